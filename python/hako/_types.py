"""The values the SDK returns: a command's result, a directory entry, a
file's metadata, a process's state."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass(frozen=True)
class RunResult:
    """How a command ended.

    Attributes:
        exit_code: its exit status, or ``None`` when a signal ended it.
        stdout: what it wrote to stdout (decoded as UTF-8, invalid bytes
            replaced), at most the sandbox's output cap.
        stderr: the same for stderr.
        stdout_bytes: stdout's raw bytes (exact when the run asked
            ``binary=True``; otherwise the UTF-8 encoding of ``stdout``).
        stderr_bytes: the same for stderr.
        timed_out: it ran past its deadline and was killed (whole tree).
        stdout_truncated: stdout was longer than the cap; the rest dropped.
        stderr_truncated: the same for stderr.
        stdout_size: how many bytes it wrote to stdout in all (kept or not).
        stderr_size: the same for stderr.
        duration: how long it ran, in seconds.
        signal: the signal that ended it, or ``None``.
        oom_killed: the kernel killed it for memory (where the backend can
            tell).
    """

    exit_code: Optional[int]
    stdout: str
    stderr: str
    stdout_bytes: bytes = field(repr=False)
    stderr_bytes: bytes = field(repr=False)
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_size: int
    stderr_size: int
    duration: float
    signal: Optional[int]
    oom_killed: bool

    @property
    def ok(self) -> bool:
        """Whether it exited 0 within its deadline."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, v: Dict[str, Any], binary: bool = False) -> "RunResult":
        """From the API's ``ExecResult`` (``binary``: stdout and stderr are
        base64)."""

        def both(name: str) -> "tuple[str, bytes]":
            raw = v.get(name) or ""
            if binary:
                data = base64.b64decode(raw)
                return data.decode("utf-8", "replace"), data
            return raw, raw.encode("utf-8")

        out, out_b = both("stdout")
        err, err_b = both("stderr")
        return cls(
            exit_code=v.get("exit_code"),
            stdout=out,
            stderr=err,
            stdout_bytes=out_b,
            stderr_bytes=err_b,
            timed_out=bool(v.get("timed_out")),
            stdout_truncated=bool(v.get("stdout_truncated")),
            stderr_truncated=bool(v.get("stderr_truncated")),
            stdout_size=int(v.get("stdout_bytes") or 0),
            stderr_size=int(v.get("stderr_bytes") or 0),
            duration=float(v.get("duration_ms") or 0) / 1000.0,
            signal=v.get("signal"),
            oom_killed=bool(v.get("oom_killed")),
        )


@dataclass(frozen=True)
class FileInfo:
    """A directory entry (:meth:`Files.list`) or a path's metadata
    (:meth:`Files.stat`).

    Attributes:
        name: the entry's name (for ``stat``, the path asked).
        kind: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"``.
        size: its size in bytes.
        mode: its permission bits, where known.
        modified: when it was last modified, Unix seconds, where known.
    """

    name: str
    kind: str
    size: int
    mode: Optional[int] = None
    modified: Optional[float] = None

    @property
    def is_dir(self) -> bool:
        """Whether it is a directory."""
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        """Whether it is a regular file."""
        return self.kind == "file"


@dataclass(frozen=True)
class ProcessState:
    """A long-lived process's state.

    Attributes:
        id: its handle (the server's process number).
        running: whether it still runs.
        exit_code: its exit status once it ended, else ``None``.
        signal: the signal that ended it, else ``None``.
        raw: every field the server answered.
    """

    id: int
    running: bool
    exit_code: Optional[int]
    signal: Optional[int]
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_json(cls, v: Dict[str, Any]) -> "ProcessState":
        """From the API's process state."""
        return cls(
            id=int(v.get("process", 0)),
            running=bool(v.get("running")),
            exit_code=v.get("exit_code"),
            signal=v.get("signal"),
            raw=dict(v),
        )
