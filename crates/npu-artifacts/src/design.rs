//! Design directories and the registration check.
//!
//! A design is `main.pdi` plus `insts.bin`, as IRON's `aiecc --get-pdi --get-npu-insts` writes
//! them. [`Design::open`] looks in the directory itself and then in its `build/` subdirectory
//! (where IRON's Makefiles leave them), takes both files from the same place, and reports every
//! path it tried and exactly which file is missing or malformed. [`check_pair`] is the check npud
//! runs on uploaded bytes before a program is registered.

use crate::ArtifactError;
use crate::pdi::{self, PdiKind};
use crate::txn::TxnProgram;
use std::path::{Path, PathBuf};

/// File name of the PDI.
pub const PDI_NAME: &str = "main.pdi";
/// File name of the instruction stream.
pub const INSTS_NAME: &str = "insts.bin";
/// Largest `main.pdi` (or xclbin) read: real PDIs are a few KB, xclbins a few MB.
pub const MAX_PDI_BYTES: u64 = 64 << 20;
/// Largest `insts.bin` read: real streams are hundreds of bytes to a few KB.
pub const MAX_INSTS_BYTES: u64 = 16 << 20;

/// Where a design's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesignFiles {
    /// The directory holding both files (the opened directory or its `build/`).
    pub dir: PathBuf,
    /// `main.pdi`.
    pub pdi_path: PathBuf,
    /// `insts.bin`.
    pub insts_path: PathBuf,
}

/// A design read from disk and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Design {
    /// Where it came from.
    pub files: DesignFiles,
    /// `main.pdi` bytes.
    pub pdi: Vec<u8>,
    /// `insts.bin` bytes.
    pub insts: Vec<u8>,
    /// The validated instruction stream.
    pub program: TxnProgram,
    /// What the PDI is.
    pub kind: PdiKind,
}

impl Design {
    /// Opens the design in `dir` (or `dir/build`), reads both files and runs [`check_pair`].
    ///
    /// # Errors
    ///
    /// [`ArtifactError::DesignIncomplete`] listing every path tried when a file is missing;
    /// [`ArtifactError::Io`] or [`ArtifactError::FileTooLarge`] when one cannot be read; any
    /// parse error wrapped in [`ArtifactError::InFile`] naming the file.
    pub fn open(dir: &Path) -> Result<Design, ArtifactError> {
        let files = locate(dir)?;
        let pdi = read_capped(&files.pdi_path, MAX_PDI_BYTES)?;
        let insts = read_capped(&files.insts_path, MAX_INSTS_BYTES)?;
        let kind = pdi::identify(&pdi).map_err(|e| e.in_file(&files.pdi_path))?;
        let program = TxnProgram::parse(&insts).map_err(|e| e.in_file(&files.insts_path))?;
        check_kind_against_program(&kind, &program).map_err(|e| match e {
            ArtifactError::XclbinNotPdi { .. } => e.in_file(&files.pdi_path),
            e => e.in_file(&files.dir),
        })?;
        Ok(Design {
            files,
            pdi,
            insts,
            program,
            kind,
        })
    }
}

/// The registration check on bytes: identifies the PDI, validates the TXN stream, refuses an
/// xclbin (the HSA path loads `main.pdi`), and for an emulated design checks that the TXN patches
/// exactly the design's buffers and needs no more bytes of any than the design gives it. The
/// generation is not checked here (see [`TxnProgram::check_generation`]).
///
/// # Errors
///
/// The PDI's or the TXN stream's error (the PDI's first), [`ArtifactError::XclbinNotPdi`], or
/// [`ArtifactError::EmuTxnMismatch`].
///
/// # Cost
///
/// [`pdi::identify`]'s on `pdi` plus [`TxnProgram::parse`]'s on `insts`: linear in both.
pub fn check_pair(pdi: &[u8], insts: &[u8]) -> Result<(PdiKind, TxnProgram), ArtifactError> {
    let kind = pdi::identify(pdi).map_err(|e| e.in_file(PDI_NAME))?;
    let program = TxnProgram::parse(insts).map_err(|e| e.in_file(INSTS_NAME))?;
    check_kind_against_program(&kind, &program)?;
    Ok((kind, program))
}

