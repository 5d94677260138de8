//! One host of a fleet: what the fleet knows of it (health, load, when to probe it again), the
//! probe that learns it, the link its sessions keep to it, and the choice of the host for the
//! next session.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::connect::{Address, ConnectOptions, error_chain, open_channel};
use crate::session::{HostWatch, identity_header, is_transport, plain_client};
use crate::{ClientError, code_name};

/// The service whose health decides whether a host takes sessions.
const NPUD_SERVICE: &str = "npud.v1.Npud";

/// What the fleet last learned of a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostHealth {
    /// Not probed yet.
    Unknown,
    /// Health `SERVING`: it takes sessions.
    Serving,
    /// It answers but takes no new sessions (health `NOT_SERVING` while the device recovers or
    /// the daemon drains, or it refused the fleet's calls); its sessions go on.
    NotServing(String),
    /// It cannot be reached (connection refused or reset, no answer in time); sessions that
    /// were on it fail with [`ClientError::SessionLost`].
    Down(String),
}

impl std::fmt::Display for HostHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostHealth::Unknown => f.write_str("unknown (not probed yet)"),
            HostHealth::Serving => f.write_str("serving"),
            HostHealth::NotServing(why) => write!(f, "not serving ({why})"),
            HostHealth::Down(why) => write!(f, "down ({why})"),
        }
    }
}

/// How long to wait before probing a failed host again: `min` doubled for each failure in a
/// row after the first, at most `max`.
pub(crate) fn backoff(failures: u32, min: Duration, max: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(30);
    min.saturating_mul(1 << doublings).min(max)
}

/// What the chooser compares: a serving host's pending dispatches, then its sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Load {
    pub pending: u64,
    pub sessions: u64,
}

/// The host for the next session: the least pending work, then the fewest sessions; among
/// hosts equal in both, the first at or after `cursor` (so equals take turns). `None` marks a
/// host that takes no sessions.
pub(crate) fn choose(loads: &[Option<Load>], cursor: usize) -> Option<usize> {
    let best = loads.iter().flatten().min()?;
    let n = loads.len();
    (0..n)
        .map(|k| (cursor + k) % n)
        .find(|&i| loads[i].as_ref() == Some(best))
}

#[derive(Debug)]
struct State {
    health: HostHealth,
    /// From the last statistics.
    pending: u64,
    sessions: u64,
    /// Sessions this fleet opened here, and how many of them the last statistics could count.
    opened: u64,
    opened_at_sample: u64,
    /// Failed probes in a row, and when to probe again.
    failures: u32,
    retry_at: Option<Instant>,
    checked: Option<Instant>,
    /// Times the host went down; a session opened at a lower count is gone.
    down_epoch: u64,
    down_reason: String,
}

/// One daemon of a fleet.
#[derive(Debug)]
pub(crate) struct Host {
    pub addr: Address,
    retry: (Duration, Duration),
    state: Mutex<State>,
    /// The probes' connection (one probe at a time).
    channel: tokio::sync::Mutex<Option<Channel>>,
    /// `down_epoch`, for calls in flight that wait for it to move.
    down: tokio::sync::watch::Sender<u64>,
}

/// A snapshot of a host for [`crate::Fleet::hosts`].
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub health: HostHealth,
    pub pending: u64,
    pub sessions: u64,
    pub opened: u64,
    pub checked: Option<Instant>,
    pub retry_at: Option<Instant>,
}

