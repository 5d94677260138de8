//! Profiles: which ROCR release the emulator behaves as, down to the way it fails.
//!
//! Users install a ROCR release, not a packet ABI; each release fails in its own way, and a
//! client tested on a kinder emulator breaks on the hardware. A profile fixes every behaviour
//! that differs between releases (`rocr-aie.md` §0, §3, §4, §5; `rocr-aie-hsaco.md` §4, §6):
//!
//! | | `rocm-7.0` | `rocr-late-2025` | `rocr-g2-2026-05` | `rocr-g2-2026-07` | `rocr-newest` (default) | `kernel-object` |
//! |---|---|---|---|---|---|---|
//! | packet ABI | G1a | G1b | G2 | G2 | G2 | G2 layout, words 20/24 a kernel object |
//! | packet header checked | no (`assert` only) | yes (must be 0) | no | type READY, opcode KMQ | type READY, opcode KMQ | opcode only |
//! | `HSA_AGENT_INFO_NAME` | always `aie2` | `aie2` / `aie2p` by generation | same | same | same | same |
//! | `HSA_AMD_AGENT_INFO_PRODUCT_NAME` | `AIE-ML` | the product name | same | same | same | same |
//! | chain per doorbell | one, ≤ 4096 bytes at 52 + 4·(6+3N) per START_CU command | same | one, ≤ 4096 bytes at 52 + 4·(8+2N) per packet | split; 52 + 4·(6+2N) per PDI + insts packet, 60 per full-ELF packet | same | split; 52 + 4·(6+2N) per `PdiInsts` command, 60 per `FullElf` |
//! | a failed batch | silent | abort | abort | suspend + error callback (abort without one) | same | suspend + error callback; a batch refused before submission retires nothing |
//! | command wait limit | 50 ms (`WAIT_CMD`) | the watchdog | the watchdog | the watchdog | the watchdog | the watchdog |
//! | `hsa_amd_portable_export_dmabuf` of AIE memory | `INVALID_AGENT` (observed) | `ERROR` | `ERROR` | `ERROR` | `ERROR` | `ERROR` |
//! | `hsa_amd_vmem_map` of an AIE-pool handle | `INVALID_AGENT` | `INVALID_AGENT` | works | works | works | works |
//! | `hsa_amd_vmem_import_shareable_handle` | `INVALID_ALLOCATION` | `INVALID_ALLOCATION` | works | works | works | works |
//! | `hsa_amd_vmem_export_shareable_handle` of an AIE-pool handle | `ERROR` | `ERROR` | `ERROR` | a sealed memfd | a sealed memfd | a sealed memfd |
//! | AIE hsaco loads (`hsa_executable_load_agent_code_object`) | `INVALID_CODE_OBJECT` | same | same | `PdiInsts` kernels only; `KERNEL_OBJECT` a descriptor that packets never name | `INVALID_CODE_OBJECT` | yes |
//! | G2 full-ELF packets (`pdi_patch_offset` ≠ 0) | — | — | word 56 ignored: the control code runs as an instruction stream | aie2p only, one mode per doorbell batch | same | — (word 56 reserved) |
//! | hardware contexts | one per doorbell; a stale agent-wide PDI cache entry drops a later queue's first doorbell (`dispatch/rocm70.rs`) | per queue | per queue | per queue, rebuilt on a mode switch | same | per mode |
//! | G2 packet / NULL G1 payload / ERT opcode not START_CU | read as G1a / abort / hang forever | refused | — | — | — | — |
//!
//! What `packet_abi = "auto"` in hsa-core sees of each profile is only what the real release
//! shows through the function table: whether an AIE code object loads, whether an AIE vmem
//! handle maps, the product name (`AIE-ML` on ROCm 7.0). The build-version string names the
//! profile, which no ROCR string does; hsa-core does not read it to choose a packet form, and
//! the exported-symbol set is the same for every profile (every entry point the binding uses
//! is public ROCR API older than ROCm 7.0, so the symbol set tells no release from another;
//! inferred from the headers, not checked against each release's exports).
//!
//! Where each row comes from, and which rows are inferred rather than read, is in the crate
//! documentation's table of rules.

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use hsa_core::PacketAbi;
use npu_artifacts::NpuGen;

