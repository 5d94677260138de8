//! Interactive sessions: which are active, and how long other doorbells may be meanwhile.
//!
//! A doorbell cannot be interrupted: a dispatch that arrives while one rings waits for all of
//! it, then rings in the next. So while an interactive session is active (it had work queued
//! within `executor.interactive_idle_ms`), every doorbell that is not its own is kept to a
//! budget: half the tightest deadline of the active interactive sessions, never less than a
//! lone dispatch's doorbell. Its dispatch then waits for at most one budget and rings in a
//! doorbell of interactive work only.
//!
//! How many dispatches fit a budget comes from the doorbells the executor has rung: a doorbell
//! of `n` dispatches takes about `lone + (n - 1)·each` (a chain's submission and its first
//! command, then a command each; the device's own time per dispatch is in both). Both are
//! running averages of what the device reported ([`Pace`]), so the budget holds on an NPU and
//! on the emulator's timing model alike, whatever the designs cost.

use std::time::{Duration, Instant};

use crate::priority::Priority;

/// Running averages of doorbells' device times.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Pace {
    /// A doorbell of one dispatch, ns.
    lone: Option<u64>,
    /// Each dispatch past the first in a doorbell, ns.
    each: Option<u64>,
}

/// Weight of a new sample in the running averages: 1/8.
const NEW_SAMPLE_SHIFT: u32 = 3;

/// A sample is taken as at most this many times the average: a doorbell that also built a
/// context or loaded a program (35 ms on the model) must not make every later budget hold one
/// dispatch for a while.
const OUTLIER_FACTOR: u64 = 4;

/// A sample this many times below the average replaces it: the average was an outlier's. The
/// queue's first doorbell builds its hardware context (35 ms on the model), and as the first
/// sample it would otherwise stay the average for dozens of doorbells.
const RESET_FACTOR: u64 = 4;

fn average(old: Option<u64>, sample: u64) -> u64 {
    match old {
        None | Some(0) => sample,
        Some(old) if sample.saturating_mul(RESET_FACTOR) < old => sample,
        Some(old) => {
            let sample = sample.min(old.saturating_mul(OUTLIER_FACTOR));
            let delta = i128::from(sample) - i128::from(old);
            let next = i128::from(old) + (delta >> NEW_SAMPLE_SHIFT);
            u64::try_from(next.max(0)).unwrap_or(u64::MAX)
        }
    }
}

impl Pace {
    /// A doorbell of `n` dispatches took `took` on the device.
    pub(super) fn observe(&mut self, n: usize, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        match n {
            0 => {}
            1 => self.lone = Some(average(self.lone, ns)),
            n => {
                // A doorbell of several dispatches took at least what a lone one takes.
                if self.lone.is_some_and(|lone| lone > ns) {
                    self.lone = Some(ns);
                }
                let Some(lone) = self.lone else { return };
                let extra = ns.saturating_sub(lone) / (n as u64 - 1);
                self.each = Some(average(self.each, extra));
            }
        }
    }

    /// A lone dispatch's doorbell, once one was seen.
    pub(super) fn lone(&self) -> Option<Duration> {
        self.lone.map(Duration::from_nanos)
    }

    /// Each dispatch past the first in a doorbell, once a larger doorbell was seen.
    pub(super) fn each(&self) -> Option<Duration> {
        self.each.map(Duration::from_nanos)
    }

    /// What a doorbell of `n` dispatches should take by the running averages (zero before
    /// any was seen).
    pub(super) fn estimate(&self, n: usize) -> Duration {
        let lone = self.lone.unwrap_or(0);
        let each = self.each.unwrap_or(lone);
        Duration::from_nanos(lone.saturating_add(each.saturating_mul(n.saturating_sub(1) as u64)))
    }

    /// The most dispatches a doorbell may carry to take at most `budget` (at least 1, at most
    /// `max`). One until a lone doorbell was seen; each further dispatch is taken to cost a
    /// lone doorbell until a larger doorbell was seen.
    pub(super) fn fit(&self, budget: Duration, max: usize) -> usize {
        let Some(lone) = self.lone else { return 1 };
        let budget = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
        let each = self.each.unwrap_or(lone).max(1);
        let more = budget.saturating_sub(lone) / each;
        usize::try_from(more)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
            .clamp(1, max.max(1))
    }
}

/// The active interactive sessions and the doorbells' pace.
#[derive(Debug)]
pub(super) struct Interactive {
    /// Each active interactive session: when it last had work queued, and its deadline.
    active: crate::IdMap<u64, (Instant, Option<Duration>)>,
    /// `executor.interactive_idle_ms`.
    idle: Duration,
    pub(super) pace: Pace,
}

impl Interactive {
    pub(super) fn new(idle: Duration) -> Self {
        Self {
            active: crate::IdMap::default(),
            idle,
            pace: Pace::default(),
        }
    }

    /// `session`, of `priority`, queued work at `now`.
    pub(super) fn queued(&mut self, session: u64, priority: Priority, now: Instant) {
        if priority.is_interactive() {
            self.active.insert(session, (now, priority.deadline));
        }
    }

