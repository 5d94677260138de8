//! The AIE hsaco: the HSA code object ROCR loads on an AIE (NPU) agent, and a packer for it.
//!
//! An hsaco is an ELF64 container with one section per arch, named `aie2` (npu1) or `aie2p`
//! (npu2), whose bytes start with the magic `AIEK`. The section holds a header, a kernel table, a
//! string table of kernel names and a pool of blobs. A kernel is either `PdiInsts` (a PDI plus a
//! TXN instruction sequence, the `main.pdi` + `insts.bin` pair) or `FullElf` (an ELF32 from
//! `aiecc --get-full-elf` holding control code, PDIs and relocations; aie2p only).
//!
//! [`Hsaco::parse`] reads the container and validates every arch section; [`parse_for_arch`]
//! does what ROCR's loader does for one agent: take the first AIE section named like its arch
//! and validate that one. [`HsacoBuilder`] writes hsacos; [`FullElf`] reads (and
//! [`FullElfBuilder`] writes) the nested full ELF. Every refusal is an
//! [`ArtifactError::HsacoContainer`], [`ArtifactError::HsacoSection`] or
//! [`ArtifactError::HsacoFullElf`] carrying the [`HsacoRule`] it breaks and its byte offset.
//!
//! # Container
//!
//! ROCR checks the ELF magic and opens the file as ELF64; `e_type` and `e_machine` are not read.
//! An **AIE section** has `sh_size >= 48`, lies inside the file and starts with `0x4B454941`
//! (`"AIEK"`). The packer writes `ET_REL`, `EM_AMDGPU` (224), sections `[0] NULL`,
//! `[1] .shstrtab`, then one `SHT_PROGBITS` section per arch without `SHF_ALLOC`, align 1.
//!
//! # Section layout (little-endian, offsets from the section start)
//!
//! | Off | Header (48 bytes) | | Off | Kernel entry (44 bytes) |
//! |---:|---|---|---:|---|
//! | 0 | magic `AIEK` | | 0 | name_offset (from string_table_offset) |
//! | 4 | version_major u16 = 1, version_minor u16 = 0 | | 4 | insts_offset |
//! | 8 | header_size (48) | | 8 | insts_size |
//! | 12 | kernel_count | | 12 | pdi_offset |
//! | 16 | kernel_entry_size (44) | | 16 | pdi_size |
//! | 20 | string_table_offset | | 20 | kernarg_size |
//! | 24 | string_table_size | | 24 | num_cols |
//! | 28 | blob_pool_offset | | 28 | kind: 0 PdiInsts, 1 FullElf |
//! | 32 | reserved\[4\] = 0 | | 32 | reserved\[3\] = 0 |
//!
//! Regions follow each other without padding: header, table, names (NUL-terminated, in table
//! order), blob pool (to the section end). Readers stride by the file's `header_size` and
//! `kernel_entry_size`, never by their own struct sizes. The packer stores identical blobs once.
//!
//! # Validation
//!
//! Section ([`HsacoRule`] in brackets), as ROCR's section parser: `version_major == 1`
//! [`VersionMajor`](HsacoRule::VersionMajor); `header_size >= 48`; `kernel_entry_size >= 44`; the
//! table ends inside the section; `string_table_offset >=` table end; the string table ends
//! inside the section; `blob_pool_offset >=` string table end and `<= sh_size`;
//! `kernel_count >= 1`. Per entry: `kind < 2` (checked first, so the kind-dependent rules below
//! know the kind); `insts_size > 0`; `PdiInsts`: `insts_size % 4 == 0`; every blob
//! `offset >= blob_pool_offset` and `offset + size <= sh_size`; `pdi_size == 0 => pdi_offset == 0`;
//! `FullElf => pdi_size == 0`; `name_offset < string_table_size` with a NUL before the string
//! table ends; the name is non-empty UTF-8 (npud's rule, stricter than ROCR, which takes any
//! bytes; [`KernelNameText`](HsacoRule::KernelNameText)); unique names. Then ROCR's loader: `num_cols >= 1` (`<=` agent columns with
//! [`AieSection::check_columns`]); `PdiInsts` has a PDI; `FullElf` only in `aie2p`; the
//! `FullElf` name is a kernel of its full ELF; a non-zero `kernarg_size` equals 16 × its
//! arguments; the kernel has a PDI patch site. Reserved words are not checked (ROCR does not).
//!
//! # The nested full ELF
//!
//! `ELFCLASS32`, `ELFDATA2LSB`, `EI_OSABI == 69`; `e_shentsize == 40`, `e_shnum > 0`,
//! `e_shstrndx < e_shnum`. A `.symtab` with `sh_entsize == 16`, its strings in `sh_link`. Each
//! `SHT_GROUP` starts with `GRP_COMDAT`; its `sh_info` is the instance symbol, whose `st_shndx` is
//! the **symtab index** of the kernel symbol; the name is `<demangled kernel>:<instance>`, where
//! only `_Z<len><name>` is demangled. The group's last member named `.ctrltext*` is the control
//! code (`SHT_PROGBITS`, not empty); groups without one are no kernels; no kernel at all or a
//! repeated name is refused. Relocations are read only when `.rela.dyn` (`sh_entsize` 12),
//! `.dynsym` (16, strings in `sh_link`) and `.dynstr` exist, and apply when the symbol's
//! `st_shndx` is a kernel's `.ctrltext`. Scheme and addend: `EI_ABIVERSION == 1` gives
//! `r_addend & 0xF` and `r_addend >> 4`, otherwise `ELF32_R_TYPE` and `r_addend`. A `.pdi*`
//! symbol is an Address64 (8) site for the section of that name (same-named sections must be
//! byte-identical): offset non-zero, a multiple of 4, `+ 8 <=` control size. A decimal name
//! 0..=4095 is a ShimDma48 (5) site for that argument: a multiple of 4, `+ 12 <=` control size.
//! Any other symbol is refused. Arguments = highest index + 1. `.note.xrt.configuration` (one note,
//! owner `XRT\0`, type 6, 4-byte column count) is read by the packer only
//! ([`FullElf::xrt_columns`]).
//!
//! # Limits
//!
//! Every count is bounded by the input: tables must lie inside their section, names are borrowed
//! from the file, string lookups scan at most 64 bytes with an index of 1/16 of each table, each
//! distinct full ELF blob is parsed once, and PDI sections of one name are compared once. Work
//! that entries sharing bytes would multiply (kernel names hashed, group member lists walked,
//! same-named PDIs compared, patch sites of kernels sharing a control code, overlapping full-ELF
//! blobs) is charged to a budget of a few units per input byte; an input that needs more is
//! refused with [`ArtifactError::OverLimit`]. Files the packer writes charge each byte about
//! once. No input allocates more than 8 bytes per input byte plus a constant (`tests/cost.rs`).
//!
//! # Evidence and what is unverified
//!
//! Read from ROCm/rocm-systems `projects/rocr-runtime/docs/aie-hsaco-format.md` (@`e7e99bce`) and
//! `runtime/hsa-runtime/core/runtime/amd_aie_code.cpp` (the stored text @`07ee4564`), and
//! Xilinx/mlir-aie `python/compiler/hsaco/format.py` (@`8fca24e5`). The byte-exact test packs the
//! format document's own example section. Where the two ROCR sources differ this module follows
//! the format document, which lists more checks: the `amd_aie_code.cpp` text read here picks the
//! first AIE section whatever its name (the loader then compares the arch; the document says the
//! first section named like the arch), checks `insts_size % 4` for every kind, and lacks the
//! `header_size`, region-order and string-table-bound checks the document lists; the packer pads a
//! full ELF to a multiple of 4 bytes so both versions accept it. Not verified against a
//! ROCR-loaded file or an `aiecc` full ELF: the nested-ELF rules come from the document, and an
//! argument name with leading zeros or more than 4 digits is refused here (the document says
//! "decimal digits only, 0 to 4095").

