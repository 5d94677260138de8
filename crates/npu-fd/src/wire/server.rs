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
use super::io::{FrameBuf, send_once};
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
/// [`read_request_into`] and closes them elsewhere.
///
/// # Errors
///
/// [`FdError::Malformed`] naming the problem (bad magic, version or op, non-zero reserved
/// bytes, more than one fd, IMPORT without an fd, an fd on REDEEM_EXPORT); every fd that came
/// with a refused frame is closed. [`FdError::Truncated`] when the client hung up mid-frame,
/// [`FdError::Sys`] for socket errors.
pub async fn read_request(
    stream: &UnixStream,
) -> Result<Option<(Request, Option<OwnedFd>)>, FdError> {
    let mut received = Vec::new();
    let request = read_request_into(stream, &mut received).await?;
    Ok(request.map(|r| (r, received.pop())))
}

/// [`read_request`], leaving every fd received in `received` instead of closing any: on
/// success the request's own fd (an IMPORT's) is the last one, and the only one received for
/// this frame; after an error, or if the future is dropped mid-frame, whatever came is there
/// for the caller to close where blocking does no harm.
///
/// # Errors
///
/// As [`read_request`].
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
    }
    frame.check_fd_count()?;
    let request = Request::decode(&frame.bytes)?;
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
