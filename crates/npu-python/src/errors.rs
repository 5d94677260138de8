//! Client errors as the package's exceptions (the classes live in `npud/_errors.py`).

use npu_client::ClientError;
use pyo3::prelude::*;

/// Converts a client error into the package's exception (see `npud/_errors.py`).
pub(crate) fn to_pyerr(py: Python<'_>, e: &ClientError) -> PyErr {
    let (kind, extra) = match e {
        ClientError::Daemon { .. } => ("daemon", None),
        ClientError::SessionLost { session, .. } => ("session_lost", Some(vec![*session])),
        ClientError::Address { .. } => ("address", None),
        ClientError::LocalDaemon { .. } => ("local_daemon", None),
        ClientError::Connect { .. } => ("connect", None),
        ClientError::Timeout { .. } => ("timeout", None),
        ClientError::Interrupted { .. } => ("interrupted", None),
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