impl Host {
    pub fn new(addr: Address, retry_min: Duration, retry_max: Duration) -> Host {
        Host {
            addr,
            retry: (retry_min, retry_max),
            state: Mutex::new(State {
                health: HostHealth::Unknown,
                pending: 0,
                sessions: 0,
                opened: 0,
                opened_at_sample: 0,
                failures: 0,
                retry_at: None,
                checked: None,
                down_epoch: 0,
                down_reason: String::new(),
            }),
            channel: tokio::sync::Mutex::new(None),
            down: tokio::sync::watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its load when it takes sessions: the sessions the last statistics counted plus those
    /// this fleet opened since (so a burst spreads before the statistics catch up).
    pub fn load(&self) -> Option<Load> {
        let s = self.lock();
        (s.health == HostHealth::Serving).then(|| Load {
            pending: s.pending,
            sessions: s.sessions + s.opened.saturating_sub(s.opened_at_sample),
        })
    }

    pub fn health(&self) -> HostHealth {
        self.lock().health.clone()
    }

    pub fn seen(&self) -> Seen {
        let s = self.lock();
        Seen {
            health: s.health.clone(),
            pending: s.pending,
            sessions: s.sessions + s.opened.saturating_sub(s.opened_at_sample),
            opened: s.opened,
            checked: s.checked,
            retry_at: s.retry_at,
        }
    }

    /// Whether a routine refresh probes it now: a host that serves (or was never probed) each
    /// time, a failed one when its backoff has passed.
    pub fn due(&self, now: Instant) -> bool {
        let s = self.lock();
        match s.health {
            HostHealth::Unknown | HostHealth::Serving => true,
            _ => s.retry_at.is_none_or(|t| t <= now),
        }
    }

    /// Counts a session being opened here; returns the epoch the session belongs to.
    pub fn reserve(&self) -> u64 {
        let mut s = self.lock();
        s.opened += 1;
        s.down_epoch
    }

    /// The session [`Host::reserve`] counted was not opened.
    pub fn unreserve(&self) {
        let mut s = self.lock();
        s.opened = s.opened.saturating_sub(1);
    }

    /// The host cannot be reached: no new sessions, and sessions opened before now are gone.
    pub fn mark_down(&self, why: String) {
        let mut s = self.lock();
        let newly = !matches!(s.health, HostHealth::Down(_));
        if newly {
            s.down_epoch += 1;
            tracing::warn!(host = %self.addr, reason = %why, "fleet host down");
        }
        s.down_reason.clone_from(&why);
        s.health = HostHealth::Down(why);
        self.failed(&mut s);
        let epoch = s.down_epoch;
        drop(s);
        if newly {
            self.down.send_replace(epoch);
        }
    }

    /// The host answers but takes no new sessions; its sessions go on.
    pub fn mark_not_serving(&self, why: String) {
        let mut s = self.lock();
        s.health = HostHealth::NotServing(why);
        self.failed(&mut s);
    }

    fn failed(&self, s: &mut State) {
        s.failures = s.failures.saturating_add(1);
        let now = Instant::now();
        s.checked = Some(now);
        s.retry_at = Some(now + backoff(s.failures, self.retry.0, self.retry.1));
    }

    fn sampled(&self, stats: &pb::Statistics, opened_before: u64) {
        let mut s = self.lock();
        if s.health != HostHealth::Serving {
            tracing::info!(host = %self.addr, "fleet host serving");
        }
        s.health = HostHealth::Serving;
        s.pending = stats.pending_dispatches;
        // A daemon older than the open_sessions field reports 0 there.
        s.sessions = u64::from(stats.open_sessions).max(stats.sessions.len() as u64);
        s.opened_at_sample = opened_before;
        s.failures = 0;
        s.retry_at = None;
        s.checked = Some(Instant::now());
    }

    /// Why a session opened at `epoch` is gone, if its host went down since.
    pub fn lost_since(&self, epoch: u64) -> Option<String> {
        let s = self.lock();
        (s.down_epoch > epoch).then(|| {
            format!(
                "its host {} went down ({}); the session's tensors and programs are gone with it",
                self.addr, s.down_reason
            )
        })
    }

    /// Asks the host for its health and then its statistics, each within the connect timeout,
    /// and records what it answered.
    pub async fn probe(&self, opts: &ConnectOptions) {
        let mut slot = self.channel.lock().await;
        let limit = opts.connect_timeout;
        let channel = match slot.as_ref() {
            Some(c) => c.clone(),
            None => match open_channel(&self.addr, opts).await {
                Ok(c) => {
                    *slot = Some(c.clone());
                    c
                }
                Err(e) => return self.mark_down(reason(&e)),
            },
        };
        let opened_before = self.lock().opened;
        let mut health = HealthClient::new(channel.clone());
        let req = HealthCheckRequest {
            service: NPUD_SERVICE.into(),
        };
        let status = match tokio::time::timeout(limit, health.check(req)).await {
            Ok(Ok(r)) => r.into_inner().status,
            Ok(Err(st)) if is_transport(&st) => {
                *slot = None;
                return self.mark_down(format!("health check: {}", error_chain(&st)));
            }
            Ok(Err(st)) => {
                return self.mark_not_serving(format!(
                    "health check answered {}: {}",
                    code_name(st.code()),
                    st.message()
                ));
            }
            Err(_) => {
                *slot = None;
                return self.mark_down(format!("no health answer within {limit:?}"));
            }
        };
        if status != ServingStatus::Serving as i32 {
            let name = ServingStatus::try_from(status).map_or("UNKNOWN", |s| s.as_str_name());
            return self.mark_not_serving(format!("health {name}"));
        }
        // A token that cannot be read fails the sessions themselves, with the reason.
        let mut rpc = plain_client(
            channel,
            opts,
            identity_header(&self.addr, opts).ok().flatten(),
        );
        // The probe reads the device-wide counters: the smallest page of programs will do.
        let probe = pb::GetStatisticsRequest {
            programs_after: 0,
            max_programs: 1,
        };
        match tokio::time::timeout(limit, rpc.get_statistics(probe)).await {
            Ok(Ok(r)) => self.sampled(&r.into_inner(), opened_before),
            Ok(Err(st)) if is_transport(&st) => {
                *slot = None;
                self.mark_down(format!("GetStatistics: {}", error_chain(&st)));
            }
            Ok(Err(st)) => self.mark_not_serving(format!(
                "GetStatistics answered {}: {}",
                code_name(st.code()),
                st.message()
            )),
            Err(_) => {
                *slot = None;
                self.mark_down(format!("no statistics within {limit:?}"));
            }
        }
    }
}

/// An error's explanation without the address the table already shows.
pub(crate) fn reason(e: &ClientError) -> String {
    match e {
        ClientError::Connect { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// What a session opened through a fleet keeps of its host.
#[derive(Debug)]
pub(crate) struct HostLink {
    pub host: Arc<Host>,
    /// The host's down count when the session opened.
    pub epoch: u64,
}

impl HostWatch for HostLink {
    fn lost(&self) -> Option<String> {
        self.host.lost_since(self.epoch)
    }

    fn unreachable(&self, why: &str) {
        self.host.mark_down(why.to_owned());
    }

    fn gone(&self) -> Pin<Box<dyn Future<Output = String> + Send + '_>> {
        Box::pin(async move {
            // Subscribed before looking, so a change in between is not missed.
            let mut rx = self.host.down.subscribe();
            loop {
                if let Some(why) = self.lost() {
                    return why;
                }
                if rx.changed().await.is_err() {
                    // The host is dropped with its fleet: nothing will say it went down.
                    return std::future::pending().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving(pending: u64, sessions: u64) -> Option<Load> {
        Some(Load { pending, sessions })
    }

    #[test]
    fn the_least_pending_work_wins_then_the_fewest_sessions() {
        let loads = [serving(3, 0), serving(1, 9), serving(1, 4), serving(2, 0)];
        assert_eq!(choose(&loads, 0), Some(2));
        assert_eq!(choose(&loads, 3), Some(2));
    }

    #[test]
    fn equal_hosts_take_turns_from_the_cursor() {
        let loads = [serving(0, 1), serving(0, 2), serving(0, 1), serving(0, 1)];
        assert_eq!(choose(&loads, 0), Some(0));
        assert_eq!(choose(&loads, 1), Some(2));
        assert_eq!(choose(&loads, 3), Some(3));
        assert_eq!(choose(&loads, 4), Some(0));
    }

    #[test]
    fn hosts_that_take_no_sessions_are_skipped() {
        let loads = [None, serving(5, 5), None];
        assert_eq!(choose(&loads, 0), Some(1));
        assert_eq!(choose(&[None, None], 0), None);
        assert_eq!(choose(&[], 0), None);
    }

    fn host() -> Arc<Host> {
        let h = Arc::new(Host::new(
            Address::Unix("/nowhere".into()),
            Duration::from_millis(100),
            Duration::from_secs(1),
        ));
        h.sampled(&pb::Statistics::default(), 0);
        h
    }

    #[test]
    fn a_burst_spreads_before_the_statistics_catch_up() {
        let hosts: Vec<Arc<Host>> = (0..3).map(|_| host()).collect();
        let mut cursor = 0;
        let mut count = [0; 3];
        for _ in 0..30 {
            let loads: Vec<_> = hosts.iter().map(|h| h.load()).collect();
            let i = choose(&loads, cursor).unwrap();
            cursor = i + 1;
            hosts[i].reserve();
            count[i] += 1;
        }
        assert_eq!(count, [10, 10, 10]);
        // Statistics that count those sessions replace the fleet's own count.
        let stats = pb::Statistics {
            open_sessions: 12,
            ..Default::default()
        };
        hosts[0].sampled(&stats, 10);
        assert_eq!(hosts[0].load().unwrap().sessions, 12);
    }

    #[test]
    fn backoff_doubles_up_to_its_limit() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(1));
        let waits: Vec<u128> = (1..=6).map(|f| backoff(f, min, max).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(u32::MAX, min, max), max);
    }

    #[test]
    fn a_down_host_takes_no_sessions_and_is_probed_after_its_backoff() {
        let h = host();
        let before = Instant::now();
        h.mark_down("connection refused".into());
        assert_eq!(h.load(), None);
        assert!(!h.due(before));
        assert!(h.due(before + Duration::from_millis(150)));
        h.mark_down("connection refused".into());
        assert!(!h.due(before + Duration::from_millis(150)));
        assert!(h.due(before + Duration::from_millis(250)));
        h.sampled(&pb::Statistics::default(), 0);
        assert!(h.load().is_some());
        assert!(h.due(before));
    }

    #[test]
    fn sessions_opened_before_a_host_went_down_are_lost_and_later_ones_are_not() {
        let h = host();
        let old = HostLink {
            host: h.clone(),
            epoch: h.reserve(),
        };
        assert_eq!(old.lost(), None);
        h.mark_not_serving("health NOT_SERVING".into());
        assert_eq!(
            old.lost(),
            None,
            "a host that only stops serving keeps its sessions"
        );
        old.unreachable("connection refused");
        let why = old.lost().unwrap();
        assert!(
            why.contains("unix:/nowhere") && why.contains("connection refused"),
            "{why}"
        );
        h.sampled(&pb::Statistics::default(), 1);
        let new = HostLink {
            host: h.clone(),
            epoch: h.reserve(),
        };
        assert_eq!(new.lost(), None);
        assert!(
            old.lost().is_some(),
            "a lost session stays lost when its host returns"
        );
    }
}
