"""hako: the sandbox AI agents act inside, from Python.

>>> import hako
>>> with hako.Sandbox(backend="linux") as sb:
...     print(sb.run("echo hi").stdout)
hi

:class:`Sandbox` (sync) and :class:`AsyncSandbox` (asyncio) each start a
private ``hako serve`` (the ``hako`` binary this package installs) holding
one sandbox, or with ``url=`` use a running server (remote mode). Errors are
:class:`HakoError` subclasses named by hako's error kinds.
"""

from ._async import AsyncFiles, AsyncProcess, AsyncSandbox, AsyncSession, RunStream
from ._common import find_binary
from ._errors import (
    AuthError,
    BadRequest,
    CommandNotFound,
    CommandTimeout,
    FenceError,
    FileNotFound,
    HakoError,
    LimitReached,
    PolicyError,
    SandboxClosed,
    SandboxLost,
    ServerError,
    Unsupported,
)
from ._sync import Files, Process, Sandbox, Session
from ._types import FileInfo, ProcessState, RunResult

__all__ = [
    "AsyncFiles",
    "AsyncProcess",
    "AsyncSandbox",
    "AsyncSession",
    "AuthError",
    "BadRequest",
    "CommandNotFound",
    "CommandTimeout",
    "FenceError",
    "FileInfo",
    "FileNotFound",
    "Files",
    "HakoError",
    "LimitReached",
    "PolicyError",
    "Process",
    "ProcessState",
    "RunResult",
    "RunStream",
    "Sandbox",
    "SandboxClosed",
    "SandboxLost",
    "ServerError",
    "Session",
    "Unsupported",
    "find_binary",
]
