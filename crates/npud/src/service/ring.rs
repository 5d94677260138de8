//! AttachRing, and the dispatch ring's two halves in the daemon (`proto/npud/v1/ring.md`).
//!
//! A ring is polled by the executor thread ([`crate::executor::Intake`]): its [`Port`] copies
//! each submission slot out of the shared memory before it looks at it (`npu_fd::ring`), then
//! admits it exactly as a `Dispatch` call ([`NpudService::admission`]): the same checks, the same
//! pending count and refusals, the same turns, the same statistics. The executor queues the
//! item in its session's turn, runs it, and the port posts its completion, in submission
//! order, on the same thread: while the executor is awake and the client spins, a dispatch
//! crosses no thread. The port keeps at most a ring's worth admitted and unanswered.
//!
//! When the executor blocks, the port sets `sq_sleeping`, so the client rings `sq_bell`; the
//! ring's bell thread sleeps on it and nudges the executor when the ring needs a look: a
//! submission the port can take, answers held for a full completion ring that the client has
//! since made room in, or a stop. The bell thread also wakes every [`IDLE_SLEEP`] (an idle ring
//! costs one look a second), or while the port holds answers the client's full completion ring
//! has no room for, every [`BUSY_SLEEP`], doubling up to [`BUSY_SLEEP_MAX`] while the client
//! consumes nothing. A bell rung with nothing behind it nudges nobody, and after
//! [`WASTED_FREE`] such rings in a row the bell thread stops listening for a while
//! ([`BELL_BACKOFF_FIRST`], doubling up to [`BELL_BACKOFF_MAX`]) until a ring brings work. So a
//! client that rings without work, corrupts its bells or stops consuming completions costs the
//! daemon a bounded number of wake-ups of its own ring's thread, delays only its own ring, and
//! never wakes the executor: the executor never waits for it.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use npu_fd::ring::{self, Completion, RingMemory, Submission, Word};
use npu_proto::v1 as pb;
use tokio::sync::oneshot;
use tonic::Request;

use super::NpudService;
use super::work::{Admitted, Work};
use crate::error::NpudError;
use crate::executor::{Command, Intake, Polled, WorkDone, WorkItem};
use crate::tickets::Grant;

// Tuned latencies: `npu_fd::latency` says why each has its value and what measured it.
const BUSY_SLEEP: Duration = npu_fd::latency::BELL_BUSY_SLEEP;
const BUSY_SLEEP_MAX: Duration = npu_fd::latency::BELL_BUSY_SLEEP_MAX;
const IDLE_SLEEP: Duration = npu_fd::latency::BELL_IDLE_SLEEP;
const WASTED_FREE: u32 = npu_fd::latency::BELL_WASTED_FREE;
const BELL_BACKOFF_FIRST: Duration = npu_fd::latency::BELL_BACKOFF_FIRST;
const BELL_BACKOFF_MAX: Duration = npu_fd::latency::BELL_BACKOFF_MAX;

/// The rings of the daemon's sessions, one at most per session.
#[derive(Debug, Default)]
pub struct Rings {
    map: Mutex<crate::IdMap<u64, Arc<RingControl>>>,
}

impl Rings {
    fn lock(&self) -> MutexGuard<'_, crate::IdMap<u64, Arc<RingControl>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `session` has a ring.
    pub fn has(&self, session: u64) -> bool {
        self.lock().contains_key(&session)
    }

    /// Tears down `session`'s ring, if it has one.
    pub fn stop(&self, session: u64) {
        if let Some(c) = self.lock().remove(&session) {
            c.stop();
        }
    }

    /// Rings attached now.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    fn insert(&self, session: u64, c: &Arc<RingControl>) -> Result<(), NpudError> {
        let mut g = self.lock();
        if g.contains_key(&session) {
            return Err(NpudError::FailedPrecondition(format!(
                "session {session} already has a dispatch ring"
            )));
        }
        g.insert(session, c.clone());
        Ok(())
    }

    fn remove(&self, session: u64, c: &Arc<RingControl>) {
        let mut g = self.lock();
        if g.get(&session).is_some_and(|x| Arc::ptr_eq(x, c)) {
            g.remove(&session);
        }
    }
}

