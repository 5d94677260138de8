//! Per-session work queues served in fair turns, and the deadline check.
//!
//! Each session has a FIFO. A turn takes one item from a session; an item that did only part of
//! its work in its turn (a chain between doorbell batches, a copy between slices) is resumed at
//! the front of its session's queue. Which session has the next turn is start-time fair
//! queuing over the executor's time: each session is charged the time its turns took (its
//! virtual time), and the next turn goes to the waiting session charged least, ties in the
//! order they started waiting. A session that starts waiting is charged at least the virtual
//! time of the turn last started, so idling banks no credit, and a session keeps what it was
//! charged while it idles, so emptying its queue between calls forgives no debt.
//!
//! A session that starts waiting within [`RETURN_GRACE`] of its last turn's end has not idled:
//! a client that dispatches one at a time is never waiting when its answer goes out. It keeps
//! its charge instead of being lifted to the virtual time. Otherwise a session far ahead (one
//! charged a device fault's context rebuilds) that happens to be the only one waiting at the
//! instant the others are answered would move the virtual time up to its own, and every
//! session returning a moment later would be lifted to it: the debt forgiven at every fault,
//! and the faulting session served as often as the others whatever its turns cost.
//!
//! So sessions that keep the device busy share it equally by time, not by turn count (one
//! whose turns are 32-link doorbell batches no longer gets 32 times the device of one sending
//! single dispatches), and a session that uses little of the device is served after the turn
//! under way, ahead of sessions that have used more, instead of waiting for a turn of each
//! (with four sessions queueing 1,024-link chains, a bystander's dispatch waited for four turns
//! of theirs; now for the one under way). With every turn free of charge the order is plain
//! round robin. A session with a thousand pending items, or one very large item, still delays
//! another session's next item by at most the turns it has been charged less than it.
//!
//! A session may weigh more ([`FairTurns::set_class`]: an interactive session weighs
//! `executor.interactive_weight` batch sessions): its turns are charged that much less, so it
//! gets that many times the device of a batch session when both keep it busy, and any batch
//! session still gets its share. A session marked first goes before the others waiting at the
//! same virtual time (an interactive session that has used less than its share is charged at
//! most the current virtual time, so it has the next turn).

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Per-session queues of `T` served in fair turns.
#[derive(Debug)]
pub struct FairTurns<T> {
    queues: crate::IdMap<u64, VecDeque<T>>,
    /// Sessions with pending items as (virtual time, rank, arrival, session): the first has
    /// the next turn. Each appears once.
    order: BTreeSet<(u64, u8, u64, u64)>,
    /// Each waiting session's key in `order`.
    keys: crate::IdMap<u64, (u64, u8, u64)>,
    /// Sessions that weigh more than one, or go first at equal virtual times: (weight, rank,
    /// 0 first).
    classes: crate::IdMap<u64, (u32, u8)>,
    /// What each session has been charged (ns of turns), kept while it idles with a debt.
    charged: crate::IdMap<u64, u64>,
    /// When each session that was charged with nothing left queued was last charged: the end
    /// of the turn that answered it.
    answered: crate::IdMap<u64, Instant>,
    /// The virtual time of the turn last started.
    now: u64,
    /// Arrivals so far, the tie-break.
    arrivals: u64,
    max_per_session: usize,
    /// Emptied queues kept for the next session that queues (a session dispatching one item
    /// at a time empties its queue at every turn): at most [`SPARE_QUEUES`], none large.
    spare: Vec<VecDeque<T>>,
}

/// Emptied queues kept at most.
const SPARE_QUEUES: usize = 16;
/// The largest capacity of an emptied queue that is kept.
const SPARE_CAPACITY: usize = 64;
/// Past this many charges kept, those that no longer matter (at most the current virtual
/// time) are dropped.
const PRUNE_AT: usize = 1024;
/// How soon after its last turn a session that starts waiting again keeps its charge: well
/// above a client's round trip between an answer and its next request, even on a loaded host
/// that leaves the client's thread waiting for a CPU for a few timeslices. A session away
/// longer has idled.
const RETURN_GRACE: Duration = Duration::from_millis(50);

