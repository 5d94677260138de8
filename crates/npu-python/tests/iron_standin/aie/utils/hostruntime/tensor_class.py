"""IRON's tensor base: backends supply data, shape, the two transfers and views."""

from abc import ABC, abstractmethod

import numpy as np


class NpuTensor(ABC):
    DEVICES = ["cpu", "npu"]
    DEFAULT_DEVICE = "npu"
    FOLDS_DDR_ADDR_OFFSET = True
    _parent = None
    _offset_bytes = 0

    def __init__(self, shape_or_data, dtype=np.uint32, device="npu"):
        if device not in type(self).DEVICES:
            raise ValueError(f"Unsupported device: {device}")
        self.device = device
        self.dtype = dtype

    @property
    @abstractmethod
    def data(self):
        ...

    @property
    @abstractmethod
    def shape(self):
        ...

    @abstractmethod
    def _sync_to_device(self):
        ...

    @abstractmethod
    def _sync_from_device(self):
        ...

    def to(self, device):
        if device != self.device:
            (self._sync_to_device if device == "npu" else self._sync_from_device)()
            self.device = device
        return self

    def numpy(self):
        return self.data

    def __array__(self, dtype=None, copy=None):
        return self.data if dtype is None else self.data.astype(dtype)

    def __getitem__(self, i):
        return self.data[i]

    def __setitem__(self, i, v):
        self.data[i] = v

    def fill_(self, v):
        self.data.fill(v)
        return self

    @classmethod
    def _make(cls, *size, dtype=None, device=None, **kw):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) \
            else tuple(size)
        return cls(shape, dtype=dtype or np.float32, device=device or cls.DEFAULT_DEVICE, **kw)

    @classmethod
    def zeros(cls, *size, out=None, dtype=None, device=None, **kw):
        return cls._make(*size, dtype=dtype, device=device, **kw).fill_(0)

    @classmethod
    def ones(cls, *size, out=None, dtype=None, device=None, **kw):
        return cls._make(*size, dtype=dtype, device=device, **kw).fill_(1)

    @classmethod
    def arange(cls, start=0, end=None, step=1, *, dtype=None, device=None, **kw):
        if end is None:
            start, end = 0, start
        if dtype is None:
            dtype = np.float32 if any(isinstance(x, float) for x in (start, end, step)) \
                else np.int64
        data = np.arange(start, end, step, dtype=dtype)
        t = cls((data.size,), dtype=dtype, device=device or cls.DEFAULT_DEVICE, **kw)
        t.data[...] = data
        return t

    @classmethod
    def zeros_like(cls, other, dtype=None, device=None, **kw):
        return cls(tuple(other.shape), dtype=dtype or other.dtype,
                   device=device or other.device, **kw)


class CPUOnlyTensor(NpuTensor):
    DEVICES = ["cpu"]
    DEFAULT_DEVICE = "cpu"

    def __init__(self, shape_or_data, dtype=np.uint32, device="cpu"):
        super().__init__(shape_or_data, dtype=dtype, device=device)
        self._data = np.zeros(shape_or_data, dtype=dtype) if isinstance(shape_or_data, tuple) \
            else np.array(shape_or_data, dtype=dtype)

    @property
    def data(self):
        return self._data

    @property
    def shape(self):
        return self._data.shape

    def _sync_to_device(self):
        pass

    def _sync_from_device(self):
        pass
