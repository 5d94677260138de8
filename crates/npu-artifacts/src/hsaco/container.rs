//! The ELF64 container: header, section headers, `.shstrtab`, and finding the AIE sections.
//!
//! ROCR checks only the ELF magic and that the file opens as an ELF64 image; `e_type` and
//! `e_machine` are not read. This reader asks for what it needs to find sections safely: a
//! little-endian ELF64 header, `e_shentsize == 64`, a section header table and a section name
//! table inside the file, and every section name inside that table. Extended section numbering
//! (`e_shnum == 0` with the count in section 0) is not followed: such a file has no sections here.
//!
//! # Cost
//!
//! [`parse_container`] allocates 40 bytes per section header (64 input bytes each) plus an
//! index of 1/16 of the name table, and reads each header once; names are borrowed from the
//! name table, so headers that share one long name cost no more than headers with short ones.

use std::fmt;

use super::strtab::StrTab;
use super::{AIE_MAGIC, HEADER_MIN, HsacoRule};
use crate::ArtifactError;
use crate::le::{u16_at, u32_at, u64_at};

/// `SHT_NOBITS`: a section with no bytes in the file.
pub(crate) const SHT_NOBITS: u32 = 8;

/// A section name: the bytes of `.shstrtab` it spans, without the NUL, borrowed from the file.
///
/// Compares equal to a `&str` with the same bytes; displays lossily (invalid UTF-8 as U+FFFD).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SectionName<'a>(pub &'a [u8]);

impl<'a> SectionName<'a> {
    /// The name's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }

    /// The name, if it is UTF-8.
    #[must_use]
    pub fn to_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.0).ok()
    }

    /// At most 64 bytes of the name, for messages, with its length when cut.
    #[must_use]
    pub fn shown(&self) -> String {
        crate::budget::shown(self.0)
    }
}

impl fmt::Display for SectionName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_str("\u{FFFD}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for SectionName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.shown(), f)
    }
}

impl PartialEq<str> for SectionName<'_> {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for SectionName<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

/// One section header of the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfSection<'a> {
    /// Index in the section header table.
    pub index: u32,
    /// Name from `.shstrtab`, borrowed from the file.
    pub name: SectionName<'a>,
    /// `sh_type`.
    pub sh_type: u32,
    /// `sh_flags`.
    pub flags: u64,
    /// `sh_offset`: file offset of the section's bytes.
    pub offset: u64,
    /// `sh_size`.
    pub size: u64,
    /// `sh_addralign`.
    pub addralign: u64,
}

impl ElfSection<'_> {
    /// The section's bytes, if they lie inside `file` (and it is not `SHT_NOBITS`).
    #[must_use]
    pub fn bytes<'a>(&self, file: &'a [u8]) -> Option<&'a [u8]> {
        if self.sh_type == SHT_NOBITS {
            return None;
        }
        let start = usize::try_from(self.offset).ok()?;
        let end = start.checked_add(usize::try_from(self.size).ok()?)?;
        file.get(start..end)
    }

    /// Whether ROCR takes it for an AIE section: at least 48 bytes, inside the file, `AIEK` first.
    #[must_use]
    pub fn is_aie(&self, file: &[u8]) -> bool {
        self.size >= u64::from(HEADER_MIN)
            && self
                .bytes(file)
                .is_some_and(|b| u32_at(b, 0) == Some(AIE_MAGIC))
    }
}

/// The ELF64 header fields the packer and `inspect` report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container<'a> {
    /// `e_type` (the packer writes `ET_REL`, 1).
    pub e_type: u16,
    /// `e_machine` (the packer writes `EM_AMDGPU`, 224).
    pub e_machine: u16,
    /// Every section header, in order.
    pub sections: Vec<ElfSection<'a>>,
}

fn err(rule: HsacoRule, offset: u64, detail: impl Into<String>) -> ArtifactError {
    ArtifactError::HsacoContainer {
        rule,
        offset,
        detail: detail.into(),
    }
}

fn widen(v: usize) -> u64 {
    v as u64
}

