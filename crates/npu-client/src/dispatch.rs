//! Running programs: [`Client::dispatch`] and [`ChainBuilder`].
//!
//! Arguments are whole tensors, in the design's order (IRON's examples: inputs, then outputs),
//! split by what the device does with them: the ones it only reads are lent as `&Tensor`, the
//! ones it may write as `&mut Tensor`, so no view of an output lives while the device writes it
//! (see [What a view guarantees](crate::tensor#what-a-view-guarantees)). Which leading
//! arguments a design only reads is [`Program::read_only_args`]; any argument after those must
//! be lent as written, and the call refuses otherwise. Staged (remote) tensors are uploaded
//! before the work when dirty, and the written ones downloaded after it (see [`crate::tensor`]).
//! Both calls return when the device has finished.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use npu_proto::v1 as pb;
use smallvec::SmallVec;

use crate::client::Client;
use crate::error::ClientError;
use crate::program::Program;
use crate::tensor::{RawTensor, TensorArg};

/// Timing of one dispatch, as the daemon measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DispatchResult {
    /// From admission to the start of the device batch.
    pub queue: Duration,
    /// From doorbell to completion.
    pub device: Duration,
}

/// A link of a chain that failed on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFailure {
    /// Index of the failing link; links before it completed.
    pub index: u32,
    /// The daemon's code for the failure.
    pub code: tonic::Code,
    /// The daemon's message.
    pub message: String,
    /// Links that did not run.
    pub not_run: Vec<u32>,
}

/// What a chain did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainResult {
    /// Links that completed.
    pub completed: u32,
    /// From admission to the start of the first device batch.
    pub queue: Duration,
    /// Device time over all links.
    pub device: Duration,
    /// Doorbell rings the chain took.
    pub doorbells: u32,
    /// Set when a link failed on the device.
    pub failure: Option<LinkFailure>,
}

impl ChainResult {
    /// The result, or [`ClientError::ChainFailed`] when a link failed.
    ///
    /// # Errors
    ///
    /// [`ClientError::ChainFailed`] with the failing link's index, code and message.
    pub fn ok(self) -> Result<ChainResult, ClientError> {
        match self.failure {
            None => Ok(self),
            Some(f) => Err(ClientError::ChainFailed {
                index: f.index,
                code: f.code,
                message: f.message,
                not_run: f.not_run,
            }),
        }
    }
}

impl Client {
    /// Runs `program` once and waits for the device. Its arguments are `reads` followed by
    /// `writes`, in the design's order: `reads` the design only reads (at most
    /// [`Program::read_only_args`] of them), `writes` the rest, which the device may write and
    /// which are lent to the daemon until it answers.
    ///
    /// Registers the program in this session first if needed.
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for a tensor of another session, or for more `reads` than the
    /// design only reads (nothing is sent); the daemon's refusal (`INVALID_ARGUMENT` for too
    /// few or too small arguments, `FAILED_PRECONDITION` for a quarantined program, `INTERNAL`
    /// when the device failed it, ...) with its message; [`ClientError::SessionLost`]; a
    /// transport error or timeout (the written tensors then stay lent: see
    /// [`crate::Tensor::is_lent`]).
    pub async fn dispatch(
        &self,
        program: &Program,
        reads: &[&dyn TensorArg],
        writes: &mut [&mut dyn TensorArg],
    ) -> Result<DispatchResult, ClientError> {
        let reads: Vec<&RawTensor> = reads.iter().map(|a| a.raw()).collect();
        let mut writes: Vec<&mut RawTensor> = writes.iter_mut().map(|a| a.raw_mut()).collect();
        check_reads(program, reads.len())?;
        let all: Vec<&RawTensor> = reads
            .iter()
            .copied()
            .chain(writes.iter().map(|w| &**w))
            .collect();
        self.check_owned(&all)?;
        let program_id = self.register(program).await?.id;
        upload_dirty(&all).await?;
        let req = link(program_id, &all, reads.len());
        drop(all);
        let r = lent_during(&mut writes, self.dispatch_request(req)).await?;
        download_written(&mut writes).await?;
        Ok(DispatchResult {
            queue: Duration::from_nanos(r.queue_ns),
            device: Duration::from_nanos(r.device_ns),
        })
    }