/// The ROCR release the emulator behaves as, named as users install it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Profile {
    /// ROCm 7.0 (`release/rocm-rel-7.0`, August 2025): G1a packets, errors only `assert`ed.
    Rocm70,
    /// rocm-systems develop, late 2025 to early 2026: G1b packets, errors abort the process.
    RocrLate2025,
    /// rocm-systems develop from May 2026 (PR #5595): the first G2 packets, no chain split,
    /// errors abort the process.
    RocrG2May2026,
    /// rocm-systems development of July 2026 (the G2-era AIE suite, `rocrtst/suites/aie/dispatch.cc`
    /// @ `07ee4564`): G2 packets, full-ELF packets (`pdi_patch_offset`), chains split to fit, a
    /// failed batch suspends the queue and calls its error callback, and an AIE hsaco loader
    /// that takes `PdiInsts` kernels through the executable API while the packets still name
    /// instruction streams, never kernel objects.
    RocrG2Jul2026,
    /// The newest ROCR whose source could be read here: rocm-systems `develop` as the newest
    /// stored text of its files shows it, the loader `runtime/hsa-runtime/loader/executable.cpp`
    /// @ `a1e856c405773f4386a1f34dc259b3741e48e11f` (gfx1250 kernel-entry trampolines, so
    /// newer than every AIE branch cited here) and the G2 driver with full-ELF packets
    /// (`core/driver/xdna/README.md` @ `159fb22fb91d26b08f8c4fcbebba417edacc622a`): G2
    /// packets, full-ELF packets, chains split to fit, a failed batch suspends the queue and
    /// calls its error callback. Its loader has no AIE section loader (no `AieKernelDescriptor`,
    /// no `amd_aie_code.hpp`: the July 2026 tree's loader lived on a development line that
    /// this text does not carry), so an AIE hsaco goes to the GPU loader and fails as an
    /// invalid code object. The newest whole tree that could be fetched, rocm-systems `develop`
    /// @ `1b1610fc2b2ab32af71e6e04e4d4a6a4ae597992` (2025-08-09), predates G2 and is not what
    /// this profile models.
    #[default]
    RocrNewest,
    /// A kernel-object ROCR (rocm-systems development branch, `rocr-aie-hsaco.md`): AIE hsacos
    /// loaded with the executable API, packets naming a kernel object, chains split to fit,
    /// a failed batch suspends the queue and calls its error callback.
    KernelObject,
}

/// How a release reports a doorbell batch that failed (`rocr-aie.md` §5.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReport {
    /// ROCm 7.0 only `assert`s, and release builds compile that out: no callback, no
    /// suspension, the read index moves to the write index as if everything ran.
    Silent,
    /// ROCR throws `hsa_exception`; the C entry point turns it into `abort()`.
    Abort,
    /// The queue is suspended and its error callback called; with no callback, ROCR's
    /// default handler prints the error and aborts.
    Callback,
}

/// How a release turns one doorbell batch into driver command chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainPolicy {
    /// One chain of the batch's run of START_CU commands; a command's slot holds the CU mask
    /// and its `5 + 3N` payload dwords. Too long a chain fails.
    G1Unsplit,
    /// One chain of every packet in the batch; a command declares `count = 9 + 2N` (3 pad
    /// dwords) and its slot `arg_cnt = count − 1`. Too long a chain fails.
    G2Unsplit,
    /// Chains split to fit the 4 KiB buffer; `count = 7 + 2N` (1 pad dword), `arg_cnt =
    /// count − 1`. Any batch the ring holds runs.
    G2Split,
}

impl ChainPolicy {
    /// The bytes one command with `n` arguments takes in the driver's chain buffer: a 52-byte
    /// slot header and 4 bytes per `arg_cnt` dword (`rocr-aie.md` §7, `rocr-aie-hsaco.md` §4).
    pub fn command_bytes(self, n: u64) -> u64 {
        let arg_cnt = match self {
            Self::G1Unsplit => 1 + 5 + 3 * n,
            Self::G2Unsplit => 8 + 2 * n,
            Self::G2Split => 6 + 2 * n,
        };
        CHAIN_SLOT_HEADER_BYTES + 4 * arg_cnt
    }
}

/// The driver's command chain buffer (`MAX_CHAIN_CMDBUF_SIZE`).
pub const CHAIN_BUFFER_BYTES: u64 = 4096;
/// Bytes of a `cmd_chain_slot_npu` header.
pub const CHAIN_SLOT_HEADER_BYTES: u64 = 52;

/// ROCm 7.0's `WAIT_CMD` timeout (`DEFAULT_TIMEOUT_VAL`, `rocr-aie.md` §5.2).
pub const ROCM_7_0_WAIT: Duration = Duration::from_millis(50);

