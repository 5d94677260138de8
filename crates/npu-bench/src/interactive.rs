//! Rows 16 (priorities): an interactive session beside [`BATCH_CLIENTS`] batch sessions that
//! keep the modelled device busy, on one daemon (`emulator.timing = "model"`). Each round runs,
//! for a window each:
//!
//! - the batch clients alone: their throughput, what the others are compared with;
//! - the batch clients and an interactive client that names no deadline (the daemon's
//!   default, `executor.interactive_deadline_us`, 1 ms): its latency, the batch clients'
//!   throughput, and the batch sessions' share of the device's time (from the daemon's
//!   per-class statistics);
//! - the interactive client alone: its latency, what the loaded one is compared with;
//! - the batch clients and an interactive client that asks for the shortest wait (a deadline
//!   of [`SHORTEST`], below two lone doorbells): the same.
//!
//! The interactive client dispatches one at a time with [`PERIOD`] between dispatches, as an
//! app at a frame rate does; the batch clients dispatch back to back. All use the fast path
//! (the dispatch ring), as rows 16 do, so the device's time is what the rows measure. The
//! daemon forgets an interactive session [`IDLE`] after its last dispatch
//! (`executor.interactive_idle_ms`), and each window starts after that.
//!
//! The batch clients' threads run at nice 19, as a host runs its batch jobs. The rows measure
//! how the daemon schedules the device; the host's CPUs are its scheduler's. On a 2-core VM,
//! 15 client threads spinning for their answers at the interactive client's priority measured
//! that scheduler instead: in a trial the interactive p99 was 3.6 times its p99 alone with the
//! p50 unchanged, while the device kept it waiting at most one lone doorbell (≈ 55 µs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;

use crate::client::{Iters, Session, connect_unix};
use crate::daemon::Daemon;
use crate::fastpath::BenchRing;
use crate::report::{Report, Row};
use crate::rows::Ready;
use crate::stats::summarize;
use crate::{BenchError, Result};

/// Batch sessions that keep the device busy.
pub const BATCH_CLIENTS: usize = 15;
/// Between two of the interactive client's dispatches.
pub const PERIOD: Duration = Duration::from_millis(2);
/// The deadline of the interactive client of the shortest-wait rows: other doorbells are
/// kept to a lone dispatch's.
pub const SHORTEST: Duration = Duration::from_micros(1);
/// `executor.interactive_idle_ms` of the bench's daemon.
pub const IDLE: Duration = Duration::from_millis(50);

/// The keys of the rows.
pub mod keys {
    pub const ALONE: &str = "device_interactive_alone";
    pub const LOADED: &str = "device_interactive_loaded";
    pub const SHORTEST: &str = "device_interactive_shortest";
    pub const BATCH_ALONE: &str = "device_batch15_alone";
    pub const BATCH_BESIDE: &str = "device_batch15_beside_interactive";
    pub const BATCH_BESIDE_SHORTEST: &str = "device_batch15_beside_shortest";
}

/// A client: its session (kept for the ring's life) and ring.
struct Client {
    ready: Ready,
    ring: BenchRing,
}

async fn client(
    socket: &std::path::Path,
    name: &str,
    class: pb::SessionClass,
    deadline: Option<Duration>,
) -> Result<Client> {
    let deadline_us = deadline.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut session =
        Session::open_class(connect_unix(socket).await?, name, class, deadline_us).await?;
    let ring = BenchRing::attach(&mut session).await?;
    let ready = Ready::new(session, true).await?;
    Ok(Client { ready, ring })
}

/// One dispatch of `c`, its latency in ns.
fn one(c: &mut Client) -> Result<u64> {
    let (ns, _) = c.ring.unary(
        &c.ready.request,
        Iters {
            warmup: 0,
            measured: 1,
        },
    )?;
    ns.first()
        .copied()
        .ok_or_else(|| BenchError("a dispatch measured nothing".into()))
}