/// What other threads hold of a running ring.
#[derive(Debug)]
pub struct RingControl {
    mem: Arc<RingMemory>,
    stopped: AtomicBool,
    /// With `stopped`: the `broken` reason the ring ends with (0: closed, not broken).
    broken_by: AtomicU32,
    /// Submissions the port has copied out (its `sq_head`), for the bell thread.
    taken: AtomicU32,
    /// The port holds answers the completion ring has no room for.
    backlog: AtomicBool,
    /// The port takes no further slot until answers come (its window is full).
    full: AtomicBool,
    /// The bell thread, woken from a back-off pause by [`RingControl::stop`].
    bell: std::sync::OnceLock<std::thread::Thread>,
    /// The port has finished.
    done: tokio::sync::Notify,
    finished: AtomicBool,
}

impl RingControl {
    /// Asks the port to stop and wakes the bell thread (which nudges the executor), at once
    /// even while the bell thread pauses.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.mem.ring(Word::SqBell);
        if let Some(t) = self.bell.get() {
            t.unpark();
        }
    }

    /// Tears the ring down because its client sent bytes or fds on the lifeline, which carries
    /// none: the ring ends broken ([`ring::BROKEN_LIFELINE`]), its answers counted, not posted.
    pub fn break_lifeline(&self) {
        self.broken_by
            .store(ring::BROKEN_LIFELINE, Ordering::SeqCst);
        self.stop();
    }

    /// How a stop asked from outside ends the port.
    fn end_asked(&self) -> End {
        match self.broken_by.load(Ordering::SeqCst) {
            0 => End::Stopped,
            why => End::Broken(why),
        }
    }

    /// Waits until the port has finished (it stopped, or the client broke the ring).
    pub async fn finished(&self) {
        loop {
            let n = self.done.notified();
            if self.finished.load(Ordering::SeqCst) {
                return;
            }
            n.await;
        }
    }
}

/// A submission in the order it came: answered already, or waiting for the executor.
#[derive(Debug)]
enum Entry {
    Answered(Completion),
    Waiting {
        request_id: u64,
        admitted: Admitted,
        /// Queued as a `Submit` stream's item (slot flag [`ring::QUEUED`]).
        queued: bool,
    },
}

impl NpudService {
    pub(super) fn attach_ring(
        &self,
        req: Request<pb::AttachRingRequest>,
    ) -> Result<pb::AttachRingResponse, NpudError> {
        let caller = self.caller(&req)?;
        let Some(uid) = caller.conn.as_ref().and_then(|c| c.uid) else {
            return Err(NpudError::FailedPrecondition(
                "AttachRing needs a local client on the Unix socket (shared memory cannot cross \
                 TCP); use Dispatch or Submit"
                    .into(),
            ));
        };
        if self.state.rings.has(caller.session) {
            return Err(NpudError::FailedPrecondition(format!(
                "session {} already has a dispatch ring",
                caller.session
            )));
        }
        let t = self
            .state
            .tickets
            .issue(caller.session, uid, 0, Grant::Ring)?;
        Ok(pb::AttachRingResponse {
            fd_ticket: t.as_bytes().to_vec(),
            fd_socket: self.fd_socket(),
            slots: ring::SLOTS,
            ring_bytes: ring::RING_BYTES as u64,
            version: 1,
            slot_flags: ring::QUEUED,
        })
    }

