"""E2B-style programs, with the unmodified `e2b` SDK from PyPI, against
`hako serve --e2b` (the wheel's own `hako`, on `linux`): only the SDK's
environment variables point it at hako."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

import hako
from conftest import skip_or_fail

e2b: Any
try:
    import e2b
except ImportError:  # pragma: no cover - the test command installs it
    e2b = None

BINARY = bytes(range(256)) * 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A `hako serve --e2b` on a port of its own; the SDK's variables set
    to it for the module's tests. Yields the root of the sandboxes'
    workspaces."""
    yield from serve_e2b(tmp_path_factory, [])


def serve_e2b(tmp_path_factory: pytest.TempPathFactory, flags: list[str]) -> Iterator[Path]:
    """Runs `hako serve --e2b` with `flags`, the SDK's variables set to it,
    while the caller's generator lives; yields the sandboxes' root."""
    if e2b is None:
        skip_or_fail("e2b_sdk", "the e2b package is not installed")
    base = tmp_path_factory.mktemp("e2b")
    root = base / "root"
    root.mkdir()
    token = base / "token"
    token.write_text(secrets.token_hex(16))
    token.chmod(0o600)
    proc = subprocess.Popen(
        [
            hako.find_binary(),
            "serve",
            "--e2b",
            "--backend",
            "linux",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            str(token),
            "--e2b-root",
            str(root),
            "--ready-json",
            "--exit-on-stdin-eof",
            *flags,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline() or "{}")
    assert "url" in ready, "hako serve --e2b did not say it was ready"
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    os.environ["E2B_API_URL"] = ready["url"]
    os.environ["E2B_SANDBOX_URL"] = ready["url"]
    os.environ["E2B_API_KEY"] = token.read_text()
    try:
        yield root
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        # Every sandbox's workspace went with it.
        assert list(root.iterdir()) == []


def test_a_command_runs_with_its_output_envs_and_cwd(server: Path) -> None:
    with e2b.Sandbox.create(timeout=120, envs={"FROM_CREATE": "c"}) as sb:
        seen: list[str] = []
        r = sb.commands.run(
            "echo out; echo err >&2; echo $FOO $FROM_CREATE",
            envs={"FOO": "bar"},
            on_stdout=seen.append,
        )
        assert (r.exit_code, r.stdout, r.stderr) == (0, "out\nbar c\n", "err\n")
        assert "".join(seen) == r.stdout
        sb.files.make_dir("/home/user/sub")
        assert sb.commands.run("pwd", cwd="/home/user/sub").stdout.strip().endswith("/sub")


def test_a_non_zero_exit_and_a_timeout_raise_the_sdks_exceptions(server: Path) -> None:
    with e2b.Sandbox.create(timeout=120) as sb:
        with pytest.raises(e2b.CommandExitException) as exited:
            sb.commands.run("echo bye; exit 7")
        assert exited.value.exit_code == 7 and exited.value.stdout == "bye\n"
        with pytest.raises(e2b.TimeoutException):
            sb.commands.run("sleep 30", timeout=1)
        assert sb.commands.run("echo still").stdout == "still\n"


def test_a_background_process_takes_stdin_and_is_listed_and_killed(server: Path) -> None:
    with e2b.Sandbox.create(timeout=120) as sb:
        h = sb.commands.run("read x; echo got $x", background=True, stdin=True)
        sb.commands.send_stdin(h.pid, "yo\n")
        assert h.wait().stdout == "got yo\n"
        h = sb.commands.run("sleep 60", background=True, timeout=0)
        assert any(p.pid == h.pid for p in sb.commands.list())
        assert sb.commands.kill(h.pid)
        with pytest.raises(e2b.CommandExitException):
            h.wait()


def test_files_round_trip_binary_content_and_are_listed(server: Path) -> None:
    with e2b.Sandbox.create(timeout=120) as sb:
        sb.files.write("/home/user/data/blob.bin", BINARY)
        assert bytes(sb.files.read("/home/user/data/blob.bin", format="bytes")) == BINARY
        sb.files.write_files(
            [{"path": "/home/user/m/a.txt", "data": "A"}, {"path": "m/b.txt", "data": b"B"}]
        )
        assert sorted(e.name for e in sb.files.list("/home/user/m")) == ["a.txt", "b.txt"]
        assert sb.files.get_info("/home/user/m/a.txt").size == 1
        sb.files.rename("/home/user/m/a.txt", "/home/user/m/c.txt")
        assert sb.files.exists("/home/user/m/c.txt") and not sb.files.exists("/home/user/m/a.txt")
        # What a command writes, the file API reads at once (a command's
        # working directory is the workspace, which /home/user maps to).
        sb.commands.run("printf made > m/cmd.txt")
        assert sb.files.read("/home/user/m/cmd.txt") == "made"
        sb.files.remove("/home/user/m")
        assert not sb.files.exists("/home/user/m")
        with pytest.raises(e2b.NotFoundException):
            sb.files.read("/home/user/nope")


def test_a_path_outside_the_workspace_is_refused_and_the_sandbox_goes_on(server: Path) -> None:
    with e2b.Sandbox.create(timeout=120) as sb:
        for bad in ["/etc/passwd", "/home/user/../../etc/passwd"]:
            with pytest.raises(e2b.SandboxException):
                sb.files.read(bad)
        with pytest.raises(e2b.SandboxException):
            sb.files.write("/tmp/planted-by-e2b", "x")
        assert not Path("/tmp/planted-by-e2b").exists()
        assert sb.commands.run("echo still").stdout == "still\n"


def test_sandboxes_do_not_share_files_and_a_killed_one_is_gone(server: Path) -> None:
    one = e2b.Sandbox.create(timeout=120)
    two = e2b.Sandbox.create(timeout=120)
    try:
        one.files.write("/home/user/mine.txt", "one")
        assert not two.files.exists("/home/user/mine.txt")
        assert one.sandbox_id in {s.sandbox_id for s in e2b.Sandbox.list().next_items()}
    finally:
        one.kill()
        two.kill()
    with pytest.raises(e2b.SandboxNotRunningException):
        one.commands.run("true")
    assert not (server / one.sandbox_id).exists()


def test_a_wrong_key_and_an_unsupported_template_are_refused(server: Path) -> None:
    with pytest.raises(e2b.AuthenticationException):
        e2b.Sandbox.create(api_key="not-the-token")
    with pytest.raises(e2b.SandboxException, match="not supported by hako"):
        e2b.Sandbox.create(template="my-template")


def test_the_async_sdk_runs_commands_and_moves_files(server: Path) -> None:
    async def drive() -> None:
        sb = await e2b.AsyncSandbox.create(timeout=60)
        try:
            seen: list[str] = []
            r = await sb.commands.run("echo a; echo b", on_stdout=seen.append)
            assert r.stdout == "a\nb\n" and "".join(seen) == "a\nb\n"
            with pytest.raises(e2b.CommandExitException):
                await sb.commands.run("exit 4")
            await sb.files.write("/home/user/x.bin", BINARY)
            assert bytes(await sb.files.read("/home/user/x.bin", format="bytes")) == BINARY
            h = await sb.commands.run("cat", background=True, stdin=True)
            await sb.commands.send_stdin(h.pid, "piped\n")
            await sb.commands.close_stdin(h.pid)
            assert (await h.wait()).stdout == "piped\n"
        finally:
            await sb.kill()

    asyncio.run(drive())


def test_a_sandbox_that_locks_its_own_directories_leaves_nothing_when_killed(server: Path) -> None:
    sb = e2b.Sandbox.create(timeout=120)
    sb.commands.run("mkdir -p d/e && touch d/e/f && chmod 000 d/e && chmod 500 d")
    assert (server / sb.sandbox_id).exists()
    sb.kill()
    assert not (server / sb.sandbox_id).exists()


def test_no_internet_asked_of_a_server_without_network_is_granted(server: Path) -> None:
    with e2b.Sandbox.create(timeout=60, allow_internet_access=False) as sb:
        assert sb.commands.run("echo offline").stdout == "offline\n"


def test_no_internet_asked_of_a_server_that_allows_some_is_refused(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    gen = serve_e2b(tmp_path_factory, ["--allow", "localhost:9"])
    root = next(gen)
    try:
        with pytest.raises(e2b.SandboxException, match="allow_internet_access"):
            e2b.Sandbox.create(timeout=60, allow_internet_access=False)
        assert list(root.iterdir()) == []
        # Without the request, the server's policy applies as always.
        with e2b.Sandbox.create(timeout=60) as sb:
            assert sb.commands.run("echo on").stdout == "on\n"
    finally:
        gen.close()
