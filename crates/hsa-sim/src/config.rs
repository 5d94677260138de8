//! What the emulated agent looks like: its generation, the ROCR release it behaves as (its
//! [`Profile`]) and the watchdog timeout.
//!
//! The configuration is read once, when `hsa_init` takes the reference count from 0 to 1:
//! from [`set_config`] if a program called it, otherwise from the environment:
//!
//! | Variable | Values | Default | Effect |
//! |---|---|---|---|
//! | `HSA_SIM_AGENT_NAME` | `aie2`, `aie2p` | `aie2p` | the AIE agent's `HSA_AGENT_INFO_NAME`, and the TXN device generation it accepts (`aie2` = npu1 = devGen 3, `aie2p` = npu2 = devGen 4) |
//! | `HSA_SIM_PROFILE` | `rocm-7.0`, `rocr-late-2025`, `rocr-g2-2026-05`, `rocr-g2-2026-07`, `rocr-newest`, `kernel-object` | `rocr-newest` | the ROCR release: packet ABI, names, chain limits, how failures are reported, what vmem and dmabuf export allow, whether AIE hsacos load (see [`Profile`]) |
//! | `HSA_SIM_TIMEOUT_MS` | milliseconds | `2000` | how long a hanging command blocks the doorbell before it fails as the driver's TDR would (ROCm 7.0 gives up after 50 ms if that is shorter) |
//! | `HSA_SIM_TIMING` | `off`, `model` | `off` | whether a doorbell takes the device time the timing model gives what it ran ([`crate::timing`]) |
//!
//! A value the emulator does not understand is logged and replaced by the default.
//! `HSA_SIM_PACKET_ABI` is not read (the profile decides the packet ABI); setting it logs a
//! warning.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use npu_artifacts::NpuGen;

/// The emulated agent's name as `HSA_SIM_AGENT_NAME` and npud's `emulator.agent_name` spell
/// it: exactly `aie2` (npu1, TXN devGen 3) or `aie2p` (npu2, devGen 4), in any case. Product
/// names such as `strix` are not agent names here.
pub fn agent_from_name(name: &str) -> Option<NpuGen> {
    match name.trim().to_ascii_lowercase().as_str() {
        "aie2" => Some(NpuGen::Npu1),
        "aie2p" => Some(NpuGen::Npu2),
        _ => None,
    }
}

/// The product name the emulated agent reports where ROCR reads sysfs `vbnv`
/// (`HSA_AMD_AGENT_INFO_PRODUCT_NAME`).
pub fn product_name(agent: NpuGen) -> &'static str {
    match agent {
        NpuGen::Npu1 => "NPU Phoenix (hsa-sim)",
        NpuGen::Npu2 => "NPU Strix (hsa-sim)",
    }
}

/// The AIE packet ABI the emulated ROCR speaks: the binding's own type, so the two cannot
/// disagree on what `g2`, `g1b` and `g1a` mean. A [`Profile`] decides it.
pub use hsa_core::PacketAbi;

pub use crate::profile::Profile;

/// The emulator's configuration, fixed for the life of one initialisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// The agent's generation: npu1 reports `aie2` and runs npu1 designs, npu2 `aie2p`.
    pub agent: NpuGen,
    /// The ROCR release the emulator behaves as.
    pub profile: Profile,
    /// How long a hanging command blocks before it fails ("Device isn't making progress").
    pub timeout: Duration,
    /// Whether doorbells take the modelled device time.
    pub timing: crate::timing::Timing,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            agent: NpuGen::Npu2,
            profile: Profile::default(),
            timeout: Duration::from_millis(2000),
            timing: crate::timing::Timing::Off,
        }
    }
}

impl SimConfig {
    /// The packet ABI of the configured profile.
    pub fn packet_abi(&self) -> PacketAbi {
        self.profile.packet_abi()
    }

    /// How long a command that never completes blocks the doorbell before it fails: the
    /// watchdog timeout, or the profile's own shorter wait (ROCm 7.0's 50 ms `WAIT_CMD`).
    pub fn command_wait(&self) -> Duration {
        match self.profile.command_wait_limit() {
            Some(limit) => limit.min(self.timeout),
            None => self.timeout,
        }
    }

