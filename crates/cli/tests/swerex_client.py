"""Drives `hako serve --swerex` with SWE-ReX's own client.

Usage: swerex_client.py MODE PORT TOKEN WORKSPACE

MODE `drive` runs every call of `swerex.runtime.remote.RemoteRuntime` (the
client SWE-agent's remote deployment uses, from the `swe-rex` package,
unmodified) against the server on 127.0.0.1:PORT, whose sandbox's
workspace is WORKSPACE; MODE `zip-slip` checks that an uploaded zip whose
entry climbs out of its target is refused whole; MODE `wrong-token` checks that a client with a
wrong or no token is refused and changes nothing. Prints "all checks
passed" at the end; any failed check raises. The server is started and
stopped by the caller (the Rust test), which then reads its audit log.
"""

import asyncio
import os
import shutil
import sys
import tempfile
import zipfile

try:
    import aiohttp
    from swerex.exceptions import (
        BashIncorrectSyntaxError,
        CommandTimeoutError,
        NonZeroExitCodeError,
        SessionDoesNotExistError,
        SessionExistsError,
    )
    from swerex.runtime.abstract import (
        BashAction,
        BashInterruptAction,
        CloseBashSessionRequest,
        Command,
        CreateBashSessionRequest,
        ReadFileRequest,
        UploadRequest,
        WriteFileRequest,
    )
    from swerex.runtime.remote import RemoteRuntime
except ImportError as exc:  # the Rust test decides whether this may skip
    print(f"IMPORT-FAILED: {exc}")
    sys.exit(3)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


async def raises(exc_type, coro, what, contains=None):
    """Awaits `coro` and checks it raised `exc_type` (as re-raised by the
    client from the server's 511 answer), whose message holds `contains`."""
    try:
        result = await coro
    except exc_type as e:
        if contains is not None and contains not in str(e):
            raise AssertionError(f"{what}: {type(e).__name__} without {contains!r}: {e}")
        print(f"ok: {what} ({type(e).__name__})")
        return e
    raise AssertionError(f"{what}: no {exc_type.__name__}, got {result!r}")


def processes_with(marker):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(cmdline)
    return found


