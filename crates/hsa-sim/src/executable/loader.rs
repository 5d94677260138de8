//! ROCR's AIE section loader (`kernel-object` only; `rocr-aie-hsaco.md` §3, §5).
//!
//! Failures, in the order ROCR checks them (the caller has already refused a frozen
//! executable with `FROZEN_EXECUTABLE`, and sent anything but an hsaco loaded for the AIE
//! agent down the GPU path with `INVALID_CODE_OBJECT`):
//!
//! | Condition | Status |
//! |---|---|
//! | AIE sections, but none named like the agent's arch (`aie2`/`aie2p`) | `INCOMPATIBLE_ARGUMENTS` |
//! | the arch section breaks a section rule (`npu_artifacts::hsaco`, §5.3) | `INVALID_CODE_OBJECT` |
//! | a kernel name already defined in this executable for this agent | `VARIABLE_ALREADY_DEFINED` |
//! | `kind >= 2`; `num_cols` 0 or more than the agent's columns; `PdiInsts` without a PDI; a `FullElf` whose nested ELF is broken, lacks the kernel, disagrees on `kernarg_size` or has no PDI site | `INVALID_CODE_OBJECT` |
//! | the device heap cannot hold a blob | `OUT_OF_RESOURCES` |
//!
//! A failed load frees what it placed and publishes no symbol. Each distinct `PdiInsts` blob
//! (by its place in the section) is copied once into the device heap; a `FullElf` kernel's
//! PDIs are placed per kernel, and its control code stays in host memory, copied into the
//! descriptor, to be patched afresh at every dispatch.

use hsa_core::sys::{
    AIE_KERNEL_DESCRIPTOR_VERSION, DEV_ADDR_OFFSET_MASK, DEVICE_HEAP_DEVICE_BASE, Status,
};
use npu_artifacts::hsaco::{
    self, AieSection, HsacoRule, KernelKind, PatchScheme, PatchSite, SiteTarget,
};
use npu_artifacts::{ArtifactError, NpuGen};

use crate::agents::PoolKind;
use crate::counters::{Counter, bump};
use crate::memory::Memory;
use crate::runtime::next_handle;
use crate::status::SimError;

/// Columns the AIE agent reports: Phoenix (aie2) has 5 device columns of which ROCR gives
/// one less; Strix (aie2p) all 8 (`rocr-aie-hsaco.md` §4).
pub(crate) fn agent_columns(agent: NpuGen) -> u32 {
    match agent {
        NpuGen::Npu1 => 4,
        NpuGen::Npu2 => 8,
    }
}

/// A blob in the device heap: a buffer object of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlacedBlob {
    /// A number unique to this placement (ROCR keys its PDI cache on the BO handle, so each
    /// load of the same hsaco is a distinct PDI).
    pub bo: u64,
    /// Host (and heap) address.
    pub va: u64,
    pub len: u64,
}

impl PlacedBlob {
    /// The address the device sees (`DEVICE_HEAP_DEVICE_BASE | (va & DEV_ADDR_OFFSET_MASK)`).
    pub fn device_address(&self) -> u64 {
        DEVICE_HEAP_DEVICE_BASE | (self.va & DEV_ADDR_OFFSET_MASK)
    }
}

/// What a descriptor runs.
#[derive(Debug)]
pub(crate) enum KernelBody {
    PdiInsts {
        pdi: PlacedBlob,
        insts: PlacedBlob,
    },
    FullElf {
        /// The pristine control code, never patched in place.
        ctrl_code: Vec<u8>,
        sites: Vec<PatchSite>,
        /// Each `.pdi*` section the sites name, placed in the device heap.
        pdis: Vec<(String, PlacedBlob)>,
        arg_count: u32,
    },
}

/// The ABI-visible head of a descriptor: the kernel object points here.
#[repr(C)]
#[derive(Debug)]
struct DescriptorHead {
    version: u32,
    kind: u32,
}

/// A kernel descriptor (`AieKernelDescriptor`): only its first u32 is ABI.
#[derive(Debug)]
pub(crate) struct KernelDescriptor {
    head: Box<DescriptorHead>,
    pub num_cols: u32,
    pub body: KernelBody,
}

