"""E2B programs, run with the unmodified `e2b` SDK against `hako serve --e2b`.

Usage: e2b_client.py sync|async URL TOKEN ROOT
(E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY are set from the arguments,
as a user sets them.) Prints "all checks passed" when every check held.
"""

import asyncio
import os
import sys

mode, url, token, root = sys.argv[1:5]
os.environ["E2B_API_URL"] = url
os.environ["E2B_SANDBOX_URL"] = url
os.environ["E2B_API_KEY"] = token

from e2b import (  # noqa: E402
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FilesystemEventType,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotRunningException,
    SandboxQuery,
    TimeoutException,
)

BINARY = bytes(range(256)) * 4


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def drive_sync():
    sb = Sandbox.create(timeout=120, metadata={"suite": "hako"}, envs={"FROM_CREATE": "c1"})
    other = Sandbox.create(timeout=120)
    try:
        # A foreground command: exit code, output, envs, cwd, streaming.
        seen = []
        r = sb.commands.run(
            "echo out; echo err >&2; echo $FOO $FROM_CREATE",
            envs={"FOO": "bar"},
            on_stdout=seen.append,
        )
        check(r.exit_code == 0, r)
        check(r.stdout == "out\nbar c1\n", repr(r.stdout))
        check(r.stderr == "err\n", repr(r.stderr))
        check("".join(seen) == r.stdout, seen)
        sb.files.make_dir("/home/user/sub")
        r = sb.commands.run("pwd", cwd="/home/user/sub")
        check(r.stdout.strip().endswith("/sub"), r.stdout)
        # A non-zero exit is CommandExitException, as on E2B.
        try:
            sb.commands.run("echo bye; exit 7")
            check(False, "no CommandExitException")
        except CommandExitException as e:
            check(e.exit_code == 7 and e.stdout == "bye\n", e)
        # The command's timeout.
        try:
            sb.commands.run("sleep 30", timeout=1)
            check(False, "no TimeoutException")
        except TimeoutException:
            pass
        # Background with stdin, listed, then killed.
        h = sb.commands.run("read x; echo got $x", background=True, stdin=True)
        sb.commands.send_stdin(h.pid, "yo\n")
        check(h.wait().stdout == "got yo\n", "stdin")
        # A handle let go of leaves the command running; connect finds it.
        h = sb.commands.run("sleep 1; echo late", background=True)
        h.disconnect()
        check(sb.commands.connect(h.pid).wait().stdout == "late\n", "connect")
        h = sb.commands.run("sleep 60", background=True, timeout=0)
        check(any(p.pid == h.pid for p in sb.commands.list()), "listed")
        check(sb.commands.kill(h.pid), "killed")
        try:
            h.wait()
            check(False, "a killed command ended well")
        except CommandExitException:
            pass
        check(not sb.commands.kill(999999), "kill of an unknown pid")
        # Files: binary round trip, several at once, list, rename, remove.
        sb.files.write("/home/user/data/blob.bin", BINARY)
        check(bytes(sb.files.read("/home/user/data/blob.bin", format="bytes")) == BINARY, "binary")
        sb.files.write_files(
            [
                {"path": "/home/user/m/a.txt", "data": "A"},
                {"path": "m/b.txt", "data": b"B"},
            ]
        )
        check(sb.files.read("/home/user/m/b.txt") == "B", "relative path")
        names = sorted(e.name for e in sb.files.list("/home/user/m"))
        check(names == ["a.txt", "b.txt"], names)
        info = sb.files.get_info("/home/user/m/a.txt")
        check(info.size == 1 and info.path == "/home/user/m/a.txt", info)
        sb.files.rename("/home/user/m/a.txt", "/home/user/m/c.txt")
        check(sb.files.exists("/home/user/m/c.txt"), "renamed")
        check(not sb.files.exists("/home/user/m/a.txt"), "old name gone")
        # A directory watched (polled by hako).
        sb.files.make_dir("/home/user/w")
        w = sb.files.watch_dir("/home/user/w")
        sb.files.write("/home/user/w/f.txt", "x")
        events = w.get_new_events()
        check(any(e.name == "f.txt" and e.type == FilesystemEventType.CREATE for e in events), events)
        sb.files.remove("/home/user/w/f.txt")
        events = w.get_new_events()
        check(any(e.name == "f.txt" and e.type == FilesystemEventType.REMOVE for e in events), events)
        w.stop()
        sb.files.remove("/home/user/m")
        check(not sb.files.exists("/home/user/m"), "removed")
        try:
            sb.files.read("/home/user/nope")
            check(False, "no NotFoundException")
        except NotFoundException:
            pass
        # Outside the workspace: refused.
        for bad in ["/etc/passwd", "/home/user/../../etc/passwd"]:
            try:
                sb.files.read(bad)
                check(False, f"{bad} was read")
            except SandboxException:
                pass
        # A symlink made inside that points out: the fence does not follow it.
        sb.commands.run(f"ln -s {root} ~/out")
        for bad in ["/home/user/out", "/home/user/out/" + other.sandbox_id]:
            try:
                sb.files.list(bad)
                check(False, f"{bad} was listed through a symlink")
            except SandboxException:
                pass
        try:
            sb.files.write("/home/user/out/planted", "x")
            check(False, "written through a symlink")
        except SandboxException:
            pass
        check(not os.path.exists(os.path.join(root, "planted")), "planted through a symlink")
        check(sb.commands.run("echo still").stdout == "still\n", "works after the refusals")
        # Sandboxes do not share files.
        check(not other.files.exists("/home/user/data/blob.bin"), "shared workspace")
        # List, by metadata; connect; timeout; kill.
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "hako"})).next_items()
        check([s.sandbox_id for s in listed] == [sb.sandbox_id], listed)
        again = Sandbox.connect(sb.sandbox_id)
        check(again.commands.run("echo same").stdout == "same\n", "connect")
        sb.set_timeout(200)
        check(sb.is_running(), "running")
        # Unsupported: a clear error.
        try:
            Sandbox.create(template="my-template")
            check(False, "a template was accepted")
        except SandboxException as e:
            check("not supported by hako" in str(e), str(e))
        other.set_timeout(1)
    finally:
        sb.kill()
    # A killed sandbox is gone, as on E2B.
    try:
        sb.commands.run("true")
        check(False, "a killed sandbox ran a command")
    except SandboxNotRunningException:
        pass
    try:
        sb.files.read("/home/user/data/blob.bin")
        check(False, "a killed sandbox's file was read")
    except SandboxNotRunningException:
        pass
    try:
        Sandbox.connect(sb.sandbox_id)
        check(False, "connected to a killed sandbox")
    except NotFoundException:
        pass
    check(not os.path.exists(os.path.join(root, sb.sandbox_id)), "workspace left behind")
    # The lease: `other` is killed once its timeout passes.
    import time

    for _ in range(100):
        if not any(s.sandbox_id == other.sandbox_id for s in Sandbox.list().next_items()):
            break
        time.sleep(0.1)
    else:
        check(False, "the timeout did not kill the sandbox")
    # A wrong key.
    try:
        Sandbox.create(api_key="not-the-token")
        check(False, "a wrong key was accepted")
    except AuthenticationException:
        pass


