//! Connection tracking: every accepted socket is wrapped in a [`Conn`] that tells the session
//! registry when it closes, so a session whose client is gone can be ended after the grace
//! period.
//!
//! [`Conn`] is the IO type tonic serves; its [`ConnInfo`] (an id, and the peer's uid and pid on
//! a Unix socket or its address over TCP) is in every request's extensions.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tonic::transport::server::Connected;

use crate::sessions::Sessions;

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
}

#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// An accepted connection that reports its close to the session registry.
#[derive(Debug)]
pub struct Conn {
    stream: Stream,
    info: ConnInfo,
    sessions: Arc<Sessions>,
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

impl Conn {
    /// Wraps an accepted Unix stream, reading the peer's credentials.
    pub fn unix(s: UnixStream, sessions: Arc<Sessions>) -> Self {
        let cred = s.peer_cred().ok();
        // A Unix peer whose credentials cannot be read is still local; it gets u32::MAX, which
        // is no real user's uid, so it can use no other user's session.
        let info = ConnInfo {
            id: NEXT_CONN.fetch_add(1, Ordering::Relaxed),
            uid: Some(cred.map_or(u32::MAX, |c| c.uid())),
            pid: cred.and_then(|c| c.pid()),
            addr: None,
        };
        Self {
            stream: Stream::Unix(s),
            info,
            sessions,
        }
    }

    /// Wraps an accepted TCP stream.
    pub fn tcp(s: TcpStream, sessions: Arc<Sessions>) -> Self {
        let _ = s.set_nodelay(true);
        let info = ConnInfo {
            id: NEXT_CONN.fetch_add(1, Ordering::Relaxed),
            uid: None,
            pid: None,
            addr: s.peer_addr().ok(),
        };
        Self {
            stream: Stream::Tcp(s),
            info,
            sessions,
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
        match &mut self.get_mut().stream {
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
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
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
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
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Unix(s) => s.is_write_vectored(),
            Stream::Tcp(s) => s.is_write_vectored(),
        }
    }
}
