//! The core HSA region API (`hsa_agent_iterate_regions`, `hsa_region_get_info`,
//! `hsa_memory_allocate`, `hsa_memory_free`), which older IRON versions use instead of the
//! AMD pool API.
//!
//! In ROCR a region and a memory pool are the same object: `hsa_region_t` and
//! `hsa_amd_memory_pool_t` carry the same handle. The emulator does the same, so a region
//! found here can be passed to the pool functions and back.

use std::ffi::c_void;

use hsa_core::sys::{Agent, MemoryPool, PoolInfo, Status};

use crate::runtime::{guard, runtime};
use crate::{hsa_amd_memory_pool_allocate, hsa_amd_memory_pool_free, hsa_amd_memory_pool_get_info};

/// `hsa_region_t`: the same handle as the pool.
pub type Region = MemoryPool;

/// `hsa_region_info_t` ids the emulator answers.
pub mod region_info {
    pub const SEGMENT: u32 = 0;
    pub const GLOBAL_FLAGS: u32 = 1;
    pub const SIZE: u32 = 2;
    pub const ALLOC_MAX_SIZE: u32 = 4;
    pub const RUNTIME_ALLOC_ALLOWED: u32 = 5;
    pub const RUNTIME_ALLOC_GRANULE: u32 = 6;
    pub const RUNTIME_ALLOC_ALIGNMENT: u32 = 7;
    /// `HSA_AMD_REGION_INFO_HOST_ACCESSIBLE`.
    pub const AMD_HOST_ACCESSIBLE: u32 = 0xA000;
}

fn known_region(region: Region) -> Result<(), Status> {
    let rt = runtime()?;
    if rt.pools.iter().any(|p| p.handle == region) {
        Ok(())
    } else {
        Err(Status::ERROR_INVALID_REGION)
    }
}

/// `hsa_agent_iterate_regions`: the agent's pools, as regions, in ROCR's order.
///
/// # Safety
/// `callback` is a valid function (or null, which fails); it is called with `data` as given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_agent_iterate_regions(
    agent: Agent,
    callback: Option<unsafe extern "C" fn(Region, *mut c_void) -> Status>,
    data: *mut c_void,
) -> Status {
    // SAFETY: a region callback has the pool callback's ABI (both handles are one u64), and
    // the caller's contract is forwarded unchanged.
    unsafe { crate::hsa_amd_agent_iterate_memory_pools(agent, callback, data) }
}

/// `hsa_region_get_info`, answered from the pool behind the region. Unknown regions give
/// `INVALID_REGION`.
///
/// # Safety
/// `value` is null (the call fails) or valid for a write of the attribute's type: `u32` for
/// SEGMENT and GLOBAL_FLAGS, `bool` for RUNTIME_ALLOC_ALLOWED and HOST_ACCESSIBLE, `size_t`
/// otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_region_get_info(
    region: Region,
    attr: u32,
    value: *mut c_void,
) -> Status {
    guard(|| {
        if let Err(st) = known_region(region) {
            return st;
        }
        if value.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        let pool_attr = match attr {
            region_info::SEGMENT => PoolInfo::SEGMENT,
            region_info::GLOBAL_FLAGS => PoolInfo::GLOBAL_FLAGS,
            region_info::SIZE => PoolInfo::SIZE,
            region_info::ALLOC_MAX_SIZE => PoolInfo::ALLOC_MAX_SIZE,
            region_info::RUNTIME_ALLOC_ALLOWED => PoolInfo::RUNTIME_ALLOC_ALLOWED,
            region_info::RUNTIME_ALLOC_GRANULE => PoolInfo::RUNTIME_ALLOC_GRANULE,
            region_info::RUNTIME_ALLOC_ALIGNMENT => PoolInfo::RUNTIME_ALLOC_ALIGNMENT,
            region_info::AMD_HOST_ACCESSIBLE => PoolInfo::ACCESSIBLE_BY_ALL,
            _ => return Status::ERROR_INVALID_ARGUMENT,
        };
        // SAFETY: the pool attribute writes the same type the region attribute documents,
        // into the caller's buffer.
        unsafe { hsa_amd_memory_pool_get_info(region, pool_attr, value) }
    })
}

/// `hsa_memory_allocate`: [`hsa_amd_memory_pool_allocate`] on the region's pool.
///
/// # Safety
/// As for [`hsa_amd_memory_pool_allocate`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_memory_allocate(
    region: Region,
    size: usize,
    ptr: *mut *mut c_void,
) -> Status {
    guard(|| {
        if let Err(st) = known_region(region) {
            return st;
        }
        // SAFETY: the caller's contract is forwarded unchanged.
        unsafe { hsa_amd_memory_pool_allocate(region, size, 0, ptr) }
    })
}

/// `hsa_memory_free`: [`hsa_amd_memory_pool_free`].
///
/// # Safety
/// As for [`hsa_amd_memory_pool_free`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_memory_free(ptr: *mut c_void) -> Status {
    // SAFETY: the caller's contract is forwarded unchanged.
    unsafe { hsa_amd_memory_pool_free(ptr) }
}
