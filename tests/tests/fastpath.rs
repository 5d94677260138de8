//! The fast path (`proto/npud/v1/ring.md`): dispatches through a session's shared-memory ring
//! give what `Dispatch` gives, a client scribbling on its ring harms nobody, and a ring lives
//! no longer than its session and its client.
//!
//! The reliability suite's probes run on ring sessions too: `reliability.rs`, `isolation.rs`
//! and `faults.rs` each have `*_on_the_fast_path` tests.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ConnectOptions, Program};
use npu_fd::ring::{self, Completion, RingArg, Submission, Word};
use npu_proto::v1 as pb;
use npud_e2e::ring::TestRing;
use npud_e2e::{Daemon, I32Copies, Mapped, Options, Session};
use tonic::Code;

/// Every test here finishes within this.
const LIMIT: Duration = Duration::from_secs(60);

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test finished within its bound")
}

const N: u32 = 1024;

fn program(c: &Client, name: &str, d: &EmuDesign) -> Program {
    Program::from_bytes(name, d.to_pdi(), d.insts(c.generation())).unwrap()
}

async fn client(d: &Daemon, fast_path: bool) -> Client {
    let c = Client::connect_with(
        Some(&format!("unix:{}", d.socket.display())),
        ConnectOptions {
            fast_path,
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(c.fast_path_active(), fast_path);
    c
}

/// Digits replaced by `#`: tensor and session ids differ between the two sessions compared.
fn shape(s: &str) -> String {
    let mut out = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// (successes, failures) of a session's dispatches in the daemon's statistics.
fn counts(st: &pb::Statistics, session: u64) -> (u64, u64) {
    let s = st
        .sessions
        .iter()
        .find(|s| s.session_id == session)
        .expect("the session is in the statistics");
    let d = s.dispatches.as_ref();
    (
        d.and_then(|d| d.success).map_or(0, |x| x.count),
        d.and_then(|d| d.fail).map_or(0, |x| x.count),
    )
}

/// What one session saw of a fixed series of dispatches: a result or an error (shaped), per
/// case, and its statistics.
async fn series(c: &Client) -> (Vec<String>, (u64, u64)) {
    let add = program(c, "add", &EmuDesign::vector_scalar_add(N, DType::I32, 1));
    let fault = program(c, "fault", &EmuDesign::fault(N));
    let mut input = c.alloc::<i32>(N as usize).await.unwrap();
    let mut out = c.alloc::<i32>(N as usize).await.unwrap();
    let mut short = c.alloc::<i32>(N as usize / 2).await.unwrap();
    let mut seen = Vec::new();
    for round in 0..3 {
        input.as_mut_slice().fill(round);
        let r = c.dispatch(&add, &[&input], &mut [&mut out]).await;
        seen.push(match r {
            Ok(_) => format!("ok {:?}", &out.as_slice()[..4]),
            Err(e) => format!("error {}", shape(&e.to_string())),
        });
    }
    // Refused by the daemon: an output too small for the design.
    let r = c.dispatch(&add, &[&input], &mut [&mut short]).await;
    seen.push(format!("{:?}", r.map_err(|e| shape(&e.to_string()))));
    // Failed on the device, then refused as quarantined.
    for _ in 0..2 {
        let r = c.dispatch(&fault, &[&input], &mut [&mut out]).await;
        seen.push(format!(
            "{:?}",
            r.map(|_| ()).map_err(|e| shape(&e.to_string()))
        ));
    }
    let st = c.statistics().await.unwrap();
    (seen, counts(&st, c.session_id()))
}

/// One daemon per way: a program's quarantine is daemon-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatches_give_the_same_results_errors_and_statistics_through_the_ring_and_grpc() {
    let opts = Options::default().env("NPUD_LIMITS__FAULT_BUDGET", "1000");
    let (d1, d2) = (Daemon::start(opts.clone()), Daemon::start(opts));
    bounded(async {
        let ring = client(&d1, true).await;
        let (ring_seen, ring_counts) = series(&ring).await;
        assert!(ring.fast_path_active(), "the ring stayed attached");
        let grpc = client(&d2, false).await;
        let (grpc_seen, grpc_counts) = series(&grpc).await;
        assert_eq!(ring_seen, grpc_seen);
        assert_eq!(ring_counts, grpc_counts);
        assert_eq!(ring_counts, (3, 3), "{ring_seen:?}");
        assert_eq!(ring_seen[2], "ok [3, 3, 3, 3]");
        let st = grpc.statistics().await.unwrap();
        assert_eq!(st.pending_dispatches, 0);
    })
    .await;
}

/// The same refusals, word for word, from a raw ring and from `Dispatch`: an unknown program,
/// an unknown tensor, and a slot the ring's rules refuse (which counts as a refused dispatch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_ring_answers_refusals_word_for_word_as_dispatch_does() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let mut s = Session::open(d.connect().await, "raw").await.unwrap();
        let p = s
            .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
            .await
            .unwrap()
            .program_id;
        let x = s.alloc_mapped(u64::from(N) * 4).await.unwrap();
        let cases = [(p + 1000, vec![x.id, x.id]), (p, vec![x.id, 999_999])];
        let mut grpc = Vec::new();
        for (prog, tensors) in &cases {
            grpc.push(s.dispatch(*prog, tensors).await.unwrap_err());
        }
        s.attach_ring().await.unwrap();
        for ((prog, tensors), g) in cases.iter().zip(&grpc) {
            let r = s.dispatch(*prog, tensors).await.unwrap_err();
            assert_eq!((r.code(), r.message()), (g.code(), g.message()));
        }
        // A second ring for the session is refused.
        let e = s
            .client
            .attach_ring(s.req(pb::AttachRingRequest {}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        // A slot with undefined flags: INVALID_ARGUMENT through the ring, counted.
        let ring = s.ring.clone().unwrap();
        let mut words = Submission {
            request_id: 77,
            program: p,
            timeout_ms: 0,
            args: vec![],
            queued: false,
        }
        .encode();
        words[3] |= 1 << 40;
        let c = tokio::task::spawn_blocking(move || raw_exchange(&ring, &words))
            .await
            .unwrap();
        assert_eq!((c.request_id, c.code), (77, Code::InvalidArgument as u32));
        assert!(c.message.contains("flags"), "{}", c.message);
        let st = s.statistics().await.unwrap();
        assert_eq!(counts(&st, s.id), (0, 5));
    })
    .await;
}

/// `Client::dispatch_now` (the blocking caller's path: Python's `dispatch`) answers what
/// `dispatch` answers, and declines, sending nothing, where it cannot run at once.
#[tokio::test(flavor = "multi_thread")]
async fn dispatch_now_answers_as_dispatch_does_and_declines_what_it_cannot_run_at_once() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let c = client(&d, true).await;
        let add = program(&c, "add", &EmuDesign::vector_scalar_add(N, DType::I32, 1));
        let mut input = c.alloc::<i32>(N as usize).await.unwrap();
        let mut out = c.alloc::<i32>(N as usize).await.unwrap();
        let mut short = c.alloc::<i32>(N as usize / 2).await.unwrap();
        input.as_mut_slice().fill(41);
        // Not registered yet: declined, nothing sent.
        let now = tokio::task::block_in_place(|| c.dispatch_now(&add, &[&input], &mut [&mut out]));
        assert!(now.is_none());
        let st = c.statistics().await.unwrap();
        assert_eq!(counts(&st, c.session_id()), (0, 0));
        c.register(&add).await.unwrap();
        let now = tokio::task::block_in_place(|| c.dispatch_now(&add, &[&input], &mut [&mut out]));
        now.expect("taken").expect("the dispatch runs");
        assert!(out.as_slice().iter().all(|v| *v == 42));
        // A refusal is the daemon's, word for word.
        let via_now =
            tokio::task::block_in_place(|| c.dispatch_now(&add, &[&input], &mut [&mut short]))
                .expect("taken")
                .unwrap_err()
                .to_string();
        let via_dispatch = c
            .dispatch(&add, &[&input], &mut [&mut short])
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(via_now, via_dispatch);
        let st = c.statistics().await.unwrap();
        assert_eq!(counts(&st, c.session_id()), (1, 2));
        // Without a ring: declined.
        let g = client(&d, false).await;
        let gadd = program(&g, "add", &EmuDesign::vector_scalar_add(N, DType::I32, 1));
        g.register(&gadd).await.unwrap();
        let gi = g.alloc::<i32>(N as usize).await.unwrap();
        let mut go = g.alloc::<i32>(N as usize).await.unwrap();
        assert!(
            tokio::task::block_in_place(|| g.dispatch_now(&gadd, &[&gi], &mut [&mut go])).is_none()
        );
    })
    .await;
}

