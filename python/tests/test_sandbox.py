"""The sync API on the linux backend: commands, output, files, sessions,
processes, capabilities, and what each bad input raises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hako


def test_the_readme_one_liner_prints_hi_from_a_new_interpreter(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HAKO_BIN"}
    code = "import hako; print(hako.Sandbox(backend='linux').__enter__().run('echo hi').stdout)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, timeout=120
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "hi"


def test_the_wheel_puts_hako_beside_the_interpreter() -> None:
    # The package finds the binary the wheel installed (no HAKO_BIN, no PATH).
    beside = Path(sys.executable).parent / "hako"
    assert beside.is_file() and os.access(beside, os.X_OK)
    env = {k: v for k, v in os.environ.items() if k != "HAKO_BIN"}
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run(
        [sys.executable, "-c", "import hako; print(hako.find_binary())"],
        env=env, capture_output=True, timeout=60,
    )
    assert out.stdout.decode().strip() == str(beside), out.stderr.decode()


def test_run_a_shell_string_and_an_argv(sb: hako.Sandbox) -> None:
    r = sb.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.ok and not r.timed_out and r.signal is None
    assert r.duration >= 0
    r = sb.run(["printf", "%s|", "a b", "$HOME", ";"])
    assert r.stdout == "a b|$HOME|;|" and r.ok


def test_run_with_cwd_env_and_stdin(sb: hako.Sandbox) -> None:
    sb.files.mkdir("sub/dir")
    assert sb.run("pwd", cwd="sub/dir").stdout.strip().endswith("/sub/dir")
    assert sb.run(["sh", "-c", "echo $GREETING"], env={"GREETING": "hej"}).stdout == "hej\n"
    assert sb.run("cat", stdin="line\n").stdout == "line\n"
    r = sb.run("od -An -tx1", stdin=b"\xff\x00\x01")
    assert r.stdout.split() == ["ff", "00", "01"]


def test_binary_output_arrives_byte_for_byte(sb: hako.Sandbox) -> None:
    r = sb.run(["printf", "\\377\\000\\001"], binary=True)
    assert r.stdout_bytes == b"\xff\x00\x01"


def test_callbacks_get_the_output_as_it_is_written(sb: hako.Sandbox) -> None:
    out: list = []
    err: list = []
    r = sb.run(
        "for i in 1 2 3; do echo $i; echo e$i >&2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "1\n2\n3\n" and "".join(err) == "e1\ne2\ne3\n"
    assert r.stdout == "1\n2\n3\n" and r.exit_code == 0


def test_a_missing_command_raises_command_not_found(sb: hako.Sandbox) -> None:
    with pytest.raises(hako.CommandNotFound) as e:
        sb.run(["no-such-command-here"])
    assert e.value.kind == "command_not_found" and "no-such-command-here" in str(e.value)
    assert sb.run("echo still").stdout == "still\n"
    # Through the shell it is the shell's exit status 127, not an error.
    assert sb.run("no-such-command-here").exit_code == 127


def test_a_command_past_its_deadline_is_timed_out_not_an_error(sb: hako.Sandbox) -> None:
    r = sb.run("echo started; sleep 30", timeout=0.5)
    assert r.timed_out and not r.ok and r.stdout == "started\n"
    assert sb.run("echo after").stdout == "after\n"


def test_the_sandbox_timeout_is_each_commands_default(workspace: Path) -> None:
    with hako.Sandbox(backend="linux", workspace=workspace, timeout=0.5) as s:
        assert s.run("sleep 30").timed_out
        assert not s.run("sleep 30", timeout=0.2 + 0.1).ok


def test_output_over_the_cap_is_truncated_and_says_so(workspace: Path) -> None:
    with hako.Sandbox(backend="linux", workspace=workspace, max_output="1K") as s:
        r = s.run("head -c 5000 /dev/zero | tr '\\0' x; head -c 3000 /dev/zero >&2")
        assert r.stdout_truncated and r.stderr_truncated
        assert r.stdout == "x" * 1024 and len(r.stderr_bytes) == 1024
        assert r.stdout_size == 5000 and r.stderr_size == 3000
        r = s.run("echo short")
        assert not r.stdout_truncated and r.stdout == "short\n"
        # A command's own cap, below the sandbox's.
        r = s.run("seq 1000", max_output=10)
        assert r.stdout_truncated and r.stdout == "1\n2\n3\n4\n5\n"
        out: list = []
        r = s.run("seq 1000", max_output=4, on_stdout=out.append)
        assert r.stdout == "1\n2\n" and r.stdout_truncated


def test_files_round_trip(sb: hako.Sandbox, workspace: Path) -> None:
    sb.files.write("notes/a.txt", "hello\n")
    assert (workspace / "notes" / "a.txt").read_text() == "hello\n"
    assert sb.files.read("notes/a.txt") == "hello\n"
    sb.files.write("bin.dat", bytes(range(256)))
    assert sb.files.read("bin.dat", text=False) == bytes(range(256))
    names = {e.name: e for e in sb.files.list()}
    assert names["notes"].is_dir and names["bin.dat"].size == 256
    assert [e.name for e in sb.files.list("notes")] == ["a.txt"]
    info = sb.files.stat("bin.dat")
    assert info.is_file and info.size == 256 and info.modified is not None
    assert sb.files.stat("notes").kind == "dir"
    assert sb.files.exists("notes/a.txt") and not sb.files.exists("notes/b.txt")
    sb.files.mkdir("x/y/z")
    assert (workspace / "x" / "y" / "z").is_dir()
    sb.files.remove("notes/a.txt")
    assert not (workspace / "notes" / "a.txt").exists()
    assert sb.run("cat bin.dat | wc -c").stdout.strip() == "256"


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../outside.txt"])
def test_a_path_outside_the_workspace_raises_the_fence_error(
    sb: hako.Sandbox, workspace: Path, path: str
) -> None:
    with pytest.raises(hako.FenceError) as e:
        sb.files.write(path, "x")
    assert e.value.kind == "refused" and e.value.status == 403
    with pytest.raises(hako.FenceError):
        sb.files.read(path)
    assert not (workspace.parent / "outside.txt").exists()
    sb.files.write("inside.txt", "ok")
    assert sb.files.read("inside.txt") == "ok"


def test_a_symlink_out_of_the_workspace_is_refused(sb: hako.Sandbox, workspace: Path) -> None:
    (workspace.parent / "secret").write_text("s3cret")
    os.symlink(workspace.parent / "secret", workspace / "link")
    with pytest.raises(hako.FenceError):
        sb.files.read("link")
    with pytest.raises(hako.FenceError):
        sb.files.write("link", "overwritten")
    assert (workspace.parent / "secret").read_text() == "s3cret"
    assert sb.run("echo fine").stdout == "fine\n"


def test_a_missing_file_is_file_not_found(sb: hako.Sandbox) -> None:
    with pytest.raises(hako.FileNotFound) as e:
        sb.files.read("nope.txt")
    assert isinstance(e.value, FileNotFoundError) and e.value.status == 404
    with pytest.raises(FileNotFoundError):
        sb.files.remove("nope.txt")
    with pytest.raises(FileNotFoundError):
        sb.files.stat("nope.txt")


def test_a_cwd_outside_the_workspace_is_refused(sb: hako.Sandbox) -> None:
    for cwd in ("../..", "/etc"):
        with pytest.raises(hako.FenceError) as e:
            sb.run("pwd", cwd=cwd)
        assert e.value.kind == "refused"
    with pytest.raises(hako.FileNotFound):
        sb.run("pwd", cwd="no-such-dir")
    assert sb.run("pwd").ok


def test_sessions_keep_their_shell_state(sb: hako.Sandbox) -> None:
    sb.files.mkdir("d")
    with sb.session() as s:
        s.run("cd d && export X=42")
        r = s.run("echo $X; pwd")
        assert r.stdout.splitlines()[0] == "42" and r.stdout.strip().endswith("/d")
        assert s.run("sleep 30", timeout=0.5).timed_out
    assert s.closed
    with pytest.raises(hako.SandboxClosed):
        s.run("echo closed")
    # Another session starts afresh.
    with sb.session() as t:
        assert t.run("echo ${X:-unset}").stdout == "unset\n"


def test_processes_read_write_wait_and_kill(sb: hako.Sandbox) -> None:
    p = sb.spawn(["cat"])
    assert p.pid == p.id and p.id > 0
    p.write("hello\n")
    got = ""
    for _ in range(100):
        out, _ = p.read(wait=0.2)
        got += out  # type: ignore[operator]
        if "hello" in got:
            break
    assert got == "hello\n"
    p.close_stdin()
    st = p.wait(timeout=30)
    assert not st.running and st.exit_code == 0
    q = sb.spawn("echo $V; sleep 300", env={"V": "from-env"})
    assert q.wait(timeout=0.2).running
    assert any(s.id == q.id and s.running for s in sb.processes())
    q.kill()
    st = q.wait(timeout=30)
    assert not st.running and (st.signal is not None or st.exit_code not in (None, 0))
    out, _ = q.read()
    assert out == "from-env\n"


def test_capabilities_say_what_is_enforced(sb: hako.Sandbox) -> None:
    caps = sb.capabilities
    assert caps["backend"] == "linux" and caps["isolation"] in ("process", "kernel")
    assert caps["network"] == "none"


def test_sandbox_flags_reach_the_sandbox(workspace: Path) -> None:
    with hako.Sandbox(
        backend="linux", workspace=workspace, env={"FROM_FLAG": "yes"}, pids=64, memory="256M",
        net="none", min_isolation="process",
    ) as s:
        assert s.run("echo $FROM_FLAG").stdout == "yes\n"
        kinds = {l["kind"]: l for l in s.capabilities["limits"]}
        assert "memory" in kinds and "pids" in kinds


def test_a_flag_the_cli_refuses_is_a_clear_error(workspace: Path) -> None:
    with pytest.raises(hako.BadRequest) as e:
        hako.Sandbox(backend="no-such-backend", workspace=workspace)
    assert e.value.kind == "bad_flag" and "no-such-backend" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(hako.BadRequest) as e:
        hako.Sandbox(backend="linux", workspace=workspace, memory="lots")
    assert "lots" in str(e.value)


def test_min_isolation_above_the_backend_is_a_policy_error(workspace: Path) -> None:
    with pytest.raises(hako.HakoError) as e:
        hako.Sandbox(backend="linux", workspace=workspace, min_isolation="vm")
    assert isinstance(e.value, hako.PolicyError) and e.value.kind == "policy"
    assert "`vm`" in str(e.value)


def test_a_closed_sandbox_refuses_calls(workspace: Path) -> None:
    s = hako.Sandbox(backend="linux", workspace=workspace)
    s.close()
    s.close()
    with pytest.raises(hako.SandboxClosed):
        s.run("echo")
    with pytest.raises(hako.SandboxClosed):
        s.files.read("x")


def test_a_killed_server_is_sandbox_lost(workspace: Path) -> None:
    s = hako.Sandbox(backend="linux", workspace=workspace)
    try:
        assert s._server is not None
        s._server.proc.kill()
        s._server.proc.wait()
        with pytest.raises(hako.SandboxLost):
            s.run("echo")
    finally:
        s.close()


def test_cow_keeps_the_workspace_untouched(workspace: Path) -> None:
    (workspace / "f.txt").write_text("original")
    with hako.Sandbox(backend="linux", workspace=workspace, cow=True) as s:
        s.files.write("f.txt", "changed")
        assert s.run("cat f.txt").stdout == "changed"
    assert (workspace / "f.txt").read_text() == "original"


def test_the_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repo").mkdir()
    with hako.Sandbox(backend="linux", workspace="repo", memory="1G", timeout=60) as sb:
        sb.files.write("hello.py", "print('hi')")
        print(sb.run(["python3", "hello.py"]).stdout)   # hi
    assert capsys.readouterr().out == "hi\n\n"


def test_a_named_cow_sandbox_continues_on_its_layers(workspace: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    flags = ["--state", str(state)]
    with hako.Sandbox(backend="linux", workspace=workspace, cow=True, name="py-named", extra_flags=flags) as s:
        s.files.write("kept.txt", "from the first")
    assert not (workspace / "kept.txt").exists()
    with hako.Sandbox(backend="linux", workspace=workspace, cow=True, name="py-named", extra_flags=flags) as s:
        assert s.files.read("kept.txt") == "from the first"
    with pytest.raises(hako.BadRequest) as e:
        hako.Sandbox(backend="linux", workspace=workspace, name="no-cow")
    assert e.value.kind == "not_cow"


def test_sandbox_env_arrives_intact_and_never_on_a_command_line(workspace: Path) -> None:
    tricky = 'a "quoted" \\back\\slash\nnew line\ttab $HOME `x` \u00e9\U0001f600 \x7f end'
    with hako.Sandbox(backend="linux", workspace=workspace, env={"SECRET_TOKEN": tricky, "B": ""}) as s:
        r = s.run(["printenv", "SECRET_TOKEN"])
        assert r.stdout == tricky + "\n"
        assert s.run("echo \"[$B]\"").stdout == "[]\n"
        assert s._server is not None
        with open(f"/proc/{s._server.proc.pid}/cmdline", "rb") as f:
            cmdline = f.read()
        assert b"quoted" not in cmdline and b"SECRET_TOKEN" not in cmdline
    with pytest.raises(hako.BadRequest):
        hako.Sandbox(backend="linux", workspace=workspace, env={"A=B": "x"})
