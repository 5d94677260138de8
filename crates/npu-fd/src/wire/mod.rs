//! The fd socket: passing tensor fds between npud and local clients.
//!
//! gRPC cannot carry file descriptors, so the daemon listens on a second Unix socket beside its
//! gRPC socket. On it, fds travel with `SCM_RIGHTS` in both directions, and every exchange is
//! bound to a one-time [`Ticket`] that a gRPC call issued to a session:
//!
//! - **REDEEM_EXPORT** (op 1): the client allocated a tensor through gRPC and got a ticket; it
//!   sends the ticket and receives the tensor's fd, offset and size ([`client::redeem_export`]).
//! - **IMPORT** (op 2): the client declared a tensor through gRPC and got a ticket; it sends the
//!   ticket with its sealed memfd and receives an ok or a refusal ([`client::import`]).
//!
//! The daemon side is [`server::read_request`], [`server::write_response`] and
//! [`server::peer_uid`]. What a ticket is worth (which session, which tensor, which user, how
//! long it lives) is the daemon's business; this module only moves the frames and the fds.
//!
//! # Frames
//!
//! The socket is `SOCK_STREAM`. Every frame has a fixed size, all integers are little-endian,
//! and a frame and its fd go out in one `sendmsg`, so the kernel attaches the fd to the frame's
//! first byte and it cannot come out beside another frame. The receiver reads with `recvmsg`
//! (`MSG_CMSG_CLOEXEC`) into a buffer exactly one frame long, looping over short reads and
//! keeping fds from every part, with room in every read for the most fds one message carries
//! ([`SCM_MAX_FD`], 253); it checks `MSG_CTRUNC`. A plain `read` on this socket, or one with
//! less room, would have the kernel close the fds it cannot deliver inside the read, on the
//! reader's thread, for as long as closing them takes (which their sender chooses), so never
//! put a buffered reader or codec on it.
//!
//! Request, client to daemon, [`REQUEST_LEN`] = 64 bytes:
//!
//! | offset | size | field                                                              |
//! |-------:|-----:|--------------------------------------------------------------------|
//! |      0 |    4 | magic `"NPFD"`                                                     |
//! |      4 |    2 | version, 1                                                         |
//! |      6 |    2 | op: 1 = REDEEM_EXPORT, 2 = IMPORT                                  |
//! |      8 |   16 | ticket                                                             |
//! |     24 |   40 | reserved, zero (room for, e.g., a declared size in a later version) |
//!
//! IMPORT carries exactly one fd; REDEEM_EXPORT carries none.
//!
//! Response, daemon to client, [`RESPONSE_LEN`] = 256 bytes:
//!
//! | offset | size | field                                                            |
//! |-------:|-----:|------------------------------------------------------------------|
//! |      0 |    4 | magic `"NPFD"`                                                   |
//! |      4 |    2 | version, 1                                                       |
//! |      6 |    2 | status ([`Status`]), 0 = ok                                      |
//! |      8 |    8 | size: the tensor's size in bytes (REDEEM_EXPORT), else 0         |
//! |     16 |    8 | offset: where the tensor starts inside the fd (REDEEM_EXPORT), else 0 |
//! |     24 |    2 | message length *n*, at most [`MAX_MESSAGE_LEN`] = 224            |
//! |     26 |    6 | reserved, zero                                                   |
//! |     32 |  224 | message: *n* bytes of UTF-8 for a person, then zeros             |
//!
//! The ok response to REDEEM_EXPORT carries the tensor's fd; no other response carries one.
//!
//! Status codes: 0 OK, 1 UNKNOWN_TICKET (unknown, expired or already redeemed), 2 WRONG_UID
//! (the ticket belongs to another user), 3 WRONG_OP (the ticket is for the other op),
//! 4 NOT_A_MEMFD, 5 MISSING_SEALS, 6 SIZE_MISMATCH, 7 NOT_READ_WRITE (the import checks of
//! [`crate::memfd::check_import`]), 8 MALFORMED (the request broke the protocol; the daemon
//! closes the connection after answering), 9 INTERNAL, 10 WRITE_SEALED (the imported memfd
//! carries `F_SEAL_WRITE` or `F_SEAL_FUTURE_WRITE`), 11 RESOURCE_EXHAUSTED (a connection or
//! file-descriptor limit of the daemon's, named in the message; the daemon closes the
//! connection after answering), 12 UNAVAILABLE (shutting down or recovering), 13 TENSOR_GONE
//! (the ticket's tensor was freed or its session ended), 14 TENSOR_STATE (the tensor is not in
//! a state for this exchange). Codes 10 to 14 were added within version 1: a client that does
//! not know them still reads a refusal with its message ([`Status`] keeps unknown codes).
//!
//! Version 1 rejects a frame with another version, an unknown op, or non-zero reserved bytes,
//! so a later version can give those bytes meaning under a new version number. A frame with more
//! fds than its op takes (naming their count), an IMPORT without an fd and a REDEEM_EXPORT with
//! one are rejected as well; fds of a rejected frame are closed, never leaked. After the OK
//! answer to ATTACH_RING the connection carries nothing more: [`server::watch_lifeline`] waits
//! for its end and reports anything sent on it.
//!
//! # Limits
//!
//! - A request frame holds at most [`SCM_MAX_FD`] + 1 of the client's fds in the daemon: it is
//!   refused as soon as it has brought more than one. Bytes and frames per second are the
//!   daemon's to bound, per connection.
//! - A process with no free descriptor cannot take the fds a read brings: the kernel closes
//!   them inside the read and reports `MSG_CTRUNC`, which refuses the frame.
//! - [`server::peer_uid`] is the uid at `connect` time (`SO_PEERCRED`), which is what a ticket's
//!   session is bound to.

pub mod client;
mod frame;
mod io;
pub mod server;
mod ticket;

pub use frame::{
    MAGIC, MAX_MESSAGE_LEN, Op, REQUEST_LEN, RESPONSE_LEN, Request, Response, Status, VERSION,
};
pub use io::SCM_MAX_FD;
pub use ticket::Ticket;
