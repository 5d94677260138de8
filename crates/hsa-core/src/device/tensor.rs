//! Tensors: device memory for buffer arguments, readable and writable by the host and
//! exportable as a file descriptor.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use super::discover::PoolChoice;
use super::resource::{PoolAlloc, VmemAlloc};
use super::{Device, TensorBacking, TensorId, TensorSharing, round_up};
use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::Agent;

/// A tensor's memory.
#[derive(Debug)]
pub(super) enum TensorMem {
    Pool(PoolAlloc),
    Vmem(VmemAlloc),
}

#[derive(Debug)]
pub(super) struct Tensor {
    pub(super) mem: TensorMem,
    /// Bytes the caller asked for.
    pub(super) size: usize,
    /// Whether its memory was handed to another process as a file descriptor: then other
    /// processes may write it at any time, and no Rust reference to it may be formed.
    pub(super) exported: bool,
}

impl Tensor {
    pub(super) fn ptr(&self) -> *mut u8 {
        match &self.mem {
            TensorMem::Pool(p) => p.ptr(),
            TensorMem::Vmem(v) => v.ptr(),
        }
    }
}

/// What a caller may know of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorInfo {
    pub size: usize,
    /// The host VA of its first byte (also what kernel arguments point at).
    pub addr: u64,
    pub backing: TensorBacking,
}

impl Device {
    /// Allocates `size` bytes of tensor memory, zeroed.
    ///
    /// The memory is not written here: every backing is fresh pages that the kernel zeroes on
    /// first touch (amdxdna's `BO_SHARE` buffers, which both the data pool and vmem handles
    /// allocate, are shmem objects; the emulator gives each allocation its own memfd). Touching
    /// it would cost a gigabyte tensor a second of the caller's thread and its whole size in
    /// resident memory before it is used.
    ///
    /// # Errors
    /// [`HsaError::InvalidArgument`] for size 0; the runtime's allocation error.
    pub fn alloc_tensor(&mut self, size: usize) -> Result<TensorId, HsaError> {
        if size == 0 {
            return Err(HsaError::InvalidArgument(
                "a tensor must have at least one byte".into(),
            ));
        }
        let mem = self.tensor_mem(size)?;
        let t = Tensor {
            mem,
            size,
            exported: false,
        };
        let id = TensorId(self.next_id());
        self.tensors.insert(id, t);
        Ok(id)
    }

    /// Fresh tensor memory of `size` bytes, as the device's tensor backing allocates it.
    pub(super) fn tensor_mem(&self, size: usize) -> Result<TensorMem, HsaError> {
        let api = self.api.clone();
        Ok(match self.opts.tensor_backing {
            TensorBacking::Pool | TensorBacking::Auto => {
                TensorMem::Pool(PoolAlloc::new(&api, self.pools.data.pool, size)?)
            }
            TensorBacking::Vmem => {
                let rounded = round_up(size, self.pools.data.granule.max(1));
                TensorMem::Vmem(VmemAlloc::new(
                    &api,
                    self.pools.data.pool,
                    rounded,
                    self.cpu,
                    self.aie,
                )?)
            }
        })
    }

    /// Frees a tensor.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`] for an id this device did not give out.
    pub fn free_tensor(&mut self, id: TensorId) -> Result<(), HsaError> {
        self.tensors
            .remove(&id)
            .map(drop)
            .ok_or(HsaError::UnknownHandle {
                kind: "tensor",
                id: id.0,
            })
    }

    pub(super) fn tensor(&self, id: TensorId) -> Result<&Tensor, HsaError> {
        self.tensors.get(&id).ok_or(HsaError::UnknownHandle {
            kind: "tensor",
            id: id.0,
        })
    }

    /// Size, address and backing of a tensor.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`] for an id this device did not give out.
    pub fn tensor_info(&self, id: TensorId) -> Result<TensorInfo, HsaError> {
        let t = self.tensor(id)?;
        let backing = match t.mem {
            TensorMem::Pool(_) => TensorBacking::Pool,
            TensorMem::Vmem(_) => TensorBacking::Vmem,
        };
        Ok(TensorInfo {
            size: t.size,
            addr: t.ptr() as u64,
            backing,
        })
    }

    fn range(&self, id: TensorId, offset: usize, len: usize) -> Result<*mut u8, HsaError> {
        let t = self.tensor(id)?;
        match offset.checked_add(len) {
            Some(end) if end <= t.size => {
                // SAFETY: `offset + len <= size`, so the result stays inside the allocation.
                Ok(unsafe { t.ptr().add(offset) })
            }
            _ => Err(HsaError::InvalidArgument(format!(
                "bytes {offset}..{} are outside tensor {} of {} bytes",
                offset.saturating_add(len),
                id.0,
                t.size
            ))),
        }
    }