    /// Sends one dispatch: through the session's ring when it has one, else (or when the ring
    /// did not take it) through gRPC. The answer, and every error, is the same either way.
    pub(crate) async fn dispatch_request(
        &self,
        req: pb::DispatchRequest,
    ) -> Result<pb::DispatchResponse, ClientError> {
        let inner = &self.inner;
        if let Some(fp) = inner.fast_path() {
            let timeout = inner.opts.call_timeout;
            let answer = match tokio::time::timeout(timeout, fp.dispatch(&req, timeout)).await {
                Err(_) => Err(crate::fastpath::RingMiss::TimedOut),
                Ok(r) => r,
            };
            if let Some(r) = self.ring_answer(answer) {
                return r;
            }
        }
        let r = inner
            .call("Dispatch", |mut c| {
                let req = req.clone();
                async move { c.dispatch(req).await.map(tonic::Response::into_inner) }
            })
            .await;
        if r.is_ok() {
            inner.maybe_reattach().await;
        }
        r
    }

    /// What a dispatch through the ring answered, as `Dispatch` would have: `None` when the
    /// daemon never took it (it goes through gRPC then).
    fn ring_answer(
        &self,
        r: Result<npu_fd::ring::Completion, crate::fastpath::RingMiss>,
    ) -> Option<Result<pb::DispatchResponse, ClientError>> {
        let inner = &self.inner;
        Some(match r {
            Ok(c) if c.code == 0 => Ok(pb::DispatchResponse {
                queue_ns: c.queue_ns,
                device_ns: c.device_ns,
            }),
            Ok(c) => {
                let code = tonic::Code::from_i32(i32::try_from(c.code).unwrap_or(2));
                let status = tonic::Status::new(code, c.message);
                Err(inner.daemon_error("Dispatch", &status))
            }
            Err(crate::fastpath::RingMiss::TimedOut) => Err(ClientError::Timeout {
                call: "Dispatch",
                timeout: inner.opts.call_timeout,
            }),
            Err(crate::fastpath::RingMiss::Interrupted) => {
                Err(ClientError::Interrupted { call: "Dispatch" })
            }
            Err(crate::fastpath::RingMiss::Lost(why)) => Err(ClientError::Connect {
                address: inner.addr.to_string(),
                message: format!("Dispatch: {why}"),
            }),
            Err(crate::fastpath::RingMiss::NotTaken) => return None,
        })
    }

    /// [`Client::dispatch`] on the calling thread, for a caller that blocks for the answer
    /// anyway (the Python package): through the session's ring with no future or runtime in
    /// between, when that is possible at once. `None`, having sent nothing, when it is not (no
    /// ring, a program not registered yet, a staged tensor, the ring busy or full): the caller
    /// then uses [`Client::dispatch`].
    ///
    /// # Errors
    ///
    /// As [`Client::dispatch`].
    pub fn dispatch_now(
        &self,
        program: &Program,
        reads: &[&dyn TensorArg],
        writes: &mut [&mut dyn TensorArg],
    ) -> Option<Result<DispatchResult, ClientError>> {
        self.dispatch_now_checking(program, reads, writes, &mut || true)
    }

    /// [`Client::dispatch_now`] whose wait, once it sleeps, asks `go_on` every 100 ms whether
    /// to keep waiting: a caller that must answer a signal (Python's Ctrl-C) checks it there.
    ///
    /// # Errors
    ///
    /// As [`Client::dispatch`]; [`ClientError::Interrupted`] when `go_on` said no before the
    /// answer came (the dispatch may still run, and the tensors it may write stay lent).
    pub fn dispatch_now_checking(
        &self,
        program: &Program,
        reads: &[&dyn TensorArg],
        writes: &mut [&mut dyn TensorArg],
        go_on: &mut dyn FnMut() -> bool,
    ) -> Option<Result<DispatchResult, ClientError>> {
        let fp = self.inner.fast_path()?;
        // Inline for a dispatch's handful of arguments: this path is the one a latency-bound
        // caller takes for every dispatch.
        let mut writes: SmallVec<[&mut RawTensor; 8]> =
            writes.iter_mut().map(|a| a.raw_mut()).collect();
        let all: SmallVec<[&RawTensor; 8]> = reads
            .iter()
            .map(|a| a.raw())
            .chain(writes.iter().map(|w| &**w))
            .collect();
        let req = match self.ring_request(program, &all, reads.len())? {
            Ok(req) => req,
            Err(e) => return Some(Err(e)),
        };
        drop(all);
        for w in &mut writes {
            w.lend();
        }
        let answer = self.ring_answer(fp.dispatch_now(&req, self.inner.opts.call_timeout, go_on));
        let reclaim = match &answer {
            None => true,
            Some(r) => answered(r),
        };
        if reclaim {
            for w in &mut writes {
                w.reclaim();
            }
        }
        Some(answer?.map(|r| DispatchResult {
            queue: Duration::from_nanos(r.queue_ns),
            device: Duration::from_nanos(r.device_ns),
        }))
    }