impl KernelDescriptor {
    fn new(kind: KernelKind, num_cols: u32, body: KernelBody) -> Self {
        Self {
            head: Box::new(DescriptorHead {
                version: AIE_KERNEL_DESCRIPTOR_VERSION,
                kind: kind.code(),
            }),
            num_cols,
            body,
        }
    }

    /// The kernel object: the descriptor head's address, stable until the descriptor drops.
    pub fn kernel_object(&self) -> u64 {
        std::ptr::from_ref::<DescriptorHead>(&self.head) as u64
    }

    pub fn kind(&self) -> KernelKind {
        match self.body {
            KernelBody::PdiInsts { .. } => KernelKind::PdiInsts,
            KernelBody::FullElf { .. } => KernelKind::FullElf,
        }
    }

    /// `head.kind` mirrors `kind()` for a reader of the raw descriptor.
    #[cfg(test)]
    fn head_kind(&self) -> u32 {
        self.head.kind
    }
}

/// One kernel a load defines.
#[derive(Debug)]
pub(crate) struct LoadedKernel {
    pub name: String,
    pub kernarg_size: u32,
    pub descriptor: KernelDescriptor,
}

/// What a successful load adds to the executable.
#[derive(Debug)]
pub(crate) struct LoadedObject {
    pub kernels: Vec<LoadedKernel>,
    pub blobs: Vec<usize>,
}

fn code_object(detail: String) -> SimError {
    SimError::new(Status::ERROR_INVALID_CODE_OBJECT, detail)
}

/// The rules ROCR's loader applies after its duplicate-name check (§3), as opposed to the
/// section parser's (§5.3), which run before it.
fn after_duplicate_check(e: &ArtifactError) -> bool {
    match e {
        ArtifactError::HsacoFullElf { .. } => true,
        ArtifactError::HsacoSection { rule, .. } => matches!(
            rule,
            HsacoRule::Kind
                | HsacoRule::NumCols
                | HsacoRule::PdiPresent
                | HsacoRule::FullElfArch
                | HsacoRule::FullElfKernelName
                | HsacoRule::KernargSize
                | HsacoRule::PdiSitePresent
        ),
        _ => false,
    }
}

/// The kernel names of the arch section, read from its raw table, for the duplicate check
/// when the section fails a rule ROCR's loader checks only after it. `None` where a name
/// cannot be read (the section parser would have refused the file first).
fn raw_names(bytes: &[u8], arch: NpuGen) -> Option<Vec<String>> {
    let c = hsaco::parse_container(bytes).ok()?;
    let s = c
        .sections
        .iter()
        .find(|s| s.is_aie(bytes) && s.name == arch.agent_name())?;
    let data = s.bytes(bytes)?;
    let u32_at = |off: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(off..off + 4)?.try_into().ok()?))
    };
    let header = u32_at(8)? as usize;
    let count = u32_at(12)? as usize;
    let entry = u32_at(16)? as usize;
    let st_off = u32_at(20)? as usize;
    let st_size = u32_at(24)? as usize;
    let strings = data.get(st_off..st_off.checked_add(st_size)?)?;
    let mut names = Vec::new();
    for i in 0..count.min(data.len() / entry.max(1)) {
        let off = u32_at(header.checked_add(i.checked_mul(entry)?)?)? as usize;
        let rest = strings.get(off..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        names.push(String::from_utf8_lossy(&rest[..end]).into_owned());
    }
    Some(names)
}

/// `VARIABLE_ALREADY_DEFINED` for the first of `names` already in `defined`.
fn duplicate<'a>(
    defined: &[String],
    names: impl IntoIterator<Item = &'a str>,
) -> Result<(), SimError> {
    match names.into_iter().find(|n| defined.iter().any(|d| d == n)) {
        Some(n) => Err(SimError::new(
            Status::ERROR_VARIABLE_ALREADY_DEFINED,
            format!(
                "hsa_executable_load_agent_code_object: kernel {n:?} is already defined in this \
                 executable for this agent"
            ),
        )),
        None => Ok(()),
    }
}

