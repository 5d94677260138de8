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

mod batch;
mod client;
mod daemon;
mod errors;
mod fleet;
mod pipeline;
mod program;
mod ringpipe;
mod runtime;
mod tensor;
mod work;

use pyo3::prelude::*;

use client::Client;
use daemon::LocalDaemon;
use fleet::Fleet;
use pipeline::Pipeline;
use program::Program;
use tensor::RawTensor;

#[pymodule]
fn _npud(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<RawTensor>()?;
    m.add_class::<Program>()?;
    m.add_class::<Pipeline>()?;
    m.add_class::<LocalDaemon>()?;
    m.add_class::<Fleet>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let hook = wrap_pyfunction!(runtime::after_fork_in_child, m)?;
    let kw = pyo3::types::PyDict::new(m.py());
    kw.set_item("after_in_child", hook)?;
    m.py()
        .import("os")?
        .call_method("register_at_fork", (), Some(&kw))?;
    Ok(())
}
