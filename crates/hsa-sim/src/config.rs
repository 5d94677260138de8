//! What the emulated agent looks like: its generation, the packet ABI it speaks and the
//! watchdog timeout.
//!
//! The configuration is read once, when `hsa_init` takes the reference count from 0 to 1:
//! from [`set_config`] if a program called it, otherwise from the environment:
//!
//! | Variable | Values | Default | Effect |
//! |---|---|---|---|
//! | `HSA_SIM_AGENT_NAME` | `aie2`, `aie2p` | `aie2p` | the AIE agent's `HSA_AGENT_INFO_NAME`, and the TXN device generation it accepts (`aie2` = npu1 = devGen 3, `aie2p` = npu2 = devGen 4) |
//! | `HSA_SIM_PACKET_ABI` | `g2`, `g1b`, `g1a` | `g2` | how queue packets are decoded (`rocr-aie.md` §0) |
//! | `HSA_SIM_TIMEOUT_MS` | milliseconds | `2000` | how long a hanging command blocks the doorbell before it fails as the driver's TDR would |
//!
//! A value the emulator does not understand is logged and replaced by the default.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use npu_artifacts::NpuGen;

/// The AIE generation the emulated agent reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AieGeneration {
    /// `aie2`: Phoenix / Hawk Point (npu1), TXN devGen 3.
    Aie2,
    /// `aie2p`: Strix / Strix Halo / Krackan (npu2), TXN devGen 4.
    Aie2p,
}

impl AieGeneration {
    /// The agent name ROCR reports (`HSA_AGENT_INFO_NAME`).
    pub fn agent_name(self) -> &'static str {
        self.npu_gen().agent_name()
    }

    /// The NPU generation whose designs this agent runs.
    pub fn npu_gen(self) -> NpuGen {
        match self {
            Self::Aie2 => NpuGen::Npu1,
            Self::Aie2p => NpuGen::Npu2,
        }
    }

    /// The product name ROCR reads from sysfs `vbnv` (`HSA_AMD_AGENT_INFO_PRODUCT_NAME`).
    pub fn product_name(self) -> &'static str {
        match self {
            Self::Aie2 => "NPU Phoenix (hsa-sim)",
            Self::Aie2p => "NPU Strix (hsa-sim)",
        }
    }

    /// Parses an agent name as `HSA_SIM_AGENT_NAME` spells it: `aie2` or `aie2p`.
    pub fn from_agent_name(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "aie2" => Some(Self::Aie2),
            "aie2p" => Some(Self::Aie2p),
            _ => None,
        }
    }
}

impl From<NpuGen> for AieGeneration {
    fn from(g: NpuGen) -> Self {
        match g {
            NpuGen::Npu1 => Self::Aie2,
            NpuGen::Npu2 => Self::Aie2p,
        }
    }
}

/// The AIE packet ABI the emulated ROCR speaks: the binding's own type, so the two cannot
/// disagree on what `g2`, `g1b` and `g1a` mean.
pub use hsa_core::PacketAbi;

/// The emulator's configuration, fixed for the life of one initialisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// The agent's generation: `aie2` runs npu1 designs, `aie2p` npu2 designs.
    pub agent: AieGeneration,
    pub packet_abi: PacketAbi,
    /// How long a hanging command blocks before it fails ("Device isn't making progress").
    pub timeout: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            agent: AieGeneration::Aie2p,
            packet_abi: PacketAbi::G2,
            timeout: Duration::from_millis(2000),
        }
    }
}

impl SimConfig {
    /// Reads `HSA_SIM_AGENT_NAME`, `HSA_SIM_PACKET_ABI` and `HSA_SIM_TIMEOUT_MS`.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let mut cfg = Self::default();
        if let Some(v) = get("HSA_SIM_AGENT_NAME") {
            match AieGeneration::from_agent_name(&v) {
                Some(a) => cfg.agent = a,
                None => {
                    tracing::warn!(value = %v, "HSA_SIM_AGENT_NAME is not aie2 or aie2p; using aie2p")
                }
            }
        }
        if let Some(v) = get("HSA_SIM_PACKET_ABI") {
            match v.trim().parse::<PacketAbi>().ok() {
                Some(p) => cfg.packet_abi = p,
                None => {
                    tracing::warn!(value = %v, "HSA_SIM_PACKET_ABI is not g2, g1b or g1a; using g2")
                }
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

/// A process-wide lock for tests that initialise the runtime or change its configuration.
///
/// The runtime is one per process; `cargo test` runs a binary's tests on several threads, so
/// such tests hold this guard for their whole body. A panic in a holder does not poison it for
/// the others.
#[doc(hidden)]
pub fn serial_test_guard() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_values_parse_and_bad_ones_fall_back() {
        let cfg = SimConfig::from_lookup(|k| match k {
            "HSA_SIM_AGENT_NAME" => Some("AIE2".into()),
            "HSA_SIM_PACKET_ABI" => Some("g1a".into()),
            "HSA_SIM_TIMEOUT_MS" => Some("50".into()),
            _ => None,
        });
        assert_eq!(cfg.agent, AieGeneration::Aie2);
        assert_eq!(cfg.packet_abi, PacketAbi::G1a);
        assert_eq!(cfg.timeout, Duration::from_millis(50));

        let bad = SimConfig::from_lookup(|k| match k {
            "HSA_SIM_AGENT_NAME" => Some("npu9".into()),
            "HSA_SIM_PACKET_ABI" => Some("g3".into()),
            "HSA_SIM_TIMEOUT_MS" => Some("soon".into()),
            _ => None,
        });
        assert_eq!(bad, SimConfig::default());
    }

    #[test]
    fn agent_names_map_to_generations() {
        assert_eq!(
            AieGeneration::from_agent_name("aie2").map(AieGeneration::npu_gen),
            Some(NpuGen::Npu1)
        );
        assert_eq!(
            AieGeneration::from_agent_name(" AIE2P "),
            Some(AieGeneration::Aie2p)
        );
        assert_eq!(AieGeneration::from_agent_name("strix"), None);
        assert_eq!(AieGeneration::from(NpuGen::Npu2).agent_name(), "aie2p");
    }
}
