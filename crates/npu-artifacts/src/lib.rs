//! IRON's NPU artifacts: parsing, validation and explanation.
//!
//! A daemon that many processes share must never hand the device a malformed program: on real
//! hardware a bad instruction stream hangs the NPU until the driver's watchdog fires, and can wedge
//! it for every process. This crate is the one place in npud that reads a design's files:
//!
//! - [`txn`]: the `insts.bin` transaction (TXN) stream. [`txn::TxnProgram::parse`] validates the
//!   header, walks every operation and describes the program: generation, array shape, op count
//!   and, for every buffer argument the DDR patches use, the byte offsets it is patched with and
//!   the smallest buffer that fits. [`txn::TxnProgram::check_buffers`] refuses a dispatch with too
//!   few or too small buffers before it reaches the device. [`txn::listing`] explains a stream op
//!   by op (for `npuctl inspect`); [`txn::explain`] does so for a refused stream too.
//! - [`pdi`]: `main.pdi`. [`pdi::identify`] recognizes a partial PDI ("PPDI") and verifies its
//!   header checksums, recognizes an xclbin (see [`xclbin`], which also finds and verifies the PDI
//!   its `AIE_PARTITION` section embeds) and reads emulated designs.
//! - [`emu`]: the emulated-design format, a small `main.pdi` that names a reference kernel for the
//!   software NPU (hsa-sim), with a writer for whole design directories.
//! - [`hsaco`]: ROCR's AIE hsaco (the code object its executable API loads on an NPU agent):
//!   [`hsaco::parse_for_arch`] validates a section as ROCR's loader does, naming the broken rule
//!   and its offsets; [`hsaco::HsacoBuilder`] packs `PdiInsts` kernels and full ELFs.
//! - [`design`]: design directories (`main.pdi` + `insts.bin`, also under `build/`), and
//!   [`design::check_pair`], the registration check npud runs on uploaded bytes.
//!
//! The crate does no I/O beyond reading (and, for [`emu::EmuDesign::write_dir`], writing) the
//! files it is pointed at, and never panics on input.
//!
//! # Cost
//!
//! Cost is part of each parser's contract, stated under `# Cost` on every function that takes
//! untrusted bytes: whatever the bytes say, a parse allocates at most a small multiple of the
//! input and does work near-linear in it. Names are borrowed from the input, counts are checked
//! against the bytes that must hold them before anything is allocated, and work that entries
//! sharing data could multiply (one long name under many headers, one blob under many entries)
//! is charged to a budget of a few units per input byte, past which the parser refuses the
//! input with [`ArtifactError::OverLimit`]. `tests/cost.rs` holds every parser to at most
//! 8 bytes per input byte (plus 1 MiB) on inputs built to break that, and the fuzz targets check
//! the same bound on every input they try.
//!
//! # The emulated `main.pdi` format (version 1)
//!
//! A fixed 80-byte little-endian header and nothing else. Real PDIs start with the SMAP pattern
//! `dd 00 00 00 44 33 22 11`, xclbins with `xclbin2\0`; the magic `NPUD-EMU` collides with
//! neither, and the kernel name is plain ASCII so `xxd main.pdi` shows what the design does.
//!
//! | Offset | Size | Field | Value |
//! |---:|---:|---|---|
//! | 0 | 8 | magic | ASCII `NPUD-EMU` |
//! | 8 | 2 | format version | `1` |
//! | 10 | 2 | header length | `80` (the whole file) |
//! | 12 | 32 | kernel | ASCII name, NUL-padded (`passthrough`, `vector_scalar_add`, `vector_scalar_add_inplace`, `vector_scalar_add_unused`, `vector_scalar_mul`, `vector_scale`, `vector_scale_mid`, `vector_vector_add`, `vector_mul`, `relu`, `matmul`, `noop`, `fault`, `hang`) |
//! | 44 | 1 | dtype_in | code, see below |
//! | 45 | 1 | dtype_out | code |
//! | 46 | 1 | num_args | number of buffer arguments |
//! | 47 | 1 | reserved | `0` |
//! | 48 | 4 | m | u32 (matmul rows of A and C; otherwise 0) |
//! | 52 | 4 | k | u32 (matmul inner dimension; otherwise 0) |
//! | 56 | 4 | n | u32 (matmul columns of B and C; element count for elementwise kernels; bytes per buffer for `noop`) |
//! | 60 | 4 | reserved | `0` |
//! | 64 | 8 | scalar | i64 (the `vector_scalar_add` kernels' addend, `vector_scalar_mul`'s factor; otherwise 0) |
//! | 72 | 4 | reserved | `0` |
//! | 76 | 4 | checksum | CRC-32 (IEEE 802.3, as in zlib) of bytes 0..76 |
//!
//! Dtype codes: 1 `u8`, 2 `i8`, 3 `i16`, 4 `i32`, 5 `u32`, 6 `f32`, 7 `bf16`.
//!
//! A reader rejects, each with its own message: a wrong magic, an unknown format version, a header
//! length other than 80 or a file of another length, a checksum that does not verify, an unknown
//! kernel name or one not NUL-padded, an unknown dtype code, non-zero reserved bytes, and
//! parameters the kernel does not accept ([`emu::EmuDesign::validate`]).
//!
//! Kernels, their buffers (in argument order) and semantics follow IRON's programming examples;
//! see [`emu::EmuKernel`].