mod build;
mod container;
mod elf_build;
mod full_elf;
mod rules;
mod section;
mod sites;
mod strtab;

pub use build::{HsacoBuilder, PdiInstsKernel};
pub use container::{Container, ElfSection, SectionName, parse_container};
pub use elf_build::{ElfKernelSpec, FullElfBuilder};
pub use full_elf::{ElfKernel, ElfPdi, FullElf, GRP_COMDAT, OSABI_AIE2P};
pub use rules::HsacoRule;
pub use section::{AieSection, Blob, Kernel};
pub use sites::{MAX_ARG_INDEX, PatchScheme, PatchSite, SiteTarget, patch_shim_dma48};

use crate::{ArtifactError, NpuGen};
use std::fmt;

/// The section magic, `"AIEK"` read as a little-endian u32.
pub const AIE_MAGIC: u32 = 0x4B45_4941;
/// The section format's major version.
pub const VERSION_MAJOR: u16 = 1;
/// The section format's minor version.
pub const VERSION_MINOR: u16 = 0;
/// Size of the version 1.0 header, and the least `header_size` a reader accepts.
pub const HEADER_MIN: u32 = 48;
/// Size of a version 1.0 kernel entry, and the least `kernel_entry_size` a reader accepts.
pub const ENTRY_MIN: u32 = 44;
/// `EM_AMDGPU`, the container's machine.
pub const EM_AMDGPU: u16 = 224;

