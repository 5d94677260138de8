class NPUKernel:
    def __init__(self, xclbin_path=None, insts_path=None, device_index=0,
                 kernel_name="MLIR_AIE", trace_config=None, num_host_bos=None, elf_path=None):
        self.xclbin_path = xclbin_path
        self.insts_path = insts_path
        self.elf_path = elf_path
        self.kernel_name = kernel_name
        self.trace_config = trace_config

    def __call__(self, *args, **kwargs):
        from . import DefaultNPURuntime

        if DefaultNPURuntime is None:
            raise Exception("Cannot run kernel; DefaultNPURuntime not set.")
        return DefaultNPURuntime.load_and_run(self, list(args), **kwargs)
