"""Twenty sandboxes from twenty threads, and many threads on one sandbox."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hako


def test_twenty_sandboxes_from_twenty_threads(tmp_path: Path) -> None:
    def one(i: int) -> str:
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        with hako.Sandbox(backend="linux", workspace=ws) as sb:
            sb.files.write("me.txt", f"thread {i}")
            return sb.run("cat me.txt; ls | wc -l").stdout

    with ThreadPoolExecutor(20) as pool:
        outs = list(pool.map(one, range(20)))
    assert outs == [f"thread {i}1\n" for i in range(20)]


def test_one_sandbox_shared_by_many_threads(sb: hako.Sandbox) -> None:
    def one(i: int) -> str:
        sb.files.write(f"f{i}", str(i))
        return sb.run(["cat", f"f{i}"]).stdout

    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(one, range(64)))
    assert outs == [str(i) for i in range(64)]


def test_more_commands_than_the_server_runs_at_once_wait_their_turn(
    sb: hako.Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server runs at most 32 commands at once and answers more `503
    # busy`; the SDK retries those after a pause, so 48 at once all run.
    def one(i: int) -> str:
        return sb.run(f"sleep 1; echo {i}").stdout

    with ThreadPoolExecutor(48) as pool:
        outs = list(pool.map(one, range(48)))
    assert outs == [f"{i}\n" for i in range(48)]
    # Without the retries the same load meets the server's limit: this
    # test's load does reach it.
    import hako._sync as sync

    monkeypatch.setattr(sync, "_BUSY_TRIES", 0)
    errors = []

    def bare(i: int) -> None:
        try:
            sb.run("sleep 1")
        except hako.HakoError as e:
            errors.append(e)

    with ThreadPoolExecutor(48) as pool:
        list(pool.map(bare, range(48)))
    assert errors and all(isinstance(e, hako.LimitReached) and e.kind == "busy" and e.status == 503 for e in errors)
    assert sb.run("echo after").stdout == "after\n"
