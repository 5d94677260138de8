//! One AIE section: header, kernel table, string table and blob pool, validated as ROCR's
//! section parser and loader do.
//!
//! # Cost
//!
//! Kernel names are borrowed from the string table; their bytes are hashed once for the
//! uniqueness check, and that work is charged to a [`Budget`] of 4 units per section byte, so
//! entries whose names overlap (every suffix of one long string is a distinct name) are refused
//! with [`ArtifactError::OverLimit`] before they cost more. Each distinct full-ELF blob is parsed
//! once, and the distinct blobs parsed may together be at most as long as the section (as blobs
//! that do not overlap are), so entries naming one blob with many lengths cannot parse it many
//! times. Allocation: about 100 bytes per 44-byte kernel entry, 1/16 of the string table,
//! and each parsed full ELF's own (linear) cost.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use super::full_elf::{ElfKernel, FullElf};
use super::strtab::{StrTab, slice};
use super::{ENTRY_MIN, HEADER_MIN, HsacoRule, KernelKind, VERSION_MAJOR};
use crate::budget::{Budget, shown};
use crate::le::{u16_at, u32_at};
use crate::{ArtifactError, NpuGen};

/// A blob of the pool: where it is and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blob<'a> {
    /// Offset from the section start.
    pub offset: u32,
    /// The bytes.
    pub bytes: &'a [u8],
}

/// One kernel table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel<'a> {
    /// The HSA symbol name (for `FullElf`, `<kernel>:<instance>`), borrowed from the string
    /// table.
    pub name: &'a str,
    /// `PdiInsts` or `FullElf`.
    pub kind: KernelKind,
    /// The instruction sequence (`PdiInsts`) or the whole full ELF (`FullElf`).
    pub insts: Blob<'a>,
    /// The PDI (`PdiInsts`; `None` for `FullElf`).
    pub pdi: Option<Blob<'a>>,
    /// `kernarg_size` as stored (for `FullElf`, 0 means "16 × arguments").
    pub kernarg_size: u32,
    /// Partition column count.
    pub num_cols: u32,
    /// `FullElf`: the kernel in its nested ELF (control code, PDIs, patch sites).
    pub full_elf: Option<ElfKernel<'a>>,
}

impl Kernel<'_> {
    /// The kernarg size ROCR reports for the symbol: the stored value, or for `FullElf` with 0
    /// stored, 16 × the ELF's argument count.
    #[must_use]
    pub fn effective_kernarg_size(&self) -> u32 {
        match &self.full_elf {
            Some(k) if self.kernarg_size == 0 => k.kernarg_size(),
            _ => self.kernarg_size,
        }
    }
}

/// A validated AIE section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AieSection<'a> {
    /// The arch the section is named for.
    pub arch: NpuGen,
    /// Index of the section in the container's section header table.
    pub section_index: u32,
    /// File offset of the section.
    pub file_offset: u64,
    /// The section's bytes.
    pub bytes: &'a [u8],
    /// `(version_major, version_minor)`.
    pub version: (u16, u16),
    /// `header_size` (the kernel table's offset).
    pub header_size: u32,
    /// `kernel_entry_size` (the table's stride).
    pub kernel_entry_size: u32,
    /// `string_table_offset`.
    pub string_table_offset: u32,
    /// `string_table_size`.
    pub string_table_size: u32,
    /// `blob_pool_offset`.
    pub blob_pool_offset: u32,
    /// The kernels, in table order.
    pub kernels: Vec<Kernel<'a>>,
}

