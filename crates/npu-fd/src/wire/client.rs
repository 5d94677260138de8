//! The client side: blocking calls on a `std::os::unix::net::UnixStream`.
//!
//! The client library runs these on a blocking thread. Each call sends one request and waits
//! for its response; one connection serves any number of calls in sequence. A read timeout set
//! on the stream (`set_read_timeout`) bounds the wait and comes back as [`FdError::Sys`].

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::frame::{REQUEST_LEN, RESPONSE_LEN};
use super::io::{FrameBuf, send_once};
use super::{Op, Request, Response, Ticket};
use crate::FdError;

/// Redeems an export ticket: receives the fd of a tensor the daemon allocated.
///
/// Returns the fd (close-on-exec), the offset where the tensor starts inside it, and the
/// tensor's size in bytes; map it with [`crate::Mapping::new`]`(fd, offset, size)`, or redeem
/// with [`crate::ClientMemory::redeem_export`] to get memory with safe views.
///
/// # Errors
///
/// [`FdError::Rejected`] with the daemon's status and message (unknown ticket, wrong user, ...),
/// [`FdError::NoResponse`] or [`FdError::Truncated`] if the daemon hung up,
/// [`FdError::Malformed`] for a response that breaks the protocol (an ok answer without an fd,
/// for one), [`FdError::Sys`] for socket errors.
#[doc(alias = "REDEEM_EXPORT")]
pub fn redeem_export(stream: &UnixStream, ticket: &Ticket) -> Result<(OwnedFd, u64, u64), FdError> {
    let request = Request {
        op: Op::RedeemExport,
        ticket: *ticket,
    };
    send_request(stream, &request, None)?;
    let (response, fd) = read_response(stream)?;
    let fd = fd.ok_or_else(|| {
        FdError::Malformed("the daemon's ok answer to REDEEM_EXPORT carried no fd".into())
    })?;
    Ok((fd, response.offset, response.size))
}

/// Sends the memfd of a tensor the client declared, redeeming an import ticket.
///
/// The memfd must pass [`crate::memfd::check_import`] for the declared size (create it with
/// [`crate::memfd::create`]); the daemon checks it again and refuses it otherwise. The client
/// keeps its own fd and may close it once this returns.
///
/// # Errors
///
/// As [`redeem_export`]; a refused memfd comes back as [`FdError::Rejected`] with the daemon's
/// explanation.
#[doc(alias = "IMPORT")]
pub fn import(stream: &UnixStream, ticket: &Ticket, fd: BorrowedFd<'_>) -> Result<(), FdError> {
    let request = Request {
        op: Op::Import,
        ticket: *ticket,
    };
    send_request(stream, &request, Some(fd))?;
    let (_, fd) = read_response(stream)?;
    if fd.is_some() {
        return Err(FdError::Malformed(
            "the daemon's answer to IMPORT carried an fd; it was closed".into(),
        ));
    }
    Ok(())
}

fn send_request(
    stream: &UnixStream,
    request: &Request,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), FdError> {
    let frame: [u8; REQUEST_LEN] = request.encode();
    let mut sent = 0;
    while sent < frame.len() {
        let attach = if sent == 0 { fd } else { None };
        match send_once(stream.as_fd(), &frame[sent..], attach) {
            Ok(0) => return Err(FdError::io("sendmsg")(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => sent += n,
            Err(e) => return Err(FdError::io("sendmsg")(e)),
        }
    }
    Ok(())
}

/// Reads one response; a refusal becomes [`FdError::Rejected`] (closing any fd that came
/// with it).
fn read_response(stream: &UnixStream) -> Result<(Response, Option<OwnedFd>), FdError> {
    let mut frame = FrameBuf::<RESPONSE_LEN>::new();
    while !frame.is_complete() {
        let n = frame.recv(stream.as_fd()).map_err(FdError::io("recvmsg"))?;
        if n == 0 {
            return Err(if frame.filled() == 0 {
                FdError::NoResponse
            } else {
                frame.truncated()
            });
        }
    }
    frame.check_fds(1, "a response carries at most one")?;
    let response = Response::decode(&frame.bytes)?;
    if !response.is_ok() {
        return Err(FdError::Rejected {
            status: response.status,
            message: response.message,
        });
    }
    Ok((response, frame.take_fd()))
}

/// Sends the memfd of a session's dispatch ring, redeeming a ring ticket (`AttachRing`).
///
/// Once this returns, keep `stream` open for as long as the ring is used: it is the ring's
/// lifeline, and the daemon tears the ring down when it closes.
///
/// # Errors
///
/// As [`import`].
#[doc(alias = "ATTACH_RING")]
pub fn attach_ring(
    stream: &UnixStream,
    ticket: &Ticket,
    fd: BorrowedFd<'_>,
) -> Result<(), FdError> {
    let request = Request {
        op: Op::AttachRing,
        ticket: *ticket,
    };
    send_request(stream, &request, Some(fd))?;
    let (_, fd) = read_response(stream)?;
    if fd.is_some() {
        return Err(FdError::Malformed(
            "the daemon's answer to ATTACH_RING carried an fd; it was closed".into(),
        ));
    }
    Ok(())
}
