//! Connection tracking: every accepted socket is wrapped in a [`Conn`] that tells the session
//! registry when it closes, so a session whose client is gone can be ended after the grace
//! period.
//!
//! [`Conn`] is the IO type tonic serves; its [`ConnInfo`] (an id, the peer's uid and pid on a
//! Unix socket or its address over TCP, the identity its transport proves, and the local user
//! on the other end when there is one) is in every request's extensions. On the Unix socket
//! the identity is `uid:<n>` with the groups of `SO_PEERCRED`'s gid and the supplementary
//! groups the peer process had when it connected (`SO_PEERGROUPS`, read at accept through
//! `npu_fd::peer`); over TCP from this host it is the same `uid:<n>` (see `auth::local`); over
//! mTLS it is the client certificate's name; otherwise anonymous.
//!
//! It holds the connection's [`Slot`] in the connection limits, and closes the connection (a
//! read fails with `TimedOut`, which ends hyper's connection task) when the peer sends no
//! bytes for `limits.idle_timeout_ms`, or has not sent the 24-byte HTTP/2 client preface
//! within `limits.handshake_timeout_ms`. Bytes of any HTTP/2 frame count, PINGs included, so a
//! client that keeps an idle channel open with HTTP/2 keepalive pings keeps it, as long as it
//! uses it: a connection that has had no session attached and no call open for
//! `limits.idle_connection_ms` is closed too (PINGs or not), so that peers that never open a
//! session cannot hold a connection pool. [`CountCalls`], a tower layer beside the server,
//! counts each connection's open calls. A refused connection ([`ConnInfo::refused`]) is closed
//! [`REFUSED_LIFETIME`] after it was accepted, whatever it sends. A connection a full pool
//! evicts (`accept`) is closed at once: its pending read fails. The pools learn what a
//! connection is doing (no session or call, a call, a session) from [`ConnUse`].
//!
//! A connection reads at most [`READ_TURN`] bytes in a row: then it yields, and reads on only
//! after the runtime has looked for other connections' events, so that one caller streaming a
//! large message does not hold the I/O thread for as long as its flow-control windows allow.

use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::transport::server::Connected;

use crate::accept::{Accepted, Admission, REFUSED_LIFETIME, Slot, Usage, Use};
use crate::auth::{Identity, LocalUser};
use crate::peer::{CallGuard, Calls, ConnInfo};
use crate::sessions::Sessions;

/// Length of the HTTP/2 client connection preface (`PRI * HTTP/2.0...`).
const PREFACE_LEN: usize = 24;

/// How long a connection may take to start, stay silent after, and stay without a session
/// or a call.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub handshake: Duration,
    pub idle: Duration,
    pub unused: Duration,
}

/// What a gRPC connection is doing, as the pools ask it when one is full.
#[derive(Debug)]
pub struct ConnUse {
    id: u64,
    calls: Arc<Calls>,
    sessions: Arc<Sessions>,
}

impl Usage for ConnUse {
    fn usage(&self) -> Use {
        if self.sessions.has_connection(self.id) {
            Use::Attached
        } else if self.calls.open() > 0 {
            Use::Busy
        } else {
            Use::Unused
        }
    }
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
    /// Completes when a pool evicted the connection (`None` for a refused one); polled when a
    /// read would wait, so a connection whose bytes keep coming is closed at its next pause.
    evicted: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    /// Fires when the connection may have been without a session or a call for
    /// `limits.idle_connection_ms`.
    unused_deadline: Pin<Box<Sleep>>,
    unused: Duration,
    /// When the HTTP/2 preface was complete.
    started: Instant,
    /// Bytes read since the connection last waited or yielded.
    turn: usize,
    /// The connection's yield once it read [`READ_TURN`] bytes in a row: the next read waits
    /// for it.
    yielding: Option<Yield>,
}

/// A pending `tokio::task::yield_now`.
struct Yield(Pin<Box<dyn Future<Output = ()> + Send>>);

impl std::fmt::Debug for Yield {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Yield")
    }
}

// Tuned: `npu_fd::latency` says why it has its value and what measured it.
const READ_TURN: usize = npu_fd::latency::CONN_READ_TURN;

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

