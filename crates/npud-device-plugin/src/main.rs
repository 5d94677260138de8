//! `npud-device-plugin`: see the crate's README and [`npud_device_plugin`].

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use npud_device_plugin::config::Args;
use npud_device_plugin::run;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match args.check() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("npud-device-plugin: {e}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        match serde_json::to_string_pretty(&config) {
            Ok(s) => {
                println!("{s}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("npud-device-plugin: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&args.log_level))
        .unwrap_or_else(|e| {
            eprintln!(
                "npud-device-plugin: --log-level {:?}: {e}; using info",
                args.log_level
            );
            EnvFilter::new("info")
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("npud-device-plugin: no async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let stop = CancellationToken::new();
        tokio::spawn(signals(stop.clone()));
        match run::run(config, stop).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = %e, "stopping");
                eprintln!("npud-device-plugin: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Cancels `stop` at SIGTERM or SIGINT.
async fn signals(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("no signal handlers: SIGTERM will not stop the plugin cleanly");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    stop.cancel();
}
