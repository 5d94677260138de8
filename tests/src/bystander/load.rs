//! The bystander: a client process of its own (`npud-bystander`, built in release beside the
//! daemon) that calls the daemon without pause and reports how long each call took; here, what
//! it reported, read by a thread of the test process.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest a bystander call may take before it counts as failed.
pub const CALL_LIMIT: Duration = Duration::from_secs(10);
/// Elements of the bystander's program (vector_scalar_add over i32): 4 KiB tensors.
pub const ELEMENTS: u32 = 1024;

/// Now on `CLOCK_MONOTONIC` in ns: the clock `Instant` reads, shared by the bystander's process
/// and the harness's.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

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
struct Reported {
    samples: Vec<Sample>,
    /// When the call under way started.
    current: Option<Instant>,
    /// `ready`, or why it could not set up.
    ready: Option<Result<(), String>>,
    /// It said `paused` since it was last asked to pause.
    paused: bool,
    /// Its output ended.
    gone: bool,
}

#[derive(Debug, Default)]
struct Shared {
    reported: Mutex<Reported>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Reported> {
        self.reported.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits up to `limit` for `done` to hold of what was reported.
    fn wait_for(&self, limit: Duration, done: impl Fn(&Reported) -> bool) -> bool {
        let g = self.lock();
        let (g, _) = self
            .changed
            .wait_timeout_while(g, limit, |r| !done(r) && !r.gone)
            .unwrap_or_else(PoisonError::into_inner);
        done(&g)
    }
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

/// A bystander calling the daemon at `socket` from a process of its own: `GetDeviceInfo` and a
/// `Dispatch` of a 1024-element vector_scalar_add in its own session, in turn, one at a time,
/// on one connection. Stopped on drop.
#[derive(Debug)]
pub struct Bystander {
    shared: Arc<Shared>,
    child: Child,
    /// Its input (`pause`, `resume`); closing it stops the bystander.
    input: Mutex<Option<ChildStdin>>,
    reader: Option<JoinHandle<()>>,
    /// The reader's thread id: it keeps its priority while an attack runs, so that the
    /// bystander never waits on a full pipe for a reader the attack's threads crowd out.
    reader_tid: rustix::process::Pid,
}

impl Bystander {
    /// Starts `bin` (`npud-bystander`) on `socket` and waits until its session is set up and it
    /// has made 200 calls.
    ///
    /// # Errors
    /// What failed while setting up.
    pub fn start(bin: &Path, socket: &Path) -> Result<Bystander, String> {
        // `Instant` and the bystander's times are the same clock: one reading of each ties them.
        let anchor = (Instant::now(), monotonic_ns());
        let mut child = Command::new(bin)
            .arg(socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let input = child.stdin.take();
        let output = child.stdout.take().ok_or("no standard output")?;
        let shared = Arc::new(Shared::default());
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let reader = std::thread::Builder::new()
            .name("bystander-reader".into())
            .spawn({
                let shared = shared.clone();
                move || {
                    let _ = tid_tx.send(rustix::thread::gettid());
                    read(BufReader::new(output), &shared, anchor);
                }
            })
            .map_err(|e| format!("a thread: {e}"))?;
        let reader_tid = tid_rx
            .recv()
            .map_err(|_| "the reader ended before it started".to_owned())?;
        let b = Bystander {
            shared,
            child,
            input: Mutex::new(input),
            reader: Some(reader),
            reader_tid,
        };
        b.shared
            .wait_for(Duration::from_secs(60), |r| r.ready.is_some());
        let ready = b.shared.lock().ready.clone();
        match ready {
            Some(Ok(())) => Ok(b),
            Some(Err(e)) => Err(e),
            None => Err("not set up within 60 s (or it exited)".into()),
        }
    }

    fn tell(&self, line: &str) {
        let mut input = self.input.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = input.as_mut() {
            let _ = writeln!(i, "{line}").and_then(|()| i.flush());
        }
    }

    /// Stops calling (once the call under way is answered) until [`Bystander::resume`], so that
    /// the daemon's CPU time can be measured without the bystander's share.
    pub fn pause(&self) {
        self.shared.lock().paused = false;
        self.tell("pause");
        self.shared
            .wait_for(CALL_LIMIT + Duration::from_secs(1), |r| r.paused);
    }

    /// The thread of this process that reads the bystander's reports.
    pub fn reader_tid(&self) -> rustix::process::Pid {
        self.reader_tid
    }

    /// Calls again after [`Bystander::pause`].
    pub fn resume(&self) {
        self.tell("resume");
    }

    /// The calls answered in `[from, to)`, and with `in_flight` the one under way at `to`.
    pub fn between(&self, from: Instant, to: Instant, in_flight: bool) -> Latencies {
        let now = Instant::now();
        let mut took = Vec::new();
        let mut errors = 0;
        let mut first_error = None;
        let r = self.shared.lock();
        for s in r
            .samples
            .iter()
            .filter(|s| s.start + s.took >= from && s.start + s.took < to)
        {
            took.push((s.took, s.dispatch));
            if let Some(e) = &s.error {
                errors += 1;
                first_error.get_or_insert_with(|| e.clone());
            }
        }
        if in_flight
            && let Some(start) = r.current
            && start < to
        {
            // Whichever call it is: counted with the dispatches, the slower kind.
            took.push((now - start, true));
        }
        drop(r);
        Latencies::of(took, errors, first_error)
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        // Its input's end stops it after the call under way.
        drop(
            self.input
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let until = Instant::now() + CALL_LIMIT;
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

/// Reads what the bystander reports until its output ends (see `npud-bystander`).
fn read(output: impl BufRead, shared: &Shared, anchor: (Instant, u64)) {
    let at = |ns: &str| -> Option<Instant> {
        let ns: u64 = ns.parse().ok()?;
        Some(anchor.0 + Duration::from_nanos(ns.saturating_sub(anchor.1)))
    };
    for line in output.lines() {
        let Ok(line) = line else { break };
        let mut words = line.splitn(5, ' ');
        let mut r = shared.lock();
        match words.next() {
            Some("begin") => r.current = words.next().and_then(at),
            Some("end") => {
                let start = words.next().and_then(at);
                let took = words.next().and_then(|t| t.parse().ok());
                let dispatch = words.next() == Some("1");
                let error = words.next().filter(|e| !e.is_empty()).map(str::to_owned);
                if let (Some(start), Some(took)) = (start, took) {
                    r.samples.push(Sample {
                        start,
                        took: Duration::from_nanos(took),
                        error,
                        dispatch,
                    });
                }
                r.current = None;
            }
            Some("ready") => r.ready = Some(Ok(())),
            Some("setup-failed") => {
                r.ready = Some(Err(line.trim_start_matches("setup-failed ").to_owned()));
            }
            Some("paused") => r.paused = true,
            _ => {}
        }
        drop(r);
        shared.changed.notify_all();
    }
    shared.lock().gone = true;
    shared.changed.notify_all();
}
