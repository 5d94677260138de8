//! Memory: pool allocations, the device heap, the address registry, and which memory
//! `hsa_amd_portable_export_dmabuf` refuses.
//!
//! - Every allocation from a data pool (AIE pools 0 and 2, the CPU system pool) is its own
//!   memfd, mapped `MAP_SHARED`.
//! - The device heap (AIE pool 1) is one 64 MiB memfd mapped at a 64 MiB-aligned address, as
//!   ROCR maps its `AMDXDNA_BO_DEV_HEAP`; allocations are carved from it at 32 KiB alignment.
//! - The registry maps any address to the allocation or vmem mapping containing it, which is
//!   how the dispatch rules decide whether a buffer is one the driver would know.
//!
//! Sizes are rounded up to pages; the rounded length is the allocation's extent for every
//! bounds check, as it is for ROCR's BOs.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::OwnedFd;

use hsa_core::sys::{AccessPermission, Agent, DEVICE_HEAP_ALIGNMENT, DEVICE_HEAP_SIZE, Status};
use rustix::mm::{MapFlags, ProtFlags};

use crate::agents::{PoolKind, page_size};
use crate::profile::Profile;
use crate::status::SimError;
use crate::vmem::VmemState;

mod ext;
mod ffi;

pub use ext::*;
pub use ffi::*;

// Packets carry addresses as u64; the emulator supports 64-bit targets only.
const _: () = assert!(size_of::<usize>() == size_of::<u64>());

/// A packet's u64 address as a host address (lossless on the 64-bit targets this crate
/// supports).
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn addr_to_usize(addr: u64) -> usize {
    addr as usize
}

/// Copies `len` bytes at `addr` from anywhere in this process, failing with `EFAULT` instead
/// of faulting when the range is not readable (`process_vm_readv` on the own process).
///
/// # Errors
/// The OS error (`EFAULT` for an unreadable range, `EPERM`/`ENOSYS` where the call is not
/// allowed); a short read is reported as `EFAULT`.
pub(crate) fn read_process_memory(addr: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut v = vec![0u8; len];
    let local = libc::iovec {
        iov_base: v.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr_to_usize(addr) as *mut c_void,
        iov_len: len,
    };
    // SAFETY: `local` describes our own writable buffer of exactly `len` bytes; the kernel only
    // reads `remote`, checking it and returning EFAULT rather than faulting on a bad range.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    match usize::try_from(n) {
        Err(_) => Err(std::io::Error::last_os_error()),
        Ok(n) if n == len => Ok(v),
        Ok(_) => Err(std::io::Error::from_raw_os_error(libc::EFAULT)),
    }
}

