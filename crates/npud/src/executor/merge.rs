//! Single dispatches of several sessions rung as one doorbell batch.
//!
//! On an NPU a doorbell is a command chain submitted and waited for, and each command in a
//! chain costs far less than a chain of its own (the timing model's figures: 41 µs a chain and
//! 9 µs a command on npu2). So when a turn's item is a single dispatch and other single
//! dispatches are queued, of its own session or of others, the executor rings them together,
//! up to one doorbell batch ([`MERGE_MAX`], fewer when the packet ABI's plan ends the batch
//! sooner). They are taken in fair order: the turn's session first, then one dispatch of each
//! session with one ready, the session charged least first, and round again; a session charged
//! more than [`JOIN_WITHIN`] past the turn's virtual time does not join. Nothing waits for
//! company: the batch is what is queued when the turn starts, so a lone dispatch on an idle
//! device rings alone at once. Chains are never merged: they stay contiguous.
//!
//! Each dispatch keeps its own checks (deadline, fault budget, program, arguments) and its own
//! answer. Only dispatches whose program is loaded and whose tensors need no staging join; one
//! that cannot goes back to the front of its session's queue and has a turn of its own. The
//! device reports one completion per batch, so its time is shared equally among the
//! dispatches that ran, and each session is charged its share of the turn
//! ([`Worker::merged_charges`]).
//!
//! Interactive sessions' dispatches ring apart from batch work (`classes`): a turn of an
//! interactive session's dispatch takes only interactive sessions' dispatches into its batch;
//! a turn of a batch session's takes any, and while an interactive session is active, only as
//! many as fit the doorbell budget its deadline sets.
//!
//! When the batch fails at a dispatch, those before it completed and are answered so; the one
//! that failed gets the answer it would have had alone (a device fault quarantines its program
//! and charges its identity, no other); those after it did not run and go back to the front of
//! their sessions' queues, where their next turn checks their programs and the fault budget
//! again, uncharged for the batch. A refusal before the doorbell (nothing of the batch ran)
//! answers only the dispatch refused; the others go back unrun.

use std::time::Instant;

use hsa_core::{ChainError, Dispatch, HsaError};

use super::loads::Step;
use super::work::{Phase, Running, faulted, faulted_error, nanos};
use super::worker::{Job, Worker};
use crate::error::NpudError;

/// Dispatches merged into one doorbell batch at most: the emulator's noop design, 2
/// arguments, plans 32 commands to a doorbell (fewer for wider ones).
pub(super) const MERGE_MAX: usize = 32;

/// How far ahead of the turn's virtual time a session may be charged and still join its batch.
/// Sessions that keep the device busy alike are within a batch's share of each other (a full
/// batch of the model's npu1 takes about 1 ms); one charged far more (a fault's batch and the
/// queue's rebuild, 35 ms each on the model) waits for its own turn instead of taking a place in
/// every batch, so it gets its share of the device's time, not of its doorbells.
const JOIN_WITHIN: std::time::Duration = std::time::Duration::from_millis(2);

/// Whether `r` may share a doorbell batch with its neighbours: a single dispatch that has not
/// started, or one that a merged batch gave back unrun.
pub(super) fn mergeable(r: &Running) -> bool {
    !r.item.chain
        && r.item.links.len() == 1
        && r.progress
            .as_ref()
            .is_none_or(|p| p.phase == Phase::Run && p.link == 0 && p.staged.is_empty())
}

/// What preparing a dispatch for a merged batch found.
enum Prep {
    /// Checked, its program loaded, ready to ring.
    Ready(Box<Running>),
    /// Refused by its checks.
    Refused(Box<Running>, NpudError),
    /// It needs a turn of its own (a load, staging, a FullElf command's heap room).
    Alone(Box<Running>),
}

impl Worker {
    /// Whether the item `r` of `session`, popped for a turn, rings together with others: it is
    /// a mergeable single dispatch and some session's next item is one too; without
    /// `executor.batch_across_sessions`, its own session's, and no other session waits.
    pub(super) fn merges(&self, session: u64, r: &Running) -> bool {
        let next = |j: &Job| matches!(j, Job::Work(w) if mergeable(w));
        mergeable(r)
            && if self.batch_across_sessions {
                self.rr.any_next(next)
            } else {
                self.rr.alone(session) && self.rr.any_next(next)
            }
    }

