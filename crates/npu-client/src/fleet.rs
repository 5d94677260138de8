//! [`Fleet`]: sessions spread over several npud hosts.
//!
//! ```no_run
//! # async fn run() -> Result<(), npu_client::ClientError> {
//! use npu_client::Fleet;
//!
//! // A Kubernetes headless Service resolves to every host; a list of addresses works too.
//! let fleet = Fleet::connect("dns:///npud-hosts.ns.svc:50051").await?;
//! let client = fleet.open().await?; // a session on the least loaded healthy host
//! println!("session {} on {}", client.session_id(), client.address());
//! # Ok(()) }
//! ```
//!
//! # Contract
//!
//! - Hosts come from a [`FleetSpec`]: a list of addresses, or a DNS name resolved at start,
//!   every [`FleetOptions::refresh_interval`], and when a session is opened more than a second
//!   after the last resolution; new addresses join, addresses gone from the answer leave (their
//!   sessions go on). Every host is connected with the same [`ConnectOptions`].
//! - Every refresh interval the fleet asks each serving host for its gRPC health
//!   (`npud.v1.Npud`) and its statistics (`pending_dispatches`, `open_sessions`), each within
//!   the connect timeout. A host that cannot be reached is *down*; one that answers
//!   `NOT_SERVING` or refuses the calls is *not serving*. Either is probed again after a
//!   backoff that doubles from [`FleetOptions::retry_min`] to [`FleetOptions::retry_max`],
//!   and takes sessions again once it answers `SERVING`.
//! - [`Fleet::open`] opens the session on the serving host with the fewest pending dispatches,
//!   then the fewest sessions (counting the sessions this fleet opened since the host's last
//!   statistics, so a burst spreads at once); equal hosts take turns. When the chosen host
//!   fails to open it, the next one is tried; when none can,
//!   [`ClientError::NoHealthyHost`] lists each host and why.
//! - A session stays on its host: its tensors and programs live there. When the fleet finds
//!   the host down (a probe, a failed open, or the session's own reconnect failing for
//!   [`ConnectOptions::reconnect_timeout`]), every session opened there before fails its
//!   calls in flight and its next ones with [`ClientError::SessionLost`] naming the host, at
//!   once and for good, also when the host comes back. A host that is only not serving keeps its sessions (the daemon
//!   answers them itself).

mod host;
mod spec;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::ClientError;
use crate::client::Client;
use crate::connect::{Address, ConnectOptions};
use crate::session::Inner;
use host::{Host, HostLink, choose, reason};

pub use host::HostHealth;
pub use spec::{FLEET_ENV, FleetSpec, Resolve, Resolving, SystemResolver};

/// A session opened more than this long after the last resolution resolves the name again.
const RESOLVE_AT_OPEN_AFTER: Duration = Duration::from_secs(1);

/// How a [`Fleet`] connects and watches its hosts.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// For every host, unchanged (timeouts, TLS, client name). Probes wait at most its
    /// `connect_timeout` for each answer.
    pub connect: ConnectOptions,
    /// How often serving hosts are probed and a DNS name resolved again.
    pub refresh_interval: Duration,
    /// The first wait before probing a failed host again; it doubles with each failure.
    pub retry_min: Duration,
    /// The longest wait before probing a failed host again.
    pub retry_max: Duration,
    /// Resolves a DNS fleet's name.
    pub resolver: Arc<dyn Resolve>,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            connect: ConnectOptions::default(),
            refresh_interval: Duration::from_secs(2),
            retry_min: Duration::from_millis(250),
            retry_max: Duration::from_secs(15),
            resolver: Arc::new(SystemResolver),
        }
    }
}

/// What a fleet knows of one host ([`Fleet::hosts`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HostStatus {
    /// The daemon's address.
    pub address: Address,
    /// Whether it takes sessions, and if not why.
    pub health: HostHealth,
    /// Dispatches pending on its device at the last probe.
    pub pending_dispatches: u64,
    /// Its open sessions: the last probe's count plus the sessions this fleet opened since.
    pub sessions: u64,
    /// Sessions this fleet opened on it.
    pub opened_here: u64,
    /// Whether the next session would go to it.
    pub next: bool,
    /// How long ago it was last probed.
    pub checked_ago: Option<Duration>,
    /// When a failed host is probed again.
    pub retry_in: Option<Duration>,
}

/// Several npud hosts that sessions are spread over (see the [module docs](self)). Cheap to
/// clone (clones share the hosts); the watching stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Fleet {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    spec: FleetSpec,
    opts: FleetOptions,
    hosts: Mutex<Hosts>,
    refresher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Hosts {
    list: Vec<Arc<Host>>,
    /// Where the turn among equal hosts starts.
    cursor: usize,
    resolved_at: Option<Instant>,
    resolve_error: Option<String>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(t) = self
            .refresher
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            t.abort();
        }
    }
}

