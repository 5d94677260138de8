//! The device's time, modelled: how long a doorbell would block on an NPU.
//!
//! The emulator runs a kernel in microseconds of CPU, so without a model every figure measured
//! on it is the software's. With `HSA_SIM_TIMING=model` (npud: `emulator.timing = "model"`) a
//! doorbell returns no sooner than the modelled time of what it ran: the ringing thread sleeps,
//! as ROCR's blocks in the driver's `WAIT_CMD`, so the device's time costs no CPU. Off by
//! default: tests that measure the software keep the emulator's own speed.
//!
//! The model charges, per doorbell ([`Model`], per NPU generation):
//! - each command chain submitted (`EXEC_CMD`, the firmware, `WAIT_CMD`): [`Model::submit`];
//! - each command in it: [`Model::per_command`];
//! - each hardware context built ([`Model::context`]): the driver refuses to configure the
//!   compute units of a context twice, so a PDI new to a queue rebuilds its context (ROCR's
//!   `ConfigHwCtx`: destroy, create, `CONFIG_CU`); ROCm 7.0 keys its PDI cache by the handle
//!   of the context it just destroyed, so every doorbell builds one;
//! - each kernel: the larger of its bytes in and out at [`Model::bytes_per_us`] and (matmul)
//!   its operations at [`Model::ops_per_us`], at least [`Model::kernel_min`], plus ROCR's cache
//!   flush of its buffers before and after the submission ([`Model::flush_ns_per_mib`]).
//!
//! A device fault is charged through the same context: the newest ROCR suspends a queue whose
//! batch failed, npud re-creates it (`hsa_queue_destroy` destroys the hardware context), and
//! the new queue's first doorbell builds one again for each PDI it runs ([`Model::context`]).
//! No published figure times a fault's recovery; that it costs one context build is the
//! model's assumption. The failing command itself, and the driver's own handling of an AIE
//! error (`aie2_error.c` stops and restarts the contexts on the failing columns; a command that
//! ends in ERROR restarts none), are not charged.
//!
//! Every figure is modelled from published measurements, not measured on an NPU here; where each
//! comes from is on its constant. The time charged is also counted
//! ([`crate::Counters::modelled_device_ns`]), so a caller can tell it from the emulator's own.
//! Not modelled: clock ramp-up after idle, power modes, the per-command buffer objects ROCR
//! creates and maps, and ROCm 7.0's 50 ms `WAIT_CMD` limit on a modelled chain (the emulator's
//! own time is still held to it).

use std::cell::Cell;
use std::time::{Duration, Instant};

use npu_artifacts::NpuGen;

use crate::counters::{Counter, bump_by};

/// Whether doorbells take the modelled device time (`HSA_SIM_TIMING`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Timing {
    /// Doorbells return as soon as the emulator has run their packets.
    #[default]
    Off,
    /// Doorbells return no sooner than the [`Model`]'s time for what they ran.
    Model,
}

impl Timing {
    /// The name `HSA_SIM_TIMING` and npud's `emulator.timing` take.
    pub fn as_str(self) -> &'static str {
        match self {
            Timing::Off => "off",
            Timing::Model => "model",
        }
    }
}

impl std::str::FromStr for Timing {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "" => Ok(Timing::Off),
            "model" => Ok(Timing::Model),
            other => Err(format!("{other:?} is not a timing (off or model)")),
        }
    }
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The modelled costs of one NPU generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    /// One command chain submitted and waited for, beyond its commands.
    pub submit: Duration,
    /// Each command of a chain.
    pub per_command: Duration,
    /// One hardware context built (created and its compute units configured).
    pub context: Duration,
    /// A kernel's bytes in and out per µs.
    pub bytes_per_us: u64,
    /// A matmul's operations (2·m·k·n) per µs.
    pub ops_per_us: u64,
    /// The least a kernel takes.
    pub kernel_min: Duration,
    /// ROCR's CPU cache flush of a kernel's buffers, per MiB, once before and once after.
    pub flush_ns_per_mib: u64,
}

