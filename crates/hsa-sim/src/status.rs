//! Status strings (`hsa_status_string`) and the detail of the last error.
//!
//! ROCR reports a failed dispatch only as a status code given to the queue's error callback.
//! The emulator also keeps a sentence saying which rule failed and why, retrievable with
//! [`last_error`] or the C symbol `hsa_sim_last_error`, and logs it with `tracing::debug!`:
//! as ROCR, the emulator only answers a status, and its caller decides whether the failure is
//! worth a warning (the packet ABI probe expects one on most runtimes).

use std::ffi::{CStr, c_char};
use std::sync::{Mutex, PoisonError};

use hsa_core::sys::Status;

/// A failure with the status the caller sees and the sentence behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimError {
    pub status: Status,
    pub detail: String,
}

impl SimError {
    pub(crate) fn new(status: Status, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.status, self.detail)
    }
}

impl std::error::Error for SimError {}

static LAST_ERROR: Mutex<Option<SimError>> = Mutex::new(None);

/// Records `err` as the last error and logs it.
pub(crate) fn record(err: &SimError) {
    tracing::debug!(status = ?err.status, "hsa-sim: {}", err.detail);
    *LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner) = Some(err.clone());
}

fn last() -> Option<SimError> {
    LAST_ERROR
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// The detail of the most recent error the emulator reported (dispatch rules, vmem order,
/// allocation limits), process-wide. `None` until something failed.
pub fn last_error() -> Option<String> {
    last().map(|e| e.detail)
}

/// The status of the most recent error, beside its [`last_error`] detail: what a profile that
/// fails silently (`rocm-7.0`) would have reported had it reported anything.
pub fn last_error_status() -> Option<Status> {
    last().map(|e| e.status)
}

/// Forgets the last error (tests use it to start clean).
pub fn clear_last_error() {
    *LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner) = None;
}

/// Copies the last error's detail into `buf` as a NUL-terminated string, truncated to
/// `len - 1` bytes. Returns the full length of the detail in bytes (without the NUL), or 0
/// when there is none; a larger value than `len - 1` means the copy was truncated.
///
/// # Safety
/// `buf` is null (nothing is written) or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_sim_last_error(buf: *mut c_char, len: usize) -> usize {
    let Some(msg) = last_error() else {
        if !buf.is_null() && len > 0 {
            // SAFETY: `buf` is non-null and valid for `len >= 1` bytes by the contract.
            unsafe { buf.write(0) };
        }
        return 0;
    };
    if !buf.is_null() && len > 0 {
        let n = msg.len().min(len - 1);
        // SAFETY: `buf` is valid for `len` bytes and `n + 1 <= len`; the source is a live
        // String of at least `n` bytes, which cannot overlap caller memory.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    msg.len()
}

