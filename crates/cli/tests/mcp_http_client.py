#!/usr/bin/env python3
"""Drives `hako mcp --http` with the official Python MCP SDK (PyPI `mcp`)
over streamable HTTP, after checking with plain HTTP requests that nothing
is reachable without the bearer token.

Usage: mcp_http_client.py URL TOKEN_FILE WORKSPACE AUDIT_LOG

URL is the server's endpoint (http://127.0.0.1:PORT/mcp), already
listening; the server is started and stopped by the caller.

Exits 0 when every check passed, 1 (with the failed check) otherwise, and
2 when the `mcp` package is missing.
"""

import asyncio
import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

try:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
except ImportError as exc:  # the Rust test decides whether this may skip
    print(f"SKIP: the Python mcp package is not installed ({exc}); python3 -m pip install mcp")
    sys.exit(2)

TOOLS = {
    "read_file", "write_file", "edit_file", "list_dir", "glob", "grep",
    "run_command", "open_session", "close_session", "read_output",
    "send_input", "kill_process", "list_processes",
}

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "intruder", "version": "0"},
    },
}

WRITE_CALL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "write_file", "arguments": {"path": "intruder.txt", "content": "x"}},
}


class Failed(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failed(f"{what}\n--- got ---\n{detail}")
    print(f"ok: {what}")


def post(url, body, headers):
    """A plain urllib POST: (status, headers, body), whatever the status."""
    data = json.dumps(body).encode()
    all_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **headers,
    }
    req = urllib.request.Request(url, data=data, headers=all_headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read().decode(errors="replace")


def request(url, method, headers):
    req = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def audit_kinds(audit):
    """The (kind, op) of every record written so far."""
    if not os.path.exists(audit):
        return []
    with open(audit) as f:
        return [(r.get("kind"), r.get("op")) for r in map(json.loads, filter(None, f.read().splitlines()))]


def nothing_touched(ws, audit, what):
    check(not os.path.exists(os.path.join(ws, "intruder.txt")), f"{what}: no file was written")
    kinds = audit_kinds(audit)
    check(all(kind != "sandbox" for kind, _ in kinds), f"{what}: no sandbox was opened", kinds)


def refusals(url, token, ws, audit):
    # No token, a wrong one, another scheme: 401, no session, nothing run.
    for name, headers in [
        ("no token", {}),
        ("a wrong token", {"Authorization": "Bearer " + "0" * len(token)}),
        ("a token one character short", {"Authorization": "Bearer " + token[:-1]}),
        ("basic auth", {"Authorization": "Basic " + token}),
    ]:
        for body in (INITIALIZE, WRITE_CALL):
            status, resp_headers, text = post(url, body, headers)
            check(status == 401, f"{body['method']} with {name} is 401", f"{status} {text}")
            check(resp_headers.get("mcp-session-id") is None, f"{body['method']} with {name} creates no session", dict(resp_headers))
            check(resp_headers.get("www-authenticate", "").lower().startswith("bearer"), f"{name}: the 401 names the Bearer scheme", dict(resp_headers))
        for method in ("GET", "DELETE"):
            status = request(url, method, {"Accept": "text/event-stream", **headers})
            check(status == 401, f"{method} with {name} is 401", status)
    nothing_touched(ws, audit, "without the token")

    good = {"Authorization": f"Bearer {token}"}
    # DNS rebinding: the right token, a foreign Host.
    port = urllib.parse.urlsplit(url).port
    for host in (f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", "localhost:1"):
        status, _, text = post(url, INITIALIZE, {**good, "Host": host})
        check(status == 403, f"Host {host} is refused with 403", f"{status} {text}")
    # A browser page's request carries an Origin.
    status, _, text = post(url, INITIALIZE, {**good, "Origin": "http://evil.example"})
    check(status == 403, "a request with an Origin is refused with 403", f"{status} {text}")
    # Another path.
    status, _, text = post(url.rsplit("/", 1)[0] + "/other", INITIALIZE, good)
    check(status == 404, "another path is 404", f"{status} {text}")
    # A body declared larger than the bound is refused before it is read.
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.putrequest("POST", parts.path)
    conn.putheader("Authorization", good["Authorization"])
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Accept", "application/json, text/event-stream")
    conn.putheader("Content-Length", str(1 << 30))
    conn.endheaders()
    resp = conn.getresponse()
    check(resp.status == 413, "a 1 GiB body is refused with 413 before it is sent", f"{resp.status} {resp.read(500)!r}")
    conn.close()
    nothing_touched(ws, audit, "after the refused requests")


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(session, name, args, what):
    result = await session.call_tool(name, args)
    text = text_of(result)
    check(not result.is_error, f"{what} ({name} succeeds)", text)
    return text


async def session(url, token, body):
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                check(init.server_info.name == "hako", "the server says it is hako", init)
                await body(s)


async def first(s, ws):
    names = {t.name for t in (await s.list_tools()).tools}
    check(names == TOOLS, "the tool list is the stdio server's", sorted(names))
    text = await call(s, "write_file", {"path": "notes/hello.txt", "content": "hello over http\n"}, "write a file")
    check("wrote 16 bytes" in text, "write_file says what it wrote", text)
    with open(os.path.join(ws, "notes/hello.txt")) as f:
        check(f.read() == "hello over http\n", "the file is on disk")
    text = await call(s, "run_command", {"command": "cat notes/hello.txt; echo ran > notes/ran.txt; echo exit-ok"}, "run a command")
    check("hello over http" in text and "exit-ok" in text, "the command's output comes back", text)
    text = await call(s, "read_file", {"path": "notes/ran.txt"}, "read what the command wrote")
    check(text == "     1\tran\n", "read_file returns the command's file", text)


async def second(s, ws):
    # A second session works in the same sandbox and the same workspace.
    text = await call(s, "read_file", {"path": "notes/hello.txt"}, "read from a second session")
    check("hello over http" in text, "the second session sees the first one's file", text)


async def run(url, token, ws, audit):
    refusals(url, token, ws, audit)
    await session(url, token, lambda s: first(s, ws))
    await session(url, token, lambda s: second(s, ws))
    opened = [k for k in audit_kinds(audit) if k == ("sandbox", "open")]
    check(len(opened) == 1, "two sessions share one sandbox", audit_kinds(audit))


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        sys.exit(64)
    url, token_file, ws, audit = sys.argv[1:]
    with open(token_file) as f:
        token = f.read().strip()
    try:
        asyncio.run(run(url, token, ws, audit))
    except Failed as failed:
        print(f"FAILED: {failed}")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
