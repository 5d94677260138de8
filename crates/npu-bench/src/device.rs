//! Rows 16: the device's time, as hsa-sim's timing model gives it (`emulator.timing = "model"`:
//! modelled from published measurements, not measured on an NPU), and how npud's scheduling
//! spends it. Two daemons side by side, both on the model: one rings queued single dispatches
//! of several sessions as one doorbell batch (`executor.batch_across_sessions`, the default),
//! the other only one session's, while no other waits (the scheduling before it). The rows
//! alternate over rounds, so that a change in the machine's load falls on both alike.
//!
//! The clients use the fast path (the dispatch ring npu-client attaches on a Unix socket), each
//! on a thread of its own dispatching one at a time: there the daemon's software costs a few
//! µs a dispatch, so the device's time is what the rows measure. (Through gRPC, on a small
//! machine, the daemon's own CPU per call is larger than a modelled doorbell, and batching
//! cannot show.)
//!
//! - `device_16_*`: [`CLIENTS`] clients for a window: their aggregate throughput, and each
//!   client's count, of which Jain's index ((Σx)² / (n·Σx²), 1 when all are equal).
//! - `device_lone_*`: one client alone: its latency, which batching must not raise (nothing
//!   waits for company on an idle device).

use std::time::{Duration, Instant};

use crate::client::{Iters, Session, connect_unix};
use crate::daemon::Daemon;
use crate::fastpath::BenchRing;
use crate::report::{Report, Row};
use crate::rows::{MIN_ROUND_WARMUP, Ready};
use crate::stats::{Acc, summarize};
use crate::{BenchError, Result};

/// Clients of the many-client rows.
pub const CLIENTS: usize = 16;

/// The keys of the rows.
pub mod keys {
    pub const MANY_BATCHED: &str = "device_16_batched";
    pub const MANY_UNBATCHED: &str = "device_16_unbatched";
    pub const LONE_BATCHED: &str = "device_lone_batched";
    pub const LONE_UNBATCHED: &str = "device_lone_unbatched";
}

/// One daemon and what was measured on it.
struct Side {
    daemon: Daemon,
    batched: bool,
    /// Every many-client dispatch's latency, and the windows' total time.
    many: (Vec<u64>, Duration),
    /// Each client's dispatches over all windows.
    counts: Vec<u64>,
    lone: Acc,
}

/// A client: its session (kept for the ring's life) and ring.
struct Client {
    ready: Ready,
    ring: BenchRing,
}

async fn client(socket: &std::path::Path, name: &str) -> Result<Client> {
    let mut session = Session::open(connect_unix(socket).await?, name).await?;
    let ring = BenchRing::attach(&mut session).await?;
    let ready = Ready::new(session, true).await?;
    Ok(Client { ready, ring })
}

/// Jain's fairness index of `x`: 1 when all are equal, 1/n when one has everything.
#[must_use]
pub fn jain(x: &[u64]) -> f64 {
    let sum: f64 = x.iter().map(|&v| crate::stats::f64_of(v)).sum();
    let squares: f64 = x.iter().map(|&v| crate::stats::f64_of(v).powi(2)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (crate::stats::f64_of(x.len() as u64) * squares)
}

/// Every client dispatches, one at a time, until `window` has passed: each one's latencies.
fn window(clients: &mut [Client], window: Duration) -> Result<Vec<Vec<u64>>> {
    let end = Instant::now() + window;
    std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .iter_mut()
            .map(|c| {
                scope.spawn(move || {
                    let mut ns = Vec::new();
                    while Instant::now() < end {
                        let (one, _) = c.ring.unary(
                            &c.ready.request,
                            Iters {
                                warmup: 0,
                                measured: 1,
                            },
                        )?;
                        ns.extend(one);
                    }
                    Ok::<_, BenchError>(ns)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| BenchError("a device-row client panicked".into()))?
            })
            .collect()
    })
}

/// Runs rows 16: `rounds` rounds of a window of [`CLIENTS`] clients on each daemon, then
/// `lone_rounds` rounds of a lone client's share of `it` on each (short rounds: on a small VM a
/// lone round trip is bimodal, one mode lasting a fraction of a second).
///
/// # Errors
/// When a daemon cannot be started or a dispatch fails.
pub async fn rows(
    report: &mut Report,
    it: Iters,
    rounds: usize,
    lone_rounds: usize,
    window_each: Duration,
) -> Result<()> {
    let model = [("NPUD_EMULATOR__TIMING", "model")];
    let mut sides = Vec::new();
    for batched in [true, false] {
        let across = if batched { "true" } else { "false" };
        let env = [model[0], ("NPUD_EXECUTOR__BATCH_ACROSS_SESSIONS", across)];
        let daemon = Daemon::start_env(None, &[], &env)?;
        sides.push(Side {
            daemon,
            batched,
            many: (Vec::new(), Duration::ZERO),
            counts: vec![0; CLIENTS],
            lone: Acc::default(),
        });
    }
    let round = Iters {
        warmup: (it.warmup / lone_rounds).max(MIN_ROUND_WARMUP),
        measured: (it.measured / lone_rounds).max(1),
    };
    let mut many: Vec<Vec<Client>> = Vec::new();
    let mut lone: Vec<Client> = Vec::new();
    for s in &sides {
        let mut cs = Vec::with_capacity(CLIENTS);
        for i in 0..CLIENTS {
            cs.push(client(&s.daemon.socket, &format!("bench-device-{i}")).await?);
        }
        many.push(cs);
        lone.push(client(&s.daemon.socket, "bench-device-lone").await?);
    }
    for _ in 0..rounds {
        for (k, side) in sides.iter_mut().enumerate() {
            let clients = &mut many[k];
            // Warm: every program loaded, every ring awake.
            let _ = window(clients, Duration::from_millis(20))?;
            let t = Instant::now();
            // The ring is driven synchronously, as row 15 does.
            let per = window(clients, window_each)?;
            side.many.1 += t.elapsed();
            for (count, ns) in side.counts.iter_mut().zip(&per) {
                *count += ns.len() as u64;
            }
            side.many.0.extend(per.into_iter().flatten());
        }
    }
    for _ in 0..lone_rounds {
        for (k, side) in sides.iter_mut().enumerate() {
            let c = &mut lone[k];
            side.lone.add(c.ring.unary(&c.ready.request, round)?);
        }
    }
    for side in sides {
        let (which, many_key, lone_key) = if side.batched {
            (
                "batching across sessions",
                keys::MANY_BATCHED,
                keys::LONE_BATCHED,
            )
        } else {
            (
                "one session's dispatches only",
                keys::MANY_UNBATCHED,
                keys::LONE_UNBATCHED,
            )
        };
        let (ns, wall) = side.many;
        let ops = ns.len() as u64;
        let mut r = Row::new(
            "16",
            many_key,
            &format!("{CLIENTS} fast-path clients, modelled device time, {which}: aggregate"),
            summarize(ns, ops, wall),
        );
        r.clients = Some(CLIENTS);
        r.fairness = Some(jain(&side.counts));
        report.rows.push(r);
        report.rows.push(Row::new(
            "16",
            lone_key,
            &format!("one fast-path client alone, modelled device time, {which}"),
            side.lone.summary(),
        ));
        drop(side.daemon);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_one_taking_all() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-12);
        assert!((jain(&[8, 0, 0, 0]) - 0.25).abs() < 1e-12);
        assert_eq!(jain(&[0, 0]), 0.0);
    }
}
