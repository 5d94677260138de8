#!/usr/bin/env python3
"""A client of npud in pure Python: grpcio for the API, the standard library for the fd socket.

Written from the two specifications only, as a client in any language would be:
``proto/npud/v1/npud.proto`` (the gRPC API) and ``proto/npud/v1/fdsocket.md`` (the fd socket).
It needs nothing but ``pip install grpcio``: the few messages it sends are encoded by the small
protobuf codec below, so there is no code generation step. (For real work, use the ``npud``
package: it is the Rust client, with numpy arrays and several times less overhead a call.)

    python3 raw_client.py --design DIR [--socket PATH] [--n 1024]

runs DIR's vector_scalar_add (``main.pdi`` + ``insts.bin``, int32, ``out = in + scalar``) on
tensors shared by fd: AllocateTensor -> redeem the ticket on the fd socket (SCM_RIGHTS) ->
mmap -> Dispatch -> read the result from the mapping. The socket is ``--socket``, else
``NPUD_ADDR`` (a path or ``unix:PATH``), else where npud binds by default (:func:`default_socket`).

Note on grpcio over a Unix socket: grpcio sends the socket *path* as the HTTP/2 ``:authority``
unless told otherwise, and a path is not a valid authority, so npud's HTTP/2 server refuses the
stream. Set the channel option ``grpc.default_authority`` (any host name, e.g. ``localhost``),
as :func:`connect` does.
"""

from __future__ import annotations

import argparse
import mmap
import os
import socket
import struct
import sys
from typing import Any

import grpc

SERVICE = "/npud.v1.Npud/"

# ---------------------------------------------------------------------------------------------
# A minimal protobuf codec: varints and length-delimited fields, which is all these messages use.


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode(fields: list[tuple[int, Any]]) -> bytes:
    """Encodes (field number, value) pairs: ints as varints, bytes/str as length-delimited."""
    out = bytearray()
    for num, value in fields:
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int):
            out += _varint(num << 3 | 0) + _varint(value)
        else:
            data = value.encode() if isinstance(value, str) else bytes(value)
            out += _varint(num << 3 | 2) + _varint(len(data)) + data
    return bytes(out)


def decode(data: bytes) -> dict[int, list[Any]]:
    """Decodes a message into field number -> values (ints, or bytes for length-delimited)."""
    fields: dict[int, list[Any]] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        shift = result = 0
        while True:
            b = data[i]
            i += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result

    while i < len(data):
        key = varint()
        num, wire = key >> 3, key & 7
        if wire == 0:
            v: Any = varint()
        elif wire == 2:
            n = varint()
            v = data[i:i + n]
            i += n
        elif wire == 1:
            v = data[i:i + 8]
            i += 8
        elif wire == 5:
            v = data[i:i + 4]
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire} for field {num}")
        fields.setdefault(num, []).append(v)
    return fields


def _one(fields: dict[int, list[Any]], num: int, default: Any = 0) -> Any:
    return fields.get(num, [default])[-1]


# ---------------------------------------------------------------------------------------------
# The gRPC API


class Session:
    """A channel with an open session: every call carries npud-session and npud-token."""

    def __init__(self, address: str, client_name: str = "raw_client.py") -> None:
        self.channel = connect(address)
        r = self.call("OpenSession", encode([(1, client_name)]), session=False)
        self.session_id = _one(r, 1)
        self.token = _one(r, 2, b"").decode()

    def call(self, method: str, request: bytes, session: bool = True) -> dict[int, list[Any]]:
        stub = self.channel.unary_unary(SERVICE + method)
        md = [("npud-session", str(self.session_id)), ("npud-token", self.token)] if session else []
        return decode(stub(request, metadata=md, timeout=30))

    def register_program(self, pdi: bytes, insts: bytes, name: str) -> int:
        return _one(self.call("RegisterProgram", encode([(1, pdi), (2, insts), (3, name)])), 1)

    def allocate(self, size: int) -> tuple[int, bytes, str]:
        """AllocateTensor: (tensor_id, fd_ticket, fd_socket)."""
        r = self.call("AllocateTensor", encode([(1, size)]))
        return _one(r, 1), _one(r, 2, b""), _one(r, 3, b"").decode()

    def dispatch(self, program_id: int, tensor_ids: list[int]) -> tuple[int, int]:
        """Dispatch over whole tensors: (queue_ns, device_ns)."""
        args = [(2, encode([(1, t)])) for t in tensor_ids]
        r = self.call("Dispatch", encode([(1, program_id)] + args))
        return _one(r, 1), _one(r, 2)

    def close(self) -> None:
        self.call("CloseSession", b"")
        self.channel.close()


