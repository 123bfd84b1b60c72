"""The synchronous client: :class:`Sandbox` and what it hands out."""

from __future__ import annotations

import http.client
import json
import os
import selectors
import socket
import shutil
import subprocess
import threading
import time
import weakref
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _common as c
from ._errors import (
    CommandTimeout,
    FileNotFound,
    HakoError,
    LimitReached,
    SandboxClosed,
    SandboxLost,
    ServerError,
    error_for,
)
from ._types import FileInfo, ProcessState, RunResult

OutputCallback = Callable[[Union[str, bytes]], None]

# A kept-alive connection idle longer than this is not reused (the server
# drops idle connections after 30 s).
_IDLE = 20.0
# How many times a request answered 503 `busy` is retried, and the first
# pause between tries (doubled each time).
_BUSY_TRIES = 8
_BUSY_PAUSE = 0.05


class _Pool:
    """Kept-alive HTTP/1.1 connections to one server, reused one request at
    a time each."""

    def __init__(self, url: str, token: str) -> None:
        self.host, self.port = c.split_url(url)
        self.auth = f"Bearer {token}"
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()
        self.closed = False

    def _take(self) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            while self._idle:
                conn, since = self._idle.pop()
                if time.monotonic() - since < _IDLE:
                    return conn, True
                conn.close()
        return http.client.HTTPConnection(self.host, self.port), False

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self.closed:
                conn.close()
            else:
                self._idle.append((conn, time.monotonic()))

    def close(self) -> None:
        """Closes every idle connection."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def open(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        timeout: Optional[float] = None,
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse, Optional[bytes]]:
        """Sends a request: its connection, the answer's head, and its body
        when it was read already (an error answer); else the body is unread.
        503 ``busy`` answers are retried after a pause."""
        pause = _BUSY_PAUSE
        attempt = 0
        while True:
            conn, resp = self._send(method, path, body, content_type, timeout)
            if resp.status < 400:
                return conn, resp, None
            data = self._read(conn, resp, method, path, timeout)
            attempt += 1
            if resp.status != 503 or not _is_busy(data) or attempt > _BUSY_TRIES:
                return conn, resp, data
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _read(
        self,
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        method: str,
        path: str,
        timeout: Optional[float],
    ) -> bytes:
        """The answer's whole body; the connection back to the pool."""
        try:
            data = resp.read()
        except (socket.timeout, TimeoutError) as e:
            conn.close()
            raise CommandTimeout(
                f"no answer to {method} {path.split('?')[0]} within {timeout} s"
            ) from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise SandboxLost(f"the server's answer was cut: {e}", "connection") from e
        self.done(conn, resp)
        return data

    def _send(
        self,
        method: str,
        path: str,
        body: Optional[bytes],
        content_type: str,
        timeout: Optional[float],
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        headers = {"Authorization": self.auth}
        if body is not None:
            headers["Content-Type"] = content_type
        while True:
            conn, reused = self._take()
            conn.timeout = timeout
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, path, body=body, headers=headers)
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if reused:
                    # The server closed a kept-alive connection before it
                    # read this request: send it again on a new one.
                    continue
                raise SandboxLost(f"the server closed the connection: {e}", "connection") from e
            except (socket.timeout, TimeoutError) as e:
                conn.close()
                raise CommandTimeout(
                    f"no answer to {method} {path.split('?')[0]} within {timeout} s"
                ) from e
            except OSError as e:
                conn.close()
                raise ServerError(
                    f"cannot reach the hako server at {self.host}:{self.port}: {e}", "connection"
                ) from e

    def done(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """Returns a connection whose answer was read whole to the pool."""
        if resp.will_close:
            conn.close()
        else:
            self._give(conn)

    def request(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        timeout: Optional[float] = None,
    ) -> Tuple[int, Dict[str, str], bytes]:
        """One request, its answer read whole; raises the error an answer
        carries."""
        conn, resp, data = self.open(method, path, body, content_type, timeout)
        if data is None:
            data = self._read(conn, resp, method, path, timeout)
        headers = {k.lower(): v for k, v in resp.getheaders()}
        c.raise_for(resp.status, data)
        return resp.status, headers, data

    def json(
        self, method: str, path: str, body: Any = None, timeout: Optional[float] = None
    ) -> Any:
        """A JSON request and its JSON answer."""
        raw = None if body is None else json.dumps(body).encode()
        _, _, data = self.request(method, path, raw, timeout=timeout)
        return json.loads(data) if data else None


def _is_busy(data: bytes) -> bool:
    try:
        return bool(json.loads(data).get("kind") == "busy")
    except (ValueError, AttributeError):
        return False


class _Server:
    """A private ``hako serve``, its lifeline the pipe on its stdin: when
    this process dies (or closes it), the server closes its sandbox and
    exits."""

    def __init__(self, flags: Sequence[str], profile: Optional[str] = None) -> None:
        binary = c.find_binary()
        # The token file and the server's stderr live in a private
        # directory only until the server is ready (it has read the token);
        # then the directory goes and the SDK keeps a handle on the log.
        self.dir, token_path, self.token = c.token_file()
        self.log: Optional[BinaryIO] = None
        if profile is not None:
            flags = ["--profile", c.write_private(self.dir, "profile.toml", profile), *flags]
        argv = c.serve_argv(binary, token_path, flags)
        try:
            w, self.log = c.open_log(self.dir)
            with w:
                self.proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=w,
                    start_new_session=True,
                )
        except OSError as e:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise HakoError(f"cannot start {binary}: {e}", "no_binary") from e
        try:
            self.url = self._ready()
        except BaseException:
            _Server._reap(self.proc, self.log)
            raise
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._finalizer = weakref.finalize(self, _Server._reap, self.proc, self.log)

    def _ready(self) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + c.START_TIMEOUT
        line = b""
        fd = self.proc.stdout.fileno()
        try:
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise CommandTimeout(
                        f"hako serve did not say it listens within {c.START_TIMEOUT:.0f} s: "
                        + c.read_log(self.log)[-2000:]
                    )
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                line += chunk
        finally:
            sel.close()
        if not line.endswith(b"\n"):
            try:
                code: Optional[int] = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                code = None
            return c.parse_ready(line, c.read_log(self.log), code)
        self.proc.stdout.close()
        return c.parse_ready(line, "", None)

    def lost(self) -> Optional[str]:
        """Why the server is gone, if it is."""
        code = self.proc.poll()
        if code is None:
            return None
        return f"hako serve exited ({code}): {c.read_log(self.log)[-2000:].strip()}"

    @staticmethod
    def _reap(proc: "subprocess.Popen[bytes]", log: Optional[BinaryIO]) -> None:
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if log is not None:
            log.close()

    def stop(self) -> None:
        """Ends the server (closing its lifeline; killed if it lingers)."""
        self._finalizer()