    /// The request for `program` over `all` (the first `reads` only read) when it can go on
    /// the ring at once, as [`Client::dispatch_now`] and [`Client::queue_now`] send it: `None`
    /// when the program is not registered in this session yet or a tensor is staged, `Some`
    /// error for what [`Client::dispatch`] refuses before sending.
    pub(crate) fn ring_request(
        &self,
        program: &Program,
        all: &[&RawTensor],
        reads: usize,
    ) -> Option<Result<pb::DispatchRequest, ClientError>> {
        let program_id = self.inner.programs.id_now(program.key())?;
        if let Err(e) = check_reads(program, reads).and_then(|()| self.check_owned(all)) {
            return Some(Err(e));
        }
        if all.iter().any(|r| r.is_staged()) {
            return None;
        }
        Some(Ok(link(program_id, all, reads)))
    }

    /// Whether this session dispatches through its shared-memory ring now.
    #[must_use]
    pub fn fast_path_active(&self) -> bool {
        self.inner.fast_path().is_some()
    }

    /// Starts a chain: links run in order, on as few doorbell rings as the daemon can.
    #[must_use]
    pub fn chain(&self) -> ChainBuilder<'_> {
        ChainBuilder {
            client: self,
            key: NEXT_CHAIN.fetch_add(1, Ordering::Relaxed),
            tensors: Vec::new(),
            links: Vec::new(),
        }
    }

    pub(crate) fn check_owned(&self, raws: &[&RawTensor]) -> Result<(), ClientError> {
        for (i, r) in raws.iter().enumerate() {
            if !Arc::ptr_eq(&r.inner, &self.inner) {
                return Err(ClientError::Invalid(format!(
                    "args[{i}]: tensor {} belongs to another session",
                    r.id
                )));
            }
        }
        Ok(())
    }
}

/// Refuses `reads` arguments when the design may write one of them.
pub(crate) fn check_reads(program: &Program, reads: usize) -> Result<(), ClientError> {
    let most = program.read_only_args();
    if reads <= most {
        return Ok(());
    }
    Err(ClientError::Invalid(format!(
        "{} gets {reads} arguments to read, but it may write argument {most}: {}",
        program.name(),
        only_reads(program)
    )))
}

/// What the library knows of the arguments `program` only reads, for error messages.
pub(crate) fn only_reads(program: &Program) -> String {
    if program.emulated_design().is_some() {
        format!(
            "it only reads its first {}, pass the rest as written",
            program.read_only_args()
        )
    } else {
        "the library cannot tell which arguments a real design writes, so every argument is \
         passed as written"
            .to_owned()
    }
}

static NEXT_CHAIN: AtomicU64 = AtomicU64::new(1);

/// A tensor added to a chain with [`ChainBuilder::read`] or [`ChainBuilder::write`], for use in
/// its links.
///
/// [`ChainArg::view`] narrows one to a byte range of its tensor for a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainArg {
    chain: u64,
    index: usize,
    /// Byte offset and length in the tensor (length 0: to its end).
    range: (u64, u64),
}

impl ChainArg {
    /// The same tensor as `len` bytes from byte `offset` (a sub-view, as IRON's
    /// `tensor.subview`): the link's program sees only those bytes, in place. The daemon
    /// refuses a range outside the tensor (`INVALID_ARGUMENT`) and one shorter than the
    /// program's argument needs.
    #[must_use]
    pub fn view(self, offset: u64, len: u64) -> ChainArg {
        ChainArg {
            range: (offset, len),
            ..self
        }
    }
}

