//! Virtual memory (`hsa_amd_vmem_*`), as the newest ROCR does it for the AIE agent, with the
//! limits of the older profiles (`rocr-aie.md` §4.2, §4.3; `rocr-aie-hsaco.md` §6):
//!
//! - `rocm-7.0` and `rocr-late-2025` map only KFD memory: `hsa_amd_vmem_map` of a handle from
//!   an AIE pool fails with `INVALID_AGENT`, and `hsa_amd_vmem_import_shareable_handle`
//!   (which needs a GPU region's dmabuf; the emulator has no GPU) with `INVALID_ALLOCATION`.
//! - `hsa_amd_vmem_export_shareable_handle` of an AIE-pool handle works on `rocr-newest`
//!   only (`HSA_STATUS_ERROR` elsewhere). The fd is a dup of the handle's memfd, sealed against
//!   shrinking and growing first ([`crate::memory::seal_size`]). Re-exporting an imported
//!   handle fails with `HSA_STATUS_ERROR` on every profile, as ROCR's AIE memory test expects.
//!
//! - A handle is a memfd of the requested size (a multiple of the pool's
//!   `RUNTIME_ALLOC_GRANULE`, the page size).
//! - A reservation is a private anonymous read-write range, as ROCR's `NO_REGISTER` path maps
//!   it (with or without the flag: there is no KFD to register with). The address hint is
//!   ignored; the size is rounded up to pages, and `address_free` must repeat the size given.
//! - `map` maps the handle's memfd `MAP_SHARED` and read-write over part of a reservation.
//!   The host can use it at once (the XDNA driver's map is a host mmap); what `set_access`
//!   records matters for the AIE agent: only a mapping the AIE agent may read and write is a
//!   valid kernel argument.
//! - `unmap` removes every agent's access itself and succeeds, as ROCR's
//!   `VMemoryHandleUnmap` does in every release (revoking first, as IRON does, is harmless).
//!   The range stays reserved until `address_free`. `address_free` fails with
//!   `HSA_STATUS_ERROR_RESOURCE_FREE` while mappings remain. Other statuses follow ROCR's
//!   `Runtime::VMemory*`: unknown handles, reservations and unmapped ranges give
//!   `INVALID_ALLOCATION`, malformed arguments `INVALID_ARGUMENT`.
//! - A released handle's memory lives on while it is mapped; handles are reference counted
//!   by `hsa_amd_vmem_retain_alloc_handle`.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use hsa_core::sys::{AccessPermission, Agent, MemoryPool, MemoryType, Status};

use crate::agents::{PoolKind, page_size};
use crate::memory::{Mapping, Owner, Resolved, new_memfd};
use crate::profile::Profile;
use crate::runtime::next_handle;
use crate::status::SimError;

mod ffi;

pub use ffi::*;

#[derive(Debug)]
struct HandleObj {
    pool: MemoryPool,
    kind: PoolKind,
    mem_type: MemoryType,
    size: usize,
    fd: Arc<OwnedFd>,
    refs: u32,
    /// Made by `hsa_amd_vmem_import_shareable_handle` over someone else's fd.
    imported: bool,
}

#[derive(Debug)]
struct VmemMapping {
    len: usize,
    handle: u64,
    pool: MemoryPool,
    kind: PoolKind,
    mem_type: MemoryType,
    fd: Arc<OwnedFd>,
    access: Vec<(Agent, AccessPermission)>,
    imported: bool,
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
    /// The size the caller asked for (`hsa_amd_vmem_address_free` must repeat it).
    size: usize,
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
    profile: Profile,
}

fn invalid(detail: String) -> SimError {
    SimError::new(Status::ERROR_INVALID_ARGUMENT, detail)
}

fn invalid_allocation(detail: String) -> SimError {
    SimError::new(Status::ERROR_INVALID_ALLOCATION, detail)
}

