//! `npuctl bench`: runs `npuctl-bench` (crate `npu-bench`), the instrument that measures npud
//! against its floors, passing the arguments through. `--json` and `--addr` given to npuctl are
//! passed on too; with `--fleet`, the host the fleet's next session would go to is measured
//! (the floors are one machine's, so a bench runs on one host: a Unix socket on this machine).

use std::path::PathBuf;
use std::process::Command;

use npu_client::binaries::{NPUCTL_BENCH, find_binary};

use crate::CmdResult;

/// `npuctl bench [--quick] [...]`: see `npuctl bench --help`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The npuctl-bench binary (default: beside npuctl, $NPUCTL_BENCH_BIN, PATH, or built).
    #[arg(long)]
    bench_bin: Option<PathBuf>,
    /// Arguments for npuctl-bench (`--quick`, `--only ROWS`, ...; `npuctl bench -- --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub async fn run(a: &Args, addr: Option<&str>, fleet: Option<&str>, json: bool) -> CmdResult {
    let chosen = match fleet {
        Some(spec) => {
            let hosts = crate::fleet(spec).await?.hosts();
            let next = hosts
                .iter()
                .find(|h| h.next)
                .ok_or_else(|| format!("--fleet: no host of {spec} serves"))?;
            eprintln!(
                "npuctl bench: measuring {}, the fleet's next host",
                next.address
            );
            Some(next.address.to_string())
        }
        None => None,
    };
    let addr = chosen.as_deref().or(addr);
    if let Some(a) = addr
        && !npu_client::Address::parse(a).is_ok_and(|a| a.is_local())
    {
        return Err(format!(
            "npuctl bench measures a daemon on this machine's Unix socket (its floors are this \
             machine's): --addr {a} is not one"
        ));
    }
    let bin = find_binary(&NPUCTL_BENCH, a.bench_bin.as_deref()).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&bin);
    cmd.args(&a.args);
    if json && !a.args.iter().any(|x| x == "--json") {
        cmd.arg("--json");
    }
    if let Some(addr) = addr
        && !a.args.iter().any(|x| x == "--addr")
    {
        cmd.args(["--addr", addr]);
    }
    let status = cmd
        .status()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} exited with {status}", bin.display()))
    }
}
