//! What a program must be before it is stored: within the size limit, a well-formed PDI and
//! instruction stream or AIE hsaco (npu-artifacts), for the device's generation, and runnable
//! on the device and its runtime.

use npu_artifacts::emu::EmuDesign;
use npu_artifacts::hsaco::{HsacoRule, KernelKind, parse_for_arch};
use npu_artifacts::pdi::PdiKind;
use npu_artifacts::{ArtifactError, NpuGen};
use npu_proto::v1 as pb;

use super::Runs;
use super::{FORM_HSACO, FORM_PDI_INSTS, gen_name};
use crate::error::NpudError;

/// RESOURCE_EXHAUSTED when `what` is over `max_bytes`.
pub(super) fn check_size(what: &str, bytes: u64, max_bytes: u64) -> Result<(), NpudError> {
    if bytes > max_bytes {
        return Err(NpudError::ResourceExhausted(format!(
            "{what}: {bytes} bytes; at most {max_bytes} (limits.max_program_bytes)"
        )));
    }
    Ok(())
}

/// An hsaco's parse error as the caller's status: a file with no section for this device's
/// arch is FAILED_PRECONDITION (like an instruction stream for another generation), anything
/// else malformed is INVALID_ARGUMENT with the rule and offset the parser names.
fn hsaco_error(e: ArtifactError, device: NpuGen) -> NpudError {
    match e {
        ArtifactError::HsacoContainer {
            rule: HsacoRule::ArchSection,
            ..
        } => NpudError::FailedPrecondition(format!(
            "hsaco: {e}; this device is {} (section {})",
            gen_name(device),
            device.agent_name()
        )),
        e => NpudError::InvalidArgument(format!("hsaco: {e}")),
    }
}

/// The kernel a registration names: `kernel`, or when it is empty the only kernel of the
/// device's section.
///
/// # Errors
/// As [`validate_hsaco`] for the file; INVALID_ARGUMENT for a kernel the section lacks, or an
/// empty name when the section has several (both listing the kernels).
pub(super) fn resolve_kernel(
    hsaco: &[u8],
    kernel: &str,
    device: NpuGen,
) -> Result<String, NpudError> {
    let section = parse_for_arch(hsaco, device).map_err(|e| hsaco_error(e, device))?;
    let names: Vec<&str> = section.kernels.iter().map(|k| k.name).collect();
    match (kernel, names.as_slice()) {
        ("", [only]) => Ok((*only).to_owned()),
        ("", _) => Err(NpudError::InvalidArgument(format!(
            "kernel: empty, and the hsaco's {} section has {} kernels {names:?}: name one",
            device.agent_name(),
            names.len()
        ))),
        (k, _) if names.contains(&k) => Ok(k.to_owned()),
        (k, _) => Err(NpudError::InvalidArgument(format!(
            "kernel: the hsaco's {} section has no kernel {k:?}; it has {names:?}",
            device.agent_name()
        ))),
    }
}

