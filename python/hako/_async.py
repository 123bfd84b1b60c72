"""The asyncio client: :class:`AsyncSandbox` and what it hands out, over a
minimal HTTP/1.1 client of its own (no third-party dependency)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    BinaryIO,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import _common as c
from ._errors import (
    CommandTimeout,
    FileNotFound,
    HakoError,
    LimitReached,
    SandboxClosed,
    SandboxLost,
    ServerError,
)
from ._sync import _entry, _is_busy, _stat, _BUSY_PAUSE, _BUSY_TRIES, _IDLE
from ._types import FileInfo, ProcessState, RunResult

Chunk = Tuple[str, Union[str, bytes, int, RunResult]]
"""One item of :class:`RunStream`: ``("stdout"|"stderr", data)``,
``("dropped", bytes_dropped)``, and last ``("exit", RunResult)``."""

_MAX_HEAD = 64 * 1024


class _Conn:
    """One HTTP/1.1 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.since = time.monotonic()

    def close(self) -> None:
        try:
            self.writer.close()
        except (OSError, RuntimeError):
            pass


class _Resp:
    """An answer: its head read, its body read by :meth:`read` or
    :meth:`lines`."""

    def __init__(self, conn: _Conn, status: int, headers: Dict[str, str]) -> None:
        self.conn = conn
        self.status = status
        self.headers = headers
        self.keep = headers.get("connection", "").lower() != "close"
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self.length: Optional[int] = int(length) if length is not None else None
        if not self.chunked and self.length is None:
            self.keep = False
        self.done = False

    async def _chunks(self) -> AsyncIterator[bytes]:
        r = self.conn.reader
        if self.chunked:
            while True:
                size_line = await r.readline()
                if not size_line:
                    raise ConnectionError("the answer's chunked body was cut")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers, then the blank line.
                    while True:
                        t = await r.readline()
                        if t in (b"\r\n", b"\n", b""):
                            break
                    break
                data = await r.readexactly(size)
                await r.readexactly(2)
                yield data
        elif self.length is not None:
            left = self.length
            while left > 0:
                data = await r.read(min(left, 1 << 20))
                if not data:
                    raise ConnectionError("the answer's body was cut")
                left -= len(data)
                yield data
        else:
            while True:
                data = await r.read(1 << 20)
                if not data:
                    break
                yield data
        self.done = True

    async def read(self) -> bytes:
        """The whole body."""
        parts = [d async for d in self._chunks()]
        return b"".join(parts)

    async def lines(self) -> AsyncIterator[bytes]:
        """The body, line by line."""
        buf = b""
        async for d in self._chunks():
            buf += d
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                yield line
        if buf:
            yield buf


