//! AttachRing and the dispatch ring's reader (`proto/npud/v1/ring.md`).
//!
//! A ring's reader is a thread of its own, so that a client that stops consuming completions,
//! or corrupts its doorbells, delays nobody else. It copies each submission slot out of the
//! shared memory before it looks at it (`npu_fd::ring`), then admits it exactly as a `Dispatch`
//! call ([`NpudService::admit_work`]): the same checks, the same pending count and refusals,
//! the same executor queue and turns, the same statistics. It keeps at most a ring's worth
//! admitted and unanswered, and posts completions in submission order.
//!
//! Waiting: after the last thing it did, the reader polls (yielding the CPU between looks) for
//! [`SPIN`], then sleeps on the
//! ring's `sq_bell` futex, which the client rings when it submits to a sleeping reader and the
//! executor's reply rings through [`Bell`] (the waker of the item at the front). Every sleep has
//! a timeout, so a corrupted bell delays only this ring, and an idle ring wakes once a second.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use npu_fd::ring::{self, Completion, RingMemory, Submission, Word};
use npu_proto::v1 as pb;
use tokio::sync::oneshot;
use tonic::Request;

use super::NpudService;
use super::work::{Admitted, Pending, Work, dispatch_response};
use crate::error::NpudError;
use crate::executor::WorkDone;
use crate::fdsock::Grant;

/// How long the reader spins after its last piece of work before it sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// The longest sleep with work admitted (a lost wake, or a full completion ring, costs this).
const BUSY_SLEEP: Duration = Duration::from_millis(10);
/// The longest sleep of an idle ring (how soon it notices a teardown whose wake was lost).
const IDLE_SLEEP: Duration = Duration::from_secs(1);

/// The rings of the daemon's sessions, one at most per session.
#[derive(Debug, Default)]
pub struct Rings {
    map: Mutex<HashMap<u64, Arc<RingControl>>>,
}

impl Rings {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<RingControl>>> {
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
    /// The reader sleeps (or is about to) on `sq_bell`.
    parked: AtomicBool,
    /// The reader has finished.
    done: tokio::sync::Notify,
    finished: AtomicBool,
}

impl RingControl {
    /// Asks the reader to stop and wakes it.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.mem.ring(Word::SqBell);
    }

    /// Waits until the reader has finished (it stopped, or the client broke the ring).
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

/// The waker of the item the reader waits for: rings the reader's bell when it sleeps.
#[derive(Debug)]
struct Bell(Arc<RingControl>);

impl Wake for Bell {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.0.parked.load(Ordering::SeqCst) {
            self.0.mem.ring(Word::SqBell);
        }
    }
}

/// A submission in the order it came: answered already, or waiting for the executor.
#[derive(Debug)]
enum Entry {
    Answered(Completion),
    Waiting { request_id: u64, admitted: Admitted },
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
        })
    }

    /// Maps a ring's memfd (already checked as an import of [`ring::RING_BYTES`]) and starts
    /// its reader for `session`.
    ///
    /// # Errors
    /// FAILED_PRECONDITION when the session has a ring already or has ended, INTERNAL when the
    /// memfd cannot be mapped or the thread cannot start.
    pub fn start_ring(&self, session: u64, fd: OwnedFd) -> Result<Arc<RingControl>, NpudError> {
        if self.state.sessions.grant(session).is_none() {
            return Err(NpudError::FailedPrecondition(format!(
                "session {session} has ended"
            )));
        }
        let mem = RingMemory::map(fd.as_fd())
            .map_err(|e| NpudError::Internal(format!("mapping the ring: {e}")))?;
        drop(fd);
        let ctl = Arc::new(RingControl {
            mem: Arc::new(mem),
            stopped: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            done: tokio::sync::Notify::new(),
            finished: AtomicBool::new(false),
        });
        self.state.rings.insert(session, &ctl)?;
        // As many as the ring holds: each is admitted as a `Dispatch` call is, so a session over
        // its pending limit is refused RESOURCE_EXHAUSTED, as concurrent calls would be.
        let window = ring::SLOTS as usize;
        let reader = Reader {
            svc: self.clone(),
            rt: tokio::runtime::Handle::current(),
            session,
            ctl: ctl.clone(),
            window,
            head: 0,
            cq_tail: 0,
            entries: VecDeque::new(),
        };
        let spawned = std::thread::Builder::new()
            .name(format!("npud-ring-{session}"))
            .spawn(move || reader.run());
        if let Err(e) = spawned {
            self.state.rings.remove(session, &ctl);
            return Err(NpudError::Internal(format!(
                "starting the ring's reader thread: {e}"
            )));
        }
        tracing::info!(session, window, "dispatch ring attached");
        Ok(ctl)
    }
}

