"""The IRON adapter, driven the way IRON drives a host runtime: a design directory as aiecc
leaves it (xclbin, main.pdi, insts.bin), ``aie.utils.tensor`` for the buffers, an NPUKernel
called with tensors (which calls ``DefaultNPURuntime.load_and_run``), ``run_test`` with
references, and chains.

IRON itself is not installed here: a stand-in ``aie.utils`` with the same entry points (the
tensor ABC, ``set_tensor_class``, ``tensor``, ``DefaultNPURuntime``, an ``NPUKernel`` whose call
goes through the default runtime) lets ``npud.iron.install()`` be exercised as the one-line
switch an IRON program makes."""

from __future__ import annotations

import abc
import sys
import types

import numpy as np
import pytest

import npud
import npud.iron as iron

N = 1024


@pytest.fixture
def design(tmp_path, client):
    npud.Program.write_emulated(tmp_path, "vector_scalar_add", N, generation=client.generation,
                                dtype="i32", scalar=1)
    (tmp_path / "final.xclbin").write_bytes(b"xclbin stand-in: npud reads main.pdi beside it")
    return tmp_path


class Kernel:
    """IRON's NPUKernel as the runtime sees it."""

    def __init__(self, xclbin_path, insts_path, kernel_name="MLIR_AIE", trace_config=None):
        self.xclbin_path = xclbin_path
        self.insts_path = insts_path
        self.kernel_name = kernel_name
        self.trace_config = trace_config

    def __call__(self, *args):
        u = sys.modules["aie.utils"]
        return u.DefaultNPURuntime.load_and_run([self], list(args), trace_config=self.trace_config)


@pytest.fixture
def fake_iron(monkeypatch):
    aie = types.ModuleType("aie")
    u = types.ModuleType("aie.utils")

    class Tensor(abc.ABC):
        pass

    state = {"cls": None}

    def set_tensor_class(cls):
        if not issubclass(cls, Tensor):
            raise ValueError(f"{cls} does not inherit from Tensor")
        state["cls"] = cls

    u.Tensor = Tensor
    u.set_tensor_class = set_tensor_class
    u.tensor = lambda *a, **k: state["cls"](*a, **k)
    u.zeros = lambda *a, **k: state["cls"].zeros(*a, **k)
    u.DefaultNPURuntime = None
    aie.utils = u
    monkeypatch.setitem(sys.modules, "aie", aie)
    monkeypatch.setitem(sys.modules, "aie.utils", u)
    return u


def test_the_one_line_switch(fake_iron, design, daemon):
    rt = npud.iron.install(daemon.address)
    assert fake_iron.DefaultNPURuntime is rt
    a = fake_iron.tensor(np.arange(N, dtype=np.int32), dtype=np.int32)
    b = fake_iron.zeros((N,), dtype=np.int32)
    assert isinstance(a, iron.NpudTensor) and isinstance(a, fake_iron.Tensor)
    k = Kernel(design / "final.xclbin", design / "insts.bin")
    handle, result = k(a, b)
    assert result.is_success() and result.npu_time > 0
    np.testing.assert_array_equal(b.numpy(), np.arange(N) + 1)
    assert b.device == "npu"
    # The tensor is npud memory, shared with the device.
    assert npud.tensor_of(b.numpy()).shared
    # A second call reuses the registered design.
    assert k(b, a)[0] is handle
    np.testing.assert_array_equal(a.numpy(), np.arange(N) + 2)
    assert rt.device() == rt.client.generation


def test_run_test_run_chain_and_failures(design, client):
    rt = iron.NpudRuntime(client=client)
    k = Kernel(design / "final.xclbin", design / "insts.bin")
    a = iron.NpudTensor(np.full(N, 5, np.int32), np.int32, client=client)
    b = iron.NpudTensor((N,), np.int32, client=client)
    assert rt.run_test(k, [a, b], {1: np.full(N, 6)}) == 0
    assert rt.run_test(k, [a, b], {1: np.full(N, 7)}) == 1
    h = rt.load(k)
    r = rt.run_chain([(h, [a, b]), (h, [b, a]), (h, [a, b])])
    assert r.is_success() and r.npu_time > 0
    np.testing.assert_array_equal(b.numpy(), np.full(N, 8))
    bad = rt.run(h, [a], fail_on_error=False)
    assert not bad.is_success() and isinstance(bad.error, npud.InvalidArgument)
    with pytest.raises(npud.InvalidArgument):
        rt.run(h, [a])
    with pytest.raises(iron.HostRuntimeError, match="NpudTensor"):
        rt.run(h, [a, np.zeros(N, np.int32)])
    assert rt.read_insts(design / "insts.bin").dtype == np.uint32


def test_designs_npud_cannot_load(tmp_path, client):
    rt = iron.NpudRuntime(client=client)
    (tmp_path / "final.xclbin").write_bytes(b"x")
    (tmp_path / "insts.bin").write_bytes(b"\0" * 16)
    with pytest.raises(iron.HostRuntimeError, match="main.pdi"):
        rt.load(Kernel(tmp_path / "final.xclbin", tmp_path / "insts.bin"))
    with pytest.raises(iron.HostRuntimeError, match="trace"):
        rt.load(Kernel(tmp_path / "final.xclbin", tmp_path / "insts.bin", trace_config=object()))