fn check_kind_against_program(kind: &PdiKind, program: &TxnProgram) -> Result<(), ArtifactError> {
    match kind {
        PdiKind::Partial(_) => Ok(()),
        PdiKind::Xclbin(x) => Err(ArtifactError::XclbinNotPdi {
            sections: x.num_sections,
            embedded_pdi_bytes: x.verified_pdi().map(|p| p.size),
        }),
        PdiKind::Emulated(design) => {
            let kernel = design.kernel.name();
            let sizes = design.arg_sizes();
            if program.arg_count() != sizes.len() {
                return Err(ArtifactError::EmuTxnMismatch {
                    kernel,
                    detail: format!(
                        "main.pdi has {} buffer arguments but insts.bin patches {}",
                        sizes.len(),
                        program.arg_count()
                    ),
                });
            }
            for (i, &size) in sizes.iter().enumerate() {
                let needed = program.min_arg_size(i);
                if needed > size {
                    return Err(ArtifactError::EmuTxnMismatch {
                        kernel,
                        detail: format!(
                            "buffer argument {i} is {size} bytes in main.pdi but insts.bin needs at least {needed}"
                        ),
                    });
                }
            }
            Ok(())
        }
    }
}

/// Finds `main.pdi` and `insts.bin` together in `dir` or `dir/build`.
fn locate(dir: &Path) -> Result<DesignFiles, ArtifactError> {
    let candidates = [dir.to_path_buf(), dir.join("build")];
    let mut tried = Vec::new();
    let mut found_pdi = None;
    let mut found_insts = None;
    for d in &candidates {
        let (p, i) = (d.join(PDI_NAME), d.join(INSTS_NAME));
        let (has_p, has_i) = (p.is_file(), i.is_file());
        if has_p && has_i {
            return Ok(DesignFiles {
                dir: d.clone(),
                pdi_path: p,
                insts_path: i,
            });
        }
        if has_p {
            found_pdi.get_or_insert_with(|| p.clone());
        }
        if has_i {
            found_insts.get_or_insert_with(|| i.clone());
        }
        tried.push(p);
        tried.push(i);
    }
    let mut detail = match (&found_pdi, &found_insts) {
        (None, None) => format!("neither {PDI_NAME} nor {INSTS_NAME} found"),
        (Some(p), None) => format!("{INSTS_NAME} missing (found {})", p.display()),
        (None, Some(i)) => format!("{PDI_NAME} missing (found {})", i.display()),
        (Some(p), Some(i)) => format!(
            "{} and {} are in different directories; expected both in one",
            p.display(),
            i.display()
        ),
    };
    let hints = hints(&candidates);
    if !hints.is_empty() {
        detail.push_str(&format!("; other artifacts there: {}", hints.join(", ")));
        if found_pdi.is_none() && hints.iter().any(|h| h.ends_with(".xclbin")) {
            detail.push_str(
                " (an xclbin is for the XRT path; the HSA path needs main.pdi from aiecc --get-pdi)",
            );
        }
    }
    if !dir.is_dir() {
        detail = format!("not a directory ({detail})");
    }
    Err(ArtifactError::DesignIncomplete {
        dir: dir.to_path_buf(),
        tried,
        detail,
    })
}

/// Other `*.pdi`, `*.xclbin` and `*.bin` files in the candidate directories, sorted.
fn hints(dirs: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(d) else {
            continue;
        };
        for e in entries.flatten().take(4096) {
            let path = e.path();
            let ext = path.extension().and_then(|x| x.to_str()).unwrap_or("");
            if matches!(ext, "pdi" | "xclbin" | "bin") && path.is_file() {
                out.push(path.display().to_string());
            }
        }
    }
    out.sort();
    out.truncate(8);
    out
}

