"""What the sync and async clients share: finding the ``hako`` binary, the
``hako serve`` command line for a sandbox's arguments, remote mode, and the
bodies of requests and answers."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlsplit

from ._errors import BadRequest, HakoError, error_for

Command = Union[str, Sequence[str]]
"""A command: a string is run by ``sh -c``; a sequence is an argv."""

PathLike = Union[str, "os.PathLike[str]"]

# How long a private server may take to say it listens (a container
# backend's first start may build its image).
START_TIMEOUT = 120.0


def find_binary() -> str:
    """The ``hako`` CLI to start: ``$HAKO_BIN``, else the ``hako`` script
    installed beside this interpreter (the wheel's), else ``hako`` on
    ``PATH``.

    Raises:
        HakoError: none was found (kind ``no_binary``).
    """
    env = os.environ.get("HAKO_BIN")
    if env:
        return env
    candidates = []
    for scheme in (None, "posix_user"):
        try:
            d = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        if d:
            candidates.append(Path(d) / "hako")
    candidates.append(Path(sys.executable).parent / "hako")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("hako")
    if found:
        return found
    raise HakoError(
        "cannot find the hako binary: set HAKO_BIN, or install this package with pip "
        "(its wheel carries hako), or put hako on PATH",
        "no_binary",
    )


def _size(v: Union[int, str]) -> str:
    if isinstance(v, bool):
        raise BadRequest(f"a size must be a number of bytes or a string like '256M', not {v!r}")
    return str(v)


def _many(v: Union[None, str, "os.PathLike[str]", Sequence[Any]]) -> List[str]:
    if v is None:
        return []
    if isinstance(v, (str, os.PathLike)):
        return [os.fspath(v)]
    return [os.fspath(x) for x in v]


def serve_flags(
    backend: Optional[str] = None,
    workspace: Optional[PathLike] = None,
    net: Optional[str] = None,
    allow: Union[None, str, Sequence[str]] = None,
    memory: Union[None, int, str] = None,
    pids: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    cow: Optional[bool] = None,
    min_isolation: Optional[str] = None,
    ro: Union[None, PathLike, Sequence[PathLike]] = None,
    rw: Union[None, PathLike, Sequence[PathLike]] = None,
    max_output: Union[None, int, str] = None,
    extra_flags: Sequence[str] = (),
) -> List[str]:
    """The ``hako serve`` flags for a sandbox's arguments (each goes through
    the CLI's own parser, which says what it refuses); ``env`` goes in a
    profile instead (:func:`env_profile`)."""
    flags: List[str] = []
    if backend is not None:
        flags += ["--backend", str(backend)]
    if workspace is not None:
        flags += ["--workspace", os.fspath(workspace)]
    if net is not None:
        flags += ["--net", str(net)]
    for a in _many(allow):
        flags += ["--allow", a]
    if memory is not None:
        flags += ["--memory", _size(memory)]
    if pids is not None:
        flags += ["--pids", str(int(pids))]
    # `env` is not a flag here: see env_profile (values may be secrets,
    # and a command line is readable by every local user).
    if cow:
        flags.append("--cow")
    if min_isolation is not None:
        flags += ["--min-isolation", str(min_isolation)]
    for d in _many(ro):
        flags += ["--ro", d]
    for d in _many(rw):
        flags += ["--rw", d]
    if max_output is not None:
        flags += ["--max-output", _size(max_output)]
    flags += [str(f) for f in extra_flags]
    return flags


POLICY_ARGS = (
    "backend",
    "workspace",
    "net",
    "allow",
    "memory",
    "pids",
    "env",
    "cow",
    "min_isolation",
    "ro",
    "rw",
    "max_output",
    "extra_flags",
)


def remote_target(
    url: Optional[str], token: Optional[str], policy: Mapping[str, Any]
) -> Optional[Tuple[str, str]]:
    """``(url, token)`` in remote mode (``url`` given, or ``$HAKO_URL``),
    else ``None``.

    Raises:
        ValueError: a sandbox-policy argument in remote mode (the server's
            flags set the policy), or no token.
    """
    url = url or os.environ.get("HAKO_URL") or None
    if url is None:
        if token is not None:
            raise ValueError("token= is for remote mode: give url= too (or set HAKO_URL)")
        return None
    given = sorted(
        k
        for k, v in policy.items()
        if v is not None and v is not False and not (isinstance(v, (tuple, list, dict)) and not v)
    )
    if given:
        raise ValueError(
            f"remote mode ({url}): the server's flags set the sandbox's policy, so "
            f"{', '.join(given)} cannot be given here; start `hako serve` with them instead"
        )
    token = token or os.environ.get("HAKO_TOKEN") or None
    if not token:
        raise ValueError(f"remote mode ({url}) needs a token: give token= or set HAKO_TOKEN")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"remote mode takes an http://HOST:PORT URL, not {url!r}")
    return url.rstrip("/"), token


def split_url(url: str) -> Tuple[str, int]:
    """Host and port of an ``http://`` URL."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def token_file() -> Tuple[str, str, str]:
    """A new private directory holding a new random token in a 0600 file:
    ``(directory, path, token)``."""
    d = tempfile.mkdtemp(prefix="hako-py-")
    token = secrets.token_urlsafe(32)
    path = os.path.join(d, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return d, path, token


def _toml_string(v: str) -> str:
    out = []
    for ch in v:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def env_profile(env: Optional[Mapping[str, str]]) -> Optional[str]:
    """A ``--profile`` TOML holding only ``env`` (the sandbox's variables),
    or ``None`` without any. The values travel in a 0600 file of the
    private directory, removed once the server has read it, never on the
    server's command line (which every local user can read)."""
    if not env:
        return None
    lines = ["[env]"]
    for k, v in env.items():
        k, v = str(k), str(v)
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise BadRequest(
                f"an environment variable's name must be non-empty without '=' or NUL, "
                f"its value without NUL: {k!r}"
            )
        lines.append(f"{_toml_string(k)} = {_toml_string(v)}")
    return "\n".join(lines) + "\n"


def write_private(d: str, name: str, text: str) -> str:
    """Writes ``text`` to a new 0600 file ``name`` in ``d``; its path."""
    path = os.path.join(d, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def serve_argv(binary: str, token_path: str, flags: Sequence[str]) -> List[str]:
    """The private server's command line."""
    return [
        binary,
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token_path,
        "--max-sandboxes",
        "1",
        "--ready-json",
        "--exit-on-stdin-eof",
        *flags,
    ]


def parse_ready(line: bytes, stderr: str, code: Optional[int]) -> str:
    """The URL from the server's ready line; an error naming why it did not
    start otherwise."""
    if line.strip():
        try:
            ready = json.loads(line)
            return str(ready["url"]).rstrip("/")
        except (ValueError, KeyError, TypeError):
            pass
    return _start_failure(stderr, code, line)


# What a policy refusal at start says (hako_core's errors): the server
# exits 125 with one of these on stderr.
_POLICY_REFUSALS = (
    "refused to run:",
    "invalid network policy",
    "cannot provide network mode",
)


def _start_failure(stderr: str, code: Optional[int], line: bytes = b"") -> str:
    said = (stderr.strip() or line.decode("utf-8", "replace").strip())[-4000:]
    if code == 2:
        # clap's usage errors: a flag or value serve refuses.
        raise BadRequest(f"hako serve refused its arguments: {said}", "bad_flag")
    if code == 125 and any(p in said for p in _POLICY_REFUSALS):
        raise error_for("policy", f"hako serve refused to start: {said}")
    raise error_for(
        "start_failed",
        f"hako serve did not start (exit {code}): {said or 'it said nothing'}",
    )


def read_log(log: "Optional[BinaryIO]") -> str:
    """The private server's stderr so far (its last 64 KiB), from the
    SDK's own read handle on it."""
    if log is None:
        return ""
    try:
        size = os.fstat(log.fileno()).st_size
        return os.pread(log.fileno(), 65536, max(0, size - 65536)).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def open_log(d: str) -> "Tuple[BinaryIO, BinaryIO]":
    """The server's stderr file in ``d``: a handle for the server (append
    only) and one for the SDK to read; the file itself is unlinked with
    ``d`` once the server is ready."""
    path = os.path.join(d, "serve.log")
    w = open(path, "ab")
    r = open(path, "rb")
    return w, r


def path_query(path: PathLike) -> str:
    """``?path=`` for a path (percent-encoded)."""
    return "?path=" + quote(os.fspath(path), safe="")


def exec_body(
    cmd: Command,
    cwd: Optional[PathLike] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    stdin: Union[None, str, bytes] = None,
    session: Optional[int] = None,
    stream: bool = False,
    binary: bool = False,
    max_output: Optional[int] = None,
) -> Dict[str, Any]:
    """The body of ``POST .../exec``."""
    body: Dict[str, Any] = {}
    if isinstance(cmd, str):
        body["command"] = cmd
    else:
        argv = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in cmd]
        if not argv:
            raise ValueError("an argv needs at least the program")
        body["argv"] = argv
    if cwd is not None:
        body["cwd"] = os.fspath(cwd)
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if timeout is not None:
        if timeout < 0:
            raise ValueError(f"a timeout cannot be negative: {timeout}")
        body["timeout_ms"] = int(timeout * 1000)
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        else:
            data = bytes(stdin)
            try:
                body["stdin"] = data.decode("utf-8")
            except UnicodeDecodeError:
                body["stdin_base64"] = base64.b64encode(data).decode("ascii")
    if session is not None:
        body["session"] = session
    if stream:
        body["stream"] = True
    if binary:
        body["encoding"] = "base64"
    if max_output is not None:
        if isinstance(max_output, bool) or int(max_output) < 0:
            raise ValueError(f"max_output is a number of bytes, not {max_output!r}")
        body["max_output"] = int(max_output)
    return body


def http_timeout(timeout: Optional[float]) -> Optional[float]:
    """A socket timeout for a request whose command has ``timeout``: long
    enough for the command and its clean-up, ``None`` (the server's own
    deadline bounds it) without one."""
    if timeout is None:
        return None
    return timeout + 60.0


def raise_for(status: int, body: bytes) -> None:
    """Raises the error an answer carries, if its status is one."""
    if status < 400:
        return
    try:
        v = json.loads(body)
        message = str(v.get("error", ""))
        kind = str(v.get("kind", "error"))
    except (ValueError, AttributeError):
        message = body.decode("utf-8", "replace")[:2000]
        kind = "unauthorized" if status == 401 else "error"
    raise error_for(kind, message or f"HTTP {status}", status)


def process_body(
    cmd: Command,
    cwd: Optional[PathLike],
    env: Optional[Mapping[str, str]],
    timeout: Optional[float] = None,
) -> Dict[str, Any]:
    """The body of ``POST .../processes``."""
    return exec_body(cmd, cwd=cwd, env=env, timeout=timeout)


def stdin_body(data: Union[str, bytes, None], close: bool) -> Dict[str, Any]:
    """The body of ``POST .../processes/{p}/stdin``."""
    body: Dict[str, Any] = {}
    if data is not None:
        if isinstance(data, str):
            body["data"] = data
        else:
            body["data_base64"] = base64.b64encode(bytes(data)).decode("ascii")
    if close:
        body["close"] = True
    return body


def decode_chunk(data: str, binary: bool) -> Union[str, bytes]:
    """A streamed chunk's data."""
    return base64.b64decode(data) if binary else data


def stream_error(line: Dict[str, Any]) -> HakoError:
    """The error a streamed ``error`` line carries."""
    return error_for(str(line.get("kind", "error")), str(line.get("error", "")))
