//! The checks ROCR, the amdxdna driver and the device apply to one decoded packet, then the
//! reference kernel. The table of rules and statuses is in the crate docs.
//!
//! Order: the runtime's checks (the instruction buffer resolving to an allocation it knows, its
//! size, the other buffers resolving,
//! the 32-PDI limit), the driver's (PDI buffer type), then the device's (PDI and TXN
//! contents, generation, argument coverage), then the kernel.

use std::sync::MutexGuard;

use hsa_core::sys::{
    AccessPermission, DEV_ADDR_OFFSET_MASK, DEVICE_HEAP_DEVICE_BASE, MAX_PDIS_PER_QUEUE, Status,
};
use npu_artifacts::emu::{EmuDesign, EmuKernel, HEADER_LEN, MAGIC};
use npu_artifacts::pdi::{PdiKind, identify};
use npu_artifacts::txn::TxnProgram;

use crate::agents::PoolKind;
use crate::dispatch::Command;
use crate::kernels;
use crate::memory::{Memory, Owner, Resolved};
use crate::queue::{QueueObj, QueueState};
use crate::runtime::Runtime;
use crate::status::SimError;

fn invalid_allocation(detail: String) -> SimError {
    SimError::new(Status::ERROR_INVALID_ALLOCATION, detail)
}

fn device_error(detail: String) -> SimError {
    SimError::new(Status::ERROR, detail)
}

/// Checks that `[addr, addr+len)` is memory the AIE driver can resolve to a BO: an AIE-pool
/// allocation, or a vmem mapping the AIE agent was granted access to.
///
/// # Errors
/// `INVALID_ALLOCATION` naming `what`, the address and the reason.
pub(crate) fn kernel_buffer(
    mem: &Memory,
    what: impl std::fmt::Display,
    addr: u64,
    len: u64,
) -> Result<Resolved, SimError> {
    let r = mem.resolve(addr).ok_or_else(|| {
        invalid_allocation(format!(
            "{what} at {addr:#x} is not an allocation the runtime knows (allocate it from an AIE \
             pool or map it with hsa_amd_vmem_*)"
        ))
    })?;
    match r.owner {
        Owner::Pool(kind) if !kind.is_aie() => {
            return Err(invalid_allocation(format!(
                "{what} at {addr:#x} is in {}, which the AIE driver cannot resolve to a BO",
                kind.describe()
            )));
        }
        Owner::Vmem { aie_access, .. } if aie_access == AccessPermission::NONE => {
            return Err(invalid_allocation(format!(
                "{what} at {addr:#x} is a vmem mapping the AIE agent has no access to (grant it \
                 with hsa_amd_vmem_set_access)"
            )));
        }
        _ => {}
    }
    if r.remaining(addr) < len {
        return Err(invalid_allocation(format!(
            "{what} at {addr:#x} declares {len} bytes but its allocation has only {} left",
            r.remaining(addr)
        )));
    }
    Ok(r)
}

/// Blocks for as long as the runtime waits for a command, then fails: as the driver's
/// watchdog does, or, on ROCm 7.0, when its 50 ms `WAIT_CMD` gives up first.
fn hang(q: &QueueObj, mem: MutexGuard<'_, Memory>, why: String) -> SimError {
    drop(mem);
    let wait = q.config.command_wait();
    std::thread::sleep(wait);
    let ms = wait.as_millis();
    if q.config.profile.command_wait_limit() == Some(wait) {
        device_error(format!(
            "WAIT_CMD timed out: {why} (ROCm 7.0 waits {ms} ms for a command; the command is \
             abandoned)"
        ))
    } else {
        device_error(format!(
            "Device isn't making progress: {why} (the command hung until the {ms} ms watchdog)"
        ))
    }
}

/// The bytes of the PDI at `addr`: an emulated PDI's fixed-size header, or the rest of the
/// allocation for any other image (the packet does not carry the PDI's length; an emulated
/// PDI's allocation is page-rounded, so read just the header).
fn pdi_bytes(mem: &Memory, addr: u64, r: &Resolved) -> Vec<u8> {
    let remaining = r.remaining(addr);
    let emulated = mem
        .read(addr, MAGIC.len() as u64)
        .is_some_and(|head| head == MAGIC.as_slice());
    let len = if emulated {
        remaining.min(u64::from(HEADER_LEN))
    } else {
        remaining
    };
    mem.read(addr, len).unwrap_or_default()
}