    /// The turn of `first` (of `session`) and the mergeable dispatches queued behind it, in
    /// fair order across sessions: one doorbell batch. What cannot join goes back to its
    /// session; what the batch did not run goes back to the front of its session's queue.
    pub(super) fn merged_turn(
        &mut self,
        session: u64,
        first: Box<Running>,
    ) -> Option<Box<Running>> {
        // An interactive session's doorbell carries interactive work only; another, while an
        // interactive session is active, as much as its budget allows.
        let interactive = first.item.priority.is_interactive();
        let max = if interactive {
            MERGE_MAX
        } else {
            self.interactive.cap(self.turn_started, MERGE_MAX)
        };
        let mut members = match self.prepare(first, true) {
            Prep::Ready(r) => vec![(session, r)],
            Prep::Refused(r, e) => {
                self.reply(r.item, Err(e));
                return None;
            }
            Prep::Alone(r) => return self.work_turn(r),
        };
        // Sessions that gave back an item that could not join: nothing more of theirs joins.
        let mut stopped: Vec<u64> = Vec::new();
        let mut back: Vec<(u64, Box<Running>)> = Vec::new();
        'rounds: while members.len() < max {
            // One dispatch of each session with one ready, in fair order.
            let mut this_round: Vec<u64> = Vec::new();
            loop {
                let across = self.batch_across_sessions;
                let skip = |s: u64| {
                    stopped.contains(&s) || this_round.contains(&s) || !(across || s == session)
                };
                let joins = |j: &Job| {
                    matches!(j, Job::Work(w) if mergeable(w)
                        && (!interactive || w.item.priority.is_interactive()))
                };
                let Some((s, Job::Work(next))) = self.rr.take_fair_if(JOIN_WITHIN, skip, joins)
                else {
                    break;
                };
                // A session alone in the queue fills the batch without a round a dispatch.
                if !self.rr.alone(s) {
                    this_round.push(s);
                }
                match self.prepare(next, false) {
                    Prep::Ready(r) => members.push((s, r)),
                    // Answered at its own turn, after the dispatches before it.
                    Prep::Refused(r, _) | Prep::Alone(r) => {
                        back.push((s, r));
                        stopped.push(s);
                    }
                }
                if members.len() == max {
                    break 'rounds;
                }
            }
            if this_round.is_empty() {
                break;
            }
        }
        if members.len() == 1 {
            self.give_back(back);
            return members.pop().and_then(|(_, r)| self.work_turn(r));
        }
        let dispatches: Vec<Dispatch> = members
            .iter()
            .filter_map(|(_, r)| r.progress.as_ref()?.dispatches.first().cloned())
            .collect();
        // As many as the packet ABI rings at once; a dispatch the plan refuses rings alone
        // below and is refused as it would be alone.
        let n = match self.dev.doorbell_plan(&dispatches) {
            Ok(batches) => batches.first().copied().unwrap_or(1),
            Err(e) => e.index,
        }
        .clamp(1, members.len());
        let rest = members.split_off(n);
        self.give_back(rest.into_iter().chain(back).collect());
        self.ring_merged(members, &dispatches[..n]);
        None
    }

    /// Checks `r` (its start, or again after it gave its turn up) and fills in its program's
    /// device id. The batch's first dispatch may load its program, within the turn's bounds;
    /// a later one joins only when its program is loaded, so that nothing loads or evicts a
    /// program an earlier member runs.
    fn prepare(&mut self, mut r: Box<Running>, first: bool) -> Prep {
        if r.progress.is_none() {
            match self.start(&r.item) {
                Ok(p) => r.progress = Some(p),
                Err(e) => return Prep::Refused(r, e),
            }
        }
        let program = r.item.links[0].program.clone();
        if program.is_full_elf() && self.dev.info().packet_abi.loads_code_objects() {
            return Prep::Alone(r);
        }
        let loaded = self.cache.touch(program.id);
        let item = &r.item;
        let Some(p) = r.progress.as_mut() else {
            return Prep::Alone(r);
        };
        if !p.staged.is_empty() || (loaded.is_none() && !first) {
            return Prep::Alone(r);
        }
        match p.phase {
            // Loaded: its device id is all it needs (the batch's plan covers its command).
            Phase::Load if let Some(id) = loaded => {
                if let Some(d) = p.dispatches.first_mut() {
                    d.program = id;
                }
                p.batches = vec![1];
                p.phase = Phase::Run;
            }
            Phase::Load => match self.load_item(item, p) {
                Ok(Step::Ready) => p.phase = Phase::Run,
                Ok(Step::Wait) => return Prep::Alone(r),
                Err(e) => return Prep::Refused(r, e),
            },
            Phase::Run if p.yielded => match self.recheck(item, p, 0..1) {
                Ok(Step::Ready) => p.yielded = false,
                Ok(Step::Wait) => return Prep::Alone(r),
                Err((_, e)) => return Prep::Refused(r, e),
            },
            Phase::Run => {}
            _ => return Prep::Alone(r),
        }
        Prep::Ready(r)
    }

    /// Puts `items`, which did nothing but their checks, back in order at the front of their
    /// sessions' queues, as they were before: each starts again at its turn, checking its
    /// deadline, the fault budget, its program and its arguments then.
    fn give_back(&mut self, items: Vec<(u64, Box<Running>)>) {
        for (session, mut r) in items.into_iter().rev() {
            r.progress = None;
            self.rr.resume(session, Job::Work(r));
        }
    }

    /// Rings `dispatches`, one per member, as one doorbell batch and answers each member.
    fn ring_merged(&mut self, mut members: Vec<(u64, Box<Running>)>, dispatches: &[Dispatch]) {
        let session = members[0].0;
        let start = Instant::now();
        // Each member's session pays its share of the turn.
        self.merged_charges.clear();
        self.merged_charges.extend(members.iter().map(|(s, _)| *s));
        for (_, r) in &mut members {
            if let Some(p) = r.progress.as_mut() {
                p.queue_ns = Some(nanos(start.duration_since(r.item.admitted)));
            }
        }
        // Statistics read what the executor published: the programs just loaded count.
        self.publish();
        self.record_programs(
            members
                .iter()
                .map(|(_, r)| r.item.links[0].program.as_ref()),
        );
        self.ringing(dispatches.len());
        let result = self.dev.run_chain(dispatches);
        if !result.as_ref().is_err_and(faulted) {
            self.clear_in_flight();
        }
        let (report, failure) = match result {
            Ok(report) => {
                if report.doorbells == 1 {
                    self.interactive
                        .pace
                        .observe(dispatches.len(), report.device_time);
                }
                if let Some(r) = self.inflight.as_mut() {
                    r.completed();
                }
                self.serving.recovered();
                (report, None)
            }
            Err(ChainError {
                index,
                error,
                report,
            }) => (report, Some((index, error))),
        };
        // A device error, a timeout or an unknown outcome comes after the doorbell: the
        // dispatches before it ran (and, unless the runtime refused it, the failed one too;
        // an unknown outcome is no fault, and its dispatch is not counted as run). Anything
        // else was refused before it, and none ran.
        let on_device = |e: &HsaError| {
            matches!(
                e,
                HsaError::Device { .. }
                    | HsaError::Timeout { .. }
                    | HsaError::OutcomeUnknown { .. }
            )
        };
        let (ran, ran_failed) = match &failure {
            None => (members.len(), false),
            Some((index, e)) if on_device(e) => (*index, faulted_error(e)),
            Some(_) => (0, false),
        };
        // The device's time, shared among the dispatches it ran.
        let share = report.device_time
            / u32::try_from((ran + usize::from(ran_failed)).max(1)).unwrap_or(u32::MAX);
        // A batch of unknown outcome: none of its dispatches is done, and none may run again
        // (each may have run, or still be running); every one is answered "outcome unknown".
        let unknown = match &failure {
            Some((_, HsaError::OutcomeUnknown { took, limit, .. })) => {
                Some(NpudError::from(HsaError::OutcomeUnknown {
                    index: 0,
                    took: *took,
                    limit: *limit,
                }))
            }
            _ => None,
        };
        if let Some(e) = unknown {
            tracing::warn!(
                session,
                dispatches = members.len(),
                error = %e,
                "a merged batch's outcome is unknown; not counted as done, not charged as a fault"
            );
            self.replace_queue_after_unknown();
            for (_, mut r) in members {
                if let Some(p) = r.progress.as_mut() {
                    p.device = report.device_time;
                    let failure = super::LinkFailure {
                        index: 0,
                        error: e.clone(),
                    };
                    let outcome = Ok(self.done(p, 0, Some(failure)));
                    self.reply(r.item, outcome);
                }
            }
            return;
        }
        let failed = failure.as_ref().map_or(usize::MAX, |(index, _)| *index);
        // A device fault's turn is the faulting session's: the batch's time (its program's
        // context build included) is charged to it alone, and so is the queue's rebuild at the
        // next doorbell ([`Worker::recovering`]).
        let faulter = members.get(failed).filter(|_| ran_failed).map(|(s, _)| *s);
        if let Some(f) = faulter {
            self.merged_charges = vec![f];
        }
        // The completed dispatches' device time by the running averages, and the failed one's
        // the rest of the batch's.
        let (share, failed_share) = match (faulter, self.interactive.pace.each()) {
            (Some(_), Some(each)) if ran > 0 => {
                let each = each.min(share);
                let ran_time = each * u32::try_from(ran).unwrap_or(u32::MAX);
                (each, report.device_time.saturating_sub(ran_time))
            }
            _ => (share, share),
        };
        let mut failure = failure.map(|(_, e)| e);
        let mut unrun = Vec::new();
        for (k, (s, mut r)) in members.into_iter().enumerate() {
            let item = &r.item;
            let Some(p) = r.progress.as_mut() else {
                continue;
            };
            if k != failed && k >= ran {
                unrun.push((s, r));
                continue;
            }
            if k < ran || ran_failed {
                p.device = if k == failed { failed_share } else { share };
                // The batch's one doorbell, counted on its first dispatch.
                p.doorbells = u32::from(k == 0) * report.doorbells;
            }
            let outcome = match failure.take_if(|_| k == failed) {
                None => Ok(self.done(p, 1, None)),
                Some(error) => {
                    if let Some(other) = self.failed_on_device(item, p, 0, error) {
                        self.refused(p, 0, 1, 0, NpudError::from(other));
                    }
                    p.outcome.take().unwrap_or_else(|| {
                        Err(NpudError::Internal(
                            "a work item ended without a result".into(),
                        ))
                    })
                }
            };
            self.reply(r.item, outcome);
        }
        if !unrun.is_empty() {
            tracing::debug!(
                session,
                unrun = unrun.len(),
                "dispatches a merged batch did not run go back to the queue"
            );
            // Not charged for the batch they did not run in.
            if faulter.is_none() {
                self.merged_charges.truncate(ran + usize::from(ran_failed));
            }
            self.give_back(unrun);
        }
    }
}
