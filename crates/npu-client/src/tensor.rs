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
//!   downloads every argument it writes (ReadTensor), so outputs read back through
//!   [`Tensor::as_slice`].
//!
//! [`Tensor::upload`] and [`Tensor::download`] do the same transfers by hand (and nothing on a
//! shared tensor).
//!
//! # What a view guarantees
//!
//! A view ([`Tensor::as_slice`], [`Tensor::as_mut_slice`]) borrows the tensor, and everything
//! that writes a tensor takes it as `&mut`: [`Tensor::download`], [`Tensor::copy_from_slice`],
//! and every dispatch, chain link or pipelined dispatch, for the tensors it writes (its
//! `writes`). So the borrow checker keeps a view from living across anything that changes the
//! bytes under it:
//!
//! ```compile_fail,E0502
//! # async fn f(client: &npu_client::Client, p: &npu_client::Program) -> Result<(), npu_client::ClientError> {
//! let input = client.alloc::<i32>(64).await?;
//! let mut output = client.alloc::<i32>(64).await?;
//! let seen = output.as_slice();
//! client.dispatch(p, &[&input], &mut [&mut output]).await?; // writes `output`
//! assert_eq!(seen[0], 0);
//! # Ok(()) }
//! ```
//!
//! ```compile_fail,E0502
//! # async fn f(t: &mut npu_client::Tensor<i32>) -> Result<(), npu_client::ClientError> {
//! let seen = t.as_slice();
//! t.download().await?;
//! assert_eq!(seen[0], 0);
//! # Ok(()) }
//! ```
//!
//! The daemon is another process, so the borrow alone does not stop it. What does is the
//! protocol: npud writes a shared tensor's memory only while a call that names it in `writes`
//! is in flight, and the library marks the tensor lent ([`npu_fd::ClientMemory::lend`]) from
//! before it sends such a call until the daemon has answered it. A call that ends without the
//! daemon's answer (its future dropped, a pipeline dropped with the dispatch in flight, a
//! timeout, a broken connection) leaves its written tensors lent for good, since nothing then
//! says when the daemon stops writing: their views panic (see [`Tensor::as_slice`]) and their
//! copies fail; free them and allocate others. [`Tensor::is_lent`] tells. A staged tensor is
//! never lent: the daemon does not map its staging copy.
//!
//! Tensors a call names in `reads` the daemon only reads; views of them stay valid during the
//! call.
//!
//! A tensor is freed on the daemon when it is dropped (in the background) or by
//! [`Tensor::free`]; all of a session's tensors are freed when the session ends.

use std::fmt;
use std::marker::PhantomData;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use npu_artifacts::emu::DType;
use npu_fd::wire::Ticket;
use npu_fd::{ClientMemory, FdError};
use npu_proto::v1 as pb;

use crate::ClientError;
use crate::session::Inner;

mod sealed {
    pub trait Sealed {}
    /// Keeps [`super::TensorArg`] to this crate's tensors.
    pub trait SealedArg {}
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
    mem: ClientMemory,
    staging: Option<Staging>,
    freed: bool,
}

#[derive(Debug)]
struct Staging {
    dirty: AtomicBool,
}

/// A tensor (of any element type) passed to a dispatch.
///
/// Implemented by [`Tensor`] only; a slice `&[&a, &b]` of tensors of different element types
/// coerces to `&[&dyn TensorArg]`, and `&mut [&mut c, &mut d]` to `&mut [&mut dyn TensorArg]`.
pub trait TensorArg: Sync + Send + sealed::SealedArg {
    /// The untyped tensor.
    #[doc(hidden)]
    fn raw(&self) -> &RawTensor;
    /// The untyped tensor, for a call that writes it.
    #[doc(hidden)]
    fn raw_mut(&mut self) -> &mut RawTensor;
}

impl<T: Element> sealed::SealedArg for Tensor<T> {}

impl<T: Element> TensorArg for Tensor<T> {
    fn raw(&self) -> &RawTensor {
        &self.raw
    }

