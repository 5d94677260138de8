//! Row 14: npud's resident memory before, during and after a quota-sized queue of chains: one
//! local user's sessions (npud's default `limits.max_sessions_per_uid`) each with its whole
//! pending allowance (`limits.max_pending_per_session`) of the longest chains allowed
//! (`limits.max_chain_links`) in flight at once. Read from `/proc/<pid>/status` (VmRSS):
//! before, at the peak while they are queued, when the last is answered, 15 s later (memory
//! the daemon keeps after work ends), and after the sessions are closed. The last two show
//! whether the allocator gives a load's memory back once the daemon is idle (npud's
//! `collect_freed`): they should be near `before`, not near `answered`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use npu_proto::v1 as pb;

use crate::client::{Session, connect_unix};
use crate::daemon::rss_kib;
use crate::report::MemoryRow;
use crate::rows::Ready;
use crate::{BenchError, Result};

/// Sessions, chains in flight per session, links per chain: npud's default limits.
pub const PLAN: (usize, usize, usize) = (16, 256, 1024);

/// How long after the last answer the daemon's memory is read again.
const AFTER: Duration = Duration::from_secs(15);

fn row(key: &str, name: &str, rss_kib: u64) -> MemoryRow {
    let (sessions, pending, links) = PLAN;
    MemoryRow {
        row: "14".into(),
        key: key.into(),
        name: format!("{name} ({sessions} sessions x {pending} chains of {links} links)"),
        rss_kib,
        sessions,
        tensors_per_session: 2,
        tensor_bytes: u64::from(crate::inproc::ARG_BYTES),
    }
}

/// Runs [`PLAN`] against the daemon at `socket` (process `pid`) and returns its memory rows.
///
/// # Errors
/// The daemon's refusal of a session or a chain, or its process gone.
pub async fn queued_chains(socket: &Path, pid: u32) -> Result<Vec<MemoryRow>> {
    let (sessions, pending, links) = PLAN;
    let mut rows = vec![row("rss_queue_before", "before", rss_kib(pid)?)];
    let mut ready = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let s = Session::open(connect_unix(socket).await?, &format!("bench-rss-{i}")).await?;
        ready.push(Arc::new(Ready::new(s, true).await?));
    }
    let left = Arc::new(AtomicUsize::new(sessions * pending));
    let mut tasks = Vec::with_capacity(sessions * pending);
    for r in &ready {
        for _ in 0..pending {
            let (r, left) = (r.clone(), left.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = r.session.clone();
                let req = s.req(pb::ChainRequest {
                    links: vec![r.request.clone(); links],
                });
                let answer = s.client.chain(req).await;
                left.fetch_sub(1, Ordering::Relaxed);
                let answer = answer?.into_inner();
                match answer.failure {
                    None => Ok(()),
                    Some(f) => Err(BenchError(format!("a queued chain failed: {f:?}"))),
                }
            }));
        }
    }
    let mut peak = 0;
    while left.load(Ordering::Relaxed) > 0 {
        peak = peak.max(rss_kib(pid)?);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answered = rss_kib(pid)?;
    for t in tasks {
        t.await.map_err(|e| BenchError(e.to_string()))??;
    }
    rows.push(row(
        "rss_queue_peak",
        "peak while the chains are queued",
        peak.max(answered),
    ));
    rows.push(row(
        "rss_queue_answered",
        "when the last chain is answered",
        answered,
    ));
    tokio::time::sleep(AFTER).await;
    rows.push(row(
        "rss_queue_after_15s",
        "15 s after the last answer, sessions open",
        rss_kib(pid)?,
    ));
    for r in &ready {
        let mut s = r.session.clone();
        crate::load::close(&mut s).await;
    }
    drop(ready);
    tokio::time::sleep(Duration::from_secs(2)).await;
    rows.push(row(
        "rss_queue_closed",
        "2 s after the sessions are closed",
        rss_kib(pid)?,
    ));
    Ok(rows)
}
