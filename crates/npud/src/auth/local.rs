//! Local users over TCP: who holds the other end of a TCP connection that comes from this host,
//! and whether that user may use the daemon's Unix socket.
//!
//! A TCP connection from this host (from loopback, or from an address of this host to itself)
//! has both of its ends in the kernel's socket table. The daemon asks the kernel for exactly
//! those two sockets by their 4-tuples (`NETLINK_SOCK_DIAG`, see [`sock_diag`]): first its own
//! accepted socket, by its tuple and its `SO_COOKIE`, which proves that the table asked is the
//! one the connection lives in (a listener passed in from another network namespace is not
//! looked up in the wrong one); then the peer's, by the reversed tuple. The peer is named only
//! if that socket is ESTABLISHED and has a socket file (a nonzero inode): its `uid` is the user
//! who created it. So a local TCP caller is `uid:<n>` exactly as on the Unix socket, with the
//! same quotas and fault budget, rather than one shared `anonymous`.
//!
//! Anything else is no uid: a peer that closed before the lookup (its socket is in FIN_WAIT or
//! TIME_WAIT, which the kernel reports with uid 0 and no inode, or gone), a socket listening
//! on the peer's port after it left, an unanswered or failed lookup. The connection is then
//! `anonymous`, which the default policy refuses; a caller that closes its end at once has
//! nothing to read an answer from anyway.
//!
//! The Unix socket's mode and group decide which local users may connect to it (the kernel
//! checks them at `connect`); a local TCP caller is held to the same test ([`SocketAccess`]),
//! with its groups read from `/etc/passwd` and `/etc/group`, since the kernel gives no
//! supplementary groups for a TCP peer. A local user who could not connect to the Unix socket
//! is not identified by its uid over TCP either: it is `anonymous`.
//!
//! Cost: a lookup is two netlink round trips answered from the kernel's connection hash, whose
//! cost does not grow with the socket table (about 15 µs for both in a debug build, measured
//! with an empty table and with 60,000 TIME_WAIT sockets in it), run on a blocking thread, one
//! at a time per listener, bounded by [`LOOKUP_TIMEOUT`]; the acceptor waits for it before
//! it counts the connection against a pool (`accept`), so the uid is the connection's pool key
//! from its first byte. Reading the user's groups reads `/etc/passwd` and `/etc/group`, at most
//! [`MAX_DB_BYTES`] of each, in a blocking task bounded by [`LOOKUP_TIMEOUT`], after the
//! connection has its place.

use std::fs::File;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::sock_diag::{Answer, Diag, DiagError, TcpState, Tuple};

/// Most bytes of `/etc/passwd` or `/etc/group` read per lookup.
pub const MAX_DB_BYTES: u64 = 4 << 20;
/// How long one lookup (of the peer's socket, or of its user's groups) may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

/// Who may connect to the gRPC Unix socket: its owner, group and mode bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    pub owner: u32,
    pub group: u32,
    pub mode: u32,
}

impl SocketAccess {
    /// The access of the socket file at `path`; when it cannot be read, only its owner (the
    /// daemon's uid, `daemon_uid`) and root.
    pub fn of_socket(path: &Path, daemon_uid: u32) -> Self {
        std::fs::metadata(path).map_or(
            Self {
                owner: daemon_uid,
                group: u32::MAX,
                mode: 0o600,
            },
            |m| Self {
                owner: m.uid(),
                group: m.gid(),
                mode: m.mode() & 0o777,
            },
        )
    }

    /// Whether user `uid` with groups `gids` could open the socket for writing (which
    /// `connect` needs), as the kernel decides it: root always; the owner by the owner's
    /// bits; a member of the group by the group's; anyone else by the others' bits.
    pub fn permits(&self, uid: u32, gids: &[u32]) -> bool {
        if uid == 0 {
            return true;
        }
        if uid == self.owner {
            return self.mode & 0o200 != 0;
        }
        if gids.contains(&self.group) {
            return self.mode & 0o020 != 0;
        }
        self.mode & 0o002 != 0
    }
}

/// A local TCP caller: its uid and groups (primary first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalUser {
    pub uid: u32,
    pub gids: Vec<u32>,
}

/// Whether a TCP connection whose ends are `peer` and `local` may come from this host (from
/// loopback, or from the address it came to), so that it is worth a lookup.
pub fn maybe_local(peer: SocketAddr, local: SocketAddr) -> bool {
    let p = peer.ip().to_canonical();
    p.is_loopback() || p == local.ip().to_canonical()
}

/// The daemon's own end of an accepted TCP connection, as the kernel knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ours {
    /// Its ends: this host's address, the peer's.
    pub tuple: Tuple,
    /// `SO_COOKIE`.
    pub cookie: u64,
    /// The socket file's inode (`fstat`).
    pub inode: u64,
}