async def drive(port, token, ws):
    rt = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token, timeout=30)
    alive = await rt.is_alive()
    check(alive.is_alive, f"is_alive: {alive.message}")

    # Sessions: named, and their state lasts from one command to the next.
    created = await rt.create_session(CreateBashSessionRequest(session="main"))
    check(created.session_type == "bash", "create_session answers a bash session")
    await raises(
        SessionExistsError,
        rt.create_session(CreateBashSessionRequest(session="main")),
        "a second session of the same name is refused",
    )
    obs = await rt.run_in_session(BashAction(command="mkdir -p sub && cd sub && export GREETING=hello", session="main"))
    check(obs.exit_code == 0, f"cd and export ran: {obs}")
    obs = await rt.run_in_session(BashAction(command='pwd; echo "$GREETING"', session="main"))
    check(obs.output.split() == [os.path.join(ws, "sub"), "hello"], f"cd and export last: {obs.output!r}")
    check(obs.exit_code == 0 and obs.expect_string == "SHELLPS1PREFIX", f"as SWE-ReX's own session: {obs}")
    obs = await rt.run_in_session(BashAction(command="echo to-out; echo to-err >&2", session="main"))
    check("to-out" in obs.output and "to-err" in obs.output, f"stdout and stderr both come: {obs.output!r}")
    # check: raise (the default), silent, ignore.
    e = await raises(
        NonZeroExitCodeError,
        rt.run_in_session(BashAction(command="echo failing; exit_with() { return 3; }; exit_with", session="main", error_msg="step 2")),
        "a non-zero exit raises with check=raise",
        contains="exit code 3",
    )
    check(str(e).startswith("step 2: ") and "failing" in str(e), f"the error says the command's output: {e}")
    obs = await rt.run_in_session(BashAction(command="false", session="main", check="silent"))
    check(obs.exit_code == 1, f"check=silent gives the code: {obs}")
    obs = await rt.run_in_session(BashAction(command="false", session="main", check="ignore"))
    check(obs.exit_code is None, f"check=ignore gives none: {obs}")
    # A deadline: the timeout error, and the session goes on where it was.
    marker = f"98{os.getpid()}"
    await raises(
        CommandTimeoutError,
        rt.run_in_session(BashAction(command=f"sleep {marker}", session="main", timeout=1)),
        "a session command past its timeout raises CommandTimeoutError",
        contains="timeout after 1.0 seconds",
    )
    check(processes_with(f"sleep {marker}") == [], "the timed-out command was killed")
    obs = await rt.run_in_session(BashInterruptAction(session="main"))
    check(obs.exit_code == 0, f"an interrupt after it is answered: {obs}")
    obs = await rt.run_in_session(BashAction(command='pwd; echo "$GREETING"', session="main"))
    check(obs.output.split() == [os.path.join(ws, "sub"), "hello"], f"the session kept its state: {obs.output!r}")
    await raises(
        SessionDoesNotExistError,
        rt.run_in_session(BashAction(command="true", session="nope")),
        "a command in a session never made raises SessionDoesNotExistError",
    )
    await raises(
        NotImplementedError,
        rt.run_in_session(BashAction(command="python3", session="main", is_interactive_command=True, expect=[">>> "])),
        "an interactive command is refused by name",
        contains="interactive",
    )

    # A command that does not parse raises before anything of it runs.
    e = await raises(
        BashIncorrectSyntaxError,
        rt.run_in_session(BashAction(command="touch parsed; if then", session="main")),
        "a command with a syntax error raises BashIncorrectSyntaxError",
        contains="syntax error",
    )
    check("bash_stderr" in e.extra_info, f"with bash's stderr in extra_info: {e.extra_info}")
    check(not os.path.exists(os.path.join(ws, "sub", "parsed")), "and nothing of it ran")

    # Startup files are sourced into a new session; a session whose shell
    # exits is gone, and its name free again.
    with open(os.path.join(ws, "rc.sh"), "w") as f:
        f.write("export FROM_RC=yes\necho sourced-rc\n")
    created = await rt.create_session(
        CreateBashSessionRequest(session="rc", startup_source=[os.path.join(ws, "rc.sh")], startup_timeout=30)
    )
    check(created.output == "sourced-rc\n", f"the startup file's output: {created.output!r}")
    obs = await rt.run_in_session(BashAction(command='echo "$FROM_RC"', session="rc"))
    check(obs.output == "yes\n", f"what it exported lasts: {obs.output!r}")
    await rt.run_in_session(BashAction(command="exit 3", session="rc", check="silent"))
    await raises(
        SessionDoesNotExistError,
        rt.run_in_session(BashAction(command="true", session="rc")),
        "a session whose shell exited is gone",
        contains="'rc'",
    )
    await rt.create_session(CreateBashSessionRequest(session="rc"))
    await rt.close_session(CloseBashSessionRequest(session="rc"))

    # One-off commands.
    r = await rt.execute(Command(command=["sh", "-c", 'echo "$FOO"; pwd'], env={"FOO": "bar"}, cwd=os.path.join(ws, "sub")))
    check(r.stdout.split() == ["bar", os.path.join(ws, "sub")] and r.exit_code == 0, f"execute with env and cwd: {r}")
    r = await rt.execute(Command(command="echo one; echo two >&2; exit 4", shell=True))
    check((r.stdout, r.stderr, r.exit_code) == ("one\n", "two\n", 4), f"execute keeps the streams apart: {r}")
    r = await rt.execute(Command(command="echo one; echo two >&2", shell=True, merge_output_streams=True))
    check(r.stdout == "one\ntwo\n" and r.stderr == "", f"merge_output_streams: {r}")
    await raises(
        NonZeroExitCodeError,
        rt.execute(Command(command="exit 5", shell=True, check=True)),
        "execute with check=True raises on a non-zero exit",
        contains="exit code 5",
    )
    await raises(
        CommandTimeoutError,
        rt.execute(Command(command=["sleep", marker], timeout=0.5)),
        "execute past its timeout raises CommandTimeoutError",
    )
    check(processes_with(f"sleep {marker}") == [], "the timed-out one-off command was killed")
    await raises(
        FileNotFoundError,
        rt.execute(Command(command=["no-such-program-hako"])),
        "a program that is not there raises FileNotFoundError",
    )

    # Files: absolute paths under the workspace.
    text = "h\u00e9llo\nw\u00f6rld\n"
    path = os.path.join(ws, "new", "dir", "f.txt")
    await rt.write_file(WriteFileRequest(content=text, path=path))
    with open(path, encoding="utf-8") as f:
        check(f.read() == text, "write_file made the parents and wrote the file")
    read = await rt.read_file(ReadFileRequest(path=path))
    check(read.content == text, "read_file gives it back")
    obs = await rt.run_in_session(BashAction(command=f"cat {path}", session="main"))
    check(obs.output.replace("\r", "") == text, "the session sees what write_file wrote")
    await raises(
        FileNotFoundError,
        rt.read_file(ReadFileRequest(path=os.path.join(ws, "missing.txt"))),
        "reading a missing file raises FileNotFoundError",
    )
    with open(os.path.join(ws, "latin.txt"), "wb") as f:
        f.write(b"caf\xe9\n")
    await raises(
        ValueError,
        rt.read_file(ReadFileRequest(path=os.path.join(ws, "latin.txt"))),
        "bytes that are not UTF-8 raise, as read_text does",
        contains="0xe9",
    )
    read = await rt.read_file(ReadFileRequest(path=os.path.join(ws, "latin.txt"), encoding="latin-1"))
    check(read.content == "caf\u00e9\n", "read_file decodes latin-1 when asked")
    read = await rt.read_file(ReadFileRequest(path=os.path.join(ws, "latin.txt"), errors="replace"))
    check(read.content == "caf\ufffd\n", "read_file replaces bad bytes when asked")

    # Uploads: a file, and a directory (sent as a zip).
    with tempfile.TemporaryDirectory() as local:
        one = os.path.join(local, "one.txt")
        with open(one, "w") as f:
            f.write("uploaded file\n")
        await rt.upload(UploadRequest(source_path=one, target_path=os.path.join(ws, "up", "one.txt")))
        with open(os.path.join(ws, "up", "one.txt")) as f:
            check(f.read() == "uploaded file\n", "upload of a file")
        tree = os.path.join(local, "tree")
        os.makedirs(os.path.join(tree, "pkg", "deep"))
        os.makedirs(os.path.join(tree, "empty"))
        blob = bytes(range(256)) * 4000
        files = {
            "README.md": b"# tree\n",
            "pkg/__init__.py": b"",
            "pkg/deep/data.bin": blob,
            "pkg/deep/mod.py": b"print('hi')\n" * 1000,
        }
        for rel, data in files.items():
            with open(os.path.join(tree, rel), "wb") as f:
                f.write(data)
        target = os.path.join(ws, "uploaded-tree")
        await rt.upload(UploadRequest(source_path=tree, target_path=target))
        for rel, data in files.items():
            with open(os.path.join(target, rel), "rb") as f:
                check(f.read() == data, f"upload of a directory: {rel}")
        check(os.path.isdir(os.path.join(target, "empty")), "upload of a directory: its empty directory")
        obs = await rt.run_in_session(BashAction(command=f"cd {target} && find . -type f | sort", session="main"))
        check(obs.output.split() == ["./README.md", "./pkg/__init__.py", "./pkg/deep/data.bin", "./pkg/deep/mod.py"], f"the session sees the tree: {obs.output!r}")

        # Paths outside the workspace are refused, and nothing is written.
        outside = tempfile.mkdtemp(prefix="hako-swerex-outside-")
        try:
            victim = os.path.join(outside, "victim.txt")
            for what, coro in [
                ("write_file", rt.write_file(WriteFileRequest(content="x", path=victim))),
                ("write_file through ..", rt.write_file(WriteFileRequest(content="x", path=os.path.join(ws, "..", os.path.basename(outside), "victim.txt")))),
                ("upload of a file", rt.upload(UploadRequest(source_path=one, target_path=victim))),
                ("upload of a directory", rt.upload(UploadRequest(source_path=tree, target_path=os.path.join(outside, "tree")))),
            ]:
                await raises(PermissionError, coro, f"{what} outside the workspace is refused", contains="refused")
            check(os.listdir(outside) == [], "nothing was written outside")
            await raises(
                PermissionError,
                rt.read_file(ReadFileRequest(path="/etc/hostname")),
                "read_file of a path outside the workspace is refused",
                contains="/etc/hostname",
            )
        finally:
            shutil.rmtree(outside)

    # The sandbox still works after the refusals.
    obs = await rt.run_in_session(BashAction(command="echo still here", session="main"))
    check(obs.output.strip() == "still here", "the session works after the refusals")

    # Closing: the session's name is gone; close kills what the sandbox
    # still runs.
    await rt.create_session(CreateBashSessionRequest(session="bg"))
    await rt.run_in_session(BashAction(command=f"(sleep {marker}7 &) ; sleep {marker}8 &", session="bg"))
    await rt.close_session(CloseBashSessionRequest(session="main"))
    await raises(
        SessionDoesNotExistError,
        rt.run_in_session(BashAction(command="true", session="main")),
        "a closed session is gone",
    )
    await raises(
        SessionDoesNotExistError,
        rt.close_session(CloseBashSessionRequest(session="main")),
        "closing it again raises SessionDoesNotExistError",
    )
    check(processes_with(f"sleep {marker}7") != [], "the background command runs before close")
    await rt.close()
    for _ in range(100):
        if not processes_with(f"sleep {marker}7") and not processes_with(f"sleep {marker}8"):
            break
        await asyncio.sleep(0.1)
    check(processes_with(f"sleep {marker}7") == [] and processes_with(f"sleep {marker}8") == [], "close killed what the sandbox ran")
    await raises(
        SessionDoesNotExistError,
        rt.run_in_session(BashAction(command="true", session="bg")),
        "after close no session is left",
    )
    # The next request opens a new sandbox on the same workspace.
    alive = await rt.is_alive()
    check(alive.is_alive, "a new sandbox after close")
    r = await rt.execute(Command(command=["cat", os.path.join(ws, "up", "one.txt")]))
    check(r.stdout == "uploaded file\n", "which sees the workspace")
    await rt.close()