/// Submits raw words as the next slot of a ring no one else uses, and waits for the
/// completion.
fn raw_exchange(r: &TestRing, words: &[u64]) -> Completion {
    let m = &r.mem;
    let tail = m.load(Word::SqTail);
    let head = m.load(Word::CqHead);
    m.write_raw_submission(tail, words);
    m.store(Word::SqTail, tail.wrapping_add(1));
    m.ring(Word::SqBell);
    for _ in 0..5000 {
        if m.load(Word::CqTail) != head {
            let c = Completion::decode(&m.read_completion(head));
            m.store(Word::CqHead, head.wrapping_add(1));
            return c;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("no completion within 10 s");
}

/// A small xorshift: the scribbler's choices, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Below `n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }

    fn u32(&mut self) -> u32 {
        u32::try_from(self.next() >> 32).unwrap_or(0)
    }
}

/// A client that scribbles on its ring from several threads (random header words, head
/// beyond tail, huge counts, torn slots rewritten while the daemon copies them, slots naming
/// another session's tensors) cannot crash, stall or mislead the daemon: another session on a
/// ring and one on gRPC keep dispatching and verifying every result meanwhile, the victim's
/// tensors are never touched, and afterwards the scribbler's session still works over gRPC and
/// can attach a new ring. The rings it breaks are torn down, each time after at most the
/// work it admitted has run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_scribbling_on_its_ring_cannot_crash_stall_or_mislead_the_daemon() {
    let mut d = Daemon::start(Options::default());
    bounded(async {
        // The victim: its tensors' ids are what the scribbler names.
        let victim = client(&d, true).await;
        let add = program(
            &victim,
            "add",
            &EmuDesign::vector_scalar_add(N, DType::I32, 1),
        );
        let mut vin = victim.alloc::<i32>(N as usize).await.unwrap();
        let mut vout = victim.alloc::<i32>(N as usize).await.unwrap();
        let grpc = client(&d, false).await;
        let gadd = program(
            &grpc,
            "add",
            &EmuDesign::vector_scalar_add(N, DType::I32, 2),
        );
        let mut gin = grpc.alloc::<i32>(N as usize).await.unwrap();
        let mut gout = grpc.alloc::<i32>(N as usize).await.unwrap();
        vin.as_mut_slice().fill(1);
        victim
            .dispatch(&add, &[&vin], &mut [&mut vout])
            .await
            .unwrap();
        // The victim's tensors, and every id near them.
        let top = vin.id().max(vout.id()).max(gin.id()).max(gout.id());
        let victim_ids: Vec<u64> = (1..=top + 8).collect();

        let mut s = Session::open(d.connect().await, "scribbler").await.unwrap();
        let sp = s
            .register(&EmuDesign::vector_scalar_add(N, DType::I32, 5))
            .await
            .unwrap()
            .program_id;
        let own = s.alloc_mapped(u64::from(N) * 4).await.unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let broken = Arc::new(AtomicU64::new(0));
        let mut rounds = 0;
        let started = std::time::Instant::now();
        let mut checked = 0u64;
        while started.elapsed() < Duration::from_secs(6) || rounds < 3 {
            rounds += 1;
            attach_once_the_old_ring_is_gone(&mut s).await;
            let ring = s.ring.take().unwrap();
            stop.store(false, Ordering::SeqCst);
            let mut threads = Vec::new();
            for t in 0..3u64 {
                let ring = ring.clone();
                let stop = stop.clone();
                let ids = victim_ids.clone();
                let own = own.id;
                threads.push(std::thread::spawn(move || {
                    scribble(&ring, t + rounds * 7919, &stop, &ids, own, sp);
                }));
            }
            // Others keep working, and every result is right.
            for k in 0..40 {
                vin.as_mut_slice().fill(k);
                victim
                    .dispatch(&add, &[&vin], &mut [&mut vout])
                    .await
                    .unwrap();
                assert!(vout.as_slice().iter().all(|v| *v == k + 1));
                gin.as_mut_slice().fill(k);
                grpc.dispatch(&gadd, &[&gin], &mut [&mut gout])
                    .await
                    .unwrap();
                assert!(gout.as_slice().iter().all(|v| *v == k + 2));
                checked += 2;
            }
            stop.store(true, Ordering::SeqCst);
            for t in threads {
                t.join().unwrap();
            }
            if ring.mem.load(Word::State) == ring::STATE_BROKEN {
                broken.fetch_add(1, Ordering::SeqCst);
            }
            // Dropping the ring closes its lifeline: the daemon tears it down (if the
            // scribbling had not broken it), and a new one can be attached.
            drop(ring);
            attach_once_the_old_ring_is_gone(&mut s).await;
            // The fresh ring works.
            let r = s.dispatch(sp, &[own.id, own.id]).await;
            assert!(r.is_ok(), "{r:?}");
            s.ring = None;
        }
        assert!(d.running(), "the daemon survived the scribbling");
        assert!(
            broken.load(Ordering::SeqCst) > 0,
            "the scribbling broke a ring's rules"
        );
        // The victim's tensors were never an argument of the scribbler's work: the last
        // result is still there.
        assert!(vout.as_slice().iter().all(|v| *v == 40));
        // Over gRPC the scribbler's session is fine, and nothing stays pending.
        s.ring = None;
        s.dispatch(sp, &[own.id, own.id]).await.unwrap();
        let st = loop {
            let st = s.statistics().await.unwrap();
            if st.pending_dispatches == 0 {
                break st;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(counts(&st, victim.session_id()).1, 0);
        assert_eq!(counts(&st, grpc.session_id()).1, 0);
        assert!(checked >= 240);
    })
    .await;
}

/// Scribbles until `stop`: valid slots naming other sessions' tensors, slots rewritten under
/// the daemon, random header words, tails far ahead, heads behind.
fn scribble(r: &TestRing, seed: u64, stop: &AtomicBool, ids: &[u64], own: u64, program: u64) {
    let m = &r.mem;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    while !stop.load(Ordering::SeqCst) {
        let pick = rng.next() % 10;
        let index = (rng.next() % 1024) as u32;
        match pick {
            0..=3 => {
                // A plausible slot naming someone else's tensors, or garbage words.
                let a = ids[rng.below(ids.len())];
                let s = Submission {
                    request_id: rng.next(),
                    program: if rng.next().is_multiple_of(2) {
                        program
                    } else {
                        rng.next() % 64
                    },
                    timeout_ms: rng.next() % 3,
                    args: vec![
                        RingArg {
                            tensor: a,
                            offset: rng.next() % 8192,
                            length: rng.next() % 8192,
                            read_only: false,
                        },
                        RingArg {
                            tensor: own,
                            offset: 0,
                            length: 0,
                            read_only: false,
                        },
                    ],
                    // Half of them a pipeline's: queued, never refused for the limit.
                    queued: rng.next().is_multiple_of(2),
                };
                m.write_submission(index, &s);
            }
            4 => {
                let words: Vec<u64> = (0..64).map(|_| rng.next()).collect();
                m.write_raw_submission(index, &words);
            }
            5 => {
                // Publish a little: the daemon takes what is there.
                let t = m.load(Word::SqTail);
                m.store(Word::SqTail, t.wrapping_add((rng.next() % 4) as u32));
                m.ring(Word::SqBell);
            }
            6 => m.store(Word::SqTail, rng.u32()),
            7 => m.store(Word::CqHead, rng.u32()),
            8 => {
                // The daemon's own words: it never reads them back (`state` is left alone
                // only so that the test can read what the daemon said).
                let w = [Word::SqHead, Word::SqBell, Word::SqSleeping, Word::CqTail]
                    [(rng.next() % 4) as usize];
                m.store(w, rng.u32());
                m.ring(Word::SqBell);
            }
            _ => {
                // Consume completions as a client would, so the ring does not just fill.
                let t = m.load(Word::CqTail);
                m.store(Word::CqHead, t);
            }
        }
    }
}

/// A ring ends with its lifeline (the client died) and with its session, and the daemon's
/// reader for it is gone then (a new ring can be attached to a living session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_is_torn_down_when_its_lifeline_closes_or_its_session_ends() {
    let d = Daemon::start(Options {
        grace_ms: 60_000,
        ..Options::default()
    });
    bounded(async {
        let (mut s, p, mut x, y) = adder(&d, "lifeline").await;
        x.map.fill_i32(41).unwrap();
        s.attach_ring().await.unwrap();
        s.dispatch(p, &[x.id, y.id]).await.unwrap();
        assert!(y.map.i32s().unwrap().iter().all(|v| *v == 42));
        let ring = s.ring.take().unwrap();
        let mem = ring.mem.clone();
        // The client's end of the lifeline closes, as when the process dies; the memory stays
        // mapped here, so the teardown is visible in it.
        drop(Arc::try_unwrap(ring).unwrap().lifeline);
        wait_state(&mem, ring::STATE_CLOSED).await;
        s.attach_ring().await.unwrap();
        let mem = s.ring.as_ref().unwrap().mem.clone();
        s.dispatch(p, &[x.id, y.id]).await.unwrap();
        s.client
            .close_session(s.req(pb::CloseSessionRequest {}))
            .await
            .unwrap();
        wait_state(&mem, ring::STATE_CLOSED).await;
        // The ring took nothing more: the dispatch goes through gRPC (as the ring spec lets a
        // client), which says the session was closed.
        let e = s.dispatch(p, &[x.id, y.id]).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("was closed (CloseSession)"), "{e:?}");
    })
    .await;
}

