//! Pipelined submission: [`Client::pipeline`] keeps several dispatches in flight, so the
//! round trip is paid once per window instead of once per dispatch.
//!
//! A local session with a dispatch ring ([`crate::fastpath`]) sends them through the ring as
//! queued slots, which the daemon treats as a `Submit` stream's items; otherwise they go on one
//! long-lived `Submit` stream. The completions, errors and flow control are the same either
//! way: past the session's pending limit, items wait for room instead of being refused. A
//! dispatch that does not fit a ring slot (more than 15 arguments), or one sent after the ring
//! closed, goes on the stream, after every dispatch in flight on the ring has completed, so
//! dispatches still run and complete in submission order. On a ring, at most its slot count
//! (64) are in flight, whatever `depth` asks for.
//!
//! # Contract
//!
//! - [`Pipeline::submit`] sends a dispatch and returns its request id at once; when `depth`
//!   dispatches are already in flight it first waits for the oldest to complete (that
//!   completion is kept for [`Pipeline::next_completion`]).
//! - Completions come back in submission order, each with its request id: a dispatch the daemon
//!   refuses or the device fails is an `Err` in its [`Completion`], and the stream goes on.
//! - Tensors must be shared in place (a local connection's fd-shared tensors): a staged
//!   tensor would need its upload and download between dispatches still in flight, so it is
//!   refused before anything is sent. Use [`Client::dispatch`] or a chain for those.
//! - The pipeline borrows the tensors of every dispatch it sends for as long as it lives: the
//!   ones a dispatch reads as `&Tensor`, the ones it writes as `&mut Tensor` (so one output
//!   cannot be in two dispatches of one pipeline, and no view of it lives until the pipeline
//!   is finished or dropped). A written tensor is lent to the daemon from its submission until
//!   its completion arrives (see [What a view guarantees](crate::tensor#what-a-view-guarantees)).
//! - A pipeline is not resumed after the connection drops: the stream ends with an error and
//!   the dispatches still in flight are unknown (the session itself reconnects on the next
//!   call). A pipeline dropped with dispatches in flight closes its stream; the daemon still
//!   runs what it had accepted, so the tensors those dispatches write stay lent for good
//!   ([`crate::Tensor::is_lent`]): call [`Pipeline::finish`] first.
//!
//! ```compile_fail,E0502
//! # async fn f(client: &npu_client::Client, p: &npu_client::Program) -> Result<(), npu_client::ClientError> {
//! let input = client.alloc::<i32>(64).await?;
//! let mut output = client.alloc::<i32>(64).await?;
//! let mut pipeline = client.pipeline(4).await?;
//! pipeline.submit(p, &[&input], vec![&mut output]).await?;
//! let seen = output.as_slice()[0]; // the dispatch may be writing it
//! pipeline.finish().await?;
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use npu_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::dispatch::DispatchResult;
use crate::error::ClientError;
use crate::fastpath::{FastPath, RingMiss};
use crate::program::Program;
use crate::tensor::{RawTensor, TensorArg};

/// One dispatch's outcome.
#[derive(Debug)]
pub struct Completion {
    /// The id [`Pipeline::submit`] returned.
    pub request_id: u64,
    /// The daemon's timing, or why the dispatch failed (the daemon's code and message).
    pub result: Result<DispatchResult, ClientError>,
}

/// Dispatches in flight on the session's ring or one `Submit` stream; see the module
/// documentation.
#[derive(Debug)]
pub struct Pipeline<'a> {
    client: &'a Client,
    depth: usize,
    /// The session's ring, when the pipeline opened on it (kept after it closes, for the
    /// dispatches it has in flight).
    ring: Option<Arc<FastPath>>,
    /// The ring closed: what is sent now goes on the stream.
    ring_closed: bool,
    /// The `Submit` stream, opened when first needed.
    stream: Option<Stream>,
    next_id: u64,
    /// Dispatches sent and not yet completed, oldest first, each with the tensors it writes
    /// (lent until its completion arrives). All on one route at a time.
    in_flight: VecDeque<Flight<'a>>,
    /// Completions taken off the stream to make room, not yet returned by `next_completion`.
    ready: VecDeque<Completion>,
}

#[derive(Debug)]
struct Stream {
    /// `None` once [`Pipeline::finish`] closed the sending side.
    requests: Option<mpsc::Sender<pb::SubmitRequest>>,
    completions: Streaming<pb::SubmitResponse>,
}

