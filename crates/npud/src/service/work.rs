//! Dispatch, Chain and the Submit stream.
//!
//! A request is checked here against the session (programs it references, chain length), then
//! admitted to the executor, which checks the arguments against the tensors and the program's
//! DDR patches before anything reaches the device. Statistics are recorded when the reply
//! arrives.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Streaming};

use crate::decoded::Inbound;

use super::{BoxStream, NpudService, deadline};
use crate::error::NpudError;
use crate::executor::{Command, Link, LinkPrefix, WorkDone, WorkItem};
use crate::metrics::Kind;
use crate::priority::{Class, Priority};
use crate::stats::{Outcome, PendingGuard, Tally};

/// Most buffer arguments one dispatch may pass (the intake counts them before decoding).
pub const MAX_ARGS: usize = 64;

type WorkReply = oneshot::Receiver<Result<WorkDone, NpudError>>;

/// A submitted item on its way through the executor.
#[derive(Debug)]
pub(super) struct Admitted {
    pub(super) rx: WorkReply,
    /// The item in its session's pending count (checked against its rule's
    /// `max_pending_per_session`; read by statistics and metrics), given back when answered.
    _slot: Option<PendingSlot>,
    /// The program of each link.
    pub(super) programs: Vec<u64>,
    pub(super) chain: bool,
    /// Its session's class, for the metrics.
    pub(super) class: Class,
    /// Counts the item in `Statistics.pending_dispatches` until its reply has been counted.
    _pending: PendingGuard,
}

/// Work as a request names it: Dispatch, Chain, or either on the Submit stream.
#[derive(Debug)]
pub(super) enum Work {
    Dispatch(pb::DispatchRequest),
    Chain(Vec<pb::DispatchRequest>),
}

impl NpudService {
    /// Checks `work` against the session and admits it to the executor. Whatever refuses it
    /// (a link, the limits, the device not serving) is counted against the session, one failure
    /// per link asked for, the same for every RPC.
    pub(super) async fn admit_work(
        &self,
        session: u64,
        work: Work,
        deadline: Option<Instant>,
        flow_controlled: bool,
    ) -> Result<Admitted, NpudError> {
        let (item, admitted) = self.admission(session, work, deadline, flow_controlled)?;
        match self.state.exec.send(Command::Work(item)).await {
            Ok(()) => Ok(admitted),
            Err(e) => {
                self.refused(session, admitted.programs.len() as u64, admitted.chain, &e);
                Err(e)
            }
        }
    }

    /// Checks `work` as [`NpudService::admit_work`] does and builds its work item, for a
    /// caller that hands the item to the executor itself (a dispatch ring, polled on the
    /// executor thread). A refusal is counted as `admit_work` counts it.
    pub(super) fn admission(
        &self,
        session: u64,
        work: Work,
        deadline: Option<Instant>,
        flow_controlled: bool,
    ) -> Result<(WorkItem, Admitted), NpudError> {
        let (asked, chain) = match &work {
            Work::Dispatch(_) => (1, false),
            Work::Chain(links) => (links.len().max(1) as u64, true),
        };
        let links = match work {
            Work::Dispatch(d) => self.links(session, std::iter::once(d), false),
            Work::Chain(links) => self.links(session, links.into_iter(), true),
        };
        let admitted = match links {
            Ok(links) => self.admit(session, links, chain, deadline, flow_controlled),
            Err(e) => Err(e),
        };
        admitted.inspect_err(|e| self.refused(session, asked, chain, e))
    }

