//! Programs: a PDI and its instruction stream copied into the device heap (G1, G2), or a code
//! object loaded through the executable API (kernel objects).
//!
//! On a runtime that loads code objects, a PDI and an instruction stream are packed into an
//! hsaco in memory and loaded like any other, so callers need not know which form the runtime
//! speaks. On the other runtimes an hsaco's `PdiInsts` kernel is unpacked into its PDI and
//! instruction stream, which is exactly what those runtimes dispatch; its `FullElf` kernels
//! cannot run there.

use std::sync::Arc;

use npu_artifacts::NpuGen;
use npu_artifacts::hsaco::{KernelKind, parse_for_arch};
use npu_artifacts::txn::TxnProgram;

use super::code_object::{LoadedKernel, PACKED_KERNEL, pack_pdi_insts};
use super::discover::PoolChoice;
use super::encode::G2Elf;
use super::resource::PoolAlloc;
use super::{Device, Generation, ProgramId, round_up};
use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{DEVICE_HEAP_ALIGNMENT, DEVICE_HEAP_SIZE, Status};

#[derive(Debug)]
pub(super) struct Program {
    pub(super) code: Code,
    /// Device-heap bytes held (every blob, rounded to the heap's alignment).
    pub(super) heap_bytes: usize,
}

/// Where a program's code lives.
#[derive(Debug)]
pub(super) enum Code {
    /// A PDI and an instruction stream this binding placed in the device heap.
    Heap {
        pdi: PoolAlloc,
        pdi_len: usize,
        insts: PoolAlloc,
        insts_len: usize,
    },
    /// A kernel of a loaded code object; the runtime placed its blobs.
    Loaded {
        kernel: LoadedKernel,
        kind: KernelKind,
    },
    /// A FullElf kernel on a G2 runtime with full ELF: its PDI this binding placed in the
    /// device heap, and its control code, patched into a ring slot's buffer per dispatch.
    G2FullElf { _pdi: PoolAlloc, elf: Arc<G2Elf> },
}

impl Device {
    /// The arch whose hsaco section the device loads.
    fn arch(&self) -> NpuGen {
        match self.info.generation {
            Generation::Npu1 => NpuGen::Npu1,
            Generation::Npu2 => NpuGen::Npu2,
        }
    }

