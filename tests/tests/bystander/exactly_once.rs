//! Exactly-once by time (`npud-request-id`): an id whose call is still running is never
//! forgotten, however many newer ids follow (a retry then gets its answer and does not run it
//! again); an id reused with a different request is `INVALID_ARGUMENT`; and only final answers
//! are replayed (a call refused `DEADLINE_EXCEEDED` before it ran runs when retried). Runs are
//! counted on the device, per program (`GetStatistics`); the call that must not be forgotten is
//! a chain of 600 matmuls, which runs for about a second while 300 newer ids are answered. The
//! attacker's session keeps a backlog of matmuls queued throughout (before the baseline too),
//! so that its calls wait in its queue while the bystander is served in turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::bystander::Stand;
use npud_e2e::{Mapped, Options, Session, dispatch_request};
use tonic::{Code, Request};

/// Matmuls the attacker keeps in flight, and their size.
const BACKLOG: usize = 64;
const SLOW: u32 = 128;
/// Links of the chain whose request id must not be forgotten.
const LINKS: usize = 600;
/// Newer ids sent while the first call runs: more than the 256 a session remembers.
const NEWER: u64 = 300;

/// The attacker's session: a slow program (a matmul), a quick one (vector_scalar_add) and
/// another matmul for a long chain, each with its tensors.
struct Attacker {
    s: Session,
    slow: u64,
    slow_args: Vec<u64>,
    quick: u64,
    quick_args: Vec<u64>,
    held: u64,
    held_args: Vec<u64>,
    _tensors: Vec<Mapped>,
}

async fn attacker(stand: &Stand) -> Attacker {
    let mut s = Session::open(stand.daemon.connect().await, "attacker")
        .await
        .unwrap();
    let mut tensors = Vec::new();
    let program = async |s: &mut Session, d: &EmuDesign, tensors: &mut Vec<Mapped>| {
        let id = s.register(d).await.unwrap().program_id;
        let mut args = Vec::new();
        for size in d.arg_sizes() {
            let t = s.alloc_mapped(size).await.unwrap();
            args.push(t.id);
            tensors.push(t);
        }
        (id, args)
    };
    let (slow, slow_args) = program(
        &mut s,
        &EmuDesign::matmul(SLOW, SLOW, SLOW, DType::I16, DType::I32),
        &mut tensors,
    )
    .await;
    let (quick, quick_args) = program(
        &mut s,
        // Not the bystander's (+1): programs are counted by content.
        &EmuDesign::vector_scalar_add(1024, DType::I32, 2),
        &mut tensors,
    )
    .await;
    let (held, held_args) = program(
        &mut s,
        &EmuDesign::matmul(SLOW, SLOW, SLOW - 32, DType::I16, DType::I32),
        &mut tensors,
    )
    .await;
    Attacker {
        s,
        slow,
        slow_args,
        quick,
        quick_args,
        held,
        held_args,
        _tensors: tensors,
    }
}

/// Keeps `BACKLOG` matmuls of the attacker in flight until stopped; the device time of the
/// last one answered, in µs, is kept in the returned counter.
fn pump(a: &Attacker) -> (Arc<AtomicBool>, Arc<AtomicU64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let device_us = Arc::new(AtomicU64::new(0));
    for _ in 0..BACKLOG {
        let (stop, device_us) = (stop.clone(), device_us.clone());
        let s = a.s.clone();
        let d = dispatch_request(a.slow, &a.slow_args);
        tokio::spawn(async move {
            let mut c = s.client.clone();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(r) = c.dispatch(s.req(d.clone())).await {
                    device_us.store(r.get_ref().device_ns / 1000, Ordering::Relaxed);
                }
            }
        });
    }
    (stop, device_us)
}

/// `msg` in the attacker's session with request id `id`.
fn with_id<T>(s: &Session, msg: T, id: u64) -> Request<T> {
    let mut r = s.req(msg);
    r.metadata_mut().insert(
        npu_proto::REQUEST_ID_HEADER,
        id.to_string().parse().expect("a decimal id"),
    );
    r
}

/// Completed runs of `program` on the device (chain links one each).
async fn runs(s: &Session, program: u64) -> u64 {
    let mut s = s.clone();
    let st = s.statistics().await.unwrap();
    st.programs
        .iter()
        .find(|p| p.program_id == program)
        .and_then(|p| p.dispatches.as_ref())
        .and_then(|d| d.success.as_ref())
        .map_or(0, |d| d.count)
}

