//! Dispatch arguments that are byte ranges of tensors: [`DispatchArg`] and
//! [`Client::dispatch_args`].
//!
//! IRON hands a runtime sub-views of one allocation (`tensor.subview(offset, shape)`, with its
//! `storage_offset` in bytes) as separate kernel arguments. Here a view is a tensor, a byte
//! offset and a length, sent as the API's `TensorArg.offset`/`length`: the program reads and
//! writes those bytes of the tensor in place (no copy for a tensor shared by fd; a staged or
//! remote tensor is uploaded and downloaded whole, as for any dispatch).

use std::time::Duration;

use crate::client::Client;
use crate::dispatch::{
    DispatchResult, download_written, lent_during, link_marked, only_reads, upload_dirty,
};
use crate::error::ClientError;
use crate::program::Program;
use crate::tensor::{RawTensor, TensorArg};

/// One argument of [`Client::dispatch_args`]: a tensor the program only reads, or one it may
/// write, whole or as a byte range ([`DispatchArg::view`]).
pub enum DispatchArg<'a> {
    /// A tensor the program only reads (it must stand where the design only reads, see
    /// [`Program::read_only_args`]).
    Read {
        tensor: &'a dyn TensorArg,
        offset: u64,
        len: u64,
    },
    /// A tensor the program may write; lent to the daemon until it answers.
    Write {
        tensor: &'a mut dyn TensorArg,
        offset: u64,
        len: u64,
    },
}

impl std::fmt::Debug for DispatchArg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (offset, len) = self.range();
        let kind = match self {
            DispatchArg::Read { .. } => "Read",
            DispatchArg::Write { .. } => "Write",
        };
        f.debug_struct(kind)
            .field("tensor", &self.raw().id)
            .field("offset", &offset)
            .field("len", &len)
            .finish()
    }
}

impl<'a> DispatchArg<'a> {
    /// The whole of a tensor the program only reads.
    pub fn read(tensor: &'a dyn TensorArg) -> Self {
        DispatchArg::Read {
            tensor,
            offset: 0,
            len: 0,
        }
    }

    /// The whole of a tensor the program may write.
    pub fn write(tensor: &'a mut dyn TensorArg) -> Self {
        DispatchArg::Write {
            tensor,
            offset: 0,
            len: 0,
        }
    }

    /// The same argument narrowed to `len` bytes from byte `offset` of its tensor.
    #[must_use]
    pub fn view(self, offset: u64, len: u64) -> Self {
        match self {
            DispatchArg::Read { tensor, .. } => DispatchArg::Read {
                tensor,
                offset,
                len,
            },
            DispatchArg::Write { tensor, .. } => DispatchArg::Write {
                tensor,
                offset,
                len,
            },
        }
    }

    fn raw(&self) -> &RawTensor {
        match self {
            DispatchArg::Read { tensor, .. } => tensor.raw(),
            DispatchArg::Write { tensor, .. } => tensor.raw(),
        }
    }

    fn range(&self) -> (u64, u64) {
        match self {
            DispatchArg::Read { offset, len, .. } | DispatchArg::Write { offset, len, .. } => {
                (*offset, *len)
            }
        }
    }
}

impl Client {
    /// Runs `program` once over `args`, in the design's order, and waits for the device; each
    /// argument is a whole tensor or a byte range of one ([`DispatchArg::view`]). As
    /// [`Client::dispatch`] otherwise (which is this call with whole tensors, reads first).
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for a tensor of another session, a read argument where the
    /// design may write, or a range outside its tensor (nothing is sent); otherwise as
    /// [`Client::dispatch`].
    pub async fn dispatch_args(
        &self,
        program: &Program,
        args: Vec<DispatchArg<'_>>,
    ) -> Result<DispatchResult, ClientError> {
        let most = program.read_only_args();
        for (i, a) in args.iter().enumerate() {
            let (offset, len) = a.range();
            let raw = a.raw();
            let end = offset.checked_add(if len == 0 { 1 } else { len });
            if end.is_none_or(|end| end > raw.bytes) {
                return Err(ClientError::Invalid(format!(
                    "args[{i}]: bytes {offset}..{} are outside tensor {} of {} bytes",
                    offset.saturating_add(len),
                    raw.id,
                    raw.bytes
                )));
            }
            if i >= most && matches!(a, DispatchArg::Read { .. }) {
                return Err(ClientError::Invalid(format!(
                    "args[{i}] (tensor {}) is passed as read, but {} may write it: {}",
                    raw.id,
                    program.name(),
                    only_reads(program)
                )));
            }
        }
        let all: Vec<&RawTensor> = args.iter().map(DispatchArg::raw).collect();
        self.check_owned(&all)?;
        let program_id = self.register(program).await?.id;
        upload_dirty(&all).await?;
        let req = link_marked(
            program_id,
            args.iter()
                .map(|a| (a.raw(), matches!(a, DispatchArg::Read { .. }), a.range())),
        );
        drop(all);
        let mut writes: Vec<&mut RawTensor> = args
            .into_iter()
            .filter_map(|a| match a {
                DispatchArg::Write { tensor, .. } => Some(tensor.raw_mut()),
                DispatchArg::Read { .. } => None,
            })
            .collect();
        let r = lent_during(
            &mut writes,
            self.inner.call("Dispatch", |mut c| {
                let req = req.clone();
                async move { c.dispatch(req).await.map(tonic::Response::into_inner) }
            }),
        )
        .await?;
        download_written(&mut writes).await?;
        Ok(DispatchResult {
            queue: Duration::from_nanos(r.queue_ns),
            device: Duration::from_nanos(r.device_ns),
        })
    }
}
