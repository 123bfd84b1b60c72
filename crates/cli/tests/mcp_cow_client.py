#!/usr/bin/env python3
"""Drives `hako mcp --cow` with the official Python MCP SDK (PyPI `mcp`):
a command writes in a copy-on-write sandbox, `workspace_changes` shows it,
a checkpoint, more writes, `rollback` (which ends the sandbox's processes),
the writes gone and the workspace untouched; `commit` refused without
`--allow-agent-commit`, then a second server with it commits exactly what
was reviewed.

Usage: mcp_cow_client.py HAKO WORKSPACE STATE AUDIT_1 AUDIT_2

Exits 0 when every check passed, 1 (with the failed check) otherwise, and
2 when the `mcp` package is missing.
"""

import asyncio
import json
import os
import re
import sys

try:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
except ImportError as exc:  # the Rust test decides whether this may skip
    print(f"SKIP: the Python mcp package is not installed ({exc}); python3 -m pip install mcp")
    sys.exit(2)


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


def read(ws, name):
    try:
        with open(os.path.join(ws, name)) as f:
            return f.read()
    except FileNotFoundError:
        return None


def server(hako, ws, state, audit, extra):
    env = {k: v for k, v in os.environ.items() if k.startswith("HAKO_") or k in ("PATH", "TMPDIR")}
    return StdioServerParameters(
        command=hako,
        args=["mcp", "--backend", "linux", "--workspace", ws, "--cow", "--name", "agent",
              "--state", state, "--audit", audit] + extra,
        env=env,
    )


async def first(hako, ws, state, audit):
    async with stdio_client(server(hako, ws, state, audit, [])) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            for name in ["workspace_changes", "checkpoint", "list_checkpoints", "rollback"]:
                check(name in names, f"{name} is offered", sorted(names))
            check("commit" not in names and "discard" not in names,
                  "commit and discard are not offered without --allow-agent-commit", sorted(names))

            await expect_ok(s, "run_command", {"command": "echo one > a.txt"}, "a command writes")
            check(read(ws, "a.txt") is None, "the workspace is untouched")
            text = await expect_ok(s, "workspace_changes", {}, "the changes")
            check("+++ b/a.txt" in text and "+one" in text and re.search(r"^# hash: [0-9a-f]{64}$", text, re.M),
                  "workspace_changes shows the command's write and the hash", text)
            text = await expect_ok(s, "checkpoint", {"label": "turn1"}, "a checkpoint")
            check(text.startswith("checkpoint 1 "), "the checkpoint's number is returned", text)

            await expect_ok(s, "run_command", {"command": "echo two > b.txt; rm base.txt; echo again >> a.txt"}, "more writes")
            await expect_ok(s, "write_file", {"path": "c.txt", "content": "through the fence\n"}, "a write through the fence")
            text = await expect_ok(s, "run_command", {"command": "sleep 299; echo cow-left-running", "wait_secs": 0}, "a process left running")
            pid = int(re.search(r"process handle: (\d+)", text).group(1))
            text = await expect_ok(s, "workspace_changes", {"format": "json"}, "the changes as JSON")
            paths = [c["path"] for c in json.loads(text)["changes"]]
            check(paths == ["a.txt", "b.txt", "base.txt", "c.txt"], "every change is listed", paths)
            text = await expect_ok(s, "workspace_changes", {"format": "stat", "paths": ["b.txt"]}, "the changes of one path")
            check("b.txt" in text and "a.txt" not in text, "paths narrow the changes", text)
            text = await expect_ok(s, "workspace_changes", {"from": 1}, "the changes since the checkpoint")
            check("+again" in text and "+++ b/b.txt" in text and "+one" not in text, "from compares with the checkpoint", text)
            text = await expect_ok(s, "list_checkpoints", {}, "the checkpoints")
            check("checkpoint 1\tlabel turn1" in text, "list_checkpoints lists it", text)

            text = await expect_ok(s, "rollback", {"checkpoint": "turn1"}, "a rollback")
            check("rolled back to checkpoint 1" in text, "rollback names the checkpoint", text)
            text = await expect_ok(s, "run_command", {"command": "cat a.txt; ls"}, "look after the rollback")
            check("one" in text and "again" not in text and "b.txt" not in text and "c.txt" not in text and "base.txt" in text,
                  "the writes after the checkpoint are gone", text)
            text = await expect_error(s, "read_output", {"process": pid}, "the process of the closed sandbox")
            check(f"no process {pid}" in text, "its handle no longer works", text)
            text = await expect_ok(s, "workspace_changes", {"from": "1"}, "the changes since the checkpoint again")
            check("no changes" in text, "the view is the checkpoint's", text)
            check(read(ws, "a.txt") is None and read(ws, "base.txt") == "base\n" and read(ws, "b.txt") is None,
                  "the workspace is untouched")
            await expect_error(s, "rollback", {"checkpoint": 9}, "a rollback to no checkpoint")

            text = await expect_error(s, "commit", {}, "an agent's commit")
            check("--allow-agent-commit" in text and "hako commit agent" in text,
                  "the refusal names the flag and hako commit", text)
            await expect_error(s, "discard", {}, "an agent's discard")
            check(read(ws, "a.txt") is None, "nothing was committed")
            text = await expect_ok(s, "run_command", {"command": "echo still here"}, "the sandbox after the refusals")
            check("still here" in text, "the sandbox is still usable", text)


async def second(hako, ws, state, audit):
    async with stdio_client(server(hako, ws, state, audit, ["--allow-agent-commit"])) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            check("commit" in names and "discard" in names, "commit and discard are offered with --allow-agent-commit", sorted(names))
            text = await expect_ok(s, "workspace_changes", {}, "the changes kept by the name")
            check("+one" in text, "a second server continues on the named layers", text)
            reviewed = re.search(r"^# hash: ([0-9a-f]{64})$", text, re.M).group(1)
            text = await expect_error(s, "commit", {"expect": "0" * 64}, "a commit of another diff")
            check("not the ones reviewed" in text, "a stale hash is refused", text)
            check(read(ws, "a.txt") is None, "nothing was committed")
            text = await expect_ok(s, "commit", {"expect": reviewed}, "the commit of what was reviewed")
            check("added a.txt sha256:" in text, "commit says what it wrote", text)
            check(read(ws, "a.txt") == "one\n" and read(ws, "base.txt") == "base\n", "the workspace has the change")
            text = await expect_ok(s, "workspace_changes", {}, "the changes after the commit")
            check("no changes" in text, "nothing is left to commit", text)
            await expect_ok(s, "run_command", {"command": "echo scratch > d.txt"}, "a write to throw away")
            text = await expect_ok(s, "discard", {"paths": ["d.txt"]}, "a discard")
            check("discarded d.txt" in text, "discard names what it threw away", text)
            text = await expect_ok(s, "run_command", {"command": "ls"}, "look after the discard")
            check("d.txt" not in text and "a.txt" in text, "the discarded write is gone", text)
            check(read(ws, "d.txt") is None, "the workspace never had it")


async def run(hako, ws, state, audit1, audit2):
    with open(os.path.join(ws, "base.txt"), "w") as f:
        f.write("base\n")
    await first(hako, ws, state, audit1)
    await second(hako, ws, state, audit2)
    print("all checks passed")


def main():
    if len(sys.argv) != 6:
        print(__doc__)
        sys.exit(64)
    try:
        asyncio.run(run(*sys.argv[1:]))
    except Failed as exc:
        print(f"FAILED: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
