//! The fast path: dispatches of a local session through its dispatch ring, shared memory with
//! the daemon (`proto/npud/v1/ring.md`), instead of the `Dispatch` RPC.
//!
//! A session on the Unix socket attaches a ring when it opens ([`FastPath::attach`]), unless
//! [`crate::ConnectOptions::fast_path`] is off (`NPUD_FAST_PATH=0`). [`crate::Client::dispatch`]
//! then writes the dispatch into the submission ring and waits for its completion: the daemon
//! admits it as it admits a `Dispatch`, so results, errors and statistics are the same. A
//! dispatch with more arguments than a slot holds goes through gRPC, as do chains and
//! everything else.
//!
//! Waiting: the caller spins (yielding to its runtime) for [`SPIN`], then parks its task and
//! lets the ring's waiter thread sleep on the completion doorbell for it. The waiter thread
//! sleeps on its own, costing nothing, while no task waits.
//!
//! A caller that blocks for the answer anyway (the Python package's `dispatch`) uses
//! [`crate::Client::dispatch_now`]: the same slot and completion, written and awaited on the
//! calling thread (spinning, then parked until the waiter thread wakes it), with no future,
//! timer or runtime in between.

/// The ring's maps, keyed by request ids this library numbers: foldhash rather than SipHash,
/// whose resistance to chosen keys these do not need.
type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type IdSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use npu_fd::ring::{self, Completion, RingArg, RingMemory, Submission, Word};
use npu_proto::v1 as pb;

// Tuned latencies: `npu_fd::latency` says why each has its value and what measured it.
pub(crate) const SPIN: Duration = npu_fd::latency::CLIENT_SPIN;
const FULL_SLEEP_FIRST: Duration = npu_fd::latency::CLIENT_FULL_SLEEP_FIRST;
const FULL_SLEEP_MAX: Duration = npu_fd::latency::CLIENT_FULL_SLEEP_MAX;
const CHECK_EVERY: Duration = npu_fd::latency::CLIENT_CHECK_EVERY;
const SPIN_LOOKS: u32 = npu_fd::latency::CLIENT_SPIN_LOOKS;
const WAITER_SLEEP: Duration = npu_fd::latency::CLIENT_WAITER_SLEEP;
const IDLE_SLEEP: Duration = npu_fd::latency::CLIENT_IDLE_SLEEP;

/// The environment variable that turns the fast path off (`0`, `off`, `false`, `no`).
pub const FAST_PATH_ENV: &str = "NPUD_FAST_PATH";

/// Whether the environment leaves the fast path on.
pub fn enabled_by_env() -> bool {
    std::env::var(FAST_PATH_ENV).map_or(true, |v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "false" | "no"
        )
    })
}

/// Why a dispatch did not get its answer through the ring.
#[derive(Debug)]
pub(crate) enum RingMiss {
    /// The daemon never took the submission (the ring closed first, or the dispatch does not
    /// fit a slot): send it through gRPC.
    NotTaken,
    /// The daemon took it, then the ring closed before its completion came.
    Lost(String),
    /// [`FastPath::dispatch_now`] waited its whole timeout.
    TimedOut,
    /// The caller of a blocking wait asked to stop ([`FastPath::wait_now_checking`]).
    Interrupted,
}

#[derive(Debug, Default)]
struct Cq {
    /// Completions consumed (the client's `cq_head`).
    head: u32,
    /// Completions read out of the ring that their callers have not taken yet.
    done: IdMap<u64, Completion>,
    /// Tasks parked for a completion, by request id.
    parked: IdMap<u64, Waker>,
    /// Requests whose callers stopped waiting (a timeout, a dropped future): their completions
    /// are dropped as they come, so `done` holds only what someone will take.
    abandoned: IdSet<u64>,
}

/// A session's ring, client side.
#[derive(Debug)]
pub(crate) struct FastPath {
    mem: Arc<RingMemory>,
    /// The ring's lifeline: the daemon tears the ring down when it closes.
    lifeline: UnixStream,
    /// The next submission index (the client's `sq_tail`).
    sq: tokio::sync::Mutex<Sq>,
    cq: Mutex<Cq>,
    next_id: AtomicU64,
    /// Tasks parked in `cq.parked` (the waiter thread sleeps on the bell while non-zero).
    parked: AtomicUsize,
    stop: AtomicBool,
    /// The lifeline closed: the daemon is gone.
    dead: AtomicBool,
    waiter: Mutex<Option<std::thread::Thread>>,
    /// The daemon takes queued slots ([`ring::QUEUED`]): a pipeline may use the ring.
    queues: bool,
}

