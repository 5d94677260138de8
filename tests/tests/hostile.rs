//! Hostile input gets the codes the README documents, and the daemon stays up: bytes that are
//! no protobuf, messages over the transport's limit, deadlines that pass while the device is
//! busy, a write-sealed memfd on the fd socket, and hsacos built to make a parser's cost explode
//! (issue 19: an 8 MiB file that asked npud, `npuctl inspect` and `npuctl run` for 256 GiB).

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

/// The file from issue 19: exactly 8 MiB (npud's default `limits.max_program_bytes`), an ELF64
/// whose 65535 section headers all name one string of almost 4 MiB. Copying each header's name
/// cost 65535 × 4 MiB = 256 GiB. With `aie` the headers are also AIE sections (one shared
/// 48-byte `AIEK` header), so the name lands in the "no section for this arch" message.
fn issue_19_hsaco(aie: bool) -> Vec<u8> {
    const TOTAL: usize = 8 << 20;
    let count = usize::from(u16::MAX);
    let shoff = TOTAL - count * 64;
    let stub_at = shoff - 48;
    let names = stub_at - 64;
    let mut f = vec![0u8; TOTAL];
    let put = |f: &mut [u8], at: usize, v: &[u8]| f[at..at + v.len()].copy_from_slice(v);
    put(&mut f, 0, b"\x7fELF\x02\x01\x01");
    put(&mut f, 16, &1u16.to_le_bytes());
    put(&mut f, 18, &224u16.to_le_bytes());
    put(&mut f, 40, &(shoff as u64).to_le_bytes());
    put(&mut f, 52, &64u16.to_le_bytes());
    put(&mut f, 58, &64u16.to_le_bytes());
    put(&mut f, 60, &u16::MAX.to_le_bytes());
    put(&mut f, 62, &0u16.to_le_bytes());
    f[64..64 + names - 1].fill(b'A');
    put(&mut f, stub_at, b"AIEK\x01\x00\x00\x00\x30\x00\x00\x00");
    put(&mut f, stub_at + 16, &44u32.to_le_bytes());
    for i in 0..count {
        let h = shoff + i * 64;
        let (ty, off, size) = match (i, aie) {
            (0, _) => (3u32, 64usize, names),
            (_, true) => (1, stub_at, 48),
            (_, false) => (1, 64, names),
        };
        put(&mut f, h + 4, &ty.to_le_bytes());
        put(&mut f, h + 24, &(off as u64).to_le_bytes());
        put(&mut f, h + 32, &(size as u64).to_le_bytes());
    }
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hsacos_built_to_explode_parse_costs_are_refused_and_the_daemon_stays_up() {
    let mut d = Daemon::start(Options::default());
    // 4 GB of address space: the 256 GiB the old parser asked for aborts the daemon at once
    // instead of swapping the machine; a linear parser needs a few times the 8 MiB.
    d.set_address_space(4_000_000_000);
    let mut s = Session::open(d.connect().await, "hostile-hsaco")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for aie in [false, true] {
        let bytes = issue_19_hsaco(aie);
        assert_eq!(bytes.len(), 8 << 20);
        let e = s
            .register_hsaco(bytes.clone(), "", "issue-19")
            .await
            .expect_err("no usable AIE section");
        // Without AIE sections the file is malformed; with AIE sections named for no arch it
        // is a file for another device.
        let (code, rule) = if aie {
            (
                Code::FailedPrecondition,
                "an AIE section named like the arch",
            )
        } else {
            (Code::InvalidArgument, "an AIE section (sh_size >= 48")
        };
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains("hsaco container"), "{}", e.message());
        assert!(e.message().contains(rule), "{}", e.message());
        assert!(
            e.message().len() < 4096,
            "a {}-byte message",
            e.message().len()
        );

        // npuctl reads the same file as a clear error, not an abort.
        let path = dir.path().join(format!("issue-19-{aie}.hsaco"));
        std::fs::write(&path, &bytes).unwrap();
        for args in [
            vec!["inspect".to_owned(), path.display().to_string()],
            vec![
                "--addr".to_owned(),
                format!("unix:{}", d.socket.display()),
                "run".to_owned(),
                path.display().to_string(),
                "--input".to_owned(),
                path.display().to_string(),
                "--output".to_owned(),
                dir.path().join("out").display().to_string(),
            ],
        ] {
            let out = std::process::Command::new("prlimit")
                .arg("--as=4000000000")
                .arg("--")
                .arg(npud_e2e::npuctl_binary())
                .args(&args)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "npuctl {args:?}: {out:?}");
            assert!(
                stderr.contains("hsaco container"),
                "npuctl {args:?}: {stderr}"
            );
            assert!(
                stderr.len() < 4096,
                "npuctl {args:?}: {} bytes on stderr",
                stderr.len()
            );
        }
    }
    // Still serving: a valid program registers after them.
    let design = EmuDesign::by_name("passthrough", 64, None).unwrap();
    s.register(&design)
        .await
        .expect("the daemon still registers programs");
    drop(s);
    assert!(d.running(), "npud died: {}", d.stderr());
}
