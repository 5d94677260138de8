//! Following npud's health: a `grpc.health.v1.Health/Watch` stream on npud's Unix socket.
//!
//! The shares are healthy exactly while the stream's last status is `SERVING`. A stream that
//! ends or fails, a refused connection and a missing socket all make them unhealthy; the
//! watcher then connects again after 100 ms, doubling the wait up to `max_backoff`, and starts
//! over from 100 ms once a stream has delivered a status. HTTP/2 keepalive pings find an npud
//! that stopped answering without closing its socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The first wait before connecting again.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Follows npud's health until `stop`, publishing whether it serves on `serving`.
pub async fn follow(
    socket: PathBuf,
    service: String,
    max_backoff: Duration,
    serving: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let mut backoff = FIRST_BACKOFF;
    let mut last_error = String::new();
    loop {
        let outcome = tokio::select! {
            () = stop.cancelled() => return,
            o = watch_once(&socket, &service, &serving) => o,
        };
        let saw_status = match outcome {
            Ok(saw) => {
                tracing::warn!(socket = %socket.display(), "npud's health stream ended: shares unhealthy");
                saw
            }
            Err((saw, e)) => {
                // Log each distinct failure once, not once per attempt.
                if e != last_error {
                    tracing::warn!(socket = %socket.display(), error = %e, "npud unreachable: shares unhealthy");
                    last_error = e;
                }
                saw
            }
        };
        set(&serving, false);
        if saw_status {
            backoff = FIRST_BACKOFF;
            last_error.clear();
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}

fn set(serving: &watch::Sender<bool>, now: bool) {
    serving.send_if_modified(|s| std::mem::replace(s, now) != now);
}

/// One connection and Watch stream: `Ok(saw a status)` when the stream ended, `Err((saw a
/// status, why))` when connecting or the stream failed.
async fn watch_once(
    socket: &Path,
    service: &str,
    serving: &watch::Sender<bool>,
) -> Result<bool, (bool, String)> {
    let channel = Endpoint::from_shared(format!("unix:{}", socket.display()))
        .map_err(|e| (false, e.to_string()))?
        .connect_timeout(Duration::from_secs(2))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|e| (false, format!("connect: {}", chain(&e))))?;
    let mut stream = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|s| (false, format!("Watch({service:?}): {}", s.message())))?
        .into_inner();
    let mut saw = false;
    loop {
        match stream.message().await {
            Ok(Some(r)) => {
                saw = true;
                let now = r.status() == ServingStatus::Serving;
                tracing::info!(status = ?r.status(), "npud health");
                set(serving, now);
            }
            Ok(None) => return Ok(saw),
            Err(s) => return Err((saw, format!("Watch stream: {}", s.message()))),
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