/// The submission side of a ring: the next slot to write, and the daemon's `sq_head` as last
/// read.
#[derive(Debug, Default)]
struct Sq {
    tail: u32,
    head: u32,
}

impl Sq {
    /// Whether slot `tail` is free: fewer than SLOTS submissions are not yet copied out.
    /// `sq_head` is read again only when the head last read leaves no room: the daemon writes
    /// it as it copies each slot, so reading it on every submission would fetch its cache line
    /// from the daemon's core each time.
    fn has_room(&mut self, mem: &RingMemory) -> bool {
        if self.tail.wrapping_sub(self.head) < ring::SLOTS {
            return true;
        }
        self.head = mem.load(Word::SqHead);
        self.tail.wrapping_sub(self.head) < ring::SLOTS
    }
}

impl FastPath {
    /// Creates a ring, sends it on the fd socket with `AttachRing`'s answer, and starts its
    /// waiter thread. Blocking: call on a blocking thread.
    pub(crate) fn attach(r: &pb::AttachRingResponse) -> Result<Arc<FastPath>, String> {
        if r.version != 1 || r.slots != ring::SLOTS || r.ring_bytes != ring::RING_BYTES as u64 {
            return Err(format!(
                "the daemon offers ring version {} ({} slots, {} bytes); this library speaks \
                 version 1",
                r.version, r.slots, r.ring_bytes
            ));
        }
        let ticket = npu_fd::wire::Ticket::from_slice(&r.fd_ticket)
            .map_err(|e| format!("AttachRing's ticket: {e}"))?;
        let (fd, mem) = RingMemory::create().map_err(|e| e.to_string())?;
        let sock = UnixStream::connect(&r.fd_socket)
            .map_err(|e| format!("connecting to the fd socket {}: {e}", r.fd_socket))?;
        let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = sock.set_write_timeout(Some(Duration::from_secs(10)));
        npu_fd::wire::client::attach_ring(&sock, &ticket, fd.as_fd()).map_err(|e| e.to_string())?;
        sock.set_nonblocking(true)
            .map_err(|e| format!("the ring's lifeline: {e}"))?;
        drop(fd);
        let fp = Arc::new(FastPath {
            mem: Arc::new(mem),
            lifeline: sock,
            sq: tokio::sync::Mutex::new(Sq::default()),
            cq: Mutex::new(Cq::default()),
            next_id: AtomicU64::new(1),
            parked: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            waiter: Mutex::new(None),
            queues: r.slot_flags & ring::QUEUED != 0,
        });
        let weak = Arc::downgrade(&fp);
        let t = std::thread::Builder::new()
            .name("npu-ring-waiter".into())
            .spawn(move || waiter(&weak))
            .map_err(|e| format!("starting the ring's waiter thread: {e}"))?;
        *fp.waiter.lock().unwrap_or_else(PoisonError::into_inner) = Some(t.thread().clone());
        Ok(fp)
    }

    /// Whether the daemon still serves the ring.
    pub(crate) fn is_open(&self) -> bool {
        !self.dead.load(Ordering::SeqCst) && self.mem.load(Word::State) == 0
    }

