//! Rows 7 and 8: many clients at once, and what the daemon holds in memory.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;

use crate::client::{Iters, Session, connect_unix};
use crate::rows::Ready;
use crate::stats::nanos;
use crate::{BenchError, Result};

/// Dispatches [`clients`] runs for `clients` clients, warm-up included.
#[must_use]
pub fn total_ops(clients: usize, it: Iters) -> usize {
    let clients = clients.max(1);
    clients * ((it.measured / clients).max(1) + (it.warmup / clients).max(1))
}

/// Row 7: `clients` clients, each on its own connection with its own session, program
/// registration and tensors, dispatch at once; `it.measured` dispatches are shared out between
/// them (each first warms up alone, then all start together at a barrier). The clients are
/// tasks on the caller's runtime. Returns every dispatch's latency, and the wall time from the
/// barrier to the last client's end (over which the aggregate throughput is counted).
///
/// # Errors
/// A client that cannot connect or a dispatch the daemon refuses.
pub async fn clients(socket: &Path, clients: usize, it: Iters) -> Result<(Vec<u64>, Duration)> {
    let clients = clients.max(1);
    let each = (it.measured / clients).max(1);
    let warmup = (it.warmup / clients).max(1);
    let mut ready = Vec::with_capacity(clients);
    for i in 0..clients {
        let s = Session::open(connect_unix(socket).await?, &format!("bench-client-{i}")).await?;
        ready.push(Ready::new(s, true).await?);
    }
    let barrier = Arc::new(Barrier::new(clients));
    let mut tasks = Vec::with_capacity(clients);
    for r in ready {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = r.session.clone();
            for _ in 0..warmup {
                s.dispatch(&r.request).await?;
            }
            barrier.wait().await;
            let start = Instant::now();
            let mut ns = Vec::with_capacity(each);
            for _ in 0..each {
                let t = Instant::now();
                s.dispatch(&r.request).await?;
                ns.push(nanos(t.elapsed()));
            }
            let end = Instant::now();
            close(&mut s).await;
            Ok::<_, BenchError>((ns, start, end))
        }));
    }
    let mut all = Vec::with_capacity(each * clients);
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for t in tasks {
        let (ns, start, end) = t.await.map_err(|e| BenchError(e.to_string()))??;
        all.extend(ns);
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
    }
    let wall = match (first, last) {
        (Some(a), Some(b)) => b.duration_since(a),
        _ => Duration::ZERO,
    };
    Ok((all, wall))
}

/// Row 8: opens `sessions` sessions on their own connections, each allocating `tensors`
/// tensors of `bytes` (redeemed through the fd socket, as local clients do), and returns the
/// open sessions (the caller reads the daemon's memory, then closes them).
///
/// # Errors
/// The daemon's refusal.
pub async fn hold(
    socket: &Path,
    sessions: usize,
    tensors: usize,
    bytes: u64,
) -> Result<Vec<Session>> {
    let mut held = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let mut s = Session::open(connect_unix(socket).await?, &format!("bench-hold-{i}")).await?;
        for _ in 0..tensors {
            // The mapping and the fd are dropped here: the tensor stays in the session.
            s.alloc_mapped(bytes).await?;
        }
        held.push(s);
    }
    Ok(held)
}

/// Ends a session.
pub async fn close(s: &mut Session) {
    let req = s.req(npu_proto::v1::CloseSessionRequest {});
    let _ = s.client.close_session(req).await;
}
