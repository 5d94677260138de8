//! systemd integration: socket activation, readiness and the watchdog.
//!
//! - **Socket activation.** When systemd passes listening sockets (`LISTEN_FDS`, checked
//!   against `LISTEN_PID`), the daemon serves on them instead of binding its own, and leaves
//!   the socket files alone at exit (systemd owns them, so clients can connect while the
//!   daemon restarts). Sockets are told apart by `FileDescriptorName=` (`LISTEN_FDNAMES`):
//!   `npud` for gRPC on a Unix socket, `fd` for the fd socket, `tcp` for gRPC on TCP. Without
//!   names, the first two Unix sockets are gRPC then fd, and a TCP socket is gRPC on TCP.
//! - **Readiness.** `READY=1` (with a `STATUS=` line) once the device is open and every
//!   listener serves; `STOPPING=1` when a signal starts the drain. Without `NOTIFY_SOCKET`
//!   these do nothing.
//! - **Watchdog.** With `WatchdogSec=` set, `WATCHDOG=1` is sent every half period, but only
//!   while the executor thread is alive and either waiting for work or in a turn that started
//!   less than half a period ago (its heartbeat, read without waiting for the thread; turns are
//!   bounded, one doorbell batch or one slice of a copy): a wedged device thread stops the pings
//!   and systemd restarts the daemon. `WatchdogSec=` must therefore be longer than twice the
//!   longest doorbell batch (the runtime's completion timeout).

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::time::Duration;

use listenfd::ListenFd;
use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use crate::executor::ExecutorHandle;

/// Listeners systemd handed over.
#[derive(Debug, Default)]
pub struct Activated {
    pub grpc: Option<UnixListener>,
    pub fd: Option<UnixListener>,
    pub tcp: Option<TcpListener>,
}

/// Why the handed-over sockets cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("socket activation: {0}")]
pub struct ActivationError(String);

impl Activated {
    /// Takes the listening sockets systemd passed, if any.
    ///
    /// # Errors
    /// A socket of the wrong kind, a name the daemon does not know, or two sockets for one role.
    pub fn from_env() -> Result<Self, ActivationError> {
        let mut fds = ListenFd::from_env();
        let names: Vec<String> = std::env::var("LISTEN_FDNAMES")
            .ok()
            .filter(|n| !n.is_empty())
            .map(|n| n.split(':').map(str::to_owned).collect())
            .unwrap_or_default();
        let mut out = Self::default();
        for i in 0..fds.len() {
            let name = names.get(i).map_or("", String::as_str);
            let err = |what: &str| ActivationError(format!("socket {i} ({name:?}): {what}"));
            match name {
                "npud" | "grpc" => {
                    let l = fds.take_unix_listener(i).map_err(|e| err(&e.to_string()))?;
                    put(&mut out.grpc, l, || err("a second gRPC Unix socket"))?;
                }
                "fd" => {
                    let l = fds.take_unix_listener(i).map_err(|e| err(&e.to_string()))?;
                    put(&mut out.fd, l, || err("a second fd socket"))?;
                }
                "tcp" => {
                    let l = fds.take_tcp_listener(i).map_err(|e| err(&e.to_string()))?;
                    put(&mut out.tcp, l, || err("a second TCP socket"))?;
                }
                "" | "unknown" => {
                    if let Ok(Some(l)) = fds.take_unix_listener(i) {
                        if out.grpc.is_none() {
                            out.grpc = Some(l);
                        } else {
                            put(&mut out.fd, Some(l), || err("more than two Unix sockets"))?;
                        }
                    } else {
                        let l = fds.take_tcp_listener(i).map_err(|e| err(&e.to_string()))?;
                        put(&mut out.tcp, l, || err("a second TCP socket"))?;
                    }
                }
                other => {
                    return Err(err(&format!(
                        "unknown FileDescriptorName {other:?} (expected npud, fd or tcp)"
                    )));
                }
            }
        }
        Ok(out)
    }

    /// Whether systemd passed any socket.
    pub fn any(&self) -> bool {
        self.grpc.is_some() || self.fd.is_some() || self.tcp.is_some()
    }
}

fn put<T>(
    slot: &mut Option<T>,
    v: Option<T>,
    dup: impl FnOnce() -> ActivationError,
) -> Result<(), ActivationError> {
    match (slot.is_some(), v) {
        (true, Some(_)) => Err(dup()),
        (_, Some(v)) => {
            *slot = Some(v);
            Ok(())
        }
        (_, None) => Ok(()),
    }
}

/// Tells the service manager the daemon serves.
pub fn ready(status: &str) {
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(status)]) {
        tracing::warn!(error = %e, "telling systemd READY=1 failed");
    }
}

/// Tells the service manager the daemon is draining.
pub fn stopping() {
    if let Err(e) = sd_notify::notify(&[NotifyState::Stopping]) {
        tracing::warn!(error = %e, "telling systemd STOPPING=1 failed");
    }
}

/// Pings the watchdog while the executor answers, until `stop`.
pub async fn watchdog(exec: ExecutorHandle, stop: CancellationToken) {
    let Some(period) = sd_notify::watchdog_enabled() else {
        return;
    };
    let half = period / 2;
    tracing::info!(?period, "systemd watchdog enabled");
    let mut tick = tokio::time::interval(half.max(Duration::from_millis(10)));
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if exec.responsive(half) {
            if let Err(e) = sd_notify::notify(&[NotifyState::Watchdog]) {
                tracing::warn!(error = %e, "pinging the systemd watchdog failed");
            }
        } else {
            tracing::warn!("the executor did not answer within half the watchdog period");
        }
    }
}
