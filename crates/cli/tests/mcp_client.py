#!/usr/bin/env python3
"""Drives `hako mcp` with the official Python MCP SDK (PyPI `mcp`), a client
hako did not write: lists the tools, calls every one of them with good and
bad input, and checks the answers.

Usage: mcp_client.py HAKO BACKEND WORKSPACE AUDIT_LOG

Exits 0 when every check passed, 1 (with the failed check) otherwise, and
2 when the `mcp` package is missing.
"""

import asyncio
import os
import re
import sys

try:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
except ImportError as exc:  # the Rust test decides whether this may skip
    print(f"SKIP: the Python mcp package is not installed ({exc}); python3 -m pip install mcp")
    sys.exit(2)

TOOLS = {
    # name: (read_only, destructive, idempotent, open_world)
    "read_file": (True, False, True, False),
    "write_file": (False, True, True, False),
    "edit_file": (False, True, False, False),
    "list_dir": (True, False, True, False),
    "glob": (True, False, True, False),
    "grep": (True, False, True, False),
    "run_command": (False, True, False, True),
    "open_session": (False, False, False, False),
    "close_session": (False, True, True, False),
    "read_output": (True, False, True, False),
    "send_input": (False, True, False, False),
    "kill_process": (False, True, True, False),
    "list_processes": (True, False, True, False),
}


