//! `npud._npud`: the native half of the `npud` Python package, npu-client for Python.
//!
//! The Python half (`python/npud/__init__.py`) turns these objects into the public API: numpy
//! arrays over [`RawTensor`]s, exception classes, chains and asyncio awaitables. Everything here
//! that waits for the daemon releases the GIL; every call also has a `*_start` form that runs on
//! the package's tokio runtime and reports through a Python callback, which the Python half
//! turns into an asyncio future.
//!
//! The only unsafe code is the buffer protocol of [`RawTensor`]: it hands Python the tensor's
//! mapping (npu-client's [`npu_client::Tensor::mapping_ptr`]), and the exported buffer holds a
//! reference to the `RawTensor`, which owns the mapping, so the memory outlives every view.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use npu_client::local::{LocalDaemon as NativeDaemon, LocalOptions};
use npu_client::{ClientError, Program as NativeProgram, Tensor, TensorArg};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::{mpsc, oneshot};

/// The runtime every client of this process uses, with the pid that made it: a process forked
/// after it was made (multiprocessing's default on Linux) cannot use it, and makes its own.
static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

fn pid() -> u32 {
    rustix::process::getpid()
        .as_raw_nonzero()
        .get()
        .unsigned_abs()
}

fn runtime() -> PyResult<Arc<tokio::runtime::Runtime>> {
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    let me = pid();
    if let Some((_, rt)) = slot.as_ref().filter(|(owner, _)| *owner == me) {
        return Ok(rt.clone());
    }
    // A runtime inherited through fork has no threads: it can neither run nor be dropped
    // (dropping waits for them), so it is forgotten.
    if let Some(old) = slot.take() {
        std::mem::forget(old);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("npud-python")
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("starting the client's runtime: {e}")))?;
    let rt = Arc::new(rt);
    *slot = Some((me, rt.clone()));
    Ok(rt)
}

/// Converts a client error into the package's exception (see `npud/_errors.py`).
fn to_pyerr(py: Python<'_>, e: &ClientError) -> PyErr {
    let (kind, extra) = match e {
        ClientError::Daemon { .. } => ("daemon", None),
        ClientError::SessionLost { session, .. } => ("session_lost", Some(vec![*session])),
        ClientError::Address { .. } => ("address", None),
        ClientError::LocalDaemon { .. } => ("local_daemon", None),
        ClientError::Connect { .. } => ("connect", None),
        ClientError::Timeout { .. } => ("timeout", None),
        ClientError::Fd { .. } => ("fd", None),
        ClientError::Artifact(_) => ("artifact", None),
        ClientError::Io { .. } => ("io", None),
        ClientError::NoHealthyHost { .. } => ("no_healthy_host", None),
        ClientError::Invalid(_) => ("invalid", None),
        ClientError::ChainFailed { index, not_run, .. } => (
            "chain_failed",
            Some(
                std::iter::once(u64::from(*index))
                    .chain(not_run.iter().map(|&i| u64::from(i)))
                    .collect(),
            ),
        ),
        _ => ("other", None),
    };
    let call = match e {
        ClientError::Daemon { call, .. }
        | ClientError::SessionLost { call, .. }
        | ClientError::Timeout { call, .. } => Some(*call),
        _ => None,
    };
    let code = e.code().map(|c| c as i32);
    let made = py.import("npud._errors").and_then(|m| {
        m.getattr("_from_native")?.call1((
            kind,
            code,
            call,
            e.daemon_message(),
            e.to_string(),
            extra,
        ))
    });
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(err) => err,
    }
}

/// Runs `fut` on the runtime with the GIL released, and waits for it.
fn wait<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send,
    F: Future<Output = Result<T, ClientError>> + Send,
{
    let rt = runtime()?;
    py.detach(|| rt.block_on(fut)).map_err(|e| to_pyerr(py, &e))
}

/// Runs `fut` on the runtime and calls `callback(result, None)` or `callback(None, exception)`
/// with its outcome, from a runtime thread.
fn start<T, F>(fut: F, callback: Py<PyAny>) -> PyResult<()>
where
    T: for<'py> IntoPyObject<'py> + Send + 'static,
    F: Future<Output = Result<T, ClientError>> + Send + 'static,
{
    let rt = runtime()?;
    drop(rt.spawn(async move {
        let outcome = fut.await;
        Python::attach(|py| {
            let called = match outcome {
                Ok(v) => callback.call1(py, (v, py.None())),
                Err(e) => callback.call1(py, (py.None(), to_pyerr(py, &e).into_value(py))),
            };
            if let Err(e) = called {
                e.write_unraisable(py, None);
            }
        });
    }));
    Ok(())
}

/// A session on npud (npu-client's `Client`).
#[pyclass(frozen, module = "npud._npud")]
struct Client {
    client: npu_client::Client,
    /// The process that connected: the connection does not survive a fork.
    pid: u32,
}

impl Client {
    fn get(&self) -> PyResult<npu_client::Client> {
        if self.pid != pid() {
            return Err(PyRuntimeError::new_err(
                "this npud.Client was made before the process forked; its connection belongs \
                 to the parent: make a new npud.Client in this process",
            ));
        }
        Ok(self.client.clone())
    }
}

/// Timing of one dispatch: (queue_ns, device_ns).
type Timing = (u64, u64);

fn timing(r: npu_client::DispatchResult) -> Timing {
    (
        u64::try_from(r.queue.as_nanos()).unwrap_or(u64::MAX),
        u64::try_from(r.device.as_nanos()).unwrap_or(u64::MAX),
    )
}

