//! The doorbell: running a queue's pending packets as command chains, and reporting a failed
//! batch the way the profile's ROCR does.
//!
//! A store to a queue's doorbell signal runs, before it returns, every packet from the read
//! index up to the write index (the value stored is ignored), as ROCR's
//! `AieAqlQueue::SubmitPackets` does. For each packet in order: decode it ([`decode`]), check
//! the rules ([`crate::rules`]), run its kernel, advance the read index past it and decrement
//! its completion signal by 1 (G2 and G1b; handle 0 means none; G1a has none).
//!
//! **Chains** ([`crate::Profile::chain_policy`], `rocr-aie.md` §5.2, `rocr-aie-hsaco.md` §4).
//! The newest ROCR splits a batch itself to fit the driver's 4 KiB chain buffer, so any batch
//! of up to 64 packets runs. The older releases do not: G1 puts the batch's run of START_CU
//! packets in one chain at `52 + 4·(6+3N)` bytes a command (IRON's measured 40 commands of two
//! arguments, 41 failing), the first G2 release every packet of the batch at `52 + 4·(8+2N)`.
//! A batch that does not fit fails at its first packet and nothing runs.
//!
//! **On the first failing packet** nothing more runs; the packets before it are retired (read
//! index past them, signals decremented). Where the runtime checks the whole batch before it
//! submits any ([`crate::Profile::checks_whole_batch_first`]: the newest), a packet it refuses
//! (decoding, an unknown buffer, a 33rd PDI) fails the batch with nothing retired; device
//! failures still retire what ran before them. Then, per [`crate::profile::FailureReport`]
//! (`rocr-aie.md` §5.6):
//! - silent (ROCm 7.0): the read index moves to the write index as if the batch had run; no
//!   callback, no suspension. The status and detail go to [`crate::last_error`] and the log.
//! - abort (late 2025, first G2): one line naming the profile, the status and the detail on
//!   stderr, then `abort()`.
//! - callback (newest): the read index stays at the failing packet, the queue is suspended
//!   (later doorbells do nothing) and, after the batch, the queue's error callback is called
//!   with the status from the ringing thread; with no callback, print and `abort()` as ROCR's
//!   default handler does. Recreate the queue to go on.
//!
//! In every case `PacketsFailed` counts the failure. `Doorbells` counts the rings that found
//! work and `ChainSubmissions` the command chains started, so a test can tell how a batch was
//! split.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hsa_core::sys::{AIE_QUEUE_SIZE, Status};

use crate::counters::{Counter, bump};
use crate::profile::{
    CHAIN_BUFFER_BYTES, CHAIN_SLOT_HEADER_BYTES, ChainPolicy, FailureReport, Profile,
};
use crate::queue::{QueueObj, QueueState};
use crate::rules;
use crate::runtime::{Runtime, runtime};
use crate::signal::complete;
use crate::status::{SimError, record, status_label};

pub(crate) mod decode;
pub(crate) mod full_elf;
pub(crate) mod kernel_object;
pub(crate) mod rocm70;

pub(crate) use decode::Command;

/// A batch that failed, and the write index it was rung with.
#[derive(Debug)]
struct BatchFailure {
    error: SimError,
    write_index: u64,
}

/// Rings `q`'s doorbell: runs its pending packets, then reports a failure.
pub(crate) fn ring(q: &Arc<QueueObj>) {
    let Ok(rt) = runtime() else { return };
    let profile = q.config.profile;
    // Slept (with the timing model on) when the doorbell returns, after the queue's lock.
    let _device = crate::timing::Doorbell::ring(q.config.timing, q.config.agent);
    let failure = {
        let mut state = q.state();
        if q.suspended.load(Ordering::Acquire) {
            tracing::debug!("hsa-sim: doorbell on a suspended queue ignored");
            return;
        }
        run_batch(&rt, q, &mut state).err().inspect(|f| {
            if profile.failure_report() == FailureReport::Silent {
                // ROCm 7.0 stores the new read index whatever happened, under the same
                // doorbell serialisation as a successful batch.
                q.read.store(f.write_index, Ordering::Release);
            }
        })
    };
    let Some(BatchFailure { error, write_index }) = failure else {
        return;
    };
    record(&error);
    bump(Counter::PacketsFailed);
    match profile.failure_report() {
        FailureReport::Silent => tracing::warn!(
            profile = %profile,
            status = ?error.status,
            "hsa-sim: the batch failed silently (ROCm 7.0 only asserts); read index moved to \
             {write_index} as if it had run"
        ),
        FailureReport::Abort => abort_process(
            profile,
            &error,
            "ROCR throws hsa_exception in the doorbell, and its C entry point aborts",
        ),
        FailureReport::Callback => {
            q.suspended.store(true, Ordering::Release);
            q.notify_error(&error);
        }
    }
}

