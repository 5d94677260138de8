//! `npuctl-bench` (run as `npuctl bench`): measures npud against its floors and prints a table,
//! or JSON with `--json`.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use npu_bench::run::{Options, run};

/// Measures what sharing the NPU through npud costs, side by side with the floors.
#[derive(Debug, Parser)]
#[command(name = "npuctl bench", version)]
struct Cli {
    /// Few iterations per row: every row, in seconds (figures are indicative only).
    #[arg(long)]
    quick: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// A running daemon's Unix socket (`unix:PATH` or a path) instead of starting one.
    #[arg(long)]
    addr: Option<String>,
    /// That daemon's TCP address (host:port), for row 4.
    #[arg(long, requires = "addr")]
    tcp: Option<String>,
    /// That daemon's process id, for row 8 (resident memory).
    #[arg(long, requires = "addr")]
    pid: Option<u32>,
    /// Measured iterations of the single-dispatch rows (default 20000; 300 with --quick).
    #[arg(long)]
    iterations: Option<usize>,
    /// Only these sections (comma-separated): floors, inproc, tcp, chains, pipelined, sizes,
    /// clients, stalls, memory, cpu, profiles, tls (row 13), fastpath (rows 15), device (rows 16),
    /// faults (row 16: healthy sessions beside a faulting one), priorities (rows 16: an
    /// interactive session beside batch ones), rss (row 14: memory around a quota-sized queue of
    /// chains; only when named). Row 3 always runs. Ratios need the rows they name.
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(npu_bench::run::SECTIONS))]
    only: Vec<String>,
    /// Emulator profiles to compare side by side in rows 11 (comma-separated; default
    /// rocr-newest,kernel-object): one daemon each, the packet ABI found as on an NPU.
    #[arg(long, value_delimiter = ',')]
    profile: Vec<String>,
    /// Every call carries an `npud-request-id` as npu-client's calls do (the daemon runs each
    /// id once and remembers its answer); without it, calls carry none.
    #[arg(long)]
    request_ids: bool,
    /// Internal: serve the floors' echo servers in DIR until stdin closes.
    #[arg(long, hide = true)]
    serve_floors: Option<PathBuf>,
    /// Internal: serve the shared-memory ping-pong of rows 15 on FILE.
    #[arg(long, hide = true)]
    serve_pingpong: Option<PathBuf>,
    /// Internal: the tonic echo's runtime threads (npud's I/O threads).
    #[arg(long, hide = true, default_value_t = 1)]
    floor_threads: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(dir) = &cli.serve_floors {
        return match npu_bench::floors::serve_floors(dir, cli.floor_threads) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("npuctl bench: serving the floors: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(file) = &cli.serve_pingpong {
        return match npu_bench::fastpath::serve_pingpong(file) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("npuctl bench: serving the ping-pong: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let addr = cli.addr.as_deref().map(|a| {
        PathBuf::from(
            a.strip_prefix("unix://")
                .or_else(|| a.strip_prefix("unix:"))
                .unwrap_or(a),
        )
    });
    let opts = Options {
        quick: cli.quick,
        addr,
        tcp: cli.tcp,
        pid: cli.pid,
        iterations: cli.iterations,
        only: cli.only,
        profiles: cli.profile,
        request_ids: cli.request_ids,
    };
    match run(&opts) {
        Ok(report) => {
            if cli.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("npuctl bench: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", report.to_table());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("npuctl bench: {e}");
            ExitCode::FAILURE
        }
    }
}
