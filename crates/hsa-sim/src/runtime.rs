//! The process-wide runtime: reference-counted `hsa_init`/`hsa_shut_down`, system info, and
//! the guard that keeps panics from crossing the C boundary.
//!
//! One [`Runtime`] exists while the reference count is above zero. Every entry point other
//! than `hsa_init`, `hsa_status_string` and the `hsa_sim_*` extras fails with
//! `HSA_STATUS_ERROR_NOT_INITIALIZED` while it is zero. The last `hsa_shut_down` drops the
//! runtime's tables; memory still in use by a doorbell in another thread stays mapped until
//! that doorbell returns. A process may also exit with everything live (IRON never releases).

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use hsa_core::sys::{Agent, Status, SystemInfo};

use crate::agents::{AgentKind, PoolDesc};
use crate::config::SimConfig;
use crate::counters::{Counter, bump};
use crate::executable::CodeObjects;
use crate::memory::Memory;
use crate::queue::QueueObj;
use crate::signal::SignalObj;
use crate::status::{SimError, record};

/// Ticks per second of `HSA_SYSTEM_INFO_TIMESTAMP` and of signal wait timeouts: nanoseconds.
pub const TIMESTAMP_FREQUENCY: u64 = 1_000_000_000;

/// Everything one initialisation owns.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub config: SimConfig,
    pub cpu_agent: Agent,
    pub aie_agent: Agent,
    /// Every pool, CPU's first, then the AIE agent's three in ROCR's order.
    pub pools: Vec<PoolDesc>,
    pub memory: Mutex<Memory>,
    pub signals: Mutex<HashMap<u64, Arc<SignalObj>>>,
    /// Live queues by the address of their `hsa_queue_t`.
    pub queues: Mutex<HashMap<usize, Arc<QueueObj>>>,
    /// Code object readers, executables and kernel descriptors. Lock it before `memory`
    /// when both are needed.
    pub code: Mutex<CodeObjects>,
    /// ROCm 7.0's agent-wide PDI cache: it lives as long as the runtime, across queues.
    pub rocm70: Mutex<crate::dispatch::rocm70::AgentContexts>,
}

/// The NPU's device node, as ROCR 7.0 opens it.
const ACCEL_NODE: &str = "/dev/accel/accel0";

impl Runtime {
    fn new(config: SimConfig) -> Result<Self, SimError> {
        let cpu_agent = Agent {
            handle: next_handle(),
        };
        let aie_agent = Agent {
            handle: next_handle(),
        };
        let pools = crate::agents::make_pools(cpu_agent, aie_agent);
        let memory = Memory::new(aie_agent, config.profile)?;
        if config.profile == crate::Profile::Rocm70 {
            // ROCm 7.0 opens `/dev/accel/accel0` in `hsa_init` and never closes it: neither
            // `hsa_shut_down` nor a second `hsa_init` does (rocm70-observed.md item 9). The
            // emulator opens that node too where there is one (a test can give it one in a
            // mount namespace), else a named memfd in its place, one per initialisation, and
            // leaves it open.
            let fd = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(ACCEL_NODE)
            {
                Ok(f) => std::os::fd::OwnedFd::from(f),
                Err(_) => crate::memory::new_memfd("hsa-sim-accel0-left-open-by-rocm-7.0", 0)?,
            };
            let _ = std::os::fd::IntoRawFd::into_raw_fd(fd);
        }
        Ok(Self {
            config,
            cpu_agent,
            aie_agent,
            pools,
            memory: Mutex::new(memory),
            signals: Mutex::new(HashMap::new()),
            queues: Mutex::new(HashMap::new()),
            code: Mutex::new(CodeObjects::default()),
            rocm70: Mutex::new(Default::default()),
        })
    }

    /// Which of this runtime's agents `agent` is.
    pub fn agent_kind(&self, agent: Agent) -> Option<AgentKind> {
        if agent == self.cpu_agent {
            Some(AgentKind::Cpu)
        } else if agent == self.aie_agent {
            Some(AgentKind::Aie)
        } else {
            None
        }
    }

