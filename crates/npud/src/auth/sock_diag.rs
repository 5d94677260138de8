//! One TCP socket of this network namespace, looked up by its exact 4-tuple through
//! `NETLINK_SOCK_DIAG` (`SOCK_DIAG_BY_FAMILY` without `NLM_F_DUMP`, the form `ss` uses for one
//! socket): the kernel answers from its connection hash, so a lookup's cost does not grow with
//! the socket table (one `send` and one `recv`).
//!
//! The exact form looks the tuple up as an arriving packet would: the established sockets
//! (TIME_WAIT ones included), then the listening ones. It does not filter by state, so the
//! caller checks [`Found::state`]; a TIME_WAIT socket is reported with uid 0 and inode 0
//! (there is no socket file behind it any more), a listening one in state LISTEN.
//!
//! The request is 72 bytes (`nlmsghdr` and `inet_diag_req_v2`), the answer one
//! `inet_diag_msg` (72 bytes after its header, then attributes this module ignores) or an
//! `NLMSG_ERROR` (`ENOENT`: no such socket; `ESTALE`: the socket has another cookie). They
//! are encoded and read here with safe code over a rustix netlink socket, connected to the
//! kernel so that no other process can put a message in its queue.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// `SOCK_DIAG_BY_FAMILY`, the request and answer type.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR`.
const NLMSG_ERROR: u16 = 2;
/// `NLM_F_REQUEST`.
const NLM_F_REQUEST: u16 = 1;
/// `IPPROTO_TCP`.
const IPPROTO_TCP: u8 = 6;
/// `INET_DIAG_NOCOOKIE`: any socket with the tuple, whatever its cookie.
const NO_COOKIE: u64 = u64::MAX;
/// Bytes of `nlmsghdr`.
const HEADER: usize = 16;
/// Bytes of the request: `nlmsghdr` and `inet_diag_req_v2`.
const REQUEST: usize = HEADER + 56;
/// Bytes of `inet_diag_msg` after its header.
const MSG: usize = 72;
/// How long the kernel may take to answer (it answers within the `send`; this bounds a
/// kernel that does not).
const RECV_TIMEOUT: Duration = Duration::from_millis(500);

/// A TCP state as the kernel numbers it (`TCP_ESTABLISHED`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpState(pub u8);

impl TcpState {
    pub const ESTABLISHED: Self = Self(1);
    pub const TIME_WAIT: Self = Self(6);
    pub const CLOSE_WAIT: Self = Self(8);
    pub const LISTEN: Self = Self(10);

    /// The bit of this state in `idiag_states`.
    fn bit(self) -> u32 {
        1 << self.0
    }
}

/// A socket's ends: its own address and the one it is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

impl Tuple {
    /// The same ends with IPv4-mapped IPv6 addresses as IPv4 (a dual-stack socket's
    /// IPv4 peer is hashed by its IPv4 address).
    pub fn canonical(self) -> Self {
        let c = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
        Self {
            src: c(self.src),
            dst: c(self.dst),
        }
    }

    /// The other end's view: source and destination swapped.
    pub fn reversed(self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
        }
    }
}

/// What the kernel says about the socket with a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub state: TcpState,
    /// The socket's owner (`sk_uid`: who created it, in the daemon's user namespace); 0 for a
    /// TIME_WAIT socket.
    pub uid: u32,
    /// The socket file's inode; 0 when there is none (TIME_WAIT, orphaned after `close`, or
    /// not yet accepted).
    pub inode: u64,
    /// The ends the kernel reports (checked against the request's).
    pub tuple: Tuple,
}

/// A lookup that could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    #[error("NETLINK_SOCK_DIAG: {0}")]
    Io(#[from] rustix::io::Errno),
    #[error("NETLINK_SOCK_DIAG answered an error: {0}")]
    Kernel(rustix::io::Errno),
    #[error("NETLINK_SOCK_DIAG answered malformed: {0}")]
    Malformed(&'static str),
}

/// The answer to one lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Found(Found),
    /// No socket has the tuple (`ENOENT`), or it has another cookie (`ESTALE`).
    Absent,
}