def connect(address: str) -> grpc.Channel:
    """A plaintext channel to ``unix:PATH`` (or a bare path) or ``HOST:PORT``."""
    if address.startswith("/"):
        address = "unix:" + address
    # Over a Unix socket grpcio would send the path as :authority; npud's HTTP/2 server refuses
    # that, so name a host instead.
    return grpc.insecure_channel(address, options=[("grpc.default_authority", "localhost")])


# ---------------------------------------------------------------------------------------------
# The fd socket (proto/npud/v1/fdsocket.md)

MAGIC = b"NPFD"
VERSION = 1
OP_REDEEM_EXPORT = 1
OP_IMPORT = 2
REQUEST_BYTES = 64
RESPONSE_BYTES = 256
STATUS_NAMES = {
    0: "OK", 1: "UNKNOWN_TICKET", 2: "WRONG_UID", 3: "WRONG_OP", 4: "NOT_A_MEMFD",
    5: "MISSING_SEALS", 6: "SIZE_MISMATCH", 7: "NOT_READ_WRITE", 8: "MALFORMED", 9: "INTERNAL",
    10: "WRITE_SEALED", 11: "RESOURCE_EXHAUSTED", 12: "UNAVAILABLE", 13: "TENSOR_GONE",
    14: "TENSOR_STATE",
}


class FdSocketError(Exception):
    """A refusal on the fd socket: ``status`` is its code, the message the daemon's."""

    def __init__(self, status: int, message: str) -> None:
        name = STATUS_NAMES.get(status, f"status {status}")
        super().__init__(f"fd socket: {name}: {message}")
        self.status = status
        self.message = message


def request_frame(op: int, ticket: bytes) -> bytes:
    if len(ticket) != 16:
        raise ValueError(f"a ticket is 16 bytes; got {len(ticket)}")
    return MAGIC + struct.pack("<HH", VERSION, op) + ticket + bytes(40)


def exchange(sock: socket.socket, frame: bytes, fds: list[int] = ()) -> tuple[int, int, int, str, list[int]]:
    """Sends one request (with its fds, in one sendmsg) and reads one response: (status, size,
    offset, message, fds received)."""
    if fds:
        socket.send_fds(sock, [frame], list(fds))
    else:
        sock.sendall(frame)
    buf = bytearray()
    got_fds: list[int] = []
    # recvmsg only (never a plain read: the kernel would drop the fds); loop over short reads.
    while len(buf) < RESPONSE_BYTES:
        data, new_fds, flags, _ = socket.recv_fds(sock, RESPONSE_BYTES - len(buf), 1,
                                                  socket.MSG_CMSG_CLOEXEC)
        got_fds += new_fds
        if flags & socket.MSG_CTRUNC:
            for fd in got_fds:
                os.close(fd)
            raise OSError("fd socket: control data truncated (MSG_CTRUNC)")
        if not data:
            for fd in got_fds:
                os.close(fd)
            raise ConnectionError("fd socket: the daemon closed the connection mid-frame")
        buf += data
    if buf[:4] != MAGIC:
        raise OSError(f"fd socket: bad magic {bytes(buf[:4])!r}")
    version, status, size, offset, mlen = struct.unpack_from("<HHQQH", buf, 4)
    message = bytes(buf[32:32 + min(mlen, 224)]).decode("utf-8", "replace")
    return status, size, offset, message, got_fds


