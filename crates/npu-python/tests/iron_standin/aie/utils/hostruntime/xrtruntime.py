"""IRON's XRT runtime as a script that bound it early holds it: it cannot run here."""

from .hostruntime import HostRuntime, HostRuntimeError


class CachedXRTRuntime(HostRuntime):
    def load(self, npu_kernel, **kwargs):
        raise HostRuntimeError("no XRT here")

    def run(self, kernel_handle, args, trace_config=None, fail_on_error=True,
            only_if_loaded=False, **kwargs):
        raise HostRuntimeError("no XRT here")

    def device(self):
        raise HostRuntimeError("no XRT here")