    /// Looks whether the daemon closed the lifeline (it stopped, or died).
    fn checklifeline(&self) {
        let mut b = [0_u8; 1];
        // The daemon sends nothing on the lifeline: a read sees only its end.
        match std::io::Read::read(&mut &self.lifeline, &mut b) {
            Ok(0) => self.dead.store(true, Ordering::SeqCst),
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                self.dead.store(true, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    fn lock_cq(&self) -> MutexGuard<'_, Cq> {
        self.cq.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `d` fits a slot and the ring is open.
    pub(crate) fn takes(&self, d: &pb::DispatchRequest) -> bool {
        d.args.len() <= ring::MAX_ARGS && self.is_open()
    }

    /// Whether the daemon takes a pipeline's submissions on this ring: queued, as a `Submit`
    /// stream's items are, instead of refused past the session's pending limit.
    pub(crate) fn queues(&self) -> bool {
        self.queues
    }

    /// Publishes `d` as a queued submission (a pipeline's; no deadline, as a `Submit` item
    /// without one) and returns its ring request id and index, for [`FastPath::wait_kept`].
    /// `NotTaken` when it did not fit or the ring closed while it waited for a free slot.
    pub(crate) async fn submit_queued(
        &self,
        d: &pb::DispatchRequest,
    ) -> Result<(u64, u32), RingMiss> {
        let (request_id, s) = self.queued_slot(d)?;
        Ok((request_id, self.submit(&s).await?))
    }

    /// `d` as a queued slot with a new request id, if it fits one and the ring is open.
    fn queued_slot(&self, d: &pb::DispatchRequest) -> Result<(u64, Submission), RingMiss> {
        if !self.takes(d) {
            return Err(RingMiss::NotTaken);
        }
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut s = submission(request_id, d, None);
        s.queued = true;
        Ok((request_id, s))
    }

    /// Runs one dispatch through the ring: `Ok` with the daemon's completion, or why not.
    pub(crate) async fn dispatch(
        &self,
        d: &pb::DispatchRequest,
        timeout: Duration,
    ) -> Result<Completion, RingMiss> {
        if !self.takes(d) {
            return Err(RingMiss::NotTaken);
        }
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let index = self
            .submit(&submission(request_id, d, Some(timeout)))
            .await?;
        self.wait(request_id, index).await
    }

    /// [`FastPath::dispatch`] on the calling thread, for a caller that blocks anyway (Python's
    /// `dispatch`): no future, timer or runtime between the caller and the ring. `NotTaken`
    /// when it did not send (another task holds the submission side, the ring is full or
    /// closed, or the dispatch does not fit a slot): the caller then uses `dispatch`.
    ///
    /// While parked, the wait asks `go_on` every [`CHECK_EVERY`] whether to keep waiting
    /// (Python checks its signals there); when it says no, the request is abandoned as after a
    /// timeout and the answer is `Interrupted`.
    pub(crate) fn dispatch_now(
        &self,
        d: &pb::DispatchRequest,
        timeout: Duration,
        go_on: &mut dyn FnMut() -> bool,
    ) -> Result<Completion, RingMiss> {
        if !self.takes(d) {
            return Err(RingMiss::NotTaken);
        }
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let index = self.submit_now(&submission(request_id, d, Some(timeout)))?;
        let r = self.wait_now_checking(request_id, index, timeout, go_on);
        if matches!(r, Err(RingMiss::TimedOut | RingMiss::Interrupted)) {
            self.abandon(request_id);
        }
        r
    }

    /// [`FastPath::submit_queued`] on the calling thread: `NotTaken`, having sent nothing,
    /// when it cannot send at once (see [`FastPath::dispatch_now`]).
    pub(crate) fn submit_queued_now(
        &self,
        d: &pb::DispatchRequest,
    ) -> Result<(u64, u32), RingMiss> {
        let (request_id, s) = self.queued_slot(d)?;
        Ok((request_id, self.submit_now(&s)?))
    }

    /// Writes `s` into the next slot and publishes it, from the calling thread: `NotTaken`
    /// when another task holds the submission side or the ring is full.
    fn submit_now(&self, s: &Submission) -> Result<u32, RingMiss> {
        let Ok(mut sq) = self.sq.try_lock() else {
            return Err(RingMiss::NotTaken);
        };
        if !sq.has_room(&self.mem) {
            return Err(RingMiss::NotTaken);
        }
        let index = sq.tail;
        sq.tail = self.mem.submit(index, s);
        Ok(index)
    }

    /// [`FastPath::wait_kept`] on the calling thread: spins for [`SPIN`], then parks until
    /// the waiter thread wakes it. `TimedOut` when `timeout` passed first: the request is
    /// kept (a later wait gets its completion; a caller that gives up calls
    /// [`FastPath::abandon`]).
    pub(crate) fn wait_now(
        &self,
        request_id: u64,
        index: u32,
        timeout: Duration,
    ) -> Result<Completion, RingMiss> {
        self.wait_now_checking(request_id, index, timeout, &mut || true)
    }

    /// [`FastPath::wait_now`] that, once parked, asks `go_on` every [`CHECK_EVERY`] whether to
    /// keep waiting: `Interrupted` when it says no (the request is kept, as after a timeout).
    /// Spinning asks nothing, so an answer that comes within [`SPIN`] costs no call.
    pub(crate) fn wait_now_checking(
        &self,
        request_id: u64,
        index: u32,
        timeout: Duration,
        go_on: &mut dyn FnMut() -> bool,
    ) -> Result<Completion, RingMiss> {
        let started = Instant::now();
        // Made when the wait first parks: most waits end while spinning.
        let mut parker: Option<Waker> = None;
        // Parks only after a look that registered the waker (the look is told to).
        let mut park = false;
        loop {
            let waker = if park {
                parker.get_or_insert_with(|| {
                    Waker::from(Arc::new(ThreadWaker(std::thread::current())))
                })
            } else {
                Waker::noop()
            };
            match self.poll_completion(request_id, index, waker, park) {
                Poll::Ready(r) => return r,
                Poll::Pending => {}
            }
            // The clock is read after a look that found nothing, not between the completion's
            // arrival and the look that takes it.
            let waited = started.elapsed();
            if waited >= timeout {
                return Err(RingMiss::TimedOut);
            }
            if park {
                std::thread::park_timeout((timeout - waited).min(CHECK_EVERY));
                if !go_on() {
                    return Err(RingMiss::Interrupted);
                }
            } else if waited >= SPIN {
                park = true;
            } else {
                self.spin_on_tail();
            }
        }
    }

    /// Spins on the completion ring's tail, a load and a pause at a time, until it moves or
    /// [`SPIN_LOOKS`] looks have passed: lighter than a look at the completions (a lock, a
    /// map) on a CPU whose sibling may be the daemon's executor, and soon enough to see a
    /// completion another thread of this process drained.
    fn spin_on_tail(&self) {
        let tail = self.mem.load(Word::CqTail);
        for _ in 0..SPIN_LOOKS {
            std::hint::spin_loop();
            if self.mem.load(Word::CqTail) != tail {
                return;
            }
        }
    }

    /// Writes `s` into the next slot and publishes it, waiting while the ring is full: yielding
    /// to the runtime for [`SPIN`], then sleeping [`FULL_SLEEP_FIRST`], doubling up to
    /// [`FULL_SLEEP_MAX`] (nothing tells the client when the daemon frees a slot, and a caller
    /// that only yielded would spin a CPU the daemon needs to free one).
    async fn submit(&self, s: &Submission) -> Result<u32, RingMiss> {
        let mut sq = self.sq.lock().await;
        let mut full_since = None;
        let mut sleep = FULL_SLEEP_FIRST;
        while !sq.has_room(&self.mem) {
            if !self.is_open() {
                return Err(RingMiss::NotTaken);
            }
            if full_since.get_or_insert_with(Instant::now).elapsed() < SPIN {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(sleep).await;
                sleep = (sleep * 2).min(FULL_SLEEP_MAX);
            }
        }
        let index = sq.tail;
        sq.tail = self.mem.submit(index, s);
        Ok(index)
    }

    /// Reads every completion the daemon posted; returns whether any came.
    fn drain(&self, cq: &mut Cq) -> bool {
        let tail = self.mem.load(Word::CqTail);
        let mut any = false;
        // At most SLOTS: a tail further ahead is not the daemon's (it never posts more).
        for _ in 0..ring::SLOTS {
            if cq.head == tail {
                break;
            }
            let c = Completion::decode(&self.mem.read_completion(cq.head));
            cq.head = cq.head.wrapping_add(1);
            if let Some(w) = cq.parked.remove(&c.request_id) {
                self.parked.fetch_sub(1, Ordering::SeqCst);
                w.wake();
            }
            if !cq.abandoned.remove(&c.request_id) {
                cq.done.insert(c.request_id, c);
            }
            any = true;
        }
        if any {
            self.mem.store(Word::CqHead, cq.head);
        }
        any
    }

    /// Waits for the completion of `request_id`, submitted at `index`, abandoning the request
    /// if the wait is dropped before its answer.
    async fn wait(&self, request_id: u64, index: u32) -> Result<Completion, RingMiss> {
        /// Abandons the request if the wait is dropped before its answer (the caller's
        /// timeout): no parked waker or unclaimed completion is left behind.
        struct Waiting<'a>(&'a FastPath, u64, bool);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    self.0.abandon(self.1);
                }
            }
        }
        let mut guard = Waiting(self, request_id, false);
        let r = self.wait_kept(request_id, index).await;
        guard.2 = true;
        r
    }

    /// Waits for the completion of `request_id`, submitted at `index`: spins (yielding to the
    /// runtime) for [`SPIN`], then parks the task for the waiter thread to wake. A wait
    /// dropped before its answer keeps the request: a later wait gets its completion, and a
    /// caller that gives up for good calls [`FastPath::abandon`].
    pub(crate) async fn wait_kept(
        &self,
        request_id: u64,
        index: u32,
    ) -> Result<Completion, RingMiss> {
        let started = Instant::now();
        std::future::poll_fn(|cx| {
            let park = started.elapsed() >= SPIN;
            let r = self.poll_completion(request_id, index, cx.waker(), park);
            if r.is_pending() && !park {
                cx.waker().wake_by_ref();
            }
            r
        })
        .await
    }

    /// The caller of `request_id` stopped waiting: forget its parked waker, and its
    /// completion whether it came already or comes later.
    pub(crate) fn abandon(&self, request_id: u64) {
        let mut cq = self.lock_cq();
        if cq.parked.remove(&request_id).is_some() {
            self.parked.fetch_sub(1, Ordering::SeqCst);
        }
        if cq.done.remove(&request_id).is_none() {
            cq.abandoned.insert(request_id);
        }
    }

    /// Whether request `request_id` (submitted at `index`) has its answer: the completion, or
    /// why it will not come. While not, and `park` is set, `waker` is registered for the
    /// waiter thread to wake when it comes.
    fn poll_completion(
        &self,
        request_id: u64,
        index: u32,
        waker: &Waker,
        park: bool,
    ) -> Poll<Result<Completion, RingMiss>> {
        let mut cq = self.lock_cq();
        self.drain(&mut cq);
        if let Some(c) = cq.done.remove(&request_id) {
            if cq.parked.remove(&request_id).is_some() {
                self.parked.fetch_sub(1, Ordering::SeqCst);
            }
            return Poll::Ready(Ok(c));
        }
        if !self.is_open() {
            // The daemon posts what it answered before it closes the ring.
            self.drain(&mut cq);
            if let Some(c) = cq.done.remove(&request_id) {
                return Poll::Ready(Ok(c));
            }
            if cq.parked.remove(&request_id).is_some() {
                self.parked.fetch_sub(1, Ordering::SeqCst);
            }
            let taken = self
                .mem
                .load(Word::SqHead)
                .wrapping_sub(index.wrapping_add(1))
                < ring::SLOTS;
            return Poll::Ready(Err(if taken {
                RingMiss::Lost(format!(
                    "the dispatch ring closed (state {}) before the daemon answered",
                    self.mem.load(Word::State)
                ))
            } else {
                RingMiss::NotTaken
            }));
        }
        if park
            && cq.parked.insert(request_id, waker.clone()).is_none()
            && self.parked.fetch_add(1, Ordering::SeqCst) == 0
            && let Some(t) = self
                .waiter
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
        {
            t.unpark();
        }
        Poll::Pending
    }
}

