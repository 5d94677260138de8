//! An I/O plane no client can hold: the ring's lifeline and the fd socket's frames. Fds a client
//! attaches are closed by the daemon, and the last close of a loopback TCP socket with
//! `SO_LINGER` and undeliverable data blocks for as long as the client chose; a frame may carry
//! more fds than the daemon makes room for (`FDS_PER_RECV`), which the kernel then closes inside
//! the daemon's `recvmsg`; and a client may write bytes into its lifeline without pause. The
//! documented answers (`proto/npud/v1/ring.md`, `fdsocket.md`): bytes and fds on a lifeline are
//! ignored and the ring keeps serving; a frame with more than one fd is `MALFORMED`.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_fd::wire::{Op, RESPONSE_LEN, Request, Response, Status as FdStatus, Ticket};
use npud_e2e::bystander::Stand;
use npud_e2e::bystander::fds::{borrowed, lingering, send_with_fds};
use npud_e2e::{Mapped, Options, Session};

/// How long a lingering socket's close blocks.
const LINGER: Duration = Duration::from_secs(5);
/// How long the byte-writing clients write.
const FLOOD: Duration = Duration::from_secs(3);

/// Closes this process's copies of sockets that were sent on a thread of their own: when the
/// daemon closed its copies first, this close is the last and blocks, which must not hold the
/// attack's timing.
fn closed_elsewhere(socks: Vec<std::net::TcpStream>) {
    std::thread::spawn(move || drop(socks));
}

/// A session with a ring attached, a program and its two tensors.
struct Ringed {
    s: Session,
    program: u64,
    a: Mapped,
    b: Mapped,
}

async fn ringed(stand: &Stand, n: usize) -> Vec<Ringed> {
    let mut out = Vec::new();
    for i in 0..n {
        let mut s = Session::open(stand.daemon.connect().await, &format!("ringed-{i}"))
            .await
            .unwrap();
        let program = s
            .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
            .await
            .unwrap()
            .program_id;
        let a = s.alloc_mapped(4096).await.unwrap();
        let b = s.alloc_mapped(4096).await.unwrap();
        if s.ring.is_none() {
            s.attach_ring().await.unwrap();
        }
        s.dispatch(program, &[a.id, b.id]).await.unwrap();
        out.push(Ringed { s, program, a, b });
    }
    out
}

/// Each ring serves a dispatch after the attack: "OK" for each, or what it answered.
async fn rings_still_serve(rings: &mut [Ringed]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rings.iter_mut() {
        let got = tokio::time::timeout(
            Duration::from_secs(20),
            r.s.dispatch(r.program, &[r.a.id, r.b.id]),
        )
        .await;
        out.push(match got {
            Ok(Ok(_)) => "OK".to_owned(),
            Ok(Err(e)) => format!("{:?}: {}", e.code(), e.message()),
            Err(_) => "no completion within 20 s".to_owned(),
        });
    }
    out
}

