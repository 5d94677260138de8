//! Hostile input gets the codes the README documents, and the daemon stays up: bytes that are
//! no protobuf, messages over the transport's limit, deadlines that pass while the device is
//! busy, and a write-sealed memfd on the fd socket.

#![forbid(unsafe_code)]

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::time::Duration;

use npu_artifacts::emu::EmuDesign;
use npu_fd::FdError;
use npu_fd::wire::{Status as FdStatus, Ticket, client};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session, dispatch_request, raw_h2_call, raw_unary, with_session};
use tonic::{Code, Request};

/// `limits.max_message_bytes` for these tests (the smallest allowed): the transport refuses
/// messages over twice this.
const MAX_MESSAGE: usize = 64 << 10;

/// A field number 2047 with wire type 7, which does not exist: no protobuf decoder accepts it.
const NOT_PROTOBUF: &[u8] = &[0xff, 0x7f, 0xff, 0xff, 0xff];

/// One hostile request and what it must get.
struct Case {
    what: &'static str,
    /// The method, `/npud.v1.Npud/...`.
    path: &'static str,
    /// The message bytes.
    body: Vec<u8>,
    /// Whether the request carries the session's metadata.
    in_session: bool,
    code: Code,
    /// Text the status message must hold.
    text: &'static str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_the_documented_codes_and_the_daemon_stays_up() {
    let mut d = Daemon::start(
        Options::default()
            .env("NPUD_LIMITS__MAX_MESSAGE_BYTES", &MAX_MESSAGE.to_string())
            .arg("--emulator-timeout-ms")
            .arg("1500"),
    );
    let s = Session::open(d.connect().await, "hostile").await.unwrap();
    let oversized = vec![0_u8; 2 * MAX_MESSAGE + 1024];

    let table = [
        Case {
            what: "no protobuf, no session needed",
            path: "/npud.v1.Npud/OpenSession",
            body: NOT_PROTOBUF.to_vec(),
            in_session: false,
            code: Code::InvalidArgument,
            text: "not a valid message",
        },
        Case {
            what: "no protobuf, in a session",
            path: "/npud.v1.Npud/RegisterProgram",
            body: NOT_PROTOBUF.to_vec(),
            in_session: true,
            code: Code::InvalidArgument,
            text: "not a valid message",
        },
        Case {
            what: "no protobuf, a tensor call",
            path: "/npud.v1.Npud/AllocateTensor",
            body: NOT_PROTOBUF.to_vec(),
            in_session: true,
            code: Code::InvalidArgument,
            text: "not a valid message",
        },
        Case {
            what: "a truncated length-delimited field",
            path: "/npud.v1.Npud/RegisterProgram",
            body: vec![0x0a, 0x40, 1, 2, 3],
            in_session: true,
            code: Code::InvalidArgument,
            text: "not a valid message",
        },
        Case {
            what: "over twice max_message_bytes",
            path: "/npud.v1.Npud/OpenSession",
            body: oversized.clone(),
            in_session: false,
            code: Code::ResourceExhausted,
            text: "limits.max_message_bytes",
        },
        Case {
            what: "over twice max_message_bytes, in a session",
            path: "/npud.v1.Npud/RegisterProgram",
            body: oversized,
            in_session: true,
            code: Code::ResourceExhausted,
            text: "limits.max_message_bytes",
        },
    ];
    for Case {
        what,
        path,
        body,
        in_session,
        code,
        text,
    } in table
    {
        let req = if in_session {
            with_session(body, s.id, &s.token)
        } else {
            Request::new(body)
        };
        let e = raw_unary(d.channel().await, path, req)
            .await
            .expect_err(what);
        assert_eq!(e.code(), code, "{what}: {e:?}");
        assert!(e.message().contains(text), "{what}: {e:?}");
        assert!(d.running(), "the daemon died on {what}");
    }

    // An expired deadline: a hanging design holds the device, and a call behind it with a
    // 200 ms deadline must read DEADLINE_EXCEEDED, not CANCELLED.
    let mut culprit = Session::open(d.connect().await, "hang").await.unwrap();
    let hang = culprit.register(&EmuDesign::hang(4096)).await.unwrap();
    let a = culprit.alloc_mapped(4096).await.unwrap();
    let b = culprit.alloc_mapped(4096).await.unwrap();
    let req = culprit.req(dispatch_request(hang.program_id, &[a.id, b.id]));
    let mut c = culprit.client.clone();
    let hanging = tokio::spawn(async move { c.dispatch(req).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A bare HTTP/2 client: tonic's own client would end the call at the same instant and
    // report its own CANCELLED.
    let id = s.id.to_string();
    let headers = [
        ("grpc-timeout", "200m"),
        (npu_proto::SESSION_HEADER, id.as_str()),
        (npu_proto::TOKEN_HEADER, s.token.as_str()),
    ];
    let alloc = prost::Message::encode_to_vec(&pb::AllocateTensorRequest {
        size_bytes: 4096,
        name: String::new(),
    });
    for attempt in 0..3 {
        let (code, message) =
            raw_h2_call(&d.socket, "/npud.v1.Npud/AllocateTensor", &headers, &alloc).await;
        assert_eq!(
            Code::from_i32(code),
            Code::DeadlineExceeded,
            "attempt {attempt}: {message}"
        );
    }
    // Bytes that are no protobuf, through the same bare client.
    let (code, message) =
        raw_h2_call(&d.socket, "/npud.v1.Npud/GetDeviceInfo", &[], NOT_PROTOBUF).await;
    assert_eq!(Code::from_i32(code), Code::InvalidArgument, "{message}");
    let _ = hanging.await;

    // A write-sealed memfd on the fd socket: its own status, not INTERNAL.
    let mut s2 = Session::open(d.connect().await, "sealed").await.unwrap();
    let r = s2
        .client
        .import_tensor(s2.req(pb::ImportTensorRequest {
            size_bytes: 4096,
            name: String::new(),
        }))
        .await
        .unwrap()
        .into_inner();
    let fd = npu_fd::memfd::create("sealed", 4096).unwrap();
    rustix::fs::fcntl_add_seals(&fd, rustix::fs::SealFlags::WRITE).unwrap();
    let ticket = Ticket::from_slice(&r.fd_ticket).unwrap();
    let sock = StdUnixStream::connect(&r.fd_socket).unwrap();
    match client::import(&sock, &ticket, fd.as_fd()) {
        Err(FdError::Rejected { status, message }) => {
            assert_eq!(status, FdStatus::WRITE_SEALED, "{message}");
            assert!(message.contains("F_SEAL_WRITE"), "{message}");
        }
        other => panic!("a write-sealed memfd was not refused as such: {other:?}"),
    }
    // The ticket survives the refusal: a proper memfd then goes through.
    let good = npu_fd::memfd::create("good", 4096).unwrap();
    client::import(&sock, &ticket, good.as_fd()).unwrap();

    s2.client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .expect("the daemon still serves");
    assert!(d.running());
    d.terminate();
}
