//! The bystander: a client on a thread of its own that calls the daemon without pause and
//! records how long each call took.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;

use crate::{Session, connect_unix, dispatch_request};

/// The longest a bystander call may take before it counts as failed.
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// Elements of the bystander's program (vector_scalar_add over i32): 4 KiB tensors.
const ELEMENTS: u32 = 1024;

/// One call of the bystander.
#[derive(Debug, Clone)]
struct Sample {
    start: Instant,
    took: Duration,
    error: Option<String>,
    /// A `Dispatch` (through the executor), not a `GetDeviceInfo` (the I/O thread only).
    dispatch: bool,
}

#[derive(Debug, Default)]
struct Shared {
    samples: Mutex<Vec<Sample>>,
    /// When the call under way started.
    current: Mutex<Option<Instant>>,
    stop: AtomicBool,
    paused: AtomicBool,
}

/// The pace [`Latencies::p99_paced`] assumes: one call per ms (about twice a call's median on
/// the development VM).
pub const PACE: Duration = Duration::from_millis(1);

/// The bystander's calls in one window.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    /// Calls answered in the window, and (for an attack's window) the one still under way at its
    /// end, counted with the time it had taken by then. A call is counted where it ends: one
    /// that starts before an attack and ends during it counts for the attack.
    pub calls: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub p50: Duration,
    pub p99: Duration,
    /// The p99 of the calls paced at [`PACE`]: a call that takes longer also counts for the
    /// calls it held up (HdrHistogram's correction for coordinated omission), so that one stall
    /// of seconds among thousands of fast calls shows. Reported, not asserted: one scheduling
    /// hiccup of 1 % of a window moves it too.
    pub p99_paced: Duration,
    pub max: Duration,
    /// The p99 of the `GetDeviceInfo` calls (served on the I/O thread alone) and of the
    /// `Dispatch` calls (which also wait for the executor): which part of the daemon an attack
    /// slowed.
    pub p99_info: Duration,
    pub p99_dispatch: Duration,
}

impl Latencies {
    fn of(took: Vec<(Duration, bool)>, errors: usize, first_error: Option<String>) -> Latencies {
        let nearest_rank = |sorted: &[Duration], q: f64| -> Duration {
            if sorted.is_empty() {
                return Duration::ZERO;
            }
            // q in [0, 1]: the rank is within 0..=len.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            sorted[rank - 1]
        };
        let kind = |dispatch: bool| -> Vec<Duration> {
            let mut v: Vec<Duration> = took
                .iter()
                .filter(|(_, d)| *d == dispatch)
                .map(|(t, _)| *t)
                .collect();
            v.sort_unstable();
            v
        };
        let (info, dispatch) = (kind(false), kind(true));
        let mut took: Vec<Duration> = took.into_iter().map(|(t, _)| t).collect();
        took.sort_unstable();
        let mut paced = took.clone();
        for t in &took {
            let mut missed = t.saturating_sub(PACE);
            while missed >= PACE {
                paced.push(missed);
                missed -= PACE;
            }
        }
        paced.sort_unstable();
        Latencies {
            calls: took.len(),
            errors,
            first_error,
            p50: nearest_rank(&took, 0.50),
            p99: nearest_rank(&took, 0.99),
            p99_paced: nearest_rank(&paced, 0.99),
            max: took.last().copied().unwrap_or_default(),
            p99_info: nearest_rank(&info, 0.99),
            p99_dispatch: nearest_rank(&dispatch, 0.99),
        }
    }
}

/// A bystander calling the daemon at `socket` on its own thread: `GetDeviceInfo` and a
/// `Dispatch` of a 1024-element vector_scalar_add in its own session, in turn, one at a time,
/// on one connection. Stopped on drop.
#[derive(Debug)]
pub struct Bystander {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Its thread's id, kept at its priority while an attack runs ([`super::nice`]).
    tid: rustix::process::Pid,
}

