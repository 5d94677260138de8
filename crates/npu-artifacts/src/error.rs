//! [`ArtifactError`]: everything that can be wrong with a design's files.
//!
//! Every message is written for the person who has to fix the artifact: it names the file when it
//! is known (see [`ArtifactError::InFile`]), the operation index and byte offset for TXN streams,
//! and what was expected next to what was found.

use std::path::PathBuf;

/// An artifact that cannot be used, and why.
///
/// Parsers work on bytes and do not know where the bytes came from; [`crate::design::Design::open`]
/// wraps their errors in [`ArtifactError::InFile`] so the message starts with the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArtifactError {
    /// The error happened while reading or checking one file.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: Box<ArtifactError>,
    },

    /// Reading a file failed.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// A file is larger than any artifact of its kind can be.
    #[error("{} is {found} bytes; expected at most {max} bytes for this kind of file", path.display())]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        found: u64,
        /// The limit.
        max: u64,
    },

    /// A design directory lacks a file, or holds it in a form the HSA path cannot use.
    #[error("design directory {}: {detail}; looked for: {}", dir.display(), list_paths(tried))]
    DesignIncomplete {
        /// The directory that was opened.
        dir: PathBuf,
        /// Every path that was tried.
        tried: Vec<PathBuf>,
        /// What is missing, and any hint from files that were found instead.
        detail: String,
    },

    /// An input asks a parser for more work or memory than its size allows: the cap that keeps
    /// parsing cost linear in the input (see each parser's `# Cost`). A file a packer writes
    /// stays far below every cap; reaching one means entries share data they would each own.
    #[error(
        "{artifact}: {what} would take {found} units of parsing work; a {input_bytes}-byte input \
         allows at most {limit}"
    )]
    OverLimit {
        /// The kind of input ("hsaco container", "hsaco section aie2", "full ELF", "xclbin").
        artifact: &'static str,
        /// What reached the cap (for example "kernel name bytes" or "group members").
        what: &'static str,
        /// The work counted so far, including the entry that reached the cap.
        found: u64,
        /// The cap for this input.
        limit: u64,
        /// The input's size.
        input_bytes: u64,
    },

    // ---- insts.bin (TXN) ----
    /// The stream is shorter than its 16-byte header.
    #[error("insts.bin is {found} bytes; expected at least 16 (the TXN header is 4 words)")]
    TxnTooShort {
        /// Length of the stream in bytes.
        found: usize,
    },

    /// The stream is not a whole number of 32-bit words.
    #[error("insts.bin is {found} bytes; expected a multiple of 4 (the stream is 32-bit words)")]
    TxnNotWords {
        /// Length of the stream in bytes.
        found: usize,
    },

    /// The header's total size (word 3) disagrees with the stream length.
    #[error(
        "TXN header (byte offset 12) declares {declared} bytes but the stream is {found} bytes; \
         the file is truncated, padded or not a TXN stream"
    )]
    TxnSizeMismatch {
        /// Header word 3.
        declared: u32,
        /// Actual length.
        found: usize,
    },

    /// The header names a format version this crate does not read.
    #[error(
        "TXN header (byte offset 0) has version {major}.{minor}; expected 0.1 (current) or 1.0 (older)"
    )]
    TxnVersion {
        /// Major version (byte 0).
        major: u8,
        /// Minor version (byte 1).
        minor: u8,
    },

    /// The header's device generation is not an NPU this crate knows.
    #[error(
        "TXN header (byte offset 2) has device generation {found}; expected 3 (npu1, aie2) or 4 (npu2, aie2p)"
    )]
    TxnGeneration {
        /// Header byte 2.
        found: u8,
    },

    /// An operation does not fit in the bytes that remain.
    #[error(
        "TXN op {op_index} ({name}) at byte offset {offset} needs {needed} bytes but only {remaining} remain"
    )]
    TxnTruncated {
        /// Index of the operation (0-based).
        op_index: u32,
        /// Byte offset of its first word.
        offset: usize,
        /// Opcode name.
        name: &'static str,
        /// Bytes the operation needs.
        needed: u64,
        /// Bytes left in the stream from its offset.
        remaining: usize,
    },

    /// An opcode byte that no TXN format defines.
    #[error(
        "TXN op {op_index} at byte offset {offset} has unknown opcode {opcode:#04x} (word {word:#010x})"
    )]
    TxnUnknownOpcode {
        /// Index of the operation.
        op_index: u32,
        /// Byte offset.
        offset: usize,
        /// The opcode byte.
        opcode: u8,
        /// The whole first word.
        word: u32,
    },

    /// A defined opcode whose encoded form is not established for this format version.
    #[error(
        "TXN op {op_index} at byte offset {offset} is {name} (opcode {opcode:#04x}), which is not supported \
         in TXN version {version}: {why}"
    )]
    TxnUnsupportedOpcode {
        /// Index of the operation.
        op_index: u32,
        /// Byte offset.
        offset: usize,
        /// The opcode byte.
        opcode: u8,
        /// Opcode name.
        name: &'static str,
        /// "0.1" or "1.0".
        version: &'static str,
        /// Why it is refused.
        why: &'static str,
    },

    /// An operation's size field disagrees with its layout.
    #[error(
        "TXN op {op_index} ({name}) at byte offset {offset}: size field (byte offset {field_offset}) is {found}; \
         expected {expected}"
    )]
    TxnOpSize {
        /// Index of the operation.
        op_index: u32,
        /// Byte offset of the operation.
        offset: usize,
        /// Byte offset of the size field.
        field_offset: usize,
        /// Opcode name.
        name: &'static str,
        /// What the layout requires.
        expected: String,
        /// The size field.
        found: u32,
    },

    /// An operation's field that must hold a fixed value does not.
    #[error(
        "TXN op {op_index} ({name}) at byte offset {offset}: {field} (byte offset {field_offset}) is \
         {found:#x}; expected {expected}"
    )]
    TxnOpField {
        /// Index of the operation.
        op_index: u32,
        /// Byte offset of the operation.
        offset: usize,
        /// Opcode name.
        name: &'static str,
        /// Which field.
        field: String,
        /// Byte offset of the field.
        field_offset: usize,
        /// What it must be.
        expected: &'static str,
        /// What it is.
        found: u32,
    },

    /// The op walk and the header's op count (word 2) disagree.
    #[error("TXN header (byte offset 8) declares {declared} ops but {detail}")]
    TxnOpCount {
        /// Header word 2.
        declared: u32,
        /// What the walk found.
        detail: String,
    },

    /// A DDR_PATCH that would write outside the shim row, or with fields the firmware rejects.
    #[error("TXN op {op_index} (DDR_PATCH) at byte offset {offset}: {detail}")]
    TxnPatch {
        /// Index of the operation.
        op_index: u32,
        /// Byte offset.
        offset: usize,
        /// What is wrong, with expected and found values.
        detail: String,
    },

    /// A DDR_PATCH into a shim BD whose transfer length no earlier op set, or set to 0: the DMA
    /// would move whatever length the BD holds, past the buffer.
    #[error(
        "TXN op {op_index} (DDR_PATCH) at byte offset {offset}: argument {arg_idx} is patched into \
         register {reg_addr:#010x}, but {} the length word of that shim BD ({length_addr:#010x}, \
         the patched register - 4); expected an earlier WRITE, BLOCKWRITE or full-mask MASKWRITE \
         to set it to a non-zero transfer length in 32-bit words, as aiecc's lowering writes the \
         whole BD before every patch (without a length the DMA moves whatever the BD holds, past \
         the buffer); rebuild insts.bin with aiecc, or write the BD's length before the patch",
        if *written_zero { "the stream last wrote 0 to" } else { "no earlier op wrote" }
    )]
    TxnPatchWithoutLength {
        /// Index of the DDR_PATCH op.
        op_index: u32,
        /// Its byte offset.
        offset: usize,
        /// The patched register (the BD's base-address-low word).
        reg_addr: u32,
        /// The buffer argument it patches.
        arg_idx: u32,
        /// The BD's word 0, which holds the transfer length.
        length_addr: u32,
        /// The length word was written, with 0 (rather than never written).
        written_zero: bool,
    },

    /// The program was built for another NPU generation than the device.
    #[error(
        "insts.bin was built for {found} (TXN device generation {found_gen}) but the device is {expected}"
    )]
    GenerationMismatch {
        /// The device's generation.
        expected: crate::NpuGen,
        /// The program's generation.
        found: crate::NpuGen,
        /// Its TXN code.
        found_gen: u8,
    },

    /// A dispatch supplies fewer buffers than the program patches.
    #[error("the program patches {needed} buffer arguments but the dispatch supplies {supplied}")]
    TooFewBuffers {
        /// `arg_count()` of the program.
        needed: usize,
        /// Buffers supplied.
        supplied: usize,
    },

    /// A dispatch buffer is smaller than the program's patches into it require.
    #[error(
        "buffer argument {index} is {supplied} bytes but the program needs at least {needed} bytes \
         (DDR_PATCH op {op_index}{bd})"
    )]
    BufferTooSmall {
        /// Argument index.
        index: usize,
        /// Its size.
        supplied: u64,
        /// The minimum.
        needed: u64,
        /// The patch that sets the minimum.
        op_index: u32,
        /// How the minimum was derived.
        bd: String,
    },

    // ---- PDI and xclbin ----
    /// The bytes are neither an emulated design, a partial PDI nor an xclbin.
    #[error(
        "unrecognized PDI content: first bytes are {first}; expected a partial PDI (SMAP words \
         dd 00 00 00 44 33 22 11 ... and \"PPDI\" at byte 56), an xclbin (\"xclbin2\\0\") or an \
         emulated design (\"NPUD-EMU\")"
    )]
    PdiUnrecognized {
        /// Hex dump of the first 16 bytes.
        first: String,
    },

    /// A PDI that is structurally broken.
    #[error("PDI: {detail}")]
    PdiMalformed {
        /// What is wrong, with the byte offset.
        detail: String,
    },

    /// A PDI header whose checksum does not verify.
    #[error(
        "PDI: {table} at byte offset {offset}: checksum does not verify (the {words} words sum to \
         {sum:#010x}; expected 0xffffffff)"
    )]
    PdiChecksum {
        /// Which header.
        table: &'static str,
        /// Its byte offset.
        offset: usize,
        /// Its length in words.
        words: usize,
        /// The wrapping sum.
        sum: u32,
    },

    /// A full boot PDI or other PDI that is not a partial PDI.
    #[error(
        "PDI: identification word (byte offset 56) is {found:#010x} ({ascii}); expected 0x50504449 (\"PPDI\", a partial PDI)"
    )]
    PdiNotPartial {
        /// The identification word.
        found: u32,
        /// Its bytes as text.
        ascii: String,
    },

    /// An xclbin that is broken.
    #[error("xclbin: {detail}")]
    XclbinMalformed {
        /// What is wrong.
        detail: String,
    },

    /// An xclbin was given where the HSA path needs a PDI.
    #[error(
        "this is an xclbin ({sections} sections), not a PDI: the HSA path loads main.pdi; build it with \
         aiecc --get-pdi (IRON's Makefiles leave it as build/main.pdi){}",
        match embedded_pdi_bytes {
            Some(n) => format!(
                ", or extract the verified {n}-byte partial PDI its AIE_PARTITION section embeds \
                 (npu_artifacts::xclbin::extract_pdi)"
            ),
            None => String::new(),
        }
    )]
    XclbinNotPdi {
        /// Number of sections in the xclbin.
        sections: u32,
        /// Size of the one embedded partial PDI that verified, if exactly one did.
        embedded_pdi_bytes: Option<u64>,
    },

    // ---- AIE hsaco ----
    /// The ELF64 container of an hsaco is broken, or holds no usable AIE section.
    #[error("hsaco container: rule \"{rule}\" broken at file offset {offset:#x}: {detail}")]
    HsacoContainer {
        /// The rule.
        rule: crate::hsaco::HsacoRule,
        /// File offset of the offending field or section.
        offset: u64,
        /// Expected and found.
        detail: String,
    },

    /// An AIE section (header, kernel table, strings, blobs) breaks a rule.
    #[error(
        "hsaco section {arch}: rule \"{rule}\" broken at section offset {offset:#x} \
         (file offset {file_offset:#x}): {detail}"
    )]
    HsacoSection {
        /// The section's arch name.
        arch: &'static str,
        /// The rule.
        rule: crate::hsaco::HsacoRule,
        /// Offset of the offending field, from the section start.
        offset: u64,
        /// The same offset in the file.
        file_offset: u64,
        /// Expected and found, naming the kernel entry where there is one.
        detail: String,
    },

    /// A nested full ELF (kind `FullElf`) breaks a rule.
    #[error(
        "full ELF{}: rule \"{rule}\" broken at ELF offset {offset:#x}{}: {detail}",
        match blob_file_offset { Some(_) => " in hsaco", None => "" },
        match blob_file_offset { Some(b) => format!(" (file offset {:#x})", b.saturating_add(*offset)), None => String::new() }
    )]
    HsacoFullElf {
        /// The rule.
        rule: crate::hsaco::HsacoRule,
        /// Offset of the offending field from the start of the full ELF.
        offset: u64,
        /// File offset of the full ELF inside an hsaco, when it was read from one.
        blob_file_offset: Option<u64>,
        /// Expected and found.
        detail: String,
    },

    /// The packer was given kernels it cannot write.
    #[error("hsaco packer: {detail}")]
    HsacoBuild {
        /// What is wrong with the input.
        detail: String,
    },

    // ---- emulated designs ----
    /// An emulated design file that cannot be read.
    #[error("emulated design: {detail}")]
    Emu {
        /// What is wrong, with byte offsets and expected/found values.
        detail: String,
    },

    /// An emulated design whose parameters do not describe a runnable kernel.
    #[error("emulated design {kernel}: {detail}")]
    EmuInvalid {
        /// Kernel name.
        kernel: &'static str,
        /// Which parameter is wrong.
        detail: String,
    },

    /// An emulated design and its insts.bin disagree.
    #[error("emulated design {kernel} and insts.bin disagree: {detail}")]
    EmuTxnMismatch {
        /// Kernel name.
        kernel: &'static str,
        /// What disagrees.
        detail: String,
    },
}

impl ArtifactError {
    /// Attaches the path of the file the error is about (unless it already carries one).
    #[must_use]
    pub fn in_file(self, path: impl Into<PathBuf>) -> Self {
        match self {
            e @ (Self::InFile { .. }
            | Self::Io { .. }
            | Self::FileTooLarge { .. }
            | Self::DesignIncomplete { .. }) => e,
            e => Self::InFile {
                path: path.into(),
                source: Box::new(e),
            },
        }
    }

    /// The error without the file context added by [`ArtifactError::in_file`].
    #[must_use]
    pub fn root(&self) -> &ArtifactError {
        match self {
            Self::InFile { source, .. } => source.root(),
            e => e,
        }
    }
}

fn list_paths(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_file_prefixes_the_path_once() {
        let e = ArtifactError::TxnTooShort { found: 3 }
            .in_file("/d/insts.bin")
            .in_file("/other");
        assert_eq!(
            e.to_string(),
            "/d/insts.bin: insts.bin is 3 bytes; expected at least 16 (the TXN header is 4 words)"
        );
        assert!(matches!(e.root(), ArtifactError::TxnTooShort { found: 3 }));
    }
}
