//! Accepting connections: connection pools per listener, a pre-authentication pool for TCP,
//! limits per peer, and an accept loop that backs off when the process is out of file
//! descriptors instead of spinning.
//!
//! Local and remote callers draw on separate pools, so that no remote peer, authenticated or
//! not, can use up the connections local users need:
//!
//! - the **local pool** serves the gRPC Unix socket and the fd socket: at most
//!   `limits.max_connections` in all, `limits.max_connections_per_peer` from one uid;
//! - the **TCP pool** serves the TCP listener: at most `limits.max_tcp_connections`, and
//!   `limits.max_tcp_connections_per_prefix` from one network prefix ([`Prefix`]: an IPv4
//!   address's /24, an IPv6 address's /64, all of loopback as one), since one host can hold a
//!   whole /24 or /64 (and every local user all of 127.0.0.0/8);
//! - the **pre-authentication pool**: a TCP connection also holds a place here from accept
//!   until it has finished its TLS handshake and sent the HTTP/2 preface, at most
//!   `limits.max_preauth_connections` in all and `limits.max_preauth_connections_per_prefix`
//!   from one prefix, each bounded by `limits.handshake_timeout_ms`. A connection with no place
//!   here is closed at once, unanswered: it has not said anything yet.
//!
//! Every connection a pool admits holds a [`Slot`] until it closes. A connection over a pool's
//! limit is still accepted, but only to be told why ([`Admission::Refused`]: the gRPC listeners
//! answer its first request with `RESOURCE_EXHAUSTED` naming the key, the fd socket with its
//! `RESOURCE_EXHAUSTED` status), and is closed within [`REFUSED_LIFETIME`]. At most
//! [`MAX_REFUSING`] refused connections are held at once per pool; past that they are closed
//! unanswered.
//!
//! When `accept` fails with `EMFILE` or `ENFILE` the connection stays in the kernel's backlog
//! and the listener stays readable, so retrying at once would spin a core. The acceptor logs the
//! cause once per episode, sleeps (10 ms, doubling to at most 1 s) between attempts, and keeps
//! one spare descriptor (`/dev/null`): on exhaustion it closes the spare, accepts one waiting
//! connection with it, and refuses that one naming the cause, so a client learns the daemon is
//! out of file descriptors rather than timing out.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::config::Limits;

/// How long a refused connection is kept open to be told why.
pub const REFUSED_LIFETIME: Duration = Duration::from_secs(2);
/// Most refused connections held open at once, to be told why.
pub const MAX_REFUSING: u32 = 16;
/// First sleep after an accept failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Longest sleep between accept attempts while they fail.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Who a connection comes from, for the per-peer limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A local user, on a Unix socket (`SO_PEERCRED`; `u32::MAX` when unreadable).
    Uid(u32),
    /// A TCP peer's address.
    Addr(IpAddr),
}

impl Peer {
    /// What the per-peer limit counts: a uid, or a TCP peer's network prefix.
    fn key(self) -> Key {
        match self {
            Peer::Uid(u) => Key::Uid(u),
            Peer::Addr(a) => Key::Prefix(Prefix::of(a)),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Uid(u) => write!(f, "uid {u}"),
            Peer::Addr(a) => write!(f, "address {a} (network {})", Prefix::of(*a)),
        }
    }
}

/// The network a TCP peer is counted in: one host can hold every address of its /24 (IPv4) or
/// /64 (IPv6), and every local user every address of loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prefix {
    /// 127.0.0.0/8 and ::1.
    Loopback,
    /// The first three octets of an IPv4 address (an IPv4-mapped IPv6 one included).
    V4([u8; 3]),
    /// The first four groups of an IPv6 address.
    V6([u16; 4]),
}

impl Prefix {
    /// The prefix `addr` is counted in.
    pub fn of(addr: IpAddr) -> Self {
        let v4 = |a: Ipv4Addr| {
            if a.is_loopback() {
                Prefix::Loopback
            } else {
                let [x, y, z, _] = a.octets();
                Prefix::V4([x, y, z])
            }
        };
        match addr {
            IpAddr::V4(a) => v4(a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(m) => v4(m),
                None if a == Ipv6Addr::LOCALHOST => Prefix::Loopback,
                None => {
                    let g = a.segments();
                    Prefix::V6([g[0], g[1], g[2], g[3]])
                }
            },
        }
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Prefix::Loopback => f.write_str("loopback"),
            Prefix::V4([a, b, c]) => write!(f, "{a}.{b}.{c}.0/24"),
            Prefix::V6([a, b, c, d]) => write!(f, "{a:x}:{b:x}:{c:x}:{d:x}::/64"),
        }
    }
}

/// What a pool's per-peer limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Uid(u32),
    Prefix(Prefix),
}

