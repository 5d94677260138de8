//! A connection pool: a total, a share per key (a uid, or a network prefix), and fair eviction
//! when the total is reached (the policy is in `accept`'s module docs).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use tokio_util::sync::CancellationToken;

use crate::config::Limits;

/// Most refused connections held open at once per pool, to be told why.
pub const MAX_REFUSING: u32 = 16;

/// Who a connection comes from, for the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A local user, on a Unix socket (`SO_PEERCRED`; `u32::MAX` when unreadable).
    Uid(u32),
    /// A local user over TCP from this host, as the kernel's socket table names it
    /// (`auth::local`), and its address.
    LocalTcp { uid: u32, addr: IpAddr },
    /// Any other TCP peer's address.
    Addr(IpAddr),
}

impl Peer {
    /// What the share per key counts: a uid (a local user on either transport), or a TCP
    /// peer's network prefix.
    fn key(self) -> Key {
        match self {
            Peer::Uid(uid) | Peer::LocalTcp { uid, .. } => Key::Uid(uid),
            Peer::Addr(a) => Key::Prefix(Prefix::of(a)),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Uid(u) => write!(f, "uid {u}"),
            Peer::LocalTcp { uid, addr } => write!(f, "uid {uid} (over TCP from {addr})"),
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

/// What a pool's share counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Uid(u32),
    Prefix(Prefix),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Uid(u) => write!(f, "uid {u}"),
            Key::Prefix(p) => write!(f, "network {p}"),
        }
    }
}

/// What an admitted connection is doing, from the cheapest to end to the dearest: a full pool
/// evicts the lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Use {
    /// Connected, no session and no call (or not past its handshake yet).
    Unused = 0,
    /// A call is open, on no session.
    Busy = 1,
    /// A session is attached (it outlives the connection for the grace period).
    Attached = 2,
    /// Never evicted: a dispatch ring's lifeline, whose number the session limits bound.
    Pinned = 3,
}

impl Use {
    fn from_u8(n: u8) -> Self {
        match n {
            0 => Use::Unused,
            1 => Use::Busy,
            2 => Use::Attached,
            _ => Use::Pinned,
        }
    }
}

/// Tells a pool what an admitted connection is doing (asked only when a full pool looks for a
/// connection to evict).
pub trait Usage: Send + Sync + std::fmt::Debug {
    fn usage(&self) -> Use;
}

/// One connection's state the pools share: the token that ends it when a pool evicts it, and
/// what it is doing.
#[derive(Debug, Default)]
pub struct Shared {
    evicted: CancellationToken,
    marked: AtomicU8,
    probe: OnceLock<Arc<dyn Usage>>,
}

impl Shared {
    fn usage(&self) -> Use {
        let marked = Use::from_u8(self.marked.load(Ordering::Acquire));
        self.probe.get().map_or(marked, |p| p.usage().max(marked))
    }
}

/// A pool's limits and the configuration keys that set them, for messages.
#[derive(Debug, Clone, Copy)]
struct PoolLimits {
    what: &'static str,
    max_total: u32,
    total_key: &'static str,
    max_per_key: u32,
    per_key_key: &'static str,
}

#[derive(Debug)]
struct Held {
    key: Key,
    conn: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Counts {
    total: u32,
    per_key: HashMap<Key, u32>,
    /// Every admitted connection, oldest first.
    held: BTreeMap<u64, Held>,
    next: u64,
}

impl Counts {
    fn remove(&mut self, id: u64) -> Option<Held> {
        let h = self.held.remove(&id)?;
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_key.get_mut(&h.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_key.remove(&h.key);
            }
        }
        Some(h)
    }

    /// The connection to evict so that a connection of `key`, which holds `mine`, can come
    /// in: of the keys that hold at least two more than `mine`, the one holding the most; of
    /// its connections, the least used (never a pinned one), the oldest of those. `None` when
    /// no key holds two more, so that an eviction never leaves its victim with fewer than the
    /// newcomer (and two keys cannot evict each other back and forth).
    fn victim(&self, key: Key, mine: u32) -> Option<(u64, Key, u32, Use)> {
        let mut keys: Vec<(Key, u32)> = self
            .per_key
            .iter()
            .filter(|(k, n)| **k != key && **n >= mine.saturating_add(2))
            .map(|(k, n)| (*k, *n))
            .collect();
        keys.sort_unstable_by_key(|k| std::cmp::Reverse(k.1));
        keys.into_iter().find_map(|(k, n)| {
            self.held
                .iter()
                .filter(|(_, h)| h.key == k)
                .map(|(id, h)| (h.conn.usage(), *id))
                .filter(|(u, _)| *u < Use::Pinned)
                .min()
                .map(|(u, id)| (id, k, n, u))
        })
    }
}