impl<T> FairTurns<T> {
    pub fn new(max_per_session: usize) -> Self {
        Self {
            queues: crate::IdMap::default(),
            order: BTreeSet::new(),
            keys: crate::IdMap::default(),
            classes: crate::IdMap::default(),
            charged: crate::IdMap::default(),
            answered: crate::IdMap::default(),
            now: 0,
            arrivals: 0,
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
        self.leave(session);
        if let Some(q) = self.queues.remove(&session)
            && self.spare.len() < SPARE_QUEUES
            && q.capacity() <= SPARE_CAPACITY
        {
            self.spare.push(q);
        }
    }

    /// `session` waits for a turn (a no-op when it already does), charged at least the
    /// virtual time of the turn last started unless its last turn ended within
    /// [`RETURN_GRACE`].
    fn wait(&mut self, session: u64) {
        if self.keys.contains_key(&session) {
            return;
        }
        let returning = self
            .answered
            .remove(&session)
            .is_some_and(|at| at.elapsed() <= RETURN_GRACE);
        let charged = self.charged.get(&session).copied();
        let mut v = match charged {
            Some(v) if returning => v,
            _ => charged.unwrap_or(0).max(self.now),
        };
        let rank = self.class(session).1;
        if rank == 0 && v <= self.now {
            // A first session that has used less than its share has the next turn, also ahead
            // of sessions that came back with a charge below the virtual time.
            let least = self.order.first().map_or(v, |&(w, _, _, _)| w);
            v = v.min(least).max(charged.unwrap_or(0));
        }
        self.charged.insert(session, v);
        self.arrivals += 1;
        self.keys.insert(session, (v, rank, self.arrivals));
        self.order.insert((v, rank, self.arrivals, session));
    }

    /// `session` no longer waits.
    fn leave(&mut self, session: u64) {
        if let Some((v, r, a)) = self.keys.remove(&session) {
            self.order.remove(&(v, r, a, session));
        }
    }

    /// `session`'s (weight, rank).
    fn class(&self, session: u64) -> (u32, u8) {
        self.classes.get(&session).copied().unwrap_or((1, 1))
    }

    /// From now on, `session`'s turns are charged `1 / weight` of their time, and it goes
    /// before sessions that are not `first` among those waiting at the same virtual time.
    /// Forgotten with [`FairTurns::take_session`].
    pub fn set_class(&mut self, session: u64, weight: u32, first: bool) {
        let c = (weight.max(1), u8::from(!first));
        if c == (1, 1) {
            self.classes.remove(&session);
        } else {
            self.classes.insert(session, c);
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
        self.queue(session).push_back(item);
        self.wait(session);
    }

    /// Puts back an item that [`FairTurns::pop`] returned and that has work left: first in its
    /// session's queue. A session that had left the turns (its queue emptied) starts waiting
    /// again behind those already waiting at its virtual time.
    pub fn resume(&mut self, session: u64, item: T) {
        self.queue(session).push_front(item);
        self.wait(session);
    }

    /// The next item: the first of the waiting session charged least. Charge the turn it gets
    /// with [`FairTurns::charge`].
    pub fn pop(&mut self) -> Option<(u64, T)> {
        while let Some((v, _, _, session)) = self.order.pop_first() {
            self.keys.remove(&session);
            self.now = self.now.max(v);
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
                // Behind the sessions waiting at the same virtual time, until its turn is
                // charged.
                self.wait(session);
            }
            if self.charged.len() > PRUNE_AT {
                self.prune();
            }
            return Some((session, item));
        }
        None
    }

    /// Charges `session` for a turn that took `took` (divided by its weight): its place among
    /// the waiting sessions moves back by as much.
    pub fn charge(&mut self, session: u64, took: Duration) {
        let ns =
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX) / u64::from(self.class(session).0);
        let v = self
            .charged
            .get(&session)
            .copied()
            .unwrap_or(self.now)
            .saturating_add(ns);
        self.charged.insert(session, v);
        if let Some((old, r, a)) = self.keys.get(&session).copied() {
            self.order.remove(&(old, r, a, session));
            self.order.insert((v, r, a, session));
            self.keys.insert(session, (v, r, a));
        } else {
            self.answered.insert(session, Instant::now());
        }
    }

    /// What `session` has been charged (its virtual time), ns; 0 when nothing.
    #[cfg(test)]
    pub fn charged(&self, session: u64) -> u64 {
        self.charged.get(&session).copied().unwrap_or(0)
    }

    /// Drops the charges of idle sessions that no longer matter: a session starts waiting
    /// charged at least the current virtual time anyway.
    fn prune(&mut self) {
        self.answered.retain(|_, at| at.elapsed() <= RETURN_GRACE);
        let (now, keys, answered) = (self.now, &self.keys, &self.answered);
        self.charged
            .retain(|s, v| *v > now || keys.contains_key(s) || answered.contains_key(s));
    }

    /// Whether no session but `session` has anything queued.
    pub fn alone(&self, session: u64) -> bool {
        self.order.iter().all(|(_, _, _, s)| *s == session)
    }