    /// Loads a PDI and its instruction stream: copied into the device heap, or on a runtime
    /// that loads code objects, packed into an hsaco in memory and loaded through the
    /// executable API.
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
        if self.info.packet_abi.loads_code_objects() {
            // The partition width and the argument count come from the TXN header and its DDR
            // patches; a stream this binding cannot parse is packed as one column.
            let (cols, args) = TxnProgram::parse(insts).map_or((1, 0), |t| {
                (
                    u32::from(t.cols),
                    u32::try_from(t.arg_count()).unwrap_or(u32::MAX),
                )
            });
            let bytes = pack_pdi_insts(self.arch(), pdi, insts, cols, args)?;
            let heap = heap_of(&[pdi.len(), insts.len()]);
            return self.load_code_object(bytes, PACKED_KERNEL, KernelKind::PdiInsts, heap);
        }
        self.load_to_heap(pdi, insts)
    }

    /// Loads kernel `kernel` of an AIE hsaco. On a runtime that loads code objects the hsaco
    /// is loaded as it is; on the others its `PdiInsts` kernel is unpacked and loaded as a PDI
    /// and an instruction stream.
    ///
    /// # Errors
    /// [`HsaError::InvalidArgument`] naming the broken format rule, or a kernel the section for
    /// this device's arch lacks; [`HsaError::NeedsCodeObjects`] for a FullElf kernel on a
    /// runtime that does not load code objects; as [`Device::load_program`] otherwise.
    pub fn load_hsaco(&mut self, hsaco: &[u8], kernel: &str) -> Result<ProgramId, HsaError> {
        let arch = self.arch();
        let section = parse_for_arch(hsaco, arch)
            .map_err(|e| HsaError::InvalidArgument(format!("the hsaco: {e}")))?;
        let k = section.kernel(kernel).ok_or_else(|| {
            let names: Vec<&str> = section.kernels.iter().map(|k| k.name).collect();
            HsaError::InvalidArgument(format!(
                "the hsaco's {} section has no kernel {kernel:?}; it has {names:?}",
                arch.agent_name()
            ))
        })?;
        if !self.info.packet_abi.loads_code_objects() {
            return match (k.kind, &k.pdi, &k.full_elf) {
                (KernelKind::PdiInsts, Some(pdi), _) => {
                    let (pdi, insts) = (pdi.bytes.to_vec(), k.insts.bytes.to_vec());
                    self.load_to_heap(&pdi, &insts)
                }
                (KernelKind::FullElf, _, Some(ek)) if self.info.g2_full_elf => {
                    let elf = g2_elf(kernel, ek)?;
                    let pdi = ek
                        .pdis
                        .first()
                        .map(|p| p.bytes.to_vec())
                        .unwrap_or_default();
                    self.load_g2_full_elf(&pdi, elf)
                }
                _ => Err(HsaError::NeedsCodeObjects {
                    kernel: kernel.to_owned(),
                    abi: self.info.packet_abi.as_str(),
                    why: self.info.g2_full_elf_source.clone(),
                }),
            };
        }
        let kind = k.kind;
        let heap = match &k.full_elf {
            Some(elf) => heap_of(&elf.pdis.iter().map(|p| p.bytes.len()).collect::<Vec<_>>()),
            None => heap_of(&[
                k.insts.bytes.len(),
                k.pdi.as_ref().map_or(0, |p| p.bytes.len()),
            ]),
        };
        self.load_code_object(hsaco.to_vec(), kernel, kind, heap)
    }

    fn load_code_object(
        &mut self,
        bytes: Vec<u8>,
        kernel: &str,
        kind: KernelKind,
        heap_bytes: usize,
    ) -> Result<ProgramId, HsaError> {
        let api = self.api.clone();
        let used = self.heap_used;
        let size = self.info.heap_size;
        let loaded =
            LoadedKernel::load(&api, self.aie, bytes, kernel).map_err(|e| match e.status() {
                Some(Status::ERROR_OUT_OF_RESOURCES) => HsaError::HeapFull {
                    needed: heap_bytes,
                    used,
                    size,
                    reason: e.to_string(),
                },
                _ => e,
            })?;
        self.heap_used += heap_bytes;
        let id = ProgramId(self.next_id());
        self.programs.insert(
            id,
            Program {
                code: Code::Loaded {
                    kernel: loaded,
                    kind,
                },
                heap_bytes,
            },
        );
        Ok(id)
    }

    fn load_to_heap(&mut self, pdi: &[u8], insts: &[u8]) -> Result<ProgramId, HsaError> {
        let id = ProgramId(self.next_id());
        self.place_in_heap(id, pdi, insts)?;
        Ok(id)
    }

    /// Copies a PDI and its instruction stream into the device heap as program `id`.
    pub(super) fn place_in_heap(
        &mut self,
        id: ProgramId,
        pdi: &[u8],
        insts: &[u8],
    ) -> Result<(), HsaError> {
        let api = self.api.clone();
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
        let heap_bytes = heap_of(&[pdi.len(), insts.len()]);
        self.heap_used += heap_bytes;
        self.programs.insert(
            id,
            Program {
                code: Code::Heap {
                    pdi: pdi_mem,
                    pdi_len: pdi.len(),
                    insts: insts_mem,
                    insts_len: insts.len(),
                },
                heap_bytes,
            },
        );
        Ok(())
    }

    /// Places a G2 full-ELF kernel's PDI in the device heap.
    fn load_g2_full_elf(&mut self, pdi: &[u8], mut elf: G2Elf) -> Result<ProgramId, HsaError> {
        let api = self.api.clone();
        let heap_bytes = heap_of(&[pdi.len()]);
        let mem = PoolAlloc::new(&api, self.pools.heap.pool, pdi.len()).map_err(|e| {
            match e.status() {
                Some(Status::ERROR_OUT_OF_RESOURCES | Status::ERROR_INVALID_ALLOCATION) => {
                    HsaError::HeapFull {
                        needed: heap_bytes,
                        used: self.heap_used,
                        size: self.info.heap_size,
                        reason: e.to_string(),
                    }
                }
                _ => e,
            }
        })?;
        // SAFETY: the allocation is at least `pdi.len()` bytes of fresh device-heap memory.
        unsafe { std::ptr::copy_nonoverlapping(pdi.as_ptr(), mem.ptr(), pdi.len()) };
        elf.pdi = mem.addr();
        self.heap_used += heap_bytes;
        let id = ProgramId(self.next_id());
        self.programs.insert(
            id,
            Program {
                code: Code::G2FullElf {
                    _pdi: mem,
                    elf: Arc::new(elf),
                },
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
        match &p.code {
            // A queue that loaded this PDI holds it in its hardware context: destroy the queue
            // before the PDI's memory goes (the next dispatch creates a new one), so the
            // runtime never refers to freed memory and a new PDI at the same address is not
            // mistaken for the cached one.
            Code::Heap { pdi, .. } => {
                if self
                    .queue
                    .as_ref()
                    .is_some_and(|q| q.pdis.contains(&pdi.addr()))
                {
                    self.queue = None;
                }
            }
            // Destroying an executable bumps the agent's PDI-release epoch: every queue drops
            // its whole PDI cache before its next batch, so the queue stays and so does
            // nothing of the cache this binding mirrors.
            Code::Loaded {
                kind: KernelKind::PdiInsts,
                ..
            } => {
                if let Some(q) = &mut self.queue {
                    q.pdis.clear();
                }
            }
            Code::Loaded { .. } | Code::G2FullElf { .. } => {}
        }
        drop(p);
        Ok(())
    }
}

/// A FullElf kernel as a G2 packet carries it: one PDI (the packet names one, and one PDI
/// site), its argument sites, and the pristine control code.
fn g2_elf(kernel: &str, ek: &npu_artifacts::hsaco::ElfKernel<'_>) -> Result<G2Elf, HsaError> {
    use npu_artifacts::hsaco::{PatchScheme, SiteTarget};
    let refuse = |why: &str| {
        HsaError::InvalidArgument(format!(
            "FullElf kernel {kernel:?}: {why}; a G2 full-ELF packet names one PDI and one PDI \
             site"
        ))
    };
    let pdi_sites: Vec<u32> = ek
        .sites
        .iter()
        .filter(|s| matches!(s.target, SiteTarget::Pdi(_)) && s.scheme == PatchScheme::ADDRESS_64)
        .map(|s| s.offset)
        .collect();
    let (&[pdi_site], 1) = (pdi_sites.as_slice(), ek.pdis.len()) else {
        return Err(refuse(&format!(
            "it has {} PDI sites and {} PDIs",
            pdi_sites.len(),
            ek.pdis.len()
        )));
    };
    if pdi_site == 0 {
        return Err(refuse(
            "its PDI site is at offset 0, which selects PDI + insts",
        ));
    }
    let arg_sites = ek
        .sites
        .iter()
        .filter_map(|s| match s.target {
            SiteTarget::Arg(i) if s.scheme == PatchScheme::SHIM_DMA_48 => {
                Some((s.offset, i, s.addend))
            }
            _ => None,
        })
        .collect();
    Ok(G2Elf {
        pdi: 0,
        ctrl: ek.ctrl_code.to_vec(),
        pdi_site,
        arg_sites,
    })
}

/// Device-heap bytes of blobs of these lengths, each rounded to the heap's alignment.
fn heap_of(lens: &[usize]) -> usize {
    lens.iter()
        .filter(|&&l| l > 0)
        .map(|&l| round_up(l, DEVICE_HEAP_ALIGNMENT))
        .sum()
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