class Files:
    """A sandbox's files, every path relative to its workspace and through
    its fence (``sb.files``)."""

    def __init__(self, sb: "Sandbox") -> None:
        self._sb = sb

    def read(self, path: c.PathLike, text: bool = True) -> Union[str, bytes]:
        """The file's content: ``str`` (UTF-8) with ``text``, else bytes.

        Raises:
            FileNotFound: no such file. FenceError: outside the workspace.
            LimitReached: larger than the server returns (64 MiB).
        """
        _, headers, data = self._sb._call("GET", "files" + c.path_query(path))
        if headers.get("x-hako-truncated") == "true":
            raise LimitReached(
                f"{os.fspath(path)} is larger than one read returns ({len(data)} bytes)", "too_large"
            )
        return data.decode("utf-8") if text else data

    def write(self, path: c.PathLike, data: Union[str, bytes]) -> None:
        """Writes the file atomically (missing parent directories made)."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._sb._call("PUT", "files" + c.path_query(path), raw, "application/octet-stream")

    def list(self, path: c.PathLike = ".") -> List[FileInfo]:
        """The directory's entries."""
        v = self._sb._json("GET", "dir" + c.path_query(path))
        return [_entry(e) for e in v.get("entries", [])]

    def remove(self, path: c.PathLike) -> None:
        """Removes a file, a symlink or an empty directory."""
        self._sb._call("DELETE", "files" + c.path_query(path))

    def mkdir(self, path: c.PathLike) -> None:
        """Makes the directory and its missing parents."""
        self._sb._call("POST", "dir" + c.path_query(path))

    def stat(self, path: c.PathLike) -> FileInfo:
        """The path's metadata (a symlink's own)."""
        return _stat(self._sb._json("GET", "stat" + c.path_query(path)), path)

    def exists(self, path: c.PathLike) -> bool:
        """Whether the path exists (a fence refusal still raises)."""
        try:
            self.stat(path)
            return True
        except FileNotFound:
            return False


