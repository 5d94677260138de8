//! The two fixed-size frames of the fd socket and their encoding (byte tables in [`super`]).

use std::fmt;

use super::Ticket;
use crate::FdError;

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"NPFD";
/// Protocol version this crate speaks.
pub const VERSION: u16 = 1;
/// Length of a request frame in bytes.
pub const REQUEST_LEN: usize = 64;
/// Length of a response frame in bytes.
pub const RESPONSE_LEN: usize = 256;
/// Longest message a response carries, in bytes of UTF-8.
pub const MAX_MESSAGE_LEN: usize = RESPONSE_LEN - MESSAGE_AT;

const MESSAGE_AT: usize = 32;
const REQUEST_RESERVED: std::ops::Range<usize> = 24..REQUEST_LEN;
const RESPONSE_RESERVED: std::ops::Range<usize> = 26..MESSAGE_AT;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// "Give me the fd of a tensor the daemon allocated." Carries no fd; the ok response carries
    /// one.
    RedeemExport,
    /// "Here is my memfd for a tensor I declared." Carries exactly one fd; the response none.
    Import,
    /// "Here is the memfd of my session's dispatch ring." Carries exactly one fd; the response
    /// none. The connection then stays open as the ring's lifeline (`ring.md`).
    AttachRing,
}

impl Op {
    /// The op's number on the wire.
    pub const fn code(self) -> u16 {
        match self {
            Op::RedeemExport => 1,
            Op::Import => 2,
            Op::AttachRing => 3,
        }
    }

    /// The op with this number, if there is one.
    pub const fn from_code(code: u16) -> Option<Op> {
        match code {
            1 => Some(Op::RedeemExport),
            2 => Some(Op::Import),
            3 => Some(Op::AttachRing),
            _ => None,
        }
    }

    /// Whether a request with this op carries an fd.
    pub const fn request_carries_fd(self) -> bool {
        matches!(self, Op::Import | Op::AttachRing)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::RedeemExport => "REDEEM_EXPORT",
            Op::Import => "IMPORT",
            Op::AttachRing => "ATTACH_RING",
        })
    }
}

/// A request frame, client to daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// What the client asks for.
    pub op: Op,
    /// The ticket a gRPC call issued for this exchange.
    pub ticket: Ticket,
}

impl Request {
    /// The frame's bytes.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut frame = [0_u8; REQUEST_LEN];
        frame[0..4].copy_from_slice(&MAGIC);
        frame[4..6].copy_from_slice(&VERSION.to_le_bytes());
        frame[6..8].copy_from_slice(&self.op.code().to_le_bytes());
        frame[8..24].copy_from_slice(self.ticket.as_bytes());
        frame
    }

    /// Parses a frame.
    ///
    /// # Errors
    ///
    /// [`FdError::Malformed`] naming the bad magic, version, op or non-zero reserved bytes.
    pub fn decode(frame: &[u8; REQUEST_LEN]) -> Result<Request, FdError> {
        check_header(frame)?;
        let code = u16_at(frame, 6);
        let op = Op::from_code(code).ok_or_else(|| {
            FdError::Malformed(format!(
                "unknown op {code} (1 = REDEEM_EXPORT, 2 = IMPORT, 3 = ATTACH_RING)"
            ))
        })?;
        check_zero(frame, REQUEST_RESERVED)?;
        let mut ticket = [0_u8; Ticket::LEN];
        ticket.copy_from_slice(&frame[8..24]);
        Ok(Request {
            op,
            ticket: Ticket::from_bytes(ticket),
        })
    }
}

/// A response status: 0 is success, anything else says why the daemon refused.
///
/// Kept as the integer from the wire, so a code added by a newer daemon still reaches the
/// caller.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub u16);

