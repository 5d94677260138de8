//! One run: start (or find) the daemon, run every row in order, and build the report.

use std::path::PathBuf;
use std::time::Duration;

use crate::client::{Iters, Session, connect_tcp, connect_unix};
use crate::daemon::{CpuMeter, Daemon, cpu_ns_by_thread, rss_kib, stat_cpu_ticks, us_per_tick};
use crate::fastpath::{BenchRing, PingPong};
use crate::floors::{FloorServers, RawEcho, TonicEcho, tonic_stream};
use crate::inproc::InProcess;
use crate::load;
use crate::report::{CpuRow, Machine, MemoryRow, Report, Row, keys};
use crate::rows::Ready;
use crate::stall::{self, Hog};
use crate::stats::Acc;
use crate::{BenchError, Result};

/// Pipeline depth of rows 1c and 9.
pub const DEPTH: usize = 16;
/// Tensor sizes of row 6.
pub const SIZES: [(u64, &str); 4] = [
    (4 << 10, "4KiB"),
    (1 << 20, "1MiB"),
    (16 << 20, "16MiB"),
    (64 << 20, "64MiB"),
];
/// Client counts of row 7.
pub const CLIENTS: [usize; 4] = [1, 4, 16, 64];
/// Row 8: sessions, tensors per session, bytes per tensor.
pub const HOLD: (usize, usize, u64) = (64, 16, 4096);

/// What to run against.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Few iterations per row (a smoke test; figures are indicative only).
    pub quick: bool,
    /// A running daemon's Unix socket instead of starting one.
    pub addr: Option<PathBuf>,
    /// That daemon's TCP address (`host:port`), for row 4.
    pub tcp: Option<String>,
    /// That daemon's process id, for row 8.
    pub pid: Option<u32>,
    /// Measured iterations of the single-operation rows (default 20000, 300 with `quick`).
    pub iterations: Option<usize>,
    /// Only these sections ([`SECTIONS`]); row 3 always runs. Empty: all.
    pub only: Vec<String>,
    /// Emulator profiles whose rows 11 run side by side (default [`crate::profiles::DEFAULT`]).
    pub profiles: Vec<String>,
    /// Every call carries an `npud-request-id`, as npu-client's do (the daemon then remembers
    /// each answer for a retry).
    pub request_ids: bool,
}

