"""Session classes: an interactive session with a deadline is granted both and shows in the
statistics; a class the policy does not give the caller is PermissionDenied; a deadline for a
batch session is InvalidArgument; a class name that is neither is a ValueError before anything
is sent."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import npud

N = 1024


def test_an_interactive_session_is_granted_its_class_and_deadline(daemon):
    with npud.Client(daemon.address) as batch:
        assert batch.session_class == "batch" and batch.deadline_us is None
    with npud.Client(daemon.address, session_class="interactive", deadline_us=5000) as c:
        assert c.session_class == "interactive"
        assert c.deadline_us == 5000
        p = npud.Program.emulated("vector_scalar_add", N, generation=c.generation,
                                  dtype=np.int32, scalar=1)
        a = c.array(np.arange(N, dtype=np.int32))
        b = c.alloc(N, np.int32)
        c.dispatch(p, a, b)
        np.testing.assert_array_equal(b, np.arange(N) + 1)
        stats = c.statistics()
        mine = [s for s in stats["sessions"] if s["session_id"] == c.session_id]
        assert [(s["session_class"], s["deadline_us"]) for s in mine] == [("interactive", 5000)]
        classes = {k["session_class"]: k for k in stats["classes"]}
        assert list(classes) == ["batch", "interactive"]
        assert classes["interactive"]["open_sessions"] >= 1
        assert classes["interactive"]["dispatches"]["success"]["count"] >= 1


def test_asyncio_connect_takes_the_class_too(daemon):
    async def main():
        c = await npud.Client.connect(daemon.address, session_class="interactive",
                                      deadline_us=20000)
        try:
            return c.session_class, c.deadline_us
        finally:
            c.close()

    assert asyncio.run(main()) == ("interactive", 20000)


def test_an_interactive_session_without_a_deadline_reads_what_the_daemon_granted(daemon):
    # No deadline asked for: the daemon's default, whatever it is, is what the client reports,
    # and the statistics say the same.
    with npud.Client(daemon.address, session_class="interactive") as c:
        mine = [s for s in c.statistics()["sessions"] if s["session_id"] == c.session_id]
        assert [s["deadline_us"] for s in mine] == [c.deadline_us or 0]


def test_a_class_the_policy_does_not_give_is_permission_denied(npud_bin, tmp_path):
    cfg = tmp_path / "npud.toml"
    cfg.write_text('[[auth.rules]]\nname = "desktop-batch"\nmatch = ["uid:*"]\n'
                   'classes = ["batch"]\n')
    d = npud.LocalDaemon(npud_bin, tcp=False, args=["--config", str(cfg)])
    try:
        with pytest.raises(npud.PermissionDenied) as e:
            npud.Client(d.address, session_class="interactive")
        assert e.value.call == "OpenSession"
        assert "desktop-batch" in e.value.message and "interactive" in e.value.message
        with npud.Client(d.address, session_class="batch") as c:
            assert c.session_class == "batch"
    finally:
        d.stop()


def test_a_deadline_for_a_batch_session_is_invalid_argument(daemon):
    with pytest.raises(npud.InvalidArgument) as e:
        npud.Client(daemon.address, deadline_us=5000)
    assert e.value.call == "OpenSession" and "deadline" in e.value.message


def test_a_class_that_is_neither_is_a_value_error_naming_both():
    # Refused before any connection: the address is never tried.
    with pytest.raises(ValueError) as e:
        npud.Client("unix:/nonexistent/npud.sock", session_class="urgent")
    assert str(e.value) == ('unknown session class "urgent": expected "batch" or '
                            '"interactive"')
    with pytest.raises(ValueError) as e:
        npud.Client("unix:/nonexistent/npud.sock", session_class="interactive",
                    deadline_us=-1)
    assert "deadline_us=-1" in str(e.value)
