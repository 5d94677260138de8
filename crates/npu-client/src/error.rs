//! [`ClientError`]: every way a call through npu-client can fail.
//!
//! A refusal by the daemon keeps the daemon's gRPC code and message ([`ClientError::Daemon`]);
//! the client adds which call it was. The transport, the fd socket and the artifact reader have
//! variants of their own, so a caller can tell "the daemon said no" from "the daemon is not
//! there" from "the design directory is incomplete".

use std::path::PathBuf;
use std::time::Duration;

/// An error from npu-client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The daemon refused or failed a call; `code` and `message` are the daemon's own.
    #[error("{call} failed ({}): {message}{}", code_name(*code), with_note(note.as_deref()))]
    Daemon {
        /// The RPC, e.g. `Dispatch`.
        call: &'static str,
        /// The daemon's gRPC status code.
        code: tonic::Code,
        /// The daemon's message.
        message: String,
        /// What to do next, when the remedy lies on the client's side (the client's words, not
        /// the daemon's: an anonymous local user over loopback TCP, for one).
        note: Option<String>,
    },
    /// The session no longer exists on the daemon: the daemon restarted, or the session ended
    /// after its grace period without a connection. Its tensors and programs are gone; open a new
    /// [`crate::Client`].
    #[error(
        "session {session} on {address} is lost ({call}): {message}; connect again to open a new \
         session"
    )]
    SessionLost {
        /// The session id the client held.
        session: u64,
        /// The daemon (host) the session was on.
        address: String,
        /// The call that found out.
        call: &'static str,
        /// The daemon's message (or why the resume failed).
        message: String,
    },
    /// The address could not be understood or is not allowed.
    #[error("address {address:?}: {reason}")]
    Address {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A private daemon ([`crate::local::LocalDaemon`]) could not be started or stopped.
    #[error("local npud: {message}")]
    LocalDaemon {
        /// What went wrong, with the daemon's log when it has one.
        message: String,
    },
    /// No host of a [`crate::Fleet`] could take a session: each host and why.
    #[error(
        "no npud host of the fleet can take a session: {}",
        host_reasons(hosts)
    )]
    NoHealthyHost {
        /// Each host's address and why it took no session (down, not serving, refused).
        hosts: Vec<(String, String)>,
    },
    /// The daemon could not be reached.
    #[error("cannot reach npud at {address}: {message}")]
    Connect {
        /// Where the client tried.
        address: String,
        /// The transport's explanation.
        message: String,
    },
    /// A call did not complete in time.
    #[error("{call} did not complete within {timeout:?}")]
    Timeout {
        /// The RPC.
        call: &'static str,
        /// The limit.
        timeout: Duration,
    },
    /// The caller asked to stop waiting (Python's Ctrl-C) before the answer came. The call
    /// may still run; the tensors it may write stay lent to the daemon.
    #[error("{call} was interrupted before its answer came (it may still run)")]
    Interrupted {
        /// The RPC.
        call: &'static str,
    },
    /// The fd socket (tensor memory sharing) failed.
    #[error("{what}: {source}")]
    Fd {
        /// What the client was doing.
        what: String,
        /// The fd layer's error.
        #[source]
        source: npu_fd::FdError,
    },
    /// A design's files are missing or malformed.
    #[error(transparent)]
    Artifact(#[from] npu_artifacts::ArtifactError),
    /// A local file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The request was refused by the client before it was sent.
    #[error("{0}")]
    Invalid(String),
    /// A chain failed on the device part way through.
    #[error("chain link {index} failed ({}): {message}; links {not_run:?} did not run", code_name(*code))]
    ChainFailed {
        /// Index of the failing link; links before it completed.
        index: u32,
        /// The daemon's code for the failure.
        code: tonic::Code,
        /// The daemon's message.
        message: String,
        /// Links that did not run.
        not_run: Vec<u32>,
    },
}

impl ClientError {
    /// The gRPC code behind this error, when the daemon sent one.
    #[must_use]
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Daemon { code, .. } | Self::ChainFailed { code, .. } => Some(*code),
            Self::SessionLost { .. } => Some(tonic::Code::Unauthenticated),
            _ => None,
        }
    }

    /// The daemon's message, when the daemon sent one.
    #[must_use]
    pub fn daemon_message(&self) -> Option<&str> {
        match self {
            Self::Daemon { message, .. }
            | Self::ChainFailed { message, .. }
            | Self::SessionLost { message, .. } => Some(message),
            _ => None,
        }
    }

    pub(crate) fn daemon(call: &'static str, status: &tonic::Status) -> Self {
        Self::Daemon {
            call,
            code: status.code(),
            message: status.message().to_owned(),
            note: None,
        }
    }

    pub(crate) fn fd(what: impl Into<String>) -> impl FnOnce(npu_fd::FdError) -> Self {
        let what = what.into();
        move |source| Self::Fd { what, source }
    }
}

fn with_note(note: Option<&str>) -> String {
    note.map_or_else(String::new, |n| format!(" ({n})"))
}

fn host_reasons(hosts: &[(String, String)]) -> String {
    if hosts.is_empty() {
        return "the fleet has no hosts".to_owned();
    }
    hosts
        .iter()
        .map(|(host, why)| format!("{host}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The upper-case name of a gRPC code, as the daemon's statistics spell it.
#[must_use]
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_errors_keep_code_and_message() {
        let s = tonic::Status::not_found("tensor 7: unknown tensor");
        let e = ClientError::daemon("Dispatch", &s);
        assert_eq!(e.code(), Some(tonic::Code::NotFound));
        assert_eq!(e.daemon_message(), Some("tensor 7: unknown tensor"));
        assert_eq!(
            e.to_string(),
            "Dispatch failed (NOT_FOUND): tensor 7: unknown tensor"
        );
    }
}
