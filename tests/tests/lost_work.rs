//! Work that must neither be lost nor run twice, nor undo a client's writes: staged tensors
//! after an abandoned call, calls retried after the connection dropped between admission and
//! reply, and the Submit stream's bad messages, window and abandonment.
//!
//! Part of the reliability suite (README); each test is bounded to tens of seconds.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, Program};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, RawCodec, Runtime, Session, dispatch_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;
use tonic::Code;

/// Every test here finishes within this.
const LIMIT: Duration = Duration::from_secs(40);

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test finished within its bound")
}

fn submit_item(request_id: u64, program: u64, tensors: &[u64]) -> pb::SubmitRequest {
    pb::SubmitRequest {
        request_id,
        work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
            program, tensors,
        ))),
        timeout_ms: 0,
    }
}

/// Polls statistics until `pred` holds, and returns them.
async fn stats_until(
    keeper: &mut Session,
    mut pred: impl FnMut(&pb::Statistics) -> bool,
) -> pb::Statistics {
    loop {
        let st = keeper.statistics().await.unwrap();
        if pred(&st) {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn session(st: &pb::Statistics, id: u64) -> &pb::SessionStatistics {
    st.sessions
        .iter()
        .find(|s| s.session_id == id)
        .expect("the session is in the statistics")
}

fn successes(st: &pb::Statistics, id: u64) -> u64 {
    session(st, id)
        .dispatches
        .as_ref()
        .and_then(|d| d.success)
        .map_or(0, |d| d.count)
}

fn failures(st: &pb::Statistics, id: u64) -> u64 {
    session(st, id)
        .dispatches
        .as_ref()
        .and_then(|d| d.fail)
        .map_or(0, |d| d.count)
}

async fn local_client(socket: &Path) -> Client {
    Client::connect(Some(&format!("unix:{}", socket.display())))
        .await
        .unwrap()
}

fn program(c: &Client, name: &str, d: &EmuDesign) -> Program {
    Program::from_bytes(name, d.to_pdi(), d.insts(c.generation())).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Staged tensors

/// On a runtime that exports no memory (ROCm 7.0), a dispatch's tensors are copied into device
/// memory before it and back after it. A call the client abandoned lends only its outputs: the
/// inputs are the client's again at once, and what it writes to them must not be overwritten
/// by the daemon's copy-back of the dispatch's (older) input.
///
/// The order is forced with another session's stream of small dispatches, which always has one
/// waiting. Turns go to the session that has used the device least: the abandoned dispatch is
/// served right after the turn under way when it arrives, copies its 8 MiB input in 1 MiB
/// slices between the stream's dispatches, and once its own doorbell (tens of ms for 8 MiB on
/// the emulator) has been charged, the stream has every turn until it has used as much, so the
/// copy-back waits behind tens of ms of them (a hundred dispatches or more). The client abandons
/// the call once its program is loaded (the turn before its first copy slice; a session waiting
/// beside the stream stops the stream's dispatches from merging, so each is a turn) and the
/// stream has finished [`STREAM_TURNS`] more dispatches, paying back the load's turn, and
/// writes its input then: after the copy-in started, long before the copy-back.
const STREAM_TURNS: u64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_staged_call_never_reverts_what_the_client_writes_to_its_inputs() {
    let d = Daemon::start(
        Options::default()
            .profile("rocm-7.0", Runtime::Linked)
            .env("NPUD_EXECUTOR__SLICE_BYTES", &(1u32 << 20).to_string())
            .env("NPUD_LIMITS__FAULT_BUDGET", "1000000"),
    );
    bounded(async {
        let c = local_client(&d.socket).await;
        assert_eq!(c.device().tensor_sharing, "staged", "{:?}", c.device());
        const M: u32 = 2 << 20; // 8 MiB of i32: eight copy slices
        let add = program(&c, "add", &EmuDesign::vector_scalar_add(M, DType::I32, 1));
        c.register(&add).await.unwrap();
        let mut input = c.alloc::<i32>(M as usize).await.unwrap();
        let mut out = c.alloc::<i32>(M as usize).await.unwrap();
        input.as_mut_slice().fill(1);

        let mut keeper = Session::open(d.connect().await, "keeper").await.unwrap();
        let mut h = Session::open(d.connect().await, "stream").await.unwrap();
        let small = h
            .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
            .await
            .unwrap()
            .program_id;
        let (hx, hy) = (
            h.alloc_mapped(4096).await.unwrap(),
            h.alloc_mapped(4096).await.unwrap(),
        );
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut answers = h
            .client
            .submit(h.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
            .await
            .unwrap()
            .into_inner();
        // The stream always has a dispatch waiting, until the call has been abandoned.
        let stop = Arc::new(AtomicBool::new(false));
        let feeder = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut k = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    if tx
                        .send(submit_item(k, small, &[hx.id, hy.id]))
                        .await
                        .is_err()
                    {
                        break;
                    }
                    k += 1;
                }
            }
        });
        let drain = tokio::spawn(async move {
            while let Some(r) = answers.next().await {
                r.unwrap();
            }
        });
        let stream_id = h.id;
        {
            let reads: [&dyn npu_client::TensorArg; 1] = [&input];
            let mut writes: [&mut dyn npu_client::TensorArg; 1] = [&mut out];
            let call = c.dispatch(&add, &reads, &mut writes);
            tokio::pin!(call);
            let turns = async {
                // The call's program is loaded at the turn before its first copy slice.
                let st = stats_until(&mut keeper, |st| {
                    st.programs.iter().any(|p| p.name == "add" && p.loaded)
                })
                .await;
                let before = successes(&st, stream_id);
                stats_until(&mut keeper, |st| {
                    successes(st, stream_id) >= before + STREAM_TURNS
                })
                .await
            };
            tokio::select! {
                r = &mut call => panic!("answered before the stream's {STREAM_TURNS} turns: {r:?}"),
                _ = turns => {}
            }
            // The call is abandoned here: the daemon still has it, part of its input copied in.
        }
        assert!(!input.is_lent(), "an input is never lent");
        input.as_mut_slice().fill(7);
        stop.store(true, Ordering::SeqCst);
        feeder.await.unwrap();
        drain.await.unwrap();
        stats_until(&mut keeper, |st| st.pending_dispatches == 0).await;
        let reverted = input.as_slice().iter().filter(|v| **v != 7).count();
        assert_eq!(
            reverted, 0,
            "the daemon copied the abandoned dispatch's input back over the client's write"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Retries after a dropped connection

/// A Unix-socket proxy in front of npud's socket. Bytes pass both ways until `hold`: then the
/// daemon's bytes are no longer passed on (a call is admitted and answered, but the answer
/// never reaches the client), until `cut` drops every connection it carries. Connections made
/// after the cut pass everything again.
struct Proxy {
    path: PathBuf,
    hold: Arc<AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    fn start(dir: &Path, upstream: PathBuf) -> Proxy {
        let path = dir.join("proxy.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let hold = Arc::new(AtomicBool::new(false));
        let (cut, cut_rx) = tokio::sync::watch::channel(0u64);
        let held = hold.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::UnixStream::connect(&upstream).await else {
                    continue;
                };
                let mut cut = cut_rx.clone();
                cut.borrow_and_update();
                tokio::spawn(pipe(client, server, held.clone(), cut));
            }
        });
        Proxy { path, hold, cut }
    }

    fn hold(&self) {
        self.hold.store(true, Ordering::SeqCst);
    }

    /// Drops every connection, and passes everything on new ones.
    fn cut(&self) {
        self.hold.store(false, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    fn address(&self) -> String {
        format!("unix:{}", self.path.display())
    }
}

async fn pipe(
    client: tokio::net::UnixStream,
    server: tokio::net::UnixStream,
    hold: Arc<AtomicBool>,
    mut cut: tokio::sync::watch::Receiver<u64>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = tokio::io::copy(&mut cr, &mut sw);
    let down = async {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = sr.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            if hold.load(Ordering::SeqCst) {
                // Held: nothing more reaches the client on this connection.
                std::future::pending::<()>().await;
            }
            cw.write_all(&buf[..n]).await?;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut.changed() => {}
    }
}

/// Starts a daemon with a proxy in front, a client through the proxy, and a keeper session
/// beside it on the daemon's own socket.
async fn proxied(d: &Daemon) -> (Proxy, Client, Session) {
    let proxy = Proxy::start(d.dir.path(), d.socket.clone());
    let c = Client::connect(Some(&proxy.address())).await.unwrap();
    let keeper = Session::open(d.connect().await, "keeper").await.unwrap();
    (proxy, c, keeper)
}

/// npu-client retries a call once after a transport error. When the daemon had already run
/// the call, the retry gets the first answer: an in-place chain (a → b, then b → a) adds 2,
/// not 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_whose_answer_was_cut_off_runs_once_when_retried() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let (proxy, c, mut keeper) = proxied(&d).await;
        const N: u32 = 1024;
        let add = program(&c, "add", &EmuDesign::vector_scalar_add(N, DType::I32, 1));
        c.register(&add).await.unwrap();
        let mut a = c.alloc::<i32>(N as usize).await.unwrap();
        let mut b = c.alloc::<i32>(N as usize).await.unwrap();
        a.as_mut_slice().fill(10);
        let me = c.session_id();
        let before = successes(&keeper.statistics().await.unwrap(), me);

        proxy.hold();
        let run = async {
            let mut chain = c.chain();
            let (x, y) = (chain.write(&mut a), chain.write(&mut b));
            chain.then(&add, &[x, y]).then(&add, &[y, x]);
            chain.run().await
        };
        let cut = async {
            // The chain ran on the device and its answer is held: cut the connection.
            stats_until(&mut keeper, |st| successes(st, me) == before + 2).await;
            proxy.cut();
        };
        let (r, ()) = tokio::join!(run, cut);
        let r = r.expect("the retried chain is answered").ok().unwrap();
        assert_eq!(r.completed, 2);
        assert!(
            a.as_slice().iter().all(|v| *v == 12),
            "{:?}",
            &a.as_slice()[..4]
        );
        let st = keeper.statistics().await.unwrap();
        assert_eq!(successes(&st, me), before + 2, "the chain ran once");
    })
    .await;
}

/// An allocation whose answer was cut off is made once: the retry gets the same tensor, and
/// the session's quota counts it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_whose_answer_was_cut_off_is_made_once_when_retried() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let (proxy, c, mut keeper) = proxied(&d).await;
        let me = c.session_id();
        let st = keeper.statistics().await.unwrap();
        let (tensors, bytes) = (session(&st, me).tensors, session(&st, me).tensor_bytes);

        proxy.hold();
        let alloc = c.alloc::<i32>(4096);
        let cut = async {
            stats_until(&mut keeper, |st| session(st, me).tensors == tensors + 1).await;
            proxy.cut();
        };
        let (t, ()) = tokio::join!(alloc, cut);
        let mut t = t.expect("the retried allocation is answered");
        t.as_mut_slice().fill(3);
        let st = keeper.statistics().await.unwrap();
        assert_eq!(session(&st, me).tensors, tensors + 1, "allocated once");
        assert_eq!(session(&st, me).tensor_bytes, bytes + 4096 * 4);

        // Freeing it, cut off the same way, is answered (not NOT_FOUND) and frees it once.
        proxy.hold();
        let free = t.free();
        let cut = async {
            stats_until(&mut keeper, |st| session(st, me).tensors == tensors).await;
            proxy.cut();
        };
        let (freed, ()) = tokio::join!(free, cut);
        freed.expect("the retried free is answered");
        let st = keeper.statistics().await.unwrap();
        assert_eq!(session(&st, me).tensor_bytes, bytes);
    })
    .await;
}

