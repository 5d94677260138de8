//! The daemon side: async calls on a `tokio::net::UnixStream`.
//!
//! The daemon accepts connections on the fd socket and, per connection, loops: [`read_request`],
//! look the ticket up, check the peer ([`peer_uid`]) and the fd
//! ([`crate::memfd::check_import`]), then [`write_response`]. After an error from
//! [`read_request`] the stream is out of step with the frames: answer with
//! [`Response::from_error`] (best effort) and close the connection.
//!
//! Neither future is cancel safe: dropping one in the middle of a frame loses the part already
//! transferred, so drop the connection with it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use tokio::io::Interest;
use tokio::net::UnixStream;

use super::frame::{REQUEST_LEN, RESPONSE_LEN};
use super::io::{FrameBuf, recv_once, send_once};
use super::{Request, Response};
use crate::FdError;

/// Reads the next request and the fd that came with it.
///
/// Returns `Ok(None)` when the client closed the connection between frames. An IMPORT request
/// comes with its fd; a REDEEM_EXPORT request with none.
///
/// Every fd that came with a refused frame is closed here, on the calling thread. Closing an
/// fd a client sent may block for as long as that client wants (a TCP socket with `SO_LINGER`,
/// a file on a FUSE mount it serves): a server that must not block uses
/// [`read_request_into`] and closes them elsewhere. (The kernel closes none inside the read:
/// see [`read_request_into`].)
///
/// # Errors
///
/// [`FdError::Malformed`] naming the problem (bad magic, version or op, non-zero reserved
/// bytes, more fds than the op takes, with their count, IMPORT without an fd); every fd that
/// came with a refused frame is closed. [`FdError::Truncated`] when the client hung up mid-frame,
/// [`FdError::Sys`] for socket errors.
pub async fn read_request(
    stream: &UnixStream,
) -> Result<Option<(Request, Option<OwnedFd>)>, FdError> {
    let mut received = Vec::new();
    let request = read_request_into(stream, &mut received).await?;
    Ok(request.map(|r| (r, received.pop())))
}

/// [`read_request`], leaving every fd received in `received` instead of closing any: on
/// success the request's own fd (an IMPORT's or ATTACH_RING's) is the last one, and the only
/// one received for this frame; after an error, or if the future is dropped mid-frame, whatever
/// came is there for the caller to close where blocking does no harm.
///
/// Every read makes room for a whole message's fds ([`super::SCM_MAX_FD`]), so the kernel
/// closes none of them inside the read. A frame that has brought more fds than a request
/// carries is refused as soon as they arrive, before the rest of it: a client sending its 64
/// bytes one at a time could otherwise bring `SCM_MAX_FD` fds with each. So one call holds at
/// most `SCM_MAX_FD + 1` of the client's fds in `received`.
///
/// # Errors
///
/// As [`read_request`]; a frame with too many fds is refused naming their count (and the op,
/// once its bytes have come).
pub async fn read_request_into(
    stream: &UnixStream,
    received: &mut Vec<OwnedFd>,
) -> Result<Option<Request>, FdError> {
    let mut frame = FrameBuf::<REQUEST_LEN>::new();
    while !frame.is_complete() {
        let n = stream
            .async_io(Interest::READABLE, || {
                let n = frame.recv(stream.as_fd());
                received.append(&mut frame.fds);
                n
            })
            .await
            .map_err(FdError::io("recvmsg"))?;
        if n == 0 {
            if frame.filled() == 0 {
                return Ok(None);
            }
            return Err(frame.truncated());
        }
        if !frame.is_complete() {
            frame.check_fds(
                MOST_FDS,
                "a request carries at most one (IMPORT and ATTACH_RING one, REDEEM_EXPORT none)",
            )?;
        }
    }
    // The op, when the frame is well formed, names what it takes; a malformed frame's fds are
    // counted first.
    let request = Request::decode(&frame.bytes);
    let takes = match &request {
        Ok(r) if r.op.request_carries_fd() => format!("{} takes one", r.op),
        Ok(r) => format!("{} takes none", r.op),
        Err(_) => "a request carries at most one".to_owned(),
    };
    frame.check_fds(MOST_FDS, &takes)?;
    let request = request?;
    match (request.op.request_carries_fd(), frame.fds_received() > 0) {
        (true, false) => Err(FdError::Malformed(format!(
            "{} carries the memfd of the tensor, but the frame came without an fd",
            request.op
        ))),
        (false, true) => Err(FdError::Malformed(format!(
            "{} takes no fd, but the frame carried one; it was closed",
            request.op
        ))),
        _ => Ok(Some(request)),
    }
}

/// The most fds a request carries.
const MOST_FDS: usize = 1;