fn tensors(args: &[Bound<'_, RawTensor>]) -> PyResult<Vec<Arc<Shared>>> {
    args.iter()
        .map(|a| {
            let t = &a.get().tensor;
            t.check_fork()?;
            Ok(t.clone())
        })
        .collect()
}

/// The error for an object used in a process forked after it was made: its connection (and
/// the runtime that serves it) belong to the parent, and waiting on them would never end.
fn forked(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "this {what} was made before the process forked; its connection belongs to the parent \
         process: make a new npud.Client in this process (and its tensors and pipelines)"
    ))
}

/// A tensor Python holds. Python reaches its bytes only through the raw pointer of the buffer
/// protocol, never through a Rust view. The Rust calls take the tensor through a read/write
/// lock: an argument the design only reads ([`NativeProgram::read_only_args`]) shares it, one
/// the device may write (and a download) holds it alone, so two calls that write one tensor,
/// or one writes what the other reads, run one after the other, in the order they were made.
struct Shared {
    id: u64,
    len: usize,
    shared: bool,
    ptr: usize,
    tensor: Arc<tokio::sync::RwLock<Tensor<u8>>>,
    /// The process that made it: its connection does not survive a fork.
    pid: u32,
}

impl Shared {
    fn new(t: Tensor<u8>) -> Self {
        Self {
            id: t.id(),
            len: t.len(),
            shared: t.is_shared(),
            ptr: t.mapping_ptr() as usize,
            tensor: Arc::new(tokio::sync::RwLock::new(t)),
            pid: pid(),
        }
    }

    fn check_fork(&self) -> PyResult<()> {
        if self.pid == pid() {
            Ok(())
        } else {
            Err(forked("npud tensor"))
        }
    }
}

/// A locked tensor: shared for an argument only read, exclusive for one that may be written.
enum Held {
    Read(tokio::sync::OwnedRwLockReadGuard<Tensor<u8>>),
    Write(tokio::sync::OwnedRwLockWriteGuard<Tensor<u8>>),
}

impl Held {
    fn tensor(&self) -> &Tensor<u8> {
        match self {
            Held::Read(g) => g,
            Held::Write(g) => g,
        }
    }
}

/// The locks one call holds: each distinct tensor once, and for each argument the index of
/// its lock.
struct Locked {
    held: Vec<Held>,
    index: Vec<usize>,
}

/// Locks the distinct tensors of `args` (`args[i]` for `i < reads` only read), in id order so
/// that concurrent calls cannot deadlock. A tensor read at one position and written at another
/// is locked for writing.
async fn lock_args(args: &[Arc<Shared>], reads: usize) -> Locked {
    let mut distinct: Vec<(&Arc<Shared>, bool)> = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let write = i >= reads;
        match distinct.iter_mut().find(|(d, _)| d.id == a.id) {
            Some((_, w)) => *w |= write,
            None => distinct.push((a, write)),
        }
    }
    distinct.sort_by_key(|(d, _)| d.id);
    let mut held = Vec::with_capacity(distinct.len());
    for (d, write) in &distinct {
        let lock = Arc::clone(&d.tensor);
        held.push(if *write {
            Held::Write(lock.write_owned().await)
        } else {
            Held::Read(lock.read_owned().await)
        });
    }
    let index = args
        .iter()
        .map(|a| distinct.iter().position(|(d, _)| d.id == a.id).unwrap_or(0))
        .collect();
    Locked { held, index }
}

/// Uploads every staged argument: Python writes a numpy view without the dirty mark the Rust
/// API sets, so a staged argument is always uploaded before the work (and, as in the Rust
/// client, every written one is downloaded after it).
async fn upload_staged(l: &Locked) -> Result<(), ClientError> {
    for h in &l.held {
        let t = h.tensor();
        if !t.is_shared() {
            t.upload().await?;
        }
    }
    Ok(())
}

/// Runs one dispatch over locked arguments.
async fn dispatch_locked(
    client: &npu_client::Client,
    program: &NativeProgram,
    mut l: Locked,
) -> Result<Timing, ClientError> {
    upload_staged(&l).await?;
    let n = l.index.len();
    let mut slots: Vec<Option<Held>> = l.held.drain(..).map(Some).collect();
    // Each position takes its tensor's lock; a distinct tensor stands at one position only
    // (checked by the caller), so every slot is taken once.
    let mut args: Vec<Held> = Vec::with_capacity(n);
    for &i in &l.index {
        args.push(slots[i].take().ok_or_else(|| {
            ClientError::Invalid(
                "one tensor stands at two argument positions of one dispatch; npud's client \
                 lends each tensor to one position: use separate tensors, or a chain"
                    .into(),
            )
        })?);
    }
    let mut reads: Vec<&dyn TensorArg> = Vec::new();
    let mut writes: Vec<&mut dyn TensorArg> = Vec::new();
    for h in &mut args {
        match h {
            Held::Read(g) if writes.is_empty() => reads.push(&**g as &dyn TensorArg),
            Held::Read(_) => {
                return Err(ClientError::Invalid(
                    "a read-only argument after a written one".into(),
                ));
            }
            Held::Write(g) => writes.push(&mut **g as &mut dyn TensorArg),
        }
    }
    client
        .dispatch(program, &reads, &mut writes)
        .await
        .map(timing)
}