/// A client that stops consuming completions stalls its own ring and nobody else: the daemon
/// takes what fits, answers it, and posts it once the client makes room, without a bell.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_stops_consuming_completions_stalls_only_its_own_ring() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let (mut s, p, x, y) = adder(&d, "stalled").await;
        s.attach_ring().await.unwrap();
        let (mut o, q, a, b) = adder(&d, "other").await;
        let mem = s.ring.clone().unwrap().mem.clone();
        let submit = |first: u64| {
            for id in first..first + u64::from(ring::SLOTS) {
                let tail = mem.load(Word::SqTail);
                mem.write_submission(tail, &whole(id, p, &[x.id, y.id]));
                mem.store(Word::SqTail, tail.wrapping_add(1));
                mem.ring(Word::SqBell);
            }
        };
        let until = |w: Word, v: u32| {
            let mem = mem.clone();
            async move {
                while mem.load(w) != v {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        };
        // A ring's worth, answered and posted; the client reads none of it.
        submit(1);
        until(Word::CqTail, ring::SLOTS).await;
        // A second ring's worth is copied out and run, but the completion ring is full.
        submit(u64::from(ring::SLOTS) + 1);
        until(Word::SqHead, 2 * ring::SLOTS).await;
        // Meanwhile another session is served, again and again.
        for _ in 0..20 {
            o.dispatch(q, &[a.id, b.id]).await.unwrap();
        }
        assert_eq!(
            mem.load(Word::CqTail),
            ring::SLOTS,
            "nothing was overwritten"
        );
        assert_eq!(mem.load(Word::State), 0);
        // The client reads the first ring's worth and makes room, ringing nothing: the daemon
        // posts the rest in order.
        let mut ids = Vec::new();
        for i in 0..ring::SLOTS {
            let c = Completion::decode(&mem.read_completion(i));
            assert_eq!(c.code, 0, "{}", c.message);
            ids.push(c.request_id);
        }
        mem.store(Word::CqHead, ring::SLOTS);
        until(Word::CqTail, 2 * ring::SLOTS).await;
        for i in ring::SLOTS..2 * ring::SLOTS {
            let c = Completion::decode(&mem.read_completion(i));
            assert_eq!(c.code, 0, "{}", c.message);
            ids.push(c.request_id);
        }
        mem.store(Word::CqHead, 2 * ring::SLOTS);
        assert_eq!(ids, (1..=2 * u64::from(ring::SLOTS)).collect::<Vec<_>>());
        let st = s.statistics().await.unwrap();
        assert_eq!(counts(&st, s.id), (2 * u64::from(ring::SLOTS), 0));
        assert!(y.map.i32s().unwrap().iter().all(|v| *v == 1));
    })
    .await;
}

