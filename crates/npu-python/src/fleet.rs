//! `npud._npud.Fleet`: sessions spread over several npud hosts.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::client::{Client, class_and_deadline};
use crate::runtime::{pid, start, wait};

/// Sessions spread over several npud hosts (npu-client's `Fleet`).
#[pyclass(frozen, module = "npud._npud")]
pub(crate) struct Fleet {
    pub(crate) fleet: npu_client::Fleet,
    /// The process that connected: the fleet's connections do not survive a fork.
    pub(crate) pid: u32,
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

    /// Opens a session of class `session_class` (and `deadline_us`) on the least loaded
    /// healthy host.
    #[pyo3(signature = (*, session_class="batch", deadline_us=None))]
    fn open(
        &self,
        py: Python<'_>,
        session_class: &str,
        deadline_us: Option<i64>,
    ) -> PyResult<Client> {
        let f = self.get()?;
        let (class, deadline) = class_and_deadline(session_class, deadline_us)?;
        let client = wait(py, async move { f.open_as(class, deadline).await })?;
        Ok(Client { client, pid: pid() })
    }

    #[pyo3(signature = (callback, *, session_class="batch", deadline_us=None))]
    fn open_start(
        &self,
        callback: Py<PyAny>,
        session_class: &str,
        deadline_us: Option<i64>,
    ) -> PyResult<()> {
        let f = self.get()?;
        let (class, deadline) = class_and_deadline(session_class, deadline_us)?;
        start(
            async move {
                let client = f.open_as(class, deadline).await?;
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
