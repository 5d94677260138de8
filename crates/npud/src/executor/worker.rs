//! The executor thread's loop: take every waiting command, give the session charged least one
//! bounded turn, publish what changed, and wait when there is nothing to do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use hsa_core::Device;
use tokio::sync::{mpsc, oneshot};

use super::cache::ProgramCache;
use super::classes::Interactive;
use super::copy::CopyJob;
use super::idle::{Idle, Woke};
use super::loads::TurnLoads;
use super::ports::Ports;
use super::sched::FairTurns;
use super::shared::Shared;
use super::tensors::Tensors;
use super::work::Running;
use super::{Command, Snapshot};
use crate::error::NpudError;
use crate::faults::FaultBudget;
use crate::health::DeviceHealth;
use crate::programs::Programs;
use crate::state_dir::InFlight;

// Tuned: `npu_fd::latency` says why it has its value and what measured it.
const YIELD_AFTER: std::time::Duration = npu_fd::latency::EXECUTOR_YIELD_AFTER;

/// The executor thread's state.
#[derive(Debug)]
pub(super) struct Worker {
    pub(super) dev: Device,
    pub(super) tensors: Tensors,
    pub(super) cache: ProgramCache,
    pub(super) rr: FairTurns<Job>,
    pub(super) programs: Arc<Programs>,
    pub(super) serving: DeviceHealth,
    pub(super) faults: Arc<AtomicU64>,
    pub(super) budget: Arc<FaultBudget>,
    pub(super) shared: Arc<Shared>,
    /// Whether tensor usage changed since the last publication.
    pub(super) usage_changed: bool,
    /// (heap used, programs loaded) as last published.
    pub(super) published: (u64, usize),
    /// `executor.slice_bytes`: the most bytes one turn copies.
    pub(super) slice_bytes: usize,
    /// The job that had the last turn and has work left, until the commands that arrived
    /// during that turn have been queued.
    pub(super) suspended: Option<(u64, Job)>,
    /// The session of each dispatch the turn's merged batch ran: each is charged a share of
    /// the turn (empty: the turn's session pays it all).
    pub(super) merged_charges: Vec<u64>,
    /// `executor.batch_across_sessions`.
    pub(super) batch_across_sessions: bool,
    /// `executor.interactive_weight`.
    pub(super) interactive_weight: u32,
    /// The active interactive sessions, and how long other doorbells may be meanwhile.
    pub(super) interactive: Interactive,
    /// The session whose device fault re-created the queue, until the next doorbell: that
    /// doorbell rebuilds the hardware context (35 ms on the model), and what it takes beyond
    /// the running averages' estimate is charged to this session, not to the batch's.
    pub(super) recovering: Option<u64>,
    /// The session charged for this turn's doorbell beyond its estimate, and the dispatches
    /// the doorbell carried.
    pub(super) turn_debtor: Option<(u64, usize)>,
    /// Which programs are on the device, for the next start if this process dies meanwhile.
    pub(super) inflight: Option<InFlight>,
    pub(super) idle: Idle,
    /// The session whose work item loads programs now ([`super::loads`]).
    pub(super) loader: Option<u64>,
    /// What the current turn has loaded and evicted.
    pub(super) turn: TurnLoads,
    /// When the current turn started.
    pub(super) turn_started: Instant,
    /// When the executor last began running turns back to back (since it last waited for work
    /// or offered its CPU): see [`Worker::offer_cpu`].
    pub(super) busy_since: Option<Instant>,
    /// The dispatch rings this thread polls.
    pub(super) ports: Ports,
    /// Cleared when a [`Command::Nudge`] is taken.
    pub(super) nudged: Arc<AtomicBool>,
}

/// What waits in a session's queue: a work item (maybe part done), a copy, or the release of an
/// ended session's tensors.
#[derive(Debug)]
pub(super) enum Job {
    Work(Box<Running>),
    Copy(CopyJob),
    Release(Release),
}

/// An ended session's tensors, freed `executor.slice_bytes` a turn (at least one tensor: the
/// runtime frees an allocation in one call), so that releasing a session of many GiB is many
/// short turns between other sessions' work.
#[derive(Debug)]
pub(super) struct Release {
    /// Tensors freed so far.
    freed: usize,
    reply: oneshot::Sender<usize>,
}

impl Job {
    fn refuse(self, e: NpudError) {
        match self {
            Job::Work(r) => {
                let _ = r.item.reply.send(Err(e));
            }
            Job::Copy(c) => c.refuse(e),
            Job::Release(r) => {
                let _ = r.reply.send(r.freed);
            }
        }
    }
}

impl Worker {
    /// The doorbell about to ring `n` dispatches is the first since a device fault re-created
    /// the queue: the faulting session pays what it takes beyond its estimate.
    pub(super) fn ringing(&mut self, n: usize) {
        if let Some(s) = self.recovering.take() {
            self.turn_debtor = Some((s, n));
        }
    }

