//! The `npud` binary: parse flags, load the configuration, start logging, open the device, serve.

#![forbid(unsafe_code)]

use std::cell::Cell;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use npud::config::{
    Backend, Config, LogFormat, OverrideEmulator, OverrideExecutor, OverrideLog, OverrideMetrics,
    Overrides,
};

/// mimalloc returns freed pages to the kernel shortly after they are freed; glibc's malloc
/// kept a load's peak RSS long after the load (see `budget.rs`) — but only when it is called:
/// see [`collect_freed`].
#[global_allocator]
static ALLOCATOR: npud_alloc::MiMalloc = npud_alloc::MiMalloc;

/// How often, at most, an I/O thread asks mimalloc to give freed memory back.
const COLLECT_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    /// When this thread last called [`collect_freed`].
    static COLLECTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Hands freed memory back to the kernel.
///
/// mimalloc does that work only inside its own calls: a block freed by another thread (a
/// request decoded on an I/O thread, dropped by the executor) waits in its page's
/// cross-thread list until the page's owner allocates again, and a purge waits for the next
/// allocation after its delay. Once a load ends the I/O threads allocate nothing, so a load's
/// peak stayed resident (row 14 of `npuctl-bench`: 220 MiB 15 s after 16 sessions' queued
/// chains were answered, with a 12 MiB live heap measured by heaptrack on the system
/// allocator). `npud_alloc::collect` takes the calling thread's cross-thread frees, retires its
/// empty pages and runs the purges that are due; without `force` it costs a walk of the
/// thread's pages, so it runs when a thread goes idle, at most every [`COLLECT_EVERY`].
fn collect_freed() {
    let now = Instant::now();
    let due = COLLECTED.with(|c| {
        let due = c
            .get()
            .is_none_or(|t| now.duration_since(t) >= COLLECT_EVERY);
        if due {
            c.set(Some(now));
        }
        due
    });
    if due {
        npud_alloc::collect();
    }
}

/// Owns one AMD XDNA NPU and serves it over gRPC.
#[derive(Debug, Parser)]
#[command(name = "npud", version)]
struct Cli {
    /// TOML configuration file (default: /etc/npud/npud.toml when present).
    #[arg(long, env = "NPUD_CONFIG")]
    config: Option<PathBuf>,
    /// emulator (built-in software NPU) or hsa (ROCR on an NPU).
    #[arg(long, value_parser = parse_backend)]
    backend: Option<Backend>,
    /// The gRPC Unix socket.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The fd socket (default: beside the gRPC socket, named after it: npud.sock gives
    /// npud.fd.sock).
    #[arg(long)]
    fd_socket: Option<PathBuf>,
    /// Also listen on TCP, e.g. 127.0.0.1:50051 (TLS with [tls] in the configuration).
    #[arg(long)]
    tcp: Option<String>,
    /// Serve Prometheus metrics (GET /metrics) on this address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Listen on a TCP address that is not loopback without TLS (tokens and tensor bytes
    /// then cross the network in the clear).
    #[arg(long)]
    allow_insecure_tcp: bool,
    /// Path of libhsa-runtime64.so (hsa backend).
    #[arg(long)]
    library: Option<PathBuf>,
    /// AIE packet ABI: auto (the default: proven from what the runtime shows, refusing to
    /// start where nothing proves one), kernel-object, g2, g1b or g1a.
    #[arg(long)]
    packet_abi: Option<String>,
    /// Whether the G2 runtime takes full-ELF packets (FullElf kernels): true, false, or unset
    /// (proven only for a G2 runtime with the AIE loader).
    #[arg(long)]
    g2_full_elf: Option<bool>,
    /// npu1 or npu2, overriding the agent name and the PCI id in sysfs.
    #[arg(long)]
    generation: Option<String>,
    /// Where sysfs is mounted (the NPU's PCI id is read there when the agent name is not
    /// specific).
    #[arg(long)]
    sysfs_root: Option<PathBuf>,
    /// The emulator's agent: aie2 (npu1) or aie2p (npu2).
    #[arg(long)]
    emulator_agent: Option<String>,
    /// The ROCR release the emulator behaves as: rocr-newest, rocr-g2-2026-07, rocr-g2-2026-05,
    /// rocr-late-2025, rocm-7.0 or kernel-object.
    #[arg(long)]
    emulator_profile: Option<String>,
    /// The emulator's hang timeout, in milliseconds.
    #[arg(long)]
    emulator_timeout_ms: Option<u64>,
    /// Where quarantine records survive restarts ("" keeps them in memory only).
    #[arg(long, value_parser = any_path)]
    state_dir: Option<PathBuf>,
    /// How long a session outlives its last connection, in milliseconds.
    #[arg(long)]
    session_grace_ms: Option<u64>,
    /// Threads serving gRPC and the fd socket (0: one per two cores past the first, 1 to 4).
    #[arg(long)]
    io_threads: Option<u32>,
    /// How long the executor polls for work before it sleeps, in µs (0: never polls).
    #[arg(long)]
    executor_spin_us: Option<u64>,
    /// Log filter (info, debug, npud=trace, ...).
    #[arg(long)]
    log_level: Option<String>,
    /// plain or json.
    #[arg(long, value_parser = parse_log_format)]
    log_format: Option<LogFormat>,
    /// Write "ready" to this file once the daemon is serving.
    #[arg(long)]
    ready_file: Option<PathBuf>,
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    match s {
        "emulator" => Ok(Backend::Emulator),
        "hsa" => Ok(Backend::Hsa),
        _ => Err(format!("{s:?}: expected emulator or hsa")),
    }
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s {
        "plain" => Ok(LogFormat::Plain),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("{s:?}: expected plain or json")),
    }
}

