//! `npud._npud.Client`: a session on npud.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use npu_client::ClientError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tokio::sync::{mpsc, oneshot};

use crate::batch::pipeline_task;
use crate::pipeline::Pipeline;
use crate::program::Program;
use crate::ringpipe::RingPipe;
use crate::runtime::{pid, runtime, start, wait};
use crate::tensor::{RawTensor, Shared, shared, tensors};
use crate::work::{
    self, ChainTiming, Few, Links, PyArg, Timing, chain, dispatch, dispatch_views, links,
};

/// A session on npud (npu-client's `Client`).
#[pyclass(frozen, module = "npud._npud")]
pub(crate) struct Client {
    pub(crate) client: npu_client::Client,
    /// The process that connected: the connection does not survive a fork.
    pub(crate) pid: u32,
}

/// The tensor `known` holds for the array `a`: its entry for `id(a)`, while that entry's
/// weak reference still names `a` (an id is reused once its array is gone).
fn known_tensor<'py>(
    a: &Bound<'py, PyAny>,
    known: &Bound<'py, PyDict>,
) -> PyResult<Option<Bound<'py, RawTensor>>> {
    // `id(a)`: the object's address, as CPython defines it.
    let Some(hit) = known.get_item(a.as_ptr() as usize)? else {
        return Ok(None);
    };
    let Ok(hit) = hit.cast_into::<PyTuple>() else {
        return Ok(None);
    };
    if hit.len() != 2 || !hit.get_item(0)?.call0()?.is(a) {
        return Ok(None);
    }
    Ok(hit.get_item(1)?.cast_into::<RawTensor>().ok())
}

impl Client {
    /// One dispatch over `t`: on the ring on this thread when its tensors are free at once,
    /// else through the runtime.
    fn dispatch_tensors(
        &self,
        py: Python<'_>,
        program: &Program,
        t: Few<Arc<Shared>>,
    ) -> PyResult<Timing> {
        let c = self.get()?;
        // A dispatch that hangs the device waits up to the call timeout: Ctrl-C ends the wait.
        let mut raised = None;
        let now = py.detach(|| {
            work::dispatch_now(&c, &program.program, &t, &mut || {
                raised = crate::runtime::signalled();
                raised.is_none()
            })
        });
        if let Some(raised) = raised {
            return Err(raised);
        }
        if let Some(r) = now {
            return r.map_err(|e| crate::errors::to_pyerr(py, &e));
        }
        wait(py, dispatch(c, program.program.clone(), t.into_vec()))
    }

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

/// The session's class and deadline from the keyword arguments: `session_class` by name
/// (`ValueError` naming the two for another), `deadline_us` in microseconds (`None` or 0: the
/// daemon's default; `ValueError` below 0). Whether the caller may have them is the daemon's to
/// say.
pub(crate) fn class_and_deadline(
    session_class: &str,
    deadline_us: Option<i64>,
) -> PyResult<(npu_client::SessionClass, Option<Duration>)> {
    let session_class = session_class
        .parse::<npu_client::SessionClass>()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let deadline = deadline_us
        .map(|us| {
            u64::try_from(us).map(Duration::from_micros).map_err(|_| {
                PyValueError::new_err(format!(
                    "deadline_us={us}: expected microseconds, 0 or more (None or 0: the daemon's default)"
                ))
            })
        })
        .transpose()?;
    Ok((session_class, deadline))
}

/// `opts` with the class and deadline of the keyword arguments ([`class_and_deadline`]).
fn with_class(
    opts: npu_client::ConnectOptions,
    session_class: &str,
    deadline_us: Option<i64>,
) -> PyResult<npu_client::ConnectOptions> {
    let (session_class, deadline) = class_and_deadline(session_class, deadline_us)?;
    Ok(npu_client::ConnectOptions {
        session_class,
        deadline,
        ..opts
    })
}

/// Connect options from the keyword arguments: TLS files, the server name, an identity token.
pub(crate) fn connect_options(
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
    /// Connects to npud and opens a session of class `session_class` (the GIL is released
    /// while it connects).
    #[new]
    #[pyo3(signature = (addr=None, *, ca=None, cert=None, key=None, tls_server_name=None, token_file=None, token=None, session_class="batch", deadline_us=None))]
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
        session_class: &str,
        deadline_us: Option<i64>,
    ) -> PyResult<Self> {
        let opts = with_class(
            connect_options(ca, cert, key, tls_server_name, token_file, token),
            session_class,
            deadline_us,
        )?;
        let client = wait(py, async move {
            npu_client::Client::connect_with(addr.as_deref(), opts).await
        })?;
        Ok(Self { client, pid: pid() })
    }

