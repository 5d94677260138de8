//! The five pool and pointer entry points of `hsa_ext_amd.h` ROCR's AIE memory test binds
//! (`test_memory.cc`), with what ROCR's implementation (`hsa_ext_amd.cpp`,
//! `amd_memory_region.cpp`, `runtime.cpp`) answers for the CPU and AIE agents:
//!
//! | Entry point | Answer |
//! |---|---|
//! | `hsa_amd_agent_memory_pool_get_info` | `MemoryRegion::GetAgentPoolInfo`: `ACCESS` is ALLOWED_BY_DEFAULT for the pool's own agent and for the CPU asking about any pool (every pool is system memory), DISALLOWED_BY_DEFAULT for the AIE agent asking about a CPU pool; `NUM_LINK_HOPS` 0 for the owner, 1 otherwise; `LINK_INFO` zeroed (the emulator has no link properties); another attribute `INVALID_ARGUMENT` |
//! | `hsa_amd_memory_lock_to_pool` | arguments checked as ROCR does; a pool not owned by the CPU agent `INVALID_MEMORY_POOL`; then `hsa_amd_memory_lock`'s rule: naming the AIE agent `INVALID_AGENT`, CPU agents only: `*agent_ptr = host_ptr` |
//! | `hsa_amd_memory_pool_can_migrate` | `MemoryRegion::CanMigrate` is not implemented: `OUT_OF_RESOURCES` with `*result = false` for any two pools |
//! | `hsa_amd_interop_map_buffer` | KFD only (`hsaKmtRegisterGraphicsHandleToNodes`), and neither agent is a KFD GPU: `HSA_STATUS_ERROR` once the arguments pass |
//! | `hsa_amd_pointer_info` | see [`hsa_amd_pointer_info`] |

use std::ffi::{c_int, c_void};

use hsa_core::sys::{Agent, DEVICE_HEAP_DEVICE_BASE, MemoryPool, Status};

use super::Owner;
use crate::agents::{AgentKind, PoolKind};
use crate::runtime::{Runtime, guard, runtime};

/// `HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS`.
pub const AGENT_POOL_INFO_ACCESS: u32 = 0;
/// `HSA_AMD_AGENT_MEMORY_POOL_INFO_NUM_LINK_HOPS`.
pub const AGENT_POOL_INFO_NUM_LINK_HOPS: u32 = 1;
/// `HSA_AMD_AGENT_MEMORY_POOL_INFO_LINK_INFO`.
pub const AGENT_POOL_INFO_LINK_INFO: u32 = 2;
/// `HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED`.
pub const POOL_ACCESS_NEVER_ALLOWED: u32 = 0;
/// `HSA_AMD_MEMORY_POOL_ACCESS_ALLOWED_BY_DEFAULT`.
pub const POOL_ACCESS_ALLOWED_BY_DEFAULT: u32 = 1;
/// `HSA_AMD_MEMORY_POOL_ACCESS_DISALLOWED_BY_DEFAULT`.
pub const POOL_ACCESS_DISALLOWED_BY_DEFAULT: u32 = 2;
/// `sizeof(hsa_amd_memory_pool_link_info_t)`: four u32, three bools, a u32 enum, a u32.
pub const POOL_LINK_INFO_SIZE: usize = 28;

/// `hsa_amd_pointer_type_t`: `HSA_EXT_POINTER_TYPE_UNKNOWN`.
pub const POINTER_TYPE_UNKNOWN: u32 = 0;
/// `HSA_EXT_POINTER_TYPE_HSA`.
pub const POINTER_TYPE_HSA: u32 = 1;

/// `sizeof(hsa_amd_pointer_info_t)` on LP64.
pub const POINTER_INFO_SIZE: u32 = 56;

/// `hsa_amd_pointer_info_t` as `hsa_ext_amd.h` lays it out ([`POINTER_INFO_SIZE`] bytes on LP64).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PointerInfo {
    /// Set by the caller to the size it has; the runtime writes at most that many bytes.
    pub size: u32,
    /// `hsa_amd_pointer_type_t`.
    pub kind: u32,
    pub agent_base_address: *mut c_void,
    pub host_base_address: *mut c_void,
    pub size_in_bytes: usize,
    pub user_data: *mut c_void,
    pub agent_owner: Agent,
    pub global_flags: u32,
}

impl Default for PointerInfo {
    fn default() -> Self {
        Self {
            size: 0,
            kind: POINTER_TYPE_UNKNOWN,
            agent_base_address: std::ptr::null_mut(),
            host_base_address: std::ptr::null_mut(),
            size_in_bytes: 0,
            user_data: std::ptr::null_mut(),
            agent_owner: Agent::default(),
            global_flags: 0,
        }
    }
}

