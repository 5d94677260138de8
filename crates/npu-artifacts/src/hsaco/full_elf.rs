//! The nested full ELF of a `FullElf` kernel: an ELF32 file from `aiecc --get-full-elf` holding
//! control code, PDIs and the relocations that patch one into the other (ROCR's rules, see the
//! [module docs](super#the-nested-full-elf)).
//!
//! # Cost
//!
//! Names are looked up through a NUL index of 1/16 of each string table and borrowed; the work
//! that entries sharing data can multiply is charged to a [`Budget`] of 4 units per ELF byte:
//! group member lists walked, kernel names composed and hashed, `.pdi*` names hashed, same-named
//! PDI sections compared. Patch sites are counted before they are stored and their bytes charged
//! to a second budget of 4 bytes per ELF byte, so kernels sharing one control code cannot
//! multiply the relocations. Past either budget the ELF is refused with
//! [`ArtifactError::OverLimit`].

use std::collections::{HashMap, HashSet};

use super::HsacoRule;
use super::sites::{PatchScheme, PatchSite, SiteTarget, arg_index};
use super::strtab::{StrTab, slice};
use crate::ArtifactError;
use crate::budget::{Budget, shown};
use crate::le::{u16_at, u32_at};

/// `EI_OSABI` of an aie2p full ELF.
pub const OSABI_AIE2P: u8 = 69;
/// `GRP_COMDAT`.
pub const GRP_COMDAT: u32 = 1;

pub(crate) const SHT_PROGBITS: u32 = 1;
pub(crate) const SHT_GROUP: u32 = 17;
const ELF32_HEADER: usize = 52;
const SHDR32: usize = 40;
const SYM32: usize = 16;
const RELA32: usize = 12;

/// A `.pdi*` section a kernel loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfPdi<'a> {
    /// The section name (`.pdi`, `.pdi.0`, ...).
    pub name: String,
    /// Its bytes.
    pub bytes: &'a [u8],
}

/// One kernel (COMDAT group with a `.ctrltext` member) of a full ELF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfKernel<'a> {
    /// `<kernel>:<instance>`, for example `main:sequence`.
    pub name: String,
    /// Section index of the control code.
    pub ctrl_section: u32,
    /// The control code.
    pub ctrl_code: &'a [u8],
    /// Patch sites into the control code, in `.rela.dyn` order.
    pub sites: Vec<PatchSite>,
    /// The distinct PDIs the sites name, in order of first use.
    pub pdis: Vec<ElfPdi<'a>>,
    /// Highest argument index + 1 (0 without argument sites).
    pub arg_count: u32,
}

impl ElfKernel<'_> {
    /// `16 × arg_count`, the kernarg size ROCR computes for it.
    #[must_use]
    pub fn kernarg_size(&self) -> u32 {
        self.arg_count.saturating_mul(16)
    }

    /// Whether some site patches a PDI address (ROCR refuses to load a kernel without one).
    #[must_use]
    pub fn has_pdi_site(&self) -> bool {
        self.sites
            .iter()
            .any(|s| matches!(s.target, SiteTarget::Pdi(_)))
    }
}

/// A parsed full ELF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullElf<'a> {
    /// The whole ELF.
    pub bytes: &'a [u8],
    /// `EI_ABIVERSION` (1 selects the addend-packed relocation encoding).
    pub abi_version: u8,
    /// Kernels in section-header order of their groups.
    pub kernels: Vec<ElfKernel<'a>>,
    note: Option<(u64, &'a [u8])>,
    /// Indices of `kernels`, sorted by name.
    by_name: Vec<u32>,
}

#[derive(Debug, Clone)]
struct Shdr<'a> {
    name: &'a [u8],
    ty: u32,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    entsize: u32,
    /// ELF offset of the header itself.
    at: u64,
}

fn err(rule: HsacoRule, offset: u64, detail: impl Into<String>) -> ArtifactError {
    ArtifactError::HsacoFullElf {
        rule,
        offset,
        blob_file_offset: None,
        detail: detail.into(),
    }
}

/// A name for a message (cut to 64 bytes).
fn lossy(b: &[u8]) -> String {
    shown(b)
}

