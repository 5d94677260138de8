//! The kernel-object runtime's doorbell (`kernel-object`; `rocr-aie-hsaco.md` §4).
//!
//! **Before submission** every packet of the batch is checked, in ring order, and any refusal
//! fails the whole batch with nothing retired (the read index stays at the batch's first
//! packet, signals untouched):
//!
//! | Condition | Status |
//! |---|---|
//! | opcode not `HSA_AMD_AIE_PACKET_OPCODE_KMQ` (0) | `INVALID_PACKET_FORMAT` |
//! | kernel object NULL, not a descriptor whose first u32 is 1 (a G2 instruction address reads as something else), or not one this runtime loaded and still holds | `INVALID_PACKET_FORMAT` |
//! | kind differs from the batch's first packet (one kind per doorbell batch) | `INVALID_PACKET_FORMAT` |
//! | `FullElf` on an agent that is not aie2p (cannot arise: the loader refuses it) | `INVALID_PACKET_FORMAT` |
//! | `FullElf` with `num_kernargs` other than its ELF's argument count | `INVALID_PACKET_FORMAT` |
//! | `num_kernargs` > 0 with a NULL `kernarg_address` | `INVALID_PACKET_FORMAT` |
//! | kernarg buffer not a runtime allocation the agent can see | `INVALID_ALLOCATION` |
//! | more arguments than fit between `kernarg_address` and the end of its allocation (16 bytes each) | `INVALID_PACKET_FORMAT` |
//! | an argument address not a registered allocation (even with size 0) | `INVALID_ALLOCATION` |
//! | an argument size past the end of its allocation | `INVALID_PACKET_FORMAT` |
//! | a 33rd distinct PDI on the queue (`PdiInsts`) | `OUT_OF_RESOURCES` |
//! | a command over 2047 dwords (the ERT header's 11-bit `count`): `PdiInsts` with more than 1020 arguments | `INVALID_PACKET_FORMAT` |
//! | completion signal not a live signal | `INVALID_SIGNAL` |
//!
//! Words 40 and 48 (reserved) and the header are not checked, as ROCR's driver does not read
//! them.
//!
//! **Hardware context.** The first packet's kind is the batch's mode. The context needs
//! `max(current columns unless the mode changed, the batch's largest num_cols)` columns; it is
//! rebuilt when the mode changed (the first batch included), when there is none, when a
//! `PdiInsts` batch added a PDI to the cache, or when it needs more columns. So it grows within
//! a mode, never shrinks within one, and is sized afresh on a mode switch. `hw_context_builds`,
//! `hw_context_mode_switches` and `hw_context_columns` (the sum of built widths) count this.
//! The PDI cache holds up to 32 PDIs per queue, keyed by the loaded blob (each load is a new
//! PDI); additions of a refused batch are rolled back, and the cache is emptied when an
//! executable with `PdiInsts` kernels was destroyed since the queue's last batch.
//!
//! **Chains.** Commands go in chains of at most 4096 bytes, each slot `52 + 4·arg_cnt`
//! bytes: a `PdiInsts` command (`ERT_START_CU`) has `count = 7 + 2N` (CU mask, txn opcode,
//! instruction address and size, the N argument addresses, one padding dword) and `arg_cnt =
//! count − 1 = 6 + 2N`, so `floor(4096 / (76 + 8N))` fit a chain: 44 of two arguments. A
//! `FullElf` command (`ERT_START_NPU_PREEMPT_ELF`) reports `arg_cnt` 2: 60 bytes, 68 a chain.
//!
//! **Running.** `PdiInsts` runs as the G2 path does after its runtime checks. `FullElf` copies
//! the pristine control code into a fresh device-heap buffer of `ctrl_size + 16384` bytes,
//! applies every `Address64` and `ShimDma48` patch ([`crate::executable::loader`]) and runs
//! it; an emulated full ELF's control code names the emulated PDI at its PDI site and reads
//! each buffer's address back from its `ShimDma48` site, so a wrong patch runs on the wrong
//! memory. Buffers are freed when the batch returns. A failure on the device retires the
//! packets before the failing one, as the driver's `error_index` does.

use std::sync::Arc;