/// Loads `bytes` (an hsaco) for an agent of `arch`. `defined` are the names this executable
/// already has for the agent.
///
/// # Errors
/// The statuses of the module table, each with a sentence naming the rule.
pub(crate) fn load(
    mem: &mut Memory,
    arch: NpuGen,
    bytes: &[u8],
    defined: &[String],
    full_elf: bool,
) -> Result<LoadedObject, SimError> {
    let section = match hsaco::parse_for_arch(bytes, arch) {
        Ok(s) => s,
        Err(ArtifactError::HsacoContainer {
            rule: HsacoRule::ArchSection,
            detail,
            ..
        }) => {
            return Err(SimError::new(
                Status::ERROR_INCOMPATIBLE_ARGUMENTS,
                format!(
                    "hsa_executable_load_agent_code_object: the agent is {} but {detail}",
                    arch.agent_name()
                ),
            ));
        }
        Err(e) if after_duplicate_check(&e) => {
            if let Some(names) = raw_names(bytes, arch) {
                duplicate(defined, names.iter().map(String::as_str))?;
            }
            return Err(code_object(format!(
                "hsa_executable_load_agent_code_object: {e}"
            )));
        }
        Err(e) => {
            return Err(code_object(format!(
                "hsa_executable_load_agent_code_object: {e}"
            )));
        }
    };
    duplicate(defined, section.kernels.iter().map(|k| k.name))?;
    if !full_elf && let Some(k) = section.kernels.iter().find(|k| k.full_elf.is_some()) {
        return Err(code_object(format!(
            "hsa_executable_load_agent_code_object: kernel {:?} is a FullElf kernel, which this \
             runtime's AIE loader does not take yet (PdiInsts kernels only)",
            k.name
        )));
    }
    section
        .check_columns(agent_columns(arch))
        .map_err(|e| code_object(format!("hsa_executable_load_agent_code_object: {e}")))?;
    let mut placed = Placer {
        mem,
        blobs: Vec::new(),
    };
    match build(&mut placed, &section) {
        Ok(kernels) => Ok(LoadedObject {
            kernels,
            blobs: placed.blobs,
        }),
        Err(e) => {
            free_blobs(placed.mem, &placed.blobs);
            Err(e)
        }
    }
}

/// Places blobs in the device heap, remembering them to free on failure.
struct Placer<'m> {
    mem: &'m mut Memory,
    blobs: Vec<usize>,
}

impl Placer<'_> {
    fn place(&mut self, what: &str, bytes: &[u8]) -> Result<PlacedBlob, SimError> {
        let va = self
            .mem
            .allocate(PoolKind::DeviceHeap, bytes.len())
            .map_err(|e| {
                SimError::new(
                    Status::ERROR_OUT_OF_RESOURCES,
                    format!(
                        "hsa_executable_load_agent_code_object: cannot place the {what} ({} \
                         bytes) in the device heap: {}",
                        bytes.len(),
                        e.detail
                    ),
                )
            })?;
        self.blobs.push(va);
        bump(Counter::CodeBlobsPlaced);
        self.mem.write(va as u64, bytes).ok_or_else(|| {
            SimError::new(Status::ERROR, format!("segment copy of the {what} failed"))
        })?;
        Ok(PlacedBlob {
            bo: next_handle(),
            va: va as u64,
            len: bytes.len() as u64,
        })
    }
}

