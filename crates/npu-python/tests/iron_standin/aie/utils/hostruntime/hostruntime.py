"""IRON's host runtime interface: the base classes and what they do themselves."""

import sys
from abc import ABC, abstractmethod

import numpy as np


class HostRuntimeError(Exception):
    pass


class KernelHandle(ABC):
    pass


class KernelResult(ABC):
    def __init__(self, npu_time, trace_config=None):
        self._npu_time = npu_time
        self._trace_config = trace_config

    @property
    def npu_time(self):
        return self._npu_time

    @abstractmethod
    def is_success(self):
        ...


class HostRuntime(ABC):
    def check_device_consistency(self):
        override = getattr(sys.modules[__package__], "_CURRENT_DEVICE", None)
        if override is None:
            return
        mine = self.device()
        if not (override.arch == mine.arch and override.cols <= mine.cols):
            raise RuntimeError(f"Overridden device {override} is not loadable on runtime "
                               f"device {mine}")

    def cleanup(self):
        return

    def evict_context(self, xclbin_path):
        return

    @abstractmethod
    def load(self, npu_kernel, **kwargs):
        ...

    @abstractmethod
    def run(self, kernel_handle, args, trace_config=None, fail_on_error=True,
            only_if_loaded=False, **kwargs):
        ...

    @abstractmethod
    def device(self):
        ...

    def load_and_run(self, npu_kernel, run_args, **kwargs):
        handle = self.load(npu_kernel, **kwargs)
        return handle, self.run(handle, list(run_args))

    @classmethod
    def read_insts_binary(cls, insts_path):
        with open(insts_path, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint32)

    @classmethod
    def verify_results(cls, io_args, refs=None, verbosity=0):
        errors = 0
        for idx, ref in (refs or {}).items():
            if idx >= len(io_args):
                raise HostRuntimeError(f"reference index {idx} out of bounds")
            io_args[idx].to("cpu")
            e = np.allclose(ref, io_args[idx].numpy())
            errors += np.size(e) - np.count_nonzero(e)
        return errors

    def run_test(self, npu_kernel, io_args, ref, verify=True, verbosity=0):
        h = self.load(npu_kernel)
        self.run(h, io_args)
        return 1 if verify and self.verify_results(io_args, ref) else 0