/// ROCR's sentence for a status code (its `hsa_status_string` text, and the finalizer and
/// image extension codes), or `None` for a code ROCR does not define. ROCR of 2025 has no
/// sentence for the AMD codes 46..=48 (RESOURCE_BUSY, NOT_SUPPORTED, XNACK_DISABLED); the
/// emulator, which returns NOT_SUPPORTED itself, gives them one in the same style.
pub fn status_text(status: Status) -> Option<&'static CStr> {
    Some(match status {
        Status::SUCCESS => c"HSA_STATUS_SUCCESS: The function has been executed successfully.",
        Status::INFO_BREAK => {
            c"HSA_STATUS_INFO_BREAK: A traversal over a list of elements has been interrupted by the application before completing."
        }
        Status::ERROR => c"HSA_STATUS_ERROR: A generic error has occurred.",
        Status::ERROR_INVALID_ARGUMENT => {
            c"HSA_STATUS_ERROR_INVALID_ARGUMENT: One of the actual arguments does not meet a precondition stated in the documentation of the corresponding formal argument."
        }
        Status::ERROR_INVALID_QUEUE_CREATION => {
            c"HSA_STATUS_ERROR_INVALID_QUEUE_CREATION: The requested queue creation is not valid."
        }
        Status::ERROR_INVALID_ALLOCATION => {
            c"HSA_STATUS_ERROR_INVALID_ALLOCATION: The requested allocation is not valid."
        }
        Status::ERROR_INVALID_AGENT => c"HSA_STATUS_ERROR_INVALID_AGENT: The agent is invalid.",
        Status::ERROR_INVALID_REGION => {
            c"HSA_STATUS_ERROR_INVALID_REGION: The memory region is invalid."
        }
        Status::ERROR_INVALID_SIGNAL => c"HSA_STATUS_ERROR_INVALID_SIGNAL: The signal is invalid.",
        Status::ERROR_INVALID_QUEUE => c"HSA_STATUS_ERROR_INVALID_QUEUE: The queue is invalid.",
        Status::ERROR_OUT_OF_RESOURCES => {
            c"HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary resources. This error may also occur when the core runtime library needs to spawn threads or create internal OS-specific events."
        }
        Status::ERROR_INVALID_PACKET_FORMAT => {
            c"HSA_STATUS_ERROR_INVALID_PACKET_FORMAT: The AQL packet is malformed."
        }
        Status::ERROR_RESOURCE_FREE => {
            c"HSA_STATUS_ERROR_RESOURCE_FREE: An error has been detected while releasing a resource."
        }
        Status::ERROR_NOT_INITIALIZED => {
            c"HSA_STATUS_ERROR_NOT_INITIALIZED: An API other than hsa_init has been invoked while the reference count of the HSA runtime is zero."
        }
        Status::ERROR_REFCOUNT_OVERFLOW => {
            c"HSA_STATUS_ERROR_REFCOUNT_OVERFLOW: The maximum reference count for the object has been reached."
        }
        Status::ERROR_INCOMPATIBLE_ARGUMENTS => {
            c"HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS: The arguments passed to a functions are not compatible."
        }
        Status::ERROR_INVALID_INDEX => c"HSA_STATUS_ERROR_INVALID_INDEX: The index is invalid.",
        Status::ERROR_INVALID_ISA => {
            c"HSA_STATUS_ERROR_INVALID_ISA: The instruction set architecture is invalid."
        }
        Status::ERROR_INVALID_CODE_OBJECT => {
            c"HSA_STATUS_ERROR_INVALID_CODE_OBJECT: The code object is invalid."
        }
        Status::ERROR_INVALID_EXECUTABLE => {
            c"HSA_STATUS_ERROR_INVALID_EXECUTABLE: The executable is invalid."
        }
        Status::ERROR_FROZEN_EXECUTABLE => {
            c"HSA_STATUS_ERROR_FROZEN_EXECUTABLE: The executable is frozen."
        }
        Status::ERROR_INVALID_SYMBOL_NAME => {
            c"HSA_STATUS_ERROR_INVALID_SYMBOL_NAME: There is no symbol with the given name."
        }
        Status::ERROR_VARIABLE_ALREADY_DEFINED => {
            c"HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED: The variable is already defined."
        }
        Status::ERROR_VARIABLE_UNDEFINED => {
            c"HSA_STATUS_ERROR_VARIABLE_UNDEFINED: The variable is undefined."
        }
        Status::ERROR_EXCEPTION => {
            c"HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception."
        }
        Status::ERROR_INVALID_ISA_NAME => {
            c"HSA_STATUS_ERROR_INVALID_ISA_NAME: The instruction set architecture name is invalid."
        }
        Status::ERROR_INVALID_CODE_SYMBOL => {
            c"HSA_STATUS_ERROR_INVALID_CODE_SYMBOL: The code object symbol is invalid."
        }
        Status::ERROR_INVALID_EXECUTABLE_SYMBOL => {
            c"HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL: The executable symbol is invalid."
        }
        Status::ERROR_INVALID_FILE => {
            c"HSA_STATUS_ERROR_INVALID_FILE: The file descriptor is invalid."
        }
        Status::ERROR_INVALID_CODE_OBJECT_READER => {
            c"HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER: The code object reader is invalid."
        }
        Status::ERROR_INVALID_CACHE => c"HSA_STATUS_ERROR_INVALID_CACHE: The cache is invalid.",
        Status::ERROR_INVALID_WAVEFRONT => {
            c"HSA_STATUS_ERROR_INVALID_WAVEFRONT: The wavefront is invalid."
        }
        Status::ERROR_INVALID_SIGNAL_GROUP => {
            c"HSA_STATUS_ERROR_INVALID_SIGNAL_GROUP: The signal group is invalid."
        }
        Status::ERROR_INVALID_RUNTIME_STATE => {
            c"HSA_STATUS_ERROR_INVALID_RUNTIME_STATE: The HSA runtime is not in the configuration state."
        }
        Status::ERROR_FATAL => {
            c"HSA_STATUS_ERROR_FATAL: The queue received an error that may require process termination."
        }
        Status::AMD_ERROR_INVALID_MEMORY_POOL => {
            c"HSA_STATUS_ERROR_INVALID_MEMORY_POOL: The memory pool is invalid."
        }
        Status::AMD_ERROR_MEMORY_APERTURE_VIOLATION => {
            c"HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory beyond the largest legal address."
        }
        Status::AMD_ERROR_ILLEGAL_INSTRUCTION => {
            c"HSA_STATUS_ERROR_ILLEGAL_INSTRUCTION: The agent attempted to execute an illegal shader instruction."
        }
        Status::AMD_ERROR_MEMORY_FAULT => {
            c"HSA_STATUS_ERROR_MEMORY_FAULT: Agent attempted to access an inaccessible address."
        }
        Status::AMD_ERROR_CU_MASK_REDUCED => {
            c"HSA_STATUS_CU_MASK_REDUCED: The CU mask was successfully set but the mask attempted to enable a CU which was disabled for the process.  CUs disabled for the process remain disabled."
        }
        Status::AMD_ERROR_OUT_OF_REGISTERS => {
            c"HSA_STATUS_ERROR_OUT_OF_REGISTERS: Kernel has requested more VGPRs than are available on this agent"
        }
        Status::AMD_ERROR_RESOURCE_BUSY => {
            c"HSA_STATUS_ERROR_RESOURCE_BUSY: The resource is busy or temporarily unavailable."
        }
        Status::AMD_ERROR_NOT_SUPPORTED => {
            c"HSA_STATUS_ERROR_NOT_SUPPORTED: The HSA function is not supported."
        }
        Status::AMD_ERROR_XNACK_DISABLED => {
            c"HSA_STATUS_ERROR_XNACK_DISABLED: The operation requires XNACK, which is disabled."
        }
        Status(0x2000) => c"HSA_EXT_STATUS_ERROR_INVALID_PROGRAM: Invalid program",
        Status(0x2001) => c"HSA_EXT_STATUS_ERROR_INVALID_MODULE: Invalid module",
        Status(0x2002) => c"HSA_EXT_STATUS_ERROR_INCOMPATIBLE_MODULE: Incompatible module",
        Status(0x2003) => c"HSA_EXT_STATUS_ERROR_MODULE_ALREADY_INCLUDED: Module already included",
        Status(0x2004) => c"HSA_EXT_STATUS_ERROR_SYMBOL_MISMATCH: Symbol mismatch",
        Status(0x2005) => c"HSA_EXT_STATUS_ERROR_FINALIZATION_FAILED: Finalization failed",
        Status(0x2006) => c"HSA_EXT_STATUS_ERROR_DIRECTIVE_MISMATCH: Directive mismatch",
        Status(0x3000) => {
            c"HSA_EXT_STATUS_ERROR_IMAGE_FORMAT_UNSUPPORTED: Image format is not supported."
        }
        Status(0x3001) => {
            c"HSA_EXT_STATUS_ERROR_IMAGE_SIZE_UNSUPPORTED: Image size is not supported."
        }
        Status(0x3002) => {
            c"HSA_EXT_STATUS_ERROR_IMAGE_PITCH_UNSUPPORTED: Image pitch is not supported or invalid."
        }
        Status(0x3003) => {
            c"HSA_EXT_STATUS_ERROR_SAMPLER_DESCRIPTOR_UNSUPPORTED: Sampler descriptor is not supported or invalid."
        }
        _ => return None,
    })
}