/// A build-version string for `name`: `hsa-sim <version> (software AIE agent, profile <name>)`.
macro_rules! build_version {
    ($name:literal) => {
        match CStr::from_bytes_with_nul(
            concat!(
                "hsa-sim ",
                env!("CARGO_PKG_VERSION"),
                " (software AIE agent, profile ",
                $name,
                ")\0"
            )
            .as_bytes(),
        ) {
            Ok(s) => s,
            Err(_) => panic!("the build version literal is NUL-terminated"),
        }
    };
}

const BUILD_PREFIX: &str = "hsa-sim ";
const PROFILE_MARK: &str = ", profile ";

impl Profile {
    /// Every profile, oldest first.
    pub const ALL: [Profile; 6] = [
        Profile::Rocm70,
        Profile::RocrLate2025,
        Profile::RocrG2May2026,
        Profile::RocrG2Jul2026,
        Profile::RocrNewest,
        Profile::KernelObject,
    ];

    /// The name users install and `HSA_SIM_PROFILE` takes.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Rocm70 => "rocm-7.0",
            Self::RocrLate2025 => "rocr-late-2025",
            Self::RocrG2May2026 => "rocr-g2-2026-05",
            Self::RocrG2Jul2026 => "rocr-g2-2026-07",
            Self::RocrNewest => "rocr-newest",
            Self::KernelObject => "kernel-object",
        }
    }

    /// What `HSA_AMD_SYSTEM_INFO_BUILD_VERSION` answers under this profile.
    pub const fn build_version(self) -> &'static CStr {
        match self {
            Self::Rocm70 => build_version!("rocm-7.0"),
            Self::RocrLate2025 => build_version!("rocr-late-2025"),
            Self::RocrG2May2026 => build_version!("rocr-g2-2026-05"),
            Self::RocrG2Jul2026 => build_version!("rocr-g2-2026-07"),
            Self::RocrNewest => build_version!("rocr-newest"),
            Self::KernelObject => build_version!("kernel-object"),
        }
    }

    /// The packet ABI this release speaks (`rocr-aie.md` §0).
    ///
    /// The kernel-object runtime uses G2's 64-byte layout with words 20/24 naming a kernel
    /// object instead of an instruction buffer ([`Profile::speaks_kernel_objects`]); hsa-core
    /// has no name of its own for that form yet, so it is reported as G2 here. A client that
    /// writes G2 packets to it is refused as real ROCR would refuse it.
    pub const fn packet_abi(self) -> PacketAbi {
        match self {
            Self::Rocm70 => PacketAbi::G1a,
            Self::RocrLate2025 => PacketAbi::G1b,
            Self::RocrG2May2026 | Self::RocrG2Jul2026 | Self::RocrNewest | Self::KernelObject => {
                PacketAbi::G2
            }
        }
    }

    /// Whether this release loads AIE hsacos with the executable API and reads words 20/24 of
    /// a packet as a kernel object (`rocr-aie-hsaco.md` §1, §3). The other releases have no
    /// AIE section loader: `hsa_executable_load_agent_code_object` fails there.
    pub const fn speaks_kernel_objects(self) -> bool {
        matches!(self, Self::KernelObject)
    }

    /// Whether `hsa_executable_load_agent_code_object` takes an AIE hsaco: the kernel-object
    /// runtime, and the July 2026 development runtime whose loader came before its packets named
    /// kernel objects (the G2-era suite @ `07ee4564` loads a `PdiInsts` hsaco and checks that
    /// `KERNEL_OBJECT` is 0 before freeze and non-zero after, while every dispatch of that suite
    /// writes G2 packets).
    pub const fn loads_code_objects(self) -> bool {
        matches!(self, Self::KernelObject | Self::RocrG2Jul2026)
    }

    /// Whether the loader takes `FullElf` kernels: not yet on the July 2026 runtime (its suite:
    /// "Full-ELF hsacos (kind = FullElf) are not supported by the loader yet").
    pub const fn loads_full_elf_code_objects(self) -> bool {
        matches!(self, Self::KernelObject)
    }

    /// Whether a G2 packet with a non-zero `pdi_patch_offset` (word 56) is a full-ELF dispatch
    /// (`rocr-aie.md` §2.1; ROCR's `core/driver/xdna/README.md` @ `159fb22f`, the driver's
    /// `BuildFullElfCommand`): the newest G2 runtimes and the July 2026 one. The first G2 release
    /// reads word 56 as reserved and runs the control code as an instruction stream.
    pub const fn g2_full_elf(self) -> bool {
        matches!(self, Self::RocrG2Jul2026 | Self::RocrNewest)
    }

    /// How a failed doorbell batch is reported (`rocr-aie.md` §5.6).
    pub const fn failure_report(self) -> FailureReport {
        match self {
            Self::Rocm70 => FailureReport::Silent,
            Self::RocrLate2025 | Self::RocrG2May2026 => FailureReport::Abort,
            Self::RocrG2Jul2026 | Self::RocrNewest | Self::KernelObject => FailureReport::Callback,
        }
    }

    /// How a doorbell batch becomes command chains (`rocr-aie.md` §5.2).
    pub const fn chain_policy(self) -> ChainPolicy {
        match self {
            Self::Rocm70 | Self::RocrLate2025 => ChainPolicy::G1Unsplit,
            Self::RocrG2May2026 => ChainPolicy::G2Unsplit,
            Self::RocrG2Jul2026 | Self::RocrNewest | Self::KernelObject => ChainPolicy::G2Split,
        }
    }

    /// The runtime's own limit on how long it waits for a command, if shorter waits than the
    /// driver's watchdog apply: 50 ms on ROCm 7.0, none later (`rocr-aie.md` §5.2).
    pub const fn command_wait_limit(self) -> Option<Duration> {
        match self {
            Self::Rocm70 => Some(ROCM_7_0_WAIT),
            _ => None,
        }
    }

    /// Whether the packet header is checked: the G1b header must be 0, and the newest G2
    /// header type READY with opcode KMQ. ROCm 7.0 only `assert`s its header (compiled out),
    /// and the first G2 release checks neither field (`rocr-aie.md` §2.2, §5.4).
    ///
    /// The kernel-object runtime checks the opcode but not the header type (its driver reads
    /// only the opcode, the descriptor and the kernargs; `rocr-aie-hsaco.md` §1): see
    /// [`Profile::speaks_kernel_objects`].
    pub const fn checks_packet_header(self) -> bool {
        matches!(
            self,
            Self::RocrLate2025 | Self::RocrG2Jul2026 | Self::RocrNewest
        )
    }

    /// The AIE agent's `HSA_AGENT_INFO_NAME`: ROCm 7.0 always says `aie2`; later releases
    /// name the generation (`rocr-aie.md` §3, PR #1459).
    pub fn agent_name(self, agent: NpuGen) -> &'static str {
        match self {
            Self::Rocm70 => "aie2",
            _ => agent.agent_name(),
        }
    }

    /// The AIE agent's `HSA_AMD_AGENT_INFO_PRODUCT_NAME`: ROCm 7.0 says `AIE-ML`; later
    /// releases read sysfs `vbnv` (`rocr-aie.md` §3).
    pub fn product_name(self, agent: NpuGen) -> &'static str {
        match self {
            Self::Rocm70 => "AIE-ML",
            _ => crate::config::product_name(agent),
        }
    }

    /// Whether `hsa_amd_vmem_map` accepts a handle from an AIE pool: the 2025 runtimes map
    /// only KFD memory (`rocr-aie.md` §4.2).
    pub const fn vmem_maps_aie_handles(self) -> bool {
        matches!(
            self,
            Self::RocrG2May2026 | Self::RocrG2Jul2026 | Self::RocrNewest | Self::KernelObject
        )
    }

    /// Whether `hsa_amd_vmem_import_shareable_handle` takes a foreign fd: the 2025 runtimes
    /// import only dmabufs of GPU regions, and the emulator has no GPU (`rocr-aie.md` §4.3).
    pub const fn vmem_imports(self) -> bool {
        matches!(
            self,
            Self::RocrG2May2026 | Self::RocrG2Jul2026 | Self::RocrNewest | Self::KernelObject
        )
    }

    /// Whether `hsa_amd_vmem_export_shareable_handle` exports a handle from an AIE pool:
    /// ROCR's own AIE memory test shows it in the newest ROCR (`rocr-aie-hsaco.md` §6); the
    /// 2025 runtimes export only KFD memory; for the first G2 release it is unconfirmed, so
    /// the emulator refuses it there.
    pub const fn vmem_exports_aie_handles(self) -> bool {
        matches!(
            self,
            Self::RocrG2Jul2026 | Self::RocrNewest | Self::KernelObject
        )
    }

    /// Whether `hsa_amd_pointer_info` knows AIE pool memory: ROCR's own AIE memory test
    /// (`test_memory.cc`, `PointerInfo`) shows the runtime asking the allocation's driver, so
    /// an AIE allocation is `HSA_EXT_POINTER_TYPE_HSA` owned by the AIE agent, in the
    /// kernel-object era and, *inferred*, the newest G2 release. ROCm 7.0's `Runtime::PtrInfo`
    /// asks KFD's thunk only, which does not know XDNA buffers (`UNKNOWN`); the first G2
    /// release is taken to do the same.
    pub const fn pointer_info_knows_aie_memory(self) -> bool {
        matches!(
            self,
            Self::RocrG2Jul2026 | Self::RocrNewest | Self::KernelObject
        )
    }

    /// Whether a doorbell checks every packet of its batch before any runs, so that a packet
    /// the runtime refuses (a malformed packet, an unknown buffer, a 33rd PDI, a dead signal)
    /// fails the whole batch with nothing retired. The newest ROCR builds the whole command
    /// list first and submits only then (ROCR's own AIE suites, `PdiCacheRolledBackOnFailedBatch`:
    /// "neither packet runs, so the signal keeps both of its counts"); the kernel-object
    /// runtime does the same. Older releases submit packet by packet. Device failures (a
    /// fault, a hang, a wrong generation) still retire the packets ahead of them.
    pub const fn checks_whole_batch_first(self) -> bool {
        matches!(
            self,
            Self::RocrG2Jul2026 | Self::RocrNewest | Self::KernelObject
        )
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A profile name the emulator does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownProfile(pub String);

impl fmt::Display for UnknownProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Profile::ALL.iter().map(|p| p.as_str()).collect();
        write!(
            f,
            "unknown hsa-sim profile {:?}; expected one of {}",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownProfile {}

impl FromStr for Profile {
    type Err = UnknownProfile;

    /// Exactly the names of [`Profile::as_str`], ignoring surrounding space and case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let want = s.trim();
        Profile::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(want))
            .ok_or_else(|| UnknownProfile(s.to_owned()))
    }
}