/// A path, the empty one included (clap's own path parser refuses `""`, which `--state-dir`
/// documents as "in memory only").
fn any_path(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

fn main() -> ExitCode {
    // Before anything else: a SIGHUP or SIGTERM while the configuration loads or the device
    // opens must not take the default action, which ends the process.
    if let Err(e) = npud::signals::catch_early() {
        eprintln!("npud: installing signal handlers: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    let overrides = Overrides {
        socket: cli.socket,
        fd_socket: cli.fd_socket,
        tcp: cli.tcp,
        allow_insecure_tcp: cli.allow_insecure_tcp.then_some(true),
        backend: cli.backend,
        library: cli.library,
        packet_abi: cli.packet_abi,
        g2_full_elf: cli.g2_full_elf,
        generation: cli.generation,
        sysfs_root: cli.sysfs_root,
        state_dir: cli.state_dir,
        session_grace_ms: cli.session_grace_ms,
        io_threads: cli.io_threads,
        log: OverrideLog {
            level: cli.log_level,
            format: cli.log_format,
        },
        emulator: OverrideEmulator {
            agent_name: cli.emulator_agent,
            profile: cli.emulator_profile,
            timeout_ms: cli.emulator_timeout_ms,
        },
        executor: OverrideExecutor {
            spin_us: cli.executor_spin_us,
        },
        metrics: OverrideMetrics {
            listen: cli.metrics_listen,
        },
    };
    let cfg = match Config::load(cli.config.as_deref(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("npud: {e}");
            return ExitCode::from(2);
        }
    };
    let hints = npud::logging::init(&cfg);
    // Before the device opens: the programs a dead predecessor was running must be quarantined
    // before anything can run them again. An unusable directory is a configuration error.
    let persisted = match npud::state_dir::Persisted::open(&cfg.state_dir) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let (opened, serving) = match npud::server::open(&cfg) {
        Ok(x) => x,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match runtime(cfg.io_threads()) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.spawn(hints.log());
    rt.spawn(collect_ticker());
    let served = rt.block_on(npud::server::run(
        cfg,
        opened,
        serving,
        persisted,
        cli.ready_file,
    ));
    // Blocking work still running (a close of an fd a client sent, which the kernel may hold
    // for as long as that fd's owner wants) must not hold the exit.
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime requests are served on. One I/O thread is this thread running tokio's
/// current-thread scheduler: with a single worker, the multi-threaded scheduler's stealing and
/// cross-worker wake-ups are pure cost (16 clients: 12% more throughput and a 15% lower p99
/// with `npuctl bench` on 2 cores).
fn runtime(io_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = if io_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(io_threads);
        b
    };
    // A thread parks when it has nothing to do: the moment a load's memory is free.
    b.enable_all()
        .thread_name("npud-io")
        .on_thread_park(collect_freed)
        .build()
}

/// Wakes an I/O thread every [`COLLECT_EVERY`], so that one that parked too soon after its
/// last collection to collect again still collects once the daemon is idle.
async fn collect_ticker() {
    let mut tick = tokio::time::interval(COLLECT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        collect_freed();
    }
}
