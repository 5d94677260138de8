//! [`Tensor<T>`]: typed tensor memory the daemon's device uses.
//!
//! # Local and remote, one behaviour
//!
//! On a Unix-socket connection, `AllocateTensor` hands out a ticket that the client redeems on
//! the daemon's fd socket for a file descriptor of the device memory itself; the client maps it
//! and [`Tensor::as_slice`] / [`Tensor::as_mut_slice`] read and write the memory the device uses,
//! with no copy.
//!
//! Over TCP (or when the daemon cannot export memory) the tensor lives in the daemon and the
//! client keeps a staging copy in a private memfd mapping. The staging rule makes the same code
//! give the same results either way:
//!
//! - [`Tensor::as_mut_slice`] (and [`Tensor::copy_from_slice`]) mark the tensor dirty;
//! - a dispatch or chain first uploads every dirty argument (WriteTensor), then runs, then
//!   downloads every argument (ReadTensor), so outputs read back through [`Tensor::as_slice`].
//!
//! [`Tensor::upload`] and [`Tensor::download`] do the same transfers by hand (and nothing on a
//! shared tensor).
//!
//! # The sharing contract
//!
//! The device (or the download) writes a tensor's memory only while a dispatch that names it
//! runs, and `dispatch` returns only when that is over; do not read or write a tensor from
//! another thread while a dispatch that names it is in flight (see [`npu_fd::mapping`]).
//!
//! A tensor is freed on the daemon when it is dropped (in the background) or by
//! [`Tensor::free`]; all of a session's tensors are freed when the session ends.

use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use npu_artifacts::emu::DType;
use npu_fd::Mapping;
use npu_fd::wire::{Ticket, client as fdclient};
use npu_proto::v1 as pb;

use crate::ClientError;
use crate::session::Inner;

mod sealed {
    pub trait Sealed {}
}