/// What a kernel entry carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// A PDI and a TXN instruction sequence.
    PdiInsts,
    /// A full ELF (aie2p only).
    FullElf,
}

impl KernelKind {
    /// The on-disk `kind` value.
    #[must_use]
    pub fn code(self) -> u32 {
        match self {
            Self::PdiInsts => 0,
            Self::FullElf => 1,
        }
    }

    /// ROCR's name for it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::PdiInsts => "PdiInsts",
            Self::FullElf => "FullElf",
        }
    }
}

impl fmt::Display for KernelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The arch a section name stands for: exactly `aie2` or `aie2p`.
#[must_use]
pub fn arch_of_section(name: &str) -> Option<NpuGen> {
    [NpuGen::Npu1, NpuGen::Npu2]
        .into_iter()
        .find(|g| g.agent_name() == name)
}

/// A parsed hsaco: its container and every arch section it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hsaco<'a> {
    /// The ELF64 container.
    pub container: Container<'a>,
    /// The first AIE section named `aie2` and the first named `aie2p`, each validated, in
    /// section-header order.
    pub sections: Vec<AieSection<'a>>,
    /// Names of AIE sections no agent would load: other names, or a second section of one arch.
    pub ignored: Vec<SectionName<'a>>,
}

impl<'a> Hsaco<'a> {
    /// Reads the container and validates every arch section.
    ///
    /// # Cost
    ///
    /// Linear in `bytes`: [`parse_container`]'s cost, 16 bytes per ignored section, and
    /// [`parse_for_arch`]'s cost for each of at most two arch sections.
    ///
    /// # Errors
    ///
    /// The first broken rule: [`ArtifactError::HsacoContainer`] for the container (also when it
    /// has no AIE section, or none named `aie2`/`aie2p`), [`ArtifactError::HsacoSection`] or
    /// [`ArtifactError::HsacoFullElf`] for a section.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ArtifactError> {
        let container = parse_container(bytes)?;
        let mut sections: Vec<AieSection<'a>> = Vec::new();
        let mut ignored = Vec::new();
        let mut any = false;
        for s in &container.sections {
            if !s.is_aie(bytes) {
                continue;
            }
            any = true;
            match s.name.to_str().and_then(arch_of_section) {
                Some(arch) if sections.iter().all(|x| x.arch != arch) => {
                    sections.push(aie_section(bytes, s, arch)?);
                }
                _ => ignored.push(s.name),
            }
        }
        if !any {
            return Err(no_aie_section(&container));
        }
        if sections.is_empty() {
            return Err(ArtifactError::HsacoContainer {
                rule: HsacoRule::ArchSection,
                offset: 0,
                detail: format!(
                    "AIE sections are named {}; expected aie2 or aie2p",
                    some_names(&ignored)
                ),
            });
        }
        Ok(Self {
            container,
            sections,
            ignored,
        })
    }

    /// The section for an arch.
    #[must_use]
    pub fn section(&self, arch: NpuGen) -> Option<&AieSection<'a>> {
        self.sections.iter().find(|s| s.arch == arch)
    }
}

