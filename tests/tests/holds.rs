//! Everything a principal holds ends through one lifecycle, whatever the transport: revoking a
//! token identity ends its unary calls in flight, its Submit streams, its dispatch ring (and
//! the ring's lifeline on the fd socket) and its sessions; a fault cool-down ends the streams
//! and rings of the identity's sessions while the sessions live on; a session's end ends what
//! its other connections hold open.
//!
//! Each test is bounded to tens of seconds; timings are printed, not asserted.

#![forbid(unsafe_code)]

use std::io::Read;
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_fd::ring::Word;
use npu_proto::v1 as pb;
use npud_e2e::tokens::{TokenDir, secret};
use npud_e2e::{Daemon, Options, Session, dispatch_request};
use tokio_stream::StreamExt;
use tonic::Code;

/// Every test finishes within this.
const LIMIT: Duration = Duration::from_secs(40);
/// `auth.token_poll_ms` in these tests.
const POLL_MS: u64 = 100;

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test finished within its bound")
}

/// A daemon serving token identities `names` (files in a token directory polled every
/// [`POLL_MS`]), with `extra` options.
fn pods(names: &[&str], extra: impl FnOnce(Options) -> Options) -> (TokenDir, Daemon) {
    let tokens = TokenDir::new(names);
    let config = tokens.scratch().join("npud.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\ntoken_dir = {:?}\ntoken_poll_ms = {POLL_MS}\n\
             [[auth.rules]]\nname = \"pods\"\nmatch = [\"token:*\", \"uid:*\"]\n",
            tokens.path().display().to_string()
        ),
    )
    .unwrap();
    let d = Daemon::start(extra(
        Options::default()
            .arg("--config")
            .arg(&config.display().to_string()),
    ));
    (tokens, d)
}

async fn pod(d: &Daemon, name: &str) -> Session {
    Session::open_as(d.connect().await, name, Some(&secret(name)))
        .await
        .unwrap()
}

async fn allocate(s: &mut Session) -> u64 {
    let req = s.req(pb::AllocateTensorRequest {
        size_bytes: 4096,
        name: String::new(),
    });
    s.client
        .allocate_tensor(req)
        .await
        .unwrap()
        .into_inner()
        .tensor_id
}

/// A program adding 1 to 1024 i32s, and its two tensors.
async fn adder(s: &mut Session) -> (u64, u64, u64) {
    let p = s
        .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    (p, allocate(s).await, allocate(s).await)
}

/// Waits until the daemon has at least `n` dispatches pending.
async fn pending_at_least(watcher: &mut Session, n: u64) {
    loop {
        if watcher.statistics().await.unwrap().pending_dispatches >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the ring says it closed, and its lifeline reads end-of-file.
async fn ring_closed(s: &Session) -> Duration {
    let ring = s.ring.clone().expect("the session has a ring");
    let start = Instant::now();
    while ring.mem.load(Word::State) == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let closed = start.elapsed();
    let eof = tokio::task::spawn_blocking(move || {
        let mut b = [0_u8; 64];
        (&ring.lifeline).read(&mut b)
    })
    .await
    .unwrap();
    assert!(matches!(eof, Ok(0)), "the lifeline was closed: {eof:?}");
    closed
}

async fn device_sessions(s: &mut Session) -> u32 {
    s.client
        .get_device_info(s.req(pb::GetDeviceInfoRequest {}))
        .await
        .unwrap()
        .into_inner()
        .sessions
}

/// Revocation ends, at once, a unary call waiting in the queue and a Submit stream, while the
/// device is busy with another pod's hang; the revoked pod's sessions then end, and the other
/// pod is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_ends_a_pods_calls_and_streams_in_flight_and_its_sessions() {
    let (tokens, d) = pods(&["pod-a", "pod-b"], |o| {
        o.arg("--emulator-timeout-ms").arg("4000")
    });
    bounded(async {
        let mut a = pod(&d, "pod-a").await;
        let (add, x, y) = adder(&mut a).await;
        let mut b = pod(&d, "pod-b").await;
        let hang = b.register(&EmuDesign::hang(4096)).await.unwrap().program_id;
        let (h1, h2) = (allocate(&mut b).await, allocate(&mut b).await);
        let sessions_before = device_sessions(&mut b).await;

        let mut b2 = b.clone();
        let hanging = tokio::spawn(async move { b2.dispatch(hang, &[h1, h2]).await });
        pending_at_least(&mut b, 1).await;
        let mut a2 = a.clone();
        let unary = tokio::spawn(async move { a2.dispatch(add, &[x, y]).await });
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(pb::SubmitRequest {
            request_id: 1,
            work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
                add,
                &[x, y],
            ))),
            timeout_ms: 0,
        })
        .await
        .unwrap();
        let req = a.req(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut stream = a.client.submit(req).await.unwrap().into_inner();
        pending_at_least(&mut b, 3).await;

        std::fs::remove_file(tokens.path().join("pod-a")).unwrap();
        let revoked = Instant::now();
        let e = unary.await.unwrap().unwrap_err();
        let unary_ended = revoked.elapsed();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(
            e.message().starts_with("token:pod-a@")
                && e.message()
                    .contains(" was revoked: its file in auth.token_dir was removed"),
            "{e:?}"
        );
        let e = loop {
            match stream.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break e,
                None => panic!("the stream ended without the revocation's status"),
            }
        };
        let stream_ended = revoked.elapsed();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("was revoked"), "{e:?}");
        assert!(
            !hanging.is_finished(),
            "both ended while the device still hung"
        );
        drop(tx);
        eprintln!(
            "after the token file went: the unary call ended in {unary_ended:?}, the Submit \
             stream in {stream_ended:?} (auth.token_poll_ms = {POLL_MS})"
        );
        // Once the device is free, the revoked pod's session is gone; the other pod works.
        let _ = hanging.await;
        loop {
            if device_sessions(&mut b).await == sessions_before - 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (badd, bx, by) = adder(&mut b).await;
        b.dispatch(badd, &[bx, by]).await.unwrap();
    })
    .await;
}

