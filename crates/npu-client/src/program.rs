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
use npu_artifacts::hsaco::{Hsaco, KernelKind};
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
    /// The PDI and instruction stream (of the hsaco's kernel, when it is a PdiInsts kernel;
    /// empty for a FullElf kernel).
    pdi: Vec<u8>,
    insts: Vec<u8>,
    dir: Option<PathBuf>,
    /// What the PDI is; `None` for a FullElf kernel whose control code is not an emulated
    /// design.
    kind: Option<PdiKind>,
    txn: TxnProgram,
    /// Registered as this hsaco and kernel rather than as the PDI and instruction stream.
    hsaco: Option<HsacoCode>,
}

/// An AIE hsaco and the kernel of it a program runs.
#[derive(Debug)]
pub(crate) struct HsacoCode {
    pub(crate) bytes: Vec<u8>,
    pub(crate) kernel: String,
    pub(crate) kind: KernelKind,
    /// Buffer arguments a FullElf kernel takes (its instruction stream is not a TXN).
    pub(crate) full_elf_args: u32,
}

/// Where [`Program::from_hsaco`] reads an hsaco from: a file, or bytes already in memory.
#[derive(Debug, Clone)]
pub enum HsacoSource {
    Path(PathBuf),
    Bytes(Vec<u8>),
}

impl From<&Path> for HsacoSource {
    fn from(p: &Path) -> Self {
        Self::Path(p.to_path_buf())
    }
}

impl From<PathBuf> for HsacoSource {
    fn from(p: PathBuf) -> Self {
        Self::Path(p)
    }
}

impl From<&PathBuf> for HsacoSource {
    fn from(p: &PathBuf) -> Self {
        Self::Path(p.clone())
    }
}

impl From<Vec<u8>> for HsacoSource {
    fn from(b: Vec<u8>) -> Self {
        Self::Bytes(b)
    }
}