#[derive(Debug, Default)]
struct Counts {
    total: u32,
    per_peer: HashMap<Key, u32>,
}

/// A pool's limits and the configuration keys that set them, for messages.
#[derive(Debug, Clone, Copy)]
struct PoolLimits {
    what: &'static str,
    max_total: u32,
    total_key: &'static str,
    max_per_peer: u32,
    per_peer_key: &'static str,
}

/// One pool's connection counts.
#[derive(Debug)]
pub struct Limiter {
    limits: PoolLimits,
    counts: Mutex<Counts>,
    refusing: AtomicU32,
}

impl Limiter {
    fn with(limits: PoolLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            counts: Mutex::new(Counts::default()),
            refusing: AtomicU32::new(0),
        })
    }

    /// The local pool: the gRPC Unix socket and the fd socket.
    pub fn local(limits: &Limits) -> Arc<Self> {
        Self::with(PoolLimits {
            what: "local",
            max_total: limits.max_connections,
            total_key: "limits.max_connections",
            max_per_peer: limits.max_connections_per_peer,
            per_peer_key: "limits.max_connections_per_peer",
        })
    }

    /// The TCP listener's pool.
    pub fn tcp(limits: &Limits) -> Arc<Self> {
        Self::with(PoolLimits {
            what: "TCP",
            max_total: limits.max_tcp_connections,
            total_key: "limits.max_tcp_connections",
            max_per_peer: limits.max_tcp_connections_per_prefix,
            per_peer_key: "limits.max_tcp_connections_per_prefix",
        })
    }

    /// The pre-authentication pool: TCP connections that have not finished their TLS
    /// handshake and HTTP/2 preface.
    pub fn preauth(limits: &Limits) -> Arc<Self> {
        Self::with(PoolLimits {
            what: "pre-authentication",
            max_total: limits.max_preauth_connections,
            total_key: "limits.max_preauth_connections",
            max_per_peer: limits.max_preauth_connections_per_prefix,
            per_peer_key: "limits.max_preauth_connections_per_prefix",
        })
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        // Each update is a pair of counter changes; a panic cannot leave them half done.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a connection from `peer`, or why there is none (naming the limit's key).
    ///
    /// # Errors
    /// The refusal message when either limit is reached.
    pub fn admit(self: &Arc<Self>, peer: Peer) -> Result<Slot, String> {
        let l = self.limits;
        let key = peer.key();
        let mut g = self.lock();
        if g.total >= l.max_total {
            return Err(format!(
                "the daemon has {} open {} connections, its limit ({}); try again later",
                g.total, l.what, l.total_key
            ));
        }
        let mine = g.per_peer.get(&key).copied().unwrap_or(0);
        if mine >= l.max_per_peer {
            let whose = match key {
                Key::Uid(_) => format!("{peer} has"),
                Key::Prefix(p) => format!("network {p} (of {peer}) has"),
            };
            return Err(format!(
                "{whose} {mine} open {} connections, the limit per {} ({}); close some (one \
                 channel serves many calls)",
                l.what,
                match key {
                    Key::Uid(_) => "peer",
                    Key::Prefix(_) => "network prefix",
                },
                l.per_peer_key
            ));
        }
        g.total += 1;
        *g.per_peer.entry(key).or_insert(0) += 1;
        Ok(Slot {
            limiter: self.clone(),
            key,
        })
    }

    /// Open admitted connections (all, and from `peer`'s uid or network prefix).
    pub fn open(&self, peer: Peer) -> (u32, u32) {
        let g = self.lock();
        (g.total, g.per_peer.get(&peer.key()).copied().unwrap_or(0))
    }

    fn refusing(self: &Arc<Self>) -> Option<RefusingGuard> {
        self.refusing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_REFUSING).then_some(n + 1)
            })
            .ok()
            .map(|_| RefusingGuard {
                limiter: self.clone(),
            })
    }
}

/// An admitted connection's place in a pool's counts, given back on drop.
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<Limiter>,
    key: Key,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut g = self.limiter.lock();
        g.total = g.total.saturating_sub(1);
        if let Some(n) = g.per_peer.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.per_peer.remove(&self.key);
            }
        }
    }
}

/// One of the [`MAX_REFUSING`] places for refused connections.
#[derive(Debug)]
pub struct RefusingGuard {
    limiter: Arc<Limiter>,
}

