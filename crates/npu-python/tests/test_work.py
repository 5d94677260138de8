"""Chains, pipelines, asyncio, the GIL, and several processes sharing the daemon."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import npud

N = 1024


def vsa(c, scalar=1):
    return npud.Program.emulated("vector_scalar_add", N, generation=c.generation, dtype=np.int32,
                                 scalar=scalar)


def test_chain(any_client):
    c = any_client
    p = vsa(c)
    a = c.array(np.zeros(N, np.int32))
    b = c.alloc(N, np.int32)
    ch = c.chain()
    for _ in range(4):
        ch.then(p, a, b).then(p, b, a)
    assert len(ch) == 8
    r = ch.run()
    assert r.completed == 8 and r.doorbells >= 1
    np.testing.assert_array_equal(a, np.full(N, 8))


def test_chain_failure_names_the_link(client):
    p = vsa(client)
    fault = npud.Program.emulated("fault", 4096, generation=client.generation)
    a, b = client.alloc(N), client.alloc(N)
    x, y = client.alloc(4096, np.uint8), client.alloc(4096, np.uint8)
    with pytest.raises(npud.ChainFailed) as e:
        client.chain().then(p, a, b).then(fault, x, y).then(p, b, a).run()
    assert e.value.index == 1 and e.value.not_run == [2]
    assert e.value.code == 13 and e.value.code_name == "INTERNAL"
    np.testing.assert_array_equal(b, np.ones(N))  # link 0 ran


def test_empty_chain_is_invalid_argument(client):
    with pytest.raises(npud.InvalidArgument) as e:
        client.chain().run()
    assert e.value.code == 3 and e.value.message


@pytest.fixture(params=["ring", "stream"])
def pipelining(request, daemon, monkeypatch):
    """A local client whose pipelines run on its dispatch ring, or (fast path off) on streams."""
    if request.param == "stream":
        monkeypatch.setenv("NPUD_FAST_PATH", "0")
    c = npud.Client(daemon.address)
    yield c, request.param
    try:
        c.close()
    except npud.NpudError:
        pass


def test_pipeline(pipelining):
    client, route = pipelining
    p = vsa(client)
    ins = [client.array(np.full(N, i, np.int32)) for i in range(8)]
    outs = [client.alloc(N, np.int32) for _ in range(8)]
    small = client.alloc(16, np.int32)
    ids = []
    with client.pipeline(depth=4) as pl:
        assert pl.depth == 4
        assert pl.on_ring == (route == "ring")
        for r in range(6):
            for i in range(8):
                ids.append(pl.submit(p, ins[i], outs[i]))
        bad = pl.submit(p, ins[0], small)  # too small: refused, and the stream goes on
        ids.append(bad)
        ids.append(pl.submit(p, ins[1], outs[1]))
        done = pl.finish()
    assert [d.request_id for d in done] == ids
    assert all(d.error is None for d in done if d.request_id != bad)
    failed = next(d for d in done if d.request_id == bad)
    assert isinstance(failed.error, npud.InvalidArgument) and "args[1]" in failed.error.message
    with pytest.raises(npud.InvalidArgument):
        failed.result()
    for i in range(8):
        np.testing.assert_array_equal(outs[i], np.full(N, i + 1))
    assert pl.pending == 0


def test_pipelined_work_on_one_tensor_keeps_its_order(pipelining):
    """Each dispatch reads what the one before it wrote: a submission takes its tensors once
    the dispatch in flight that holds them has completed."""
    client, route = pipelining
    p = vsa(client)
    a = client.array(np.zeros(N, np.int32))
    b = client.alloc(N, np.int32)
    with client.pipeline(depth=8) as pl:
        assert pl.on_ring == (route == "ring")
        for _ in range(20):
            pl.submit(p, a, b)
            pl.submit(p, b, a)
        done = pl.finish()
    assert len(done) == 40 and all(d.error is None for d in done)
    np.testing.assert_array_equal(a, np.full(N, 40))


def test_a_pipeline_dropped_in_flight_lets_its_tensors_go_once_answered(pipelining):
    """Dropped with dispatches in flight, the pipeline's submissions still run. On the ring each
    took its tensors when it was submitted, and keeps them until the daemon has answered it: a
    later dispatch on one of them runs after, and sees what it wrote. On streams a submission
    takes its tensors when the pipeline's task reaches it, so a later call may come first: the
    outputs are written all the same."""
    client, route = pipelining
    p = vsa(client)
    ins = [client.array(np.full(N, i, np.int32)) for i in range(8)]
    outs = [client.alloc(N, np.int32) for _ in range(8)]
    pl = client.pipeline(depth=8)
    for i in range(8):
        pl.submit(p, ins[i], outs[i])
    del pl
    if route == "ring":
        last = client.alloc(N, np.int32)
        client.dispatch(p, outs[7], last)
        np.testing.assert_array_equal(last, np.full(N, 9))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(o[0] == i + 1 for i, o in enumerate(outs)):
        time.sleep(0.01)
    for i in range(8):
        np.testing.assert_array_equal(outs[i], np.full(N, i + 1))


def test_pipeline_refuses_staged_tensors(remote):
    p = vsa(remote)
    a, b = remote.alloc(N), remote.alloc(N)
    pl = remote.pipeline(4)
    with pytest.raises(npud.InvalidRequest, match="staged"):
        pl.submit(p, a, b)


def test_asyncio(client):
    p = vsa(client, scalar=5)

    async def main():
        c2 = await npud.Client.connect(client.address)
        arrays = [await c2.alloc_async(N, np.int32) for _ in range(8)]
        for i, a in enumerate(arrays[:4]):
            a[:] = i
        times = await asyncio.gather(*(c2.dispatch_async(p, arrays[i], arrays[i + 4])
                                       for i in range(4)))
        assert all(isinstance(t, npud.Timing) for t in times)
        r = await c2.chain().then(p, arrays[4], arrays[0]).run_async()
        assert r.completed == 1
        pl = c2.pipeline(4)
        for _ in range(10):
            await pl.submit_async(p, arrays[1], arrays[2])
        done = await pl.finish_async()
        assert len(done) == 10 and all(d.error is None for d in done)
        info = await c2.device_info_async()
        stats = await c2.statistics_async()
        with pytest.raises(npud.InvalidArgument):
            await c2.dispatch_async(p, arrays[0])
        return arrays, info, stats

    arrays, info, stats = asyncio.run(main())
    for i in range(4):
        np.testing.assert_array_equal(arrays[i + 4], np.full(N, i + 5))
    np.testing.assert_array_equal(arrays[0], np.full(N, 10))
    np.testing.assert_array_equal(arrays[2], np.full(N, 6))
    assert info["serving"] and stats["sessions"]


def test_gil_is_released_while_the_device_works(npud_bin):
    # An emulated hang blocks the device until the emulator's watchdog (here 1.5 s) fails it;
    # another Python thread must run meanwhile.
    d = npud.LocalDaemon(npud_bin, tcp=False, args=["--emulator-timeout-ms", "1500"])
    try:
        c = npud.Client(d.address)
        hang = npud.Program.emulated("hang", 4096, generation=c.generation)
        x, y = c.alloc(4096, np.uint8), c.alloc(4096, np.uint8)
        started = threading.Event()
        stop = threading.Event()
        count = [0]

        def spin():
            started.set()
            while not stop.is_set():
                count[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        started.wait()
        before = count[0]
        with pytest.raises(npud.Internal) as e:
            c.dispatch(hang, x, y)
        during = count[0] - before
        stop.set()
        t.join()
        assert e.value.code == 13
        # With the GIL held for the whole dispatch the thread would get at most a switch
        # interval's worth of iterations before the call and none during it.
        assert during > 100_000, during
    finally:
        d.stop()


def test_ctrl_c_ends_a_wait_on_the_ring(npud_bin):
    """A hang holds the device for 30 s (the emulator's watchdog): Ctrl-C ends the caller's wait
    on the ring within a slice of it, for a dispatch and for a pipeline's completion, where it
    used to wait for the answer with signals unseen."""
    d = npud.LocalDaemon(npud_bin, tcp=False, args=["--emulator-timeout-ms", "30000"])
    try:
        c = npud.Client(d.address)
        hang = npud.Program.emulated("hang", 4096, generation=c.generation)
        x, y = c.alloc(4096, np.uint8), c.alloc(4096, np.uint8)
        for wait in ("dispatch", "pipeline"):
            timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
            started = time.monotonic()
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                if wait == "dispatch":
                    c.dispatch(hang, x, y)
                else:
                    pl = c.pipeline(depth=2)
                    assert pl.on_ring
                    u, v = c.alloc(4096, np.uint8), c.alloc(4096, np.uint8)
                    pl.submit(hang, u, v)
                    pl.next_completion()
            timer.join()
            # Far sooner than the hang's 30 s (or the pipeline's, queued behind it).
            assert time.monotonic() - started < 15, wait
    finally:
        d.stop()


def _worker(address: str, k: int, q) -> None:
    c = npud.Client(address)
    p = npud.Program.emulated("vector_scalar_add", N, generation=c.generation, dtype=np.int32,
                              scalar=k)
    a = c.array(np.arange(N, dtype=np.int32))
    b = c.alloc(N, np.int32)
    for _ in range(20):
        c.dispatch(p, a, b)
    q.put((k, c.session_id, bool((b == np.arange(N) + k).all())))
    c.close()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_processes_share_the_daemon(daemon, client, method):
    # The parent holds a session (and so the package's runtime) before forking: a forked child
    # must make its own.
    client.dispatch(vsa(client), client.alloc(N), client.alloc(N))
    ctx = multiprocessing.get_context(method)
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(daemon.address, k, q)) for k in range(1, 5)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sorted(r[0] for r in results) == [1, 2, 3, 4]
    assert all(r[2] for r in results), results
    assert len({r[1] for r in results} | {client.session_id}) == 5


def test_a_client_does_not_cross_fork(client):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        try:
            client.statistics()
            q.put("no error")
        except RuntimeError as e:
            q.put(str(e))

    p = ctx.Process(target=child)
    p.start()
    msg = q.get(timeout=30)
    p.join(10)
    assert "before the process forked" in msg


def _in_forked_child(fn, timeout=20):
    """Runs ``fn`` in a forked child; returns what it put in the queue, or "hung" when it gave
    nothing within ``timeout`` seconds (the child is then killed)."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        try:
            fn()
            q.put("no error")
        except RuntimeError as e:
            q.put(str(e))

    p = ctx.Process(target=child, daemon=True)
    p.start()
    try:
        return q.get(timeout=timeout)
    except Exception:
        return "hung"
    finally:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def test_tensors_do_not_cross_fork(remote):
    # Staged tensors (TCP): upload and download talk to the daemon on the parent's connection.
    a = remote.alloc(N)
    raw = npud.tensor_of(a)
    for call in (raw.upload, raw.download):
        msg = _in_forked_child(call)
        assert "before the process forked" in msg, msg
        assert "npud tensor" in msg, msg
    # The parent's tensor still works.
    a[:] = 5
    raw.upload()
    raw.download()
    assert (a == 5).all()


def test_a_tensor_made_before_fork_is_refused_by_a_client_made_after(daemon, client):
    a, b = client.alloc(N), client.alloc(N)

    def child():
        c = npud.Client(daemon.address)
        c.dispatch(vsa(c), a, b)

    msg = _in_forked_child(child)
    assert "before the process forked" in msg, msg


def test_pipelines_do_not_cross_fork(client):
    p = client.pipeline(4)
    for call in (p.finish, p.next_completion):
        msg = _in_forked_child(call)
        assert "before the process forked" in msg and "pipeline" in msg, msg
    assert p.finish() == []


def test_uploads_copy_while_numpy_writes(remote):
    # A staged upload copies the bytes out through raw pointers while another thread writes
    # them through numpy; the last upload after the writer stops carries the last values.
    a = remote.alloc(1 << 20, np.uint8)
    raw = npud.tensor_of(a)
    stop = threading.Event()

    def writer():
        v = 0
        while not stop.is_set():
            a[:] = v % 251
            v += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(20):
            raw.upload()
    finally:
        stop.set()
        t.join()
    a[:] = 7
    raw.upload()
    a[:] = 0
    raw.download()
    assert (a == 7).all()
