//! [`HsacoBuilder`]: writes an hsaco from `PdiInsts` kernels and full ELFs, laid out as the
//! format document and mlir-aie's `aie-hsaco` packer lay it out.

use std::collections::HashMap;

use super::full_elf::FullElf;
use super::{
    AIE_MAGIC, EM_AMDGPU, ENTRY_MIN, HEADER_MIN, KernelKind, VERSION_MAJOR, VERSION_MINOR,
};
use crate::{ArtifactError, NpuGen};

/// A `PdiInsts` kernel to pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdiInstsKernel {
    /// The HSA symbol name.
    pub name: String,
    /// `main.pdi`.
    pub pdi: Vec<u8>,
    /// `insts.bin`.
    pub insts: Vec<u8>,
    /// Partition column count the design was compiled for.
    pub num_cols: u32,
    /// `16 ×` buffer arguments (ROCR passes it through to the symbol).
    pub kernarg_size: u32,
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    kind: KernelKind,
    insts: usize,
    pdi: Option<usize>,
    kernarg_size: u32,
    num_cols: u32,
}

/// Builds an hsaco: one AIE section per arch, in the order the arches were first used.
#[derive(Debug, Clone, Default)]
pub struct HsacoBuilder {
    blobs: Vec<Vec<u8>>,
    sections: Vec<(NpuGen, Vec<Entry>)>,
}

fn build_err(detail: String) -> ArtifactError {
    ArtifactError::HsacoBuild { detail }
}

fn u32_len(what: &str, len: usize) -> Result<u32, ArtifactError> {
    u32::try_from(len).map_err(|_| {
        build_err(format!(
            "{what} is {len} bytes; the format's offsets are 32-bit"
        ))
    })
}