impl Bystander {
    /// Starts it and waits until its session is set up and it has made 200 calls.
    ///
    /// # Errors
    /// What failed while setting up.
    pub fn start(socket: &Path) -> Result<Bystander, String> {
        let shared = Arc::new(Shared::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let socket = socket.to_path_buf();
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("bystander".into())
                .spawn(move || {
                    let _ = tid_tx.send(rustix::thread::gettid());
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("a runtime: {e}")));
                            return;
                        }
                    };
                    rt.block_on(run(&socket, &shared, ready_tx));
                })
                .map_err(|e| format!("a thread: {e}"))?
        };
        let tid = tid_rx
            .recv()
            .map_err(|_| "the thread ended before it started".to_owned())?;
        let b = Bystander {
            shared,
            thread: Some(thread),
            tid,
        };
        match ready_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => Ok(b),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("not set up within 60 s".into()),
        }
    }

    /// Stops calling (once the call under way is answered) until [`Bystander::resume`], so that
    /// the daemon's CPU time can be measured without the bystander's share.
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
        let until = Instant::now() + CALL_LIMIT + Duration::from_secs(1);
        while self
            .shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
            && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Its thread's id.
    pub fn tid(&self) -> rustix::process::Pid {
        self.tid
    }

    /// Calls again after [`Bystander::pause`].
    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
    }

    /// The calls answered in `[from, to)`, and with `in_flight` the one under way at `to`.
    pub fn between(&self, from: Instant, to: Instant, in_flight: bool) -> Latencies {
        let now = Instant::now();
        let mut took = Vec::new();
        let mut errors = 0;
        let mut first_error = None;
        let samples = self
            .shared
            .samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for s in samples
            .iter()
            .filter(|s| s.start + s.took >= from && s.start + s.took < to)
        {
            took.push((s.took, s.dispatch));
            if let Some(e) = &s.error {
                errors += 1;
                first_error.get_or_insert_with(|| e.clone());
            }
        }
        // Read under the samples' lock, which the caller also holds when it ends a call.
        let current = *self
            .shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        drop(samples);
        if in_flight
            && let Some(start) = current
            && start < to
        {
            // Whichever call it is: counted with the dispatches, the slower kind.
            took.push((now - start, true));
        }
        Latencies::of(took, errors, first_error)
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn run(socket: &Path, shared: &Shared, ready: std::sync::mpsc::Sender<Result<(), String>>) {
    let setup = async {
        let client = NpudClient::new(connect_unix(socket).await);
        let mut s = Session::open(client, "bystander")
            .await
            .map_err(|e| format!("OpenSession: {e}"))?;
        let design = EmuDesign::vector_scalar_add(ELEMENTS, DType::I32, 1);
        let program = s
            .register(&design)
            .await
            .map_err(|e| format!("RegisterProgram: {e}"))?
            .program_id;
        let bytes = u64::from(ELEMENTS) * 4;
        let a = s.alloc_mapped(bytes).await?;
        let b = s.alloc_mapped(bytes).await?;
        Ok::<_, String>((s, program, a, b))
    };
    let (s, program, a, b) = match setup.await {
        Ok(v) => v,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut client = s.client.clone();
    let mut n: u64 = 0;
    let mut ready = Some(ready);
    while !shared.stop.load(Ordering::SeqCst) {
        if shared.paused.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let start = Instant::now();
        *shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(start);
        let dispatch = !n.is_multiple_of(2);
        let r = if !dispatch {
            tokio::time::timeout(
                CALL_LIMIT,
                client.get_device_info(pb::GetDeviceInfoRequest {}),
            )
            .await
            .map(|r| r.map(|_| ()))
        } else {
            tokio::time::timeout(
                CALL_LIMIT,
                client.dispatch(s.req(dispatch_request(program, &[a.id, b.id]))),
            )
            .await
            .map(|r| r.map(|_| ()))
        };
        let took = start.elapsed();
        let error = match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!(
                "{} {:?}: {}",
                if n.is_multiple_of(2) {
                    "GetDeviceInfo"
                } else {
                    "Dispatch"
                },
                e.code(),
                e.message()
            )),
            Err(_) => Some(format!("no answer within {CALL_LIMIT:?}")),
        };
        let failed = error.is_some();
        {
            let mut samples = shared
                .samples
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            samples.push(Sample {
                start,
                took,
                error,
                dispatch,
            });
            *shared
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
        n += 1;
        if n == 200
            && let Some(r) = ready.take()
        {
            let _ = r.send(Ok(()));
        }
        if failed {
            // A dead daemon fails every call at once: no need to spin on it.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    drop((a, b));
}