#![forbid(unsafe_code)]

mod budget;
pub mod design;
pub mod emu;
mod error;
pub mod hsaco;
mod le;
pub mod pdi;
pub mod txn;
pub mod xclbin;

pub use error::ArtifactError;

use std::fmt;

/// The NPU generation a program is built for.
///
/// TXN streams record it as the device generation byte: 3 for npu1 (Phoenix, Hawk Point; AIE2,
/// HSA agent name `aie2`), 4 for npu2 (Strix, Strix Halo, Krackan; AIE2P, agent name `aie2p`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NpuGen {
    /// npu1: Phoenix and Hawk Point (AIE2).
    Npu1,
    /// npu2: Strix, Strix Halo and Krackan (AIE2P).
    Npu2,
}

impl NpuGen {
    /// The device generation byte in a TXN header.
    #[must_use]
    pub fn txn_dev_gen(self) -> u8 {
        match self {
            Self::Npu1 => 3,
            Self::Npu2 => 4,
        }
    }

    /// The generation a TXN header's device generation byte names.
    #[must_use]
    pub fn from_txn_dev_gen(dev_gen: u8) -> Option<Self> {
        match dev_gen {
            3 => Some(Self::Npu1),
            4 => Some(Self::Npu2),
            _ => None,
        }
    }

    /// The HSA agent name ROCR reports for this generation.
    #[must_use]
    pub fn agent_name(self) -> &'static str {
        match self {
            Self::Npu1 => "aie2",
            Self::Npu2 => "aie2p",
        }
    }

    /// The generation an agent name (or a common product name) stands for, case-insensitively:
    /// `aie2p`, `strix`, `krackan`, `npu2` are npu2; `aie2`, `phoenix`, `npu1` are npu1.
    ///
    /// Names are matched as prefixes (so `aie2p_xyz` and `strix_halo` work), `aie2p` before `aie2`.
    #[must_use]
    pub fn from_agent_name(name: &str) -> Option<Self> {
        let name = name.trim().to_ascii_lowercase();
        const NPU2: [&str; 4] = ["aie2p", "strix", "krackan", "npu2"];
        const NPU1: [&str; 4] = ["aie2", "phoenix", "hawk", "npu1"];
        if NPU2.iter().any(|p| name.starts_with(p)) {
            Some(Self::Npu2)
        } else if NPU1.iter().any(|p| name.starts_with(p)) {
            Some(Self::Npu1)
        } else {
            None
        }
    }

    /// Array shape recorded in TXN headers written for this generation:
    /// (rows including the shim row, columns, memory-tile rows).
    #[must_use]
    pub fn array_shape(self) -> (u8, u8, u8) {
        match self {
            Self::Npu1 => (6, 5, 1),
            Self::Npu2 => (6, 8, 1),
        }
    }
}

impl fmt::Display for NpuGen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Npu1 => f.write_str("npu1 (aie2)"),
            Self::Npu2 => f.write_str("npu2 (aie2p)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_codes_round_trip() {
        for g in [NpuGen::Npu1, NpuGen::Npu2] {
            assert_eq!(NpuGen::from_txn_dev_gen(g.txn_dev_gen()), Some(g));
            assert_eq!(NpuGen::from_agent_name(g.agent_name()), Some(g));
        }
        assert_eq!(NpuGen::from_txn_dev_gen(2), None);
        assert_eq!(NpuGen::from_txn_dev_gen(5), None);
    }

    #[test]
    fn agent_names_check_aie2p_before_aie2() {
        assert_eq!(NpuGen::from_agent_name("AIE2P"), Some(NpuGen::Npu2));
        assert_eq!(NpuGen::from_agent_name("aie2"), Some(NpuGen::Npu1));
        assert_eq!(NpuGen::from_agent_name("Strix"), Some(NpuGen::Npu2));
        assert_eq!(NpuGen::from_agent_name("krackan"), Some(NpuGen::Npu2));
        assert_eq!(NpuGen::from_agent_name("npu2"), Some(NpuGen::Npu2));
        assert_eq!(NpuGen::from_agent_name("Phoenix"), Some(NpuGen::Npu1));
        assert_eq!(NpuGen::from_agent_name("npu1"), Some(NpuGen::Npu1));
        assert_eq!(NpuGen::from_agent_name("gfx1100"), None);
        assert_eq!(NpuGen::from_agent_name(""), None);
    }
}