#[derive(Debug)]
struct Flight<'a> {
    /// The pipeline's request id.
    id: u64,
    route: Route,
    /// What a ring slot carries, kept for the case of a ring that closes before it takes it
    /// (it is then sent on the stream).
    request: Option<pb::DispatchRequest>,
    writes: Vec<&'a mut RawTensor>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Stream,
    /// The ring's request id and the slot's index.
    Ring(u64, u32),
}

impl Client {
    /// Opens a pipeline that keeps up to `depth` dispatches in flight (at least 1, at most the
    /// daemon's `max_pending_per_session`, and at most 64 on a ring).
    ///
    /// # Errors
    ///
    /// [`ClientError::SessionLost`], the daemon's refusal, or a transport error opening the
    /// stream (a pipeline on the session's ring opens its stream only if it needs one).
    pub async fn pipeline(&self, depth: usize) -> Result<Pipeline<'_>, ClientError> {
        let ring = self.inner.fast_path().filter(|fp| fp.queues());
        let depth = self.pipeline_depth(depth, ring.is_some());
        let stream = match ring {
            Some(_) => None,
            None => Some(open_stream(self, depth).await?),
        };
        Ok(Pipeline {
            client: self,
            depth,
            ring,
            ring_closed: false,
            stream,
            next_id: 0,
            in_flight: VecDeque::new(),
            ready: VecDeque::new(),
        })
    }
}

impl Client {
    /// The depth a pipeline asking for `depth` gets when it runs on this session's dispatch
    /// ring, or `None` when it would not (no ring, or a daemon without queued slots): at
    /// least 1, at most the daemon's `max_pending_per_session` and the ring's 64 slots.
    #[must_use]
    pub fn ring_pipeline_depth(&self, depth: usize) -> Option<usize> {
        self.pipelines_on_ring()
            .then(|| self.pipeline_depth(depth, true))
    }

    fn pipelines_on_ring(&self) -> bool {
        self.inner.fast_path().is_some_and(|fp| fp.queues())
    }

    /// `depth` within 1 and the daemon's `max_pending_per_session`, and within the ring's
    /// slots for a pipeline `on_ring`.
    fn pipeline_depth(&self, depth: usize, on_ring: bool) -> usize {
        let most = self
            .device()
            .limits
            .as_ref()
            .map_or(1, |l| l.max_pending_per_session as usize)
            .max(1);
        let most = if on_ring {
            most.min(npu_fd::ring::SLOTS as usize)
        } else {
            most
        };
        depth.clamp(1, most)
    }
}

async fn open_stream(client: &Client, depth: usize) -> Result<Stream, ClientError> {
    let (tx, rx) = mpsc::channel(depth);
    let completions = client
        .inner
        .open_stream("Submit", |mut c| async move {
            c.submit(ReceiverStream::new(rx))
                .await
                .map(tonic::Response::into_inner)
        })
        .await?;
    Ok(Stream {
        requests: Some(tx),
        completions,
    })
}

