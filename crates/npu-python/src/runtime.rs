//! The tokio runtime the package's calls run on, and the two ways Python waits for them:
//! blocking with the GIL released ([`wait`]) or through a callback ([`start`], [`start_with`]).
//! A process forked after the runtime was made makes its own.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use npu_client::ClientError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::to_pyerr;

/// The runtime every client of this process uses, with the pid that made it: a process forked
/// after it was made (multiprocessing's default on Linux) cannot use it, and makes its own.
pub(crate) static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

/// This process's id, once asked ([`pid`]); 0 before. A forked child's is set by
/// [`after_fork_in_child`], which the module registers with `os.register_at_fork`.
static PID: AtomicU32 = AtomicU32::new(0);

fn getpid() -> u32 {
    rustix::process::getpid()
        .as_raw_nonzero()
        .get()
        .unsigned_abs()
}

/// This process's id. Every call and every tensor of a call checks it (objects do not cross a
/// fork), so it is cached: `getpid` is a system call, and five of them cost a fifth of a
/// dispatch on the fast path. Python's `os.fork` (and so `multiprocessing`) runs the
/// `register_at_fork` hook that renews it in the child; a child forked below Python, by C code
/// that then runs Python without `exec`, is not seen.
pub(crate) fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = getpid();
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// `os.register_at_fork(after_in_child=...)`: this process is a new one.
#[pyfunction]
pub(crate) fn after_fork_in_child() {
    PID.store(getpid(), Ordering::Relaxed);
}

pub(crate) fn runtime() -> PyResult<Arc<tokio::runtime::Runtime>> {
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

/// How long a wait without the GIL goes before it looks at Python's signals: Ctrl-C ends a
/// wait within this.
pub(crate) const SIGNAL_SLICE: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs `fut` on the runtime with the GIL released, and waits for it; Ctrl-C (any signal
/// handler's exception) ends the wait, dropping `fut`.
pub(crate) fn wait<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send,
    F: Future<Output = Result<T, ClientError>> + Send,
{
    let rt = runtime()?;
    py.detach(|| block_on_checking(&rt, fut))?
        .map_err(|e| to_pyerr(py, &e))
}

/// `rt.block_on(fut)` from a thread that holds no GIL, looking at Python's signals every
/// [`SIGNAL_SLICE`] while `fut` is pending: `Err` with the exception a handler raised (Ctrl-C's
/// `KeyboardInterrupt`), `fut` dropped.
pub(crate) fn block_on_checking<F: Future>(
    rt: &tokio::runtime::Runtime,
    fut: F,
) -> PyResult<F::Output> {
    rt.block_on(async {
        let mut fut = std::pin::pin!(fut);
        loop {
            tokio::select! {
                biased;
                r = &mut fut => return Ok(r),
                () = tokio::time::sleep(SIGNAL_SLICE) => {
                    if let Some(raised) = signalled() {
                        return Err(raised);
                    }
                }
            }
        }
    })
}

/// Whether Python has a signal for this thread to answer (Ctrl-C's `KeyboardInterrupt`): runs
/// the signal handlers with the GIL taken for the moment, and returns the exception one of them
/// raised. For waits that hold no GIL, between slices of their wait; on a thread other than
/// the main one it finds nothing (Python runs handlers only there).
pub(crate) fn signalled() -> Option<PyErr> {
    Python::attach(|py| py.check_signals().err())
}

/// Runs `fut` on the runtime and calls `callback(result, None)` or `callback(None, exception)`
/// with its outcome, from a runtime thread.
pub(crate) fn start<T, F>(fut: F, callback: Py<PyAny>) -> PyResult<()>
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

/// The error for an object used in a process forked after it was made: its connection (and
/// the runtime that serves it) belong to the parent, and waiting on them would never end.
pub(crate) fn forked(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "this {what} was made before the process forked; its connection belongs to the parent \
         process: make a new npud.Client in this process (and its tensors and pipelines)"
    ))
}

/// Calls `callback` with a converted outcome from a runtime thread.
pub(crate) fn start_with<T, F, C>(fut: F, callback: Py<PyAny>, convert: C) -> PyResult<()>
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
