//! `HsaError`: everything hsa-core can fail with, each naming what failed and why.

use std::path::PathBuf;
use std::time::Duration;

use crate::sys::Status;

/// A place discovery looked for the runtime library, and what happened there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    /// What was tried: a file path, or a bare soname handed to the system loader.
    pub candidate: String,
    /// Why it was not used.
    pub outcome: String,
}

/// The error of every fallible hsa-core call.
#[derive(Debug, thiserror::Error)]
pub enum HsaError {
    /// No candidate library could be loaded.
    #[error("no usable libhsa-runtime64 found; tried:\n{}", render_tried(.tried))]
    LibraryNotFound { tried: Vec<Tried> },

    /// The library exists but the loader refused it.
    #[error("could not load {path}: {reason}")]
    LibraryLoad { path: PathBuf, reason: String },

    /// A required entry point is missing from the library.
    #[error("{library} does not export the required symbol {symbol}")]
    MissingSymbol {
        library: String,
        symbol: &'static str,
    },

    /// A runtime call returned an error status.
    #[error("{call} failed with {status:?}: {message}")]
    Call {
        call: &'static str,
        status: Status,
        message: String,
    },

    /// `hsa_init` failed: the runtime could not start (no device nodes, no driver, ...).
    #[error("hsa_init in {library} failed with {status:?}: {message}")]
    Init {
        library: String,
        status: Status,
        message: String,
    },

    /// The runtime has no agent of a kind the binding needs.
    #[error("{what}; agents found: [{}]", .found.join(", "))]
    NoAgent {
        what: &'static str,
        found: Vec<String>,
    },

    /// The AIE agent has no memory pool of a kind the binding needs.
    #[error("the AIE agent has no {what} pool; pools found: [{}]", .found.join(", "))]
    NoPool {
        what: &'static str,
        found: Vec<String>,
    },

    /// Neither the agent name nor sysfs tells the NPU generation.
    #[error(
        "cannot tell the NPU generation: the AIE agent is named {name:?}, which {why_name}, and \
         {sysfs}; set it with --generation npu1 (Phoenix, Hawk Point) or npu2 (Strix, Strix \
         Halo, Krackan), or `generation` in npud.toml"
    )]
    UnknownGeneration {
        name: String,
        why_name: &'static str,
        sysfs: String,
    },

    /// `packet_abi = "auto"` found nothing that proves which packet form the runtime reads.
    #[error(
        "cannot tell which AIE packet form this runtime reads ({evidence}); set packet_abi = \
         \"g1b\" for a rocm-systems develop build of late 2025 to early 2026 (completion signal \
         at offset 48, AmdFormat 200), or packet_abi = \"g1a\" for ROCm 7.0 and the develop \
         builds of 2025 before it (AmdFormat 3), in npud.toml or with --packet-abi"
    )]
    PacketAbiUnknown { evidence: String },

    /// The runtime needs a driver interface the kernel's amdxdna driver lacks.
    #[error(
        "the G1a runtime (ROCm 7.0) waits for every command with the WAIT_CMD ioctl, which only \
         the out-of-tree amdxdna driver (xdna-driver) has, and {sysfs}/module/amdxdna is the \
         in-tree driver (no taint flag O): no command could complete, and the runtime would \
         report every dispatch as done. Install the out-of-tree xdna-driver, or a ROCR newer \
         than ROCm 7.0 (packet ABI g2 or kernel objects)"
    )]
    DriverUnsupported { sysfs: PathBuf },

    /// The runtime lacks an optional entry point this operation needs.
    #[error("{operation} needs {symbol}, which this runtime does not export")]
    Unsupported {
        operation: &'static str,
        symbol: &'static str,
    },

    /// The device heap (PDIs and instruction streams) has no room for a program: unload one
    /// and try again.
    #[error(
        "the device heap has no room for {needed} more bytes ({used} of {size} in use): {reason}"
    )]
    HeapFull {
        needed: usize,
        used: usize,
        size: usize,
        reason: String,
    },

    /// The runtime reported success but handed back something the binding cannot use
    /// safely (a queue of the wrong size, a null address): a runtime bug or an ABI this
    /// binding does not speak.
    #[error("{call} returned {detail}")]
    Contract { call: &'static str, detail: String },

    /// A FullElf kernel on a runtime that runs neither kernel objects nor G2 full-ELF packets.
    #[error(
        "kernel {kernel:?} is a FullElf kernel: it runs on a runtime that loads code objects \
         (packet ABI kernel-object) or takes G2 full-ELF packets on aie2p, and this one speaks \
         {abi} without full ELF ({why})"
    )]
    NeedsCodeObjects {
        kernel: String,
        abi: &'static str,
        why: String,
    },

    /// A caller-supplied value is out of range.
    #[error("{0}")]
    InvalidArgument(String),

    /// A handle this device does not know.
    #[error("unknown {kind} handle {id}")]
    UnknownHandle { kind: &'static str, id: u64 },

    /// The device reported an error while running a batch of packets.
    #[error("the device failed packet {index} of the batch with {status:?}: {message}")]
    Device {
        index: usize,
        status: Status,
        message: String,
    },

    /// The completion wait gave up.
    #[error("no completion after {waited:?} (signal value {value})")]
    Timeout { waited: Duration, value: i64 },

    /// The batch's outcome cannot be known: ROCm 7.0 (G1a) waits for a command chain once, for
    /// 50 ms (`WAIT_CMD`), and then advances the read index as if it had run, reporting
    /// nothing. A doorbell that took that long may have been a correct but slow kernel, a
    /// loaded host descheduling the ringing thread, or a hang: nothing tells them apart, and
    /// nothing says the device failed. The links of the batch may or may not have run, and
    /// may still be running; the device reported no error.
    #[error(
        "outcome unknown: the doorbell of the batch took {} ms, and ROCm 7.0 stops waiting for \
         a command after {} ms without reporting whether it ran; the batch's results (from \
         link {index} of the batch on) may be missing, partial or still being written",
        took.as_millis(),
        limit.as_millis()
    )]
    OutcomeUnknown {
        /// The batch's first link whose outcome is unknown (0: the whole batch).
        index: usize,
        took: Duration,
        limit: Duration,
    },
}

impl HsaError {
    /// The runtime status behind this error, when there is one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Self::Call { status, .. } | Self::Device { status, .. } | Self::Init { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }
}

fn render_tried(tried: &[Tried]) -> String {
    tried
        .iter()
        .map(|t| format!("  {}: {}", t.candidate, t.outcome))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_failed() {
        let e = HsaError::Call {
            call: "hsa_init",
            status: Status::ERROR_OUT_OF_RESOURCES,
            message: "HSA_STATUS_ERROR_OUT_OF_RESOURCES: out".into(),
        };
        assert_eq!(
            e.to_string(),
            "hsa_init failed with Status::ERROR_OUT_OF_RESOURCES(0x1008): \
             HSA_STATUS_ERROR_OUT_OF_RESOURCES: out"
        );
        let e = HsaError::LibraryNotFound {
            tried: vec![
                Tried {
                    candidate: "/opt/rocm/lib/libhsa-runtime64.so".into(),
                    outcome: "not present".into(),
                },
                Tried {
                    candidate: "libhsa-runtime64.so.1".into(),
                    outcome: "cannot open".into(),
                },
            ],
        };
        let s = e.to_string();
        assert!(
            s.contains("/opt/rocm/lib/libhsa-runtime64.so: not present"),
            "{s}"
        );
        assert!(s.contains("libhsa-runtime64.so.1: cannot open"), "{s}");
    }
}