/// Element types of tensors: the types IRON designs use.
pub trait Element: bytemuck::Pod + Send + Sync + fmt::Debug + sealed::Sealed {
    /// The matching dtype of emulated designs.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(u8 => U8, i8 => I8, i16 => I16, i32 => I32, u32 => U32, f32 => F32, half::bf16 => Bf16);

/// Largest WriteTensor chunk the client sends.
const CHUNK_BYTES: usize = 1 << 20;
/// How long the fd socket may take to answer.
const FD_TIMEOUT: Duration = Duration::from_secs(10);

/// A typed tensor in a session. See the [module docs](self).
pub struct Tensor<T: Element> {
    raw: RawTensor,
    len: usize,
    _t: PhantomData<T>,
}

/// The untyped part of a tensor, shared with dispatch.
#[doc(hidden)]
#[derive(Debug)]
pub struct RawTensor {
    pub(crate) id: u64,
    pub(crate) bytes: u64,
    pub(crate) inner: Arc<Inner>,
    mem: Mapping,
    staging: Option<Staging>,
    freed: bool,
}

#[derive(Debug)]
struct Staging {
    fd: OwnedFd,
    dirty: AtomicBool,
}

/// A tensor (of any element type) passed to a dispatch.
///
/// Implemented by [`Tensor`]; a slice `&[&a, &b]` of tensors of different element types
/// coerces to `&[&dyn TensorArg]`.
pub trait TensorArg: Sync {
    /// The untyped tensor.
    #[doc(hidden)]
    fn raw(&self) -> &RawTensor;
}

impl<T: Element> TensorArg for Tensor<T> {
    fn raw(&self) -> &RawTensor {
        &self.raw
    }
}

impl<T: Element> Tensor<T> {
    pub(crate) async fn allocate(
        inner: &Arc<Inner>,
        len: usize,
        name: &str,
    ) -> Result<Tensor<T>, ClientError> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                ClientError::Invalid(format!(
                    "a tensor of {len} {} elements: expected at least one, and a size that fits",
                    T::DTYPE
                ))
            })?;
        let req = pb::AllocateTensorRequest {
            size_bytes: bytes as u64,
            name: name.to_owned(),
        };
        let r = inner
            .call("AllocateTensor", |mut c| {
                let req = req.clone();
                async move {
                    c.allocate_tensor(req)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await?;
        let id = r.tensor_id;
        let made = if r.fd_ticket.is_empty() {
            staged(bytes, id)
        } else {
            shared(r, bytes).await
        };
        let (mem, staging) = match made {
            Ok(m) => m,
            Err(e) => {
                free_in_background(inner, id);
                return Err(e);
            }
        };
        let t = Tensor {
            raw: RawTensor {
                id,
                bytes: bytes as u64,
                inner: inner.clone(),
                mem,
                staging,
                freed: false,
            },
            len,
            _t: PhantomData,
        };
        // The view's alignment and length are checked once here; as_slice relies on it.
        t.raw
            .mem
            .as_slice_of::<T>()
            .map_err(ClientError::fd(format!(
                "viewing tensor {id} as {}",
                T::DTYPE
            )))?;
        Ok(t)
    }

    /// Number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: tensors have at least one element.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    #[must_use]
    pub fn size_bytes(&self) -> u64 {
        self.raw.bytes
    }

    /// The daemon's tensor id.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.raw.id
    }

    /// Whether the memory is shared with the device by fd (no copies); false for a staged
    /// (remote) tensor.
    #[must_use]
    pub fn is_shared(&self) -> bool {
        self.raw.staging.is_none()
    }

    /// The elements.
    #[must_use]
    pub fn as_slice(&self) -> &[T] {
        self.raw
            .mem
            .as_slice_of::<T>()
            .expect("the view was checked when the tensor was made")
    }

    /// The elements, writable; marks a staged tensor dirty, so the next dispatch uploads it.
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        if let Some(s) = &self.raw.staging {
            s.dirty.store(true, Ordering::SeqCst);
        }
        self.raw
            .mem
            .as_mut_slice_of::<T>()
            .expect("a writable view was checked when the tensor was made")
    }

    /// Copies `src` in (it must have [`Tensor::len`] elements).
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for a length mismatch.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<(), ClientError> {
        if src.len() != self.len {
            return Err(ClientError::Invalid(format!(
                "copying {} elements into a tensor of {}",
                src.len(),
                self.len
            )));
        }
        self.as_mut_slice().copy_from_slice(src);
        Ok(())
    }

    /// The start of the tensor's mapping ([`Tensor::size_bytes`] bytes, readable and writable
    /// while the tensor lives), for handing the memory to foreign code: the Python package's
    /// numpy arrays are views over it, and keep the tensor alive.
    ///
    /// Writes through the pointer follow the sharing contract of the [module docs](self), and
    /// do not mark a staged tensor dirty: call [`Tensor::upload`] before the dispatch.
    #[must_use]
    pub fn mapping_ptr(&self) -> *mut u8 {
        self.raw.mem.as_ptr().cast_mut()
    }

    /// The elements, copied.
    #[must_use]
    pub fn to_vec(&self) -> Vec<T> {
        self.as_slice().to_vec()
    }

    /// Uploads a staged tensor's bytes now (nothing for a shared tensor).
    ///
    /// # Errors
    ///
    /// The daemon's refusal or a transport error.
    pub async fn upload(&self) -> Result<(), ClientError> {
        self.raw.upload(true).await
    }

    /// Downloads a staged tensor's bytes now (nothing for a shared tensor).
    ///
    /// # Errors
    ///
    /// The daemon's refusal or a transport error.
    pub async fn download(&self) -> Result<(), ClientError> {
        self.raw.download().await
    }

    /// Frees the tensor on the daemon now and waits for the answer.
    ///
    /// # Errors
    ///
    /// The daemon's refusal or a transport error.
    pub async fn free(mut self) -> Result<(), ClientError> {
        self.raw.freed = true;
        free(&self.raw.inner, self.raw.id).await
    }
}

impl<T: Element> fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("id", &self.raw.id)
            .field("dtype", &T::DTYPE)
            .field("len", &self.len)
            .field("shared", &self.is_shared())
            .finish()
    }
}

impl Drop for RawTensor {
    fn drop(&mut self) {
        if !self.freed {
            free_in_background(&self.inner, self.id);
        }
    }
}

impl RawTensor {
    /// Whether the tensor's bytes move through the API (a remote connection) rather than being
    /// shared in place.
    pub(crate) fn is_staged(&self) -> bool {
        self.staging.is_some()
    }