impl Drop for RefusingGuard {
    fn drop(&mut self) {
        self.limiter.refusing.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the acceptor decided for a connection.
#[derive(Debug)]
pub enum Admission {
    /// Serve it; the slot is given back when the connection closes. A TCP connection also
    /// holds a place in the pre-authentication pool, given back once it has finished its TLS
    /// handshake and HTTP/2 preface.
    Admitted { slot: Slot, preauth: Option<Slot> },
    /// Tell it why not (the message names the limit or the cause), then close it.
    Refused {
        why: Arc<str>,
        _guard: RefusingGuard,
    },
}

/// A listening socket.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// An accepted stream.
#[derive(Debug)]
pub enum Accepted {
    Unix(UnixStream),
    Tcp(TcpStream),
    /// A TCP stream after its TLS handshake.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Accepted {
    fn peer(&self) -> Peer {
        match self {
            // A Unix peer whose credentials cannot be read gets u32::MAX, no real user's uid.
            Accepted::Unix(s) => Peer::Uid(s.peer_cred().map_or(u32::MAX, |c| c.uid())),
            Accepted::Tls(s) => s.get_ref().0.peer_addr().map_or(
                Peer::Addr(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
                |a| Peer::Addr(a.ip()),
            ),
            Accepted::Tcp(s) => s.peer_addr().map_or(
                Peer::Addr(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
                |a| Peer::Addr(a.ip()),
            ),
        }
    }
}

impl Listener {
    async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Accepted::Tcp(s)),
        }
    }
}

/// Whether an accept error means the process or the system is out of descriptors.
fn out_of_fds(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(c) if c == rustix::io::Errno::MFILE.raw_os_error()
            || c == rustix::io::Errno::NFILE.raw_os_error()
    )
}

/// The process's soft `RLIMIT_NOFILE`, for messages.
pub fn nofile_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Whether the process is out of file descriptors (or within a few of its limit), as a message
/// for a client whose request failed for it; `None` when it is not. Called on failure paths
/// only (an allocation the runtime refused), where memory exhaustion and descriptor exhaustion
/// look alike: a memfd that cannot be created is `OUT_OF_RESOURCES` to the runtime.
pub fn fd_exhaustion() -> Option<String> {
    let limit = nofile_limit()?;
    let open = match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => d.count() as u64,
        // Reading the directory needs a descriptor itself.
        Err(e) if out_of_fds(&e) => limit,
        Err(_) => return None,
    };
    (open + 4 >= limit).then(|| {
        format!(
            "the daemon is out of file descriptors ({open} of RLIMIT_NOFILE {limit} in use; \
             LimitNOFILE= in npud.service): try again later"
        )
    })
}

/// What a client refused for fd exhaustion reads.
fn fd_exhaustion_message(e: &io::Error) -> String {
    let limit = nofile_limit().map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    format!(
        "the daemon is out of file descriptors ({e}; RLIMIT_NOFILE {limit}, LimitNOFILE= in \
         npud.service): try again later"
    )
}

/// A listener's accept loop state: backoff, the spare descriptor, the current failure episode.
#[derive(Debug)]
pub struct Acceptor {
    listener: Listener,
    what: &'static str,
    limiter: Arc<Limiter>,
    /// The pre-authentication pool, for the TCP listener.
    preauth: Option<Arc<Limiter>>,
    spare: Option<File>,
    backoff: Duration,
    /// When the current run of failures began, and how many attempts failed since.
    episode: Option<(Instant, u64)>,
}

impl Acceptor {
    pub fn new(listener: Listener, what: &'static str, limiter: Arc<Limiter>) -> Self {
        Self {
            listener,
            what,
            limiter,
            preauth: None,
            spare: File::open("/dev/null").ok(),
            backoff: FIRST_BACKOFF,
            episode: None,
        }
    }

    /// Holds each connection in `preauth` until it has authenticated itself (the TCP listener).
    #[must_use]
    pub fn with_preauth(mut self, preauth: Arc<Limiter>) -> Self {
        self.preauth = Some(preauth);
        self
    }

