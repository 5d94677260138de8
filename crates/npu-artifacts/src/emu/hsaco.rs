//! Emulated designs as hsacos, so the emulator can load them the way ROCR loads real ones.
//!
//! - `PdiInsts` ([`EmuDesign::to_hsaco`]): one kernel named like the emulated kernel, PDI =
//!   the emulated `main.pdi`, instructions = [`EmuDesign::insts`], `num_cols` 1,
//!   `kernarg_size` 16 × buffers, in the generation's section (`aie2` or `aie2p`).
//! - `FullElf` ([`EmuDesign::to_full_elf`], aie2p only): a full ELF whose one kernel is
//!   `<kernel>:sequence`, whose `.pdi` section is the emulated `main.pdi`, and whose control
//!   code, where a real one has NPU instructions, is [`EMU_CTRL_MAGIC`] (16 bytes), one 8-byte PDI
//!   site at offset 16 and one 12-byte argument site per buffer from offset 24, all zero. Its
//!   `.note.xrt.configuration` says 1 column. Its relocations use ELF ABI version 0, as aiecc
//!   writes them (the scheme in `ELF32_R_TYPE`, the addend in `r_addend`);
//!   [`EmuDesign::to_full_elf_abi`] writes version 1 (scheme and addend packed in `r_addend`).

use super::EmuDesign;
use crate::hsaco::{
    ElfKernel, ElfKernelSpec, FullElfBuilder, HsacoBuilder, PdiInstsKernel, SiteTarget,
};
use crate::{ArtifactError, NpuGen};

/// The first 16 bytes of an emulated design's control code.
pub const EMU_CTRL_MAGIC: &[u8; 16] = b"NPUD-EMU CTRL v1";
/// Control-code offset of the emulated control code's PDI site.
pub const EMU_CTRL_PDI_SITE: u32 = 16;
/// Control-code offset of argument 0's site; argument `i` is at `24 + 12 i`.
pub const EMU_CTRL_ARG_SITES: u32 = 24;
/// The instance name of an emulated full ELF's kernel.
pub const EMU_INSTANCE: &str = "sequence";

impl EmuDesign {
    /// The design as a `PdiInsts` kernel for [`HsacoBuilder::pdi_insts`].
    #[must_use]
    pub fn hsaco_kernel(&self, generation: NpuGen) -> PdiInstsKernel {
        PdiInstsKernel {
            name: self.kernel.name().to_owned(),
            pdi: self.to_pdi(),
            insts: self.insts(generation),
            num_cols: 1,
            kernarg_size: u32::from(self.num_args) * 16,
        }
    }

    /// An hsaco holding the design as one `PdiInsts` kernel in `generation`'s section.
    ///
    /// # Errors
    ///
    /// [`EmuDesign::validate`]'s errors.
    pub fn to_hsaco(&self, generation: NpuGen) -> Result<Vec<u8>, ArtifactError> {
        self.validate()?;
        HsacoBuilder::new()
            .pdi_insts(generation, self.hsaco_kernel(generation))?
            .build()
    }

    /// The design as a full ELF with ELF ABI version 0 relocations, as aiecc writes (see the
    /// [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`EmuDesign::validate`]'s errors.
    pub fn to_full_elf(&self) -> Result<Vec<u8>, ArtifactError> {
        self.to_full_elf_abi(0)
    }

    /// The design as a full ELF whose relocations use `EI_ABIVERSION` `abi_version`: 1 packs
    /// the scheme and addend into `r_addend`, any other value keeps the scheme in
    /// `ELF32_R_TYPE`.
    ///
    /// # Errors
    ///
    /// [`EmuDesign::validate`]'s errors.
    pub fn to_full_elf_abi(&self, abi_version: u8) -> Result<Vec<u8>, ArtifactError> {
        self.to_full_elf_as(self.kernel.name(), abi_version)
    }

    /// The design as a full ELF whose one kernel is `device:sequence`. aiecc names the device of
    /// every design it compiles `main` (`main:sequence`), which is what `npuctl emu-design`
    /// writes; the design's own name (the default of [`EmuDesign::to_full_elf`]) tells
    /// emulated kernels apart where several share one executable.
    ///
    /// # Errors
    ///
    /// [`EmuDesign::validate`]'s errors.
    pub fn to_full_elf_as(&self, device: &str, abi_version: u8) -> Result<Vec<u8>, ArtifactError> {
        self.validate()?;
        let mut ctrl = EMU_CTRL_MAGIC.to_vec();
        ctrl.resize(
            EMU_CTRL_ARG_SITES as usize + 12 * usize::from(self.num_args),
            0,
        );
        let arg_sites = (0..u16::from(self.num_args))
            .map(|i| (EMU_CTRL_ARG_SITES + 12 * u32::from(i), i, 0))
            .collect();
        Ok(FullElfBuilder {
            kernels: vec![ElfKernelSpec {
                kernel: device.to_owned(),
                instance: EMU_INSTANCE.to_owned(),
                ctrl_code: ctrl,
                pdi_sites: vec![(EMU_CTRL_PDI_SITE, ".pdi".to_owned())],
                arg_sites,
            }],
            pdis: vec![(".pdi".to_owned(), self.to_pdi())],
            columns: Some(1),
            abi_version,
        }
        .build())
    }

