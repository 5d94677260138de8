//! Running one work item on the device, a bounded piece per turn: the deadline and fault-budget
//! checks, argument checks against the program's DDR patches (a slice of the links a turn;
//! nothing runs before every link is checked), loading programs (at most one a turn, evicting
//! least-recently-used ones; [`super::loads`]), staging client memfds in and out
//! (at most `executor.slice_bytes` per turn), the chain one doorbell batch per turn, and what a
//! device fault does (quarantine, the fault budget, queue recovery) or a runtime's refusal
//! does not.
//!
//! Between two turns of one item, other sessions run. So every batch of an item that has given
//! up a turn since its checks (a later batch of a chain, and the first batch of an item whose
//! checks or staging took several turns) checks again that its programs may run (one may have been
//! quarantined or unregistered meanwhile) and are loaded (another session's work may have
//! evicted them), and that the identity has not spent its fault budget meanwhile; a link
//! refused then ends the chain as a link failure, with the links before it completed, or the
//! item with the refusal when nothing of it ran (its staged memfds are then left as they are).
//! The session's own later work waits behind the item (its queue is FIFO), so nothing of the
//! session changes its staged tensors in between.
//!
//! Around each doorbell the executor keeps the state directory's in-flight record: the distinct
//! programs of the batch are recorded before the doorbell and cleared after it returns, so that
//! a runtime that aborts the process on a device fault leaves behind which programs were on the
//! device (and, since another session may run between two batches, only the batch that was
//! on the device); the next start suspects them, and quarantines those it already suspected
//! (`state_dir::suspects`). A batch that completes clears its programs' suspicion.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hsa_core::{ChainError, Dispatch, HsaError, ProgramId};
use smallvec::SmallVec;

use super::WorkItem;
use super::loads::Step;
use super::sched::may_start;
use super::worker::Worker;
use crate::error::NpudError;
use crate::programs::{Program, Runnable};

/// An item's distinct programs (or their ids): inline for up to four, as most items have one.
type Programs<'a> = SmallVec<[&'a Program; 4]>;
type Ids = SmallVec<[u64; 4]>;

/// A link that failed on the device after earlier links completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFailure {
    pub index: usize,
    pub error: NpudError,
}

/// What a work item did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkDone {
    /// Admission to the start of the device batch.
    pub queue_ns: u64,
    /// Doorbell to completion (or failure).
    pub device_ns: u64,
    pub doorbells: u32,
    /// Links that completed.
    pub completed: usize,
    pub failure: Option<LinkFailure>,
}

/// A work item and how far it got.
#[derive(Debug)]
pub struct Running {
    pub item: WorkItem,
    pub(super) progress: Option<Progress>,
}

impl Running {
    pub fn new(item: WorkItem) -> Self {
        Self {
            item,
            progress: None,
        }
    }
}

/// Links one turn checks, at most. Checking a link (its program may run, each argument against
/// the session's tensors and the program's DDR patches) costs about a tenth of running it on the
/// emulator, so a slice costs about one doorbell batch: a 1,024-link chain is checked in four
/// turns (and loaded and planned in a fifth, with its first batch) instead of one that would
/// make every other session wait for all of it.
const CHECK_LINKS_PER_TURN: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Checking the links, [`CHECK_LINKS_PER_TURN`] a turn; nothing runs before all are checked.
    Check,
    /// Loading the item's programs, one a turn ([`super::loads`]).
    Load,
    StageIn,
    Run,
    StageOut,
}

