//! Who is on the other end of a connection, as every layer above the transport sees it: a
//! [`ConnInfo`] in each request's extensions (put there by `conn`), and the connection's open
//! calls ([`Calls`]). Below the transport: sessions, the policy and the error type read it
//! without knowing how connections are accepted or served.
//!
//! Cost: a `ConnInfo` is cloned into each request (an `Arc` and an identity); counting a call
//! is two atomic operations.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::auth::Identity;

/// A connection's open calls, and when the last one ended.
#[derive(Debug)]
pub struct Calls {
    open: AtomicU32,
    born: Instant,
    /// When the last call ended, in ms since `born`.
    ended_ms: AtomicU64,
}

impl Calls {
    /// No call yet; `born` is when the connection was accepted.
    pub fn new(born: Instant) -> Self {
        Self {
            open: AtomicU32::new(0),
            born,
            ended_ms: AtomicU64::new(0),
        }
    }

    /// Counts a call open until the returned guard is dropped.
    pub fn enter(self: &Arc<Self>) -> CallGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        CallGuard(self.clone())
    }

    /// Calls open now.
    pub fn open(&self) -> u32 {
        self.open.load(Ordering::Acquire)
    }

    /// When the last call ended (when the connection was accepted, if none has).
    pub fn last_ended(&self) -> Instant {
        self.born + Duration::from_millis(self.ended_ms.load(Ordering::Acquire))
    }
}

/// One open call of a connection (see [`Calls::enter`]).
#[derive(Debug)]
pub struct CallGuard(Arc<Calls>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.ended_ms.fetch_max(ms, Ordering::AcqRel);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Unique for the life of the daemon.
    pub id: u64,
    /// The peer's uid (`SO_PEERCRED`), on a Unix socket only (fd tickets are issued to it; a
    /// TCP peer on this host is known by [`ConnInfo::local`]).
    pub uid: Option<u32>,
    /// The peer's pid, on a Unix socket.
    pub pid: Option<i32>,
    /// The peer's address, over TCP.
    pub addr: Option<SocketAddr>,
    /// Who the transport says the peer is (a call's `x-npud-token` may replace it).
    pub identity: Identity,
    /// The local user the kernel says is on the other end (the Unix socket's peer, or a TCP
    /// peer on this host), whatever else the connection presents: quotas and the fault
    /// budget count against it too (see `auth`).
    pub local: Option<Identity>,
    /// The connection's open calls (for the idle policy).
    pub calls: Arc<Calls>,
    /// Set when the connection was accepted only to be refused: why (naming the limit or the
    /// cause). Every request on it is answered RESOURCE_EXHAUSTED with this message.
    pub refused: Option<Arc<str>>,
}

impl ConnInfo {
    /// Connection `id` proving `identity` alone: no uid, address or local user, not refused.
    pub fn of(id: u64, identity: Identity) -> Self {
        Self {
            id,
            uid: None,
            pid: None,
            addr: None,
            identity,
            local: None,
            calls: Arc::new(Calls::new(Instant::now())),
            refused: None,
        }
    }
}
