//! `npud._npud.Pipeline`: dispatches in flight, completed in submission order.

use std::future::Future;

use npu_client::ClientError;
use pyo3::prelude::*;
use tokio::sync::{mpsc, oneshot};

use crate::batch::{Cmd, Done};
use crate::errors::to_pyerr;
use crate::program::Program;
use crate::runtime::{forked, pid, start, start_with, wait};
use crate::tensor::{RawTensor, tensors};
use crate::work::Timing;

/// Dispatches in flight, at most `depth` at once, completed in submission order.
#[pyclass(frozen, module = "npud._npud")]
pub(crate) struct Pipeline {
    pub(crate) tx: mpsc::Sender<Cmd>,
    pub(crate) depth: usize,
    pub(crate) client: npu_client::Client,
    pub(crate) next_id: std::sync::atomic::AtomicU64,
    /// The process that made it: its task and connection do not survive a fork.
    pub(crate) pid: u32,
}

pub(crate) fn gone() -> ClientError {
    ClientError::Invalid("the pipeline's stream has ended".into())
}

pub(crate) type PyDone = (u64, Option<Timing>, Option<Py<PyAny>>);

pub(crate) fn done_to_py(py: Python<'_>, d: Done) -> PyDone {
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

#[pymethods]
impl Pipeline {
    #[getter]
    fn depth(&self) -> usize {
        self.depth
    }

    /// Sends a dispatch and returns its request id; waits only while `depth` ×
    /// [`crate::batch::WINDOWS_PER_BATCH`] dispatches wait to be sent.
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
