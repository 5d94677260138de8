//! The plugin's lifecycle.
//!
//! 1. Prepare the token directory and start following npud's health.
//! 2. Bind the plugin's socket beside the kubelet's and serve `DevicePlugin` on it.
//! 3. Register with the kubelet: a kubelet that cannot be reached is tried again (100 ms,
//!    doubling to `--max-backoff-ms`); one that refuses ends the plugin with the kubelet's
//!    reason, as the API asks.
//! 4. Every `--watch-interval-ms`: when the plugin's socket is gone or replaced, bind it anew
//!    (ending the old socket's streams) and register again; when the kubelet's socket has
//!    another identity than at registration (the kubelet restarted), register again.
//! 5. On SIGTERM or SIGINT: stop serving and remove the plugin's socket. Token files stay, so
//!    running containers keep their identities while the plugin is replaced.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::kubelet::{self, FileId, RegisterError, file_id};
use crate::npud;
use crate::plugin::Plugin;
use crate::token::{TokenDir, TokenError};
use crate::v1beta1::device_plugin_server::DevicePluginServer;

/// Why the plugin stopped other than by a signal.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("plugin socket {path}: {source}")]
    Bind {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Refused(RegisterError),
}

/// One bound plugin socket and its server.
struct Serving {
    id: Option<FileId>,
    done: CancellationToken,
    server: JoinHandle<()>,
}

impl Serving {
    async fn stop(self) {
        self.done.cancel();
        if tokio::time::timeout(Duration::from_secs(5), self.server)
            .await
            .is_err()
        {
            tracing::warn!("the plugin's old server did not stop within 5 s");
        }
    }
}

/// Runs the plugin until `stop` is cancelled.
///
/// # Errors
///
/// [`RunError`] when the token directory or the plugin's socket cannot be prepared, or the
/// kubelet refuses the registration.
pub async fn run(config: Config, stop: CancellationToken) -> Result<(), RunError> {
    let config = Arc::new(config);
    let tokens = Arc::new(TokenDir::prepare(&config.token_dir, config.token_dir_uid)?);
    let (serving_tx, serving) = watch::channel(false);
    let follower = tokio::spawn(npud::follow(
        config.npud_socket.clone(),
        config.health_service.clone(),
        config.max_backoff,
        serving_tx,
        stop.clone(),
    ));
    tracing::info!(
        resource = %config.resource_name,
        shares = config.shares,
        socket = %config.plugin_socket.display(),
        npud = %config.npud_socket.display(),
        "npud-device-plugin starting"
    );
    let result = lifecycle(&config, &tokens, &serving, &stop).await;
    stop.cancel();
    let _ = follower.await;
    let _ = std::fs::remove_file(&config.plugin_socket);
    result
}

async fn lifecycle(
    config: &Arc<Config>,
    tokens: &Arc<TokenDir>,
    serving: &watch::Receiver<bool>,
    stop: &CancellationToken,
) -> Result<(), RunError> {
    let mut current = bind(config, tokens, serving, stop)?;
    let mut kubelet_id = match register(config, stop).await {
        Some(r) => r.map_err(RunError::Refused)?,
        None => {
            current.stop().await;
            return Ok(());
        }
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(config.watch_interval) => {}
        }
        let ours = file_id(&config.plugin_socket);
        let rebind = ours.is_none() || ours != current.id;
        let theirs = file_id(&config.kubelet_socket);
        let kubelet_restarted = theirs.is_some() && theirs != kubelet_id;
        if !rebind && !kubelet_restarted {
            continue;
        }
        if rebind {
            tracing::info!("the plugin's socket is gone: serving on a new one");
            current.stop().await;
            current = bind(config, tokens, serving, stop)?;
        }
        if kubelet_restarted {
            tracing::info!("the kubelet's socket was recreated: registering again");
        }
        kubelet_id = match register(config, stop).await {
            Some(r) => r.map_err(RunError::Refused)?,
            None => break,
        };
    }
    current.stop().await;
    Ok(())
}

/// Binds the plugin's socket (replacing a stale file) and serves on it.
fn bind(
    config: &Arc<Config>,
    tokens: &Arc<TokenDir>,
    serving: &watch::Receiver<bool>,
    stop: &CancellationToken,
) -> Result<Serving, RunError> {
    let path = &config.plugin_socket;
    let err = |source| RunError::Bind {
        path: path.display().to_string(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    let id = file_id(path);
    let done = stop.child_token();
    let plugin = Plugin::new(
        Arc::clone(config),
        Arc::clone(tokens),
        serving.clone(),
        done.clone(),
    );
    let shutdown = done.clone();
    let server = tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                shutdown.cancelled_owned(),
            )
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "the plugin's server failed");
        }
    });
    tracing::info!(socket = %path.display(), "serving DevicePlugin");
    Ok(Serving { id, done, server })
}

/// Registers until the kubelet accepts (`Some(Ok(its socket's identity))`) or refuses
/// (`Some(Err)`), or `stop` (`None`).
async fn register(
    config: &Config,
    stop: &CancellationToken,
) -> Option<Result<Option<FileId>, RegisterError>> {
    let mut backoff = npud::FIRST_BACKOFF;
    let mut last = String::new();
    loop {
        // The identity before the call: a kubelet that restarts during it is seen next turn.
        let id = file_id(&config.kubelet_socket);
        if id.is_some() {
            match kubelet::register(config).await {
                Ok(()) => {
                    tracing::info!(
                        resource = %config.resource_name,
                        endpoint = %config.endpoint,
                        "registered with the kubelet"
                    );
                    return Some(Ok(id));
                }
                Err(e @ RegisterError::Refused { .. }) => return Some(Err(e)),
                Err(e) => {
                    let text = e.to_string();
                    if text != last {
                        tracing::warn!(error = %text, "registration: trying again");
                        last = text;
                    }
                }
            }
        } else if last.is_empty() {
            last = format!("no kubelet socket at {}", config.kubelet_socket.display());
            tracing::warn!("{last}: waiting for it");
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(config.max_backoff);
    }
}
