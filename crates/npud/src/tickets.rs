//! One-time tickets that bind an fd-socket exchange to a gRPC call.
//!
//! A ticket is bound to a session, a tensor, the peer uid of the gRPC connection that asked
//! for it, and an operation (export, import or a ring), and expires after [`TICKET_TTL`].
//! Redeeming takes it out of the table in one step under the table's lock ([`Tickets::take`]),
//! so of two redeems of one ticket racing on two connections exactly one gets it; the other is
//! told the ticket is unknown. A refused import (an unsealed memfd, a wrong size, not a memfd)
//! puts it back, so the client can send a fixed memfd, and the tensor stays awaiting its
//! import. Expired tickets leave the table at the next issue and at every [`Tickets::sweep`]
//! (the session reaper's tick), whether or not anything is issued again.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use npu_fd::wire::{Op, Response, Status, Ticket};

use crate::error::NpudError;

/// How long a ticket may wait to be redeemed.
pub const TICKET_TTL: Duration = Duration::from_secs(60);

/// What a ticket lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Receive the fd of a daemon-allocated tensor.
    Export,
    /// Send a memfd of exactly `size` bytes for a declared tensor.
    Import { size: u64 },
    /// Send the memfd of the session's dispatch ring (`npu_fd::ring::RING_BYTES`).
    Ring,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Issued {
    pub(crate) session: u64,
    uid: u32,
    pub(crate) tensor: u64,
    pub(crate) grant: Grant,
    expires: Instant,
}

/// Outstanding tickets: what the gRPC side (which issues them) shares with the fd socket
/// (which redeems them).
#[derive(Debug)]
pub struct Tickets {
    map: Mutex<HashMap<Ticket, Issued>>,
    ttl: Duration,
}

impl Default for Tickets {
    fn default() -> Self {
        Self::with_ttl(TICKET_TTL)
    }
}

impl Tickets {
    /// Tickets that expire `ttl` after they are issued.
    pub fn with_ttl(ttl: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Ticket, Issued>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Issues a ticket for `tensor` of `session` to the user `uid`.
    ///
    /// # Errors
    /// INTERNAL when the kernel gives no random bytes.
    pub fn issue(
        &self,
        session: u64,
        uid: u32,
        tensor: u64,
        grant: Grant,
    ) -> Result<Ticket, NpudError> {
        let ticket = Ticket::random().map_err(|e| NpudError::Internal(e.to_string()))?;
        let now = Instant::now();
        let mut g = self.lock();
        g.retain(|_, i| i.expires > now);
        g.insert(
            ticket,
            Issued {
                session,
                uid,
                tensor,
                grant,
                expires: now + self.ttl,
            },
        );
        Ok(ticket)
    }

    /// Checks a ticket for `op` by `uid` and takes it out of the table, in one step under
    /// the lock: of concurrent redeems of one ticket, one gets it and the rest are refused
    /// as unknown. A ticket refused for another uid or op stays.
    pub(crate) fn take(&self, ticket: &Ticket, uid: u32, op: Op) -> Result<Issued, Response> {
        let mut g = self.lock();
        let issued = g
            .get(ticket)
            .filter(|i| i.expires > Instant::now())
            .copied()
            .ok_or_else(|| {
                Response::error(
                    Status::UNKNOWN_TICKET,
                    "unknown ticket: it was never issued, has expired (60 s) or was already \
                     redeemed (or is being redeemed on another connection)",
                )
            })?;
        if issued.uid != uid {
            return Err(Response::error(
                Status::WRONG_UID,
                format!(
                    "the ticket was issued to uid {}; this peer is uid {uid}",
                    issued.uid
                ),
            ));
        }
        let expected = match issued.grant {
            Grant::Export => Op::RedeemExport,
            Grant::Import { .. } => Op::Import,
            Grant::Ring => Op::AttachRing,
        };
        if expected != op {
            return Err(Response::error(
                Status::WRONG_OP,
                format!("the ticket is for {expected}, not {op}"),
            ));
        }
        g.remove(ticket);
        Ok(issued)
    }

    /// Puts back a ticket whose exchange was refused (a memfd that failed the import
    /// checks), so the client can try again with a fixed one, unless it has expired.
    pub(crate) fn put_back(&self, ticket: Ticket, issued: Issued) {
        if issued.expires > Instant::now() {
            self.lock().insert(ticket, issued);
        }
    }

    /// Drops the tickets that have expired; returns how many.
    pub fn sweep(&self, now: Instant) -> usize {
        let mut g = self.lock();
        let before = g.len();
        g.retain(|_, i| i.expires > now);
        before - g.len()
    }

    /// Outstanding tickets.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no ticket is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the tickets of an ended session.
    pub fn forget_session(&self, session: u64) {
        self.lock().retain(|_, i| i.session != session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_taken_once_and_expired_ones_are_swept_without_a_new_issue() {
        let t = Tickets::with_ttl(Duration::from_millis(50));
        let a = t.issue(1, 1000, 7, Grant::Export).unwrap();
        let b = t.issue(1, 1000, 8, Grant::Export).unwrap();
        assert_eq!(t.len(), 2);
        // Another uid or op is refused and leaves it in place.
        assert_eq!(
            t.take(&a, 1001, Op::RedeemExport).unwrap_err().status,
            Status::WRONG_UID
        );
        assert_eq!(
            t.take(&a, 1000, Op::Import).unwrap_err().status,
            Status::WRONG_OP
        );
        assert_eq!(t.take(&a, 1000, Op::RedeemExport).unwrap().tensor, 7);
        assert_eq!(
            t.take(&a, 1000, Op::RedeemExport).unwrap_err().status,
            Status::UNKNOWN_TICKET
        );
        assert_eq!(t.len(), 1);
        // b is never redeemed: a sweep after its lifetime frees it, with nothing issued since.
        assert_eq!(t.sweep(Instant::now()), 0);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.sweep(Instant::now()), 1);
        assert!(t.is_empty());
        assert_eq!(
            t.take(&b, 1000, Op::RedeemExport).unwrap_err().status,
            Status::UNKNOWN_TICKET
        );
    }
}
