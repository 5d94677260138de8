"""npud.Fleet over two private daemons: sessions alternate between equal hosts, the table shows
both, and a fleet with no reachable host raises NoHealthyHost naming each."""

from __future__ import annotations

import numpy as np
import pytest

import npud


@pytest.fixture(scope="module")
def two(npud_bin):
    ds = [npud.LocalDaemon(npud_bin, tcp=False) for _ in range(2)]
    yield ds
    for d in ds:
        d.stop()


def test_sessions_alternate_over_equal_hosts_and_run(two):
    fleet = npud.Fleet(",".join(d.address for d in two))
    hosts = fleet.hosts()
    assert [h["address"] for h in hosts] == [d.address for d in two]
    assert all(h["health"] == "serving" for h in hosts), hosts
    assert sum(h["next"] for h in hosts) == 1
    clients = [fleet.open() for _ in range(4)]
    try:
        assert sorted(c.address for c in clients) == sorted([d.address for d in two] * 2)
        for d in two:
            on = [c for c in clients if c.address == d.address]
            stats = on[0].statistics()
            assert stats["open_sessions"] == 2, stats
        c = clients[0]
        a = c.alloc(64, np.int32)
        assert a.shape == (64,)
    finally:
        for c in clients:
            c.close()


def test_no_healthy_host_names_each(tmp_path):
    spec = f"unix:{tmp_path / 'a.sock'},unix:{tmp_path / 'b.sock'}"
    fleet = npud.Fleet(spec)
    with pytest.raises(npud.NoHealthyHost) as e:
        fleet.open()
    text = str(e.value)
    assert "a.sock: down (" in text and "b.sock: down (" in text, text
    assert isinstance(e.value, npud.ConnectError)