/// A request id names one call: the same id on another method is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_reused_by_another_method_is_invalid_argument() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let mut s = Session::open(d.connect().await, "ids").await.unwrap();
        let with_id = |s: &Session, id: &str| {
            let mut r = s.req(pb::AllocateTensorRequest {
                size_bytes: 64,
                name: String::new(),
            });
            r.metadata_mut()
                .insert(npu_proto::REQUEST_ID_HEADER, id.parse().unwrap());
            r
        };
        let first = s.client.allocate_tensor(with_id(&s, "7")).await.unwrap();
        let again = s.client.allocate_tensor(with_id(&s, "7")).await.unwrap();
        assert_eq!(
            first.get_ref().tensor_id,
            again.get_ref().tensor_id,
            "the same id answers the same"
        );
        let mut free = s.req(pb::FreeTensorRequest {
            tensor_id: first.get_ref().tensor_id,
        });
        free.metadata_mut()
            .insert(npu_proto::REQUEST_ID_HEADER, "7".parse().unwrap());
        let e = s.client.free_tensor(free).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(
            e.message(),
            "npud-request-id: 7 was already used by a AllocateTensor call of this session"
        );
        let e = s
            .client
            .allocate_tensor(with_id(&s, "seven"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(e.message(), "npud-request-id: not a decimal u64");
    })
    .await;
}

