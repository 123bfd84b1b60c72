"""Remote mode: the same API against a `hako serve` this test starts, with
its URL and token; policy arguments refused there."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Iterator, Tuple

import pytest

import hako


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Tuple[str, str, Path]]:
    ws = tmp_path / "remote-ws"
    ws.mkdir()
    token = secrets.token_hex(24)
    tf = tmp_path / "token"
    tf.write_text(token)
    tf.chmod(0o600)
    proc = subprocess.Popen(
        [hako.find_binary(), "serve", "--backend", "linux", "--workspace", str(ws),
         "--listen", "127.0.0.1:0", "--token-file", str(tf), "--ready-json",
         "--exit-on-stdin-eof", "--max-output", "2K"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    url = json.loads(proc.stdout.readline())["url"]
    try:
        yield url, token, ws
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(60)


def test_remote_mode_runs_the_same_api(server: Tuple[str, str, Path]) -> None:
    url, token, ws = server
    with hako.Sandbox(url=url, token=token) as sb:
        assert sb._server is None
        assert sb.run("echo remote").stdout == "remote\n"
        assert sb.run("head -c 5000 /dev/zero").stdout_truncated
        sb.files.write("r.txt", "over http")
        assert (ws / "r.txt").read_text() == "over http"
        assert sb.files.read("r.txt") == "over http"
        with pytest.raises(hako.FenceError):
            sb.files.read("../token")
        with sb.session() as s:
            s.run("Z=1")
            assert s.run("echo $Z").stdout == "1\n"
        assert sb.capabilities["backend"] == "linux"
    # Two sandboxes on one server, from the environment's URL and token.
    env_before = dict(os.environ)
    os.environ["HAKO_URL"], os.environ["HAKO_TOKEN"] = url, token
    try:
        with hako.Sandbox() as a, hako.Sandbox() as b:
            assert a.id != b.id
            assert a.run("echo a").stdout == "a\n" and b.run("echo b").stdout == "b\n"
    finally:
        os.environ.clear()
        os.environ.update(env_before)


def test_remote_async(server: Tuple[str, str, Path]) -> None:
    import asyncio

    url, token, _ = server

    async def go() -> None:
        async with hako.AsyncSandbox(url=url, token=token) as sb:
            assert (await sb.run("echo async-remote")).stdout == "async-remote\n"

    asyncio.run(go())


def test_remote_mode_refuses_policy_arguments(server: Tuple[str, str, Path]) -> None:
    url, token, _ = server
    with pytest.raises(ValueError) as e:
        hako.Sandbox(url=url, token=token, backend="linux", memory="1G")
    assert "backend" in str(e.value) and "memory" in str(e.value)
    with pytest.raises(ValueError):
        hako.AsyncSandbox(url=url, token=token, net="host")
    with pytest.raises(ValueError):
        hako.Sandbox(url=url)


def test_a_wrong_token_is_an_auth_error(server: Tuple[str, str, Path]) -> None:
    url, _, _ = server
    with pytest.raises(hako.AuthError) as e:
        hako.Sandbox(url=url, token="wrong-token")
    assert e.value.status == 401
