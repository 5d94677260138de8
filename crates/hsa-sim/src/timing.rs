//! The device's time, modelled: how long a doorbell would block on an NPU.
//!
//! The emulator runs a kernel in microseconds of CPU, so without a model every figure measured
//! on it is the software's. With `HSA_SIM_TIMING=model` (npud: `emulator.timing = "model"`) a
//! doorbell returns no sooner than the modelled time of what it ran: the ringing thread sleeps,
//! as ROCR's blocks in the driver's `WAIT_CMD`, so the device's time costs no CPU. Off by
//! default: tests that measure the software keep the emulator's own speed.
//!
//! The model charges, per doorbell ([`Model`]):
//! - each command chain submitted (`EXEC_CMD` + the firmware + `WAIT_CMD`): [`Model::submit`];
//! - each command in it: [`Model::per_command`];
//! - each hardware context built (ROCm 7.0 builds one at every doorbell that misses its PDI
//!   cache; the kernel-object runtime when a batch needs a wider or new one): [`Model::context`];
//! - each PDI a context is configured with (`CONFIG_CU`): [`Model::configure`];
//! - each kernel: its bytes in and out at [`Model::bytes_per_us`], at least
//!   [`Model::kernel_min`].
//!
//! Every figure is modelled, not measured on an NPU; where each comes from is on its field.
//! The time charged is also counted ([`crate::Counters::modelled_device_ns`]), so a caller can
//! tell modelled device time from the emulator's own.

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
    /// One hardware context built.
    pub context: Duration,
    /// One PDI configured into a context.
    pub configure: Duration,
    /// A kernel's bytes in and out per µs.
    pub bytes_per_us: u64,
    /// The least a kernel takes.
    pub kernel_min: Duration,
}

impl Model {
    /// The model of `agent`'s NPU.
    pub fn of(agent: NpuGen) -> Model {
        let us = Duration::from_micros;
        match agent {
            NpuGen::Npu1 | NpuGen::Npu2 => Model {
                submit: us(SUBMIT_US),
                per_command: us(PER_COMMAND_US),
                context: us(CONTEXT_US),
                configure: us(CONFIGURE_US),
                bytes_per_us: BYTES_PER_US,
                kernel_min: us(KERNEL_MIN_US),
            },
        }
    }

    /// A kernel's modelled time for `bytes` in and out.
    pub fn kernel(&self, bytes: u64) -> Duration {
        let us = bytes / self.bytes_per_us.max(1);
        Duration::from_micros(us).max(self.kernel_min)
    }
}

// Figures. See the module docs: modelled, not measured here.

/// A command chain submitted alone and waited for: XRT's run + wait of an empty kernel,
/// ≈45 µs (Xilinx/XRT#9018, Xilinx/mlir-aie#2381), less the command itself.
const SUBMIT_US: u64 = 35;
/// Each command of a chain: XRT's run + wait of an empty kernel (≈45 µs) less a submission.
const PER_COMMAND_US: u64 = 10;
/// A hardware context built: XRT's `hw_context` ≈35 ms (amd/Triton-XDNA#113).
const CONTEXT_US: u64 = 35_000;
/// A PDI configured (`CONFIG_CU`).
const CONFIGURE_US: u64 = 1_000;
/// A kernel's bytes in and out per µs.
const BYTES_PER_US: u64 = 4_096;
/// The least a kernel takes: ≈2.5 µs (Xilinx/mlir-aie#3793).
const KERNEL_MIN_US: u64 = 3;

thread_local! {
    /// The model and the time charged so far of the doorbell this thread is ringing, if the
    /// model is on.
    static CHARGED: Cell<Option<(Model, Duration)>> = const { Cell::new(None) };
}

/// A doorbell being rung: what it is charged is slept when it is dropped.
#[must_use]
pub(crate) struct Doorbell {
    started: Instant,
    on: bool,
}

impl Doorbell {
    /// Starts charging this thread's doorbell (nothing when `timing` is off).
    pub fn ring(timing: Timing, agent: NpuGen) -> Doorbell {
        let on = timing == Timing::Model;
        if on {
            CHARGED.with(|c| c.set(Some((Model::of(agent), Duration::ZERO))));
        }
        Doorbell {
            started: Instant::now(),
            on,
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        if !self.on {
            return;
        }
        let charged = CHARGED.with(Cell::take).map_or(Duration::ZERO, |(_, t)| t);
        bump_by(
            Counter::ModelledDeviceNs,
            u64::try_from(charged.as_nanos()).unwrap_or(u64::MAX),
        );
        // The device works while the emulator does: only what is left of its time is slept.
        if let Some(left) = charged.checked_sub(self.started.elapsed()) {
            std::thread::sleep(left);
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

/// A PDI configured into a context.
pub(crate) fn configure() {
    charge(|m| m.configure);
}

/// A kernel that moved `bytes` in and out.
pub(crate) fn kernel(bytes: u64) {
    charge(|m| m.kernel(bytes));
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
    fn a_kernel_takes_its_bytes_at_the_rate_and_at_least_the_minimum() {
        let m = Model::of(NpuGen::Npu1);
        assert_eq!(m.kernel(0), m.kernel_min);
        assert_eq!(
            m.kernel(m.bytes_per_us * 100),
            Duration::from_micros(100).max(m.kernel_min)
        );
    }

    #[test]
    fn timing_names_round_trip() {
        for t in [Timing::Off, Timing::Model] {
            assert_eq!(t.as_str().parse::<Timing>(), Ok(t));
        }
        assert!("fast".parse::<Timing>().is_err());
    }
}