/// A request carrying `s`'s metadata and request id `id` (and `ack` as `npud-request-ack`).
fn with_request_id<T>(s: &Session, msg: T, id: u64, ack: Option<u64>) -> tonic::Request<T> {
    let mut r = s.req(msg);
    r.metadata_mut().insert(
        npu_proto::REQUEST_ID_HEADER,
        id.to_string().parse().unwrap(),
    );
    if let Some(a) = ack {
        r.metadata_mut().insert(
            npu_proto::REQUEST_ACK_HEADER,
            a.to_string().parse().unwrap(),
        );
    }
    r
}

async fn allocate(s: &mut Session, size: u64) -> u64 {
    let req = s.req(pb::AllocateTensorRequest {
        size_bytes: size,
        name: String::new(),
    });
    s.client
        .allocate_tensor(req)
        .await
        .unwrap()
        .into_inner()
        .tensor_id
}

/// A call whose id is still running is remembered however many ids follow it: its retry waits
/// for its answer instead of running it again. (A window of the last 256 ids forgot it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_call_is_run_once_when_retried_after_hundreds_of_newer_ids() {
    let d = Daemon::start(Options::default().arg("--emulator-timeout-ms").arg("3000"));
    bounded(async {
        // Another session's hang holds the device, so this session's dispatch waits, admitted.
        let mut culprit = Session::open(d.connect().await, "culprit").await.unwrap();
        let hang = culprit.register(&EmuDesign::hang(4096)).await.unwrap();
        let (h1, h2) = (
            allocate(&mut culprit, 4096).await,
            allocate(&mut culprit, 4096).await,
        );
        let mut s = Session::open(d.connect().await, "ids").await.unwrap();
        let add = s
            .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
            .await
            .unwrap();
        let (a, b) = (allocate(&mut s, 4096).await, allocate(&mut s, 4096).await);
        let mut keeper = Session::open(d.connect().await, "keeper").await.unwrap();
        let mut c = culprit.clone();
        let hanging = tokio::spawn(async move { c.dispatch(hang.program_id, &[h1, h2]).await });
        stats_until(&mut keeper, |st| st.pending_dispatches >= 1).await;
        let mut s2 = s.clone();
        let first = tokio::spawn(async move {
            let r = with_request_id(&s2, dispatch_request(add.program_id, &[a, b]), 1, None);
            s2.client.dispatch(r).await
        });
        stats_until(&mut keeper, |st| st.pending_dispatches >= 2).await;
        // 300 newer ids of this session, each refused before it runs.
        for id in 2..302 {
            let r = with_request_id(&s, dispatch_request(999_999, &[a, b]), id, None);
            let e = s.client.dispatch(r).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound, "{e:?}");
        }
        // The retry of id 1 while it waits.
        let r = with_request_id(&s, dispatch_request(add.program_id, &[a, b]), 1, None);
        let again = s.client.dispatch(r).await;
        let first = first.await.unwrap();
        assert!(first.is_ok(), "{first:?}");
        assert!(again.is_ok(), "{again:?}");
        let _ = hanging.await;
        let st = keeper.statistics().await.unwrap();
        let me = s.id;
        assert_eq!(successes(&st, me), 1, "the dispatch ran once");
    })
    .await;
}