/// Reads the container's header and section headers.
///
/// # Cost
///
/// Linear: at most 40 bytes allocated per 64-byte section header plus 1/16 of the name table,
/// and a bounded scan per header (see the [module docs](self#cost)).
///
/// # Errors
///
/// [`ArtifactError::HsacoContainer`] naming the broken rule and its file offset.
pub fn parse_container(file: &[u8]) -> Result<Container<'_>, ArtifactError> {
    if file.get(0..4) != Some(b"\x7fELF".as_slice()) {
        return Err(err(
            HsacoRule::ElfMagic,
            0,
            format!(
                "first bytes are {:02x?}; expected 7f 45 4c 46",
                &file[..file.len().min(4)]
            ),
        ));
    }
    if file.len() < 64 || file[4] != 2 {
        return Err(err(
            HsacoRule::Elf64,
            4,
            format!(
                "EI_CLASS is {} in a {}-byte file; expected 2 (ELFCLASS64) and at least 64 bytes",
                file.get(4).copied().unwrap_or(0),
                file.len()
            ),
        ));
    }
    if file[5] != 1 {
        return Err(err(
            HsacoRule::ElfLittleEndian,
            5,
            format!("EI_DATA is {}; expected 1 (ELFDATA2LSB)", file[5]),
        ));
    }
    // The 64-byte header is present, so these reads cannot fail.
    let h16 = |at| u16_at(file, at).unwrap_or(0);
    let e_type = h16(16);
    let e_machine = h16(18);
    let shoff = u64_at(file, 40).unwrap_or(0);
    let shentsize = h16(58);
    let shnum = h16(60);
    let shstrndx = h16(62);
    if shnum == 0 {
        return Ok(Container {
            e_type,
            e_machine,
            sections: Vec::new(),
        });
    }
    if shentsize != 64 {
        return Err(err(
            HsacoRule::SectionHeaders,
            58,
            format!("e_shentsize is {shentsize}; expected 64"),
        ));
    }
    let table_len = u64::from(shnum) * 64;
    if shoff
        .checked_add(table_len)
        .is_none_or(|end| end > widen(file.len()))
    {
        return Err(err(
            HsacoRule::SectionHeaders,
            40,
            format!(
                "e_shoff {shoff:#x} + {shnum} headers of 64 bytes ends past the {}-byte file",
                file.len()
            ),
        ));
    }
    // In range: checked just above.
    let shoff = usize::try_from(shoff).unwrap_or(usize::MAX);
    let header = |i: u16| -> (usize, &[u8]) {
        let at = shoff + usize::from(i) * 64;
        (at, &file[at..at + 64])
    };
    if shstrndx >= shnum {
        return Err(err(
            HsacoRule::SectionNames,
            62,
            format!("e_shstrndx is {shstrndx}; expected less than e_shnum {shnum}"),
        ));
    }
    let (str_at, sh) = header(shstrndx);
    let names_hdr = raw_section(u32::from(shstrndx), sh);
    let Some(names) = names_hdr.bytes(file) else {
        return Err(err(
            HsacoRule::SectionNames,
            widen(str_at) + 24,
            format!(
                "section name table (section {shstrndx}) at {:#x}, {} bytes, is not inside the {}-byte file",
                names_hdr.offset,
                names_hdr.size,
                file.len()
            ),
        ));
    };
    let names_index = StrTab::new(names);
    let mut sections = Vec::with_capacity(usize::from(shnum));
    for i in 0..shnum {
        let (at, sh) = header(i);
        let mut s = raw_section(u32::from(i), sh);
        let name_off = u32_at(sh, 0).unwrap_or(0);
        let Some(name) = names_index.get(u64::from(name_off)) else {
            return Err(err(
                HsacoRule::SectionNames,
                widen(at),
                format!(
                    "section {i}'s sh_name {name_off} has no NUL-terminated name inside the {}-byte .shstrtab",
                    names.len()
                ),
            ));
        };
        s.name = SectionName(name);
        sections.push(s);
    }
    Ok(Container {
        e_type,
        e_machine,
        sections,
    })
}

fn raw_section<'a>(index: u32, sh: &[u8]) -> ElfSection<'a> {
    ElfSection {
        index,
        name: SectionName(&[]),
        sh_type: u32_at(sh, 4).unwrap_or(0),
        flags: u64_at(sh, 8).unwrap_or(0),
        offset: u64_at(sh, 24).unwrap_or(0),
        size: u64_at(sh, 32).unwrap_or(0),
        addralign: u64_at(sh, 48).unwrap_or(0),
    }
}
