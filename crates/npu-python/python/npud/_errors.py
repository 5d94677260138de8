"""Exceptions of the ``npud`` package.

Every refusal by the daemon is an :class:`NpudError` subclass named after its gRPC status code
(``NotFound``, ``ResourceExhausted``, ...) with the code (:attr:`NpudError.code`, an ``int``;
:attr:`NpudError.code_name`, e.g. ``"NOT_FOUND"``), the call (``"Dispatch"``) and the daemon's own
message. Errors found before anything reached the daemon have classes of their own
(:class:`ConnectError`, :class:`AddressError`, :class:`ArtifactError`, ...), with ``code`` None.
"""

from __future__ import annotations

__all__ = [
    "NpudError",
    "DaemonError",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
    "SessionLost",
    "ChainFailed",
    "ConnectError",
    "NoHealthyHost",
    "AddressError",
    "TimeoutError",
    "FdError",
    "ArtifactError",
    "LocalDaemonError",
    "InvalidRequest",
    "IoError",
    "CODE_NAMES",
]

#: gRPC status codes by number.
CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}


class NpudError(Exception):
    """Every error of the package.

    Attributes:
        code: the gRPC status code the daemon answered (an ``int``), or None when the error
            did not come from the daemon.
        code_name: the code's name (``"NOT_FOUND"``), or None.
        call: the RPC (``"Dispatch"``), when known.
        message: the daemon's own message, or the client's explanation.
    """

    code: int | None = None

    def __init__(self, text: str, *, code: int | None = None, call: str | None = None,
                 message: str | None = None) -> None:
        super().__init__(text)
        if code is not None:
            self.code = code
        self.call = call
        self.message = message if message is not None else text

    @property
    def code_name(self) -> str | None:
        return None if self.code is None else CODE_NAMES.get(self.code, str(self.code))


class DaemonError(NpudError):
    """The daemon refused or failed a call (a gRPC status other than OK)."""


def _code_class(name: str, number: int, doc: str) -> type[DaemonError]:
    return type(name, (DaemonError,), {"code": number, "__doc__": doc, "__module__": __name__})


Cancelled = _code_class("Cancelled", 1, "CANCELLED")
Unknown = _code_class("Unknown", 2, "UNKNOWN")
InvalidArgument = _code_class(
    "InvalidArgument", 3,
    "INVALID_ARGUMENT: a malformed program, too few or too small arguments, an empty chain...")
DeadlineExceeded = _code_class(
    "DeadlineExceeded", 4, "DEADLINE_EXCEEDED: the deadline passed before the work started")
NotFound = _code_class("NotFound", 5, "NOT_FOUND: an unknown program or tensor id")
AlreadyExists = _code_class("AlreadyExists", 6, "ALREADY_EXISTS")
PermissionDenied = _code_class(
    "PermissionDenied", 7, "PERMISSION_DENIED: a session of another uid, or a local session over TCP")
ResourceExhausted = _code_class(
    "ResourceExhausted", 8, "RESOURCE_EXHAUSTED: a limit of the daemon's, named in the message")
FailedPrecondition = _code_class(
    "FailedPrecondition", 9,
    "FAILED_PRECONDITION: a quarantined program, a program for another generation...")
Aborted = _code_class("Aborted", 10, "ABORTED")
OutOfRange = _code_class("OutOfRange", 11, "OUT_OF_RANGE")
Unimplemented = _code_class("Unimplemented", 12, "UNIMPLEMENTED")
Internal = _code_class("Internal", 13, "INTERNAL: the device failed the work (it is quarantined)")
Unavailable = _code_class(
    "Unavailable", 14, "UNAVAILABLE: the device is recovering or the daemon is shutting down")
DataLoss = _code_class("DataLoss", 15, "DATA_LOSS")
Unauthenticated = _code_class("Unauthenticated", 16, "UNAUTHENTICATED: no or a wrong session token")

_BY_CODE = {c.code: c for c in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated)}


class SessionLost(Unauthenticated):
    """The daemon no longer knows the session (it restarted, or the session lapsed): its
    tensors and programs are gone; make a new Client. ``session`` is its id."""

    session: int | None = None


class ChainFailed(DaemonError):
    """A chain link failed on the device part way through: ``index`` is the failing link
    (links before it completed), ``not_run`` the links that did not run, ``code`` the
    daemon's code for the failure."""

    index: int = -1
    not_run: list[int] = []


class ConnectError(NpudError):
    """The daemon could not be reached."""


class NoHealthyHost(ConnectError):
    """No host of a :class:`npud.Fleet` could take a session; the message lists each host and
    why (down, not serving, refused)."""


class AddressError(NpudError, ValueError):
    """The address could not be understood or is not allowed."""


class TimeoutError(NpudError, TimeoutError):  # noqa: A001 - also a builtins.TimeoutError
    """A call did not complete in time."""


class FdError(NpudError, OSError):
    """Sharing tensor memory through the daemon's fd socket failed."""


class ArtifactError(NpudError, ValueError):
    """A design's files are missing or malformed (the message names the file and the rule)."""


class LocalDaemonError(NpudError):
    """A private daemon could not be started or stopped (the message has its log)."""


class InvalidRequest(NpudError, ValueError):
    """The client refused the request before sending it."""


class IoError(NpudError, OSError):
    """A local file could not be read or written."""


_BY_KIND = {
    "connect": ConnectError,
    "no_healthy_host": NoHealthyHost,
    "address": AddressError,
    "timeout": TimeoutError,
    "fd": FdError,
    "artifact": ArtifactError,
    "local_daemon": LocalDaemonError,
    "invalid": InvalidRequest,
    "io": IoError,
}



def _from_native(kind: str, code: int | None, call: str | None, message: str | None,
                 text: str, extra: list[int] | None) -> NpudError:
    """Builds the exception for an error of the native client (called from Rust)."""
    if kind == "session_lost":
        e: NpudError = SessionLost(text, code=code, call=call, message=message)
        e.session = extra[0] if extra else None
        return e
    if kind == "chain_failed":
        e = ChainFailed(text, code=code, call="Chain", message=message)
        if extra:
            e.index = extra[0]
            e.not_run = list(extra[1:])
        return e
    if kind == "daemon" and code is not None:
        cls = _BY_CODE.get(code, DaemonError)
        return cls(text, code=code, call=call, message=message)
    return _BY_KIND.get(kind, NpudError)(text, code=code, call=call, message=message)
