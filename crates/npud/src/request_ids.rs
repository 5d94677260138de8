//! Request ids, remembered by time: what makes a retried call run once.
//!
//! A call that carries `npud-request-id` claims its id in its session. The first claim runs
//! the call; a claim of an id the session remembers gets that call's answer (waiting for it
//! while it runs). What the table keeps, and for how long:
//!
//! - **A running call's id is never forgotten.** It stays until its call has an answer,
//!   whatever else arrives; a retry always finds it.
//! - **A final answer is kept for the retry horizon**: until [`Claim::expires`] (the call's
//!   arrival plus its own deadline, capped by `limits.request_id_horizon_ms`, plus the
//!   session grace period for the client to reconnect), or until the client acknowledges it
//!   (`npud-request-ack: N` says it will never retry an id below `N`), whichever is first.
//! - **Only final answers are kept.** An answer of work that did not run
//!   ([`NpudError::is_final`] is false: a quota, a deadline that passed in the queue, a device
//!   recovering) is given to the callers waiting for it and then forgotten, so a retry runs.
//! - **A reused id must name the same request.** Each claim carries a fingerprint of its
//!   method and message; a claim of a remembered id with another method or another message
//!   is INVALID_ARGUMENT, never the first call's answer.
//! - **Bounded in bytes per principal.** Every entry is charged to the identity that owns its
//!   session (`limits.max_request_id_bytes_per_principal`, across its sessions); a claim past
//!   the bound, after expired and acknowledged ids are forgotten, is RESOURCE_EXHAUSTED naming
//!   the key. Nothing is ever forgotten early to make room.
//!
//! Cost: a claim and a finish are one ordered-map insert or update each, plus the forgetting
//! they trigger, which is amortised: each entry is forgotten once.

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crate::error::NpudError;

/// A call's answer as kept for its retries: the handler's `Result<T, NpudError>`, type-erased.
pub type Reply = Arc<dyn Any + Send + Sync>;

/// What one remembered id costs beyond its answer: the entry, its place in the ordered map
/// and in the expiry queue (measured as the sizes of the types plus the map's node share).
pub const ENTRY_BYTES: u64 = 160;

/// What a call with a request id does: run, as the first with its id, or wait for the first's
/// answer.
#[derive(Debug)]
pub enum Replay {
    /// The id is new: run the call and send its answer here.
    First(tokio::sync::watch::Sender<Option<Reply>>),
    /// The id was seen: its answer arrives (or has arrived) here.
    Again(tokio::sync::watch::Receiver<Option<Reply>>),
}

/// One claim of a request id.
#[derive(Debug, Clone, Copy)]
pub struct Claim {
    pub id: u64,
    /// The method (`Dispatch`, `Chain`, `AllocateTensor`, `FreeTensor`).
    pub call: &'static str,
    /// A hash of the method and the request message.
    pub fingerprint: u64,
    /// When the answer may be forgotten (see the module docs).
    pub expires: Instant,
}

#[derive(Debug)]
struct Entry {
    call: &'static str,
    fingerprint: u64,
    expires: Instant,
    answer: tokio::sync::watch::Receiver<Option<Reply>>,
    /// The call has a final answer (otherwise it runs).
    done: bool,
    /// What this entry is charged.
    bytes: u64,
}

/// One session's remembered request ids.
#[derive(Debug, Default)]
pub struct SessionIds {
    entries: BTreeMap<u64, Entry>,
    /// Ids with final answers, in the order they finished, with when each may be forgotten.
    finished: VecDeque<(Instant, u64)>,
    /// The client will retry no id below this (`npud-request-ack`).
    acked: u64,
    /// What the entries are charged, in all.
    bytes: u64,
}

