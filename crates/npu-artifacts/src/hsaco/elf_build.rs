//! [`FullElfBuilder`]: writes a minimal full ELF (ELF32, aie2p) with the structure ROCR reads:
//! COMDAT groups naming `.ctrltext` members, `.pdi*` sections, `.rela.dyn`/`.dynsym`/`.dynstr`
//! relocations and a `.note.xrt.configuration`. It carries whatever control code it is given;
//! npud uses it for emulated designs and tests, not to build real NPU programs.

use super::full_elf::{GRP_COMDAT, OSABI_AIE2P, SHT_GROUP, SHT_PROGBITS};
use super::sites::PatchScheme;

/// One kernel of a full ELF to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfKernelSpec {
    /// Kernel symbol name before mangling (`main`); stored as `_Z<len><name>`.
    pub kernel: String,
    /// Instance name (`sequence`).
    pub instance: String,
    /// The control code.
    pub ctrl_code: Vec<u8>,
    /// PDI sites: control-code offset and `.pdi*` section name.
    pub pdi_sites: Vec<(u32, String)>,
    /// Argument sites: control-code offset, argument index, addend.
    pub arg_sites: Vec<(u32, u16, u32)>,
}

/// Builds a full ELF.
#[derive(Debug, Clone, Default)]
pub struct FullElfBuilder {
    /// Kernels, one COMDAT group each.
    pub kernels: Vec<ElfKernelSpec>,
    /// `.pdi*` sections: name and bytes (a name may repeat to test duplicate sections).
    pub pdis: Vec<(String, Vec<u8>)>,
    /// The `.note.xrt.configuration` column count, if any.
    pub columns: Option<u32>,
    /// `EI_ABIVERSION`: 1 packs scheme and addend into `r_addend`; anything else uses
    /// `ELF32_R_TYPE` for the scheme.
    pub abi_version: u8,
}

struct Sec {
    name: u32,
    ty: u32,
    data: Vec<u8>,
    link: u32,
    info: u32,
    entsize: u32,
}

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn sym(name: u32, shndx: u16) -> Vec<u8> {
    let mut s = words(&[name, 0, 0]);
    s.extend_from_slice(&[0x10, 0]); // STB_GLOBAL, STT_NOTYPE
    s.extend_from_slice(&shndx.to_le_bytes());
    s
}

fn add_str(table: &mut Vec<u8>, s: &str) -> u32 {
    let at = u32::try_from(table.len()).unwrap_or(u32::MAX);
    table.extend_from_slice(s.as_bytes());
    table.push(0);
    at
}

