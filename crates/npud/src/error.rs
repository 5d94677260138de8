//! [`NpudError`]: every way a request can fail, and the one place it becomes a `tonic::Status`.
//!
//! Each variant is a gRPC status code with the message a user reads; messages name the field
//! at fault (`args[1]`, `links[3].program_id`, `size_bytes`). Statistics count failures by
//! [`NpudError::code_name`], and the Submit stream reports [`NpudError::code`] inline.

use tonic::Code;

/// A request the daemon refused or could not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NpudError {
    /// Malformed input.
    #[error("{0}")]
    InvalidArgument(String),
    /// An unknown handle, or one of another session.
    #[error("{0}")]
    NotFound(String),
    /// A quota or size limit.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A state that must change before the call can succeed (quarantined program, pending
    /// import, a design that needs other hardware).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The device is recovering or the daemon is draining; retry.
    #[error("{0}")]
    Unavailable(String),
    /// The deadline passed before the work started; it did not run.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// No session, or a wrong token.
    #[error("{0}")]
    Unauthenticated(String),
    /// The peer's uid is not the session's.
    #[error("{0}")]
    PermissionDenied(String),
    /// The device failed work that had started, or the daemon broke an invariant.
    #[error("{0}")]
    Internal(String),
}

impl NpudError {
    /// The gRPC code.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::Unavailable(_) => Code::Unavailable,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::Unauthenticated(_) => Code::Unauthenticated,
            Self::PermissionDenied(_) => Code::PermissionDenied,
            Self::Internal(_) => Code::Internal,
        }
    }

    /// The code's canonical name ("INVALID_ARGUMENT", ...), as statistics count it.
    pub fn code_name(&self) -> &'static str {
        code_name(self.code())
    }

    /// The message without the code.
    pub fn message(&self) -> &str {
        match self {
            Self::InvalidArgument(m)
            | Self::NotFound(m)
            | Self::ResourceExhausted(m)
            | Self::FailedPrecondition(m)
            | Self::Unavailable(m)
            | Self::DeadlineExceeded(m)
            | Self::Unauthenticated(m)
            | Self::PermissionDenied(m)
            | Self::Internal(m) => m,
        }
    }

    /// The same error with `prefix: ` before its message (to name a chain link).
    #[must_use]
    pub fn within(self, prefix: &str) -> Self {
        let wrap = |m: String| format!("{prefix}: {m}");
        match self {
            Self::InvalidArgument(m) => Self::InvalidArgument(wrap(m)),
            Self::NotFound(m) => Self::NotFound(wrap(m)),
            Self::ResourceExhausted(m) => Self::ResourceExhausted(wrap(m)),
            Self::FailedPrecondition(m) => Self::FailedPrecondition(wrap(m)),
            Self::Unavailable(m) => Self::Unavailable(wrap(m)),
            Self::DeadlineExceeded(m) => Self::DeadlineExceeded(wrap(m)),
            Self::Unauthenticated(m) => Self::Unauthenticated(wrap(m)),
            Self::PermissionDenied(m) => Self::PermissionDenied(wrap(m)),
            Self::Internal(m) => Self::Internal(wrap(m)),
        }
    }

    /// The executor has stopped (the daemon is shutting down).
    pub fn executor_gone() -> Self {
        Self::Unavailable("the daemon is shutting down".into())
    }
}

/// The canonical upper-case name of a gRPC code.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

impl From<NpudError> for tonic::Status {
    fn from(e: NpudError) -> Self {
        let code = e.code();
        match e {
            NpudError::InvalidArgument(m)
            | NpudError::NotFound(m)
            | NpudError::ResourceExhausted(m)
            | NpudError::FailedPrecondition(m)
            | NpudError::Unavailable(m)
            | NpudError::DeadlineExceeded(m)
            | NpudError::Unauthenticated(m)
            | NpudError::PermissionDenied(m)
            | NpudError::Internal(m) => tonic::Status::new(code, m),
        }
    }
}