class _APool:
    """Kept-alive connections to one server."""

    def __init__(self, url: str, token: str) -> None:
        self.host, self.port = c.split_url(url)
        self.auth = f"Bearer {token}"
        self._idle: List[_Conn] = []
        self.closed = False

    async def _take(self) -> Tuple[_Conn, bool]:
        while self._idle:
            conn = self._idle.pop()
            if time.monotonic() - conn.since < _IDLE and not conn.reader.at_eof():
                return conn, True
            conn.close()
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=_MAX_HEAD * 16)
        except OSError as e:
            raise ServerError(
                f"cannot reach the hako server at {self.host}:{self.port}: {e}", "connection"
            ) from e
        return _Conn(reader, writer), False

    def give(self, resp: _Resp) -> None:
        """Returns a connection whose answer was read whole."""
        if resp.keep and resp.done and not self.closed:
            resp.conn.since = time.monotonic()
            self._idle.append(resp.conn)
        else:
            resp.conn.close()

    def close(self) -> None:
        """Closes every idle connection."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _send(self, method: str, path: str, body: Optional[bytes], content_type: str) -> _Resp:
        head = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            f"Authorization: {self.auth}",
            f"Content-Length: {len(body) if body is not None else 0}",
        ]
        if body is not None:
            head.append(f"Content-Type: {content_type}")
        raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        while True:
            conn, reused = await self._take()
            try:
                conn.writer.write(raw)
                await conn.writer.drain()
                status_line = await conn.reader.readline()
                if not status_line:
                    raise ConnectionResetError("the server closed the connection")
                parts = status_line.decode("latin-1").split(" ", 2)
                status = int(parts[1])
                headers: Dict[str, str] = {}
                size = len(status_line)
                while True:
                    h = await conn.reader.readline()
                    size += len(h)
                    if size > _MAX_HEAD:
                        raise ConnectionError("the answer's head is too long")
                    if h in (b"\r\n", b"\n"):
                        break
                    if not h:
                        raise ConnectionResetError("the answer's head was cut")
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                return _Resp(conn, status, headers)
            except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
                conn.close()
                if reused:
                    continue
                raise SandboxLost(f"the server closed the connection: {e}", "connection") from e
            except BaseException:
                conn.close()
                raise

    async def open(
        self, method: str, path: str, body: Optional[bytes] = None, content_type: str = "application/json"
    ) -> Tuple[_Resp, Optional[bytes]]:
        """Sends a request: the answer, and its body when it was read
        already (an error answer). 503 ``busy`` is retried after a pause."""
        pause = _BUSY_PAUSE
        attempt = 0
        while True:
            resp = await self._send(method, path, body, content_type)
            if resp.status < 400:
                return resp, None
            data = await self.read(resp)
            attempt += 1
            if resp.status != 503 or not _is_busy(data) or attempt > _BUSY_TRIES:
                return resp, data
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def read(self, resp: _Resp) -> bytes:
        """The answer's whole body; its connection back to the pool."""
        try:
            data = await resp.read()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
            resp.conn.close()
            raise SandboxLost(f"the server's answer was cut: {e}", "connection") from e
        except BaseException:
            resp.conn.close()
            raise
        self.give(resp)
        return data

    async def request(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        timeout: Optional[float] = None,
    ) -> Tuple[int, Dict[str, str], bytes]:
        """One request, its answer read whole; raises the error it carries."""

        async def go() -> Tuple[int, Dict[str, str], bytes]:
            resp, data = await self.open(method, path, body, content_type)
            if data is None:
                data = await self.read(resp)
            c.raise_for(resp.status, data)
            return resp.status, resp.headers, data

        if timeout is None:
            return await go()
        try:
            return await asyncio.wait_for(go(), timeout)
        except asyncio.TimeoutError as e:
            raise CommandTimeout(f"no answer to {method} {path.split('?')[0]} within {timeout} s") from e

    async def json(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None) -> Any:
        """A JSON request and its JSON answer."""
        raw = None if body is None else json.dumps(body).encode()
        _, _, data = await self.request(method, path, raw, timeout=timeout)
        return json.loads(data) if data else None


class _AServer:
    """A private ``hako serve`` with its stdin as lifeline (asyncio)."""

    proc: "asyncio.subprocess.Process"

    def __init__(self) -> None:
        self.dir = ""
        self.token = ""
        self.url = ""
        self.log: Optional[BinaryIO] = None

    async def start(self, flags: Sequence[str], profile: Optional[str] = None) -> None:
        binary = c.find_binary()
        self.dir, token_path, self.token = c.token_file()
        if profile is not None:
            flags = ["--profile", c.write_private(self.dir, "profile.toml", profile), *flags]
        try:
            try:
                w, self.log = c.open_log(self.dir)
                with w:
                    self.proc = await asyncio.create_subprocess_exec(
                        *c.serve_argv(binary, token_path, flags),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=w,
                        start_new_session=True,
                    )
            except OSError as e:
                raise HakoError(f"cannot start {binary}: {e}", "no_binary") from e
            try:
                assert self.proc.stdout is not None
                try:
                    line = await asyncio.wait_for(self.proc.stdout.readline(), c.START_TIMEOUT)
                except asyncio.TimeoutError as e:
                    raise CommandTimeout(
                        f"hako serve did not say it listens within {c.START_TIMEOUT:.0f} s: "
                        + c.read_log(self.log)[-2000:]
                    ) from e
                if not line.endswith(b"\n"):
                    try:
                        code: Optional[int] = await asyncio.wait_for(self.proc.wait(), 10)
                    except asyncio.TimeoutError:
                        code = None
                    c.parse_ready(line, c.read_log(self.log), code)
                self.url = c.parse_ready(line, "", None)
            except BaseException:
                await self.stop()
                raise
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def lost(self) -> Optional[str]:
        code = self.proc.returncode
        if code is None:
            return None
        return f"hako serve exited ({code}): {c.read_log(self.log)[-2000:].strip()}"

    async def stop(self) -> None:
        """Ends the server: closes its lifeline, kills it if it lingers."""
        proc = getattr(self, "proc", None)
        if proc is not None:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except (OSError, RuntimeError):
                    pass
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self.log is not None:
            self.log.close()


