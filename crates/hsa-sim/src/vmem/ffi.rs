//! The `hsa_amd_vmem_*` entry points over [`super::VmemState`].

use std::ffi::{c_int, c_void};
use std::os::fd::IntoRawFd;
use std::sync::Arc;

use hsa_core::sys::{
    AccessDesc, AccessPermission, Agent, MemoryPool, MemoryType, Status, VmemHandle,
};

use super::{HandleObj, invalid, invalid_allocation};
use crate::agents::{PoolKind, page_size};
use crate::counters::{Counter, bump};
use crate::memory::seal_size;
use crate::runtime::{Runtime, guard, next_handle, report, runtime};
use crate::status::SimError;

fn vmem_call(f: impl FnOnce(&Runtime) -> Result<(), SimError>) -> Status {
    guard(|| match runtime() {
        Ok(rt) => report(f(&rt)),
        Err(st) => st,
    })
}

/// `hsa_amd_vmem_handle_create`: a physical allocation of `size` bytes (a multiple of the
/// pool's `RUNTIME_ALLOC_GRANULE`) from a data pool.
///
/// # Safety
/// `out` is null (the call fails) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_handle_create(
    pool: MemoryPool,
    size: usize,
    mem_type: MemoryType,
    _flags: u64,
    out: *mut VmemHandle,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        let Some(desc) = rt.pools.iter().find(|p| p.handle == pool) else {
            // ROCR checks the pool with the other arguments here (not INVALID_MEMORY_POOL).
            return Status::ERROR_INVALID_ARGUMENT;
        };
        if out.is_null() || size == 0 || mem_type.0 > MemoryType::PINNED.0 {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        vmem_call(|rt| {
            let h = rt
                .memory()
                .vmem
                .create_handle(pool, desc.kind, size, mem_type)?;
            bump(Counter::VmemHandlesCreated);
            // SAFETY: `out` is non-null and valid for one write by the contract.
            unsafe { out.write(VmemHandle { handle: h }) };
            Ok(())
        })
    })
}

/// `hsa_amd_vmem_handle_release`. The memory lives on while a mapping uses it.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_handle_release(h: VmemHandle) -> Status {
    vmem_call(|rt| {
        rt.memory().vmem.release_handle(h.handle)?;
        bump(Counter::VmemHandlesReleased);
        Ok(())
    })
}

/// `hsa_amd_vmem_address_reserve_align`: an inaccessible range of `size` bytes (a page
/// multiple), aligned to `alignment` (0 = page). `address` and `flags` are ignored.
///
/// # Safety
/// `va` is null (the call fails) or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_address_reserve_align(
    va: *mut *mut c_void,
    size: usize,
    _address: u64,
    alignment: u64,
    _flags: u64,
) -> Status {
    if va.is_null() {
        return guard(|| runtime().err().unwrap_or(Status::ERROR_INVALID_ARGUMENT));
    }
    vmem_call(|rt| {
        let base = rt.memory().vmem.reserve(size, alignment)?;
        bump(Counter::ReservationsCreated);
        // SAFETY: `va` is non-null and valid for one pointer write by the contract.
        unsafe { va.write(base as *mut c_void) };
        Ok(())
    })
}

/// `hsa_amd_vmem_address_reserve`: [`hsa_amd_vmem_address_reserve_align`] with page alignment.
///
/// # Safety
/// As for [`hsa_amd_vmem_address_reserve_align`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_address_reserve(
    va: *mut *mut c_void,
    size: usize,
    address: u64,
    flags: u64,
) -> Status {
    // SAFETY: the same contract, forwarded.
    unsafe { hsa_amd_vmem_address_reserve_align(va, size, address, 0, flags) }
}

/// `hsa_amd_vmem_address_free`: fails with `HSA_STATUS_ERROR` while mappings remain.
///
/// # Safety
/// After success the range is unmapped: the caller must not touch it again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_address_free(va: *mut c_void, size: usize) -> Status {
    vmem_call(|rt| {
        rt.memory().vmem.free_reservation(va as usize, size)?;
        bump(Counter::ReservationsFreed);
        Ok(())
    })
}

/// `hsa_amd_vmem_map`: maps `size` bytes of `h` from `in_offset` at `va`, inside a reservation.
///
/// # Safety
/// `va` must come from `hsa_amd_vmem_address_reserve*`; the range is replaced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_map(
    va: *mut c_void,
    size: usize,
    in_offset: usize,
    h: VmemHandle,
    _flags: u64,
) -> Status {
    vmem_call(|rt| {
        rt.memory()
            .vmem
            .map(va as usize, size, in_offset, h.handle)?;
        bump(Counter::MappingsCreated);
        Ok(())
    })
}