impl Status {
    /// The request was served.
    pub const OK: Status = Status(0);
    /// The ticket is unknown, expired or already redeemed.
    pub const UNKNOWN_TICKET: Status = Status(1);
    /// The ticket was issued to a session of another user than the fd socket's peer.
    pub const WRONG_UID: Status = Status(2);
    /// The ticket was issued for the other op (an import ticket sent with REDEEM_EXPORT, or the
    /// reverse).
    pub const WRONG_OP: Status = Status(3);
    /// The imported fd is not a memfd.
    pub const NOT_A_MEMFD: Status = Status(4);
    /// The imported memfd lacks `F_SEAL_SHRINK` or `F_SEAL_GROW`.
    pub const MISSING_SEALS: Status = Status(5);
    /// The imported memfd's size differs from the declared tensor size.
    pub const SIZE_MISMATCH: Status = Status(6);
    /// The imported fd is not open read-write.
    pub const NOT_READ_WRITE: Status = Status(7);
    /// The request frame was malformed; the daemon closes the connection after answering.
    pub const MALFORMED: Status = Status(8);
    /// The daemon failed for a reason of its own.
    pub const INTERNAL: Status = Status(9);
    /// The imported memfd carries `F_SEAL_WRITE` or `F_SEAL_FUTURE_WRITE`: the daemon writes
    /// results into it and cannot map it writable.
    pub const WRITE_SEALED: Status = Status(10);
    /// A limit of the daemon's was reached (connections, file descriptors); the message names
    /// it. The daemon closes the connection after answering.
    pub const RESOURCE_EXHAUSTED: Status = Status(11);
    /// The daemon is shutting down or its device is recovering; try again.
    pub const UNAVAILABLE: Status = Status(12);
    /// The ticket was valid but its tensor is gone (freed, or its session ended).
    pub const TENSOR_GONE: Status = Status(13);
    /// The tensor is not in a state for this exchange (no longer awaiting its import, or the
    /// memfd could not be mapped); the message says which.
    pub const TENSOR_STATE: Status = Status(14);

    /// The constant's name, for known codes.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "OK",
            1 => "UNKNOWN_TICKET",
            2 => "WRONG_UID",
            3 => "WRONG_OP",
            4 => "NOT_A_MEMFD",
            5 => "MISSING_SEALS",
            6 => "SIZE_MISMATCH",
            7 => "NOT_READ_WRITE",
            8 => "MALFORMED",
            9 => "INTERNAL",
            10 => "WRITE_SEALED",
            11 => "RESOURCE_EXHAUSTED",
            12 => "UNAVAILABLE",
            13 => "TENSOR_GONE",
            14 => "TENSOR_STATE",
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}"),
            None => write!(f, "status {}", self.0),
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({}: {self})", self.0)
    }
}

/// A response frame, daemon to client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// [`Status::OK`] or the reason for refusing.
    pub status: Status,
    /// REDEEM_EXPORT: the tensor's size in bytes. Otherwise 0.
    pub size: u64,
    /// REDEEM_EXPORT: where the tensor starts inside the fd. Otherwise 0.
    pub offset: u64,
    /// A message for a person; [`Response::encode`] keeps its first [`MAX_MESSAGE_LEN`] bytes
    /// (cut at a character boundary).
    pub message: String,
}

impl Response {
    /// The ok answer to IMPORT.
    pub fn ok() -> Response {
        Response {
            status: Status::OK,
            size: 0,
            offset: 0,
            message: String::new(),
        }
    }

    /// The ok answer to REDEEM_EXPORT; the fd goes with it.
    pub fn exported(offset: u64, size: u64) -> Response {
        Response {
            status: Status::OK,
            size,
            offset,
            message: String::new(),
        }
    }

    /// A refusal.
    pub fn error(status: Status, message: impl Into<String>) -> Response {
        Response {
            status,
            size: 0,
            offset: 0,
            message: message.into(),
        }
    }

    /// The refusal for an error, with [`FdError::wire_status`] and the error's message.
    pub fn from_error(error: &FdError) -> Response {
        Response::error(error.wire_status(), error.to_string())
    }

    /// Whether the status is [`Status::OK`].
    pub fn is_ok(&self) -> bool {
        self.status == Status::OK
    }