use hsa_core::sys::{AIE_PACKET_OPCODE_KMQ, Status};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{EMU_CTRL_ARG_SITES, EMU_CTRL_MAGIC, EMU_CTRL_PDI_SITE};
use npu_artifacts::hsaco::KernelKind;

use crate::agents::PoolKind;
use crate::counters::{Counter, bump, bump_by};
use crate::executable::loader::{patched_control_code, shim_dma48_address};
use crate::executable::{CodeObjects, KernelBody, KernelDescriptor};
use crate::memory::Memory;
use crate::profile::{CHAIN_BUFFER_BYTES, CHAIN_SLOT_HEADER_BYTES};
use crate::queue::{QueueObj, QueueState};
use crate::rules::{self, kernel_buffer};
use crate::runtime::Runtime;
use crate::signal::{SignalObj, complete};
use crate::status::SimError;

use super::Command;
use super::decode::{self, read_kernel_object};

/// The most dwords one ERT command may declare (`count` is 11 bits).
pub const MAX_COMMAND_DWORDS: u64 = 2047;
/// Extra bytes of a full-ELF control buffer, so its 16 KiB-aligned start fits.
pub const CTRL_CODE_SLACK: usize = 16 << 10;
/// Distinct PDIs a queue holds (the CU mask has 32 bits).
pub const PDI_CACHE: usize = 32;

/// A queue's hardware context and PDI cache under the kernel-object runtime.
#[derive(Debug, Default)]
pub(crate) struct KoQueueState {
    /// The kind of the last batch (`None`: undecided, no context yet).
    mode: Option<KernelKind>,
    /// Columns of the current context (0: none).
    columns: u32,
    /// PDI buffer objects in the CU mask, in order.
    pdis: Vec<u64>,
    /// The PDI-release epoch the cache belongs to.
    epoch: u64,
}

/// The dwords of a command for a kernel of `kind` with `n` arguments.
pub fn command_dwords(kind: KernelKind, n: u64) -> u64 {
    match kind {
        KernelKind::PdiInsts => 7 + 2 * n,
        KernelKind::FullElf => 13,
    }
}

/// The bytes one command takes in the driver's chain buffer: `52 + 4·arg_cnt`.
pub fn command_bytes(kind: KernelKind, n: u64) -> u64 {
    let arg_cnt = match kind {
        KernelKind::PdiInsts => command_dwords(kind, n) - 1,
        KernelKind::FullElf => 2,
    };
    CHAIN_SLOT_HEADER_BYTES + 4 * arg_cnt
}

/// One packet that passed the checks.
#[derive(Debug)]
struct Checked {
    kernel: Arc<KernelDescriptor>,
    /// (address, declared size).
    args: Vec<(u64, u64)>,
    /// Bytes usable at each argument (the rest of its allocation when the size is 0).
    avail: Vec<u64>,
    completion: Option<Arc<SignalObj>>,
}

fn bad_format(detail: String) -> SimError {
    SimError::new(Status::ERROR_INVALID_PACKET_FORMAT, detail)
}

/// The descriptor a kernel object names, or the refusal real ROCR gives (or, where real ROCR
/// would use freed or foreign memory as a descriptor, a refusal all the same).
fn descriptor(
    code: &CodeObjects,
    mem: &Memory,
    ko: u64,
) -> Result<Arc<KernelDescriptor>, SimError> {
    if ko == 0 {
        return Err(bad_format("the kernel object (words 20/24) is NULL".into()));
    }
    if let Some(k) = code.kernel(ko) {
        return Ok(k);
    }
    let word = match mem.read(ko, 4) {
        Some(b) => Some(b),
        None => crate::memory::read_process_memory(ko, 4).ok(),
    };
    let word = word
        .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
        .map(u32::from_le_bytes);
    Err(bad_format(match word {
        None => format!(
            "kernel object {ko:#x} is not readable memory (real ROCR would fault reading the \
             descriptor)"
        ),
        Some(v) if v != hsa_core::sys::AIE_KERNEL_DESCRIPTOR_VERSION => format!(
            "kernel descriptor version {v:#x} at kernel object {ko:#x} is not 1: words 20/24 \
             must hold HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT of a frozen executable (a G2 \
             packet's instruction address reads as this)"
        ),
        Some(_) => format!(
            "kernel object {ko:#x} is not a descriptor of a live executable (destroyed, or never \
             loaded); real ROCR would trust it and use freed or foreign memory"
        ),
    }))
}

