//! `sendmsg`/`recvmsg` with `SCM_RIGHTS`, shared by the blocking client and the tokio server.
//!
//! Each function makes one system call (retrying `EINTR`) and works on blocking and
//! non-blocking sockets alike: on a non-blocking one, `EAGAIN` comes back as
//! `io::ErrorKind::WouldBlock`, which is what tokio's `async_io` expects.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::FdError;

/// Room for more fds than a frame may carry, so that an extra fd is received and counted (then
/// closed) rather than cut off by the kernel with `MSG_CTRUNC`.
const FDS_PER_RECV: usize = 4;

/// Sends `bytes` with one `sendmsg`, attaching `fd` when there is one. Returns the bytes sent,
/// which on a stream socket may be fewer than `bytes.len()`; the fd then travels with the first
/// of them.
pub(crate) fn send_once(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<usize> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let fds = fd.map(|fd| [fd]);
    let mut control = SendAncillaryBuffer::new(&mut space);
    if let Some(fds) = &fds
        && !control.push(SendAncillaryMessage::ScmRights(fds))
    {
        return Err(io::Error::other("no room for one fd in the control buffer"));
    }
    loop {
        match rustix::net::sendmsg(
            socket,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Err(Errno::INTR) => {}
            result => return result.map_err(io::Error::from),
        }
    }
}

/// A frame of `N` bytes being received, with the fds that arrived with it.
pub(crate) struct FrameBuf<const N: usize> {
    pub(crate) bytes: [u8; N],
    filled: usize,
    pub(crate) fds: Vec<OwnedFd>,
    /// Fds received for this frame, whether or not still in `fds`.
    fds_received: usize,
    control_truncated: bool,
}

impl<const N: usize> FrameBuf<N> {
    pub(crate) fn new() -> Self {
        FrameBuf {
            bytes: [0; N],
            filled: 0,
            fds: Vec::new(),
            fds_received: 0,
            control_truncated: false,
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.filled == N
    }

    pub(crate) fn filled(&self) -> usize {
        self.filled
    }

    /// One `recvmsg` into the part of the frame still missing, so bytes of the next frame are
    /// never consumed. Fds are received close-on-exec and kept. Returns the bytes received; 0
    /// means end of stream.
    pub(crate) fn recv(&mut self, socket: BorrowedFd<'_>) -> io::Result<usize> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_RECV))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let message = loop {
            let mut iov = [IoSliceMut::new(&mut self.bytes[self.filled..])];
            match rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
                Err(Errno::INTR) => {}
                result => break result?,
            }
        };
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                let before = self.fds.len();
                self.fds.extend(fds);
                self.fds_received += self.fds.len() - before;
            }
        }
        self.control_truncated |= message.flags.contains(ReturnFlags::CTRUNC);
        self.filled += message.bytes;
        Ok(message.bytes)
    }

    /// Refuses a frame that brought more than one fd, or lost some to `MSG_CTRUNC`. The fds are
    /// closed when the `FrameBuf` is dropped.
    pub(crate) fn check_fd_count(&self) -> Result<(), FdError> {
        if self.control_truncated {
            return Err(FdError::Malformed(
                "the frame carried more fds than the receiver makes room for; the kernel closed \
                 the ones that did not fit, and a frame carries at most one"
                    .into(),
            ));
        }
        if self.fds_received > 1 {
            return Err(FdError::Malformed(format!(
                "the frame carried {} fds; a frame carries at most one",
                self.fds_received
            )));
        }
        Ok(())
    }

    /// Fds received for this frame so far.
    pub(crate) fn fds_received(&self) -> usize {
        self.fds_received
    }

    /// The frame's one fd, if it had one (call [`FrameBuf::check_fd_count`] first).
    pub(crate) fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop()
    }

    /// The error for an end of stream in the middle of this frame.
    pub(crate) fn truncated(&self) -> FdError {
        FdError::Truncated {
            got: self.filled,
            want: N,
        }
    }
}
