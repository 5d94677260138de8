//! Fds whose last close blocks, and frames that carry them.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

/// The other end of a [`lingering`] socket: while it is open, the socket's close blocks.
#[derive(Debug)]
pub struct Peer {
    pub peer: std::net::TcpStream,
    pub listener: std::net::TcpListener,
}

/// A loopback TCP connection whose last close blocks for `linger`: the peer never reads, its
/// receive buffer and this end's send queue are full, and `SO_LINGER` makes close wait for the
/// queue to drain, as long as the returned [`Peer`] is kept.
///
/// # Panics
/// When a loopback socket cannot be made.
pub fn lingering(linger: Duration) -> (std::net::TcpStream, Peer) {
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
        let sock = std::net::TcpStream::connect(listener.local_addr().expect("an address"))
            .expect("a loopback connection");
        let (peer, _) = listener.accept().expect("the peer");
        rustix::net::sockopt::set_socket_recv_buffer_size(&peer, 4096).expect("SO_RCVBUF");
        sock.set_nonblocking(true).expect("non-blocking");
        let chunk = vec![0u8; 64 << 10];
        let mut w = &sock;
        loop {
            match w.write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the socket: {e}"),
            }
        }
        rustix::net::sockopt::set_socket_linger(&sock, Some(linger)).expect("SO_LINGER");
        (sock, Peer { peer, listener })
    }
}

/// Sends `bytes` on `socket` with `fds` attached (`SCM_RIGHTS`, one message). Returns the bytes
/// sent.
///
/// # Errors
/// The `sendmsg` failure.
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<usize> {
    let mut space =
        vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    assert!(
        control.push(rustix::net::SendAncillaryMessage::ScmRights(fds)),
        "room for {} fds",
        fds.len()
    );
    Ok(rustix::net::sendmsg(
        socket,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        rustix::net::SendFlags::NOSIGNAL,
    )?)
}

/// Sockets' fds, borrowed.
pub fn borrowed(socks: &[std::net::TcpStream]) -> Vec<BorrowedFd<'_>> {
    socks.iter().map(AsFd::as_fd).collect()
}