impl<'a> AieSection<'a> {
    /// The kernel with this name.
    #[must_use]
    pub fn kernel(&self, name: &str) -> Option<&Kernel<'a>> {
        // Linear: a caller looks up one name, and names are unique.
        self.kernels.iter().find(|k| k.name == name)
    }

    /// ROCR's load-time column check: every kernel's `num_cols` is at most the agent's columns
    /// (Phoenix: device columns − 1; Strix family: device columns).
    ///
    /// # Errors
    ///
    /// [`ArtifactError::HsacoSection`] ([`HsacoRule::NumCols`]) naming the first kernel that
    /// needs more.
    pub fn check_columns(&self, agent_columns: u32) -> Result<(), ArtifactError> {
        for (i, k) in self.kernels.iter().enumerate() {
            if k.num_cols > agent_columns {
                let off =
                    u64::from(self.header_size) + i as u64 * u64::from(self.kernel_entry_size) + 24;
                return Err(ArtifactError::HsacoSection {
                    arch: self.arch.agent_name(),
                    rule: HsacoRule::NumCols,
                    offset: off,
                    file_offset: self.file_offset + off,
                    detail: format!(
                        "kernel {i} {:?} needs {} columns; the agent has {agent_columns}",
                        shown(k.name.as_bytes()),
                        k.num_cols
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Parses and validates the section `bytes` found at `file_offset`.
pub(crate) fn parse_section<'a>(
    bytes: &'a [u8],
    arch: NpuGen,
    section_index: u32,
    file_offset: u64,
) -> Result<AieSection<'a>, ArtifactError> {
    let size = bytes.len() as u64;
    let fail = |rule, offset: u64, detail: String| ArtifactError::HsacoSection {
        arch: arch.agent_name(),
        rule,
        offset,
        file_offset: file_offset.saturating_add(offset),
        detail,
    };
    // The caller found the magic in a section of at least 48 bytes.
    let w = |o| u32_at(bytes, o).unwrap_or(0);
    let version = (u16_at(bytes, 4).unwrap_or(0), u16_at(bytes, 6).unwrap_or(0));
    let header_size = w(8);
    let kernel_count = w(12);
    let entry_size = w(16);
    let st_off = w(20);
    let st_size = w(24);
    let pool = w(28);
    if version.0 != VERSION_MAJOR {
        return Err(fail(
            HsacoRule::VersionMajor,
            4,
            format!("version_major is {}; expected 1", version.0),
        ));
    }
    if header_size < HEADER_MIN {
        return Err(fail(
            HsacoRule::HeaderSize,
            8,
            format!("header_size is {header_size}; expected at least 48"),
        ));
    }
    if entry_size < ENTRY_MIN {
        return Err(fail(
            HsacoRule::KernelEntrySize,
            16,
            format!("kernel_entry_size is {entry_size}; expected at least 44"),
        ));
    }
    let table_end = u64::from(header_size) + u64::from(kernel_count) * u64::from(entry_size);
    if table_end > size {
        return Err(fail(
            HsacoRule::KernelTableInSection,
            12,
            format!(
                "{kernel_count} entries of {entry_size} bytes from {header_size} end at {table_end}, past the {size}-byte section"
            ),
        ));
    }
    if u64::from(st_off) < table_end {
        return Err(fail(
            HsacoRule::StringTableAfterTable,
            20,
            format!("string_table_offset is {st_off}; the kernel table ends at {table_end}"),
        ));
    }
    let st_end = u64::from(st_off) + u64::from(st_size);
    if st_end > size {
        return Err(fail(
            HsacoRule::StringTableInSection,
            24,
            format!(
                "string table {st_off} + {st_size} ends at {st_end}, past the {size}-byte section"
            ),
        ));
    }
    if u64::from(pool) < st_end || u64::from(pool) > size {
        return Err(fail(
            HsacoRule::BlobPoolAfterStrings,
            28,
            format!(
                "blob_pool_offset is {pool}; expected from {st_end} (string table end) to {size} (section size)"
            ),
        ));
    }
    if kernel_count == 0 {
        return Err(fail(
            HsacoRule::KernelCount,
            12,
            "kernel_count is 0; expected at least 1".into(),
        ));
    }
    let mut budget = Budget::new(
        match arch {
            NpuGen::Npu1 => "hsaco section aie2",
            NpuGen::Npu2 => "hsaco section aie2p",
        },
        bytes.len(),
    );
    let strings = StrTab::new(slice(bytes, u64::from(st_off), u64::from(st_size)).unwrap_or(&[]));
    let mut names = HashSet::new();
    let mut kernels = Vec::with_capacity(kernel_count as usize);
    let in_pool = |off: u32, len: u32| off >= pool && u64::from(off) + u64::from(len) <= size;
    for i in 0..kernel_count {
        let e = header_size as usize + i as usize * entry_size as usize;
        let f = |o: usize| u32_at(bytes, e + o).unwrap_or(0);
        let at = |o: usize| (e + o) as u64;
        let (name_off, insts_off, insts_size, pdi_off, pdi_size) = (f(0), f(4), f(8), f(12), f(16));
        let (kernarg_size, num_cols, kind) = (f(20), f(24), f(28));
        let kind = match kind {
            0 => KernelKind::PdiInsts,
            1 => KernelKind::FullElf,
            k => {
                return Err(fail(
                    HsacoRule::Kind,
                    at(28),
                    format!("kernel {i}: kind is {k}; expected 0 (PdiInsts) or 1 (FullElf)"),
                ));
            }
        };
        if insts_size == 0 {
            return Err(fail(
                HsacoRule::InstsSize,
                at(8),
                format!("kernel {i}: insts_size is 0"),
            ));
        }
        if kind == KernelKind::PdiInsts && insts_size % 4 != 0 {
            return Err(fail(
                HsacoRule::InstsWords,
                at(8),
                format!("kernel {i}: insts_size is {insts_size}; expected a multiple of 4"),
            ));
        }
        if !in_pool(insts_off, insts_size) {
            return Err(fail(
                HsacoRule::BlobInPool,
                at(4),
                format!(
                    "kernel {i}: insts blob {insts_off} + {insts_size}; expected inside the blob pool {pool}..{size}"
                ),
            ));
        }
        if pdi_size == 0 && pdi_off != 0 {
            return Err(fail(
                HsacoRule::PdiAbsent,
                at(12),
                format!("kernel {i}: pdi_size is 0 but pdi_offset is {pdi_off}; expected 0"),
            ));
        }
        if kind == KernelKind::FullElf && pdi_size != 0 {
            return Err(fail(
                HsacoRule::FullElfNoPdi,
                at(16),
                format!(
                    "kernel {i}: FullElf with pdi_size {pdi_size}; expected 0 (the PDI is inside the full ELF)"
                ),
            ));
        }
        if pdi_size != 0 && !in_pool(pdi_off, pdi_size) {
            return Err(fail(
                HsacoRule::BlobInPool,
                at(12),
                format!(
                    "kernel {i}: PDI blob {pdi_off} + {pdi_size}; expected inside the blob pool {pool}..{size}"
                ),
            ));
        }
        let name = (name_off < st_size)
            .then(|| strings.get(u64::from(name_off)))
            .flatten();
        let Some(name) = name else {
            return Err(fail(
                HsacoRule::NameInStringTable,
                at(0),
                format!(
                    "kernel {i}: name_offset {name_off} has no NUL-terminated name inside the {st_size}-byte string table"
                ),
            ));
        };
        let Some(name_text) = std::str::from_utf8(name).ok().filter(|n| !n.is_empty()) else {
            return Err(fail(
                HsacoRule::KernelNameText,
                at(0),
                format!(
                    "kernel {i}: name {:?} at string-table offset {name_off}; expected non-empty UTF-8",
                    shown(name)
                ),
            ));
        };
        // Hashing (and later comparing) the name reads it whole.
        budget.charge_bytes("kernel name bytes", name.len())?;
        if !names.insert(name) {
            return Err(fail(
                HsacoRule::UniqueNames,
                at(0),
                format!("kernel {i}: name {:?} is already defined", shown(name)),
            ));
        }
        let blob = |off: u32, len: u32| Blob {
            offset: off,
            bytes: slice(bytes, u64::from(off), u64::from(len)).unwrap_or(&[]),
        };
        kernels.push(Kernel {
            name: name_text,
            kind,
            insts: blob(insts_off, insts_size),
            pdi: (pdi_size != 0).then(|| blob(pdi_off, pdi_size)),
            kernarg_size,
            num_cols,
            full_elf: None,
        });
    }

    // The loader's rules, per kernel.
    let mut elves: HashMap<(u32, usize), FullElf<'a>> = HashMap::new();
    let mut elf_bytes = Budget::with_limit(budget.artifact(), bytes.len(), size);
    for (i, k) in kernels.iter_mut().enumerate() {
        let e = u64::from(header_size) + i as u64 * u64::from(entry_size);
        let name = shown(k.name.as_bytes());
        if k.num_cols == 0 {
            return Err(fail(
                HsacoRule::NumCols,
                e + 24,
                format!("kernel {i} {name:?}: num_cols is 0; expected at least 1"),
            ));
        }
        match k.kind {
            KernelKind::PdiInsts => {
                if k.pdi.is_none() {
                    return Err(fail(
                        HsacoRule::PdiPresent,
                        e + 16,
                        format!(
                            "kernel {i} {name:?}: PdiInsts with pdi_size 0; ROCR requires a PDI"
                        ),
                    ));
                }
            }
            KernelKind::FullElf => {
                if arch != NpuGen::Npu2 {
                    return Err(fail(
                        HsacoRule::FullElfArch,
                        e + 28,
                        format!(
                            "kernel {i} {name:?}: FullElf in an {} section; full ELF exists for aie2p only",
                            arch.agent_name()
                        ),
                    ));
                }
                let key = (k.insts.offset, k.insts.bytes.len());
                if let Entry::Vacant(slot) = elves.entry(key) {
                    // Blobs may overlap (one offset, many lengths): the distinct blobs parsed
                    // may together be as long as the section, as blobs that do not overlap are.
                    elf_bytes.charge_bytes("full ELF blob bytes parsed", key.1)?;
                    let parsed = FullElf::parse(k.insts.bytes).map_err(|err| match err {
                        ArtifactError::HsacoFullElf {
                            rule,
                            offset,
                            detail,
                            ..
                        } => ArtifactError::HsacoFullElf {
                            rule,
                            offset,
                            blob_file_offset: Some(file_offset + u64::from(k.insts.offset)),
                            detail: format!("kernel {i} {name:?}: {detail}"),
                        },
                        other => other,
                    })?;
                    slot.insert(parsed);
                }
                let elf = &elves[&key];
                let Some(ek) = elf.kernel(k.name) else {
                    let known: Vec<String> = elf
                        .kernels
                        .iter()
                        .take(8)
                        .map(|k| shown(k.name.as_bytes()))
                        .collect();
                    return Err(fail(
                        HsacoRule::FullElfKernelName,
                        e,
                        format!(
                            "kernel {i} {name:?} is not in its full ELF, which defines {known:?}"
                        ),
                    ));
                };
                if k.kernarg_size != 0 && k.kernarg_size != ek.kernarg_size() {
                    return Err(fail(
                        HsacoRule::KernargSize,
                        e + 20,
                        format!(
                            "kernel {i} {name:?}: kernarg_size is {}; its full ELF has {} arguments, so expected 0 or {}",
                            k.kernarg_size,
                            ek.arg_count,
                            ek.kernarg_size()
                        ),
                    ));
                }
                if !ek.has_pdi_site() {
                    return Err(fail(
                        HsacoRule::PdiSitePresent,
                        e,
                        format!("kernel {i} {name:?}: its control code has no PDI patch site"),
                    ));
                }
                k.full_elf = Some(ek.clone());
            }
        }
    }
    Ok(AieSection {
        arch,
        section_index,
        file_offset,
        bytes,
        version,
        header_size,
        kernel_entry_size: entry_size,
        string_table_offset: st_off,
        string_table_size: st_size,
        blob_pool_offset: pool,
        kernels,
    })
}