    #[staticmethod]
    #[pyo3(signature = (addr, callback, *, ca=None, cert=None, key=None, tls_server_name=None, token_file=None, token=None, session_class="batch", deadline_us=None))]
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
        session_class: &str,
        deadline_us: Option<i64>,
    ) -> PyResult<()> {
        let opts = with_class(
            connect_options(ca, cert, key, tls_server_name, token_file, token),
            session_class,
            deadline_us,
        )?;
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

    /// The class the daemon granted: `"batch"` or `"interactive"`.
    #[getter]
    fn session_class(&self) -> &'static str {
        self.client.session_class().as_str()
    }

    /// The deadline the daemon granted, in microseconds; `None` without one.
    #[getter]
    fn deadline_us(&self) -> Option<u64> {
        self.client
            .deadline()
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
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
        self.dispatch_tensors(py, program, tensors(&args)?)
    }

    /// `dispatch` over arguments given as they were to `Client.dispatch`: each a `RawTensor`
    /// or an array found in `known` (the package's `_KNOWN`: `id(array)` → `(weakref to the
    /// array, RawTensor)`). Resolving them here rather than in a Python loop saves about a µs
    /// a dispatch. `None`, before anything is sent, when an argument is neither: the package
    /// then resolves the arguments itself (sub-views, arrays seen for the first time) and says
    /// which one is wrong.
    fn dispatch_known(
        &self,
        py: Python<'_>,
        program: &Program,
        args: &Bound<'_, PyTuple>,
        known: &Bound<'_, PyDict>,
    ) -> PyResult<Option<Timing>> {
        let mut t = Few::new();
        for a in args.iter() {
            let raw = match a.cast_into::<RawTensor>() {
                Ok(r) => r,
                Err(e) => match known_tensor(&e.into_inner(), known)? {
                    Some(r) => r,
                    None => return Ok(None),
                },
            };
            t.push(shared(&raw)?);
        }
        self.dispatch_tensors(py, program, t).map(Some)
    }

    /// One dispatch over byte ranges of tensors: `(tensor, offset, nbytes)` each, in the
    /// design's order (`nbytes` 0: to the end); a tensor may stand at several positions.
    fn dispatch_views(
        &self,
        py: Python<'_>,
        program: &Program,
        args: Vec<PyArg<'_>>,
    ) -> PyResult<Timing> {
        let c = self.get()?;
        wait(
            py,
            dispatch_views(c, program.program.clone(), work::args(&args)?),
        )
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
        if let Some(depth) = c.ring_pipeline_depth(depth) {
            return Ok(Pipeline {
                tx: None,
                ring: Some(Arc::new(RingPipe::new(c.clone(), depth))),
                depth,
                client: c,
                next_id: std::sync::atomic::AtomicU64::new(0),
                pid: pid(),
            });
        }
        let rt = runtime()?;
        // Room for a whole batch waiting to be sent while the previous one runs.
        let (tx, rx) = mpsc::channel(
            depth
                .saturating_mul(crate::batch::WINDOWS_PER_BATCH)
                .clamp(1, 8192),
        );
        let (opened_tx, opened) = oneshot::channel();
        drop(rt.spawn(pipeline_task(c, depth, rx, opened_tx)));
        let depth = wait(py, async move {
            opened
                .await
                .unwrap_or_else(|_| Err(ClientError::Invalid("the pipeline task ended".into())))
        })?;
        Ok(Pipeline {
            tx: Some(tx),
            ring: None,
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