    /// The memory tables, locked. A panic while they were held poisons nothing: each
    /// operation leaves them consistent before it can fail.
    pub fn memory(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn signals(&self) -> MutexGuard<'_, HashMap<u64, Arc<SignalObj>>> {
        self.signals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn code(&self) -> MutexGuard<'_, CodeObjects> {
        self.code.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn rocm70(&self) -> MutexGuard<'_, crate::dispatch::rocm70::AgentContexts> {
        self.rocm70.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn queues(&self) -> MutexGuard<'_, HashMap<usize, Arc<QueueObj>>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, Default)]
struct Global {
    refs: u32,
    runtime: Option<Arc<Runtime>>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    refs: 0,
    runtime: None,
});

fn global() -> MutexGuard<'static, Global> {
    GLOBAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The live runtime, or `HSA_STATUS_ERROR_NOT_INITIALIZED`.
pub(crate) fn runtime() -> Result<Arc<Runtime>, Status> {
    global()
        .runtime
        .clone()
        .ok_or(Status::ERROR_NOT_INITIALIZED)
}

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x5151_0000);

/// A fresh opaque handle. Handles are never reused, so a stale one is always unknown.
pub(crate) fn next_handle() -> u64 {
    NEXT_HANDLE.fetch_add(0x10, Ordering::Relaxed)
}

/// Runs an entry point's body, turning a panic into `HSA_STATUS_ERROR` (recorded as the last
/// error) so that nothing unwinds into C.
pub(crate) fn guard(f: impl FnOnce() -> Status) -> Status {
    guard_value(Status::ERROR, f)
}

/// [`guard`] for entry points that return a value rather than a status.
pub(crate) fn guard_value<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            record(&SimError::new(
                Status::ERROR,
                format!("internal error in hsa-sim: {what}"),
            ));
            on_panic
        }
    }
}

/// Turns `Result<(), SimError>` into a status, recording the detail of a failure.
pub(crate) fn report(r: Result<(), SimError>) -> Status {
    match r {
        Ok(()) => Status::SUCCESS,
        Err(e) => {
            record(&e);
            e.status
        }
    }
}

/// `hsa_init`: takes a reference on the runtime, creating it (and reading the configuration)
/// when the count goes from 0 to 1.
///
/// # Safety
/// Always safe to call; `unsafe` only because it is part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_init() -> Status {
    guard(|| {
        let mut g = global();
        if g.refs == u32::MAX {
            return Status::ERROR_REFCOUNT_OVERFLOW;
        }
        if g.refs == 0 {
            match Runtime::new(crate::config::effective()) {
                Ok(rt) => {
                    tracing::debug!(config = ?rt.config, "hsa-sim: runtime initialised");
                    g.runtime = Some(Arc::new(rt));
                }
                Err(e) => {
                    record(&e);
                    return Status::ERROR_OUT_OF_RESOURCES;
                }
            }
        }
        g.refs += 1;
        bump(Counter::Inits);
        Status::SUCCESS
    })
}

/// `hsa_shut_down`: drops one reference; the last one releases the runtime.
///
/// # Safety
/// Always safe to call; `unsafe` only because it is part of the C ABI. Handles and pointers
/// the runtime gave out are invalid after the last shutdown.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_shut_down() -> Status {
    guard(|| {
        let mut g = global();
        if g.refs == 0 {
            return Status::ERROR_NOT_INITIALIZED;
        }
        g.refs -= 1;
        bump(Counter::Shutdowns);
        if g.refs == 0 {
            g.runtime = None;
        }
        Status::SUCCESS
    })
}