fn code_of<T>(r: &Result<tonic::Response<T>, tonic::Status>) -> String {
    match r {
        Ok(_) => "OK".into(),
        Err(e) => format!("{:?}: {}", e.code(), e.message()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_whose_call_still_runs_is_not_forgotten_after_300_newer_ids() {
    let stand = Stand::start(Options::default()).await;
    let a = attacker(&stand).await;
    let (stop, device_us) = pump(&a);
    let attack = async {
        let before = runs(&a.s, a.held).await;
        let chain = || pb::ChainRequest {
            links: vec![dispatch_request(a.held, &a.held_args); LINKS],
        };
        // The call: a long chain, behind the backlog in its session's queue.
        let first = {
            let (s, req) = (a.s.clone(), with_id(&a.s, chain(), 1));
            let mut c = s.client.clone();
            tokio::spawn(async move { c.chain(req).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Newer ids, each answered at once (no such program), 16 at a time.
        let flood_started = Instant::now();
        let senders: Vec<_> = (0..16)
            .map(|k| {
                let s = a.s.clone();
                tokio::spawn(async move {
                    let mut c = s.client.clone();
                    for id in (2 + k..=NEWER + 1).step_by(16) {
                        let _ = c
                            .dispatch(with_id(&s, dispatch_request(u64::MAX, &[]), id))
                            .await;
                    }
                })
            })
            .collect();
        for t in senders {
            t.await.expect("a sender");
        }
        let flood = flood_started.elapsed();
        let still_running = !first.is_finished();
        // The retry of the first call; a second run, if any, has completed when it returns.
        let retry = a.s.client.clone().chain(with_id(&a.s, chain(), 1)).await;
        let first = first.await.expect("the first call");
        let ran = (runs(&a.s, a.held).await - before) as f64 / LINKS as f64;
        (code_of(&first), code_of(&retry), ran, still_running, flood)
    };
    let v = stand
        .attack("300 newer ids while a call runs", attack)
        .await;
    stop.store(true, Ordering::Relaxed);
    v.expect(
        "the call ran once and its retry got its answer",
        |(first, retry, ran, still_running, flood)| {
            let seen = format!(
                "first {first}, retry {retry}, ran {ran} time(s); the first call ({LINKS} links) \
                 was {} when the {NEWER} newer ids ({} ms) were done; a matmul of the backlog \
                 takes {} µs",
                if *still_running {
                    "still running"
                } else {
                    "done"
                },
                flood.as_millis(),
                device_us.load(Ordering::Relaxed)
            );
            if first == "OK" && retry == "OK" && *ran == 1.0 {
                Ok(seen)
            } else {
                Err(seen)
            }
        },
    )
    .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_reused_with_another_request_is_invalid_argument() {
    let stand = Stand::start(Options::default()).await;
    let a = attacker(&stand).await;
    let (stop, _) = pump(&a);
    let attack = async {
        let mut c = a.s.client.clone();
        let first = c
            .dispatch(with_id(&a.s, dispatch_request(a.quick, &a.quick_args), 7))
            .await;
        // The same id, another program and arguments.
        let reused = c
            .dispatch(with_id(&a.s, dispatch_request(a.slow, &a.slow_args), 7))
            .await;
        (code_of(&first), reused.map(|_| ()))
    };
    let v = stand
        .attack("a request id reused with another body", attack)
        .await;
    stop.store(true, Ordering::Relaxed);
    let _ = v
        .expect("answer (INVALID_ARGUMENT)", |(first, reused)| {
            let seen = format!(
                "first {first}, the same id with another request: {}",
                match reused {
                    Ok(()) => "OK (the first call's answer)".to_owned(),
                    Err(e) => format!("{:?}: {}", e.code(), e.message()),
                }
            );
            match reused {
                Err(e) if first == "OK" && e.code() == Code::InvalidArgument => Ok(seen),
                _ => Err(seen),
            }
        })
        .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_refused_before_it_ran_runs_when_retried() {
    let stand = Stand::start(Options::default()).await;
    let a = attacker(&stand).await;
    let (stop, _) = pump(&a);
    let attack = async {
        let mut c = a.s.client.clone();
        let before = runs(&a.s, a.quick).await;
        // A deadline far shorter than the backlog ahead of it: refused before it starts.
        let mut req = with_id(&a.s, dispatch_request(a.quick, &a.quick_args), 9);
        req.set_timeout(Duration::from_millis(5));
        let first = c.dispatch(req).await;
        // Settled: the refused call was taken off the queue before a call queued after it ran.
        let _ = c
            .dispatch(a.s.req(dispatch_request(a.slow, &a.slow_args)))
            .await;
        let ran_first = runs(&a.s, a.quick).await - before;
        let retry = c
            .dispatch(with_id(&a.s, dispatch_request(a.quick, &a.quick_args), 9))
            .await;
        let ran = runs(&a.s, a.quick).await - before;
        (code_of(&first), ran_first, code_of(&retry), ran)
    };
    let v = stand
        .attack("a retry after DEADLINE_EXCEEDED", attack)
        .await;
    stop.store(true, Ordering::Relaxed);
    v.expect(
        "the retry ran (not the refusal replayed)",
        |(first, ran_first, retry, ran)| {
            let seen = format!(
                "first {first} (ran {ran_first} time(s)), retry {retry}, ran {ran} time(s) in all"
            );
            if *ran_first == 0 && retry == "OK" && *ran == 1 {
                Ok(seen)
            } else {
                Err(seen)
            }
        },
    )
    .finish();
}
