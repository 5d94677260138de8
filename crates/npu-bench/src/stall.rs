//! Row 12: what one client's big request costs the others. One client (the hog) repeats a big
//! request back to back (allocating and freeing a 1 GiB tensor, or a 1,024-link chain) while
//! another client dispatches one at a time, and the row is the other client's dispatch
//! latency. Compare it with row 3 (the same dispatch with nobody else): the executor's bounded
//! turns keep the p99 near it, where a request served in one turn adds its whole length to the
//! dispatches queued behind it (max shows the longest such wait).
//!
//! The hog is another application: it runs on a thread of its own, with its own runtime and
//! connection, as a second process would. On the measured client's runtime, building,
//! encoding and decoding the hog's requests would run between the measured client's own
//! polls (a runtime's tasks are not preempted), and the row would count this process's time
//! instead of the daemon's: a 1,024-link request takes a client about 90 µs to build and
//! encode, as long as the daemon takes to answer a dispatch.
//!
//! The rows are measured in rounds alternating with row 3's (the hogs pause, after their
//! request in flight is answered, while row 3 and the floors are measured), so that the
//! machine's load falls on the rows compared alike.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;
use tokio::sync::{oneshot, watch};

use crate::client::{Iters, Session, connect_unix};
use crate::rows::Ready;
use crate::stats::nanos;
use crate::{BenchError, Result};

/// The hog's request.
#[derive(Debug, Clone, Copy)]
pub enum Hog {
    /// AllocateTensor of this many bytes, then FreeTensor.
    Allocate(u64),
    /// A chain of this many noop links.
    Chain(usize),
}

/// Least number of big requests the hog completes while the other client is measured (over
/// all rounds, and at least one in each), so that a row whose big request is slow still has the
/// other client wait behind several of them.
pub const MIN_HOG_ROUNDS: usize = 3;

/// How long after a hog pauses the next row starts: npud's executor stops polling for its next
/// command for 2 ms after it served two sessions within 2 ms (`executor::idle::SHARED`), and a
/// row measured within that would pay for the hog that is gone.
const SETTLE: Duration = Duration::from_millis(10);

/// A hog on its own thread, paused between the rounds it is measured in.
#[derive(Debug)]
pub struct HogThread {
    pub kind: Hog,
    /// Whether the hog runs (true) or pauses (false); closed to stop it.
    run: watch::Sender<bool>,
    /// Whether the hog is paused with nothing in flight.
    idle: watch::Receiver<bool>,
    rounds: Arc<AtomicUsize>,
    done: oneshot::Receiver<Result<()>>,
    thread: std::thread::JoinHandle<()>,
}

/// What the other client measured over the rounds of one hog.
#[derive(Debug, Default)]
pub struct Measured {
    /// (latency, the daemon's queue time) of each dispatch, ns.
    samples: Vec<(u64, u64)>,
    /// The wall time they took.
    pub wall: Duration,
}

impl Measured {
    /// The latencies (ns), and the daemon's mean queue time (admission to device start) over
    /// all dispatches and over the slowest 1% (those at or above the p99), µs: how much of the
    /// tail the executor's turns explain; the rest is the transport, the daemon's I/O threads
    /// and this process.
    #[must_use]
    pub fn finish(mut self) -> (Vec<u64>, Duration, (f64, f64)) {
        self.samples.sort_unstable();
        let mean_us = |s: &[(u64, u64)]| {
            let n = crate::stats::f64_of(s.len().max(1) as u64);
            crate::stats::f64_of(s.iter().map(|x| x.1).sum::<u64>()) / n / 1000.0
        };
        let n = self.samples.len();
        let tail = &self.samples[n - (n / 100).max(1).min(n)..];
        let queue = (mean_us(&self.samples), mean_us(tail));
        (
            self.samples.into_iter().map(|s| s.0).collect(),
            self.wall,
            queue,
        )
    }
}

impl HogThread {
    /// Starts a hog of `kind` on a session of its own on `socket` (the noop program and two
    /// tensors, as every row's client), paused.
    ///
    /// # Errors
    /// The thread cannot start, or the daemon refuses the hog's session.
    pub async fn start(kind: Hog, socket: &Path) -> Result<HogThread> {
        let (run_tx, run_rx) = watch::channel(false);
        let (idle_tx, idle_rx) = watch::channel(false);
        let (done_tx, mut done) = oneshot::channel();
        let rounds = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("npuctl-bench-hog".into())
            .spawn({
                let rounds = rounds.clone();
                let socket = socket.to_path_buf();
                move || {
                    let r = run_hog(kind, &socket, run_rx, &idle_tx, &rounds);
                    let _ = done_tx.send(r);
                }
            })?;
        let mut idle = idle_rx;
        // Ready (paused, its session set up), or ended with its error.
        tokio::select! {
            r = idle.wait_for(|i| *i) => {
                r.map_err(|_| BenchError("the hog ended before it was ready".into()))?;
            }
            r = &mut done => {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
                r.unwrap_or_else(|_| Err(BenchError("the hog's thread ended".into())))?;
                return Err(BenchError("the hog ended before it was ready".into()));
            }
        }
        Ok(HogThread {
            kind,
            run: run_tx,
            idle,
            rounds,
            done,
            thread,
        })
    }