/// Identifies the PDI at `addr` from its bytes.
fn design_of(addr: u64, bytes: &[u8]) -> Result<EmuDesign, SimError> {
    match identify(bytes) {
        Ok(PdiKind::Emulated(d)) => Ok(d),
        Ok(PdiKind::Partial(_)) => Err(SimError::new(
            Status::AMD_ERROR_NOT_SUPPORTED,
            format!(
                "the PDI at {addr:#x} is a real partial PDI (\"PPDI\"): the emulator cannot run AIE \
                 cores, so real designs need an NPU; use an emulated design (npu-artifacts emu)"
            ),
        )),
        Ok(PdiKind::Xclbin(_)) => Err(SimError::new(
            Status::AMD_ERROR_NOT_SUPPORTED,
            format!(
                "the PDI at {addr:#x} is an xclbin; ROCR loads PDIs, and the emulator runs only \
                 emulated designs"
            ),
        )),
        Err(e) => Err(device_error(format!(
            "device error: the PDI at {addr:#x} is not a loadable image: {e}"
        ))),
    }
}

/// Programs a queue has identified and walked, remembered by their bytes.
///
/// The device reads the PDI and the instruction stream at every dispatch, so the emulator
/// does too; but a PDI and a stream that are byte for byte what an earlier dispatch had need
/// not be identified (a CRC over the PDI) and walked (every TXN op) again. Keyed by content,
/// not address, so a buffer rewritten in place or freed and reused is parsed afresh.
#[derive(Debug, Default)]
pub(crate) struct ParsedPrograms {
    entries: Vec<ParsedProgram>,
}

#[derive(Debug)]
struct ParsedProgram {
    pdi: Vec<u8>,
    insts: Vec<u8>,
    design: EmuDesign,
    txn: TxnProgram,
}

/// Programs remembered per queue (as many as a queue may hold PDIs).
const PARSED_PROGRAMS: usize = MAX_PDIS_PER_QUEUE;

impl ParsedPrograms {
    fn find(&self, pdi: &[u8], insts: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.pdi == pdi && e.insts == insts)
    }

    fn insert(&mut self, e: ParsedProgram) -> usize {
        if self.entries.len() >= PARSED_PROGRAMS {
            self.entries.remove(0);
        }
        self.entries.push(e);
        self.entries.len() - 1
    }
}

/// The runtime's checks of one command, before the driver sees it: the instruction buffer, its
/// size, every argument and the PDI resolve to allocations the runtime knows. Returns the
/// instruction buffer, the bytes each argument may use, and the PDI.
fn runtime_checks(mem: &Memory, cmd: &Command) -> Result<(Resolved, Vec<u64>, Resolved), SimError> {
    // The instruction buffer must resolve to a BO before its size is looked at: a
    // kernel-object packet (words 20/24 a host descriptor, word 40 reserved 0) on a G2 runtime
    // fails as an unknown allocation (`rocr-aie-hsaco.md` §1).
    let insts = kernel_buffer(mem, "instruction buffer", cmd.insts, cmd.insts_size)?;
    if cmd.insts_size == 0 || !cmd.insts_size.is_multiple_of(4) {
        return Err(SimError::new(
            Status::ERROR_INVALID_ARGUMENT,
            format!(
                "insts_size {} is not a non-zero multiple of 4 bytes",
                cmd.insts_size
            ),
        ));
    }
    let avail = arg_room(mem, cmd)?;
    let pdi = mem.resolve(cmd.pdi).ok_or_else(|| {
        invalid_allocation(format!(
            "PDI at {:#x} is not an allocation the runtime knows",
            cmd.pdi
        ))
    })?;
    Ok((insts, avail, pdi))
}