/// A range this process mapped; unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub addr: usize,
    pub len: usize,
}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset`, shared and read-write, at a fresh address, or
    /// over `[at, at+len)` when `at` is given.
    ///
    /// # Safety
    /// When `at` is given, the range must be one this crate reserved and nothing else uses:
    /// `MAP_FIXED` replaces whatever was mapped there.
    pub unsafe fn shared(
        fd: &OwnedFd,
        offset: u64,
        len: usize,
        at: Option<usize>,
    ) -> Result<Self, SimError> {
        let (hint, extra) = match at {
            Some(a) => (a as *mut c_void, MapFlags::FIXED),
            None => (std::ptr::null_mut(), MapFlags::empty()),
        };
        // SAFETY: a fresh shared mapping of a memfd we own; with FIXED, the caller guarantees
        // the target range is ours to replace.
        let p = unsafe {
            rustix::mm::mmap(
                hint,
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | extra,
                fd,
                offset,
            )
        }
        .map_err(|e| SimError::new(Status::ERROR_OUT_OF_RESOURCES, format!("mmap: {e}")))?;
        Ok(Self {
            addr: p as usize,
            len,
        })
    }

    /// Reserves `len` bytes of private anonymous read-write address space aligned to `align`
    /// (ROCR's `NO_REGISTER` reservation; untouched pages cost nothing).
    pub fn reserve(len: usize, align: usize) -> Result<Self, SimError> {
        let align = align.max(page_size());
        let span = len.checked_add(align).ok_or_else(|| {
            SimError::new(Status::ERROR_INVALID_ARGUMENT, "reservation size overflows")
        })?;
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks; it
        // overlaps nothing of ours.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                span,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| SimError::new(Status::ERROR_OUT_OF_RESOURCES, format!("mmap: {e}")))?;
        let start = p as usize;
        let aligned = start.next_multiple_of(align);
        let head = aligned - start;
        let tail = span - head - len;
        // SAFETY: both trimmed pieces lie inside the span just mapped and are not part of the
        // range we keep.
        unsafe {
            if head > 0 {
                let _ = rustix::mm::munmap(p, head);
            }
            if tail > 0 {
                let _ = rustix::mm::munmap((aligned + len) as *mut c_void, tail);
            }
        }
        Ok(Self { addr: aligned, len })
    }

    /// Replaces `[addr, addr+len)` inside this mapping with fresh reserved memory.
    pub fn clear_range(&self, addr: usize, len: usize) -> Result<(), SimError> {
        debug_assert!(addr >= self.addr && addr + len <= self.addr + self.len);
        // SAFETY: the range lies inside a reservation this crate owns; MAP_FIXED replaces
        // only our own mapping there.
        unsafe {
            rustix::mm::mmap_anonymous(
                addr as *mut c_void,
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::FIXED,
            )
        }
        .map(|_| ())
        .map_err(|e| SimError::new(Status::ERROR, format!("mmap: {e}")))
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: this range was mapped by this crate and is unmapped exactly once, here.
        if let Err(e) = unsafe { rustix::mm::munmap(self.addr as *mut c_void, self.len) } {
            tracing::warn!(
                "hsa-sim: munmap({:#x}, {}) failed: {e}",
                self.addr,
                self.len
            );
        }
    }
}

/// Seals `fd` against shrinking and growing, and then against any further seal, as every fd
/// the emulator hands out must be: a dmabuf can be neither truncated nor sealed, a client's
/// `ftruncate` on a memfd the emulator also maps would make the emulator's own accesses fault
/// (`SIGBUS`), and a write seal added by a client would refuse the emulator's later writes.
/// Sealing an fd that is already sealed this way succeeds (each export hands out a new fd for
/// the same memory, so the seals may be there from an earlier export).
///
/// # Errors
/// `HSA_STATUS_ERROR` when the seals cannot be added (the fd was not created sealable).
pub(crate) fn seal_size(fd: &OwnedFd) -> Result<(), SimError> {
    use rustix::fs::SealFlags;
    let want = SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL;
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| {
        SimError::new(
            Status::ERROR,
            format!("reading an exported memfd's seals: {e}"),
        )
    })?;
    if seals.contains(want) {
        return Ok(());
    }
    rustix::fs::fcntl_add_seals(fd, want)
        .map_err(|e| SimError::new(Status::ERROR, format!("sealing an exported memfd: {e}")))
}

/// A new memfd of `len` bytes, sealable (see [`seal_size`]).
pub(crate) fn new_memfd(name: &str, len: usize) -> Result<OwnedFd, SimError> {
    let oom = |e| SimError::new(Status::ERROR_OUT_OF_RESOURCES, format!("memfd: {e}"));
    let fd = rustix::fs::memfd_create(
        name,
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .map_err(oom)?;
    rustix::fs::ftruncate(&fd, len as u64).map_err(oom)?;
    Ok(fd)
}

/// Rounds `n` up to whole pages.
pub(crate) fn page_round(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(page_size())
}

#[derive(Debug)]
enum Backing {
    /// Its own memfd's mapping (the mapping keeps the file alive).
    Own {
        _map: Mapping,
    },
    Heap {
        offset: usize,
    },
}

/// One `hsa_amd_memory_pool_allocate` allocation.
#[derive(Debug)]
pub(crate) struct PoolAlloc {
    len: usize,
    pool: PoolKind,
    backing: Backing,
    /// The driver's GEM handle of an AIE-pool allocation (a DEV or SHMEM BO); `None` for the
    /// CPU pools, whose memory is not the AIE driver's.
    gem: Option<u32>,
}

/// What kind of buffer object a GEM handle names, as the amdxdna driver types it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BoKind {
    /// `AMDXDNA_BO_SHMEM`: data and kernarg pool memory, a queue's ring.
    Shmem,
    /// `AMDXDNA_BO_DEV_HEAP`: the 64 MiB device heap.
    DevHeap,
    /// `AMDXDNA_BO_DEV`: device-heap pool memory (PDIs, instruction streams).
    Dev,
    /// `AMDXDNA_BO_CMD`: a command or command-chain buffer ROCR makes for one doorbell.
    Cmd,
}

/// One live buffer object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bo {
    pub kind: BoKind,
    /// Its first byte's host address (0 for command buffers, which the client never sees).
    pub base: u64,
    /// Unique per creation: tells a reused handle from the buffer it named before.
    pub serial: u64,
}

/// The driver's GEM handles for this runtime's device fd: the lowest free one from 1, as the
/// kernel's `idr_alloc` hands them out, so a freed handle comes back at once. Only ROCm 7.0's
/// doorbell ([`crate::dispatch::rocm70`]) reads them; every profile keeps them.
#[derive(Debug, Default)]
pub(crate) struct GemHandles {
    live: BTreeMap<u32, Bo>,
    serial: u64,
}

impl GemHandles {
    /// Creates a buffer object: the lowest free handle.
    pub fn create(&mut self, kind: BoKind, base: u64) -> u32 {
        let mut h = 1u32;
        for &used in self.live.keys() {
            if used != h {
                break;
            }
            h += 1;
        }
        self.serial += 1;
        self.live.insert(
            h,
            Bo {
                kind,
                base,
                serial: self.serial,
            },
        );
        h
    }

    /// `DRM_IOCTL_GEM_CLOSE`.
    pub fn close(&mut self, h: u32) {
        self.live.remove(&h);
    }

    /// The live buffer object `h` names.
    pub fn get(&self, h: u32) -> Option<Bo> {
        self.live.get(&h).copied()
    }
}

/// The 64 MiB device heap.
#[derive(Debug)]
struct DeviceHeap {
    map: Mapping,
    /// Allocated blocks: offset → length.
    blocks: BTreeMap<usize, usize>,
}

impl DeviceHeap {
    fn new() -> Result<Self, SimError> {
        let fd = new_memfd("hsa-sim-device-heap", DEVICE_HEAP_SIZE)?;
        let reserved = Mapping::reserve(DEVICE_HEAP_SIZE, DEVICE_HEAP_SIZE)?;
        // SAFETY: `reserved` is our own fresh reservation of exactly this range.
        let map = unsafe { Mapping::shared(&fd, 0, DEVICE_HEAP_SIZE, Some(reserved.addr)) }?;
        // The shared mapping now owns the range.
        std::mem::forget(reserved);
        Ok(Self {
            map,
            blocks: BTreeMap::new(),
        })
    }

    /// First fit at `DEVICE_HEAP_ALIGNMENT`.
    fn alloc(&mut self, len: usize) -> Option<usize> {
        let mut cursor = 0usize;
        for (&off, &l) in &self.blocks {
            if off - cursor >= len {
                break;
            }
            cursor = (off + l).next_multiple_of(DEVICE_HEAP_ALIGNMENT);
        }
        if cursor.checked_add(len)? > DEVICE_HEAP_SIZE {
            return None;
        }
        self.blocks.insert(cursor, len);
        Some(cursor)
    }
}

/// What an address belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    Pool(PoolKind),
    /// A vmem mapping of a handle from `pool`, with the access granted to the AIE agent.
    Vmem {
        pool: PoolKind,
        aie_access: AccessPermission,
    },
}

/// The allocation or mapping containing an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub base: u64,
    pub len: u64,
    pub owner: Owner,
}

impl Resolved {
    /// Bytes from `addr` to the end of the allocation.
    pub fn remaining(&self, addr: u64) -> u64 {
        (self.base + self.len).saturating_sub(addr)
    }
}

/// All memory of one runtime.
#[derive(Debug)]
pub(crate) struct Memory {
    heap: DeviceHeap,
    allocs: BTreeMap<usize, PoolAlloc>,
    pub vmem: VmemState,
    /// The driver's GEM handles (the heap takes the first, as ROCR creates it in `hsa_init`).
    pub gem: GemHandles,
}

impl Memory {
    /// Memory for a runtime whose AIE agent is `aie`, behaving as `profile`.
    pub fn new(aie: Agent, profile: Profile) -> Result<Self, SimError> {
        let heap = DeviceHeap::new()?;
        let mut gem = GemHandles::default();
        gem.create(BoKind::DevHeap, heap.map.addr as u64);
        Ok(Self {
            heap,
            allocs: BTreeMap::new(),
            vmem: VmemState::new(aie, profile),
            gem,
        })
    }

    pub fn allocate(&mut self, pool: PoolKind, size: usize) -> Result<usize, SimError> {
        if size == 0 {
            return Err(SimError::new(
                Status::ERROR_INVALID_ARGUMENT,
                "allocation of 0 bytes",
            ));
        }
        let too_big = |limit: usize| {
            SimError::new(
                Status::ERROR_INVALID_ALLOCATION,
                format!(
                    "{size} bytes exceed {}'s limit of {limit} bytes",
                    pool.describe()
                ),
            )
        };
        let len = page_round(size).ok_or_else(|| too_big(pool.size()))?;
        match pool {
            PoolKind::DeviceHeap => {
                if len > DEVICE_HEAP_SIZE {
                    return Err(too_big(DEVICE_HEAP_SIZE));
                }
                let offset = self.heap.alloc(len).ok_or_else(|| {
                    SimError::new(
                        Status::ERROR_OUT_OF_RESOURCES,
                        format!("the 64 MiB device heap has no free {len}-byte range"),
                    )
                })?;
                let base = self.heap.map.addr + offset;
                // SAFETY: `[base, base+len)` lies inside the heap mapping, which is live and
                // writable, and belongs to no other allocation (it was just carved).
                unsafe { std::ptr::write_bytes(base as *mut u8, 0, len) };
                let gem = Some(self.gem.create(BoKind::Dev, base as u64));
                self.allocs.insert(
                    base,
                    PoolAlloc {
                        len,
                        pool,
                        backing: Backing::Heap { offset },
                        gem,
                    },
                );
                Ok(base)
            }
            _ => {
                if len > pool.size() {
                    return Err(too_big(pool.size()));
                }
                let fd = new_memfd("hsa-sim-pool", len)?;
                // SAFETY: a fresh mapping at a kernel-chosen address.
                let map = unsafe { Mapping::shared(&fd, 0, len, None) }?;
                let base = map.addr;
                let backing = Backing::Own { _map: map };
                let gem = pool
                    .is_aie()
                    .then(|| self.gem.create(BoKind::Shmem, base as u64));
                self.allocs.insert(
                    base,
                    PoolAlloc {
                        len,
                        pool,
                        backing,
                        gem,
                    },
                );
                Ok(base)
            }
        }
    }

    pub fn free(&mut self, ptr: usize) -> Result<(), SimError> {
        let Some(a) = self.allocs.remove(&ptr) else {
            return Err(SimError::new(
                Status::ERROR_INVALID_ALLOCATION,
                format!("hsa_amd_memory_pool_free: {ptr:#x} is not the start of an allocation"),
            ));
        };
        if let Some(h) = a.gem {
            self.gem.close(h);
        }
        if let Backing::Heap { offset } = a.backing {
            self.heap.blocks.remove(&offset);
        }
        Ok(())
    }

    /// The GEM handle of the AIE-pool allocation containing `addr`, as ROCR's `FindBOHandle`
    /// finds it (any address inside the buffer).
    pub fn gem_of(&self, addr: u64) -> Option<u32> {
        let a = usize::try_from(addr).ok()?;
        let (&base, alloc) = self.allocs.range(..=a).next_back()?;
        (a < base + alloc.len).then_some(alloc.gem).flatten()
    }

    /// The device heap's base address (64 MiB aligned).
    pub fn heap_base(&self) -> u64 {
        self.heap.map.addr as u64
    }

    /// The allocation or vmem mapping containing `addr`.
    pub fn resolve(&self, addr: u64) -> Option<Resolved> {
        let a = usize::try_from(addr).ok()?;
        if let Some((&base, alloc)) = self.allocs.range(..=a).next_back()
            && a < base + alloc.len
        {
            return Some(Resolved {
                base: base as u64,
                len: alloc.len as u64,
                owner: Owner::Pool(alloc.pool),
            });
        }
        self.vmem.resolve(a)
    }

    /// Checks that `[addr, addr+len)` lies inside one allocation or mapping.
    fn check_range(&self, addr: u64, len: u64) -> Option<Resolved> {
        let r = self.resolve(addr)?;
        (r.remaining(addr) >= len).then_some(r)
    }

    /// Copies `len` bytes at `addr` out of registered memory.
    pub fn read(&self, addr: u64, len: u64) -> Option<Vec<u8>> {
        self.check_range(addr, len)?;
        let n = usize::try_from(len).ok()?;
        let mut v = vec![0u8; n];
        // SAFETY: `[addr, addr+len)` lies inside a live read-write mapping of the registry
        // (checked above; mappings change only under the lock the caller holds). The copy
        // makes no reference to that memory, which other processes may write concurrently.
        unsafe {
            std::ptr::copy_nonoverlapping(addr_to_usize(addr) as *const u8, v.as_mut_ptr(), n)
        };
        Some(v)
    }

    /// Copies `bytes` into registered memory at `addr`.
    pub fn write(&self, addr: u64, bytes: &[u8]) -> Option<()> {
        self.check_range(addr, bytes.len() as u64)?;
        // SAFETY: as in `read`: the destination range is a live writable registered mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                addr_to_usize(addr) as *mut u8,
                bytes.len(),
            )
        };
        Some(())
    }

    /// Why `hsa_amd_portable_export_dmabuf` refuses `[ptr, ptr+size)`: every profile does.
    ///
    /// Memory that is no allocation or mapping gives `INVALID_ALLOCATION`, CPU-pool memory
    /// `INVALID_AGENT`, and AIE memory (a pool allocation, or a vmem mapping of an AIE-pool
    /// handle) `HSA_STATUS_ERROR` (`INVALID_AGENT` on ROCm 7.0, as observed): ROCm 7.0 does
    /// not implement the export, and ROCR's own AIE
    /// memory test expects it to fail in the newer releases (`rocr-aie.md` §4.3,
    /// `rocr-aie-hsaco.md` §6). The vmem case is inferred from the pool case.
    pub fn export_refusal(&self, ptr: usize, size: usize, profile: Profile) -> SimError {
        let inside = self
            .resolve(ptr as u64)
            .filter(|r| r.remaining(ptr as u64) >= size as u64);
        let kind = match inside.map(|r| r.owner) {
            None => {
                return SimError::new(
                    Status::ERROR_INVALID_ALLOCATION,
                    format!(
                        "hsa_amd_portable_export_dmabuf: [{ptr:#x}, +{size}) is not inside one \
                         allocation or vmem mapping"
                    ),
                );
            }
            Some(Owner::Pool(k) | Owner::Vmem { pool: k, .. }) => k,
        };
        if !kind.is_aie() {
            return SimError::new(
                Status::ERROR_INVALID_AGENT,
                format!(
                    "hsa_amd_portable_export_dmabuf: {ptr:#x} is in {}; ROCR exports only device \
                     allocations",
                    kind.describe()
                ),
            );
        }
        if profile == Profile::Rocm70 {
            // Observed on ROCm 7.0 (rocm70-observed.md): the export of AIE memory answers
            // INVALID_AGENT, not the ERROR its "not implemented" driver path suggests.
            return SimError::new(
                Status::ERROR_INVALID_AGENT,
                format!(
                    "hsa_amd_portable_export_dmabuf: {ptr:#x} is in {} ({profile}): ROCm 7.0 \
                     exports no AIE memory",
                    kind.describe()
                ),
            );
        }
        let why = "ROCR's AIE driver does not export its memory this way";
        let hint = if profile.vmem_exports_aie_handles() {
            "; export a vmem handle with hsa_amd_vmem_export_shareable_handle instead"
        } else {
            ""
        };
        SimError::new(
            Status::ERROR,
            format!(
                "hsa_amd_portable_export_dmabuf: {ptr:#x} is in {} ({profile}): {why}{hint}",
                kind.describe()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_memory_reads_fail_instead_of_faulting() {
        let v: Vec<u8> = (0..100).collect();
        assert_eq!(read_process_memory(v.as_ptr() as u64, 100).unwrap(), v);
        // Page zero is never mapped.
        match read_process_memory(8, 16) {
            Err(e) => assert!(matches!(
                e.raw_os_error(),
                Some(libc::EFAULT | libc::EPERM | libc::ENOSYS)
            )),
            Ok(_) => panic!("address 8 was readable"),
        }
    }

    #[test]
    fn heap_is_64_mib_aligned_and_first_fit_at_32_kib() {
        let mut h = DeviceHeap::new().unwrap();
        assert_eq!(h.map.addr % DEVICE_HEAP_SIZE, 0);
        let a = h.alloc(4096).unwrap();
        let b = h.alloc(40 << 10).unwrap();
        let c = h.alloc(4096).unwrap();
        assert_eq!((a, b, c), (0, 32 << 10, 96 << 10));
        h.blocks.remove(&b);
        assert_eq!(h.alloc(8192), Some(32 << 10));
        assert_eq!(h.alloc(DEVICE_HEAP_SIZE), None);
    }

    #[test]
    fn registry_resolves_interior_addresses_only() {
        let mut m = Memory::new(Agent { handle: 1 }, Profile::default()).unwrap();
        let p = m.allocate(PoolKind::Data, 100).unwrap() as u64;
        let r = m.resolve(p + 99).unwrap();
        assert_eq!((r.base, r.len), (p, page_size() as u64));
        assert!(
            m.resolve(p + page_size() as u64)
                .is_none_or(|r| r.base != p)
        );
        assert!(m.write(p + 4, &[1, 2, 3]).is_some());
        assert_eq!(m.read(p + 4, 3).unwrap(), vec![1, 2, 3]);
        assert!(m.read(p, page_size() as u64 + 1).is_none());
        m.free(addr_to_usize(p)).unwrap();
        assert!(m.resolve(p).is_none());
    }
}