/// Readies a connection the daemon accepted on the fd socket: bytes a client sends out of band
/// (`MSG_OOB`) are read in line (`SO_OOBINLINE`), so fds it attaches to them arrive in the
/// control buffer with the rest; read out of line, the kernel would drop that message, closing
/// its fds, inside a read on the daemon's thread.
///
/// # Errors
///
/// [`FdError::Sys`] if `setsockopt(SO_OOBINLINE)` fails, which it does not on a Unix stream
/// socket.
#[doc(alias = "SO_OOBINLINE")]
pub fn accepted(stream: &UnixStream) -> Result<(), FdError> {
    rustix::net::sockopt::set_socket_oobinline(stream, true)
        .map_err(FdError::sys("setsockopt(SO_OOBINLINE)"))
}

/// What ended [`watch_lifeline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifelineEnd {
    /// The client closed its end.
    Closed,
    /// The client sent something on a connection that carries nothing more: `bytes` bytes (at
    /// most the read's 64) and `fds` fds.
    Sent {
        /// Bytes read.
        bytes: usize,
        /// Fds that came with them (in the caller's `received`).
        fds: usize,
    },
}

/// Waits until the client closes a connection that carries nothing more (a dispatch ring's
/// lifeline, `ring.md`), or sends something on it, which the caller then refuses: one read,
/// whatever the client keeps sending. Every fd that came is left in `received`, none closed
/// here.
///
/// Cancel safe: a read is one `recvmsg`, whose fds are in `received` before it returns.
///
/// # Errors
///
/// [`FdError::Sys`] for socket errors (a reset connection among them).
pub async fn watch_lifeline(
    stream: &UnixStream,
    received: &mut Vec<OwnedFd>,
) -> Result<LifelineEnd, FdError> {
    let mut buf = [0_u8; 64];
    let r = stream
        .async_io(Interest::READABLE, || {
            recv_once(stream.as_fd(), &mut buf, received)
        })
        .await
        .map_err(FdError::io("recvmsg"))?;
    Ok(if r.bytes == 0 {
        LifelineEnd::Closed
    } else {
        LifelineEnd::Sent {
            bytes: r.bytes,
            fds: r.fds,
        }
    })
}

/// Sends a response, with `fd` attached (the ok answer to REDEEM_EXPORT carries the tensor's
/// fd; every other response carries none).
///
/// The fd is duplicated into the client by the kernel; the daemon keeps its own.
///
/// # Errors
///
/// [`FdError::Sys`] when `sendmsg` fails (`EPIPE` once the client has gone).
pub async fn write_response(
    stream: &UnixStream,
    response: &Response,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), FdError> {
    let frame: [u8; RESPONSE_LEN] = response.encode();
    let mut sent = 0;
    while sent < frame.len() {
        let attach = if sent == 0 { fd } else { None };
        let n = stream
            .async_io(Interest::WRITABLE, || {
                send_once(stream.as_fd(), &frame[sent..], attach)
            })
            .await
            .map_err(FdError::io("sendmsg"))?;
        if n == 0 {
            return Err(FdError::io("sendmsg")(io::ErrorKind::WriteZero.into()));
        }
        sent += n;
    }
    Ok(())
}

