//! Decoding one ring slot into a [`Command`], for the profile's packet generation.
//!
//! G2 packets carry their arguments in a kernarg buffer the runtime must know; G1 packets
//! point at a payload in any host memory. G1a (ROCm 7.0) indexes the ring without wrapping,
//! so its packet 64 lies past the ring (`rocr-aie.md` §2, §5.2).

use std::sync::Arc;

use hsa_core::sys::{
    AIE_PACKET_OPCODE_KMQ, AIE_PACKET_TYPE_READY, AIE_QUEUE_SIZE, AMD_PACKET_TYPE_AIE_ERT,
    AMD_PACKET_TYPE_RESERVED200, AieDispatchPacket, AieKernelObjectPacket, DEV_ADDR_OFFSET_MASK,
    DEVICE_HEAP_DEVICE_BASE, ERT_PAYLOAD_DATA_OFFSET, ERT_TXN_OPCODE, ErtPacket, Signal, Status,
    ert_opcode, ert_state,
};

use crate::config::PacketAbi;
use crate::profile::Profile;
use crate::queue::{PACKET_SIZE, QueueObj};
use crate::rules::{self, kernel_buffer};
use crate::runtime::Runtime;
use crate::signal::SignalObj;
use crate::status::SimError;

/// One decoded packet, whatever its generation.
#[derive(Debug)]
pub(crate) struct Command {
    pub pdi: u64,
    pub insts: u64,
    /// Bytes.
    pub insts_size: u64,
    /// (address, declared size in bytes), in argument order.
    pub args: Vec<(u64, u64)>,
    pub completion: Option<Arc<SignalObj>>,
    /// A G2 full-ELF packet's PDI site in its control code (word 56); 0 for PDI + insts, and
    /// on every runtime without G2 full ELF.
    pub pdi_patch_offset: u64,
}

/// The ring slot of packet `index`; `None` when a G1a ring would read past its end.
fn slot(q: &QueueObj, index: u64) -> Option<usize> {
    let size = u64::from(AIE_QUEUE_SIZE);
    let i = match q.config.packet_abi() {
        PacketAbi::G2 | PacketAbi::G1b | PacketAbi::KernelObject => index % size,
        PacketAbi::G1a if index < size => index,
        PacketAbi::G1a => return None,
    };
    let offset = usize::try_from(i).ok()? * PACKET_SIZE;
    debug_assert!(offset + PACKET_SIZE <= q.ring_len());
    Some(q.ring_base() + offset)
}

pub(crate) fn read_g2(q: &QueueObj, index: u64) -> Option<AieDispatchPacket> {
    let at = slot(q, index)?;
    // SAFETY: `at` is a 64-byte-aligned slot inside the queue's live ring mapping (the queue is
    // kept alive by the caller's Arc); the packet type is plain data valid for any bits.
    Some(unsafe { std::ptr::read_volatile(at as *const AieDispatchPacket) })
}

/// Packet `index` read as the kernel-object form (the G2 ring layout).
pub(crate) fn read_kernel_object(q: &QueueObj, index: u64) -> Option<AieKernelObjectPacket> {
    let at = slot(q, index)?;
    // SAFETY: as in `read_g2`.
    Some(unsafe { std::ptr::read_volatile(at as *const AieKernelObjectPacket) })
}

fn read_g1(q: &QueueObj, index: u64) -> Option<ErtPacket> {
    let at = slot(q, index)?;
    // SAFETY: as in `read_g2`.
    Some(unsafe { std::ptr::read_volatile(at as *const ErtPacket) })
}

fn g1a_overrun(index: u64) -> SimError {
    SimError::new(
        Status::ERROR_INVALID_PACKET_FORMAT,
        format!(
            "G1a ring overrun: ROCm 7.0's AIE queue reads packet {index} at base + read index \
             without wrapping, past its {AIE_QUEUE_SIZE}-slot ring; destroy and recreate the \
             queue before it has taken {AIE_QUEUE_SIZE} packets"
        ),
    )
}

fn bad_format(detail: String) -> SimError {
    SimError::new(Status::ERROR_INVALID_PACKET_FORMAT, detail)
}

