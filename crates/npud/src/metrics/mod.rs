//! Prometheus metrics: what the daemon counts as work happens ([`Metrics`]), what it reads from
//! its own state at each scrape (`service::collect`), the tower layer that counts RPC outcomes
//! ([`rpc`]), and the HTTP listener that serves `GET /metrics` ([`http`]).
//!
//! Counters that the daemon already keeps (sessions opened and ended, device faults,
//! recoveries, heap use, tensors, quarantine records) are read at scrape time, never counted
//! twice; only what happens in a handler and is kept nowhere else (dispatch outcomes by
//! program, queue and device time histograms, RPC and fd-socket outcomes, work in flight per
//! session) is counted here.
//!
//! Label values are bounded: programs by name (or, unnamed, by the first 12 hex digits of
//! their content hash), at most `metrics.max_program_labels` of them, the rest as `other`;
//! RPC methods by the API's own method names, anything else as `other`; work pending in
//! sessions by the kind of identity that opened them (`uid`, `cert`, `token`, `anonymous`).
//! No label carries a request's own values or text a client chose, unless the operator asks
//! for per-session series (`metrics.max_session_labels`): then at most that many sessions are
//! shown by id and `client_name` (control characters escaped), the rest as `other`.

pub mod http;
pub mod rpc;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::priority::Class;
use crate::programs::Programs;

/// The label value of programs past `metrics.max_program_labels`, and of RPC paths that are no
/// method of the API.
pub const OTHER: &str = "other";

/// Bucket bounds of the queue and device time histograms, in seconds: 10 µs (an emulated
/// dispatch) to 10 s (past the driver's hang timeout).
const TIME_BUCKETS: [f64; 19] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn time_histogram() -> Histogram {
    Histogram::new(TIME_BUCKETS)
}