impl Ours {
    /// The accepted socket `fd` whose ends are `local` and `peer`.
    ///
    /// # Errors
    /// When `getsockopt(SO_COOKIE)` or `fstat` fails.
    pub fn of(fd: impl AsFd, local: SocketAddr, peer: SocketAddr) -> io::Result<Self> {
        let cookie = rustix::net::sockopt::socket_cookie(&fd)?;
        let inode = rustix::fs::fstat(&fd)?.st_ino;
        Ok(Self {
            tuple: Tuple {
                src: local,
                dst: peer,
            }
            .canonical(),
            cookie,
            inode,
        })
    }
}

/// The socket on the other end of a connection from this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSocket {
    /// Who created it.
    pub uid: u32,
    /// Its socket file's inode.
    pub inode: u64,
}

/// Why a lookup named no peer for a reason that is not the peer's.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error(transparent)]
    Diag(#[from] DiagError),
    #[error(
        "the kernel's socket table does not show the daemon's own socket (cookie {cookie}, \
         inode {inode}): the listener is in another network namespace, or this kernel has no \
         tcp_diag"
    )]
    NotOurs { cookie: u64, inode: u64 },
}

/// The socket at the other end of `ours`, when it is on this host, ESTABLISHED and has a
/// socket file; `None` for anything else (closed, TIME_WAIT, not found). Blocks for two
/// netlink round trips.
///
/// # Errors
/// When the lookup could not be made, or did not find the daemon's own socket.
pub fn peer_socket(diag: &Diag, ours: Ours) -> Result<Option<PeerSocket>, LookupError> {
    let established_or_closing = [TcpState::ESTABLISHED, TcpState::CLOSE_WAIT];
    match diag.lookup(ours.tuple, Some(ours.cookie), &established_or_closing)? {
        Answer::Found(f) if f.inode == ours.inode => {}
        _ => {
            return Err(LookupError::NotOurs {
                cookie: ours.cookie,
                inode: ours.inode,
            });
        }
    }
    Ok(
        match diag.lookup(ours.tuple.reversed(), None, &[TcpState::ESTABLISHED])? {
            Answer::Found(f) if f.state == TcpState::ESTABLISHED && f.inode != 0 => {
                Some(PeerSocket {
                    uid: f.uid,
                    inode: f.inode,
                })
            }
            _ => None,
        },
    )
}

/// A listener's lookups of its local peers: one at a time, on a blocking thread, over one
/// netlink socket kept between them.
#[derive(Debug, Default)]
pub struct PeerLookup {
    /// The netlink socket, when one is open; also the lock that keeps lookups one at a time
    /// (taken with `try_lock`: a lookup that finds it held, because an earlier one has not
    /// come back within its timeout, does not wait and names no one).
    diag: Arc<Mutex<Option<Diag>>>,
    /// Whether a failure of the lookup itself was logged as a warning already.
    warned: AtomicBool,
}

impl PeerLookup {
    /// The uid of the socket at the other end of the accepted `stream`, if the connection
    /// comes from this host and that socket is ESTABLISHED ([`peer_socket`]); `None` when it
    /// does not, or the lookup fails or takes longer than [`LOOKUP_TIMEOUT`].
    pub async fn uid(&self, stream: &tokio::net::TcpStream) -> Option<u32> {
        let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
            return None;
        };
        if !maybe_local(peer, local) {
            return None;
        }
        let ours = match Ours::of(stream, local, peer) {
            Ok(o) => o,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "reading the daemon's own socket failed");
                return None;
            }
        };
        let diag = self.diag.clone();
        let task = tokio::task::spawn_blocking(move || {
            let Ok(mut slot) = diag.try_lock() else {
                return Err(None);
            };
            let found = match slot.take() {
                Some(d) => Ok(d),
                None => Diag::open(),
            }
            .map_err(LookupError::from)
            .and_then(|d| {
                let r = peer_socket(&d, ours);
                *slot = Some(d);
                r
            });
            if found.is_err() {
                // A late answer may still come to it: the next lookup opens another.
                *slot = None;
            }
            found.map_err(Some)
        });
        match tokio::time::timeout(LOOKUP_TIMEOUT, task).await {
            Ok(Ok(Ok(Some(p)))) => Some(p.uid),
            Ok(Ok(Ok(None))) => {
                tracing::debug!(
                    %peer,
                    "no ESTABLISHED socket at the other end of a TCP connection from this host \
                     (it closed, or is not local); anonymous"
                );
                None
            }
            Ok(Ok(Err(None))) => {
                tracing::debug!(
                    %peer,
                    "an earlier lookup of a local TCP peer has not come back; this one is \
                     anonymous"
                );
                None
            }
            // The connection itself is gone (its peer reset it): nothing is wrong with the
            // lookup.
            Ok(Ok(Err(Some(e)))) if stream.peer_addr().is_err() => {
                tracing::debug!(%peer, error = %e, "a local TCP peer left before its lookup");
                None
            }
            Ok(Ok(Err(Some(e)))) => {
                if self.warned.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%peer, error = %e, "looking up a local TCP peer failed");
                } else {
                    tracing::warn!(
                        %peer,
                        error = %e,
                        "looking up a local TCP peer failed; local TCP callers are anonymous \
                         while it does (logged once)"
                    );
                }
                None
            }
            Ok(Err(_)) => None,
            Err(_) => {
                tracing::warn!(%peer, "looking up a local TCP peer took too long; it is anonymous");
                None
            }
        }
    }
}