impl SessionIds {
    /// What this session's ids are charged.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Ids remembered, running or finished.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets the finished ids the client acknowledged (below `ack`) and those past their
    /// horizon at `now`; returns the bytes given back.
    pub fn forget(&mut self, ack: Option<u64>, now: Instant) -> u64 {
        let before = self.bytes;
        if let Some(ack) = ack
            && ack > self.acked
        {
            let low = self.acked;
            self.acked = ack;
            let gone: Vec<u64> = self
                .entries
                .range(low..ack)
                .filter(|(_, e)| e.done)
                .map(|(id, _)| *id)
                .collect();
            for id in gone {
                self.remove(id);
            }
        }
        while let Some(&(expires, id)) = self.finished.front() {
            if expires > now {
                break;
            }
            self.finished.pop_front();
            // An id acknowledged, or claimed again after it was forgotten, is no longer this
            // finished entry.
            if self
                .entries
                .get(&id)
                .is_some_and(|e| e.done && e.expires <= now)
            {
                self.remove(id);
            }
        }
        before - self.bytes
    }

    fn remove(&mut self, id: u64) {
        if let Some(e) = self.entries.remove(&id) {
            self.bytes -= e.bytes;
        }
    }

    /// Claims `c.id`. `room` is what the session's principal may still be charged; the entry
    /// costs [`ENTRY_BYTES`].
    ///
    /// # Errors
    /// INVALID_ARGUMENT when the id was used by another method or for another message;
    /// RESOURCE_EXHAUSTED when `room` is smaller than an entry (`principal` and `max` name the
    /// bound in the message).
    pub fn claim(
        &mut self,
        c: Claim,
        room: u64,
        principal: &dyn std::fmt::Display,
        max: u64,
    ) -> Result<Replay, NpudError> {
        if let Some(e) = self.entries.get(&c.id) {
            if e.call != c.call {
                return Err(NpudError::InvalidArgument(format!(
                    "npud-request-id: {} was already used by a {} call of this session",
                    c.id, e.call
                )));
            }
            if e.fingerprint != c.fingerprint {
                return Err(NpudError::InvalidArgument(format!(
                    "npud-request-id: {} was already used by a {} call of this session with \
                     another request; a retry must send the same message (use a new id for \
                     new work)",
                    c.id, e.call
                )));
            }
            return Ok(Replay::Again(e.answer.clone()));
        }
        if room < ENTRY_BYTES {
            return Err(NpudError::ResourceExhausted(format!(
                "npud-request-id: {principal} already holds {max} bytes of remembered request \
                 ids (limits.max_request_id_bytes_per_principal); each is kept until its \
                 call's deadline plus the reconnect grace, or until the client acknowledges \
                 it with npud-request-ack: retry later, acknowledge ids, or send calls without \
                 an id"
            )));
        }
        let (tx, rx) = tokio::sync::watch::channel(None);
        self.entries.insert(
            c.id,
            Entry {
                call: c.call,
                fingerprint: c.fingerprint,
                expires: c.expires,
                answer: rx,
                done: false,
                bytes: ENTRY_BYTES,
            },
        );
        self.bytes += ENTRY_BYTES;
        Ok(Replay::First(tx))
    }

    /// Records the end of id `id`'s call: a final answer of `answer_bytes` is kept until its
    /// horizon (unless the client has acknowledged it already); any other is forgotten.
    /// Returns the change in bytes charged (positive: more).
    pub fn finish(&mut self, id: u64, is_final: bool, answer_bytes: u64) -> i64 {
        let before = self.bytes;
        let keep = is_final && id >= self.acked;
        match self.entries.get_mut(&id) {
            Some(e) if keep && !e.done => {
                e.done = true;
                e.bytes += answer_bytes;
                self.bytes += answer_bytes;
                self.finished.push_back((e.expires, id));
            }
            Some(e) if !e.done => self.remove(id),
            _ => {}
        }
        i64::try_from(self.bytes).unwrap_or(i64::MAX) - i64::try_from(before).unwrap_or(i64::MAX)
    }
}