/// A reused request id must name the same request: another message is refused, never given
/// the first call's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_reused_for_another_message_is_invalid_argument() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let mut s = Session::open(d.connect().await, "ids").await.unwrap();
        let add = s
            .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
            .await
            .unwrap();
        let (a, b) = (allocate(&mut s, 4096).await, allocate(&mut s, 4096).await);
        let r = with_request_id(&s, dispatch_request(add.program_id, &[a, b]), 5, None);
        s.client.dispatch(r).await.unwrap();
        // The same message again: the first answer, not a second run.
        let r = with_request_id(&s, dispatch_request(add.program_id, &[a, b]), 5, None);
        s.client.dispatch(r).await.unwrap();
        let r = with_request_id(&s, dispatch_request(add.program_id, &[b, a]), 5, None);
        let e = s.client.dispatch(r).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert_eq!(
            e.message(),
            "npud-request-id: 5 was already used by a Dispatch call of this session with \
             another request; a retry must send the same message (use a new id for new work)"
        );
        let st = s.statistics().await.unwrap();
        assert_eq!(successes(&st, s.id), 1, "the dispatch ran once");
    })
    .await;
}

/// Only final answers are replayed: a call refused before it ran (a quota) runs when retried
/// with its id once the quota has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_not_replayed_and_the_retry_runs() {
    let d = Daemon::start(Options::default().env("NPUD_LIMITS__MAX_TENSORS_PER_SESSION", "2"));
    bounded(async {
        let mut s = Session::open(d.connect().await, "ids").await.unwrap();
        let a = allocate(&mut s, 64).await;
        allocate(&mut s, 64).await;
        let alloc = pb::AllocateTensorRequest {
            size_bytes: 64,
            name: String::new(),
        };
        let r = with_request_id(&s, alloc.clone(), 9, None);
        let e = s.client.allocate_tensor(r).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let free = s.req(pb::FreeTensorRequest { tensor_id: a });
        s.client.free_tensor(free).await.unwrap();
        let r = with_request_id(&s, alloc, 9, None);
        let made = s.client.allocate_tensor(r).await;
        assert!(made.is_ok(), "the retry ran: {made:?}");
    })
    .await;
}

