//! Per-session work queues served round-robin, and the deadline check.
//!
//! Each session has a FIFO; the scheduler takes one item from the session at the front of the
//! rotation and moves that session to the back if it has more. An item that did only part of
//! its work in its turn (a chain between doorbell batches, a copy between slices) is resumed at
//! the front of its session's queue, and the session goes to the back of the rotation. A session
//! with a thousand pending items, or one very large item, therefore delays another session's
//! next item by at most one turn.

use std::collections::VecDeque;
use std::time::Instant;

/// Round-robin queues of `T`, keyed by session.
#[derive(Debug)]
pub struct RoundRobin<T> {
    queues: crate::IdMap<u64, VecDeque<T>>,
    /// Sessions with pending items, in serving order; each appears once.
    order: VecDeque<u64>,
    max_per_session: usize,
    /// Emptied queues kept for the next session that queues (a session dispatching one item
    /// at a time empties its queue at every turn): at most [`SPARE_QUEUES`], none large.
    spare: Vec<VecDeque<T>>,
}

/// Emptied queues kept at most.
const SPARE_QUEUES: usize = 16;
/// The largest capacity of an emptied queue that is kept.
const SPARE_CAPACITY: usize = 64;

impl<T> RoundRobin<T> {
    pub fn new(max_per_session: usize) -> Self {
        Self {
            queues: crate::IdMap::default(),
            order: VecDeque::new(),
            max_per_session,
            spare: Vec::new(),
        }
    }

    /// `session`'s queue, made (or taken from the spares) when it has none.
    fn queue(&mut self, session: u64) -> &mut VecDeque<T> {
        let spare = &mut self.spare;
        self.queues
            .entry(session)
            .or_insert_with(|| spare.pop().unwrap_or_default())
    }

    /// Drops `session`'s queue, which is empty, keeping it as a spare when there is room.
    fn retire(&mut self, session: u64) {
        if let Some(q) = self.queues.remove(&session)
            && self.spare.len() < SPARE_QUEUES
            && q.capacity() <= SPARE_CAPACITY
        {
            self.spare.push(q);
        }
    }

    /// Queues `item` for `session`, or gives it back when the session's queue is full.
    pub fn push(&mut self, session: u64, item: T) -> Result<(), T> {
        if self.queues.get(&session).map_or(0, VecDeque::len) >= self.max_per_session {
            return Err(item);
        }
        self.push_unbounded(session, item);
        Ok(())
    }

    /// Queues `item` for `session` whatever the session's queue holds (control work, which the
    /// request channel already bounds).
    pub fn push_unbounded(&mut self, session: u64, item: T) {
        let q = self.queue(session);
        let first = q.is_empty();
        q.push_back(item);
        if first {
            self.order.push_back(session);
        }
    }

    /// Puts back an item that [`RoundRobin::pop`] returned and that has work left: first in its
    /// session's queue, with the session last in the rotation.
    pub fn resume(&mut self, session: u64, item: T) {
        let q = self.queue(session);
        let first = q.is_empty();
        q.push_front(item);
        if first {
            // `pop` took the session out of the rotation when its queue emptied; otherwise it
            // is already at the back.
            self.order.push_back(session);
        }
    }

    /// The next item in round-robin order.
    pub fn pop(&mut self) -> Option<(u64, T)> {
        while let Some(session) = self.order.pop_front() {
            let Some(q) = self.queues.get_mut(&session) else {
                continue;
            };
            let Some(item) = q.pop_front() else {
                self.retire(session);
                continue;
            };
            if q.is_empty() {
                self.retire(session);
            } else {
                self.order.push_back(session);
            }
            return Some((session, item));
        }
        None
    }

    /// Whether no session but `session` has anything queued.
    pub fn alone(&self, session: u64) -> bool {
        self.order.iter().all(|s| *s == session)
    }

    /// `session`'s next item.
    pub fn peek(&self, session: u64) -> Option<&T> {
        self.queues.get(&session)?.front()
    }

    /// Takes `session`'s next item when `accept` does, out of turn (the session keeps its
    /// place in the rotation while it has more).
    pub fn take_next_if(&mut self, session: u64, accept: impl FnOnce(&T) -> bool) -> Option<T> {
        let q = self.queues.get_mut(&session)?;
        if !q.front().is_some_and(accept) {
            return None;
        }
        let item = q.pop_front();
        if q.is_empty() {
            self.retire(session);
            self.order.retain(|s| *s != session);
        }
        item
    }