/// Submissions past the session's pending limit are refused `RESOURCE_EXHAUSTED` through the
/// ring as concurrent `Dispatch` calls are, whether the daemon's limit or the session's rule
/// sets it; the ones within it run. Queued slots (a pipeline's) are a `Submit` stream's items
/// instead: published far past the limit at once, they all run, in order.
#[tokio::test(flavor = "multi_thread")]
async fn submissions_past_the_pending_limit_are_refused_through_the_ring_as_dispatch_calls_are() {
    let dir = tempfile::tempdir().unwrap();
    let rule = dir.path().join("npud.toml");
    std::fs::write(
        &rule,
        "[[auth.rules]]\nname = \"local\"\nmatch = [\"uid:*\"]\nmax_pending_per_session = 2\n",
    )
    .unwrap();
    for (opts, key) in [
        (
            Options::default().env("NPUD_LIMITS__MAX_PENDING_PER_SESSION", "2"),
            "limits.max_pending_per_session",
        ),
        (
            Options::default()
                .arg("--config")
                .arg(&rule.display().to_string()),
            "auth.rules[\"local\"].max_pending_per_session",
        ),
    ] {
        let d = Daemon::start(opts);
        bounded(async {
            let (mut s, p, x, y) = adder(&d, "limited").await;
            s.attach_ring().await.unwrap();
            let mem = s.ring.clone().unwrap().mem.clone();
            // Four slots published at once: the daemon takes them in one look.
            let subs: Vec<Submission> = (1..=4).map(|id| whole(id, p, &[x.id, y.id])).collect();
            publish(&mem, 0, &subs);
            until(&mem, Word::CqTail, |t| t == 4).await;
            let got: Vec<(u64, u32, String)> = (0..4)
                .map(|i| {
                    let c = Completion::decode(&mem.read_completion(i));
                    (c.request_id, c.code, c.message)
                })
                .collect();
            mem.store(Word::CqHead, 4);
            assert_eq!((got[0].0, got[0].1), (1, 0), "{got:?}");
            assert_eq!((got[1].0, got[1].1), (2, 0), "{got:?}");
            for (id, code, message) in &got[2..] {
                assert_eq!(
                    *code,
                    Code::ResourceExhausted as u32,
                    "request {id}: {message}"
                );
                assert!(message.contains(key), "request {id}: {message}");
            }
            let st = s.statistics().await.unwrap();
            assert_eq!(counts(&st, s.id), (2, 2));
            // Twenty queued slots at once, ten times the limit.
            let queued: Vec<Submission> = (5..=24)
                .map(|id| Submission {
                    queued: true,
                    ..whole(id, p, &[x.id, y.id])
                })
                .collect();
            publish(&mem, 4, &queued);
            until(&mem, Word::CqTail, |t| t == 24).await;
            for i in 4..24_u32 {
                let c = Completion::decode(&mem.read_completion(i));
                assert_eq!(
                    (c.request_id, c.code),
                    (u64::from(i) + 1, 0),
                    "{}",
                    c.message
                );
            }
            mem.store(Word::CqHead, 24);
            let st = s.statistics().await.unwrap();
            assert_eq!(counts(&st, s.id), (22, 2));
            assert_eq!(st.pending_dispatches, 0);
        })
        .await;
    }
}

