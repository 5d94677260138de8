"""IRON's host-runtime interface, backed by npud.

IRON (mlir-aie's Python API) runs a design through a *host runtime*: an object with
``load(npu_kernel) -> handle``, ``run(handle, args) -> result`` (``result.npu_time`` in ns,
``result.is_success()``), ``load_and_run(npu_kernel, args)``, ``run_chain([(handle, args),
...])``, ``device()`` and ``cleanup()``, and tensors made by ``aie.utils.tensor(...)`` (a shaped,
typed buffer with ``.numpy()``, ``.to("npu"|"cpu")``, item access and ``zeros``/``ones``/...
factories). :class:`NpudRuntime` and :class:`NpudTensor` implement that interface on a shared
npud: the design's PDI and ``insts.bin`` are registered with the daemon once, tensors are npud
memory (zero-copy numpy views on a local connection), and dispatches and chains run through the
daemon's queue, alongside every other process using the NPU.

The one-line switch, after ``import aie.utils``::

    import npud.iron; npud.iron.install()       # IRON now runs its designs on npud

``install(addr=None)`` makes an :class:`NpudRuntime` IRON's ``aie.utils.DefaultNPURuntime`` and
:class:`NpudTensor` its default tensor class. Without IRON installed, use the classes directly.

Written against IRON's ``python/utils/hostruntime/`` (``hostruntime.py`` at mlir-aie commit
0897fa2e0c41872abd15a034070183021413fe2f, ``hsaruntime/hostruntime.py`` at 07ef5dfef847,
``tensor_class.py`` at 07f5158f63e5, ``utils/__init__.py`` at dda8594bcfc5, ``npukernel.py`` at
94ee9f1c2f2a). What IRON's interface has that npud does not, and what the adapter does instead,
is listed in ``crates/npu-python/README.md``.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any, Iterable, Sequence

import numpy as np

from . import Client, NpudError, Program, tensor_of

__all__ = [
    "NpudRuntime",
    "NpudKernelHandle",
    "NpudKernelResult",
    "NpudTensor",
    "HostRuntimeError",
    "install",
    "default_client",
]

_CLIENT: Client | None = None
_ADDR: str | None = None


def default_client() -> Client:
    """The client :class:`NpudTensor` allocates through (made on first use, from ``install``'s
    address or ``NPUD_ADDR``/npud's default socket)."""
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = Client(_ADDR)
    return _CLIENT


class HostRuntimeError(NpudError):
    """A design could not be loaded or run through npud (IRON's HostRuntimeError)."""


class NpudKernelHandle:
    """A design registered with npud: its :class:`npud.Program`."""

    __slots__ = ("program", "insts_path", "pdi_path")

    def __init__(self, program: Program, insts_path: pathlib.Path, pdi_path: pathlib.Path):
        self.program = program
        self.insts_path = insts_path
        self.pdi_path = pdi_path

    def __repr__(self) -> str:
        return f"NpudKernelHandle({self.program.name!r}, pdi={str(self.pdi_path)!r})"


class NpudKernelResult:
    """A run's outcome: ``npu_time`` is the daemon's device time in ns (from doorbell to
    completion); ``queue_time`` the time it waited behind other clients' work."""

    def __init__(self, npu_time: int, queue_time: int = 0, error: NpudError | None = None,
                 trace_config: Any = None):
        self._npu_time = npu_time
        self.queue_time = queue_time
        self.error = error
        self._trace_config = trace_config

    @property
    def npu_time(self) -> int:
        return self._npu_time

    @property
    def trace_config(self) -> Any:
        return self._trace_config

    def has_trace(self) -> bool:
        return self._trace_config is not None

    def is_success(self) -> bool:
        return self.error is None

    def __repr__(self) -> str:
        state = "ok" if self.error is None else f"failed: {self.error}"
        return f"NpudKernelResult(npu_time={self._npu_time}, {state})"


def _dtype(dtype: Any) -> np.dtype:
    return np.dtype(dtype)


class NpudTensor:
    """IRON's tensor on npud memory: a fixed shape and dtype over a tensor of the daemon's.

    ``NpudTensor((4, 4), np.int32)`` allocates (zeroed); ``NpudTensor(array_like, dtype)``
    allocates and copies. ``.data``/``.numpy()`` are the numpy array over the memory itself
    (local) or its staging copy (remote, uploaded and downloaded around each run). There is no
    host/device copy to reconcile on a local connection, so ``to()`` only records residency.
    """

    DEVICES = ["cpu", "npu"]
    DEFAULT_DEVICE = "npu"
    DEFAULT_INT_DTYPE = np.int64
    DEFAULT_FLOAT_DTYPE = np.float32

    def __init__(self, shape_or_data: Any, dtype: Any = np.uint32, device: str = "npu", *,
                 client: Client | None = None):
        if device not in self.DEVICES:
            raise ValueError(f"Unsupported device: {device}")
        c = client or default_client()
        if isinstance(shape_or_data, (int, np.integer)) or (
                isinstance(shape_or_data, tuple)
                and all(isinstance(x, (int, np.integer)) for x in shape_or_data)):
            shape = (shape_or_data,) if isinstance(shape_or_data, (int, np.integer)) \
                else tuple(shape_or_data)
            if any(x < 0 for x in shape):
                raise ValueError(f"shape extents must not be negative, got {shape}")
            self._array = c.alloc(shape if shape else (1,), _dtype(dtype))
            if not shape:
                self._array = self._array.reshape(())
        else:
            src = np.asarray(shape_or_data, dtype=None if dtype is None else _dtype(dtype))
            self._array = c.array(src)
        self._device = device

    # --- what IRON's tensor offers ---------------------------------------------------------

    @property
    def data(self) -> np.ndarray:
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def nbytes(self) -> int:
        return self._array.nbytes

    @property
    def device(self) -> str:
        return self._device

    @device.setter
    def device(self, value: str) -> None:
        if value not in self.DEVICES:
            raise ValueError(f"Unsupported device: {value}")
        self._device = value

    def to(self, device: str) -> NpudTensor:
        """Moves residency: nothing to copy (the memory is shared, or staged by the run)."""
        self.device = device
        return self

    def numpy(self) -> np.ndarray:
        return self._array

    def buffer_object(self):
        """The npud tensor underneath (a :class:`npud.RawTensor`)."""
        return tensor_of(self._array)

    def fill_(self, value: Any) -> NpudTensor:
        self._array.fill(value)
        return self

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._array if dtype is None else self._array.astype(dtype)

    def __getitem__(self, index: Any) -> Any:
        return self._array[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        self._array[index] = value

    def __len__(self) -> int:
        return len(self._array)

    def __repr__(self) -> str:
        return f"NpudTensor({np.array2string(self._array, separator=',')}, device='{self._device}')"

    @classmethod
    def zeros(cls, shape: Any, dtype: Any = np.float32, **kw: Any) -> NpudTensor:
        return cls(tuple(shape) if not isinstance(shape, int) else shape, dtype, **kw)

    @classmethod
    def ones(cls, shape: Any, dtype: Any = np.float32, **kw: Any) -> NpudTensor:
        return cls(tuple(shape) if not isinstance(shape, int) else shape, dtype, **kw).fill_(1)

    @classmethod
    def zeros_like(cls, other: Any, dtype: Any = None, **kw: Any) -> NpudTensor:
        return cls(tuple(np.shape(other)), dtype or np.asarray(other).dtype, **kw)

    @classmethod
    def arange(cls, *args: Any, dtype: Any = None, **kw: Any) -> NpudTensor:
        return cls(np.arange(*args, dtype=dtype or cls.DEFAULT_INT_DTYPE), **kw)

    @classmethod
    def randint(cls, low: int, high: int, size: Any, dtype: Any = None, **kw: Any) -> NpudTensor:
        return cls(np.random.randint(low, high, size=size,
                                     dtype=dtype or cls.DEFAULT_INT_DTYPE), **kw)

    @classmethod
    def rand(cls, *size: int, dtype: Any = None, **kw: Any) -> NpudTensor:
        return cls(np.random.rand(*size).astype(dtype or cls.DEFAULT_FLOAT_DTYPE), **kw)


def _arg(a: Any, i: int):
    if isinstance(a, NpudTensor):
        return a.data
    try:
        tensor_of(a)
        return a
    except (TypeError, ValueError) as e:
        raise HostRuntimeError(
            f"args[{i}]: the npud runtime takes NpudTensor (or arrays from npud.Client.alloc); "
            f"got {type(a).__name__}: {e}") from None


class NpudRuntime:
    """IRON's HostRuntime on npud. ``addr`` as for :class:`npud.Client`."""

    def __init__(self, addr: str | None = None, *, client: Client | None = None):
        self._client = client or (Client(addr) if addr is not None else default_client())
        self._handles: dict[tuple[str, str], NpudKernelHandle] = {}

    @property
    def client(self) -> Client:
        return self._client

    # --- loading ----------------------------------------------------------------------------

    @staticmethod
    def _find_pdi(xclbin_path: pathlib.Path) -> pathlib.Path:
        if xclbin_path.suffix == ".pdi" and xclbin_path.is_file():
            return xclbin_path
        d = xclbin_path.parent
        if (d / "main.pdi").is_file():
            return d / "main.pdi"
        pdis = sorted(d.glob("*.pdi"))
        if pdis:
            return pdis[0]
        raise HostRuntimeError(
            f"no PDI beside {xclbin_path} (looked for {d / 'main.pdi'} and {d}/*.pdi): npud "
            "loads the PDI and insts.bin that aiecc writes next to the xclbin, not the xclbin")

    def load(self, npu_kernel: Any, **kwargs: Any) -> NpudKernelHandle:
        """Registers the design (``npu_kernel.xclbin_path``'s PDI, or a ``.pdi`` path, with
        ``npu_kernel.insts_path``) with the daemon, once per runtime."""
        if getattr(npu_kernel, "trace_config", None) is not None:
            raise HostRuntimeError("trace capture is not supported by the npud runtime; run "
                                   "without a trace_config")
        xclbin = pathlib.Path(npu_kernel.xclbin_path).resolve()
        insts = pathlib.Path(npu_kernel.insts_path).resolve()
        if insts.suffix.lower() != ".bin":
            raise HostRuntimeError(f"{insts}: expected the binary instruction stream (.bin)")
        pdi = self._find_pdi(xclbin)
        key = (str(pdi), str(insts))
        h = self._handles.get(key)
        if h is None:
            name = getattr(npu_kernel, "kernel_name", None) or xclbin.stem
            program = Program.from_bytes(str(name), pdi.read_bytes(), insts.read_bytes())
            self._client.register(program)
            h = NpudKernelHandle(program, insts, pdi)
            self._handles[key] = h
        return h

    # --- running ----------------------------------------------------------------------------

    def run(self, kernel_handle: NpudKernelHandle, args: Sequence[Any], trace_config: Any = None,
            fail_on_error: bool = True, only_if_loaded: bool = False,
            **kwargs: Any) -> NpudKernelResult:
        """Dispatches the design over ``args`` (callables in ``args`` are skipped, as IRON's
        runtimes do) and waits. ``fail_on_error=False`` returns a failed result instead of
        raising."""
        if trace_config is not None:
            raise HostRuntimeError("trace capture is not supported by the npud runtime")
        if kwargs.get("dispatch_insts") is not None:
            raise HostRuntimeError("per-call instruction streams (DispatchTime designs) are not "
                                   "supported by the npud runtime")
        kept = [_arg(a, i) for i, a in enumerate(x for x in args if not callable(x))]
        try:
            t = self._client.dispatch(kernel_handle.program, *kept)
        except NpudError as e:
            if fail_on_error:
                raise
            return NpudKernelResult(0, 0, e)
        for a in args:
            if isinstance(a, NpudTensor):
                a.device = "npu"
        return NpudKernelResult(t.device_ns, t.queue_ns)

    def run_chain(self, runs: Iterable[tuple[NpudKernelHandle, Sequence[Any]]],
                  fail_on_error: bool = True) -> NpudKernelResult:
        """Runs ``(handle, args)`` entries in order as one npud chain; ``npu_time`` is the
        device time over every link."""
        runs = list(runs)
        if not runs:
            return NpudKernelResult(0)
        ch = self._client.chain()
        for handle, args in runs:
            ch.then(handle.program,
                    *[_arg(a, i) for i, a in enumerate(x for x in args if not callable(x))])
        try:
            r = ch.run()
        except NpudError as e:
            if fail_on_error:
                raise
            return NpudKernelResult(0, 0, e)
        return NpudKernelResult(r.device_ns, r.queue_ns)

    def load_and_run(self, npu_kernel: Any, run_args: list[Any], **kwargs: Any):
        """``load`` then ``run``: returns ``(handle, result)``."""
        if isinstance(npu_kernel, list):  # IRON's NPUKernel.__call__ passes [self]
            npu_kernel = npu_kernel[0]
        kwargs.pop("trace_config", None)
        h = self.load(npu_kernel)
        return h, self.run(h, list(run_args))

    def device(self) -> Any:
        """IRON's device object for the daemon's NPU when IRON is installed, else the
        generation name (``"npu1"`` or ``"npu2"``)."""
        gen = self._client.generation
        try:
            from aie.iron.device import NPU1, NPU2  # type: ignore[import-not-found]
        except ImportError:
            return gen
        return NPU1() if gen == "npu1" else NPU2()

    def cleanup(self) -> None:
        """Forgets the loaded designs (the daemon drops them with the session)."""
        self._handles.clear()

    # --- IRON's helpers ---------------------------------------------------------------------

    @staticmethod
    def read_insts(insts_path: Any) -> np.ndarray:
        p = pathlib.Path(insts_path)
        if p.suffix.lower() != ".bin":
            raise HostRuntimeError(f"{p}: expected the binary instruction stream (.bin)")
        return np.fromfile(p, dtype=np.uint32)

    @staticmethod
    def verify_results(io_args: Sequence[Any], refs: dict[int, Any] | None = None,
                       verbosity: int = 0) -> int:
        errors = 0
        for idx, ref in (refs or {}).items():
            if idx >= len(io_args):
                raise HostRuntimeError(
                    f"reference index {idx} out of bounds for {len(io_args)} IO buffers")
            ok = np.isclose(np.asarray(io_args[idx]), np.asarray(ref))
            errors += int(ok.size - np.count_nonzero(ok))
        return errors

    def run_test(self, npu_kernel: Any, io_args: Any, ref: dict[int, Any] | None,
                 verify: bool = True, verbosity: int = 0) -> int:
        """Loads and runs the design, then compares ``io_args[i]`` with ``ref[i]``: 0 when
        every element matches, 1 otherwise."""
        if not isinstance(io_args, list):
            io_args = [io_args] if io_args is not None else []
        h = self.load(npu_kernel)
        r = self.run(h, io_args)
        if verbosity >= 1:
            print(f"npu_time: {r.npu_time / 1000.0} us")
        if verify and self.verify_results(io_args, ref, verbosity):
            return 1
        return 0


def install(addr: str | None = None) -> NpudRuntime:
    """Makes npud IRON's runtime: ``aie.utils.DefaultNPURuntime`` becomes an
    :class:`NpudRuntime` and ``aie.utils.tensor(...)`` makes :class:`NpudTensor` s.

    Raises:
        ImportError: IRON (``aie.utils``) is not installed.
    """
    global _ADDR, _CLIENT
    if addr is not None and addr != _ADDR:
        _ADDR = addr
        _CLIENT = None
    import aie.utils as u  # type: ignore[import-not-found]

    rt = NpudRuntime(client=default_client())
    base = getattr(u, "Tensor", None)
    if base is not None and not issubclass(NpudTensor, base):
        base.register(NpudTensor)  # IRON's tensor is an ABC: a virtual subclass passes its check
    u.set_tensor_class(NpudTensor)
    u.DefaultNPURuntime = rt
    # IRON modules that took the runtime at import time (e.g. npukernel's DEFAULT_NPU_RUNTIME).
    for name, mod in list(sys.modules.items()):
        if name.startswith("aie.") and mod is not None:
            for attr in ("DefaultNPURuntime", "DEFAULT_NPU_RUNTIME"):
                if hasattr(mod, attr):
                    setattr(mod, attr, rt)
    return rt