/// Where the daemon is.
struct Target {
    socket: PathBuf,
    tcp: Option<String>,
    pid: Option<u32>,
    started: Option<Daemon>,
    describe: String,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs every row.
///
/// # Errors
/// When the daemon cannot be started or reached, or a row fails.
pub fn run(opts: &Options) -> Result<Report> {
    let loadavg_start = loadavg();
    crate::client::set_request_ids(opts.request_ids);
    let mut target = match &opts.addr {
        Some(socket) => Target {
            socket: socket.clone(),
            tcp: opts.tcp.clone(),
            pid: opts.pid,
            started: None,
            describe: format!("npud at unix:{}", socket.display()),
        },
        None => {
            let d = Daemon::start()?;
            Target {
                socket: d.socket.clone(),
                tcp: Some(d.tcp.clone()),
                pid: d.pid(),
                describe: format!(
                    "npud --backend emulator ({}), started on unix:{} and {}",
                    d.binary.display(),
                    d.socket.display(),
                    d.tcp
                ),
                started: Some(d),
            }
        }
    };
    // Every client runs on this one thread, as an application's own runtime would: the
    // caller, tonic's connection tasks and the socket's readiness all on one thread, so a
    // round trip pays for the transport and the server, not for hops between the harness's
    // threads (a multi-threaded client runtime added about 70 µs to every unary call here,
    // half of the bare tonic echo's measured cost).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let measured = opts
        .iterations
        .unwrap_or(if opts.quick { 300 } else { 20_000 });
    let it = Iters {
        warmup: (measured / 10).max(20),
        measured,
    };
    let mut report = Report {
        quick: opts.quick,
        machine: Machine {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            loadavg_start,
            loadavg_end: String::new(),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .into(),
        },
        daemon: if opts.request_ids {
            format!("{}; every call carries a request id", target.describe)
        } else {
            target.describe.clone()
        },
        daemon_threads: None,
        rows: Vec::new(),
        memory: Vec::new(),
        cpu: Vec::new(),
        ratios: Vec::new(),
        skipped: Vec::new(),
        notes: Vec::new(),
    };
    let result = rt.block_on(all_rows(&mut report, &mut target, it, opts));
    // Closes every client connection, so that npud's graceful shutdown does not wait for
    // connections nobody drives any more.
    drop(rt);
    if let Some(mut d) = target.started.take() {
        if let Err(e) = &result {
            eprintln!("npud's log:\n{}", d.log());
            return Err(BenchError(e.to_string()));
        }
        d.stop();
    }
    result?;
    report.machine.loadavg_end = loadavg();
    report.compute_ratios();
    Ok(report)
}

/// Sections of the run, for `--only`. `rss` runs only when named.
pub const SECTIONS: [&str; 17] = [
    "floors",
    "fastpath",
    "inproc",
    "tcp",
    "chains",
    "pipelined",
    "sizes",
    "clients",
    "stalls",
    "memory",
    "cpu",
    "profiles",
    "tls",
    "device",
    "faults",
    "priorities",
    "rss",
];

/// Rounds the side-by-side rows (1, 1b, 3), and the fd sizes of row 6, alternate over. Short
/// rounds matter: on a small VM a one-client round trip is bimodal (two threads landing on one
/// vCPU or on two), the mode lasting a fraction of a second, and rows measured in long rounds
/// could each catch a different mode (10 rounds: 64 MiB over 4 KiB read 0.91–1.12 across runs;
/// 40: 0.99–1.00).
const ROUNDS: usize = 40;
/// Rounds the client counts of row 7 alternate over (5: the p99 goal read 2.99–4.57 across
/// runs; 10: 3.42–3.64).
const CLIENT_ROUNDS: usize = 10;

/// How many of at most `most` rounds `it` is split into: a round keeps at least 250 measured
/// samples, so a `--quick` run is not spent opening sessions for rounds of a few dispatches.
fn rounds(it: Iters, most: usize) -> usize {
    (it.measured / 250).clamp(1, most)
}
/// Rounds rows 16 alternate their two daemons over.
const DEVICE_ROUNDS: usize = 8;
/// Row 7 measures this many times the single-dispatch rows' iterations: its p99s are compared,
/// and with many clients a p99 rests on few events (one stall of the machine delays every
/// client's dispatch in flight at once), so it needs more samples to be steady.
const CLIENT_SAMPLES: usize = 4;

fn memory_row(key: &str, name: &str, rss_kib: u64, hold: (usize, usize, u64)) -> MemoryRow {
    let (sessions, tensors, bytes) = hold;
    MemoryRow {
        row: "8".into(),
        key: key.into(),
        name: name.into(),
        rss_kib,
        sessions,
        tensors_per_session: tensors,
        tensor_bytes: bytes,
    }
}

async fn all_rows(
    report: &mut Report,
    target: &mut Target,
    it: Iters,
    opts: &Options,
) -> Result<()> {
    let only = &opts.only;
    let want = |s: &str| only.is_empty() || only.iter().any(|o| o == s);
    // Row 8, idle: before anything else touches the daemon.
    if want("memory") {
        match target.pid {
            Some(pid) => report.memory.push(memory_row(
                keys::RSS_IDLE,
                "npud resident memory, idle (just started)",
                rss_kib(pid)?,
                (0, 0, 0),
            )),
            None => report
                .skipped
                .push("row 8: no process id for the given daemon (--pid)".into()),
        }
    }
    let unix = Ready::new(
        Session::open(connect_unix(&target.socket).await?, "bench-unix").await?,
        true,
    )
    .await?;
    report.daemon_threads = Some(unix.session.threads);
    let dir = tempfile::Builder::new().prefix("npub").tempdir_in("/tmp")?;
    let stalls = want("stalls").then_some(target.socket.as_path());
    side_by_side(
        report,
        &unix,
        dir.path(),
        it,
        want("floors"),
        target.pid,
        stalls,
    )
    .await?;
    if want("floors") {
        let floors = FloorServers::start(dir.path(), unix.session.threads.0)?;
        let size = unix.message_bytes();
        let p = tonic_stream(&floors.echo, size, DEPTH, it).await?;
        let mut r = Row::new(
            "1c",
            "tonic_stream_per_message",
            "bare tonic bidi stream echo, 16 in flight: per message",
            p.per_op,
        );
        r.message_bytes = Some(size.max(8));
        report.rows.push(r);
        floors.stop().await;
    }
    if want("fastpath") {
        fastpath_rows(report, &target.socket, target.pid, dir.path(), it).await?;
    }
    if want("inproc") {
        inproc(report, it).await?;
    }
    if want("tcp") {
        tcp(report, target, it).await?;
    }
    if want("chains") {
        chains(report, &unix, it).await?;
    }
    if want("pipelined") {
        let mut cpu = CpuMeter::new(target.pid);
        let p = cpu
            .measure(it.warmup + it.measured, unix.pipelined(DEPTH, it))
            .await?;
        let mut r = Row::new(
            "9",
            keys::PIPELINED,
            "npud Submit stream, 16 in flight: per dispatch",
            p.per_op,
        );
        r.message_bytes = Some(unix.message_bytes());
        r.daemon_cpu_us = cpu.per_op_us();
        report.rows.push(r);
        report.rows.push(Row::new(
            "9",
            "pipelined_latency",
            "npud Submit stream, 16 in flight: submit to completion",
            p.latency,
        ));
    }
    if want("sizes") {
        sizes(report, &unix, it).await?;
    }
    if want("tls") {
        match &target.tcp {
            Some(plain) => {
                crate::tls::rows(report, plain, it, rounds(it, ROUNDS)).await?;
            }
            None => report
                .skipped
                .push("row 13: no TCP address for the given daemon (--tcp)".into()),
        }
    }
    if want("profiles") {
        let profiles: Vec<String> = if opts.profiles.is_empty() {
            crate::profiles::DEFAULT
                .iter()
                .map(|p| (*p).to_owned())
                .collect()
        } else {
            opts.profiles.clone()
        };
        crate::profiles::rows(report, &profiles, it, rounds(it, ROUNDS)).await?;
    }
    if want("clients") {
        // The client counts are measured in turn over rounds, so that a change in the
        // machine's load falls on all of them alike (their p99s are compared).
        let client_rounds = rounds(it, CLIENT_ROUNDS);
        let round = Iters {
            warmup: (it.warmup / client_rounds).max(crate::rows::MIN_ROUND_WARMUP),
            measured: (it.measured * CLIENT_SAMPLES / client_rounds).max(1),
        };
        let mut acc: Vec<(Acc, CpuMeter)> = CLIENTS
            .iter()
            .map(|_| (Acc::default(), CpuMeter::new(target.pid)))
            .collect();
        for _ in 0..client_rounds {
            for (n, (samples, cpu)) in CLIENTS.iter().zip(acc.iter_mut()) {
                let ops = load::total_ops(*n, round);
                samples.add(
                    cpu.measure(ops, load::clients(&target.socket, *n, round))
                        .await?,
                );
            }
        }
        for (n, (samples, cpu)) in CLIENTS.into_iter().zip(acc) {
            let mut r = Row::new(
                "7",
                &format!("clients_{n}"),
                &format!("{n} concurrent clients, one dispatch each at a time: aggregate"),
                samples.summary(),
            );
            r.clients = Some(n);
            r.daemon_cpu_us = cpu.per_op_us();
            report.rows.push(r);
        }
    }
    if want("device") {
        // Rows 16: windows of a fraction of a second a round (quick: a tenth), so that the
        // many-client rows count thousands of dispatches either way.
        let window = if it.measured >= 20_000 {
            Duration::from_millis(250)
        } else {
            Duration::from_millis(60)
        };
        crate::device::rows(
            report,
            it,
            rounds(it, DEVICE_ROUNDS),
            rounds(it, ROUNDS),
            window,
        )
        .await?;
    }
    if want("priorities") {
        // Rows 16 (priorities): a second a window, so that the interactive client's p99 (one
        // dispatch every 2 ms) rests on thousands of dispatches: with a quarter of a second, 880
        // dispatches made its p99 the ninth slowest, and one hiccup of the host moved the ratio
        // from 1.5 to 2.7 between runs.
        let window = if it.measured >= 20_000 {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(60)
        };
        crate::interactive::rows(report, rounds(it, DEVICE_ROUNDS), window).await?;
    }
    if want("faults") {
        crate::faulting::rows(report, it, rounds(it, DEVICE_ROUNDS)).await?;
    }
    if want("cpu") {
        cpu_rows(report, &unix, &target.socket, target.pid, dir.path(), it).await?;
    }
    let mut s = unix.session.clone();
    load::close(&mut s).await;
    if only.iter().any(|o| o == "rss") {
        match target.pid {
            Some(pid) => report
                .memory
                .extend(crate::rss::queued_chains(&target.socket, pid).await?),
            None => report
                .skipped
                .push("row 14: no process id for the given daemon (--pid)".into()),
        }
    }
    if want("memory")
        && let Some(pid) = target.pid
    {
        let (sessions, tensors, bytes) = HOLD;
        let mut held = load::hold(&target.socket, sessions, tensors, bytes).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        report.memory.push(memory_row(
            "rss_64_sessions_16_tensors",
            "npud resident memory with 64 sessions of 16 tensors (4 KiB)",
            rss_kib(pid)?,
            HOLD,
        ));
        for s in &mut held {
            load::close(s).await;
        }
    }
    Ok(())
}

/// Rows 1, 1b, 3 and 12, measured in turn over [`ROUNDS`] rounds so that a change in the
/// machine's load during the run falls on all of them alike. Without the floors, rows 1 and 1b
/// are left out; without `stalls` (the daemon's socket), row 12.
async fn side_by_side(
    report: &mut Report,
    unix: &Ready,
    dir: &std::path::Path,
    it: Iters,
    floors: bool,
    pid: Option<u32>,
    stalls: Option<&std::path::Path>,
) -> Result<()> {
    let size = unix.message_bytes();
    let n_rounds = rounds(it, ROUNDS);
    let round = Iters {
        warmup: (it.warmup / n_rounds).max(crate::rows::MIN_ROUND_WARMUP),
        measured: (it.measured / n_rounds).max(1),
    };
    let (mut raw_acc, mut echo_acc, mut npud_acc) =
        (Acc::default(), Acc::default(), Acc::default());
    let mut cpu = CpuMeter::new(pid);
    let servers = if floors {
        Some(FloorServers::start(dir, unix.session.threads.0)?)
    } else {
        None
    };
    let mut raw = match &servers {
        Some(f) => Some(RawEcho::connect(&f.raw, size)?),
        None => None,
    };
    let tonic = match &servers {
        Some(f) => Some(TonicEcho::connect(&f.echo, size).await?),
        None => None,
    };
    let mut hogs = Vec::new();
    if let Some(socket) = stalls {
        for (kind, key, name) in STALLS {
            hogs.push((
                stall::HogThread::start(kind, socket).await?,
                key,
                name,
                stall::Measured::default(),
            ));
        }
    }
    // Row 12 measures a quarter of row 3's dispatches; each round sees the hog's request
    // complete at least once.
    let stall_round = Iters {
        warmup: round.warmup,
        measured: (it.measured / 4 / n_rounds).max(1),
    };
    let min_hog = stall::MIN_HOG_ROUNDS.div_ceil(n_rounds);
    for _ in 0..n_rounds {
        for (hog, _, _, acc) in &mut hogs {
            hog.round(unix, stall_round, min_hog, acc).await?;
        }
        if let Some(raw) = raw.as_mut() {
            raw_acc.add(raw.measure(round)?);
        }
        if let Some(t) = &tonic {
            echo_acc.add(t.measure(round).await?);
        }
        npud_acc.add(
            cpu.measure(round.warmup + round.measured, unix.dispatches(round))
                .await?,
        );
    }
    drop(raw);
    drop(tonic);
    if let Some(s) = servers {
        s.stop().await;
    }
    if floors {
        let mut r = Row::new(
            "1",
            keys::RAW_ECHO,
            "raw echo over a Unix socket (no gRPC)",
            raw_acc.summary(),
        );
        r.message_bytes = Some(size);
        report.rows.push(r);
        let mut r = Row::new(
            "1b",
            keys::TONIC_ECHO,
            "bare tonic unary echo over a Unix socket",
            echo_acc.summary(),
        );
        r.message_bytes = Some(size);
        report.rows.push(r);
    }
    let mut r = Row::new(
        "3",
        keys::NPUD_UNIX,
        "npud dispatch over a Unix socket, one client",
        npud_acc.summary(),
    );
    r.message_bytes = Some(size);
    if let Ok(g) = unix.reported.lock() {
        let (q, d) = g.means_us();
        r.daemon_queue_us = Some(q);
        r.daemon_device_us = Some(d);
    }
    r.daemon_cpu_us = cpu.per_op_us();
    report.rows.push(r);
    for (hog, key, name, acc) in hogs {
        let kind = hog.kind;
        let rounds = hog.stop().await?;
        let (ns, wall, queue) = acc.finish();
        let mut samples = Acc::default();
        samples.add((ns, wall));
        let mut r = Row::new("12", key, name, samples.summary());
        r.message_bytes = Some(size);
        match kind {
            Hog::Allocate(bytes) => r.tensor_bytes = Some(bytes),
            Hog::Chain(links) => r.links = Some(links),
        }
        r.hog_requests = Some(rounds);
        r.daemon_queue_us = Some(queue.0);
        r.tail_queue_us = Some(queue.1);
        report.rows.push(r);
    }
    Ok(())
}

/// Row 12's hogs: what each repeats, its row's key and what the row measures.
const STALLS: [(Hog, &str, &str); 2] = [
    (
        Hog::Allocate(1 << 30),
        keys::STALL_ALLOC,
        "one client's dispatch while another allocates and frees 1 GiB tensors",
    ),
    (
        Hog::Chain(1024),
        keys::STALL_CHAIN,
        "one client's dispatch while another runs 1,024-link chains",
    ),
];

/// Row 2: in-process, on a blocking thread.
async fn inproc(report: &mut Report, it: Iters) -> Result<()> {
    let (one, chain) = tokio::task::spawn_blocking(move || {
        let mut d = InProcess::open()?;
        let one = d.dispatch(it)?;
        let chain = d.chain(32, it.scaled_down(8))?;
        Ok::<_, BenchError>((one, chain))
    })
    .await
    .map_err(|e| BenchError(e.to_string()))??;
    report.rows.push(Row::new(
        "2",
        "inproc_dispatch",
        "in-process dispatch through hsa-core on the emulator",
        one,
    ));
    let mut r = Row::new(
        "2",
        "inproc_chain32_per_link",
        "in-process chain of 32: per link",
        chain.1,
    );
    r.links = Some(32);
    report.rows.push(r);
    Ok(())
}

/// Row 4: a session over TCP with device tensors.
async fn tcp(report: &mut Report, target: &Target, it: Iters) -> Result<()> {
    let Some(addr) = &target.tcp else {
        report
            .skipped
            .push("row 4: no TCP address for the given daemon (--tcp)".into());
        return Ok(());
    };
    let tcp = Ready::new(
        Session::open(connect_tcp(addr).await?, "bench-tcp").await?,
        false,
    )
    .await?;
    let mut acc = Acc::default();
    acc.add(tcp.dispatches(it).await?);
    let mut r = Row::new(
        "4",
        "npud_tcp",
        "npud dispatch over TCP loopback, one client",
        acc.summary(),
    );
    r.message_bytes = Some(tcp.message_bytes());
    report.rows.push(r);
    let mut s = tcp.session.clone();
    load::close(&mut s).await;
    Ok(())
}

/// Row 5: chains of 8 and 32.
async fn chains(report: &mut Report, unix: &Ready, it: Iters) -> Result<()> {
    for links in [8usize, 32] {
        let (chain, link) = unix.chains(links, it.scaled_down(links / 4)).await?;
        let mut r = Row::new(
            "5",
            &format!("chain{links}_per_chain"),
            &format!("npud chain of {links} over a Unix socket: per chain"),
            chain,
        );
        r.links = Some(links);
        report.rows.push(r);
        let mut r = Row::new(
            "5",
            &format!("chain{links}_per_link"),
            &format!("npud chain of {links}: per link"),
            link,
        );
        r.links = Some(links);
        report.rows.push(r);
    }
    Ok(())
}

/// Row 6: tensor sizes, by fd and inline.
async fn sizes(report: &mut Report, unix: &Ready, it: Iters) -> Result<()> {
    let bytes: Vec<u64> = SIZES.iter().map(|(b, _)| *b).collect();
    let small = it.scaled_down(2);
    let fd = unix.fd_sized(&bytes, rounds(small, ROUNDS), small).await?;
    for ((bytes, label), summary) in SIZES.into_iter().zip(fd) {
        let mut r = Row::new(
            "6",
            &format!("fd_{label}"),
            &format!("dispatch over two {label} tensors shared by fd"),
            summary,
        );
        r.tensor_bytes = Some(bytes);
        report.rows.push(r);
    }
    for (bytes, label) in SIZES {
        // Inline moves 2 × bytes per operation: fewer iterations for big tensors.
        let div = usize::try_from((bytes >> 12).max(4)).unwrap_or(usize::MAX);
        let mut r = Row::new(
            "6",
            &format!("inline_{label}"),
            &format!("write {label} inline, dispatch, read {label} inline"),
            unix.inline_sized(bytes, it.scaled_down(div)).await?,
        );
        r.tensor_bytes = Some(bytes);
        report.rows.push(r);
    }
    Ok(())
}

/// Row 10 measures at least this many calls of each server, so that one clock tick (10 ms) of
/// `/proc/<pid>/stat` is small against the total (at 50 µs a call: 25 ticks).
const CPU_CALLS: usize = 5000;
/// Rounds row 10's three servers are measured in turn over.
const CPU_ROUNDS: usize = 10;

/// CPU ticks and calls of one server over row 10's rounds.
#[derive(Debug, Default, Clone)]
struct Tally {
    ticks: u64,
    calls: u64,
    measured: u64,
    wall: Duration,
    /// ns of CPU by thread name over the same rounds.
    threads: std::collections::BTreeMap<String, u64>,
}

impl Tally {
    /// Runs `work` (`round`'s calls, warm-up included) and adds `pid`'s CPU ticks over it.
    async fn measure<F>(&mut self, pid: u32, round: Iters, work: F) -> Result<()>
    where
        F: Future<Output = Result<(Vec<u64>, Duration)>>,
    {
        let gone = || BenchError(format!("process {pid} is gone: no /proc/{pid}/stat"));
        let by_before = cpu_ns_by_thread(pid).unwrap_or_default();
        let before = stat_cpu_ticks(pid).ok_or_else(gone)?;
        let (_, wall) = work.await?;
        let after = stat_cpu_ticks(pid).ok_or_else(gone)?;
        for (name, ns) in cpu_ns_by_thread(pid).unwrap_or_default() {
            let was = by_before.get(&name).copied().unwrap_or(0);
            *self.threads.entry(name).or_insert(0) += ns.saturating_sub(was);
        }
        self.ticks += after.saturating_sub(before);
        self.calls += (round.warmup + round.measured) as u64;
        self.measured += round.measured as u64;
        self.wall += wall;
        Ok(())
    }

