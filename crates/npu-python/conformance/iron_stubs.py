"""Stand-ins for the parts of IRON that need compiled MLIR, for the conformance run.

The conformance script copies this file into the directory it assembles IRON's pure-Python
packages in, as ``sitecustomize.py``, so it runs before any script. It stubs:

* the compiled MLIR bindings (``aie._mlir_libs``, ``aie.dialects``, ``aie.ir``, ``aie.extras``,
  ``aie.passmanager``, ``aie.helpers.dialects``, ``aie.compiler``): modules whose every attribute is an
  inert stand-in, so IRON's design-building modules import (designs are never built here);
* what mlir-aie's build generates: ``aie.utils.configure`` (configured by CMake), and, in trees
  without the trace event tables it generates from its register database, the whole of
  ``aie.utils.trace`` (``NPUD_CONFORMANCE_STUB_TRACE=1``; npud captures no traces);
* ``aie.iron.device``: ``NPU1``/``NPU2`` (and their column variants, ``from_name``) as plain
  objects with the ``arch``, ``cols`` and ``_device`` IRON's host code compares;
* the JIT's compile step (``CompilableDesign.compile``, which would generate MLIR and run aiecc):
  it writes the emulated design the generator's name stands for with ``npuctl emu-design``
  (``NPUD_CONFORMANCE_NPUCTL``), and leaves everything around it (the kernel cache, NPUKernel,
  the runtime call) IRON's own.

Then, as a script would, it runs ``npud.iron.install()`` once, unless ``NPUD_CONFORMANCE_INSTALL``
is ``0``.
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import types

_STUBBED = ("aie._mlir_libs", "aie.dialects", "aie.ir", "aie.extras", "aie.passmanager",
            "aie.helpers.dialects", "aie.compiler", "aie.iron.device", "aie._mlir", "mlir",
            "aie.utils.configure")


class _Inert:
    """Anything a module-level use of an MLIR binding asks of it: called, subscripted, used as a
    base class or a decorator, it gives another stand-in."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return _Inert()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __getitem__(self, k):
        return _Inert()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return True

    def __enter__(self):
        return _Inert()

    def __exit__(self, *exc):
        return False

    def __str__(self):
        return "inert"

    def __len__(self):
        return 0

    def __mro_entries__(self, bases):
        return (_InertBase,)

    def __or__(self, other):
        return _Inert()

    __ror__ = __or__


class _InertBase:
    def __init__(self, *a, **k):
        pass

    def __init_subclass__(cls, **k):
        pass


class AIEArch(enum.Enum):
    AIE1 = 1
    AIE2 = 2
    AIE2p = 3


class AIETileType(enum.Enum):
    CoreTile = 1
    MemTile = 2
    ShimNOCTile = 3
    ShimPLTile = 4


class AIEDevice(enum.Enum):
    npu1 = 1
    npu1_1col = 2
    npu1_2col = 3
    npu1_3col = 4
    npu2 = 5
    npu2_1col = 6
    npu2_2col = 7
    npu2_3col = 8
    npu2_4col = 9
    npu2_5col = 10
    npu2_6col = 11
    npu2_7col = 12


class _Device:
    def __init__(self, arch: str, cols: int, name: str):
        self.arch = AIEArch.AIE2p if arch == "aie2p" else AIEArch.AIE2
        self.cols, self._name = cols, name
        self._device = AIEDevice[name]

    def __repr__(self):
        return f"{type(self).__name__}()"

    def resolve(self, *a, **k):
        return self._device

    def __getattr__(self, name):
        # What IRON's design builders ask of a device (tiles, shims): never used to run.
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __eq__(self, o):
        return isinstance(o, _Device) and (o.arch, o.cols) == (self.arch, self.cols)

    def __hash__(self):
        return hash((self.arch, self.cols))


# The tree's own tile module (``aie.iron.device.tile``: ``Tile``, ``AnyComputeTile``, ...) is
# loaded, not stubbed: its tiles carry the tile type IRON's design code checks (a Worker refuses
# a tile whose type is not a core tile) and need nothing compiled beyond the enum above.
_REAL = ("aie.iron.device.tile",)


