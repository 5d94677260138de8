//! Virtual memory (`hsa_amd_vmem_*`), as the newest ROCR does it for the AIE agent.
//!
//! - A handle is a memfd of the requested size (a multiple of the pool's
//!   `RUNTIME_ALLOC_GRANULE`, the page size).
//! - A reservation is an inaccessible anonymous range (`NO_REGISTER` or not: there is no KFD
//!   to register with). The address hint is ignored.
//! - `map` maps the handle's memfd `MAP_SHARED` and read-write over part of a reservation.
//!   The host can use it at once (the XDNA driver's map is a host mmap); what `set_access`
//!   records matters for the AIE agent: only a mapping the AIE agent may read and write is a
//!   valid kernel argument.
//! - `unmap` fails with `HSA_STATUS_ERROR` while any agent still has access, as IRON found:
//!   revoke access (`set_access` NONE) first. `address_free` fails while mappings remain.
//! - A released handle's memory lives on while it is mapped; handles are reference counted
//!   by `hsa_amd_vmem_retain_alloc_handle`.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::os::fd::{IntoRawFd, OwnedFd};
use std::sync::Arc;

use hsa_core::sys::{
    AccessDesc, AccessPermission, Agent, MemoryPool, MemoryType, Status, VmemHandle,
};

use crate::agents::{PoolKind, page_size};
use crate::counters::{Counter, bump};
use crate::memory::{Mapping, Owner, Resolved, new_memfd};
use crate::runtime::{Runtime, guard, next_handle, report, runtime};
use crate::status::SimError;

#[derive(Debug)]
struct HandleObj {
    pool: MemoryPool,
    kind: PoolKind,
    mem_type: MemoryType,
    size: usize,
    fd: Arc<OwnedFd>,
    refs: u32,
}

#[derive(Debug)]
struct VmemMapping {
    len: usize,
    handle: u64,
    pool: MemoryPool,
    kind: PoolKind,
    mem_type: MemoryType,
    fd: Arc<OwnedFd>,
    offset: u64,
    access: Vec<(Agent, AccessPermission)>,
}

impl VmemMapping {
    fn access_of(&self, agent: Agent) -> AccessPermission {
        self.access
            .iter()
            .find(|(a, _)| *a == agent)
            .map_or(AccessPermission::NONE, |&(_, p)| p)
    }
}

#[derive(Debug)]
struct Reservation {
    region: Mapping,
    /// Mappings inside the reservation, by start address.
    mappings: BTreeMap<usize, VmemMapping>,
}

/// The vmem tables of one runtime (part of [`crate::memory::Memory`]).
#[derive(Debug, Default)]
pub(crate) struct VmemState {
    handles: HashMap<u64, HandleObj>,
    reservations: BTreeMap<usize, Reservation>,
    /// The AIE agent, whose access makes a mapping a valid kernel argument.
    aie: Agent,
}

fn invalid(detail: String) -> SimError {
    SimError::new(Status::ERROR_INVALID_ARGUMENT, detail)
}

impl VmemState {
    pub fn new(aie: Agent) -> Self {
        Self {
            aie,
            ..Self::default()
        }
    }

    fn reservation_of(&self, a: usize) -> Option<(usize, &Reservation)> {
        let (&base, r) = self.reservations.range(..=a).next_back()?;
        (a < base + r.region.len).then_some((base, r))
    }

    fn mapping_of(&self, a: usize) -> Option<(usize, &VmemMapping)> {
        let (_, r) = self.reservation_of(a)?;
        let (&base, m) = r.mappings.range(..=a).next_back()?;
        (a < base + m.len).then_some((base, m))
    }

    /// The vmem mapping containing `a`.
    pub fn resolve(&self, a: usize) -> Option<Resolved> {
        let (base, m) = self.mapping_of(a)?;
        Some(Resolved {
            base: base as u64,
            len: m.len as u64,
            owner: Owner::Vmem {
                pool: m.kind,
                aie_access: m.access_of(self.aie),
            },
        })
    }

    /// The memfd behind `[ptr, ptr+size)` and the offset of `ptr` in it.
    pub fn backing(&self, ptr: usize, size: usize) -> Option<(Arc<OwnedFd>, u64)> {
        let (base, m) = self.mapping_of(ptr)?;
        if ptr.checked_add(size)? > base + m.len {
            return None;
        }
        Some((m.fd.clone(), m.offset + (ptr - base) as u64))
    }

