//! Dispatch counters, kept per session and per program in the shape of Triton's statistics
//! extension: cumulative (count, nanoseconds) pairs, so a client computes interval averages by
//! subtracting two snapshots.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use npu_proto::v1 as pb;

/// Dispatches admitted to the executor and not yet answered, daemon-wide
/// (`Statistics.pending_dispatches`).
#[derive(Debug, Clone, Default)]
pub struct PendingWork(Arc<AtomicU64>);

impl PendingWork {
    /// Counts `links` dispatches as pending until the returned guard drops.
    pub fn admit(&self, links: u64) -> PendingGuard {
        self.0.fetch_add(links, Ordering::Relaxed);
        PendingGuard {
            count: self.0.clone(),
            links,
        }
    }

    /// Dispatches pending now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Admitted work, counted in [`PendingWork`] while it lives.
#[derive(Debug)]
pub struct PendingGuard {
    count: Arc<AtomicU64>,
    links: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.count.fetch_sub(self.links, Ordering::Relaxed);
    }
}

/// What one dispatch (or one chain link) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Completed.
    Success,
    /// Refused or failed, with the gRPC code name.
    Fail(&'static str),
}

/// Now, in ms since the Unix epoch (0 before it): read once for all the statistics one
/// finished item updates.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One finished work item's share of a statistics table: `links` dispatches with one outcome,
/// sharing one queue wait and one device run, finished at `at_ms` ([`unix_ms`], read once for
/// every table the item updates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub links: u64,
    pub outcome: Outcome,
    pub queue_ns: u64,
    pub device_ns: u64,
    pub at_ms: u64,
}

impl Tally {
    /// `links` refused before they reached the device (no queue or device time), now.
    pub fn refused(links: u64, code: &'static str) -> Tally {
        Tally {
            links,
            outcome: Outcome::Fail(code),
            queue_ns: 0,
            device_ns: 0,
            at_ms: unix_ms(),
        }
    }
}

/// Counters for one session or one program.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DispatchStats {
    success: (u64, u64),
    fail: (u64, u64),
    queue: (u64, u64),
    execute: (u64, u64),
    errors: BTreeMap<&'static str, u64>,
    last_unix_ms: u64,
}

impl DispatchStats {
    /// Records `links` dispatches that shared one queue wait and one device run.
    ///
    /// `queue_ns` and `device_ns` are the whole item's; they are counted once per item so the
    /// totals stay wall-clock time, while the counts are per link.
    pub fn record(&mut self, t: Tally) {
        let Tally {
            links,
            outcome,
            queue_ns,
            device_ns,
            at_ms,
        } = t;
        let total = queue_ns.saturating_add(device_ns);
        match outcome {
            Outcome::Success => add(&mut self.success, links, total),
            Outcome::Fail(code) => {
                add(&mut self.fail, links, total);
                *self.errors.entry(code).or_default() += links;
            }
        }
        if device_ns > 0 || outcome == Outcome::Success {
            add(&mut self.queue, links, queue_ns);
            add(&mut self.execute, links, device_ns);
        }
        self.last_unix_ms = at_ms;
    }

    /// The counters as the API reports them.
    pub fn to_proto(&self) -> pb::DispatchStatistics {
        let d = |(count, ns): (u64, u64)| Some(pb::Duration { count, ns });
        pb::DispatchStatistics {
            success: d(self.success),
            fail: d(self.fail),
            queue: d(self.queue),
            execute: d(self.execute),
            errors: self
                .errors
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            last_dispatch_unix_ms: self.last_unix_ms,
        }
    }
}

fn add(slot: &mut (u64, u64), count: u64, ns: u64) {
    slot.0 = slot.0.saturating_add(count);
    slot.1 = slot.1.saturating_add(ns);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_work_counts_links_until_the_guard_drops() {
        let p = PendingWork::default();
        let chain = p.admit(3);
        let one = p.clone().admit(1);
        assert_eq!(p.get(), 4);
        drop(chain);
        assert_eq!(p.get(), 1);
        drop(one);
        assert_eq!(p.get(), 0);
    }

    #[test]
    fn counts_links_and_errors_by_code() {
        let mut s = DispatchStats::default();
        let at = unix_ms();
        assert!(at > 0);
        s.record(Tally {
            links: 1,
            outcome: Outcome::Success,
            queue_ns: 10,
            device_ns: 100,
            at_ms: at - 3,
        });
        s.record(Tally {
            links: 64,
            outcome: Outcome::Success,
            queue_ns: 5,
            device_ns: 50,
            at_ms: at - 2,
        });
        s.record(Tally {
            links: 1,
            outcome: Outcome::Fail("DEADLINE_EXCEEDED"),
            queue_ns: 7,
            device_ns: 0,
            at_ms: at - 1,
        });
        s.record(Tally {
            links: 3,
            outcome: Outcome::Fail("INTERNAL"),
            queue_ns: 1,
            device_ns: 2,
            at_ms: at,
        });
        let p = s.to_proto();
        assert_eq!(p.success.unwrap().count, 65);
        assert_eq!(p.success.unwrap().ns, 165);
        assert_eq!(p.fail.unwrap().count, 4);
        assert_eq!(p.errors["DEADLINE_EXCEEDED"], 1);
        assert_eq!(p.errors["INTERNAL"], 3);
        // A refused item never reached the device: no queue or execute time.
        assert_eq!(p.queue.unwrap().count, 68);
        assert_eq!(p.execute.unwrap().ns, 152);
        assert_eq!(p.last_dispatch_unix_ms, at, "the last record's time");
    }
}