    /// An hsaco holding [`EmuDesign::to_full_elf`] as a `FullElf` kernel (aie2p).
    ///
    /// # Errors
    ///
    /// [`EmuDesign::validate`]'s errors.
    pub fn to_full_elf_hsaco(&self) -> Result<Vec<u8>, ArtifactError> {
        self.to_full_elf_hsaco_abi(0)
    }

    /// An hsaco holding [`EmuDesign::to_full_elf_abi`] as a `FullElf` kernel (aie2p).
    ///
    /// # Errors
    ///
    /// [`EmuDesign::validate`]'s errors.
    pub fn to_full_elf_hsaco_abi(&self, abi_version: u8) -> Result<Vec<u8>, ArtifactError> {
        HsacoBuilder::new()
            .full_elf(&self.to_full_elf_abi(abi_version)?, None)?
            .build()
    }

    /// The design a full ELF kernel written by [`EmuDesign::to_full_elf`] carries.
    ///
    /// # Errors
    ///
    /// [`ArtifactError::Emu`] when the control code is not emulated, or sites are not where the
    /// layout puts them; the PDI's own errors.
    pub fn from_full_elf_kernel(k: &ElfKernel<'_>) -> Result<Self, ArtifactError> {
        let bad = |detail: String| ArtifactError::Emu { detail };
        if !k.ctrl_code.starts_with(EMU_CTRL_MAGIC) {
            return Err(bad(format!(
                "full ELF kernel {:?}: control code is not emulated (no {:?} at offset 0)",
                k.name,
                String::from_utf8_lossy(EMU_CTRL_MAGIC)
            )));
        }
        let [pdi] = k.pdis.as_slice() else {
            return Err(bad(format!(
                "full ELF kernel {:?} loads {} PDIs; expected 1",
                k.name,
                k.pdis.len()
            )));
        };
        let d = Self::from_pdi(pdi.bytes)?;
        for s in &k.sites {
            let expected = match s.target {
                SiteTarget::Pdi(_) => EMU_CTRL_PDI_SITE,
                SiteTarget::Arg(i) => EMU_CTRL_ARG_SITES + 12 * u32::from(i),
            };
            if s.offset != expected {
                return Err(bad(format!(
                    "full ELF kernel {:?}: site for {:?} at offset {}; expected {expected}",
                    k.name, s.target, s.offset
                )));
            }
        }
        if k.arg_count != u32::from(d.num_args) {
            return Err(bad(format!(
                "full ELF kernel {:?} has {} argument sites; the design has {} buffers",
                k.name, k.arg_count, d.num_args
            )));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::DType;
    use crate::hsaco::{Hsaco, KernelKind, parse_for_arch};
    use crate::txn::TxnProgram;

    #[test]
    fn pdi_insts_hsaco_carries_the_design_files() {
        let d = EmuDesign::vector_scalar_add(256, DType::I32, 3);
        for g in [NpuGen::Npu1, NpuGen::Npu2] {
            let bytes = d.to_hsaco(g).unwrap();
            let s = parse_for_arch(&bytes, g).unwrap();
            let [k] = s.kernels.as_slice() else {
                panic!("one kernel")
            };
            assert_eq!(k.name, "vector_scalar_add");
            assert_eq!(k.kind, KernelKind::PdiInsts);
            assert_eq!(k.kernarg_size, 32);
            assert_eq!(k.num_cols, 1);
            assert_eq!(EmuDesign::from_pdi(k.pdi.unwrap().bytes).unwrap(), d);
            assert_eq!(TxnProgram::parse(k.insts.bytes).unwrap().generation, g);
        }
    }

    #[test]
    fn full_elf_hsaco_reads_back_the_design_in_both_relocation_abis() {
        for (d, abi) in [
            (EmuDesign::matmul(4, 4, 4, DType::I16, DType::I32), 0),
            (EmuDesign::noop(0, 4), 1),
            (EmuDesign::noop(7, 64), 0),
            (EmuDesign::vector_scalar_mul(64, DType::U32, 3), 1),
        ] {
            let bytes = d.to_full_elf_hsaco_abi(abi).unwrap();
            let h = Hsaco::parse(&bytes).unwrap();
            let s = h.section(NpuGen::Npu2).unwrap();
            let k = s.kernel(&format!("{}:sequence", d.kernel.name())).unwrap();
            assert_eq!(k.kind, KernelKind::FullElf);
            assert_eq!(k.num_cols, 1);
            let ek = k.full_elf.as_ref().unwrap();
            assert_eq!(
                crate::hsaco::FullElf::parse(&d.to_full_elf_abi(abi).unwrap())
                    .unwrap()
                    .abi_version,
                abi
            );
            assert_eq!(k.effective_kernarg_size(), 16 * u32::from(d.num_args));
            assert_eq!(EmuDesign::from_full_elf_kernel(ek).unwrap(), d);
        }
    }
}
