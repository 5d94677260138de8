//! Running programs: [`Client::dispatch`] and [`ChainBuilder`].
//!
//! Arguments are whole tensors, in the design's order (IRON's examples: inputs, then outputs).
//! Staged (remote) tensors are uploaded before the work when dirty and downloaded after it (see
//! [`crate::tensor`]). Both calls return when the device has finished.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use npu_proto::v1 as pb;

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
    /// Runs `program` once over `args` and waits for the device.
    ///
    /// Registers the program in this session first if needed.
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for a tensor of another session; the daemon's refusal
    /// (`INVALID_ARGUMENT` for too few or too small arguments, `FAILED_PRECONDITION` for a
    /// quarantined program, `INTERNAL` when the device failed it, ...) with its message;
    /// [`ClientError::SessionLost`]; a transport error or timeout.
    pub async fn dispatch(
        &self,
        program: &Program,
        args: &[&dyn TensorArg],
    ) -> Result<DispatchResult, ClientError> {
        let raws: Vec<&RawTensor> = args.iter().map(|a| a.raw()).collect();
        self.check_owned(&raws)?;
        let program_id = self.register(program).await?.id;
        upload_dirty(&raws).await?;
        let req = link(program_id, &raws);
        let r = self
            .inner
            .call("Dispatch", |mut c| {
                let req = req.clone();
                async move { c.dispatch(req).await.map(tonic::Response::into_inner) }
            })
            .await?;
        download_all(&raws).await?;
        Ok(DispatchResult {
            queue: Duration::from_nanos(r.queue_ns),
            device: Duration::from_nanos(r.device_ns),
        })
    }

    /// Starts a chain: links run in order, on as few doorbell rings as the daemon can.
    #[must_use]
    pub fn chain(&self) -> ChainBuilder<'_> {
        ChainBuilder {
            client: self,
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

/// Links of a chain, built with [`Client::chain`] and run with [`ChainBuilder::run`].
#[derive(Debug)]
pub struct ChainBuilder<'a> {
    client: &'a Client,
    links: Vec<(&'a Program, Vec<&'a RawTensor>)>,
}

impl<'a> ChainBuilder<'a> {
    /// Adds a link: `program` over `args`.
    #[must_use]
    pub fn then(mut self, program: &'a Program, args: &[&'a dyn TensorArg]) -> Self {
        self.links
            .push((program, args.iter().map(|a| a.raw()).collect()));
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
    /// [`ChainResult::ok`] to make it an error). Staged tensors are downloaded in both cases.
    ///
    /// # Errors
    ///
    /// As [`Client::dispatch`], and `INVALID_ARGUMENT` for an empty chain.
    pub async fn run(self) -> Result<ChainResult, ClientError> {
        let client = self.client;
        let mut links = Vec::with_capacity(self.links.len());
        let mut all: Vec<&RawTensor> = Vec::new();
        for (program, raws) in &self.links {
            client.check_owned(raws)?;
            let id = client.register(program).await?.id;
            links.push(link(id, raws));
            all.extend(raws.iter().copied());
        }
        upload_dirty(&all).await?;
        let req = pb::ChainRequest { links };
        let r = client
            .inner
            .call("Chain", |mut c| {
                let req = req.clone();
                async move { c.chain(req).await.map(tonic::Response::into_inner) }
            })
            .await?;
        download_all(&all).await?;
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

pub(crate) fn link(program_id: u64, raws: &[&RawTensor]) -> pb::DispatchRequest {
    pb::DispatchRequest {
        program_id,
        args: raws
            .iter()
            .map(|r| pb::TensorArg {
                tensor_id: r.id,
                offset: 0,
                length: 0,
            })
            .collect(),
    }
}

fn unique<'a>(raws: &[&'a RawTensor]) -> Vec<&'a RawTensor> {
    let mut seen = HashSet::new();
    raws.iter().copied().filter(|r| seen.insert(r.id)).collect()
}

async fn upload_dirty(raws: &[&RawTensor]) -> Result<(), ClientError> {
    for r in unique(raws) {
        r.upload(false).await?;
    }
    Ok(())
}

async fn download_all(raws: &[&RawTensor]) -> Result<(), ClientError> {
    for r in unique(raws) {
        r.download().await?;
    }
    Ok(())
}
