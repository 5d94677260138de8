//! Pipelined submission: [`Client::pipeline`] keeps several dispatches in flight on one
//! long-lived `Submit` stream, so the round trip is paid once per window instead of once per
//! dispatch (`npuctl bench` row 9: ≈ 5 µs per dispatch with 16 in flight, against ≈ 60 µs for
//! one unary dispatch at a time, on the emulator).
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
use std::time::Duration;

use npu_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::dispatch::DispatchResult;
use crate::error::ClientError;
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

/// Dispatches in flight on one `Submit` stream; see the module documentation.
#[derive(Debug)]
pub struct Pipeline<'a> {
    client: &'a Client,
    depth: usize,
    requests: Option<mpsc::Sender<pb::SubmitRequest>>,
    completions: Streaming<pb::SubmitResponse>,
    next_id: u64,
    /// Ids sent and not yet completed, oldest first, each with the tensors it writes (lent
    /// until its completion arrives).
    in_flight: VecDeque<(u64, Vec<&'a mut RawTensor>)>,
    /// Completions taken off the stream to make room, not yet returned by `next_completion`.
    ready: VecDeque<Completion>,
}

impl Client {
    /// Opens a pipeline that keeps up to `depth` dispatches in flight (at least 1, at most the
    /// daemon's `max_pending_per_session`).
    ///
    /// # Errors
    ///
    /// [`ClientError::SessionLost`], the daemon's refusal, or a transport error opening the
    /// stream.
    pub async fn pipeline(&self, depth: usize) -> Result<Pipeline<'_>, ClientError> {
        let most = self
            .device()
            .limits
            .as_ref()
            .map_or(1, |l| l.max_pending_per_session as usize);
        let depth = depth.clamp(1, most.max(1));
        let (tx, rx) = mpsc::channel(depth);
        let completions = self
            .inner
            .open_stream("Submit", |mut c| async move {
                c.submit(ReceiverStream::new(rx))
                    .await
                    .map(tonic::Response::into_inner)
            })
            .await?;
        Ok(Pipeline {
            client: self,
            depth,
            requests: Some(tx),
            completions,
            next_id: 0,
            in_flight: VecDeque::new(),
            ready: VecDeque::new(),
        })
    }
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
        while self.in_flight.len() >= self.depth {
            let c = self.receive().await?;
            self.ready.push_back(c);
        }
        let request_id = self.next_id;
        let req = pb::SubmitRequest {
            request_id,
            work: Some(pb::submit_request::Work::Dispatch(crate::dispatch::link(
                program_id,
                &raws,
                reads.len(),
            ))),
            timeout_ms: 0,
        };
        drop(raws);
        // Lent before the request leaves: the daemon may write them as soon as it has it.
        for w in &mut writes {
            w.lend();
        }
        let sent = match &self.requests {
            Some(tx) => tx.send(req).await.is_ok(),
            None => false,
        };
        if !sent {
            // Never sent, so the daemon does not have it.
            for w in &mut writes {
                w.reclaim();
            }
            return Err(self.ended("the stream is closed"));
        }
        self.next_id += 1;
        self.in_flight.push_back((request_id, writes));
        Ok(request_id)
    }

    /// The next completion in submission order, or `None` when every dispatch sent has been
    /// returned.
    ///
    /// # Errors
    ///
    /// The stream's end: the daemon's status or a transport error (the dispatches still in
    /// flight are then unknown).
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
        self.requests = None;
        let mut all = Vec::with_capacity(self.pending());
        while let Some(c) = self.next_completion().await? {
            all.push(c);
        }
        Ok(all)
    }

    async fn receive(&mut self) -> Result<Completion, ClientError> {
        let r = match self.completions.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(self.ended("the daemon ended the stream")),
            Err(status) => return Err(ClientError::daemon("Submit", &status)),
        };
        match self.in_flight.front_mut() {
            Some((id, writes)) if *id == r.request_id => {
                // The daemon is done with this dispatch, whatever its outcome.
                for w in writes.iter_mut() {
                    w.reclaim();
                }
                self.in_flight.pop_front();
            }
            expected => {
                return Err(protocol(format!(
                    "a completion for request {} while {:?} was due",
                    r.request_id,
                    expected.map(|(id, _)| *id)
                )));
            }
        }
        let result = if r.code == 0 {
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
            Err(ClientError::Daemon {
                call: "Submit",
                code: tonic::Code::from_i32(r.code),
                message: r.message,
            })
        };
        Ok(Completion {
            request_id: r.request_id,
            result,
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

/// The daemon broke the stream's contract (a completion out of order or without its result).
fn protocol(message: String) -> ClientError {
    ClientError::Daemon {
        call: "Submit",
        code: tonic::Code::Internal,
        message,
    }
}