def redeem_export(fd_socket: str, ticket: bytes) -> tuple[int, int, int]:
    """REDEEM_EXPORT: (fd, offset, size) of the tensor's memory."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(fd_socket)
        status, size, offset, message, fds = exchange(s, request_frame(OP_REDEEM_EXPORT, ticket))
    if status != 0:
        for fd in fds:
            os.close(fd)
        raise FdSocketError(status, message)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise OSError(f"fd socket: an OK answer with {len(fds)} fds; expected 1")
    return fds[0], offset, size


class Mapped:
    """A tensor's memory mapped from its fd; ``view`` is a memoryview of exactly its bytes."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        # The offset need not be page-aligned: map from the page that holds it.
        head = offset % mmap.PAGESIZE
        self.map = mmap.mmap(fd, size + head, flags=mmap.MAP_SHARED,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset - head)
        os.close(fd)  # the mapping keeps the memory
        self.view = memoryview(self.map)[head:head + size]

    def close(self) -> None:
        self.view.release()
        self.map.close()


def shared_tensor(session: Session, size: int) -> tuple[int, Mapped]:
    """A tensor shared by fd: AllocateTensor, redeem its ticket, map it."""
    tid, ticket, fd_socket = session.allocate(size)
    if not ticket:
        raise OSError("AllocateTensor gave no fd ticket: a remote (TCP) connection, where "
                      "tensors move with WriteTensor/ReadTensor")
    fd, offset, got = redeem_export(fd_socket, ticket)
    if got != size:
        os.close(fd)
        raise OSError(f"the fd socket gave {got} bytes for a {size}-byte tensor")
    return tid, Mapped(fd, offset, got)


def default_socket() -> str:
    """Where npud binds by default: ``/run/npud/npud.sock`` for root (a system service),
    ``$XDG_RUNTIME_DIR/npud/npud.sock`` for another user, ``/tmp/npud-<uid>/npud.sock`` when
    ``XDG_RUNTIME_DIR`` is unset or empty."""
    uid = os.getuid()
    if uid == 0:
        return "/run/npud/npud.sock"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "npud", "npud.sock")
    return f"/tmp/npud-{uid}/npud.sock"


def socket_from_env() -> str:
    """``NPUD_ADDR`` when it names a Unix socket, else :func:`default_socket`."""
    addr = os.environ.get("NPUD_ADDR", "")
    if addr.startswith("unix:"):
        return addr.removeprefix("unix:")
    if addr.startswith("/"):
        return addr
    return default_socket()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=None,
                    help="npud's gRPC socket (default: NPUD_ADDR, else npud's default socket: "
                         "/run/npud/npud.sock for root, $XDG_RUNTIME_DIR/npud/npud.sock "
                         "otherwise)")
    ap.add_argument("--design", required=True, help="a vector_scalar_add design directory")
    ap.add_argument("--n", type=int, default=1024, help="int32 elements")
    ap.add_argument("--scalar", type=int, default=1, help="the design's addend")
    a = ap.parse_args(argv)
    with open(os.path.join(a.design, "main.pdi"), "rb") as f:
        pdi = f.read()
    with open(os.path.join(a.design, "insts.bin"), "rb") as f:
        insts = f.read()
    s = Session(a.socket or socket_from_env())
    program = s.register_program(pdi, insts, "vector_scalar_add")
    tin, min_ = shared_tensor(s, 4 * a.n)
    tout, mout = shared_tensor(s, 4 * a.n)
    src = min_.view.cast("i")
    for i in range(a.n):
        src[i] = i
    queue_ns, device_ns = s.dispatch(program, [tin, tout])
    out = mout.view.cast("i")
    bad = [i for i in range(a.n) if out[i] != i + a.scalar]
    print(f"dispatch: queue {queue_ns} ns, device {device_ns} ns; "
          f"{'PASS' if not bad else f'FAIL at {bad[:5]}'}")
    src.release()
    out.release()
    min_.close()
    mout.close()
    s.close()
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