    /// Maps a ring's memfd (already checked as an import of [`ring::RING_BYTES`]), starts its
    /// bell thread and hands its port to the executor for `session`.
    ///
    /// # Errors
    /// FAILED_PRECONDITION when the session has a ring already or has ended, INTERNAL when the
    /// memfd cannot be mapped or the thread cannot start, UNAVAILABLE when the executor has
    /// stopped.
    pub async fn start_ring(
        &self,
        session: u64,
        fd: OwnedFd,
    ) -> Result<Arc<RingControl>, NpudError> {
        // The ring holds the session's life: it ends with the session, its identity's
        // revocation or cool-down, or shutdown, whichever is first.
        let ended = || NpudError::FailedPrecondition(format!("session {session} has ended"));
        let life = self
            .state
            .lifecycle
            .stream_life(session)
            .ok_or_else(ended)?;
        if self.state.sessions.grant(session).is_none() {
            return Err(ended());
        }
        let mem = RingMemory::map(fd.as_fd())
            .map_err(|e| NpudError::Internal(format!("mapping the ring: {e}")))?;
        drop(fd);
        let ctl = Arc::new(RingControl {
            mem: Arc::new(mem),
            stopped: AtomicBool::new(false),
            broken_by: AtomicU32::new(0),
            taken: AtomicU32::new(0),
            backlog: AtomicBool::new(false),
            full: AtomicBool::new(false),
            bell: std::sync::OnceLock::new(),
            done: tokio::sync::Notify::new(),
            finished: AtomicBool::new(false),
        });
        self.state.rings.insert(session, &ctl)?;
        // The session may have ended since the look above, and its end stopped the rings it
        // found before this one was there. A session's end takes it out of the sessions first
        // and stops its ring after: so looked at again now that the ring is in, either the
        // session is still there (and its end, later, finds the ring) or it is gone here.
        if self.state.sessions.grant(session).is_none() {
            self.state.rings.remove(session, &ctl);
            return Err(ended());
        }
        {
            let ctl = ctl.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = life.ended() => ctl.stop(),
                    () = ctl.finished() => {}
                }
            });
        }
        // As many as the ring holds: each is admitted as a `Dispatch` call is, so a session over
        // its pending limit is refused RESOURCE_EXHAUSTED, as concurrent calls would be. Queued
        // slots are a Submit stream's items: never refused for the limit, and held to a
        // stream's window instead.
        let window = ring::SLOTS as usize;
        let queued_window = self.submit_window(session).min(window);
        // From here on, dropping the port tears the ring down (and ends the bell thread).
        let port = Port {
            svc: self.clone(),
            session,
            ctl: ctl.clone(),
            window,
            queued_window,
            queued: 0,
            head: 0,
            cq_tail: 0,
            cq_head: 0,
            entries: VecDeque::new(),
            metrics_due: Vec::new(),
            end: None,
        };
        let bell = Bell {
            ctl: ctl.clone(),
            exec: self.state.exec.clone(),
        };
        let t = std::thread::Builder::new()
            .name(format!("npud-ring-{session}"))
            .spawn(move || bell.run())
            .map_err(|e| NpudError::Internal(format!("starting the ring's bell thread: {e}")))?;
        let _ = ctl.bell.set(t.thread().clone());
        self.state
            .exec
            .send(Command::AttachIntake(Box::new(port)))
            .await?;
        tracing::info!(session, window, "dispatch ring attached");
        Ok(ctl)
    }
}

/// The ring's bell thread: sleeps on `sq_bell` and nudges the executor when the ring needs a
/// look while the executor may be blocked.
struct Bell {
    ctl: Arc<RingControl>,
    exec: crate::executor::ExecutorHandle,
}

impl Bell {
    fn run(self) {
        let ctl = &self.ctl;
        let mem = &ctl.mem;
        let mut seen = mem.load(Word::SqBell);
        let mut taken_seen = ctl.taken.load(Ordering::Acquire);
        let mut cq_seen = mem.load(Word::CqHead);
        let mut busy = BUSY_SLEEP;
        let mut wasted = 0_u32;
        loop {
            if ctl.finished.load(Ordering::SeqCst) {
                return;
            }
            let backlog = ctl.backlog.load(Ordering::SeqCst);
            mem.wait(Word::SqBell, seen, if backlog { busy } else { IDLE_SLEEP });
            if ctl.finished.load(Ordering::SeqCst) {
                return;
            }
            // Read before nudging: a ring after this read changes the bell again, so the next
            // wait returns at once.
            let now = mem.load(Word::SqBell);
            let rung = now != seen;
            seen = now;
            let taken = ctl.taken.load(Ordering::Acquire);
            let progressed = taken != taken_seen;
            taken_seen = taken;
            // Answers wait for room: worth the executor's look only once the client consumed.
            let consumed = backlog && {
                let head = mem.load(Word::CqHead);
                let moved = head != cq_seen;
                cq_seen = head;
                moved
            };
            busy = if backlog && !consumed {
                (busy * 2).min(BUSY_SLEEP_MAX)
            } else {
                BUSY_SLEEP
            };
            let look = ctl.stopped.load(Ordering::SeqCst)
                || consumed
                || mem.load(Word::SqTail) != taken && !ctl.full.load(Ordering::SeqCst);
            if look {
                self.exec.nudge();
            }
            if look || progressed {
                wasted = 0;
            } else if rung {
                wasted = wasted.saturating_add(1);
            }
            if let Some(past) = wasted.checked_sub(WASTED_FREE + 1) {
                let pause = BELL_BACKOFF_FIRST
                    .checked_mul(1_u32 << past.min(16))
                    .map_or(BELL_BACKOFF_MAX, |d| d.min(BELL_BACKOFF_MAX));
                // Woken early by a stop.
                std::thread::park_timeout(pause);
            }
        }
    }
}

