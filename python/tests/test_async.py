"""The asyncio API: the same calls, the output stream, and 20 sandboxes
from 20 tasks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import hako


def arun(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_async_run_files_sessions_and_capabilities(workspace: Path) -> None:
    async def go() -> None:
        async with hako.AsyncSandbox(backend="linux", workspace=workspace) as sb:
            r = await sb.run("echo hi; exit 4")
            assert (r.exit_code, r.stdout) == (4, "hi\n")
            r = await sb.run(["cat"], stdin=b"\x00\xff", binary=True)
            assert r.stdout_bytes == b"\x00\xff"
            assert (await sb.run("sleep 30", timeout=0.5)).timed_out
            await sb.files.write("d/a.txt", "content")
            assert await sb.files.read("d/a.txt") == "content"
            assert [e.name for e in await sb.files.list("d")] == ["a.txt"]
            assert (await sb.files.stat("d/a.txt")).size == 7
            await sb.files.mkdir("e/f")
            assert await sb.files.exists("e/f")
            await sb.files.remove("d/a.txt")
            assert not await sb.files.exists("d/a.txt")
            with pytest.raises(hako.FenceError):
                await sb.files.read("../x")
            with pytest.raises(hako.FileNotFound):
                await sb.files.read("missing")
            with pytest.raises(hako.CommandNotFound):
                await sb.run(["no-such-command-here"])
            async with await sb.session() as s:
                await s.run("cd e && Y=7")
                r = await s.run("echo $Y; pwd")
                assert r.stdout.splitlines()[0] == "7" and r.stdout.strip().endswith("/e")
            assert (await sb.capabilities)["backend"] == "linux"
            p = await sb.spawn(["sh", "-c", "read x; echo got-$x"])
            await p.write("it\n")
            st = await p.wait(timeout=30)
            assert st.exit_code == 0
            out, _ = await p.read()
            assert out == "got-it\n"

    arun(go())


def test_async_stream_yields_chunks_then_the_result(workspace: Path) -> None:
    async def go() -> None:
        async with hako.AsyncSandbox(backend="linux", workspace=workspace) as sb:
            items = []
            s = sb.stream("for i in 1 2 3; do echo $i; sleep 0.05; done; echo bad >&2; exit 2")
            async for kind, data in s:
                items.append((kind, data))
            assert items[-1][0] == "exit" and s.result is items[-1][1]
            out = "".join(d for k, d in items if k == "stdout")  # type: ignore[misc]
            err = "".join(d for k, d in items if k == "stderr")  # type: ignore[misc]
            assert out == "1\n2\n3\n" and err == "bad\n"
            assert s.result is not None and s.result.exit_code == 2
            got: list = []

            async def on_out(d: str) -> None:
                got.append(d)

            r = await sb.run("echo a; echo b", on_stdout=on_out)
            assert "".join(got) == "a\nb\n" and r.ok

    arun(go())


def test_twenty_sandboxes_from_twenty_asyncio_tasks(tmp_path: Path) -> None:
    async def one(i: int) -> str:
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        async with hako.AsyncSandbox(backend="linux", workspace=ws) as sb:
            await sb.files.write("me.txt", f"task {i}")
            r = await sb.run("cat me.txt; ls | wc -l")
            return r.stdout

    async def go() -> None:
        outs = await asyncio.gather(*(one(i) for i in range(20)))
        assert outs == [f"task {i}1\n" for i in range(20)]

    arun(go())


def test_many_commands_at_once_in_one_async_sandbox(workspace: Path) -> None:
    async def go() -> None:
        async with hako.AsyncSandbox(backend="linux", workspace=workspace) as sb:
            rs = await asyncio.gather(*(sb.run(["echo", str(i)]) for i in range(40)))
            assert [r.stdout for r in rs] == [f"{i}\n" for i in range(40)]

    arun(go())