async def zip_slip(port, token, ws):
    """An archive whose entry climbs out of its target is refused whole,
    and the sandbox still works. (RemoteRuntime zips directories itself,
    so this one is posted as it posts one.)"""
    rt = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token, timeout=30)
    check((await rt.is_alive()).is_alive, "is_alive")
    with tempfile.TemporaryDirectory() as local:
        for entry in ["../escaped.txt", "a/../../escaped.txt", "/tmp/escaped-hako-swerex.txt"]:
            evil = os.path.join(local, "evil.zip")
            with zipfile.ZipFile(evil, "w") as z:
                z.writestr("fine.txt", "fine")
                z.writestr(zipfile.ZipInfo(entry), "escaped")
            data = aiohttp.FormData()
            data.add_field("file", open(evil, "rb"), filename="zipped_transfer.zip", content_type="application/zip")
            data.add_field("target_path", os.path.join(ws, "slip"))
            data.add_field("unzip", "true")
            async with aiohttp.ClientSession() as s:
                async with s.post(f"http://127.0.0.1:{port}/upload", data=data, headers={"X-API-Key": token}) as resp:
                    body = await resp.json()
            check(resp.status == 511, f"a zip-slip upload ({entry}) is refused: {resp.status} {body}")
            exc = body["swerexception"]
            check(exc["class_path"] == "builtins.ValueError" and entry in exc["message"] and "nothing was written" in exc["message"], f"and says why: {exc}")
            check(not os.path.exists(os.path.join(ws, "escaped.txt")), "the escaping entry was not written")
            check(not os.path.exists("/tmp/escaped-hako-swerex.txt"), "nor at its absolute path")
            check(not os.path.exists(os.path.join(ws, "slip")), "nor any other entry")
        # The same upload without the hostile entry goes through.
        good = os.path.join(local, "good")
        os.makedirs(good)
        with open(os.path.join(good, "fine.txt"), "w") as f:
            f.write("fine")
        await rt.upload(UploadRequest(source_path=good, target_path=os.path.join(ws, "slip")))
        with open(os.path.join(ws, "slip", "fine.txt")) as f:
            check(f.read() == "fine", "an upload after the refusals works")
    r = await rt.execute(Command(command="echo still here", shell=True))
    check(r.stdout == "still here\n", "the sandbox works after the refusals")
    await rt.close()