/// Queued slots are taken a `Submit` stream's window at a time (the session's pending limit):
/// while a hanging dispatch holds the device, the daemon has copied out only the window's
/// worth of what was published, and the rest wait in the ring, to run after it.
#[tokio::test(flavor = "multi_thread")]
async fn queued_slots_are_taken_a_submit_windows_worth_at_a_time() {
    let d = Daemon::start(
        Options::default()
            .env("NPUD_LIMITS__MAX_PENDING_PER_SESSION", "2")
            .arg("--emulator-timeout-ms")
            .arg("1500"),
    );
    bounded(async {
        let (mut s, p, x, y) = adder(&d, "window").await;
        let hang = s
            .register(&EmuDesign::hang(N * 4))
            .await
            .unwrap()
            .program_id;
        s.attach_ring().await.unwrap();
        let mem = s.ring.clone().unwrap().mem.clone();
        let queued: Vec<Submission> = (0..10)
            .map(|id| Submission {
                queued: true,
                ..whole(id, if id == 0 { hang } else { p }, &[x.id, y.id])
            })
            .collect();
        publish(&mem, 0, &queued);
        until(&mem, Word::SqHead, |h| h >= 2).await;
        // The hang holds the device for 1.5 s; look well inside it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(mem.load(Word::SqHead), 2, "a window's worth copied out");
        assert_eq!(mem.load(Word::CqTail), 0, "the hang is still running");
        let st = s.statistics().await.unwrap();
        assert_eq!(st.pending_dispatches, 2);
        until(&mem, Word::CqTail, |t| t == 10).await;
        let got: Vec<(u64, u32)> = (0..10)
            .map(|i| {
                let c = Completion::decode(&mem.read_completion(i));
                (c.request_id, c.code)
            })
            .collect();
        assert_eq!(got[0].0, 0);
        assert_ne!(got[0].1, 0, "the hang fails");
        for (i, (id, code)) in got.iter().enumerate().skip(1) {
            assert_eq!((*id, *code), (i as u64, 0));
        }
        assert!(y.map.i32s().unwrap().iter().all(|v| *v == 1));
    })
    .await;
}