/// Checks packet `index` against the batch's kind; `pdis` is the tentative PDI cache.
#[allow(clippy::too_many_arguments)]
fn check(
    rt: &Runtime,
    q: &QueueObj,
    code: &CodeObjects,
    mem: &Memory,
    index: u64,
    batch_kind: &mut Option<KernelKind>,
    pdis: &mut Vec<u64>,
) -> Result<Checked, SimError> {
    let p = read_kernel_object(q, index)
        .ok_or_else(|| bad_format(format!("packet {index} is outside the ring")))?;
    if p.opcode != AIE_PACKET_OPCODE_KMQ {
        return Err(bad_format(format!(
            "opcode {} is not HSA_AMD_AIE_PACKET_OPCODE_KMQ (0)",
            p.opcode
        )));
    }
    let kernel = descriptor(code, mem, p.kernel_object())?;
    let kind = kernel.kind();
    match *batch_kind {
        None => *batch_kind = Some(kind),
        Some(b) if b != kind => {
            return Err(bad_format(format!(
                "a {kind} kernel in a batch of {b} kernels: one doorbell batch runs one kind \
                 (ring the doorbell before switching)"
            )));
        }
        Some(_) => {}
    }
    let n = usize::from(p.num_kernargs);
    if let KernelBody::FullElf { arg_count, .. } = &kernel.body {
        if rt.config.agent != NpuGen::Npu2 {
            return Err(bad_format(
                "a FullElf kernel needs an aie2p (Strix) device".into(),
            ));
        }
        if u64::from(*arg_count) != n as u64 {
            return Err(bad_format(format!(
                "num_kernargs is {n} but the FullElf kernel's ELF has {arg_count} arguments"
            )));
        }
    }
    let mut args = Vec::with_capacity(n);
    let mut avail = Vec::with_capacity(n);
    if n > 0 {
        if p.kernarg_address == 0 {
            return Err(bad_format(format!(
                "num_kernargs is {n} but kernarg_address is NULL"
            )));
        }
        let r = kernel_buffer(mem, "kernarg buffer", p.kernarg_address, 0)?;
        let room = r.remaining(p.kernarg_address) / 16;
        if (n as u64) > room {
            return Err(bad_format(format!(
                "num_kernargs is {n} but the kernarg buffer at {:#x} has room for {room} \
                 (16 bytes each: the addresses, then the sizes)",
                p.kernarg_address
            )));
        }
        let words = mem
            .read(p.kernarg_address, 16 * n as u64)
            .unwrap_or_default();
        let word = |i: usize| {
            let b = words
                .get(i * 8..i * 8 + 8)
                .and_then(|w| <[u8; 8]>::try_from(w).ok());
            u64::from_le_bytes(b.unwrap_or_default())
        };
        for i in 0..n {
            let (addr, size) = (word(i), word(n + i));
            let r = kernel_buffer(mem, format_args!("argument {i}"), addr, 0)?;
            let left = r.remaining(addr);
            if size > left {
                return Err(bad_format(format!(
                    "argument {i} at {addr:#x} declares {size} bytes but its allocation has only \
                     {left} left"
                )));
            }
            args.push((addr, size));
            avail.push(if size == 0 { left } else { size });
        }
    }
    if let KernelBody::PdiInsts { pdi, .. } = &kernel.body
        && !pdis.contains(&pdi.bo)
    {
        if pdis.len() >= PDI_CACHE {
            return Err(SimError::new(
                Status::ERROR_OUT_OF_RESOURCES,
                format!(
                    "the PDI of this kernel would be distinct PDI number {} on this queue; a \
                     queue holds at most {PDI_CACHE} (the CU mask has 32 bits; every load of an \
                     hsaco is a new PDI)",
                    PDI_CACHE + 1
                ),
            ));
        }
        pdis.push(pdi.bo);
    }
    let dwords = command_dwords(kind, n as u64);
    if dwords > MAX_COMMAND_DWORDS {
        return Err(bad_format(format!(
            "the command for {n} arguments needs {dwords} dwords; an ERT command holds at most \
             {MAX_COMMAND_DWORDS} (11-bit count), so at most 1020 arguments"
        )));
    }
    let completion = decode::completion(rt, p.completion_signal)?;
    Ok(Checked {
        kernel,
        args,
        avail,
        completion,
    })
}