    fn create_handle(
        &mut self,
        pool: MemoryPool,
        kind: PoolKind,
        size: usize,
        mem_type: MemoryType,
    ) -> Result<u64, SimError> {
        if kind == PoolKind::DeviceHeap {
            return Err(invalid(
                "hsa_amd_vmem_handle_create: the device heap pool does not back vmem handles"
                    .into(),
            ));
        }
        if size == 0 || !size.is_multiple_of(page_size()) {
            return Err(invalid(format!(
                "hsa_amd_vmem_handle_create: size {size} is not a non-zero multiple of the pool's \
                 RUNTIME_ALLOC_GRANULE ({})",
                page_size()
            )));
        }
        let fd = new_memfd("hsa-sim-vmem", size)?;
        let h = next_handle();
        self.handles.insert(
            h,
            HandleObj {
                pool,
                kind,
                mem_type,
                size,
                fd: Arc::new(fd),
                refs: 1,
            },
        );
        Ok(h)
    }

    fn release_handle(&mut self, h: u64) -> Result<(), SimError> {
        let obj = self.handles.get_mut(&h).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_handle_release: unknown handle {h:#x}"
            ))
        })?;
        obj.refs -= 1;
        if obj.refs == 0 {
            self.handles.remove(&h);
        }
        Ok(())
    }

    fn reserve(&mut self, size: usize, align: u64) -> Result<usize, SimError> {
        if size == 0 || !size.is_multiple_of(page_size()) {
            return Err(invalid(format!(
                "hsa_amd_vmem_address_reserve: size {size} is not a non-zero multiple of the page size"
            )));
        }
        if align != 0 && !align.is_power_of_two() {
            return Err(invalid(format!(
                "hsa_amd_vmem_address_reserve_align: alignment {align:#x} is not a power of two"
            )));
        }
        let align = usize::try_from(align).map_err(|_| invalid("alignment too large".into()))?;
        let region = Mapping::reserve(size, align)?;
        let base = region.addr;
        self.reservations.insert(
            base,
            Reservation {
                region,
                mappings: BTreeMap::new(),
            },
        );
        Ok(base)
    }

    fn free_reservation(&mut self, va: usize, size: usize) -> Result<(), SimError> {
        let r = self.reservations.get(&va).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_address_free: {va:#x} is not a reserved range"
            ))
        })?;
        if r.region.len != size {
            return Err(invalid(format!(
                "hsa_amd_vmem_address_free: size {size} differs from the reservation's {}",
                r.region.len
            )));
        }
        if !r.mappings.is_empty() {
            return Err(SimError::new(
                Status::ERROR,
                format!(
                    "hsa_amd_vmem_address_free: {} mapping(s) remain in [{va:#x}, +{size}); unmap them first",
                    r.mappings.len()
                ),
            ));
        }
        self.reservations.remove(&va);
        Ok(())
    }

    fn map(&mut self, va: usize, size: usize, offset: usize, h: u64) -> Result<(), SimError> {
        let obj = self
            .handles
            .get(&h)
            .ok_or_else(|| invalid(format!("hsa_amd_vmem_map: unknown handle {h:#x}")))?;
        if size == 0 || !va.is_multiple_of(page_size()) || !size.is_multiple_of(page_size()) {
            return Err(invalid(format!(
                "hsa_amd_vmem_map: [{va:#x}, +{size}) is not a non-empty page-aligned range"
            )));
        }
        if offset.checked_add(size).is_none_or(|end| end > obj.size)
            || !offset.is_multiple_of(page_size())
        {
            return Err(invalid(format!(
                "hsa_amd_vmem_map: offset {offset} + size {size} does not fit the {}-byte handle",
                obj.size
            )));
        }
        let (fd, pool, kind, mem_type) = (obj.fd.clone(), obj.pool, obj.kind, obj.mem_type);
        let (rbase, res) = self.reservation_of(va).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_map: {va:#x} is not in a reserved range"
            ))
        })?;
        if va + size > rbase + res.region.len {
            return Err(invalid(format!(
                "hsa_amd_vmem_map: [{va:#x}, +{size}) runs past its reservation"
            )));
        }
        let overlaps = res
            .mappings
            .range(..va + size)
            .next_back()
            .is_some_and(|(&b, m)| b + m.len > va);
        if overlaps {
            return Err(invalid(format!(
                "hsa_amd_vmem_map: [{va:#x}, +{size}) is already mapped"
            )));
        }
        // SAFETY: `[va, va+size)` lies inside a reservation this crate made and overlaps no
        // mapping in it, so MAP_FIXED replaces only our own inaccessible placeholder.
        let m = unsafe { Mapping::shared(&fd, offset as u64, size, Some(va)) }?;
        // The reservation's region owns the range from here on (it unmaps it as a whole).
        std::mem::forget(m);
        let res = self.reservations.get_mut(&rbase).expect("looked up above");
        res.mappings.insert(
            va,
            VmemMapping {
                len: size,
                handle: h,
                pool,
                kind,
                mem_type,
                fd,
                offset: offset as u64,
                access: Vec::new(),
            },
        );
        Ok(())
    }

    fn unmap(&mut self, va: usize, size: usize) -> Result<(), SimError> {
        let (rbase, _) = self.reservation_of(va).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_unmap: {va:#x} is not in a reserved range"
            ))
        })?;
        let res = self.reservations.get_mut(&rbase).expect("looked up above");
        let m = res
            .mappings
            .get(&va)
            .ok_or_else(|| invalid(format!("hsa_amd_vmem_unmap: nothing is mapped at {va:#x}")))?;
        if m.len != size {
            return Err(invalid(format!(
                "hsa_amd_vmem_unmap: size {size} differs from the mapping's {}",
                m.len
            )));
        }
        if let Some((a, p)) = m.access.iter().find(|(_, p)| *p != AccessPermission::NONE) {
            return Err(SimError::new(
                Status::ERROR,
                format!(
                    "hsa_amd_vmem_unmap: agent {:#x} still has {:?} access to [{va:#x}, +{size}); \
                     revoke it with hsa_amd_vmem_set_access(NONE) before unmapping",
                    a.handle, p
                ),
            ));
        }
        res.region.clear_range(va, size)?;
        res.mappings.remove(&va);
        Ok(())
    }

    fn set_access(
        &mut self,
        va: usize,
        size: usize,
        descs: &[(Agent, AccessPermission)],
    ) -> Result<(), SimError> {
        let (rbase, _) = self.reservation_of(va).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_set_access: {va:#x} is not in a reserved range"
            ))
        })?;
        let res = self.reservations.get_mut(&rbase).expect("looked up above");
        if !res.mappings.contains_key(&va) {
            return Err(invalid(format!(
                "hsa_amd_vmem_set_access: nothing is mapped at {va:#x}"
            )));
        }
        let end = va.saturating_add(size);
        for (_, m) in res.mappings.range_mut(va..end) {
            for &(agent, perm) in descs {
                match m.access.iter_mut().find(|(a, _)| *a == agent) {
                    Some(slot) => slot.1 = perm,
                    None => m.access.push((agent, perm)),
                }
            }
        }
        Ok(())
    }
}

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
            return Status::AMD_ERROR_INVALID_MEMORY_POOL;
        };
        if out.is_null() || mem_type.0 > MemoryType::PINNED.0 {
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

/// `hsa_amd_vmem_unmap`: fails with `HSA_STATUS_ERROR` while an agent still has access.
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
            return Status::ERROR_INVALID_ARGUMENT;
        };
        // SAFETY: `perms` is non-null and valid for one write by the contract.
        unsafe { perms.write(m.access_of(agent)) };
        Status::SUCCESS
    })
}

/// `hsa_amd_vmem_export_shareable_handle`: a dup of the handle's memfd, which the caller
/// closes with `close(2)`.
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
        let obj = mem.vmem.handles.get(&h.handle).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_export_shareable_handle: unknown handle {:#x}",
                h.handle
            ))
        })?;
        let fd = rustix::io::dup(&*obj.fd)
            .map_err(|e| SimError::new(Status::ERROR_OUT_OF_RESOURCES, format!("dup: {e}")))?;
        bump(Counter::ShareableHandlesExported);
        // SAFETY: `dmabuf_fd` is non-null and valid for one write by the contract.
        unsafe { dmabuf_fd.write(fd.into_raw_fd()) };
        Ok(())
    })
}

/// `hsa_amd_vmem_import_shareable_handle`: a new handle over a dup of `fd` (a memfd or any
/// mappable file), sized by `fstat`. The caller keeps its own fd.
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
            invalid(format!(
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
