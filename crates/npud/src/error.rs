//! [`NpudError`]: every way a request can fail, and the one place it becomes a `tonic::Status`.
//!
//! Each variant is a gRPC status code with the message a user reads; messages name the field
//! at fault (`args[1]`, `links[3].program_id`, `size_bytes`). Statistics count failures by
//! [`NpudError::code_name`], and the Submit stream reports [`NpudError::code`] inline.
//!
//! Statuses tonic makes on its own, before or beside a handler, are put into the documented
//! codes by the transport (`codes`), which this layer knows nothing of.

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
    /// Work started and whether it ran cannot be known (ROCm 7.0 stops waiting for a command
    /// after 50 ms and reports nothing): UNKNOWN, the message starting `outcome unknown`. Not
    /// DEADLINE_EXCEEDED, which says the work never started; not a device fault.
    #[error("{0}")]
    OutcomeUnknown(String),
}

/// How every [`NpudError::OutcomeUnknown`] message starts.
pub const OUTCOME_UNKNOWN: &str = "outcome unknown: ";

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
            Self::OutcomeUnknown(_) => Code::Unknown,
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
            | Self::Internal(m)
            | Self::OutcomeUnknown(m) => m,
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
            // The message keeps starting with "outcome unknown".
            Self::OutcomeUnknown(m) => {
                Self::OutcomeUnknown(match m.strip_prefix(OUTCOME_UNKNOWN) {
                    Some(rest) => format!("{OUTCOME_UNKNOWN}{prefix}: {rest}"),
                    None => wrap(m),
                })
            }
        }
    }

    /// Whether this is a final answer for a request id (`request_ids`): one a retry must get
    /// rather than run the work again. Every refusal is made before the work reaches the
    /// device (its arguments, a quota, the policy, a deadline that passed in the queue, a
    /// device recovering, a program the runtime refused without running it), so running the
    /// call again is safe and may succeed; INTERNAL is a failure of work that had started (a
    /// device fault) or a broken invariant, and UNKNOWN work that may have run (its doorbell
    /// outlasted the runtime's wait): both are final, so a retry never runs the work twice.
    pub fn is_final(&self) -> bool {
        match self {
            Self::InvalidArgument(_)
            | Self::NotFound(_)
            | Self::ResourceExhausted(_)
            | Self::FailedPrecondition(_)
            | Self::Unavailable(_)
            | Self::DeadlineExceeded(_)
            | Self::Unauthenticated(_)
            | Self::PermissionDenied(_) => false,
            Self::Internal(_) | Self::OutcomeUnknown(_) => true,
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
            | NpudError::Internal(m)
            | NpudError::OutcomeUnknown(m) => tonic::Status::new(code, m),
        }
    }
}

/// What tonic's `TimeoutExpired` becomes in `Status::from_error`.
const TONIC_TIMEOUT_MESSAGE: &str = "Timeout expired";

/// A status tonic made on its own, in the code the README documents; `None` for every other
/// status (the handlers' own, which already are). `max_message_bytes` is
/// `limits.max_message_bytes`, named in the oversized-message message.
pub fn transport_status(
    code: Code,
    message: &str,
    max_message_bytes: u64,
) -> Option<tonic::Status> {
    match code {
        Code::Internal
            if message.starts_with("failed to decode Protobuf message")
                || message.starts_with("protocol error:")
                || message.starts_with("Unexpected EOF decoding stream") =>
        {
            Some(tonic::Status::invalid_argument(format!(
                "the request is not a valid message for this method: {message}"
            )))
        }
        Code::OutOfRange if message.starts_with("Error, decoded message length too large") => {
            Some(tonic::Status::resource_exhausted(format!(
                "{message} (limits.max_message_bytes is {max_message_bytes}; the transport \
                 accepts messages up to twice that)"
            )))
        }
        Code::Cancelled if message == TONIC_TIMEOUT_MESSAGE => Some(deadline_passed()),
        _ => None,
    }
}

/// The status of a call whose `grpc-timeout` passed.
pub fn deadline_passed() -> tonic::Status {
    tonic::Status::deadline_exceeded(
        "the call's deadline (grpc-timeout) passed before it finished; if it was queued work, \
         it did not run",
    )
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
            H::Unsupported { .. } | H::NeedsCodeObjects { .. } => {
                Self::FailedPrecondition(e.to_string())
            }
            H::HeapFull { .. } => Self::ResourceExhausted(e.to_string()),
            H::OutcomeUnknown { .. } => Self::OutcomeUnknown(e.to_string()),
            H::Call { status, .. } if *status == Status::ERROR_OUT_OF_RESOURCES => {
                out_of_memory(&e)
            }
            H::Call { call, status, .. }
                if *status == Status::ERROR_INVALID_ALLOCATION
                    && (call.ends_with("_allocate") || call.ends_with("handle_create")) =>
            {
                out_of_memory(&e)
            }
            _ => Self::Internal(format!("the runtime failed: {e}")),
        }
    }
}

/// An allocation the runtime refused for want of resources: out of memory, unless the daemon
/// is out of file descriptors (the emulator's and staged runtimes' tensors are memfds), which
/// the message then says instead.
fn out_of_memory(e: &hsa_core::HsaError) -> NpudError {
    match crate::fds::fd_exhaustion() {
        Some(why) => NpudError::ResourceExhausted(format!("{why} (the runtime said: {e})")),
        None => NpudError::ResourceExhausted(format!("the device is out of memory: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonic_s_own_statuses_become_the_documented_codes() {
        let table = [
            (
                Code::Internal,
                "failed to decode Protobuf message: invalid wire type",
                Some(Code::InvalidArgument),
            ),
            (
                Code::OutOfRange,
                "Error, decoded message length too large: found 9 bytes, the limit is: 8 bytes",
                Some(Code::ResourceExhausted),
            ),
            (
                Code::Cancelled,
                "Timeout expired",
                Some(Code::DeadlineExceeded),
            ),
            // A handler's own statuses are left alone.
            (Code::Internal, "the runtime failed: x", None),
            (Code::Cancelled, "the client went away", None),
            (Code::OutOfRange, "offset: past the end", None),
        ];
        for (code, msg, want) in table {
            let got = transport_status(code, msg, 8);
            assert_eq!(got.as_ref().map(tonic::Status::code), want, "{msg}");
        }
        let s = transport_status(
            Code::OutOfRange,
            "Error, decoded message length too large",
            8,
        )
        .unwrap();
        assert!(
            s.message().contains("limits.max_message_bytes is 8"),
            "{s:?}"
        );
    }

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