impl VmemState {
    pub fn new(aie: Agent, profile: Profile) -> Self {
        Self {
            aie,
            profile,
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
                imported: false,
            },
        );
        Ok(h)
    }

    fn release_handle(&mut self, h: u64) -> Result<(), SimError> {
        let obj = self.handles.get_mut(&h).ok_or_else(|| {
            invalid_allocation(format!(
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
        if size == 0 {
            return Err(invalid("hsa_amd_vmem_address_reserve: size is 0".into()));
        }
        if align != 0 && !align.is_power_of_two() {
            return Err(invalid(format!(
                "hsa_amd_vmem_address_reserve_align: alignment {align:#x} is not a power of two"
            )));
        }
        let align = usize::try_from(align).map_err(|_| invalid("alignment too large".into()))?;
        let len = crate::memory::page_round(size).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_address_reserve: size {size} overflows"
            ))
        })?;
        let region = Mapping::reserve(len, align)?;
        let base = region.addr;
        let mappings = BTreeMap::new();
        self.reservations.insert(
            base,
            Reservation {
                region,
                size,
                mappings,
            },
        );
        Ok(base)
    }

    fn free_reservation(&mut self, va: usize, size: usize) -> Result<(), SimError> {
        let r = self.reservations.get(&va).ok_or_else(|| {
            invalid_allocation(format!(
                "hsa_amd_vmem_address_free: {va:#x} is not a reserved range"
            ))
        })?;
        if r.size != size {
            return Err(invalid(format!(
                "hsa_amd_vmem_address_free: size {size} differs from the reservation's {}",
                r.size
            )));
        }
        if !r.mappings.is_empty() {
            return Err(SimError::new(
                Status::ERROR_RESOURCE_FREE,
                format!(
                    "hsa_amd_vmem_address_free: {} mapping(s) remain in [{va:#x}, +{size}); \
                     unmap them first",
                    r.mappings.len()
                ),
            ));
        }
        self.reservations.remove(&va);
        Ok(())
    }

    /// The start addresses of the mappings that tile `[va, va+size)` contiguously from `va`
    /// (the last may run past the end), as ROCR walks them.
    fn tiling(&self, what: &str, va: usize, size: usize) -> Result<(usize, Vec<usize>), SimError> {
        let (rbase, res) = self
            .reservation_of(va)
            .ok_or_else(|| invalid(format!("{what}: {va:#x} is not in a reserved range")))?;
        let end = va.saturating_add(size);
        let mut starts = Vec::new();
        let mut at = va;
        while at < end {
            let m = res.mappings.get(&at).ok_or_else(|| {
                invalid_allocation(format!(
                    "{what}: [{va:#x}, +{size}) is not covered by mappings (nothing is mapped at {at:#x})"
                ))
            })?;
            starts.push(at);
            at += m.len;
        }
        Ok((rbase, starts))
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
        if obj.kind.is_aie() && !self.profile.vmem_maps_aie_handles() {
            return Err(SimError::new(
                Status::ERROR_INVALID_AGENT,
                format!(
                    "hsa_amd_vmem_map: handle {h:#x} is from {}; {} maps only KFD (GPU) memory \
                     through vmem, so allocate AIE buffers with hsa_amd_memory_pool_allocate",
                    obj.kind.describe(),
                    self.profile
                ),
            ));
        }
        let (fd, pool, kind, mem_type) = (obj.fd.clone(), obj.pool, obj.kind, obj.mem_type);
        let imported = obj.imported;
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
        // mapping in it, so MAP_FIXED replaces only our own placeholder.
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
                access: Vec::new(),
                imported,
            },
        );
        Ok(())
    }

    fn unmap(&mut self, va: usize, size: usize) -> Result<(), SimError> {
        const WHAT: &str = "hsa_amd_vmem_unmap";
        if self.mapping_of(va).is_none() {
            return Err(invalid_allocation(format!(
                "{WHAT}: nothing is mapped at {va:#x}"
            )));
        }
        let (rbase, starts) = self.tiling(WHAT, va, size)?;
        let res = self.reservations.get_mut(&rbase).expect("found by tiling");
        let covered: usize = starts.iter().map(|s| res.mappings[s].len).sum();
        if covered != size {
            return Err(invalid_allocation(format!(
                "{WHAT}: size {size} does not end on a mapping boundary (the mappings from \
                 {va:#x} cover {covered} bytes)"
            )));
        }
        // ROCR's `VMemoryHandleUnmap` removes every agent's access itself before it drops the
        // mapping (the loop over `allowed_agents` in runtime.cpp, in every release read: the
        // August 2025 develop branch and the newest), so access still granted is no error.
        for s in &starts {
            if let Some(m) = res.mappings.get_mut(s) {
                m.access.clear();
            }
        }
        for s in starts {
            if let Some(m) = res.mappings.remove(&s) {
                res.region.clear_range(s, m.len)?;
            }
        }
        Ok(())
    }

    fn set_access(
        &mut self,
        va: usize,
        size: usize,
        descs: &[(Agent, AccessPermission)],
    ) -> Result<(), SimError> {
        let (rbase, res) = self.reservation_of(va).ok_or_else(|| {
            invalid(format!(
                "hsa_amd_vmem_set_access: {va:#x} is not in a reserved range"
            ))
        })?;
        if va.saturating_add(size) > rbase + res.region.len {
            return Err(invalid(format!(
                "hsa_amd_vmem_set_access: [{va:#x}, +{size}) runs past its reservation"
            )));
        }
        let (rbase, starts) = self.tiling("hsa_amd_vmem_set_access", va, size)?;
        let res = self.reservations.get_mut(&rbase).expect("found by tiling");
        for s in starts {
            let Some(m) = res.mappings.get_mut(&s) else {
                continue;
            };
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