/// One pool's connections.
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
            max_per_key: limits.max_connections_per_peer,
            per_key_key: "limits.max_connections_per_peer",
        })
    }

    /// The TCP listener's pool.
    pub fn tcp(limits: &Limits) -> Arc<Self> {
        Self::with(PoolLimits {
            what: "TCP",
            max_total: limits.max_tcp_connections,
            total_key: "limits.max_tcp_connections",
            max_per_key: limits.max_tcp_connections_per_prefix,
            per_key_key: "limits.max_tcp_connections_per_prefix",
        })
    }

    /// The pre-authentication pool: TCP connections that have not finished their TLS
    /// handshake and HTTP/2 preface.
    pub fn preauth(limits: &Limits) -> Arc<Self> {
        Self::with(PoolLimits {
            what: "pre-authentication",
            max_total: limits.max_preauth_connections,
            total_key: "limits.max_preauth_connections",
            max_per_key: limits.max_preauth_connections_per_prefix,
            per_key_key: "limits.max_preauth_connections_per_prefix",
        })
    }

    /// What the pool is called in messages.
    pub fn what(&self) -> &'static str {
        self.limits.what
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        // Each update is a few counter changes under the lock; a panic cannot leave them half
        // done.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for connection `conn` from `peer`, or why there is none (naming the limit's
    /// key). At the total, the oldest least-used connection of the key holding the most is
    /// evicted for it (`conn`'s token of that connection is cancelled), if that key holds at
    /// least two more than `peer`'s. Cost: O(1) below the total; at it, O(connections held).
    ///
    /// # Errors
    /// The refusal message when `peer`'s key holds its share, or the pool is full and no key
    /// holds two more than it.
    pub fn admit(self: &Arc<Self>, peer: Peer, conn: &Arc<Shared>) -> Result<Slot, String> {
        let l = self.limits;
        let key = peer.key();
        let mut g = self.lock();
        let mine = g.per_key.get(&key).copied().unwrap_or(0);
        if mine >= l.max_per_key {
            let (whose, per) = match key {
                Key::Uid(_) => (format!("{peer} has"), "local user"),
                Key::Prefix(p) => (format!("network {p} (of {peer}) has"), "network prefix"),
            };
            return Err(format!(
                "{whose} {mine} open {} connections, the limit per {per} ({}); close some (one \
                 channel serves many calls)",
                l.what, l.per_key_key
            ));
        }
        if g.total >= l.max_total {
            let Some((id, victim, held, usage)) = g.victim(key, mine) else {
                return Err(format!(
                    "the daemon has {} open {} connections, its limit ({}), and no user or \
                     network holds two more of them than {key} ({mine}); try again later",
                    g.total, l.what, l.total_key
                ));
            };
            if let Some(h) = g.remove(id) {
                h.conn.evicted.cancel();
            }
            tracing::debug!(
                pool = l.what,
                %victim,
                held,
                ?usage,
                newcomer = %peer,
                "pool full: evicted the oldest least-used connection of the key holding the most"
            );
        }
        let id = g.next;
        g.next += 1;
        g.total += 1;
        *g.per_key.entry(key).or_insert(0) += 1;
        g.held.insert(
            id,
            Held {
                key,
                conn: conn.clone(),
            },
        );
        Ok(Slot {
            limiter: self.clone(),
            id,
            conn: conn.clone(),
        })
    }

    /// Open admitted connections (all, and from `peer`'s uid or network prefix).
    pub fn open(&self, peer: Peer) -> (u32, u32) {
        let g = self.lock();
        (g.total, g.per_key.get(&peer.key()).copied().unwrap_or(0))
    }

    pub(super) fn refusing(self: &Arc<Self>) -> Option<RefusingGuard> {
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

/// An admitted connection's place in a pool, given back on drop (or taken back by an
/// eviction, which cancels [`Slot::evicted`]).
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<Limiter>,
    id: u64,
    conn: Arc<Shared>,
}