/// A status as a reader knows it: its C name and code, e.g.
/// `HSA_STATUS_ERROR_INVALID_PACKET_FORMAT (0x1009)`.
pub(crate) fn status_label(status: Status) -> String {
    let name = status_text(status)
        .and_then(|s| s.to_str().ok())
        .and_then(|s| s.split(':').next());
    match name {
        Some(n) => format!("{n} ({:#x})", status.0),
        None => format!("status {:#x}", status.0),
    }
}

/// `hsa_status_string`: points `*out` at a static NUL-terminated description of `status`.
/// Works without `hsa_init`. Unknown codes give `HSA_STATUS_ERROR_INVALID_ARGUMENT`.
///
/// # Safety
/// `out` is null (the call fails) or valid for one pointer write. The string is static.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_status_string(status: Status, out: *mut *const c_char) -> Status {
    if out.is_null() {
        return Status::ERROR_INVALID_ARGUMENT;
    }
    match status_text(status) {
        Some(s) => {
            // SAFETY: `out` is non-null and valid for one pointer write by the contract.
            unsafe { out.write(s.as_ptr()) };
            Status::SUCCESS
        }
        None => Status::ERROR_INVALID_ARGUMENT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_status_has_a_string_that_starts_with_its_name() {
        for code in (0..=1).chain(0x1000..=0x1026).chain(40..=48) {
            let st = Status(code);
            let Some(name) = st.name() else { continue };
            let text = status_text(st)
                .expect("named codes have a string")
                .to_str()
                .unwrap();
            let stem = name.trim_start_matches("AMD_").trim_start_matches("ERROR_");
            assert!(text.contains(stem), "{name}: {text}");
        }
        assert!(status_text(Status(0x4242)).is_none());
    }

    #[test]
    fn labels_carry_the_c_name_and_the_code() {
        assert_eq!(
            status_label(Status::ERROR_INVALID_PACKET_FORMAT),
            "HSA_STATUS_ERROR_INVALID_PACKET_FORMAT (0x1009)"
        );
        assert_eq!(status_label(Status(0x4242)), "status 0x4242");
    }

    #[test]
    fn status_string_works_without_init() {
        let mut p = std::ptr::null();
        // SAFETY: `p` is a valid out-pointer.
        let st = unsafe { hsa_status_string(Status::ERROR_NOT_INITIALIZED, &mut p) };
        assert_eq!(st, Status::SUCCESS);
        // SAFETY: on success `p` points to a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap();
        assert!(s.starts_with("HSA_STATUS_ERROR_NOT_INITIALIZED"));
        // SAFETY: as above.
        let st = unsafe { hsa_status_string(Status(7), &mut p) };
        assert_eq!(st, Status::ERROR_INVALID_ARGUMENT);
    }

    #[test]
    fn last_error_copies_and_truncates() {
        let _g = crate::config::serial_test_guard();
        record(&SimError::new(Status::ERROR, "abcdef"));
        let mut buf = [1 as c_char; 4];
        // SAFETY: `buf` is valid for 4 bytes.
        let n = unsafe { hsa_sim_last_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 6);
        // SAFETY: the call NUL-terminated `buf`.
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(s.to_str().unwrap(), "abc");
        clear_last_error();
        assert_eq!(last_error(), None);
    }
}