    fn links(
        &self,
        session: u64,
        requests: impl ExactSizeIterator<Item = pb::DispatchRequest>,
        chain: bool,
    ) -> Result<Vec<Link>, NpudError> {
        let max = self.state.limits.max_chain_links as usize;
        if chain && requests.len() == 0 {
            return Err(NpudError::InvalidArgument(
                "links: a chain needs at least one link".into(),
            ));
        }
        if requests.len() > max {
            return Err(NpudError::ResourceExhausted(format!(
                "links: {} links; at most {max} (limits.max_chain_links)",
                requests.len()
            )));
        }
        // The links of a chain usually run one program, or a few in runs: each is looked up in
        // the store (under its lock) once per request, not once per link.
        let mut last: Option<Arc<crate::programs::Program>> = None;
        let mut found: HashMap<u64, Arc<crate::programs::Program>> = HashMap::new();
        // A single dispatch looks its program up once: no map to fill.
        let many = requests.len() > 1;
        requests
            .enumerate()
            .map(|(k, d)| {
                let prefix = LinkPrefix { chain, k };
                if d.args.len() > MAX_ARGS {
                    return Err(NpudError::InvalidArgument(format!(
                        "{prefix}args: {} arguments; at most {MAX_ARGS}",
                        d.args.len()
                    )));
                }
                let program = match last.as_ref().filter(|p| p.id == d.program_id) {
                    Some(p) => p.clone(),
                    None => {
                        let p = match found.get(&d.program_id) {
                            Some(p) => p.clone(),
                            None => {
                                let p = self.state.programs.for_dispatch(
                                    session,
                                    d.program_id,
                                    format_args!("{prefix}program_id"),
                                )?;
                                if many {
                                    found.insert(d.program_id, p.clone());
                                }
                                p
                            }
                        };
                        last = Some(p.clone());
                        p
                    }
                };
                Ok(Link {
                    program,
                    args: d.args,
                })
            })
            .collect()
    }

    fn admit(
        &self,
        session: u64,
        links: Vec<Link>,
        chain: bool,
        deadline: Option<Instant>,
        flow_controlled: bool,
    ) -> Result<(WorkItem, Admitted), NpudError> {
        self.check_serving()?;
        let (slot, who, priority) = match self.state.sessions.for_admission(session) {
            Some(s) => (
                Some(self.pending_slot(&s.grant, s.pending, flow_controlled)?),
                s.charged,
                s.priority,
            ),
            // The session ended meanwhile: there is no count to hold a place in.
            None => (None, String::new().into(), Priority::BATCH),
        };
        let now = Instant::now();
        self.state
            .exec
            .fault_budget()
            .check(&who, "dispatch", now)?;
        let programs: Vec<u64> = links.iter().map(|l| l.program.id).collect();
        let pending = self.state.pending.admit(programs.len() as u64);
        let (tx, rx) = oneshot::channel();
        let item = WorkItem {
            session,
            who,
            priority,
            links,
            chain,
            admitted: now,
            deadline,
            flow_controlled,
            reply: tx,
        };
        Ok((
            item,
            Admitted {
                rx,
                _slot: slot,
                programs,
                chain,
                class: priority.class,
                _pending: pending,
            },
        ))
    }