class AsyncFiles:
    """A sandbox's files (``sb.files``), as :class:`hako.Files`, async."""

    def __init__(self, sb: "AsyncSandbox") -> None:
        self._sb = sb

    async def read(self, path: c.PathLike, text: bool = True) -> Union[str, bytes]:
        """The file's content: ``str`` with ``text``, else bytes."""
        _, headers, data = await self._sb._call("GET", "files" + c.path_query(path))
        if headers.get("x-hako-truncated") == "true":
            raise LimitReached(
                f"{os.fspath(path)} is larger than one read returns ({len(data)} bytes)", "too_large"
            )
        return data.decode("utf-8") if text else data

    async def write(self, path: c.PathLike, data: Union[str, bytes]) -> None:
        """Writes the file atomically (missing parent directories made)."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        await self._sb._call("PUT", "files" + c.path_query(path), raw, "application/octet-stream")

    async def list(self, path: c.PathLike = ".") -> List[FileInfo]:
        """The directory's entries."""
        v = await self._sb._json("GET", "dir" + c.path_query(path))
        return [_entry(e) for e in v.get("entries", [])]

    async def remove(self, path: c.PathLike) -> None:
        """Removes a file, a symlink or an empty directory."""
        await self._sb._call("DELETE", "files" + c.path_query(path))

    async def mkdir(self, path: c.PathLike) -> None:
        """Makes the directory and its missing parents."""
        await self._sb._call("POST", "dir" + c.path_query(path))

    async def stat(self, path: c.PathLike) -> FileInfo:
        """The path's metadata."""
        return _stat(await self._sb._json("GET", "stat" + c.path_query(path)), path)

    async def exists(self, path: c.PathLike) -> bool:
        """Whether the path exists."""
        try:
            await self.stat(path)
            return True
        except FileNotFound:
            return False


class AsyncSession:
    """A shell session (``await sb.session()``); ``async with`` closes it."""

    def __init__(self, sb: "AsyncSandbox", sid: int) -> None:
        self._sb = sb
        self.id = sid
        self.closed = False

    async def run(self, cmd: str, timeout: Optional[float] = None) -> RunResult:
        """Runs a shell command in the session."""
        if self.closed:
            raise SandboxClosed(f"session {self.id} is closed", "no_such_session")
        if not isinstance(cmd, str):
            raise TypeError("a session runs shell command strings")
        timeout = self._sb._timeout(timeout)
        body = c.exec_body(cmd, timeout=timeout, session=self.id)
        return RunResult.from_json(await self._sb._json("POST", "exec", body, timeout=c.http_timeout(timeout)))

    async def close(self) -> None:
        """Closes the session and everything started in it."""
        if not self.closed:
            self.closed = True
            await self._sb._call("DELETE", f"sessions/{self.id}")

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._sb.closed:
            await self.close()