pub(crate) fn completion(rt: &Runtime, s: Signal) -> Result<Option<Arc<SignalObj>>, SimError> {
    if s.handle == 0 {
        return Ok(None);
    }
    rt.signals()
        .get(&s.handle)
        .cloned()
        .map(Some)
        .ok_or_else(|| {
            SimError::new(
                Status::ERROR_INVALID_SIGNAL,
                format!("completion signal {:#x} is not a live signal", s.handle),
            )
        })
}

pub(crate) fn decode(rt: &Runtime, q: &QueueObj, index: u64) -> Result<Command, SimError> {
    match q.config.packet_abi() {
        PacketAbi::G2 | PacketAbi::KernelObject => decode_g2(rt, q, index),
        PacketAbi::G1a | PacketAbi::G1b => decode_g1(rt, q, index),
    }
}

fn decode_g2(rt: &Runtime, q: &QueueObj, index: u64) -> Result<Command, SimError> {
    let p = read_g2(q, index).ok_or_else(|| g1a_overrun(index))?;
    let checks = q.config.profile.checks_packet_header();
    let ty = p.header & 0xFF;
    if checks && ty != AIE_PACKET_TYPE_READY {
        return Err(bad_format(format!(
            "G2 header type {ty} is not HSA_AMD_AIE_PACKET_TYPE_READY (0) (header {:#06x})",
            p.header
        )));
    }
    if checks && p.opcode != AIE_PACKET_OPCODE_KMQ {
        return Err(bad_format(format!(
            "G2 opcode {} is not HSA_AMD_AIE_PACKET_OPCODE_KMQ (0)",
            p.opcode
        )));
    }
    // The first G2 release reads word 56 as reserved; the later ones take it as the full-ELF
    // PDI site.
    let full_elf = q.config.profile.g2_full_elf();
    let pdi_patch_offset = if full_elf { p.reserved4 } else { 0 };
    let n = usize::from(p.num_kernargs);
    let mut args = Vec::with_capacity(n);
    if n > 0 {
        if p.kernarg_address == 0 {
            if q.config.profile.loads_code_objects() {
                // ROCR's driver resolves the PDI and the instruction stream (or control code)
                // before the kernargs (`BuildPdiInstsCommand`, `AddKernargBOs`). Under the
                // runtime with the AIE loader this order is what tells a kernel-object packet
                // (no PDI) from one this runtime reads, as hsa-core's `auto` asks it to.
                let mem = rt.memory();
                kernel_buffer(&mem, "PDI", p.pdi_addr, 0)?;
                kernel_buffer(&mem, "instruction buffer", p.insts_addr(), 0)?;
                return Err(bad_format(format!(
                    "num_kernargs is {n} but kernarg_address is NULL"
                )));
            }
            return Err(SimError::new(
                Status::ERROR_INVALID_ARGUMENT,
                format!("num_kernargs is {n} but kernarg_address is NULL"),
            ));
        }
        let words = {
            let mem = rt.memory();
            rules::kernel_buffer(&mem, "kernarg buffer", p.kernarg_address, 16 * n as u64)?;
            mem.read(p.kernarg_address, 16 * n as u64)
                .unwrap_or_default()
        };
        let word = |i: usize| {
            let b = words
                .get(i * 8..i * 8 + 8)
                .and_then(|w| <[u8; 8]>::try_from(w).ok());
            u64::from_le_bytes(b.unwrap_or_default())
        };
        for i in 0..n {
            args.push((word(i), word(n + i)));
        }
    }
    Ok(Command {
        pdi: p.pdi_addr,
        insts: p.insts_addr(),
        insts_size: p.insts_size,
        args,
        completion: completion(rt, p.completion_signal)?,
        pdi_patch_offset,
    })
}

/// The `count` field of a G1 packet that would join the chain, or `None` where the chain stops.
pub(crate) fn g1_count(q: &QueueObj, index: u64) -> Option<u32> {
    let p = read_g1(q, index)?;
    let bits = p.bits();
    (bits.opcode == ert_opcode::START_CU).then_some(bits.count)
}