impl Fleet {
    /// Connects to the hosts of `spec` (see [`FleetSpec`] for the forms) with default options
    /// and probes each once.
    ///
    /// # Errors
    ///
    /// [`ClientError::Address`] for a fleet that does not parse or a DNS name that does not
    /// resolve (or resolves to no address). Hosts that cannot be reached are no error: they are
    /// down until they answer.
    pub async fn connect(spec: &str) -> Result<Fleet, ClientError> {
        Self::connect_with(FleetSpec::parse(spec)?, FleetOptions::default()).await
    }

    /// Like [`Fleet::connect`], with a parsed fleet and options.
    ///
    /// # Errors
    ///
    /// As [`Fleet::connect`].
    pub async fn connect_with(spec: FleetSpec, opts: FleetOptions) -> Result<Fleet, ClientError> {
        let list = match &spec {
            FleetSpec::Endpoints(list) => list
                .iter()
                .map(|a| Arc::new(Host::new(a.clone(), opts.retry_min, opts.retry_max)))
                .collect(),
            FleetSpec::Dns { .. } => Vec::new(),
        };
        let shared = Arc::new(Shared {
            spec,
            opts,
            hosts: Mutex::new(Hosts {
                list,
                ..Hosts::default()
            }),
            refresher: Mutex::new(None),
        });
        if let FleetSpec::Dns { .. } = &shared.spec {
            shared.resolve().await;
            let h = shared.lock();
            if let Some(e) = &h.resolve_error {
                return Err(ClientError::Address {
                    address: shared.spec.to_string(),
                    reason: e.clone(),
                });
            }
        }
        shared.probe(true).await;
        let every = shared.opts.refresh_interval.max(Duration::from_millis(10));
        let task = tokio::spawn(refresh_loop(Arc::downgrade(&shared), every));
        *shared
            .refresher
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(task);
        Ok(Fleet { shared })
    }

    /// The fleet as given.
    #[must_use]
    pub fn spec(&self) -> &FleetSpec {
        &self.shared.spec
    }

    /// Opens a session on the healthy host with the least pending work (see the
    /// [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`ClientError::NoHealthyHost`] with each host and why when no host takes the session.
    pub async fn open(&self) -> Result<Client, ClientError> {
        self.open_with(self.shared.opts.connect.clone()).await
    }

    /// Like [`Fleet::open`], a session of `class` with `deadline` (see
    /// [`ConnectOptions::session_class`] and [`ConnectOptions::deadline`]) instead of the
    /// fleet's connect options' class: an application a person waits for asks to be served
    /// first on whichever host it lands.
    ///
    /// # Errors
    ///
    /// As [`Fleet::open`]; a host whose policy refuses the class is passed over, and its
    /// refusal is among the reasons [`ClientError::NoHealthyHost`] lists when no host takes the
    /// session.
    pub async fn open_as(
        &self,
        class: crate::SessionClass,
        deadline: Option<Duration>,
    ) -> Result<Client, ClientError> {
        self.open_with(ConnectOptions {
            session_class: class,
            deadline,
            ..self.shared.opts.connect.clone()
        })
        .await
    }

    async fn open_with(&self, opts: ConnectOptions) -> Result<Client, ClientError> {
        let s = &self.shared;
        if let FleetSpec::Dns { .. } = s.spec {
            let stale = s
                .lock()
                .resolved_at
                .is_none_or(|t| t.elapsed() >= RESOLVE_AT_OPEN_AFTER);
            if stale {
                s.resolve().await;
            }
        }
        s.probe_where(|h| h.health() == HostHealth::Unknown).await;
        if !s.lock().list.iter().any(|h| h.load().is_some()) {
            // Nothing serves as far as the fleet knows: look again at hosts whose backoff passed.
            s.probe(false).await;
        }
        let mut tried: Vec<(String, String)> = Vec::new();
        loop {
            let Some((host, epoch)) = s.pick(&tried) else {
                return Err(s.no_host(tried));
            };
            match Inner::connect(host.addr.clone(), opts.clone(), true).await {
                Ok(inner) => {
                    let link = Arc::new(HostLink { host, epoch });
                    // A fresh Inner's cell is empty.
                    let _ = inner.host.set(link);
                    return Ok(Client { inner });
                }
                Err(e) => {
                    host.unreserve();
                    let why = reason(&e);
                    match &e {
                        ClientError::Connect { .. } | ClientError::Timeout { .. } => {
                            host.mark_down(why.clone());
                        }
                        ClientError::Daemon { code, .. } if *code == tonic::Code::Unavailable => {
                            host.mark_not_serving(why.clone());
                        }
                        _ => {}
                    }
                    tried.push((host.addr.to_string(), why));
                }
            }
        }
    }

