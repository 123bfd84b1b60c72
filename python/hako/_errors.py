"""Exceptions: one class per kind of hako error.

Every error the server answers carries a ``kind`` (``policy``, ``refused``,
``not_found``, ...); :func:`error_for` picks the class for it, so a caller
catches what it means (a fence refusal, a policy refusal, a lost sandbox)
rather than an HTTP status.
"""

from __future__ import annotations

import builtins
from typing import Dict, Optional, Type


class HakoError(Exception):
    """Any error hako reports.

    Attributes:
        kind: hako's error kind (``"policy"``, ``"refused"``, ``"not_found"``,
            ...), or a kind of the SDK's own (``"server_exited"``,
            ``"connection"``, ``"bad_flag"``).
        status: the HTTP status the server answered with, or ``None`` when
            the error did not come from an answer.
        message: what went wrong, as hako says it.
    """

    def __init__(self, message: str, kind: str = "error", status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status

    def __str__(self) -> str:
        return f"{self.message} ({self.kind})"


class PolicyError(HakoError):
    """Refused by policy: isolation weaker than ``min_isolation``, a network
    policy that cannot be enforced here, ..."""


class FenceError(HakoError):
    """Refused by the file fence: a path outside the workspace (``..``, an
    absolute path elsewhere, a symlink that leads out), a device, ..."""


class FileNotFound(HakoError, builtins.FileNotFoundError):
    """The path does not exist inside the sandbox (also a
    :class:`FileNotFoundError`)."""

    def __init__(self, message: str, kind: str = "not_found", status: Optional[int] = None) -> None:
        HakoError.__init__(self, message, kind, status)


class CommandNotFound(HakoError):
    """The command's program does not exist in the sandbox
    (``command_not_found``), or cannot be executed (``cannot_execute``)."""


class CommandTimeout(HakoError, builtins.TimeoutError):
    """An API call itself ran out of time (the server's ``timeout`` kind, or
    the private server not starting in time). A command that runs past its
    deadline is *not* an error: its result has ``timed_out`` true."""

    def __init__(self, message: str, kind: str = "timeout", status: Optional[int] = None) -> None:
        HakoError.__init__(self, message, kind, status)


class SandboxLost(HakoError):
    """The sandbox ended while open (its guest was killed, its container or
    engine stopped), or its private server exited."""


class SandboxClosed(HakoError):
    """The sandbox, or the session or process named, is closed or not open."""


class LimitReached(HakoError):
    """A limit was reached: too many sandboxes, sessions or processes, a body
    or file too large, the server or machine out of resources."""


class Unsupported(HakoError):
    """The sandbox's backend cannot do this (sessions on ``--no-guest``, ...)."""


class BadRequest(HakoError, ValueError):
    """The request was malformed (also a :class:`ValueError`): a bad
    argument, an unknown flag value, an invalid command."""

    def __init__(self, message: str, kind: str = "bad_request", status: Optional[int] = None) -> None:
        HakoError.__init__(self, message, kind, status)


class AuthError(HakoError):
    """The server refused the token (401) or the request's host (403)."""


class ServerError(HakoError):
    """The server failed (an internal error, an unreachable server)."""


_KINDS: Dict[str, Type[HakoError]] = {
    "policy": PolicyError,
    "refused": FenceError,
    "not_found": FileNotFound,
    "command_not_found": CommandNotFound,
    "cannot_execute": CommandNotFound,
    "timeout": CommandTimeout,
    "sandbox_lost": SandboxLost,
    "server_exited": SandboxLost,
    "closed": SandboxClosed,
    "no_such_sandbox": SandboxClosed,
    "no_such_session": SandboxClosed,
    "no_such_process": SandboxClosed,
    "too_many": LimitReached,
    "too_many_sandboxes": LimitReached,
    "too_large": LimitReached,
    "out_of_resources": LimitReached,
    "busy": LimitReached,
    "unsupported": Unsupported,
    "bad_request": BadRequest,
    "invalid_command": BadRequest,
    "bad_name": BadRequest,
    "not_cow": BadRequest,
    "bad_flag": BadRequest,
    "unauthorized": AuthError,
    "forbidden_host": AuthError,
}


def error_for(kind: str, message: str, status: Optional[int] = None) -> HakoError:
    """The exception for hako's error ``kind``: its class, or
    :class:`ServerError` for a 5xx of another kind, else :class:`HakoError`."""
    cls = _KINDS.get(kind)
    if cls is None:
        if status == 401:
            cls = AuthError
        elif status is not None and status >= 500:
            cls = ServerError
        else:
            cls = HakoError
    return cls(message, kind, status)