/// Prints one line naming the profile, the status and the detail to stderr, then aborts the
/// process, as ROCR does where it throws from a C entry point or has no queue callback.
pub(crate) fn abort_process(profile: Profile, error: &SimError, why: &str) -> ! {
    eprintln!(
        "hsa-sim (profile {profile}): doorbell batch failed with {}: {}; {why}",
        status_label(error.status),
        error.detail
    );
    std::process::abort()
}

fn run_batch(rt: &Runtime, q: &QueueObj, state: &mut QueueState) -> Result<(), BatchFailure> {
    let rd = q.read.load(Ordering::Acquire);
    let wr = q.write.load(Ordering::Acquire);
    if wr <= rd {
        return Ok(());
    }
    let fail = |error| BatchFailure {
        error,
        write_index: wr,
    };
    bump(Counter::Doorbells);
    if wr - rd > u64::from(AIE_QUEUE_SIZE) {
        return Err(fail(SimError::new(
            Status::ERROR_INVALID_ARGUMENT,
            format!(
                "doorbell: write index {wr} is {} packets ahead of read index {rd}; the \
                 {AIE_QUEUE_SIZE}-slot ring overflowed (wait for the read index before reusing a slot)",
                wr - rd
            ),
        )));
    }
    if q.config.profile.speaks_kernel_objects() {
        return kernel_object::run_batch(rt, q, state, rd, wr).map_err(fail);
    }
    let chains = plan_chains(q, rd, wr).map_err(fail)?;
    if q.config.profile.g2_full_elf() {
        batch_mode(rt, q, state, rd, wr).map_err(fail)?;
    }
    if q.config.profile == Profile::Rocm70 {
        return rocm70::doorbell(rt, q, state, rd, wr).map_err(fail);
    }
    let at = |index: u64| {
        move |e: SimError| {
            fail(SimError::new(
                e.status,
                format!("packet {index}: {}", e.detail),
            ))
        }
    };
    // The newest runtime builds the whole batch before it submits any of it: a packet it
    // refuses fails the batch with nothing retired.
    let mut checked = Vec::new();
    if q.config.profile.checks_whole_batch_first() {
        for index in rd..wr {
            checked.push(decode::decode(rt, q, index).map_err(at(index))?);
        }
        rules::check_batch(rt, state, &checked).map_err(|(i, e)| at(rd + i as u64)(e))?;
    }
    let mut checked = checked.into_iter();
    let mut chains = chains.into_iter();
    let mut next_chain = rd;
    for index in rd..wr {
        if index == next_chain {
            bump(Counter::ChainSubmissions);
            crate::timing::chain();
            next_chain += chains.next().unwrap_or(wr - index);
        }
        let cmd = match checked.next() {
            Some(cmd) => cmd,
            None => decode::decode(rt, q, index).map_err(at(index))?,
        };
        rules::execute(rt, q, state, &cmd).map_err(at(index))?;
        q.read.store(index + 1, Ordering::Release);
        if let Some(sig) = &cmd.completion {
            complete(sig);
        }
        bump(Counter::PacketsCompleted);
        crate::timing::command();
    }
    Ok(())
}