/// What one window measured.
#[derive(Default)]
struct Window {
    /// The batch clients' latencies.
    batch: Vec<u64>,
    /// The interactive client's latencies.
    interactive: Vec<u64>,
}

/// For `window`: the batch clients back to back, and `interactive` one at a time every
/// [`PERIOD`].
fn window(
    batch: &mut [Client],
    interactive: Option<&mut Client>,
    window: Duration,
) -> Result<Window> {
    let end = Instant::now() + window;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let batch: Vec<_> = batch
            .iter_mut()
            .map(|c| {
                let stop = &stop;
                scope.spawn(move || {
                    lower_this_thread();
                    let mut ns = Vec::new();
                    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                        ns.push(one(c)?);
                    }
                    Ok::<_, BenchError>(ns)
                })
            })
            .collect();
        let mut w = Window::default();
        if let Some(c) = interactive {
            while Instant::now() < end {
                match one(c) {
                    Ok(ns) => w.interactive.push(ns),
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                std::thread::sleep(PERIOD);
            }
        }
        for h in batch {
            let ns = h
                .join()
                .map_err(|_| BenchError("a batch client panicked".into()))??;
            w.batch.extend(ns);
        }
        Ok(w)
    })
}

/// Runs this thread at nice 19 (a batch job's priority); left as it is if the kernel refuses.
fn lower_this_thread() {
    let tid = rustix::thread::gettid();
    let _ = rustix::process::setpriority_process(Some(tid), 19);
}

/// Device time of each class so far (batch, interactive), from the daemon's statistics.
pub(crate) async fn device_time(s: &mut Session) -> Result<[Duration; 2]> {
    let stats = s
        .client
        .get_statistics(s.req(pb::GetStatisticsRequest::default()))
        .await?
        .into_inner();
    let mut t = [Duration::ZERO; 2];
    for c in stats.classes {
        let k = match pb::SessionClass::try_from(c.session_class) {
            Ok(pb::SessionClass::Interactive) => 1,
            _ => 0,
        };
        let exec = c
            .dispatches
            .and_then(|d| d.execute)
            .map_or(Duration::ZERO, |d| Duration::from_nanos(d.ns));
        t[k] += exec;
    }
    Ok(t)
}

/// Totals of one configuration over the rounds.
#[derive(Default)]
struct Totals {
    batch: Vec<u64>,
    wall: Duration,
    interactive: Vec<u64>,
    /// Device time of (batch, interactive) sessions over its windows.
    device: [Duration; 2],
}