impl Conn {
    /// Wraps an accepted stream, reading the peer's credentials on a Unix socket; `local` is
    /// the local user on the other end of a TCP connection from this host (`auth::local`).
    pub fn new(
        accepted: Accepted,
        admission: Admission,
        sessions: Arc<Sessions>,
        t: Timeouts,
        local: Option<LocalUser>,
    ) -> Self {
        let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let calls = Arc::new(Calls::new(now));
        let local = local.map(|u| Identity::uid(u.uid, u.gids));
        let (stream, mut info) = match accepted {
            Accepted::Unix(s) => {
                let cred = s.peer_cred().ok();
                // A Unix peer whose credentials cannot be read is still local; it gets
                // u32::MAX, which is no real user's uid, so it can use no other user's session.
                let uid = cred.map_or(u32::MAX, |c| c.uid());
                let pid = cred.and_then(|c| c.pid());
                let supplementary = npu_fd::peer::groups(s.as_fd()).unwrap_or_else(|e| {
                    tracing::debug!(conn = id, error = %e, "SO_PEERGROUPS failed; no supplementary groups");
                    Vec::new()
                });
                let gids = cred.map(|c| c.gid()).into_iter().chain(supplementary);
                let identity = Identity::uid(uid, gids);
                let info = ConnInfo {
                    id,
                    uid: Some(uid),
                    pid,
                    addr: None,
                    local: Some(identity.clone()),
                    identity,
                    calls,
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
                    identity: local
                        .clone()
                        .unwrap_or_else(|| Identity::anonymous(addr.map(|a| a.ip()))),
                    local,
                    calls,
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
                    .map(|(kind, name)| Identity::cert(kind, &name))
                    .or_else(|| local.clone())
                    .unwrap_or_else(|| Identity::anonymous(addr.map(|a| a.ip())));
                let info = ConnInfo {
                    id,
                    uid: None,
                    pid: None,
                    addr,
                    identity,
                    local,
                    calls,
                    refused: None,
                };
                (Stream::Tls(s), info)
            }
        };
        tracing::debug!(
            conn = id,
            identity = %info.identity,
            local = ?info.local.as_ref().map(ToString::to_string),
            peer = ?info.addr,
            uid = ?info.uid,
            "connection accepted"
        );
        let (slot, preauth, refusing, first, fixed) = match admission {
            Admission::Admitted { slot, preauth, .. } => {
                slot.track(Arc::new(ConnUse {
                    id,
                    calls: info.calls.clone(),
                    sessions: sessions.clone(),
                }));
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
        let evicted = slot
            .as_ref()
            .map(|s| Box::pin(s.evicted().cancelled_owned()));
        Self {
            stream,
            info,
            sessions,
            evicted,
            _slot: slot,
            preauth,
            _refusing: refusing,
            deadline: Box::pin(tokio::time::sleep_until(now + first)),
            last_read: now,
            preface_left: PREFACE_LEN,
            idle: t.idle,
            fixed,
            unused_deadline: Box::pin(tokio::time::sleep_until(now + t.unused)),
            unused: t.unused,
            started: now,
            turn: 0,
            yielding: None,
        }
    }

    /// Whether the connection has been without a session and a call for
    /// `limits.idle_connection_ms`; re-arms the timer otherwise.
    fn poll_unused(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.unused_deadline.as_mut().poll(cx).is_pending() {
                return false;
            }
            let now = Instant::now();
            if self.info.calls.open() > 0 || self.sessions.has_connection(self.info.id) {
                self.unused_deadline.as_mut().reset(now + self.unused);
                continue;
            }
            let due = self.started.max(self.info.calls.last_ended()) + self.unused;
            if due <= now {
                return true;
            }
            self.unused_deadline.as_mut().reset(due);
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
        // A connection whose bytes keep coming reads a turn's worth, then lets the I/O thread
        // look for other connections' events and serve them before it reads on.
        if let Some(y) = this.yielding.as_mut() {
            ready!(y.0.as_mut().poll(cx));
            this.yielding = None;
            this.turn = 0;
        }
        let before = buf.filled().len();
        let r = match &mut this.stream {
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        };
        if r.is_pending() {
            // It waits for its peer: its next bytes start a new turn.
            this.turn = 0;
        }
        match r {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                this.turn += n;
                if this.turn >= READ_TURN {
                    // `yield_now` wakes the task only after the runtime has polled for I/O.
                    this.yielding = Some(Yield(Box::pin(tokio::task::yield_now())));
                }
                if n > 0 {
                    this.last_read = Instant::now();
                    if this.preface_left > 0 {
                        this.preface_left = this.preface_left.saturating_sub(n);
                        if this.preface_left == 0 && !this.fixed {
                            // Past the preface: out of the pre-authentication pool, and the
                            // handshake deadline no longer applies.
                            this.preauth = None;
                            this.deadline.as_mut().reset(this.last_read + this.idle);
                            this.started = this.last_read;
                            this.unused_deadline
                                .as_mut()
                                .reset(this.started + this.unused);
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending
                if this
                    .evicted
                    .as_mut()
                    .is_some_and(|w| w.as_mut().poll(cx).is_ready()) =>
            {
                Poll::Ready(Err(evicted(this.info.id)))
            }
            Poll::Pending if !this.fixed && this.preface_left == 0 && this.poll_unused(cx) => {
                let what = "no session and no call for limits.idle_connection_ms";
                tracing::debug!(conn = this.info.id, "{what}");
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
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

/// The read error of a connection a full pool evicted.
fn evicted(conn: u64) -> io::Error {
    let what = "evicted: a connection pool was full, and this connection's user or network \
                held the most";
    tracing::debug!(conn, "{what}");
    io::Error::new(io::ErrorKind::ConnectionAborted, what)
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

/// A tower layer that counts each connection's open calls ([`ConnInfo::calls`]): a call is
/// open from its request until both its request and its response bodies are gone.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountCalls;

impl<S> tower_layer::Layer<S> for CountCalls {
    type Service = CountCallsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountCallsService { inner }
    }
}

/// [`CountCalls`] around a service.
#[derive(Debug, Clone)]
pub struct CountCallsService<S> {
    inner: S,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, R> tower_service::Service<http::Request<tonic::body::Body>> for CountCallsService<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>, Response = http::Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    R::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let guard = req
            .extensions()
            .get::<ConnInfo>()
            .map(|c| Arc::new(c.calls.enter()));
        let req = req.map(|b| {
            tonic::body::Body::new(Counted {
                inner: b,
                _guard: guard.clone(),
            })
        });
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let resp = inner.call(req).await?;
            Ok(resp.map(|b| {
                tonic::body::Body::new(Counted {
                    inner: b,
                    _guard: guard,
                })
            }))
        })
    }
}

/// A body that keeps its call counted while it lives.
struct Counted<B> {
    inner: B,
    _guard: Option<Arc<CallGuard>>,
}

impl<B> http_body::Body for Counted<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accept::{Limiter, Peer};
    use crate::config::Limits;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A Unix connection, admitted, and its peer.
    fn connected() -> (Conn, tokio::net::UnixStream) {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let limiter = Limiter::local(&Limits::default());
        let slot = limiter.admit(Peer::Uid(0), &Arc::default()).unwrap();
        let admission = Admission::Admitted {
            slot,
            preauth: None,
            local_uid: None,
        };
        let timeouts = Timeouts {
            handshake: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            unused: Duration::from_secs(60),
        };
        let sessions = Arc::new(Sessions::new(Duration::from_secs(1), 8));
        let conn = Conn::new(Accepted::Unix(ours), admission, sessions, timeouts, None);
        (conn, theirs)
    }

    #[tokio::test]
    async fn a_connection_whose_bytes_keep_coming_yields_after_a_turn_and_then_reads_on() {
        let (mut conn, mut peer) = connected();
        let sent = 4 * READ_TURN;
        let writer = tokio::spawn(async move {
            peer.write_all(&vec![7u8; sent]).await.unwrap();
            peer
        });
        // Reads in one poll, as a connection task does, until the connection says to wait.
        let mut got = 0;
        let mut turns = Vec::new();
        let mut buf = vec![0u8; 16 << 10];
        while got < sent {
            let in_turn = std::future::poll_fn(|cx| {
                let mut n = 0;
                loop {
                    let mut rb = ReadBuf::new(&mut buf);
                    match Pin::new(&mut conn).poll_read(cx, &mut rb) {
                        Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(n),
                        Poll::Ready(Ok(())) => n += rb.filled().len(),
                        Poll::Ready(Err(e)) => panic!("{e}"),
                        Poll::Pending if n > 0 => return Poll::Ready(n),
                        Poll::Pending => return Poll::Pending,
                    }
                }
            })
            .await;
            got += in_turn;
            turns.push(in_turn);
        }
        assert_eq!(got, sent);
        // No turn reads more than a turn's worth and one more read.
        assert!(
            turns.iter().all(|&n| n < READ_TURN + buf.len()),
            "{turns:?}"
        );
        // The bytes after a yield are read, and the connection still works both ways.
        let mut peer = writer.await.unwrap();
        conn.write_all(b"ok").await.unwrap();
        let mut back = [0u8; 2];
        peer.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ok");
    }
}