impl HsacoBuilder {
    /// An empty builder.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn blob(&mut self, bytes: Vec<u8>) -> usize {
        self.blobs.push(bytes);
        self.blobs.len() - 1
    }

    fn entries(&mut self, arch: NpuGen) -> &mut Vec<Entry> {
        let i = match self.sections.iter().position(|(a, _)| *a == arch) {
            Some(i) => i,
            None => {
                self.sections.push((arch, Vec::new()));
                self.sections.len() - 1
            }
        };
        &mut self.sections[i].1
    }

    /// Adds a `PdiInsts` kernel to the `arch` section.
    ///
    /// # Errors
    ///
    /// [`ArtifactError::HsacoBuild`] for an empty or NUL-containing name, a name already in that
    /// section, an empty PDI, an instruction sequence that is empty or not whole 32-bit words,
    /// or `num_cols == 0`: everything ROCR would refuse at load.
    pub fn pdi_insts(
        &mut self,
        arch: NpuGen,
        k: PdiInstsKernel,
    ) -> Result<&mut Self, ArtifactError> {
        self.check_name(arch, &k.name)?;
        let what = |d: &str| build_err(format!("kernel {:?}: {d}", k.name));
        if k.insts.is_empty() || !k.insts.len().is_multiple_of(4) {
            return Err(what(&format!(
                "insts.bin is {} bytes; expected a positive multiple of 4",
                k.insts.len()
            )));
        }
        if k.pdi.is_empty() {
            return Err(what("the PDI is empty; ROCR requires one"));
        }
        if k.num_cols == 0 {
            return Err(what("num_cols is 0; expected the partition's column count"));
        }
        let insts = self.blob(k.insts);
        let pdi = self.blob(k.pdi);
        self.entries(arch).push(Entry {
            name: k.name,
            kind: KernelKind::PdiInsts,
            insts,
            pdi: Some(pdi),
            kernarg_size: k.kernarg_size,
            num_cols: k.num_cols,
        });
        Ok(self)
    }

    /// Adds every kernel of a full ELF to the `aie2p` section, in name order, all pointing at one
    /// copy of the ELF (padded with zeros to whole 32-bit words). `num_cols` comes from the ELF's
    /// `.note.xrt.configuration`; `num_cols` given here must agree with it, and is used only when
    /// the ELF has no note. Each entry's `kernarg_size` is 16 × the kernel's arguments.
    ///
    /// # Errors
    ///
    /// The ELF's own [`ArtifactError::HsacoFullElf`], or [`ArtifactError::HsacoBuild`] when the
    /// column count is missing, zero or disagrees, a kernel has no PDI patch site (ROCR would
    /// refuse it), or a name is already in the section.
    pub fn full_elf(
        &mut self,
        elf: &[u8],
        num_cols: Option<u32>,
    ) -> Result<&mut Self, ArtifactError> {
        let parsed = FullElf::parse(elf)?;
        let cols = match (parsed.xrt_columns()?, num_cols) {
            (Some(a), Some(b)) if a != b => {
                return Err(build_err(format!(
                    "--num-cols {b} disagrees with the full ELF's .note.xrt.configuration ({a})"
                )));
            }
            (Some(c), _) | (None, Some(c)) => c,
            (None, None) => {
                return Err(build_err(
                    "the full ELF has no .note.xrt.configuration; give the column count".into(),
                ));
            }
        };
        if cols == 0 {
            return Err(build_err(
                "num_cols is 0; expected the partition's column count".into(),
            ));
        }
        let mut kernels: Vec<_> = parsed.kernels.iter().collect();
        kernels.sort_by(|a, b| a.name.cmp(&b.name));
        for k in &kernels {
            self.check_name(NpuGen::Npu2, &k.name)?;
            if !k.has_pdi_site() {
                return Err(build_err(format!(
                    "full ELF kernel {:?} has no PDI patch site; ROCR refuses to load it",
                    k.name
                )));
            }
        }
        let mut bytes = elf.to_vec();
        bytes.resize(elf.len().next_multiple_of(4), 0);
        let blob = self.blob(bytes);
        for k in kernels {
            self.entries(NpuGen::Npu2).push(Entry {
                name: k.name.clone(),
                kind: KernelKind::FullElf,
                insts: blob,
                pdi: None,
                kernarg_size: k.kernarg_size(),
                num_cols: cols,
            });
        }
        Ok(self)
    }

    fn check_name(&self, arch: NpuGen, name: &str) -> Result<(), ArtifactError> {
        if name.is_empty() || name.contains('\0') {
            return Err(build_err(format!(
                "kernel name {name:?}: expected a non-empty name without NUL"
            )));
        }
        let dup = self
            .sections
            .iter()
            .filter(|(a, _)| *a == arch)
            .flat_map(|(_, e)| e)
            .any(|e| e.name == name);
        if dup {
            return Err(build_err(format!(
                "kernel name {name:?} is already in the {} section",
                arch.agent_name()
            )));
        }
        Ok(())
    }

    /// The bytes of one AIE section (what `llvm-objcopy --add-section` would insert).
    ///
    /// # Errors
    ///
    /// [`ArtifactError::HsacoBuild`] when no kernel was added for `arch` or the section would
    /// pass 4 GiB.
    pub fn section_bytes(&self, arch: NpuGen) -> Result<Vec<u8>, ArtifactError> {
        let entries = self
            .sections
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, e)| e)
            .ok_or_else(|| build_err(format!("no kernel for {}", arch.agent_name())))?;
        let table_end = HEADER_MIN as usize + entries.len() * ENTRY_MIN as usize;
        let mut strings = Vec::new();
        let mut name_offsets = Vec::with_capacity(entries.len());
        for e in entries {
            name_offsets.push(u32_len("the string table", strings.len())?);
            strings.extend_from_slice(e.name.as_bytes());
            strings.push(0);
        }
        let pool_start = table_end + strings.len();
        let mut pool: Vec<u8> = Vec::new();
        let mut placed: HashMap<&[u8], u32> = HashMap::new();
        let mut place = |i: usize, pool: &mut Vec<u8>| -> Result<(u32, u32), ArtifactError> {
            let b = self.blobs[i].as_slice();
            let size = u32_len("a blob", b.len())?;
            if let Some(&off) = placed.get(b) {
                return Ok((off, size));
            }
            let off = u32_len("the section", pool_start + pool.len())?;
            pool.extend_from_slice(b);
            placed.insert(b, off);
            Ok((off, size))
        };
        let mut table = Vec::with_capacity(entries.len() * ENTRY_MIN as usize);
        for (e, name_off) in entries.iter().zip(name_offsets) {
            let (insts_off, insts_size) = place(e.insts, &mut pool)?;
            let (pdi_off, pdi_size) = match e.pdi {
                Some(p) => place(p, &mut pool)?,
                None => (0, 0),
            };
            for w in [
                name_off,
                insts_off,
                insts_size,
                pdi_off,
                pdi_size,
                e.kernarg_size,
                e.num_cols,
                e.kind.code(),
                0,
                0,
                0,
            ] {
                table.extend_from_slice(&w.to_le_bytes());
            }
        }
        u32_len("the section", pool_start + pool.len())?;
        let mut out = Vec::with_capacity(pool_start + pool.len());
        out.extend_from_slice(&AIE_MAGIC.to_le_bytes());
        out.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
        out.extend_from_slice(&VERSION_MINOR.to_le_bytes());
        for w in [
            HEADER_MIN,
            u32_len("the kernel table", entries.len())?,
            ENTRY_MIN,
            u32_len("the section", table_end)?,
            u32_len("the string table", strings.len())?,
            u32_len("the section", pool_start)?,
            0,
            0,
            0,
            0,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&table);
        out.extend_from_slice(&strings);
        out.extend_from_slice(&pool);
        Ok(out)
    }

    /// The whole hsaco: ELF64 `ET_REL`, `EM_AMDGPU`, sections `[0] NULL`, `[1] .shstrtab`, then
    /// one `SHT_PROGBITS` section per arch (no flags, align 1), section headers last.
    ///
    /// # Errors
    ///
    /// [`ArtifactError::HsacoBuild`] when no kernel was added, or a section passes 4 GiB.
    pub fn build(&self) -> Result<Vec<u8>, ArtifactError> {
        if self.sections.is_empty() {
            return Err(build_err("no kernels to pack".into()));
        }
        let mut named = Vec::with_capacity(self.sections.len());
        for (arch, _) in &self.sections {
            named.push((arch.agent_name(), self.section_bytes(*arch)?));
        }
        let refs: Vec<(&str, &[u8])> = named.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        Ok(write_container(&refs))
    }
}

