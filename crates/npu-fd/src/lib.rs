//! File descriptors between npud and its local clients.
//!
//! Local clients share tensor memory with the daemon through file descriptors instead of copying
//! bytes through gRPC. This crate holds everything that needs `unsafe` or raw syscalls for that,
//! so the daemon and the client library can stay `#![forbid(unsafe_code)]`:
//!
//! - [`memfd`]: create memfds with the size seals the daemon requires, and check a client's fd
//!   before the daemon maps it ([`memfd::check_import`]).
//! - [`mapping`]: [`Mapping`], a shared `mmap` of part of an fd, unmapped on drop, with safe
//!   byte and typed (`bytemuck::Pod`) copies through raw pointers, and `unsafe` views (memory
//!   another process or the device writes is not a slice).
//! - [`client_memory`]: [`ClientMemory`], a client's own tensor memory, whose views are safe
//!   because nothing else maps it and the daemon writes it only while it is lent.
//! - [`latency`]: every spin, sleep and back-off tuned by measurement, for both sides of the
//!   ring and the daemon's threads that serve it, each with its reason and its measurement.
//! - [`peer`]: the supplementary groups of a Unix socket's peer (`SO_PEERGROUPS`).
//! - [`ring`]: the dispatch ring's shared memory ([`ring::RingMemory`]), its slots and its futex
//!   doorbells, every access atomic (`proto/npud/v1/ring.md`).
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
//! input.write_from(0, &[1.5f32; 1024])?;
//! assert_eq!(input.read_vec::<f32>(4092, 1)?, [1.5]);
//!
//! // On the daemon's side, after npu_fd::wire::server::read_request handed it the fd:
//! let facts = memfd::check_import(fd.as_fd(), 4096)?;
//! assert!(facts.size_is_sealed());
//! # Ok::<(), npu_fd::FdError>(())
//! ```
//!
//! Linux only: memfd sealing, `SO_PEERCRED` and `MSG_CMSG_CLOEXEC` have no portable equivalent.

pub mod client_memory;
mod error;
pub mod latency;
pub mod mapping;
pub mod memfd;
pub mod peer;
pub mod ring;
pub mod wire;

pub use client_memory::ClientMemory;
pub use error::FdError;
pub use mapping::Mapping;
pub use memfd::{Access, FdFacts, FdKind, SealFlags};