/// The user id of the process at the other end (`SO_PEERCRED`), as of `connect`.
///
/// Only the uid is read: a peer in another pid namespace (a pod beside npud's container) has
/// pid 0 in the answer, which rustix's reader refuses as no pid at all, so tokio's is used.
///
/// # Errors
///
/// [`FdError::Sys`] if `getsockopt(SO_PEERCRED)` fails, which it does not for a connected Unix
/// socket.
#[doc(alias = "SO_PEERCRED")]
pub fn peer_uid(stream: &UnixStream) -> Result<u32, FdError> {
    stream
        .peer_cred()
        .map(|cred| cred.uid())
        .map_err(FdError::io("getsockopt(SO_PEERCRED)"))
}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;
    use std::mem::MaybeUninit;
    use std::os::unix::net::UnixStream as StdUnixStream;

    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

    use super::*;
    use crate::wire::{Op, SCM_MAX_FD, Ticket};

    /// A connected pair: the client's blocking end and the daemon's tokio end.
    fn pair() -> (StdUnixStream, UnixStream) {
        let (a, b) = StdUnixStream::pair().expect("socketpair");
        b.set_nonblocking(true).expect("non-blocking");
        (a, UnixStream::from_std(b).expect("tokio stream"))
    }

    /// A pipe's read end and `n` clones of its write end.
    fn pipe_with_writers(n: usize) -> (OwnedFd, Vec<OwnedFd>) {
        let (r, w) = std::io::pipe().expect("pipe");
        let writers = (0..n)
            .map(|_| OwnedFd::from(w.try_clone().expect("dup")))
            .collect();
        (OwnedFd::from(r), writers)
    }

    /// Whether every write end of the pipe is closed.
    fn writers_closed(r: &OwnedFd) -> bool {
        rustix::io::ioctl_fionbio(r, true).expect("non-blocking");
        let mut b = [0_u8; 1];
        matches!(rustix::io::read(r, &mut b), Ok(0))
    }

    fn send_fds(sock: &StdUnixStream, bytes: &[u8], fds: &[OwnedFd], flags: SendFlags) {
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
        let n = rustix::net::sendmsg(
            sock,
            &[IoSlice::new(bytes)],
            &mut control,
            flags | SendFlags::NOSIGNAL,
        )
        .expect("sendmsg");
        assert_eq!(n, bytes.len());
    }

    fn import_frame() -> [u8; REQUEST_LEN] {
        Request {
            op: Op::Import,
            ticket: Ticket::from_bytes([3; 16]),
        }
        .encode()
    }

    #[tokio::test]
    async fn a_frame_with_more_fds_than_its_op_takes_is_refused_naming_the_count() {
        let (client, server) = pair();
        let (r, writers) = pipe_with_writers(8);
        let frame = import_frame();
        send_fds(&client, &frame, &writers, SendFlags::empty());
        drop(writers);
        let mut received = Vec::new();
        let err = read_request_into(&server, &mut received)
            .await
            .expect_err("8 fds");
        assert_eq!(
            err.to_string(),
            "malformed fd-socket frame: the frame carried 8 fds; IMPORT takes one"
        );
        assert_eq!(received.len(), 8, "every fd reached the caller");
        assert!(!writers_closed(&r), "the kernel closed none of them");
        drop(received);
        assert!(writers_closed(&r));
    }

    #[tokio::test]
    async fn fds_past_a_requests_one_are_refused_before_the_rest_of_the_frame() {
        let (client, server) = pair();
        let (r, writers) = pipe_with_writers(2 * SCM_MAX_FD);
        let frame = import_frame();
        let (first, second) = writers.split_at(SCM_MAX_FD);
        // A whole message's worth with each of the first two bytes: the second never reaches
        // the daemon's table.
        send_fds(&client, &frame[..1], first, SendFlags::empty());
        send_fds(&client, &frame[1..2], second, SendFlags::empty());
        drop(writers);
        let mut received = Vec::new();
        let err = read_request_into(&server, &mut received)
            .await
            .expect_err("too many fds");
        assert_eq!(
            err.to_string(),
            "malformed fd-socket frame: the frame carried 253 fds; a request carries at most \
             one (IMPORT and ATTACH_RING one, REDEEM_EXPORT none)"
        );
        assert_eq!(received.len(), SCM_MAX_FD);
        drop(received);
        // The second message's fds are still queued in the socket, for whoever closes it.
        assert!(!writers_closed(&r));
        drop(server);
        assert!(writers_closed(&r));
    }

    #[tokio::test]
    async fn an_import_with_its_one_fd_and_a_redeem_with_none_are_read() {
        let (client, server) = pair();
        let (_r, writers) = pipe_with_writers(1);
        send_fds(&client, &import_frame(), &writers, SendFlags::empty());
        let mut received = Vec::new();
        let req = read_request_into(&server, &mut received)
            .await
            .expect("a good frame")
            .expect("a request");
        assert_eq!((req.op, received.len()), (Op::Import, 1));
        let redeem = Request {
            op: Op::RedeemExport,
            ticket: Ticket::from_bytes([4; 16]),
        }
        .encode();
        send_fds(&client, &redeem, &writers, SendFlags::empty());
        let err = read_request_into(&server, &mut received)
            .await
            .expect_err("an fd on REDEEM_EXPORT");
        assert!(
            err.to_string()
                .contains("REDEEM_EXPORT takes no fd, but the frame carried one"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_lifeline_reports_what_was_sent_on_it_with_its_fds_and_its_end() {
        let (client, server) = pair();
        accepted(&server).expect("SO_OOBINLINE");
        let (r, writers) = pipe_with_writers(3);
        send_fds(&client, b"hello", &writers, SendFlags::empty());
        drop(writers);
        let mut received = Vec::new();
        let end = watch_lifeline(&server, &mut received).await.expect("read");
        assert_eq!(end, LifelineEnd::Sent { bytes: 5, fds: 3 });
        assert!(!writers_closed(&r));
        drop(received);
        drop(client);
        let end = watch_lifeline(&server, &mut Vec::new())
            .await
            .expect("read");
        assert_eq!(end, LifelineEnd::Closed);
    }

    #[tokio::test]
    async fn fds_sent_out_of_band_reach_the_reader_instead_of_being_closed_in_the_read() {
        let (client, server) = pair();
        accepted(&server).expect("SO_OOBINLINE");
        let (r, writers) = pipe_with_writers(2);
        send_fds(&client, b"!", &writers, SendFlags::OOB);
        drop(writers);
        let mut received = Vec::new();
        let end = watch_lifeline(&server, &mut received).await.expect("read");
        assert_eq!(end, LifelineEnd::Sent { bytes: 1, fds: 2 });
        assert!(!writers_closed(&r));
    }
}
