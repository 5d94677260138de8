//! `sendmsg`/`recvmsg` with `SCM_RIGHTS`, shared by the blocking client and the tokio server.
//!
//! Each function makes one system call (retrying `EINTR`) and works on blocking and
//! non-blocking sockets alike: on a non-blocking one, `EAGAIN` comes back as
//! `io::ErrorKind::WouldBlock`, which is what tokio's `async_io` expects.
//!
//! # Every fd is received; none is closed inside a read
//!
//! A read of a Unix stream socket takes the fds that came with the bytes it returns. Where the
//! reader leaves no room for them (a plain `read`) or too little (`MSG_CTRUNC`), the kernel
//! closes them inside the call, on the reader's thread, and closing an fd a peer chose can take
//! as long as that peer wants: the last close of a TCP socket with `SO_LINGER` and unsent data,
//! of a file on a FUSE mount the peer serves. So every receive here ([`recv_once`]) makes room
//! for the most fds one message can carry, [`SCM_MAX_FD`]: on a stream socket one `recvmsg`
//! returns the fds of one message at most (the kernel stops reading after the first message
//! that brought any), and one message carries at most `SCM_MAX_FD` (the kernel refuses a
//! `sendmsg` with more). Every fd received goes to the caller, who decides where to close it.
//!
//! One case is left to the kernel: a process with no free descriptor (`EMFILE`) cannot take
//! them, and the kernel closes those it could not install, reporting `MSG_CTRUNC`
//! ([`Recv::truncated`]). A daemon keeps that from happening by keeping descriptors in reserve.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::FdError;

/// The most fds one message can carry: the kernel's `SCM_MAX_FD` (`include/net/scm.h`), which
/// `sendmsg` enforces. So also the most one `recvmsg` of a stream socket can deliver.
pub const SCM_MAX_FD: usize = 253;

/// Room for a whole message's fds, and for credentials besides (which come only if the receiver
/// set `SO_PASSCRED`, and would otherwise crowd fds out): 1,064 bytes, on the stack.
const CONTROL_SPACE: usize = rustix::cmsg_space!(ScmRights(SCM_MAX_FD), ScmCredentials(1));

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

/// What one [`recv_once`] brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recv {
    /// Bytes received; 0 is the end of the stream.
    pub(crate) bytes: usize,
    /// Fds received (appended to the caller's list).
    pub(crate) fds: usize,
    /// `MSG_CTRUNC`: the kernel closed fds it could not deliver (only when the process had no
    /// free descriptor, since the control buffer holds a whole message's).
    pub(crate) truncated: bool,
}