async fn dispatch(
    client: npu_client::Client,
    program: NativeProgram,
    args: Vec<Arc<Shared>>,
) -> Result<Timing, ClientError> {
    let l = lock_args(&args, program.read_only_args()).await;
    dispatch_locked(&client, &program, l).await
}

/// (completed, queue_ns, device_ns, doorbells).
type ChainTiming = (u32, u64, u64, u32);

async fn chain(
    client: npu_client::Client,
    links: Vec<(NativeProgram, Vec<Arc<Shared>>)>,
) -> Result<ChainTiming, ClientError> {
    // A tensor only read by every link that names it is shared; any other is written.
    let mut all: Vec<Arc<Shared>> = Vec::new();
    let mut written: Vec<u64> = Vec::new();
    for (p, a) in &links {
        for (i, t) in a.iter().enumerate() {
            if i >= p.read_only_args() {
                written.push(t.id);
            }
            all.push(Arc::clone(t));
        }
    }
    let mut order: Vec<Arc<Shared>> = all
        .iter()
        .filter(|t| !written.contains(&t.id))
        .cloned()
        .collect();
    let reads = order.len();
    order.extend(all.iter().filter(|t| written.contains(&t.id)).cloned());
    let mut l = lock_args(&order, reads).await;
    upload_staged(&l).await?;
    let mut b = client.chain();
    let handles: Vec<npu_client::ChainArg> = l
        .held
        .iter_mut()
        .map(|h| match h {
            Held::Read(g) => b.read(&**g),
            Held::Write(g) => b.write(&mut **g),
        })
        .collect();
    for (p, a) in &links {
        let args: Vec<npu_client::ChainArg> = a
            .iter()
            .map(|t| {
                let at = order.iter().position(|o| o.id == t.id).unwrap_or(0);
                handles[l.index[at]]
            })
            .collect();
        b.then(p, &args);
    }
    let r = b.run().await?.ok()?;
    Ok((
        r.completed,
        u64::try_from(r.queue.as_nanos()).unwrap_or(u64::MAX),
        u64::try_from(r.device.as_nanos()).unwrap_or(u64::MAX),
        r.doorbells,
    ))
}

type Links<'py> = Vec<(Bound<'py, Program>, Vec<Bound<'py, RawTensor>>)>;

fn links(l: &Links<'_>) -> PyResult<Vec<(NativeProgram, Vec<Arc<Shared>>)>> {
    l.iter()
        .map(|(p, a)| Ok((p.get().program.clone(), tensors(a)?)))
        .collect()
}

/// Connect options from the keyword arguments: TLS files, the server name, an identity token.
fn connect_options(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    tls_server_name: Option<String>,
    token_file: Option<PathBuf>,
    token: Option<String>,
) -> npu_client::ConnectOptions {
    npu_client::ConnectOptions {
        tls_ca: ca,
        tls_cert: cert,
        tls_key: key,
        tls_domain: tls_server_name,
        token_file,
        token,
        ..npu_client::ConnectOptions::default()
    }
}