    /// Removes and returns everything `session` has queued.
    pub fn take_session(&mut self, session: u64) -> Vec<T> {
        self.order.retain(|s| *s != session);
        self.queues
            .remove(&session)
            .map(Vec::from)
            .unwrap_or_default()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// Whether work with `deadline` may still start at `now`.
pub fn may_start(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_none_or(|d| now < d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sessions_take_turns_one_item_each() {
        let mut rr = RoundRobin::new(100);
        for i in 0..5 {
            rr.push(1, ("a", i)).unwrap();
        }
        rr.push(2, ("b", 0)).unwrap();
        rr.push(2, ("b", 1)).unwrap();
        rr.push(3, ("c", 0)).unwrap();
        let order: Vec<_> = std::iter::from_fn(|| rr.pop().map(|(_, x)| x)).collect();
        assert_eq!(
            order,
            vec![
                ("a", 0),
                ("b", 0),
                ("c", 0),
                ("a", 1),
                ("b", 1),
                ("a", 2),
                ("a", 3),
                ("a", 4)
            ]
        );
        assert!(rr.is_empty());
    }

    #[test]
    fn a_session_that_drains_and_returns_goes_to_the_back() {
        let mut rr = RoundRobin::new(100);
        rr.push(1, 10).unwrap();
        rr.push(2, 20).unwrap();
        assert_eq!(rr.pop(), Some((1, 10)));
        rr.push(1, 11).unwrap();
        assert_eq!(rr.pop(), Some((2, 20)));
        assert_eq!(rr.pop(), Some((1, 11)));
        assert_eq!(rr.pop(), None);
    }

    #[test]
    fn a_full_queue_refuses_and_others_are_unaffected() {
        let mut rr = RoundRobin::new(2);
        rr.push(1, 1).unwrap();
        rr.push(1, 2).unwrap();
        assert_eq!(rr.push(1, 3), Err(3));
        rr.push(2, 9).unwrap();
        assert_eq!(rr.take_session(1), vec![1, 2]);
        assert_eq!(rr.pop(), Some((2, 9)));
        assert_eq!(rr.pop(), None);
    }

    #[test]
    fn a_resumed_item_keeps_its_place_in_its_session_and_others_go_first() {
        let mut rr = RoundRobin::new(100);
        rr.push(1, "chain").unwrap();
        rr.push(1, "after-chain").unwrap();
        rr.push(2, "b0").unwrap();
        rr.push_unbounded(3, "write");
        let (s, item) = rr.pop().unwrap();
        assert_eq!((s, item), (1, "chain"));
        rr.resume(1, "chain");
        assert_eq!(rr.pop(), Some((2, "b0")));
        rr.push(2, "b1").unwrap();
        let (s, item) = rr.pop().unwrap();
        assert_eq!((s, item), (3, "write"));
        rr.resume(3, "write");
        assert_eq!(rr.pop(), Some((1, "chain")));
        assert_eq!(rr.pop(), Some((2, "b1")));
        assert_eq!(rr.pop(), Some((3, "write")));
        assert_eq!(rr.pop(), Some((1, "after-chain")));
        assert_eq!(rr.pop(), None);
    }

    #[test]
    fn items_taken_out_of_turn_leave_the_rotation_as_popping_does() {
        let mut rr = RoundRobin::new(100);
        rr.push(1, 10).unwrap();
        rr.push(1, 11).unwrap();
        rr.push(1, 12).unwrap();
        assert_eq!(rr.pop(), Some((1, 10)));
        assert!(rr.alone(1));
        assert_eq!(rr.peek(1), Some(&11));
        assert_eq!(
            rr.take_next_if(1, |x| *x == 99),
            None,
            "refused: left in place"
        );
        assert_eq!(rr.take_next_if(1, |x| *x == 11), Some(11));
        rr.push(2, 20).unwrap();
        assert!(!rr.alone(1), "another session waits");
        assert_eq!(rr.take_next_if(1, |_| true), Some(12));
        assert_eq!(rr.peek(1), None);
        // Session 1's queue emptied out of turn: it left the rotation, and comes back last.
        rr.resume(1, 13);
        assert_eq!(rr.pop(), Some((2, 20)));
        assert_eq!(rr.pop(), Some((1, 13)));
        assert_eq!(rr.pop(), None);
        assert!(rr.alone(1) && rr.alone(2), "nothing queued");
    }

    #[test]
    fn deadlines_in_the_past_do_not_start() {
        let now = Instant::now();
        assert!(may_start(None, now));
        assert!(may_start(Some(now + Duration::from_millis(1)), now));
        assert!(!may_start(Some(now), now));
        assert!(!may_start(Some(now - Duration::from_millis(1)), now));
    }
}
