//! [`Program`]: a design's `main.pdi` and `insts.bin`, checked on the client, registered once
//! per session and reused.
//!
//! A `Program` holds bytes and knows nothing of a daemon. The first dispatch of it through a
//! [`crate::Client`] registers it (or call [`crate::Client::register`] up front); the client
//! remembers the daemon's program id for every clone of the `Program`, so later dispatches send
//! only the id. The daemon stores identical bytes once whichever session registers them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use npu_artifacts::NpuGen;
use npu_artifacts::design::{self, Design};
use npu_artifacts::emu::{EmuDesign, EmuKernel};
use npu_artifacts::pdi::PdiKind;
use npu_artifacts::txn::TxnProgram;
use npu_proto::v1 as pb;

use crate::ClientError;

static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A design's program: `main.pdi` plus `insts.bin`. Cheap to clone (clones share the bytes and
/// the registration).
#[derive(Debug, Clone)]
pub struct Program {
    data: Arc<ProgramData>,
}

#[derive(Debug)]
struct ProgramData {
    key: u64,
    name: String,
    pdi: Vec<u8>,
    insts: Vec<u8>,
    dir: Option<PathBuf>,
    kind: PdiKind,
    txn: TxnProgram,
}

impl Program {
    /// Reads `dir/main.pdi` and `dir/insts.bin` (or the same under `dir/build`, where IRON's
    /// Makefiles leave them) and checks them as the daemon will.
    ///
    /// The program is named after the directory.
    ///
    /// # Errors
    ///
    /// [`ClientError::Artifact`] naming every path tried when a file is missing, or the file and
    /// the rule it breaks when one is malformed.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Program, ClientError> {
        let dir = dir.as_ref();
        let d = Design::open(dir)?;
        let name = dir
            .canonicalize()
            .ok()
            .as_deref()
            .unwrap_or(dir)
            .file_name()
            .map_or_else(|| "design".to_owned(), |n| n.to_string_lossy().into_owned());
        Ok(Self::build(
            name,
            d.pdi,
            d.insts,
            Some(d.files.dir),
            d.kind,
            d.program,
        ))
    }

    /// A program from bytes, checked as the daemon will check them.
    ///
    /// # Errors
    ///
    /// [`ClientError::Artifact`] when the PDI or the instruction stream is malformed or they
    /// disagree.
    pub fn from_bytes(
        name: impl Into<String>,
        pdi: Vec<u8>,
        insts: Vec<u8>,
    ) -> Result<Program, ClientError> {
        let (kind, txn) = design::check_pair(&pdi, &insts)?;
        Ok(Self::build(name.into(), pdi, insts, None, kind, txn))
    }

    /// The program of an emulated design for the given generation (see
    /// [`crate::Client::generation`]).
    ///
    /// # Errors
    ///
    /// [`ClientError::Artifact`] when the design's parameters do not validate.
    pub fn emulated(design: &EmuDesign, generation: NpuGen) -> Result<Program, ClientError> {
        design.validate()?;
        Self::from_bytes(
            design.kernel.name(),
            design.to_pdi(),
            design.insts(generation),
        )
    }

    fn build(
        mut name: String,
        pdi: Vec<u8>,
        insts: Vec<u8>,
        dir: Option<PathBuf>,
        kind: PdiKind,
        txn: TxnProgram,
    ) -> Program {
        if name.len() > 128 {
            let mut cut = 128;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name.truncate(cut);
        }
        Program {
            data: Arc::new(ProgramData {
                key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
                name,
                pdi,
                insts,
                dir,
                kind,
                txn,
            }),
        }
    }

    /// The name sent to the daemon (for listings and statistics).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.data.name
    }

    /// `main.pdi`.
    #[must_use]
    pub fn pdi(&self) -> &[u8] {
        &self.data.pdi
    }

    /// `insts.bin`.
    #[must_use]
    pub fn insts(&self) -> &[u8] {
        &self.data.insts
    }

    /// The directory the files came from, for [`Program::from_dir`].
    #[must_use]
    pub fn dir(&self) -> Option<&Path> {
        self.data.dir.as_deref()
    }

    /// What the PDI is (an emulated design, a partial PDI).
    #[must_use]
    pub fn kind(&self) -> &PdiKind {
        &self.data.kind
    }

    /// The validated instruction stream: generation, buffer arguments and their minimum sizes.
    #[must_use]
    pub fn txn(&self) -> &TxnProgram {
        &self.data.txn
    }

    /// The emulated design, when the PDI is one.
    #[must_use]
    pub fn emulated_design(&self) -> Option<&EmuDesign> {
        match &self.data.kind {
            PdiKind::Emulated(d) => Some(d),
            _ => None,
        }
    }

    /// How many leading arguments the design only reads, as far as the library can tell: an
    /// emulated design's inputs (every argument of `noop`). For any other program 0: the
    /// library cannot see which buffers a real design's device code writes, so every argument
    /// goes in `writes`.
    #[must_use]
    pub fn read_only_args(&self) -> usize {
        let Some(d) = self.emulated_design() else {
            return 0;
        };
        match d.kernel {
            EmuKernel::Noop => usize::from(d.num_args),
            EmuKernel::VectorVectorAdd | EmuKernel::VectorMul | EmuKernel::Matmul => 2,
            EmuKernel::Passthrough
            | EmuKernel::VectorScalarAdd
            | EmuKernel::Relu
            | EmuKernel::Fault
            | EmuKernel::Hang => 1,
        }
    }

    pub(crate) fn key(&self) -> u64 {
        self.data.key
    }
}

