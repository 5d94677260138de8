//! Work the executor takes in itself: the sessions' dispatch rings.
//!
//! A submission that reaches the executor through its channel costs two thread wake-ups, one
//! to hand it over and one to hand the answer back, and on a small VM each costs more than the
//! emulator's whole dispatch. So a ring is polled by the executor thread itself, between turns
//! and while it polls its channel when idle: a submission is copied out, admitted, queued in
//! its session's turn and run, and its completion posted, all on this thread, while the client
//! spins on its completion. What admits and answers a ring's submissions belongs to the
//! service, which hands the executor an [`Intake`]; the executor only decides when to look.
//!
//! When the executor blocks on its channel, it first tells every intake so ([`Intake::park`]),
//! and the intake asks its client to ring the ring's bell; a thread of the service sleeps on
//! that bell and nudges the executor ([`super::ExecutorHandle::nudge`]).

use super::WorkItem;
use super::idle::Elsewhere;

/// A source of work items the executor polls: one session's dispatch ring.
///
/// Called only on the executor thread; each call is bounded (an intake looks at most a ring's
/// worth of slots) and never waits for its client.
pub trait Intake: Send + std::fmt::Debug {
    /// Admits what its client submitted into `out` (in submission order: the executor queues
    /// them in its session's turn as they are), and posts the answers that came. `draining`:
    /// the executor is shutting down and takes no new work. [`Polled::Finished`] once the
    /// intake is over; the executor then drops it.
    fn poll(&mut self, out: &mut Vec<WorkItem>, draining: bool) -> Polled;

    /// The executor is about to block until a command comes (`true`), or polls again
    /// (`false`). On `true`, answers whether work is already waiting, so that the executor
    /// does not block.
    fn park(&mut self, parked: bool) -> bool;

    /// The executor stops: post what was answered and end (no reply will come any more).
    fn close(&mut self);
}

/// What a poll left the intake as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    Open,
    Finished,
}

/// The intakes the executor polls.
#[derive(Debug, Default)]
pub(super) struct Ports {
    list: Vec<Box<dyn Intake>>,
    /// Items taken by the last poll, not yet queued.
    pub(super) items: Vec<WorkItem>,
}

impl Ports {
    pub(super) fn add(&mut self, intake: Box<dyn Intake>) {
        self.list.push(intake);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Polls every intake; returns whether any took work (left in `items`).
    pub(super) fn poll_all(&mut self, draining: bool) -> bool {
        let before = self.items.len();
        let items = &mut self.items;
        self.list
            .retain_mut(|i| i.poll(items, draining) == Polled::Open);
        self.items.len() > before
    }

    /// Closes every intake (the executor stops).
    pub(super) fn close_all(&mut self) {
        for mut i in self.list.drain(..) {
            i.close();
        }
    }
}

impl Elsewhere for Ports {
    fn poll(&mut self) -> bool {
        self.poll_all(false)
    }

    /// Tells every intake the executor blocks (`true`) or polls again; on `true`, whether any
    /// has work waiting.
    fn park(&mut self, parked: bool) -> bool {
        let mut waiting = false;
        for i in &mut self.list {
            waiting |= i.park(parked);
        }
        waiting
    }
}
