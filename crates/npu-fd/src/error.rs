//! The crate's one error type.

use std::io;

use crate::memfd::{Access, FdKind};
use crate::wire::Status;

/// Everything that can go wrong creating, checking, mapping or passing a file descriptor.
///
/// The messages are meant for the person who wrote the client: each one says what was found and,
/// where there is one, what to change. [`FdError::wire_status`] gives the status code the daemon
/// answers with on the fd socket.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FdError {
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Sys {
        /// The call, as a C programmer would search for it (`memfd_create`, `recvmsg`, ...).
        call: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// The fd is not a memfd (nor a shmem file that carries the size seals).
    #[error(
        "fd is {kind}, not a memfd: create it with memfd_create(name, MFD_CLOEXEC | \
         MFD_ALLOW_SEALING), size it with ftruncate, and seal it with fcntl(fd, F_ADD_SEALS, \
         F_SEAL_SHRINK | F_SEAL_GROW)"
    )]
    NotMemfd {
        /// What the fd is instead.
        kind: FdKind,
    },

    /// The memfd lacks `F_SEAL_SHRINK`, `F_SEAL_GROW` or both.
    #[error("memfd lacks the {missing} seal{}: {}", plural(missing), seal_hint(*sealing_locked))]
    MissingSeals {
        /// The missing seals, by their C names (`"F_SEAL_SHRINK and F_SEAL_GROW"`).
        missing: &'static str,
        /// `F_SEAL_SEAL` is set (or the memfd was created without `MFD_ALLOW_SEALING`), so no
        /// seal can be added any more.
        sealing_locked: bool,
    },

    /// The fd's size differs from the size declared for the tensor.
    #[error(
        "memfd is {actual} bytes but the tensor was declared as {declared} bytes: ftruncate it \
         to {declared} before sealing, or declare {actual}"
    )]
    SizeMismatch {
        /// The size `fstat` reports.
        actual: u64,
        /// The size the gRPC call declared.
        declared: u64,
    },

    /// The memfd carries a write seal, so it cannot be mapped writable.
    #[error(
        "memfd carries {seal}: the daemon writes results into imported tensors and cannot map \
         it writable; send a memfd sealed with F_SEAL_SHRINK | F_SEAL_GROW only"
    )]
    WriteSealed {
        /// The seal found, by its C name.
        seal: &'static str,
    },

    /// The fd was not opened read-write.
    #[error(
        "fd is open {access}, but the daemon maps tensors read-write: send the memfd itself \
         (memfd_create opens it O_RDWR), not a reopened copy"
    )]
    NotReadWrite {
        /// How the fd was opened.
        access: Access,
    },

    /// A mapping of zero bytes was asked for.
    #[error("cannot map 0 bytes: a mapping needs a length of at least 1")]
    ZeroLength,

    /// The mapping would reach past the end of the fd.
    #[error(
        "cannot map {len} bytes at offset {offset}: the fd is only {size} bytes long, and \
         touching pages past its end raises SIGBUS"
    )]
    OutOfRange {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Size of the fd.
        size: u64,
    },

    /// A copy would reach past the mapping's end.
    #[error("bytes {offset}..{} are outside the {mapped}-byte mapping", .offset.saturating_add(*.len))]
    RangeOutsideMapping {
        offset: usize,
        len: usize,
        mapped: usize,
    },

    /// A write view was asked of a read-only mapping.
    #[error("the mapping is read-only: map the fd with Mapping::new to write it")]
    ReadOnlyMapping,

    /// A view or copy of client memory that is lent to the daemon
    /// ([`crate::ClientMemory::lend`]).
    #[error("the memory is lent to the daemon for a call that may still write it")]
    Lent,

    /// A typed view does not fit the mapped bytes.
    #[error("cannot view {len} mapped bytes as [{ty}]: {reason}")]
    BadView {
        /// The element type's name.
        ty: &'static str,
        /// Length of the mapping in bytes.
        len: usize,
        /// What does not fit (alignment or length).
        reason: String,
    },

    /// A ticket is not 16 bytes, or its text form is not 32 hex characters.
    #[error("invalid ticket: {reason}")]
    BadTicket {
        /// What is wrong with it.
        reason: String,
    },

    /// A frame on the fd socket broke the protocol; the connection cannot be trusted any more.
    #[error("malformed fd-socket frame: {0}")]
    Malformed(String),

    /// The peer closed the fd socket in the middle of a frame.
    #[error("the fd socket closed after {got} of the {want} bytes of a frame")]
    Truncated {
        /// Bytes of the frame that arrived.
        got: usize,
        /// Frame length.
        want: usize,
    },

    /// The daemon closed the fd socket without answering a request.
    #[error("the daemon closed the fd socket without answering")]
    NoResponse,

    /// The daemon answered with an error status.
    #[error("the daemon refused the request ({status}): {message}")]
    Rejected {
        /// The status code from the response frame.
        status: Status,
        /// The daemon's message.
        message: String,
    },
}

impl FdError {
    /// Wraps a system call's error, naming the call.
    pub(crate) fn sys(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> FdError {
        move |errno| FdError::Sys {
            call,
            source: errno.into(),
        }
    }

    /// Wraps a `std::io` error, naming the call.
    pub(crate) fn io(call: &'static str) -> impl FnOnce(io::Error) -> FdError {
        move |source| FdError::Sys { call, source }
    }

    /// The status code the daemon sends on the fd socket when this error refuses a request.
    ///
    /// Import checks map to their own codes, a broken frame to [`Status::MALFORMED`], a
    /// [`FdError::Rejected`] keeps its code, and anything else is [`Status::INTERNAL`].
    pub fn wire_status(&self) -> Status {
        match self {
            FdError::NotMemfd { .. } => Status::NOT_A_MEMFD,
            FdError::MissingSeals { .. } => Status::MISSING_SEALS,
            FdError::SizeMismatch { .. } => Status::SIZE_MISMATCH,
            FdError::NotReadWrite { .. } => Status::NOT_READ_WRITE,
            FdError::WriteSealed { .. } => Status::WRITE_SEALED,
            FdError::Malformed(_) | FdError::Truncated { .. } => Status::MALFORMED,
            FdError::Rejected { status, .. } => *status,
            _ => Status::INTERNAL,
        }
    }
}

fn plural(missing: &str) -> &'static str {
    if missing.contains(" and ") { "s" } else { "" }
}

fn seal_hint(sealing_locked: bool) -> &'static str {
    if sealing_locked {
        "this memfd has F_SEAL_SEAL (or was created without MFD_ALLOW_SEALING), so no seal can \
         be added; create a new one with memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING) and \
         seal it with fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)"
    } else {
        "add them with fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) before sending the fd, \
         so it cannot be truncated under the daemon's mapping"
    }
}