/// Runs the batch `[rd, wr)`. On failure returns the error and the index it is about; the
/// read index has been moved past every packet that completed.
pub(super) fn run_batch(
    rt: &Runtime,
    q: &QueueObj,
    state: &mut QueueState,
    rd: u64,
    wr: u64,
) -> Result<(), SimError> {
    let checked = {
        let code = rt.code();
        let mem = rt.memory();
        if state.ko.epoch != code.pdi_epoch {
            state.ko.pdis.clear();
            state.ko.epoch = code.pdi_epoch;
        }
        let mut kind = None;
        let mut pdis = state.ko.pdis.clone();
        let mut checked = Vec::with_capacity(usize::try_from(wr - rd).unwrap_or(0));
        for index in rd..wr {
            let c = check(rt, q, &code, &mem, index, &mut kind, &mut pdis).map_err(|e| {
                SimError::new(
                    e.status,
                    format!(
                        "packet {index}: {}; the batch was refused before submission",
                        e.detail
                    ),
                )
            })?;
            checked.push(c);
        }
        let added = pdis.len() > state.ko.pdis.len();
        state.ko.pdis = pdis;
        if let Some(kind) = kind {
            size_context(&mut state.ko, kind, &checked, added);
        }
        checked
    };
    let chains = plan_chains(&checked);
    bump_by(Counter::ChainSubmissions, chains.len() as u64);
    for _ in &chains {
        crate::timing::chain();
    }
    let mut buffers = Vec::new();
    let result = run_all(rt, q, state, rd, &checked, &mut buffers);
    let mut mem = rt.memory();
    for b in buffers {
        if let Err(e) = mem.free(b) {
            tracing::warn!("hsa-sim: freeing a control-code buffer: {}", e.detail);
        }
    }
    result
}

fn size_context(ko: &mut KoQueueState, kind: KernelKind, checked: &[Checked], added_pdi: bool) {
    let widest = checked.iter().map(|c| c.kernel.num_cols).max().unwrap_or(0);
    let mode_changed = ko.mode != Some(kind);
    let required = if mode_changed {
        widest
    } else {
        ko.columns.max(widest)
    };
    if mode_changed || ko.columns == 0 || added_pdi || required > ko.columns {
        bump(Counter::HwContextBuilds);
        crate::timing::context();
        if mode_changed && ko.mode.is_some() {
            bump(Counter::HwContextModeSwitches);
        }
        bump_by(Counter::HwContextColumns, u64::from(required));
        ko.columns = required;
        ko.mode = Some(kind);
    }
}

/// Packets per chain: commands fill 4096-byte chain buffers in order.
fn plan_chains(checked: &[Checked]) -> Vec<usize> {
    let mut chains = Vec::new();
    let (mut len, mut bytes) = (0usize, 0u64);
    for c in checked {
        let cost = command_bytes(c.kernel.kind(), c.args.len() as u64);
        if len > 0 && bytes + cost > CHAIN_BUFFER_BYTES {
            chains.push(len);
            (len, bytes) = (0, 0);
        }
        len += 1;
        bytes += cost;
    }
    if len > 0 {
        chains.push(len);
    }
    chains
}

fn run_all(
    rt: &Runtime,
    q: &QueueObj,
    state: &mut QueueState,
    rd: u64,
    checked: &[Checked],
    buffers: &mut Vec<usize>,
) -> Result<(), SimError> {
    for (index, c) in (rd..).zip(checked) {
        let at = |e: SimError| SimError::new(e.status, format!("packet {index}: {}", e.detail));
        run_one(rt, q, state, c, buffers).map_err(at)?;
        q.read
            .store(index + 1, std::sync::atomic::Ordering::Release);
        if let Some(sig) = &c.completion {
            complete(sig);
        }
        bump(Counter::PacketsCompleted);
        crate::timing::command();
    }
    Ok(())
}