#[derive(Debug)]
enum Slot<'a> {
    Read(&'a RawTensor),
    Write(&'a mut RawTensor),
}

impl Slot<'_> {
    fn raw(&self) -> &RawTensor {
        match self {
            Slot::Read(r) => r,
            Slot::Write(w) => w,
        }
    }
}

/// Links of a chain, built with [`Client::chain`] and run with [`ChainBuilder::run`].
///
/// A chain borrows each of its tensors once, for all its links: [`ChainBuilder::read`] for a
/// tensor no link writes, [`ChainBuilder::write`] for one any link may write (an output that a
/// later link reads is added once, with `write`). Links name them by the [`ChainArg`] those
/// return:
///
/// ```no_run
/// # async fn f(client: &npu_client::Client, add_one: &npu_client::Program) -> Result<(), npu_client::ClientError> {
/// let input = client.tensor_from(&[1i32; 64]).await?;
/// let (mut mid, mut out) = (client.alloc::<i32>(64).await?, client.alloc::<i32>(64).await?);
/// let mut chain = client.chain();
/// let (i, m, o) = (chain.read(&input), chain.write(&mut mid), chain.write(&mut out));
/// chain.then(add_one, &[i, m]).then(add_one, &[m, o]);
/// chain.run().await?.ok()?;
/// assert_eq!(out.as_slice()[0], 3);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ChainBuilder<'a> {
    client: &'a Client,
    key: u64,
    tensors: Vec<Slot<'a>>,
    links: Vec<(&'a Program, Vec<ChainArg>)>,
}

impl<'a> ChainBuilder<'a> {
    /// Adds a tensor that the chain's links only read.
    pub fn read(&mut self, tensor: &'a dyn TensorArg) -> ChainArg {
        self.add(Slot::Read(tensor.raw()))
    }

    /// Adds a tensor that a link may write; it is lent to the daemon while the chain runs.
    pub fn write(&mut self, tensor: &'a mut dyn TensorArg) -> ChainArg {
        self.add(Slot::Write(tensor.raw_mut()))
    }

    fn add(&mut self, slot: Slot<'a>) -> ChainArg {
        self.tensors.push(slot);
        ChainArg {
            chain: self.key,
            index: self.tensors.len() - 1,
            range: (0, 0),
        }
    }

    /// Adds a link: `program` over `args`, in the design's order. Arguments from
    /// [`ChainBuilder::read`] may only stand where the design only reads
    /// ([`Program::read_only_args`]); [`ChainBuilder::run`] refuses the chain otherwise.
    pub fn then(&mut self, program: &'a Program, args: &[ChainArg]) -> &mut Self {
        self.links.push((program, args.to_vec()));
        self
    }

    /// Number of links so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether no link was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Runs the chain and waits for it.
    ///
    /// A link the daemon refuses before anything runs is an error naming the link; a device
    /// failure part way through is reported in [`ChainResult::failure`] (use
    /// [`ChainResult::ok`] to make it an error). Staged tensors added with `write` are
    /// downloaded in both cases.
    ///
    /// # Errors
    ///
    /// As [`Client::dispatch`]; [`ClientError::Invalid`] for an argument of another chain or
    /// one added with `read` where the design may write; `INVALID_ARGUMENT` for an empty chain.
    pub async fn run(self) -> Result<ChainResult, ClientError> {
        let ChainBuilder {
            client,
            key,
            tensors,
            links: planned,
        } = self;
        let mut links = Vec::with_capacity(planned.len());
        for (n, (program, args)) in planned.iter().enumerate() {
            let mut raws = Vec::with_capacity(args.len());
            let mut marked = Vec::with_capacity(args.len());
            for (i, a) in args.iter().enumerate() {
                let slot = tensors
                    .get(a.index)
                    .filter(|_| a.chain == key)
                    .ok_or_else(|| {
                        ClientError::Invalid(format!(
                            "chain link {n}: args[{i}] was added to another chain"
                        ))
                    })?;
                if i >= program.read_only_args()
                    && let Slot::Read(r) = slot
                {
                    return Err(ClientError::Invalid(format!(
                        "chain link {n}: args[{i}] (tensor {}) was added with read, but {} may \
                         write it: {}",
                        r.id,
                        program.name(),
                        only_reads(program)
                    )));
                }
                raws.push(slot.raw());
                // A tensor added with `read` is not lent: it must never be written back.
                marked.push((slot.raw(), matches!(slot, Slot::Read(_)), a.range));
            }
            client.check_owned(&raws)?;
            let id = client.register(program).await?.id;
            links.push(link_marked(id, marked.into_iter()));
        }
        let all: Vec<&RawTensor> = tensors.iter().map(Slot::raw).collect();
        upload_dirty(&all).await?;
        drop(all);
        let mut writes: Vec<&mut RawTensor> = tensors
            .into_iter()
            .filter_map(|s| match s {
                Slot::Write(w) => Some(w),
                Slot::Read(_) => None,
            })
            .collect();
        let req = pb::ChainRequest { links };
        let r = lent_during(
            &mut writes,
            client.inner.call("Chain", |mut c| {
                let req = req.clone();
                async move { c.chain(req).await.map(tonic::Response::into_inner) }
            }),
        )
        .await?;
        download_written(&mut writes).await?;
        Ok(ChainResult {
            completed: r.completed,
            queue: Duration::from_nanos(r.queue_ns),
            device: Duration::from_nanos(r.device_ns),
            doorbells: r.doorbells,
            failure: r.failure.map(|f| LinkFailure {
                index: f.index,
                code: tonic::Code::from_i32(f.code),
                message: f.message,
                not_run: f.not_run,
            }),
        })
    }
}