/// A client that publishes a submission without ringing the bell while the daemon sleeps is
/// still answered: the ring's thread looks at `sq_tail` when its sleep runs out (once a
/// second) and wakes the executor.
#[tokio::test(flavor = "multi_thread")]
async fn a_submission_whose_bell_was_never_rung_is_answered_all_the_same() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let (mut s, p, mut x, y) = adder(&d, "silent").await;
        x.map.fill_i32(6).unwrap();
        s.attach_ring().await.unwrap();
        let mem = s.ring.clone().unwrap().mem.clone();
        // Long enough for the executor to stop polling and block.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(mem.load(Word::SqSleeping), 1, "the daemon asks to be rung");
        mem.write_submission(0, &whole(9, p, &[x.id, y.id]));
        mem.store(Word::SqTail, 1);
        while mem.load(Word::CqTail) != 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let c = Completion::decode(&mem.read_completion(0));
        assert_eq!((c.request_id, c.code), (9, 0), "{}", c.message);
        assert!(y.map.i32s().unwrap().iter().all(|v| *v == 7));
    })
    .await;
}

/// A session named `name` with the add-one design registered and two tensors of its size.
async fn adder(d: &Daemon, name: &str) -> (Session, u64, Mapped, Mapped) {
    let mut s = Session::open(d.connect().await, name).await.unwrap();
    let p = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let x = s.alloc_mapped(u64::from(N) * 4).await.unwrap();
    let y = s.alloc_mapped(u64::from(N) * 4).await.unwrap();
    (s, p, x, y)
}