fn all_ok(answers: &[String]) -> Result<String, String> {
    let seen = format!("rings after the attack: {answers:?}");
    if answers.iter().all(|a| a == "OK") {
        Ok(seen)
    } else {
        Err(seen)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_lifelines_each_sent_a_lingering_socket() {
    let stand = Stand::start(Options::default()).await;
    let mut rings = ringed(&stand, 4).await;
    let attack = async {
        let mut peers = Vec::new();
        for r in &rings {
            let ring = r.s.ring.as_ref().expect("a ring");
            let (sock, peer) = lingering(LINGER);
            // 64 KiB the daemon reads first, so that this process has closed its copy by the
            // time the daemon reads the byte the socket comes with: the daemon's is the last.
            // The daemon breaks the ring at the lifeline's first byte (`broken` 3) and closes
            // it: the writes may then fail with EPIPE, which is the defence working.
            let _ = (&ring.lifeline).write_all(&[0; 64 << 10]);
            let _ = send_with_fds(ring.lifeline.as_fd(), b"x", &[sock.as_fd()]);
            closed_elsewhere(vec![sock]);
            peers.push(peer);
        }
        // The window: while the closes may block.
        tokio::time::sleep(LINGER + Duration::from_millis(500)).await;
        drop(peers);
    };
    let v = stand
        .attack("4 lifelines, a 5 s lingering socket each", attack)
        .await;
    let answers = rings_still_serve(&mut rings).await;
    v.expect("answer (ignored; the rings serve)", |()| all_ok(&answers))
        .finish();
}

/// An fd-socket request frame `op` (an unknown ticket) carrying `fds` lingering sockets on its
/// first byte; returns the daemon's answer, read within `limit`.
fn frame_with_fds(
    socket: &std::path::Path,
    op: Op,
    fds: usize,
    limit: Duration,
) -> Result<Response, String> {
    let conn = std::os::unix::net::UnixStream::connect(socket).map_err(|e| e.to_string())?;
    let frame = Request {
        op,
        ticket: Ticket::from_bytes([7; 16]),
    }
    .encode();
    let (socks, peers): (Vec<_>, Vec<_>) = (0..fds).map(|_| lingering(LINGER)).unzip();
    send_with_fds(conn.as_fd(), &frame[..1], &borrowed(&socks)).map_err(|e| e.to_string())?;
    closed_elsewhere(socks);
    // The daemon may refuse on the first byte's fds and close before the rest arrives (the
    // write then fails with EPIPE): its answer is read all the same.
    let _ = (&conn).write_all(&frame[1..]);
    conn.set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    let mut answer = [0u8; RESPONSE_LEN];
    let r = (&conn)
        .read_exact(&mut answer)
        .map_err(|e| format!("no answer: {e}"))
        .and_then(|()| Response::decode(&answer).map_err(|e| e.to_string()));
    // The closes block while the peers are open: keep them for the linger time.
    std::thread::sleep(LINGER.saturating_sub(Duration::from_millis(200)));
    drop(peers);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_frames_each_with_more_fds_than_the_daemon_makes_room_for() {
    let stand = Stand::start(Options::default()).await;
    let fd_socket = stand.daemon.fd_socket.clone();
    let attack = async {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let fd_socket = fd_socket.clone();
                tokio::task::spawn_blocking(move || {
                    frame_with_fds(
                        &fd_socket,
                        Op::RedeemExport,
                        8,
                        LINGER + Duration::from_secs(5),
                    )
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("an attacker"));
        }
        out
    };
    stand
        .attack("4 fd-socket frames, 8 lingering sockets each", attack)
        .await
        .expect("answer (MALFORMED naming the fd count)", |answers| {
            let seen: Vec<String> = answers
                .iter()
                .map(|a| match a {
                    Ok(r) => format!("{:?}: {}", r.status, r.message),
                    Err(e) => e.clone(),
                })
                .collect();
            let ok = answers
                .iter()
                .all(|a| matches!(a, Ok(r) if r.status == FdStatus::MALFORMED && r.message.contains("fd")));
            if ok {
                Ok(format!("{seen:?}"))
            } else {
                Err(format!("{seen:?}"))
            }
        })
        .finish();
}

/// Each ring's client writes single bytes into its lifeline for `FLOOD`; returns the bytes
/// written by each, then what each ring answers.
async fn write_into_lifelines(rings: &mut [Ringed]) -> (Vec<u64>, Vec<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = rings
        .iter()
        .map(|r| {
            let lifeline =
                r.s.ring
                    .as_ref()
                    .expect("a ring")
                    .lifeline
                    .try_clone()
                    .expect("a second handle on the lifeline");
            let stop = stop.clone();
            // A daemon that stops reading blocks the writes: they give up after 50 ms each.
            lifeline
                .set_write_timeout(Some(Duration::from_millis(50)))
                .expect("SO_SNDTIMEO");
            std::thread::spawn(move || {
                let mut n = 0u64;
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed) && started.elapsed() < FLOOD {
                    match (&lifeline).write(b"x") {
                        Ok(k) => n += k as u64,
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        Err(_) => break,
                    }
                }
                n
            })
        })
        .collect();
    let written: Vec<u64> = tokio::task::spawn_blocking(move || {
        writers
            .into_iter()
            .map(|w| w.join().expect("a writer"))
            .collect()
    })
    .await
    .expect("the writers");
    stop.store(true, Ordering::Relaxed);
    (written, rings_still_serve(rings).await)
}

async fn bytes_into_lifelines(n: usize) {
    let stand = Stand::start(Options::default()).await;
    let mut rings = ringed(&stand, n).await;
    let name = format!("{n} lifeline(s), 1-byte writes for 3 s");
    stand
        .attack(&name, write_into_lifelines(&mut rings))
        .await
        .expect("answer (ignored; the rings serve)", |(written, answers)| {
            all_ok(answers).map(|s| format!("{s}; bytes written {written:?}"))
        })
        .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_writing_bytes_into_its_lifeline() {
    bytes_into_lifelines(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_writing_bytes_into_their_lifelines() {
    bytes_into_lifelines(4).await;
}

/// Last round's (issue 19, 9; `lifecycle.rs` has it with one caller): IMPORT frames whose one
/// fd is a lingering socket. Answered `UNKNOWN_TICKET`; the close must block no other caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_import_frames_each_with_a_lingering_socket() {
    let stand = Stand::start(Options::default()).await;
    let fd_socket = stand.daemon.fd_socket.clone();
    let attack = async {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let fd_socket = fd_socket.clone();
                tokio::task::spawn_blocking(move || {
                    frame_with_fds(&fd_socket, Op::Import, 1, LINGER + Duration::from_secs(5))
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("an attacker"));
        }
        out
    };
    stand
        .attack("4 IMPORT frames, a lingering socket each", attack)
        .await
        .expect("answer (UNKNOWN_TICKET)", |answers| {
            let seen: Vec<String> = answers
                .iter()
                .map(|a| match a {
                    Ok(r) => format!("{:?}", r.status),
                    Err(e) => e.clone(),
                })
                .collect();
            if answers
                .iter()
                .all(|a| matches!(a, Ok(r) if r.status == FdStatus::UNKNOWN_TICKET))
            {
                Ok(format!("{seen:?}"))
            } else {
                Err(format!("{seen:?}"))
            }
        })
        .finish();
}