    /// The frame's bytes.
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let message = truncate_at_char(&self.message, MAX_MESSAGE_LEN);
        let message_len = u16::try_from(message.len()).expect("MAX_MESSAGE_LEN fits u16");
        let mut frame = [0_u8; RESPONSE_LEN];
        frame[0..4].copy_from_slice(&MAGIC);
        frame[4..6].copy_from_slice(&VERSION.to_le_bytes());
        frame[6..8].copy_from_slice(&self.status.0.to_le_bytes());
        frame[8..16].copy_from_slice(&self.size.to_le_bytes());
        frame[16..24].copy_from_slice(&self.offset.to_le_bytes());
        frame[24..26].copy_from_slice(&message_len.to_le_bytes());
        frame[MESSAGE_AT..MESSAGE_AT + message.len()].copy_from_slice(message.as_bytes());
        frame
    }

    /// Parses a frame.
    ///
    /// # Errors
    ///
    /// [`FdError::Malformed`] naming the bad magic, version, reserved bytes, message length or
    /// message encoding.
    pub fn decode(frame: &[u8; RESPONSE_LEN]) -> Result<Response, FdError> {
        check_header(frame)?;
        check_zero(frame, RESPONSE_RESERVED)?;
        let message_len = usize::from(u16_at(frame, 24));
        if message_len > MAX_MESSAGE_LEN {
            return Err(FdError::Malformed(format!(
                "message length {message_len} exceeds the {MAX_MESSAGE_LEN} bytes a response holds"
            )));
        }
        let message = std::str::from_utf8(&frame[MESSAGE_AT..MESSAGE_AT + message_len])
            .map_err(|e| FdError::Malformed(format!("response message is not UTF-8: {e}")))?;
        Ok(Response {
            status: Status(u16_at(frame, 6)),
            size: u64_at(frame, 8),
            offset: u64_at(frame, 16),
            message: message.to_owned(),
        })
    }
}

fn check_header(frame: &[u8]) -> Result<(), FdError> {
    if frame[0..4] != MAGIC {
        return Err(FdError::Malformed(format!(
            "bad magic \"{}\" (expected \"NPFD\"): the peer does not speak the npud fd protocol",
            frame[0..4].escape_ascii()
        )));
    }
    let version = u16_at(frame, 4);
    if version != VERSION {
        return Err(FdError::Malformed(format!(
            "unsupported protocol version {version} (this side speaks {VERSION})"
        )));
    }
    Ok(())
}

fn check_zero(frame: &[u8], reserved: std::ops::Range<usize>) -> Result<(), FdError> {
    if frame[reserved.clone()].iter().any(|&b| b != 0) {
        return Err(FdError::Malformed(format!(
            "reserved bytes {}..{} are not zero (version {VERSION} gives them no meaning)",
            reserved.start, reserved.end
        )));
    }
    Ok(())
}

fn u16_at(frame: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([frame[at], frame[at + 1]])
}