#[pymethods]
impl Client {
    /// Connects to npud and opens a session (the GIL is released while it connects).
    #[new]
    #[pyo3(signature = (addr=None, *, ca=None, cert=None, key=None, tls_server_name=None, token_file=None, token=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        addr: Option<String>,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        tls_server_name: Option<String>,
        token_file: Option<PathBuf>,
        token: Option<String>,
    ) -> PyResult<Self> {
        let opts = connect_options(ca, cert, key, tls_server_name, token_file, token);
        let client = wait(py, async move {
            npu_client::Client::connect_with(addr.as_deref(), opts).await
        })?;
        Ok(Self { client, pid: pid() })
    }

    #[staticmethod]
    #[pyo3(signature = (addr, callback, *, ca=None, cert=None, key=None, tls_server_name=None, token_file=None, token=None))]
    #[allow(clippy::too_many_arguments)]
    fn connect_start(
        addr: Option<String>,
        callback: Py<PyAny>,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        tls_server_name: Option<String>,
        token_file: Option<PathBuf>,
        token: Option<String>,
    ) -> PyResult<()> {
        let opts = connect_options(ca, cert, key, tls_server_name, token_file, token);
        start(
            async move {
                let client = npu_client::Client::connect_with(addr.as_deref(), opts).await?;
                Ok(Client { client, pid: pid() })
            },
            callback,
        )
    }

    #[getter]
    fn session_id(&self) -> u64 {
        self.client.session_id()
    }

    #[getter]
    fn address(&self) -> String {
        self.client.address().to_string()
    }

    #[getter]
    fn is_local(&self) -> bool {
        self.client.is_local()
    }

    #[getter]
    fn generation(&self) -> &'static str {
        match self.client.generation() {
            npu_client::NpuGen::Npu1 => "npu1",
            npu_client::NpuGen::Npu2 => "npu2",
        }
    }

    #[getter]
    fn reconnects(&self) -> u64 {
        self.client.reconnects()
    }

    fn device_info_json(&self, py: Python<'_>) -> PyResult<String> {
        let c = self.get()?;
        wait(py, async move { c.device_info().await })
            .map(|d| npu_client::json::device_json(&d).to_string())
    }

    fn device_info_start(&self, callback: Py<PyAny>) -> PyResult<()> {
        let c = self.get()?;
        start(
            async move {
                c.device_info()
                    .await
                    .map(|d| npu_client::json::device_json(&d).to_string())
            },
            callback,
        )
    }

    fn statistics_json(&self, py: Python<'_>) -> PyResult<String> {
        let c = self.get()?;
        wait(py, async move { c.statistics().await })
            .map(|s| npu_client::json::statistics_json(&s).to_string())
    }

    fn statistics_start(&self, callback: Py<PyAny>) -> PyResult<()> {
        let c = self.get()?;
        start(
            async move {
                c.statistics()
                    .await
                    .map(|s| npu_client::json::statistics_json(&s).to_string())
            },
            callback,
        )
    }

    /// Registers `program` (once per session); returns (program_id, content_hash, newly_stored).
    fn register(&self, py: Python<'_>, program: &Program) -> PyResult<(u64, String, bool)> {
        let c = self.get()?;
        let p = program.program.clone();
        let info = wait(py, async move { c.register(&p).await })?;
        Ok((info.id, info.content_hash, info.newly_stored))
    }

    fn alloc(&self, py: Python<'_>, nbytes: usize, name: &str) -> PyResult<RawTensor> {
        let c = self.get()?;
        let name = name.to_owned();
        let t = wait(py, async move { c.alloc_named::<u8>(&name, nbytes).await })?;
        Ok(RawTensor::new(t))
    }

    fn alloc_start(&self, nbytes: usize, name: &str, callback: Py<PyAny>) -> PyResult<()> {
        let c = self.get()?;
        let name = name.to_owned();
        start(
            async move { c.alloc_named::<u8>(&name, nbytes).await.map(RawTensor::new) },
            callback,
        )
    }

    fn dispatch(
        &self,
        py: Python<'_>,
        program: &Program,
        args: Vec<Bound<'_, RawTensor>>,
    ) -> PyResult<Timing> {
        let c = self.get()?;
        let fut = dispatch(c, program.program.clone(), tensors(&args)?);
        wait(py, fut)
    }

    fn dispatch_start(
        &self,
        program: &Program,
        args: Vec<Bound<'_, RawTensor>>,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        let c = self.get()?;
        start(
            dispatch(c, program.program.clone(), tensors(&args)?),
            callback,
        )
    }

    fn chain(&self, py: Python<'_>, links: Links<'_>) -> PyResult<ChainTiming> {
        let c = self.get()?;
        let fut = chain(c, self::links(&links)?);
        wait(py, fut)
    }

    fn chain_start(&self, links: Links<'_>, callback: Py<PyAny>) -> PyResult<()> {
        let c = self.get()?;
        start(chain(c, self::links(&links)?), callback)
    }

    fn pipeline(&self, py: Python<'_>, depth: usize) -> PyResult<Pipeline> {
        let c = self.get()?;
        let rt = runtime()?;
        let (tx, rx) = mpsc::channel(depth.clamp(1, 1024));
        let (opened_tx, opened) = oneshot::channel();
        drop(rt.spawn(pipeline_task(c, depth, rx, opened_tx)));
        let depth = wait(py, async move {
            opened
                .await
                .unwrap_or_else(|_| Err(ClientError::Invalid("the pipeline task ended".into())))
        })?;
        Ok(Pipeline {
            tx,
            depth,
            client: self.get()?,
            next_id: std::sync::atomic::AtomicU64::new(0),
            pid: pid(),
        })
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.get()?;
        wait(py, async move { c.close().await })
    }
}

/// A tensor's memory: the buffer protocol gives its bytes (no copy), and the `npud` package
/// views them as a numpy array.
#[pyclass(frozen, module = "npud._npud")]
struct RawTensor {
    tensor: Arc<Shared>,
}

