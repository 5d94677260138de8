//! `npud._npud.RawTensor`: a tensor's memory through the buffer protocol, and the lock the
//! Rust calls take it through.

use std::ffi::c_int;
use std::sync::Arc;

use npu_client::Tensor;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::runtime::{forked, pid, wait};

/// The tensors behind `args`, in whatever collection the caller keeps them.
pub(crate) fn tensors<C: FromIterator<Arc<Shared>>>(args: &[Bound<'_, RawTensor>]) -> PyResult<C> {
    args.iter().map(shared).collect()
}

/// The tensor behind `a`, refused in a forked child.
pub(crate) fn shared(a: &Bound<'_, RawTensor>) -> PyResult<Arc<Shared>> {
    let t = &a.get().tensor;
    t.check_fork()?;
    Ok(t.clone())
}

/// A tensor Python holds. Python reaches its bytes only through the raw pointer of the buffer
/// protocol, never through a Rust view. The Rust calls take the tensor through a read/write
/// lock: an argument the design only reads ([`NativeProgram::read_only_args`]) shares it, one
/// the device may write (and a download) holds it alone, so two calls that write one tensor,
/// or one writes what the other reads, run one after the other, in the order they were made.
pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) len: usize,
    pub(crate) shared: bool,
    pub(crate) ptr: usize,
    pub(crate) tensor: Arc<tokio::sync::RwLock<Tensor<u8>>>,
    /// The process that made it: its connection does not survive a fork.
    pub(crate) pid: u32,
}

impl Shared {
    pub(crate) fn new(t: Tensor<u8>) -> Self {
        Self {
            id: t.id(),
            len: t.len(),
            shared: t.is_shared(),
            ptr: t.mapping_ptr() as usize,
            tensor: Arc::new(tokio::sync::RwLock::new(t)),
            pid: pid(),
        }
    }

    pub(crate) fn check_fork(&self) -> PyResult<()> {
        if self.pid == pid() {
            Ok(())
        } else {
            Err(forked("npud tensor"))
        }
    }
}

/// A locked tensor: shared for an argument only read, exclusive for one that may be written.
pub(crate) enum Held {
    Read(tokio::sync::OwnedRwLockReadGuard<Tensor<u8>>),
    Write(tokio::sync::OwnedRwLockWriteGuard<Tensor<u8>>),
}

impl Held {
    pub(crate) fn tensor(&self) -> &Tensor<u8> {
        match self {
            Held::Read(g) => g,
            Held::Write(g) => g,
        }
    }
}

/// A tensor's memory: the buffer protocol gives its bytes (no copy), and the `npud` package
/// views them as a numpy array.
#[pyclass(frozen, module = "npud._npud")]
pub(crate) struct RawTensor {
    pub(crate) tensor: Arc<Shared>,
}

impl RawTensor {
    pub(crate) fn new(t: Tensor<u8>) -> Self {
        Self {
            tensor: Arc::new(Shared::new(t)),
        }
    }
}

#[pymethods]
impl RawTensor {
    #[getter]
    fn id(&self) -> u64 {
        self.tensor.id
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.tensor.len
    }

    /// Whether the memory is the device's, shared by fd (false: staged through the API).
    #[getter]
    fn shared(&self) -> bool {
        self.tensor.shared
    }

    /// The address of the first byte of the mapping.
    #[getter]
    fn address(&self) -> usize {
        self.tensor.ptr
    }

    /// Sends a staged tensor's bytes to the daemon now (nothing for a shared one).
    fn upload(&self, py: Python<'_>) -> PyResult<()> {
        self.tensor.check_fork()?;
        let t = self.tensor.clone();
        wait(py, async move { t.tensor.read().await.upload().await })
    }

    /// Reads a staged tensor's bytes from the daemon now (nothing for a shared one).
    fn download(&self, py: Python<'_>) -> PyResult<()> {
        self.tensor.check_fork()?;
        let t = self.tensor.clone();
        wait(py, async move { t.tensor.write().await.download().await })
    }

    /// # Safety
    ///
    /// Called by Python with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let t = &slf.get().tensor;
        let len = isize::try_from(t.len)
            .map_err(|_| PyValueError::new_err("the tensor is larger than a buffer can be"))?;
        // SAFETY: `view` is Python's to fill; the pointer is the tensor's mapping, `len` bytes,
        // readable and writable (npu-client maps tensors read-write), and FillInfo stores a
        // new reference to `slf` in the view, so the RawTensor (which owns the mapping) lives
        // until the last view is released.
        let r = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(view, slf.as_ptr(), t.ptr as *mut _, len, 0, flags)
        };
        if r == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(slf.py()))
        }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

    fn __repr__(&self) -> String {
        format!(
            "RawTensor(id={}, nbytes={}, shared={})",
            self.tensor.id, self.tensor.len, self.tensor.shared
        )
    }
}