/// Checks an hsaco kernel before it is stored: the file against every rule ROCR's loader
/// applies for this device's arch; a PdiInsts kernel's PDI and instruction stream as
/// [`validate`] checks them; a FullElf kernel only on a runtime that loads code objects.
///
/// # Errors
/// RESOURCE_EXHAUSTED above `max_bytes`; INVALID_ARGUMENT for a malformed file or an unknown
/// kernel; FAILED_PRECONDITION for a file without this arch's section, a design this device
/// cannot run, or a FullElf kernel on a runtime that does not load code objects.
pub fn validate_hsaco(
    hsaco: &[u8],
    kernel: &str,
    max_bytes: u64,
    device: NpuGen,
    runs: Runs,
    abi: hsa_core::PacketAbi,
    g2_full_elf: Result<(), &str>,
) -> Result<pb::ProgramSummary, NpudError> {
    check_size("hsaco", hsaco.len() as u64, max_bytes)?;
    let section = parse_for_arch(hsaco, device).map_err(|e| hsaco_error(e, device))?;
    let k = section.kernel(kernel).ok_or_else(|| {
        NpudError::InvalidArgument(format!("kernel: the hsaco has no kernel {kernel:?}"))
    })?;
    let mut summary = match (k.kind, &k.pdi, &k.full_elf) {
        (KernelKind::PdiInsts, Some(pdi), _) => {
            validate(pdi.bytes, k.insts.bytes, max_bytes, device, runs)
                .map_err(|e| e.within(&format!("hsaco kernel {kernel:?}")))?
        }
        (KernelKind::FullElf, _, Some(elf)) => {
            if !abi.loads_code_objects() {
                if let Err(why) = g2_full_elf {
                    return Err(NpudError::FailedPrecondition(format!(
                        "hsaco kernel {kernel:?} is a FullElf kernel, and this runtime (packet \
                         ABI {abi}) neither loads code objects nor takes G2 full-ELF packets \
                         ({why}): FullElf kernels run on a kernel-object ROCR, or on a G2 ROCR \
                         with full ELF on aie2p (g2_full_elf = true); PdiInsts kernels of an \
                         hsaco run on every runtime"
                    )));
                }
                let pdi_sites = elf
                    .sites
                    .iter()
                    .filter(|s| matches!(s.target, npu_artifacts::hsaco::SiteTarget::Pdi(_)))
                    .count();
                if elf.pdis.len() != 1 || pdi_sites != 1 {
                    return Err(NpudError::FailedPrecondition(format!(
                        "hsaco kernel {kernel:?} is a FullElf kernel with {} PDIs and {pdi_sites} \
                         PDI sites; a G2 full-ELF packet names one of each",
                        elf.pdis.len()
                    )));
                }
            }
            // An emulated full ELF carries an emulated design where a real one carries control
            // code: each runs only where its kind of design does.
            let kind = match (EmuDesign::from_full_elf_kernel(elf), runs) {
                (Ok(d), Runs::EmulatedDesigns) => d.kernel.name().to_owned(),
                (Err(_), Runs::RealDesigns) => "full-elf".to_owned(),
                (Ok(d), Runs::RealDesigns) => {
                    return Err(NpudError::FailedPrecondition(format!(
                        "hsaco kernel {kernel:?}: an emulated design ({}) runs only on the \
                         emulator (hsa-sim); this daemon drives an NPU",
                        d.kernel.name()
                    )));
                }
                (Err(e), Runs::EmulatedDesigns) => {
                    return Err(NpudError::FailedPrecondition(format!(
                        "hsaco kernel {kernel:?}: real control code ({e}) needs an NPU; this \
                         daemon runs the emulator (hsa-sim), which runs emulated designs only"
                    )));
                }
            };
            let args = elf.arg_count as usize;
            pb::ProgramSummary {
                generation: gen_name(device).to_owned(),
                arg_count: elf.arg_count,
                min_arg_bytes: vec![0; args],
                kind,
                insts_bytes: u32::try_from(elf.ctrl_code.len()).unwrap_or(u32::MAX),
                pdi_bytes: u32::try_from(elf.pdis.iter().map(|p| p.bytes.len()).sum::<usize>())
                    .unwrap_or(u32::MAX),
                columns: k.num_cols,
                ..Default::default()
            }
        }
        _ => {
            return Err(NpudError::InvalidArgument(format!(
                "hsaco kernel {kernel:?}: a {} kernel without its blobs",
                k.kind
            )));
        }
    };
    summary.form = FORM_HSACO.to_owned();
    summary.kernel_name = kernel.to_owned();
    summary.kernel_kind = k.kind.name().to_owned();
    Ok(summary)
}

/// Checks uploaded bytes before they are stored.
///
/// # Errors
/// RESOURCE_EXHAUSTED above `max_bytes`; INVALID_ARGUMENT with the artifact error for malformed
/// bytes; FAILED_PRECONDITION for another generation, or a design the device cannot run.
pub fn validate(
    pdi: &[u8],
    insts: &[u8],
    max_bytes: u64,
    device: NpuGen,
    runs: Runs,
) -> Result<pb::ProgramSummary, NpudError> {
    let total = (pdi.len() as u64).saturating_add(insts.len() as u64);
    check_size("pdi and insts together", total, max_bytes)?;
    if pdi.is_empty() {
        return Err(NpudError::InvalidArgument("pdi: empty".into()));
    }
    if insts.is_empty() {
        return Err(NpudError::InvalidArgument("insts: empty".into()));
    }
    let (kind, txn) = npu_artifacts::design::check_pair(pdi, insts)
        .map_err(|e| NpudError::InvalidArgument(format!("invalid program: {e}")))?;
    txn.check_generation(device)
        .map_err(|e| NpudError::FailedPrecondition(format!("insts: {e}")))?;
    let kind_name = match (&kind, runs) {
        (PdiKind::Emulated(d), Runs::EmulatedDesigns) => d.kernel.name().to_owned(),
        (PdiKind::Partial(_), Runs::RealDesigns) => "pdi".to_owned(),
        (PdiKind::Partial(_), Runs::EmulatedDesigns) => {
            return Err(NpudError::FailedPrecondition(
                "pdi: a real partial PDI (PPDI): real designs need an NPU; this daemon runs the \
                 emulator (hsa-sim), which runs emulated designs only"
                    .into(),
            ));
        }
        (PdiKind::Emulated(d), Runs::RealDesigns) => {
            return Err(NpudError::FailedPrecondition(format!(
                "pdi: an emulated design ({}) runs only on the emulator (hsa-sim); this daemon \
                 drives an NPU",
                d.kernel.name()
            )));
        }
        (PdiKind::Xclbin(_), _) => {
            return Err(NpudError::InvalidArgument(
                "pdi: an xclbin, not a PDI; the HSA path needs main.pdi from aiecc --get-pdi"
                    .into(),
            ));
        }
    };
    Ok(pb::ProgramSummary {
        generation: gen_name(txn.generation).to_owned(),
        arg_count: u32::try_from(txn.arg_count()).unwrap_or(u32::MAX),
        min_arg_bytes: txn.min_arg_sizes(),
        kind: kind_name,
        insts_bytes: u32::try_from(insts.len()).unwrap_or(u32::MAX),
        pdi_bytes: u32::try_from(pdi.len()).unwrap_or(u32::MAX),
        columns: u32::from(txn.cols),
        op_count: txn.op_count,
        form: FORM_PDI_INSTS.to_owned(),
        ..Default::default()
    })
}
