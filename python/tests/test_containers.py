"""The docker and gvisor backends through the SDK, where `hako doctor` says
they work here (they need their runtime and hako's image)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hako
from conftest import backend_works, skip_or_fail


@pytest.mark.parametrize("backend", ["docker", "gvisor"])
def test_a_container_backend_runs_commands_and_files(backend: str, workspace: Path) -> None:
    if not backend_works(backend):
        skip_or_fail(
            f"sdk_on_{backend}",
            f"hako doctor says the {backend} backend does not work here",
            may_skip_in_ci=True,
        )
    with hako.Sandbox(backend=backend, workspace=workspace) as sb:
        assert sb.capabilities["backend"] == backend
        assert sb.run("echo hi").stdout == "hi\n"
        sb.files.write("c.txt", "in a container")
        assert sb.run("cat c.txt").stdout == "in a container"
        with pytest.raises(hako.FenceError):
            sb.files.read("../outside")
        assert sb.run("sleep 30", timeout=1).timed_out
