"""A local tensor's array is the fd mapping itself: its address, the device's writes, and a
second process's writes are all seen in it, with no copy."""

from __future__ import annotations

import gc
import os

import numpy as np

import npud

N = 4096


def mapping_of(address: int) -> str:
    """The /proc/self/maps line of the mapping that holds ``address``."""
    with open("/proc/self/maps") as f:
        for line in f:
            span = line.split()[0]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return line.strip()
    raise AssertionError(f"no mapping holds {address:#x}")


def test_the_array_is_the_fd_mapping(client):
    assert client.is_local
    a = client.alloc(N, np.int32)
    raw = npud.tensor_of(a)
    assert raw.shared and raw.nbytes == 4 * N
    address = a.__array_interface__["data"][0]
    assert address == raw.address
    line = mapping_of(address)
    # A shared file mapping of the daemon's memfd (the emulator's export), not heap memory.
    assert "memfd:" in line and line.split()[1][3] == "s", line


def test_the_device_writes_into_the_array(client):
    p = npud.Program.emulated("vector_scalar_add", N, generation=client.generation,
                              dtype=np.int32, scalar=1)
    a = client.alloc(N, np.int32)
    b = client.alloc(N, np.int32)
    view = b[100:110]  # a numpy view taken before the dispatch
    a[:] = 41
    client.dispatch(p, a, b)
    assert (view == 42).all() and (b == 42).all()


def test_a_second_process_writes_the_same_memory(client):
    p = npud.Program.emulated("vector_scalar_add", N, generation=client.generation,
                              dtype=np.int32, scalar=1)
    a = client.alloc(N, np.int32)
    b = client.alloc(N, np.int32)
    pid = os.fork()
    if pid == 0:  # the child writes the inherited shared mapping, and nothing else
        try:
            a[:] = np.arange(N, dtype=np.int32)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    # A private copy (heap memory after fork) would still read zeros here.
    np.testing.assert_array_equal(a, np.arange(N))
    client.dispatch(p, a, b)  # and the device reads what the child wrote
    np.testing.assert_array_equal(b, np.arange(N) + 1)


def test_the_array_keeps_the_mapping_alive(client):
    a = client.alloc(N, np.int32)
    raw = npud.tensor_of(a)
    address = raw.address
    v = a.reshape(64, 64)[3]
    del a, raw
    gc.collect()
    v[:] = 9  # still mapped: the view holds the tensor
    assert "memfd:" in mapping_of(address)
    assert (v == 9).all()


def test_remote_tensors_are_staged(remote):
    a = remote.alloc(N, np.int32)
    raw = npud.tensor_of(a)
    assert not raw.shared and not remote.is_local