/// The local user `uid`, with its groups, if it could connect to the Unix socket at `socket`
/// (whose mode and group are read at each call): in a blocking task bounded by
/// [`LOOKUP_TIMEOUT`]. `None` when it could not, or reading the user database failed or took
/// too long.
pub async fn local_user(uid: u32, socket: Arc<Path>) -> Option<LocalUser> {
    let task = tokio::task::spawn_blocking(move || {
        let access = SocketAccess::of_socket(&socket, rustix::process::getuid().as_raw());
        user(Path::new("/"), uid, access)
    });
    match tokio::time::timeout(LOOKUP_TIMEOUT, task).await {
        Ok(Ok(Ok(found))) => found,
        Ok(Ok(Err(e))) => {
            tracing::debug!(uid, error = %e, "reading a local TCP caller's groups failed");
            None
        }
        _ => {
            tracing::warn!(
                uid,
                "reading a local TCP caller's groups took too long; it is anonymous"
            );
            None
        }
    }
}

/// [`local_user`]'s work, with the files under `root` (for tests).
fn user(root: &Path, uid: u32, access: SocketAccess) -> io::Result<Option<LocalUser>> {
    let gids = groups_of(root, uid)?;
    if !access.permits(uid, &gids) {
        tracing::info!(
            uid,
            "a local user who may not use the Unix socket connected over TCP; it is anonymous"
        );
        return Ok(None);
    }
    Ok(Some(LocalUser { uid, gids }))
}

