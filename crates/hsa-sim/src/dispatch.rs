//! The doorbell: decoding packets of the configured generation and running them as one chain.
//!
//! A store to a queue's doorbell signal runs, before it returns, every packet from the read
//! index up to the write index (the value stored is ignored), as ROCR's
//! `AieAqlQueue::SubmitPackets` does. For each packet in order: decode it, check the rules
//! ([`crate::rules`]), run its kernel, advance the read index past it and decrement its
//! completion signal by 1 (G2 and G1b; handle 0 means none; G1a has none).
//!
//! **On the first failing packet** nothing more runs: the packets before it are retired
//! (read index past them, signals decremented), the read index stays at the failing packet,
//! the queue is suspended (later doorbells do nothing) and, after the batch, the queue's error
//! callback is called with the status from the ringing thread, as the newest ROCR does. The
//! detail goes to [`crate::last_error`] and the log. Recreate the queue to go on.
//!
//! Chains: G2 splits a batch itself to fit the driver's 4 KiB chain buffer, so any batch of up
//! to 64 packets runs. G1a and G1b do not: the batch's run of START_CU packets must fit 4 KiB,
//! each command costing a 52-byte slot header plus `4·(1 + count)` bytes (CU mask and the
//! `5 + 3N` payload dwords), which reproduces IRON's measurement of 40 commands with N = 2
//! (and 41 failing). A batch that does not fit fails at its first packet and nothing runs.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hsa_core::sys::{
    AIE_PACKET_OPCODE_KMQ, AIE_PACKET_TYPE_READY, AIE_QUEUE_SIZE, AMD_PACKET_TYPE_AIE_ERT,
    AMD_PACKET_TYPE_RESERVED200, AieDispatchPacket, ERT_PAYLOAD_DATA_OFFSET, ERT_TXN_OPCODE,
    ErtPacket, Signal, Status, ert_opcode, ert_state,
};

use crate::config::PacketAbi;
use crate::counters::{Counter, bump};
use crate::queue::{PACKET_SIZE, QueueObj};
use crate::rules;
use crate::runtime::{Runtime, runtime};
use crate::signal::{SignalObj, complete};
use crate::status::{SimError, record};

/// The driver's command chain buffer (`MAX_CHAIN_CMDBUF_SIZE`).
pub const CHAIN_BUFFER_BYTES: u64 = 4096;
/// Bytes of a `cmd_chain_slot_npu` header.
pub const CHAIN_SLOT_HEADER_BYTES: u64 = 52;

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
}

/// Rings `q`'s doorbell: runs its pending packets, then reports a failure.
pub(crate) fn ring(q: &Arc<QueueObj>) {
    let Ok(rt) = runtime() else { return };
    let failure = {
        let mut state = q.state();
        if q.suspended.load(Ordering::Acquire) {
            tracing::debug!("hsa-sim: doorbell on a suspended queue ignored");
            return;
        }
        run_batch(&rt, q, &mut state).err()
    };
    if let Some(e) = failure {
        record(&e);
        q.suspended.store(true, Ordering::Release);
        bump(Counter::PacketsFailed);
        q.notify_error(&e);
    }
}

fn run_batch(
    rt: &Runtime,
    q: &QueueObj,
    state: &mut crate::queue::QueueState,
) -> Result<(), SimError> {
    let rd = q.read.load(Ordering::Acquire);
    let wr = q.write.load(Ordering::Acquire);
    if wr <= rd {
        return Ok(());
    }
    bump(Counter::Doorbells);
    if wr - rd > u64::from(AIE_QUEUE_SIZE) {
        return Err(SimError::new(
            Status::ERROR_INVALID_ARGUMENT,
            format!(
                "doorbell: write index {wr} is {} packets ahead of read index {rd}; the \
                 {AIE_QUEUE_SIZE}-slot ring overflowed (wait for the read index before reusing a slot)",
                wr - rd
            ),
        ));
    }
    if q.config.packet_abi != PacketAbi::G2 {
        check_g1_chain(q, rd, wr)?;
    }
    for index in rd..wr {
        let cmd = decode(rt, q, index)
            .map_err(|e| SimError::new(e.status, format!("packet {index}: {}", e.detail)))?;
        rules::execute(rt, q, state, &cmd)
            .map_err(|e| SimError::new(e.status, format!("packet {index}: {}", e.detail)))?;
        q.read.store(index + 1, Ordering::Release);
        if let Some(sig) = &cmd.completion {
            complete(sig);
        }
        bump(Counter::PacketsCompleted);
    }
    Ok(())
}

/// The ring slot of packet `index`; `None` when a G1a ring would read past its end.
fn slot(q: &QueueObj, index: u64) -> Option<usize> {
    let size = u64::from(AIE_QUEUE_SIZE);
    let i = match q.config.packet_abi {
        PacketAbi::G2 | PacketAbi::G1b => index % size,
        PacketAbi::G1a if index < size => index,
        PacketAbi::G1a => return None,
    };
    let offset = usize::try_from(i).ok()? * PACKET_SIZE;
    debug_assert!(offset + PACKET_SIZE <= q.ring_len());
    Some(q.ring_base() + offset)
}