/// An answered item still to be counted in the metrics ([`Port::count_due`]).
#[derive(Debug)]
struct Due {
    programs: Vec<u64>,
    chain: bool,
    class: crate::priority::Class,
    result: Result<WorkDone, NpudError>,
}

/// Why a port ended.
#[derive(Debug, Clone, Copy)]
enum End {
    /// The session ended, the lifeline closed or the daemon stops: answer what was taken.
    Stopped,
    /// The client broke a rule: its answers are counted, not posted.
    Broken(u32),
}

/// One ring's daemon side, polled on the executor thread.
#[derive(Debug)]
struct Port {
    svc: NpudService,
    session: u64,
    ctl: Arc<RingControl>,
    window: usize,
    /// Queued submissions admitted and unanswered at most (a `Submit` stream's window).
    queued_window: usize,
    /// Queued submissions admitted and unanswered.
    queued: usize,
    /// Submissions copied out (the daemon's own count; `sq_head` is only written).
    head: u32,
    /// Completions posted.
    cq_tail: u32,
    /// The client's `cq_head` as last read (completions it had consumed then).
    cq_head: u32,
    entries: VecDeque<Entry>,
    /// Answered, counted in the statistics, not yet in the metrics.
    metrics_due: Vec<Due>,
    end: Option<End>,
}

impl Intake for Port {
    fn poll(&mut self, out: &mut Vec<WorkItem>, draining: bool) -> Polled {
        // A quiet ring (nothing submitted, nothing waited for or unposted) costs the executor's
        // idle poll two loads.
        if self.entries.is_empty()
            && self.end.is_none()
            && !draining
            && self.ctl.mem.load(Word::SqTail) == self.head
            && !self.ctl.stopped.load(Ordering::Relaxed)
        {
            return Polled::Open;
        }
        if self.end.is_none() && draining {
            self.end = Some(End::Stopped);
        }
        if self.end.is_none() && self.ctl.stopped.load(Ordering::SeqCst) {
            self.end = Some(self.ctl.end_asked());
        }
        if self.end.is_none()
            && let Err(why) = self.intake(out)
        {
            self.end = Some(End::Broken(why));
        }
        self.collect(self.end.is_some());
        if !matches!(self.end, Some(End::Broken(_)))
            && let Err(why) = self.post()
        {
            self.end = Some(End::Broken(why));
        }
        self.count_due();
        if self.end.is_some()
            && !self
                .entries
                .iter()
                .any(|e| matches!(e, Entry::Waiting { .. }))
        {
            self.finish();
            return Polled::Finished;
        }
        // Answers left at the front after posting found no room: the client must consume
        // first, and nothing tells the executor when it has (items still running are the
        // executor's own, and it polls after each turn).
        let stuck = matches!(self.entries.front(), Some(Entry::Answered(_)));
        if self.ctl.backlog.load(Ordering::Relaxed) != stuck {
            self.ctl.backlog.store(stuck, Ordering::SeqCst);
        }
        // Whether a bell rung for a new submission needs the executor: not while the window
        // is full (the executor polls after the turns that will answer it).
        let full = !self.has_room();
        if self.ctl.full.load(Ordering::Relaxed) != full {
            self.ctl.full.store(full, Ordering::SeqCst);
        }
        Polled::Open
    }

    fn park(&mut self, parked: bool) -> bool {
        let mem = &self.ctl.mem;
        mem.store(Word::SqSleeping, u32::from(parked));
        // An ended port takes nothing more: what it waits for is the executor's own work, so
        // it never keeps the executor from blocking (a broken ring's client may go on
        // publishing).
        parked
            && self.end.is_none()
            && (self.ctl.stopped.load(Ordering::SeqCst)
                || mem.load(Word::SqTail) != self.head && self.has_room())
    }