impl Slot {
    /// Cancelled when a pool evicted the connection: it should close.
    pub fn evicted(&self) -> CancellationToken {
        self.conn.evicted.clone()
    }

    /// Lets the pools ask `probe` what the connection is doing (once; later calls are ignored).
    pub fn track(&self, probe: Arc<dyn Usage>) {
        let _ = self.conn.probe.set(probe);
    }

    /// Marks the connection as doing at least `usage` from now on.
    pub fn mark(&self, usage: Use) {
        self.conn.marked.fetch_max(usage as u8, Ordering::AcqRel);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limiter.lock().remove(self.id);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Arc<Shared> {
        Arc::default()
    }

    #[test]
    fn limits_in_total_and_per_peer_name_their_keys_and_free_on_drop() {
        let l = Limiter::local(&Limits {
            max_connections: 3,
            max_connections_per_peer: 2,
            ..Limits::default()
        });
        let a = Peer::Uid(1000);
        let b = Peer::Uid(1001);
        let s1 = l.admit(a, &conn()).unwrap();
        let _s2 = l.admit(a, &conn()).unwrap();
        let e = l.admit(a, &conn()).unwrap_err();
        assert!(e.contains("(limits.max_connections_per_peer)"), "{e}");
        assert!(
            e.starts_with("uid 1000 has 2 open local connections, the limit per local user"),
            "{e}"
        );
        let _s3 = l.admit(b, &conn()).unwrap();
        // Full: uid 1001 holds 1, uid 1000 only one more: no eviction.
        let e = l.admit(b, &conn()).unwrap_err();
        assert!(
            e.starts_with(
                "the daemon has 3 open local connections, its limit (limits.max_connections)"
            ),
            "{e}"
        );
        drop(s1);
        assert_eq!(l.open(a), (2, 1));
        l.admit(b, &conn()).unwrap();
    }

    #[test]
    fn tcp_peers_count_by_network_prefix_and_local_users_by_uid() {
        let l = Limiter::tcp(&Limits {
            max_tcp_connections: 100,
            max_tcp_connections_per_prefix: 2,
            ..Limits::default()
        });
        let ip = |s: &str| Peer::Addr(s.parse().unwrap());
        let _a = l.admit(ip("127.0.0.1"), &conn()).unwrap();
        let _b = l.admit(ip("127.0.0.2"), &conn()).unwrap();
        // Another loopback address is the same host.
        let e = l.admit(ip("127.1.2.3"), &conn()).unwrap_err();
        assert!(
            e.starts_with("network loopback (of address 127.1.2.3 (network loopback)) has 2"),
            "{e}"
        );
        assert!(e.contains("(limits.max_tcp_connections_per_prefix)"), "{e}");
        let e = l.admit(ip("::1"), &conn()).unwrap_err();
        assert!(e.contains("network loopback"), "{e}");
        // A local user the kernel named is counted as itself, not as loopback.
        let local = |uid| Peer::LocalTcp {
            uid,
            addr: "127.0.0.1".parse().unwrap(),
        };
        let _u = l.admit(local(1000), &conn()).unwrap();
        let _v = l.admit(local(1000), &conn()).unwrap();
        let e = l.admit(local(1000), &conn()).unwrap_err();
        assert!(
            e.starts_with("uid 1000 (over TCP from 127.0.0.1) has 2 open TCP connections"),
            "{e}"
        );
        l.admit(local(1001), &conn()).unwrap();
        let _c = l.admit(ip("192.0.2.1"), &conn()).unwrap();
        let _d = l.admit(ip("::ffff:192.0.2.200"), &conn()).unwrap();
        let e = l.admit(ip("192.0.2.77"), &conn()).unwrap_err();
        assert!(e.contains("network 192.0.2.0/24"), "{e}");
        l.admit(ip("192.0.3.1"), &conn()).unwrap();
        let _e = l.admit(ip("2001:db8:1:2::1"), &conn()).unwrap();
        let _f = l.admit(ip("2001:db8:1:2:ffff::9"), &conn()).unwrap();
        let e = l.admit(ip("2001:db8:1:2::3"), &conn()).unwrap_err();
        assert!(e.contains("network 2001:db8:1:2::/64"), "{e}");
        l.admit(ip("2001:db8:1:3::1"), &conn()).unwrap();
    }

    #[test]
    fn the_pools_are_separate() {
        let limits = Limits {
            max_connections: 1,
            max_tcp_connections: 1,
            ..Limits::default()
        };
        let (local, tcp) = (Limiter::local(&limits), Limiter::tcp(&limits));
        let _t = tcp
            .admit(Peer::Addr("127.0.0.1".parse().unwrap()), &conn())
            .unwrap();
        let e = tcp
            .admit(Peer::Addr("198.51.100.1".parse().unwrap()), &conn())
            .unwrap_err();
        assert!(
            e.contains("open TCP connections, its limit (limits.max_tcp_connections)"),
            "{e}"
        );
        local.admit(Peer::Uid(1000), &conn()).unwrap();
    }

    #[derive(Debug)]
    struct Fixed(Use);

    impl Usage for Fixed {
        fn usage(&self) -> Use {
            self.0
        }
    }

    /// Issue 36: eight keys holding their whole share filled the pool and refused everyone
    /// else. A key with fewer now gets in by evicting the oldest least-used connection of the
    /// key holding the most.
    #[test]
    fn a_full_pool_evicts_the_least_used_oldest_connection_of_the_biggest_holder() {
        let l = Limiter::local(&Limits {
            max_connections: 8,
            max_connections_per_peer: 4,
            ..Limits::default()
        });
        let mut held = Vec::new();
        // uid 1 holds 4: a session, a call, two unused (the second unused is the newer).
        let uses = [Use::Attached, Use::Unused, Use::Busy, Use::Unused];
        let mut ones = Vec::new();
        for u in uses {
            let c = conn();
            let s = l.admit(Peer::Uid(1), &c).unwrap();
            s.track(Arc::new(Fixed(u)));
            ones.push(c);
            held.push(s);
        }
        // uid 2 holds 3, uid 3 holds 1: the pool is full.
        for _ in 0..3 {
            held.push(l.admit(Peer::Uid(2), &conn()).unwrap());
        }
        held.push(l.admit(Peer::Uid(3), &conn()).unwrap());
        assert_eq!(l.open(Peer::Uid(0)).0, 8);
        // Root holds none: uid 1's oldest unused connection makes way.
        let _root = l.admit(Peer::Uid(0), &conn()).unwrap();
        let cancelled: Vec<bool> = ones.iter().map(|c| c.evicted.is_cancelled()).collect();
        assert_eq!(cancelled, [false, true, false, false]);
        assert_eq!(l.open(Peer::Uid(1)), (8, 3));
        // Next: uid 1 and uid 2 hold 3 each; root's second place comes from one of them.
        let _root2 = l.admit(Peer::Uid(0), &conn()).unwrap();
        assert_eq!(l.open(Peer::Uid(0)), (8, 2));
        // Now the most any key holds is 3; uid 3 (holding 1) still gets in, root (2) not.
        let _three = l.admit(Peer::Uid(3), &conn()).unwrap();
        let e = l.admit(Peer::Uid(0), &conn()).unwrap_err();
        assert!(e.contains("no user or network holds two more"), "{e}");
    }

    #[test]
    fn pinned_connections_are_never_evicted() {
        let l = Limiter::preauth(&Limits {
            max_preauth_connections: 4,
            max_preauth_connections_per_prefix: 4,
            ..Limits::default()
        });
        let ip = |s: &str| Peer::Addr(s.parse().unwrap());
        let mut held = Vec::new();
        for _ in 0..4 {
            let s = l.admit(ip("192.0.2.1"), &conn()).unwrap();
            s.mark(Use::Pinned);
            held.push(s);
        }
        let e = l.admit(ip("198.51.100.1"), &conn()).unwrap_err();
        assert!(e.contains("(limits.max_preauth_connections)"), "{e}");
        held[1]
            .conn
            .marked
            .store(Use::Unused as u8, Ordering::Release);
        let _newcomer = l.admit(ip("198.51.100.1"), &conn()).unwrap();
        assert!(held[1].evicted().is_cancelled());
        // The evicted connection's slot is already given back: dropping it changes nothing.
        drop(held.remove(1));
        assert_eq!(l.open(ip("192.0.2.1")), (4, 3));
    }
}
