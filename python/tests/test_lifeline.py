"""The private server's lifeline: when the Python process dies (kill -9,
no clean-up of its own), its server and its sandbox go with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

CHILD = r"""
import sys, hako
sb = hako.Sandbox(backend="linux", workspace=sys.argv[1])
s = sb.session()
s.run("sleep 86399.4242 >/dev/null 2>&1 &")
p = sb.spawn(["sleep", "86398.4242"])
print(sb._server.proc.pid, flush=True)
sys.stdin.read()
"""


def pids_running(marker: str) -> List[int]:
    """Processes whose command line holds `marker`."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(d))
        except OSError:
            pass
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_killing_the_python_process_ends_its_server_and_sandbox(workspace: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(workspace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip().isdigit(), child.stderr.read().decode() if child.stderr else ""
    server = int(line)
    assert alive(server)
    assert pids_running("86399.4242") and pids_running("86398.4242")
    child.send_signal(signal.SIGKILL)
    child.wait()
    # Liveness bound only (not a timing assertion): the server notices its
    # stdin's end, closes the sandbox and exits.
    for _ in range(600):
        if not alive(server) and not pids_running("86399.4242") and not pids_running("86398.4242"):
            break
        time.sleep(0.1)
    assert not alive(server), "the server outlived its Python process"
    assert not pids_running("86399.4242"), "the session's process outlived the Python process"
    assert not pids_running("86398.4242"), "the spawned process outlived the Python process"
    leftovers = [p for p in os.listdir(os.environ.get("TMPDIR", "/tmp")) if p.startswith("hako-py-")]
    assert leftovers == [] or all(not (Path("/tmp") / p / "token").exists() for p in leftovers)


def test_closing_the_sandbox_ends_its_server(workspace: Path) -> None:
    import hako

    sb = hako.Sandbox(backend="linux", workspace=workspace)
    assert sb._server is not None
    proc = sb._server.proc
    sb.close()
    assert proc.poll() is not None
