from .tensor_class import NpuTensor

_CURRENT_DEVICE = None


def set_current_device(device):
    global _CURRENT_DEVICE
    _CURRENT_DEVICE = device
