//! The daemon's own life, against callers who do not help: signals from the first instant,
//! SIGTERM with idle streams open, an fd whose close blocks, and memory held after a load.
//! Part of the reliability suite; each test is bounded to tens of seconds.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session, binary, with_session};
use tokio_stream::StreamExt;
use tonic::Code;

/// Whether `/proc/PID/status` says the process catches signal `sig`.
fn catches(pid: u32, sig: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

#[test]
fn sighup_from_the_first_instant_never_kills_npud() {
    const TRIES: usize = 12;
    for i in 0..TRIES {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let mut child = Command::new(binary("npud"))
            .args(["--backend", "emulator", "--socket"])
            .arg(dir.path().join("s"))
            .arg("--fd-socket")
            .arg(dir.path().join("f"))
            .arg("--ready-file")
            .arg(&ready)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env_remove("NPUD_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("npud starts");
        let pid = child.id();
        // The first thing the daemon does that can be seen from outside is creating its state
        // directory, after the configuration and logging: SIGHUP from then on, again and
        // again until the daemon is ready (or has died). The daemon that caught signals only
        // once it served died here every time. (Racing the exec itself is no test: the
        // microseconds before main cannot be covered by safe code, and on a loaded machine
        // they stretch.)
        let state = dir.path().join("state");
        let until = Instant::now() + Duration::from_secs(30);
        while !state.exists() && Instant::now() < until {
            if child.try_wait().unwrap().is_some() {
                break;
            }
        }
        let hup_caught = catches(pid, 1);
        let mut sent = 0;
        while !ready.exists() && Instant::now() < until {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            npud_e2e::signal(&child, rustix::process::Signal::HUP);
            sent += 1;
            std::thread::sleep(Duration::from_micros(200));
        }
        let died = child.try_wait().unwrap();
        assert!(
            died.is_none(),
            "try {i}: npud died during start-up after {sent} SIGHUPs (SIGHUP caught when the \
             first was sent: {hup_caught}): {died:?}"
        );
        assert!(ready.exists(), "try {i}: npud not ready in 30 s");
        npud_e2e::signal(&child, rustix::process::Signal::TERM);
        let until = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < until, "try {i}: no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "try {i}: {status:?}");
    }
}

#[test]
fn a_sigterm_at_start_up_ends_npud_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(binary("npud"))
        .args(["--backend", "emulator", "--socket"])
        .arg(dir.path().join("s"))
        .arg("--fd-socket")
        .arg(dir.path().join("f"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("npud starts");
    let until = Instant::now() + Duration::from_secs(30);
    // SIGTERM once its handler is in (npud installs SIGHUP's, then SIGTERM's: waiting for
    // SIGHUP's alone raced the second).
    while !catches(child.id(), 15) && Instant::now() < until {}
    npud_e2e::signal(&child, rustix::process::Signal::TERM);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "no exit after an early SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
}

async fn session(d: &Daemon) -> Session {
    Session::open(d.connect().await, "lifecycle").await.unwrap()
}

/// A streaming request with the session's metadata.
fn streaming<T>(s: &Session, stream: T) -> tonic::Request<T> {
    with_session(stream, s.id, &s.token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_only_idle_streams_exits_promptly_and_ends_them_with_unavailable() {
    // The close grace is longer than the default 300 ms so that this test's reader, which reads
    // only once it has seen the daemon end the calls, keeps its connection on a loaded machine.
    let mut d = Daemon::start(
        Options::default()
            .env("NPUD_SHUTDOWN__DRAIN_TIMEOUT_MS", "60000")
            .env("NPUD_SHUTDOWN__CLOSE_GRACE_MS", "2000"),
    );
    let mut s = session(&d).await;
    // Remote-style tensors (the harness's Session is on the Unix socket, but WriteTensor and
    // ReadTensor work for any caller).
    let size = 8u64 << 20;
    let t = s
        .client
        .allocate_tensor(s.req(pb::AllocateTensorRequest {
            size_bytes: size,
            name: "idle".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .tensor_id;

    // An idle Submit: the stream is open, nothing was sent.
    let (submit_tx, submit_rx) = tokio::sync::mpsc::channel::<pb::SubmitRequest>(1);
    let mut submit_client = s.client.clone();
    let submit = streaming(&s, tokio_stream::wrappers::ReceiverStream::new(submit_rx));
    let submit = tokio::spawn(async move {
        let mut responses = submit_client.submit(submit).await?.into_inner();
        match responses.next().await {
            Some(Err(st)) => Err(st),
            other => Ok(format!("{other:?}")),
        }
    });

    // An idle WriteTensor: the first chunk names the tensor, then nothing.
    let (write_tx, write_rx) = tokio::sync::mpsc::channel::<pb::WriteTensorChunk>(1);
    write_tx
        .send(pb::WriteTensorChunk {
            tensor_id: t,
            offset: 0,
            data: vec![1; 4096],
        })
        .await
        .unwrap();
    let mut write_client = s.client.clone();
    let write = streaming(&s, tokio_stream::wrappers::ReceiverStream::new(write_rx));
    let write = tokio::spawn(async move { write_client.write_tensor(write).await });

    // A ReadTensor nobody reads.
    let mut read = s
        .client
        .read_tensor(s.req(pb::ReadTensorRequest {
            tensor_id: t,
            offset: 0,
            length: 0,
            chunk_bytes: 1 << 20,
        }))
        .await
        .unwrap()
        .into_inner();

    // A connection that sent only the HTTP/2 preface.
    let mut preface = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();

    // Let every call reach its handler and go quiet.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let asked = Instant::now();
    d.send_signal(rustix::process::Signal::TERM);

    // The unread ReadTensor gets its UNAVAILABLE once its caller reads again, after the
    // daemon ended the idle calls and before it closes their connections.
    let stderr_until = Instant::now() + Duration::from_secs(10);
    while !d
        .stderr()
        .contains("ending the calls that wait for their callers")
    {
        assert!(
            Instant::now() < stderr_until,
            "the daemon did not end its idle calls:\n{}",
            d.stderr()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let read_end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match read.next().await {
                Some(Ok(_)) => {}
                Some(Err(st)) => break Some(st),
                None => break None,
            }
        }
    })
    .await
    .expect("the ReadTensor stream ends");

    let status = tokio::task::spawn_blocking(move || {
        let s = d.wait_exit(Duration::from_secs(10));
        (s, d)
    })
    .await
    .unwrap();
    let (exit, d) = status;
    let took = asked.elapsed();
    assert!(
        exit.is_some_and(|s| s.success()),
        "npud did not exit cleanly within 10 s of SIGTERM (the drain timeout is 60 s): \
         {exit:?}\n{}",
        d.stderr()
    );
    eprintln!(
        "SIGTERM to exit with four idle streams: {} ms",
        took.as_millis()
    );

    let submit = tokio::time::timeout(Duration::from_secs(10), submit)
        .await
        .expect("Submit ends")
        .unwrap();
    assert_eq!(
        submit.as_ref().err().map(tonic::Status::code),
        Some(Code::Unavailable),
        "Submit: {submit:?}"
    );
    let write = tokio::time::timeout(Duration::from_secs(10), write)
        .await
        .expect("WriteTensor ends")
        .unwrap();
    assert_eq!(
        write.as_ref().err().map(tonic::Status::code),
        Some(Code::Unavailable),
        "WriteTensor: {write:?}"
    );
    assert_eq!(
        read_end.as_ref().map(tonic::Status::code),
        Some(Code::Unavailable),
        "ReadTensor: {read_end:?}"
    );
    drop((submit_tx, write_tx, preface));
}

/// A TCP socket whose last close blocks for `linger`: its send queue is full (the peer never
/// reads) and `SO_LINGER` makes close wait for the queue to drain.
fn lingering_socket(
    linger: Duration,
) -> (
    std::net::TcpStream,
    std::net::TcpStream,
    std::net::TcpListener,
) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sock = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (peer, _) = listener.accept().unwrap();
    rustix::net::sockopt::set_socket_recv_buffer_size(&peer, 4096).unwrap();
    sock.set_nonblocking(true).unwrap();
    let chunk = vec![0u8; 64 << 10];
    let mut w = &sock;
    loop {
        match w.write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the socket: {e}"),
        }
    }
    rustix::net::sockopt::set_socket_linger(&sock, Some(linger)).unwrap();
    (sock, peer, listener)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fd_whose_close_blocks_stalls_no_other_caller() {
    // One I/O thread: on the old code a blocked close there stalled every caller.
    let d = Daemon::start(Options::default().arg("--io-threads").arg("1"));
    let mut s = session(&d).await;
    let (sock, peer, _listener) = lingering_socket(Duration::from_secs(30));

    // An IMPORT frame with the socket attached to its first byte; the rest is sent after this
    // process has closed its own copy, so that the daemon's close is the last one.
    let fds = std::os::unix::net::UnixStream::connect(&d.fd_socket).unwrap();
    let frame = npu_fd::wire::Request {
        op: npu_fd::wire::Op::Import,
        ticket: npu_fd::wire::Ticket::from_bytes([7; 16]),
    }
    .encode();
    {
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        let attached = [sock.as_fd()];
        assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&attached)));
        let n = rustix::net::sendmsg(
            &fds,
            &[std::io::IoSlice::new(&frame[..1])],
            &mut control,
            rustix::net::SendFlags::NOSIGNAL,
        )
        .unwrap();
        assert_eq!(n, 1);
    }
    drop(sock);
    (&fds).write_all(&frame[1..]).unwrap();
    let mut answer = [0u8; npu_fd::wire::RESPONSE_LEN];
    (&fds).read_exact(&mut answer).unwrap();
    let answer = npu_fd::wire::Response::decode(&answer).unwrap();
    assert_eq!(
        answer.status,
        npu_fd::wire::Status::UNKNOWN_TICKET,
        "{answer:?}"
    );
    // The daemon now closes the socket, which blocks for up to 30 s.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let other = tokio::time::timeout(Duration::from_secs(10), async {
        for _ in 0..5 {
            s.client
                .get_device_info(pb::GetDeviceInfoRequest {})
                .await
                .unwrap();
            let mut other = session(&d).await;
            other
                .client
                .allocate_tensor(other.req(pb::AllocateTensorRequest {
                    size_bytes: 4096,
                    name: "bystander".into(),
                }))
                .await
                .unwrap();
        }
    })
    .await;
    assert!(
        other.is_ok(),
        "other callers were stalled while the daemon closed a client's lingering socket"
    );
    eprintln!(
        "five bystander rounds during a 30 s blocking close: {} ms",
        started.elapsed().as_millis()
    );
    // The daemon still answers the fd socket too.
    drop(fds);
    drop(peer);
}

/// The daemon's resident set, in KiB (`VmRSS` of `/proc/PID/status`).
fn rss_kib(d: &Daemon) -> u64 {
    let pid = d.pid().expect("the daemon runs");
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_budget_refuses_naming_its_key_and_rss_returns_near_baseline() {
    let d = Daemon::start(
        Options::default()
            .env(
                "NPUD_LIMITS__MAX_TOTAL_TENSOR_BYTES",
                &(192 * MIB).to_string(),
            )
            .env("NPUD_LIMITS__MAX_TOTAL_PROGRAM_BYTES", "4096")
            .env(
                "NPUD_LIMITS__MAX_QUEUED_REQUEST_BYTES",
                &(8 * MIB).to_string(),
            ),
    );
    let mut s = session(&d).await;
    let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    s.register(&design).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = rss_kib(&d);

    // The load: tensors up to the budget, written and read back through the API (16 MiB
    // messages), from two sessions.
    let mut other = session(&d).await;
    let mut tensors = Vec::new();
    let mut peak = baseline;
    for i in 0..3usize {
        let sess = if i == 1 { &mut other } else { &mut s };
        let t = sess
            .client
            .allocate_tensor(sess.req(pb::AllocateTensorRequest {
                size_bytes: 64 * MIB,
                name: format!("load{i}"),
            }))
            .await
            .unwrap()
            .into_inner()
            .tensor_id;
        // 2 MiB chunks: each chunk is charged to the 8 MiB queued budget while the handler
        // writes it (its bytes and its decoded copy).
        let chunks: Vec<pb::WriteTensorChunk> = (0..32)
            .map(|c| pb::WriteTensorChunk {
                tensor_id: t,
                offset: c * 2 * MIB,
                data: vec![u8::try_from(i).unwrap() + 1; usize::try_from(2 * MIB).unwrap()],
            })
            .collect();
        let w = with_session(tokio_stream::iter(chunks), sess.id, &sess.token);
        sess.client.write_tensor(w).await.unwrap();
        let mut r = sess
            .client
            .read_tensor(sess.req(pb::ReadTensorRequest {
                tensor_id: t,
                offset: 0,
                length: 0,
                chunk_bytes: 0,
            }))
            .await
            .unwrap()
            .into_inner();
        let mut got = 0u64;
        while let Some(c) = r.next().await {
            got += c.unwrap().data.len() as u64;
        }
        assert_eq!(got, 64 * MIB);
        peak = peak.max(rss_kib(&d));
        tensors.push((i, t));
    }

    // Past the daemon-wide tensor budget (each session's own quota is 4 GiB).
    let e = other
        .client
        .allocate_tensor(other.req(pb::AllocateTensorRequest {
            size_bytes: 64 * MIB + 1,
            name: "past".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("limits.max_total_tensor_bytes"),
        "{e:?}"
    );

    // Past the program budget: distinct designs until the store's bytes pass 4096.
    let mut refused = None;
    for n in 2..200u32 {
        match other
            .register(&EmuDesign::vector_scalar_add(
                1024,
                DType::I32,
                i64::from(n),
            ))
            .await
        {
            Ok(_) => {}
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("the program budget refuses at last");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("limits.max_total_program_bytes"),
        "{e:?}"
    );

    // Past the queued-request budget: a 12 MiB request (within limits.max_message_bytes)
    // would hold more than the 8 MiB all unanswered requests may.
    let e = other
        .client
        .register_program(other.req(pb::RegisterProgramRequest {
            pdi: vec![0u8; usize::try_from(12 * MIB).unwrap()],
            insts: vec![0; 4],
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("limits.max_queued_request_bytes"),
        "{e:?}"
    );
    peak = peak.max(rss_kib(&d));

    // Work ends: every tensor freed.
    for (i, t) in tensors {
        let sess = if i == 1 { &mut other } else { &mut s };
        let req = sess.req(pb::FreeTensorRequest { tensor_id: t });
        sess.client.free_tensor(req).await.unwrap();
    }
    // RSS back near its baseline (memory, not time: polled for up to 15 s).
    let bound = baseline + 64 * 1024;
    let until = Instant::now() + Duration::from_secs(15);
    let mut after = rss_kib(&d);
    while after > bound && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        after = rss_kib(&d);
    }
    eprintln!(
        "npud VmRSS: baseline {} MiB, peak {} MiB, after {} MiB (bound {} MiB)",
        baseline / 1024,
        peak / 1024,
        after / 1024,
        bound / 1024
    );
    assert!(
        peak > baseline + 64 * 1024,
        "the load did not raise RSS ({baseline} -> {peak} KiB): the test measures nothing"
    );
    assert!(
        after <= bound,
        "RSS stayed at {after} KiB after the load (baseline {baseline} KiB, peak {peak} KiB)"
    );
}

/// A daemon that begins shutting down just as a client's first call arrives: the first
/// connection at the returned socket reads the client's preface and frames as HTTP/2 and, when
/// the call's HEADERS frame arrives, answers GOAWAY (last stream 0, `NO_ERROR`), the server's
/// graceful refusal of a stream it will not process, and closes; or, with `!go_away`, is
/// closed as soon as it is accepted (a daemon that exits with a connection it accepted and
/// never served). Later connections are passed to `daemon`, as socket activation hands the
/// next connection to the next daemon. Counts the refused calls.
async fn refuse_first(
    dir: &std::path::Path,
    daemon: std::path::PathBuf,
    go_away: bool,
) -> (
    std::path::PathBuf,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let path = dir.join("go-away.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let refused = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = refused.clone();
    tokio::spawn(async move {
        let (mut first, _) = listener.accept().await.unwrap();
        if !go_away {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(first);
            return proxy(listener, daemon).await;
        }
        let mut preface = [0u8; 24];
        first.read_exact(&mut preface).await.unwrap();
        assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        // An empty SETTINGS: the server's preface.
        first.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        loop {
            let mut head = [0u8; 9];
            first.read_exact(&mut head).await.unwrap();
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            first.read_exact(&mut payload).await.unwrap();
            match (head[3], head[4]) {
                // SETTINGS, not an ACK: acknowledge it.
                (4, flags) if flags & 1 == 0 => {
                    first.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await.unwrap();
                }
                // HEADERS: the call. GOAWAY, last stream 0, NO_ERROR.
                (1, _) => {
                    let mut go_away = vec![0, 0, 8, 7, 0, 0, 0, 0, 0];
                    go_away.extend_from_slice(&[0; 8]);
                    first.write_all(&go_away).await.unwrap();
                    counted.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                _ => {}
            }
        }
        drop(first);
        proxy(listener, daemon).await;
    });
    (path, refused)
}

/// Passes every connection `listener` accepts to the socket at `daemon`.
async fn proxy(listener: tokio::net::UnixListener, daemon: std::path::PathBuf) {
    loop {
        let (mut c, _) = listener.accept().await.unwrap();
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let mut d = tokio::net::UnixStream::connect(&daemon).await.unwrap();
            let _ = tokio::io::copy_bidirectional(&mut c, &mut d).await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_call_a_stopping_daemon_refused_or_dropped_is_sent_again_on_a_new_connection() {
    let d = Daemon::start(Options::default());
    for go_away in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (path, refused) = refuse_first(dir.path(), d.socket.clone(), go_away).await;
        let addr = format!("unix:{}", path.display());
        let out = tokio::process::Command::new(npud_e2e::npuctl_binary())
            .args(["--addr", &addr, "status", "--json"])
            .env_remove("NPUD_ADDR")
            .output()
            .await
            .unwrap();
        assert_eq!(refused.load(std::sync::atomic::Ordering::SeqCst), 1);
        let how = if go_away {
            "a GOAWAY"
        } else {
            "a dropped connection"
        };
        assert!(
            out.status.success(),
            "npuctl status after {how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(status.get("device").is_some(), "{how}: {status}");
    }
}
