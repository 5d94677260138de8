//! Connection tracking: every accepted socket is wrapped in a [`Conn`] that tells the session
//! registry when it closes, so a session whose client is gone can be ended after the grace
//! period.
//!
//! [`Conn`] is the IO type tonic serves; its [`ConnInfo`] (an id, the peer's uid and pid on a
//! Unix socket or its address over TCP, and the identity its transport proves) is in every
//! request's extensions. On the Unix socket the identity is `uid:<n>` with the groups of
//! `SO_PEERCRED`'s gid and the supplementary groups the peer process had when it connected
//! (read from `/proc/<pid>/status`: neither rustix nor nix offers `SO_PEERGROUPS`, and this
//! crate has no unsafe code); over mTLS it is the client certificate's subject; otherwise
//! anonymous. It holds the
//! connection's [`Slot`] in the connection limits, and closes the connection (a read fails
//! with `TimedOut`, which ends hyper's connection task) when the peer sends no bytes for
//! `limits.idle_timeout_ms`, or has not sent the 24-byte HTTP/2 client preface within
//! `limits.handshake_timeout_ms`. Bytes of any HTTP/2 frame count, PINGs included, so a client
//! that keeps an idle channel open with HTTP/2 keepalive pings keeps it. A refused connection
//! ([`ConnInfo::refused`]) is closed [`REFUSED_LIFETIME`] after it was accepted, whatever it
//! sends.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use crate::accept::{Accepted, Admission, REFUSED_LIFETIME, Slot};
use crate::auth::Identity;
use crate::sessions::Sessions;

/// Length of the HTTP/2 client connection preface (`PRI * HTTP/2.0...`).
const PREFACE_LEN: usize = 24;

/// How long a connection may take to start, and stay silent after.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub handshake: Duration,
    pub idle: Duration,
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Unique for the life of the daemon.
    pub id: u64,
    /// The peer's uid (`SO_PEERCRED`), on a Unix socket.
    pub uid: Option<u32>,
    /// The peer's pid, on a Unix socket.
    pub pid: Option<i32>,
    /// The peer's address, over TCP.
    pub addr: Option<SocketAddr>,
    /// Who the transport says the peer is (a call's `x-npud-token` may replace it).
    pub identity: Identity,
    /// Set when the connection was accepted only to be refused: why (naming the limit or the
    /// cause). Every request on it is answered RESOURCE_EXHAUSTED with this message.
    pub refused: Option<Arc<str>>,
}

#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// An accepted connection that reports its close to the session registry.
#[derive(Debug)]
pub struct Conn {
    stream: Stream,
    info: ConnInfo,
    sessions: Arc<Sessions>,
    _slot: Option<Slot>,
    /// The connection's place in the pre-authentication pool (TCP), given back when the
    /// HTTP/2 preface is complete.
    preauth: Option<Slot>,
    _refusing: Option<crate::accept::RefusingGuard>,
    /// Fires at the handshake deadline, then (re-armed lazily) at the idle deadline.
    deadline: Pin<Box<Sleep>>,
    last_read: Instant,
    preface_left: usize,
    idle: Duration,
    /// A refused connection: the deadline is never extended.
    fixed: bool,
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

impl Conn {
    /// Wraps an accepted stream, reading the peer's credentials on a Unix socket.
    pub fn new(
        accepted: Accepted,
        admission: Admission,
        sessions: Arc<Sessions>,
        t: Timeouts,
    ) -> Self {
        let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        let (stream, mut info) = match accepted {
            Accepted::Unix(s) => {
                let cred = s.peer_cred().ok();
                // A Unix peer whose credentials cannot be read is still local; it gets
                // u32::MAX, which is no real user's uid, so it can use no other user's session.
                let uid = cred.map_or(u32::MAX, |c| c.uid());
                let pid = cred.and_then(|c| c.pid());
                let gids = cred
                    .map(|c| c.gid())
                    .into_iter()
                    .chain(pid.map(supplementary_groups).unwrap_or_default());
                let info = ConnInfo {
                    id,
                    uid: Some(uid),
                    pid,
                    addr: None,
                    identity: Identity::uid(uid, gids),
                    refused: None,
                };
                (Stream::Unix(s), info)
            }
            Accepted::Tcp(s) => {
                let _ = s.set_nodelay(true);
                let addr = s.peer_addr().ok();
                let info = ConnInfo {
                    id,
                    uid: None,
                    pid: None,
                    addr,
                    identity: Identity::anonymous(addr.map(|a| a.ip())),
                    refused: None,
                };
                (Stream::Tcp(s), info)
            }
            Accepted::Tls(s) => {
                let (tcp, session) = s.get_ref();
                let _ = tcp.set_nodelay(true);
                let addr = tcp.peer_addr().ok();
                let identity = session
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| crate::tls::certificate_subject(c))
                    .map_or_else(
                        || Identity::anonymous(addr.map(|a| a.ip())),
                        |(kind, name)| Identity::cert(kind, &name),
                    );
                let info = ConnInfo {
                    id,
                    uid: None,
                    pid: None,
                    addr,
                    identity,
                    refused: None,
                };
                (Stream::Tls(s), info)
            }
        };
        let now = Instant::now();
        let (slot, preauth, refusing, first, fixed) = match admission {
            Admission::Admitted { slot, preauth } => {
                (Some(slot), preauth, None, t.handshake, false)
            }
            Admission::Refused { why, _guard } => {
                info.refused = Some(why);
                (
                    None,
                    None,
                    Some(_guard),
                    REFUSED_LIFETIME.min(t.handshake.max(Duration::from_millis(1))),
                    true,
                )
            }
        };
        Self {
            stream,
            info,
            sessions,
            _slot: slot,
            preauth,
            _refusing: refusing,
            deadline: Box::pin(tokio::time::sleep_until(now + first)),
            last_read: now,
            preface_left: PREFACE_LEN,
            idle: t.idle,
            fixed,
        }
    }

    /// Whether the connection has been silent too long; re-arms the timer when a read
    /// since it was set moved the deadline.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return false;
            }
            if self.fixed || self.preface_left > 0 {
                return true;
            }
            let due = self.last_read + self.idle;
            if due <= Instant::now() {
                return true;
            }
            self.deadline.as_mut().reset(due);
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        tracing::debug!(conn = self.info.id, "connection closed");
        self.sessions.connection_closed(self.info.id);
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = match &mut this.stream {
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        };
        match r {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    this.last_read = Instant::now();
                    if this.preface_left > 0 {
                        this.preface_left = this.preface_left.saturating_sub(n);
                        if this.preface_left == 0 && !this.fixed {
                            // Past the preface: out of the pre-authentication pool, and the
                            // handshake deadline no longer applies.
                            this.preauth = None;
                            this.deadline.as_mut().reset(this.last_read + this.idle);
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.poll_expired(cx) => {
                let what = if this.fixed {
                    "refused connection closed"
                } else if this.preface_left > 0 {
                    "no HTTP/2 handshake within limits.handshake_timeout_ms"
                } else {
                    "idle past limits.idle_timeout_ms"
                };
                tracing::debug!(conn = this.info.id, "{what}");
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Unix(s) => s.is_write_vectored(),
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The supplementary groups of process `pid` (the `Groups:` line of `/proc/<pid>/status`);
/// empty when it cannot be read.
fn supplementary_groups(pid: i32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Groups:").map(|g| {
                    g.split_whitespace()
                        .filter_map(|n| n.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}