/// An ELF64 `ET_REL`/`EM_AMDGPU` file: header, `.shstrtab`'s bytes, each section's bytes back to
/// back (unaligned), then the section headers (8-aligned): `[0] NULL`, `[1] .shstrtab`, then one
/// `SHT_PROGBITS` per section with no flags and align 1.
pub(crate) fn write_container(sections: &[(&str, &[u8])]) -> Vec<u8> {
    let mut shstrtab = b"\0.shstrtab\0".to_vec();
    let mut data = Vec::new();
    let mut headers: Vec<[u64; 4]> = Vec::new(); // name, offset in data, size
    for (name, bytes) in sections {
        let at = shstrtab.len() as u64;
        shstrtab.extend_from_slice(name.as_bytes());
        shstrtab.push(0);
        headers.push([at, data.len() as u64, bytes.len() as u64, 0]);
        data.extend_from_slice(bytes);
    }
    let data_start = 64 + shstrtab.len() as u64;
    let shoff = (data_start + data.len() as u64).next_multiple_of(8);
    let shnum = u16::try_from(2 + headers.len()).unwrap_or(u16::MAX);
    let mut out = Vec::new();
    out.extend_from_slice(b"\x7fELF\x02\x01\x01");
    out.resize(16, 0);
    out.extend_from_slice(&1u16.to_le_bytes()); // ET_REL
    out.extend_from_slice(&EM_AMDGPU.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    out.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    out.extend_from_slice(&0u64.to_le_bytes()); // e_phoff
    out.extend_from_slice(&shoff.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    for h in [64u16, 0, 0, 64, shnum, 1] {
        out.extend_from_slice(&h.to_le_bytes());
    }
    out.extend_from_slice(&shstrtab);
    out.extend_from_slice(&data);
    out.resize(usize::try_from(shoff).unwrap_or(usize::MAX), 0);
    out.extend_from_slice(&[0u8; 64]); // [0] NULL
    let mut shdr = |name: u64, ty: u32, offset: u64, size: u64| {
        out.extend_from_slice(&u32::try_from(name).unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // flags: no SHF_ALLOC
        out.extend_from_slice(&0u64.to_le_bytes()); // addr
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]); // link, info
        out.extend_from_slice(&1u64.to_le_bytes()); // addralign
        out.extend_from_slice(&0u64.to_le_bytes()); // entsize
    };
    shdr(1, 3, 64, shstrtab.len() as u64); // .shstrtab, SHT_STRTAB
    for [name, off, size, _] in headers {
        shdr(name, 1, data_start + off, size); // SHT_PROGBITS
    }
    out
}