impl RawTensor {
    fn new(t: Tensor<u8>) -> Self {
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

/// A design's program: `main.pdi` plus `insts.bin`.
#[pyclass(frozen, module = "npud._npud")]
struct Program {
    program: NativeProgram,
}

fn artifact_err(py: Python<'_>, e: ClientError) -> PyErr {
    to_pyerr(py, &e)
}

fn emu_design(
    kernel: &str,
    n: u32,
    dtype: Option<&str>,
    scalar: Option<i64>,
) -> Result<npu_artifacts::emu::EmuDesign, ClientError> {
    let dtype = dtype
        .map(str::parse::<npu_artifacts::emu::DType>)
        .transpose()?;
    let mut d = npu_artifacts::emu::EmuDesign::by_name(kernel, n, dtype)?;
    if let Some(s) = scalar {
        d.scalar = s;
        d.validate()?;
    }
    Ok(d)
}

fn generation(g: &str) -> PyResult<npu_client::NpuGen> {
    match g {
        "npu1" => Ok(npu_client::NpuGen::Npu1),
        "npu2" => Ok(npu_client::NpuGen::Npu2),
        _ => Err(PyValueError::new_err(format!(
            "generation {g:?}: expected \"npu1\" or \"npu2\""
        ))),
    }
}

#[pymethods]
impl Program {
    #[staticmethod]
    fn from_dir(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        NativeProgram::from_dir(path)
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    #[staticmethod]
    fn from_bytes(py: Python<'_>, name: &str, pdi: &[u8], insts: &[u8]) -> PyResult<Self> {
        NativeProgram::from_bytes(name, pdi.to_vec(), insts.to_vec())
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    /// Kernel `kernel` of an AIE hsaco given as a path or as bytes (`kernel` may be empty
    /// when the file has one kernel).
    #[staticmethod]
    #[pyo3(signature = (source, kernel=""))]
    fn from_hsaco(py: Python<'_>, source: &Bound<'_, PyAny>, kernel: &str) -> PyResult<Self> {
        let source = if let Ok(b) = source.cast::<PyBytes>() {
            npu_client::HsacoSource::Bytes(b.as_bytes().to_vec())
        } else {
            npu_client::HsacoSource::Path(source.extract::<std::path::PathBuf>()?)
        };
        NativeProgram::from_hsaco(source, kernel)
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    #[staticmethod]
    #[pyo3(signature = (kernel, n, generation, dtype=None, scalar=None))]
    fn emulated(
        py: Python<'_>,
        kernel: &str,
        n: u32,
        generation: &str,
        dtype: Option<&str>,
        scalar: Option<i64>,
    ) -> PyResult<Self> {
        let g = self::generation(generation)?;
        emu_design(kernel, n, dtype, scalar)
            .and_then(|d| NativeProgram::emulated(&d, g))
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    #[staticmethod]
    #[pyo3(signature = (dir, kernel, n, generation, dtype=None, scalar=None))]
    fn write_emulated(
        py: Python<'_>,
        dir: std::path::PathBuf,
        kernel: &str,
        n: u32,
        generation: &str,
        dtype: Option<&str>,
        scalar: Option<i64>,
    ) -> PyResult<()> {
        let g = self::generation(generation)?;
        emu_design(kernel, n, dtype, scalar)
            .and_then(|d| d.write_dir(&dir, g).map_err(ClientError::from))
            .map(|_| ())
            .map_err(|e| artifact_err(py, e))
    }

    #[getter]
    fn name(&self) -> &str {
        self.program.name()
    }

    #[getter]
    fn pdi<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.program.pdi())
    }

    #[getter]
    fn insts<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.program.insts())
    }

    /// The smallest size in bytes of each buffer argument, as the instruction stream patches
    /// them.
    #[getter]
    fn min_arg_bytes(&self) -> Vec<u64> {
        self.program.txn().min_arg_sizes()
    }

    fn __repr__(&self) -> String {
        format!(
            "Program(name={:?}, args={})",
            self.program.name(),
            self.program.txn().arg_count()
        )
    }
}

enum Cmd {
    /// Send a dispatch; its outcome comes back as a completion (a refusal before sending, too).
    Submit {
        py_id: u64,
        program: NativeProgram,
        args: Vec<Arc<Shared>>,
    },
    /// The next completion in submission order.
    Next {
        reply: oneshot::Sender<Result<Option<Done>, ClientError>>,
    },
    /// Every completion still pending, in order.
    Drain {
        reply: oneshot::Sender<Result<Vec<Done>, ClientError>>,
    },
}

/// A completion: (request_id, timing or None, exception or None) once in Python.
type Done = (u64, Result<Timing, ClientError>);

/// A submission waiting for its batch.
struct Pending {
    py_id: u64,
    program: NativeProgram,
    args: Vec<Arc<Shared>>,
}

impl Pending {
    /// (tensors only read, tensors written), by id; `Err` when one tensor stands at two
    /// positions (the client lends a tensor to one position).
    fn access(&self) -> Result<(Vec<u64>, Vec<u64>), ClientError> {
        let k = self.program.read_only_args();
        let mut seen = std::collections::HashSet::new();
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for (i, t) in self.args.iter().enumerate() {
            if !seen.insert(t.id) {
                return Err(ClientError::Invalid(format!(
                    "args[{i}]: tensor {} stands at two argument positions of one dispatch; \
                     npud's client lends each tensor to one position",
                    t.id
                )));
            }
            if i < k {
                reads.push(t.id);
            } else {
                writes.push(t.id);
            }
        }
        Ok((reads, writes))
    }
}

/// One locked tensor of a batch, as the batch's submissions borrow it.
enum Lent<'a> {
    Read(&'a Tensor<u8>),
    Write(Option<&'a mut Tensor<u8>>),
}

/// Runs submissions from the front of `backlog` on one `Submit` stream: as many as `depth`,
/// stopping before one that writes a tensor an earlier one of the batch uses (or uses one it
/// writes), so that every tensor is locked once for the whole batch, in id order. Their
/// completions go to `done` in submission order.
async fn run_batch(
    client: &npu_client::Client,
    depth: usize,
    backlog: &mut VecDeque<Pending>,
    done: &mut VecDeque<Done>,
) {
    let mut batch: Vec<Pending> = Vec::new();
    let (mut read, mut written) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    while batch.len() < depth {
        let Some(next) = backlog.front() else { break };
        let (r, w) = match next.access() {
            Ok(rw) => rw,
            Err(e) => {
                if let Some(p) = backlog.pop_front() {
                    if batch.is_empty() {
                        done.push_back((p.py_id, Err(e)));
                        continue;
                    }
                    // Keep submission order: answer it after this batch.
                    backlog.push_front(p);
                }
                break;
            }
        };
        let conflicts = w.iter().any(|id| read.contains(id) || written.contains(id))
            || r.iter().any(|id| written.contains(id));
        if conflicts {
            break;
        }
        read.extend(r);
        written.extend(w);
        if let Some(p) = backlog.pop_front() {
            batch.push(p);
        }
    }
    if batch.is_empty() {
        return;
    }
    // Lock every tensor of the batch once, in id order (as lock_args does).
    let mut tensors: Vec<&Arc<Shared>> = Vec::new();
    for p in &batch {
        for t in &p.args {
            if !tensors.iter().any(|u| u.id == t.id) {
                tensors.push(t);
            }
        }
    }
    tensors.sort_by_key(|t| t.id);
    let mut held: Vec<(u64, Held)> = Vec::with_capacity(tensors.len());
    for t in tensors {
        let lock = Arc::clone(&t.tensor);
        held.push((
            t.id,
            if written.contains(&t.id) {
                Held::Write(lock.write_owned().await)
            } else {
                Held::Read(lock.read_owned().await)
            },
        ));
    }
    let mut lent: std::collections::HashMap<u64, Lent<'_>> = held
        .iter_mut()
        .map(|(id, h)| {
            (
                *id,
                match h {
                    Held::Read(g) => Lent::Read(g),
                    Held::Write(g) => Lent::Write(Some(&mut **g)),
                },
            )
        })
        .collect();
    let mut p = match client.pipeline(depth).await {
        Ok(p) => p,
        Err(e) => {
            spread(done, batch.iter().map(|b| b.py_id), e);
            return;
        }
    };
    // (py_id, the pipeline's request id, or why the submission was refused).
    let mut sent: Vec<(u64, Result<u64, ClientError>)> = Vec::with_capacity(batch.len());
    for b in &batch {
        let k = b.program.read_only_args();
        let mut reads: Vec<&dyn TensorArg> = Vec::new();
        let mut writes: Vec<&mut dyn TensorArg> = Vec::new();
        for (i, t) in b.args.iter().enumerate() {
            match lent.get_mut(&t.id) {
                Some(Lent::Read(r)) if i < k => reads.push(*r as &dyn TensorArg),
                Some(Lent::Write(w)) if i >= k => {
                    if let Some(w) = w.take() {
                        writes.push(w as &mut dyn TensorArg);
                    }
                }
                _ => {}
            }
        }
        let r = if reads.len() + writes.len() == b.args.len() {
            p.submit(&b.program, &reads, writes).await
        } else {
            Err(ClientError::Invalid(
                "the pipeline's batch lost a tensor (a bug in the npud package)".into(),
            ))
        };
        sent.push((b.py_id, r));
    }
    let completions = p.finish().await;
    let mut by_request: std::collections::HashMap<u64, Result<Timing, ClientError>> =
        match completions {
            Ok(all) => all
                .into_iter()
                .map(|c| (c.request_id, c.result.map(timing)))
                .collect(),
            Err(e) => {
                spread(done, sent.iter().map(|(py_id, _)| *py_id), e);
                return;
            }
        };
    for (py_id, r) in sent {
        done.push_back((
            py_id,
            match r {
                Ok(request) => by_request.remove(&request).unwrap_or_else(|| {
                    Err(ClientError::Invalid(format!(
                        "the Submit stream ended without request {request}'s completion"
                    )))
                }),
                Err(e) => Err(e),
            },
        ));
    }
}

/// One error for several submissions: the first gets it, the rest its message.
fn spread(done: &mut VecDeque<Done>, ids: impl Iterator<Item = u64>, e: ClientError) {
    let message = e.to_string();
    let mut first = Some(e);
    for id in ids {
        let e = first
            .take()
            .unwrap_or_else(|| ClientError::Invalid(message.clone()));
        done.push_back((id, Err(e)));
    }
}

/// Dispatches for the Python object that sends it commands, on `Submit` streams: whatever
/// has been submitted runs as one batch (see [`run_batch`]) while Python goes on submitting.
/// Submissions are not answered (the Python side numbers them), so submitting costs no round
/// trip between threads.
async fn pipeline_task(
    client: npu_client::Client,
    depth: usize,
    mut rx: mpsc::Receiver<Cmd>,
    opened: oneshot::Sender<Result<usize, ClientError>>,
) {
    let depth = depth.max(1);
    let _ = opened.send(Ok(depth));
    let mut backlog: VecDeque<Pending> = VecDeque::new();
    let mut done: VecDeque<Done> = VecDeque::new();
    let mut next: VecDeque<oneshot::Sender<Result<Option<Done>, ClientError>>> = VecDeque::new();
    let mut drain: Vec<oneshot::Sender<Result<Vec<Done>, ClientError>>> = Vec::new();
    let mut closed = false;
    loop {
        // Take every command already waiting, so a batch holds as much as was submitted.
        loop {
            let cmd = match rx.try_recv() {
                Ok(c) => c,
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            };
            match cmd {
                Cmd::Submit {
                    py_id,
                    program,
                    args,
                } => backlog.push_back(Pending {
                    py_id,
                    program,
                    args,
                }),
                Cmd::Next { reply } => next.push_back(reply),
                Cmd::Drain { reply } => drain.push(reply),
            }
        }
        // Answer in order what can be answered now.
        while !next.is_empty() && (!done.is_empty() || backlog.is_empty()) {
            if let Some(reply) = next.pop_front() {
                let _ = reply.send(Ok(done.pop_front()));
            }
        }
        if backlog.is_empty() && next.is_empty() {
            for reply in drain.drain(..) {
                let _ = reply.send(Ok(done.drain(..).collect()));
            }
        }
        if !backlog.is_empty() {
            run_batch(&client, depth, &mut backlog, &mut done).await;
            continue;
        }
        if closed {
            break;
        }
        match rx.recv().await {
            Some(Cmd::Submit {
                py_id,
                program,
                args,
            }) => backlog.push_back(Pending {
                py_id,
                program,
                args,
            }),
            Some(Cmd::Next { reply }) => next.push_back(reply),
            Some(Cmd::Drain { reply }) => drain.push(reply),
            None => closed = true,
        }
    }
}

/// Dispatches in flight, at most `depth` at once, completed in submission order.
#[pyclass(frozen, module = "npud._npud")]
struct Pipeline {
    tx: mpsc::Sender<Cmd>,
    depth: usize,
    client: npu_client::Client,
    next_id: std::sync::atomic::AtomicU64,
    /// The process that made it: its task and connection do not survive a fork.
    pid: u32,
}

fn gone() -> ClientError {
    ClientError::Invalid("the pipeline's stream has ended".into())
}

type PyDone = (u64, Option<Timing>, Option<Py<PyAny>>);

fn done_to_py(py: Python<'_>, d: Done) -> PyDone {
    match d {
        (id, Ok(t)) => (id, Some(t), None),
        (id, Err(e)) => (id, None, Some(to_pyerr(py, &e).into_value(py).into_any())),
    }
}

impl Pipeline {
    /// Checks the arguments, registers the program (once per session) and numbers the
    /// dispatch: what must be refused at once rather than in a completion.
    fn prepare(
        &self,
        py: Python<'_>,
        program: &Program,
        args: &[Bound<'_, RawTensor>],
    ) -> PyResult<Cmd> {
        self.check_fork()?;
        let args = tensors(args)?;
        for (i, t) in args.iter().enumerate() {
            if !t.shared {
                return Err(to_pyerr(
                    py,
                    &ClientError::Invalid(format!(
                        "args[{i}]: tensor {} is staged through the API (a remote connection); \
                         pipelined submission needs tensors shared in place: use dispatch or a \
                         chain",
                        t.id
                    )),
                ));
            }
        }
        let c = self.client.clone();
        let p = program.program.clone();
        wait(py, async move { c.register(&p).await })?;
        Ok(Cmd::Submit {
            py_id: self
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            program: program.program.clone(),
            args,
        })
    }

    fn check_fork(&self) -> PyResult<()> {
        if self.pid == pid() {
            Ok(())
        } else {
            Err(forked("npud pipeline"))
        }
    }

    fn send(&self, py: Python<'_>, cmd: Cmd) -> PyResult<u64> {
        let Cmd::Submit { py_id, .. } = &cmd else {
            unreachable!("only submissions are sent here")
        };
        let id = *py_id;
        match self.tx.try_send(cmd) {
            Ok(()) => Ok(id),
            Err(mpsc::error::TrySendError::Full(cmd)) => {
                let tx = self.tx.clone();
                wait(py, async move { tx.send(cmd).await.map_err(|_| gone()) })?;
                Ok(id)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(to_pyerr(py, &gone())),
        }
    }

    fn ask<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, ClientError>>) -> Cmd,
    ) -> impl Future<Output = Result<T, ClientError>> + Send + 'static {
        let tx = self.tx.clone();
        let (reply, r) = oneshot::channel();
        let cmd = make(reply);
        async move {
            tx.send(cmd).await.map_err(|_| gone())?;
            r.await.map_err(|_| gone())?
        }
    }
}

/// Calls `callback` with a converted outcome from a runtime thread.
fn start_with<T, F, C>(fut: F, callback: Py<PyAny>, convert: C) -> PyResult<()>
where
    T: Send + 'static,
    F: Future<Output = Result<T, ClientError>> + Send + 'static,
    C: for<'py> FnOnce(Python<'py>, T) -> Py<PyAny> + Send + 'static,
{
    let rt = runtime()?;
    drop(rt.spawn(async move {
        let outcome = fut.await;
        Python::attach(|py| {
            let called = match outcome {
                Ok(v) => callback.call1(py, (convert(py, v), py.None())),
                Err(e) => callback.call1(py, (py.None(), to_pyerr(py, &e).into_value(py))),
            };
            if let Err(e) = called {
                e.write_unraisable(py, None);
            }
        });
    }));
    Ok(())
}

#[pymethods]
impl Pipeline {
    #[getter]
    fn depth(&self) -> usize {
        self.depth
    }