    fn close(&mut self) {
        if self.end.is_none() {
            self.end = Some(self.ctl.end_asked());
        }
        self.collect(true);
        for e in &mut self.entries {
            if let Entry::Waiting { request_id, .. } = e {
                *e = Entry::Answered(error_completion(*request_id, &NpudError::executor_gone()));
            }
        }
        if !matches!(self.end, Some(End::Broken(_))) {
            let _ = self.post();
        }
        self.count_due();
        self.finish();
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        if !self.ctl.finished.load(Ordering::SeqCst) {
            if self.end.is_none() {
                self.end = Some(End::Stopped);
            }
            self.finish();
        }
    }
}

impl Port {
    /// Whether the port reads another slot: fewer than a ring's worth admitted and unanswered,
    /// and fewer than a stream's window of them queued. A slot is read before its flags are
    /// known, so a full queued window holds back every slot behind it: completions are in
    /// submission order anyway.
    fn has_room(&self) -> bool {
        self.entries.len() < self.window && self.queued < self.queued_window
    }

    /// Copies out and admits what the client submitted, up to the window.
    fn intake(&mut self, out: &mut Vec<WorkItem>) -> Result<(), u32> {
        let mem = &self.ctl.mem;
        let tail = mem.load(Word::SqTail);
        let avail = tail.wrapping_sub(self.head);
        if avail > ring::SLOTS {
            return Err(ring::BROKEN_SQ_TAIL);
        }
        let mut took = 0;
        while took < avail as usize && self.has_room() {
            let raw = mem.read_submission(self.head);
            self.head = self.head.wrapping_add(1);
            mem.store(Word::SqHead, self.head);
            took += 1;
            let entry = match Submission::decode(&raw) {
                Err(bad) => {
                    let e = NpudError::InvalidArgument(bad.why);
                    self.svc.refused(self.session, 1, false, &e);
                    Entry::Answered(error_completion(bad.request_id, &e))
                }
                Ok(s) => self.admit(s, out),
            };
            if let Entry::Waiting { queued: true, .. } = entry {
                self.queued += 1;
            }
            self.entries.push_back(entry);
        }
        if took > 0 {
            self.ctl.taken.store(self.head, Ordering::Release);
        }
        Ok(())
    }

    fn admit(&self, s: Submission, out: &mut Vec<WorkItem>) -> Entry {
        let request_id = s.request_id;
        let queued = s.queued;
        let deadline =
            (s.timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(s.timeout_ms));
        let d = pb::DispatchRequest {
            program_id: s.program,
            args: s
                .args
                .iter()
                .map(|a| pb::TensorArg {
                    tensor_id: a.tensor,
                    offset: a.offset,
                    length: a.length,
                    read_only: a.read_only,
                })
                .collect(),
        };
        match self
            .svc
            .admission(self.session, Work::Dispatch(d), deadline, queued)
        {
            Ok((item, admitted)) => {
                out.push(item);
                Entry::Waiting {
                    request_id,
                    admitted,
                    queued,
                }
            }
            Err(e) => Entry::Answered(error_completion(request_id, &e)),
        }
    }

    /// Turns the answers that came into completions, counting them: from the front while they
    /// are in order, or all of them (`all`, when the port is ending).
    fn collect(&mut self, all: bool) {
        for e in &mut self.entries {
            let Entry::Waiting {
                request_id,
                admitted,
                queued,
            } = e
            else {
                continue;
            };
            let r = match admitted.rx.try_recv() {
                Ok(r) => r,
                Err(oneshot::error::TryRecvError::Closed) => Err(NpudError::executor_gone()),
                Err(oneshot::error::TryRecvError::Empty) if all => continue,
                Err(oneshot::error::TryRecvError::Empty) => break,
            };
            self.svc.record_stats(self.session, &admitted.programs, &r);
            self.queued -= usize::from(*queued);
            let c = completion(*request_id, &r);
            self.metrics_due.push(Due {
                programs: std::mem::take(&mut admitted.programs),
                chain: admitted.chain,
                class: admitted.class,
                result: r,
            });
            *e = Entry::Answered(c);
        }
    }