fn monotonic_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let ns = START.get_or_init(Instant::now).elapsed().as_nanos();
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// `hsa_system_get_info`. `AMD_BUILD_VERSION` names the emulator and its profile
/// ([`crate::Profile::build_version`]; [`crate::profile_of_build_version`] reads it back).
///
/// # Safety
/// `value` is null (the call fails) or valid for a write of the attribute's type: `u16` for
/// the versions, `u64` for timestamps and `SIGNAL_MAX_WAIT`, `u32` for enums, 128 bytes for
/// `EXTENSIONS`, a `const char*` for `AMD_BUILD_VERSION`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_system_get_info(attr: SystemInfo, value: *mut c_void) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if value.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: (every arm) `value` is non-null and, by the contract, valid for a write of
        // the attribute's documented type; unaligned writes make no alignment assumption.
        unsafe {
            match attr {
                SystemInfo::VERSION_MAJOR => value.cast::<u16>().write_unaligned(1),
                SystemInfo::VERSION_MINOR => value.cast::<u16>().write_unaligned(1),
                SystemInfo::TIMESTAMP => value.cast::<u64>().write_unaligned(monotonic_ns()),
                SystemInfo::TIMESTAMP_FREQUENCY => {
                    value.cast::<u64>().write_unaligned(TIMESTAMP_FREQUENCY)
                }
                SystemInfo::SIGNAL_MAX_WAIT => value.cast::<u64>().write_unaligned(u64::MAX),
                // HSA_ENDIANNESS_LITTLE
                SystemInfo::ENDIANNESS => value.cast::<u32>().write_unaligned(0),
                // HSA_MACHINE_MODEL_LARGE
                SystemInfo::MACHINE_MODEL => value.cast::<u32>().write_unaligned(1),
                SystemInfo::EXTENSIONS => value.cast::<u8>().write_bytes(0, 128),
                SystemInfo::AMD_BUILD_VERSION => value
                    .cast::<*const c_char>()
                    .write_unaligned(rt.config.profile.build_version().as_ptr()),
                _ => return Status::ERROR_INVALID_ARGUMENT,
            }
        }
        Status::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_counting_and_not_initialized() {
        let _g = crate::config::serial_test_guard();
        // SAFETY: (whole test) the entry points are called with valid out-pointers.
        unsafe {
            assert_eq!(hsa_shut_down(), Status::ERROR_NOT_INITIALIZED);
            let mut f = 0u64;
            assert_eq!(
                hsa_system_get_info(SystemInfo::TIMESTAMP_FREQUENCY, (&raw mut f).cast()),
                Status::ERROR_NOT_INITIALIZED
            );
            assert_eq!(hsa_init(), Status::SUCCESS);
            assert_eq!(hsa_init(), Status::SUCCESS);
            assert_eq!(hsa_shut_down(), Status::SUCCESS);
            assert_eq!(
                hsa_system_get_info(SystemInfo::TIMESTAMP_FREQUENCY, (&raw mut f).cast()),
                Status::SUCCESS
            );
            assert_eq!(f, TIMESTAMP_FREQUENCY);
            let mut w = 0u64;
            hsa_system_get_info(SystemInfo::SIGNAL_MAX_WAIT, (&raw mut w).cast());
            assert_eq!(w, u64::MAX);
            let mut s: *const c_char = std::ptr::null();
            hsa_system_get_info(SystemInfo::AMD_BUILD_VERSION, (&raw mut s).cast());
            let s = std::ffi::CStr::from_ptr(s).to_str().unwrap();
            assert!(s.starts_with("hsa-sim "), "{s}");
            let profile = runtime().unwrap().config.profile;
            assert_eq!(crate::profile_of_build_version(s), Some(profile), "{s}");
            assert_eq!(
                hsa_system_get_info(SystemInfo(0x4242), (&raw mut w).cast()),
                Status::ERROR_INVALID_ARGUMENT
            );
            assert_eq!(hsa_shut_down(), Status::SUCCESS);
            assert_eq!(hsa_shut_down(), Status::ERROR_NOT_INITIALIZED);
        }
    }

    #[test]
    fn a_panic_becomes_a_status() {
        let _g = crate::config::serial_test_guard();
        let st = guard(|| panic!("boom"));
        assert_eq!(st, Status::ERROR);
        assert!(crate::last_error().unwrap().contains("boom"));
    }
}
