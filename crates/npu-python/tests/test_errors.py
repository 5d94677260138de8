"""Every refusal the suite provokes arrives as its exception class, with the daemon's gRPC code
and message."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import npud

N = 1024


def vsa(c):
    return npud.Program.emulated("vector_scalar_add", N, generation=c.generation, dtype=np.int32)


def test_too_few_arguments(any_client):
    a = any_client.alloc(N)
    with pytest.raises(npud.InvalidArgument) as e:
        any_client.dispatch(vsa(any_client), a)
    assert (e.value.code, e.value.code_name, e.value.call) == (3, "INVALID_ARGUMENT", "Dispatch")
    assert "takes 2 buffer arguments; 1 given" in e.value.message
    assert isinstance(e.value, npud.DaemonError)


def test_too_small_argument(client):
    a, b = client.alloc(N), client.alloc(N // 2)
    with pytest.raises(npud.InvalidArgument) as e:
        client.dispatch(vsa(client), a, b)
    assert "args[1]" in e.value.message


def test_other_generation_is_failed_precondition(client):
    other = "npu1" if client.generation == "npu2" else "npu2"
    p = npud.Program.emulated("vector_scalar_add", N, generation=other)
    with pytest.raises(npud.FailedPrecondition) as e:
        client.dispatch(p, client.alloc(N), client.alloc(N))
    assert e.value.code == 9 and other in e.value.message
    assert e.value.call == "RegisterProgram"


def test_device_fault_is_internal_then_quarantine(client):
    fault = npud.Program.emulated("fault", 8192, generation=client.generation)
    x, y = client.alloc(8192, np.uint8), client.alloc(8192, np.uint8)
    with pytest.raises(npud.Internal) as e:
        client.dispatch(fault, x, y)
    assert e.value.code == 13 and e.value.message
    with pytest.raises(npud.FailedPrecondition) as e:
        client.dispatch(fault, x, y)
    assert "quarantine" in e.value.message


def test_quota_is_resource_exhausted(npud_bin):
    d = npud.LocalDaemon(npud_bin, tcp=False,
                         env=[("NPUD_LIMITS__MAX_TENSORS_PER_SESSION", "2")])
    try:
        c = npud.Client(d.address)
        kept = [c.alloc(16), c.alloc(16)]
        with pytest.raises(npud.ResourceExhausted) as e:
            c.alloc(16)
        assert e.value.code == 8 and "max_tensors_per_session" in e.value.message
        assert e.value.call == "AllocateTensor" and len(kept) == 2
    finally:
        d.stop()


def test_closed_session_is_lost(daemon):
    c = npud.Client(daemon.address)
    sid = c.session_id
    c.close()
    with pytest.raises(npud.SessionLost) as e:
        c.alloc(16)
    assert e.value.code == 16 and e.value.session == sid
    assert isinstance(e.value, npud.Unauthenticated)


def test_client_side_errors():
    with pytest.raises(npud.AddressError):
        npud.Client("ftp://example")
    with pytest.raises(npud.ConnectError) as e:
        npud.Client("unix:/nonexistent/npud.sock")
    assert e.value.code is None
    with pytest.raises(npud.ArtifactError, match="insts.bin") as e:
        npud.Program.from_dir("/nonexistent-design")
    # What makes a design, for a newcomer who has none yet.
    assert "npuctl emu-design vector_scalar_add --out /nonexistent-design" in str(e.value)


def test_arrays_that_are_not_tensors(client):
    p = vsa(client)
    a = client.alloc(N)
    with pytest.raises(TypeError, match="args\\[1\\].*not npud tensor memory"):
        client.dispatch(p, a, np.zeros(N, np.int32))
    with pytest.raises(ValueError, match="args\\[0\\].*not one contiguous range"):
        client.dispatch(p, a[::2], a)
    # A contiguous slice is a sub-view: its bytes in place, refused when shorter than the
    # design's argument.
    with pytest.raises(npud.InvalidArgument, match="args\\[0\\]: 4092 bytes"):
        client.dispatch(p, a[1:], a)
    other = npud.Client(client.address)
    with pytest.raises(npud.InvalidRequest, match="another session"):
        client.dispatch(p, a, other.alloc(N))
    # A reshape is the whole tensor.
    client.dispatch(p, a.reshape(32, 32), client.alloc((4, 256)))


def test_a_stale_known_entry_is_not_taken_for_another_array(client):
    # Arrays dispatched before are resolved natively from the package's table of arrays it
    # made (by id); an id is reused once its array is gone, so an entry counts only while its
    # weak reference still names the argument.
    p = vsa(client)
    a, b = client.alloc(N), client.alloc(N)
    client.dispatch(p, a, b)
    assert client._c.dispatch_known(p._p, (a, b), npud._KNOWN) is not None
    foreign = np.zeros(N, np.int32)
    assert client._c.dispatch_known(p._p, (a, foreign), npud._KNOWN) is None
    # An entry for `foreign`'s id that names another array, as after the id was reused.
    npud._KNOWN[id(foreign)] = (weakref.ref(b), npud.tensor_of(b))
    try:
        assert client._c.dispatch_known(p._p, (a, foreign), npud._KNOWN) is None
        with pytest.raises(TypeError, match="args\\[1\\].*not npud tensor memory"):
            client.dispatch(p, a, foreign)
    finally:
        npud._KNOWN.pop(id(foreign), None)
    # Tensors themselves need no entry.
    ra, rb = npud.tensor_of(a), npud.tensor_of(b)
    assert client._c.dispatch_known(p._p, (ra, rb), {}) is not None