    /// Resolves the name again (a DNS fleet) and probes every host now, down ones included.
    pub async fn refresh(&self) {
        self.shared.resolve().await;
        self.shared.probe(true).await;
    }

    /// What the fleet knows of each host, in the fleet's order.
    #[must_use]
    pub fn hosts(&self) -> Vec<HostStatus> {
        let h = self.shared.lock();
        let loads: Vec<_> = h.list.iter().map(|x| x.load()).collect();
        let next = choose(&loads, h.cursor);
        let now = Instant::now();
        h.list
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let seen = x.seen();
                HostStatus {
                    address: x.addr.clone(),
                    health: seen.health,
                    pending_dispatches: seen.pending,
                    sessions: seen.sessions,
                    opened_here: seen.opened,
                    next: next == Some(i),
                    checked_ago: seen.checked.map(|t| now.saturating_duration_since(t)),
                    retry_in: seen.retry_at.map(|t| t.saturating_duration_since(now)),
                }
            })
            .collect()
    }

    /// Why the last resolution of a DNS fleet failed (the fleet keeps its previous hosts).
    #[must_use]
    pub fn resolve_error(&self) -> Option<String> {
        self.shared.lock().resolve_error.clone()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Hosts> {
        self.hosts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves a DNS fleet's name and updates its hosts: new addresses join (unprobed),
    /// addresses no longer in the answer leave. A failed resolution keeps the hosts.
    async fn resolve(&self) {
        let FleetSpec::Dns { name, port, tls } = &self.spec else {
            return;
        };
        let limit = self.opts.connect.connect_timeout;
        let answer = tokio::time::timeout(limit, self.opts.resolver.resolve(name, *port)).await;
        let mut h = self.lock();
        h.resolved_at = Some(Instant::now());
        let ips = match answer {
            Ok(Ok(ips)) if !ips.is_empty() => ips,
            Ok(Ok(_)) => {
                h.resolve_error = Some(format!("{name} resolves to no address"));
                return;
            }
            Ok(Err(e)) => {
                h.resolve_error = Some(format!("resolving {name}: {e}"));
                return;
            }
            Err(_) => {
                h.resolve_error = Some(format!("resolving {name}: no answer within {limit:?}"));
                return;
            }
        };
        h.resolve_error = None;
        let mut addrs: Vec<Address> = ips
            .into_iter()
            .map(|ip| FleetSpec::address_of(ip, *port, *tls))
            .collect();
        addrs.dedup();
        let before = h.list.len();
        h.list.retain(|x| addrs.contains(&x.addr));
        let left = before - h.list.len();
        let mut joined = 0;
        for a in &addrs {
            if !h.list.iter().any(|x| &x.addr == a) {
                h.list.push(Arc::new(Host::new(
                    a.clone(),
                    self.opts.retry_min,
                    self.opts.retry_max,
                )));
                joined += 1;
            }
        }
        h.list.sort_by_key(|x| x.addr.to_string());
        if joined + left > 0 {
            tracing::info!(
                name,
                joined,
                left,
                hosts = h.list.len(),
                "fleet hosts changed"
            );
        }
    }

    /// Probes every host (`all`), or those due for a routine probe, at once.
    async fn probe(&self, all: bool) {
        let now = Instant::now();
        self.probe_where(|h| all || h.due(now)).await;
    }

    async fn probe_where(&self, which: impl Fn(&Host) -> bool) {
        let hosts: Vec<Arc<Host>> = self
            .lock()
            .list
            .iter()
            .filter(|h| which(h))
            .cloned()
            .collect();
        let mut probes = tokio::task::JoinSet::new();
        for h in hosts {
            let opts = self.opts.connect.clone();
            probes.spawn(async move { h.probe(&opts).await });
        }
        while probes.join_next().await.is_some() {}
    }

    /// Chooses the host for a session (not one in `tried`) and counts the session there.
    fn pick(&self, tried: &[(String, String)]) -> Option<(Arc<Host>, u64)> {
        let mut h = self.lock();
        let loads: Vec<_> = h
            .list
            .iter()
            .map(|x| {
                let name = x.addr.to_string();
                if tried.iter().any(|(t, _)| *t == name) {
                    None
                } else {
                    x.load()
                }
            })
            .collect();
        let i = choose(&loads, h.cursor)?;
        h.cursor = i + 1;
        let host = h.list[i].clone();
        let epoch = host.reserve();
        Some((host, epoch))
    }

    /// The error when no host took a session: what each host answered or why it was skipped.
    fn no_host(&self, tried: Vec<(String, String)>) -> ClientError {
        let h = self.lock();
        let mut hosts = tried;
        for x in &h.list {
            let name = x.addr.to_string();
            if !hosts.iter().any(|(t, _)| *t == name) {
                hosts.push((name, x.health().to_string()));
            }
        }
        if let Some(e) = &h.resolve_error {
            hosts.push((self.spec.to_string(), e.clone()));
        }
        ClientError::NoHealthyHost { hosts }
    }
}

/// Refreshes the fleet every `every` until it is dropped.
async fn refresh_loop(fleet: Weak<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(s) = fleet.upgrade() else {
            return;
        };
        s.resolve().await;
        s.probe(false).await;
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// A resolver whose answer the test sets.
    #[derive(Debug, Default)]
    struct Fixed(Mutex<Vec<IpAddr>>);

    impl Fixed {
        fn set(&self, ips: &[&str]) {
            *self.0.lock().unwrap() = ips.iter().map(|s| s.parse().unwrap()).collect();
        }
    }

    impl Resolve for Fixed {
        fn resolve<'a>(&'a self, name: &'a str, _port: u16) -> Resolving<'a> {
            let ips = self.0.lock().unwrap().clone();
            let name = name.to_owned();
            Box::pin(async move {
                if name == "npud-hosts.test" {
                    Ok(ips)
                } else {
                    Err(std::io::Error::other(format!("{name}: no such host")))
                }
            })
        }
    }

    /// A loopback port nothing listens on.
    fn closed_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    fn options(resolver: Arc<dyn Resolve>) -> FleetOptions {
        FleetOptions {
            connect: ConnectOptions {
                connect_timeout: Duration::from_secs(2),
                ..ConnectOptions::default()
            },
            refresh_interval: Duration::from_secs(3600),
            resolver,
            ..FleetOptions::default()
        }
    }

    fn addresses(f: &Fleet) -> Vec<String> {
        f.hosts().iter().map(|h| h.address.to_string()).collect()
    }

    #[tokio::test]
    async fn a_dns_name_becomes_one_host_per_address_and_follows_its_records() {
        let resolver = Arc::new(Fixed::default());
        resolver.set(&["127.0.0.3", "127.0.0.1", "127.0.0.2"]);
        let port = closed_port();
        let spec = FleetSpec::parse(&format!("dns:///npud-hosts.test:{port}")).unwrap();
        let fleet = Fleet::connect_with(spec, options(resolver.clone()))
            .await
            .unwrap();
        let want: Vec<String> = (1..=3)
            .map(|i| format!("http://127.0.0.{i}:{port}"))
            .collect();
        assert_eq!(addresses(&fleet), want);
        for h in fleet.hosts() {
            assert!(matches!(h.health, HostHealth::Down(_)), "{h:?}");
            assert!(h.retry_in.is_some(), "{h:?}");
        }

        resolver.set(&["127.0.0.2", "127.0.0.4"]);
        fleet.refresh().await;
        let want: Vec<String> = [2, 4]
            .iter()
            .map(|i| format!("http://127.0.0.{i}:{port}"))
            .collect();
        assert_eq!(addresses(&fleet), want);

        // A failed resolution keeps the hosts and says why.
        resolver.set(&[]);
        fleet.refresh().await;
        assert_eq!(addresses(&fleet).len(), 2);
        let e = fleet.resolve_error().unwrap();
        assert!(e.contains("resolves to no address"), "{e}");
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_refused_at_connect() {
        let spec = FleetSpec::parse("dns:///elsewhere.test:1").unwrap();
        let e = Fleet::connect_with(spec, options(Arc::new(Fixed::default())))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("elsewhere.test: no such host"), "{e}");
    }

    #[tokio::test]
    async fn a_fleet_with_no_healthy_host_lists_each_host_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.sock");
        let port = closed_port();
        let spec = format!("{},http://127.0.0.1:{port}", a.display());
        let fleet = Fleet::connect_with(
            FleetSpec::parse(&spec).unwrap(),
            options(Arc::new(SystemResolver)),
        )
        .await
        .unwrap();
        let e = fleet.open().await.unwrap_err();
        let ClientError::NoHealthyHost { hosts } = &e else {
            panic!("expected NoHealthyHost, got {e}");
        };
        assert_eq!(hosts.len(), 2, "{e}");
        assert_eq!(hosts[0].0, format!("unix:{}", a.display()));
        assert_eq!(hosts[1].0, format!("http://127.0.0.1:{port}"));
        for (_, why) in hosts {
            assert!(why.starts_with("down ("), "{e}");
        }
        let text = e.to_string();
        assert!(
            text.starts_with("no npud host of the fleet can take a session: unix:"),
            "{text}"
        );
    }
}