/// The mode of a G2 batch on a runtime with full ELF, checked before anything runs: the first
/// packet's `pdi_patch_offset` fixes it, a packet of the other mode refuses the whole batch, a
/// full-ELF batch needs an aie2p agent, and entering full-ELF mode drops the queue's PDI cache
/// (its hardware context is rebuilt without compute units). The queue is not pinned: a later
/// batch may switch back, rebuilding the context again.
fn batch_mode(
    rt: &Runtime,
    q: &QueueObj,
    state: &mut QueueState,
    rd: u64,
    wr: u64,
) -> Result<(), SimError> {
    let full = |index| decode::read_g2(q, index).map(|p| p.reserved4 != 0);
    let Some(first) = full(rd) else {
        return Ok(());
    };
    for index in rd + 1..wr {
        if full(index) != Some(first) {
            return Err(SimError::new(
                Status::ERROR_INVALID_PACKET_FORMAT,
                format!(
                    "packet {index}: a batch cannot mix full-ELF and PDI + insts packets (packet \
                     {rd} is {}); ring the doorbell between the two modes",
                    if first { "full-ELF" } else { "PDI + insts" }
                ),
            ));
        }
    }
    if first && rt.config.agent != npu_artifacts::NpuGen::Npu2 {
        return Err(SimError::new(
            Status::ERROR_INVALID_PACKET_FORMAT,
            format!(
                "packet {rd}: full-ELF dispatch needs an aie2p (Strix) agent; this one is {}",
                rt.config.agent.agent_name()
            ),
        ));
    }
    if state.g2_full_elf != Some(first) {
        if state.g2_full_elf.is_some() {
            bump(Counter::HwContextModeSwitches);
        }
        if first {
            state.pdis.clear();
        }
        state.g2_full_elf = Some(first);
    }
    Ok(())
}

/// The bytes each packet from `rd` would take as a command in a chain, in order, until a
/// packet that cannot join one (a G1 packet whose opcode is not START_CU ends G1's chain;
/// what it is fails when it is decoded).
fn command_costs(q: &QueueObj, policy: ChainPolicy, rd: u64, wr: u64) -> Vec<u64> {
    let mut costs = Vec::new();
    for index in rd..wr {
        let cost = match policy {
            ChainPolicy::G1Unsplit => {
                let Some(count) = decode::g1_count(q, index) else {
                    break;
                };
                // The slot's CU mask and the `count` payload dwords.
                CHAIN_SLOT_HEADER_BYTES + 4 * (1 + u64::from(count))
            }
            ChainPolicy::G2Unsplit | ChainPolicy::G2Split => {
                let Some(p) = decode::read_g2(q, index) else {
                    break;
                };
                if q.config.profile.g2_full_elf() && p.reserved4 != 0 {
                    full_elf::COMMAND_BYTES
                } else {
                    policy.command_bytes(u64::from(p.num_kernargs))
                }
            }
        };
        costs.push(cost);
    }
    costs
}

/// How many packets each command chain of the batch `[rd, wr)` takes, or the failure of a
/// release that does not split a chain too long for the driver's buffer.
fn plan_chains(q: &QueueObj, rd: u64, wr: u64) -> Result<Vec<u64>, SimError> {
    let policy = q.config.profile.chain_policy();
    let costs = command_costs(q, policy, rd, wr);
    if policy == ChainPolicy::G2Split {
        let mut chains = Vec::new();
        let (mut len, mut bytes) = (0u64, 0u64);
        for c in costs {
            if len > 0 && bytes + c > CHAIN_BUFFER_BYTES {
                chains.push(len);
                (len, bytes) = (0, 0);
            }
            len += 1;
            bytes += c;
        }
        if len > 0 {
            chains.push(len);
        }
        return Ok(chains);
    }
    let bytes: u64 = costs.iter().sum();
    let commands = costs.len() as u64;
    if bytes > CHAIN_BUFFER_BYTES {
        let fit = costs
            .iter()
            .scan(0u64, |sum, c| {
                *sum += c;
                Some(*sum)
            })
            .take_while(|&sum| sum <= CHAIN_BUFFER_BYTES)
            .count();
        let what = match policy {
            ChainPolicy::G1Unsplit => "G1 runtimes",
            _ => "the first G2 runtimes",
        };
        return Err(SimError::new(
            Status::ERROR,
            format!(
                "packet {rd}: command chain of {commands} commands needs {bytes} bytes; the \
                 driver's chain buffer (MAX_CHAIN_CMDBUF_SIZE) holds {CHAIN_BUFFER_BYTES}, and \
                 {what} do not split chains ({}): only the first {fit} fit, so ring the doorbell \
                 sooner",
                q.config.profile
            ),
        ));
    }
    Ok(vec![commands])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g1_chain_cost_fits_40_commands_of_two_arguments_but_not_41() {
        let count = hsa_core::sys::ert_payload_count(2) as u64;
        let per = CHAIN_SLOT_HEADER_BYTES + 4 * (1 + count);
        assert_eq!(per, ChainPolicy::G1Unsplit.command_bytes(2));
        assert!(40 * per <= CHAIN_BUFFER_BYTES);
        assert!(41 * per > CHAIN_BUFFER_BYTES);
    }
}
