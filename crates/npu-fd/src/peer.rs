//! Credentials of a Unix socket's peer that neither rustix nor nix reads: the supplementary
//! groups the peer process had when it connected (`SO_PEERGROUPS`, Linux 4.13).
//!
//! The kernel records them at `connect`, with `SO_PEERCRED`'s uid and gid, so they are the
//! connecting process's, not those of whatever process holds its pid later (which is what
//! reading `/proc/<pid>/status` after `accept` would give).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SO_PEERGROUPS` (`asm-generic/socket.h`; the architectures this crate builds for use the
/// generic numbers).
#[doc(alias = "SO_PEERGROUPS")]
const PEERGROUPS: libc::c_int = 59;

/// Most groups a process can have (`NGROUPS_MAX`).
const MAX_GROUPS: usize = 65536;

/// The supplementary groups of the process on the other end of the connected Unix socket
/// `socket`, as they were when it connected.
///
/// Cost: one `getsockopt`, two when the peer has more than 64 groups; at most
/// [`MAX_GROUPS`] × 4 bytes.
///
/// # Errors
/// The `getsockopt` error (`ENOPROTOOPT` before Linux 4.13, `ENOTSOCK`, ...).
pub fn groups(socket: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut buf: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = libc::socklen_t::try_from(buf.len() * size_of::<libc::gid_t>())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `buf` is a live, writable allocation of `len` bytes that the kernel fills
        // with at most `len` bytes of gids; `len` is a valid socklen_t the kernel updates;
        // `socket` is a borrowed, open descriptor for the whole call.
        let r = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                PEERGROUPS,
                buf.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        let n = len as usize / size_of::<libc::gid_t>();
        if r == 0 {
            buf.truncate(n.min(buf.len()));
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        // ERANGE: the buffer was too small; `len` says how large it must be.
        if e.raw_os_error() != Some(libc::ERANGE) || n <= buf.len() || n > MAX_GROUPS {
            return Err(e);
        }
        buf.resize(n, 0);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_peer_has_the_groups_of_the_process_that_connected() {
        let (a, _b) = UnixStream::pair().unwrap();
        let got = super::groups(a.as_fd()).unwrap();
        let mut want = rustix::process::getgroups()
            .unwrap()
            .into_iter()
            .map(|g| g.as_raw())
            .collect::<Vec<_>>();
        let mut got = got;
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn a_socket_that_is_not_connected_has_no_peer_groups() {
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(super::groups(f.as_fd()).is_err());
    }
}
