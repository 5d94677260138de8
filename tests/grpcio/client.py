"""A grpcio (gRPC C-core) client of npud, run by tests/tests/grpcio.rs.

usage: client.py SOCKET DESCRIPTORS PDI INSTS

SOCKET is npud's Unix socket; DESCRIPTORS the encoded FileDescriptorSet of npud.v1 (the
messages are built from it, so no stubs are generated); PDI and INSTS a vector_scalar_add (+1 on
1024 int32) program. Prints one JSON line of what it saw; exits 1 with {"pass": false, ...} on
the first surprise.

C-core sends a Unix socket's percent-encoded path as the HTTP/2 :authority, which npud's HTTP/2
layer refuses; the channel option grpc.default_authority fixes that, as the README says.
"""

import json
import struct
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SOCKET, DESCRIPTORS, PDI, INSTS = sys.argv[1:5]
N = 1024

pool = descriptor_pool.DescriptorPool()
fds = descriptor_pb2.FileDescriptorSet()
with open(DESCRIPTORS, "rb") as f:
    fds.ParseFromString(f.read())
for fd in fds.file:
    pool.Add(fd)


def msg(name):
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("npud.v1." + name))


def method(ch, kind, name, req, resp):
    make = getattr(ch, kind)
    return make(
        "/npud.v1.Npud/" + name,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=msg(resp).FromString,
    )


def fail(why, **seen):
    print(json.dumps({"pass": False, "error": why, **seen}))
    sys.exit(1)


seen = {}

# Without the option: every call is refused (RST_STREAM), and the daemon logs the hint.
with grpc.insecure_channel("unix:" + SOCKET) as bare:
    try:
        method(bare, "unary_unary", "GetDeviceInfo", None, "DeviceInfo")(
            msg("GetDeviceInfoRequest")(), timeout=10
        )
        seen["default_authority_refused"] = False
    except grpc.RpcError as e:
        seen["default_authority_refused"] = True
        seen["default_authority_error"] = f"{e.code().name}: {e.details()}"

opts = [("grpc.default_authority", "localhost")]
with grpc.insecure_channel("unix:" + SOCKET, options=opts) as ch:
    health = ch.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    # HealthCheckRequest{service: "npud.v1.Npud"}; HealthCheckResponse{status: SERVING (1)}.
    name = b"npud.v1.Npud"
    seen["health"] = health(b"\x0a" + bytes([len(name)]) + name, timeout=10).hex()

    info = method(ch, "unary_unary", "GetDeviceInfo", None, "DeviceInfo")(
        msg("GetDeviceInfoRequest")(), timeout=10
    )
    seen["backend"] = info.backend
    seen["generation"] = info.generation

    opened = method(ch, "unary_unary", "OpenSession", None, "OpenSessionResponse")(
        msg("OpenSessionRequest")(client_name="grpcio"), timeout=10
    )
    md = [("npud-session", str(opened.session_id)), ("npud-token", opened.token)]

    # Without the session's metadata: UNAUTHENTICATED, as documented.
    try:
        method(ch, "unary_unary", "AllocateTensor", None, "AllocateTensorResponse")(
            msg("AllocateTensorRequest")(size_bytes=4 * N), timeout=10
        )
        fail("AllocateTensor without a session succeeded", **seen)
    except grpc.RpcError as e:
        seen["no_session"] = e.code().name

    with open(PDI, "rb") as f:
        pdi = f.read()
    with open(INSTS, "rb") as f:
        insts = f.read()
    reg = method(ch, "unary_unary", "RegisterProgram", None, "RegisterProgramResponse")(
        msg("RegisterProgramRequest")(pdi=pdi, insts=insts, name="vector_scalar_add"),
        metadata=md,
        timeout=10,
    )
    alloc = method(ch, "unary_unary", "AllocateTensor", None, "AllocateTensorResponse")
    tin = alloc(msg("AllocateTensorRequest")(size_bytes=4 * N, name="in"), metadata=md, timeout=10)
    tout = alloc(msg("AllocateTensorRequest")(size_bytes=4 * N, name="out"), metadata=md, timeout=10)

    values = [3 * i - 500 for i in range(N)]
    chunk = msg("WriteTensorChunk")
    data = struct.pack(f"<{N}i", *values)
    half = len(data) // 2
    wrote = method(ch, "stream_unary", "WriteTensor", None, "WriteTensorResponse")(
        iter(
            [
                chunk(tensor_id=tin.tensor_id, offset=0, data=data[:half]),
                chunk(tensor_id=tin.tensor_id, offset=half, data=data[half:]),
            ]
        ),
        metadata=md,
        timeout=10,
    )
    seen["bytes_written"] = wrote.bytes_written

    arg = msg("TensorArg")
    method(ch, "unary_unary", "Dispatch", None, "DispatchResponse")(
        msg("DispatchRequest")(
            program_id=reg.program_id,
            args=[arg(tensor_id=tin.tensor_id), arg(tensor_id=tout.tensor_id)],
        ),
        metadata=md,
        timeout=10,
    )
    out = b""
    for c in method(ch, "unary_stream", "ReadTensor", None, "ReadTensorChunk")(
        msg("ReadTensorRequest")(tensor_id=tout.tensor_id, chunk_bytes=1024),
        metadata=md,
        timeout=10,
    ):
        if c.offset != len(out):
            fail(f"a chunk at offset {c.offset} after {len(out)} bytes", **seen)
        out += c.data
    got = list(struct.unpack(f"<{N}i", out))
    bad = [i for i in range(N) if got[i] != values[i] + 1]
    if bad:
        fail(f"out[{bad[0]}] = {got[bad[0]]}, expected {values[bad[0]] + 1}", **seen)
    seen["verified"] = N

    # A foreign handle: NOT_FOUND, with the daemon's message.
    try:
        method(ch, "unary_unary", "GetTensorInfo", None, "TensorInfo")(
            msg("GetTensorInfoRequest")(tensor_id=987654321), metadata=md, timeout=10
        )
        fail("GetTensorInfo of an unknown tensor succeeded", **seen)
    except grpc.RpcError as e:
        seen["unknown_tensor"] = e.code().name

    stats = method(ch, "unary_unary", "GetStatistics", None, "Statistics")(
        msg("GetStatisticsRequest")(), metadata=md, timeout=10
    )
    mine = [s for s in stats.sessions if s.session_id == opened.session_id]
    seen["dispatches"] = mine[0].dispatches.success.count if mine else None

    method(ch, "unary_unary", "CloseSession", None, "CloseSessionResponse")(
        msg("CloseSessionRequest")(), metadata=md, timeout=10
    )

print(json.dumps({"pass": True, **seen}))