def _entry(e: Mapping[str, Any]) -> FileInfo:
    mtime = e.get("mtime")
    return FileInfo(
        name=str(e.get("name", "")),
        kind=str(e.get("kind", "other")),
        size=int(e.get("size") or 0),
        mode=e.get("mode"),
        modified=float(mtime) if mtime is not None else None,
    )


def _stat(v: Mapping[str, Any], path: c.PathLike) -> FileInfo:
    ms = v.get("modified_ms")
    return FileInfo(
        name=str(v.get("path", os.fspath(path))),
        kind=str(v.get("kind", "other")),
        size=int(v.get("size") or 0),
        mode=v.get("mode"),
        modified=ms / 1000.0 if ms is not None else None,
    )


class Session:
    """A shell session: commands run in one shell, sharing its working
    directory, variables and jobs. A context manager."""

    def __init__(self, sb: "Sandbox", sid: int) -> None:
        self._sb = sb
        self.id = sid
        self.closed = False

    def run(self, cmd: str, timeout: Optional[float] = None) -> RunResult:
        """Runs a shell command in the session."""
        if self.closed:
            raise SandboxClosed(f"session {self.id} is closed", "no_such_session")
        if not isinstance(cmd, str):
            raise TypeError("a session runs shell command strings")
        timeout = self._sb._timeout(timeout)
        body = c.exec_body(cmd, timeout=timeout, session=self.id)
        v = self._sb._json("POST", "exec", body, timeout=c.http_timeout(timeout))
        return RunResult.from_json(v)

    def close(self) -> None:
        """Closes the session and everything started in it."""
        if not self.closed:
            self.closed = True
            self._sb._call("DELETE", f"sessions/{self.id}")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._sb.closed:
            self.close()