/// A submission of `program` over whole `tensors`, written.
fn whole(request_id: u64, program: u64, tensors: &[u64]) -> Submission {
    let d = pb::DispatchRequest {
        program_id: program,
        args: tensors
            .iter()
            .map(|&t| pb::TensorArg {
                tensor_id: t,
                ..Default::default()
            })
            .collect(),
    };
    npu_client::fastpath::submission(request_id, &d, None)
}

/// Writes `subs` into the slots from index `from` on, publishes them with one store of
/// `sq_tail` and rings the daemon's bell; returns the new tail.
fn publish(mem: &npu_fd::ring::RingMemory, from: u32, subs: &[Submission]) -> u32 {
    let mut tail = from;
    for sub in subs {
        mem.write_submission(tail, sub);
        tail += 1;
    }
    mem.store(Word::SqTail, tail);
    mem.ring(Word::SqBell);
    tail
}

/// Waits until the ring's `word` satisfies `done` (the test's [`bounded`] ends a wait that
/// never does).
async fn until(mem: &npu_fd::ring::RingMemory, word: Word, done: impl Fn(u32) -> bool) {
    while !done(mem.load(word)) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn wait_state(mem: &npu_fd::ring::RingMemory, want: u32) {
    for _ in 0..1000 {
        if mem.load(Word::State) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the ring's state stayed {}", mem.load(Word::State));
}

/// Dispatches published at once, each reading what the one before it wrote, with a device
/// fault among them: the daemon rings a session's queued dispatches together (one doorbell
/// batch), and still every dispatch is answered in order as if it had rung alone. Those before
/// the fault completed, the fault is answered as a fault (its program quarantined), and those
/// after it ran afterwards, in order: the last value counts every increment.
#[tokio::test(flavor = "multi_thread")]
async fn dependent_dispatches_published_at_once_run_in_order_around_a_fault() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let (mut s, add, x, y) = adder(&d, "pipelined").await;
        let fault = s
            .register(&EmuDesign::fault(N * 4))
            .await
            .unwrap()
            .program_id;
        let f = [
            s.alloc_mapped(u64::from(N) * 4).await.unwrap(),
            s.alloc_mapped(u64::from(N) * 4).await.unwrap(),
        ];
        s.attach_ring().await.unwrap();
        let mem = s.ring.clone().unwrap().mem.clone();
        // x → y, y → x, ...: 20 increments, with the fault published after the 10th.
        let mut subs = Vec::new();
        for k in 0..20u64 {
            if k == 10 {
                subs.push(whole(100, fault, &[f[0].id, f[1].id]));
            }
            let (from, to) = if k % 2 == 0 {
                (x.id, y.id)
            } else {
                (y.id, x.id)
            };
            subs.push(whole(k + 1, add, &[from, to]));
        }
        // Published at once, with one bell: the executor finds them queued together.
        let n = publish(&mem, 0, &subs);
        until(&mem, Word::CqTail, |t| t == n).await;
        let done: Vec<Completion> = (0..n)
            .map(|i| Completion::decode(&mem.read_completion(i)))
            .collect();
        mem.store(Word::CqHead, n);
        let ids: Vec<u64> = done.iter().map(|c| c.request_id).collect();
        let want: Vec<u64> = subs.iter().map(|s| s.request_id).collect();
        assert_eq!(ids, want, "answered in the order published");
        for c in &done {
            if c.request_id == 100 {
                assert_eq!(c.code, Code::Internal as u32, "{}", c.message);
                assert!(c.message.contains("is quarantined"), "{}", c.message);
            } else {
                assert_eq!(c.code, 0, "dispatch {}: {}", c.request_id, c.message);
                assert!(c.device_ns > 0, "{c:?}");
            }
        }
        // The 20th increment wrote x, the 19th y.
        assert!(x.map.i32s().unwrap().iter().all(|v| *v == 20));
        assert!(y.map.i32s().unwrap().iter().all(|v| *v == 19));
        let st = s.statistics().await.unwrap();
        assert_eq!(counts(&st, s.id), (20, 1));
    })
    .await;
}