class AsyncProcess:
    """A long-lived process (``await sb.spawn(...)``), as
    :class:`hako.Process`, async."""

    def __init__(self, sb: "AsyncSandbox", pid: int) -> None:
        self._sb = sb
        self.id = pid
        self._offset = 0
        self._err_offset = 0

    @property
    def pid(self) -> int:
        """Its handle (the server's process number)."""
        return self.id

    def _path(self, tail: str = "") -> str:
        return f"processes/{self.id}{tail}"

    async def read(self, wait: float = 0.0, binary: bool = False) -> Tuple[Union[str, bytes], Union[str, bytes]]:
        """The output written since the last read: ``(stdout, stderr)``;
        waits up to ``wait`` seconds (at most 60) for some when there is
        none yet. The server keeps the last 1 MiB of stdout and 256 KiB of
        stderr of a process; output older than that is gone."""
        wait_ms = max(0, min(int(wait * 1000), 60000))
        q = f"?offset={self._offset}&stderr_offset={self._err_offset}&wait_ms={wait_ms}"
        if binary:
            q += "&encoding=base64"
        v = await self._sb._json("GET", self._path("/output") + q, timeout=wait_ms / 1000 + 60.0)
        self._offset = int(v.get("offset", self._offset))
        self._err_offset = int(v.get("stderr_offset", self._err_offset))
        out, err = v.get("stdout") or "", v.get("stderr") or ""
        return c.decode_chunk(out, binary), c.decode_chunk(err, binary)

    async def write(self, data: Union[str, bytes]) -> None:
        """Writes to its stdin."""
        await self._sb._json("POST", self._path("/stdin"), c.stdin_body(data, False))

    async def close_stdin(self) -> None:
        """Closes its stdin."""
        await self._sb._json("POST", self._path("/stdin"), c.stdin_body(None, True))

    async def kill(self) -> None:
        """Kills it."""
        await self._sb._json("POST", self._path("/kill"))

    async def state(self) -> ProcessState:
        """Its state now."""
        return ProcessState.from_json(await self._sb._json("GET", self._path()))

    async def wait(self, timeout: Optional[float] = None) -> ProcessState:
        """Waits until it ends, or ``timeout`` seconds (then ``running`` is
        still true); without a timeout, until it ends."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
            v = await self._sb._json(
                "POST", self._path("/wait") + f"?timeout_ms={int(left * 1000)}", timeout=left + 60.0
            )
            st = ProcessState.from_json(v)
            if not st.running or (deadline is not None and time.monotonic() >= deadline):
                return st


class RunStream:
    """A command's output as it comes: ``async for stream, data in
    sb.stream(cmd)``. Items are ``("stdout", data)`` and ``("stderr",
    data)``, ``("dropped", n)`` when the server dropped ``n`` bytes for a
    slow reader, and last ``("exit", RunResult)``; after the loop the result
    is also :attr:`result`."""

    def __init__(self, sb: "AsyncSandbox", body: Dict[str, Any], binary: bool) -> None:
        self._sb = sb
        self._body = body
        self._binary = binary
        self.result: Optional[RunResult] = None

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._run()

    async def _run(self) -> AsyncIterator[Chunk]:
        sb = self._sb
        sb._check()
        pool = sb._pool
        assert pool is not None
        try:
            resp, pre = await pool.open("POST", sb._base + "exec", json.dumps(self._body).encode())
        except (SandboxLost, ServerError) as e:
            raise sb._lost(e) from e
        if pre is not None:
            c.raise_for(resp.status, pre)
        ended = False
        try:
            async for line in resp.lines():
                if not line.strip():
                    continue
                ev = json.loads(line)
                if "stream" in ev:
                    yield ev["stream"], c.decode_chunk(ev.get("data", ""), self._binary)
                elif "dropped" in ev:
                    yield "dropped", int(ev["dropped"])
                elif "exit" in ev:
                    ended = True
                    self.result = RunResult.from_json(ev["exit"], self._binary)
                    yield "exit", self.result
                elif "error" in ev:
                    ended = True
                    raise c.stream_error(ev)
            if not ended:
                raise sb._lost(SandboxLost("the command's stream ended without its exit", "connection"))
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            resp.conn.close()
            raise sb._lost(SandboxLost(f"the command's stream was cut: {e}", "connection")) from e
        finally:
            if ended and resp.done:
                pool.give(resp)
            elif ended:
                try:
                    await resp.read()
                    pool.give(resp)
                except (ConnectionError, asyncio.IncompleteReadError, ValueError):
                    resp.conn.close()
            else:
                resp.conn.close()


class AsyncSandbox:
    """A hako sandbox for asyncio: the arguments of :class:`hako.Sandbox`;
    ``async with AsyncSandbox(...) as sb`` (or ``sb = await
    AsyncSandbox(...).start()`` and ``await sb.close()``)."""

    def __init__(
        self,
        backend: Optional[str] = None,
        workspace: Optional[c.PathLike] = None,
        net: Optional[str] = None,
        allow: Union[None, str, Sequence[str]] = None,
        memory: Union[None, int, str] = None,
        pids: Optional[int] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cow: Optional[bool] = None,
        name: Optional[str] = None,
        min_isolation: Optional[str] = None,
        ro: Union[None, c.PathLike, Sequence[c.PathLike]] = None,
        rw: Union[None, c.PathLike, Sequence[c.PathLike]] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        max_output: Union[None, int, str] = None,
        extra_flags: Sequence[str] = (),
    ) -> None:
        policy = dict(
            backend=backend, workspace=workspace, net=net, allow=allow, memory=memory,
            pids=pids, env=env, cow=cow, min_isolation=min_isolation, ro=ro, rw=rw,
            max_output=max_output, extra_flags=tuple(extra_flags),
        )
        self.timeout = timeout
        self.closed = False
        self.files = AsyncFiles(self)
        self._name = name
        self._remote = c.remote_target(url, token, policy)
        self._flags = None if self._remote else c.serve_flags(**policy)  # type: ignore[arg-type]
        self._profile = None if self._remote else c.env_profile(env)
        self._server: Optional[_AServer] = None
        self._pool: Optional[_APool] = None
        self.id = 0
        self.url = self._remote[0] if self._remote else ""
        self._base = ""

    async def start(self) -> "AsyncSandbox":
        """Starts the server (local mode) and opens the sandbox."""
        if self._pool is not None:
            return self
        if self._remote is None:
            self._server = _AServer()
            await self._server.start(self._flags or [], self._profile)
            self.url, tok = self._server.url, self._server.token
        else:
            self.url, tok = self._remote
        self._pool = _APool(self.url, tok)
        try:
            created = await self._pool.json("POST", "/v1/sandboxes", {"name": self._name} if self._name else None)
        except BaseException:
            await self._shutdown()
            raise
        self.id = int(created["id"])
        self._base = f"/v1/sandboxes/{self.id}/"
        return self

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout

    def _check(self) -> None:
        if self.closed:
            raise SandboxClosed(f"sandbox {self.id} is closed", "closed")
        if self._pool is None:
            raise SandboxClosed("the sandbox is not started: use `async with` or `await sb.start()`", "closed")

    def _lost(self, e: HakoError) -> HakoError:
        why = self._server.lost() if self._server else None
        return SandboxLost(why, "server_exited") if why else e

    async def _call(
        self,
        method: str,
        tail: str,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        timeout: Optional[float] = None,
    ) -> Tuple[int, Dict[str, str], bytes]:
        self._check()
        assert self._pool is not None
        try:
            return await self._pool.request(method, self._base + tail, body, content_type, timeout)
        except (SandboxLost, ServerError) as e:
            raise self._lost(e) from e

    async def _json(self, method: str, tail: str, body: Any = None, timeout: Optional[float] = None) -> Any:
        raw = None if body is None else json.dumps(body).encode()
        _, _, data = await self._call(method, tail, raw, timeout=timeout)
        return json.loads(data) if data else None

    @property
    def capabilities(self) -> Awaitable[Dict[str, Any]]:
        """What the sandbox enforces, as the server reports it:
        ``await sb.capabilities``."""
        return self._capabilities()

    async def _capabilities(self) -> Dict[str, Any]:
        self._check()
        assert self._pool is not None
        return dict((await self._pool.json("GET", f"/v1/sandboxes/{self.id}"))["capabilities"])

    async def run(
        self,
        cmd: c.Command,
        cwd: Optional[c.PathLike] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        stdin: Union[None, str, bytes] = None,
        on_stdout: Optional[Any] = None,
        on_stderr: Optional[Any] = None,
        binary: bool = False,
        max_output: Optional[int] = None,
    ) -> RunResult:
        """Runs a command, as :meth:`hako.Sandbox.run`; the callbacks may be
        plain functions or coroutine functions."""
        timeout = self._timeout(timeout)
        if on_stdout is None and on_stderr is None:
            body = c.exec_body(cmd, cwd, env, timeout, stdin, binary=binary, max_output=max_output)
            return RunResult.from_json(await self._json("POST", "exec", body, timeout=c.http_timeout(timeout)), binary)
        s = self.stream(cmd, cwd, env, timeout, stdin, binary, max_output)
        async for kind, data in s:
            cb = on_stdout if kind == "stdout" else on_stderr if kind == "stderr" else None
            if cb is not None:
                r = cb(data)
                if asyncio.iscoroutine(r):
                    await r
        assert s.result is not None
        return s.result

    def stream(
        self,
        cmd: c.Command,
        cwd: Optional[c.PathLike] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        stdin: Union[None, str, bytes] = None,
        binary: bool = False,
        max_output: Optional[int] = None,
    ) -> RunStream:
        """Runs a command, its output as it comes: ``async for stream, data
        in sb.stream(cmd)``; see :class:`RunStream`."""
        timeout = self._timeout(timeout)
        body = c.exec_body(cmd, cwd, env, timeout, stdin, stream=True, binary=binary, max_output=max_output)
        return RunStream(self, body, binary)

    async def session(self) -> AsyncSession:
        """Opens a shell session."""
        v = await self._json("POST", "sessions")
        return AsyncSession(self, int(v["session"]))

    async def spawn(
        self,
        cmd: c.Command,
        cwd: Optional[c.PathLike] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> AsyncProcess:
        """Starts a long-lived process, as :meth:`hako.Sandbox.spawn`."""
        v = await self._json("POST", "processes", c.process_body(cmd, cwd, env, timeout))
        return AsyncProcess(self, int(v["process"]))

    async def processes(self) -> List[ProcessState]:
        """The sandbox's long-lived processes."""
        v = await self._json("GET", "processes")
        return [ProcessState.from_json(p) for p in v.get("processes", [])]

    async def close(self) -> None:
        """Closes the sandbox and, in local mode, its server."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._pool is not None and (self._server is None or self._server.lost() is None):
                await self._pool.json("DELETE", f"/v1/sandboxes/{self.id}", timeout=60.0)
        except HakoError:
            if self._server is None:
                raise
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._server is not None:
            await self._server.stop()

    async def __aenter__(self) -> "AsyncSandbox":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<hako.AsyncSandbox {self.id} at {self.url} ({'closed' if self.closed else 'open'})>"