    /// A place for one more item in `session`'s pending count, refused when its rule lowers
    /// `limits.max_pending_per_session` and the session is at it (the executor enforces
    /// the limit itself otherwise).
    fn pending_slot(
        &self,
        grant: &crate::auth::Grant,
        count: Arc<AtomicU32>,
        flow_controlled: bool,
    ) -> Result<PendingSlot, NpudError> {
        let q = &grant.quotas.pending;
        // A Submit item is counted but not refused: its stream's window (the rule's quota at
        // most) already bounds it.
        if flow_controlled || q.max >= self.state.limits.max_pending_per_session {
            count.fetch_add(1, Ordering::AcqRel);
            return Ok(PendingSlot(count));
        }
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < q.max).then_some(n + 1)
            })
            .map_err(|n| {
                NpudError::ResourceExhausted(format!(
                    "the session already has {n} dispatches queued ({})",
                    q.key
                ))
            })?;
        Ok(PendingSlot(count))
    }

    /// Waits for an admitted item and counts it in statistics. The wait runs in the caller's
    /// task; if the caller gives up first (a `grpc-timeout` that expires while the item is
    /// queued drops the handler; the executor then refuses the item), a task takes the wait
    /// over, so the item is counted all the same.
    async fn complete(&self, session: u64, a: Admitted) -> Result<WorkDone, NpudError> {
        Pending {
            svc: self.clone(),
            session,
            admitted: Some(a),
        }
        .wait()
        .await
    }

    /// Counts work refused before admission against the session.
    pub(super) fn refused(&self, session: u64, links: u64, chain: bool, e: &NpudError) {
        self.state
            .sessions
            .record(session, Tally::refused(links, e.code_name()));
        let kind = if chain { Kind::Chain } else { Kind::Dispatch };
        self.state.metrics.refused(kind, links, e.code_name());
    }

    /// Counts a finished item against the session and its programs, and in the metrics.
    pub(super) fn record(
        &self,
        session: u64,
        programs: &[u64],
        chain: bool,
        class: Class,
        r: &Result<WorkDone, NpudError>,
    ) {
        self.record_metrics(programs, chain, class, r);
        self.record_stats(session, programs, r);
    }

    /// The part of [`NpudService::record`] the API's statistics read: a caller that has its
    /// answer sees its work counted in them.
    pub(super) fn record_stats(
        &self,
        session: u64,
        programs: &[u64],
        r: &Result<WorkDone, NpudError>,
    ) {
        let st = &self.state;
        let at_ms = crate::stats::unix_ms();
        let tally = |links: u64, outcome: Outcome, queue_ns: u64, device_ns: u64| Tally {
            links,
            outcome,
            queue_ns,
            device_ns,
            at_ms,
        };
        match r {
            Ok(done) => {
                let ok = done.completed.min(programs.len());
                if ok > 0 {
                    let t = |links| tally(links, Outcome::Success, done.queue_ns, done.device_ns);
                    st.sessions.record(session, t(ok as u64));
                    // A single dispatch needs no grouping map.
                    if let [p] = programs {
                        st.programs.record(*p, t(1));
                    } else {
                        for (p, c) in group(&programs[..ok]) {
                            st.programs.record(p, t(c));
                        }
                    }
                }
                if let Some(f) = &done.failure {
                    let (q, d) = if ok == 0 {
                        (done.queue_ns, done.device_ns)
                    } else {
                        (0, 0)
                    };
                    let t = tally(1, Outcome::Fail(f.error.code_name()), q, d);
                    st.sessions.record(session, t);
                    if let Some(p) = programs.get(f.index) {
                        st.programs.record(*p, t);
                    }
                }
            }
            Err(e) => {
                let t = |links| tally(links, Outcome::Fail(e.code_name()), 0, 0);
                st.sessions.record(session, t(programs.len() as u64));
                for (p, c) in group(programs) {
                    st.programs.record(p, t(c));
                }
            }
        }
    }

    /// Counts a finished item's links by program and outcome, and its times when the device
    /// queue answered it (an item refused there, for its deadline or its session ending, has
    /// none).
    pub(super) fn record_metrics(
        &self,
        programs: &[u64],
        chain: bool,
        class: Class,
        r: &Result<WorkDone, NpudError>,
    ) {
        let kind = if chain { Kind::Chain } else { Kind::Dispatch };
        let st = &self.state;
        let m = &st.metrics;
        match r {
            Ok(done) => {
                m.timed(kind, class, done.queue_ns, done.device_ns);
                let ok = done.completed.min(programs.len());
                if let [p] = &programs[..ok] {
                    m.links(&st.programs, kind, *p, 1, "OK");
                } else {
                    for (p, c) in group(&programs[..ok]) {
                        m.links(&st.programs, kind, p, c, "OK");
                    }
                }
                if let Some(f) = &done.failure
                    && let Some(p) = programs.get(f.index)
                {
                    m.links(&st.programs, kind, *p, 1, f.error.code_name());
                }
            }
            Err(e) => {
                for (p, c) in group(programs) {
                    m.links(&st.programs, kind, p, c, e.code_name());
                }
            }
        }
    }

    pub(super) async fn dispatch(
        &self,
        req: Request<pb::DispatchRequest>,
    ) -> Result<pb::DispatchResponse, NpudError> {
        let caller = self.caller(&req)?;
        let rid = self.request_id(&req, "Dispatch")?;
        let deadline = deadline(&req);
        let work = Work::Dispatch(req.into_inner());
        let (svc, session) = (self.clone(), caller.session);
        self.once(session, rid, async move {
            let a = svc.admit_work(session, work, deadline, false).await?;
            dispatch_response(svc.complete(session, a).await?)
        })
        .await
    }

    pub(super) async fn chain(
        &self,
        req: Request<pb::ChainRequest>,
    ) -> Result<pb::ChainResponse, NpudError> {
        let caller = self.caller(&req)?;
        let rid = self.request_id(&req, "Chain")?;
        let deadline = deadline(&req);
        let work = Work::Chain(req.into_inner().links);
        let (svc, session) = (self.clone(), caller.session);
        self.once(session, rid, async move {
            let a = svc.admit_work(session, work, deadline, false).await?;
            let count = a.programs.len();
            Ok(chain_response(svc.complete(session, a).await?, count))
        })
        .await
    }

    /// The Submit stream. Its contract:
    ///
    /// - Flow control: at most `window` items of the stream are admitted and unanswered (the
    ///   session's pending limit, its rule's when lower); the reader stops reading the inbound
    ///   stream until one is answered, so a client that sends faster than the device runs is
    ///   slowed by HTTP/2 flow control instead of refused.
    /// - A message that cannot be decoded (or is larger than the daemon accepts) ends the
    ///   stream, after every item admitted before it has been answered, with
    ///   `INVALID_ARGUMENT` (`RESOURCE_EXHAUSTED` for its size) naming its index (0-based,
    ///   counting every message of the stream).
    /// - An item whose caller left (the stream was dropped or reset) keeps its pending place
    ///   until the executor answers it.
    /// - A cool-down of the session's identity ends it the same way, once every item admitted
    ///   before it has been answered, with the cool-down's RESOURCE_EXHAUSTED.
    pub(super) fn submit(
        &self,
        req: Request<Streaming<pb::SubmitRequest>>,
    ) -> Result<BoxStream<pb::SubmitResponse>, NpudError> {
        let caller = self.caller(&req)?;
        let session = caller.session;
        let mut inbound = Inbound::of(req);
        let window = self.submit_window(session);
        let places = Arc::new(Semaphore::new(window));
        let (order_tx, mut order_rx) = mpsc::channel::<Submitted>(window);
        let (out_tx, out_rx) = mpsc::channel(window);
        let reader = self.clone();
        // A cool-down of the session's identity ends the stream's life: admit nothing more,
        // answer what was admitted, then end with the cool-down's reason.
        let life = self.state.lifecycle.stream_life(session);
        tokio::spawn(async move {
            let mut index = 0usize;
            let mut ended = std::pin::pin!(async {
                match &life {
                    Some(l) => l.ended().await,
                    None => std::future::pending().await,
                }
            });
            loop {
                // Read the next message only when the stream has a place for it.
                let Ok(place) = places.clone().acquire_owned().await else {
                    break;
                };
                let next = tokio::select! {
                    biased;
                    () = &mut ended => {
                        if let Some(l) = &life {
                            let _ = order_tx.send(Submitted::End(l.why())).await;
                        }
                        break;
                    }
                    m = inbound.message() => m,
                };
                let r = match next {
                    // Nobody reads the answers any more: admit nothing new.
                    Ok(Some(_)) if order_tx.is_closed() => break,
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(status) => {
                        let e = bad_message(index, &status);
                        let _ = order_tx.send(Submitted::End(e)).await;
                        break;
                    }
                };
                let admitted = reader
                    .admit_submitted(session, r.work, r.timeout_ms)
                    .await
                    .map(|a| Pending {
                        svc: reader.clone(),
                        session,
                        admitted: Some(a),
                    });
                index += 1;
                // A send that fails drops the item: as a `Pending`, it is still awaited and
                // counted.
                if order_tx
                    .send(Submitted::Item(r.request_id, admitted, place))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            // Completions go out in submission order: each is awaited in turn.
            while let Some(next) = order_rx.recv().await {
                let resp = match next {
                    Submitted::Item(request_id, Ok(p), place) => {
                        let a = p.admitted.as_ref();
                        let (count, chain) = a.map_or((0, false), |a| (a.programs.len(), a.chain));
                        let r = p.wait().await;
                        drop(place);
                        Ok(submit_response(request_id, r, count, chain))
                    }
                    Submitted::Item(request_id, Err(e), _place) => Ok(submit_error(request_id, &e)),
                    Submitted::End(e) => Err(tonic::Status::from(e)),
                };
                let end = resp.is_err();
                if out_tx.send(resp).await.is_err() || end {
                    break;
                }
            }
            // Items left (the caller is gone) are dropped as `Pending`s: each keeps its place
            // until the executor answers it.
        });
        Ok(Box::pin(ReceiverStream::new(out_rx)))
    }

    /// Items one Submit stream may have admitted and unanswered: the session's pending limit
    /// (its rule's when lower).
    pub(super) fn submit_window(&self, session: u64) -> usize {
        let limit = self.state.limits.max_pending_per_session;
        let rule = self
            .state
            .sessions
            .grant(session)
            .map_or(limit, |(g, _)| g.quotas.pending.max);
        (limit.min(rule) as usize).max(1)
    }

    async fn admit_submitted(
        &self,
        session: u64,
        work: Option<pb::submit_request::Work>,
        timeout_ms: u64,
    ) -> Result<Admitted, NpudError> {
        let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
        let work = match work {
            Some(pb::submit_request::Work::Dispatch(d)) => Work::Dispatch(d),
            Some(pb::submit_request::Work::Chain(c)) => Work::Chain(c.links),
            None => {
                let e = NpudError::InvalidArgument("work: set dispatch or chain".into());
                self.refused(session, 1, false, &e);
                return Err(e);
            }
        };
        self.admit_work(session, work, deadline, true).await
    }
}

