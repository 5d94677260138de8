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