    /// Whether any waiting session's next item is one `accept` takes.
    pub fn any_next(&self, accept: impl Fn(&T) -> bool) -> bool {
        self.order.iter().any(|(_, _, _, s)| {
            self.queues
                .get(s)
                .and_then(VecDeque::front)
                .is_some_and(&accept)
        })
    }

    /// Takes, out of turn, the next item of the first waiting session in fair order (charged
    /// least first) that `skip` does not name, whose next item `accept` takes, and that has
    /// been charged at most `within` more than the turn last started: a session far ahead of
    /// its share waits for its own turn. The session keeps its place among the waiting while
    /// it has more; charge what it gets with [`FairTurns::charge`].
    pub fn take_fair_if(
        &mut self,
        within: Duration,
        skip: impl Fn(u64) -> bool,
        accept: impl Fn(&T) -> bool,
    ) -> Option<(u64, T)> {
        let limit = self
            .now
            .saturating_add(u64::try_from(within.as_nanos()).unwrap_or(u64::MAX));
        let session = self
            .order
            .iter()
            .take_while(|&&(v, _, _, _)| v <= limit)
            .map(|&(_, _, _, s)| s)
            .find(|&s| {
                !skip(s)
                    && self
                        .queues
                        .get(&s)
                        .and_then(VecDeque::front)
                        .is_some_and(&accept)
            })?;
        let q = self.queues.get_mut(&session)?;
        let item = q.pop_front()?;
        if q.is_empty() {
            self.retire(session);
        }
        Some((session, item))
    }