/// What the Submit stream's reader hands its writer, in order.
#[derive(Debug)]
enum Submitted {
    /// A message's item (or why it was refused), holding its place in the stream's window.
    Item(u64, Result<Pending, NpudError>, OwnedSemaphorePermit),
    /// A message that ended the stream.
    End(NpudError),
}

/// Why message `index` of a Submit stream ends it: it was too large, or no `SubmitRequest`.
fn bad_message(index: usize, status: &tonic::Status) -> NpudError {
    let why = format!("message {index}: {}", status.message());
    match status.code() {
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => {
            NpudError::ResourceExhausted(why)
        }
        _ => NpudError::InvalidArgument(why),
    }
}

/// An admitted item whose reply is awaited; see [`NpudService::complete`].
#[derive(Debug)]
pub(super) struct Pending {
    svc: NpudService,
    session: u64,
    /// Taken once the reply has been counted.
    admitted: Option<Admitted>,
}

/// Handlers waiting for a work item's reply, daemon-wide.
static WAITING: AtomicUsize = AtomicUsize::new(0);

// Tuned latencies: `npu_fd::latency` says why each has its value and what measured it.
const IDLE_POLL: Duration = npu_fd::latency::HANDLER_IDLE_POLL;

/// Counts a waiting handler in [`WAITING`] while it lives.
#[derive(Debug)]
struct Waiting;

