"""npud for Python: share an AMD XDNA NPU through the npud daemon.

The package is the Rust client library (npu-client) with a Python face::

    import numpy as np
    import npud

    client = npud.Client()                      # NPUD_ADDR, else npud's default socket
    program = npud.Program.from_dir("build")     # main.pdi + insts.bin, as IRON builds them
    a = client.alloc(1024, np.int32)             # a numpy array over the device's memory
    b = client.alloc(1024, np.int32)
    a[:] = np.arange(1024)
    client.dispatch(program, a, b)               # the GIL is released while the NPU works
    assert (b == a + 1).all()

- :class:`Client` — a session: tensors, dispatch, chains, pipelines, statistics, device info;
  every waiting call has an ``*_async`` twin for asyncio.
- Tensors are plain ``numpy.ndarray`` objects. On a local connection (a Unix socket) they are
  zero-copy views of the memory the device uses, shared with the daemon by file descriptor;
  the array keeps that mapping alive. Over TCP (``http://``/``https://``) the array is a staging
  copy that every dispatch uploads before the work and downloads after it.
- :class:`Fleet` — sessions spread over several npud hosts, each on the healthy host with the
  least pending work, pinned there.
- :class:`Program` — a design's ``main.pdi`` and ``insts.bin``, from a directory or bytes.
- Errors are :class:`NpudError` subclasses carrying the daemon's gRPC code and message.
- :mod:`npud.iron` — IRON's host-runtime interface backed by npud.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import os
import pathlib
import weakref
from typing import Any, Callable, Iterable, Literal, NamedTuple, Sequence

import numpy as np

from . import _npud
from ._errors import *  # noqa: F401,F403 - the exception classes are part of the API
from ._errors import ArtifactError, InvalidRequest, NpudError

__version__ = _npud.__version__

__all__ = [
    "Client",
    "Fleet",
    "Program",
    "Pipeline",
    "Chain",
    "Completion",
    "Timing",
    "ChainResult",
    "ProgramInfo",
    "LocalDaemon",
    "tensor_of",
    "is_tensor",
    "RawTensor",
    "SessionClass",
] + list(_errors.__all__)  # type: ignore[name-defined]  # noqa: F405

RawTensor = _npud.RawTensor
LocalDaemon = _npud.LocalDaemon

SessionClass = Literal["batch", "interactive"]
"""A session's class: ``"batch"`` (throughput work, the default) or ``"interactive"`` (work a
person waits for; its dispatches go first)."""


class Timing(NamedTuple):
    """A dispatch's times as the daemon measured them, in nanoseconds."""

    queue_ns: int
    """From admission to the start of the device batch."""
    device_ns: int
    """From doorbell to completion."""


# A Timing from the binding's (queue_ns, device_ns) pair: tuple.__new__ bound in C, with no
# Python frame of its own (Timing._make is one), on every dispatch's path.
_timing = functools.partial(tuple.__new__, Timing)


class ChainResult(NamedTuple):
    """What a chain did."""

    completed: int
    queue_ns: int
    device_ns: int
    doorbells: int


class ProgramInfo(NamedTuple):
    """What the daemon said when it registered a program."""

    program_id: int
    content_hash: str
    newly_stored: bool


class Completion(NamedTuple):
    """One pipelined dispatch's outcome: ``timing`` or ``error`` (an :class:`NpudError`)."""

    request_id: int
    timing: Timing | None
    error: NpudError | None

    def result(self) -> Timing:
        """The timing, or raises the dispatch's error."""
        if self.error is not None:
            raise self.error
        assert self.timing is not None
        return self.timing


# Names of element types as emulated designs spell them.
_EMU_DTYPES = {
    np.dtype(np.uint8): "u8",
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.int32): "i32",
    np.dtype(np.uint32): "u32",
    np.dtype(np.float32): "f32",
}