/// Wakes a thread parked in [`FastPath::wait_now`].
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A dispatch as a ring slot (`proto/npud/v1/ring.md`): its program and arguments, and the
/// time the daemon may hold it before it starts (`None`: no deadline; a deadline rounds up to
/// a whole millisecond, never 0, which would mean none). Every writer of slots uses this one
/// mapping: the client, `npuctl bench`'s raw ring and the tests.
#[must_use]
pub fn submission(
    request_id: u64,
    d: &pb::DispatchRequest,
    timeout: Option<Duration>,
) -> Submission {
    Submission {
        request_id,
        program: d.program_id,
        timeout_ms: timeout.map_or(0, |t| {
            u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)
        }),
        args: d
            .args
            .iter()
            .map(|a| RingArg {
                tensor: a.tensor_id,
                offset: a.offset,
                length: a.length,
                read_only: a.read_only,
            })
            .collect(),
        queued: false,
    }
}

impl Drop for FastPath {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self
            .waiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            t.unpark();
        }
    }
}

/// The waiter thread: while tasks are parked, sleeps on the completion bell and wakes the
/// tasks whose completions came; otherwise parks.
fn waiter(fp: &std::sync::Weak<FastPath>) {
    loop {
        let Some(f) = fp.upgrade() else { return };
        if f.stop.load(Ordering::SeqCst) {
            return;
        }
        if f.parked.load(Ordering::SeqCst) == 0 {
            drop(f);
            std::thread::park_timeout(IDLE_SLEEP);
            continue;
        }
        f.checklifeline();
        let mem = f.mem.clone();
        mem.store(Word::CqSleeping, 1);
        let seen = mem.load(Word::CqBell);
        let woke = {
            let mut cq = f.lock_cq();
            let any = f.drain(&mut cq);
            if !f.is_open() {
                // Wake every parked task: each sees the ring closed.
                for (_, w) in cq.parked.drain() {
                    f.parked.fetch_sub(1, Ordering::SeqCst);
                    w.wake();
                }
            }
            any
        };
        if !woke && f.is_open() {
            drop(f);
            mem.wait(Word::CqBell, seen, WAITER_SLEEP);
        }
        mem.store(Word::CqSleeping, 0);
    }
}