    /// Uploads a staged tensor when it is dirty (or always, with `force`).
    pub(crate) async fn upload(&self, force: bool) -> Result<(), ClientError> {
        let Some(s) = &self.staging else {
            return Ok(());
        };
        if !force && !s.dirty.load(Ordering::SeqCst) {
            return Ok(());
        }
        s.dirty.store(false, Ordering::SeqCst);
        let max = usize::try_from(
            self.inner
                .device
                .limits
                .as_ref()
                .map_or(0, |l| l.max_message_bytes),
        )
        .unwrap_or(usize::MAX);
        let chunk = CHUNK_BYTES.min((max / 2).max(4096));
        let bytes = self.mem.as_slice();
        let id = self.id;
        let r = self
            .inner
            .call("WriteTensor", |mut c| {
                let chunks: Vec<pb::WriteTensorChunk> = bytes
                    .chunks(chunk)
                    .enumerate()
                    .map(|(i, data)| pb::WriteTensorChunk {
                        tensor_id: id,
                        offset: (i * chunk) as u64,
                        data: data.to_vec(),
                    })
                    .collect();
                async move {
                    c.write_tensor(tokio_stream::iter(chunks))
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await;
        if r.is_err() {
            s.dirty.store(true, Ordering::SeqCst);
        }
        r.map(|_| ())
    }

    /// Downloads a staged tensor into its staging mapping.
    pub(crate) async fn download(&self) -> Result<(), ClientError> {
        let Some(s) = &self.staging else {
            return Ok(());
        };
        let id = self.id;
        let chunks = self
            .inner
            .call("ReadTensor", |mut c| async move {
                let mut stream = c
                    .read_tensor(pb::ReadTensorRequest {
                        tensor_id: id,
                        offset: 0,
                        length: 0,
                        chunk_bytes: 0,
                    })
                    .await?
                    .into_inner();
                let mut chunks = Vec::new();
                while let Some(chunk) = stream.message().await? {
                    chunks.push(chunk);
                }
                Ok(chunks)
            })
            .await?;
        let len = self.mem.len();
        let mut target = Mapping::new(s.fd.as_fd(), 0, len).map_err(ClientError::fd(format!(
            "mapping tensor {id}'s staging copy"
        )))?;
        let dst = target.as_mut_slice().map_err(ClientError::fd(format!(
            "writing tensor {id}'s staging copy"
        )))?;
        let mut got = 0_usize;
        for c in chunks {
            let start = usize::try_from(c.offset).unwrap_or(usize::MAX);
            let end = start.saturating_add(c.data.len());
            if end > len {
                return Err(ClientError::Invalid(format!(
                    "ReadTensor of tensor {id} sent bytes {start}..{end} of a {len}-byte tensor"
                )));
            }
            dst[start..end].copy_from_slice(&c.data);
            got += c.data.len();
        }
        if got != len {
            return Err(ClientError::Invalid(format!(
                "ReadTensor of tensor {id} sent {got} of its {len} bytes"
            )));
        }
        s.dirty.store(false, Ordering::SeqCst);
        Ok(())
    }
}

/// A staged tensor: a private sealed memfd the client maps.
fn staged(bytes: usize, id: u64) -> Result<(Mapping, Option<Staging>), ClientError> {
    let what = || format!("creating tensor {id}'s staging copy");
    let fd = npu_fd::memfd::create("npu-client-staging", bytes as u64)
        .map_err(ClientError::fd(what()))?;
    let mem = Mapping::new(fd.as_fd(), 0, bytes).map_err(ClientError::fd(what()))?;
    Ok((
        mem,
        Some(Staging {
            fd,
            dirty: AtomicBool::new(false),
        }),
    ))
}

/// A shared tensor: redeem the ticket on the fd socket and map the fd.
async fn shared(
    r: pb::AllocateTensorResponse,
    bytes: usize,
) -> Result<(Mapping, Option<Staging>), ClientError> {
    let id = r.tensor_id;
    let path = r.fd_socket.clone();
    let shown = r.fd_socket;
    let what = move || format!("sharing tensor {id} through {shown}");
    let ticket = Ticket::from_slice(&r.fd_ticket).map_err(ClientError::fd(what()))?;
    let redeemed = tokio::task::spawn_blocking(move || {
        let sock = UnixStream::connect(&path).map_err(|e| npu_fd::FdError::Sys {
            call: "connect",
            source: e,
        })?;
        let _ = sock.set_read_timeout(Some(FD_TIMEOUT));
        let _ = sock.set_write_timeout(Some(FD_TIMEOUT));
        fdclient::redeem_export(&sock, &ticket)
    })
    .await
    .map_err(|e| ClientError::Invalid(format!("the fd-socket task failed: {e}")))?;
    let (fd, offset, size) = redeemed.map_err(ClientError::fd(what()))?;
    if size != bytes as u64 {
        return Err(ClientError::Invalid(format!(
            "the fd socket gave tensor {id} as {size} bytes; {bytes} were allocated"
        )));
    }
    let mem = Mapping::new(fd.as_fd(), offset, bytes).map_err(ClientError::fd(what()))?;
    Ok((mem, None))
}

async fn free(inner: &Inner, id: u64) -> Result<(), ClientError> {
    inner
        .call("FreeTensor", |mut c| async move {
            c.free_tensor(pb::FreeTensorRequest { tensor_id: id })
                .await
                .map(tonic::Response::into_inner)
        })
        .await
        .map(|_| ())
}

fn free_in_background(inner: &Arc<Inner>, id: u64) {
    let inner = inner.clone();
    // Nothing to do when the runtime is gone: the session's end frees the tensor.
    drop(inner.runtime.clone().spawn(async move {
        if let Err(e) = free(&inner, id).await {
            tracing::debug!(tensor = id, error = %e, "freeing a dropped tensor failed");
        }
    }));
}