/// An item that has started: its checks, then its batches.
#[derive(Debug)]
pub(super) struct Progress {
    /// One per link checked so far (all of them past [`Phase::Check`]).
    pub(super) dispatches: Vec<Dispatch>,
    /// Links per doorbell batch, in order.
    pub(super) batches: Vec<usize>,
    /// The next batch, and its first link.
    pub(super) batch: usize,
    pub(super) link: usize,
    /// Staged memfds (store id, bytes, whether an argument naming it may be written), and the
    /// copy's position: (index, bytes done). Only written ones are copied back after the work:
    /// the client lends those, and may write the others again as soon as it stops waiting.
    pub(super) staged: Vec<(u64, u64, bool)>,
    pub(super) cursor: (usize, u64),
    pub(super) phase: Phase,
    /// Whether the item gave its turn up since its programs, their quarantine and the
    /// identity's fault budget were last checked: other sessions ran meanwhile, so the next
    /// batch checks them again.
    pub(super) yielded: bool,
    pub(super) queue_ns: Option<u64>,
    pub(super) device: Duration,
    pub(super) doorbells: u32,
    /// The reply, held while staged results are copied out.
    pub(super) outcome: Option<Result<WorkDone, NpudError>>,
}

impl Worker {
    /// Does one turn of `r`: its checks when it starts, then at most `executor.slice_bytes` of
    /// staging copies and at most one doorbell batch. Gives it back when work is left.
    pub(super) fn work_turn(&mut self, mut r: Box<Running>) -> Option<Box<Running>> {
        if r.progress.is_none() {
            match self.start(&r.item) {
                Ok(p) => r.progress = Some(p),
                Err(e) => {
                    self.reply(r.item, Err(e));
                    return None;
                }
            }
        }
        let mut budget = self.slice_bytes as u64;
        let mut rang = false;
        loop {
            let p = r.progress.as_mut()?;
            match p.phase {
                Phase::Check => match self.check_links(&r.item, p) {
                    // The turn that checked the last slice ends there: loading and the first
                    // batch come at the item's next turn.
                    Ok(Step::Ready) => {
                        p.phase = Phase::Load;
                        p.yielded = true;
                        return Some(r);
                    }
                    Ok(Step::Wait) => {
                        p.yielded = true;
                        return Some(r);
                    }
                    Err(e) => {
                        self.reply(r.item, Err(e));
                        return None;
                    }
                },
                Phase::Load => match self.load_item(&r.item, p) {
                    Ok(Step::Ready) => {}
                    Ok(Step::Wait) => {
                        p.yielded = true;
                        return Some(r);
                    }
                    Err(e) => {
                        self.reply(r.item, Err(e));
                        return None;
                    }
                },
                Phase::StageIn => match self.stage(p, &mut budget, true) {
                    Ok(true) => {
                        p.phase = Phase::Run;
                        p.cursor = (0, 0);
                    }
                    Ok(false) => {
                        p.yielded = true;
                        return Some(r);
                    }
                    Err(e) => {
                        self.reply(r.item, Err(e));
                        return None;
                    }
                },
                Phase::Run => {
                    if rang {
                        p.yielded = true;
                        return Some(r);
                    }
                    rang = true;
                    self.run_batch(&r.item, p);
                }
                Phase::StageOut => match self.stage(p, &mut budget, false) {
                    Ok(false) => return Some(r),
                    done => {
                        if let Err(e) = done {
                            tracing::error!(error = %e, "copying results back to a client memfd failed");
                        }
                        let outcome = p.outcome.take().unwrap_or_else(|| {
                            Err(NpudError::Internal(
                                "a work item ended without a result".into(),
                            ))
                        });
                        self.reply(r.item, outcome);
                        return None;
                    }
                },
            }
        }
    }

    pub(super) fn reply(&mut self, item: WorkItem, result: Result<WorkDone, NpudError>) {
        self.loader_done(item.session);
        match &result {
            Ok(done) => tracing::debug!(
                session = item.session,
                links = item.links.len(),
                completed = done.completed,
                queue_ns = done.queue_ns,
                device_ns = done.device_ns,
                "work done"
            ),
            Err(e) => {
                tracing::debug!(session = item.session, code = e.code_name(), error = %e, "work refused")
            }
        }
        let _ = item.reply.send(result);
    }