    fn row(&self, key: &str, name: &str) -> CpuRow {
        let f = crate::stats::f64_of;
        CpuRow {
            row: "10".into(),
            key: key.into(),
            name: name.into(),
            calls: self.calls,
            cpu_us_per_call: f(self.ticks) * us_per_tick() / f(self.calls.max(1)),
            cpu_ticks: self.ticks,
            wall_us_per_call: self.wall.as_secs_f64() * 1e6 / f(self.measured.max(1)),
            threads_us_per_call: self
                .threads
                .iter()
                .map(|(name, ns)| (name.clone(), f(*ns) / 1e3 / f(self.calls.max(1))))
                .collect(),
        }
    }
}

/// Row 10: the CPU time a server process spends per call while one client calls back to back
/// (user plus system, `/proc/<pid>/stat`, all its threads): the bare tonic echo's process,
/// this run's npud (polling for `executor.spin_us` as it reports), and a second npud started
/// with `--executor-spin-us 0` (always sleeping). The three are measured in turn over
/// [`CPU_ROUNDS`] rounds so that the machine's load falls on them alike.
async fn cpu_rows(
    report: &mut Report,
    unix: &Ready,
    socket: &std::path::Path,
    pid: Option<u32>,
    dir: &std::path::Path,
    it: Iters,
) -> Result<()> {
    let Some(pid) = pid else {
        report
            .skipped
            .push("row 10: no process id for the given daemon (--pid)".into());
        return Ok(());
    };
    let spin = unix.session.threads.1;
    let calls = it.measured.max(CPU_CALLS);
    let round = Iters {
        warmup: (calls / CPU_ROUNDS / 10).max(crate::rows::MIN_ROUND_WARMUP),
        measured: calls / CPU_ROUNDS,
    };
    let floors = FloorServers::start(dir, unix.session.threads.0)?;
    let echo = TonicEcho::connect(&floors.echo, unix.message_bytes()).await?;
    let hop = TonicEcho::connect(&floors.echo_hop, unix.message_bytes()).await?;
    let mut sleeper = Daemon::start_with(None, &["--executor-spin-us", "0"])?;
    let sleeper_pid = sleeper
        .pid()
        .ok_or_else(|| BenchError("the second npud has no process id".into()))?;
    let sleeping = Ready::new(
        Session::open(connect_unix(&sleeper.socket).await?, "bench-cpu").await?,
        true,
    )
    .await?;
    let fast = Ready::new(
        Session::open(connect_unix(socket).await?, "bench-cpu-ring").await?,
        true,
    )
    .await?;
    let mut ring = BenchRing::attach(&mut fast.session.clone()).await?;
    let (mut e, mut on, mut off) = (Tally::default(), Tally::default(), Tally::default());
    let (mut f, mut h) = (Tally::default(), Tally::default());
    for _ in 0..CPU_ROUNDS {
        e.measure(floors.pid(), round, echo.measure(round)).await?;
        h.measure(floors.pid(), round, hop.measure(round)).await?;
        on.measure(pid, round, unix.dispatches(round)).await?;
        off.measure(sleeper_pid, round, sleeping.dispatches(round))
            .await?;
        f.measure(pid, round, async { ring.unary(&fast.request, round) })
            .await?;
    }
    drop(ring);
    let mut s = fast.session.clone();
    load::close(&mut s).await;
    let mut s = sleeping.session.clone();
    load::close(&mut s).await;
    drop((echo, hop, sleeping));
    floors.stop().await;
    sleeper.stop();
    report.cpu.push(e.row(
        keys::CPU_TONIC_ECHO,
        "bare tonic unary echo: its server process's CPU per call",
    ));
    report.cpu.push(h.row(
        keys::CPU_TONIC_ECHO_HOP,
        "tonic unary echo through a second server thread and back: its server process's CPU per call",
    ));
    report.cpu.push(on.row(
        keys::CPU_NPUD_POLLING,
        &format!("npud dispatch, one client, executor.spin_us = {spin}: npud's CPU per dispatch"),
    ));
    report.cpu.push(off.row(
        keys::CPU_NPUD_SLEEPING,
        "npud dispatch, one client, executor.spin_us = 0: npud's CPU per dispatch",
    ));
    report.cpu.push(f.row(
        keys::CPU_NPUD_FASTPATH,
        &format!("npud fast-path dispatch, one client, executor.spin_us = {spin}: npud's CPU per dispatch"),
    ));
    Ok(())
}

/// Rows 15: in-process dispatch, the shared-memory ping-pong, fast-path unary and pipelined
/// dispatch, measured in turn over [`ROUNDS`] rounds so that the machine's load falls on them
/// alike; then npud's CPU with 64 idle fast-path sessions.
async fn fastpath_rows(
    report: &mut Report,
    socket: &std::path::Path,
    pid: Option<u32>,
    dir: &std::path::Path,
    it: Iters,
) -> Result<()> {
    let fast = Ready::new(
        Session::open(connect_unix(socket).await?, "bench-ring").await?,
        true,
    )
    .await?;
    let mut ring = BenchRing::attach(&mut fast.session.clone()).await?;
    let mut inproc = crate::inproc::InProcess::open()?;
    let mut pingpong = PingPong::start(dir)?;
    let n_rounds = rounds(it, ROUNDS);
    let round = Iters {
        warmup: (it.warmup / n_rounds).max(crate::rows::MIN_ROUND_WARMUP),
        measured: (it.measured / n_rounds).max(1),
    };
    let (mut inp, mut pp, mut unary) = (Acc::default(), Acc::default(), Acc::default());
    let (mut per, mut lat, mut pwall) = (Vec::new(), Vec::new(), Duration::ZERO);
    let mut cpu = CpuMeter::new(pid);
    let mut pcpu = CpuMeter::new(pid);
    let place = match crate::place::Placement::pin(pid) {
        Ok(p) => {
            p.with_daemon(pingpong.child_pid());
            Some(p)
        }
        Err(why) => {
            report.notes.push(format!(
                "rows 15 ran unpinned (the in-process row and npud's executor may run on CPUs of different speeds): {why}"
            ));
            None
        }
    };
    let mut unsettled = 0;
    for _ in 0..n_rounds {
        if let Some(p) = &place
            && !p.on_daemon_cpu()
        {
            unsettled += 1;
        }
        inp.add(inproc.samples(round)?);
        if let Some(p) = &place {
            p.on_client_cpu();
        }
        pp.add(pingpong.measure(round));
        let ops = round.warmup + round.measured;
        unary.add(
            cpu.measure(ops, async { ring.unary(&fast.request, round) })
                .await?,
        );
        let (a, b, w) = pcpu
            .measure(ops, async { ring.pipelined(&fast.request, DEPTH, round) })
            .await?;
        per.extend(a);
        lat.extend(b);
        pwall += w;
    }
    drop(place);
    if unsettled > 0 {
        report.notes.push(format!(
            "rows 15: in {unsettled} of {n_rounds} rounds npud's executor still ran when the \
             in-process row started on its CPU (that row may read slow there)"
        ));
    }
    pingpong.stop();
    drop(ring);
    let mut s = fast.session.clone();
    load::close(&mut s).await;
    report.rows.push(Row::new(
        "15",
        keys::FAST_INPROC,
        "in-process dispatch through hsa-core, in turn with the fast-path rows",
        inp.summary(),
    ));
    report.rows.push(Row::new(
        "15",
        keys::SHM_PINGPONG,
        "shared-memory ping-pong between two spinning processes (the floor)",
        pp.summary(),
    ));
    let mut r = Row::new(
        "15",
        keys::FAST_UNARY,
        "npud fast-path dispatch (shared-memory ring), one client",
        unary.summary(),
    );
    r.daemon_cpu_us = cpu.per_op_us();
    report.rows.push(r);
    let p = crate::fastpath::pipelined_summary(per, lat, pwall);
    let mut r = Row::new(
        "15",
        keys::FAST_PIPELINED,
        "npud fast-path ring, 16 in flight: per dispatch",
        p.per_op,
    );
    r.daemon_cpu_us = pcpu.per_op_us();
    report.rows.push(r);
    report.rows.push(Row::new(
        "15",
        "fastpath_pipelined_latency",
        "npud fast-path ring, 16 in flight: submit to completion",
        p.latency,
    ));
    idle_rings(report, socket, pid).await
}

/// Row 15: npud's CPU over a few seconds while 64 sessions each hold an idle ring.
async fn idle_rings(report: &mut Report, socket: &std::path::Path, pid: Option<u32>) -> Result<()> {
    const RINGS: usize = 64;
    const SECONDS: u64 = 5;
    let Some(pid) = pid else {
        report
            .skipped
            .push("row 15 (idle rings): no process id for the given daemon (--pid)".into());
        return Ok(());
    };
    let channel = connect_unix(socket).await?;
    let mut held = Vec::new();
    for i in 0..RINGS {
        let mut s = Session::open(channel.clone(), &format!("bench-idle-{i}")).await?;
        let r = BenchRing::attach(&mut s).await?;
        held.push((s, r));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let gone = || BenchError(format!("process {pid} is gone: no /proc/{pid}/stat"));
    let before = stat_cpu_ticks(pid).ok_or_else(gone)?;
    tokio::time::sleep(Duration::from_secs(SECONDS)).await;
    let after = stat_cpu_ticks(pid).ok_or_else(gone)?;
    let ticks = after.saturating_sub(before);
    let per_s = crate::stats::f64_of(ticks) * us_per_tick() / crate::stats::f64_of(SECONDS);
    report.cpu.push(CpuRow {
        row: "15".into(),
        key: keys::CPU_IDLE_RINGS.into(),
        name: format!(
            "npud with {RINGS} idle fast-path sessions: CPU µs per second of wall time \
             (10000 = 1% of a core)"
        ),
        calls: SECONDS,
        cpu_us_per_call: per_s,
        cpu_ticks: ticks,
        wall_us_per_call: 1e6,
        threads_us_per_call: std::collections::BTreeMap::new(),
    });
    for (mut s, r) in held {
        drop(r);
        load::close(&mut s).await;
    }
    Ok(())
}
