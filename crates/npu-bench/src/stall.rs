//! Row 12: what one client's big request costs the others. One client (the hog) repeats a big
//! request back to back (allocating and freeing a 1 GiB tensor, or a 1,024-link chain) while
//! another client dispatches one at a time, and the row is the other client's dispatch
//! latency. Compare it with row 3 (the same dispatch with nobody else): the executor's bounded
//! turns keep the p99 near it, where a request served in one turn adds its whole length to the
//! dispatches queued behind it (max shows the longest such wait).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;

use crate::client::{Iters, Session};
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

/// Least number of big requests the hog completes while the other client is measured, so that
/// a row whose big request is slow still has the other client wait behind several of them.
const MIN_HOG_ROUNDS: usize = 3;

/// The other client's single dispatches (`it.measured` at least, warm-up first) while `hog`
/// repeats its request on its own session; the hog runs until the other client is done and
/// has seen [`MIN_HOG_ROUNDS`] of its requests complete. Returns the other client's latencies,
/// the wall time they took, and how many requests the hog completed.
///
/// # Errors
/// Either client's refusal.
pub async fn under(
    hog: Hog,
    hog_session: &Ready,
    other: &Ready,
    it: Iters,
) -> Result<(Vec<u64>, Duration, usize)> {
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let mut s = hog_session.session.clone();
    let request = hog_session.request.clone();
    let task = tokio::spawn({
        let (stop, rounds) = (stop.clone(), rounds.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
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
                rounds.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, BenchError>(())
        }
    });
    let mut o = other.session.clone();
    for _ in 0..it.warmup {
        o.dispatch(&other.request).await?;
    }
    let mut ns = Vec::with_capacity(it.measured);
    let start = Instant::now();
    while ns.len() < it.measured || rounds.load(Ordering::Relaxed) < MIN_HOG_ROUNDS {
        if task.is_finished() {
            break;
        }
        let t = Instant::now();
        o.dispatch(&other.request).await?;
        ns.push(nanos(t.elapsed()));
    }
    let wall = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    task.await.map_err(|e| BenchError(e.to_string()))??;
    Ok((ns, wall, rounds.load(Ordering::Relaxed)))
}

/// A session for the hog: the noop program and two tensors, as every row's client.
///
/// # Errors
/// The daemon's refusal.
pub async fn hog_session(socket: &std::path::Path) -> Result<Ready> {
    let s = Session::open(crate::client::connect_unix(socket).await?, "bench-hog").await?;
    Ready::new(s, true).await
}