def _emu_dtype(dtype: Any) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, str) and dtype in ("u8", "i8", "i16", "i32", "u32", "f32", "bf16"):
        return dtype
    if isinstance(dtype, str) and dtype == "bfloat16":
        return "bf16"
    d = np.dtype(dtype)
    if d.name == "bfloat16":
        return "bf16"
    try:
        return _EMU_DTYPES[d]
    except KeyError:
        raise ValueError(f"dtype {d}: emulated designs take uint8, int8, int16, int32, uint32, "
                         "float32 or bfloat16") from None


def is_tensor(a: Any) -> bool:
    """Whether ``a`` is npud tensor memory (an array from :meth:`Client.alloc` or a RawTensor)."""
    try:
        tensor_of(a)
        return True
    except (TypeError, ValueError):
        return False


def tensor_of(a: Any) -> RawTensor:
    """The npud tensor whose memory the array ``a`` is (the whole of it).

    Raises:
        TypeError: ``a`` is not npud memory (e.g. an array numpy allocated).
        ValueError: ``a`` is a view of part of a tensor, or of its bytes in another order.
    """
    if type(a) is RawTensor:
        return a
    hit = _KNOWN.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    if not isinstance(a, np.ndarray):
        raise TypeError(f"expected a numpy array from npud.Client.alloc, got {type(a).__name__}")
    base: Any = a.base
    while base is not None and type(base) is not RawTensor:
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    if base is None:
        raise TypeError("the array is not npud tensor memory: allocate it with "
                        "npud.Client.alloc (or copy it into one with Client.array)")
    if (a.__array_interface__["data"][0] != base.address or a.nbytes != base.nbytes
            or not a.flags.c_contiguous):
        raise ValueError(f"the array is a view of part of tensor {base.id} ({a.nbytes} of its "
                         f"{base.nbytes} bytes, or not in order): dispatches take whole tensors; "
                         "pass the array Client.alloc returned (any reshape of it is fine)")
    _remember(a, base)
    return base


def view_of(a: Any) -> tuple[RawTensor, int, int]:
    """The npud tensor under the array ``a``, and the byte range of it that ``a`` is:
    ``(tensor, offset, nbytes)``. ``a`` may be a contiguous slice of a tensor's array (a
    sub-view, as IRON's ``subview``); a dispatch then passes the program those bytes in place.

    Raises:
        TypeError: ``a`` is not npud memory.
        ValueError: ``a`` is not one contiguous range of its tensor.
    """
    try:
        raw = tensor_of(a)
        return raw, 0, raw.nbytes
    except ValueError:
        pass
    base: Any = a.base
    while base is not None and type(base) is not RawTensor:
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    assert base is not None
    offset = a.__array_interface__["data"][0] - base.address
    if not a.flags.c_contiguous or offset < 0 or offset + a.nbytes > base.nbytes:
        raise ValueError(f"the array is not one contiguous range of tensor {base.id}: "
                         "pass a contiguous slice (np.ascontiguousarray copies out of npud memory)")
    return base, offset, a.nbytes


# Arrays already resolved to their tensor, by id, each with a weak reference that drops the
# entry when the array goes (an array's memory and size never change, so the answer holds).
_KNOWN: dict[int, tuple[weakref.ref[np.ndarray], RawTensor]] = {}


def _remember(a: np.ndarray, raw: RawTensor) -> None:
    key = id(a)
    _KNOWN[key] = (weakref.ref(a, lambda _r, key=key: _KNOWN.pop(key, None)), raw)


def _each(args: Iterable[Any], of: Callable[[Any], Any], where: str = "") -> list[Any]:
    """``of`` of each argument; an error names the argument (``where`` + ``args[i]``)."""
    out = []
    for i, a in enumerate(args):
        try:
            out.append(of(a))
        except (TypeError, ValueError) as e:
            raise type(e)(f"{where}args[{i}]: {e}") from None
    return out


def _raws(args: Iterable[Any]) -> list[RawTensor]:
    """Each argument's whole tensor (:func:`tensor_of`)."""
    # The arrays a program is dispatched over again and again are known: look them up without
    # the per-argument error handling, which only the first dispatch over an array needs.
    out = []
    known = _KNOWN.get
    for a in args:
        hit = known(id(a))
        if hit is None or hit[0]() is not a:
            return _each(args, tensor_of)
        out.append(hit[1])
    return out