async def wrong_token(port, token, ws):
    for name, given in [("a wrong token", token + "x"), ("no token", "")]:
        rt = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=given, timeout=30)
        alive = await rt.is_alive()
        check(not alive.is_alive and "401" in alive.message, f"is_alive with {name} says 401: {alive.message}")
        for what, coro in [
            ("create_session", rt.create_session(CreateBashSessionRequest(session="main"))),
            ("execute", rt.execute(Command(command=["touch", os.path.join(ws, "ran")]))),
            ("write_file", rt.write_file(WriteFileRequest(content="x", path=os.path.join(ws, "written")))),
        ]:
            try:
                await coro
            except aiohttp.ClientResponseError as e:
                check(e.status == 401, f"{what} with {name} is refused (401)")
            else:
                raise AssertionError(f"{what} with {name} was not refused")
    check(os.listdir(ws) == [], "nothing was done in the workspace")
    # And the right token still works.
    rt = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token, timeout=30)
    r = await rt.execute(Command(command="echo in", shell=True))
    check(r.stdout == "in\n", "the right token works")
    await rt.close()


def main():
    mode, port, token, ws = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    run = {"drive": drive, "zip-slip": zip_slip, "wrong-token": wrong_token}[mode]
    asyncio.run(run(port, token, ws))
    print("all checks passed")


if __name__ == "__main__":
    main()