/// `hsa_amd_vmem_unmap`: removes every agent's access and unmaps, as ROCR's `VMemoryHandleUnmap` does;
/// the range stays reserved.
///
/// # Safety
/// After success the range is inaccessible: the caller must not touch it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_unmap(va: *mut c_void, size: usize) -> Status {
    vmem_call(|rt| {
        rt.memory().vmem.unmap(va as usize, size)?;
        bump(Counter::MappingsDestroyed);
        Ok(())
    })
}

/// `hsa_amd_vmem_set_access`: records each agent's permission on the mappings in
/// `[va, va+size)`; `va` must start a mapping.
///
/// # Safety
/// `desc` is valid for `desc_cnt` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_set_access(
    va: *mut c_void,
    size: usize,
    desc: *const AccessDesc,
    desc_cnt: usize,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if desc.is_null() || desc_cnt == 0 {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        let mut descs = Vec::with_capacity(desc_cnt);
        for i in 0..desc_cnt {
            // SAFETY: `desc` is valid for `desc_cnt` reads by the contract.
            let d = unsafe { desc.add(i).read_unaligned() };
            if rt.agent_kind(d.agent_handle).is_none() {
                return Status::ERROR_INVALID_AGENT;
            }
            if d.permissions.0 > AccessPermission::RW.0 {
                return Status::ERROR_INVALID_ARGUMENT;
            }
            descs.push((d.agent_handle, d.permissions));
        }
        report(rt.memory().vmem.set_access(va as usize, size, &descs))
    })
}

/// `hsa_amd_vmem_get_access`: `agent`'s permission on the mapping containing `va`.
///
/// # Safety
/// `perms` is null (the call fails) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_get_access(
    va: *mut c_void,
    perms: *mut AccessPermission,
    agent: Agent,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if rt.agent_kind(agent).is_none() {
            return Status::ERROR_INVALID_AGENT;
        }
        if perms.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        let mem = rt.memory();
        let Some((_, m)) = mem.vmem.mapping_of(va as usize) else {
            return Status::ERROR_INVALID_ALLOCATION;
        };
        // SAFETY: `perms` is non-null and valid for one write by the contract.
        unsafe { perms.write(m.access_of(agent)) };
        Status::SUCCESS
    })
}

/// `hsa_amd_vmem_export_shareable_handle`: on `rocr-newest`, a dup of the handle's memfd,
/// sealed against shrinking and growing before it is handed out (`ftruncate` on it fails with
/// `EPERM`, so a client cannot make the emulator's own mappings fault); the caller closes it
/// with `close(2)`. An AIE-pool handle on an older profile, or an imported handle on any,
/// fails with `HSA_STATUS_ERROR`.
///
/// # Safety
/// `dmabuf_fd` is null (the call fails) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_export_shareable_handle(
    dmabuf_fd: *mut c_int,
    h: VmemHandle,
    _flags: u64,
) -> Status {
    if dmabuf_fd.is_null() {
        return guard(|| runtime().err().unwrap_or(Status::ERROR_INVALID_ARGUMENT));
    }
    vmem_call(|rt| {
        let mem = rt.memory();
        let what = "hsa_amd_vmem_export_shareable_handle";
        let obj =
            mem.vmem.handles.get(&h.handle).ok_or_else(|| {
                invalid_allocation(format!("{what}: unknown handle {:#x}", h.handle))
            })?;
        let profile = rt.config.profile;
        if obj.imported {
            return Err(SimError::new(
                Status::ERROR,
                format!(
                    "{what}: handle {:#x} was imported; ROCR exports only handles it allocated",
                    h.handle
                ),
            ));
        }
        if obj.kind.is_aie() && !profile.vmem_exports_aie_handles() {
            return Err(SimError::new(
                Status::ERROR,
                format!(
                    "{what}: handle {:#x} is from {}; {profile} does not export AIE memory \
                     (rocr-newest does)",
                    h.handle,
                    obj.kind.describe()
                ),
            ));
        }
        seal_size(&obj.fd)?;
        let fd = rustix::io::dup(&*obj.fd)
            .map_err(|e| SimError::new(Status::ERROR_OUT_OF_RESOURCES, format!("dup: {e}")))?;
        bump(Counter::ShareableHandlesExported);
        // SAFETY: `dmabuf_fd` is non-null and valid for one write by the contract.
        unsafe { dmabuf_fd.write(fd.into_raw_fd()) };
        Ok(())
    })
}