fn u64_at(frame: &[u8], at: usize) -> u64 {
    let mut bytes = [0_u8; 8];
    bytes.copy_from_slice(&frame[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn truncate_at_char(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const TICKET: Ticket =
        Ticket::from_bytes([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xa, 0xb, 0xc, 0xd, 0xe, 0xf]);

    #[test]
    fn request_layout_matches_the_byte_table() {
        let frame = Request {
            op: Op::Import,
            ticket: TICKET,
        }
        .encode();
        assert_eq!(&frame[0..4], b"NPFD");
        assert_eq!(&frame[4..6], &[1, 0]);
        assert_eq!(&frame[6..8], &[2, 0]);
        assert_eq!(&frame[8..24], TICKET.as_bytes());
        assert!(frame[24..].iter().all(|&b| b == 0));
    }

    #[test]
    fn response_layout_matches_the_byte_table() {
        let mut r = Response::exported(0x1122, 0x0102_0304_0506_0708);
        r.message = "hé".into();
        let frame = r.encode();
        assert_eq!(&frame[0..4], b"NPFD");
        assert_eq!(&frame[4..6], &[1, 0]);
        assert_eq!(&frame[6..8], &[0, 0]);
        assert_eq!(&frame[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&frame[16..24], &[0x22, 0x11, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&frame[24..26], &[3, 0]);
        assert_eq!(&frame[32..35], "hé".as_bytes());
        assert_eq!(Response::decode(&frame).expect("decode"), r);
    }

    #[test]
    fn malformed_requests_name_what_is_wrong() {
        let good = Request {
            op: Op::RedeemExport,
            ticket: TICKET,
        }
        .encode();
        let cases: [(usize, u8, &str); 4] = [
            (0, b'X', "bad magic \"XPFD\" (expected \"NPFD\")"),
            (4, 7, "unsupported protocol version 7 (this side speaks 1)"),
            (
                6,
                9,
                "unknown op 9 (1 = REDEEM_EXPORT, 2 = IMPORT, 3 = ATTACH_RING)",
            ),
            (40, 1, "reserved bytes 24..64 are not zero"),
        ];
        for (at, value, expected) in cases {
            let mut frame = good;
            frame[at] = value;
            let err = Request::decode(&frame).expect_err(expected);
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn malformed_responses_name_what_is_wrong() {
        let mut frame = Response::error(Status::INTERNAL, "x").encode();
        frame[24] = 225;
        let err = Response::decode(&frame).expect_err("too long");
        assert!(
            err.to_string().contains("message length 225 exceeds"),
            "{err}"
        );
        frame[24] = 1;
        frame[32] = 0xff;
        let err = Response::decode(&frame).expect_err("not UTF-8");
        assert!(err.to_string().contains("not UTF-8"), "{err}");
        frame[32] = b'x';
        frame[30] = 1;
        let err = Response::decode(&frame).expect_err("reserved");
        assert!(err.to_string().contains("reserved bytes 26..32"), "{err}");
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let r = Response::error(Status::MISSING_SEALS, "é".repeat(200));
        let back = Response::decode(&r.encode()).expect("decode");
        assert_eq!(back.message, "é".repeat(MAX_MESSAGE_LEN / 2));
        let r = Response::error(Status::MISSING_SEALS, format!("a{}", "é".repeat(200)));
        let back = Response::decode(&r.encode()).expect("decode");
        assert_eq!(back.message.len(), MAX_MESSAGE_LEN - 1);
    }

    #[test]
    fn status_shows_names_and_unknown_codes() {
        assert_eq!(Status::SIZE_MISMATCH.to_string(), "SIZE_MISMATCH");
        assert_eq!(Status(77).to_string(), "status 77");
        assert_eq!(format!("{:?}", Status::OK), "Status(0: OK)");
        for code in 0..=9 {
            assert!(Status(code).name().is_some());
        }
    }

    proptest! {
        #[test]
        fn requests_round_trip(bytes in any::<[u8; 16]>(), import in any::<bool>()) {
            let op = if import { Op::Import } else { Op::RedeemExport };
            let r = Request { op, ticket: Ticket::from_bytes(bytes) };
            prop_assert_eq!(Request::decode(&r.encode()).expect("decode"), r);
        }

        #[test]
        fn responses_round_trip(status in any::<u16>(), size in any::<u64>(), offset in any::<u64>(),
                                message in "\\PC{0,100}") {
            let r = Response { status: Status(status), size, offset, message };
            let back = Response::decode(&r.encode()).expect("decode");
            prop_assert!(r.message.starts_with(&back.message));
            prop_assert_eq!((back.status, back.size, back.offset), (r.status, r.size, r.offset));
        }

        #[test]
        fn any_request_bytes_decode_or_fail_cleanly(frame in any::<[u8; 32]>()) {
            let mut full = [0_u8; REQUEST_LEN];
            full[..32].copy_from_slice(&frame);
            let _ = Request::decode(&full);
        }
    }
}