/// Reads a file, refusing one larger than `max` bytes without reading it.
fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, ArtifactError> {
    let io = |source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > max {
        return Err(ArtifactError::FileTooLarge {
            path: path.to_path_buf(),
            found: len,
            max,
        });
    }
    std::fs::read(path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NpuGen;
    use crate::emu::{DType, EmuDesign};

    #[test]
    fn written_design_opens_from_dir_and_build() {
        let tmp = tempfile::tempdir().unwrap();
        let d = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
        let files = d.write_dir(tmp.path(), NpuGen::Npu2).unwrap();
        let opened = Design::open(tmp.path()).unwrap();
        assert_eq!(opened.files, files);
        assert_eq!(opened.kind, PdiKind::Emulated(d.clone()));
        assert_eq!(opened.program.generation, NpuGen::Npu2);

        let top = tempfile::tempdir().unwrap();
        let build = top.path().join("build");
        std::fs::create_dir(&build).unwrap();
        d.write_dir(&build, NpuGen::Npu1).unwrap();
        let opened = Design::open(top.path()).unwrap();
        assert_eq!(opened.files.dir, build);
    }

    #[test]
    fn missing_files_are_named_with_every_path_tried() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("insts.bin"), [0u8; 16]).unwrap();
        std::fs::write(tmp.path().join("final.xclbin"), b"xclbin2\0").unwrap();
        let e = Design::open(tmp.path()).unwrap_err().to_string();
        let t = tmp.path().display();
        assert!(
            e.contains(&format!("main.pdi missing (found {t}/insts.bin)")),
            "{e}"
        );
        assert!(
            e.contains("the HSA path needs main.pdi from aiecc --get-pdi"),
            "{e}"
        );
        assert!(
            e.ends_with(&format!(
                "looked for: {t}/main.pdi, {t}/insts.bin, {t}/build/main.pdi, {t}/build/insts.bin"
            )),
            "{e}"
        );
    }

    #[test]
    fn malformed_file_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        EmuDesign::relu(16, DType::F32)
            .write_dir(tmp.path(), NpuGen::Npu1)
            .unwrap();
        std::fs::write(tmp.path().join("insts.bin"), [0u8; 20]).unwrap();
        let e = Design::open(tmp.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}/insts.bin: TXN header (byte offset 0) has version 0.0; expected 0.1 (current) \
                 or 1.0 (older)",
                tmp.path().display()
            )
        );
    }

    #[test]
    fn malformed_pdi_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        EmuDesign::relu(16, DType::F32)
            .write_dir(tmp.path(), NpuGen::Npu1)
            .unwrap();
        let pdi = tmp.path().join("main.pdi");
        let mut bytes = std::fs::read(&pdi).unwrap();
        bytes[56] ^= 1;
        std::fs::write(&pdi, bytes).unwrap();
        let e = Design::open(tmp.path()).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "{}: emulated design: checksum (byte offset 76) is",
                pdi.display()
            )),
            "{e}"
        );
    }

    #[test]
    fn files_split_across_dir_and_build_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let build = tmp.path().join("build");
        std::fs::create_dir(&build).unwrap();
        let d = EmuDesign::relu(16, DType::I16);
        std::fs::write(tmp.path().join("main.pdi"), d.to_pdi()).unwrap();
        std::fs::write(build.join("insts.bin"), d.insts(NpuGen::Npu1)).unwrap();
        let e = Design::open(tmp.path()).unwrap_err().to_string();
        let t = tmp.path().display();
        assert!(
            e.contains(&format!(
                "{t}/main.pdi and {t}/build/insts.bin are in different directories; expected both in one"
            )),
            "{e}"
        );
        let e = Design::open(&tmp.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(": not a directory (neither main.pdi nor insts.bin found)"),
            "{e}"
        );
    }

    #[test]
    fn check_pair_compares_an_emulated_design_with_its_insts() {
        let d = EmuDesign::vector_vector_add(64, DType::I32);
        let (kind, program) = check_pair(&d.to_pdi(), &d.insts(NpuGen::Npu1)).unwrap();
        assert_eq!(kind, PdiKind::Emulated(d.clone()));
        assert_eq!(program.min_arg_sizes(), vec![256; 3]);

        let other = EmuDesign::relu(64, DType::I32);
        let e = check_pair(&d.to_pdi(), &other.insts(NpuGen::Npu1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "emulated design vector_vector_add and insts.bin disagree: main.pdi has 3 buffer \
             arguments but insts.bin patches 2"
        );
        let bigger = EmuDesign::vector_vector_add(128, DType::I32);
        let e = check_pair(&d.to_pdi(), &bigger.insts(NpuGen::Npu1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "emulated design vector_vector_add and insts.bin disagree: buffer argument 0 is 256 \
             bytes in main.pdi but insts.bin needs at least 512"
        );
    }

    #[test]
    fn check_pair_refuses_an_xclbin_and_names_the_file() {
        let d = EmuDesign::relu(16, DType::I32);
        let x = crate::xclbin::tests::sample_xclbin();
        let e = check_pair(&x, &d.insts(NpuGen::Npu1))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("this is an xclbin (1 sections), not a PDI"),
            "{e}"
        );
        assert!(!e.contains("extract"), "{e}");
        let with_pdi = crate::xclbin::tests::xclbin_with_pdi(&crate::pdi::tests::sample_pdi());
        let e = check_pair(&with_pdi, &d.insts(NpuGen::Npu1))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with(
                ", or extract the verified 368-byte partial PDI its AIE_PARTITION section embeds \
                 (npu_artifacts::xclbin::extract_pdi)"
            ),
            "{e}"
        );
        let e = check_pair(b"junk", &d.insts(NpuGen::Npu1))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("main.pdi: unrecognized PDI content"), "{e}");
    }

    #[test]
    fn check_pair_accepts_a_partial_pdi() {
        let pdi = crate::pdi::tests::sample_pdi();
        let d = EmuDesign::relu(16, DType::I32);
        let (kind, _) = check_pair(&pdi, &d.insts(NpuGen::Npu2)).unwrap();
        assert!(matches!(kind, PdiKind::Partial(_)));
    }
}