def _device_module(name: str) -> types.ModuleType:
    m = types.ModuleType(name)
    # The tree's device directory, for its tile module.
    parent = sys.modules.get(name.rpartition(".")[0])
    m.__path__ = [os.path.join(p, "device") for p in getattr(parent, "__path__", [])]
    m.Device = _Device
    specs = {"NPU1": ("aie2", 4, "npu1"), "NPU2": ("aie2p", 8, "npu2")}
    for n in range(1, 4):
        specs[f"NPU1Col{n}"] = ("aie2", n, f"npu1_{n}col")
    specs["NPU1Col4"] = ("aie2", 4, "npu1")
    for n in range(1, 8):
        specs[f"NPU2Col{n}"] = ("aie2p", n, f"npu2_{n}col")
    for cls_name, (arch, cols, dev) in specs.items():
        m.__dict__[cls_name] = type(cls_name, (_Device,), {
            "__init__": lambda self, a=arch, c=cols, d=dev: _Device.__init__(self, a, c, d)})

    def from_name(name, n_cols=None):
        gen = "NPU2" if "2" in str(name) else "NPU1"
        return m.__dict__[gen if n_cols is None else f"{gen}Col{n_cols}"]()

    m.from_name = from_name

    def getattr_(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:
            tile = importlib.import_module(name + ".tile")
        except ImportError:
            tile = None
        if tile is not None and hasattr(tile, attr):
            return getattr(tile, attr)
        return _Inert()

    m.__getattr__ = getattr_
    return m


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        if spec.name == "aie.iron.device":
            return _device_module(spec.name)
        if spec.name == "aie.dialects._aie_enum_gen":
            m = types.ModuleType(spec.name)
            m.AIEArch, m.AIEDevice, m.AIETileType = AIEArch, AIEDevice, AIETileType
            m.__getattr__ = lambda attr: _Inert()
            return m
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda attr: _Inert()
        return m

    def exec_module(self, module):
        pass


# IRON's trace package, when the checkout lacks the event tables mlir-aie's build generates
# from its register database (older trees): npud does not capture traces, and the package
# cannot import without them.
if os.environ.get("NPUD_CONFORMANCE_STUB_TRACE") == "1":
    _STUBBED += ("aie.utils.trace",)


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname in _REAL:
            return None
        if any(fullname == p or fullname.startswith(p + ".") for p in _STUBBED):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(),
                                                  is_package=True)
        return None


sys.meta_path.insert(0, _StubFinder())


# --- the JIT's compile step --------------------------------------------------------------------

# Generator name -> (emulated kernel, the compile argument holding the element count, its
# default, dtype, scalar), or a function of the compile arguments giving (kernel, n, dtype,
# scalar).
_DESIGNS = {
    "my_passthrough_kernel": ("passthrough", "n", 4096, "u8", 0),
    "passthrough_kernel": ("passthrough", "n", 4096, "u8", 0),
    "vector_scalar_add": ("vector_scalar_add", "problem_size", 1024, "i32", 1),
    "vector_vector_add": ("vector_vector_add", "num_elements", 32, None, 0),
    "add_one": ("vector_scalar_add", "N", 1024, "i32", 1),
    # programming_examples/algorithms: transform(lambda a: a + 1), transform_binary(a + b).
    "transform": ("vector_scalar_add", "num_elements", 1024, None, 1),
    "transform_binary": ("vector_vector_add", "num_elements", 1024, None, 0),
    "add_two": ("vector_scalar_add", "N", 1024, "i32", 2),
    # algorithms/for_each.py: a + 1 on one buffer, in place.
    "for_each": ("vector_scalar_add_inplace", "num_elements", 1024, None, 1),
    "transform_parallel": ("vector_scalar_add", "num_elements", 1024, None, 1),
    "transform_parallel_binary": ("vector_vector_add", "num_elements", 1024, None, 0),
    "vector_vector_mul": ("vector_mul", "num_elements", 256, None, 0),
    # basic/vector_scalar_mul: c = a * factor, the factor an i32 buffer; the JIT passes (a, c,
    # factor). The newer generator takes the input's size in bytes and its bit width.
    "vector_scalar_mul": lambda kw: (
        "vector_scale", int(kw["in1_size"]) // (int(kw.get("int_bit_width", 16)) // 8),
        "i16" if int(kw.get("int_bit_width", 16)) == 16 else "i32", 0),
    # The older vector_scalar_mul_jit.py: transform(scale_kernel, input, output, factor).
    "transform:vector_scalar_mul": ("vector_scale", "num_elements", 2048, None, 0),
}


def _dtype_name(dt) -> str:
    import numpy as np

    return {"int32": "i32", "uint32": "u32", "int16": "i16", "int8": "i8", "uint8": "u8",
            "float32": "f32", "bfloat16": "bf16"}[np.dtype(dt).name]