impl FullElfBuilder {
    /// The ELF's bytes. Section order: NULL, `.shstrtab`, `.strtab`, `.symtab`, then per kernel
    /// its `.ctrltext.<instance>` and group, the PDIs, `.dynstr`, `.dynsym`, `.rela.dyn`, the note.
    #[must_use]
    pub fn build(&self) -> Vec<u8> {
        let mut shstr = vec![0u8];
        let mut secs: Vec<Sec> = Vec::new();
        let mut push = |shstr: &mut Vec<u8>, name: &str, ty, data, link, info, entsize| {
            let n = add_str(shstr, name);
            secs.push(Sec {
                name: n,
                ty,
                data,
                link,
                info,
                entsize,
            });
            u32::try_from(secs.len()).unwrap_or(u32::MAX) // index, counting NULL as 0
        };
        // Indices: 1 .shstrtab (filled at the end), 2 .strtab, 3 .symtab.
        push(&mut shstr, ".shstrtab", 3, Vec::new(), 0, 0, 0);
        let mut strtab = vec![0u8];
        let mut symtab = vec![0u8; 16];
        let mut sym_index = 1u32;
        let mut groups = Vec::new(); // (instance symbol index)
        for k in &self.kernels {
            let mangled = format!("_Z{}{}", k.kernel.len(), k.kernel);
            let kn = add_str(&mut strtab, &mangled);
            symtab.extend(sym(kn, 0));
            let kidx = sym_index;
            let inn = add_str(&mut strtab, &k.instance);
            symtab.extend(sym(inn, u16::try_from(kidx).unwrap_or(u16::MAX)));
            groups.push(kidx + 1);
            sym_index += 2;
        }
        let strtab_i = push(&mut shstr, ".strtab", 3, strtab, 0, 0, 0);
        let symtab_i = push(&mut shstr, ".symtab", 2, symtab, strtab_i, 1, 16);
        let mut ctrl_index = Vec::new();
        for (k, inst_sym) in self.kernels.iter().zip(&groups) {
            let c = push(
                &mut shstr,
                &format!(".ctrltext.{}", k.instance),
                SHT_PROGBITS,
                k.ctrl_code.clone(),
                0,
                0,
                0,
            );
            push(
                &mut shstr,
                ".group",
                SHT_GROUP,
                words(&[GRP_COMDAT, c]),
                symtab_i,
                *inst_sym,
                4,
            );
            ctrl_index.push(c);
        }
        for (name, bytes) in &self.pdis {
            push(&mut shstr, name, SHT_PROGBITS, bytes.clone(), 0, 0, 0);
        }
        let mut dynstr = vec![0u8];
        let mut dynsym = vec![0u8; 16];
        let mut rela = Vec::new();
        let mut dyn_index = 1u32;
        let mut reloc = |name: &str, ctrl: u32, off: u32, scheme: PatchScheme, addend: u32| {
            let n = add_str(&mut dynstr, name);
            dynsym.extend(sym(n, u16::try_from(ctrl).unwrap_or(u16::MAX)));
            let (info, add) = if self.abi_version == 1 {
                (dyn_index << 8, (addend << 4) | (scheme.0 & 0xF))
            } else {
                ((dyn_index << 8) | (scheme.0 & 0xFF), addend)
            };
            rela.extend(words(&[off, info, add]));
            dyn_index += 1;
        };
        for (k, &c) in self.kernels.iter().zip(&ctrl_index) {
            for (off, pdi) in &k.pdi_sites {
                reloc(pdi, c, *off, PatchScheme::ADDRESS_64, 0);
            }
            for (off, arg, addend) in &k.arg_sites {
                reloc(&arg.to_string(), c, *off, PatchScheme::SHIM_DMA_48, *addend);
            }
        }
        let dynstr_i = push(&mut shstr, ".dynstr", 3, dynstr, 0, 0, 0);
        let dynsym_i = push(&mut shstr, ".dynsym", 11, dynsym, dynstr_i, 1, 16);
        push(&mut shstr, ".rela.dyn", 4, rela, dynsym_i, 0, 12);
        if let Some(cols) = self.columns {
            let mut note = words(&[4, 4, 6]);
            note.extend_from_slice(b"XRT\0");
            note.extend_from_slice(&cols.to_le_bytes());
            push(&mut shstr, ".note.xrt.configuration", 7, note, 0, 0, 0);
        }
        secs[0].data = shstr;

        let mut out = vec![0u8; 52];
        let mut offsets = Vec::new();
        for s in &secs {
            out.resize(out.len().next_multiple_of(4), 0);
            offsets.push(u32::try_from(out.len()).unwrap_or(u32::MAX));
            out.extend_from_slice(&s.data);
        }
        out.resize(out.len().next_multiple_of(4), 0);
        let shoff = u32::try_from(out.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&[0u8; 40]);
        for (s, off) in secs.iter().zip(offsets) {
            let size = u32::try_from(s.data.len()).unwrap_or(u32::MAX);
            out.extend(words(&[
                s.name, s.ty, 0, 0, off, size, s.link, s.info, 1, s.entsize,
            ]));
        }
        let shnum = u16::try_from(secs.len() + 1).unwrap_or(u16::MAX);
        out[0..4].copy_from_slice(b"\x7fELF");
        out[4] = 1; // ELFCLASS32
        out[5] = 1; // ELFDATA2LSB
        out[6] = 1; // EV_CURRENT
        out[7] = OSABI_AIE2P;
        out[8] = self.abi_version;
        out[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
        out[20..24].copy_from_slice(&1u32.to_le_bytes());
        out[32..36].copy_from_slice(&shoff.to_le_bytes());
        out[40..42].copy_from_slice(&52u16.to_le_bytes());
        out[46..48].copy_from_slice(&40u16.to_le_bytes());
        out[48..50].copy_from_slice(&shnum.to_le_bytes());
        out[50..52].copy_from_slice(&1u16.to_le_bytes());
        out
    }
}