def _ranges(args: Iterable[Any], where: str = "") -> list[tuple[RawTensor, int, int]]:
    """Each argument's tensor and byte range (:func:`view_of`)."""
    return _each(args, view_of, where)


def _future(start: Callable[..., None], *args: Any) -> asyncio.Future[Any]:
    """Starts a native call whose last argument is a completion callback, as a future of the
    running loop."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.cancelled():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    def done(value: Any, exc: BaseException | None) -> None:
        loop.call_soon_threadsafe(settle, value, exc)

    start(*args, done)
    return fut


def _view(raw: RawTensor, shape: Any, dtype: Any) -> np.ndarray:
    d = np.dtype(dtype)
    arr = np.frombuffer(raw, dtype=np.uint8).view(d).reshape(shape)
    _remember(arr, raw)
    return arr


def _nbytes(shape: Any, dtype: Any) -> int:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return n * np.dtype(dtype).itemsize


class Program:
    """A design's program: ``main.pdi`` plus ``insts.bin``, checked on the client as the
    daemon will check them, registered once per session by its first dispatch."""

    __slots__ = ("_p",)

    def __init__(self, native: Any) -> None:
        self._p = native

    @staticmethod
    def from_dir(path: str | os.PathLike[str]) -> Program:
        """Reads ``path/main.pdi`` and ``path/insts.bin`` (or the same under ``path/build``).

        Raises:
            ArtifactError: a file is missing (naming every path tried, and how to make a
                design) or malformed.
        """
        try:
            return Program(_npud.Program.from_dir(os.fspath(path)))
        except ArtifactError as e:
            p = pathlib.Path(path)
            if any((d / "main.pdi").is_file() and (d / "insts.bin").is_file()
                   for d in (p, p / "build")):
                raise
            raise ArtifactError(
                f"{e}. A design directory holds the main.pdi and insts.bin aiecc writes; for the "
                f"emulator, `npuctl emu-design vector_scalar_add --out {p}` makes one (or "
                "npud.Program.write_emulated from Python)", message=e.message) from None

    @staticmethod
    def from_bytes(name: str, pdi: bytes, insts: bytes) -> Program:
        """A program from the bytes of a PDI and an instruction stream (``insts.bin``)."""
        return Program(_npud.Program.from_bytes(name, bytes(pdi), bytes(insts)))

    @staticmethod
    def from_hsaco(source: str | os.PathLike[str] | bytes, kernel: str = "") -> Program:
        """Kernel ``kernel`` of an AIE hsaco, from a path or from bytes (``kernel`` may be
        empty when the file has one kernel). A PdiInsts kernel runs on every runtime npud
        supports; a FullElf kernel only where the runtime loads code objects.

        Raises:
            InvalidRequest: the file breaks a format rule (named with its offset) or lacks
                the kernel (the message lists those it has).
        """
        if isinstance(source, (bytes, bytearray, memoryview)):
            return Program(_npud.Program.from_hsaco(bytes(source), kernel))
        return Program(_npud.Program.from_hsaco(os.fspath(source), kernel))

    @staticmethod
    def from_full_elf(source: str | os.PathLike[str] | bytes, kernel: str = "", *,
                      num_cols: int | None = None) -> Program:
        """Kernel ``kernel`` of a full ELF (PDIs plus control code, as aiecc's
        ``--get-full-elf`` writes it and IRON's ``NPUKernel(elf_path=...)`` runs), from a path
        or bytes; ``num_cols`` only when the ELF does not record its column count. It runs
        where the runtime loads code objects.

        Raises:
            ArtifactError, InvalidRequest: the ELF is malformed or lacks the kernel.
        """
        data = bytes(source) if isinstance(source, (bytes, bytearray, memoryview)) \
            else pathlib.Path(source).read_bytes()
        return Program(_npud.Program.from_full_elf(data, kernel, num_cols))

    @staticmethod
    def emulated(kernel: str, n: int, *, generation: str = "npu2", dtype: Any = None,
                 scalar: int | None = None) -> Program:
        """An emulated design for the daemon's emulator: ``kernel`` is one of passthrough,
        vector_scalar_add, vector_scalar_add_inplace, vector_scalar_add_unused (in, unused,
        out), vector_scalar_mul (in place), vector_scale (in, out, an i32 factor
        buffer), vector_scale_mid (in, factor, out), vector_vector_add, vector_mul, relu,
        matmul (n×n×n), noop, fault, hang; ``n`` elements; ``generation`` should be :attr:`Client.generation`."""
        return Program(_npud.Program.emulated(kernel, n, generation, _emu_dtype(dtype), scalar))

    @staticmethod
    def write_emulated(path: str | os.PathLike[str], kernel: str, n: int, *,
                       generation: str = "npu2", dtype: Any = None,
                       scalar: int | None = None) -> None:
        """Writes an emulated design's ``main.pdi`` and ``insts.bin`` into ``path``."""
        _npud.Program.write_emulated(os.fspath(path), kernel, n, generation, _emu_dtype(dtype),
                                     scalar)

    @property
    def name(self) -> str:
        return self._p.name

    @property
    def pdi(self) -> bytes:
        return self._p.pdi

    @property
    def insts(self) -> bytes:
        return self._p.insts

    @property
    def min_arg_bytes(self) -> list[int]:
        """The smallest size of each buffer argument in bytes, from the instruction stream."""
        return self._p.min_arg_bytes

    def __repr__(self) -> str:
        return repr(self._p)


# Every client of this process, closed at interpreter exit: a session left open would hold its
# place on the daemon through the grace period (meant for a client that reconnects), and a
# short script run again and again would fill the daemon's session limit.
_OPEN: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for c in list(_OPEN):
        try:
            c.close()
        except Exception:  # noqa: BLE001 - the daemon has gone, or the process forked: nothing to do
            pass


class Client:
    """A session on npud. Cheap to share between threads; not across ``fork`` (make a new one
    in the child).

    ``addr``: ``None`` (``NPUD_ADDR``, else npud's default socket), a socket path,
    ``unix:PATH``, ``http://HOST:PORT`` (loopback only) or ``https://HOST:PORT``.

    For ``https://``: ``ca`` is a PEM CA bundle that signs the daemon's certificate (default:
    the system roots); ``cert`` and ``key`` a PEM client certificate and its key (mTLS);
    ``tls_server_name`` the name the daemon's certificate must carry when it is not the
    address's host. ``token_file`` (default: ``NPUD_TOKEN_FILE``) or ``token`` is an identity
    token's secret from npud's ``auth.token_dir``, sent as ``x-npud-token`` with every call.

    ``session_class``: ``"batch"`` (the default) or ``"interactive"`` (latency work a person
    waits for: its dispatches go first). ``deadline_us``: an interactive session's deadline per
    dispatch, admission to answer, in microseconds (at most 10,000,000; ``None``: the
    daemon's default for interactive sessions).
    :attr:`session_class` and :attr:`deadline_us` are what the daemon granted.

    Raises:
        ValueError: ``session_class`` is neither ``"batch"`` nor ``"interactive"``, or
            ``deadline_us`` is negative.
        ConnectError: the daemon cannot be reached.
        AddressError: the address is malformed or not allowed.
        ResourceExhausted: the daemon refuses the session (too many sessions).
        PermissionDenied: the daemon's policy (``auth.rules[].classes``) does not give the
            caller this class.
        InvalidArgument: a deadline for a batch session, or one over 10 s.
    """

    __slots__ = ("_c", "__weakref__")

    def __init__(self, addr: str | None = None, *, ca: str | os.PathLike[str] | None = None,
                 cert: str | os.PathLike[str] | None = None,
                 key: str | os.PathLike[str] | None = None, tls_server_name: str | None = None,
                 token_file: str | os.PathLike[str] | None = None, token: str | None = None,
                 session_class: SessionClass = "batch", deadline_us: int | None = None,
                 _native: Any = None) -> None:
        self._c = _native if _native is not None else _npud.Client(
            addr, ca=ca, cert=cert, key=key, tls_server_name=tls_server_name,
            token_file=token_file, token=token, session_class=session_class,
            deadline_us=deadline_us)
        _OPEN.add(self)

    @classmethod
    async def connect(cls, addr: str | None = None, *, ca: str | os.PathLike[str] | None = None,
                      cert: str | os.PathLike[str] | None = None,
                      key: str | os.PathLike[str] | None = None,
                      tls_server_name: str | None = None,
                      token_file: str | os.PathLike[str] | None = None,
                      token: str | None = None, session_class: SessionClass = "batch",
                      deadline_us: int | None = None) -> Client:
        """Connects without blocking the event loop (the keywords as for ``Client``)."""
        start = functools.partial(
            _npud.Client.connect_start, ca=ca, cert=cert, key=key,
            tls_server_name=tls_server_name, token_file=token_file, token=token,
            session_class=session_class, deadline_us=deadline_us)
        native = await _future(start, addr)
        return cls(_native=native)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"npud.Client(address={self.address!r}, session={self.session_id})"

    @property
    def session_id(self) -> int:
        return self._c.session_id

    @property
    def address(self) -> str:
        return self._c.address

    @property
    def session_class(self) -> SessionClass:
        """The class the daemon granted, ``"batch"`` or ``"interactive"`` (``"batch"`` from a
        daemon older than session classes)."""
        return self._c.session_class

    @property
    def deadline_us(self) -> int | None:
        """The deadline the daemon granted, in microseconds; ``None`` without one."""
        return self._c.deadline_us

    @property
    def is_local(self) -> bool:
        """Whether tensors are shared by fd (no copies): a Unix socket and a daemon that
        exports memory."""
        return self._c.is_local

    @property
    def generation(self) -> str:
        """The device's generation, ``"npu1"`` or ``"npu2"``."""
        return self._c.generation

    @property
    def reconnects(self) -> int:
        """How often the client reconnected and resumed its session."""
        return self._c.reconnects

    def device_info(self) -> dict[str, Any]:
        """The daemon's ``DeviceInfo`` (the proto's field names)."""
        return json.loads(self._c.device_info_json())

    async def device_info_async(self) -> dict[str, Any]:
        return json.loads(await _future(self._c.device_info_start))

    def statistics(self) -> dict[str, Any]:
        """The daemon's ``Statistics``: per session and per program counters, and per session
        class (``classes``: each with ``session_class``, ``open_sessions``, ``dispatches``,
        ``deadline_missed``; empty from a daemon older than classes). A session's and a class's
        ``session_class`` is its name, ``"batch"`` or ``"interactive"``."""
        return json.loads(self._c.statistics_json())

    async def statistics_async(self) -> dict[str, Any]:
        return json.loads(await _future(self._c.statistics_start))

    def register(self, program: Program) -> ProgramInfo:
        """Registers ``program`` in the session (dispatching registers it anyway)."""
        return ProgramInfo(*self._c.register(program._p))

    def alloc(self, shape: int | Sequence[int], dtype: Any = np.int32, *,
              name: str = "") -> np.ndarray:
        """A zeroed tensor of ``shape`` and ``dtype``, as a numpy array over its memory."""
        raw = self._c.alloc(_nbytes(shape, dtype), name)
        return _view(raw, shape, dtype)

    async def alloc_async(self, shape: int | Sequence[int], dtype: Any = np.int32, *,
                          name: str = "") -> np.ndarray:
        raw = await _future(self._c.alloc_start, _nbytes(shape, dtype), name)
        return _view(raw, shape, dtype)

    def array(self, data: Any, dtype: Any = None, *, name: str = "") -> np.ndarray:
        """A tensor holding a copy of ``data`` (anything ``numpy.asarray`` takes)."""
        src = np.asarray(data, dtype=dtype)
        out = self.alloc(src.shape, src.dtype, name=name)
        out[...] = src
        return out

    def dispatch(self, program: Program, *args: Any) -> Timing:
        """Runs ``program`` once over the tensors ``args`` (in the design's order: inputs,
        then outputs) and waits for the device, with the GIL released. An argument may be a
        contiguous slice of a tensor's array (``buf[256:512]``): the program gets those bytes
        of the tensor in place, and one tensor may give several arguments.

        Raises:
            InvalidArgument: too few or too small arguments (the message names the argument).
            NotFound, FailedPrecondition, Internal, ...: the daemon's refusal, with its message.
        """
        # Arrays dispatched before are resolved natively; the rest (an array seen for the
        # first time, a sub-view, a wrong argument) here.
        t = self._c.dispatch_known(program._p, args, _KNOWN)
        if t is not None:
            return _timing(t)
        try:
            raws = _raws(args)
        except ValueError:
            # Sub-views (contiguous slices of a tensor's array): their byte ranges, in place.
            return Timing(*self._c.dispatch_views(program._p, _ranges(args)))
        return _timing(self._c.dispatch(program._p, raws))

    async def dispatch_async(self, program: Program, *args: Any) -> Timing:
        return Timing(*await _future(self._c.dispatch_start, program._p, _raws(args)))

    def chain(self) -> Chain:
        """A chain: links run in order, on as few doorbell rings as the daemon can."""
        return Chain(self)

    def pipeline(self, depth: int = 16) -> Pipeline:
        """A pipeline keeping up to ``depth`` dispatches in flight (tensors shared in place
        only: a local connection), on the session's dispatch ring when it has one (at most 64
        in flight there), else on ``Submit`` streams."""
        return Pipeline(self._c.pipeline(depth))

    def close(self) -> None:
        """Ends the session: the daemon frees its tensors (arrays over them keep their
        memory mapped, but the device no longer uses it)."""
        _OPEN.discard(self)
        self._c.close()


class Chain:
    """Links of a chain; ``client.chain().then(p, a, b).then(q, b, c).run()``."""

    __slots__ = ("_client", "_links")

    def __init__(self, client: Client) -> None:
        self._client = client
        self._links: list[tuple[Any, list[tuple[RawTensor, int, int]]]] = []

    def then(self, program: Program, *args: Any) -> Chain:
        """Adds a link: ``program`` over ``args``, each a tensor's array or a contiguous slice
        of one (the link gets those bytes in place, as :meth:`Client.dispatch` does)."""
        self._links.append((program._p, _ranges(args, f"links[{len(self._links)}].")))
        return self

    def __len__(self) -> int:
        return len(self._links)

    def run(self) -> ChainResult:
        """Runs the chain and waits for it.

        Raises:
            ChainFailed: a link failed on the device (``index``, ``not_run``, ``code``).
            InvalidArgument: an empty chain, or a link the daemon refuses before anything ran.
        """
        return ChainResult(*self._client._c.chain(self._links))

    async def run_async(self) -> ChainResult:
        return ChainResult(*await _future(self._client._c.chain_start, self._links))


def _completion(t: tuple[int, tuple[int, int] | None, NpudError | None] | None) -> Completion | None:
    if t is None:
        return None
    rid, timing, err = t
    return Completion(rid, Timing(*timing) if timing is not None else None, err)


class Pipeline:
    """Dispatches in flight, at most ``depth`` at once.

    Each submission takes its tensors in submission order (shared where the design only reads
    them, alone where it may write them), so work on one tensor keeps its order while work on
    other tensors overlaps. On the ring a submission takes them before :meth:`submit` returns,
    so a call made after it on the same tensor runs after it; on ``Submit`` streams it takes
    them when the pipeline's task reaches it, and such a call may run first.

    On the session's dispatch ring (:attr:`on_ring`: a local session with the fast path on),
    :meth:`submit` writes the dispatch into the ring on the calling thread and returns its
    request id; it waits only while ``depth`` dispatches are in flight, or for a tensor that
    one in flight (or another call) holds. On ``Submit`` streams, it returns at once (it waits
    only while ``depth`` dispatches are in flight and eight times ``depth`` more wait to be
    sent: one stream carries that many before it is drained, so opening and draining it is
    paid once per eight windows). A dispatch refused by the daemon, or by the
    client after it was numbered (a tensor of another session), comes back as a completion with
    ``error`` set. Completions come back in submission order, a refused or failed
    dispatch as a :class:`Completion` with ``error`` set, and the stream goes on. Used as a
    context manager it waits for everything in flight on exit.
    """

    __slots__ = ("_p", "_sent", "_returned")

    def __init__(self, native: Any) -> None:
        self._p = native
        self._sent = 0
        self._returned = 0

    @property
    def depth(self) -> int:
        return self._p.depth

    @property
    def on_ring(self) -> bool:
        """Whether the dispatches go through the session's dispatch ring (a local session with
        the fast path on), rather than ``Submit`` streams."""
        return self._p.on_ring

    @property
    def pending(self) -> int:
        """Dispatches sent whose completion has not been returned yet."""
        return self._sent - self._returned

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish()

    def submit(self, program: Program, *args: Any) -> int:
        rid = self._p.submit(program._p, _raws(args))
        self._sent += 1
        return rid

    async def submit_async(self, program: Program, *args: Any) -> int:
        rid = await _future(self._p.submit_start, program._p, _raws(args))
        self._sent += 1
        return rid

    def next_completion(self) -> Completion | None:
        """The next completion in submission order; None when nothing is pending."""
        c = _completion(self._p.next_completion())
        if c is not None:
            self._returned += 1
        return c

    async def next_completion_async(self) -> Completion | None:
        c = _completion(await _future(self._p.next_completion_start))
        if c is not None:
            self._returned += 1
        return c

    def finish(self) -> list[Completion]:
        """Waits for every dispatch in flight; their completions, in order."""
        out = [_completion(t) for t in self._p.drain()]
        self._returned += len(out)
        return out  # type: ignore[return-value]

    async def finish_async(self) -> list[Completion]:
        out = [_completion(t) for t in await _future(self._p.drain_start)]
        self._returned += len(out)
        return out  # type: ignore[return-value]


class Fleet:
    """Several npud hosts that sessions are spread over (npu-client's ``Fleet``).

    ``spec``: addresses separated by commas (any form :class:`Client` takes), or
    ``dns:///NAME:PORT`` for every address NAME resolves to (a Kubernetes headless Service).
    Each host is probed at once and then every two seconds (gRPC health and the daemon's
    statistics) in the background.

    :meth:`open` opens a session on the serving host with the fewest pending dispatches, then
    the fewest sessions; equal hosts take turns. The session stays on its host. When the host
    goes down, its sessions raise :class:`SessionLost` naming it.

    Raises:
        AddressError: the fleet does not parse, or its DNS name does not resolve.
    """

    __slots__ = ("_f", "__weakref__")

    def __init__(self, spec: str) -> None:
        self._f = _npud.Fleet(spec)

    def __repr__(self) -> str:
        return f"npud.Fleet({self.spec!r})"

    @property
    def spec(self) -> str:
        return self._f.spec

    def open(self, *, session_class: str = "batch", deadline_us: int | None = None) -> Client:
        """A session on the least loaded healthy host, of class ``session_class`` (``"batch"``
        or ``"interactive"``, with ``deadline_us`` as :class:`Client` takes them).

        Raises:
            ValueError: an unknown class or a negative deadline, before anything is sent.
            NoHealthyHost: no host takes the session; the message lists each host and why (a
                host whose policy refuses the class among them).
        """
        return Client(_native=self._f.open(session_class=session_class, deadline_us=deadline_us))

    async def open_async(self, *, session_class: str = "batch",
                         deadline_us: int | None = None) -> Client:
        """:meth:`open` without blocking the event loop."""
        return Client(_native=await _future(
            lambda cb: self._f.open_start(cb, session_class=session_class,
                                          deadline_us=deadline_us)))

    def refresh(self) -> None:
        """Probes every host now (down ones too) and resolves a DNS name again."""
        self._f.refresh()

    def hosts(self) -> list[dict[str, Any]]:
        """Each host: ``address``, ``health`` (``serving``, ``not_serving``, ``down``,
        ``unknown``), ``reason``, ``sessions``, ``pending_dispatches``, ``next`` (the next
        session goes there), ``checked_ms_ago``, ``retry_in_ms``."""
        return json.loads(self._f.hosts_json())["hosts"]