    /// Sends a dispatch and returns its request id; waits only while `depth` dispatches wait
    /// to be sent.
    fn submit(
        &self,
        py: Python<'_>,
        program: &Program,
        args: Vec<Bound<'_, RawTensor>>,
    ) -> PyResult<u64> {
        let cmd = self.prepare(py, program, &args)?;
        self.send(py, cmd)
    }

    fn submit_start(
        &self,
        py: Python<'_>,
        program: &Program,
        args: Vec<Bound<'_, RawTensor>>,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        let cmd = self.prepare(py, program, &args)?;
        let Cmd::Submit { py_id, .. } = &cmd else {
            unreachable!("prepare makes a submission")
        };
        let id = *py_id;
        let tx = self.tx.clone();
        start(
            async move {
                tx.send(cmd).await.map_err(|_| gone())?;
                Ok(id)
            },
            callback,
        )
    }

    fn next_completion(&self, py: Python<'_>) -> PyResult<Option<PyDone>> {
        self.check_fork()?;
        let fut = self.ask(|reply| Cmd::Next { reply });
        let d = wait(py, fut)?;
        Ok(d.map(|d| done_to_py(py, d)))
    }

    fn next_completion_start(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.check_fork()?;
        let fut = self.ask(|reply| Cmd::Next { reply });
        start_with(fut, callback, |py, d: Option<Done>| {
            match d.map(|d| done_to_py(py, d)).into_pyobject(py) {
                Ok(o) => o.unbind(),
                Err(e) => e.into_value(py).into_any(),
            }
        })
    }

