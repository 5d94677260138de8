//! What the device's condition looks like from outside: `grpc.health.v1.Health`, and the
//! recovery counters in `DeviceInfo`.
//!
//! The executor reports a device recovery through [`DeviceHealth`]: [`DeviceHealth::recovering`]
//! when a fault makes it recreate the queue, [`DeviceHealth::recovered`] when the device serves
//! again. A recovery takes a few milliseconds on the emulator, far less than any watcher's
//! polling interval, so [`publish`] holds `NOT_SERVING` for at least
//! `health.min_not_serving_ms` from the start of each recovery. Handlers refuse work only while
//! the device really recovers ([`Condition::serving`]); the hold is for watchers only.
//!
//! At shutdown [`publish`] reports `NOT_SERVING` as draining begins, and every `Watch` stream
//! sends that status and ends, so that an open stream does not hold the drain open.

use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// The device's condition as the executor last reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Condition {
    /// False while the device recovers from a fault (work is refused `UNAVAILABLE`).
    pub serving: bool,
    /// Recoveries since the daemon started.
    pub recoveries: u64,
    /// When the last recovery started.
    pub last_recovery: Option<Recovery>,
}

/// When a recovery started, on both clocks: the monotonic one for the hold, the wall clock for
/// clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub at: Instant,
    pub wall: SystemTime,
}

impl Recovery {
    /// The start in milliseconds since the Unix epoch (0 before the epoch).
    pub fn unix_ms(&self) -> u64 {
        self.wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// The executor's side of the device's condition.
#[derive(Debug)]
pub struct DeviceHealth {
    tx: watch::Sender<Condition>,
}

impl DeviceHealth {
    /// A serving device with no recoveries, and a receiver of its condition.
    pub fn new() -> (DeviceHealth, watch::Receiver<Condition>) {
        let (tx, rx) = watch::channel(Condition {
            serving: true,
            recoveries: 0,
            last_recovery: None,
        });
        (DeviceHealth { tx }, rx)
    }

    /// A recovery starts: the device stops serving, and the recovery is counted.
    pub fn recovering(&self) {
        self.tx.send_modify(|c| {
            c.serving = false;
            c.recoveries += 1;
            c.last_recovery = Some(Recovery {
                at: Instant::now(),
                wall: SystemTime::now(),
            });
        });
    }

    /// The device serves (again); nothing changes when it already did.
    pub fn recovered(&self) {
        self.tx
            .send_if_modified(|c| !std::mem::replace(&mut c.serving, true));
    }
}

/// The services the health service answers for: the server as a whole and `npud.v1.Npud`.
const SERVICES: [&str; 2] = ["", "npud.v1.Npud"];

/// Follows the device's condition and publishes what watchers see, until `stop`: `NOT_SERVING`
/// from the start of each recovery for at least `min_not_serving` (longer if the recovery takes
/// longer), and from `stop` on.
pub async fn publish(
    mut device: watch::Receiver<Condition>,
    min_not_serving: Duration,
    out: watch::Sender<ServingStatus>,
    stop: CancellationToken,
) {
    let mut hold_until: Option<Instant> = None;
    let mut seen = device.borrow().recoveries;
    loop {
        let c = *device.borrow_and_update();
        if c.recoveries != seen {
            seen = c.recoveries;
            // The hold runs from the recovery's start, which the executor timed.
            let start = c.last_recovery.map_or_else(Instant::now, |r| r.at);
            hold_until = Some(start + min_not_serving);
        }
        let held = hold_until.is_some_and(|t| Instant::now() < t);
        let status = if c.serving && !held {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        out.send_if_modified(|s| std::mem::replace(s, status) != status);
        let wake = hold_until.filter(|_| held);
        tokio::select! {
            () = stop.cancelled() => break,
            r = device.changed() => if r.is_err() { break },
            () = sleep_until(wake) => {}
        }
    }
    out.send_replace(ServingStatus::NotServing);
    tracing::info!("health: NOT_SERVING while the daemon drains");
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// `grpc.health.v1.Health` over the status [`publish`] keeps.
#[derive(Debug, Clone)]
pub struct HealthService {
    status: watch::Receiver<ServingStatus>,
    stop: CancellationToken,
}

impl HealthService {
    /// The service, and the sender [`publish`] writes to.
    pub fn new(
        stop: CancellationToken,
    ) -> (HealthServer<HealthService>, watch::Sender<ServingStatus>) {
        let (tx, status) = watch::channel(ServingStatus::Serving);
        (HealthServer::new(HealthService { status, stop }), tx)
    }

    fn known(service: &str) -> Result<(), Status> {
        if SERVICES.contains(&service) {
            Ok(())
        } else {
            Err(Status::not_found(format!(
                "unknown service {service:?}: this server reports on \"\" and \"npud.v1.Npud\""
            )))
        }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Self::known(&request.get_ref().service)?;
        Ok(Response::new(response(*self.status.borrow())))
    }

    type WatchStream = WatchStream;

    /// The current status, then each change; at shutdown the last status (`NOT_SERVING`) and
    /// the end of the stream.
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Self::known(&request.get_ref().service)?;
        let state = Watching {
            rx: self.status.clone(),
            stop: self.stop.clone(),
            sent: None,
            done: false,
        };
        // The stream owns its state: a client that goes away drops it with the stream.
        let stream = futures_util::stream::unfold(state, |mut w| async move {
            w.next().await.map(|s| (Ok(response(s)), w))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// One `Watch` stream's state.
struct Watching {
    rx: watch::Receiver<ServingStatus>,
    stop: CancellationToken,
    sent: Option<ServingStatus>,
    done: bool,
}

impl Watching {
    /// The next status to send, or `None` when the stream ends.
    async fn next(&mut self) -> Option<ServingStatus> {
        if self.done {
            return None;
        }
        loop {
            let now = *self.rx.borrow_and_update();
            if self.stop.is_cancelled() {
                self.done = true;
                return (self.sent != Some(ServingStatus::NotServing))
                    .then_some(ServingStatus::NotServing);
            }
            if self.sent != Some(now) {
                self.sent = Some(now);
                return Some(now);
            }
            tokio::select! {
                () = self.stop.cancelled() => {}
                r = self.rx.changed() => if r.is_err() {
                    self.done = true;
                    return None;
                },
            }
        }
    }
}