impl Model {
    /// The model of `agent`'s NPU.
    pub fn of(agent: NpuGen) -> Model {
        let us = Duration::from_micros;
        let (single, per_command) = match agent {
            NpuGen::Npu1 => (NPU1_SINGLE_US, NPU1_PER_COMMAND_US),
            NpuGen::Npu2 => (NPU2_SINGLE_US, NPU2_PER_COMMAND_US),
        };
        Model {
            submit: us(single - per_command),
            per_command: us(per_command),
            context: us(CONTEXT_US),
            bytes_per_us: BYTES_PER_US,
            ops_per_us: OPS_PER_US,
            kernel_min: Duration::from_nanos(KERNEL_MIN_NS),
            flush_ns_per_mib: FLUSH_NS_PER_MIB,
        }
    }

    /// A kernel's modelled time for `bytes` in and out and `ops` operations.
    pub fn kernel(&self, bytes: u64, ops: u64) -> Duration {
        let ns = |n: u64, per_us: u64| n.saturating_mul(1000) / per_us.max(1);
        let work = ns(bytes, self.bytes_per_us).max(ns(ops, self.ops_per_us));
        let flush = 2 * bytes.saturating_mul(self.flush_ns_per_mib) / (1 << 20);
        Duration::from_nanos(work).max(self.kernel_min) + Duration::from_nanos(flush)
    }
}

// Figures (see the module docs: modelled from published measurements, not measured here).

/// npu1 (Phoenix): one no-op command submitted and waited for, `xrt-smi validate -r latency`
/// (10,000 × run + wait): 110.0 µs (amd/RyzenAI-SW#142, Ryzen 5 7640U).
const NPU1_SINGLE_US: u64 = 110;
/// npu1: each command of a chain, `xrt-smi validate -r cmd-chain-latency` (1,000 no-op commands
/// in runlists of 24 per chain, amortised): 27.7 µs, same machine and run as the above. Taking
/// the amortised figure as each command's own cost is an inference.
const NPU1_PER_COMMAND_US: u64 = 28;
/// npu2 (Strix): `xrt-smi validate -r latency` on Linux: 50.0 µs (amd/IRON#43). On Windows
/// 109.5–127.2 µs (Xilinx/XRT#8075, #8319).
const NPU2_SINGLE_US: u64 = 50;
/// npu2: `cmd-chain-latency` 8.8 µs a command (Xilinx/XRT#8238, Strix, Windows); as for npu1,
/// an inference that this is each command's own cost.
const NPU2_PER_COMMAND_US: u64 = 9;
/// A hardware context built: `xrt::hw_context` 35 ms on Strix (amd/Triton-XDNA#113, with XRT's
/// own work, so an upper bound); npu1 takes the same figure (an inference: none published).
const CONTEXT_US: u64 = 35_000;
/// A full-array copy DDR→AIE→DDR: 66.6 GB/s counting bytes in and out (Xilinx/mlir-aie#2559,
/// `memcpy` of 64 MiB); a design using fewer columns is slower (not modelled).
const BYTES_PER_US: u64 = 66_000;
/// A 512³ IRON matmul on npu2, one core: 83.3 GFLOPS (Xilinx/mlir-aie#2704); ~80 here.
const OPS_PER_US: u64 = 80_000;
/// A small kernel's compute: ≈2.5 µs (Xilinx/mlir-aie#3793, npu2).
const KERNEL_MIN_NS: u64 = 2_500;
/// ROCR flushes the CPU cache over every argument range before and after a submission: ≈18 µs
/// per MB (amd/Triton-XDNA#112).
const FLUSH_NS_PER_MIB: u64 = 18_000;

thread_local! {
    /// The model and the time charged so far of the doorbell this thread is ringing, if the
    /// model is on.
    static CHARGED: Cell<Option<(Model, Duration)>> = const { Cell::new(None) };
    /// Whether this thread's timer slack was made 1 ns.
    static PRECISE: Cell<bool> = const { Cell::new(false) };
}

/// Sleeps `d` on a timer with 1 ns of slack: the default 50 µs would make a modelled 50 µs
/// doorbell take twice as long. The slack is the ringing thread's (a thread that rings with the
/// model on keeps it); the sleep costs no CPU, as the real doorbell's wait does not.
fn sleep_precisely(d: Duration) {
    if !PRECISE.with(Cell::get) {
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
        PRECISE.with(|p| p.set(true));
    }
    std::thread::sleep(d);
}

/// A doorbell being rung: what it is charged is slept when it is dropped.
#[must_use]
pub(crate) struct Doorbell {
    /// When it was rung, with the model on (off: no clock is read).
    started: Option<Instant>,
}