    /// Every completion still pending, in submission order.
    fn drain(&self, py: Python<'_>) -> PyResult<Vec<PyDone>> {
        self.check_fork()?;
        let fut = self.ask(|reply| Cmd::Drain { reply });
        let all = wait(py, fut)?;
        Ok(all.into_iter().map(|d| done_to_py(py, d)).collect())
    }

    fn drain_start(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.check_fork()?;
        let fut = self.ask(|reply| Cmd::Drain { reply });
        start_with(fut, callback, |py, all: Vec<Done>| {
            let v: Vec<PyDone> = all.into_iter().map(|d| done_to_py(py, d)).collect();
            match v.into_pyobject(py) {
                Ok(o) => o.unbind(),
                Err(e) => e.into_value(py).into_any(),
            }
        })
    }
}

/// A private npud on the emulator (npu-client's `LocalDaemon`), for tests and trials.
#[pyclass(frozen, module = "npud._npud")]
struct LocalDaemon {
    daemon: Mutex<Option<NativeDaemon>>,
    socket: String,
    tcp: Option<String>,
    /// The process that started it: a forked child must not stop its parent's daemon.
    owner: u32,
}

#[pymethods]
impl LocalDaemon {
    #[new]
    #[pyo3(signature = (binary, tcp=true, env=None, args=None, session_grace_ms=None))]
    fn new(
        py: Python<'_>,
        binary: std::path::PathBuf,
        tcp: bool,
        env: Option<Vec<(String, String)>>,
        args: Option<Vec<String>>,
        session_grace_ms: Option<u64>,
    ) -> PyResult<Self> {
        let mut o = LocalOptions::new(binary);
        o.tcp = tcp;
        o.session_grace_ms = session_grace_ms;
        o.env = env
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        o.args = args
            .unwrap_or_default()
            .into_iter()
            .map(Into::into)
            .collect();
        let d = py
            .detach(|| NativeDaemon::start(o))
            .map_err(|e| to_pyerr(py, &e))?;
        Ok(Self {
            socket: format!("unix:{}", d.socket().display()),
            tcp: d.http_url(),
            daemon: Mutex::new(Some(d)),
            owner: pid(),
        })
    }

