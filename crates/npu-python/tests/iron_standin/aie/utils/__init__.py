"""IRON's aie.utils as scripts and IRON's JIT use it."""

import os

from . import hostruntime
from .hostruntime import set_current_device
from .hostruntime.hostruntime import HostRuntime
from .hostruntime.tensor_class import CPUOnlyTensor, NpuTensor
from .npukernel import NPUKernel

DEFAULT_TENSOR_CLASS = CPUOnlyTensor
_DefaultNPURuntime = None


def set_tensor_class(cls):
    if not issubclass(cls, NpuTensor):
        raise ValueError(f"Tensors must inherit from the NpuTensor class but {cls} does not.")
    global DEFAULT_TENSOR_CLASS
    DEFAULT_TENSOR_CLASS = cls


def tensor(*a, **k):
    return DEFAULT_TENSOR_CLASS(*a, **k)


def zeros(*a, **k):
    return DEFAULT_TENSOR_CLASS.zeros(*a, **k)


def ones(*a, **k):
    return DEFAULT_TENSOR_CLASS.ones(*a, **k)


def full(*a, **k):
    return DEFAULT_TENSOR_CLASS.full(*a, **k)


def arange(*a, **k):
    return DEFAULT_TENSOR_CLASS.arange(*a, **k)


def zeros_like(*a, **k):
    return DEFAULT_TENSOR_CLASS.zeros_like(*a, **k)


def _get_default_npu_runtime():
    # IRON makes its XRT runtime on first use where pyxrt imports; the stand-in's, when
    # IRON_STANDIN_XRT=1, can run nothing.
    global _DefaultNPURuntime
    if _DefaultNPURuntime is None and os.environ.get("IRON_STANDIN_XRT") == "1":
        from .hostruntime.xrtruntime import CachedXRTRuntime

        _DefaultNPURuntime = CachedXRTRuntime()
    return _DefaultNPURuntime


def __getattr__(name):
    if name == "DefaultNPURuntime":
        return _get_default_npu_runtime()
    raise AttributeError(name)


def get_current_device():
    if hostruntime._CURRENT_DEVICE is not None:
        return hostruntime._CURRENT_DEVICE
    rt = _get_default_npu_runtime()
    return rt.device() if rt else None


def ensure_current_device():
    d = get_current_device()
    if d is not None:
        set_current_device(d)
    return d
