//! What a new user or an outside gRPC client meets first: a start that logs no warning (and no
//! colour escapes into a file), a second daemon beside the first, compressed requests, ReadTensor chunks a client with default limits can receive, and an
//! ended session that says how it ended.

#![forbid(unsafe_code)]

use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use npud_e2e::{Daemon, Options, Runtime, Session};
use tokio_stream::StreamExt;
use tonic::codec::CompressionEncoding;

/// Lines of the daemon's log at WARN or above.
fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_start_logs_no_warning_and_keeps_the_probe_evidence() {
    for runtime in [Runtime::Linked, Runtime::Loaded] {
        let opts = Options {
            runtime,
            ..Options::default()
        };
        let mut d = Daemon::start(opts);
        let mut c = d.connect().await;
        let info = c
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.packet_abi, "g2", "{info:?}");
        // The evidence: the code object the runtime refused, and what proved G2.
        assert!(
            info.packet_abi_source.contains("loads no AIE code object")
                && info.packet_abi_source.contains("the code object:"),
            "{}",
            info.packet_abi_source
        );
        drop(c);
        d.terminate();
        let log = d.stderr();
        assert!(log.contains("chose the packet ABI"), "{log}");

        let w = warnings(&log);
        assert!(w.is_empty(), "a normal start ({runtime:?}) warned: {w:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_and_deflate_requests_are_accepted_within_the_size_limit() {
    let d = Daemon::start(Options::default().env("NPUD_LIMITS__MAX_MESSAGE_BYTES", "65536"));
    for enc in [CompressionEncoding::Gzip, CompressionEncoding::Deflate] {
        let client = NpudClient::new(d.channel().await)
            .send_compressed(enc)
            .max_encoding_message_size(usize::MAX);
        let mut s = Session::open(client, "compressed").await.unwrap();
        let info = s
            .client
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        let max = info.limits.unwrap().max_message_bytes;
        assert_eq!(max, 65536);
        let t = s
            .client
            .allocate_tensor(s.req(pb::AllocateTensorRequest {
                size_bytes: 4096,
                name: String::new(),
            }))
            .await
            .unwrap()
            .into_inner();
        let chunk = |len: usize| pb::WriteTensorChunk {
            tensor_id: t.tensor_id,
            offset: 0,
            data: vec![5; len],
        };
        let r = s
            .client
            .write_tensor(s.req(tokio_stream::iter(vec![chunk(4096)])))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.bytes_written, 4096, "{enc:?}");
        // A message that compresses to a few KiB but decompresses past the limit is refused
        // without inflating it whole.
        let big = usize::try_from(3 * max).unwrap();
        let e = s
            .client
            .write_tensor(s.req(tokio_stream::iter(vec![chunk(big)])))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{enc:?}: {e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_tensor_chunks_fit_a_default_client_whatever_chunk_bytes_asks() {
    let d = Daemon::start(Options::default());
    // tonic's client, as grpc-go, grpcio and grpc-js, receives at most 4 MiB by default.
    let mut s = Session::open(d.connect().await, "chunks").await.unwrap();
    const SIZE: u64 = 9 << 20;
    let t = s
        .client
        .allocate_tensor(s.req(pb::AllocateTensorRequest {
            size_bytes: SIZE,
            name: String::new(),
        }))
        .await
        .unwrap()
        .into_inner();
    for ask in [0, 8 << 20, u32::MAX] {
        let mut stream = s
            .client
            .read_tensor(s.req(pb::ReadTensorRequest {
                tensor_id: t.tensor_id,
                offset: 0,
                length: 0,
                chunk_bytes: ask,
            }))
            .await
            .unwrap()
            .into_inner();
        let (mut got, mut largest) = (0u64, 0usize);
        while let Some(c) = stream.next().await {
            let c = c.unwrap_or_else(|e| panic!("chunk_bytes {ask}: {e:?}"));
            assert_eq!(c.offset, got);
            got += c.data.len() as u64;
            largest = largest.max(c.data.len());
        }
        assert_eq!(got, SIZE, "chunk_bytes {ask}");
        assert!(largest < 4 << 20, "chunk_bytes {ask}: a chunk of {largest}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_session_says_it_was_closed_not_that_its_grace_period_passed() {
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "closed").await.unwrap();
    s.client
        .close_session(s.req(pb::CloseSessionRequest {}))
        .await
        .unwrap();
    let e = s
        .client
        .allocate_tensor(s.req(pb::AllocateTensorRequest {
            size_bytes: 64,
            name: String::new(),
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert_eq!(
        e.message(),
        format!("session {} was closed (CloseSession): open a new one", s.id)
    );

    // A session whose only connection is gone for the grace period says that.
    let d = Daemon::start(Options {
        grace_ms: 300,
        ..Options::default()
    });
    let s = Session::open(d.connect().await, "expired").await.unwrap();
    let (id, token) = (s.id, s.token.clone());
    drop(s);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let mut c = d.connect().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let e = loop {
        let e = c
            .allocate_tensor(npud_e2e::with_session(
                pb::AllocateTensorRequest {
                    size_bytes: 64,
                    name: String::new(),
                },
                id,
                &token,
            ))
            .await;
        match e {
            Err(e) if e.code() == tonic::Code::Unauthenticated => break e,
            _ => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the session never ended"
                );
                // A connection that uses the session keeps it: use a fresh one each try.
                c = d.connect().await;
                tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
            }
        }
    };
    assert!(
        e.message().starts_with(&format!(
            "session {id} ended after 300 ms without a connection"
        )),
        "{e:?}"
    );
}

/// Starts `npud --socket SOCKET --state-dir ""` with only those (as a person would run a second
/// daemon), waiting for its ready file.
fn plain_npud(dir: &std::path::Path, name: &str) -> std::process::Child {
    let ready = dir.join(format!("{name}.ready"));
    let mut c = std::process::Command::new(npud_e2e::binary("npud"));
    c.arg("--socket")
        .arg(dir.join(format!("{name}.sock")))
        .args(["--state-dir", ""])
        .arg("--ready-file")
        .arg(&ready)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap());
    for (k, _) in std::env::vars() {
        if k.starts_with("NPUD_") {
            c.env_remove(&k);
        }
    }
    // As a person starts it: no NO_COLOR (the harness's daemons get one).
    c.env_remove("NO_COLOR");
    let mut child = c.spawn().unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ready.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "npud {name} exited ({status}): {}",
                std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
            );
        }
        assert!(std::time::Instant::now() < until, "npud {name} not ready");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
}

#[test]
fn two_daemons_given_two_sockets_get_two_fd_sockets_state_dir_empty_is_accepted_and_logs_are_plain()
{
    let dir = tempfile::tempdir().unwrap();
    let mut a = plain_npud(dir.path(), "a");
    // The second one's fd socket was the first one's default, and it failed to bind.
    let mut b = plain_npud(dir.path(), "b");
    for name in ["a", "b"] {
        assert!(
            dir.path().join(format!("{name}.fd.sock")).exists(),
            "{name}"
        );
        // Tensors shared by fd: the daemon's fd socket answers.
        let out = std::process::Command::new(npud_e2e::npuctl_binary())
            .arg("--addr")
            .arg(format!(
                "unix:{}",
                dir.path().join(format!("{name}.sock")).display()
            ))
            .args(["emu-design", "passthrough", "--out"])
            .arg(dir.path().join(format!("design-{name}")))
            .env_remove("NPUD_ADDR")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let input = dir.path().join("in.bin");
        std::fs::write(&input, vec![7u8; 4096]).unwrap();
        let out = std::process::Command::new(npud_e2e::npuctl_binary())
            .arg("--addr")
            .arg(format!(
                "unix:{}",
                dir.path().join(format!("{name}.sock")).display()
            ))
            .arg("run")
            .arg(dir.path().join(format!("design-{name}")))
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(dir.path().join(format!("out-{name}.bin")))
            .env_remove("NPUD_ADDR")
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("fd-shared tensors"),
            "{out:?}"
        );
    }
    let log = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    assert!(log.contains("quarantine is kept in memory only"), "{log}");
    // stderr is a file, not a terminal: plain text, no colour escapes.
    assert!(
        !log.contains('\x1b'),
        "colour escapes in a log file: {log:?}"
    );
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
