"""IRON's devices as the host runtime compares them: an architecture and a column count."""


class Device:
    arch = ""
    cols = 0

    def __repr__(self):
        return f"{type(self).__name__}()"


class NPU1(Device):
    arch, cols = "aie2", 4


class NPU1Col1(Device):
    arch, cols = "aie2", 1


class NPU2(Device):
    arch, cols = "aie2p", 8


class NPU2Col1(Device):
    arch, cols = "aie2p", 1


def from_name(name, n_cols=None):
    return {"npu1": NPU1, "npu2": NPU2}[name]()