    /// What an item checks when it reaches the front: the deadline and the fault budget, and
    /// the links of an item of at most [`CHECK_LINKS_PER_TURN`]; a longer item's links are
    /// checked next, a slice a turn ([`Phase::Check`]).
    pub(super) fn start(&mut self, item: &WorkItem) -> Result<Progress, NpudError> {
        let now = self.turn_started;
        if !may_start(item.deadline, now) {
            return Err(NpudError::DeadlineExceeded(format!(
                "the deadline passed after {:?} in the queue; the work did not run",
                now.duration_since(item.admitted)
            )));
        }
        self.budget.check(&item.who, "dispatch", now)?;
        let mut p = Progress {
            dispatches: Vec::with_capacity(item.links.len()),
            batches: Vec::new(),
            batch: 0,
            link: 0,
            staged: Vec::new(),
            cursor: (0, 0),
            phase: Phase::Check,
            yielded: false,
            queue_ns: None,
            device: Duration::ZERO,
            doorbells: 0,
            outcome: None,
        };
        // An item of one slice is checked at once.
        if item.links.len() <= CHECK_LINKS_PER_TURN {
            self.check_links(item, &mut p)?;
            p.phase = Phase::Load;
        }
        Ok(p)
    }

    /// The Check phase: checks the next [`CHECK_LINKS_PER_TURN`] links (each link's program and
    /// arguments; field names are formatted only on failure); `Ready` when every link is
    /// checked. Nothing of the item runs before then, so a bad link refuses the whole item.
    /// Device ids are filled in once the programs are loaded (the Load phase).
    fn check_links(&mut self, item: &WorkItem, p: &mut Progress) -> Result<Step, NpudError> {
        let first = p.dispatches.len();
        let end = (first + CHECK_LINKS_PER_TURN).min(item.links.len());
        // Consecutive links usually run one program: its store entry is looked up once.
        let mut runnable: Option<u64> = None;
        for (k, link) in item.links.iter().enumerate().take(end).skip(first) {
            let prefix = LinkPrefix {
                chain: item.chain,
                k,
            };
            if runnable != Some(link.program.id) {
                self.check_runnable(&link.program, prefix)?;
                runnable = Some(link.program.id);
            }
            let mut args = Vec::with_capacity(link.args.len());
            let mut sizes: SmallVec<[u64; 16]> = SmallVec::new();
            for (i, a) in link.args.iter().enumerate() {
                let r = self
                    .tensors
                    .resolve(item.session, a, format_args!("{prefix}args[{i}]"))?;
                if let Some(id) = r.staged {
                    match p.staged.iter_mut().find(|(s, ..)| *s == id) {
                        Some(s) => s.2 |= !a.read_only,
                        None => p.staged.push((
                            id,
                            self.tensors.size(item.session, id, "tensor_id")?,
                            !a.read_only,
                        )),
                    }
                }
                sizes.push(r.len);
                args.push(r.arg);
            }
            link.program
                .check_args(&sizes, format_args!("{prefix}args"))?;
            p.dispatches.push(Dispatch {
                program: ProgramId(0),
                args,
            });
        }
        Ok(if end == item.links.len() {
            Step::Ready
        } else {
            Step::Wait
        })
    }

    /// The Load phase: loads the item's distinct programs (at most one a turn), then fills in
    /// their device ids and plans the doorbell batches.
    pub(super) fn load_item(
        &mut self,
        item: &WorkItem,
        p: &mut Progress,
    ) -> Result<Step, NpudError> {
        let mut programs: Programs<'_> = SmallVec::new();
        for l in &item.links {
            if !programs.iter().any(|x| x.id == l.program.id) {
                programs.push(&l.program);
            }
        }
        let protect: Ids = programs.iter().map(|x| x.id).collect();
        if self.load_step(item.session, &programs, &protect)? == Step::Wait {
            return Ok(Step::Wait);
        }
        for (d, l) in p.dispatches.iter_mut().zip(&item.links) {
            d.program = self.loaded_id(&l.program)?;
        }
        p.batches = self.dev.doorbell_plan(&p.dispatches).map_err(|e| {
            let err = NpudError::from(e.error);
            if item.chain {
                err.within(&format!("links[{}]", e.index))
            } else {
                err
            }
        })?;
        p.phase = Phase::StageIn;
        Ok(Step::Ready)
    }