fn pool_of(rt: &Runtime, pool: MemoryPool) -> Option<crate::agents::PoolDesc> {
    rt.pools.iter().find(|p| p.handle == pool).copied()
}

/// `hsa_amd_agent_memory_pool_get_info` (see the module table).
///
/// # Safety
/// `value` is null (the call fails) or valid for a write of the attribute's type: a `u32` for
/// `ACCESS` and `NUM_LINK_HOPS`, [`POOL_LINK_INFO_SIZE`] bytes for `LINK_INFO`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_agent_memory_pool_get_info(
    agent: Agent,
    pool: MemoryPool,
    attribute: u32,
    value: *mut c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if value.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        let Some(kind) = rt.agent_kind(agent) else {
            return Status::ERROR_INVALID_AGENT;
        };
        let Some(desc) = pool_of(&rt, pool) else {
            return Status::AMD_ERROR_INVALID_MEMORY_POOL;
        };
        let own = desc.owner == agent;
        let access = if own || kind == AgentKind::Cpu {
            POOL_ACCESS_ALLOWED_BY_DEFAULT
        } else {
            POOL_ACCESS_DISALLOWED_BY_DEFAULT
        };
        // SAFETY: (every arm) `value` is non-null and valid for the attribute's type.
        unsafe {
            match attribute {
                AGENT_POOL_INFO_ACCESS => value.cast::<u32>().write_unaligned(access),
                AGENT_POOL_INFO_NUM_LINK_HOPS => {
                    value.cast::<u32>().write_unaligned(u32::from(!own));
                }
                AGENT_POOL_INFO_LINK_INFO => value.cast::<u8>().write_bytes(0, POOL_LINK_INFO_SIZE),
                _ => return Status::ERROR_INVALID_ARGUMENT,
            }
        }
        Status::SUCCESS
    })
}

/// `hsa_amd_memory_lock_to_pool` (see the module table).
///
/// # Safety
/// `agents` is valid for `num_agent` reads (or null when it is 0); `agent_ptr` is null (the
/// call fails) or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_memory_lock_to_pool(
    host_ptr: *mut c_void,
    size: usize,
    agents: *const Agent,
    num_agent: c_int,
    pool: MemoryPool,
    flags: u32,
    agent_ptr: *mut *mut c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if size == 0 || host_ptr.is_null() || agent_ptr.is_null() || flags != 0 {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: `agent_ptr` is non-null and valid for one pointer write by the contract.
        unsafe { agent_ptr.write(std::ptr::null_mut()) };
        if agents.is_null() != (num_agent == 0) {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        match pool_of(&rt, pool) {
            Some(d) if d.owner == rt.cpu_agent => {}
            _ => return Status::AMD_ERROR_INVALID_MEMORY_POOL,
        }
        // SAFETY: the caller's contract is `hsa_amd_memory_lock`'s.
        unsafe { super::hsa_amd_memory_lock(host_ptr, size, agents, num_agent, agent_ptr) }
    })
}

/// `hsa_amd_memory_pool_can_migrate` (see the module table).
///
/// # Safety
/// `result` is null (the call fails) or valid for one `bool` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_memory_pool_can_migrate(
    src: MemoryPool,
    dst: MemoryPool,
    result: *mut bool,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if result.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        if pool_of(&rt, src).is_none() || pool_of(&rt, dst).is_none() {
            return Status::AMD_ERROR_INVALID_MEMORY_POOL;
        }
        // SAFETY: `result` is non-null and valid for one write by the contract.
        unsafe { result.write(false) };
        Status::ERROR_OUT_OF_RESOURCES
    })
}

/// `hsa_amd_interop_map_buffer` (see the module table). `ptr`, `size` and the metadata
/// outputs are never written.
///
/// # Safety
/// `agents` is valid for `num_agents` reads (or null, which fails).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_interop_map_buffer(
    num_agents: u32,
    agents: *const Agent,
    _interop_handle: c_int,
    flags: u32,
    size: *mut usize,
    ptr: *mut *mut c_void,
    _metadata_size: *mut usize,
    _metadata: *mut *const c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if agents.is_null() || size.is_null() || ptr.is_null() || flags != 0 || num_agents == 0 {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        for i in 0..num_agents as usize {
            // SAFETY: `agents` is valid for `num_agents` reads by the contract.
            let a = unsafe { agents.add(i).read_unaligned() };
            if rt.agent_kind(a).is_none() {
                return Status::ERROR_INVALID_AGENT;
            }
        }
        crate::status::record(&crate::status::SimError::new(
            Status::ERROR,
            "hsa_amd_interop_map_buffer: ROCR imports interop buffers through KFD \
             (hsaKmtRegisterGraphicsHandleToNodes) onto GPU nodes only; neither the CPU nor the \
             AIE agent is one",
        ));
        Status::ERROR
    })
}