/// One `recvmsg` into `buf`, with room for every fd one message carries; the fds received
/// (close-on-exec) are appended to `fds`, none closed here.
///
/// Costs one system call and a 1 KiB control buffer on the stack, whatever the peer sent.
pub(crate) fn recv_once(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<Recv> {
    let mut space = [MaybeUninit::<u8>::uninit(); CONTROL_SPACE];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let message = loop {
        let mut iov = [IoSliceMut::new(buf)];
        match rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Err(Errno::INTR) => {}
            result => break result?,
        }
    };
    // Every fd is taken out of the buffer here: one left in it would be closed when the buffer
    // is dropped, on this thread.
    let before = fds.len();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    Ok(Recv {
        bytes: message.bytes,
        fds: fds.len() - before,
        truncated: message.flags.contains(ReturnFlags::CTRUNC),
    })
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
    /// never consumed ([`recv_once`]: every fd that came is kept, in `fds`). Returns the bytes
    /// received; 0 means end of stream.
    pub(crate) fn recv(&mut self, socket: BorrowedFd<'_>) -> io::Result<usize> {
        let r = recv_once(socket, &mut self.bytes[self.filled..], &mut self.fds)?;
        self.fds_received += r.fds;
        self.control_truncated |= r.truncated;
        self.filled += r.bytes;
        Ok(r.bytes)
    }

    /// Refuses a frame that lost fds to `MSG_CTRUNC` (the receiver had no free descriptor),
    /// or brought more than `most`. The fds stay where they are for the caller to close.
    pub(crate) fn check_fds(&self, most: usize, what: &str) -> Result<(), FdError> {
        if self.control_truncated {
            return Err(FdError::Malformed(format!(
                "the receiver had no free descriptor for the {} fds the frame carried; the \
                 kernel closed the ones it could not deliver",
                self.fds_received
            )));
        }
        if self.fds_received > most {
            return Err(FdError::Malformed(format!(
                "the frame carried {} fds; {what}",
                self.fds_received
            )));
        }
        Ok(())
    }

    /// Fds received for this frame so far.
    pub(crate) fn fds_received(&self) -> usize {
        self.fds_received
    }

    /// The frame's one fd, if it had one (call [`FrameBuf::check_fds`] first).
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    /// A pipe's read end and `n` clones of its write end: the read end sees the end of the
    /// stream only once every clone (wherever it went) is closed.
    fn pipe_with_writers(n: usize) -> (OwnedFd, Vec<OwnedFd>) {
        let (r, w) = std::io::pipe().expect("pipe");
        let writers = (0..n)
            .map(|_| OwnedFd::from(w.try_clone().expect("dup")))
            .collect();
        (OwnedFd::from(r), writers)
    }

    /// Whether every write end of the pipe is closed: a read would see the end of the stream.
    fn writers_closed(r: &OwnedFd) -> bool {
        rustix::io::ioctl_fionbio(r, true).expect("non-blocking");
        let mut b = [0_u8; 1];
        matches!(rustix::io::read(r, &mut b), Ok(0))
    }

    fn send_fds(sock: &UnixStream, bytes: &[u8], fds: &[OwnedFd]) {
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
        let n = rustix::net::sendmsg(
            sock,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .expect("sendmsg");
        assert_eq!(n, bytes.len());
    }

    #[test]
    fn a_whole_message_of_fds_is_received_and_none_is_closed_by_the_kernel() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (r, writers) = pipe_with_writers(SCM_MAX_FD);
        send_fds(&a, b"x", &writers);
        drop(writers);
        let mut fds = Vec::new();
        let mut buf = [0_u8; 64];
        let got = recv_once(b.as_fd(), &mut buf, &mut fds).expect("recvmsg");
        assert_eq!(
            got,
            Recv {
                bytes: 1,
                fds: SCM_MAX_FD,
                truncated: false
            }
        );
        // The kernel closed none: the pipe's writers are all in `fds`.
        assert!(!writers_closed(&r));
        drop(fds);
        assert!(writers_closed(&r));
    }

    #[test]
    fn the_kernel_refuses_a_message_with_more_than_scm_max_fd() {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let (_r, writers) = pipe_with_writers(SCM_MAX_FD + 1);
        let borrowed: Vec<BorrowedFd<'_>> = writers.iter().map(AsFd::as_fd).collect();
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(borrowed.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
        let r = rustix::net::sendmsg(&a, &[IoSlice::new(b"x")], &mut control, SendFlags::NOSIGNAL);
        assert_eq!(r, Err(Errno::INVAL), "SCM_MAX_FD is the kernel's bound");
    }

    #[test]
    fn one_recvmsg_takes_the_fds_of_one_message_only() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (r, writers) = pipe_with_writers(2 * SCM_MAX_FD);
        let (first, second) = writers.split_at(SCM_MAX_FD);
        send_fds(&a, b"ab", first);
        send_fds(&a, b"cd", second);
        drop(writers);
        let mut fds = Vec::new();
        let mut buf = [0_u8; 64];
        let got = recv_once(b.as_fd(), &mut buf, &mut fds).expect("recvmsg");
        assert_eq!((got.bytes, got.fds, got.truncated), (2, SCM_MAX_FD, false));
        let got = recv_once(b.as_fd(), &mut buf, &mut fds).expect("recvmsg");
        assert_eq!((got.bytes, got.fds, got.truncated), (2, SCM_MAX_FD, false));
        assert_eq!(&buf[..2], b"cd");
        assert!(!writers_closed(&r));
    }

    #[test]
    fn a_frame_counts_fds_from_every_part_and_refuses_more_than_it_may_carry() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (r, writers) = pipe_with_writers(3);
        let (one, two) = writers.split_at(1);
        send_fds(&a, &[0; 10], one);
        send_fds(&a, &[0; 54], two);
        drop(writers);
        let mut frame = FrameBuf::<64>::new();
        while !frame.is_complete() {
            assert!(frame.recv(b.as_fd()).expect("recvmsg") > 0);
        }
        assert_eq!(frame.fds_received(), 3);
        let err = frame.check_fds(1, "IMPORT takes one").expect_err("3 fds");
        assert_eq!(
            err.to_string(),
            "malformed fd-socket frame: the frame carried 3 fds; IMPORT takes one"
        );
        assert!(!writers_closed(&r), "the caller has them, not the kernel");
        drop(frame);
        assert!(writers_closed(&r));
    }
}