/// Runs rows 16 (priorities): `rounds` rounds of four windows of `window_each`.
///
/// # Errors
/// When the daemon cannot be started or a dispatch fails.
pub async fn rows(report: &mut Report, rounds: usize, window_each: Duration) -> Result<()> {
    let idle_ms = IDLE.as_millis().to_string();
    let env = [
        ("NPUD_EMULATOR__TIMING", "model"),
        ("NPUD_EXECUTOR__INTERACTIVE_IDLE_MS", idle_ms.as_str()),
    ];
    let daemon = Daemon::start_env(None, &[], &env)?;
    let mut batch = Vec::with_capacity(BATCH_CLIENTS);
    for i in 0..BATCH_CLIENTS {
        batch.push(
            client(
                &daemon.socket,
                &format!("bench-batch-{i}"),
                pb::SessionClass::Batch,
                None,
            )
            .await?,
        );
    }
    let mut plain = client(
        &daemon.socket,
        "bench-interactive",
        pb::SessionClass::Interactive,
        None,
    )
    .await?;
    let mut shortest = client(
        &daemon.socket,
        "bench-interactive-shortest",
        pb::SessionClass::Interactive,
        Some(SHORTEST),
    )
    .await?;
    let mut stats = Session::open(connect_unix(&daemon.socket).await?, "bench-stats").await?;
    // [batch alone, beside interactive, interactive alone, beside the shortest-wait one].
    let mut totals: [Totals; 4] = Default::default();
    // Warm: every program loaded, every ring awake.
    let _ = window(&mut batch, Some(&mut plain), Duration::from_millis(30))?;
    let _ = window(&mut [], Some(&mut shortest), Duration::from_millis(30))?;
    for _ in 0..rounds {
        for (k, total) in totals.iter_mut().enumerate() {
            // The interactive sessions of the last window are forgotten first.
            std::thread::sleep(IDLE * 2);
            let (b, i): (&mut [Client], Option<&mut Client>) = match k {
                0 => (batch.as_mut_slice(), None),
                1 => (batch.as_mut_slice(), Some(&mut plain)),
                2 => (&mut [], Some(&mut plain)),
                _ => (batch.as_mut_slice(), Some(&mut shortest)),
            };
            let before = device_time(&mut stats).await?;
            let t = Instant::now();
            let w = window(b, i, window_each)?;
            total.wall += t.elapsed();
            let after = device_time(&mut stats).await?;
            for c in 0..2 {
                total.device[c] += after[c].saturating_sub(before[c]);
            }
            total.batch.extend(w.batch);
            total.interactive.extend(w.interactive);
        }
    }
    let [batch_alone, beside, alone, beside_shortest] = totals;
    let shortest_us = SHORTEST.as_micros();
    let batch_row = |key: &str, what: &str, t: &Totals| {
        let mut r = Row::new(
            "16",
            key,
            &format!(
                "{BATCH_CLIENTS} batch fast-path clients, modelled device time, {what}: aggregate"
            ),
            summarize(t.batch.clone(), t.batch.len() as u64, t.wall),
        );
        r.clients = Some(BATCH_CLIENTS);
        let all = t.device[0] + t.device[1];
        if !all.is_zero() {
            r.batch_share = Some(t.device[0].as_secs_f64() / all.as_secs_f64());
        }
        r
    };
    let latency_row = |key: &str, what: &str, t: Totals| {
        let n = t.interactive.len() as u64;
        Row::new(
            "16",
            key,
            &format!(
                "an interactive fast-path client, one dispatch every {} ms, modelled device \
                 time, {what}",
                PERIOD.as_millis()
            ),
            summarize(t.interactive, n, t.wall),
        )
    };
    // How busy the modelled device was: the sessions' device time over the windows' wall time
    // (a merged batch's members each count their share of its doorbell).
    let busy = |t: &Totals| {
        let all = t.device[0] + t.device[1];
        format!(
            "{:.0} %",
            100.0 * all.as_secs_f64() / t.wall.as_secs_f64().max(1e-9)
        )
    };
    report.notes.push(format!(
        "rows 16 (priorities): the dispatches' modelled device time was {} of the wall time \
         of the batch clients' windows alone, {} beside the interactive client, {} beside the \
         shortest-wait one",
        busy(&batch_alone),
        busy(&beside),
        busy(&beside_shortest)
    ));
    report
        .rows
        .push(batch_row(keys::BATCH_ALONE, "alone", &batch_alone));
    report.rows.push(batch_row(
        keys::BATCH_BESIDE,
        "beside an interactive client with the default deadline",
        &beside,
    ));
    report.rows.push(batch_row(
        keys::BATCH_BESIDE_SHORTEST,
        &format!(
            "beside an interactive client with a {shortest_us} µs deadline (the shortest wait)"
        ),
        &beside_shortest,
    ));
    report.rows.push(latency_row(keys::ALONE, "alone", alone));
    report.rows.push(latency_row(
        keys::LOADED,
        &format!("the default deadline, beside {BATCH_CLIENTS} batch clients"),
        beside,
    ));
    report.rows.push(latency_row(
        keys::SHORTEST,
        &format!(
            "a {shortest_us} µs deadline (the shortest wait), beside {BATCH_CLIENTS} batch clients"
        ),
        beside_shortest,
    ));
    drop(daemon);
    Ok(())
}