/// Whether work was one dispatch or a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Dispatch,
    Chain,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Dispatch => "dispatch",
            Self::Chain => "chain",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ProgramOutcome {
    program: Arc<str>,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindCode {
    kind: &'static str,
    code: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindClass {
    kind: &'static str,
    class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MethodLabel {
    method: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MethodCode {
    method: Arc<str>,
    code: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OpStatus {
    op: &'static str,
    status: &'static str,
}

/// At most `max` distinct values; values past them become [`OTHER`].
#[derive(Debug)]
struct CappedLabels {
    max: usize,
    seen: Mutex<HashSet<Arc<str>>>,
}

impl CappedLabels {
    fn new(max: usize) -> Self {
        Self {
            max,
            seen: Mutex::new(HashSet::new()),
        }
    }

    fn admit(&self, value: &str) -> Arc<str> {
        let mut seen = lock(&self.seen);
        if let Some(v) = seen.get(value) {
            return v.clone();
        }
        if seen.len() >= self.max || value == OTHER {
            return OTHER.into();
        }
        let v: Arc<str> = value.into();
        seen.insert(v.clone());
        v
    }
}

/// Most program ids whose label is remembered; past it the memory starts over (a label is
/// found again from the program store, and keeps its place under the cap).
const PROGRAM_ID_CACHE: usize = 4096;

/// What the daemon counts as it happens.
#[derive(Debug)]
pub struct Metrics {
    dispatches: Family<ProgramOutcome, Counter>,
    chain_links: Family<ProgramOutcome, Counter>,
    refused: Family<KindCode, Counter>,
    queue_time: Family<KindClass, Histogram, fn() -> Histogram>,
    device_time: Family<KindClass, Histogram, fn() -> Histogram>,
    rpcs: Family<MethodLabel, Counter>,
    rpc_errors: Family<MethodCode, Counter>,
    fd_exchanges: Family<OpStatus, Counter>,
    program_labels: CappedLabels,
    program_ids: Mutex<crate::IdMap<u64, Arc<str>>>,
    /// The counter of each (kind, program id, outcome) counted lately: a finished dispatch
    /// costs one lookup, not a label's and a family's (a `Counter` shares its value).
    counters: Mutex<crate::IdMap<(Kind, u64, &'static str), Counter>>,
    /// (queue, device) time histograms of each kind, in [`Kind`] order, and of each session
    /// class, in [`Class::ALL`] order: one pair of observations a finished item, its class a
    /// label of the same histograms.
    times: [[(Histogram, Histogram); 2]; 2],
    methods: HashSet<Arc<str>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Metrics {
    /// Counters with at most `max_program_labels` distinct program label values.
    pub fn new(max_program_labels: u32) -> Self {
        let queue_time: Family<KindClass, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(time_histogram);
        let device_time: Family<KindClass, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(time_histogram);
        // Every kind and class from the start, so that quantile panels have series before any
        // work.
        let times = [Kind::Dispatch, Kind::Chain].map(|kind| {
            Class::ALL.map(|class| {
                let l = KindClass {
                    kind: kind.as_str(),
                    class: class.as_str(),
                };
                (
                    queue_time.get_or_create(&l).clone(),
                    device_time.get_or_create(&l).clone(),
                )
            })
        });
        Self {
            dispatches: Family::default(),
            chain_links: Family::default(),
            refused: Family::default(),
            queue_time,
            device_time,
            rpcs: Family::default(),
            rpc_errors: Family::default(),
            fd_exchanges: Family::default(),
            program_labels: CappedLabels::new(max_program_labels as usize),
            program_ids: Mutex::new(crate::IdMap::default()),
            counters: Mutex::new(crate::IdMap::default()),
            times,
            methods: rpc::api_methods(),
        }
    }

    /// Registers the event counters in `registry` (names without the `npud_` prefix, which
    /// the registry adds).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "dispatches",
            "Dispatches that reached the device queue, by program and outcome (OK or the gRPC \
             code of the failure)",
            self.dispatches.clone(),
        );
        registry.register(
            "chain_links",
            "Chain links that reached the device queue, by program and outcome (links after a \
             failed link did not run and are not counted)",
            self.chain_links.clone(),
        );
        registry.register(
            "refused_links",
            "Dispatches and chain links refused before they were queued (quotas, unknown or \
             quarantined programs, a device not serving), by kind and gRPC code",
            self.refused.clone(),
        );
        registry.register_with_unit(
            "queue_time",
            "Time from admission to the device starting a dispatch or chain, by kind and the \
             session's class (batch, interactive)",
            Unit::Seconds,
            self.queue_time.clone(),
        );
        registry.register_with_unit(
            "device_time",
            "Time the device took for a dispatch or a whole chain, by kind and the session's \
             class: a class's _sum over all classes' is its device share",
            Unit::Seconds,
            self.device_time.clone(),
        );
        registry.register("rpcs", "gRPC calls answered, by method", self.rpcs.clone());
        registry.register(
            "rpc_errors",
            "gRPC calls answered with an error, by method and code",
            self.rpc_errors.clone(),
        );
        registry.register(
            "fd_exchanges",
            "Requests answered on the fd socket, by operation and status",
            self.fd_exchanges.clone(),
        );
    }

    /// The label of program `id`: its name, or the start of its content hash when unnamed;
    /// [`OTHER`] past the cap or when the program is gone.
    fn program_label(&self, programs: &Programs, id: u64) -> Arc<str> {
        if let Some(l) = lock(&self.program_ids).get(&id) {
            return l.clone();
        }
        let label = match programs.label_of(id) {
            Some(v) => self.program_labels.admit(&v),
            None => return OTHER.into(),
        };
        let mut ids = lock(&self.program_ids);
        if ids.len() >= PROGRAM_ID_CACHE {
            ids.clear();
        }
        ids.insert(id, label.clone());
        label
    }

    /// Counts finished work: `links` links of `program` with `outcome` ("OK" or a code name).
    pub fn links(
        &self,
        programs: &Programs,
        kind: Kind,
        program: u64,
        links: u64,
        outcome: &'static str,
    ) {
        let key = (kind, program, outcome);
        if let Some(c) = lock(&self.counters).get(&key) {
            c.inc_by(links);
            return;
        }
        let l = ProgramOutcome {
            program: self.program_label(programs, program),
            outcome,
        };
        let family = match kind {
            Kind::Dispatch => &self.dispatches,
            Kind::Chain => &self.chain_links,
        };
        let c = family.get_or_create(&l).clone();
        c.inc_by(links);
        let mut counters = lock(&self.counters);
        if counters.len() >= PROGRAM_ID_CACHE {
            counters.clear();
        }
        counters.insert(key, c);
    }

    /// Times of one work item of a session of `class` that the device queue answered.
    pub fn timed(&self, kind: Kind, class: Class, queue_ns: u64, device_ns: u64) {
        #[expect(
            clippy::cast_precision_loss,
            reason = "seconds as f64, as Prometheus has them"
        )]
        let secs = |ns: u64| ns as f64 / 1e9;
        let (queue, device) = &self.times[kind as usize][class.index()];
        queue.observe(secs(queue_ns));
        device.observe(secs(device_ns));
    }

    /// Counts `links` refused before they were queued.
    pub fn refused(&self, kind: Kind, links: u64, code: &'static str) {
        self.refused
            .get_or_create(&KindCode {
                kind: kind.as_str(),
                code,
            })
            .inc_by(links);
    }

    /// The method label of a request path: the path of an API method, else [`OTHER`].
    pub fn method_label(&self, path: &str) -> Arc<str> {
        self.methods
            .get(path)
            .cloned()
            .unwrap_or_else(|| OTHER.into())
    }

    /// Counts an answered RPC with its gRPC code name.
    pub fn rpc(&self, method: &Arc<str>, code: &'static str) {
        self.rpcs
            .get_or_create(&MethodLabel {
                method: method.clone(),
            })
            .inc();
        if code != "OK" {
            self.rpc_errors
                .get_or_create(&MethodCode {
                    method: method.clone(),
                    code,
                })
                .inc();
        }
    }

    /// Counts an fd-socket answer.
    pub fn fd_exchange(&self, op: &'static str, status: &'static str) {
        self.fd_exchanges
            .get_or_create(&OpStatus { op, status })
            .inc();
    }
}

/// The registry a scrape encodes: the event counters and the scrape-time collector.
#[derive(Debug)]
pub struct Exporter {
    registry: Registry,
}

impl Exporter {
    /// The registry of `metrics`' counters and `collector`, which reads the daemon's state at
    /// each scrape (`service::collect`).
    pub fn new(
        metrics: &Metrics,
        collector: Box<dyn prometheus_client::collector::Collector>,
    ) -> Self {
        let mut registry = Registry::with_prefix("npud");
        metrics.register(&mut registry);
        registry.register_collector(collector);
        Self { registry }
    }

    /// The metrics in Prometheus' text format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug of ours.
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_past_the_cap_are_other() {
        let c = CappedLabels::new(2);
        assert_eq!(&*c.admit("a"), "a");
        assert_eq!(&*c.admit("b"), "b");
        assert_eq!(&*c.admit("c"), OTHER);
        assert_eq!(&*c.admit("a"), "a");
        assert_eq!(&*c.admit(OTHER), OTHER);
    }

    #[test]
    fn rpc_paths_outside_the_api_are_other() {
        let m = Metrics::new(4);
        assert_eq!(
            &*m.method_label("/npud.v1.Npud/Dispatch"),
            "/npud.v1.Npud/Dispatch"
        );
        assert_eq!(
            &*m.method_label("/grpc.health.v1.Health/Check"),
            "/grpc.health.v1.Health/Check"
        );
        assert_eq!(&*m.method_label("/npud.v1.Npud/NoSuchCall"), OTHER);
        assert_eq!(&*m.method_label("/x"), OTHER);
    }
}