def _emulated(name: str, kwargs: dict) -> tuple:
    """Writes the emulated design for generator ``name``; returns (xclbin, insts) paths."""
    import inspect  # noqa: F401
    import pathlib

    import aie.utils as u

    if name not in _DESIGNS:
        raise RuntimeError(f"no emulated design stands for the generator {name!r}")
    entry = _DESIGNS[name]
    if callable(entry):
        kernel, n, dtype, scalar = entry(kwargs)
    else:
        kernel, n_arg, n_default, dtype, scalar = entry
        n = int(kwargs.get(n_arg, n_default))
    if dtype is None:
        dtype = _dtype_name(kwargs.get("dtype", "int32"))
    if kernel == "passthrough":
        n *= 1  # bytes: passthrough's buffers are u8
    # The device the JIT targets is IRON's current device, which npud's runtime gives.
    device = u.ensure_current_device() if hasattr(u, "ensure_current_device") else \
        u.DefaultNPURuntime.device()
    if device is None:
        raise RuntimeError("IRON has no current device: the runtime gave none")
    gen = "npu2" if getattr(device, "arch", None) == AIEArch.AIE2p else "npu1"
    out = pathlib.Path(os.environ.get("NPUD_CONFORMANCE_CACHE", "/tmp")) / \
        f"{name}-{kernel}-{n}-{dtype}-{scalar}-{gen}"
    if not (out / "insts.bin").is_file():
        cmd = [os.environ["NPUD_CONFORMANCE_NPUCTL"], "emu-design", kernel, "--n", str(n),
               "--dtype", dtype, "--generation", gen, "--out", str(out)]
        if kernel.startswith("vector_scalar_add"):
            cmd += ["--scalar", str(scalar)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        (out / "final.xclbin").write_bytes(b"npud loads main.pdi beside this file")
    return out / "final.xclbin", out / "insts.bin"


def _patch_newer_jit() -> None:
    try:
        from aie.utils.compile.jit import compilabledesign as cd
    except ImportError:
        return

    def compile(self, *args, **kw):
        # Whatever this tree's compile takes (its signature changed between trees): what the
        # real compile reads from the runtime first, where the tree has it (the DDR-patch ABI
        # of the tensor class), then the emulated design where aiecc's output would be.
        resolve = getattr(self, "_resolve_fold_ddr_addr_offset", None)
        if resolve is not None:
            resolve()
        kwargs = {}
        gen = self.mlir_generator
        try:
            import inspect

            for p in inspect.signature(gen).parameters.values():
                if p.default is not inspect.Parameter.empty:
                    kwargs[p.name] = p.default
        except (TypeError, ValueError):
            pass
        kwargs.update(self.compile_kwargs)
        x, i = _emulated(self.generator_name, kwargs)
        # The attributes this tree's compile leaves for the rest of its JIT.
        self._kernel_dir = x.parent
        self._xclbin_path, self._inst_path = x, i
        self._expected_tensor_sizes = None
        return x, i

    cd.CompilableDesign.compile = compile


def _patch_older_jit() -> None:
    try:
        import aie.iron  # noqa: F401  (imports the JIT module the way scripts do)
        import aie.utils.jit as jit
    except ImportError:
        return
    if not hasattr(jit, "compile_mlir_module"):
        return

    def compile_mlir_module(mlir_module=None, insts_path=None, xclbin_path=None,
                            work_dir=None, **kw):
        # The older JIT runs the generator for MLIR first; its name and arguments are the
        # caller's.
        f = sys._getframe(1)
        fn = f.f_locals.get("function")
        kwargs = dict(f.f_locals.get("kwargs") or {})
        tensors = [a for a in (f.f_locals.get("args") or ()) if hasattr(a, "shape")]
        if tensors:
            import numpy as np

            kwargs.setdefault("num_elements", int(np.size(tensors[0])))
            kwargs.setdefault("dtype", tensors[0].dtype)
        name = getattr(fn, "__name__", "?")
        # A generic algorithm (transform) stands for the design of the kernel it is given.
        externals = f.f_locals.get("external_kernels") or ()
        if any("vector_scalar_mul" in str(getattr(k, "_name", getattr(k, "name", "")))
               for k in externals):
            name += ":vector_scalar_mul"
        x, i = _emulated(name, kwargs)
        import shutil

        shutil.copy(x.parent / "main.pdi", pathlib_path(xclbin_path).parent / "main.pdi")
        shutil.copy(i, insts_path)
        pathlib_path(xclbin_path).write_bytes(b"npud loads main.pdi beside this file")

    jit.compile_mlir_module = compile_mlir_module
    # aiecc's kernel compiler (Peano or chess) for ExternalFunctions: the emulated design needs
    # no object file.
    if hasattr(jit, "compile_external_kernel"):
        jit.compile_external_kernel = lambda *a, **k: None


def pathlib_path(p):
    import pathlib

    return pathlib.Path(p)


if os.environ.get("NPUD_CONFORMANCE_INSTALL", "1") == "1":
    import npud.iron

    npud.iron.install(os.environ.get("NPUD_ADDR") or None)
    _patch_newer_jit()
    _patch_older_jit()