/// One ring's reader; runs on its own thread.
struct Reader {
    svc: NpudService,
    rt: tokio::runtime::Handle,
    session: u64,
    ctl: Arc<RingControl>,
    window: usize,
    /// Submissions copied out (the daemon's own count; `sq_head` is only written).
    head: u32,
    /// Completions posted.
    cq_tail: u32,
    entries: VecDeque<Entry>,
}

/// Why the reader stopped.
enum End {
    Stopped,
    Broken(u32),
}

impl Reader {
    fn run(mut self) {
        let end = self.serve();
        if matches!(end, End::Stopped) {
            self.answer_the_rest();
        }
        let mem = &self.ctl.mem;
        match end {
            End::Stopped => mem.store(Word::State, ring::STATE_CLOSED),
            End::Broken(why) => {
                tracing::info!(
                    session = self.session,
                    why,
                    "a client broke its dispatch ring's rules; the ring is torn down"
                );
                mem.store(Word::Broken, why);
                mem.store(Word::State, ring::STATE_BROKEN);
            }
        }
        mem.ring(Word::CqBell);
        // A broken ring's admitted work still runs and is counted: a Pending dropped in the
        // runtime waits for it on a task.
        let _rt = self.rt.enter();
        for e in self.entries.drain(..) {
            if let Entry::Waiting { admitted, .. } = e {
                drop(Pending::new(self.svc.clone(), self.session, admitted));
            }
        }
        self.svc.state.rings.remove(self.session, &self.ctl);
        self.ctl.finished.store(true, Ordering::SeqCst);
        self.ctl.done.notify_waiters();
        tracing::info!(session = self.session, "dispatch ring closed");
    }

    fn serve(&mut self) -> End {
        let waker = Waker::from(Arc::new(Bell(self.ctl.clone())));
        let mut last = Instant::now();
        loop {
            if self.ctl.stopped.load(Ordering::SeqCst) {
                return End::Stopped;
            }
            let took = match self.intake() {
                Ok(n) => n,
                Err(why) => return End::Broken(why),
            };
            let posted = match self.post() {
                Ok(n) => n,
                Err(why) => return End::Broken(why),
            };
            if took + posted > 0 {
                last = Instant::now();
                continue;
            }
            if last.elapsed() < SPIN {
                // Yield rather than spin hot: on a small machine the client, this reader and
                // the executor may share a core, and the one that would answer must run.
                std::thread::yield_now();
                continue;
            }
            // Sleep: say so, then look once more (the client's tail, the front item with the
            // waker registered) before waiting on the bell's value read after saying so.
            let mem = self.ctl.mem.clone();
            mem.store(Word::SqSleeping, 1);
            self.ctl.parked.store(true, Ordering::SeqCst);
            let seen = mem.load(Word::SqBell);
            let ready = mem.load(Word::SqTail) != self.head && self.entries.len() < self.window
                || self.front_ready(&waker);
            if !ready && !self.ctl.stopped.load(Ordering::SeqCst) {
                let limit = if self.entries.is_empty() {
                    IDLE_SLEEP
                } else {
                    BUSY_SLEEP
                };
                mem.wait(Word::SqBell, seen, limit);
            }
            self.ctl.parked.store(false, Ordering::SeqCst);
            mem.store(Word::SqSleeping, 0);
            // Spin again only when rung: a sleep that ran out with nothing to do (an idle
            // ring looking for a lost wake) looks once and sleeps again, so 64 idle rings
            // cost 64 looks a second, not 64 spins.
            if mem.load(Word::SqBell) != seen {
                last = Instant::now();
            }
        }
    }

    /// After a stop: waits for every admitted item's answer, in order, and posts it while the
    /// completion ring has room, so that a client sees the answers to what the daemon took
    /// before it sees the ring closed. (The executor answers every item: a session's end
    /// answers its queued items UNAVAILABLE, and shutdown finishes the queued work.)
    fn answer_the_rest(&mut self) {
        while let Some(e) = self.entries.pop_front() {
            let c = match e {
                Entry::Answered(c) => c,
                Entry::Waiting {
                    request_id,
                    admitted,
                } => {
                    // Its pending place is given back when `admitted` drops, after the answer.
                    let mut admitted = admitted;
                    let rx = std::mem::replace(&mut admitted.rx, oneshot::channel().1);
                    let r = rx
                        .blocking_recv()
                        .unwrap_or_else(|_| Err(NpudError::executor_gone()));
                    self.svc
                        .record(self.session, &admitted.programs, admitted.chain, &r);
                    completion(request_id, r)
                }
            };
            if self.room().is_ok_and(|r| r > 0) {
                self.post_one(&c);
            }
        }
    }