    fn check_runnable(&self, program: &Program, p: LinkPrefix) -> Result<(), NpudError> {
        match self.programs.runnable(program.id) {
            Runnable::Yes => Ok(()),
            Runnable::Gone => Err(NpudError::NotFound(format!(
                "{p}program_id: program {} was unregistered",
                program.id
            ))),
            Runnable::Quarantined => Err(NpudError::FailedPrecondition(format!(
                "{p}program_id: program {} ({}) is quarantined: it faulted the device while \
                 this work was queued",
                program.id,
                program.display_name()
            ))),
        }
    }

    /// Copies staged memfds in (or out) within `budget` bytes; true when every copy is done.
    fn stage(&mut self, p: &mut Progress, budget: &mut u64, into: bool) -> Result<bool, NpudError> {
        while let Some(&(id, len, written)) = p.staged.get(p.cursor.0) {
            let done = p.cursor.1;
            if done >= len || (!into && !written) {
                p.cursor = (p.cursor.0 + 1, 0);
                continue;
            }
            if *budget == 0 {
                return Ok(false);
            }
            let n = (len - done).min(*budget);
            if into {
                self.tensors.stage_in(&mut self.dev, id, done, n)?;
            } else {
                self.tensors.stage_out(&self.dev, id, done, n)?;
            }
            *budget -= n;
            p.cursor.1 += n;
        }
        Ok(true)
    }

    /// Rings one doorbell batch of `item`; sets the outcome and moves to staging out when the
    /// item is over (its last batch, or a failure).
    fn run_batch(&mut self, item: &WorkItem, p: &mut Progress) {
        let first = p.link;
        let len = p.batches.get(p.batch).copied().unwrap_or(0);
        let end = (first + len).min(p.dispatches.len());
        if p.yielded {
            match self.recheck(item, p, first..end) {
                Err((index, error)) => {
                    self.refused(p, first, end, index, error);
                    return;
                }
                // Loads are left for the item's next turn.
                Ok(Step::Wait) => return,
                Ok(Step::Ready) => p.yielded = false,
            }
        }
        // While an interactive session is active, another's doorbell holds what fits the
        // budget its deadline sets (`classes`); the rest is the next batch.
        let end = if item.priority.is_interactive() || end - first <= 1 {
            end
        } else {
            let fit = self.interactive.cap(self.turn_started, end - first);
            if fit < end - first {
                p.batches[p.batch] = fit;
                p.batches.insert(p.batch + 1, end - first - fit);
            }
            first + fit
        };
        let programs: Programs<'_> = item.links[first..end]
            .iter()
            .map(|l| l.program.as_ref())
            .collect();
        let protect = distinct_ids(&programs);
        let end = match self.full_elf_room(item.session, &programs, &protect) {
            Ok(Ok(fit)) if fit < end - first => {
                // The heap holds the control code of only `fit` commands at once: the rest
                // goes in a batch of its own.
                p.batches[p.batch] = fit;
                p.batches.insert(p.batch + 1, end - first - fit);
                first + fit
            }
            Ok(Ok(_)) => end,
            Ok(Err(_)) => {
                p.yielded = true;
                return;
            }
            Err(e) => {
                let e = if item.chain {
                    e.within(&format!("links[{first}]"))
                } else {
                    e
                };
                self.refused(p, first, end, first, e);
                return;
            }
        };
        let start = Instant::now();
        if p.queue_ns.is_none() {
            p.queue_ns = Some(nanos(start.duration_since(item.admitted)));
        }
        // Statistics read what the executor published: the programs just loaded count.
        self.publish();
        self.record_in_flight(item, first..end);
        self.ringing(end - first);
        let result = self.dev.run_chain(&p.dispatches[first..end]);
        if !result.as_ref().is_err_and(faulted) {
            // A device fault keeps the record until its program's quarantine is on disk.
            self.clear_in_flight();
        }
        match result {
            Ok(report) => {
                if report.doorbells == 1 {
                    self.interactive
                        .pace
                        .observe(end - first, report.device_time);
                }
                // A suspect among the batch's programs ran to completion: no longer suspected.
                if let Some(r) = self.inflight.as_mut() {
                    r.completed();
                }
                p.device += report.device_time;
                p.doorbells += report.doorbells;
                p.batch += 1;
                p.link = end;
                if end >= p.dispatches.len() {
                    // A dispatch ran, so the device serves again even if recover() had failed.
                    self.serving.recovered();
                    p.outcome = Some(Ok(self.done(p, p.dispatches.len(), None)));
                    p.phase = Phase::StageOut;
                }
            }
            Err(ChainError {
                index,
                error,
                report,
            }) => {
                p.device += report.device_time;
                p.doorbells += report.doorbells;
                let index = first + index;
                if let Some(other) = self.failed_on_device(item, p, index, error) {
                    let e = NpudError::from(other);
                    let e = if item.chain {
                        e.within(&format!("links[{index}]"))
                    } else {
                        e
                    };
                    // Refused before the doorbell: none of this batch ran.
                    self.refused(p, first, end, index, e);
                }
            }
        }
    }