    /// Copies `data` into a tensor at `offset`.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`], or [`HsaError::InvalidArgument`] when the range does not fit.
    pub fn write_tensor(
        &mut self,
        id: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<(), HsaError> {
        let dst = self.range(id, offset, data.len())?;
        // SAFETY: `range` checked that `dst..dst+len` lies inside the tensor's live allocation.
        // `data` is no slice of this device's memory (those are lent by `with_tensor*`, which
        // borrow the device that `&mut self` holds), so the two do not overlap. The copy forms
        // no reference to device memory, so another process (an exported tensor's client) or
        // the device writing it meanwhile only tears the bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copies bytes out of a tensor at `offset` into `out`.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`], or [`HsaError::InvalidArgument`] when the range does not fit.
    pub fn read_tensor(&self, id: TensorId, offset: usize, out: &mut [u8]) -> Result<(), HsaError> {
        let src = self.range(id, offset, out.len())?;
        // SAFETY: as in `write_tensor`, in the other direction: `out` is a `&mut` the caller
        // holds, so it is not lent device memory (`with_tensor_mut` needs `&mut self`).
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Exports a tensor's memory as a file descriptor another process can map, with the byte
    /// offset of the tensor inside it: a vmem allocation through
    /// `hsa_amd_vmem_export_shareable_handle`, a pool allocation through
    /// `hsa_amd_portable_export_dmabuf`. On the emulator this is a memfd sealed against
    /// shrinking and growing; on ROCR, a dmabuf (whether another process can map an amdxdna
    /// dmabuf is unverified on hardware).
    ///
    /// # Errors
    /// [`HsaError::Unsupported`] when the runtime lacks the call; the runtime's error (most
    /// runtimes refuse to export pool memory: see [`DeviceInfo::tensor_sharing`]).
    pub fn export_tensor(&mut self, id: TensorId) -> Result<(OwnedFd, u64), HsaError> {
        let api = self.api.clone();
        let t = self.tensors.get_mut(&id).ok_or(HsaError::UnknownHandle {
            kind: "tensor",
            id: id.0,
        })?;
        let exported = match &t.mem {
            TensorMem::Vmem(v) => export_vmem(&api, v),
            TensorMem::Pool(p) => export_pool(&api, p, t.size),
        }?;
        t.exported = true;
        Ok(exported)
    }

    /// Lends bytes `offset..offset + len` of a tensor that was never exported as `&mut [u8]`,
    /// for copying into it without a bounce buffer. Such memory is seen by no other process,
    /// and the device writes it only inside a dispatch, which needs `&mut self` as well, or
    /// after one that failed or timed out, until its queue is replaced (refused meanwhile).
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`]; [`HsaError::InvalidArgument`] for a range outside the
    /// tensor, a tensor that was exported, or while a failed queue lives (use
    /// [`Device::write_tensor`], which copies through raw pointers).
    pub fn with_tensor_mut<R>(
        &mut self,
        id: TensorId,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, HsaError> {
        let p = self.private_range(id, offset, len)?;
        // SAFETY: `private_range` checked that the range lies inside the tensor's live
        // allocation, that no other process was given the memory, and that no failed dispatch
        // can still be running on a live queue; `&mut self` excludes every other access from
        // this process (new dispatches included) while the slice lives.
        Ok(f(unsafe { std::slice::from_raw_parts_mut(p, len) }))
    }

    /// Lends bytes of a tensor that was never exported as `&[u8]` (see
    /// [`Device::with_tensor_mut`]).
    ///
    /// # Errors
    /// As [`Device::with_tensor_mut`].
    pub fn with_tensor<R>(
        &self,
        id: TensorId,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, HsaError> {
        let p = self.private_range(id, offset, len)?;
        // SAFETY: as in `with_tensor_mut`; `&self` excludes new dispatches (they need
        // `&mut self`) and `private_range` ruled out a failed one still running, so nothing
        // writes the bytes while the slice lives.
        Ok(f(unsafe { std::slice::from_raw_parts(p, len) }))
    }

    fn private_range(&self, id: TensorId, offset: usize, len: usize) -> Result<*mut u8, HsaError> {
        if self.tensor(id)?.exported {
            return Err(HsaError::InvalidArgument(format!(
                "tensor {} is shared with other processes; copy with write_tensor/read_tensor",
                id.0
            )));
        }
        // A dispatch that failed or timed out left its queue alive: on hardware its packets may
        // still run and write tensor memory until `recover` (or the next dispatch) destroys the
        // queue, so no slice of device memory is lent until then.
        if self.queue.as_ref().is_some_and(|q| q.stale) {
            return Err(HsaError::InvalidArgument(format!(
                "tensor {}: a dispatch that failed or timed out may still write device memory \
                 until recover() replaces its queue; copy with write_tensor/read_tensor",
                id.0
            )));
        }
        self.range(id, offset, len)
    }
}

fn export_vmem(api: &HsaApi, v: &VmemAlloc) -> Result<(OwnedFd, u64), HsaError> {
    let export = api
        .fns()
        .vmem_export_shareable_handle
        .ok_or(HsaError::Unsupported {
            operation: "exporting a vmem tensor as a file descriptor",
            symbol: "hsa_amd_vmem_export_shareable_handle",
        })?;
    let mut fd: i32 = -1;
    // SAFETY: `fd` is a valid out-pointer and the handle is live.
    let st = unsafe { export(&mut fd, v.handle(), 0) };
    api.check("hsa_amd_vmem_export_shareable_handle", st)?;
    own_fd("hsa_amd_vmem_export_shareable_handle", fd).map(|fd| (fd, 0))
}

fn export_pool(api: &HsaApi, p: &PoolAlloc, size: usize) -> Result<(OwnedFd, u64), HsaError> {
    let export = api
        .fns()
        .portable_export_dmabuf
        .ok_or(HsaError::Unsupported {
            operation: "exporting a pool tensor as a file descriptor",
            symbol: "hsa_amd_portable_export_dmabuf",
        })?;
    let mut fd: i32 = -1;
    let mut offset: u64 = 0;
    // SAFETY: `p.ptr()..+size` is a live allocation of this runtime; the out-pointers are
    // valid.
    let st = unsafe { export(p.ptr().cast_const().cast(), size, &mut fd, &mut offset) };
    api.check("hsa_amd_portable_export_dmabuf", st)?;
    own_fd("hsa_amd_portable_export_dmabuf", fd).map(|fd| (fd, offset))
}

fn own_fd(call: &'static str, fd: i32) -> Result<OwnedFd, HsaError> {
    if fd < 0 {
        return Err(HsaError::Contract {
            call,
            detail: format!("success but an invalid descriptor {fd}"),
        });
    }
    // SAFETY: on success the runtime hands over a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What [`probe_sharing`] found.
#[derive(Debug)]
pub(super) struct Probe {
    pub backing: TensorBacking,
    pub sharing: TensorSharing,
    pub reason: String,
}

/// Finds out, with one small allocation of each kind, which export the runtime really
/// performs: a symbol being present proves nothing (ROCm 7.0 exports
/// `hsa_amd_portable_export_dmabuf` and fails every call; ROCR's own AIE memory test expects
/// pool export to fail and vmem export to work). vmem is tried first, then the pool; a
/// `requested` backing other than `Auto` is the only one tried. Where nothing exports, tensors
/// stay in the pool, which every runtime takes as a kernel argument.
pub(super) fn probe_sharing(
    api: &Arc<HsaApi>,
    pools: &PoolChoice,
    cpu: Agent,
    aie: Agent,
    requested: TensorBacking,
) -> Probe {
    let mut failures = Vec::new();
    if matches!(requested, TensorBacking::Auto | TensorBacking::Vmem) {
        let size = pools.data.granule.max(1);
        match VmemAlloc::new(api, pools.data.pool, size, cpu, aie)
            .and_then(|v| export_vmem(api, &v).map(drop))
        {
            Ok(()) => {
                return Probe {
                    backing: TensorBacking::Vmem,
                    sharing: TensorSharing::VmemExport,
                    reason: "a vmem allocation exported with \
                             hsa_amd_vmem_export_shareable_handle"
                        .into(),
                };
            }
            Err(e) => failures.push(format!("vmem: {e}")),
        }
    }
    if matches!(requested, TensorBacking::Auto | TensorBacking::Pool) {
        let size = pools.data.granule.max(1);
        match PoolAlloc::new(api, pools.data.pool, size)
            .and_then(|p| export_pool(api, &p, size).map(drop))
        {
            Ok(()) => {
                return Probe {
                    backing: TensorBacking::Pool,
                    sharing: TensorSharing::PoolExport,
                    reason: "a pool allocation exported with hsa_amd_portable_export_dmabuf".into(),
                };
            }
            Err(e) => failures.push(format!("pool: {e}")),
        }
    }
    Probe {
        backing: match requested {
            TensorBacking::Vmem => TensorBacking::Vmem,
            _ => TensorBacking::Pool,
        },
        sharing: TensorSharing::None,
        reason: format!("no export works: {}", failures.join("; ")),
    }
}