/// Every argument resolves to an allocation the runtime knows; the bytes each may use.
fn arg_room(mem: &Memory, cmd: &Command) -> Result<Vec<u64>, SimError> {
    let mut avail = Vec::with_capacity(cmd.args.len());
    for (i, &(addr, size)) in cmd.args.iter().enumerate() {
        let r = kernel_buffer(mem, format_args!("argument {i}"), addr, size)?;
        // A size of 0 means "the caller synchronises this range": the whole rest is usable.
        avail.push(if size == 0 { r.remaining(addr) } else { size });
    }
    Ok(avail)
}

/// The PDI limit: `pdi` may join a queue holding `pdis` unless it is a 33rd.
fn pdi_slot(pdis: &[u64], pdi: u64) -> Result<(), SimError> {
    if !pdis.contains(&pdi) && pdis.len() >= MAX_PDIS_PER_QUEUE {
        return Err(SimError::new(
            Status::ERROR_OUT_OF_RESOURCES,
            format!(
                "PDI at {pdi:#x} would be the {}th distinct PDI on this queue; a queue holds at \
                 most {MAX_PDIS_PER_QUEUE} (the CU mask has 32 bits)",
                MAX_PDIS_PER_QUEUE + 1
            ),
        ));
    }
    Ok(())
}

/// The runtime's checks of a whole batch, before any of it runs
/// ([`crate::Profile::checks_whole_batch_first`]): each command's buffers resolve, and the
/// batch's new PDIs fit the queue's 32.
///
/// # Errors
/// The first command's failure, with its index in `cmds`.
pub(crate) fn check_batch(
    rt: &Runtime,
    state: &QueueState,
    cmds: &[Command],
) -> Result<(), (usize, SimError)> {
    let mem = rt.memory();
    let mut pdis = state.pdis.clone();
    for (i, cmd) in cmds.iter().enumerate() {
        if cmd.pdi_patch_offset != 0 {
            // A full-ELF command takes no compute-unit slot.
            crate::dispatch::full_elf::check(&mem, cmd).map_err(|e| (i, e))?;
            arg_room(&mem, cmd).map_err(|e| (i, e))?;
            continue;
        }
        runtime_checks(&mem, cmd).map_err(|e| (i, e))?;
        pdi_slot(&pdis, cmd.pdi).map_err(|e| (i, e))?;
        if !pdis.contains(&cmd.pdi) {
            pdis.push(cmd.pdi);
        }
    }
    Ok(())
}

/// Checks `cmd` and runs its kernel.
///
/// # Errors
/// The first rule the packet breaks, with ROCR's status and a sentence naming it.
pub(crate) fn execute(
    rt: &Runtime,
    q: &QueueObj,
    state: &mut QueueState,
    cmd: &Command,
) -> Result<(), SimError> {
    if cmd.pdi_patch_offset != 0 {
        crate::dispatch::full_elf::prepare(rt, cmd)?;
        let avail = arg_room(&rt.memory(), cmd)?;
        return crate::dispatch::full_elf::run(rt, q, cmd, &avail);
    }
    let mem = rt.memory();
    let (insts, avail, pdi) = runtime_checks(&mem, cmd)?;
    // ROCm 7.0's PDI cache and CONFIG_CU are its doorbell's (`dispatch::rocm70`).
    if q.config.profile != crate::Profile::Rocm70 && !state.pdis.contains(&cmd.pdi) {
        pdi_slot(&state.pdis, cmd.pdi)?;
        if pdi.owner != Owner::Pool(PoolKind::DeviceHeap) {
            return Err(device_error(format!(
                "aie2_config_cu: Invalid BO type: PDI at {:#x} is not in the device heap (it is \
                 in {}); allocate PDIs from the pool whose RUNTIME_ALLOC_REC_GRANULE is 0",
                cmd.pdi,
                describe(pdi.owner)
            )));
        }
        state.pdis.push(cmd.pdi);
        // The driver configures a context's compute units once: ROCR rebuilds the queue's
        // context with the new PDI set (`ConfigHwCtx`).
        crate::timing::context();
    }
    if insts.owner != Owner::Pool(PoolKind::DeviceHeap) {
        let dev = DEVICE_HEAP_DEVICE_BASE | (cmd.insts & DEV_ADDR_OFFSET_MASK);
        return Err(device_error(format!(
            "device error: instruction buffer at {:#x} is not in the device heap (it is in {}); \
             the firmware would fetch instructions from device address {dev:#x}",
            cmd.insts,
            describe(insts.owner)
        )));
    }
    if q.config.profile == crate::Profile::Rocm70 {
        // ROCm 7.0 translates the instruction address with a mask one bit short of the 64 MiB
        // heap (rocm70-observed.md item 1): the device fetches from heap offset `offset &
        // 0x02FFFFFF`, so a stream at 16 MiB + x runs whatever lies at x.
        let base = mem.heap_base();
        let seen = base + ((cmd.insts - base) & DEV_ADDR_OFFSET_MASK);
        if seen != cmd.insts {
            let aliased = Command {
                pdi: cmd.pdi,
                insts: seen,
                insts_size: cmd.insts_size,
                args: cmd.args.clone(),
                completion: None,
                pdi_patch_offset: 0,
            };
            return match mem.resolve(seen) {
                Some(r) if r.remaining(seen) >= cmd.insts_size => {
                    run_pdi_insts(q, state, mem, &aliased, &pdi, &avail)
                }
                _ => Err(device_error(format!(
                    "device error: the instruction stream at {:#x} (heap offset {:#x}) was fetched \
                     from device address {:#x}, which no buffer of {} bytes holds",
                    cmd.insts,
                    cmd.insts - base,
                    DEVICE_HEAP_DEVICE_BASE | (seen - base),
                    cmd.insts_size
                ))),
            };
        }
    }
    run_pdi_insts(q, state, mem, cmd, &pdi, &avail)
}