class Process:
    """A long-lived process (``sb.spawn``): read its output, write its
    stdin, kill it, wait for it."""

    def __init__(self, sb: "Sandbox", pid: int) -> None:
        self._sb = sb
        self.id = pid
        self._offset = 0
        self._err_offset = 0

    @property
    def pid(self) -> int:
        """Its handle (the server's process number, not a host pid)."""
        return self.id

    def _path(self, tail: str = "") -> str:
        return f"processes/{self.id}{tail}"

    def read(self, wait: float = 0.0, binary: bool = False) -> Tuple[Union[str, bytes], Union[str, bytes]]:
        """The output written since the last read: ``(stdout, stderr)``;
        waits up to ``wait`` seconds (at most 60) for some when there is
        none yet. The server keeps the last 1 MiB of stdout and 256 KiB of
        stderr of a process; output older than that is gone."""
        wait_ms = max(0, min(int(wait * 1000), 60000))
        q = f"?offset={self._offset}&stderr_offset={self._err_offset}&wait_ms={wait_ms}"
        if binary:
            q += "&encoding=base64"
        v = self._sb._json("GET", self._path("/output") + q, timeout=wait_ms / 1000 + 60.0)
        self._offset = int(v.get("offset", self._offset))
        self._err_offset = int(v.get("stderr_offset", self._err_offset))
        out, err = v.get("stdout") or "", v.get("stderr") or ""
        return c.decode_chunk(out, binary), c.decode_chunk(err, binary)

    def write(self, data: Union[str, bytes]) -> None:
        """Writes to its stdin."""
        self._sb._json("POST", self._path("/stdin"), c.stdin_body(data, False))

    def close_stdin(self) -> None:
        """Closes its stdin (it reads end of file)."""
        self._sb._json("POST", self._path("/stdin"), c.stdin_body(None, True))

    def kill(self) -> None:
        """Kills it (and what it started)."""
        self._sb._json("POST", self._path("/kill"))

    def state(self) -> ProcessState:
        """Its state now."""
        return ProcessState.from_json(self._sb._json("GET", self._path()))

    def wait(self, timeout: Optional[float] = None) -> ProcessState:
        """Waits until it ends, or ``timeout`` seconds (then ``running`` is
        still true); without a timeout, until it ends."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
            v = self._sb._json(
                "POST", self._path("/wait") + f"?timeout_ms={int(left * 1000)}", timeout=left + 60.0
            )
            st = ProcessState.from_json(v)
            if not st.running or (deadline is not None and time.monotonic() >= deadline):
                return st

    @property
    def exit_code(self) -> Optional[int]:
        """Its exit status once it ended, else ``None``."""
        return self.state().exit_code


class Sandbox:
    """A hako sandbox; a context manager (closed on exit).

    By default it starts a private ``hako serve`` (the ``hako`` of this
    package's wheel, or ``$HAKO_BIN``) with one sandbox, and every flag given
    here goes to that server's command line, so hako's own parser checks it.
    With ``url`` (or ``$HAKO_URL``) it opens a sandbox on a running server
    instead (remote mode): the server's flags set the policy, and the
    policy arguments here are refused.

    Args:
        backend: ``auto``, ``host``, ``linux``, ``landlock``, ``docker`` or
            ``gvisor`` (``--backend``).
        workspace: the sandbox's root on the host (``--workspace``;
            default: the current directory).
        net: ``none``, ``allow`` or ``host`` (``--net``).
        allow: hosts the sandbox may reach through the egress proxy
            (``--allow``, one or a list).
        memory: memory limit, bytes or a size like ``"256M"`` (``--memory``).
        pids: most processes at once (``--pids``).
        timeout: default deadline of each command, seconds (per ``run``
            otherwise; the server's default is 10 minutes).
        env: variables set inside the sandbox (``--env K=V``).
        cow: copy-on-write workspace (``--cow``).
        name: keep the ``cow`` layers as this named sandbox.
        min_isolation: refuse to run weaker than ``none``, ``process``,
            ``kernel`` or ``vm`` (``--min-isolation``).
        ro: extra read-only binds (``--ro``). rw: read-write ones (``--rw``).
        max_output: bytes kept of each of stdout and stderr
            (``--max-output``).
        extra_flags: any other ``hako serve`` flags, as on its command line
            (``["--cpus", "1", "--image", "x"]``).
        url: a running ``hako serve`` (remote mode).
        token: its bearer token (else ``$HAKO_TOKEN``).
    """

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
        self.files = Files(self)
        self._server: Optional[_Server] = None
        remote = c.remote_target(url, token, policy)
        if remote is None:
            self._server = _Server(c.serve_flags(**policy), c.env_profile(env))  # type: ignore[arg-type]
            self.url, tok = self._server.url, self._server.token
        else:
            self.url, tok = remote
        self._pool = _Pool(self.url, tok)
        try:
            created = self._pool.json("POST", "/v1/sandboxes", {"name": name} if name else None)
        except BaseException:
            self._shutdown()
            raise
        self.id: int = int(created["id"])
        self._base = f"/v1/sandboxes/{self.id}/"

    # -- plumbing -----------------------------------------------------------

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout

    def _check(self) -> None:
        if self.closed:
            raise SandboxClosed(f"sandbox {self.id} is closed", "closed")

    def _lost(self, e: HakoError) -> HakoError:
        why = self._server.lost() if self._server else None
        if why:
            return SandboxLost(why, "server_exited")
        return e

    def _call(
        self,
        method: str,
        tail: str,
        body: Optional[bytes] = None,
        content_type: str = "application/json",
        timeout: Optional[float] = None,
    ) -> Tuple[int, Dict[str, str], bytes]:
        self._check()
        try:
            return self._pool.request(method, self._base + tail, body, content_type, timeout)
        except (SandboxLost, ServerError) as e:
            raise self._lost(e) from e

    def _json(self, method: str, tail: str, body: Any = None, timeout: Optional[float] = None) -> Any:
        raw = None if body is None else json.dumps(body).encode()
        _, _, data = self._call(method, tail, raw, timeout=timeout)
        return json.loads(data) if data else None

    # -- the API ------------------------------------------------------------

    @property
    def capabilities(self) -> Dict[str, Any]:
        """What the sandbox enforces (backend, isolation, network, limits,
        ...), as the server reports it."""
        self._check()
        return dict(self._pool.json("GET", f"/v1/sandboxes/{self.id}")["capabilities"])

    def run(
        self,
        cmd: c.Command,
        cwd: Optional[c.PathLike] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        stdin: Union[None, str, bytes] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        binary: bool = False,
        max_output: Optional[int] = None,
    ) -> RunResult:
        """Runs a command and returns how it ended.

        Args:
            cmd: a string (run by ``sh -c``) or an argv list.
            cwd: working directory, relative to the workspace.
            env: variables set for this command.
            timeout: deadline in seconds (default: the sandbox's ``timeout``,
                else the server's): past it the whole tree is killed and
                ``timed_out`` is true (not an exception).
            stdin: its standard input.
            on_stdout, on_stderr: called with each chunk of output as the
                command writes it (the command streams then).
            binary: exact bytes in ``stdout_bytes``/``stderr_bytes`` (and
                bytes to the callbacks), rather than UTF-8 text.
            max_output: bytes kept of each of stdout and stderr for this
                command (at most the sandbox's cap).

        Raises:
            CommandNotFound: no such program. FenceError: ``cwd`` outside
            the workspace. SandboxLost: the sandbox ended.
        """
        timeout = self._timeout(timeout)
        stream = on_stdout is not None or on_stderr is not None
        body = c.exec_body(
            cmd, cwd, env, timeout, stdin, stream=stream, binary=binary, max_output=max_output
        )
        if not stream:
            v = self._json("POST", "exec", body, timeout=c.http_timeout(timeout))
            return RunResult.from_json(v, binary)
        result: Optional[RunResult] = None
        for kind, data in self._stream(body, timeout, binary):
            if kind == "stdout" and on_stdout is not None:
                on_stdout(data)  # type: ignore[arg-type]
            elif kind == "stderr" and on_stderr is not None:
                on_stderr(data)  # type: ignore[arg-type]
            elif kind == "exit":
                result = data  # type: ignore[assignment]
        assert result is not None
        return result

    def _stream(
        self, body: Dict[str, Any], timeout: Optional[float], binary: bool
    ) -> Iterator[Tuple[str, Union[str, bytes, int, RunResult]]]:
        self._check()
        raw = json.dumps(body).encode()
        try:
            conn, resp, pre = self._pool.open(
                "POST", self._base + "exec", raw, timeout=c.http_timeout(timeout)
            )
        except (SandboxLost, ServerError) as e:
            raise self._lost(e) from e
        if pre is not None:
            c.raise_for(resp.status, pre)
        ended = False
        try:
            while True:
                line = resp.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                ev = json.loads(line)
                if "stream" in ev:
                    yield ev["stream"], c.decode_chunk(ev.get("data", ""), binary)
                elif "dropped" in ev:
                    yield "dropped", int(ev["dropped"])
                elif "exit" in ev:
                    ended = True
                    yield "exit", RunResult.from_json(ev["exit"], binary)
                elif "error" in ev:
                    ended = True
                    raise c.stream_error(ev)
            if not ended:
                raise self._lost(SandboxLost("the command's stream ended without its exit", "connection"))
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise self._lost(SandboxLost(f"the command's stream was cut: {e}", "connection")) from e
        finally:
            if ended:
                try:
                    resp.read()
                    self._pool.done(conn, resp)
                except (OSError, http.client.HTTPException):
                    conn.close()
            else:
                conn.close()

    def session(self) -> Session:
        """Opens a shell session (a context manager)."""
        v = self._json("POST", "sessions")
        return Session(self, int(v["session"]))

    def spawn(
        self,
        cmd: c.Command,
        cwd: Optional[c.PathLike] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Process:
        """Starts a long-lived process and returns its handle at once. It
        runs until it ends, is killed, its ``timeout`` (seconds) passes, or
        the sandbox closes (the sandbox's ``timeout`` does not apply)."""
        v = self._json("POST", "processes", c.process_body(cmd, cwd, env, timeout))
        return Process(self, int(v["process"]))

    def processes(self) -> List[ProcessState]:
        """The sandbox's long-lived processes."""
        v = self._json("GET", "processes")
        return [ProcessState.from_json(p) for p in v.get("processes", [])]

    def close(self) -> None:
        """Closes the sandbox (everything in it is killed) and, in local
        mode, its server. Closing twice does nothing."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._server is None or self._server.lost() is None:
                self._pool.json("DELETE", f"/v1/sandboxes/{self.id}", timeout=60.0)
        except HakoError:
            if self._server is None:
                raise
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._pool.close()
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<hako.Sandbox {self.id} at {self.url} ({state})>"