fn build(p: &mut Placer<'_>, section: &AieSection<'_>) -> Result<Vec<LoadedKernel>, SimError> {
    // Distinct PdiInsts blobs, by their place in the section.
    let mut by_place: Vec<((u32, usize), PlacedBlob)> = Vec::new();
    let mut place_once =
        |p: &mut Placer<'_>, what: &str, b: &hsaco::Blob<'_>| -> Result<PlacedBlob, SimError> {
            let key = (b.offset, b.bytes.len());
            if let Some((_, placed)) = by_place.iter().find(|(k, _)| *k == key) {
                return Ok(*placed);
            }
            let placed = p.place(what, b.bytes)?;
            by_place.push((key, placed));
            Ok(placed)
        };
    let mut kernels = Vec::with_capacity(section.kernels.len());
    for k in &section.kernels {
        let kernarg_size = k.effective_kernarg_size();
        let descriptor = match (&k.full_elf, k.pdi) {
            (None, Some(pdi)) => {
                let pdi = place_once(p, &format!("PDI of {:?}", k.name), &pdi)?;
                let insts = place_once(p, &format!("instructions of {:?}", k.name), &k.insts)?;
                KernelDescriptor::new(
                    KernelKind::PdiInsts,
                    k.num_cols,
                    KernelBody::PdiInsts { pdi, insts },
                )
            }
            (Some(ek), _) => {
                let mut pdis = Vec::with_capacity(ek.pdis.len());
                for pdi in &ek.pdis {
                    let placed = p.place(&format!("{} of {:?}", pdi.name, k.name), pdi.bytes)?;
                    pdis.push((pdi.name.clone(), placed));
                }
                KernelDescriptor::new(
                    KernelKind::FullElf,
                    k.num_cols,
                    KernelBody::FullElf {
                        ctrl_code: ek.ctrl_code.to_vec(),
                        sites: ek.sites.clone(),
                        pdis,
                        arg_count: ek.arg_count,
                    },
                )
            }
            (None, None) => {
                // The section parser refuses a PdiInsts kernel without a PDI.
                return Err(code_object(format!(
                    "kernel {:?}: PdiInsts with pdi_size 0",
                    k.name
                )));
            }
        };
        kernels.push(LoadedKernel {
            name: k.name.to_owned(),
            kernarg_size,
            descriptor,
        });
    }
    Ok(kernels)
}

/// Frees blobs a load placed.
pub(crate) fn free_blobs(mem: &mut Memory, blobs: &[usize]) {
    for &va in blobs {
        match mem.free(va) {
            Ok(()) => bump(Counter::CodeBlobsFreed),
            Err(e) => tracing::warn!("hsa-sim: freeing a code blob at {va:#x}: {}", e.detail),
        }
    }
}

/// Applies an `Address64` patch (scheme 8): the PDI's device address as a little-endian u64.
pub(crate) fn patch_address64(ctrl: &mut [u8], offset: u32, addr: u64) -> Option<()> {
    let at = offset as usize;
    ctrl.get_mut(at..at + 8)?
        .copy_from_slice(&addr.to_le_bytes());
    Some(())
}

/// A fresh copy of `ctrl_code` with every site patched: PDI sites with their PDI's device
/// address, argument sites with `args[i] + addend`.
///
/// # Errors
/// `INVALID_PACKET_FORMAT` when a site names an argument the packet lacks or a PDI the
/// kernel did not place, or does not fit the control code (none of which a validated load
/// allows).
pub(crate) fn patched_control_code(
    ctrl_code: &[u8],
    sites: &[PatchSite],
    pdis: &[(String, PlacedBlob)],
    args: &[u64],
) -> Result<Vec<u8>, SimError> {
    let bad = |d: String| SimError::new(Status::ERROR_INVALID_PACKET_FORMAT, d);
    let mut ctrl = ctrl_code.to_vec();
    for s in sites {
        let done = match (&s.target, s.scheme) {
            (SiteTarget::Pdi(name), PatchScheme::ADDRESS_64) => {
                let pdi = pdis
                    .iter()
                    .find(|(n, _)| n == name)
                    .ok_or_else(|| bad(format!("PDI site names {name}, which was not placed")))?;
                patch_address64(&mut ctrl, s.offset, pdi.1.device_address())
            }
            (SiteTarget::Arg(i), PatchScheme::SHIM_DMA_48) => {
                let addr = *args.get(usize::from(*i)).ok_or_else(|| {
                    bad(format!(
                        "argument site for argument {i}, which the packet lacks"
                    ))
                })?;
                npu_artifacts::hsaco::patch_shim_dma48(
                    &mut ctrl,
                    s.offset,
                    addr.wrapping_add(u64::from(s.addend)),
                )
            }
            (t, scheme) => return Err(bad(format!("site {t:?} with scheme {}", scheme.0))),
        };
        done.ok_or_else(|| bad(format!("patch site at {} does not fit", s.offset)))?;
    }
    Ok(ctrl)
}