impl Doorbell {
    /// Starts charging this thread's doorbell (nothing when `timing` is off).
    pub fn ring(timing: Timing, agent: NpuGen) -> Doorbell {
        let on = timing == Timing::Model;
        if on {
            CHARGED.with(|c| c.set(Some((Model::of(agent), Duration::ZERO))));
        }
        Doorbell {
            started: on.then(Instant::now),
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        let Some(started) = self.started else {
            return;
        };
        let charged = CHARGED.with(Cell::take).map_or(Duration::ZERO, |(_, t)| t);
        bump_by(
            Counter::ModelledDeviceNs,
            u64::try_from(charged.as_nanos()).unwrap_or(u64::MAX),
        );
        // The device works while the emulator does: only what is left of its time is slept.
        if let Some(left) = charged.checked_sub(started.elapsed()) {
            sleep_precisely(left);
        }
    }
}

/// Charges `f(model)` to this thread's doorbell, if one is being rung with the model on.
fn charge(f: impl FnOnce(&Model) -> Duration) {
    CHARGED.with(|c| {
        if let Some((m, t)) = c.get() {
            c.set(Some((m, t + f(&m))));
        }
    });
}

/// A command chain submitted.
pub(crate) fn chain() {
    charge(|m| m.submit);
}

/// A command of a chain run.
pub(crate) fn command() {
    charge(|m| m.per_command);
}

/// A hardware context built.
pub(crate) fn context() {
    charge(|m| m.context);
}

/// A kernel that moved `bytes` in and out and did `ops` operations.
pub(crate) fn kernel(bytes: u64, ops: u64) {
    charge(|m| m.kernel(bytes, ops));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doorbell_sleeps_what_it_charged_and_nothing_with_the_model_off() {
        let agent = NpuGen::Npu2;
        let m = Model::of(agent);
        let t = Instant::now();
        {
            let _d = Doorbell::ring(Timing::Model, agent);
            chain();
            command();
            command();
        }
        assert!(
            t.elapsed() >= m.submit + 2 * m.per_command,
            "{:?}",
            t.elapsed()
        );
        let t = Instant::now();
        {
            let _d = Doorbell::ring(Timing::Off, agent);
            chain();
            context();
        }
        assert!(t.elapsed() < m.context, "{:?}", t.elapsed());
    }

    #[test]
    fn a_kernel_takes_the_longer_of_its_bytes_and_its_operations_plus_the_flushes() {
        let m = Model::of(NpuGen::Npu1);
        assert_eq!(m.kernel(0, 0), m.kernel_min);
        // 66,000 bytes a µs: 100 µs, and 2 flushes of 6.6 MB at 18 µs a MiB.
        let bytes = m.bytes_per_us * 100;
        let flush = Duration::from_nanos(2 * bytes * m.flush_ns_per_mib / (1 << 20));
        assert_eq!(m.kernel(bytes, 0), Duration::from_micros(100) + flush);
        // Operations dominate a matmul: 64³·2 at 80,000 a µs.
        let ops = 2 * 64 * 64 * 64;
        assert_eq!(
            m.kernel(3 * 64 * 64 * 4, ops),
            Duration::from_nanos(ops * 1000 / m.ops_per_us)
                + Duration::from_nanos(2 * 3 * 64 * 64 * 4 * m.flush_ns_per_mib / (1 << 20))
        );
    }

    #[test]
    fn a_lone_command_costs_the_published_latency_and_a_batch_saves_a_submission_each() {
        // xrt-smi's latency (a command alone) and cmd-chain-latency (each in a chain).
        for (g, alone, in_chain) in [(NpuGen::Npu1, 110, 28), (NpuGen::Npu2, 50, 9)] {
            let m = Model::of(g);
            assert_eq!(
                m.submit + m.per_command,
                Duration::from_micros(alone),
                "{g:?}"
            );
            assert_eq!(m.per_command, Duration::from_micros(in_chain), "{g:?}");
            // Sixteen in one chain against sixteen chains of one: fifteen submissions saved.
            let one = m.submit + 16 * m.per_command;
            let sixteen = 16 * (m.submit + m.per_command);
            assert_eq!(sixteen - one, 15 * m.submit, "{g:?}");
        }
    }

    #[test]
    fn timing_names_round_trip() {
        for t in [Timing::Off, Timing::Model] {
            assert_eq!(t.as_str().parse::<Timing>(), Ok(t));
        }
        assert!("fast".parse::<Timing>().is_err());
    }
}
