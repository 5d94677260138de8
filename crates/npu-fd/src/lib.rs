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
//! What a client does before importing a tensor, and what the daemon checks when the fd arrives:
//!
//! ```
//! use std::os::fd::AsFd;
//! use npu_fd::{Mapping, memfd};
//!
//! let fd = memfd::create("input", 4096)?; // sealed: SHRINK | GROW
//! let mut input = Mapping::new(fd.as_fd(), 0, 4096)?;
//! input.as_mut_slice_of::<f32>()?.fill(1.5);
//!
//! // On the daemon's side, after npu_fd::wire::server::read_request handed it the fd:
//! let facts = memfd::check_import(fd.as_fd(), 4096)?;
//! assert!(facts.size_is_sealed());
//! # Ok::<(), npu_fd::FdError>(())
//! ```
//!
//! Linux only: memfd sealing, `SO_PEERCRED` and `MSG_CMSG_CLOEXEC` have no portable equivalent.

mod error;
pub mod mapping;
pub mod memfd;
pub mod wire;

pub use error::FdError;
pub use mapping::Mapping;
pub use memfd::{Access, FdFacts, FdKind, SealFlags};
