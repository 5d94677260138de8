//! What a program must be before it is stored: within the size limit, a well-formed PDI and
//! instruction stream (npu-artifacts), for the device's generation, and runnable on the device.

use npu_artifacts::NpuGen;
use npu_artifacts::pdi::PdiKind;
use npu_proto::v1 as pb;

use super::Runs;
use super::gen_name;
use crate::error::NpudError;

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
    if total > max_bytes {
        return Err(NpudError::ResourceExhausted(format!(
            "pdi and insts: {total} bytes together; at most {max_bytes} (limits.max_program_bytes)"
        )));
    }
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
    })
}