    /// `session` ended.
    pub(super) fn ended(&mut self, session: u64) {
        self.active.remove(&session);
    }

    /// Whether `session` is an active interactive session.
    #[cfg(test)]
    pub(super) fn is_active(&self, session: u64) -> bool {
        self.active.contains_key(&session)
    }

    /// How long a doorbell that is not interactive work may take at `now`: `None` when no
    /// interactive session is active. Sessions idle past `executor.interactive_idle_ms` are
    /// dropped.
    pub(super) fn budget(&mut self, now: Instant) -> Option<Duration> {
        if self.active.is_empty() {
            return None;
        }
        let idle = self.idle;
        self.active
            .retain(|_, (last, _)| now.saturating_duration_since(*last) < idle);
        let lone = self.pace.lone().unwrap_or(Duration::ZERO);
        self.active
            .values()
            .map(|(_, deadline)| deadline.map_or(lone, |d| (d / 2).max(lone)))
            .min()
    }

    /// The most dispatches (or chain links) a doorbell that is not interactive work may carry
    /// at `now`, of at most `max`.
    pub(super) fn cap(&mut self, now: Instant, max: usize) -> usize {
        match self.budget(now) {
            None => max,
            Some(b) => self.pace.fit(b, max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// The model's npu1 doorbell: 82 µs a chain, 28 µs and ~3 µs of kernel a command.
    fn npu1(n: usize) -> Duration {
        US * (82 + 31 * u32::try_from(n).unwrap())
    }

    fn learned() -> Pace {
        let mut p = Pace::default();
        for _ in 0..64 {
            p.observe(1, npu1(1));
            p.observe(32, npu1(32));
        }
        p
    }

    #[test]
    fn the_pace_learns_a_doorbells_fixed_and_per_dispatch_cost() {
        let p = learned();
        let lone = p.lone().unwrap();
        assert!(lone.abs_diff(npu1(1)) < US, "{lone:?}");
        let each = Duration::from_nanos(p.each.unwrap());
        assert!(each.abs_diff(US * 31) < US, "{each:?}");
    }

    #[test]
    fn a_budget_holds_as_many_dispatches_as_fit_in_it() {
        let p = learned();
        assert_eq!(p.fit(npu1(1), 32), 1, "a lone doorbell's budget: one");
        assert_eq!(p.fit(npu1(5), 32), 5);
        assert_eq!(p.fit(npu1(5) - US, 32), 4);
        assert_eq!(p.fit(Duration::from_secs(1), 32), 32, "at most the plan's");
        assert_eq!(p.fit(Duration::ZERO, 32), 1, "at least one");
        assert_eq!(
            Pace::default().fit(npu1(32), 32),
            1,
            "one until a lone doorbell was seen"
        );
    }

    #[test]
    fn a_doorbell_that_built_a_context_barely_moves_the_pace() {
        let mut p = learned();
        p.observe(1, Duration::from_millis(35));
        let lone = p.lone().unwrap();
        assert!(lone < npu1(1) * 2, "{lone:?}");
    }

    #[test]
    fn a_first_doorbell_that_built_a_context_does_not_stay_the_pace() {
        // The queue's first doorbell, lone, builds the context; batches follow.
        let mut p = Pace::default();
        p.observe(1, Duration::from_millis(35));
        p.observe(32, npu1(32));
        // Bounded by the batch: what a batch takes is estimated right, and budgets below it
        // hold one dispatch until a lone doorbell is seen (never more than fit).
        assert_eq!(p.lone(), Some(npu1(32)), "{p:?}");
        assert_eq!(p.estimate(32), npu1(32));
        assert_eq!(p.fit(npu1(5), 32), 1);
        p.observe(1, npu1(1));
        assert_eq!(
            p.lone(),
            Some(npu1(1)),
            "a lone doorbell far below resets it"
        );
        for _ in 0..32 {
            p.observe(32, npu1(32));
        }
        let est = p.estimate(32);
        assert!(est.abs_diff(npu1(32)) < npu1(32) / 10, "{est:?}");
        assert_eq!(p.fit(npu1(5), 32), 5, "{p:?}");
    }

    #[test]
    fn doorbells_are_kept_short_only_while_an_interactive_session_is_active() {
        let t0 = Instant::now();
        let mut i = Interactive::new(Duration::from_millis(100));
        i.pace = learned();
        i.queued(1, Priority::BATCH, t0);
        assert_eq!(i.cap(t0, 32), 32, "batch work alone: whole batches");
        i.queued(2, Priority::interactive(None), t0);
        assert!(i.is_active(2) && !i.is_active(1));
        assert_eq!(i.cap(t0, 32), 1, "no deadline: a lone dispatch's doorbell");
        i.queued(3, Priority::interactive(Some(npu1(9) * 2)), t0);
        assert_eq!(i.cap(t0, 32), 1, "the tightest active session decides");
        i.ended(2);
        assert_eq!(i.cap(t0, 32), 9, "half the deadline");
        let later = t0 + Duration::from_millis(100);
        assert_eq!(i.cap(later, 32), 32, "idle past interactive_idle_ms");
        assert!(!i.is_active(3));
    }
}