impl Waiting {
    /// Counts one more waiter; true when it is the only one.
    fn enter() -> (Waiting, bool) {
        (Waiting, WAITING.fetch_add(1, Ordering::Relaxed) == 0)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pending {
    async fn wait(mut self) -> Result<WorkDone, NpudError> {
        // `complete` builds a Pending with its item and `wait` consumes it: only Drop takes it.
        let a = self
            .admitted
            .as_mut()
            .expect("a Pending holds its item until it is waited for or dropped");
        let (waiting, alone) = Waiting::enter();
        let mut early = None;
        // An executor that never polls (`executor.spin_us = 0`, CPU before latency) is asleep
        // when the item reaches it, and its wake-up alone outlasts the poll.
        if alone && self.svc.state.executor_spin_us > 0 {
            // Yielding between polls keeps the worker serving its other tasks.
            let until = Instant::now() + IDLE_POLL;
            while Instant::now() < until {
                match a.rx.try_recv() {
                    Ok(r) => {
                        early = Some(r);
                        break;
                    }
                    Err(oneshot::error::TryRecvError::Closed) => break,
                    Err(oneshot::error::TryRecvError::Empty) => tokio::task::yield_now().await,
                }
            }
        }
        let r = match early {
            Some(r) => r,
            None => (&mut a.rx)
                .await
                .unwrap_or_else(|_| Err(NpudError::executor_gone())),
        };
        drop(waiting);
        if let Some(a) = self.admitted.take() {
            self.svc
                .record(self.session, &a.programs, a.chain, a.class, &r);
        }
        r
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(Admitted {
            rx,
            programs,
            chain,
            class,
            _pending: pending,
            _slot: slot,
        }) = self.admitted.take()
        else {
            return;
        };
        let (svc, session) = (self.svc.clone(), self.session);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let r = rx.await.unwrap_or_else(|_| Err(NpudError::executor_gone()));
                    svc.record(session, &programs, chain, class, &r);
                    // The item counts as pending (and holds its place under the session's
                    // rule) until the executor has answered, even after its caller left.
                    drop((pending, slot));
                });
            }
            Err(_) => tracing::warn!(
                session,
                "a work item's caller left outside the runtime; it is not counted"
            ),
        }
    }
}