    /// Removes and returns everything `session` has queued, and forgets its charge.
    pub fn take_session(&mut self, session: u64) -> Vec<T> {
        self.leave(session);
        self.charged.remove(&session);
        self.answered.remove(&session);
        self.classes.remove(&session);
        self.queues
            .remove(&session)
            .map(Vec::from)
            .unwrap_or_default()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Moves every session's last answer `by` into the past, as if that much time had passed.
    #[cfg(test)]
    pub fn age(&mut self, by: Duration) {
        for at in self.answered.values_mut() {
            *at = at.checked_sub(by).unwrap_or(*at);
        }
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
        let mut rr = FairTurns::new(100);
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
        let mut rr = FairTurns::new(100);
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
        let mut rr = FairTurns::new(2);
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
        let mut rr = FairTurns::new(100);
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
        let mut rr = FairTurns::new(100);
        rr.push(1, 10).unwrap();
        rr.push(1, 11).unwrap();
        rr.push(1, 12).unwrap();
        assert_eq!(rr.pop(), Some((1, 10)));
        assert!(rr.any_next(|x| *x == 11));
        assert_eq!(
            rr.take_fair_if(Duration::MAX, |_| false, |x| *x == 99),
            None,
            "refused: left in place"
        );
        assert_eq!(
            rr.take_fair_if(Duration::MAX, |_| false, |x| *x == 11),
            Some((1, 11))
        );
        rr.push(2, 20).unwrap();
        assert_eq!(
            rr.take_fair_if(Duration::MAX, |s| s == 2, |_| true),
            Some((1, 12))
        );
        assert!(!rr.any_next(|x| *x == 12));
        // Session 1's queue emptied out of turn: it left the rotation, and comes back last.
        rr.resume(1, 13);
        assert_eq!(rr.pop(), Some((2, 20)));
        assert_eq!(rr.pop(), Some((1, 13)));
        assert_eq!(rr.pop(), None);
        assert!(!rr.any_next(|_| true), "nothing queued");
    }

    const MS: Duration = Duration::from_millis(1);

    /// Pops the next turn and charges it `took`.
    fn turn<T>(q: &mut FairTurns<T>, took: Duration) -> Option<(u64, T)> {
        let next = q.pop()?;
        q.charge(next.0, took);
        Some(next)
    }

    #[test]
    fn a_session_that_used_little_goes_before_sessions_that_used_more() {
        let mut q = FairTurns::new(100);
        for s in 1..=3 {
            for i in 0..10 {
                q.push(s, (s, i)).unwrap();
            }
        }
        // Three sessions keep the device busy with turns of a millisecond.
        for _ in 0..9 {
            turn(&mut q, MS).unwrap();
        }
        // A fourth asks for one short turn: it is next, not behind a turn of each.
        q.push(4, (4, 0)).unwrap();
        assert_eq!(turn(&mut q, MS / 20), Some((4, (4, 0))));
    }

    #[test]
    fn sessions_that_keep_the_device_busy_share_its_time_not_its_turns() {
        let mut q = FairTurns::new(1000);
        for i in 0..400 {
            q.push(1, i).unwrap();
            q.push(2, i).unwrap();
        }
        // Session 1's turns take 4 ms (32-link batches), session 2's 1 ms.
        let mut time = [Duration::ZERO; 2];
        while time.iter().sum::<Duration>() < 200 * MS {
            let (s, _) = q.pop().unwrap();
            let took = if s == 1 { 4 * MS } else { MS };
            q.charge(s, took);
            time[usize::from(s == 2)] += took;
        }
        let share = time[0].as_secs_f64() / time[1].as_secs_f64();
        assert!(
            (0.9..=1.1).contains(&share),
            "device time {time:?}: each should have about half"
        );
    }

    #[test]
    fn idling_banks_no_credit_and_forgives_no_debt() {
        let mut q = FairTurns::new(100);
        // Session 1 used 10 ms and emptied its queue.
        q.push(1, 0).unwrap();
        turn(&mut q, 10 * MS).unwrap();
        // Session 2 has used nothing and waits with work; session 1 comes back: session 2
        // has turns until it has used as much.
        for i in 0..20 {
            q.push(2, i).unwrap();
        }
        q.push(1, 1).unwrap();
        let order: Vec<u64> = (0..12).map(|_| turn(&mut q, MS).unwrap().0).collect();
        assert_eq!(&order[..10], &[2; 10], "{order:?}");
        assert!(order[10..].contains(&1), "{order:?}");

        // Session 3 idled all along: it starts at the current virtual time, so it takes turns
        // with the others instead of running everything it queues first.
        for i in 0..10 {
            q.push(3, i).unwrap();
        }
        let order: Vec<u64> = (0..6).map(|_| turn(&mut q, MS).unwrap().0).collect();
        assert!(order.contains(&2) && order.contains(&3), "{order:?}");
    }

    #[test]
    fn charges_of_sessions_gone_idle_are_dropped_past_the_bound() {
        let mut q = FairTurns::new(10);
        for s in 0..(PRUNE_AT as u64 * 3) {
            q.push(s, s).unwrap();
            turn(&mut q, MS).unwrap();
            // Another session's turn moves the virtual time past what `s` was charged, and
            // `s` stays away past the grace.
            q.push(u64::MAX, 0).unwrap();
            turn(&mut q, 2 * MS).unwrap();
            q.age(2 * RETURN_GRACE);
        }
        assert!(
            q.charged.len() <= PRUNE_AT + 2,
            "{} charges kept",
            q.charged.len()
        );
        assert!(q.is_empty());
    }

    #[test]
    fn items_taken_in_fair_order_come_from_the_session_charged_least_that_has_one() {
        let mut q = FairTurns::new(8);
        for (s, v) in [(1, 10), (1, 11), (2, 20), (3, 30)] {
            q.push(s, v).unwrap();
        }
        // Session 1 has used the device; 3's next item is not wanted.
        q.charge(1, Duration::from_millis(5));
        assert!(q.any_next(|v| *v == 30));
        assert!(!q.any_next(|v| *v == 11));
        assert_eq!(
            q.take_fair_if(Duration::MAX, |_| false, |v| *v != 30),
            Some((2, 20))
        );
        assert_eq!(
            q.take_fair_if(Duration::MAX, |s| s == 1, |v| *v != 30),
            None
        );
        assert_eq!(
            q.take_fair_if(Duration::MAX, |_| false, |v| *v != 30),
            Some((1, 10))
        );
        // Session 1 keeps its place with its second item; 2 left the rotation.
        assert_eq!(q.pop(), Some((3, 30)));
        assert_eq!(q.pop(), Some((1, 11)));
        assert!(q.is_empty());
    }

    #[test]
    fn a_weighty_session_gets_its_weight_in_device_time_and_the_others_still_theirs() {
        let mut q = FairTurns::new(1000);
        q.set_class(1, 8, true);
        for i in 0..900 {
            for s in 1..=3 {
                q.push(s, i).unwrap();
            }
        }
        let mut time = [Duration::ZERO; 3];
        while time.iter().sum::<Duration>() < 500 * MS {
            let (s, _) = turn(&mut q, MS).unwrap();
            time[usize::try_from(s - 1).unwrap()] += MS;
        }
        // 8 : 1 : 1 of the device.
        let share = |s: usize| time[s].as_secs_f64() / time.iter().sum::<Duration>().as_secs_f64();
        assert!((share(0) - 0.8).abs() < 0.02, "{time:?}");
        assert!(
            (share(1) - 0.1).abs() < 0.02 && (share(2) - 0.1).abs() < 0.02,
            "{time:?}"
        );
    }

    #[test]
    fn a_first_session_goes_before_those_waiting_at_its_virtual_time() {
        let mut q = FairTurns::new(100);
        q.push(1, "batch").unwrap();
        q.push(2, "batch").unwrap();
        q.set_class(3, 8, true);
        q.push(3, "interactive").unwrap();
        assert_eq!(q.pop(), Some((3, "interactive")));
        // Forgotten with the session: it queues again as any other.
        assert!(q.take_session(3).is_empty());
        q.push(3, "plain").unwrap();
        assert_eq!(q.pop(), Some((1, "batch")));
        assert_eq!(q.pop(), Some((2, "batch")));
        assert_eq!(q.pop(), Some((3, "plain")));
    }

    #[test]
    fn a_session_far_ahead_of_its_share_is_not_taken_out_of_turn() {
        let mut q = FairTurns::new(8);
        for s in 1..=3 {
            q.push(s, s).unwrap();
            q.push(s, s * 10).unwrap();
        }
        // Session 3 took 50 ms (a fault's context build); 1 and 2 a millisecond each.
        assert_eq!(turn(&mut q, MS), Some((1, 1)));
        assert_eq!(turn(&mut q, MS), Some((2, 2)));
        assert_eq!(turn(&mut q, 50 * MS), Some((3, 3)));
        assert_eq!(q.pop(), Some((1, 10)));
        // A batch of the turn's session's peers within 2 ms of it: 2, not 3.
        assert_eq!(q.take_fair_if(2 * MS, |s| s == 1, |_| true), Some((2, 20)));
        assert_eq!(q.take_fair_if(2 * MS, |s| s == 1, |_| true), None);
        // Its own turn comes all the same.
        assert_eq!(q.pop(), Some((3, 30)));
    }

    #[test]
    fn a_debt_run_alone_between_the_others_answers_is_not_forgiven() {
        let mut q = FairTurns::new(8);
        // Sessions 1-3 dispatch one at a time; 9 faulted the device: its turn and the next
        // doorbell's context rebuild, 70 ms, are charged to it.
        for s in [1, 2, 3, 9] {
            q.push(s, s).unwrap();
        }
        for _ in 0..3 {
            turn(&mut q, MS).unwrap();
        }
        assert_eq!(turn(&mut q, 70 * MS), Some((9, 9)));
        // 9 asks again while the others wait for their answers: it is alone, so it runs.
        q.push(9, 90).unwrap();
        assert_eq!(turn(&mut q, MS), Some((9, 90)));
        // The others come back a moment later: they keep their charges, so they have the
        // device until each has used as much as 9, and 9 waits with its next dispatch.
        q.push(9, 91).unwrap();
        let mut order = Vec::new();
        for round in 0..68 {
            for s in 1..=3 {
                q.push(s, round).unwrap();
            }
            for _ in 0..3 {
                order.push(turn(&mut q, MS).unwrap().0);
            }
        }
        assert!(!order.contains(&9), "{order:?}");
        assert_eq!(q.pop(), Some((9, 91)));

        // Away past the grace, a session has idled: it is lifted to the virtual time, so 9's
        // new debt is forgiven to it (and to it alone).
        let mut q = FairTurns::new(8);
        for s in [1, 9] {
            q.push(s, s).unwrap();
        }
        turn(&mut q, MS).unwrap();
        turn(&mut q, 70 * MS).unwrap();
        q.push(9, 90).unwrap();
        turn(&mut q, MS).unwrap();
        q.age(2 * RETURN_GRACE);
        q.push(1, 10).unwrap();
        q.push(9, 91).unwrap();
        assert_eq!(q.pop(), Some((1, 10)));
        assert_eq!(q.pop(), Some((9, 91)));
    }

    #[test]
    fn a_first_session_under_its_share_goes_before_sessions_that_kept_a_charge() {
        let mut q = FairTurns::new(8);
        q.set_class(5, 8, true);
        for s in [1, 2, 9] {
            q.push(s, s).unwrap();
        }
        turn(&mut q, MS).unwrap();
        turn(&mut q, MS).unwrap();
        // 9 runs alone past the others (a fault's rebuilds): they come back below the
        // virtual time, and the interactive session 5 still has the next turn.
        assert_eq!(turn(&mut q, 70 * MS), Some((9, 9)));
        q.push(9, 90).unwrap();
        turn(&mut q, MS).unwrap();
        q.push(1, 10).unwrap();
        q.push(2, 20).unwrap();
        q.push(5, 50).unwrap();
        assert_eq!(q.pop(), Some((5, 50)));
        assert_eq!(q.pop(), Some((1, 10)));
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