/// The profile named in an `HSA_AMD_SYSTEM_INFO_BUILD_VERSION` string, or `None` when the
/// string is not hsa-sim's: how a program that loaded some `libhsa-runtime64.so` tells that it
/// is the emulator, and which ROCR release it plays.
pub fn profile_of_build_version(s: &str) -> Option<Profile> {
    let rest = s.strip_prefix(BUILD_PREFIX)?;
    let (_, tail) = rest.split_once(PROFILE_MARK)?;
    tail.strip_suffix(')')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for p in Profile::ALL {
            assert_eq!(p.to_string().parse::<Profile>(), Ok(p));
        }
        assert_eq!(" ROCM-7.0 ".parse::<Profile>(), Ok(Profile::Rocm70));
        let e = "rocm-7.1".parse::<Profile>().unwrap_err();
        assert!(e.to_string().contains("rocr-newest"), "{e}");
        assert_eq!(Profile::default(), Profile::RocrNewest);
    }

    #[test]
    fn the_build_version_names_the_profile() {
        for p in Profile::ALL {
            let s = p.build_version().to_str().unwrap();
            assert!(s.starts_with("hsa-sim "), "{s}");
            assert!(
                s.ends_with(&format!("(software AIE agent, profile {p})")),
                "{s}"
            );
            assert_eq!(profile_of_build_version(s), Some(p));
        }
        assert_eq!(profile_of_build_version("ROCR 1.18.0"), None);
        assert_eq!(
            profile_of_build_version("hsa-sim 0.1.0 (software AIE agent)"),
            None
        );
    }

    #[test]
    fn chain_costs_match_the_measured_limits() {
        let fit = |p: ChainPolicy, n: u64| CHAIN_BUFFER_BYTES / p.command_bytes(n);
        // IRON measured 40 commands of two arguments on G1 and the first G2 (41 failed).
        assert_eq!(fit(ChainPolicy::G1Unsplit, 2), 40);
        assert_eq!(fit(ChainPolicy::G2Unsplit, 2), 40);
        assert_eq!(fit(ChainPolicy::G2Unsplit, 6), 31);
        assert_eq!(fit(ChainPolicy::G1Unsplit, 6), 27);
        // The newest driver fits 44 (PDI + insts, two arguments).
        assert_eq!(fit(ChainPolicy::G2Split, 2), 44);
    }
}
