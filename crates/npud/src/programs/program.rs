//! [`Program`]: one stored program, the form it was registered in, and its content hash.

use npu_artifacts::hsaco::KernelKind;
use npu_proto::v1 as pb;

use crate::error::NpudError;

/// A stored program: its bytes and what the daemon needs to know to check a dispatch.
#[derive(Debug)]
pub struct Program {
    pub id: u64,
    /// [`content_hash`] of its bytes, hex.
    pub hash: String,
    pub name: String,
    pub code: Code,
    pub summary: pb::ProgramSummary,
}

/// The form a program was registered in. The device layer turns either into what the runtime
/// loads: on a kernel-object runtime PDI+insts are packed into an hsaco in memory; on the
/// others an hsaco's PdiInsts kernel is unpacked.
#[derive(Debug)]
pub enum Code {
    PdiInsts {
        pdi: Vec<u8>,
        insts: Vec<u8>,
    },
    /// An AIE hsaco and the kernel of it this program runs (resolved at registration).
    Hsaco {
        bytes: Vec<u8>,
        kernel: String,
    },
}

/// `pdi+insts` or `hsaco`, as listings show it.
pub const FORM_PDI_INSTS: &str = "pdi+insts";
pub const FORM_HSACO: &str = "hsaco";

impl Program {
    /// Refuses arguments that are fewer or smaller than the program's DDR patches require, and
    /// for a FullElf kernel any other count than its ELF's: the runtime refuses such a packet
    /// (`INVALID_PACKET_FORMAT`), where a PdiInsts kernel ignores arguments its instruction
    /// stream does not patch. `sizes` are the byte lengths of the arguments; `field` names them
    /// (`args`, `links[2].args`).
    ///
    /// # Errors
    /// INVALID_ARGUMENT naming the argument.
    pub fn check_args(
        &self,
        sizes: &[u64],
        field: impl std::fmt::Display,
    ) -> Result<(), NpudError> {
        let need = &self.summary.min_arg_bytes;
        if self.is_full_elf() && sizes.len() != need.len() {
            return Err(NpudError::InvalidArgument(format!(
                "{field}: program {} ({}) is a FullElf kernel that takes exactly {} buffer \
                 arguments; {} given",
                self.id,
                self.display_name(),
                need.len(),
                sizes.len()
            )));
        }
        if sizes.len() < need.len() {
            return Err(NpudError::InvalidArgument(format!(
                "{field}: program {} ({}) takes {} buffer arguments; {} given",
                self.id,
                self.display_name(),
                need.len(),
                sizes.len()
            )));
        }
        for (i, (&have, &min)) in sizes.iter().zip(need).enumerate() {
            if have < min {
                return Err(NpudError::InvalidArgument(format!(
                    "{field}[{i}]: {have} bytes, but program {} ({}) needs at least {min} \
                     (its instruction stream patches that many)",
                    self.id,
                    self.display_name()
                )));
            }
        }
        Ok(())
    }

    /// Whether it is an hsaco's FullElf kernel (kernel-object runtimes only).
    pub fn is_full_elf(&self) -> bool {
        self.summary.kernel_kind == KernelKind::FullElf.name()
    }

    /// The bytes it holds: PDI plus instruction stream, or the hsaco.
    pub fn byte_len(&self) -> u64 {
        match &self.code {
            Code::PdiInsts { pdi, insts } => (pdi.len() as u64).saturating_add(insts.len() as u64),
            Code::Hsaco { bytes, .. } => bytes.len() as u64,
        }
    }

    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            &self.summary.kind
        } else {
            &self.name
        }
    }
}

/// The content hash of a program's bytes.
pub fn content_hash(pdi: &[u8], insts: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    hash_pausing(&mut h, pdi);
    hash_pausing(&mut h, insts);
    h.finalize().to_hex().to_string()
}

/// How many bytes are hashed between two [`crate::bulk::pause`] points (tens of µs).
const HASH_PIECE: usize = 64 << 10;

/// `h.update(bytes)`, a piece at a time between pause points: registration hashes megabytes
/// as bulk work.
fn hash_pausing(h: &mut blake3::Hasher, bytes: &[u8]) {
    for piece in bytes.chunks(HASH_PIECE) {
        h.update(piece);
        crate::bulk::pause();
    }
}

/// The content hash of an hsaco kernel: a domain tag, the kernel name (length-prefixed) and
/// the file, so that it can equal no PDI+insts hash and two kernels of one file differ.
pub fn hsaco_hash(bytes: &[u8], kernel: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"npud hsaco\0");
    h.update(&(kernel.len() as u64).to_le_bytes());
    h.update(kernel.as_bytes());
    hash_pausing(&mut h, bytes);
    h.finalize().to_hex().to_string()
}
