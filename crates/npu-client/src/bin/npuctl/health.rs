//! `npuctl health [--service NAME] [--timeout-ms MS]`: exit 0 when the daemon's
//! `grpc.health.v1` status is SERVING, 1 with the reason otherwise. For exec probes: the
//! kubelet's gRPC probe cannot reach a Unix socket and speaks no TLS.

use std::time::Duration;

use npu_client::ConnectOptions;
use npu_client::health::{self, ServingStatus};
use serde_json::json;

use crate::output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The service to ask about: "" (the server as a whole) or npud.v1.Npud.
    #[arg(long, default_value = "")]
    service: String,
    /// Limit on connecting and on the call, each, in ms.
    #[arg(long, default_value_t = 3000)]
    timeout_ms: u64,
}

pub async fn run(a: &Args, addr: Option<&str>, json: bool) -> crate::CmdResult {
    let limit = Duration::from_millis(a.timeout_ms);
    // The global connection options (--ca, --cert, --key, --tls-server-name, --token-file),
    // as every subcommand takes them.
    let opts = ConnectOptions {
        connect_timeout: limit,
        call_timeout: limit,
        ..crate::connect_options()
    };
    let status = health::check(addr, &opts, &a.service)
        .await
        .map_err(|e| e.to_string())?;
    let name = status.as_str_name();
    if json {
        output::print_json(&json!({ "service": a.service, "status": name }));
    } else if status == ServingStatus::Serving {
        println!("{name}");
    }
    if status == ServingStatus::Serving {
        Ok(())
    } else {
        let why = match status {
            ServingStatus::NotServing => {
                "the device is recovering from a fault, or the daemon is shutting down"
            }
            _ => "the daemon reports no serving status",
        };
        Err(format!("npud health is {name} ({why})"))
    }
}
