//! Local users over TCP: who holds the other end of a TCP connection that comes from this host,
//! and whether that user may use the daemon's Unix socket.
//!
//! A TCP connection from this host (from loopback, or from an address of this host to itself)
//! has both of its ends in the kernel's socket table: the peer's socket is the row of
//! `/proc/net/tcp` (or `tcp6`) whose local address is the connection's remote one and whose
//! remote address is the connection's local one, and that row's `uid` column is the user who
//! created the socket. So a local TCP caller is `uid:<n>` exactly as on the Unix socket, with
//! the same quotas and fault budget, rather than one shared `anonymous`.
//!
//! The Unix socket's mode and group decide which local users may connect to it (the kernel
//! checks them at `connect`); a local TCP caller is held to the same test ([`SocketAccess`]),
//! with its groups read from `/etc/passwd` and `/etc/group`, since the kernel gives no
//! supplementary groups for a TCP peer. A local user who could not connect to the Unix socket
//! is not identified by its uid over TCP either: it is `anonymous`, which the default policy
//! refuses.
//!
//! Cost: each lookup reads `/proc/net/tcp` and `/proc/net/tcp6` (about 150 bytes a socket), at
//! most [`MAX_TABLE_BYTES`] of each, and `/etc/passwd` and `/etc/group`, at most
//! [`MAX_DB_BYTES`] of each, in a blocking task bounded by [`LOOKUP_TIMEOUT`]; a table larger
//! than that, or a lookup that takes longer, leaves the caller unidentified (`anonymous`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Most bytes of one `/proc/net/tcp*` table read per lookup (about 50,000 sockets).
pub const MAX_TABLE_BYTES: u64 = 8 << 20;
/// Most bytes of `/etc/passwd` or `/etc/group` read per lookup.
pub const MAX_DB_BYTES: u64 = 4 << 20;
/// How long one lookup may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Whether a TCP connection whose ends are `peer` and `local` may come from this host, so that
/// looking it up is worth a read of the socket tables.
pub fn maybe_local(peer: SocketAddr, local: SocketAddr) -> bool {
    let p = peer.ip().to_canonical();
    p.is_loopback() || p == local.ip().to_canonical()
}

/// The local user holding the peer end of the TCP connection `peer` → `local`, if it is a
/// socket of this host and its user could connect to the Unix socket at `socket` (whose mode
/// and group are read at each lookup). Runs the lookup in a blocking task bounded by
/// [`LOOKUP_TIMEOUT`].
pub async fn identify(peer: SocketAddr, local: SocketAddr, socket: Arc<Path>) -> Option<LocalUser> {
    if !maybe_local(peer, local) {
        return None;
    }
    let task = tokio::task::spawn_blocking(move || {
        let access = SocketAccess::of_socket(&socket, rustix::process::getuid().as_raw());
        lookup(Path::new("/"), peer, local, access)
    });
    match tokio::time::timeout(LOOKUP_TIMEOUT, task).await {
        Ok(Ok(Ok(found))) => found,
        Ok(Ok(Err(e))) => {
            tracing::debug!(%peer, error = %e, "looking up a local TCP peer failed");
            None
        }
        _ => {
            tracing::warn!(%peer, "looking up a local TCP peer took too long; it is anonymous");
            None
        }
    }
}

/// [`identify`]'s work, with the files under `root` (for tests).
fn lookup(
    root: &Path,
    peer: SocketAddr,
    local: SocketAddr,
    access: SocketAccess,
) -> io::Result<Option<LocalUser>> {
    let mut uid = None;
    for table in ["proc/net/tcp", "proc/net/tcp6"] {
        let f = match File::open(root.join(table)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        uid = find_owner(BufReader::new(f.take(MAX_TABLE_BYTES)), peer, local)?;
        if uid.is_some() {
            break;
        }
    }
    let Some(uid) = uid else { return Ok(None) };
    let gids = groups_of(root, uid)?;
    if !access.permits(uid, &gids) {
        tracing::info!(
            uid,
            %peer,
            "a local user who may not use the Unix socket connected over TCP; it is anonymous"
        );
        return Ok(None);
    }
    Ok(Some(LocalUser { uid, gids }))
}

/// The `uid` of the row of a `/proc/net/tcp*` table whose local address is `peer` and whose
/// remote address is `local`.
fn find_owner(table: impl BufRead, peer: SocketAddr, local: SocketAddr) -> io::Result<Option<u32>> {
    let want = (canonical(peer), canonical(local));
    for line in table.lines().skip(1) {
        let line = line?;
        let mut f = line.split_whitespace();
        let (Some(_sl), Some(l), Some(r)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if parse_addr(l) != Some(want.0) || parse_addr(r) != Some(want.1) {
            continue;
        }
        // st, tx:rx queue, tr:when, retrnsmt, then uid.
        if let Some(uid) = f.nth(4).and_then(|u| u.parse().ok()) {
            return Ok(Some(uid));
        }
    }
    Ok(None)
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// An address as the kernel prints it in `/proc/net/tcp*`: the address's bytes in memory order,
/// as native-endian 32-bit words in hex, a colon, the port in hex.
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip.to_canonical(), port))
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

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:C350 00000000:0000 0A 00000000:00000000 00:00000000 00000000   990        0 1 1 0 100 0 0 10 0
   1: 0100007F:C350 0100007F:9C40 01 00000000:00000000 00:00000000 00000000   990        0 2 1 0 100 0 0 10 0
   2: 0100007F:9C40 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 3 1 0 100 0 0 10 0
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:9C41 00000000000000000000000001000000:C350 01 00000000:00000000 00:00000000 00000000  1001        0 4 1 0 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:9C42 0000000000000000FFFF00000100007F:C350 01 00000000:00000000 00:00000000 00000000  1002        0 5 1 0 100 0 0 10 0
";

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_peer_is_the_row_whose_ends_are_the_connections_reversed() {
        let server = sa("127.0.0.1:50000");
        let owner = |t: &str, peer| find_owner(t.as_bytes(), sa(peer), server).unwrap();
        assert_eq!(
            owner(TCP, "127.0.0.1:40000"),
            Some(1000),
            "not the daemon's row"
        );
        assert_eq!(owner(TCP, "127.0.0.1:40001"), None);
        let v6 = |peer| find_owner(TCP6.as_bytes(), sa(peer), sa("[::1]:50000")).unwrap();
        assert_eq!(v6("[::1]:40001"), Some(1001));
        // A dual-stack socket's v4-mapped addresses are the IPv4 addresses.
        assert_eq!(
            find_owner(TCP6.as_bytes(), sa("127.0.0.1:40002"), server).unwrap(),
            Some(1002)
        );
        assert_eq!(
            find_owner(
                TCP.as_bytes(),
                sa("[::ffff:127.0.0.1]:40000"),
                sa("[::ffff:127.0.0.1]:50000")
            )
            .unwrap(),
            Some(1000)
        );
    }

    #[test]
    fn a_local_user_is_identified_only_if_it_could_use_the_unix_socket() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("proc/net")).unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("proc/net/tcp"), TCP).unwrap();
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
        let find = || {
            lookup(
                root.path(),
                sa("127.0.0.1:40000"),
                sa("127.0.0.1:50000"),
                access,
            )
            .unwrap()
        };
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