    fn raw_mut(&mut self) -> &mut RawTensor {
        &mut self.raw
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
        t.raw.mem.view::<T>().map_err(ClientError::fd(format!(
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

    /// Whether the tensor is lent to a call the daemon never answered (see
    /// [What a view guarantees](self#what-a-view-guarantees)): its views panic and its copies
    /// fail, for good.
    #[must_use]
    pub fn is_lent(&self) -> bool {
        self.raw.mem.is_lent()
    }

    /// The elements.
    ///
    /// # Panics
    ///
    /// When the tensor is lent to a call that ended without the daemon's answer (see
    /// [What a view guarantees](self#what-a-view-guarantees) and [`Tensor::is_lent`]); the
    /// daemon may still be writing it. [`Tensor::try_as_slice`] answers an error instead.
    #[must_use]
    pub fn as_slice(&self) -> &[T] {
        match self.raw.mem.view::<T>() {
            Ok(v) => v,
            Err(e) => self.raw.view_failed(&e),
        }
    }

    /// The elements, or why they cannot be read: [`Tensor::as_slice`] without the panic, for
    /// callers that keep going after a call ended without the daemon's answer.
    ///
    /// # Errors
    ///
    /// [`ClientError::Fd`] with [`npu_fd::FdError::Lent`] while the tensor is lent to such a
    /// call (the daemon may still be writing it: free it and allocate another).
    pub fn try_as_slice(&self) -> Result<&[T], ClientError> {
        self.raw
            .mem
            .view::<T>()
            .map_err(ClientError::fd(format!("reading tensor {}", self.raw.id)))
    }

    /// The elements, writable, or why they cannot be: [`Tensor::as_mut_slice`] without the
    /// panic. Marks a staged tensor dirty only when the view is given.
    ///
    /// # Errors
    ///
    /// As [`Tensor::try_as_slice`].
    pub fn try_as_mut_slice(&mut self) -> Result<&mut [T], ClientError> {
        let id = self.raw.id;
        let view = self
            .raw
            .mem
            .view_mut::<T>()
            .map_err(ClientError::fd(format!("writing tensor {id}")))?;
        if let Some(s) = &self.raw.staging {
            s.dirty.store(true, Ordering::SeqCst);
        }
        Ok(view)
    }

    /// The elements, writable; marks a staged tensor dirty, so the next dispatch uploads it.
    ///
    /// # Panics
    ///
    /// As [`Tensor::as_slice`].
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        if let Some(s) = &self.raw.staging {
            s.dirty.store(true, Ordering::SeqCst);
        }
        let id = self.raw.id;
        match self.raw.mem.view_mut::<T>() {
            Ok(v) => v,
            Err(e) => view_failed(id, &e),
        }
    }

    /// Copies `src` in (it must have [`Tensor::len`] elements).
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for a length mismatch; [`ClientError::Fd`] for a tensor that
    /// is lent for good ([`Tensor::is_lent`]).
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<(), ClientError> {
        if src.len() != self.len {
            return Err(ClientError::Invalid(format!(
                "copying {} elements into a tensor of {}",
                src.len(),
                self.len
            )));
        }
        if let Some(s) = &self.raw.staging {
            s.dirty.store(true, Ordering::SeqCst);
        }
        let id = self.raw.id;
        self.raw
            .mem
            .write_from(0, src)
            .map_err(ClientError::fd(format!("writing tensor {id}")))
    }

    /// The start of the tensor's mapping ([`Tensor::size_bytes`] bytes, readable and writable
    /// while the tensor lives), for handing the memory to foreign code: the Python package's
    /// numpy arrays are views over it, and keep the tensor alive.
    ///
    /// Writes through the pointer follow the sharing contract of the [module docs](self), and
    /// do not mark a staged tensor dirty: call [`Tensor::upload`] before the dispatch. Foreign
    /// code that keeps the pointer is outside the borrow rules the rest of this type enforces:
    /// it must not read memory a dispatch is writing, and no Rust view of the tensor
    /// ([`Tensor::as_slice`]) may be alive while it writes (npu-fd's
    /// `ClientMemory::as_foreign_ptr`).
    #[must_use]
    pub fn mapping_ptr(&self) -> *mut u8 {
        self.raw.mem.as_foreign_ptr()
    }

    /// The elements, copied.
    ///
    /// # Panics
    ///
    /// As [`Tensor::as_slice`].
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

    /// Downloads a staged tensor's bytes now (nothing for a shared tensor). It writes the
    /// tensor, so it takes it as `&mut`: no view can live across it.
    ///
    /// # Errors
    ///
    /// The daemon's refusal or a transport error.
    pub async fn download(&mut self) -> Result<(), ClientError> {
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

    /// Marks the tensor lent to a call that names it as written; see the module docs. A staged
    /// tensor is not lent: its memory is a private copy the daemon never maps (the download
    /// after the call writes it, through `&mut self`).
    pub(crate) fn lend(&mut self) {
        if self.staging.is_none() {
            self.mem.lend();
        }
    }

    /// Takes the tensor back once the daemon has answered the call it was lent for.
    pub(crate) fn reclaim(&mut self) {
        self.mem.reclaim();
    }

    fn view_failed(&self, e: &FdError) -> ! {
        view_failed(self.id, e)
    }

    /// Uploads a staged tensor when it is dirty (or always, with `force`).
    pub(crate) async fn upload(&self, force: bool) -> Result<(), ClientError> {
        let Some(s) = &self.staging else {
            return Ok(());
        };
        if !force && !s.dirty.load(Ordering::SeqCst) {
            return Ok(());
        }
        let max = usize::try_from(
            self.inner
                .device
                .limits
                .as_ref()
                .map_or(0, |l| l.max_message_bytes),
        )
        .unwrap_or(usize::MAX);
        let chunk = CHUNK_BYTES.min((max / 2).max(4096));
        let id = self.id;
        // Copied out through raw pointers, never viewed as a slice: foreign code (a numpy array
        // over the tensor) may write the memory while this runs.
        let mut chunks: Vec<pb::WriteTensorChunk> = Vec::new();
        let mut offset = 0;
        while offset < self.mem.len() {
            let n = chunk.min(self.mem.len() - offset);
            let mut data = vec![0u8; n];
            self.mem
                .read_into(offset, &mut data)
                .map_err(ClientError::fd(format!("uploading tensor {id}")))?;
            chunks.push(pb::WriteTensorChunk {
                tensor_id: id,
                offset: offset as u64,
                data,
            });
            offset += n;
        }
        s.dirty.store(false, Ordering::SeqCst);
        let r = self
            .inner
            .call("WriteTensor", |mut c| {
                let chunks = chunks.clone();
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

    /// Downloads a staged tensor into its staging copy, through `&mut self`: no view of the
    /// copy is alive while it changes.
    pub(crate) async fn download(&mut self) -> Result<(), ClientError> {
        if self.staging.is_none() {
            return Ok(());
        }
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
        let mut got = 0_usize;
        for c in chunks {
            let start = usize::try_from(c.offset).unwrap_or(usize::MAX);
            let end = start.saturating_add(c.data.len());
            if end > len {
                return Err(ClientError::Invalid(format!(
                    "ReadTensor of tensor {id} sent bytes {start}..{end} of a {len}-byte tensor"
                )));
            }
            self.mem
                .write_from(start, &c.data)
                .map_err(ClientError::fd(format!(
                    "writing tensor {id}'s staging copy"
                )))?;
            got += c.data.len();
        }
        if got != len {
            return Err(ClientError::Invalid(format!(
                "ReadTensor of tensor {id} sent {got} of its {len} bytes"
            )));
        }
        if let Some(s) = &self.staging {
            s.dirty.store(false, Ordering::SeqCst);
        }
        Ok(())
    }
}

fn view_failed(id: u64, e: &FdError) -> ! {
    match e {
        FdError::Lent => panic!(
            "tensor {id} is lent to a call the daemon never answered (its future was dropped, \
             its pipeline was dropped with it in flight, or it timed out), so the daemon may \
             still write it; free it and allocate another"
        ),
        other => panic!("tensor {id}: the view checked at allocation failed: {other}"),
    }
}

/// A staged tensor: a private sealed memfd the client maps.
fn staged(bytes: usize, id: u64) -> Result<(ClientMemory, Option<Staging>), ClientError> {
    let mem = ClientMemory::private("npu-client-staging", bytes).map_err(ClientError::fd(
        format!("creating tensor {id}'s staging copy"),
    ))?;
    Ok((
        mem,
        Some(Staging {
            dirty: AtomicBool::new(false),
        }),
    ))
}

/// A shared tensor: redeem the ticket on the fd socket and map the fd.
async fn shared(
    r: pb::AllocateTensorResponse,
    bytes: usize,
) -> Result<(ClientMemory, Option<Staging>), ClientError> {
    let id = r.tensor_id;
    let path = r.fd_socket.clone();
    let shown = r.fd_socket;
    let what = move || format!("sharing tensor {id} through {shown}");
    let ticket = Ticket::from_slice(&r.fd_ticket).map_err(ClientError::fd(what()))?;
    let redeemed = tokio::task::spawn_blocking(move || {
        let sock = UnixStream::connect(&path).map_err(|e| FdError::Sys {
            call: "connect",
            source: e,
        })?;
        let _ = sock.set_read_timeout(Some(FD_TIMEOUT));
        let _ = sock.set_write_timeout(Some(FD_TIMEOUT));
        ClientMemory::redeem_export(&sock, &ticket, bytes)
    })
    .await
    .map_err(|e| ClientError::Invalid(format!("the fd-socket task failed: {e}")))?;
    let mem = redeemed.map_err(ClientError::fd(what()))?;
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