/// Remembered ids are bounded in bytes per principal: past the bound a new id is refused
/// naming the key, nothing remembered is forgotten, and ids the client acknowledges make room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_request_ids_are_bounded_per_principal_and_acknowledged_ids_make_room() {
    let d = Daemon::start(
        Options::default().env("NPUD_LIMITS__MAX_REQUEST_ID_BYTES_PER_PRINCIPAL", "4096"),
    );
    bounded(async {
        let mut s = Session::open(d.connect().await, "ids").await.unwrap();
        let alloc = |s: &Session, id, ack| {
            with_request_id(
                s,
                pb::AllocateTensorRequest {
                    size_bytes: 64,
                    name: String::new(),
                },
                id,
                ack,
            )
        };
        let mut refused = None;
        for id in 0..64 {
            match s.client.allocate_tensor(alloc(&s, id, None)).await {
                Ok(_) => {}
                Err(e) => {
                    refused = Some((id, e));
                    break;
                }
            }
        }
        let (n, e) = refused.expect("the bound refused a new id");
        assert!(n >= 2, "at least two ids fit in 4 KiB; refused at {n}");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message()
                .contains("limits.max_request_id_bytes_per_principal"),
            "{e:?}"
        );
        // Everything remembered still answers the same.
        let first = s.client.allocate_tensor(alloc(&s, 0, None)).await.unwrap();
        let again = s.client.allocate_tensor(alloc(&s, 0, None)).await.unwrap();
        assert_eq!(first.get_ref().tensor_id, again.get_ref().tensor_id);
        // Acknowledging every id below n makes room.
        s.client
            .allocate_tensor(alloc(&s, n, Some(n)))
            .await
            .unwrap();
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// The Submit stream

/// A Submit stream of raw message bodies; returns the decoded responses and how the stream
/// ended.
async fn raw_submit(
    d: &Daemon,
    s: &Session,
    bodies: Vec<Vec<u8>>,
) -> (Vec<pb::SubmitResponse>, tonic::Status) {
    let mut grpc = tonic::client::Grpc::new(d.channel().await)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/npud.v1.Npud/Submit");
    let mut inbound = grpc
        .streaming(s.req(tokio_stream::iter(bodies)), path, RawCodec)
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    loop {
        match inbound.message().await {
            Ok(Some(b)) => {
                got.push(<pb::SubmitResponse as prost::Message>::decode(&b[..]).unwrap())
            }
            Ok(None) => return (got, tonic::Status::ok("")),
            Err(status) => return (got, status),
        }
    }
}

async fn submit_setup(d: &Daemon) -> (Session, u64, u64, u64) {
    let mut s = Session::open(d.connect().await, "submit").await.unwrap();
    let p = s
        .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let a = s.alloc_mapped(4096).await.unwrap().id;
    let b = s.alloc_mapped(4096).await.unwrap().id;
    (s, p, a, b)
}

fn encoded(m: &pb::SubmitRequest) -> Vec<u8> {
    prost::Message::encode_to_vec(m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_submit_message_ends_the_stream_with_invalid_argument_naming_it() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let (s, p, a, b) = submit_setup(&d).await;
        let bodies = vec![
            encoded(&submit_item(1, p, &[a, b])),
            vec![0xff; 16],
            encoded(&submit_item(3, p, &[a, b])),
        ];
        let (got, end) = raw_submit(&d, &s, bodies).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].request_id, got[0].code), (1, 0), "{got:?}");
        assert_eq!(end.code(), Code::InvalidArgument, "{end:?}");
        assert!(end.message().starts_with("message 1: "), "{end:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_40_mib_submit_message_ends_the_stream_with_resource_exhausted_naming_it() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let (s, p, a, b) = submit_setup(&d).await;
        // A SubmitRequest whose unknown field 15 holds 40 MiB.
        let mut big = encoded(&submit_item(2, p, &[a, b]));
        big.push(15 << 3 | 2);
        prost::encoding::encode_varint(40 << 20, &mut big);
        big.resize(big.len() + (40 << 20), 0);
        let bodies = vec![encoded(&submit_item(1, p, &[a, b])), big];
        let (got, end) = raw_submit(&d, &s, bodies).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].request_id, got[0].code), (1, 0), "{got:?}");
        assert_eq!(end.code(), Code::ResourceExhausted, "{end:?}");
        assert!(end.message().starts_with("message 1: "), "{end:?}");
    })
    .await;
}

