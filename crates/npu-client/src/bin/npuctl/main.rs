//! `npuctl`: the command for npud's operators and users.
//!
//! Tables for people, `--json` for scripts. `NPUD_ADDR` (or `--addr`) selects the daemon.

#![forbid(unsafe_code)]

mod bench;
mod demo;
mod emu_design;
mod fleet;
mod health;
mod inspect;
mod inspect_hsaco;
mod output;
mod pack;
mod programs;
mod run;
mod sessions;
mod status;
mod top;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use npu_client::{Client, ConnectOptions, Fleet, FleetOptions, FleetSpec, Operator, SessionClass};

/// Operate and use npud, the daemon that owns the NPU.
#[derive(Debug, Parser)]
#[command(name = "npuctl", version)]
struct Cli {
    /// The daemon's address: a socket path, unix:PATH, http://127.0.0.1:PORT or https://HOST:PORT
    /// (default: the daemon's default socket).
    #[arg(long, global = true, env = "NPUD_ADDR")]
    addr: Option<String>,
    /// Several daemons: ADDR,ADDR,... or dns:///NAME:PORT (every address NAME resolves to).
    /// `run` opens its session on the least loaded healthy one (before --addr), `bench`
    /// measures that one, `fleet` lists them; commands about one daemon still need --addr.
    #[arg(long, global = true, env = "NPUD_FLEET")]
    fleet: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// PEM CA bundle that signs the daemon's certificate, for https:// (default: the system
    /// roots).
    #[arg(long, global = true, env = "NPUD_CA")]
    ca: Option<PathBuf>,
    /// PEM client certificate for mTLS (with --key).
    #[arg(long, global = true, env = "NPUD_CERT")]
    cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, global = true, env = "NPUD_KEY")]
    key: Option<PathBuf>,
    /// The name the daemon's certificate must carry, when it is not the address's host.
    #[arg(long, global = true, env = "NPUD_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,
    /// A file holding an identity token's secret (sent as x-npud-token).
    #[arg(long, global = true, env = "NPUD_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Dispatch through gRPC even on a local daemon, instead of the session's shared-memory
    /// ring (also NPUD_FAST_PATH=0).
    #[arg(long, global = true)]
    no_fast_path: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Device, backend, sessions, programs, heap use and counters.
    Status,
    /// Open sessions and their counters.
    Sessions,
    /// Exit 0 when the daemon's gRPC health is SERVING, 1 otherwise (for exec probes).
    Health(health::Args),
    /// The hosts of --fleet: health, sessions, pending work, and where the next session goes.
    Fleet,
    /// A live view of sessions, programs, throughput and queue time (q quits).
    Top(top::Args),
    /// Stored programs, their counters, and quarantined programs; or clear a quarantine.
    Programs(programs::Args),
    /// Summarize a design directory (main.pdi + insts.bin) and list its instruction stream, or
    /// show the sections and kernels of an AIE hsaco.
    Inspect(inspect::Args),
    /// Write an AIE hsaco from PDI + insts.bin kernels and full ELFs.
    Pack(pack::Args),
    /// Write an emulated design for the emulator (main.pdi + insts.bin, or an hsaco).
    EmuDesign(emu_design::Args),
    /// Run a design once over files: inputs, then outputs, in the design's argument order.
    Run(run::Args),
    /// Measure npud against its floors (raw echo, bare gRPC, in-process) in one run.
    Bench(bench::Args),
    /// Start npud on the emulator, run the examples through it, and stop it.
    Demo(demo::Args),
    /// One of the demo's concurrent client processes.
    #[command(name = "__demo-worker", hide = true)]
    DemoWorker(worker::Args),
}