    /// Link `index` of `item` failed at its doorbell: the runtime refused it
    /// ([`Worker::runtime_refused`]), or it faulted the device or timed out (its program
    /// quarantined, the fault charged, the item ended with a link failure). Either way the
    /// item's outcome is set. Any other error was a refusal before the doorbell, and is given
    /// back for the caller to answer.
    pub(super) fn failed_on_device(
        &mut self,
        item: &WorkItem,
        p: &mut Progress,
        index: usize,
        error: HsaError,
    ) -> Option<HsaError> {
        let link = item.links.get(index).map(|l| l.program.as_ref());
        if let HsaError::Device { status, .. } = &error
            && let Some(e) = link.and_then(|l| {
                let name = format!("{} ({})", l.id, l.display_name());
                crate::faults::refusal(*status, &name, &error)
            })
        {
            self.runtime_refused(item, p, index, e);
            return None;
        }
        match error {
            HsaError::OutcomeUnknown { .. } => {
                self.outcome_unknown(item, p, index, NpudError::from(error));
                None
            }
            HsaError::Device { .. } | HsaError::Timeout { .. } => {
                let error = self.device_fault(item, link, &error);
                p.outcome = Some(Ok(self.done(p, index, Some(LinkFailure { index, error }))));
                p.phase = Phase::StageOut;
                None
            }
            other => Some(other),
        }
    }

    /// Link `index` of the batch `first..end` was refused before the doorbell (without a
    /// device fault). The links before it in the batch run first, as a batch of their own in
    /// the next turn; when it is the batch's first, the item ends there: an error when no link
    /// ran, a link failure after the completed ones (so that, as the API says, links before
    /// the failure completed and links after it did not run).
    pub(super) fn refused(
        &self,
        p: &mut Progress,
        first: usize,
        end: usize,
        index: usize,
        error: NpudError,
    ) {
        if index > first && index < end {
            p.batches[p.batch] = index - first;
            p.batches.insert(p.batch + 1, end - index);
            return;
        }
        p.outcome = Some(if first == 0 {
            // Nothing of the item ran: its staged memfds hold what the client last wrote, and
            // copying the staging buffers back would only undo later writes.
            p.staged.clear();
            Err(error)
        } else {
            Ok(self.done(
                p,
                first,
                Some(LinkFailure {
                    index: first,
                    error,
                }),
            ))
        });
        p.phase = Phase::StageOut;
    }