async def drive_async():
    sb = await AsyncSandbox.create(timeout=60)
    try:
        seen = []
        r = await sb.commands.run("echo a; echo b", on_stdout=seen.append)
        check(r.stdout == "a\nb\n" and "".join(seen) == "a\nb\n", r)
        try:
            await sb.commands.run("exit 4")
            check(False, "no CommandExitException")
        except CommandExitException as e:
            check(e.exit_code == 4, e)
        await sb.files.make_dir("/home/user/w")
        seen_events = []
        w = await sb.files.watch_dir("/home/user/w", on_event=seen_events.append)
        await sb.files.write("/home/user/w/new.txt", "n")
        for _ in range(100):
            if any(e.name == "new.txt" for e in seen_events):
                break
            await asyncio.sleep(0.05)
        else:
            check(False, f"no watch event: {seen_events}")
        await w.stop()
        await sb.files.write("/home/user/x.bin", BINARY)
        check(bytes(await sb.files.read("/home/user/x.bin", format="bytes")) == BINARY, "binary")
        h = await sb.commands.run("cat", background=True, stdin=True)
        await sb.commands.send_stdin(h.pid, "piped\n")
        await sb.commands.close_stdin(h.pid)
        check((await h.wait()).stdout == "piped\n", "async stdin")
    finally:
        await sb.kill()


if mode == "sync":
    drive_sync()
else:
    asyncio.run(drive_async())
print("all checks passed", flush=True)
# Every check has run. The SDK's async directory watch can leave a thread
# behind that aborts the interpreter's teardown now and then (SIGABRT after
# this line): end here, past what is tested.
os._exit(0)
