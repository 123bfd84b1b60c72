"""Shared fixtures of the SDK's tests: a workspace per test, a linux
sandbox on it, the rule for skipping (never under HAKO_MUST_WORK=1), and
which container backends `hako doctor` says work here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import pytest

import hako

MUST_WORK = os.environ.get("HAKO_MUST_WORK") == "1"


def skip_or_fail(name: str, why: str, may_skip_in_ci: bool = False) -> None:
    """Skips the test with a `SKIPPED name` line, or fails it under
    HAKO_MUST_WORK=1 (unless it may skip there too)."""
    if MUST_WORK and not may_skip_in_ci:
        pytest.fail(f"{name}: {why} (HAKO_MUST_WORK=1: it must run)")
    print(f"SKIPPED {name}: {why}", file=sys.stderr)
    pytest.skip(why)


@lru_cache(maxsize=None)
def doctor() -> dict:
    """`hako doctor --json` of the binary the SDK starts."""
    out = subprocess.run(
        [hako.find_binary(), "doctor", "--json"], capture_output=True, timeout=300, check=False
    )
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {}


def backend_works(name: str) -> bool:
    """Whether `hako doctor` says the backend works here."""
    return any(b.get("backend") == name and b.get("works") for b in doctor().get("backends", []))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def sb(workspace: Path) -> Iterator[hako.Sandbox]:
    if not backend_works("linux"):
        skip_or_fail("linux_sandbox", "hako doctor says the linux backend does not work here")
    with hako.Sandbox(backend="linux", workspace=workspace) as s:
        yield s
