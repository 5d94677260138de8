//! Programs: a PDI and its instruction stream copied into the device heap.

use std::sync::Arc;

use super::discover::PoolChoice;
use super::resource::PoolAlloc;
use super::{Device, ProgramId, round_up};
use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{DEVICE_HEAP_ALIGNMENT, DEVICE_HEAP_SIZE, Status};

#[derive(Debug)]
pub(super) struct Program {
    pub(super) pdi: PoolAlloc,
    pub(super) insts: PoolAlloc,
    pub(super) insts_len: usize,
    /// Device-heap bytes held (both allocations, rounded to the heap's alignment).
    pub(super) heap_bytes: usize,
}

impl Device {
    /// Copies a PDI and its instruction stream into the device heap.
    ///
    /// # Errors
    /// [`HsaError::InvalidArgument`] for an empty PDI or an instruction stream that is empty or
    /// not a whole number of 32-bit words; [`HsaError::HeapFull`] when the device heap has no
    /// room (unload a program and retry); the runtime's error otherwise.
    pub fn load_program(&mut self, pdi: &[u8], insts: &[u8]) -> Result<ProgramId, HsaError> {
        if pdi.is_empty() {
            return Err(HsaError::InvalidArgument("the PDI is empty".into()));
        }
        if insts.is_empty() || !insts.len().is_multiple_of(4) {
            return Err(HsaError::InvalidArgument(format!(
                "the instruction stream is {} bytes: it must be a non-empty multiple of 4",
                insts.len()
            )));
        }
        let api = self.rt.api.clone();
        let heap_full = |reason: String| HsaError::HeapFull {
            needed: round_up(pdi.len(), DEVICE_HEAP_ALIGNMENT)
                + round_up(insts.len(), DEVICE_HEAP_ALIGNMENT),
            used: self.heap_used,
            size: self.info.heap_size,
            reason,
        };
        let out_of_heap = |e: HsaError| match e.status() {
            Some(Status::ERROR_OUT_OF_RESOURCES | Status::ERROR_INVALID_ALLOCATION) => {
                heap_full(e.to_string())
            }
            _ => e,
        };
        // Instructions first: they are small and must stay out of the windows ROCR's address
        // mask gets wrong, which is easiest while the low heap is free.
        let insts_mem = alloc_insts(&api, &self.pools, insts.len()).map_err(|e| match e {
            HsaError::InvalidArgument(reason) => heap_full(reason),
            e => out_of_heap(e),
        })?;
        let pdi_mem = PoolAlloc::new(&api, self.pools.heap.pool, pdi.len()).map_err(out_of_heap)?;
        // SAFETY: both allocations are at least as long as the slices copied into them, and
        // fresh device-heap memory cannot overlap caller memory.
        unsafe {
            std::ptr::copy_nonoverlapping(pdi.as_ptr(), pdi_mem.ptr(), pdi.len());
            std::ptr::copy_nonoverlapping(insts.as_ptr(), insts_mem.ptr(), insts.len());
        }
        let heap_bytes = round_up(pdi.len(), DEVICE_HEAP_ALIGNMENT)
            + round_up(insts.len(), DEVICE_HEAP_ALIGNMENT);
        self.heap_used += heap_bytes;
        let id = ProgramId(self.next_id());
        self.programs.insert(
            id,
            Program {
                pdi: pdi_mem,
                insts: insts_mem,
                insts_len: insts.len(),
                heap_bytes,
            },
        );
        Ok(id)
    }

    /// Frees a program's device-heap memory.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`] for an id this device did not give out.
    pub fn unload_program(&mut self, id: ProgramId) -> Result<(), HsaError> {
        let p = self.programs.remove(&id).ok_or(HsaError::UnknownHandle {
            kind: "program",
            id: id.0,
        })?;
        self.heap_used -= p.heap_bytes;
        // A queue that loaded this PDI holds it in its hardware context: destroy the queue
        // before the PDI's memory goes (the next dispatch creates a new one), so the runtime
        // never refers to freed memory and a new PDI at the same address is not mistaken for
        // the cached one.
        if self
            .queue
            .as_ref()
            .is_some_and(|q| q.pdis.contains(&p.pdi.addr()))
        {
            self.queue = None;
        }
        drop(p);
        Ok(())
    }
}

/// Allocates device-heap memory for an instruction stream at an address ROCR translates
/// correctly. ROCR turns an instruction VA into a device address as
/// `0x04000000 | (va & 0x02FFFFFF)`, which clears bit 24: a buffer at a heap offset in
/// [16, 32) or [48, 64) MiB would be given the wrong device address (read from ROCR's source;
/// unverified on hardware). A placement there is held, the rest of that window is filled so the
/// next try lands past it, and both are released once a good placement is found.
fn alloc_insts(api: &Arc<HsaApi>, pools: &PoolChoice, len: usize) -> Result<PoolAlloc, HsaError> {
    const BAD_BIT: u64 = 0x0100_0000;
    let mut held = Vec::new();
    for _ in 0..8 {
        let a = PoolAlloc::new(api, pools.heap.pool, len)?;
        let start = a.addr() & (DEVICE_HEAP_SIZE as u64 - 1);
        let end = start + len as u64 - 1;
        if start & BAD_BIT == 0 && end & BAD_BIT == 0 {
            return Ok(a);
        }
        tracing::debug!(
            offset = start,
            "instruction buffer landed where ROCR's address mask is wrong; retrying"
        );
        // Where the bad window this buffer touches ends.
        let window_end = (end | (BAD_BIT - 1)) + 1;
        let used = round_up(len, DEVICE_HEAP_ALIGNMENT) as u64;
        held.push(a);
        if let Some(rest) = window_end.checked_sub(start + used).filter(|&r| r > 0)
            && let Ok(filler) = PoolAlloc::new(
                api,
                pools.heap.pool,
                usize::try_from(rest).unwrap_or(usize::MAX),
            )
        {
            held.push(filler);
        }
    }
    Err(HsaError::InvalidArgument(
        "no device-heap placement for the instruction stream below 16 MiB or in [32, 48) MiB"
            .into(),
    ))
}
