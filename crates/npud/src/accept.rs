//! Accepting connections: connection pools per listener, a pre-authentication pool for TCP,
//! shares per local user and per network prefix with fair eviction, and an accept loop that
//! backs off when the process is out of file descriptors instead of spinning.
//!
//! Local and remote callers draw on separate pools, so that no remote peer, authenticated or
//! not, can use up the connections local users need:
//!
//! - the **local pool** serves the gRPC Unix socket and the fd socket: at most
//!   `limits.max_connections` in all, `limits.max_connections_per_peer` from one uid (the
//!   kernel's `SO_PEERCRED`, known at accept);
//! - the **TCP pool** serves the TCP listener: at most `limits.max_tcp_connections`, and
//!   `limits.max_tcp_connections_per_prefix` from one key: a local user (a connection from
//!   this host whose peer socket the kernel names, see `auth::local`) is its own key, its uid,
//!   whatever address of loopback it uses; any other peer counts in its network prefix
//!   ([`Prefix`]: an IPv4 address's /24, an IPv6 address's /64, all of loopback as one for local
//!   callers the kernel names no user for), since one host can hold a whole /24 or /64;
//! - the **pre-authentication pool**: a TCP connection also holds a place here from accept
//!   until it has finished its TLS handshake and sent the HTTP/2 preface, at most
//!   `limits.max_preauth_connections` in all and `limits.max_preauth_connections_per_prefix`
//!   per key (the same keys as the TCP pool), each bounded by `limits.handshake_timeout_ms`. A
//!   connection with no place here is closed at once, unanswered: it has not said anything yet.
//!
//! **No group of peers can refuse another.** A key at its own share is refused (it holds its
//! share). A pool at its total does not refuse a newcomer whose key holds less than the others:
//! it evicts a connection of the key holding the most, if that key holds at least two more than
//! the newcomer's (so an eviction never leaves its victim with fewer than the newcomer, and two
//! keys cannot evict each other back and forth), choosing the least used of that key's
//! connections ([`Use`]: one with no session and no call first, then one with a call open but
//! no session, then one with a session, which outlives its connection for the grace period;
//! never a dispatch ring's lifeline), the oldest of those. The evicted connection is closed at
//! once (its pending read fails; a gRPC client reconnects). So eight uids holding 128 idle
//! Unix connections each do not refuse root or a ninth uid, and 64 silent connections from
//! eight /24s do not refuse a ninth /24: the newcomer takes the place of the oldest idle
//! connection of the biggest holder. A newcomer is refused at the total only when no key holds
//! two more than its own (every key has about the same share), and then told so.
//!
//! A local TCP caller's uid comes from the kernel's socket table (`auth::local`), looked up
//! before the connection is counted: the acceptor waits for the lookup (about 15 µs,
//! one at a time, bounded by `auth::local::LOOKUP_TIMEOUT`), so a local user's silent
//! connections count against its own uid from the start, and eight of them cannot lock every
//! other local user out of loopback TCP. A local connection the kernel names no user for (its
//! peer closed, or the lookup failed) counts in the loopback prefix.
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

mod pool;

use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::auth::local::PeerLookup;
use crate::fds::{fd_exhaustion_message, nofile_limit, out_of_fds};

pub use pool::{Limiter, MAX_REFUSING, Peer, Prefix, RefusingGuard, Shared, Slot, Usage, Use};

/// How long a refused connection is kept open to be told why.
pub const REFUSED_LIFETIME: Duration = Duration::from_secs(2);
/// First sleep after an accept failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Longest sleep between accept attempts while they fail.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What the acceptor decided for a connection.
#[derive(Debug)]
pub enum Admission {
    /// Serve it; the slot is given back when the connection closes. A TCP connection also
    /// holds a place in the pre-authentication pool, given back once it has finished its TLS
    /// handshake and HTTP/2 preface. `local_uid` is the uid of the peer socket of a TCP
    /// connection from this host, as the kernel names it (`auth::local`).
    Admitted {
        slot: Slot,
        preauth: Option<Slot>,
        local_uid: Option<u32>,
    },
    /// Tell it why not (the message names the limit or the cause), then close it.
    Refused {
        why: Arc<str>,
        _guard: RefusingGuard,
    },
}

impl Admission {
    /// Cancelled when a pool evicts the connection to let another key in: it should close.
    /// Never cancelled for a refused connection (it closes within [`REFUSED_LIFETIME`]).
    pub fn evicted(&self) -> tokio_util::sync::CancellationToken {
        match self {
            Admission::Admitted { slot, .. } => slot.evicted(),
            Admission::Refused { .. } => tokio_util::sync::CancellationToken::new(),
        }
    }

    /// Marks the connection as doing at least `usage` from now on (see [`Use`]).
    pub fn mark(&self, usage: Use) {
        if let Admission::Admitted { slot, .. } = self {
            slot.mark(usage);
        }
    }
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
    /// Who the connection is from, with the uid the kernel names for a TCP peer on this host
    /// (`local_uid`).
    fn peer(&self, local_uid: Option<u32>) -> Peer {
        let addr = |a: io::Result<std::net::SocketAddr>| {
            a.map_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |a| a.ip())
        };
        let tcp = |a| match local_uid {
            Some(uid) => Peer::LocalTcp { uid, addr: a },
            None => Peer::Addr(a),
        };
        match self {
            // A Unix peer whose credentials cannot be read gets u32::MAX, no real user's uid.
            Accepted::Unix(s) => Peer::Uid(s.peer_cred().map_or(u32::MAX, |c| c.uid())),
            Accepted::Tls(s) => tcp(addr(s.get_ref().0.peer_addr())),
            Accepted::Tcp(s) => tcp(addr(s.peer_addr())),
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

/// A listener's accept loop state: backoff, the spare descriptor, the current failure episode.
#[derive(Debug)]
pub struct Acceptor {
    listener: Listener,
    what: &'static str,
    limiter: Arc<Limiter>,
    /// The pre-authentication pool, for the TCP listener.
    preauth: Option<Arc<Limiter>>,
    /// Who holds the other end of a TCP connection from this host.
    lookup: PeerLookup,
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
            lookup: PeerLookup::default(),
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
                    // A local TCP caller's uid is its key in the pools from the start.
                    let local_uid = match &s {
                        Accepted::Tcp(t) => self.lookup.uid(t).await,
                        _ => None,
                    };
                    let peer = s.peer(local_uid);
                    let conn = Arc::new(Shared::default());
                    let preauth = match self.preauth.as_ref().map(|p| p.admit(peer, &conn)) {
                        None => None,
                        Some(Ok(slot)) => Some(slot),
                        Some(Err(why)) => {
                            // Not a word from it yet: closed unanswered, costing nothing more.
                            tracing::debug!(listener = self.what, %peer, "{why}; closed");
                            continue;
                        }
                    };
                    match self.limiter.admit(peer, &conn) {
                        Ok(slot) => {
                            return (
                                s,
                                Admission::Admitted {
                                    slot,
                                    preauth,
                                    local_uid,
                                },
                            );
                        }
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
