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

use crate::service::State;

/// The collector registered with the [`Exporter`](super::Exporter); it holds the state weakly,
/// so that a scrape in flight at shutdown keeps nothing alive.
#[derive(Debug)]
pub struct StateCollector {
    state: Weak<State>,
    started_unix_s: f64,
}

impl StateCollector {
    pub fn new(state: Weak<State>) -> Self {
        let started_unix_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Self {
            state,
            started_unix_s,
        }
    }
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
                "Dispatches and chains a session has admitted that are not answered yet (queued \
                 or on the device); a session's series leaves with it",
                None,
                MetricType::Gauge,
            )?;
            for x in &sessions {
                let n = x.pending;
                let labels = [
                    ("session", x.id.to_string()),
                    ("client", x.client_name.clone()),
                ];
                ConstGauge::new(i64::from(n)).encode(m.encode_family(&labels)?)?;
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