/// A netlink socket for lookups, connected to the kernel.
#[derive(Debug)]
pub struct Diag {
    fd: OwnedFd,
}

static SEQ: AtomicU32 = AtomicU32::new(1);

impl Diag {
    /// A new socket (one `socket` and one `connect`).
    ///
    /// # Errors
    /// The kernel's, e.g. when it has no `NETLINK_SOCK_DIAG`.
    pub fn open() -> Result<Self, DiagError> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            Some(netlink::SOCK_DIAG),
        )?;
        // Connected to the kernel (port 0): the kernel refuses other senders' messages to a
        // connected netlink socket, so every answer read here is the kernel's.
        rustix::net::connect(&fd, &SocketAddrNetlink::new(0, 0))?;
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(RECV_TIMEOUT),
        )?;
        Ok(Self { fd })
    }

    /// The TCP socket whose own address is `tuple.src` and whose peer is `tuple.dst`, and,
    /// with `cookie`, only if it is that socket (`SO_COOKIE`). `states` is what the caller
    /// will accept (the kernel does not filter the exact form by it; the caller checks).
    /// Blocks for one round trip to the kernel (bounded by [`RECV_TIMEOUT`]).
    ///
    /// # Errors
    /// A failed `send` or `recv`, an error answer other than "no such socket", or an answer
    /// that is not one `inet_diag_msg` for the tuple asked.
    pub fn lookup(
        &self,
        tuple: Tuple,
        cookie: Option<u64>,
        states: &[TcpState],
    ) -> Result<Answer, DiagError> {
        let tuple = tuple.canonical();
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let req = request(seq, tuple, cookie, states);
        rustix::net::send(&self.fd, &req, SendFlags::empty())?;
        let mut buf = [0_u8; 4096];
        // A message of an earlier lookup that timed out may still be queued: skip it (a few
        // at most, since each lookup sends one request and reads its answer).
        for _ in 0..8 {
            let (got, _) = rustix::net::recv(&self.fd, &mut buf[..], RecvFlags::empty())?;
            let msg = buf.get(..got).ok_or(DiagError::Malformed("truncated"))?;
            match parse(msg, seq)? {
                Some(answer) => {
                    if let Answer::Found(f) = answer
                        && f.tuple != tuple
                    {
                        return Err(DiagError::Malformed("an answer for another tuple"));
                    }
                    return Ok(answer);
                }
                None => continue,
            }
        }
        Err(DiagError::Malformed("no answer to the request"))
    }
}

