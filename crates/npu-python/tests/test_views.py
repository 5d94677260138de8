"""Sub-views: contiguous slices of a tensor's array as dispatch arguments (IRON's subview)."""

from __future__ import annotations

import numpy as np
import pytest

import npud

N = 256


def vsa(c):
    return npud.Program.emulated("vector_scalar_add", N, generation=c.generation, dtype=np.int32,
                                 scalar=1)


def test_views_of_one_tensor_in_and_out(any_client):
    c = any_client
    p = vsa(c)
    buf = c.array(np.concatenate([np.arange(N, dtype=np.int32), np.full(2 * N, -7, np.int32)]))
    assert npud.view_of(buf[N:2 * N]) == (npud.tensor_of(buf), N * 4, N * 4)
    # Input: the first N elements; output: the last N; the middle is left alone.
    c.dispatch(p, buf[:N], buf[2 * N:])
    np.testing.assert_array_equal(buf[2 * N:], np.arange(N, dtype=np.int32) + 1)
    np.testing.assert_array_equal(buf[N:2 * N], np.full(N, -7, np.int32))
    np.testing.assert_array_equal(buf[:N], np.arange(N, dtype=np.int32))


def test_a_view_too_small_or_not_contiguous_is_refused(client):
    p = vsa(client)
    buf = client.alloc(2 * N, np.int32)
    with pytest.raises(npud.InvalidArgument, match=r"args\[1\]: 1020 bytes"):
        client.dispatch(p, buf[:N], buf[N:2 * N - 1])
    with pytest.raises(ValueError, match=r"args\[0\]: the array is not one contiguous range"):
        client.dispatch(p, buf[::2], buf[N:])


def test_a_chains_links_take_views_of_one_tensor(any_client):
    c = any_client
    p = vsa(c)
    buf = c.array(np.concatenate([np.arange(N, dtype=np.int32), np.zeros(2 * N, np.int32)]))
    # Each link reads the range the one before wrote: the data moves through one tensor.
    r = c.chain().then(p, buf[:N], buf[N:2 * N]).then(p, buf[N:2 * N], buf[2 * N:]).run()
    assert r.completed == 2
    np.testing.assert_array_equal(buf[N:2 * N], np.arange(N, dtype=np.int32) + 1)
    np.testing.assert_array_equal(buf[2 * N:], np.arange(N, dtype=np.int32) + 2)
    np.testing.assert_array_equal(buf[:N], np.arange(N, dtype=np.int32))


def test_a_chain_link_names_the_view_it_refuses(client):
    p = vsa(client)
    buf = client.alloc(3 * N, np.int32)
    with pytest.raises(ValueError, match=r"links\[1\]\.args\[0\]: the array is not one contiguous"):
        client.chain().then(p, buf[:N], buf[N:2 * N]).then(p, buf[::3], buf[2 * N:])
    with pytest.raises(npud.InvalidArgument, match=r"1020 bytes"):
        client.chain().then(p, buf[:N], buf[N:2 * N]).then(p, buf[N:2 * N], buf[2 * N:-1]).run()