fn run_one(
    rt: &Runtime,
    q: &QueueObj,
    state: &mut QueueState,
    c: &Checked,
    buffers: &mut Vec<usize>,
) -> Result<(), SimError> {
    match &c.kernel.body {
        KernelBody::PdiInsts { pdi, insts } => {
            let mem = rt.memory();
            let resolved = mem.resolve(pdi.va).ok_or_else(|| {
                SimError::new(
                    Status::ERROR,
                    "the kernel's PDI is no longer in the device heap",
                )
            })?;
            let cmd = Command {
                pdi: pdi.va,
                insts: insts.va,
                insts_size: insts.len,
                args: c.args.clone(),
                completion: None,
                pdi_patch_offset: 0,
            };
            rules::run_pdi_insts(q, state, mem, &cmd, &resolved, &c.avail)
        }
        KernelBody::FullElf {
            ctrl_code,
            sites,
            pdis,
            ..
        } => {
            let addrs: Vec<u64> = c.args.iter().map(|a| a.0).collect();
            let patched = patched_control_code(ctrl_code, sites, pdis, &addrs)?;
            let mut mem = rt.memory();
            let buf = mem
                .allocate(PoolKind::DeviceHeap, patched.len() + CTRL_CODE_SLACK)
                .map_err(|e| {
                    SimError::new(
                        Status::ERROR_OUT_OF_RESOURCES,
                        format!(
                            "no device-heap room for the control code ({} + {CTRL_CODE_SLACK} \
                             bytes): {}",
                            patched.len(),
                            e.detail
                        ),
                    )
                })?;
            buffers.push(buf);
            // The heap's blocks start 32 KiB-aligned, so the buffer's start is 16 KiB-aligned.
            mem.write(buf as u64, &patched)
                .ok_or_else(|| SimError::new(Status::ERROR, "control-code copy failed"))?;
            let ctrl = mem
                .read(buf as u64, patched.len() as u64)
                .unwrap_or_default();
            if !ctrl.starts_with(EMU_CTRL_MAGIC) {
                return Err(SimError::new(
                    Status::AMD_ERROR_NOT_SUPPORTED,
                    "the full ELF's control code is real NPU code: the emulator runs only \
                     emulated full ELFs (npu-artifacts EmuDesign::to_full_elf)",
                ));
            }
            let pdi_dev = ctrl
                .get(EMU_CTRL_PDI_SITE as usize..EMU_CTRL_PDI_SITE as usize + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_le_bytes)
                .unwrap_or_default();
            let pdi = pdis
                .iter()
                .find(|(_, p)| p.device_address() == pdi_dev)
                .map(|(_, p)| p.va)
                .ok_or_else(|| {
                    SimError::new(
                        Status::ERROR,
                        format!(
                            "device error: the control code loads a PDI from device address \
                             {pdi_dev:#x}, where the kernel has none"
                        ),
                    )
                })?;
            let design = rules::design_in(&mem, pdi)?;
            let mut args = Vec::with_capacity(c.args.len());
            for (i, &(_, size)) in c.args.iter().enumerate() {
                let site = EMU_CTRL_ARG_SITES + 12 * u32::try_from(i).unwrap_or(u32::MAX);
                let addr = shim_dma48_address(&ctrl, site).unwrap_or_default();
                args.push((addr, size));
            }
            rules::run_design(q, mem, &design, &args, &c.avail)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_hold_44_pdi_insts_commands_of_two_arguments_and_68_full_elf() {
        let fit = |kind, n| CHAIN_BUFFER_BYTES / command_bytes(kind, n);
        assert_eq!(command_bytes(KernelKind::PdiInsts, 2), 92);
        assert_eq!(fit(KernelKind::PdiInsts, 2), 44);
        assert_eq!(fit(KernelKind::FullElf, 2), 68);
        assert_eq!(
            command_dwords(KernelKind::PdiInsts, 1020),
            MAX_COMMAND_DWORDS
        );
        assert!(command_dwords(KernelKind::PdiInsts, 1021) > MAX_COMMAND_DWORDS);
    }
}