/// An hsa-core failure outside a dispatch (allocation, copy, export), classified by what
/// failed: a caller's bad value is INVALID_ARGUMENT; memory the runtime could not find is
/// RESOURCE_EXHAUSTED (only when its status says so: `OUT_OF_RESOURCES`, or
/// `INVALID_ALLOCATION` from an allocating call); every other runtime failure, broken runtime
/// contract and device fault is the daemon's side, INTERNAL, naming the call and its status.
impl From<hsa_core::HsaError> for NpudError {
    fn from(e: hsa_core::HsaError) -> Self {
        use hsa_core::HsaError as H;
        use hsa_core::sys::Status;
        match &e {
            H::InvalidArgument(_) => Self::InvalidArgument(e.to_string()),
            H::UnknownHandle { .. } => Self::NotFound(e.to_string()),
            H::Unsupported { .. } => Self::FailedPrecondition(e.to_string()),
            H::HeapFull { .. } => Self::ResourceExhausted(e.to_string()),
            H::Call { status, .. } if *status == Status::ERROR_OUT_OF_RESOURCES => {
                Self::ResourceExhausted(format!("the device is out of memory: {e}"))
            }
            H::Call { call, status, .. }
                if *status == Status::ERROR_INVALID_ALLOCATION
                    && (call.ends_with("_allocate") || call.ends_with("handle_create")) =>
            {
                Self::ResourceExhausted(format!("the device is out of memory: {e}"))
            }
            _ => Self::Internal(format!("the runtime failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_its_status_code_and_keeps_its_message() {
        let table = [
            (
                NpudError::InvalidArgument("a".into()),
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
            ),
            (NpudError::NotFound("b".into()), Code::NotFound, "NOT_FOUND"),
            (
                NpudError::ResourceExhausted("c".into()),
                Code::ResourceExhausted,
                "RESOURCE_EXHAUSTED",
            ),
            (
                NpudError::FailedPrecondition("d".into()),
                Code::FailedPrecondition,
                "FAILED_PRECONDITION",
            ),
            (
                NpudError::Unavailable("e".into()),
                Code::Unavailable,
                "UNAVAILABLE",
            ),
            (
                NpudError::DeadlineExceeded("f".into()),
                Code::DeadlineExceeded,
                "DEADLINE_EXCEEDED",
            ),
            (
                NpudError::Unauthenticated("g".into()),
                Code::Unauthenticated,
                "UNAUTHENTICATED",
            ),
            (
                NpudError::PermissionDenied("h".into()),
                Code::PermissionDenied,
                "PERMISSION_DENIED",
            ),
            (NpudError::Internal("i".into()), Code::Internal, "INTERNAL"),
        ];
        for (e, code, name) in table {
            assert_eq!(e.code_name(), name);
            let msg = e.message().to_owned();
            let s = tonic::Status::from(e);
            assert_eq!(s.code(), code);
            assert_eq!(s.message(), msg);
        }
    }

    #[test]
    fn within_prefixes_the_message_and_keeps_the_code() {
        let e = NpudError::NotFound("args[0].tensor_id: no tensor 7".into()).within("links[3]");
        assert_eq!(e.code(), Code::NotFound);
        assert_eq!(e.message(), "links[3]: args[0].tensor_id: no tensor 7");
    }

    #[test]
    fn hsa_errors_map_by_kind() {
        let e: NpudError = hsa_core::HsaError::InvalidArgument("x".into()).into();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e: NpudError = hsa_core::HsaError::UnknownHandle {
            kind: "tensor",
            id: 3,
        }
        .into();
        assert_eq!(e.code(), Code::NotFound);
    }

    #[test]
    fn runtime_failures_are_classified_by_status_not_by_call_name() {
        use hsa_core::HsaError as H;
        use hsa_core::sys::Status;
        let call = |call, status| H::Call {
            call,
            status,
            message: "m".into(),
        };
        let oom: NpudError =
            call("hsa_amd_vmem_handle_create", Status::ERROR_OUT_OF_RESOURCES).into();
        assert_eq!(oom.code(), Code::ResourceExhausted);
        assert!(oom.message().contains("out of memory"), "{}", oom.message());
        let e: NpudError = call(
            "hsa_amd_memory_pool_allocate",
            Status::ERROR_INVALID_ALLOCATION,
        )
        .into();
        assert_eq!(e.code(), Code::ResourceExhausted);
        // A vmem map or access call that fails is the runtime's failure, not memory pressure.
        for c in [
            "hsa_amd_vmem_map",
            "hsa_amd_vmem_set_access",
            "hsa_amd_vmem_export_shareable_handle",
        ] {
            let e: NpudError = call(c, Status::ERROR_INVALID_AGENT).into();
            assert_eq!(e.code(), Code::Internal, "{c}");
            assert!(e.message().contains(c), "{}", e.message());
            assert!(!e.message().contains("out of memory"), "{}", e.message());
        }
        // Device faults and broken runtime contracts are never the client's bad argument.
        let fault: NpudError = H::Device {
            index: 0,
            status: Status::ERROR,
            message: "device error".into(),
        }
        .into();
        assert_eq!(fault.code(), Code::Internal);
        let contract: NpudError = H::Contract {
            call: "hsa_queue_create",
            detail: "a queue of 32 packets".into(),
        }
        .into();
        assert_eq!(contract.code(), Code::Internal);
    }
}
