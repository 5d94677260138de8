//! The pool allocation and dmabuf entry points over [`super::Memory`].

use std::ffi::{c_int, c_void};

use hsa_core::sys::{Agent, MemoryPool, Status};

use crate::agents::AgentKind;
use crate::counters::{Counter, bump};
use crate::runtime::{guard, report, runtime};
use crate::status::{SimError, record};

/// `hsa_amd_memory_pool_allocate`: page-rounded memory from a pool.
///
/// Device-heap requests above 64 MiB fail with `INVALID_ALLOCATION`, and a full heap with
/// `OUT_OF_RESOURCES`. `flags` is accepted and ignored.
///
/// # Safety
/// `ptr` is null (the call fails) or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_memory_pool_allocate(
    pool: MemoryPool,
    size: usize,
    _flags: u32,
    ptr: *mut *mut c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        let Some(desc) = rt.pools.iter().find(|p| p.handle == pool) else {
            return Status::AMD_ERROR_INVALID_MEMORY_POOL;
        };
        if ptr.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        let r = rt.memory().allocate(desc.kind, size).map(|base| {
            bump(Counter::AllocationsCreated);
            // SAFETY: `ptr` is non-null and valid for one pointer write by the contract.
            unsafe { ptr.write(base as *mut c_void) };
        });
        report(r)
    })
}

/// `hsa_amd_memory_pool_free`. Null is accepted; anything but an allocation's start fails
/// with `INVALID_ALLOCATION`.
///
/// # Safety
/// After success the memory is unmapped: the caller must not touch it again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_memory_pool_free(ptr: *mut c_void) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if ptr.is_null() {
            return Status::SUCCESS;
        }
        let r = rt
            .memory()
            .free(ptr as usize)
            .map(|()| bump(Counter::AllocationsFreed));
        report(r)
    })
}

/// `hsa_amd_agents_allow_access`: a no-op for host-mapped pool memory. As in ROCR, naming the
/// AIE agent fails with `INVALID_AGENT`.
///
/// # Safety
/// `agents` is valid for `num_agents` reads; `ptr` is any address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_agents_allow_access(
    num_agents: u32,
    agents: *const Agent,
    _flags: *const u32,
    ptr: *const c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if num_agents == 0 || agents.is_null() || ptr.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        for i in 0..num_agents as usize {
            // SAFETY: `agents` is valid for `num_agents` reads by the contract.
            let a = unsafe { agents.add(i).read_unaligned() };
            match rt.agent_kind(a) {
                Some(AgentKind::Cpu) => {}
                Some(AgentKind::Aie) | None => return Status::ERROR_INVALID_AGENT,
            }
        }
        if rt.memory().resolve(ptr as u64).is_none() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        Status::SUCCESS
    })
}

/// `hsa_amd_portable_export_dmabuf`: refused on every profile, with the status ROCR gives
/// (the crate docs cite the sources): `HSA_STATUS_ERROR` for AIE memory,
/// `INVALID_AGENT` for CPU-pool memory, `INVALID_ALLOCATION` for anything else. `*dmabuf` is
/// set to -1, so that closing it with `hsa_amd_portable_close_dmabuf` succeeds as it does in
/// ROCR's AIE memory test. Export AIE tensors with `hsa_amd_vmem_export_shareable_handle`
/// (`rocr-newest`).
///
/// # Safety
/// `dmabuf` and `offset` are null (the call fails) or valid for one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_portable_export_dmabuf(
    ptr: *const c_void,
    size: usize,
    dmabuf: *mut c_int,
    offset: *mut u64,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if ptr.is_null() || dmabuf.is_null() || offset.is_null() || size == 0 {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: `dmabuf` is non-null and valid for one write by the contract.
        unsafe { dmabuf.write(-1) };
        let e = rt
            .memory()
            .export_refusal(ptr as usize, size, rt.config.profile);
        report(Err(e))
    })
}

/// `hsa_amd_portable_close_dmabuf`: closes `dmabuf` with `close(2)`, as ROCR's
/// `Runtime::DmaBufClose` does whatever made the fd (a vmem export, for the emulator), and
/// fails with `HSA_STATUS_ERROR_RESOURCE_FREE` when `close` does (an fd that is not open). A
/// negative fd (what a refused export leaves) succeeds with nothing to close, as in ROCR's AIE
/// memory test (`rocr-aie-hsaco.md` §6).
///
/// # Safety
/// `dmabuf` is negative or an fd the caller owns and gives up, as with `close(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_portable_close_dmabuf(dmabuf: c_int) -> Status {
    guard(|| match runtime() {
        Ok(_) if dmabuf < 0 => Status::SUCCESS,
        // SAFETY: the caller owns `dmabuf` and gives it up (the contract above).
        Ok(_) => match unsafe { libc::close(dmabuf) } {
            0 => {
                bump(Counter::DmabufsClosed);
                Status::SUCCESS
            }
            _ => {
                let e = std::io::Error::last_os_error();
                record(&SimError::new(
                    Status::ERROR_RESOURCE_FREE,
                    format!("hsa_amd_portable_close_dmabuf: close({dmabuf}) failed: {e}"),
                ));
                Status::ERROR_RESOURCE_FREE
            }
        },
        Err(st) => st,
    })
}

/// `hsa_amd_memory_lock`: as in ROCR, naming the AIE agent fails with `INVALID_AGENT` (the
/// AIE driver cannot use locked user memory); with CPU agents only it succeeds and
/// `*agent_ptr` is `host_ptr`. Nothing is pinned: the emulator has no device to pin for.
///
/// # Safety
/// `agents` is valid for `num_agent` reads (or null when it is 0); `agent_ptr` is null (the
/// call fails) or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_memory_lock(
    host_ptr: *mut c_void,
    size: usize,
    agents: *const Agent,
    num_agent: c_int,
    agent_ptr: *mut *mut c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        let n = usize::try_from(num_agent).unwrap_or(0);
        if host_ptr.is_null() || size == 0 || agent_ptr.is_null() || (n > 0 && agents.is_null()) {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        for i in 0..n {
            // SAFETY: `agents` is valid for `num_agent` reads by the contract.
            let a = unsafe { agents.add(i).read_unaligned() };
            if rt.agent_kind(a) != Some(AgentKind::Cpu) {
                return Status::ERROR_INVALID_AGENT;
            }
        }
        // SAFETY: `agent_ptr` is non-null and valid for one pointer write by the contract.
        unsafe { agent_ptr.write(host_ptr) };
        Status::SUCCESS
    })
}

/// `hsa_amd_memory_unlock`: the counterpart of [`hsa_amd_memory_lock`]; nothing to undo.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_memory_unlock(host_ptr: *mut c_void) -> Status {
    guard(|| match runtime() {
        Ok(_) if host_ptr.is_null() => Status::ERROR_INVALID_ARGUMENT,
        Ok(_) => Status::SUCCESS,
        Err(st) => st,
    })
}
