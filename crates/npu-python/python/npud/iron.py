"""IRON's host runtime, backed by npud.

IRON (mlir-aie's Python API) runs a design through a *host runtime* (``aie.utils``'s
``HostRuntime``: ``load``, ``run``, ``load_and_run``, ``run_test``, ``device``, ``cleanup``, ...)
and tensors of its default tensor class (an ``NpuTensor``, ``Tensor`` in older IRON). This module
implements both on a shared npud: a design's PDI and ``insts.bin`` are registered with the daemon
once, tensors are npud memory (zero-copy numpy views on a local connection), and dispatches and
chains run through the daemon's queue, alongside every other process using the NPU.

When IRON is importable, the classes here are subclasses of IRON's own: :class:`NpudTensor`
of ``NpuTensor`` (or ``Tensor``), :class:`NpudRuntime` of ``HostRuntime``, :class:`NpudKernelHandle`
and :class:`NpudKernelResult` of ``KernelHandle`` and ``KernelResult``, and :class:`HostRuntimeError`
of IRON's ``HostRuntimeError`` (every npud error a run raises is one), so IRON's checks and
``except`` clauses take them for its own. Without IRON the same classes stand alone.

The one-line switch, anywhere in a script (before or after it imports ``aie.utils``)::

    import npud.iron; npud.iron.install()       # IRON now runs its designs on npud

or, for a script left unchanged, ``python -m npud.iron SCRIPT [ARGS...]`` (or ``NPUD_IRON=1``
with :func:`enable_on_import` in a ``sitecustomize``), which installs npud the moment the script
imports ``aie.utils``.

Written against IRON's ``python/utils/`` in two eras: mlir-aie's main at commit
3ca0193cea9e2c39ec670a65f93e1dd43c969f22 (2026-08) and 1e400306479ef709a0f897e330cd51fc297f9a13
(2026-03). What IRON's interface has that npud does not, and what the adapter does instead, is
listed in ``crates/npu-python/README.md``.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.abc
import importlib.util
import math
import operator
import os
import pathlib
import sys
import threading
import weakref
from typing import Any, Iterable, Sequence

import numpy as np

from . import Client, NpudError, Program, tensor_of

__all__ = [
    "NpudRuntime",
    "NpudKernelHandle",
    "NpudKernelResult",
    "NpudTensor",
    "HostRuntimeError",
    "IronMissing",
    "install",
    "enable_on_import",
    "default_client",
    "iron_version",
]

_ADDR: str | None = None
_CLIENT: Client | None = None
_LOCK = threading.RLock()
# The bytes of a tensor's coherence granule (IRON's COHERENCE_GRANULE: a cache line), used
# when IRON does not say.
_GRANULE = 64


class IronMissing(ImportError):
    """IRON (mlir-aie's ``aie`` Python package) cannot be imported, so there is nothing to
    install npud into."""


# --- the client ------------------------------------------------------------------------------

def default_client() -> Client:
    """The session :class:`NpudTensor` allocates in and :class:`NpudRuntime` runs on (made on
    first use, from ``install``'s address or ``NPUD_ADDR``/npud's default socket; made again
    after :meth:`NpudRuntime.cleanup` closed it)."""
    global _CLIENT
    with _LOCK:
        if _CLIENT is None:
            _CLIENT = Client(_ADDR)
        return _CLIENT


# Live tensors per session, so that cleanup closes a session only when none of its memory is
# still in use.
_LIVE: dict[int, weakref.WeakSet[Any]] = {}


def _track(client: Client, t: Any) -> None:
    _LIVE.setdefault(id(client), weakref.WeakSet()).add(t)


def _close_default(force: bool) -> bool:
    """Closes the default session when nothing uses it (or ``force``); true if it was closed."""
    global _CLIENT
    with _LOCK:
        c = _CLIENT
        if c is None:
            return True
        if not force and len(_LIVE.get(id(c), ())) > 0:
            return False
        _CLIENT = None
        _LIVE.pop(id(c), None)
    try:
        c.close()
    except NpudError:
        pass  # the daemon has gone, or the session already ended: nothing left to close
    return True


@atexit.register
def _at_exit() -> None:
    # A session left open outlives the process by the daemon's grace period: close it.
    _close_default(force=True)


# --- IRON's classes ----------------------------------------------------------------------------

class _Iron:
    """IRON's host-runtime classes, as found in ``aie.utils``."""

    def __init__(self) -> None:
        from aie.utils.hostruntime import hostruntime as hr  # type: ignore[import-not-found]
        from aie.utils.hostruntime import tensor_class as tc  # type: ignore[import-not-found]

        self.utils = sys.modules["aie.utils"]
        self.hostruntime = sys.modules["aie.utils.hostruntime"]
        self.HostRuntime = hr.HostRuntime
        self.KernelHandle = hr.KernelHandle
        self.KernelResult = hr.KernelResult
        self.HostRuntimeError = hr.HostRuntimeError
        self.tensor_base = getattr(tc, "NpuTensor", None) or tc.Tensor


def _find_iron() -> _Iron | None:
    """IRON's classes when ``aie.utils`` is imported already or can be imported, else None."""
    if "aie.utils" not in sys.modules:
        try:
            if importlib.util.find_spec("aie") is None:
                return None
        except (ImportError, ValueError):
            return None
    try:
        return _Iron()
    except ImportError:
        return None


def iron_version() -> str | None:
    """Which IRON the classes here subclass: ``"NpuTensor"`` (newer IRON), ``"Tensor"`` (older),
    or None (IRON not importable: the classes stand alone)."""
    return None if _BOUND is None else _BOUND.tensor_base.__name__


# --- what IRON's base classes give, for when IRON is not importable -----------------------------

class _StandaloneError(Exception):
    pass


class _StandaloneHandle:
    pass


class _StandaloneResult:
    def __init__(self, npu_time: int, trace_config: Any = None):
        self._npu_time = npu_time
        self._trace_config = trace_config

    @property
    def npu_time(self) -> int:
        return self._npu_time

    @property
    def trace_config(self) -> Any:
        return self._trace_config

    def has_trace(self) -> bool:
        return self._trace_config is not None


class _StandaloneRuntime:
    """IRON's ``HostRuntime`` behaviour that the npud runtime does not override."""

    def check_device_consistency(self) -> None:
        """Refuses when the current device set with IRON's ``set_current_device`` cannot be
        loaded on the daemon's NPU (a design for another generation, or wider than it)."""
        override = _current_device()
        if override is None:
            return
        mine = self.device()
        same = _generation_of(override) == _generation_of(mine)
        cols_o, cols_m = getattr(override, "cols", None), getattr(mine, "cols", None)
        fits = cols_o is None or cols_m is None or cols_o <= cols_m
        if not (same and fits):
            raise RuntimeError(
                f"Overridden device {override} is not loadable on runtime device {mine}")

    def evict_context(self, xclbin_path: Any) -> None:
        """Nothing to evict: npud keeps no per-design context in this process."""
        return

    @classmethod
    def read_insts_binary(cls, insts_path: Any) -> np.ndarray:
        return np.frombuffer(pathlib.Path(insts_path).read_bytes(), dtype=np.uint32)

    @classmethod
    def read_insts(cls, insts_path: Any) -> np.ndarray:
        p = pathlib.Path(insts_path)
        if p.suffix.lower() != ".bin":
            raise HostRuntimeError(
                "Unsupported file extension for instruction file: expected .bin")
        return cls.read_insts_binary(p)

    @classmethod
    def verify_results(cls, io_args: Sequence[Any], refs: dict[int, Any] | None = None,
                       verbosity: int = 0) -> int:
        """The number of references ``io_args[i]`` does not match (IRON counts one error per
        mismatching reference, not per element)."""
        errors = 0
        for idx, ref in (refs or {}).items():
            if idx >= len(io_args):
                raise HostRuntimeError(
                    f"Error: Reference index {idx} out of bounds for {len(io_args)} IO buffers")
            io_args[idx].to("cpu")
            o = io_args[idx].numpy()
            ref = np.asarray(ref)
            if ref.dtype.name == "bfloat16":
                ok = np.allclose(ref.astype(np.float16), np.asarray(o).astype(np.float16))
            else:
                ok = np.allclose(ref, o)
            errors += 0 if ok else 1
        return errors

    def run_test(self, npu_kernel: Any, io_args: Any, ref: dict[int, Any] | None,
                 verify: bool = True, verbosity: int = 0) -> int:
        """Loads and runs the design, then compares ``io_args[i]`` with ``ref[i]``: 0 when
        every reference matches, 1 otherwise."""
        h = self.load(npu_kernel)
        if not isinstance(io_args, list):
            io_args = [io_args] if io_args else []
        r = self.run(h, io_args)
        if verbosity >= 1:
            print(f"npu_time: {r.npu_time / 1000.0} us")
        errors = self.verify_results(io_args, ref, verbosity) if verify else 0
        return 0 if not errors else 1


class _StandaloneTensor:
    """IRON's ``NpuTensor`` behaviour that the npud tensor does not override; on IRON's own
    base class, the members here that the base lacks (older IRON has no ``subview``, say)."""

    DEVICES = ["cpu", "npu"]
    DEFAULT_DEVICE = "npu"
    DEFAULT_INT_DTYPE = np.int64
    DEFAULT_FLOAT_DTYPE = np.float32
    _parent: Any = None
    _offset_bytes: int = 0

    # -- residency ---------------------------------------------------------------------------
    def _base_init(self, shape_or_data: Any, dtype: Any, device: str) -> None:
        if device not in type(self).DEVICES:
            raise ValueError(f"Unsupported device: {device}")
        self._device = device
        self.dtype = dtype

    @property
    def device(self) -> str:
        return self._device

    @device.setter
    def device(self, value: str) -> None:
        if value not in type(self).DEVICES:
            raise ValueError(f"Unsupported device: {value}")
        self._device = value

    def to(self, target_device: str) -> Any:
        if target_device == self.device:
            return self
        if target_device == "npu":
            self._sync_to_device()
        elif target_device == "cpu":
            self._sync_from_device()
        else:
            raise ValueError(f"Unknown device '{target_device}'")
        self.device = target_device
        return self

    # -- views -------------------------------------------------------------------------------
    @property
    def base(self) -> Any:
        owner = self._parent
        while owner is not None and owner._parent is not None:
            owner = owner._parent
        return owner

    @property
    def is_view(self) -> bool:
        return self.base is not None

    @property
    def storage_offset(self) -> int:
        return self._offset_bytes

    def subview(self, offset: int, shape: Any, dtype: Any = None) -> Any:
        """A tensor over ``shape`` elements of ``dtype`` from byte ``offset`` of this one's
        memory (no copy), as IRON's: in bounds, and aligned to the coherence granule unless it
        ends where this tensor ends."""
        view_dtype = np.dtype(dtype) if dtype is not None else np.dtype(self.dtype)
        shape = _as_shape(shape)
        try:
            offset = operator.index(offset)
        except TypeError:
            raise TypeError(
                f"subview() offset must be an integer number of bytes, got {offset!r}.") from None
        nbytes = math.prod(shape) * view_dtype.itemsize
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"subview(offset={offset}, shape={shape}, dtype={view_dtype}) is "
                             f"out of bounds for a buffer of {self.nbytes} bytes")
        at_end = offset + nbytes == self.nbytes
        if offset % _GRANULE or (nbytes % _GRANULE and not at_end):
            raise ValueError(
                f"subview(offset={offset}, shape={tuple(shape)}, dtype={view_dtype}) spans "
                f"bytes [{offset}, {offset + nbytes}) of this buffer, which is not aligned to "
                f"the {_GRANULE}-byte coherence granule")
        return self._subview(offset, tuple(shape), view_dtype)

    # -- reading and writing -----------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        return self.data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.data.astype(dtype) if dtype else self.data

    def __getitem__(self, index: Any) -> Any:
        return self.data[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        self.data[index] = value

    def __len__(self) -> int:
        if self.data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({np.array2string(self.data, separator=',')}, "
                f"device='{self.device}')")

    @property
    def nbytes(self) -> int:
        return self.numel() * self.element_size

    @property
    def element_size(self) -> int:
        return np.dtype(self.dtype).itemsize

    def numel(self) -> int:
        return int(math.prod(self.shape))

    def fill_(self, value: Any) -> Any:
        self.data.fill(value)
        return self

    def mutate(self) -> Any:
        """``with t.mutate() as a: a[...] = ...``: a write to the tensor's memory (npud's
        memory is the device's, so nothing is left to reconcile)."""
        return _Borrow(self)

    def overwrite(self) -> Any:
        """As :meth:`mutate`, for a write that replaces every byte."""
        return _Borrow(self)

    def to_torch(self) -> Any:
        import torch  # type: ignore[import-not-found]

        return torch.from_numpy(self.numpy())

    # -- factories, with IRON's signatures ---------------------------------------------------
    @classmethod
    def _check_or_create(cls, *size: Any, out: Any = None, dtype: Any = None,
                         device: Any = None, **kwargs: Any) -> Any:
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) \
            else tuple(size)
        dtype = dtype or np.float32
        device = device or cls.DEFAULT_DEVICE
        if out is not None:
            if out.shape != shape or out.dtype != dtype or out.device != device:
                raise ValueError("Provided `out` tensor must match shape, dtype, and device")
            return out
        return cls(shape, dtype=dtype, device=device, **kwargs)

    @classmethod
    def ones(cls, *size: Any, out: Any = None, dtype: Any = None, device: Any = None,
             **kwargs: Any) -> Any:
        return cls._check_or_create(*size, out=out, dtype=dtype, device=device,
                                    **kwargs).fill_(1)

    @classmethod
    def zeros(cls, *size: Any, out: Any = None, dtype: Any = None, device: Any = None,
              **kwargs: Any) -> Any:
        return cls._check_or_create(*size, out=out, dtype=dtype, device=device,
                                    **kwargs).fill_(0)

    @classmethod
    def full(cls, size: Any, fill_value: Any, *, out: Any = None, dtype: Any = None,
             device: Any = None, **kwargs: Any) -> Any:
        return cls._check_or_create(size, out=out, dtype=dtype, device=device,
                                    **kwargs).fill_(fill_value)

    @classmethod
    def randint(cls, low: int, high: int, size: Any, *, out: Any = None, dtype: Any = None,
                device: Any = None, generator: Any = None, **kwargs: Any) -> Any:
        dtype = dtype or np.int64
        t = cls._check_or_create(size, out=out, dtype=dtype, device=device, **kwargs)
        if generator is not None:
            v = generator.integers(low, high, size=size, dtype=dtype)
        else:
            v = np.random.randint(low, high, size=size, dtype=dtype)
        t.data[...] = v
        return t

    @classmethod
    def rand(cls, *size: Any, out: Any = None, dtype: Any = None, device: Any = None,
             generator: Any = None, **kwargs: Any) -> Any:
        if not size:
            raise ValueError("rand() received no arguments")
        dtype = dtype or np.float32
        t = cls._check_or_create(*size, out=out, dtype=dtype, device=device, **kwargs)
        rng = generator.uniform if generator is not None else np.random.uniform
        v = np.asarray(rng(0.0, 1.0, size=t.shape)).astype(dtype)
        if np.issubdtype(np.dtype(dtype), np.floating):
            v = np.clip(v, 0.0, np.nextafter(np.dtype(dtype).type(1.0),
                                             np.dtype(dtype).type(0.0)))
        t.data[...] = v
        return t

    @classmethod
    def arange(cls, start: Any = 0, end: Any = None, step: Any = 1, *, shape: Any = None,
               out: Any = None, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
        if end is None:
            start, end = 0, start
        if dtype is None:
            dtype = np.float32 if any(isinstance(x, float) for x in (start, end, step)) \
                else np.int64
        device = device or cls.DEFAULT_DEVICE
        data = np.arange(start, end, step, dtype=dtype)
        if shape is not None:
            shape = tuple(shape)
            if math.prod(shape) != data.size:
                raise ValueError(f"iron.arange: shape={shape} (prod={math.prod(shape)}) does "
                                 f"not match generated range size {data.size}")
            data = data.reshape(shape)
        else:
            shape = (data.size,)
        if out is not None:
            if out.shape != shape or out.dtype != dtype or out.device != device:
                raise ValueError("Provided `out` tensor must match shape, dtype, and device")
            out.data[...] = data
            return out
        t = cls(shape, dtype=dtype, device=device, **kwargs)
        t.data[...] = data
        return t

    @classmethod
    def zeros_like(cls, other: Any, dtype: Any = None, device: Any = None,
                   **kwargs: Any) -> Any:
        return cls(tuple(other.shape), dtype=dtype or other.dtype,
                   device=device or other.device, **kwargs)


class _Borrow:
    __slots__ = ("_t",)

    def __init__(self, t: Any):
        self._t = t

    def __enter__(self) -> np.ndarray:
        return self._t.data

    def __exit__(self, *exc: Any) -> bool:
        return False


def _as_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    out = tuple(operator.index(x) for x in shape)
    if any(x < 0 for x in out):
        raise ValueError(f"shape extents must not be negative, got {out}")
    return out


# --- the npud implementation ----------------------------------------------------------------

def _is_shape(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) or (
        isinstance(x, tuple) and all(isinstance(e, (int, np.integer)) for e in x))


class _TensorCore:
    """What an IRON backend supplies: the memory (an npud tensor), ``data``, ``shape``, the two
    transfers and views."""

    # npud patches a buffer's address into the instruction stream as XRT's firmware ABI does:
    # the insts.bin aiecc writes for XRT runs unchanged (IRON's JIT reads this to pick the ABI).
    FOLDS_DDR_ADDR_OFFSET = True

    def __init__(self, shape_or_data: Any, dtype: Any = None, device: str = "npu", *,
                 client: Client | None = None):
        """``NpudTensor((4, 4), np.int32)`` allocates (zeroed); ``NpudTensor(array_like,
        dtype)`` allocates and copies (``dtype`` defaults to the data's, else uint32)."""
        if _is_shape(shape_or_data):
            shape = _as_shape(shape_or_data)
            dt = np.dtype(dtype if dtype is not None else np.uint32)
            src = None
        else:
            src = np.asarray(shape_or_data, dtype=dtype)
            if dtype is None and not hasattr(shape_or_data, "dtype"):
                src = np.asarray(shape_or_data, dtype=np.uint32)
            shape, dt = src.shape, src.dtype
        type(self)._iron_init(self, shape, dt, device)
        c = client or default_client()
        a = c.alloc(shape if shape else (1,), dt)
        self._data = a if shape else a.reshape(())
        self._client = c
        _track(c, self)
        if src is not None:
            self._data[...] = src

    @property
    def data(self) -> np.ndarray:
        """The numpy array over the tensor's memory (local: the device's own memory; remote:
        its staging copy, sent and fetched around each run)."""
        return self._data

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def client(self) -> Client:
        return self._client

    def buffer_object(self) -> Any:
        """The npud tensor underneath (a :class:`npud.RawTensor`)."""
        return tensor_of(self._owner_array())

    def _owner_array(self) -> np.ndarray:
        owner = self.base if self._parent is not None else self
        return owner._data

    def _sync_to_device(self) -> None:
        # Local memory is the device's; a remote tensor is sent before each run anyway.
        return None

    def _sync_from_device(self) -> None:
        return None

    def _subview(self, offset_bytes: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        view = type(self).__new__(type(self))
        type(self)._iron_init(view, shape, dtype, self.device)
        owner = self.base if self._parent is not None else self
        start = self.storage_offset + offset_bytes
        nbytes = math.prod(shape) * dtype.itemsize
        flat = owner._data.reshape(-1).view(np.uint8)
        view._data = flat[start:start + nbytes].view(dtype).reshape(shape)
        view._parent = self
        view._offset_bytes = start
        view._client = self._client
        if isinstance(getattr(type(owner), "storage", None), property):
            view._storage = owner.storage  # newer IRON: one coherence map per memory
        return view

    def _dispatch_arg(self) -> Any:
        """What a dispatch takes for this tensor: its array, which for a view is a contiguous
        slice of its owner's memory (the dispatch passes that byte range in place)."""
        if self._parent is not None and not hasattr(_npud_pkg(), "view_of"):
            raise HostRuntimeError(
                f"a sub-view (bytes {self._offset_bytes}..{self._offset_bytes + self.nbytes} of "
                f"its tensor) as a dispatch argument needs a npud package that dispatches byte "
                f"ranges (npud.view_of); this one has none: pass the whole tensor")
        return self._data


def _npud_pkg() -> Any:
    return sys.modules["npud"]


def _generation_of(device: Any) -> str | None:
    """``"npu1"`` or ``"npu2"`` for IRON's device objects (or a generation name)."""
    if isinstance(device, str):
        return device
    for attr in ("_device", "arch", "name"):
        v = getattr(device, attr, None)
        if v is not None:
            s = str(v).lower()
            if "npu2" in s or "aie2p" in s or "strix" in s:
                return "npu2"
            if "npu" in s or "aie2" in s or "phoenix" in s:
                return "npu1"
    n = type(device).__name__.lower()
    return "npu2" if n.startswith("npu2") else "npu1" if n.startswith("npu1") else None


def _current_device() -> Any:
    hr = sys.modules.get("aie.utils.hostruntime")
    return getattr(hr, "_CURRENT_DEVICE", None)


class _HandleCore:
    def __init__(self, program: Program, insts_path: pathlib.Path | None,
                 pdi_path: pathlib.Path | None, kernel_name: str = "MLIR_AIE"):
        self.program = program
        self.insts_path = insts_path
        self.pdi_path = pdi_path
        self.kernel_name = kernel_name
        # Scratch tensors for the trailing arguments a caller leaves out (XRT accepts fewer
        # buffers than a design declares; npud's dispatch takes them all).
        self.padding: list[np.ndarray] = []

    def __repr__(self) -> str:
        return f"NpudKernelHandle({self.program.name!r}, pdi={str(self.pdi_path)!r})"


class _ResultCore:
    def __init__(self, npu_time: int, queue_time: int = 0, error: NpudError | None = None,
                 trace_config: Any = None):
        type(self)._iron_init(self, npu_time, trace_config)
        self.queue_time = queue_time
        self.error = error

    def is_success(self) -> bool:
        return self.error is None

    def __repr__(self) -> str:
        state = "ok" if self.error is None else f"failed: {self.error}"
        return f"NpudKernelResult(npu_time={self.npu_time}, {state})"


_CONFIG_KWARGS = ("trace_config", "fail_on_error", "only_if_loaded")


class _RuntimeCore:
    """IRON's ``HostRuntime`` on npud. ``addr`` as for :class:`npud.Client`; without ``addr``
    or ``client``, the runtime uses :func:`default_client`."""

    def __init__(self, addr: str | None = None, *, client: Client | None = None):
        self._own = Client(addr) if addr is not None and client is None else client
        self._handles: dict[tuple[str, ...], Any] = {}

    @property
    def client(self) -> Client:
        return self._own if self._own is not None else default_client()

    # -- loading -----------------------------------------------------------------------------
    @staticmethod
    def _find_pdi(xclbin_path: pathlib.Path) -> pathlib.Path:
        if xclbin_path.suffix == ".pdi" and xclbin_path.is_file():
            return xclbin_path
        d = xclbin_path.parent
        for c in (d / "main.pdi", d / f"{xclbin_path.stem}.pdi"):
            if c.is_file():
                return c
        pdis = sorted(d.glob("*.pdi"))
        if pdis:
            return pdis[0]
        raise HostRuntimeError(
            f"no PDI beside {xclbin_path} (looked for {d / 'main.pdi'} and {d}/*.pdi): npud "
            "loads the PDI and insts.bin that aiecc writes next to the xclbin, not the xclbin")

    def _key_and_program(self, npu_kernel: Any) -> tuple[tuple[str, ...], Any]:
        name = str(getattr(npu_kernel, "kernel_name", None) or "MLIR_AIE")
        elf = getattr(npu_kernel, "elf_path", None)
        if elf is not None:
            # A full ELF (PDIs plus the control code, IRON's full-ELF kernels), or an hsaco
            # holding one; IRON names the kernel "<device>:<sequence>", npud's ELF has one.
            p = pathlib.Path(elf).resolve()
            if not p.is_file():
                raise HostRuntimeError(f"full ELF {p} does not exist or is not a file.")

            def from_elf() -> tuple[Program, None, pathlib.Path]:
                data = p.read_bytes()
                try:
                    return Program.from_full_elf(data), None, p
                except NpudError as e:
                    try:
                        return Program.from_hsaco(data), None, p
                    except NpudError:
                        raise e from None

            return ("elf", str(p), str(p.stat().st_mtime_ns), name), from_elf
        if getattr(npu_kernel, "xclbin_path", None) is None or \
                getattr(npu_kernel, "insts_path", None) is None:
            raise HostRuntimeError("the kernel names neither an xclbin and insts.bin nor a full "
                                   "ELF (elf_path)")
        xclbin = pathlib.Path(npu_kernel.xclbin_path).resolve()
        insts = pathlib.Path(npu_kernel.insts_path).resolve()
        if insts.suffix.lower() != ".bin":
            raise HostRuntimeError(f"{insts}: expected the binary instruction stream (.bin)")
        pdi = self._find_pdi(xclbin)

        def make() -> tuple[Program, pathlib.Path, pathlib.Path]:
            prog = Program.from_bytes(xclbin.stem if name == "MLIR_AIE" else name,
                                      pdi.read_bytes(), insts.read_bytes())
            return prog, insts, pdi

        st_p, st_i = pdi.stat(), insts.stat()
        return ("xclbin", str(pdi), str(insts), str(st_p.st_mtime_ns), str(st_i.st_mtime_ns),
                name), make

    def load(self, npu_kernel: Any, **kwargs: Any) -> Any:
        """Registers the design with the daemon, once per runtime and design: the PDI beside
        ``npu_kernel.xclbin_path`` (``main.pdi``, or a ``.pdi`` path) with its ``insts_path``,
        or the full ELF of ``npu_kernel.elf_path``. Refuses a design for another device (IRON's
        ``check_device_consistency``). Other keywords are taken and not used, as IRON's XRT
        runtime's ``load`` takes them: IRON's ``load_and_run`` hands ``load`` every keyword its
        caller gave (the JIT passes a design's compile-time values, ``tile_size=16``), and the
        design was compiled with them already.

        Raises:
            HostRuntimeError: the files are missing or malformed, or the daemon refuses them.
        """
        if kwargs.get("trace_config") is not None or \
                getattr(npu_kernel, "trace_config", None) is not None:
            raise HostRuntimeError("trace capture is not supported by the npud runtime; run "
                                   "without a trace_config")
        self.check_device_consistency()
        key, make = self._key_and_program(npu_kernel)
        h = self._handles.get(key)
        if h is None:
            try:
                program, insts, pdi = make()
                self.client.register(program)
            except NpudError as e:
                raise _as_iron(e) from None
            h = NpudKernelHandle(program, insts, pdi, str(getattr(npu_kernel, "kernel_name",
                                                                  "MLIR_AIE")))
            self._handles[key] = h
        return h

    # -- running -----------------------------------------------------------------------------
    def _args(self, handle: Any, args: Sequence[Any]) -> list[Any]:
        kept = [_arg(a, i) for i, a in enumerate(x for x in args if not callable(x))]
        sizes = handle.program.min_arg_bytes
        if len(kept) < len(sizes):
            # XRT runs a kernel given fewer buffers than the design declares (IRON's
            # passthrough leaves out the trace slot): npud's dispatch takes every one, so the
            # missing trailing ones are scratch tensors of the design's sizes.
            c = self.client
            while len(handle.padding) < len(sizes) - len(kept):
                i = len(kept) + len(handle.padding)
                handle.padding.append(c.alloc((max(sizes[i], 4),), np.uint8,
                                              name=f"unused-arg-{i}"))
            kept += handle.padding[:len(sizes) - len(kept)]
        return kept

    def run(self, kernel_handle: Any, args: Sequence[Any], trace_config: Any = None,
            fail_on_error: bool = True, only_if_loaded: bool = False,
            **kwargs: Any) -> Any:
        """Dispatches the design over ``args`` (callables in ``args`` are skipped, as IRON's
        runtimes do; trailing buffers left out are scratch) and waits. ``dispatch_insts`` (a
        per-call instruction stream: bytes, a uint32 array or a path) runs the design's PDI
        with it instead of insts.bin. Runtime scalars (``dispatch_scalars=[...]`` or named
        keywords) are refused by name: the dispatch carries buffers only.
        ``fail_on_error=False`` returns a failed result instead of raising."""
        if trace_config is not None:
            raise HostRuntimeError("trace capture is not supported by the npud runtime")
        insts = kwargs.pop("dispatch_insts", None)
        scalars = _scalars(kwargs)
        try:
            program = kernel_handle.program if insts is None else \
                self._with_insts(kernel_handle, insts)
            kept = self._args(kernel_handle, args)
            c = self.client
            if scalars:
                raise HostRuntimeError(
                    f"runtime scalar arguments {scalars!r}: an NPU dispatch carries buffer "
                    "arguments only, so npud passes none; a DispatchTime value reaches the "
                    "device in the instruction stream IRON's dispatch library builds for the "
                    "call (pass that stream as dispatch_insts=), or compile the value into the "
                    "design")
            t = c.dispatch(program, *kept)
        except NpudError as e:
            err = _as_iron(e)
            if fail_on_error:
                raise err from None
            return NpudKernelResult(0, 0, err)
        for a in args:
            if isinstance(a, _TensorCore):
                a.device = "npu"
        return NpudKernelResult(t.device_ns, t.queue_ns)

    @staticmethod
    def _with_insts(handle: Any, insts: Any) -> Any:
        """The design's PDI with a per-call instruction stream (``dispatch_insts``: IRON's
        DispatchTime values are written into the stream its dispatch library builds for each
        call), as a program of its own; a stream seen before is the same program (and the
        daemon stores equal bytes once)."""
        if isinstance(insts, (str, os.PathLike)):
            data = pathlib.Path(insts).read_bytes()
        elif isinstance(insts, np.ndarray):
            data = np.ascontiguousarray(insts).tobytes()
        else:
            data = bytes(insts)
        pdi = handle.program.pdi
        if not pdi:
            raise HostRuntimeError("dispatch_insts needs a design loaded from a PDI and "
                                   "insts.bin; a full-ELF kernel carries its own control code")
        key = hashlib.sha256(data).digest()
        programs = handle.__dict__.setdefault("_insts_programs", {})
        p = programs.get(key)
        if p is None:
            if len(programs) >= 256:
                programs.clear()  # bounded: a design whose every call differs
            p = programs[key] = Program.from_bytes(handle.program.name, pdi, data)
        return p

    def run_chain(self, runs: Iterable[tuple[Any, Sequence[Any]]],
                  fail_on_error: bool = True) -> Any:
        """Runs ``(handle, args)`` entries in order as one npud chain; ``npu_time`` is the
        device time over every link."""
        runs = list(runs)
        if not runs:
            return NpudKernelResult(0)
        try:
            ch = self.client.chain()
            for handle, args in runs:
                ch.then(handle.program, *self._args(handle, args))
            r = ch.run()
        except NpudError as e:
            err = _as_iron(e)
            if fail_on_error:
                raise err from None
            return NpudKernelResult(0, 0, err)
        return NpudKernelResult(r.device_ns, r.queue_ns)

    def load_and_run(self, npu_kernel: Any, run_args: list[Any], **kwargs: Any) -> Any:
        """``load`` then ``run``: returns ``(handle, result)``. Every keyword goes to ``load``
        and none to ``run``, as IRON's own ``HostRuntime.load_and_run`` sends them (the JIT
        and ``NPUKernel.__call__`` pass a design's keywords this way: ``tile_size=16``). Runtime
        scalars and per-call instruction streams are ``run``'s keywords (``dispatch_scalars=``,
        ``dispatch_insts=``), given to ``run`` itself."""
        if isinstance(npu_kernel, list):  # a list of one kernel, as some callers pass it
            npu_kernel = npu_kernel[0]
        trace = kwargs.get("trace_config") or getattr(npu_kernel, "trace_config", None)
        if trace is not None:
            raise HostRuntimeError("trace capture is not supported by the npud runtime; run "
                                   "without a trace_config")
        h = self.load(npu_kernel, **kwargs)
        return h, self.run(h, list(run_args))

    def device(self) -> Any:
        """IRON's device object for the daemon's NPU when IRON is installed, else the
        generation name (``"npu1"`` or ``"npu2"``)."""
        gen = self.client.generation
        try:
            from aie.iron import device as d  # type: ignore[import-not-found]
        except ImportError:
            return gen
        from_name = getattr(d, "from_name", None)
        if from_name is not None:
            return from_name(gen, n_cols=None)
        return d.NPU1() if gen == "npu1" else d.NPU2()

    def cleanup(self) -> None:
        """Forgets the loaded designs and closes the session when no tensor of it is still
        alive (at interpreter exit otherwise): the next use opens a new one."""
        self._handles.clear()
        if self._own is not None:
            if len(_LIVE.get(id(self._own), ())) == 0:
                try:
                    self._own.close()
                except NpudError:
                    pass
        else:
            _close_default(force=False)


def _scalars(kwargs: dict[str, Any]) -> list[int | float]:
    """Runtime scalar arguments: ``dispatch_scalars=[...]``, then any other keyword IRON's JIT
    passes by name, in order. The AIE packet carries buffers only: a scalar reaches the device
    in the instruction stream (``dispatch_insts``), so the runtime refuses these by name rather
    than drop them."""
    out: list[Any] = list(kwargs.pop("dispatch_scalars", None) or [])
    for k in list(kwargs):
        if k in _CONFIG_KWARGS or k == "dispatch_insts":
            continue
        v = kwargs.pop(k)
        if not isinstance(v, (int, float, np.integer, np.floating, bool)):
            raise HostRuntimeError(f"keyword {k}={v!r}: the npud runtime takes runtime scalar "
                                   "arguments (numbers) by keyword, nothing else")
        out.append(v)
    return [x.item() if isinstance(x, np.generic) else x for x in out]


def _arg(a: Any, i: int) -> Any:
    if isinstance(a, _TensorCore):
        return a._dispatch_arg()
    try:
        tensor_of(a)
        return a
    except (TypeError, ValueError) as e:
        view_of = getattr(_npud_pkg(), "view_of", None)
        if view_of is not None and not isinstance(e, TypeError):
            try:
                view_of(a)
                return a
            except (TypeError, ValueError):
                pass
        raise HostRuntimeError(
            f"args[{i}]: the npud runtime takes NpudTensor (or arrays from npud.Client.alloc); "
            f"got {type(a).__name__}: {e}") from None


# npud's error classes made IRON's HostRuntimeError too, by class.
_IRON_ERRORS: dict[type, type] = {}


def _as_iron(e: NpudError) -> NpudError:
    """``e`` as an instance of both its npud class and IRON's ``HostRuntimeError``."""
    if isinstance(e, HostRuntimeError):
        return e
    cls = type(e)
    combined = _IRON_ERRORS.get(cls)
    if combined is None:
        combined = type(cls.__name__, (cls, HostRuntimeError), {"__module__": cls.__module__,
                                                                  "__doc__": cls.__doc__})
        _IRON_ERRORS[cls] = combined
    try:
        e.__class__ = combined
    except TypeError:
        pass
    return e


# --- binding the public classes to IRON's bases ------------------------------------------------

_BOUND: _Iron | None = None
# What the standalone tensor has and IRON's base may lack (older IRON has no subview, full,
# mutate, ...), copied onto the class over IRON's base when the base lacks it.
_NOT_COPIED = {"__module__", "__doc__", "__dict__", "__weakref__", "__init__", "_base_init"}


def _bind(iron: _Iron | None) -> None:
    """Makes the public classes, over IRON's base classes when ``iron`` is given."""
    global NpudTensor, NpudRuntime, NpudKernelHandle, NpudKernelResult, HostRuntimeError, _BOUND
    g = globals()
    if iron is None:
        err_base, handle_base, result_base = _StandaloneError, _StandaloneHandle, \
            _StandaloneResult
        rt_base, tensor_base = _StandaloneRuntime, _StandaloneTensor

        def tensor_init(self: Any, shape: Any, dtype: Any, device: str) -> None:
            _StandaloneTensor._base_init(self, shape, dtype, device)
    else:
        err_base, handle_base, result_base = iron.HostRuntimeError, iron.KernelHandle, \
            iron.KernelResult
        rt_base, tensor_base = iron.HostRuntime, iron.tensor_base

        def tensor_init(self: Any, shape: Any, dtype: Any, device: str) -> None:
            iron.tensor_base.__init__(self, shape, dtype=dtype, device=device)

    HostRuntimeError = type("HostRuntimeError", (NpudError, err_base), {
        "__module__": __name__,
        "__doc__": "A design could not be loaded or run through npud: an npud error and IRON's "
                   "HostRuntimeError."})
    _IRON_ERRORS.clear()

    ns: dict[str, Any] = {"__module__": __name__, "__doc__": _TensorCore.__doc__,
                          "_iron_init": staticmethod(tensor_init)}
    if iron is not None:
        for name, member in _StandaloneTensor.__dict__.items():
            if name not in _NOT_COPIED and (name == "_check_or_create"
                                             or not hasattr(tensor_base, name)):
                ns[name] = member
    NpudTensor = type("NpudTensor", (_TensorCore, tensor_base), ns)
    NpudTensor.__doc__ = ("IRON's tensor on npud memory: a fixed shape and dtype over a tensor "
                          "of the daemon's; ``.data``/``.numpy()`` are the numpy array over the "
                          "memory itself (local) or its staging copy (remote).")

    def result_init(self: Any, npu_time: int, trace_config: Any) -> None:
        result_base.__init__(self, npu_time, trace_config)

    NpudKernelResult = type("NpudKernelResult", (_ResultCore, result_base), {
        "__module__": __name__, "_iron_init": staticmethod(result_init),
        "__doc__": "A run's outcome: ``npu_time`` is the daemon's device time in ns; "
                   "``queue_time`` the time it waited behind other clients' work."})
    NpudKernelHandle = type("NpudKernelHandle", (_HandleCore, handle_base), {
        "__module__": __name__,
        "__doc__": "A design registered with npud: its :class:`npud.Program`."})
    NpudRuntime = type("NpudRuntime", (_RuntimeCore, rt_base), {
        "__module__": __name__, "__doc__": _RuntimeCore.__doc__})
    _BOUND = iron
    for k in ("NpudTensor", "NpudKernelResult", "NpudKernelHandle", "NpudRuntime",
              "HostRuntimeError"):
        g[k] = g[k]


NpudTensor: Any
NpudRuntime: Any
NpudKernelHandle: Any
NpudKernelResult: Any
HostRuntimeError: Any
_bind(_find_iron())


# --- the switch --------------------------------------------------------------------------------

_INSTALLED: Any = None

_IRON_HELP = (
    "npud.iron.install() switches IRON (mlir-aie's Python package `aie`) to npud, and IRON is "
    "not importable here{why}. Install IRON's host-side Python (mlir-aie's wheels: "
    "`pip install mlir_aie -f https://github.com/Xilinx/mlir-aie/releases/expanded_assets/"
    "latest-wheels-2`, or an mlir-aie build's python directory on PYTHONPATH), or use "
    "npud.iron.NpudRuntime and npud.iron.NpudTensor directly without IRON.")


def install(addr: str | None = None) -> Any:
    """Makes npud IRON's runtime and tensor class, whether the script imported ``aie.utils``
    before or after: ``aie.utils.DefaultNPURuntime`` and ``_DefaultNPURuntime`` (which
    ``get_current_device``/``ensure_current_device`` and the JIT read) become an
    :class:`NpudRuntime`, ``set_tensor_class(NpudTensor)`` makes ``aie.utils.tensor(...)`` and
    its factories npud memory, and names already bound to IRON's previous default runtime (a
    script's ``from aie.utils import DefaultNPURuntime``) now reach npud: the previous runtime
    object, if there was one, delegates to npud's, and modules that bound ``None`` are given
    npud's.

    Returns:
        The :class:`NpudRuntime` installed.

    Raises:
        IronMissing: IRON (``aie.utils``) cannot be imported; the message says what to install.
    """
    global _ADDR, _CLIENT, _INSTALLED
    if addr is not None and addr != _ADDR:
        _close_default(force=True)
        _ADDR = addr
    try:
        import aie.utils as u  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as e:
        why = f" ({type(e).__name__}: {e})"
        raise IronMissing(_IRON_HELP.format(why=why)) from e
    iron = _Iron()
    if _BOUND is None or _BOUND.tensor_base is not iron.tensor_base \
            or _BOUND.HostRuntime is not iron.HostRuntime:
        _bind(iron)
    u = iron.utils
    rt = NpudRuntime()
    old = u.__dict__.get("_DefaultNPURuntime")
    old_default = u.__dict__.get("DefaultNPURuntime", old)
    u.set_tensor_class(NpudTensor)
    if "DEFAULT_TENSOR_CLASS" in u.__dict__:
        u.DEFAULT_TENSOR_CLASS = NpudTensor
    u._DefaultNPURuntime = rt
    u.DefaultNPURuntime = rt
    previous = {id(x) for x in (old, old_default, _INSTALLED) if x is not None}
    for x in (old, old_default):
        if x is not None and x is not rt and not isinstance(x, _RuntimeCore):
            _delegate(x, rt)
    # Modules that took the runtime by name at import (a script's `from aie.utils import
    # DefaultNPURuntime`, IRON's own modules).
    for name, mod in list(sys.modules.items()):
        if mod is None or mod is u:
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for attr in ("DefaultNPURuntime", "DEFAULT_NPU_RUNTIME", "_DefaultNPURuntime"):
            if attr in d and (d[attr] is None or id(d[attr]) in previous
                              or isinstance(d[attr], _RuntimeCore)):
                d[attr] = rt
    _INSTALLED = rt
    return rt


def _delegate(old: Any, rt: Any) -> None:
    """Turns IRON's previous default runtime object into a view of ``rt``, so a name bound to
    it before ``install`` runs designs on npud."""
    try:
        old.__class__ = _Delegate
    except TypeError:
        return
    old.__dict__.clear()
    old.__dict__["_npud_target"] = rt


class _Delegate:
    """A runtime object IRON made before ``install``: every attribute is npud's runtime's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_npud_target"], name)

    def __repr__(self) -> str:
        return f"<IRON's default runtime, now {self.__dict__['_npud_target']!r}>"


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Runs :func:`install` the moment ``aie.utils`` has been imported."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "aie.utils":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        finder = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, s: Any) -> Any:
                return loader.create_module(s)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                if finder in sys.meta_path:
                    sys.meta_path.remove(finder)
                install(_ADDR)

        spec.loader = _Loader()
        return spec


def enable_on_import(addr: str | None = None) -> None:
    """Installs npud into IRON as soon as a script imports ``aie.utils`` (at once if it has):
    for scripts left unchanged. ``python -m npud.iron SCRIPT`` does this, as does
    ``NPUD_IRON=1`` with ``import npud.iron`` in a ``sitecustomize``."""
    global _ADDR
    if addr is not None:
        _ADDR = addr
    if "aie.utils" in sys.modules:
        install(_ADDR)
        return
    if not any(isinstance(f, _InstallOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallOnImport())


if os.environ.get("NPUD_IRON") == "1":
    enable_on_import(os.environ.get("NPUD_ADDR") or None)


def _main(argv: list[str]) -> int:
    """``python -m npud.iron SCRIPT [ARGS...]``: runs an IRON script unchanged, on npud."""
    import runpy

    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m npud.iron SCRIPT [ARGS...]\n\nRuns an IRON host script "
              "unchanged with npud as IRON's runtime (installed when the script imports "
              "aie.utils; NPUD_ADDR names the daemon).", file=sys.stderr)
        return 2
    import npud.iron as this  # the package's module, not this __main__ copy

    this.enable_on_import(os.environ.get("NPUD_ADDR") or None)
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