/// User `uid`'s primary group (`/etc/passwd`) and the groups `/etc/group` lists it in by name.
fn groups_of(root: &Path, uid: u32) -> io::Result<Vec<u32>> {
    let read = |p: &str| -> io::Result<String> {
        let mut s = String::new();
        match File::open(root.join(p)) {
            Ok(f) => {
                f.take(MAX_DB_BYTES).read_to_string(&mut s)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(s)
    };
    let passwd = read("etc/passwd")?;
    let entry = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.splitn(5, ':').collect();
        (f.len() >= 4 && f[2].parse() == Ok(uid)).then(|| (f[0].to_owned(), f[3].parse().ok()))
    });
    let Some((name, primary)) = entry else {
        return Ok(Vec::new());
    };
    let mut gids: Vec<u32> = primary.into_iter().collect();
    for l in read("etc/group")?.lines() {
        let f: Vec<&str> = l.splitn(4, ':').collect();
        if f.len() == 4
            && f[3].split(',').any(|m| m.trim() == name)
            && let Ok(g) = f[2].parse()
            && !gids.contains(&g)
        {
            gids.push(g);
        }
    }
    Ok(gids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A connection to a listener on `listen`, made to `to` and its port: (the client's end,
    /// the accepted end); `None` when `listen` cannot be bound (no IPv6).
    fn pair(listen: &str, to: &str) -> Option<(TcpStream, TcpStream)> {
        let l = TcpListener::bind(listen).ok()?;
        let port = l.local_addr().unwrap().port();
        let c = TcpStream::connect(SocketAddr::new(to.parse().unwrap(), port)).unwrap();
        let (s, _) = l.accept().unwrap();
        Some((c, s))
    }

    fn ours(s: &TcpStream) -> Ours {
        Ours::of(s, s.local_addr().unwrap(), s.peer_addr().unwrap()).unwrap()
    }

    #[test]
    fn an_established_loopback_peer_is_named_with_its_creator_and_inode() {
        let diag = Diag::open().unwrap();
        let me = rustix::process::geteuid().as_raw();
        for (listen, to) in [
            ("127.0.0.1:0", "127.0.0.1"),
            // A dual-stack listener sees an IPv4 peer as ::ffff:127.0.0.1.
            ("[::]:0", "127.0.0.1"),
            ("[::1]:0", "::1"),
        ] {
            let Some((c, s)) = pair(listen, to) else {
                continue; // no IPv6 here
            };
            let found = peer_socket(&diag, ours(&s)).unwrap();
            assert_eq!(
                found,
                Some(PeerSocket {
                    uid: me,
                    inode: rustix::fs::fstat(&c).unwrap().st_ino,
                }),
                "{listen} <- {to}"
            );
        }
    }

    /// Issue 36: a peer that connects and closes at once was found as the TIME_WAIT row the
    /// kernel prints with uid 0, i.e. root. Its socket is not ESTABLISHED and has no file, so
    /// it names no one.
    #[test]
    fn a_peer_that_closed_is_no_uid_whatever_the_kernel_reports_for_it() {
        let diag = Diag::open().unwrap();
        let (c, mut s) = pair("127.0.0.1:0", "127.0.0.1").unwrap();
        let ours = ours(&s);
        drop(c);
        // Its FIN has arrived (and been acknowledged): it is in FIN_WAIT2 or TIME_WAIT.
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(s.read(&mut [0_u8; 8]).unwrap(), 0);
        match diag.lookup(ours.tuple.reversed(), None, &[]).unwrap() {
            Answer::Found(f) => {
                assert_ne!(f.state, TcpState::ESTABLISHED, "{f:?}");
                assert_eq!(f.inode, 0, "{f:?}");
            }
            Answer::Absent => {}
        }
        assert_eq!(peer_socket(&diag, ours).unwrap(), None);
    }

    /// A peer that resets its connection before the lookup takes the daemon's own socket out
    /// of the table too: that is the peer leaving, not a lookup that does not work.
    #[tokio::test]
    async fn a_peer_that_reset_is_anonymous_and_no_failure_of_the_lookup() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().await.unwrap();
        let lookup = PeerLookup::default();
        let me = rustix::process::geteuid().as_raw();
        assert_eq!(lookup.uid(&s).await, Some(me));
        rustix::net::sockopt::set_socket_linger(&c, Some(Duration::ZERO)).unwrap();
        drop(c);
        loop {
            s.readable().await.unwrap();
            match s.try_read(&mut [0_u8; 8]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) | Ok(0) => break,
                Ok(_) => {}
            }
        }
        assert_eq!(lookup.uid(&s).await, None);
        assert!(!lookup.warned.load(Ordering::Relaxed));
    }

    #[test]
    fn a_socket_the_table_does_not_show_as_ours_is_an_error() {
        let diag = Diag::open().unwrap();
        let (_c, s) = pair("127.0.0.1:0", "127.0.0.1").unwrap();
        let mut o = ours(&s);
        o.cookie ^= 1;
        assert!(matches!(
            peer_socket(&diag, o),
            Err(LookupError::NotOurs { .. })
        ));
        let mut o = ours(&s);
        o.inode += 1;
        assert!(matches!(
            peer_socket(&diag, o),
            Err(LookupError::NotOurs { .. })
        ));
    }

    #[test]
    fn a_local_user_is_identified_only_if_it_could_use_the_unix_socket() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/passwd"),
            "npud:x:990:990::/:/bin/false\nalice:x:1000:1000::/home/alice:/bin/sh\n",
        )
        .unwrap();
        let group = |g: &str| std::fs::write(root.path().join("etc/group"), g).unwrap();
        let access = SocketAccess {
            owner: 990,
            group: 44,
            mode: 0o660,
        };
        let find = || user(root.path(), 1000, access).unwrap();
        group("alice:x:1000:\nnpu:x:44:npud\n");
        assert_eq!(find(), None, "alice is not in the socket's group");
        group("alice:x:1000:\nnpu:x:44:npud,alice\n");
        assert_eq!(
            find(),
            Some(LocalUser {
                uid: 1000,
                gids: vec![1000, 44]
            })
        );
        assert!(
            SocketAccess {
                mode: 0o666,
                ..access
            }
            .permits(1234, &[])
        );
        assert!(
            SocketAccess {
                mode: 0o600,
                ..access
            }
            .permits(0, &[])
        );
        assert!(
            !SocketAccess {
                mode: 0o600,
                ..access
            }
            .permits(1234, &[44])
        );
    }

    #[test]
    fn only_loopback_and_this_hosts_own_address_are_looked_up() {
        assert!(maybe_local(sa("127.0.0.9:1"), sa("10.0.0.1:50051")));
        assert!(maybe_local(sa("[::ffff:127.0.0.1]:1"), sa("[::]:50051")));
        assert!(maybe_local(sa("10.0.0.1:1"), sa("10.0.0.1:50051")));
        assert!(!maybe_local(sa("10.0.0.2:1"), sa("10.0.0.1:50051")));
    }
}