/// What ROCR's loader does for an agent of `arch`: find the first AIE section named like the
/// arch and validate it (and only it).
///
/// # Errors
///
/// [`ArtifactError::HsacoContainer`] with [`HsacoRule::AieSectionPresent`] when the file has no
/// AIE section (ROCR would take the GPU path), [`HsacoRule::ArchSection`] when none is named for
/// `arch` (`HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS`); otherwise a section error
/// (`HSA_STATUS_ERROR_INVALID_CODE_OBJECT`).
pub fn parse_for_arch(bytes: &[u8], arch: NpuGen) -> Result<AieSection<'_>, ArtifactError> {
    let container = parse_container(bytes)?;
    let aie: Vec<&ElfSection<'_>> = container
        .sections
        .iter()
        .filter(|s| s.is_aie(bytes))
        .collect();
    if aie.is_empty() {
        return Err(no_aie_section(&container));
    }
    let Some(s) = aie.iter().find(|s| s.name == arch.agent_name()) else {
        let names: Vec<SectionName<'_>> = aie.iter().map(|s| s.name).collect();
        return Err(ArtifactError::HsacoContainer {
            rule: HsacoRule::ArchSection,
            offset: 0,
            detail: format!(
                "no AIE section is named {}; AIE sections: {}",
                arch.agent_name(),
                some_names(&names)
            ),
        });
    };
    aie_section(bytes, s, arch)
}

/// Whether the bytes are an ELF64 file with an AIE section (what ROCR tests before taking the
/// AIE load path).
///
/// # Cost
///
/// [`parse_container`]'s: linear in `bytes`.
#[must_use]
pub fn is_hsaco(bytes: &[u8]) -> bool {
    parse_container(bytes).is_ok_and(|c| c.sections.iter().any(|s| s.is_aie(bytes)))
}

fn aie_section<'a>(
    bytes: &'a [u8],
    s: &ElfSection<'_>,
    arch: NpuGen,
) -> Result<AieSection<'a>, ArtifactError> {
    // `is_aie` checked that the section lies inside the file.
    let data = s.bytes(bytes).unwrap_or(&[]);
    section::parse_section(data, arch, s.index, s.offset)
}

fn no_aie_section(c: &Container<'_>) -> ArtifactError {
    let names: Vec<SectionName<'_>> = c.sections.iter().map(|s| s.name).collect();
    ArtifactError::HsacoContainer {
        rule: HsacoRule::AieSectionPresent,
        offset: 0,
        detail: format!(
            "{} sections {}, none at least 48 bytes inside the file starting with \"AIEK\"",
            c.sections.len(),
            some_names(&names)
        ),
    }
}

/// The first few names, each cut to 64 bytes, for a message that must stay short whatever the
/// file holds.
fn some_names(names: &[SectionName<'_>]) -> String {
    const SHOWN: usize = 8;
    let shown: Vec<String> = names.iter().take(SHOWN).map(SectionName::shown).collect();
    if names.len() > SHOWN {
        format!("{shown:?} and {} more", names.len() - SHOWN)
    } else {
        format!("{shown:?}")
    }
}

#[cfg(test)]
mod tests;