fn decode_g1(rt: &Runtime, q: &QueueObj, index: u64) -> Result<Command, SimError> {
    let p = read_g1(q, index).ok_or_else(|| g1a_overrun(index))?;
    let (format, abi) = match q.config.packet_abi() {
        PacketAbi::G1a => (AMD_PACKET_TYPE_AIE_ERT, "G1a"),
        _ => (AMD_PACKET_TYPE_RESERVED200, "G1b"),
    };
    // ROCm 7.0 only `assert`s the header, the AmdFormat and the ERT state, and release builds
    // compile that out: a G2 packet is read as G1a (rocm70-observed.md, "npud itself").
    let rocm70 = q.config.profile == Profile::Rocm70;
    if q.config.profile.checks_packet_header() && p.header != 0 {
        return Err(bad_format(format!(
            "{abi} header is {:#06x}; the vendor-specific header must be exactly 0",
            p.header
        )));
    }
    if !rocm70 && p.amd_format != format {
        return Err(bad_format(format!(
            "{abi} AmdFormat is {}; expected {format}",
            p.amd_format
        )));
    }
    let bits = p.bits();
    if bits.opcode != ert_opcode::START_CU {
        if rocm70 {
            hang_forever(index, bits.opcode);
        }
        return Err(bad_format(format!(
            "{abi} ERT opcode {} is not START_CU (0); real ROCR would loop forever in the \
             doorbell on this packet",
            bits.opcode
        )));
    }
    if !rocm70 && bits.state != ert_state::NEW {
        return Err(bad_format(format!(
            "{abi} ERT state {} is not NEW (1)",
            bits.state
        )));
    }
    let count = bits.count as usize;
    let len = (ERT_PAYLOAD_DATA_OFFSET + 4 * count) as u64;
    if p.payload_data == 0 {
        let e = bad_format(format!("{abi} payload_data is NULL"));
        if rocm70 {
            // ROCm 7.0 dereferences the payload without a check: SIGSEGV in the doorbell.
            crate::dispatch::abort_process(
                q.config.profile,
                &e,
                "ROCm 7.0 dereferences the NULL payload in its submit path and the process dies",
            );
        }
        return Err(e);
    }
    if count < 5 || !(count - 5).is_multiple_of(3) {
        return Err(bad_format(format!(
            "{abi} ERT count {count} is not 5 + 3N for a whole number of arguments N"
        )));
    }
    let n = (count - 5) / 3;
    let payload = match read_payload(rt, p.payload_data, len) {
        Err(e) if rocm70 && e.status == Status::ERROR_INVALID_PACKET_FORMAT => {
            crate::dispatch::abort_process(
                q.config.profile,
                &e,
                "ROCm 7.0 dereferences the payload in its submit path and the process dies",
            )
        }
        r => r?,
    };
    let dw = |i: usize| {
        let at = ERT_PAYLOAD_DATA_OFFSET + 4 * i;
        let b = payload
            .get(at..at + 4)
            .and_then(|w| <[u8; 4]>::try_from(w).ok());
        u32::from_le_bytes(b.unwrap_or_default())
    };
    if dw(0) != ERT_TXN_OPCODE || dw(1) != 0 {
        return Err(bad_format(format!(
            "{abi} payload data[0..2] is [{}, {}]; expected the transaction opcode [3, 0]",
            dw(0),
            dw(1)
        )));
    }
    let pdi = payload.get(..8).and_then(|w| <[u8; 8]>::try_from(w).ok());
    let pdi = u64::from_le_bytes(pdi.unwrap_or_default());
    let insts = u64::from(dw(2)) | (u64::from(dw(3)) << 32);
    let insts_size = u64::from(dw(4)) * 4;
    let args = (0..n)
        .map(|i| {
            let addr = u64::from(dw(5 + 2 * i)) | (u64::from(dw(6 + 2 * i)) << 32);
            (addr, u64::from(dw(5 + 2 * n + i)))
        })
        .collect();
    let completion = match q.config.packet_abi() {
        PacketAbi::G1b => completion(rt, p.completion_signal)?,
        _ => None,
    };
    Ok(Command {
        pdi,
        insts,
        insts_size,
        args,
        completion,
        pdi_patch_offset: 0,
    })
}