    /// Link `index`'s batch rang, and whether it ran cannot be known (ROCm 7.0 gave up waiting
    /// for it after 50 ms and reported nothing). Not a device fault: nothing is quarantined or
    /// charged, since a correct kernel slower than 50 ms or a loaded host look the same, and
    /// the device reported no error. Neither is it done: the item ends with `error` (UNKNOWN,
    /// "outcome unknown ..."), as a link failure after the links before it, which completed. The queue (and on ROCm 7.0 the runtime) is replaced, so that nothing the
    /// batch may still be doing reaches later work through it.
    pub(super) fn outcome_unknown(
        &mut self,
        item: &WorkItem,
        p: &mut Progress,
        index: usize,
        e: NpudError,
    ) {
        tracing::warn!(
            session = item.session,
            error = %e,
            "a dispatch's outcome is unknown; not counted as done, not charged as a fault"
        );
        self.replace_queue_after_unknown();
        // As after a device fault, the staged outputs are copied out: they hold whatever the
        // device wrote.
        p.outcome = Some(Ok(self.done(
            p,
            index,
            Some(LinkFailure { index, error: e }),
        )));
        p.phase = Phase::StageOut;
    }

    /// Replaces the queue (on ROCm 7.0 the runtime) after a batch whose outcome is unknown.
    pub(super) fn replace_queue_after_unknown(&mut self) {
        self.serving.recovering();
        match self.dev.recover() {
            Ok(_) => self.serving.recovered(),
            Err(e) => tracing::error!(
                error = %e,
                "replacing the queue after a batch of unknown outcome failed; the next dispatch \
                 retries"
            ),
        }
    }

    /// The runtime refused link `index` when the doorbell rang, before running it (the links
    /// before it completed). Not a device fault: nothing is quarantined or charged. The queue,
    /// which the runtime suspends after any failed batch, is recreated; the item ends there.
    pub(super) fn runtime_refused(
        &mut self,
        item: &WorkItem,
        p: &mut Progress,
        index: usize,
        e: NpudError,
    ) {
        tracing::warn!(session = item.session, error = %e, "the runtime refused a dispatch");
        if let Err(e) = self.dev.recover() {
            tracing::error!(
                error = %e,
                "recreating the queue after a refused batch failed; the next dispatch retries"
            );
        }
        let e = if item.chain {
            e.within(&format!("links[{index}]"))
        } else {
            e
        };
        p.outcome = Some(if index == 0 {
            // Nothing of the item ran: its staged memfds are left as they are.
            p.staged.clear();
            Err(e)
        } else {
            Ok(self.done(p, index, Some(LinkFailure { index, error: e })))
        });
        p.phase = Phase::StageOut;
    }

    pub(super) fn done(
        &self,
        p: &Progress,
        completed: usize,
        failure: Option<LinkFailure>,
    ) -> WorkDone {
        WorkDone {
            queue_ns: p.queue_ns.unwrap_or(0),
            device_ns: nanos(p.device),
            doorbells: p.doorbells,
            completed,
            failure,
        }
    }

    /// Before a batch of an item that yielded: the identity may still use the device, and the
    /// batch's programs may still run and are loaded (loading them, within the turn's bounds,
    /// and refreshing their device ids); `Wait` when loads are left for the next turn.
    pub(super) fn recheck(
        &mut self,
        item: &WorkItem,
        p: &mut Progress,
        links: std::ops::Range<usize>,
    ) -> Result<Step, (usize, NpudError)> {
        self.budget
            .check(&item.who, "dispatch", Instant::now())
            .map_err(|e| (links.start, e))?;
        let mut programs: Vec<&Program> = Vec::new();
        for k in links.clone() {
            let link = &item.links[k];
            let prefix = LinkPrefix {
                chain: item.chain,
                k,
            };
            self.check_runnable(&link.program, prefix)
                .map_err(|e| (k, e))?;
            if !programs.iter().any(|x| x.id == link.program.id) {
                programs.push(&link.program);
            }
        }
        let protect: Vec<u64> = programs.iter().map(|x| x.id).collect();
        if self
            .load_step(item.session, &programs, &protect)
            .map_err(|e| (links.start, e))?
            == Step::Wait
        {
            return Ok(Step::Wait);
        }
        for k in links.clone() {
            p.dispatches[k].program = self.loaded_id(&item.links[k].program).map_err(|e| (k, e))?;
        }
        Ok(Step::Ready)
    }

