//! One-time tickets that bind an fd-socket exchange to a gRPC call.

use std::fmt;
use std::str::FromStr;

use rustix::io::Errno;
use rustix::rand::GetRandomFlags;

use crate::FdError;

/// A one-time, unguessable 128-bit ticket.
///
/// A gRPC call (allocate-and-export, or import) issues one to a session; the client redeems it
/// on the fd socket. gRPC messages carry it as 16 bytes ([`Ticket::as_bytes`],
/// [`Ticket::from_slice`]) or as 32 lowercase hex characters (`Display`, `FromStr`).
///
/// Anyone holding a ticket can redeem it, so `Debug` shows only its first 4 bytes; `Display`
/// shows all of it and is meant for the wire, not for logs.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket([u8; Ticket::LEN]);

impl Ticket {
    /// Length in bytes.
    pub const LEN: usize = 16;

    /// Draws a ticket from the kernel's random number generator (`getrandom`).
    ///
    /// # Errors
    ///
    /// [`FdError::Sys`] if `getrandom` fails, which on Linux ≥ 3.17 happens only when the
    /// system call is blocked by a seccomp filter.
    #[doc(alias = "getrandom")]
    pub fn random() -> Result<Ticket, FdError> {
        let mut bytes = [0_u8; Ticket::LEN];
        let mut filled = 0;
        while filled < bytes.len() {
            match rustix::rand::getrandom(&mut bytes[filled..], GetRandomFlags::empty()) {
                Ok(n) => filled += n,
                Err(Errno::INTR) => {}
                Err(errno) => return Err(FdError::sys("getrandom")(errno)),
            }
        }
        Ok(Ticket(bytes))
    }

    /// A ticket with the given bytes.
    pub const fn from_bytes(bytes: [u8; Ticket::LEN]) -> Ticket {
        Ticket(bytes)
    }

    /// A ticket from a gRPC `bytes` field.
    ///
    /// # Errors
    ///
    /// [`FdError::BadTicket`] unless `bytes` is exactly 16 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Result<Ticket, FdError> {
        <[u8; Ticket::LEN]>::try_from(bytes)
            .map(Ticket)
            .map_err(|_| FdError::BadTicket {
                reason: format!("expected {} bytes, got {}", Ticket::LEN, bytes.len()),
            })
    }

    /// The ticket's bytes.
    pub const fn as_bytes(&self) -> &[u8; Ticket::LEN] {
        &self.0
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Ticket(")?;
        self.0[..4].iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        f.write_str("…)")
    }
}

impl FromStr for Ticket {
    type Err = FdError;

    /// Parses 32 hex characters (either case).
    fn from_str(s: &str) -> Result<Ticket, FdError> {
        let bad = || FdError::BadTicket {
            reason: format!(
                "{:?} is not 32 hexadecimal characters",
                s.chars().take(64).collect::<String>()
            ),
        };
        let text = s.as_bytes();
        if text.len() != 2 * Ticket::LEN {
            return Err(bad());
        }
        let mut bytes = [0_u8; Ticket::LEN];
        for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
            let hi = hex_value(pair[0]).ok_or_else(bad)?;
            let lo = hex_value(pair[1]).ok_or_else(bad)?;
            *byte = hi << 4 | lo;
        }
        Ok(Ticket(bytes))
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn random_tickets_differ() {
        let a = Ticket::random().expect("getrandom");
        let b = Ticket::random().expect("getrandom");
        assert_ne!(a, b);
    }

    #[test]
    fn hex_form_is_32_lowercase_characters() {
        let t = Ticket::from_bytes([0xAB; 16]);
        assert_eq!(t.to_string(), "ab".repeat(16));
        assert_eq!(format!("{t:?}"), "Ticket(abababab…)");
        assert_eq!("AB".repeat(16).parse::<Ticket>().expect("upper case"), t);
    }

    #[test]
    fn bad_text_and_bad_lengths_are_refused() {
        for text in ["", "abc", &"g".repeat(32), &"a".repeat(33), &"é".repeat(16)] {
            let err = text.parse::<Ticket>().expect_err(text);
            assert!(err.to_string().starts_with("invalid ticket: "), "{err}");
        }
        let err = Ticket::from_slice(&[0; 15]).expect_err("15 bytes");
        assert_eq!(err.to_string(), "invalid ticket: expected 16 bytes, got 15");
    }

    proptest! {
        #[test]
        fn hex_round_trips(bytes in any::<[u8; 16]>()) {
            let t = Ticket::from_bytes(bytes);
            let text = t.to_string();
            prop_assert_eq!(text.len(), 32);
            prop_assert!(text.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
            prop_assert_eq!(text.parse::<Ticket>().expect("parse"), t);
            prop_assert_eq!(Ticket::from_slice(t.as_bytes()).expect("slice"), t);
        }
    }
}