impl From<&[u8]> for HsacoSource {
    fn from(b: &[u8]) -> Self {
        Self::Bytes(b.to_vec())
    }
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
            Some(d.kind),
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
        Ok(Self::build(name.into(), pdi, insts, None, Some(kind), txn))
    }

    /// Kernel `kernel` of an AIE hsaco (`kernel` may be empty when the file has one kernel).
    /// The file is checked against ROCR's loader rules here; the daemon checks it again for
    /// its device's arch. A PdiInsts kernel runs on every runtime npud supports (npud unpacks
    /// it where the runtime does not load code objects); a FullElf kernel only where it does.
    ///
    /// # Errors
    ///
    /// [`ClientError::Io`] for an unreadable file; [`ClientError::Invalid`] for a format rule
    /// the file breaks (named with its offset) or a kernel the file lacks (listing those it
    /// has); a PdiInsts kernel's PDI and instruction stream are checked as
    /// [`Program::from_bytes`] checks them.
    pub fn from_hsaco(
        source: impl Into<HsacoSource>,
        kernel: &str,
    ) -> Result<Program, ClientError> {
        let (bytes, from) = match source.into() {
            HsacoSource::Path(p) => (
                std::fs::read(&p).map_err(|source| ClientError::Io {
                    path: p.clone(),
                    source,
                })?,
                Some(p),
            ),
            HsacoSource::Bytes(b) => (b, None),
        };
        let at = || {
            from.as_ref()
                .map_or_else(|| "hsaco".to_owned(), |p| p.display().to_string())
        };
        let parsed =
            Hsaco::parse(&bytes).map_err(|e| ClientError::Invalid(format!("{}: {e}", at())))?;
        let mut names: Vec<&str> = parsed
            .sections
            .iter()
            .flat_map(|s| s.kernels.iter().map(|k| k.name))
            .collect();
        names.dedup();
        let kernel = match (kernel, names.as_slice()) {
            ("", [only]) => (*only).to_owned(),
            ("", _) => {
                return Err(ClientError::Invalid(format!(
                    "{}: name a kernel; it has {names:?}",
                    at()
                )));
            }
            (k, _) if names.contains(&k) => k.to_owned(),
            (k, _) => {
                return Err(ClientError::Invalid(format!(
                    "{}: no kernel {k:?}; it has {names:?}",
                    at()
                )));
            }
        };
        // The first section holding the kernel describes it (every arch's copy has the same
        // arguments).
        let k = parsed
            .sections
            .iter()
            .find_map(|s| s.kernel(&kernel))
            .ok_or_else(|| ClientError::Invalid(format!("{}: no kernel {kernel:?}", at())))?;
        let (pdi, insts, kind, txn, full_elf_args) = match (&k.pdi, &k.full_elf) {
            (Some(pdi), _) => {
                let (kind, txn) = design::check_pair(pdi.bytes, k.insts.bytes)?;
                (
                    pdi.bytes.to_vec(),
                    k.insts.bytes.to_vec(),
                    Some(kind),
                    txn,
                    0,
                )
            }
            (None, Some(elf)) => {
                // A FullElf kernel has no TXN stream: describe its arguments with an empty one.
                let txn = TxnProgram {
                    version: (0, 0),
                    generation: NpuGen::Npu2,
                    rows: 0,
                    cols: u8::try_from(k.num_cols).unwrap_or(u8::MAX),
                    mem_tile_rows: 0,
                    op_count: 0,
                    size_bytes: 0,
                    args: Vec::new(),
                };
                // An emulated full ELF carries an emulated design where a real one carries
                // control code.
                let kind = EmuDesign::from_full_elf_kernel(elf)
                    .ok()
                    .map(PdiKind::Emulated);
                (Vec::new(), Vec::new(), kind, txn, elf.arg_count)
            }
            _ => {
                return Err(ClientError::Invalid(format!(
                    "{}: kernel {kernel:?} has neither a PDI nor a full ELF",
                    at()
                )));
            }
        };
        let code = HsacoCode {
            kind: k.kind,
            kernel: kernel.clone(),
            bytes: Vec::new(),
            full_elf_args,
        };
        let name = from
            .as_deref()
            .and_then(Path::file_stem)
            .map_or_else(|| kernel.clone(), |s| s.to_string_lossy().into_owned());
        let mut p = Self::build(name, pdi, insts, None, kind, txn);
        let data = Arc::get_mut(&mut p.data).ok_or_else(|| {
            ClientError::Invalid("a new program is shared before it is built".into())
        })?;
        data.hsaco = Some(HsacoCode { bytes, ..code });
        data.dir = from.and_then(|p| p.parent().map(Path::to_path_buf));
        Ok(p)
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
        kind: Option<PdiKind>,
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
                hsaco: None,
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
    pub fn kind(&self) -> Option<&PdiKind> {
        self.data.kind.as_ref()
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
            Some(PdiKind::Emulated(d)) => Some(d),
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
            // One buffer, read and written in place.
            EmuKernel::VectorScalarMul | EmuKernel::VectorScalarAddInPlace => 0,
            // (in, factor, out): both inputs lead.
            EmuKernel::VectorScaleMid
            | EmuKernel::VectorVectorAdd
            | EmuKernel::VectorMul
            | EmuKernel::Matmul => 2,
            // (in, out, factor): only `in` leads; the factor counts as written.
            EmuKernel::VectorScale => 1,
            // (in, unused, out): the unused buffer counts as written.
            EmuKernel::Passthrough
            | EmuKernel::VectorScalarAddUnused
            | EmuKernel::VectorScalarAdd
            | EmuKernel::Relu
            | EmuKernel::Fault
            | EmuKernel::Hang => 1,
        }
    }

    /// The hsaco kernel's name, when the program came from an hsaco.
    #[must_use]
    pub fn hsaco_kernel(&self) -> Option<&str> {
        self.data.hsaco.as_ref().map(|h| h.kernel.as_str())
    }

    /// The smallest size of each buffer argument, in order: what the instruction stream's DDR
    /// patches need, or for a FullElf kernel one byte per argument.
    #[must_use]
    pub fn min_arg_sizes(&self) -> Vec<u64> {
        match &self.data.hsaco {
            Some(h) if h.kind == KernelKind::FullElf => vec![1; h.full_elf_args as usize],
            _ => self.data.txn.min_arg_sizes(),
        }
    }

    pub(crate) fn hsaco(&self) -> Option<&HsacoCode> {
        self.data.hsaco.as_ref()
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
    fn from_hsaco_takes_a_file_or_bytes_and_names_what_is_wrong() {
        let d = EmuDesign::vector_scalar_add(64, DType::I32, 1);
        let bytes = d.to_hsaco(NpuGen::Npu2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vsa.hsaco");
        std::fs::write(&path, &bytes).unwrap();
        let p = Program::from_hsaco(&path, "").unwrap();
        assert_eq!(p.name(), "vsa");
        assert_eq!(p.hsaco_kernel(), Some("vector_scalar_add"));
        assert_eq!(p.min_arg_sizes(), vec![256, 256]);
        assert_eq!(p.emulated_design(), Some(&d));
        let q = Program::from_hsaco(bytes.clone(), "vector_scalar_add").unwrap();
        assert_eq!(q.pdi(), p.pdi());
        let e = Program::from_hsaco(bytes, "relu").unwrap_err().to_string();
        assert!(
            e.contains("no kernel \"relu\"") && e.contains("vector_scalar_add"),
            "{e}"
        );
        let e = Program::from_hsaco(dir.path().join("missing.hsaco"), "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.hsaco"), "{e}");
        let e = Program::from_hsaco(b"\x7fELF".as_slice(), "")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("hsaco: "), "{e}");
        let full = Program::from_hsaco(d.to_full_elf_hsaco().unwrap(), "").unwrap();
        assert_eq!(full.min_arg_sizes(), vec![1, 1]);
        assert_eq!(full.emulated_design(), Some(&d));
    }

    #[test]
    fn from_bytes_refuses_mismatched_files() {
        let d = EmuDesign::vector_vector_add(64, DType::I32);
        let other = EmuDesign::relu(64, DType::I32);
        let e = Program::from_bytes("x", d.to_pdi(), other.insts(NpuGen::Npu1)).unwrap_err();
        assert!(e.to_string().contains("disagree"), "{e}");
    }
}