/// What a subcommand returns: success, or a message for stderr.
type CmdResult = Result<(), String>;

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(e) = options_apply(&cli.command, &matches) {
        eprintln!("npuctl: {e}");
        return ExitCode::FAILURE;
    }
    let _ = OPTIONS.set(ConnectOptions {
        tls_ca: cli.ca.clone(),
        tls_cert: cli.cert.clone(),
        tls_key: cli.key.clone(),
        tls_domain: cli.tls_server_name.clone(),
        token_file: cli.token_file.clone(),
        fast_path: !cli.no_fast_path && npu_client::fastpath::enabled_by_env(),
        ..ConnectOptions::default()
    });
    let addr = cli.addr.as_deref();
    let fleet = cli.fleet.as_deref();
    let one = |command: &str| one_daemon(command, addr, fleet);
    let result = match cli.command {
        Command::Status => match one("status") {
            Ok(addr) => status::run(addr, cli.json).await,
            Err(e) => Err(e),
        },
        Command::Sessions => match one("sessions") {
            Ok(addr) => sessions::run(addr, cli.json).await,
            Err(e) => Err(e),
        },
        Command::Health(a) => match one("health") {
            Ok(addr) => health::run(&a, addr, cli.json).await,
            Err(e) => Err(e),
        },
        Command::Fleet => fleet::run(fleet, cli.json).await,
        Command::Programs(a) => match one("programs") {
            Ok(addr) => programs::run(&a, addr, cli.json).await,
            Err(e) => Err(e),
        },
        Command::Top(a) => match one("top") {
            Ok(addr) => top::run(&a, addr).await,
            Err(e) => Err(e),
        },
        Command::Inspect(a) => inspect::run(&a, cli.json),
        Command::Pack(a) => pack::run(&a, cli.json),
        Command::EmuDesign(a) => emu_design::run(&a, addr, cli.json).await,
        Command::Run(a) => run::run(&a, addr, fleet, cli.json).await,
        Command::Bench(a) => bench::run(&a, addr, fleet, cli.json).await,
        Command::Demo(a) => demo::run(&a).await,
        Command::DemoWorker(a) => worker::run(&a).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("npuctl: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The global connection options (`--addr`, `--fleet`, the TLS files, the token) apply to every
/// subcommand that connects; `demo` starts a daemon of its own and `bench` measures one on
/// this machine's Unix socket, so such an option given to them on the command line is refused,
/// saying why, rather than ignored. (From the environment they are left alone: a pod's
/// `NPUD_TOKEN_FILE` is no request.)
fn options_apply(command: &Command, matches: &clap::ArgMatches) -> Result<(), String> {
    let given = |id: &str| {
        let sub = matches.subcommand().map(|(_, m)| m);
        [Some(matches), sub].into_iter().flatten().any(|m| {
            m.try_get_raw(id).is_ok_and(|v| v.is_some())
                && m.value_source(id) == Some(ValueSource::CommandLine)
        })
    };
    let (name, unused, why): (&str, &[&str], &str) = match command {
        Command::Demo(_) => (
            "demo",
            &[
                "addr",
                "fleet",
                "ca",
                "cert",
                "key",
                "tls_server_name",
                "token_file",
            ],
            "it starts a daemon of its own on a private socket",
        ),
        Command::Bench(_) => (
            "bench",
            &["ca", "cert", "key", "tls_server_name", "token_file"],
            "it measures a daemon on this machine's Unix socket (--addr), beside floors \
             measured on this machine",
        ),
        _ => return Ok(()),
    };
    match unused.iter().find(|id| given(id)) {
        Some(id) => Err(format!(
            "--{} does not apply to npuctl {name}: {why}",
            id.replace('_', "-")
        )),
        None => Ok(()),
    }
}

/// The daemon a command about one daemon talks to: with only `--fleet` (or `NPUD_FLEET`) given
/// it would silently fall back to the default socket, so it refuses instead.
fn one_daemon<'a>(
    command: &str,
    addr: Option<&'a str>,
    fleet: Option<&str>,
) -> Result<Option<&'a str>, String> {
    match (addr, fleet) {
        (None, Some(f)) => Err(format!(
            "npuctl {command} shows one daemon: give --addr (or NPUD_ADDR); the fleet {f} is \
             listed by `npuctl fleet`"
        )),
        _ => Ok(addr),
    }
}

/// The connect options the global flags (TLS, token) give.
static OPTIONS: OnceLock<ConnectOptions> = OnceLock::new();

/// The connect options from the global flags, for every subcommand that connects.
fn connect_options() -> ConnectOptions {
    OPTIONS.get().cloned().unwrap_or_default()
}

/// A session-less connection for the operator views.
async fn operator(addr: Option<&str>) -> Result<Operator, String> {
    Operator::connect_with(addr, connect_options())
        .await
        .map_err(|e| e.to_string())
}

/// The fleet `--fleet` names, its hosts probed once.
async fn fleet(spec: &str) -> Result<Fleet, String> {
    fleet_with(spec, connect_options()).await
}

/// The fleet `--fleet` names, its sessions opened with `connect`.
async fn fleet_with(spec: &str, connect: ConnectOptions) -> Result<Fleet, String> {
    let spec = FleetSpec::parse(spec).map_err(|e| format!("--fleet: {e}"))?;
    let options = FleetOptions {
        connect,
        ..FleetOptions::default()
    };
    Fleet::connect_with(spec, options)
        .await
        .map_err(|e| format!("--fleet: {e}"))
}

/// What a subcommand that opens a session to dispatch asks of it.
#[derive(Debug, Clone, clap::Args)]
struct SessionArgs {
    /// The session's class: batch, or interactive (its dispatches go first; the daemon's
    /// policy says who may ask for it).
    #[arg(long = "class", value_name = "batch|interactive", default_value_t = SessionClass::Batch)]
    session_class: SessionClass,
    /// An interactive session's deadline per dispatch, admission to answer, in microseconds
    /// (at most 10000000).
    #[arg(long, value_name = "N")]
    deadline_us: Option<u64>,
}

impl SessionArgs {
    /// The global connect options with this session's class and deadline.
    fn options(&self) -> ConnectOptions {
        ConnectOptions {
            session_class: self.session_class,
            deadline: self.deadline_us.map(Duration::from_micros),
            ..connect_options()
        }
    }
}

/// A session of class `s`: on the least loaded healthy host of `--fleet` when given, else on
/// `--addr`.
async fn session(
    addr: Option<&str>,
    fleet: Option<&str>,
    s: &SessionArgs,
) -> Result<Client, String> {
    match fleet {
        Some(spec) => fleet_with(spec, s.options())
            .await?
            .open()
            .await
            .map_err(|e| e.to_string()),
        None => Client::connect_with(addr, s.options())
            .await
            .map_err(|e| e.to_string()),
    }
}