/// ROCm 7.0 writes the instruction address's device translation, `0x04000000 | (low word &
/// 0x02FFFFFF)`, over the low word in the caller's payload of packet `index` (in `PrepareBOs`,
/// once the instruction buffer and every operand were found to be driver buffers) (its high word stays the host
/// address's; rocm70-observed.md item 2). Submitting the same payload again names an address
/// no allocation holds, and the packet is silently dropped. The emulator writes payloads in
/// registered memory (where hsa-core and the tests put them); a payload in other host memory
/// is left as it was (inferred to be rare: ROCR's own clients allocate it from a pool).
pub(crate) fn translate_in_place(rt: &Runtime, q: &QueueObj, index: u64) {
    let Some(p) = read_g1(q, index) else { return };
    let payload = p.payload_data;
    let Some(low) = rt
        .memory()
        .read(payload + (ERT_PAYLOAD_DATA_OFFSET + 8) as u64, 4)
        .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
    else {
        tracing::debug!("hsa-sim: the payload at {payload:#x} is not registered memory");
        return;
    };
    let insts_low = u32::from_le_bytes(low);
    let device = DEVICE_HEAP_DEVICE_BASE | (u64::from(insts_low) & DEV_ADDR_OFFSET_MASK);
    // Both constants lie below 2^32, so the device address is one 32-bit word.
    let device = u32::try_from(device).unwrap_or(u32::MAX);
    let at = payload + (ERT_PAYLOAD_DATA_OFFSET + 8) as u64;
    let mem = rt.memory();
    if mem.write(at, &device.to_le_bytes()).is_none() {
        tracing::debug!("hsa-sim: the payload at {payload:#x} is not registered memory");
    }
}

/// ROCm 7.0 loops forever in the doorbell on an ERT opcode other than START_CU
/// (rocm70-observed.md item 6): the ringing thread never returns.
fn hang_forever(index: u64, opcode: u32) -> ! {
    tracing::error!(
        "hsa-sim (rocm-7.0): packet {index} has ERT opcode {opcode}, not START_CU; ROCm 7.0 \
         loops forever in the doorbell, and so does this thread"
    );
    loop {
        std::thread::park();
    }
}

/// Reads a G1 payload. Payloads inside registered memory are bounds-checked; the G1 ABI lets
/// a payload live in any host memory, so other addresses are read through
/// `process_vm_readv`, which fails on an unmapped address where ROCR would fault (and where
/// that call is not allowed, read directly, as ROCR does).
fn read_payload(rt: &Runtime, addr: u64, len: u64) -> Result<Vec<u8>, SimError> {
    let mem = rt.memory();
    if let Some(r) = mem.resolve(addr) {
        return mem.read(addr, len).ok_or_else(|| {
            SimError::new(
                Status::ERROR_INVALID_ALLOCATION,
                format!(
                    "payload at {addr:#x} needs {len} bytes but its allocation has {} left",
                    r.remaining(addr)
                ),
            )
        });
    }
    let n = usize::try_from(len).unwrap_or(0);
    match crate::memory::read_process_memory(addr, n) {
        Ok(v) => Ok(v),
        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => Err(bad_format(format!(
            "payload_data {addr:#x} does not point at {len} readable bytes (real ROCR would \
             fault reading it)"
        ))),
        Err(e) => {
            tracing::debug!(
                "hsa-sim: process_vm_readv unavailable ({e}); reading the payload directly"
            );
            let mut v = vec![0u8; n];
            // SAFETY: the G1 packet ABI makes `payload_data` a host pointer to `8 + 4·count`
            // readable bytes, which the client guarantees as it does for ROCR (which reads it
            // the same way). The copy creates no reference to that memory.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    crate::memory::addr_to_usize(addr) as *const u8,
                    v.as_mut_ptr(),
                    n,
                )
            };
            Ok(v)
        }
    }
}