    /// Requests the hog has completed so far.
    #[must_use]
    pub fn rounds(&self) -> usize {
        self.rounds.load(Ordering::Relaxed)
    }

    /// One round: the hog runs while `other` dispatches `it.warmup` times unrecorded, then at
    /// least `it.measured` times and until the hog has completed `min_hog` requests in the
    /// round; then the hog pauses once its request in flight is answered.
    ///
    /// # Errors
    /// The other client's refusal, or the hog's failure.
    pub async fn round(
        &mut self,
        other: &Ready,
        it: Iters,
        min_hog: usize,
        acc: &mut Measured,
    ) -> Result<()> {
        let _ = self.run.send(true);
        let r = self.measure(other, it, min_hog, acc).await;
        let _ = self.run.send(false);
        // Paused with nothing in flight, or ended (with its error, reported by `stop`).
        let paused = self.idle.wait_for(|i| *i).await.is_ok();
        // What follows is measured as one client sees the daemon.
        tokio::time::sleep(SETTLE).await;
        r?;
        if !paused {
            return Err(BenchError(
                "the hog ended while it was measured against".into(),
            ));
        }
        Ok(())
    }

    async fn measure(
        &mut self,
        other: &Ready,
        it: Iters,
        min_hog: usize,
        acc: &mut Measured,
    ) -> Result<()> {
        let mut o = other.session.clone();
        let first = self.rounds();
        for _ in 0..it.warmup {
            o.dispatch(&other.request).await?;
        }
        let start = Instant::now();
        let mut n = 0;
        while n < it.measured || self.rounds() < first + min_hog {
            let t = Instant::now();
            let r = o.dispatch(&other.request).await?;
            acc.samples.push((nanos(t.elapsed()), r.queue_ns));
            n += 1;
            // A hog that stopped (it failed) ends the round; `stop` reports its error.
            if self.thread.is_finished() {
                break;
            }
        }
        acc.wall += start.elapsed();
        Ok(())
    }

    /// Stops the hog and closes its session; returns the requests it completed.
    ///
    /// # Errors
    /// The hog's failure.
    pub async fn stop(self) -> Result<usize> {
        let HogThread {
            run,
            rounds,
            done,
            thread,
            ..
        } = self;
        drop(run);
        let r = done
            .await
            .unwrap_or_else(|_| Err(BenchError("the hog's thread ended without a word".into())));
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        r?;
        Ok(rounds.load(Ordering::Relaxed))
    }
}

/// The hog's thread: its own runtime, connection and session, then `hog` back to back while
/// `run` says so, until `run` closes.
fn run_hog(
    hog: Hog,
    socket: &Path,
    mut run: watch::Receiver<bool>,
    idle: &watch::Sender<bool>,
    rounds: &AtomicUsize,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let s = Session::open(connect_unix(socket).await?, "bench-hog").await?;
        let r = Ready::new(s, true).await?;
        let mut s = r.session.clone();
        let result = async {
            loop {
                if !*run.borrow_and_update() {
                    let _ = idle.send(true);
                    if run.changed().await.is_err() {
                        return Ok(());
                    }
                    continue;
                }
                let _ = idle.send(false);
                one(hog, &mut s, &r.request).await?;
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        }
        .await;
        crate::load::close(&mut s).await;
        result
    })
}

/// One big request of the hog.
async fn one(hog: Hog, s: &mut Session, request: &pb::DispatchRequest) -> Result<()> {
    match hog {
        Hog::Allocate(bytes) => {
            let id = s.alloc(bytes).await?;
            let req = s.req(pb::FreeTensorRequest { tensor_id: id });
            s.client
                .free_tensor(req)
                .await
                .map_err(|e| BenchError(format!("FreeTensor: {e}")))?;
        }
        Hog::Chain(links) => {
            let req = s.req(pb::ChainRequest {
                links: vec![request.clone(); links],
            });
            let r = s
                .client
                .chain(req)
                .await
                .map_err(|e| BenchError(format!("Chain: {e}")))?
                .into_inner();
            if r.failure.is_some() {
                return Err(BenchError(format!("the hog's chain failed: {r:?}")));
            }
        }
    }
    Ok(())
}