/// Whether a call's answer is final: it is kept for retries. An error of work that did not
/// run is not (see [`NpudError::is_final`]).
pub fn is_final<T>(r: &Result<T, NpudError>) -> bool {
    r.as_ref().err().is_none_or(NpudError::is_final)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn claim(id: u64, fp: u64, expires: Instant) -> Claim {
        Claim {
            id,
            call: "Dispatch",
            fingerprint: fp,
            expires,
        }
    }

    fn first(r: Result<Replay, NpudError>) -> tokio::sync::watch::Sender<Option<Reply>> {
        match r {
            Ok(Replay::First(tx)) => tx,
            other => panic!("expected a first claim, got {other:?}"),
        }
    }

    #[test]
    fn a_running_id_is_never_forgotten_however_many_ids_follow() {
        let mut s = SessionIds::default();
        let now = Instant::now();
        let soon = now + Duration::from_millis(1);
        let _running = first(s.claim(claim(1, 7, soon), u64::MAX, &"uid:1", 0));
        for id in 2..2_000 {
            first(s.claim(claim(id, 7, soon), u64::MAX, &"uid:1", 0));
            s.finish(id, true, 16);
        }
        // Long past every horizon, acknowledged up to past it: the running id stays.
        s.forget(Some(5_000), now + Duration::from_secs(3600));
        assert_eq!(s.len(), 1);
        assert!(matches!(
            s.claim(claim(1, 7, soon), u64::MAX, &"uid:1", 0),
            Ok(Replay::Again(_))
        ));
        // Finished after the acknowledgement, it is not kept.
        s.finish(1, true, 16);
        assert!(s.is_empty());
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn a_final_answer_is_kept_until_its_horizon_and_a_transient_one_not_at_all() {
        let mut s = SessionIds::default();
        let now = Instant::now();
        let horizon = now + Duration::from_secs(30);
        first(s.claim(claim(1, 7, horizon), u64::MAX, &"uid:1", 0));
        s.finish(1, true, 40);
        first(s.claim(claim(2, 7, horizon), u64::MAX, &"uid:1", 0));
        s.finish(2, false, 40);
        assert_eq!(s.bytes(), ENTRY_BYTES + 40);
        s.forget(None, now + Duration::from_secs(29));
        assert!(matches!(
            s.claim(claim(1, 7, horizon), u64::MAX, &"uid:1", 0),
            Ok(Replay::Again(_))
        ));
        // The transient answer was forgotten: its retry runs.
        first(s.claim(claim(2, 7, horizon), u64::MAX, &"uid:1", 0));
        s.finish(2, true, 0);
        s.forget(None, now + Duration::from_secs(31));
        assert!(s.is_empty());
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn a_reused_id_must_name_the_same_method_and_message() {
        let mut s = SessionIds::default();
        let horizon = Instant::now() + Duration::from_secs(30);
        first(s.claim(claim(1, 7, horizon), u64::MAX, &"uid:1", 0));
        let e = s
            .claim(claim(1, 8, horizon), u64::MAX, &"uid:1", 0)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("with another request"), "{e}");
        let e = s
            .claim(
                Claim {
                    call: "FreeTensor",
                    ..claim(1, 7, horizon)
                },
                u64::MAX,
                &"uid:1",
                0,
            )
            .unwrap_err();
        assert_eq!(
            e.message(),
            "npud-request-id: 1 was already used by a Dispatch call of this session"
        );
    }

    #[test]
    fn the_bound_refuses_new_ids_and_forgets_nothing_early() {
        let mut s = SessionIds::default();
        let horizon = Instant::now() + Duration::from_secs(30);
        let max = 3 * ENTRY_BYTES;
        for id in 0..3 {
            let room = max - s.bytes();
            first(s.claim(claim(id, 7, horizon), room, &"uid:1", max));
            s.finish(id, true, 0);
        }
        let e = s
            .claim(claim(9, 7, horizon), max - s.bytes(), &"uid:1", max)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(
            e.message()
                .contains("limits.max_request_id_bytes_per_principal"),
            "{e}"
        );
        // Every remembered id still replays.
        for id in 0..3 {
            assert!(matches!(
                s.claim(claim(id, 7, horizon), 0, &"uid:1", max),
                Ok(Replay::Again(_))
            ));
        }
        // An acknowledgement makes room.
        assert_eq!(s.forget(Some(2), Instant::now()), 2 * ENTRY_BYTES);
        first(s.claim(claim(9, 7, horizon), max - s.bytes(), &"uid:1", max));
    }
}