/// More items than the session may have pending are not refused: the stream stops reading
/// until earlier ones are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_submit_window_slows_the_stream_instead_of_refusing_items() {
    let d = Daemon::start(Options {
        args: vec!["--emulator-timeout-ms".into(), "1000".into()],
        ..Options::default().env("NPUD_LIMITS__MAX_PENDING_PER_SESSION", "2")
    });
    bounded(async {
        let (mut s, p, a, b) = submit_setup(&d).await;
        let hang = s.register(&EmuDesign::hang(4096)).await.unwrap().program_id;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut inbound = s
            .client
            .submit(s.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
            .await
            .unwrap()
            .into_inner();
        tx.send(submit_item(0, hang, &[a, b])).await.unwrap();
        for i in 1..=6 {
            tx.send(submit_item(i, p, &[a, b])).await.unwrap();
        }
        drop(tx);
        let mut answered = Vec::new();
        while let Some(r) = inbound.next().await {
            let r = r.expect("the stream ends with OK");
            assert_ne!(r.code, Code::ResourceExhausted as i32, "{r:?}");
            if r.request_id > 0 {
                assert_eq!(r.code, 0, "{r:?}");
            }
            answered.push(r.request_id);
        }
        assert_eq!(answered, (0..=6).collect::<Vec<u64>>());
    })
    .await;
}

/// Items of an abandoned stream hold their places in the session's pending count until the
/// executor answers them, so a rule's `max_pending_per_session` still bounds the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_submit_stream_keeps_its_items_pending_until_answered() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("npud.toml");
    std::fs::write(
        &config,
        "[[auth.rules]]\nname = \"local\"\nmatch = [\"uid:*\"]\nmax_pending_per_session = 2\n",
    )
    .unwrap();
    let d = Daemon::start(
        Options::default()
            .arg("--config")
            .arg(&config.display().to_string())
            .arg("--emulator-timeout-ms")
            .arg("1500")
            .env("NPUD_LIMITS__FAULT_BUDGET", "1000000"),
    );
    bounded(async {
        let (mut s, _, a, b) = submit_setup(&d).await;
        let h1 = s.register(&EmuDesign::hang(4096)).await.unwrap().program_id;
        let h2 = s.register(&EmuDesign::hang(8192)).await.unwrap().program_id;
        let (x, y) = (
            s.alloc_mapped(8192).await.unwrap().id,
            s.alloc_mapped(8192).await.unwrap().id,
        );
        let _ = (a, b);
        let mut keeper = Session::open(d.connect().await, "keeper").await.unwrap();
        {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let _inbound = s
                .client
                .submit(s.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
                .await
                .unwrap()
                .into_inner();
            tx.send(submit_item(1, h1, &[x, y])).await.unwrap();
            tx.send(submit_item(2, h2, &[x, y])).await.unwrap();
            stats_until(&mut keeper, |st| st.pending_dispatches == 2).await;
            // The stream is dropped here, both items still in the daemon.
        }
        // The first hang is answered (to nobody); the second still runs, and still counts.
        let st = stats_until(&mut keeper, |st| {
            failures(st, s.id) >= 1 && st.pending_dispatches < 2
        })
        .await;
        assert_eq!(
            (failures(&st, s.id), st.pending_dispatches),
            (1, 1),
            "the second item is pending until the executor answers it"
        );
        stats_until(&mut keeper, |st| st.pending_dispatches == 0).await;
    })
    .await;
}