    /// Records the distinct programs of `links` of `item` as on the device (nothing without a
    /// state directory).
    fn record_in_flight(&mut self, item: &WorkItem, links: std::ops::Range<usize>) {
        self.record_programs(item.links[links].iter().map(|l| l.program.as_ref()));
    }

    /// Records the distinct programs among `programs` as on the device.
    pub(super) fn record_programs<'a>(&mut self, programs: impl Iterator<Item = &'a Program>) {
        let Some(r) = self.inflight.as_mut() else {
            return;
        };
        let mut seen = Ids::new();
        r.begin(
            programs
                .filter(|p| {
                    let new = !seen.contains(&p.id);
                    if new {
                        seen.push(p.id);
                    }
                    new
                })
                .map(|p| (p.hash.as_str(), p.name.as_str())),
        );
    }

    pub(super) fn clear_in_flight(&mut self) {
        if let Some(r) = self.inflight.as_mut() {
            r.end();
        }
    }

    /// A program faulted the device: quarantine it (durably, before the in-flight record that
    /// would otherwise quarantine every program of the batch at the next start is cleared),
    /// count the fault, charge it to the session and its identity, and report the service
    /// NOT_SERVING while the queue is recreated.
    pub(super) fn device_fault(
        &mut self,
        item: &WorkItem,
        program: Option<&Program>,
        error: &HsaError,
    ) -> NpudError {
        self.faults.fetch_add(1, Ordering::Relaxed);
        if self.budget.charge(item.session, &item.who, Instant::now()) {
            let who = &item.who;
            tracing::warn!(
                session = item.session,
                "{who} spent its device-fault budget (limits.fault_budget); cooling it down"
            );
        }
        // Written before NOT_SERVING: the record's fsyncs are not recovery, and clients that
        // submit meanwhile are queued rather than told to retry.
        if let Some(p) = program {
            self.programs
                .quarantine(p.id, &format!("it faulted the device: {error}"));
        }
        self.clear_in_flight();
        self.serving.recovering();
        self.recovering = Some(item.session);
        let msg = match program {
            Some(p) => {
                tracing::error!(program = p.id, error = %error, "a program faulted the device; quarantined it");
                format!(
                    "the device failed program {} ({}): {error}; the program is quarantined",
                    p.id,
                    p.display_name()
                )
            }
            None => format!("the device failed: {error}"),
        };
        // NOT_SERVING covers the queue's recreation (a hardware-context rebuild on an NPU).
        match self.dev.recover() {
            Ok(_) => self.serving.recovered(),
            Err(e) => tracing::error!(
                error = %e,
                "recreating the queue after the fault failed; the next dispatch retries"
            ),
        }
        NpudError::Internal(msg)
    }
}

/// `links[k].` in a chain's messages; nothing for a single dispatch.
#[derive(Debug, Clone, Copy)]
pub struct LinkPrefix {
    pub chain: bool,
    pub k: usize,
}

impl std::fmt::Display for LinkPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.chain {
            write!(f, "links[{}].", self.k)
        } else {
            Ok(())
        }
    }
}

/// Whether a batch's failure is a device fault (a timeout, or a device error that is not the
/// runtime's refusal): the in-flight record stays until the program's quarantine is on disk.
pub(super) fn faulted(e: &ChainError) -> bool {
    faulted_error(&e.error)
}

/// As [`faulted`], of the error alone.
pub(super) fn faulted_error(e: &HsaError) -> bool {
    match e {
        HsaError::Timeout { .. } => true,
        HsaError::Device { status, .. } => !crate::faults::is_refusal(*status),
        _ => false,
    }
}

pub(super) fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The distinct program ids of `programs` (a batch's links, which usually share one), in
/// order: what eviction must leave loaded.
fn distinct_ids(programs: &[&Program]) -> Ids {
    let mut ids = Ids::new();
    for p in programs {
        if !ids.contains(&p.id) {
            ids.push(p.id);
        }
    }
    ids
}
