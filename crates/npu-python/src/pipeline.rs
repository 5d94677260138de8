//! `npud._npud.Pipeline`: dispatches in flight, completed in submission order: on the
//! session's dispatch ring, driven from the Python thread ([`crate::ringpipe`]), or else on
//! `Submit` streams through a task ([`crate::batch`]).

use std::future::Future;
use std::sync::Arc;

use npu_client::ClientError;
use pyo3::prelude::*;
use tokio::sync::{mpsc, oneshot};

use crate::batch::{Cmd, Done};
use crate::errors::to_pyerr;
use crate::program::Program;
use crate::ringpipe::{RingPipe, settle};
use crate::runtime::{forked, pid, runtime, start, start_with, wait};
use crate::tensor::{RawTensor, Shared, tensors};
use crate::work::Timing;

/// Dispatches in flight, at most `depth` at once, completed in submission order.
#[pyclass(frozen, module = "npud._npud")]
pub(crate) struct Pipeline {
    /// The task's commands, for a pipeline on `Submit` streams.
    pub(crate) tx: Option<mpsc::Sender<Cmd>>,
    /// The pipeline on the session's ring.
    pub(crate) ring: Option<Arc<RingPipe>>,
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
        let args = self.checked(py, program, args)?;
        Ok(Cmd::Submit {
            py_id: self
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            program: program.program.clone(),
            args,
        })
    }

    /// The arguments' tensors, checked, with the program registered.
    fn checked(
        &self,
        py: Python<'_>,
        program: &Program,
        args: &[Bound<'_, RawTensor>],
    ) -> PyResult<Vec<Arc<Shared>>> {
        self.check_fork()?;
        let args: Vec<_> = tensors(args)?;
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
        if !self.client.is_registered(&program.program) {
            let c = self.client.clone();
            let p = program.program.clone();
            wait(py, async move { c.register(&p).await })?;
        }
        Ok(args)
    }

    /// Sends one dispatch on the ring from this thread, without the GIL.
    fn submit_ring(
        &self,
        py: Python<'_>,
        ring: &RingPipe,
        program: &Program,
        args: &[Bound<'_, RawTensor>],
    ) -> PyResult<u64> {
        let args = self.checked(py, program, args)?;
        let rt = runtime()?;
        let p = &program.program;
        py.detach(|| ring.submit(&rt, p, &args))
    }

    fn tx(&self) -> Result<&mpsc::Sender<Cmd>, ClientError> {
        self.tx.as_ref().ok_or_else(gone)
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
        let tx = self.tx().map_err(|e| to_pyerr(py, &e))?;
        match tx.try_send(cmd) {
            Ok(()) => Ok(id),
            Err(mpsc::error::TrySendError::Full(cmd)) => {
                let tx = tx.clone();
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
            let tx = tx.ok_or_else(gone)?;
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

    /// Whether the pipeline runs on the session's dispatch ring (else on `Submit` streams).
    #[getter]
    fn on_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// Sends a dispatch and returns its request id; waits only while `depth` ×
    /// [`crate::batch::WINDOWS_PER_BATCH`] dispatches wait to be sent.
    fn submit(
        &self,
        py: Python<'_>,
        program: &Program,
        args: Vec<Bound<'_, RawTensor>>,
    ) -> PyResult<u64> {
        if let Some(ring) = &self.ring {
            return self.submit_ring(py, ring, program, &args);
        }
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
        if let Some(ring) = &self.ring {
            // Sent now, on this thread (it waits only while `depth` are in flight); the id
            // comes back through the callback, as a stream pipeline's does.
            let id = self.submit_ring(py, ring, program, &args)?;
            return start(async move { Ok(id) }, callback);
        }
        let cmd = self.prepare(py, program, &args)?;
        let Cmd::Submit { py_id, .. } = &cmd else {
            unreachable!("prepare makes a submission")
        };
        let id = *py_id;
        let tx = self.tx().map_err(|e| to_pyerr(py, &e))?.clone();
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
        if let Some(ring) = &self.ring {
            let d = py.detach(|| ring.next_now())?;
            return Ok(d.map(|d| done_to_py(py, d)));
        }
        let fut = self.ask(|reply| Cmd::Next { reply });
        let d = wait(py, fut)?;
        Ok(d.map(|d| done_to_py(py, d)))
    }

    fn next_completion_start(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.check_fork()?;
        let convert = |py: Python<'_>, d: Option<Done>| match d
            .map(|d| done_to_py(py, d))
            .into_pyobject(py)
        {
            Ok(o) => o.unbind(),
            Err(e) => e.into_value(py).into_any(),
        };
        if let Some(ring) = &self.ring {
            let next = ring.take_next();
            let fut = async move {
                Ok(match next {
                    Some((id, e)) => Some((id, settle(e).await)),
                    None => None,
                })
            };
            return start_with(fut, callback, convert);
        }
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
        if let Some(ring) = &self.ring {
            let all: Vec<Done> = py.detach(|| ring.drain_now())?;
            return Ok(all.into_iter().map(|d| done_to_py(py, d)).collect());
        }
        let fut = self.ask(|reply| Cmd::Drain { reply });
        let all = wait(py, fut)?;
        Ok(all.into_iter().map(|d| done_to_py(py, d)).collect())
    }

    fn drain_start(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.check_fork()?;
        let fut: std::pin::Pin<Box<dyn Future<Output = _> + Send>> = if let Some(ring) = &self.ring
        {
            let all = ring.take_all();
            Box::pin(async move {
                let mut done = Vec::with_capacity(all.len());
                for (id, e) in all {
                    done.push((id, settle(e).await));
                }
                Ok(done)
            })
        } else {
            Box::pin(self.ask(|reply| Cmd::Drain { reply }))
        };
        start_with(fut, callback, |py, all: Vec<Done>| {
            let v: Vec<PyDone> = all.into_iter().map(|d| done_to_py(py, d)).collect();
            match v.into_pyobject(py) {
                Ok(o) => o.unbind(),
                Err(e) => e.into_value(py).into_any(),
            }
        })
    }
}
