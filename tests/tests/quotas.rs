//! Limits per identity that a hostile client cannot get around: one-time tickets redeemed
//! concurrently, sessions per uid, program bytes per session, connections per peer with
//! handshake and idle timeouts, and file-descriptor exhaustion without a spinning accept loop.

#![forbid(unsafe_code)]

use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_fd::FdError;
use npu_fd::wire::{Status as FdStatus, Ticket, client};
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use npud_e2e::{Daemon, Options, Session};
use tokio::io::AsyncReadExt;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_ticket_redeemed_from_many_threads_at_once_gives_one_fd() {
    // Several I/O threads, so that the redeems are served in parallel, not one after another.
    let d = Daemon::start(Options::default().arg("--io-threads").arg("4"));
    let mut s = Session::open(d.connect().await, "race").await.unwrap();
    for round in 0..20 {
        let r = s
            .client
            .allocate_tensor(s.req(pb::AllocateTensorRequest {
                size_bytes: 4096,
                name: String::new(),
            }))
            .await
            .unwrap()
            .into_inner();
        let ticket = Ticket::from_slice(&r.fd_ticket).unwrap();
        const N: usize = 16;
        let barrier = Arc::new(Barrier::new(N));
        let threads: Vec<_> = (0..N)
            .map(|_| {
                let barrier = barrier.clone();
                let path = r.fd_socket.clone();
                std::thread::spawn(move || {
                    let sock = StdUnixStream::connect(&path).unwrap();
                    barrier.wait();
                    client::redeem_export(&sock, &ticket).map(|_| ())
                })
            })
            .collect();
        let results: Vec<Result<(), FdError>> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        let won = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {results:?}");
        for e in results.into_iter().filter_map(Result::err) {
            match e {
                FdError::Rejected { status, message } => {
                    assert_eq!(status, FdStatus::UNKNOWN_TICKET, "{message}");
                    assert!(message.contains("already redeemed"), "{message}");
                }
                other => panic!("round {round}: not a clear refusal: {other:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_uid_cannot_open_every_session() {
    let d = Daemon::start(Options::default().env("NPUD_LIMITS__MAX_SESSIONS_PER_UID", "3"));
    let mut open = Vec::new();
    for i in 0..3 {
        open.push(
            Session::open(d.connect().await, &format!("s{i}"))
                .await
                .unwrap(),
        );
    }
    let e = Session::open(d.connect().await, "one too many")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("(limits.max_sessions_per_uid)"),
        "{e:?}"
    );
    let mut first = open.remove(0);
    first
        .client
        .close_session(first.req(pb::CloseSessionRequest {}))
        .await
        .unwrap();
    Session::open(d.connect().await, "after a close")
        .await
        .expect("a closed session frees its place");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_s_program_bytes_are_bounded_and_counted_once_per_content() {
    let design = |k: i64| EmuDesign::vector_scalar_add(1 << 16, DType::I32, k);
    let probe = Daemon::start(Options::default());
    let mut p = Session::open(probe.connect().await, "probe").await.unwrap();
    let generation = p.generation().await.unwrap();
    drop(p);
    drop(probe);
    let one = design(1).to_pdi().len() + design(1).insts(generation).len();
    let quota = 2 * one + one / 2;
    let d = Daemon::start(Options::default().env(
        "NPUD_LIMITS__MAX_PROGRAM_BYTES_PER_SESSION",
        &quota.to_string(),
    ));
    let mut s = Session::open(d.connect().await, "programs").await.unwrap();
    let first = s.register(&design(1)).await.unwrap();
    s.register(&design(2)).await.unwrap();
    // The same content again costs nothing.
    s.register(&design(1)).await.unwrap();
    let e = s.register(&design(3)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message()
            .contains("(limits.max_program_bytes_per_session)"),
        "{e:?}"
    );
    // Another session has its own quota.
    let mut other = Session::open(d.connect().await, "other").await.unwrap();
    other.register(&design(3)).await.unwrap();
    // Unregistering frees the bytes.
    s.client
        .unregister_program(s.req(pb::UnregisterProgramRequest {
            program_id: first.program_id,
        }))
        .await
        .unwrap();
    s.register(&design(3)).await.unwrap();
}

/// One call on a fresh channel, bounded.
async fn call_on_new_channel(d: &Daemon) -> Result<NpudClient<tonic::transport::Channel>, String> {
    let attempt = async {
        let mut c = d.connect().await;
        c.get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .map(|_| c)
            .map_err(|e| format!("{:?}: {}", e.code(), e.message()))
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .unwrap_or_else(|_| Err("timed out without an answer".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_peer_are_limited_and_silent_ones_are_closed() {
    let d = Daemon::start(
        Options::default()
            .env("NPUD_LIMITS__MAX_CONNECTIONS_PER_PEER", "4")
            .env("NPUD_LIMITS__HANDSHAKE_TIMEOUT_MS", "300"),
    );
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(call_on_new_channel(&d).await.expect("within the limit"));
    }
    let e = call_on_new_channel(&d).await.unwrap_err();
    assert!(e.starts_with("ResourceExhausted"), "{e}");
    assert!(e.contains("(limits.max_connections_per_peer)"), "{e}");
    // The fd socket shares the count and says so in its own status.
    let sock = StdUnixStream::connect(&d.fd_socket).unwrap();
    match client::redeem_export(&sock, &Ticket::from_bytes([0; 16])) {
        Err(FdError::Rejected { status, message }) => {
            assert_eq!(status, FdStatus::RESOURCE_EXHAUSTED, "{message}");
            assert!(
                message.contains("limits.max_connections_per_peer"),
                "{message}"
            );
        }
        other => panic!("the fd socket took a connection over the limit: {other:?}"),
    }
    held.pop();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match call_on_new_channel(&d).await {
            Ok(c) => {
                held.push(c);
                break;
            }
            Err(e) => assert!(Instant::now() < until, "no place after a close: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(held);

    // A connection that never sends the HTTP/2 preface is closed after the handshake
    // timeout, on both sockets.
    for path in [&d.socket, &d.fd_socket] {
        let mut silent = tokio::net::UnixStream::connect(path).await.unwrap();
        let started = Instant::now();
        let mut buf = [0_u8; 1024];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match silent.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "{}: a silent connection was still open after 5 s",
            path.display()
        );
        assert!(started.elapsed() >= Duration::from_millis(250));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let d = Daemon::start(Options::default().env("NPUD_LIMITS__IDLE_TIMEOUT_MS", "500"));
    let mut c = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut c, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // An empty SETTINGS frame completes the client's side of the handshake.
    tokio::io::AsyncWriteExt::write_all(&mut c, &[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0_u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "an idle connection was still open after 5 s"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
}

/// Issue 20: a connection that never opens a session is closed after
/// `limits.idle_connection_ms` even while it sends HTTP/2 PINGs (which keep it within
/// `limits.idle_timeout_ms`), so peers that open no session cannot hold a connection pool; a
/// connection with a session, or with a call open, is not idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_session_or_a_call_is_closed_even_while_it_pings() {
    use tokio::io::AsyncWriteExt;
    let d = Daemon::start(Options::default().env("NPUD_LIMITS__IDLE_CONNECTION_MS", "500"));
    let s = Session::open(d.connect().await, "kept").await.unwrap();
    let mut watch = tonic_health::pb::health_client::HealthClient::new(d.channel().await)
        .watch(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(watch.message().await.unwrap().is_some(), "the first status");

    let mut c = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let started = Instant::now();
    let (mut rd, mut wr) = c.into_split();
    let pings = tokio::spawn(async move {
        // A PING every 100 ms: 8 bytes of payload on stream 0.
        let ping = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        while wr.write_all(&ping).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = [0_u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    pings.abort();
    assert!(
        closed.is_ok(),
        "a pinging connection without a session was still open after 5 s"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));

    // By now the session's connection and the health watch's have been quiet as long: both
    // are still open.
    let stats = d
        .connect()
        .await
        .get_statistics(pb::GetStatisticsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mine = stats
        .sessions
        .iter()
        .find(|x| x.session_id == s.id)
        .expect("the session");
    assert!(
        mine.connected,
        "the session's connection was closed: {mine:?}"
    );
    let next = tokio::time::timeout(Duration::from_millis(300), watch.message()).await;
    assert!(next.is_err(), "the open watch ended: {next:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_daemon_says_so_does_not_spin_and_recovers() {
    let mut d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "before").await.unwrap();
    s.generation().await.unwrap();
    // Room for a handful of connections past what the daemon holds now.
    let limit = d.open_fds() as u64 + 6;
    d.set_nofile(limit);

    let mut held = Vec::new();
    let refusal = loop {
        assert!(held.len() < 64, "no refusal after 64 connections");
        match call_on_new_channel(&d).await {
            Ok(c) => held.push(c),
            Err(e) => break e,
        }
    };
    assert!(refusal.starts_with("ResourceExhausted"), "{refusal}");
    assert!(refusal.contains("out of file descriptors"), "{refusal}");
    assert!(refusal.contains("RLIMIT_NOFILE"), "{refusal}");
    // A tensor allocation on a connection that was already open fails for the same cause, and
    // says so rather than blaming device memory.
    let mut tensors = Vec::new();
    let alloc = loop {
        assert!(
            tensors.len() < 64,
            "64 tensors allocated with no descriptors left"
        );
        let r = s
            .client
            .allocate_tensor(s.req(pb::AllocateTensorRequest {
                size_bytes: 4096,
                name: String::new(),
            }))
            .await;
        match r {
            Ok(t) => tensors.push(t),
            Err(e) => break e,
        }
    };
    assert_eq!(alloc.code(), Code::ResourceExhausted, "{alloc:?}");
    assert!(
        alloc.message().contains("out of file descriptors"),
        "{alloc:?}"
    );
    assert!(!alloc.message().contains("out of memory"), "{alloc:?}");

    // Keep connections waiting in the backlog, so that every accept fails while we measure.
    let waiting: Vec<StdUnixStream> = (0..8)
        .map(|_| StdUnixStream::connect(&d.socket).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ticks_per_s = rustix::param::clock_ticks_per_second();
    let before = d.cpu_ticks();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = d.cpu_ticks() - before;
    assert!(
        used * 10 < ticks_per_s * 3,
        "the daemon used {used} of {ticks_per_s} clock ticks in a second while refusing"
    );
    assert!(d.running());

    drop(waiting);
    drop(held);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match call_on_new_channel(&d).await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < until, "not serving again: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d.stderr().contains("out of file descriptors"));
    d.terminate();
}

/// A raw TCP connection to `to` from the loopback address `from`, that has sent the HTTP/2
/// client preface and an empty SETTINGS frame (so it is past the pre-authentication pool) and
/// then stays idle.
async fn idle_http2_from(
    from: std::net::Ipv4Addr,
    to: std::net::SocketAddr,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind((from, 0).into()).unwrap();
    let mut s = sock.connect(to).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    s
}

/// Issue 20, finding 1: idle TCP connections from many loopback addresses used up the one
/// connection count every listener shared, and Unix-socket users and the fd socket were refused.
/// Now TCP peers have a pool of their own, counted per network prefix, or per uid for a local
/// user the kernel names (every loopback address is the same user's), and local users keep
/// theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_peers_from_many_addresses_cannot_lock_out_local_users() {
    let d = Daemon::start(Options {
        tcp: true,
        ..Options::default()
            .env("NPUD_LIMITS__MAX_CONNECTIONS", "16")
            .env("NPUD_LIMITS__MAX_CONNECTIONS_PER_PEER", "16")
            .env("NPUD_LIMITS__MAX_TCP_CONNECTIONS_PER_PREFIX", "8")
            .env("NPUD_LIMITS__MAX_PREAUTH_CONNECTIONS_PER_PREFIX", "4")
    });
    let to = d.tcp.expect("the daemon listens on TCP");
    // 8 addresses × 16 connections that finished their preface, then 8 × 16 that never start
    // (which the pre-authentication pool closes past 4): far more than the local pool's 16.
    let mut held = Vec::new();
    for host in 1..=8_u8 {
        for _ in 0..16 {
            held.push(idle_http2_from(std::net::Ipv4Addr::new(127, 0, 0, host), to).await);
        }
    }
    // A TCP caller from the full network is told which limit it met (once a place to be told
    // in is free: at most 16 refused connections are held at once, each for 2 s).
    let until = Instant::now() + Duration::from_secs(10);
    let e = loop {
        let attempt = async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{to}"))
                .unwrap()
                .connect()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            NpudClient::new(channel)
                .get_device_info(pb::GetDeviceInfoRequest {})
                .await
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Err(e)) if e.code() == Code::ResourceExhausted => break e,
            other => {
                assert!(Instant::now() < until, "never told why: {other:?}");
                // Served: on a loaded machine the daemon may not have read some idle
                // connections' prefaces within the handshake deadline and closed them. Fill
                // the network's pool again.
                for host in 1..=8_u8 {
                    held.push(idle_http2_from(std::net::Ipv4Addr::new(127, 0, 0, host), to).await);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // Every loopback address the test connects from is its own uid's.
    let me = rustix::process::getuid().as_raw();
    assert!(
        e.message()
            .starts_with(&format!("uid {me} (over TCP from 127.0.0."))
            && e.message()
                .contains("(limits.max_tcp_connections_per_prefix)"),
        "{}",
        e.message()
    );
    for host in 1..=8_u8 {
        for _ in 0..16 {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind((std::net::Ipv4Addr::new(127, 0, 0, host), 0).into())
                .unwrap();
            held.push(sock.connect(to).await.unwrap());
        }
    }
    // Local users: a gRPC call, a session, and the fd socket.
    let mut s = Session::open(d.connect().await, "local")
        .await
        .expect("a Unix-socket user is served while TCP peers hold connections");
    let t = s
        .client
        .allocate_tensor(s.req(pb::AllocateTensorRequest {
            size_bytes: 4096,
            name: String::new(),
        }))
        .await
        .expect("an allocation on the Unix socket");
    let sock = StdUnixStream::connect(&d.fd_socket).unwrap();
    client::redeem_export(
        &sock,
        &Ticket::from_slice(&t.into_inner().fd_ticket).unwrap(),
    )
    .expect("the fd socket serves local users");

    drop(held);
}