fn read_g2(q: &QueueObj, index: u64) -> Option<AieDispatchPacket> {
    let at = slot(q, index)?;
    // SAFETY: `at` is a 64-byte-aligned slot inside the queue's live ring mapping (the queue is
    // kept alive by the caller's Arc); the packet type is plain data valid for any bits.
    Some(unsafe { std::ptr::read_volatile(at as *const AieDispatchPacket) })
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

fn completion(rt: &Runtime, s: Signal) -> Result<Option<Arc<SignalObj>>, SimError> {
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

fn decode(rt: &Runtime, q: &QueueObj, index: u64) -> Result<Command, SimError> {
    match q.config.packet_abi {
        PacketAbi::G2 => decode_g2(rt, q, index),
        PacketAbi::G1a | PacketAbi::G1b => decode_g1(rt, q, index),
    }
}

fn decode_g2(rt: &Runtime, q: &QueueObj, index: u64) -> Result<Command, SimError> {
    let p = read_g2(q, index).ok_or_else(|| g1a_overrun(index))?;
    let ty = p.header & 0xFF;
    if ty != AIE_PACKET_TYPE_READY {
        return Err(bad_format(format!(
            "G2 header type {ty} is not HSA_AMD_AIE_PACKET_TYPE_READY (0) (header {:#06x})",
            p.header
        )));
    }
    if p.opcode != AIE_PACKET_OPCODE_KMQ {
        return Err(bad_format(format!(
            "G2 opcode {} is not HSA_AMD_AIE_PACKET_OPCODE_KMQ (0)",
            p.opcode
        )));
    }
    if p.reserved4 != 0 {
        return Err(SimError::new(
            Status::AMD_ERROR_NOT_SUPPORTED,
            format!(
                "pdi_patch_offset {:#x} selects full-ELF mode, which the emulator does not support \
                 (write 0 for PDI + insts)",
                p.reserved4
            ),
        ));
    }
    let n = usize::from(p.num_kernargs);
    let mut args = Vec::with_capacity(n);
    if n > 0 {
        if p.kernarg_address == 0 {
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
    })
}

/// The `count` field of a G1 packet that would join the chain, or `None` where the chain stops.
fn g1_count(q: &QueueObj, index: u64) -> Option<u32> {
    let p = read_g1(q, index)?;
    let bits = p.bits();
    (bits.opcode == ert_opcode::START_CU).then_some(bits.count)
}

fn check_g1_chain(q: &QueueObj, rd: u64, wr: u64) -> Result<(), SimError> {
    let mut bytes = 0u64;
    let mut commands = 0u64;
    for index in rd..wr {
        let Some(count) = g1_count(q, index) else {
            break;
        };
        bytes += CHAIN_SLOT_HEADER_BYTES + 4 * (1 + u64::from(count));
        commands += 1;
    }
    if bytes > CHAIN_BUFFER_BYTES {
        return Err(SimError::new(
            Status::ERROR,
            format!(
                "packet {rd}: command chain of {commands} commands needs {bytes} bytes; the \
                 driver's chain buffer (MAX_CHAIN_CMDBUF_SIZE) holds {CHAIN_BUFFER_BYTES}, and \
                 G1 runtimes do not split chains: ring the doorbell at least every 32 packets"
            ),
        ));
    }
    Ok(())
}

fn decode_g1(rt: &Runtime, q: &QueueObj, index: u64) -> Result<Command, SimError> {
    let p = read_g1(q, index).ok_or_else(|| g1a_overrun(index))?;
    let (format, abi) = match q.config.packet_abi {
        PacketAbi::G1a => (AMD_PACKET_TYPE_AIE_ERT, "G1a"),
        _ => (AMD_PACKET_TYPE_RESERVED200, "G1b"),
    };
    if p.header != 0 {
        return Err(bad_format(format!(
            "{abi} header is {:#06x}; the vendor-specific header must be exactly 0",
            p.header
        )));
    }
    if p.amd_format != format {
        return Err(bad_format(format!(
            "{abi} AmdFormat is {}; expected {format}",
            p.amd_format
        )));
    }
    let bits = p.bits();
    if bits.opcode != ert_opcode::START_CU {
        return Err(bad_format(format!(
            "{abi} ERT opcode {} is not START_CU (0); real ROCR would loop forever in the \
             doorbell on this packet",
            bits.opcode
        )));
    }
    if bits.state != ert_state::NEW {
        return Err(bad_format(format!(
            "{abi} ERT state {} is not NEW (1)",
            bits.state
        )));
    }
    let count = bits.count as usize;
    if count < 5 || !(count - 5).is_multiple_of(3) {
        return Err(bad_format(format!(
            "{abi} ERT count {count} is not 5 + 3N for a whole number of arguments N"
        )));
    }
    let n = (count - 5) / 3;
    if p.payload_data == 0 {
        return Err(bad_format(format!("{abi} payload_data is NULL")));
    }
    let len = (ERT_PAYLOAD_DATA_OFFSET + 4 * count) as u64;
    let payload = read_payload(rt, p.payload_data, len)?;
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
    let completion = match q.config.packet_abi {
        PacketAbi::G1b => completion(rt, p.completion_signal)?,
        _ => None,
    };
    Ok(Command {
        pdi,
        insts,
        insts_size,
        args,
        completion,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g1_chain_cost_fits_40_commands_of_two_arguments_but_not_41() {
        let count = hsa_core::sys::ert_payload_count(2) as u64;
        let per = CHAIN_SLOT_HEADER_BYTES + 4 * (1 + count);
        assert!(40 * per <= CHAIN_BUFFER_BYTES);
        assert!(41 * per > CHAIN_BUFFER_BYTES);
    }
}
