//! G2 full-ELF packets (`pdi_patch_offset` ≠ 0) on the runtimes that have them
//! ([`crate::Profile::g2_full_elf`]; ROCR's `core/driver/xdna/README.md` @ `159fb22f` and the
//! driver's `BuildFullElfCommand`).
//!
//! The application parsed the full ELF itself: it placed the PDI and the control code in the
//! device heap and patched its argument addresses into the control code (`ShimDma48`). The
//! packet names the control code in words 20/24 with its size in word 40, the PDI in word 48,
//! and in word 56 the offset of the control code's PDI site. The runtime writes the PDI's
//! device address (u64, low word first) at that site in the application's buffer and submits
//! `ERT_START_NPU_PREEMPT_ELF`. The kernargs only keep the buffers resident and drive the
//! cache flushes; the device reads the arguments from the control code.
//!
//! Refusals, as the driver's (all `INVALID_PACKET_FORMAT` unless named):
//!
//! | Condition | Status |
//! |---|---|
//! | control code or PDI NULL; `insts_size` < 8; the 8-byte PDI site past the control code or not 4-byte aligned | |
//! | control code or PDI not an allocation the runtime knows | `INVALID_ALLOCATION` |
//! | control code not in the device heap (no device address), or not 16 KiB aligned there | |
//! | `insts_size` past the end of the control code's allocation | |
//! | PDI not in the device heap | |
//! | a batch that mixes full-ELF and PDI + insts packets (checked before anything runs) | |
//! | a full-ELF batch on an agent that is not aie2p | |
//!
//! Full ELF uses no compute-unit slot: the PDI cache (32 per queue) is dropped when a queue
//! switches to it, and no PDI ceiling applies. A full-ELF command takes 60 bytes of the
//! driver's chain buffer.

use hsa_core::sys::{DEVICE_HEAP_DEVICE_BASE, Status};
use npu_artifacts::emu::{EMU_CTRL_ARG_SITES, EMU_CTRL_MAGIC, EMU_CTRL_PDI_SITE};

use crate::agents::PoolKind;
use crate::executable::loader::shim_dma48_address;
use crate::memory::{Memory, Owner};
use crate::profile::CHAIN_SLOT_HEADER_BYTES;
use crate::queue::QueueObj;
use crate::rules::{self, kernel_buffer};
use crate::runtime::Runtime;
use crate::status::SimError;

use super::Command;

/// The control code's required device-address alignment (measured by ROCR's authors on aie2p:
/// every other offset hangs, so the runtime refuses it).
pub const CTRL_CODE_ALIGNMENT: u64 = 16 << 10;

/// Bytes one full-ELF command takes in the driver's chain buffer: the slot header and the two
/// argument dwords the driver's bound check counts (68 fit a chain).
pub const COMMAND_BYTES: u64 = CHAIN_SLOT_HEADER_BYTES + 4 * 2;

fn bad_format(detail: String) -> SimError {
    SimError::new(Status::ERROR_INVALID_PACKET_FORMAT, detail)
}

/// The device address of heap memory at `va`.
fn device_address(mem: &Memory, va: u64) -> u64 {
    DEVICE_HEAP_DEVICE_BASE + (va - mem.heap_base())
}

/// Resolves `addr` as device-heap memory the NPU can fetch, returning the bytes left in its
/// allocation from `addr`.
fn device_buffer(mem: &Memory, what: &str, addr: u64) -> Result<u64, SimError> {
    let r = kernel_buffer(mem, what, addr, 0)?;
    if r.owner != Owner::Pool(PoolKind::DeviceHeap) {
        return Err(bad_format(format!(
            "the full-ELF {what} at {addr:#x} is not in device memory: the NPU fetches it itself, \
             so allocate it from the pool whose RUNTIME_ALLOC_REC_GRANULE is 0"
        )));
    }
    Ok(r.remaining(addr))
}