/// The daemon reads `cq_head` only when the completions it knows consumed leave no room
/// (`proto/npud/v1/ring.md`): a `cq_head` ahead of `cq_tail` is harmless while there is room,
/// and breaks the ring (`broken` 2) once the completion ring fills, with nothing overwritten.
/// A head read earlier never lets the daemon post over a completion the client has not
/// consumed.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_cq_head_breaks_the_ring_when_the_completion_ring_fills() {
    let d = Daemon::start(Options::default());
    bounded(async {
        let (mut s, p, x, y) = adder(&d, "bad-head").await;
        s.attach_ring().await.unwrap();
        let mem = s.ring.clone().unwrap().mem.clone();
        let slots = ring::SLOTS;
        // Half a ring's worth, answered; the client consumes them and then claims far more.
        let subs: Vec<Submission> = (1..=u64::from(slots / 2))
            .map(|id| whole(id, p, &[x.id, y.id]))
            .collect();
        let tail = publish(&mem, 0, &subs);
        until(&mem, Word::CqTail, |t| t == slots / 2).await;
        mem.store(Word::CqHead, slots / 2 + 1000);
        // Room is left as far as the daemon knows: the next half is answered and posted, and the
        // bad head goes unread.
        let subs: Vec<Submission> = (u64::from(slots / 2) + 1..=u64::from(slots))
            .map(|id| whole(id, p, &[x.id, y.id]))
            .collect();
        let tail = publish(&mem, tail, &subs);
        until(&mem, Word::CqTail, |t| t == slots).await;
        assert_eq!(
            mem.load(Word::State),
            0,
            "read only when the ring looks full"
        );
        // The completion ring is full as far as the daemon knows: it reads the head, which is
        // ahead of its tail, and tears the ring down without posting.
        publish(&mem, tail, &[whole(u64::from(slots) + 1, p, &[x.id, y.id])]);
        wait_state(&mem, ring::STATE_BROKEN).await;
        assert_eq!(mem.load(Word::Broken), ring::BROKEN_CQ_HEAD);
        assert_eq!(
            mem.load(Word::CqTail),
            slots,
            "nothing was posted past the full ring"
        );
        let ids: Vec<u64> = (0..slots)
            .map(|i| Completion::decode(&mem.read_completion(i)).request_id)
            .collect();
        assert_eq!(ids, (1..=u64::from(slots)).collect::<Vec<_>>());
        // The session lives on, and every dispatch that ran is counted: the last one too,
        // whose answer found the ring full and was counted, not posted.
        let st = s.statistics().await.unwrap();
        assert_eq!(counts(&st, s.id), (u64::from(slots) + 1, 0));
    })
    .await;
}

/// Attaches a ring to `s` once the daemon has torn down the one `s` let go of (it does so when
/// it sees the lifeline close, which a client does not wait for): AttachRing answers
/// FAILED_PRECONDITION until then.
async fn attach_once_the_old_ring_is_gone(s: &mut Session) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match s.attach_ring().await {
            Ok(()) => return,
            Err(e) if e.code() == Code::FailedPrecondition => {
                assert!(
                    std::time::Instant::now() < until,
                    "the old ring was never torn down: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("AttachRing: {e:?}"),
        }
    }
}