impl<'a> Pipeline<'a> {
    /// Dispatches in flight at most.
    #[must_use]
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Dispatches sent whose completion has not arrived yet (at most [`Pipeline::depth`]).
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Dispatches sent whose completion [`Pipeline::next_completion`] has not returned yet.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.in_flight.len() + self.ready.len()
    }

    /// Whether the pipeline sends through the session's dispatch ring (until the ring
    /// closes).
    #[must_use]
    pub fn on_ring(&self) -> bool {
        self.ring.is_some() && !self.ring_closed
    }

    /// Sends `program` over `reads` followed by `writes`, in the design's order (registering
    /// the program first if needed), and returns the request id its [`Completion`] will carry.
    /// As in [`Client::dispatch`], `reads` are the arguments the design only reads (at most
    /// [`Program::read_only_args`]); the pipeline keeps both borrowed for the rest of its life.
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for a tensor of another session, one staged through the API, or
    /// more `reads` than the design only reads (nothing is sent); a registration error; a
    /// transport error when the stream has ended.
    pub async fn submit(
        &mut self,
        program: &Program,
        reads: &[&'a dyn TensorArg],
        writes: Vec<&'a mut dyn TensorArg>,
    ) -> Result<u64, ClientError> {
        crate::dispatch::check_reads(program, reads.len())?;
        let mut writes: Vec<&'a mut RawTensor> =
            writes.into_iter().map(TensorArg::raw_mut).collect();
        let raws: Vec<&RawTensor> = reads
            .iter()
            .map(|a| a.raw())
            .chain(writes.iter().map(|w| &**w))
            .collect();
        self.client.check_owned(&raws)?;
        for (i, r) in raws.iter().enumerate() {
            if r.is_staged() {
                return Err(ClientError::Invalid(format!(
                    "args[{i}]: tensor {} is staged through the API (a remote connection); \
                     pipelined submission needs tensors shared in place: use dispatch or a chain",
                    r.id
                )));
            }
        }
        let program_id = self.client.register(program).await?.id;
        let request = crate::dispatch::link(program_id, &raws, reads.len());
        drop(raws);
        loop {
            let on_ring =
                !self.ring_closed && self.ring.as_ref().is_some_and(|fp| fp.takes(&request));
            // One route in flight at a time: the daemon orders a session's ring and stream
            // items only as they reach it.
            if self
                .in_flight
                .back()
                .is_some_and(|f| matches!(f.route, Route::Ring(..)) != on_ring)
            {
                self.wait_for_all().await?;
            }
            while self.in_flight.len() >= self.depth {
                let c = self.receive().await?;
                self.ready.push_back(c);
            }
            // Lent before the request leaves: the daemon may write them as soon as it has it.
            set_lent(&mut writes, true);
            let (sent, request) = match &self.ring {
                Some(fp) if on_ring => match fp.submit_queued(&request).await {
                    Ok((ring_id, index)) => (Ok(Route::Ring(ring_id, index)), Some(request)),
                    // The ring closed before it took the dispatch: the stream takes it.
                    Err(_) => {
                        set_lent(&mut writes, false);
                        self.ring_closed = true;
                        continue;
                    }
                },
                _ => (self.send_on_stream(self.next_id, request).await, None),
            };
            let route = match sent {
                Ok(route) => route,
                Err(e) => {
                    // Never sent, so the daemon does not have it.
                    set_lent(&mut writes, false);
                    return Err(e);
                }
            };
            let id = self.next_id;
            self.next_id += 1;
            self.in_flight.push_back(Flight {
                id,
                route,
                request,
                writes,
            });
            return Ok(id);
        }
    }

    /// Sends one item on the stream, opening it first if needed.
    async fn send_on_stream(
        &mut self,
        request_id: u64,
        d: pb::DispatchRequest,
    ) -> Result<Route, ClientError> {
        if self.stream.is_none() {
            self.stream = Some(open_stream(self.client, self.depth).await?);
        }
        let req = pb::SubmitRequest {
            request_id,
            work: Some(pb::submit_request::Work::Dispatch(d)),
            timeout_ms: 0,
        };
        let sent = match self.stream.as_ref().and_then(|s| s.requests.as_ref()) {
            Some(tx) => tx.send(req).await.is_ok(),
            None => false,
        };
        if sent {
            Ok(Route::Stream)
        } else {
            Err(self.ended("the stream is closed"))
        }
    }

    /// Takes every completion in flight into `ready`.
    async fn wait_for_all(&mut self) -> Result<(), ClientError> {
        while !self.in_flight.is_empty() {
            let c = self.receive().await?;
            self.ready.push_back(c);
        }
        Ok(())
    }

    /// The next completion in submission order, or `None` when every dispatch sent has been
    /// returned.
    ///
    /// # Errors
    ///
    /// The stream's end, or the ring's closing with the dispatch taken and unanswered: the
    /// daemon's status or a transport error (the dispatches still in flight are then
    /// unknown).
    pub async fn next_completion(&mut self) -> Result<Option<Completion>, ClientError> {
        if let Some(c) = self.ready.pop_front() {
            return Ok(Some(c));
        }
        if self.in_flight.is_empty() {
            return Ok(None);
        }
        self.receive().await.map(Some)
    }

    /// Waits for every dispatch in flight and returns their completions in order, then closes
    /// the stream.
    ///
    /// # Errors
    ///
    /// As [`Pipeline::next_completion`].
    pub async fn finish(mut self) -> Result<Vec<Completion>, ClientError> {
        // Nothing more will be sent: the daemon ends the stream after the last completion.
        if let Some(s) = &mut self.stream {
            s.requests = None;
        }
        let mut all = Vec::with_capacity(self.pending());
        while let Some(c) = self.next_completion().await? {
            all.push(c);
        }
        Ok(all)
    }

    /// The oldest dispatch's completion.
    async fn receive(&mut self) -> Result<Completion, ClientError> {
        loop {
            let Some(front) = self.in_flight.front_mut() else {
                return Err(protocol(
                    "a completion was awaited with none in flight".into(),
                ));
            };
            let id = front.id;
            let result = match front.route {
                Route::Stream => self.receive_from_stream(id).await?,
                Route::Ring(ring_id, index) => {
                    let Some(fp) = self.ring.clone() else {
                        return Err(protocol("a ring dispatch without its ring".into()));
                    };
                    match fp.wait_kept(ring_id, index).await {
                        Ok(c) => ring_result(c),
                        Err(RingMiss::NotTaken) => {
                            // The ring closed before the daemon took it, and took everything
                            // before it: the stream takes it in its place, in order.
                            self.ring_closed = true;
                            let d = front.request.take().unwrap_or_default();
                            let route = self.send_on_stream(id, d).await?;
                            if let Some(f) = self.in_flight.front_mut() {
                                f.route = route;
                            }
                            continue;
                        }
                        Err(RingMiss::Lost(why)) => return Err(self.ended(&why)),
                        Err(RingMiss::TimedOut | RingMiss::Interrupted) => {
                            return Err(self.ended("the ring timed out"));
                        }
                    }
                }
            };
            // The daemon is done with this dispatch, whatever its outcome.
            if let Some(mut f) = self.in_flight.pop_front() {
                set_lent(&mut f.writes, false);
            }
            return Ok(Completion {
                request_id: id,
                result,
            });
        }
    }

    /// The stream's next completion, which must be request `id`'s.
    async fn receive_from_stream(
        &mut self,
        id: u64,
    ) -> Result<Result<DispatchResult, ClientError>, ClientError> {
        let Some(stream) = &mut self.stream else {
            return Err(protocol("a stream dispatch without its stream".into()));
        };
        let r = match stream.completions.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(self.ended("the daemon ended the stream")),
            Err(status) => return Err(ClientError::daemon("Submit", &status)),
        };
        if r.request_id != id {
            return Err(protocol(format!(
                "a completion for request {} while {id} was due",
                r.request_id
            )));
        }
        Ok(if r.code == 0 {
            match r.result {
                Some(pb::submit_response::Result::Dispatch(d)) => Ok(DispatchResult {
                    queue: Duration::from_nanos(d.queue_ns),
                    device: Duration::from_nanos(d.device_ns),
                }),
                other => Err(protocol(format!(
                    "request {} completed without a dispatch result ({other:?})",
                    r.request_id
                ))),
            }
        } else {
            Err(item_error(r.code, r.message))
        })
    }

    fn ended(&self, why: &str) -> ClientError {
        ClientError::Connect {
            address: self.client.address().to_string(),
            message: format!(
                "Submit: {why} with {} dispatches in flight",
                self.in_flight.len()
            ),
        }
    }
}