/// The device's part of a PDI + insts command whose runtime checks passed: identify the PDI,
/// walk the instruction stream, check the generation and the buffers, run the kernel.
///
/// # Errors
/// A device error (`ERROR`), a hang, or an argument the design or TXN needs that is missing or
/// too small (`INVALID_ALLOCATION`).
pub(crate) fn run_pdi_insts(
    q: &QueueObj,
    state: &mut QueueState,
    mem: MutexGuard<'_, Memory>,
    cmd: &Command,
    pdi: &Resolved,
    avail: &[u64],
) -> Result<(), SimError> {
    let pdi_bytes = pdi_bytes(&mem, cmd.pdi, pdi);
    let txn_bytes = mem.read(cmd.insts, cmd.insts_size).unwrap_or_default();
    let k = match state.parsed.find(&pdi_bytes, &txn_bytes) {
        Some(k) => k,
        None => {
            let design = design_of(cmd.pdi, &pdi_bytes)?;
            let txn = TxnProgram::parse(&txn_bytes).map_err(|e| {
                device_error(format!(
                    "device error: the instruction sequence is malformed: {e}"
                ))
            })?;
            state.parsed.insert(ParsedProgram {
                pdi: pdi_bytes,
                insts: txn_bytes,
                design,
                txn,
            })
        }
    };
    let ParsedProgram { design, txn, .. } = &state.parsed.entries[k];
    let npu = q.config.agent;
    if txn.generation != npu {
        let why = format!(
            "insts.bin was built for {:?} (devGen {}) but the agent is {} ({npu:?}, devGen {})",
            txn.generation,
            txn.generation.txn_dev_gen(),
            npu.agent_name(),
            npu.txn_dev_gen()
        );
        return Err(hang(q, mem, why));
    }
    txn.check_buffers(avail)
        .map_err(|e| invalid_allocation(format!("{e}")))?;
    let design = design.clone();
    run_design(q, mem, &design, &cmd.args, avail)
}

/// Identifies the emulated design in a PDI's bytes.
///
/// # Errors
/// `NOT_SUPPORTED` for real PDIs and xclbins, `ERROR` for bytes no loader takes.
pub(crate) fn design_in(mem: &Memory, addr: u64) -> Result<EmuDesign, SimError> {
    let r = mem.resolve(addr).ok_or_else(|| {
        device_error(format!(
            "device error: no PDI at {addr:#x} (the control code's PDI address is not in the \
             device heap)"
        ))
    })?;
    design_of(addr, &pdi_bytes(mem, addr, &r))
}

