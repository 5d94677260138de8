//! [`HsacoRule`]: the validation rules an hsaco is checked against, one name each, so an error
//! and a test can say which rule a file breaks.

use std::fmt;

/// One rule of the AIE hsaco format or of ROCR's loader (see the [module docs](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HsacoRule {
    // ---- the ELF64 container ----
    /// The file starts with `\x7fELF`.
    ElfMagic,
    /// `EI_CLASS` is `ELFCLASS64` and the 64-byte header is present.
    Elf64,
    /// `EI_DATA` is `ELFDATA2LSB`.
    ElfLittleEndian,
    /// `e_shentsize` is 64 and the section header table lies inside the file.
    SectionHeaders,
    /// `e_shstrndx` names a section inside the file, and every section name lies inside it.
    SectionNames,
    /// At least one section is an AIE section (`sh_size >= 48`, inside the file, `AIEK` first).
    AieSectionPresent,
    /// An AIE section is named like the requested arch.
    ArchSection,
    // ---- the AIE section ----
    /// `version_major == 1`.
    VersionMajor,
    /// `header_size >= 48`.
    HeaderSize,
    /// `kernel_entry_size >= 44`.
    KernelEntrySize,
    /// `kernel_count >= 1`.
    KernelCount,
    /// The kernel table ends inside the section.
    KernelTableInSection,
    /// `string_table_offset` is at or after the end of the kernel table.
    StringTableAfterTable,
    /// The string table ends inside the section.
    StringTableInSection,
    /// `blob_pool_offset` is at or after the end of the string table, and inside the section.
    BlobPoolAfterStrings,
    /// `insts_size > 0`.
    InstsSize,
    /// `PdiInsts`: `insts_size` is a multiple of 4.
    InstsWords,
    /// A blob lies in the blob pool: `offset >= blob_pool_offset`, `offset + size <= sh_size`.
    BlobInPool,
    /// `pdi_size == 0` implies `pdi_offset == 0`.
    PdiAbsent,
    /// `name_offset < string_table_size`, with a NUL before the string table ends.
    NameInStringTable,
    /// A kernel name is non-empty UTF-8. npud's own rule, stricter than ROCR (which takes any
    /// bytes): the format document calls names UTF-8, and an empty name is no symbol to look up.
    KernelNameText,
    /// Kernel names are unique in a section.
    UniqueNames,
    /// `kind` is 0 (`PdiInsts`) or 1 (`FullElf`).
    Kind,
    /// `num_cols >= 1` (and, at load, at most the agent's columns).
    NumCols,
    /// `PdiInsts` carries a PDI (`pdi_size > 0`).
    PdiPresent,
    /// `FullElf` has no separate PDI (`pdi_size == 0`).
    FullElfNoPdi,
    /// `FullElf` only in an `aie2p` section (only aie2p has a full-ELF `EI_OSABI`).
    FullElfArch,
    /// A `FullElf` entry's name is a kernel of its full ELF.
    FullElfKernelName,
    /// A `FullElf` entry's non-zero `kernarg_size` is 16 × the ELF's argument count.
    KernargSize,
    // ---- the nested full ELF ----
    /// The full ELF starts with `\x7fELF` and its 52-byte header is present.
    NestedElfHeader,
    /// `EI_CLASS == ELFCLASS32`.
    NestedElfClass,
    /// `EI_DATA == ELFDATA2LSB`.
    NestedElfData,
    /// `EI_OSABI == 69` (aie2p).
    NestedElfOsAbi,
    /// `e_shentsize == 40`, `e_shnum > 0`, `e_shstrndx < e_shnum`, section headers and data
    /// inside the ELF, names inside the section name table.
    NestedSectionHeaders,
    /// A `.symtab` with `sh_entsize == 16` and a string table in its `sh_link`.
    Symtab,
    /// Every `SHT_GROUP` starts with `GRP_COMDAT` and names its symbols and members in range.
    ComdatGroup,
    /// A group's `.ctrltext` member is `SHT_PROGBITS` and not empty.
    CtrlText,
    /// At least one group has a `.ctrltext` member.
    KernelPresent,
    /// Full kernel names (`<kernel>:<instance>`) are unique.
    UniqueElfKernels,
    /// `.rela.dyn` (`sh_entsize == 12`) and `.dynsym` (16) with their strings are well formed.
    Relocations,
    /// A relocation symbol is `.pdi*` (scheme 8) or an argument index 0..=4095 (scheme 5).
    RelocationSymbol,
    /// A `.pdi*` relocation names an existing section; same-named sections are byte-identical.
    PdiSection,
    /// PDI site: non-zero, a multiple of 4, `offset + 8 <= ctrl size`.
    PdiSite,
    /// Argument site: a multiple of 4, `offset + 12 <= ctrl size`.
    ArgSite,
    /// A kernel has at least one PDI patch site.
    PdiSitePresent,
    /// `.note.xrt.configuration`: one note, owner `XRT\0`, type 6, `descsz` 4.
    XrtConfigurationNote,
}