    /// Copies out and admits what the client submitted, up to the window.
    fn intake(&mut self) -> Result<usize, u32> {
        let mem = self.ctl.mem.clone();
        let tail = mem.load(Word::SqTail);
        let avail = tail.wrapping_sub(self.head);
        if avail > ring::SLOTS {
            return Err(ring::BROKEN_SQ_TAIL);
        }
        let mut took = 0;
        while took < avail as usize && self.entries.len() < self.window {
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
                Ok(s) => self.admit(s),
            };
            self.entries.push_back(entry);
        }
        Ok(took)
    }

    fn admit(&self, s: Submission) -> Entry {
        let request_id = s.request_id;
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
        let svc = &self.svc;
        match self
            .rt
            .block_on(svc.admit_work(self.session, Work::Dispatch(d), deadline, false))
        {
            Ok(admitted) => Entry::Waiting {
                request_id,
                admitted,
            },
            Err(e) => Entry::Answered(error_completion(request_id, &e)),
        }
    }

    /// Whether the front entry can be posted now; polls its reply with `waker` registered.
    fn front_ready(&mut self, waker: &Waker) -> bool {
        match self.entries.front_mut() {
            None => false,
            Some(Entry::Answered(_)) => self.room().is_ok_and(|r| r > 0),
            Some(Entry::Waiting { admitted, .. }) => {
                let mut cx = Context::from_waker(waker);
                match Pin::new(&mut admitted.rx).poll(&mut cx) {
                    Poll::Pending => false,
                    Poll::Ready(r) => {
                        // Keep the answer: the receiver may not be polled again.
                        let r = r.unwrap_or_else(|_| Err(NpudError::executor_gone()));
                        let c = self.finish_front(r);
                        self.entries[0] = Entry::Answered(c);
                        true
                    }
                }
            }
        }
    }

    /// Room in the completion ring, or the rule the client's `cq_head` broke.
    fn room(&self) -> Result<u32, u32> {
        let used = self.cq_tail.wrapping_sub(self.ctl.mem.load(Word::CqHead));
        if used > ring::SLOTS {
            return Err(ring::BROKEN_CQ_HEAD);
        }
        Ok(ring::SLOTS - used)
    }

    /// Counts the front item's answer (it must be `Waiting`) and builds its completion.
    fn finish_front(&mut self, r: Result<WorkDone, NpudError>) -> Completion {
        let Some(Entry::Waiting {
            request_id,
            admitted,
        }) = self.entries.front()
        else {
            unreachable!("finish_front is called for a waiting front entry");
        };
        self.svc
            .record(self.session, &admitted.programs, admitted.chain, &r);
        completion(*request_id, r)
    }

    /// Posts answered items from the front, in order, while the completion ring has room.
    fn post(&mut self) -> Result<usize, u32> {
        let mut posted = 0;
        let mut room = self.room()?;
        while room > 0 {
            let ready = match self.entries.front_mut() {
                None => break,
                Some(Entry::Answered(_)) => true,
                Some(Entry::Waiting { admitted, .. }) => match admitted.rx.try_recv() {
                    Ok(r) => {
                        let c = self.finish_front(r);
                        self.entries[0] = Entry::Answered(c);
                        true
                    }
                    Err(oneshot::error::TryRecvError::Empty) => false,
                    Err(oneshot::error::TryRecvError::Closed) => {
                        let c = self.finish_front(Err(NpudError::executor_gone()));
                        self.entries[0] = Entry::Answered(c);
                        true
                    }
                },
            };
            if !ready {
                break;
            }
            let Some(Entry::Answered(c)) = self.entries.pop_front() else {
                break;
            };
            self.post_one(&c);
            room -= 1;
            posted += 1;
        }
        Ok(posted)
    }
}

impl Reader {
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
}

/// A dispatch's answer as its completion: what `Dispatch` would have returned.
fn completion(request_id: u64, r: Result<WorkDone, NpudError>) -> Completion {
    match r.and_then(dispatch_response) {
        Ok(d) => Completion {
            request_id,
            code: 0,
            message: String::new(),
            queue_ns: d.queue_ns,
            device_ns: d.device_ns,
        },
        Err(e) => error_completion(request_id, &e),
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
