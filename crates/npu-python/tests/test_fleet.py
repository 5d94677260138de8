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


def test_a_fleet_opens_interactive_sessions_and_refuses_a_bad_class_before_sending(two):
    import asyncio

    fleet = npud.Fleet(",".join(d.address for d in two))
    with fleet.open(session_class="interactive", deadline_us=3000) as c:
        assert (c.session_class, c.deadline_us) == ("interactive", 3000)
        mine = [s for s in c.statistics()["sessions"] if s["session_id"] == c.session_id]
        assert [(s["session_class"], s["deadline_us"]) for s in mine] == [("interactive", 3000)]

    async def main():
        c = await fleet.open_async(session_class="interactive")
        try:
            return c.session_class
        finally:
            c.close()

    assert asyncio.run(main()) == "interactive"
    with fleet.open() as c:
        assert c.session_class == "batch"
    with pytest.raises(ValueError, match="urgent"):
        fleet.open(session_class="urgent")
    with pytest.raises(ValueError, match="deadline_us=-1"):
        fleet.open(session_class="interactive", deadline_us=-1)