impl HsacoRule {
    /// The rule as the format documents state it.
    #[must_use]
    pub fn text(self) -> &'static str {
        use HsacoRule::*;
        match self {
            ElfMagic => "ELF magic",
            Elf64 => "ELF64 header",
            ElfLittleEndian => "little-endian ELF",
            SectionHeaders => "section header table (e_shentsize 64, inside the file)",
            SectionNames => "section names in .shstrtab",
            AieSectionPresent => "an AIE section (sh_size >= 48, inside the file, magic \"AIEK\")",
            ArchSection => "an AIE section named like the arch",
            VersionMajor => "version_major == 1",
            HeaderSize => "header_size >= 48",
            KernelEntrySize => "kernel_entry_size >= 44",
            KernelCount => "kernel_count >= 1",
            KernelTableInSection => "kernel table inside the section",
            StringTableAfterTable => "string_table_offset >= end of the kernel table",
            StringTableInSection => "string table inside the section",
            BlobPoolAfterStrings => "blob_pool_offset >= end of the string table and <= sh_size",
            InstsSize => "insts_size > 0",
            InstsWords => "PdiInsts: insts_size % 4 == 0",
            BlobInPool => "blob inside the blob pool",
            PdiAbsent => "pdi_size == 0 => pdi_offset == 0",
            NameInStringTable => "name_offset < string_table_size with a NUL before its end",
            KernelNameText => "kernel name is non-empty UTF-8",
            UniqueNames => "unique kernel names",
            Kind => "kind < 2",
            NumCols => "num_cols >= 1",
            PdiPresent => "PdiInsts has a PDI",
            FullElfNoPdi => "FullElf has no separate PDI",
            FullElfArch => "FullElf only in aie2p",
            FullElfKernelName => "FullElf name is a kernel of its full ELF",
            KernargSize => "FullElf kernarg_size is 0 or 16 x arguments",
            NestedElfHeader => "full ELF header",
            NestedElfClass => "full ELF is ELFCLASS32",
            NestedElfData => "full ELF is ELFDATA2LSB",
            NestedElfOsAbi => "full ELF EI_OSABI == 69 (aie2p)",
            NestedSectionHeaders => "full ELF section headers",
            Symtab => ".symtab with sh_entsize 16 and its string table",
            ComdatGroup => "COMDAT groups",
            CtrlText => ".ctrltext is PROGBITS and not empty",
            KernelPresent => "a group with a .ctrltext member",
            UniqueElfKernels => "unique full ELF kernel names",
            Relocations => ".rela.dyn/.dynsym/.dynstr",
            RelocationSymbol => {
                "relocation symbol .pdi* (scheme 8) or argument 0..=4095 (scheme 5)"
            }
            PdiSection => ".pdi* section present and same-named sections identical",
            PdiSite => "PDI site != 0, % 4 == 0, + 8 <= ctrl size",
            ArgSite => "argument site % 4 == 0, + 12 <= ctrl size",
            PdiSitePresent => "at least one PDI patch site",
            XrtConfigurationNote => ".note.xrt.configuration (one XRT note, type 6, descsz 4)",
        }
    }
}

impl fmt::Display for HsacoRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}