impl Drop for Pipeline<'_> {
    /// Dispatches still in flight on the ring are left to the daemon, which runs them; their
    /// completions are dropped as they come.
    fn drop(&mut self) {
        if let Some(fp) = &self.ring {
            for f in &self.in_flight {
                if let Route::Ring(ring_id, _) = f.route {
                    fp.abandon(ring_id);
                }
            }
        }
    }
}

/// Lends the tensors a dispatch writes to the daemon, or takes them back.
fn set_lent(writes: &mut [&mut RawTensor], lent: bool) {
    for w in writes {
        if lent {
            w.lend();
        } else {
            w.reclaim();
        }
    }
}

/// A ring completion as the stream's item would have been.
pub(crate) fn ring_result(c: npu_fd::ring::Completion) -> Result<DispatchResult, ClientError> {
    if c.code == 0 {
        Ok(DispatchResult {
            queue: Duration::from_nanos(c.queue_ns),
            device: Duration::from_nanos(c.device_ns),
        })
    } else {
        Err(item_error(i32::try_from(c.code).unwrap_or(2), c.message))
    }
}

/// A dispatch the daemon refused or the device failed, as the stream reports it.
fn item_error(code: i32, message: String) -> ClientError {
    ClientError::Daemon {
        call: "Submit",
        code: tonic::Code::from_i32(code),
        message,
        note: None,
    }
}

/// The daemon broke the stream's contract (a completion out of order or without its result).
fn protocol(message: String) -> ClientError {
    ClientError::Daemon {
        call: "Submit",
        code: tonic::Code::Internal,
        message,
        note: None,
    }
}