    /// `unix:PATH` of its gRPC socket.
    #[getter]
    fn address(&self) -> String {
        self.socket.clone()
    }

    /// `http://127.0.0.1:PORT`, when it serves TCP.
    #[getter]
    fn tcp_address(&self) -> Option<String> {
        self.tcp.clone()
    }

    #[getter]
    fn pid(&self) -> Option<u32> {
        self.daemon
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(NativeDaemon::pid)
    }

    /// Its log so far.
    fn log(&self) -> String {
        self.daemon
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(NativeDaemon::log)
            .unwrap_or_default()
    }

    /// Stops it (SIGTERM, then SIGKILL after `timeout` seconds); true for a clean exit.
    #[pyo3(signature = (timeout=10.0))]
    fn stop(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        if self.owner != pid() {
            return Err(forked("npud.LocalDaemon"));
        }
        let d = self
            .daemon
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(mut d) = d else {
            return Ok(true);
        };
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        py.detach(move || d.stop(t))
            .map(|s| s.clean())
            .map_err(|e| to_pyerr(py, &e))
    }
}

/// Sessions spread over several npud hosts (npu-client's `Fleet`).
#[pyclass(frozen, module = "npud._npud")]
struct Fleet {
    fleet: npu_client::Fleet,
    /// The process that connected: the fleet's connections do not survive a fork.
    pid: u32,
}

impl Fleet {
    fn get(&self) -> PyResult<npu_client::Fleet> {
        if self.pid != pid() {
            return Err(PyRuntimeError::new_err(
                "this npud.Fleet was made before the process forked; make a new npud.Fleet in \
                 this process",
            ));
        }
        Ok(self.fleet.clone())
    }
}

#[pymethods]
impl Fleet {
    /// Connects to the hosts of `spec` (addresses separated by commas, or dns:///NAME:PORT) and
    /// probes each once (the GIL is released meanwhile).
    #[new]
    fn new(py: Python<'_>, spec: String) -> PyResult<Self> {
        let fleet = wait(py, async move { npu_client::Fleet::connect(&spec).await })?;
        Ok(Self { fleet, pid: pid() })
    }

    #[getter]
    fn spec(&self) -> String {
        self.fleet.spec().to_string()
    }

    /// Opens a session on the least loaded healthy host.
    fn open(&self, py: Python<'_>) -> PyResult<Client> {
        let f = self.get()?;
        let client = wait(py, async move { f.open().await })?;
        Ok(Client { client, pid: pid() })
    }

    fn open_start(&self, callback: Py<PyAny>) -> PyResult<()> {
        let f = self.get()?;
        start(
            async move {
                let client = f.open().await?;
                Ok(Client { client, pid: pid() })
            },
            callback,
        )
    }

    /// Probes every host now (and resolves a DNS fleet's name again).
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let f = self.get()?;
        wait(py, async move {
            f.refresh().await;
            Ok(())
        })
    }

    /// What the fleet knows of its hosts, as JSON (npu_client::json::fleet_json).
    fn hosts_json(&self) -> String {
        npu_client::json::fleet_json(&self.fleet).to_string()
    }
}

#[pymodule]
fn _npud(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<RawTensor>()?;
    m.add_class::<Program>()?;
    m.add_class::<Pipeline>()?;
    m.add_class::<LocalDaemon>()?;
    m.add_class::<Fleet>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
