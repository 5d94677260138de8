//! `npud._npud.LocalDaemon`: a private npud on the emulator.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use npu_client::local::{LocalDaemon as NativeDaemon, LocalOptions};
use pyo3::prelude::*;

use crate::errors::to_pyerr;
use crate::runtime::{forked, pid};

/// A private npud on the emulator (npu-client's `LocalDaemon`), for tests and trials.
#[pyclass(frozen, module = "npud._npud")]
pub(crate) struct LocalDaemon {
    pub(crate) daemon: Mutex<Option<NativeDaemon>>,
    pub(crate) socket: String,
    pub(crate) tcp: Option<String>,
    /// The process that started it: a forked child must not stop its parent's daemon.
    pub(crate) owner: u32,
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