/// Checks a full-ELF packet and writes the PDI's device address into its control code, as the
/// runtime does while it builds the batch.
///
/// # Errors
/// The refusals of the module table.
pub(crate) fn prepare(rt: &Runtime, cmd: &Command) -> Result<(), SimError> {
    let mem = rt.memory();
    let pdi_dev = check(&mem, cmd)?;
    mem.write(cmd.insts + cmd.pdi_patch_offset, &pdi_dev.to_le_bytes())
        .ok_or_else(|| SimError::new(Status::ERROR, "writing the PDI site failed"))?;
    Ok(())
}

/// The refusals of the module table for one full-ELF packet; the PDI's device address.
///
/// # Errors
/// The refusals of the module table.
pub(crate) fn check(mem: &Memory, cmd: &Command) -> Result<u64, SimError> {
    let off = cmd.pdi_patch_offset;
    if cmd.insts == 0 || cmd.pdi == 0 {
        return Err(bad_format(
            "a full-ELF packet needs both the control code (words 20/24) and the PDI (word 48)"
                .into(),
        ));
    }
    if cmd.insts_size < 8 || off > cmd.insts_size - 8 || !off.is_multiple_of(4) {
        return Err(bad_format(format!(
            "the PDI site at offset {off:#x} must be 4-byte aligned and its 8 bytes inside the \
             {}-byte control code",
            cmd.insts_size
        )));
    }
    let ctrl_left = device_buffer(mem, "control code", cmd.insts)?;
    let ctrl_dev = device_address(mem, cmd.insts);
    if !ctrl_dev.is_multiple_of(CTRL_CODE_ALIGNMENT) {
        return Err(bad_format(format!(
            "the full-ELF control code's device address {ctrl_dev:#x} is not 16 KiB aligned; a \
             misaligned control code never completes on aie2p"
        )));
    }
    if cmd.insts_size > ctrl_left {
        return Err(bad_format(format!(
            "insts_size {} runs past the control code's allocation ({ctrl_left} bytes left)",
            cmd.insts_size
        )));
    }
    device_buffer(mem, "PDI", cmd.pdi)?;
    Ok(device_address(mem, cmd.pdi))
}

/// Runs a prepared full-ELF packet: the emulated control code loads the PDI named at its PDI
/// site and reads each buffer's address back from its `ShimDma48` site, so a wrong patch (the
/// application's or the runtime's) runs on the wrong memory.
///
/// # Errors
/// `NOT_SUPPORTED` for real NPU control code; a device error where the control code names no
/// PDI; the design's own failures.
pub(crate) fn run(
    rt: &Runtime,
    q: &QueueObj,
    cmd: &Command,
    avail: &[u64],
) -> Result<(), SimError> {
    let mem = rt.memory();
    let ctrl = mem.read(cmd.insts, cmd.insts_size).unwrap_or_default();
    if !ctrl.starts_with(EMU_CTRL_MAGIC) {
        return Err(SimError::new(
            Status::AMD_ERROR_NOT_SUPPORTED,
            "the full ELF's control code is real NPU code: the emulator runs only emulated full \
             ELFs (npu-artifacts EmuDesign::to_full_elf)",
        ));
    }
    let site = EMU_CTRL_PDI_SITE as usize;
    let pdi_dev = ctrl
        .get(site..site + 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_le_bytes);
    let pdi = pdi_dev
        .checked_sub(DEVICE_HEAP_DEVICE_BASE)
        .map_or(0, |o| mem.heap_base() + o);
    let design = rules::design_in(&mem, pdi).map_err(|e| {
        SimError::new(
            e.status,
            format!(
                "the control code loads its PDI from device address {pdi_dev:#x}: {}",
                e.detail
            ),
        )
    })?;
    let mut args = Vec::with_capacity(cmd.args.len());
    for (i, &(_, size)) in cmd.args.iter().enumerate() {
        let at = EMU_CTRL_ARG_SITES + 12 * u32::try_from(i).unwrap_or(u32::MAX);
        args.push((shim_dma48_address(&ctrl, at).unwrap_or_default(), size));
    }
    rules::run_design(q, mem, &design, &args, avail)
}