/// `hsa_amd_vmem_import_shareable_handle`: a new handle over a dup of `fd` (a memfd or any
/// mappable file), sized by `fstat`. The caller keeps its own fd. `rocm-7.0` and
/// `rocr-late-2025` import only a GPU region's dmabuf, and the emulator has no GPU: there it
/// fails with `INVALID_ALLOCATION`.
///
/// # Safety
/// `out` is null (the call fails) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_import_shareable_handle(
    fd: c_int,
    out: *mut VmemHandle,
) -> Status {
    if out.is_null() || fd < 0 {
        return guard(|| runtime().err().unwrap_or(Status::ERROR_INVALID_ARGUMENT));
    }
    vmem_call(|rt| {
        if !rt.config.profile.vmem_imports() {
            return Err(invalid_allocation(format!(
                "hsa_amd_vmem_import_shareable_handle: fd {fd}: {} imports only dmabufs of GPU \
                 regions through KFD, and there is no GPU agent",
                rt.config.profile
            )));
        }
        // SAFETY: the fd is only borrowed for `dup` and `fstat` while the caller keeps it
        // open (the caller's contract: it passes an open descriptor).
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let bad = |e| {
            invalid(format!(
                "hsa_amd_vmem_import_shareable_handle: fd {fd}: {e}"
            ))
        };
        let st = rustix::fs::fstat(borrowed).map_err(bad)?;
        let dup = rustix::io::dup(borrowed).map_err(bad)?;
        let size = usize::try_from(st.st_size).unwrap_or(0);
        if size == 0 || !size.is_multiple_of(page_size()) {
            return Err(invalid(format!(
                "hsa_amd_vmem_import_shareable_handle: fd {fd} has size {size}, not a page multiple"
            )));
        }
        let data_pool = rt
            .pools
            .iter()
            .find(|p| p.kind == PoolKind::Data)
            .map(|p| p.handle);
        let h = next_handle();
        rt.memory().vmem.handles.insert(
            h,
            HandleObj {
                pool: data_pool.unwrap_or_default(),
                kind: PoolKind::Data,
                mem_type: MemoryType::PINNED,
                size,
                fd: Arc::new(dup),
                refs: 1,
                imported: true,
            },
        );
        bump(Counter::VmemHandlesCreated);
        // SAFETY: `out` is non-null and valid for one write by the contract.
        unsafe { out.write(VmemHandle { handle: h }) };
        Ok(())
    })
}

/// `hsa_amd_vmem_retain_alloc_handle`: another reference to the handle mapped at `addr`;
/// release it with `hsa_amd_vmem_handle_release`.
///
/// # Safety
/// `out` is null (the call fails) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_retain_alloc_handle(
    out: *mut VmemHandle,
    addr: *mut c_void,
) -> Status {
    if out.is_null() {
        return guard(|| runtime().err().unwrap_or(Status::ERROR_INVALID_ARGUMENT));
    }
    vmem_call(|rt| {
        let mut mem = rt.memory();
        let (_, m) = mem.vmem.mapping_of(addr as usize).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_retain_alloc_handle: nothing is mapped at {addr:p}"
            ))
        })?;
        let (h, pool, kind, mem_type, fd) = (m.handle, m.pool, m.kind, m.mem_type, m.fd.clone());
        let imported = m.imported;
        let size = usize::try_from(rustix::fs::fstat(&*fd).map_or(0, |s| s.st_size)).unwrap_or(0);
        mem.vmem
            .handles
            .entry(h)
            .and_modify(|o| o.refs += 1)
            .or_insert(HandleObj {
                pool,
                kind,
                mem_type,
                size,
                fd,
                refs: 1,
                imported,
            });
        bump(Counter::VmemHandlesCreated);
        // SAFETY: `out` is non-null and valid for one write by the contract.
        unsafe { out.write(VmemHandle { handle: h }) };
        Ok(())
    })
}

/// `hsa_amd_vmem_get_alloc_properties_from_handle`: the handle's pool and memory type.
///
/// # Safety
/// `pool` and `mem_type` are null (the call fails) or valid for one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_vmem_get_alloc_properties_from_handle(
    h: VmemHandle,
    pool: *mut MemoryPool,
    mem_type: *mut MemoryType,
) -> Status {
    if pool.is_null() || mem_type.is_null() {
        return guard(|| runtime().err().unwrap_or(Status::ERROR_INVALID_ARGUMENT));
    }
    vmem_call(|rt| {
        let mem = rt.memory();
        let obj = mem.vmem.handles.get(&h.handle).ok_or_else(|| {
            invalid_allocation(format!(
                "hsa_amd_vmem_get_alloc_properties_from_handle: unknown handle {:#x}",
                h.handle
            ))
        })?;
        // SAFETY: both out-pointers are non-null and valid for one write by the contract.
        unsafe {
            pool.write(obj.pool);
            mem_type.write(obj.mem_type);
        }
        Ok(())
    })
}