/// What the daemon said when it registered a program.
#[derive(Debug, Clone)]
pub struct ProgramInfo {
    /// The program id in this session.
    pub id: u64,
    /// blake3 of the PDI and instruction stream, hex.
    pub content_hash: String,
    /// False when another session had already stored the same bytes.
    pub newly_stored: bool,
    /// The daemon's summary (generation, argument count and sizes, kind).
    pub summary: Option<pb::ProgramSummary>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use npu_artifacts::emu::DType;

    #[test]
    fn missing_insts_names_the_paths_tried() {
        let dir = tempfile::tempdir().unwrap();
        let d = EmuDesign::vector_scalar_add(64, DType::I32, 1);
        d.write_dir(dir.path(), NpuGen::Npu2).unwrap();
        std::fs::remove_file(dir.path().join("insts.bin")).unwrap();
        let e = Program::from_dir(dir.path()).unwrap_err().to_string();
        let t = dir.path().display();
        assert!(e.contains("insts.bin missing"), "{e}");
        assert!(e.contains(&format!("{t}/insts.bin")), "{e}");
        assert!(e.contains(&format!("{t}/build/insts.bin")), "{e}");
    }

    #[test]
    fn clones_share_a_key_and_programs_differ() {
        let d = EmuDesign::vector_scalar_add(64, DType::I32, 1);
        let a = Program::emulated(&d, NpuGen::Npu1).unwrap();
        let b = Program::emulated(&d, NpuGen::Npu1).unwrap();
        assert_eq!(a.clone().key(), a.key());
        assert_ne!(a.key(), b.key());
        assert_eq!(a.name(), "vector_scalar_add");
        assert_eq!(a.txn().arg_count(), 2);
    }

    #[test]
    fn read_only_args_are_an_emulated_designs_inputs() {
        let g = NpuGen::Npu1;
        let args = |d: EmuDesign| Program::emulated(&d, g).unwrap().read_only_args();
        assert_eq!(args(EmuDesign::vector_scalar_add(64, DType::I32, 1)), 1);
        assert_eq!(
            args(EmuDesign::passthrough(64)),
            1,
            "the trace slot may be written"
        );
        assert_eq!(args(EmuDesign::vector_vector_add(64, DType::I32)), 2);
        assert_eq!(args(EmuDesign::matmul(8, 8, 8, DType::I16, DType::I32)), 2);
        assert_eq!(
            args(EmuDesign::hang(64)),
            1,
            "a faulting kernel may have written"
        );
        assert_eq!(args(EmuDesign::noop(3, 64)), 3, "noop writes nothing");
    }

    #[test]
    fn from_bytes_refuses_mismatched_files() {
        let d = EmuDesign::vector_vector_add(64, DType::I32);
        let other = EmuDesign::relu(64, DType::I32);
        let e = Program::from_bytes("x", d.to_pdi(), other.insts(NpuGen::Npu1)).unwrap_err();
        assert!(e.to_string().contains("disagree"), "{e}");
    }
}