/// A link over `raws`, the first `reads` of which the caller only lends for reading: those are
/// marked `read_only`, so the daemon never copies a staged one back into memory the caller may
/// write again as soon as it stops waiting.
pub(crate) fn link(program_id: u64, raws: &[&RawTensor], reads: usize) -> pb::DispatchRequest {
    link_marked(
        program_id,
        raws.iter()
            .enumerate()
            .map(|(i, r)| (*r, i < reads, (0, 0))),
    )
}

/// A link over `args`: each tensor, whether it is only read, and its byte range (offset,
/// length; 0 length: to the end).
pub(crate) fn link_marked<'r>(
    program_id: u64,
    args: impl Iterator<Item = (&'r RawTensor, bool, (u64, u64))>,
) -> pb::DispatchRequest {
    pb::DispatchRequest {
        program_id,
        args: args
            .map(|(r, read_only, (offset, length))| pb::TensorArg {
                tensor_id: r.id,
                offset,
                length,
                read_only,
            })
            .collect(),
    }
}

/// Runs `call` with `writes` lent to the daemon, and takes them back only when the daemon
/// answered it (see [`answered`]); otherwise they stay lent.
pub(crate) async fn lent_during<R>(
    writes: &mut [&mut RawTensor],
    call: impl Future<Output = Result<R, ClientError>>,
) -> Result<R, ClientError> {
    for w in writes.iter_mut() {
        w.lend();
    }
    let r = call.await;
    if answered(&r) {
        for w in writes.iter_mut() {
            w.reclaim();
        }
    }
    r
}

/// Whether an outcome is the daemon's answer to the whole call, after which it no longer
/// writes the call's tensors: a result, or a refusal it sent. Not a timeout or a broken
/// connection, nor `DEADLINE_EXCEEDED`, `CANCELLED` or `UNKNOWN`, which the transport may
/// produce while the work still runs.
pub(crate) fn answered<R>(r: &Result<R, ClientError>) -> bool {
    match r {
        Ok(_) | Err(ClientError::SessionLost { .. } | ClientError::ChainFailed { .. }) => true,
        Err(ClientError::Daemon { code, .. }) => !matches!(
            code,
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled | tonic::Code::Unknown
        ),
        Err(_) => false,
    }
}

fn unique<'a>(raws: &[&'a RawTensor]) -> Vec<&'a RawTensor> {
    let mut seen = HashSet::new();
    raws.iter().copied().filter(|r| seen.insert(r.id)).collect()
}

pub(crate) async fn upload_dirty(raws: &[&RawTensor]) -> Result<(), ClientError> {
    for r in unique(raws) {
        r.upload(false).await?;
    }
    Ok(())
}

pub(crate) async fn download_written(writes: &mut [&mut RawTensor]) -> Result<(), ClientError> {
    for w in writes.iter_mut() {
        w.download().await?;
    }
    Ok(())
}