class Failed(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failed(f"{what}\n--- got ---\n{detail}")
    print(f"ok: {what}")


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(session, name, args):
    result = await session.call_tool(name, args)
    return bool(result.is_error), text_of(result)


async def expect_ok(session, name, args, what):
    err, text = await call(session, name, args)
    check(not err, f"{what} ({name} succeeds)", text)
    return text


async def expect_error(session, name, args, what):
    err, text = await call(session, name, args)
    check(err, f"{what} ({name} is a tool error)", text)
    return text


async def run(hako, backend, ws, audit):
    env = {k: v for k, v in os.environ.items() if k.startswith("HAKO_") or k == "PATH"}
    params = StdioServerParameters(
        command=hako,
        args=["mcp", "--backend", backend, "--workspace", ws, "--audit", audit],
        env=env,
    )
    outside = os.path.join(os.path.dirname(ws), "outside-target")
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            check(init.server_info.name == "hako", "the server says it is hako", init)

            # The tools, with every annotation present and right.
            listed = (await s.list_tools()).tools
            names = {t.name for t in listed}
            check(names == set(TOOLS), "the tool list is exactly the expected one", sorted(names))
            for tool in listed:
                a = tool.annotations
                check(a is not None, f"{tool.name} has annotations")
                got = (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint)
                check(got == TOOLS[tool.name], f"{tool.name} annotations", got)
                check(len(tool.description or "") > 80, f"{tool.name} has a description")
                check(tool.input_schema.get("type") == "object", f"{tool.name} has an input schema")
            schema = next(t for t in listed if t.name == "read_file").input_schema
            check(schema.get("required") == ["path"], "read_file requires only path", schema)
            check("description" in schema["properties"]["offset"], "fields are documented", schema)

            # Files.
            text = await expect_ok(s, "write_file", {"path": "src/hello.txt", "content": "one\ntwo\nthree\n"}, "write a new file in a new directory")
            check("wrote 14 bytes" in text, "write_file says what it wrote", text)
            with open(os.path.join(ws, "src/hello.txt")) as f:
                check(f.read() == "one\ntwo\nthree\n", "the file is on disk")
            text = await expect_ok(s, "read_file", {"path": "src/hello.txt"}, "read it back")
            check(text == "     1\tone\n     2\ttwo\n     3\tthree\n", "read_file numbers lines like cat -n", text)
            text = await expect_ok(s, "read_file", {"path": "src/hello.txt", "offset": 2, "limit": 1}, "read one line")
            check(text.startswith("     2\ttwo\n") and "continue with offset 3" in text, "offset and limit", text)

            for bad in ["../x", "/etc/passwd", "src/../../x"]:
                text = await expect_error(s, "read_file", {"path": bad}, f"read {bad}")
                check("refused" in text and "workspace" in text, f"reading {bad} is refused with the reason", text)
            text = await expect_error(s, "write_file", {"path": "../outside-target", "content": "x"}, "write outside")
            check(not os.path.exists(outside), "nothing was written outside", text)

            await expect_ok(s, "write_file", {"path": "dup.py", "content": "x = 1\ny = 2\nx = 1\n"}, "write a file to edit")
            text = await expect_error(s, "edit_file", {"path": "dup.py", "old_string": "x = 1", "new_string": "x = 3"}, "non-unique edit")
            check("2 times" in text, "the error says how many matches", text)
            text = await expect_error(s, "edit_file", {"path": "dup.py", "old_string": "nope", "new_string": "x"}, "edit with no match")
            check("0 matches" in text, "the error says there was no match", text)
            text = await expect_ok(s, "edit_file", {"path": "dup.py", "old_string": "y = 2", "new_string": "y = 5"}, "unique edit")
            check("y = 5" in text, "the edit is shown", text)
            await expect_ok(s, "edit_file", {"path": "dup.py", "old_string": "x = 1", "new_string": "x = 3", "replace_all": True}, "replace_all edit")
            with open(os.path.join(ws, "dup.py")) as f:
                check(f.read() == "x = 3\ny = 5\nx = 3\n", "the edits are on disk")

            text = await expect_ok(s, "list_dir", {}, "list the root")
            check(re.search(r"^dir\s+-\s+src/$", text, re.M) and re.search(r"^file\s+18\s+dup\.py$", text, re.M), "list_dir shows kind, size and name", text)
            await expect_error(s, "list_dir", {"path": ".."}, "list the parent")

            await expect_ok(s, "write_file", {"path": ".gitignore", "content": "build/\n"}, "write a .gitignore")
            await expect_ok(s, "write_file", {"path": "build/gen.txt", "content": "generated three\n"}, "write an ignored file")
            text = await expect_ok(s, "glob", {"pattern": "*.txt"}, "glob")
            check(text.split() == ["src/hello.txt"], "glob finds files by name and skips .gitignore'd ones", text)
            text = await expect_ok(s, "glob", {"pattern": "**/*", "path": "src"}, "glob below a directory")
            check(text.split() == ["src/hello.txt"], "glob returns workspace-relative paths", text)
            await expect_error(s, "glob", {"pattern": "*", "path": "/etc"}, "glob outside")
            text = await expect_ok(s, "grep", {"pattern": "th?ree"}, "grep")
            check(text.strip() == "src/hello.txt:3:three", "grep answers path:line:text, skipping ignored files", text)
            text = await expect_ok(s, "grep", {"pattern": "X = 3", "case_insensitive": True, "glob": "*.py"}, "grep case-insensitive with a glob")
            check(text.split("\n")[:2] == ["dup.py:1:x = 3", "dup.py:3:x = 3"], "grep -i with glob", text)
            await expect_error(s, "grep", {"pattern": "("}, "grep with a bad regex")

            # Commands.
            text = await expect_ok(s, "run_command", {"command": "echo hi; echo oops >&2; exit 3"}, "a failing command")
            check("exit code: 3" in text and "hi" in text and "oops" in text, "exit code and both streams", text)
            text = await expect_ok(s, "run_command", {"command": "pwd", "cwd": "src"}, "a command in a subdirectory")
            check(text.rstrip().endswith("/src"), "cwd applies", text)
            text = await expect_error(s, "run_command", {"command": "pwd", "cwd": "../"}, "cwd outside")
            check("refused" in text, "a cwd outside the workspace is refused", text)
            text = await expect_ok(s, "run_command", {"command": "seq 1 100000"}, "a long output")
            check(text.count("bytes cut") == 1 and "\n1\n2\n" in text and text.rstrip().endswith("100000"), "long output keeps head and tail with a marker", text[:300] + " ... " + text[-300:])

            text = await expect_error(s, "run_command", {"command": "sleep 30", "timeout_secs": 1}, "a command past its deadline")
            check("timed out" in text and "Do not retry" in text, "the timeout says not to retry blindly", text)

            text = await expect_ok(s, "run_command", {"command": "echo started; sleep 30", "wait_secs": 1}, "a command that outlives the wait")
            m = re.search(r"process handle: (\d+)", text)
            check(m is not None and "still running after 1 s" in text, "it returns a handle and the output so far", text)
            pid = int(m.group(1))
            text = await expect_ok(s, "list_processes", {}, "list processes")
            check(f"process {pid}: running" in text, "the process is listed as running", text)
            text = await expect_ok(s, "read_output", {"process": pid, "wait_secs": 10}, "read its output")
            check("started" in text and "next offset" in text, "read_output gives stdout and the next offset", text)
            text = await expect_ok(s, "kill_process", {"process": pid}, "kill it")
            check("killed" in text and "signal" in text, "kill_process says how it ended", text)
            text = await expect_ok(s, "read_output", {"process": pid, "offset": 8}, "read after the kill")
            check("end of stdout" in text, "the stream has ended", text)
            await expect_error(s, "read_output", {"process": 999999}, "an unknown process")

            text = await expect_ok(s, "run_command", {"command": "read line; echo got $line", "wait_secs": 0, "keep_stdin_open": True}, "a command reading stdin")
            pid = int(re.search(r"process handle: (\d+)", text).group(1))
            await expect_ok(s, "send_input", {"process": pid, "data": "hello\n"}, "send it a line")
            text = await expect_ok(s, "read_output", {"process": pid, "wait_secs": 10}, "read its answer")
            for _ in range(50):
                if "got hello" in text:
                    break
                await asyncio.sleep(0.1)
                text = await expect_ok(s, "read_output", {"process": pid, "wait_secs": 1}, "read its answer again")
            check("got hello" in text, "send_input reached the process", text)

            # Sessions.
            text = await expect_ok(s, "open_session", {}, "open a session")
            sid = int(re.search(r"session (\d+) is open", text).group(1))
            await expect_ok(s, "run_command", {"command": "export X=1; cd src", "session": sid}, "set state in the session")
            text = await expect_ok(s, "run_command", {"command": "echo X=$X; pwd", "session": sid}, "read it back")
            check("X=1" in text and "/src" in text, "the session keeps variables and cwd", text)
            text = await expect_ok(s, "run_command", {"command": "echo X=$X"}, "outside the session")
            check("X=1" not in text, "a command outside the session does not see them", text)
            await expect_error(s, "run_command", {"command": "pwd", "session": sid, "cwd": "src"}, "cwd with a session")
            await expect_ok(s, "close_session", {"session": sid}, "close it")
            await expect_error(s, "run_command", {"command": "true", "session": sid}, "use a closed session")

            # A sandbox that is not copy-on-write has nothing to review.
            text = await expect_error(s, "workspace_changes", {}, "the changes of a plain sandbox")
            check("not copy-on-write" in text and "--cow" in text, "the error says to start with --cow", text)
            text = await expect_error(s, "commit", {}, "a commit on a plain sandbox")
            check("--cow" in text, "the error says to start with --cow", text)

            # Bad input is a tool error, not a protocol error.
            text = await expect_error(s, "run_command", {}, "a missing argument")
            check("command" in text, "the error names the missing field", text)
            await expect_error(s, "read_file", {"path": "src/hello.txt", "bogus": 1}, "an unknown argument")
            await expect_error(s, "read_file", {"path": "src/hello.txt", "offset": "two"}, "a wrongly typed argument")
            await expect_error(s, "run_command", {"command": "true", "timeout_secs": 10**9}, "an out-of-range timeout")
            # The server is still fine after all of that.
            text = await expect_ok(s, "run_command", {"command": "echo still here"}, "the server survived")
            check("still here" in text, "the sandbox is still usable", text)
    print("all checks passed")


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        sys.exit(64)
    hako, backend, ws, audit = sys.argv[1:]
    try:
        asyncio.run(run(hako, backend, ws, audit))
    except Failed as exc:
        print(f"FAILED: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