/// Links per program. A chain's links come in runs of one program: one map entry update per
/// run, not per link.
fn group(programs: &[u64]) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for run in programs.chunk_by(|a, b| a == b) {
        *m.entry(run[0]).or_default() += run.len() as u64;
    }
    m
}

pub(super) fn dispatch_response(done: WorkDone) -> Result<pb::DispatchResponse, NpudError> {
    match done.failure {
        Some(f) => Err(f.error),
        None => Ok(pb::DispatchResponse {
            queue_ns: done.queue_ns,
            device_ns: done.device_ns,
        }),
    }
}

fn chain_response(done: WorkDone, count: usize) -> pb::ChainResponse {
    let u32_of = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    pb::ChainResponse {
        completed: u32_of(done.completed),
        queue_ns: done.queue_ns,
        device_ns: done.device_ns,
        failure: done.failure.map(|f| pb::LinkFailure {
            index: u32_of(f.index),
            code: f.error.code() as i32,
            message: f.error.message().to_owned(),
            not_run: (f.index + 1..count).map(u32_of).collect(),
        }),
        doorbells: done.doorbells,
    }
}

fn submit_response(
    request_id: u64,
    r: Result<WorkDone, NpudError>,
    count: usize,
    chain: bool,
) -> pb::SubmitResponse {
    let done = match r {
        Ok(d) => d,
        Err(e) => return submit_error(request_id, &e),
    };
    if chain {
        return pb::SubmitResponse {
            request_id,
            code: 0,
            message: String::new(),
            result: Some(pb::submit_response::Result::Chain(chain_response(
                done, count,
            ))),
        };
    }
    match dispatch_response(done) {
        Ok(d) => pb::SubmitResponse {
            request_id,
            code: 0,
            message: String::new(),
            result: Some(pb::submit_response::Result::Dispatch(d)),
        },
        Err(e) => submit_error(request_id, &e),
    }
}

fn submit_error(request_id: u64, e: &NpudError) -> pb::SubmitResponse {
    pb::SubmitResponse {
        request_id,
        code: e.code() as i32,
        message: e.message().to_owned(),
        result: None,
    }
}

/// One item counted in its session's pending work.
#[derive(Debug)]
struct PendingSlot(Arc<AtomicU32>);

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::LinkFailure;

    #[test]
    fn a_failed_link_reports_the_links_that_did_not_run() {
        let done = WorkDone {
            queue_ns: 1,
            device_ns: 2,
            doorbells: 0,
            completed: 10,
            failure: Some(LinkFailure {
                index: 10,
                error: NpudError::Internal("fault".into()),
            }),
        };
        let r = chain_response(done, 13);
        assert_eq!(r.completed, 10);
        let f = r.failure.unwrap();
        assert_eq!(f.index, 10);
        assert_eq!(f.code, tonic::Code::Internal as i32);
        assert_eq!(f.not_run, vec![11, 12]);
    }
}