    /// Counts in the metrics what [`Port::collect`] answered. The API's statistics were
    /// updated before the answers were posted, so a client that has its completion sees its
    /// dispatch counted there; the Prometheus metrics, which a scraper reads from time to time,
    /// are updated after the post, off the client's wait.
    fn count_due(&mut self) {
        for d in self.metrics_due.drain(..) {
            self.svc
                .record_metrics(&d.programs, d.chain, d.class, &d.result);
        }
    }

    /// Room in the completion ring, or the rule the client's `cq_head` broke.
    ///
    /// `cq_head` is read again only when the room last read is used up: the client writes it
    /// after every completion it consumes, so reading it on every post would fetch its cache
    /// line from the client's core each time. A head read earlier only undercounts the room
    /// (the client's head only moves forward), and every value read is checked.
    fn room(&mut self) -> Result<u32, u32> {
        if self.cq_tail.wrapping_sub(self.cq_head) >= ring::SLOTS {
            let head = self.ctl.mem.load(Word::CqHead);
            let used = self.cq_tail.wrapping_sub(head);
            if used > ring::SLOTS {
                return Err(ring::BROKEN_CQ_HEAD);
            }
            self.cq_head = head;
        }
        Ok(ring::SLOTS - self.cq_tail.wrapping_sub(self.cq_head))
    }

    /// Posts answered items from the front, in order, while the completion ring has room.
    fn post(&mut self) -> Result<(), u32> {
        if !matches!(self.entries.front(), Some(Entry::Answered(_))) {
            return Ok(());
        }
        let mut room = self.room()?;
        while room > 0 {
            let Some(Entry::Answered(_)) = self.entries.front() else {
                break;
            };
            let Some(Entry::Answered(c)) = self.entries.pop_front() else {
                break;
            };
            self.post_one(&c);
            room -= 1;
        }
        Ok(())
    }

    /// Writes a completion into the next slot and publishes it (the caller checked the room),
    /// ringing the client's bell when it sleeps.
    fn post_one(&mut self, c: &Completion) {
        let mem = &self.ctl.mem;
        mem.write_completion(self.cq_tail, c);
        self.cq_tail = self.cq_tail.wrapping_add(1);
        mem.store(Word::CqTail, self.cq_tail);
        if mem.load(Word::CqSleeping) != 0 {
            mem.ring(Word::CqBell);
        }
    }

    /// Ends the ring: says why in its header, wakes the client and the bell thread, and lets
    /// the lifeline go. Answers left unposted (the completion ring was full) are dropped.
    fn finish(&mut self) {
        self.entries.clear();
        // Out of the session's rings before the client can see the end: a client that sees
        // its ring closed or broken may attach another at once.
        self.svc.state.rings.remove(self.session, &self.ctl);
        let mem = &self.ctl.mem;
        match self.end {
            Some(End::Broken(why)) => {
                tracing::info!(
                    session = self.session,
                    why,
                    "a client broke its dispatch ring's rules; the ring is torn down"
                );
                mem.store(Word::Broken, why);
                mem.store(Word::State, ring::STATE_BROKEN);
            }
            Some(End::Stopped) | None => mem.store(Word::State, ring::STATE_CLOSED),
        }
        mem.ring(Word::CqBell);
        self.ctl.backlog.store(false, Ordering::SeqCst);
        self.ctl.finished.store(true, Ordering::SeqCst);
        self.ctl.done.notify_waiters();
        mem.ring(Word::SqBell);
        if let Some(t) = self.ctl.bell.get() {
            t.unpark();
        }
        tracing::info!(session = self.session, "dispatch ring closed");
    }
}

/// A dispatch's answer as its completion: what `Dispatch` would have returned
/// (as `service::work::dispatch_response` makes it).
fn completion(request_id: u64, r: &Result<WorkDone, NpudError>) -> Completion {
    match r {
        Ok(WorkDone {
            failure: None,
            queue_ns,
            device_ns,
            ..
        }) => Completion {
            request_id,
            code: 0,
            message: String::new(),
            queue_ns: *queue_ns,
            device_ns: *device_ns,
        },
        Ok(WorkDone {
            failure: Some(f), ..
        }) => error_completion(request_id, &f.error),
        Err(e) => error_completion(request_id, e),
    }
}

fn error_completion(request_id: u64, e: &NpudError) -> Completion {
    Completion {
        request_id,
        code: e.code() as u32,
        message: e.message().to_owned(),
        queue_ns: 0,
        device_ns: 0,
    }
}