    /// Reads `HSA_SIM_AGENT_NAME`, `HSA_SIM_PROFILE`, `HSA_SIM_TIMEOUT_MS` and `HSA_SIM_TIMING`.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let mut cfg = Self::default();
        if let Some(v) = get("HSA_SIM_AGENT_NAME") {
            match agent_from_name(&v) {
                Some(a) => cfg.agent = a,
                None => {
                    tracing::warn!(value = %v, "HSA_SIM_AGENT_NAME is not aie2 or aie2p; using aie2p")
                }
            }
        }
        if let Some(v) = get("HSA_SIM_PROFILE") {
            match v.parse::<Profile>() {
                Ok(p) => cfg.profile = p,
                Err(e) => tracing::warn!("HSA_SIM_PROFILE: {e}; using {}", Profile::default()),
            }
        }
        if let Some(v) = get("HSA_SIM_PACKET_ABI") {
            tracing::warn!(
                value = %v,
                "HSA_SIM_PACKET_ABI is no longer read: HSA_SIM_PROFILE ({}) decides the packet ABI",
                cfg.profile
            );
        }
        if let Some(v) = get("HSA_SIM_TIMING") {
            match v.parse() {
                Ok(t) => cfg.timing = t,
                Err(e) => tracing::warn!("HSA_SIM_TIMING: {e}; using off"),
            }
        }
        if let Some(v) = get("HSA_SIM_TIMEOUT_MS") {
            match v.trim().parse::<u64>() {
                Ok(ms) => cfg.timeout = Duration::from_millis(ms),
                Err(_) => {
                    tracing::warn!(value = %v, "HSA_SIM_TIMEOUT_MS is not a number; using 2000")
                }
            }
        }
        cfg
    }
}

static OVERRIDE: Mutex<Option<SimConfig>> = Mutex::new(None);

/// Makes every later 0→1 `hsa_init` use `config` instead of the environment, until
/// [`reset_config`]. A runtime that is already initialised keeps its configuration.
pub fn set_config(config: SimConfig) {
    *OVERRIDE.lock().unwrap_or_else(PoisonError::into_inner) = Some(config);
}

/// Drops the override of [`set_config`]: later initialisations read the environment again.
pub fn reset_config() {
    *OVERRIDE.lock().unwrap_or_else(PoisonError::into_inner) = None;
}

/// The configuration a 0→1 `hsa_init` uses now.
pub(crate) fn effective() -> SimConfig {
    OVERRIDE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .unwrap_or_else(SimConfig::from_env)
}

static SERIAL: Mutex<()> = Mutex::new(());

thread_local! {
    /// How many [`SerialGuard`]s this thread holds (the lock is taken by the first only).
    static HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// What [`serial_test_guard`] returns: the process-wide test lock, held until the outermost
/// guard of this thread is dropped.
#[doc(hidden)]
#[derive(Debug)]
pub struct SerialGuard {
    _lock: Option<MutexGuard<'static, ()>>,
}

impl Drop for SerialGuard {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// A process-wide lock for tests that initialise the runtime, change its configuration or read
/// its process-wide counters.
///
/// The runtime is one per process; `cargo test` runs a binary's tests on several threads, so
/// such tests hold this guard for their whole body. A thread that already holds it may take it
/// again (a test holds it around helpers that take it themselves), so a test can read the
/// counters before and after everything its helpers do. A panic in a holder does not poison it
/// for the others.
#[doc(hidden)]
pub fn serial_test_guard() -> SerialGuard {
    let lock = (HELD.with(std::cell::Cell::get) == 0)
        .then(|| SERIAL.lock().unwrap_or_else(PoisonError::into_inner));
    HELD.with(|h| h.set(h.get() + 1));
    SerialGuard { _lock: lock }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_values_parse_and_bad_ones_fall_back() {
        let cfg = SimConfig::from_lookup(|k| match k {
            "HSA_SIM_AGENT_NAME" => Some("AIE2".into()),
            "HSA_SIM_PROFILE" => Some("ROCm-7.0".into()),
            "HSA_SIM_TIMEOUT_MS" => Some("500".into()),
            "HSA_SIM_TIMING" => Some("Model".into()),
            _ => None,
        });
        assert_eq!(cfg.timing, crate::timing::Timing::Model);
        assert_eq!(cfg.agent, NpuGen::Npu1);
        assert_eq!(cfg.profile, Profile::Rocm70);
        assert_eq!(cfg.packet_abi(), PacketAbi::G1a);
        assert_eq!(cfg.timeout, Duration::from_millis(500));
        assert_eq!(cfg.command_wait(), Duration::from_millis(50));

        let bad = SimConfig::from_lookup(|k| match k {
            "HSA_SIM_AGENT_NAME" => Some("npu9".into()),
            "HSA_SIM_PROFILE" => Some("rocm-7.1".into()),
            "HSA_SIM_PACKET_ABI" => Some("g1a".into()),
            "HSA_SIM_TIMEOUT_MS" => Some("soon".into()),
            "HSA_SIM_TIMING" => Some("fast".into()),
            _ => None,
        });
        assert_eq!(bad, SimConfig::default());
        assert_eq!(bad.command_wait(), bad.timeout);
    }

    #[test]
    fn agent_names_map_to_generations() {
        assert_eq!(agent_from_name("aie2"), Some(NpuGen::Npu1));
        assert_eq!(agent_from_name(" AIE2P "), Some(NpuGen::Npu2));
        assert_eq!(agent_from_name("strix"), None);
        assert_eq!(NpuGen::Npu2.agent_name(), "aie2p");
        assert_eq!(product_name(NpuGen::Npu1), "NPU Phoenix (hsa-sim)");
    }
}