/// The argument address a zero-initialised `ShimDma48` site holds after a patch (the
/// emulated control code reads its buffers this way).
pub(crate) fn shim_dma48_address(ctrl: &[u8], offset: u32) -> Option<u64> {
    let at = offset as usize;
    let w = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            ctrl.get(at + 4 * i..at + 4 * i + 4)?.try_into().ok()?,
        ))
    };
    let base = (u64::from(w(2)? & 0xFFFF) << 32) | u64::from(w(1)?);
    Some(base.wrapping_sub(0x8000_0000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use npu_artifacts::hsaco::patch_shim_dma48;

    #[test]
    fn shim_dma48_matches_the_formula_on_known_bytes() {
        // w0 = 0xAAAA_AAAA (untouched), w1 = 0x0000_1000, w2 = 0xBEEF_0001.
        let mut ctrl = vec![0u8; 16];
        ctrl[4..8].copy_from_slice(&0xAAAA_AAAAu32.to_le_bytes());
        ctrl[8..12].copy_from_slice(&0x0000_1000u32.to_le_bytes());
        ctrl[12..16].copy_from_slice(&0xBEEF_0001u32.to_le_bytes());
        patch_shim_dma48(&mut ctrl, 4, 0x7F12_3456_7003).unwrap();
        // base = 0x1_0000_1000 + 0x7F12_3456_7003 + 0x8000_0000 = 0x7F13_B456_8003
        assert_eq!(&ctrl[4..8], &0xAAAA_AAAAu32.to_le_bytes());
        assert_eq!(&ctrl[8..12], &0xB456_8000u32.to_le_bytes());
        assert_eq!(&ctrl[12..16], &(0xBEEF_0000u32 | 0x7F13).to_le_bytes());
        // Additive: patching the same bytes again moves the address again.
        let once = ctrl.clone();
        patch_shim_dma48(&mut ctrl, 4, 0x10).unwrap();
        assert_ne!(ctrl, once);
    }

    #[test]
    fn the_high_word_is_ored_without_a_16_bit_mask() {
        let mut ctrl = vec![0u8; 12];
        ctrl[8..12].copy_from_slice(&0x0001_FFFFu32.to_le_bytes());
        patch_shim_dma48(&mut ctrl, 0, 0xFFFF_0000_0000 - 0x8000_0000).unwrap();
        // base = 0xFFFF_0000_0000 + 0xFFFF << 32 = 0x1_FFFE_0000_0000: hi = 0x1FFFE.
        assert_eq!(&ctrl[8..12], &(0x0001_0000u32 | 0x1_FFFE).to_le_bytes());
    }

    #[test]
    fn a_zero_site_reads_back_its_address() {
        let mut ctrl = vec![0u8; 12];
        patch_shim_dma48(&mut ctrl, 0, 0x7F00_1234_5000).unwrap();
        assert_eq!(shim_dma48_address(&ctrl, 0), Some(0x7F00_1234_5000));
        let mut ctrl = vec![0u8; 16];
        patch_address64(&mut ctrl, 8, 0x0400_8000).unwrap();
        assert_eq!(&ctrl[8..16], &0x0400_8000u64.to_le_bytes());
    }

    #[test]
    fn the_descriptor_head_is_version_1() {
        let d = KernelDescriptor::new(
            KernelKind::FullElf,
            1,
            KernelBody::FullElf {
                ctrl_code: vec![],
                sites: vec![],
                pdis: vec![],
                arg_count: 0,
            },
        );
        // SAFETY: the kernel object is the address of the live descriptor head.
        let word0 = unsafe { (d.kernel_object() as *const u32).read() };
        assert_eq!(word0, 1);
        assert_eq!(d.head_kind(), 1);
        assert_eq!(d.kind(), KernelKind::FullElf);
    }
}