/// What `hsa_amd_pointer_info` reports for `ptr`: `(type, agent base, host base, size, owner,
/// global flags, agents with access)`.
fn describe(rt: &Runtime, ptr: u64) -> Option<PointerInfo> {
    let mem = rt.memory();
    let r = mem.resolve(ptr)?;
    let Owner::Pool(kind) = r.owner else {
        // vmem mappings: ROCR's thunk query does not know a reserved range either.
        return None;
    };
    let owner = if kind.is_aie() {
        if !rt.config.profile.pointer_info_knows_aie_memory() {
            return None;
        }
        rt.aie_agent
    } else {
        rt.cpu_agent
    };
    let agent_base = if kind == PoolKind::DeviceHeap {
        DEVICE_HEAP_DEVICE_BASE + (r.base - mem.heap_base())
    } else {
        r.base
    };
    Some(PointerInfo {
        size: 0,
        kind: POINTER_TYPE_HSA,
        agent_base_address: agent_base as *mut c_void,
        host_base_address: r.base as *mut c_void,
        size_in_bytes: usize::try_from(r.len).unwrap_or(usize::MAX),
        user_data: std::ptr::null_mut(),
        agent_owner: owner,
        global_flags: kind.global_flags(),
    })
}

/// `hsa_amd_pointer_info`: a pool allocation containing `ptr` is `HSA_EXT_POINTER_TYPE_HSA`,
/// with its base (host and agent; the device heap's agent address is its device address), its
/// page-rounded size, the owning agent and the pool's flags, as the newest ROCR answers by
/// asking the driver that owns the allocation (ROCR's AIE memory test, `PointerInfo`). Older
/// releases ask KFD's thunk only, which does not know AIE memory
/// ([`crate::Profile::pointer_info_knows_aie_memory`]): there, and for anything else (vmem
/// mappings, unknown addresses), the type is `UNKNOWN` and the call still succeeds.
/// `info->size` 0 is `INVALID_ARGUMENT`; at most `info->size` bytes are written. With
/// `alloc`, `num_agents` and `accessible` all given, the agents that can reach a known
/// allocation (its owner, and the CPU for AIE memory, which is host-mapped) are returned in a
/// block from `alloc`.
///
/// # Safety
/// `info` is null (the call fails) or valid for reads and writes of `info->size` bytes;
/// `alloc` is null or a valid allocator; `num_agents` and `accessible` are null or valid for
/// one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_pointer_info(
    ptr: *const c_void,
    info: *mut PointerInfo,
    alloc: Option<unsafe extern "C" fn(usize) -> *mut c_void>,
    num_agents: *mut u32,
    accessible: *mut *mut Agent,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if info.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: `info` is non-null; its first field is readable by the contract.
        let caller_size = unsafe { info.cast::<u32>().read_unaligned() };
        if caller_size == 0 {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        // `PointerInfo` is 56 bytes, so the count fits both types.
        let n = (caller_size as usize).min(size_of::<PointerInfo>());
        let n32 = caller_size.min(POINTER_INFO_SIZE);
        let found = describe(&rt, ptr as u64);
        let mut out = found.unwrap_or_default();
        out.size = n32;
        // SAFETY: `info` is valid for `caller_size >= n` bytes; `out` is a live local.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const out).cast::<u8>(), info.cast::<u8>(), n);
        }
        let (Some(found), Some(alloc)) = (found, alloc) else {
            return Status::SUCCESS;
        };
        if num_agents.is_null() || accessible.is_null() {
            return Status::SUCCESS;
        }
        let mut list = vec![found.agent_owner];
        if found.agent_owner != rt.cpu_agent {
            list.push(rt.cpu_agent);
        }
        // SAFETY: `alloc` is a valid allocator by the contract.
        let block = unsafe { alloc(size_of::<Agent>() * list.len()) }.cast::<Agent>();
        if block.is_null() {
            return Status::ERROR_OUT_OF_RESOURCES;
        }
        // SAFETY: `block` holds `list.len()` agents; the outputs are valid for one write each.
        unsafe {
            for (i, a) in list.iter().enumerate() {
                block.add(i).write_unaligned(*a);
            }
            accessible.write(block);
            num_agents.write(if list.len() == 2 { 2 } else { 1 });
        }
        Status::SUCCESS
    })
}
