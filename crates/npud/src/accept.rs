//! Accepting connections: limits per peer and in total, and an accept loop that backs off when
//! the process is out of file descriptors instead of spinning.
//!
//! Every listener (the gRPC Unix socket, the optional TCP listener, the fd socket) accepts
//! through an [`Acceptor`], and every connection it admits holds a [`Slot`] of one shared
//! [`Limiter`] until it closes: at most `limits.max_connections` in all, and
//! `limits.max_connections_per_peer` from one peer (a uid on the Unix sockets, an IP address
//! over TCP). A connection over a limit is still accepted, but only to be told why
//! ([`Admission::Refused`]: the gRPC listeners answer its first request with
//! `RESOURCE_EXHAUSTED` naming the key, the fd socket with its `RESOURCE_EXHAUSTED` status),
//! and is closed within [`REFUSED_LIFETIME`]. At most [`MAX_REFUSING`] refused connections are
//! held at once; past that they are closed unanswered.
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
use std::net::IpAddr;
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

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Uid(u) => write!(f, "uid {u}"),
            Peer::Addr(a) => write!(f, "address {a}"),
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: u32,
    per_peer: HashMap<Peer, u32>,
}

/// Connection counts shared by every listener.
#[derive(Debug)]
pub struct Limiter {
    max_total: u32,
    max_per_peer: u32,
    counts: Mutex<Counts>,
    refusing: AtomicU32,
}

impl Limiter {
    pub fn new(limits: &Limits) -> Arc<Self> {
        Arc::new(Self {
            max_total: limits.max_connections,
            max_per_peer: limits.max_connections_per_peer,
            counts: Mutex::new(Counts::default()),
            refusing: AtomicU32::new(0),
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
        let mut g = self.lock();
        if g.total >= self.max_total {
            return Err(format!(
                "the daemon has {} open connections, its limit (limits.max_connections); try \
                 again later",
                g.total
            ));
        }
        let mine = g.per_peer.get(&peer).copied().unwrap_or(0);
        if mine >= self.max_per_peer {
            return Err(format!(
                "{peer} has {mine} open connections, the limit per peer \
                 (limits.max_connections_per_peer); close some (one channel serves many calls)"
            ));
        }
        g.total += 1;
        *g.per_peer.entry(peer).or_insert(0) += 1;
        Ok(Slot {
            limiter: self.clone(),
            peer,
        })
    }

    /// Open admitted connections (all, and from `peer`).
    pub fn open(&self, peer: Peer) -> (u32, u32) {
        let g = self.lock();
        (g.total, g.per_peer.get(&peer).copied().unwrap_or(0))
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

/// An admitted connection's place in the counts, given back on drop.
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<Limiter>,
    peer: Peer,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut g = self.limiter.lock();
        g.total = g.total.saturating_sub(1);
        if let Some(n) = g.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.per_peer.remove(&self.peer);
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
    /// Serve it; the slot is given back when the connection closes.
    Admitted(Slot),
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
            spare: File::open("/dev/null").ok(),
            backoff: FIRST_BACKOFF,
            episode: None,
        }
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
                    match self.limiter.admit(peer) {
                        Ok(slot) => return (s, Admission::Admitted(slot)),
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
        let l = Limiter::new(&Limits {
            max_connections: 3,
            max_connections_per_peer: 2,
            ..Limits::default()
        });
        let a = Peer::Uid(1000);
        let b = Peer::Uid(1001);
        let s1 = l.admit(a).unwrap();
        let _s2 = l.admit(a).unwrap();
        let e = l.admit(a).unwrap_err();
        assert!(e.contains("limits.max_connections_per_peer"), "{e}");
        assert!(e.starts_with("uid 1000 has 2 open connections"), "{e}");
        let _s3 = l.admit(b).unwrap();
        let e = l.admit(b).unwrap_err();
        assert!(e.contains("(limits.max_connections)"), "{e}");
        drop(s1);
        assert_eq!(l.open(a), (2, 1));
        l.admit(b).unwrap();
    }
}