    /// After turns back to back since `busy_since` up to `now`: once they have run
    /// [`YIELD_AFTER`], offers the CPU to whatever thread waits for it (the gRPC I/O thread the
    /// executor's own replies woke, most often) instead of holding it for the rest of a
    /// scheduler slice. Returns at once when nothing waits.
    fn offer_cpu(&mut self, busy_since: Instant, now: Instant) {
        if now.saturating_duration_since(busy_since) >= YIELD_AFTER {
            std::thread::yield_now();
            self.busy_since = None;
        }
    }

    pub(super) fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        let mut closed = false;
        loop {
            // The rings first: the answers the last turn gave are posted before anything else
            // (a client spins on its completion), and what they submitted is taken.
            self.poll_ports(shutdown.is_some());
            // Then every command that is already waiting, so control commands and newly
            // admitted work are seen between work items.
            while !closed {
                match rx.try_recv() {
                    Ok(Command::Shutdown { reply }) => shutdown = Some(reply),
                    Ok(cmd) => self.handle(cmd, shutdown.is_some()),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
                }
            }
            // The item that just had its turn goes behind the sessions whose work arrived
            // during that turn.
            if let Some((session, job)) = self.suspended.take() {
                self.rr.resume(session, job);
            }
            self.publish();
            if let Some((session, job)) = self.rr.pop() {
                // The turn's one reading of the clock: the heartbeat, the idle policy and the
                // checks at the turn's start use it.
                let now = Instant::now();
                self.turn_started = now;
                let busy_since = *self.busy_since.get_or_insert(now);
                self.shared.beat_at(now);
                self.turn = TurnLoads::default();
                self.idle.serving(session, now);
                let left = match job {
                    Job::Work(r) if self.merges(session, &r) => {
                        self.merged_turn(session, r).map(Job::Work)
                    }
                    Job::Work(r) => self.work_turn(r).map(Job::Work),
                    Job::Copy(c) => self.copy_turn(c).map(Job::Copy),
                    Job::Release(r) => self.release_turn(session, r).map(Job::Release),
                };
                // The session pays for the turn's time, or the sessions of a merged batch each
                // their share: the next turn goes to whoever has been charged least
                // ([`FairTurns`]).
                let mut took = now.elapsed();
                self.offer_cpu(busy_since, now + took);
                if let Some((debtor, n)) = self.turn_debtor.take() {
                    let excess = took.saturating_sub(self.interactive.pace.estimate(n));
                    self.rr.charge(debtor, excess);
                    took -= excess;
                }
                let mut shared = std::mem::take(&mut self.merged_charges);
                if shared.is_empty() {
                    self.rr.charge(session, took);
                } else {
                    // One charge per session, however many of its dispatches the batch held.
                    let share = took / u32::try_from(shared.len()).unwrap_or(u32::MAX);
                    shared.sort_unstable();
                    for run in shared.chunk_by(|a, b| a == b) {
                        self.rr
                            .charge(run[0], share * u32::try_from(run.len()).unwrap_or(u32::MAX));
                    }
                    shared.clear();
                }
                // Kept, with its room, for the next merged batch.
                self.merged_charges = shared;
                self.suspended = left.map(|job| (session, job));
                continue;
            }
            if shutdown.is_some() || closed {
                break;
            }
            self.shared.idle();
            self.busy_since = None;
            let next = self.idle.next_or(&mut rx, &mut self.ports);
            self.shared.beat();
            match next {
                Woke::Command(Command::Shutdown { reply }) => shutdown = Some(reply),
                Woke::Command(cmd) => self.handle(cmd, false),
                Woke::Elsewhere => {}
                Woke::Closed => closed = true,
            }
        }
        // The queued work is done: the rings post its last answers and close.
        self.poll_ports(true);
        self.ports.close_all();
        self.release_all();
        drop(self);
        tracing::info!("released the NPU");
        if let Some(reply) = shutdown {
            let _ = reply.send(());
        }
    }

    /// Polls the dispatch rings and queues what they took.
    fn poll_ports(&mut self, draining: bool) {
        if self.ports.is_empty() {
            return;
        }
        self.ports.poll_all(draining);
        self.queue_port_items(draining);
    }

    fn queue_port_items(&mut self, draining: bool) {
        // The list goes back empty, keeping its room for the next poll.
        let mut items = std::mem::take(&mut self.ports.items);
        for item in items.drain(..) {
            self.handle(Command::Work(item), draining);
        }
        self.ports.items = items;
    }

    fn handle(&mut self, cmd: Command, draining: bool) {
        if !matches!(
            cmd,
            Command::Work(_)
                | Command::Write { .. }
                | Command::Read { .. }
                | Command::Info { .. }
                | Command::Size { .. }
                | Command::Nudge
        ) {
            self.usage_changed = true;
        }
        let dev = &mut self.dev;
        let t = &mut self.tensors;
        match cmd {
            Command::Work(item) => {
                if draining {
                    let _ = item.reply.send(Err(NpudError::Unavailable(
                        "the daemon is shutting down".into(),
                    )));
                    return;
                }
                let session = item.session;
                if item.priority.is_interactive() {
                    self.interactive
                        .queued(session, item.priority, Instant::now());
                    self.rr.set_class(session, self.interactive_weight, true);
                }
                if item.flow_controlled {
                    // Bounded by the stream's window (and the daemon's queued-bytes budget);
                    // queued in order behind whatever the session has queued.
                    self.rr
                        .push_unbounded(session, Job::Work(Box::new(Running::new(item))));
                } else if let Err(job) = self
                    .rr
                    .push(session, Job::Work(Box::new(Running::new(item))))
                {
                    job.refuse(NpudError::ResourceExhausted(
                        "the session already has limits.max_pending_per_session dispatches \
                         queued"
                            .into(),
                    ));
                }
            }
            Command::Allocate {
                session,
                size,
                name,
                cap,
                local,
                reply,
            } => {
                let _ = reply.send(t.allocate(dev, session, size, name, cap, local));
            }
            Command::DeclareImport {
                session,
                size,
                name,
                cap,
                reply,
            } => {
                let _ = reply.send(t.declare_import(session, size, name, cap));
            }
            Command::AttachImport {
                session,
                tensor,
                fd,
                reply,
            } => {
                let _ = reply.send(t.attach_import(dev, session, tensor, fd));
            }
            Command::Export {
                session,
                tensor,
                reply,
            } => {
                let _ = reply.send(t.export(dev, session, tensor));
            }
            Command::Free {
                session,
                tensor,
                reply,
            } => {
                let _ = reply.send(t.free(dev, session, tensor));
            }
            Command::Info {
                session,
                tensor,
                reply,
            } => {
                let _ = reply.send(t.info(session, tensor));
            }
            Command::Size {
                session,
                tensor,
                reply,
            } => {
                let _ = reply.send(t.size(session, tensor, "tensor_id"));
            }
            Command::Write {
                session,
                tensor,
                offset,
                data,
                reply,
            } => {
                let job = CopyJob::Write {
                    session,
                    tensor,
                    offset,
                    data,
                    done: 0,
                    reply,
                };
                self.rr.push_unbounded(job.session(), Job::Copy(job));
            }
            Command::Read {
                session,
                tensor,
                offset,
                len,
                reply,
            } => {
                let job = CopyJob::Read {
                    session,
                    tensor,
                    offset,
                    len,
                    out: Vec::new(),
                    reply,
                };
                self.rr.push_unbounded(job.session(), Job::Copy(job));
            }
            Command::Unload { program } => self.unload(program),
            Command::ReleaseSession { session, reply } => {
                let suspended = self
                    .suspended
                    .take_if(|(s, _)| *s == session)
                    .map(|(_, job)| job);
                for job in suspended.into_iter().chain(self.rr.take_session(session)) {
                    job.refuse(NpudError::Unavailable(
                        "the session ended before this work finished".into(),
                    ));
                }
                if self.loader == Some(session) {
                    self.loader = None;
                }
                self.interactive.ended(session);
                self.budget.forget_session(session);
                // Its tensors are freed in turns of their own, and the reply waits for the last.
                self.rr
                    .push_unbounded(session, Job::Release(Release { freed: 0, reply }));
            }
            Command::AttachIntake(mut intake) => {
                if draining {
                    intake.close();
                } else {
                    self.ports.add(intake);
                }
            }
            Command::Nudge => self.nudged.store(false, Ordering::Release),
            #[cfg(test)]
            Command::Charges { sessions, reply } => {
                let _ = reply.send(sessions.iter().map(|s| self.rr.charged(*s)).collect());
            }
            Command::Shutdown { reply } => {
                // Handled by the loop; answering here keeps the match total.
                let _ = reply.send(());
            }
        }
    }

    /// One turn of a session release: frees up to `executor.slice_bytes` of its tensors (at
    /// least one). Gives the job back while tensors are left.
    fn release_turn(&mut self, session: u64, mut r: Release) -> Option<Release> {
        let (freed, done) =
            self.tensors
                .release_some(&mut self.dev, session, self.slice_bytes as u64);
        r.freed += freed;
        self.usage_changed |= freed > 0;
        if done {
            let _ = r.reply.send(r.freed);
            return None;
        }
        Some(r)
    }

    /// Publishes what the device holds when it changed since the last time.
    pub(super) fn publish(&mut self) {
        let now = (self.dev.heap_used() as u64, self.cache.len());
        if !self.usage_changed && now == self.published {
            return;
        }
        self.shared.publish(Snapshot {
            heap_used: now.0,
            programs_loaded: u32::try_from(now.1).unwrap_or(u32::MAX),
            usage: self.tensors.all_usage(),
        });
        self.published = now;
        self.usage_changed = false;
    }

    pub(super) fn unload(&mut self, program: u64) {
        if let Some(d) = self.cache.remove(program) {
            if let Err(e) = self.dev.unload_program(d) {
                tracing::warn!(program, error = %e, "unloading a program failed");
            }
            self.programs.set_loaded(program, false);
        }
    }

    fn release_all(&mut self) {
        self.tensors.clear(&mut self.dev);
        for (id, d) in self.cache.drain() {
            if let Err(e) = self.dev.unload_program(d) {
                tracing::warn!(program = id, error = %e, "unloading a program failed");
            }
        }
    }
}
