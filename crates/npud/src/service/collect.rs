//! What a scrape reads from the daemon's own state: the same numbers `GetStatistics` and
//! `GetDeviceInfo` report, so that nothing is counted twice. Reading never waits for the
//! executor (it publishes what the device holds after each turn).

use std::sync::Weak;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::State;

/// The collector registered with the [`Exporter`](crate::metrics::Exporter); it holds the state weakly,
/// so that a scrape in flight at shutdown keeps nothing alive.
#[derive(Debug)]
pub struct StateCollector {
    state: Weak<State>,
    started_unix_s: f64,
    /// `metrics.max_session_labels`.
    max_session_labels: usize,
}

impl StateCollector {
    pub fn new(state: Weak<State>, max_session_labels: u32) -> Self {
        let started_unix_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Self {
            state,
            started_unix_s,
            max_session_labels: max_session_labels as usize,
        }
    }
}

/// The `identity_kind` label of a session's owner.
fn identity_kind(who: &crate::auth::Identity) -> &'static str {
    match who.kind() {
        crate::auth::Kind::Uid(_) => "uid",
        crate::auth::Kind::Cert => "cert",
        crate::auth::Kind::Token => "token",
        crate::auth::Kind::Anonymous => "anonymous",
    }
}

/// `npud_session_pending_work`'s series: (labels, value). At most 4 series by identity kind
/// (`max == 0`), or `max` sessions (the oldest, by id) with their client names and one
/// `other` series for the rest.
fn pending_series(
    sessions: &[crate::sessions::SessionSnapshot],
    max: usize,
) -> Vec<(Vec<(&'static str, String)>, u64)> {
    if max == 0 {
        let mut by_kind: Vec<(&'static str, u64)> = ["uid", "cert", "token", "anonymous"]
            .into_iter()
            .map(|k| (k, 0))
            .collect();
        for x in sessions {
            let k = identity_kind(&x.owner);
            if let Some(e) = by_kind.iter_mut().find(|(n, _)| *n == k) {
                e.1 += u64::from(x.pending);
            }
        }
        return by_kind
            .into_iter()
            .map(|(k, n)| (vec![("identity_kind", k.to_owned())], n))
            .collect();
    }
    let mut sorted: Vec<&crate::sessions::SessionSnapshot> = sessions.iter().collect();
    sorted.sort_by_key(|x| x.id);
    let mut out: Vec<(Vec<(&'static str, String)>, u64)> = sorted
        .iter()
        .take(max)
        .map(|x| {
            (
                vec![
                    ("session", x.id.to_string()),
                    ("client", x.client_name.clone()),
                ],
                u64::from(x.pending),
            )
        })
        .collect();
    if sorted.len() > max {
        let rest = sorted[max..].iter().map(|x| u64::from(x.pending)).sum();
        out.push((
            vec![
                ("session", crate::metrics::OTHER.to_owned()),
                ("client", crate::metrics::OTHER.to_owned()),
            ],
            rest,
        ));
    }
    out
}

fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(m)
}

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(v).encode(m)
}

impl Collector for StateCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = self.state.upgrade() else {
            return Ok(());
        };
        let snap = s.exec.snapshot_now();
        let sessions = s.sessions.snapshot();
        let (opened, ended) = s.sessions.totals();
        let device = *s.device.borrow();
        let info = &s.facts.info;

        let build = [
            ("version", env!("CARGO_PKG_VERSION").to_owned()),
            ("backend", s.facts.backend.as_str().to_owned()),
            ("packet_abi", info.packet_abi.as_str().to_owned()),
            ("generation", info.generation.as_str().to_owned()),
            (
                "emulator_profile",
                s.facts.emulator_profile.clone().unwrap_or_default(),
            ),
        ];
        {
            let mut m = e.encode_descriptor(
                "build_info",
                "Always 1; the labels say what is running: the daemon's version, backend, the \
                 packet ABI spoken, the NPU generation and the emulator profile (empty on ROCR)",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(1i64).encode(m.encode_family(&build)?)?;
        }
        {
            let m = e.encode_descriptor(
                "start_time",
                "When the daemon started, in seconds since the Unix epoch",
                Some(&Unit::Seconds),
                MetricType::Gauge,
            )?;
            ConstGauge::new(self.started_unix_s).encode(m)?;
        }
        gauge(
            &mut e,
            "serving",
            "1 while the device serves work, 0 while it recovers from a fault",
            None,
            u64::from(device.serving),
        )?;

        gauge(
            &mut e,
            "sessions",
            "Open sessions",
            None,
            sessions.len() as u64,
        )?;
        counter(
            &mut e,
            "sessions_opened",
            "Sessions opened since start",
            opened,
        )?;
        counter(
            &mut e,
            "sessions_ended",
            "Sessions ended (closed, or expired after their grace period) since start",
            ended,
        )?;
        {
            let mut m = e.encode_descriptor(
                "session_pending_work",
                "Dispatches and chains sessions have admitted that are not answered yet (queued \
                 or on the device), by the kind of identity that opened them (or, with \
                 metrics.max_session_labels, per session)",
                None,
                MetricType::Gauge,
            )?;
            for (labels, n) in pending_series(&sessions, self.max_session_labels) {
                ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
                    .encode(m.encode_family(&labels)?)?;
            }
        }
        let (tensors, bytes) = snap
            .usage
            .values()
            .fold((0u64, 0u64), |(t, b), (n, sz)| (t + u64::from(*n), b + sz));
        gauge(
            &mut e,
            "tensors",
            "Tensors held by all sessions",
            None,
            tensors,
        )?;
        gauge(
            &mut e,
            "tensor",
            "Bytes of the tensors held by all sessions",
            Some(&Unit::Bytes),
            bytes,
        )?;

        gauge(
            &mut e,
            "heap_used",
            "Device heap (PDIs and instruction streams) in use",
            Some(&Unit::Bytes),
            snap.heap_used,
        )?;
        gauge(
            &mut e,
            "heap_size",
            "Device heap size",
            Some(&Unit::Bytes),
            info.heap_size as u64,
        )?;
        let p = s.programs.counts();
        gauge(&mut e, "programs", "Programs stored", None, p.stored)?;
        gauge(
            &mut e,
            "programs_loaded",
            "Programs loaded into the device heap",
            None,
            u64::from(snap.programs_loaded),
        )?;
        gauge(
            &mut e,
            "programs_quarantined",
            "Quarantine records (programs refused until an operator clears them), stored \
             programs or not",
            None,
            p.quarantined,
        )?;
        counter(
            &mut e,
            "program_loads",
            "Programs loaded into the device heap since start (first loads and reloads after \
             an eviction)",
            p.loads,
        )?;
        counter(
            &mut e,
            "program_evictions",
            "Programs evicted from the device heap (least recently used) to make room for \
             another",
            p.evictions,
        )?;
        counter(
            &mut e,
            "device_faults",
            "Device faults (failed or hung work) since start",
            s.exec.faults(),
        )?;
        counter(
            &mut e,
            "recoveries",
            "Device recoveries (the queue recreated after a fault) since start",
            device.recoveries,
        )?;
        Ok(())
    }
}