/// `_Z<len><name>...` → `<name>`; anything else unchanged.
fn demangle(sym: &[u8]) -> &[u8] {
    let Some(rest) = sym.strip_prefix(b"_Z") else {
        return sym;
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 9 {
        return sym;
    }
    let len: usize = std::str::from_utf8(&rest[..digits])
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(usize::MAX);
    rest.get(digits..).and_then(|r| r.get(..len)).unwrap_or(sym)
}

impl<'a> FullElf<'a> {
    /// Parses and validates a full ELF as ROCR's loader does.
    ///
    /// # Cost
    ///
    /// Linear in `bytes` (see the [module docs](self#cost)): about 50 bytes per 40-byte section
    /// header, 1/16 of each string table, each kernel's name, and at most 4 bytes of patch sites
    /// per ELF byte; work is at most a constant per byte plus 4 budget units per byte.
    ///
    /// # Errors
    ///
    /// [`ArtifactError::HsacoFullElf`] naming the broken rule and the ELF offset;
    /// [`ArtifactError::OverLimit`] when entries share more data than the budget allows.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ArtifactError> {
        if bytes.len() < ELF32_HEADER || bytes.get(0..4) != Some(b"\x7fELF".as_slice()) {
            return Err(err(
                HsacoRule::NestedElfHeader,
                0,
                format!(
                    "{} bytes starting {:02x?}; expected \\x7fELF and a 52-byte header",
                    bytes.len(),
                    &bytes[..bytes.len().min(4)]
                ),
            ));
        }
        if bytes[4] != 1 {
            return Err(err(
                HsacoRule::NestedElfClass,
                4,
                format!("EI_CLASS is {}; expected 1 (ELFCLASS32)", bytes[4]),
            ));
        }
        if bytes[5] != 1 {
            return Err(err(
                HsacoRule::NestedElfData,
                5,
                format!("EI_DATA is {}; expected 1 (ELFDATA2LSB)", bytes[5]),
            ));
        }
        if bytes[7] != OSABI_AIE2P {
            return Err(err(
                HsacoRule::NestedElfOsAbi,
                7,
                format!("EI_OSABI is {}; expected {OSABI_AIE2P} (aie2p)", bytes[7]),
            ));
        }
        let abi_version = bytes[8];
        let mut budget = Budget::new("full ELF", bytes.len());
        let mut site_bytes = Budget::new("full ELF", bytes.len());
        let shoff = u64::from(u32_at(bytes, 32).unwrap_or(0));
        let shentsize = u16_at(bytes, 46).unwrap_or(0);
        let shnum = u16_at(bytes, 48).unwrap_or(0);
        let shstrndx = u16_at(bytes, 50).unwrap_or(0);
        let hdr_err = |at, d: String| err(HsacoRule::NestedSectionHeaders, at, d);
        if usize::from(shentsize) != SHDR32 {
            return Err(hdr_err(
                46,
                format!("e_shentsize is {shentsize}; expected 40"),
            ));
        }
        if shnum == 0 {
            return Err(hdr_err(48, "e_shnum is 0; expected at least 1".into()));
        }
        if shstrndx >= shnum {
            return Err(hdr_err(
                50,
                format!("e_shstrndx is {shstrndx}; expected less than e_shnum {shnum}"),
            ));
        }
        let table = slice(bytes, shoff, u64::from(shnum) * SHDR32 as u64).ok_or_else(|| {
            hdr_err(
                32,
                format!(
                    "e_shoff {shoff:#x} + {shnum} headers of 40 bytes ends past the {}-byte ELF",
                    bytes.len()
                ),
            )
        })?;
        let raw = |i: u16| {
            let h = &table[usize::from(i) * 40..usize::from(i) * 40 + 40];
            let w = |o| u32_at(h, o).unwrap_or(0);
            Shdr {
                name: &[],
                ty: w(4),
                offset: u64::from(w(16)),
                size: u64::from(w(20)),
                link: w(24),
                info: w(28),
                entsize: w(36),
                at: shoff + u64::from(i) * SHDR32 as u64,
            }
        };
        let data = |s: &Shdr<'_>| -> Result<&'a [u8], ArtifactError> {
            slice(bytes, s.offset, s.size).ok_or_else(|| {
                err(
                    HsacoRule::NestedSectionHeaders,
                    s.at + 16,
                    format!(
                        "section {} at {:#x}, {} bytes, ends past the {}-byte ELF",
                        lossy(s.name),
                        s.offset,
                        s.size,
                        bytes.len()
                    ),
                )
            })
        };
        let names = StrTab::new(data(&raw(shstrndx))?);
        let mut secs = Vec::with_capacity(usize::from(shnum));
        for i in 0..shnum {
            let mut s = raw(i);
            let off = u32_at(table, usize::from(i) * 40).unwrap_or(0);
            s.name = names.get(u64::from(off)).ok_or_else(|| {
                hdr_err(
                    s.at,
                    format!("section {i}'s sh_name {off} has no NUL-terminated name in the section name table"),
                )
            })?;
            secs.push(s);
        }
        let by_name = |n: &[u8]| secs.iter().position(|s| s.name == n);

        // .symtab and its strings.
        let sym_err = |at, d: String| err(HsacoRule::Symtab, at, d);
        let symtab_i =
            by_name(b".symtab").ok_or_else(|| sym_err(0, "no .symtab section".into()))?;
        let symtab_h = &secs[symtab_i];
        if symtab_h.entsize as usize != SYM32 {
            return Err(sym_err(
                symtab_h.at + 36,
                format!(".symtab sh_entsize is {}; expected 16", symtab_h.entsize),
            ));
        }
        let symtab = data(symtab_h)?;
        let strtab_h = secs.get(symtab_h.link as usize).ok_or_else(|| {
            sym_err(
                symtab_h.at + 24,
                format!(".symtab sh_link {} is not a section", symtab_h.link),
            )
        })?;
        let strtab = StrTab::new(data(strtab_h)?);
        let sym_count = symtab.len() / SYM32;
        let sym_field = |table: &[u8], i: usize, o: usize| u32_at(table, i * 16 + o).unwrap_or(0);

        // COMDAT groups → kernels.
        let mut kernels: Vec<ElfKernel<'a>> = Vec::new();
        let mut group_at: Vec<(usize, u64)> = Vec::new();
        for (gi, g) in secs.iter().enumerate() {
            if g.ty != SHT_GROUP {
                continue;
            }
            let gerr = |at, d: String| err(HsacoRule::ComdatGroup, at, d);
            let words = data(g)?;
            if words.len() < 4 || words.len() % 4 != 0 {
                return Err(gerr(
                    g.at + 20,
                    format!(
                        "group section {gi} is {} bytes; expected a non-empty array of 32-bit words",
                        words.len()
                    ),
                ));
            }
            let flags = u32_at(words, 0).unwrap_or(0);
            if flags != GRP_COMDAT {
                return Err(gerr(
                    g.offset,
                    format!("group section {gi} flags are {flags:#x}; expected GRP_COMDAT (1)"),
                ));
            }
            let mut ctrl = None;
            // Groups may share one member list: each walk is charged.
            budget.charge("group members", (words.len() / 4) as u64)?;
            for m in 1..words.len() / 4 {
                let idx = u32_at(words, m * 4).unwrap_or(0);
                let member = secs.get(idx as usize).ok_or_else(|| {
                    gerr(
                        g.offset + (m as u64) * 4,
                        format!("group section {gi} member {idx} is not a section"),
                    )
                })?;
                if member.name.starts_with(b".ctrltext") {
                    ctrl = Some(idx);
                }
            }
            let Some(ctrl) = ctrl else { continue };
            let inst = g.info as usize;
            if inst >= sym_count {
                return Err(gerr(
                    g.at + 28,
                    format!(
                        "group section {gi} sh_info {inst} is not a .symtab index (count {sym_count})"
                    ),
                ));
            }
            let inst_name = strtab
                .get(u64::from(sym_field(symtab, inst, 0)))
                .ok_or_else(|| {
                    gerr(
                        symtab_h.offset + inst as u64 * 16,
                        format!("instance symbol {inst} has no name in the string table"),
                    )
                })?;
            let kern = usize::from(u16_at(symtab, inst * 16 + 14).unwrap_or(0));
            if kern >= sym_count {
                return Err(gerr(
                    symtab_h.offset + inst as u64 * 16 + 14,
                    format!(
                        "instance symbol {inst}'s st_shndx {kern} is not a .symtab index (count {sym_count})"
                    ),
                ));
            }
            let kern_name = strtab
                .get(u64::from(sym_field(symtab, kern, 0)))
                .ok_or_else(|| {
                    gerr(
                        symtab_h.offset + kern as u64 * 16,
                        format!("kernel symbol {kern} has no name in the string table"),
                    )
                })?;
            let c = &secs[ctrl as usize];
            if c.ty != SHT_PROGBITS || c.size == 0 {
                return Err(err(
                    HsacoRule::CtrlText,
                    c.at + 4,
                    format!(
                        "{} (section {ctrl}) has sh_type {} and {} bytes; expected SHT_PROGBITS (1), not empty",
                        lossy(c.name),
                        c.ty,
                        c.size
                    ),
                ));
            }
            let kern_name = demangle(kern_name);
            // Groups may share one long symbol name: each copy is charged, and its hash below.
            let name_len = kern_name.len() + 1 + inst_name.len();
            budget.charge_bytes("kernel name bytes", name_len.saturating_mul(2))?;
            let name = format!(
                "{}:{}",
                String::from_utf8_lossy(kern_name),
                String::from_utf8_lossy(inst_name)
            );
            group_at.push((gi, g.at));
            kernels.push(ElfKernel {
                name,
                ctrl_section: ctrl,
                ctrl_code: data(c)?,
                sites: Vec::new(),
                pdis: Vec::new(),
                arg_count: 0,
            });
        }
        if kernels.is_empty() {
            return Err(err(
                HsacoRule::KernelPresent,
                shoff,
                "no SHT_GROUP section has a .ctrltext member",
            ));
        }
        // Unique names: hashing reads each name once more (charged above with its copy).
        let mut seen = HashSet::with_capacity(kernels.len());
        for (k, &(gi, at)) in kernels.iter().zip(&group_at) {
            if !seen.insert(k.name.as_str()) {
                return Err(err(
                    HsacoRule::UniqueElfKernels,
                    at,
                    format!(
                        "group section {gi} defines kernel {:?} again",
                        shown(k.name.as_bytes())
                    ),
                ));
            }
        }
        drop(seen);

        // Relocations, read only when .rela.dyn, .dynsym and .dynstr all exist.
        if let (Some(ri), Some(di), Some(_)) = (
            by_name(b".rela.dyn"),
            by_name(b".dynsym"),
            by_name(b".dynstr"),
        ) {
            let rerr = |at, d: String| err(HsacoRule::Relocations, at, d);
            let (rh, dh) = (&secs[ri], &secs[di]);
            if rh.entsize as usize != RELA32 {
                return Err(rerr(
                    rh.at + 36,
                    format!(".rela.dyn sh_entsize is {}; expected 12", rh.entsize),
                ));
            }
            if dh.entsize as usize != SYM32 {
                return Err(rerr(
                    dh.at + 36,
                    format!(".dynsym sh_entsize is {}; expected 16", dh.entsize),
                ));
            }
            let rela = data(rh)?;
            let dynsym = data(dh)?;
            let dynstr_h = secs.get(dh.link as usize).ok_or_else(|| {
                rerr(
                    dh.at + 24,
                    format!(".dynsym sh_link {} is not a section", dh.link),
                )
            })?;
            let dynstr = StrTab::new(data(dynstr_h)?);
            let dyn_count = dynsym.len() / 16;
            let mut by_ctrl: HashMap<u32, Vec<usize>> = HashMap::new();
            for (k, kern) in kernels.iter().enumerate() {
                by_ctrl.entry(kern.ctrl_section).or_default().push(k);
            }
            let mut pdi_sections: HashMap<&[u8], Vec<usize>> = HashMap::new();
            for (i, s) in secs.iter().enumerate() {
                if s.name.starts_with(b".pdi") {
                    budget.charge_bytes(".pdi section name bytes", s.name.len())?;
                    pdi_sections.entry(s.name).or_default().push(i);
                }
            }
            // Count each kernel's sites first, so their memory is charged before it is taken.
            let mut per_ctrl: HashMap<u32, u64> = HashMap::new();
            for r in 0..rela.len() / 12 {
                let sym = (u32_at(rela, r * 12 + 4).unwrap_or(0) >> 8) as usize;
                let shndx = u32::from(u16_at(dynsym, sym * 16 + 14).unwrap_or(0));
                if sym < dyn_count && by_ctrl.contains_key(&shndx) {
                    *per_ctrl.entry(shndx).or_default() += 1;
                }
            }
            for (ctrl, users) in &by_ctrl {
                let n = per_ctrl.get(ctrl).copied().unwrap_or(0);
                site_bytes.charge(
                    "patch site bytes",
                    n.saturating_mul(users.len() as u64)
                        .saturating_mul(std::mem::size_of::<PatchSite>() as u64),
                )?;
                for &k in users {
                    kernels[k]
                        .sites
                        .reserve_exact(usize::try_from(n).unwrap_or(0));
                }
            }
            drop(per_ctrl);
            let mut pdi_checked: HashMap<&[u8], (u32, &'a [u8])> = HashMap::new();
            let mut kernel_pdis: HashSet<(usize, u32)> = HashSet::new();
            for r in 0..rela.len() / 12 {
                let at = rh.offset + r as u64 * 12;
                let r_offset = u32_at(rela, r * 12).unwrap_or(0);
                let r_info = u32_at(rela, r * 12 + 4).unwrap_or(0);
                let r_addend = u32_at(rela, r * 12 + 8).unwrap_or(0);
                let sym = (r_info >> 8) as usize;
                if sym >= dyn_count {
                    return Err(rerr(
                        at + 4,
                        format!(
                            "relocation {r} names .dynsym {sym}; .dynsym has {dyn_count} symbols"
                        ),
                    ));
                }
                let shndx = u32::from(u16_at(dynsym, sym * 16 + 14).unwrap_or(0));
                let Some(users) = by_ctrl.get(&shndx) else {
                    continue;
                };
                let name = dynstr
                    .get(u64::from(sym_field(dynsym, sym, 0)))
                    .ok_or_else(|| {
                        rerr(
                            dh.offset + sym as u64 * 16,
                            format!("relocation {r}'s symbol {sym} has no name in .dynstr"),
                        )
                    })?;
                let (scheme, addend) = if abi_version == 1 {
                    (PatchScheme(r_addend & 0xF), r_addend >> 4)
                } else {
                    (PatchScheme(r_info & 0xFF), r_addend)
                };
                let ctrl_len = kernels[users[0]].ctrl_code.len() as u64;
                let off = u64::from(r_offset);
                let target = if name.starts_with(b".pdi") {
                    // Relocations may share one long name: hashing it is charged, and so is the
                    // copy each kernel's site keeps.
                    budget.charge_bytes(".pdi symbol name bytes", name.len())?;
                    site_bytes
                        .charge_bytes("patch site bytes", name.len().saturating_mul(users.len()))?;
                    if scheme != PatchScheme::ADDRESS_64 {
                        return Err(err(
                            HsacoRule::RelocationSymbol,
                            at,
                            format!(
                                "relocation {r} for PDI {} has scheme {}; expected 8 (Address64)",
                                lossy(name),
                                scheme.0
                            ),
                        ));
                    }
                    if !pdi_checked.contains_key(name) {
                        let same = pdi_sections.get(name).ok_or_else(|| {
                            err(
                                HsacoRule::PdiSection,
                                at + 4,
                                format!(
                                    "relocation {r} names PDI section {}, which does not exist",
                                    lossy(name)
                                ),
                            )
                        })?;
                        let first = data(&secs[same[0]])?;
                        for &o in &same[1..] {
                            budget.charge_bytes(
                                "same-named PDI section bytes compared",
                                first.len(),
                            )?;
                            if data(&secs[o])? != first {
                                return Err(err(
                                    HsacoRule::PdiSection,
                                    secs[o].at,
                                    format!(
                                        "sections {} and {o} are both named {} but their contents differ",
                                        same[0],
                                        lossy(name)
                                    ),
                                ));
                            }
                        }
                        let id = u32::try_from(pdi_checked.len()).unwrap_or(u32::MAX);
                        pdi_checked.insert(name, (id, first));
                    }
                    if off == 0 || off % 4 != 0 || off + 8 > ctrl_len {
                        return Err(err(
                            HsacoRule::PdiSite,
                            at,
                            format!(
                                "relocation {r}: PDI site at control-code offset {off}; expected non-zero, a multiple of 4, and offset + 8 <= {ctrl_len}"
                            ),
                        ));
                    }
                    SiteTarget::Pdi(String::from_utf8_lossy(name).into_owned())
                } else if let Some(arg) = arg_index(name) {
                    if scheme != PatchScheme::SHIM_DMA_48 {
                        return Err(err(
                            HsacoRule::RelocationSymbol,
                            at,
                            format!(
                                "relocation {r} for argument {arg} has scheme {}; expected 5 (ShimDma48)",
                                scheme.0
                            ),
                        ));
                    }
                    if off % 4 != 0 || off + 12 > ctrl_len {
                        return Err(err(
                            HsacoRule::ArgSite,
                            at,
                            format!(
                                "relocation {r}: argument {arg} site at control-code offset {off}; expected a multiple of 4 and offset + 12 <= {ctrl_len}"
                            ),
                        ));
                    }
                    SiteTarget::Arg(arg)
                } else {
                    return Err(err(
                        HsacoRule::RelocationSymbol,
                        at,
                        format!(
                            "relocation {r} names symbol {:?}; expected .pdi* or an argument index 0..=4095",
                            lossy(name)
                        ),
                    ));
                };
                for &k in users {
                    let kern = &mut kernels[k];
                    match &target {
                        SiteTarget::Arg(a) => {
                            kern.arg_count = kern.arg_count.max(u32::from(*a) + 1)
                        }
                        SiteTarget::Pdi(n) => {
                            let (id, pdi) = pdi_checked[name];
                            if kernel_pdis.insert((k, id)) {
                                kern.pdis.push(ElfPdi {
                                    name: n.clone(),
                                    bytes: pdi,
                                });
                            }
                        }
                    }
                    kern.sites.push(PatchSite {
                        scheme,
                        offset: r_offset,
                        addend,
                        target: target.clone(),
                    });
                }
            }
        }
        let note = match by_name(b".note.xrt.configuration") {
            Some(i) => Some((secs[i].offset, data(&secs[i])?)),
            None => None,
        };
        // Fewer than 65536 kernels: one per section header at most.
        let mut by_name: Vec<u32> = (0..kernels.len())
            .map(|k| u32::try_from(k).unwrap_or(u32::MAX))
            .collect();
        by_name.sort_unstable_by(|&a, &b| kernels[a as usize].name.cmp(&kernels[b as usize].name));
        Ok(Self {
            bytes,
            abi_version,
            kernels,
            note,
            by_name,
        })
    }

    /// The kernel with this `<kernel>:<instance>` name (a binary search).
    #[must_use]
    pub fn kernel(&self, name: &str) -> Option<&ElfKernel<'a>> {
        let i = self
            .by_name
            .binary_search_by(|&k| self.kernels[k as usize].name.as_str().cmp(name))
            .ok()?;
        self.kernels.get(self.by_name[i] as usize)
    }

    /// The partition column count from `.note.xrt.configuration` (`None` without that section).
    /// ROCR ignores the note; the packer takes `num_cols` from it.
    ///
    /// # Errors
    ///
    /// [`ArtifactError::HsacoFullElf`] ([`HsacoRule::XrtConfigurationNote`]) when the section is
    /// not exactly one note with owner `XRT\0`, type 6 and a 4-byte descriptor.
    pub fn xrt_columns(&self) -> Result<Option<u32>, ArtifactError> {
        let Some((at, n)) = self.note else {
            return Ok(None);
        };
        let w = |o| u32_at(n, o);
        let ok = n.len() == 20
            && w(0) == Some(4)
            && w(4) == Some(4)
            && w(8) == Some(6)
            && n.get(12..16) == Some(b"XRT\0".as_slice());
        if !ok {
            return Err(err(
                HsacoRule::XrtConfigurationNote,
                at,
                format!(
                    "{} bytes {:02x?}; expected one 20-byte note: namesz 4, descsz 4, type 6, \"XRT\\0\", u32 columns",
                    n.len(),
                    &n[..n.len().min(20)]
                ),
            ));
        }
        Ok(w(16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangle_reads_only_the_length_prefixed_name() {
        assert_eq!(demangle(b"_Z4mainPcPcPc"), b"main");
        assert_eq!(demangle(b"main"), b"main");
        assert_eq!(demangle(b"_Z9ab"), b"_Z9ab", "too short: unchanged");
        assert_eq!(demangle(b"_Zx"), b"_Zx");
        assert_eq!(demangle(b"_Z99999999999a"), b"_Z99999999999a");
    }
}
