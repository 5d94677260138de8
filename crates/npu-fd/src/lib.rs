//! File descriptors between npud and its local clients.
//!
//! Local clients share tensor memory with the daemon through file descriptors instead of copying
//! bytes through gRPC. This crate holds everything that needs `unsafe` or raw syscalls for that,
//! so the daemon and the client library can stay `#![forbid(unsafe_code)]`:
//!
//! - [`memfd`]: create memfds with the size seals the daemon requires, and check a client's fd
//!   before the daemon maps it ([`memfd::check_import`]).
//! - [`mapping`]: [`Mapping`], a shared `mmap` of part of an fd, unmapped on drop, with byte and
//!   typed (`bytemuck::Pod`) views.
//! - [`wire`]: the fd socket, a Unix stream socket beside the gRPC socket that carries fds with
//!   `SCM_RIGHTS` in fixed-size frames, each exchange bound to a one-time [`wire::Ticket`] that a
//!   gRPC call issued.
//!
//! One error type, [`FdError`], covers the crate; its messages say what to change.
//!
//! Linux only: memfd sealing, `SO_PEERCRED` and `MSG_CMSG_CLOEXEC` have no portable equivalent.

mod error;
pub mod mapping;
pub mod memfd;
pub mod wire;

pub use error::FdError;
pub use mapping::Mapping;
pub use memfd::{Access, FdFacts, FdKind, SealFlags};
