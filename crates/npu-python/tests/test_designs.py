"""The emulator's example designs through the package, checked against numpy, locally (tensors
shared by fd) and over TCP (tensors staged through the API)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np
import pytest

import npud

N = 1024


def test_vector_scalar_add(any_client):
    c = any_client
    p = npud.Program.emulated("vector_scalar_add", N, generation=c.generation, dtype=np.int32,
                              scalar=7)
    a = c.alloc(N, np.int32)
    b = c.alloc(N, np.int32)
    a[:] = np.arange(N, dtype=np.int32) * 3 - 100
    t = c.dispatch(p, a, b)
    assert isinstance(t, npud.Timing) and t.device_ns > 0
    np.testing.assert_array_equal(b, a + 7)
    assert npud.tensor_of(a).shared == (c.address.startswith("unix:"))


def test_from_dir_and_from_bytes(client, tmp_path):
    npud.Program.write_emulated(tmp_path, "vector_scalar_add", N, generation=client.generation,
                                dtype="i32", scalar=2)
    p = npud.Program.from_dir(tmp_path)
    assert p.name == tmp_path.name
    assert p.min_arg_bytes == [4 * N, 4 * N]
    q = npud.Program.from_bytes("again", p.pdi, p.insts)
    a = client.array(np.arange(N, dtype=np.int32))
    b = client.alloc(N, np.int32)
    client.dispatch(p, a, b)
    np.testing.assert_array_equal(b, np.arange(N) + 2)
    client.dispatch(q, b, a)
    np.testing.assert_array_equal(a, np.arange(N) + 4)
    info = client.register(q)
    assert len(info.content_hash) == 64 and not info.newly_stored


def test_from_hsaco_by_path_and_bytes(client, tmp_path):
    npuctl = pathlib.Path(os.environ["NPUD_BIN"]).with_name("npuctl")
    path = tmp_path / "vsa.hsaco"
    subprocess.run([npuctl, "emu-design", "vector_scalar_add", "--format", "hsaco", "--n", str(N),
                    "--generation", client.generation, "--out", path], check=True,
                   capture_output=True)
    p = npud.Program.from_hsaco(path)
    q = npud.Program.from_hsaco(path.read_bytes(), "vector_scalar_add")
    a = client.array(np.arange(N, dtype=np.int32))
    b = client.alloc(N, np.int32)
    client.dispatch(p, a, b)
    np.testing.assert_array_equal(b, np.arange(N) + 1)
    client.dispatch(q, b, a)
    np.testing.assert_array_equal(a, np.arange(N) + 2)
    with pytest.raises(npud.InvalidRequest, match="relu"):
        npud.Program.from_hsaco(path, "relu")


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32])
def test_elementwise(any_client, dtype):
    c = any_client
    rng = np.random.default_rng(1)
    x = c.array(rng.integers(-50, 50, N).astype(dtype))
    y = c.array(rng.integers(-50, 50, N).astype(dtype))
    z = c.alloc(N, dtype)
    for kernel, expect in [("vector_vector_add", x + y), ("vector_mul", x * y)]:
        c.dispatch(npud.Program.emulated(kernel, N, generation=c.generation, dtype=dtype), x, y, z)
        np.testing.assert_array_equal(z, expect, err_msg=kernel)
    c.dispatch(npud.Program.emulated("relu", N, generation=c.generation, dtype=dtype), x, z)
    np.testing.assert_array_equal(z, np.maximum(x, 0))


def test_passthrough(any_client):
    c = any_client
    data = np.frombuffer(np.random.default_rng(2).bytes(4096), dtype=np.uint8)
    src = c.array(data)
    dst = c.alloc(4096, np.uint8)
    trace = c.alloc(4096, np.uint8)
    c.dispatch(npud.Program.emulated("passthrough", 4096, generation=c.generation), src, dst,
               trace)
    np.testing.assert_array_equal(dst, data)


def test_matmul_i16_i32(any_client):
    c = any_client
    n = 64
    rng = np.random.default_rng(3)
    a = c.array(rng.integers(-100, 100, (n, n)).astype(np.int16))
    b = c.array(rng.integers(-100, 100, (n, n)).astype(np.int16))
    out = c.alloc((n, n), np.int32)
    c.dispatch(npud.Program.emulated("matmul", n, generation=c.generation), a, b, out)
    np.testing.assert_array_equal(out, a.astype(np.int32) @ b.astype(np.int32))


def test_matmul_bf16_f32(client):
    n = 64
    rng = np.random.default_rng(4)

    def to_bf16(x):  # round toward zero: bf16 is the top half of a float32
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

    a16 = to_bf16(rng.uniform(-2, 2, (n, n)))
    b16 = to_bf16(rng.uniform(-2, 2, (n, n)))
    a = client.array(a16)
    b = client.array(b16)
    out = client.alloc((n, n), np.float32)
    client.dispatch(npud.Program.emulated("matmul", n, generation=client.generation,
                                          dtype="bf16"), a, b, out)
    af = (a16.astype(np.uint32) << 16).view(np.float32)
    bf = (b16.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(out, af @ bf, rtol=1e-4, atol=1e-3)


def test_device_info_and_statistics(client):
    info = client.device_info()
    assert info["backend"] == "emulator" and info["generation"] == client.generation
    assert info["limits"]["max_pending_per_session"] > 0
    p = npud.Program.emulated("vector_scalar_add", N, generation=client.generation)
    a, b = client.alloc(N), client.alloc(N)
    client.dispatch(p, a, b)
    stats = client.statistics()
    mine = [s for s in stats["sessions"] if s["session_id"] == client.session_id]
    assert mine and mine[0]["dispatches"]["success"]["count"] == 1
    assert mine[0]["tensors"] == 2