    /// The next connection and what to do with it. Never returns an error: failures are
    /// logged once per episode and retried after a bounded sleep.
    pub async fn next(&mut self) -> (Accepted, Admission) {
        loop {
            if self.spare.is_none() {
                self.spare = File::open("/dev/null").ok();
            }
            match self.listener.accept().await {
                Ok(s) => {
                    if let Some((since, failed)) = self.episode.take() {
                        tracing::info!(
                            listener = self.what,
                            failed,
                            after = ?since.elapsed(),
                            "accepting connections again"
                        );
                    }
                    self.backoff = FIRST_BACKOFF;
                    let peer = s.peer();
                    let preauth = match self.preauth.as_ref().map(|p| p.admit(peer)) {
                        None => None,
                        Some(Ok(slot)) => Some(slot),
                        Some(Err(why)) => {
                            // Not a word from it yet: closed unanswered, costing nothing more.
                            tracing::debug!(listener = self.what, %peer, "{why}; closed");
                            continue;
                        }
                    };
                    match self.limiter.admit(peer) {
                        Ok(slot) => return (s, Admission::Admitted { slot, preauth }),
                        Err(why) => {
                            tracing::info!(listener = self.what, %peer, "{why}");
                            if let Some(g) = self.limiter.refusing() {
                                return (
                                    s,
                                    Admission::Refused {
                                        why: why.into(),
                                        _guard: g,
                                    },
                                );
                            }
                        }
                    }
                }
                Err(e) => {
                    let exhausted = out_of_fds(&e);
                    match &mut self.episode {
                        Some((_, n)) => *n += 1,
                        None => {
                            self.episode = Some((Instant::now(), 1));
                            if exhausted {
                                tracing::error!(
                                    listener = self.what,
                                    error = %e,
                                    rlimit_nofile = ?nofile_limit(),
                                    "out of file descriptors: refusing new connections, retrying \
                                     with backoff (raise LimitNOFILE= or lower \
                                     limits.max_connections)"
                                );
                            } else {
                                tracing::warn!(listener = self.what, error = %e, "accept failed; retrying with backoff");
                            }
                        }
                    }
                    if exhausted
                        && let Some(spare) = self.spare.take()
                        && let Some(g) = self.limiter.refusing()
                    {
                        drop(spare);
                        let waiting =
                            tokio::time::timeout(Duration::from_millis(10), self.listener.accept())
                                .await;
                        if let Ok(Ok(s)) = waiting {
                            return (
                                s,
                                Admission::Refused {
                                    why: fd_exhaustion_message(&e).into(),
                                    _guard: g,
                                },
                            );
                        }
                    }
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_in_total_and_per_peer_name_their_keys_and_free_on_drop() {
        let l = Limiter::local(&Limits {
            max_connections: 3,
            max_connections_per_peer: 2,
            ..Limits::default()
        });
        let a = Peer::Uid(1000);
        let b = Peer::Uid(1001);
        let s1 = l.admit(a).unwrap();
        let _s2 = l.admit(a).unwrap();
        let e = l.admit(a).unwrap_err();
        assert!(e.contains("(limits.max_connections_per_peer)"), "{e}");
        assert!(
            e.starts_with("uid 1000 has 2 open local connections"),
            "{e}"
        );
        let _s3 = l.admit(b).unwrap();
        let e = l.admit(b).unwrap_err();
        assert!(e.contains("(limits.max_connections)"), "{e}");
        drop(s1);
        assert_eq!(l.open(a), (2, 1));
        l.admit(b).unwrap();
    }

    #[test]
    fn tcp_peers_count_by_network_prefix_and_loopback_is_one_network() {
        let l = Limiter::tcp(&Limits {
            max_tcp_connections: 100,
            max_tcp_connections_per_prefix: 2,
            ..Limits::default()
        });
        let ip = |s: &str| Peer::Addr(s.parse().unwrap());
        let _a = l.admit(ip("127.0.0.1")).unwrap();
        let _b = l.admit(ip("127.0.0.2")).unwrap();
        // Another loopback address is the same host.
        let e = l.admit(ip("127.1.2.3")).unwrap_err();
        assert!(
            e.starts_with("network loopback (of address 127.1.2.3 (network loopback)) has 2"),
            "{e}"
        );
        assert!(e.contains("(limits.max_tcp_connections_per_prefix)"), "{e}");
        let e = l.admit(ip("::1")).unwrap_err();
        assert!(e.contains("network loopback"), "{e}");
        let _c = l.admit(ip("192.0.2.1")).unwrap();
        let _d = l.admit(ip("::ffff:192.0.2.200")).unwrap();
        let e = l.admit(ip("192.0.2.77")).unwrap_err();
        assert!(e.contains("network 192.0.2.0/24"), "{e}");
        l.admit(ip("192.0.3.1")).unwrap();
        let _e = l.admit(ip("2001:db8:1:2::1")).unwrap();
        let _f = l.admit(ip("2001:db8:1:2:ffff::9")).unwrap();
        let e = l.admit(ip("2001:db8:1:2::3")).unwrap_err();
        assert!(e.contains("network 2001:db8:1:2::/64"), "{e}");
        l.admit(ip("2001:db8:1:3::1")).unwrap();
    }

    #[test]
    fn the_pools_are_separate() {
        let limits = Limits {
            max_connections: 1,
            max_tcp_connections: 1,
            ..Limits::default()
        };
        let (local, tcp) = (Limiter::local(&limits), Limiter::tcp(&limits));
        let _t = tcp.admit(Peer::Addr("127.0.0.1".parse().unwrap())).unwrap();
        let e = tcp
            .admit(Peer::Addr("198.51.100.1".parse().unwrap()))
            .unwrap_err();
        assert!(
            e.contains("open TCP connections, its limit (limits.max_tcp_connections)"),
            "{e}"
        );
        local.admit(Peer::Uid(1000)).unwrap();
    }
}
