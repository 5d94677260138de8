"""The pure-Python example client (grpcio + socket.recv_fds), written from the proto and
proto/npud/v1/fdsocket.md, against the real daemon."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

import npud
from conftest import REPO

grpc = pytest.importorskip("grpc", reason="pip install grpcio")  # in tests/python/requirements.txt

spec = importlib.util.spec_from_file_location("raw_client",
                                              REPO / "examples" / "python" / "raw_client.py")
raw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(raw)


def socket_path(daemon) -> str:
    return daemon.address.removeprefix("unix:")


def test_the_example_runs(daemon, tmp_path):
    npud.Program.write_emulated(tmp_path, "vector_scalar_add", 1024, generation="npu2",
                                dtype="i32", scalar=3)
    r = subprocess.run([sys.executable, str(REPO / "examples/python/raw_client.py"),
                        "--socket", socket_path(daemon), "--design", str(tmp_path),
                        "--scalar", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "PASS" in r.stdout


def test_the_example_finds_the_socket_itself(daemon, tmp_path):
    # Without --socket: NPUD_ADDR, as every npud client reads it.
    npud.Program.write_emulated(tmp_path, "vector_scalar_add", 1024, generation="npu2",
                                dtype="i32", scalar=2)
    env = dict(os.environ, NPUD_ADDR=daemon.address)
    r = subprocess.run([sys.executable, str(REPO / "examples/python/raw_client.py"),
                        "--design", str(tmp_path), "--scalar", "2"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "PASS" in r.stdout


def test_the_default_socket_is_npuds(monkeypatch):
    # npud binds /run/npud for root whatever XDG_RUNTIME_DIR says (crates/npud/src/config.rs).
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/0")
    monkeypatch.setattr(raw.os, "getuid", lambda: 0)
    assert raw.default_socket() == "/run/npud/npud.sock"
    monkeypatch.setattr(raw.os, "getuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert raw.default_socket() == "/run/user/1000/npud/npud.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    assert raw.default_socket() == "/tmp/npud-1000/npud.sock"
    monkeypatch.delenv("NPUD_ADDR", raising=False)
    assert raw.socket_from_env() == "/tmp/npud-1000/npud.sock"
    monkeypatch.setenv("NPUD_ADDR", "unix:/x/npud.sock")
    assert raw.socket_from_env() == "/x/npud.sock"


def test_allocate_redeem_map_dispatch_read(daemon):
    s = raw.Session(socket_path(daemon))
    p = npud.Program.emulated("vector_scalar_add", 256, generation="npu2", dtype="i32", scalar=1)
    prog = s.register_program(p.pdi, p.insts, "vsa")
    tin, min_ = raw.shared_tensor(s, 1024)
    tout, mout = raw.shared_tensor(s, 1024)
    src = min_.view.cast("i")
    for i in range(256):
        src[i] = 1000 + i
    queue_ns, device_ns = s.dispatch(prog, [tin, tout])
    assert device_ns > 0
    out = mout.view.cast("i")
    assert list(out) == [1001 + i for i in range(256)]
    src.release()
    out.release()
    min_.close()
    mout.close()
    s.close()


def test_a_ticket_is_good_once(daemon):
    s = raw.Session(socket_path(daemon))
    _, ticket, fd_socket = s.allocate(4096)
    fd, offset, size = raw.redeem_export(fd_socket, ticket)
    os.close(fd)
    assert size == 4096
    with pytest.raises(raw.FdSocketError) as e:
        raw.redeem_export(fd_socket, ticket)
    assert e.value.status == 1  # UNKNOWN_TICKET
    s.close()


def test_malformed_frame_is_refused_and_the_connection_closed(daemon):
    s = raw.Session(socket_path(daemon))
    _, ticket, fd_socket = s.allocate(4096)
    import socket as so
    with so.socket(so.AF_UNIX, so.SOCK_STREAM) as c:
        c.settimeout(10)
        c.connect(fd_socket)
        frame = bytearray(raw.request_frame(raw.OP_REDEEM_EXPORT, ticket))
        frame[4] = 2  # version 2
        status, _, _, message, fds = raw.exchange(c, bytes(frame))
        assert status == 8 and not fds and message  # MALFORMED
        assert c.recv(1) == b""  # closed after the answer
    # The refused frame did not consume the ticket.
    fd, _, size = raw.redeem_export(fd_socket, ticket)
    os.close(fd)
    assert size == 4096
    s.close()


def test_dispatch_of_an_unknown_tensor_is_not_found(daemon):
    s = raw.Session(socket_path(daemon))
    p = npud.Program.emulated("vector_scalar_add", 256, generation="npu2", dtype="i32")
    prog = s.register_program(p.pdi, p.insts, "vsa")
    with pytest.raises(grpc.RpcError) as e:
        s.dispatch(prog, [987654, 987655])
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    s.close()