/// The request for `tuple` (canonical), as the kernel reads it: `nlmsghdr` (host order),
/// then `inet_diag_req_v2` whose ports and addresses are in network order.
fn request(seq: u32, tuple: Tuple, cookie: Option<u64>, states: &[TcpState]) -> [u8; REQUEST] {
    let mut r = [0_u8; REQUEST];
    r[0..4].copy_from_slice(&u32::try_from(REQUEST).unwrap_or(0).to_ne_bytes());
    r[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    r[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    r[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills it in.
    let v4 = tuple.src.is_ipv4() && tuple.dst.is_ipv4();
    r[16] = family(v4);
    r[17] = IPPROTO_TCP;
    // idiag_ext 0 (no attributes asked), pad.
    let states = states.iter().fold(0_u32, |b, s| b | s.bit());
    r[20..24].copy_from_slice(&states.to_ne_bytes());
    // inet_diag_sockid
    r[24..26].copy_from_slice(&tuple.src.port().to_be_bytes());
    r[26..28].copy_from_slice(&tuple.dst.port().to_be_bytes());
    r[28..44].copy_from_slice(&address(tuple.src.ip(), v4));
    r[44..60].copy_from_slice(&address(tuple.dst.ip(), v4));
    // idiag_if 0: a socket bound to no device (one bound to a device is not found, and its
    // caller is anonymous).
    let cookie = cookie.unwrap_or(NO_COOKIE);
    // idiag_cookie[0] is the cookie's low half, [1] its high half, each in host order.
    let (low, high) = (cookie & 0xffff_ffff, cookie >> 32);
    r[64..68].copy_from_slice(&u32::try_from(low).unwrap_or(0).to_ne_bytes());
    r[68..72].copy_from_slice(&u32::try_from(high).unwrap_or(0).to_ne_bytes());
    r
}

fn family(v4: bool) -> u8 {
    let f = if v4 {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    u8::try_from(f.as_raw()).unwrap_or(0)
}

/// An address as `inet_diag_sockid` holds it: an IPv4 address in the first 4 bytes (with
/// `AF_INET`), an IPv6 one in all 16.
fn address(ip: IpAddr, v4: bool) -> [u8; 16] {
    let mut b = [0_u8; 16];
    match ip {
        IpAddr::V4(a) if v4 => b[..4].copy_from_slice(&a.octets()),
        IpAddr::V4(a) => b.copy_from_slice(&a.to_ipv6_mapped().octets()),
        IpAddr::V6(a) => b.copy_from_slice(&a.octets()),
    }
    b
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The answer in `msg` to request `seq`; `None` for a message that answers another request.
fn parse(msg: &[u8], seq: u32) -> Result<Option<Answer>, DiagError> {
    let bad = DiagError::Malformed;
    let len = u32_at(msg, 0).ok_or(bad("shorter than a header"))? as usize;
    let kind = u16_at(msg, 4).ok_or(bad("shorter than a header"))?;
    let got_seq = u32_at(msg, 8).ok_or(bad("shorter than a header"))?;
    if len < HEADER || len > msg.len() {
        return Err(bad("a length past the datagram"));
    }
    if got_seq != seq {
        return Ok(None);
    }
    let body = &msg[HEADER..len];
    match kind {
        NLMSG_ERROR => {
            let code = body
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(i32::from_ne_bytes)
                .ok_or(bad("an error without its code"))?;
            let errno = rustix::io::Errno::from_raw_os_error(code.saturating_neg());
            if errno == rustix::io::Errno::NOENT || errno == rustix::io::Errno::STALE {
                Ok(Some(Answer::Absent))
            } else {
                Err(DiagError::Kernel(errno))
            }
        }
        SOCK_DIAG_BY_FAMILY => {
            if body.len() < MSG {
                return Err(bad("an inet_diag_msg cut short"));
            }
            let v4 = body[0] == family(true);
            if !v4 && body[0] != family(false) {
                return Err(bad("an address family that is not IPv4 or IPv6"));
            }
            let port = |at: usize| u16::from_be_bytes([body[at], body[at + 1]]);
            let ip = |at: usize| -> IpAddr {
                if v4 {
                    IpAddr::V4(Ipv4Addr::new(
                        body[at],
                        body[at + 1],
                        body[at + 2],
                        body[at + 3],
                    ))
                } else {
                    let mut b = [0_u8; 16];
                    b.copy_from_slice(&body[at..at + 16]);
                    IpAddr::V6(Ipv6Addr::from(b)).to_canonical()
                }
            };
            let tuple = Tuple {
                src: SocketAddr::new(ip(8), port(4)),
                dst: SocketAddr::new(ip(24), port(6)),
            };
            Ok(Some(Answer::Found(Found {
                state: TcpState(body[1]),
                uid: u32_at(body, 64).ok_or(bad("no uid"))?,
                inode: u64::from(u32_at(body, 68).ok_or(bad("no inode"))?),
                tuple,
            })))
        }
        _ => Err(bad("a message of another type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_request_is_inet_diag_req_v2_for_the_exact_tuple() {
        let t = Tuple {
            src: sa("127.0.0.2:40000"),
            dst: sa("127.0.0.1:50051"),
        };
        let r = request(7, t, Some(0x1122_3344_5566_7788), &[TcpState::ESTABLISHED]);
        assert_eq!(u32_at(&r, 0), Some(72));
        assert_eq!(u16_at(&r, 4), Some(20));
        assert_eq!(u16_at(&r, 6), Some(1), "a request, not a dump");
        assert_eq!(u32_at(&r, 8), Some(7));
        assert_eq!(r[16], 2, "AF_INET");
        assert_eq!(r[17], 6, "IPPROTO_TCP");
        assert_eq!(u32_at(&r, 20), Some(1 << 1), "ESTABLISHED only");
        assert_eq!(
            &r[24..28],
            &[0x9c, 0x40, 0xc3, 0x83],
            "ports in network order"
        );
        assert_eq!(&r[28..32], &[127, 0, 0, 2]);
        assert_eq!(&r[44..48], &[127, 0, 0, 1]);
        assert_eq!(u32_at(&r, 64), Some(0x5566_7788));
        assert_eq!(u32_at(&r, 68), Some(0x1122_3344));
        let v6 = request(
            1,
            Tuple {
                src: sa("[::1]:1"),
                dst: sa("[::1]:2"),
            },
            None,
            &[],
        );
        assert_eq!(v6[16], 10, "AF_INET6");
        assert_eq!(v6[43], 1);
        assert_eq!(u32_at(&v6, 64), Some(u32::MAX), "no cookie");
    }

    /// An answer as the kernel writes it.
    fn answer(seq: u32, state: u8, uid: u32, inode: u32) -> Vec<u8> {
        let mut m = vec![0_u8; HEADER + MSG + 8];
        let len = u32::try_from(m.len()).unwrap();
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        m[8..12].copy_from_slice(&seq.to_ne_bytes());
        let b = &mut m[HEADER..];
        b[0] = 2;
        b[1] = state;
        b[4..6].copy_from_slice(&40000_u16.to_be_bytes());
        b[6..8].copy_from_slice(&50051_u16.to_be_bytes());
        b[8..12].copy_from_slice(&[127, 0, 0, 2]);
        b[24..28].copy_from_slice(&[127, 0, 0, 1]);
        b[64..68].copy_from_slice(&uid.to_ne_bytes());
        b[68..72].copy_from_slice(&inode.to_ne_bytes());
        m
    }

    #[test]
    fn answers_are_read_with_their_state_uid_inode_and_tuple() {
        let m = answer(9, 1, 1000, 4242);
        assert_eq!(parse(&m, 8).unwrap(), None, "another request's answer");
        let Some(Answer::Found(f)) = parse(&m, 9).unwrap() else {
            panic!("not found");
        };
        assert_eq!(f.state, TcpState::ESTABLISHED);
        assert_eq!((f.uid, f.inode), (1000, 4242));
        assert_eq!(f.tuple.src, sa("127.0.0.2:40000"));
        assert_eq!(f.tuple.dst, sa("127.0.0.1:50051"));
        assert!(parse(&m[..HEADER + 10], 9).is_err(), "cut short");
        let mut e = vec![0_u8; HEADER + 4 + HEADER];
        let len = u32::try_from(e.len()).unwrap();
        e[0..4].copy_from_slice(&len.to_ne_bytes());
        e[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        e[8..12].copy_from_slice(&3_u32.to_ne_bytes());
        e[16..20].copy_from_slice(&(-2_i32).to_ne_bytes());
        assert_eq!(parse(&e, 3).unwrap(), Some(Answer::Absent), "ENOENT");
        e[16..20].copy_from_slice(&(-13_i32).to_ne_bytes());
        assert!(matches!(parse(&e, 3), Err(DiagError::Kernel(_))), "EACCES");
    }
}