/// Runs an emulated design on the packet's arguments: `args` are (address, declared size),
/// `avail` the bytes usable at each.
///
/// # Errors
/// `INVALID_ALLOCATION` for missing or short buffers; the `fault` and `hang` designs' errors;
/// a kernel's own failure as a device error.
pub(crate) fn run_design(
    q: &QueueObj,
    mem: MutexGuard<'_, Memory>,
    design: &EmuDesign,
    args: &[(u64, u64)],
    avail: &[u64],
) -> Result<(), SimError> {
    let need = design.arg_sizes();
    if avail.len() < need.len() {
        return Err(invalid_allocation(format!(
            "the {} design takes {} buffers but the packet has {}",
            design.kernel.name(),
            need.len(),
            avail.len()
        )));
    }
    if let Some((i, (&have, &want))) = avail
        .iter()
        .zip(&need)
        .enumerate()
        .find(|(_, (h, w))| h < w)
    {
        return Err(invalid_allocation(format!(
            "argument {i} has {have} bytes but the {} design needs {want}",
            design.kernel.name()
        )));
    }
    match design.kernel {
        EmuKernel::Fault => {
            return Err(device_error(
                "device error: the fault design failed on the device (command state ERROR)".into(),
            ));
        }
        EmuKernel::Hang => {
            return Err(hang(q, mem, "the hang design never completes".into()));
        }
        _ => {}
    }
    let (ins, out) = kernels::io(design.kernel);
    // An address the packet (or a full ELF's patched control code) names outside every buffer
    // object is a DMA the NPU's IOMMU refuses: a device error, never an empty input.
    let inputs: Vec<Vec<u8>> = ins
        .iter()
        .map(|&i| {
            mem.read(args[i].0, need[i]).ok_or_else(|| {
                device_error(format!(
                    "device error: argument {i} reads {} bytes at {:#x}, outside every buffer \
                     object (an IOMMU fault on the NPU)",
                    need[i], args[i].0
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let result =
        kernels::run(design, &inputs).map_err(|e| device_error(format!("device error: {e}")))?;
    if let (Some(bytes), Some(o)) = (result, out) {
        mem.write(args[o].0, &bytes).ok_or_else(|| {
            invalid_allocation(format!("argument {o} is too small for the kernel's output"))
        })?;
    }
    Ok(())
}

fn describe(owner: Owner) -> &'static str {
    match owner {
        Owner::Pool(k) => k.describe(),
        Owner::Vmem { .. } => "a vmem mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use npu_artifacts::NpuGen;

    fn parsed(d: &EmuDesign) -> ParsedProgram {
        let insts = d.insts(NpuGen::Npu2);
        ParsedProgram {
            pdi: d.to_pdi(),
            txn: TxnProgram::parse(&insts).unwrap(),
            insts,
            design: d.clone(),
        }
    }

    #[test]
    fn programs_are_remembered_by_their_bytes() {
        let mut cache = ParsedPrograms::default();
        let d = EmuDesign::noop(2, 4096);
        let e = parsed(&d);
        let (pdi, mut insts) = (e.pdi.clone(), e.insts.clone());
        assert_eq!(cache.insert(e), 0);
        assert_eq!(cache.find(&pdi, &insts), Some(0));
        // An instruction stream rewritten in place is a different program.
        let last = insts.len() - 1;
        insts[last] ^= 1;
        assert_eq!(cache.find(&pdi, &insts), None);
    }

    #[test]
    fn the_oldest_program_goes_when_the_cache_is_full() {
        let mut cache = ParsedPrograms::default();
        let first = parsed(&EmuDesign::noop(2, 4096));
        let (pdi, insts) = (first.pdi.clone(), first.insts.clone());
        cache.insert(first);
        for n in 1..=PARSED_PROGRAMS {
            let bytes = 4096 * (u32::try_from(n).unwrap() + 1);
            cache.insert(parsed(&EmuDesign::noop(2, bytes)));
        }
        assert_eq!(cache.entries.len(), PARSED_PROGRAMS);
        assert_eq!(cache.find(&pdi, &insts), None);
    }
}