/// Revocation ends a pod's dispatch ring: the ring closes, its lifeline on the fd socket is
/// closed, and nothing more is admitted through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_ends_a_pods_dispatch_ring_and_its_lifeline() {
    let (tokens, d) = pods(&["pod-a"], |o| o);
    bounded(async {
        let mut a = pod(&d, "pod-a").await;
        let (add, x, y) = adder(&mut a).await;
        a.attach_ring().await.unwrap();
        a.dispatch(add, &[x, y]).await.unwrap();

        std::fs::remove_file(tokens.path().join("pod-a")).unwrap();
        let closed = ring_closed(&a).await;
        eprintln!("the ring closed {closed:?} after the revocation was seen");
        // The closed ring takes nothing: the dispatch goes through gRPC (as the ring spec lets
        // a client), where the revoked token is unknown.
        let e = a.dispatch(add, &[x, y]).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("unknown secret"), "{e:?}");
    })
    .await;
}

/// A fault cool-down ends what keeps admitting work for the identity's sessions (their rings
/// and Submit streams), naming the cool-down; the sessions live on, and a unary call is
/// answered by the executor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cool_down_ends_the_identitys_rings_and_streams_and_its_sessions_live_on() {
    let (_tokens, d) = pods(&["pod-a"], |o| {
        o.env("NPUD_LIMITS__FAULT_BUDGET", "1")
            .env("NPUD_LIMITS__FAULT_COOLDOWN_MS", "600000")
    });
    bounded(async {
        let mut a = pod(&d, "pod-a").await;
        let (add, x, y) = adder(&mut a).await;
        let fault = a
            .register(&EmuDesign::fault(4096))
            .await
            .unwrap()
            .program_id;
        let mut ringed = pod(&d, "pod-a").await;
        let (radd, rx_, ry) = adder(&mut ringed).await;
        ringed.attach_ring().await.unwrap();
        ringed.dispatch(radd, &[rx_, ry]).await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::SubmitRequest>(4);
        let req = a.req(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut stream = a.client.submit(req).await.unwrap().into_inner();

        // The fault that spends the budget is answered as the fault it is.
        let e = a.dispatch(fault, &[x, y]).await.unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{e:?}");
        let e = loop {
            match stream.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break e,
                None => panic!("the stream ended without the cool-down's status"),
            }
        };
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("limits.fault_cooldown_ms"), "{e:?}");
        ringed_closed_with_sessions_alive(&ringed).await;
        drop(tx);
        // The sessions live on: their tensors are there, their work is refused for now.
        let e = a.dispatch(add, &[x, y]).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let info = a
            .client
            .get_tensor_info(a.req(pb::GetTensorInfoRequest { tensor_id: x }))
            .await;
        assert!(info.is_ok(), "{info:?}");
    })
    .await;
}

async fn ringed_closed_with_sessions_alive(s: &Session) {
    let closed = ring_closed(s).await;
    eprintln!("the ring closed {closed:?} after the cool-down");
    let mut s = s.clone();
    let info = s
        .client
        .resume_session(s.req(pb::ResumeSessionRequest {
            session_id: s.id,
            token: s.token.clone(),
        }))
        .await;
    assert!(info.is_ok(), "the session lives on: {info:?}");
}

/// A session closed from one connection ends what its other connections hold open: a Submit
/// stream and the dispatch ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_ends_its_streams_and_ring_on_other_connections() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let mut s = Session::open(d.connect().await, "closing").await.unwrap();
        let (add, x, y) = adder(&mut s).await;
        s.attach_ring().await.unwrap();
        s.dispatch(add, &[x, y]).await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::SubmitRequest>(4);
        let req = s.req(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut stream = s.client.submit(req).await.unwrap().into_inner();
        // CloseSession on a connection of its own.
        let mut other = s.clone();
        other.client = d.connect().await;
        other
            .client
            .close_session(other.req(pb::CloseSessionRequest {}))
            .await
            .unwrap();
        let e = loop {
            match stream.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break e,
                None => panic!("the stream ended without a status"),
            }
        };
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("was closed (CloseSession)"), "{e:?}");
        ring_closed(&s).await;
        drop(tx);
    })
    .await;
}
