//! Fuzzes the AIE hsaco reader: the container, every arch section, nested full ELFs. It must
//! never panic; a section that parses must re-pack (its PdiInsts kernels) into one that parses
//! back to the same kernels; a full ELF that parses and packs must load from the packed hsaco.
//! Every parse holds at most 8 bytes per input byte at its peak (the cost oracle).
#![no_main]

#[path = "common/cost.rs"]
mod cost;

use libfuzzer_sys::fuzz_target;
use npu_artifacts::NpuGen;
use npu_artifacts::hsaco::{self, FullElf, Hsaco, HsacoBuilder, KernelKind, PdiInstsKernel};

fuzz_target!(|data: &[u8]| {
    for arch in [NpuGen::Npu1, NpuGen::Npu2] {
        let _ = cost::check("parse_for_arch", data.len(), 8, || {
            hsaco::parse_for_arch(data, arch).map(|s| s.kernels.len())
        });
    }
    let _ = cost::check("is_hsaco", data.len(), 8, || hsaco::is_hsaco(data));
    let _ = cost::check("FullElf::parse", data.len(), 8, || {
        FullElf::parse(data).map(|e| e.kernels.len())
    });
    if let Ok(h) = cost::check("Hsaco::parse", data.len(), 8, || Hsaco::parse(data)) {
        for s in &h.sections {
            let mut b = HsacoBuilder::new();
            let mut packed = Vec::new();
            for k in s.kernels.iter().filter(|k| k.kind == KernelKind::PdiInsts) {
                let pdi = k.pdi.expect("a parsed PdiInsts kernel has a PDI");
                b.pdi_insts(
                    s.arch,
                    PdiInstsKernel {
                        name: k.name.to_owned(),
                        pdi: pdi.bytes.to_vec(),
                        insts: k.insts.bytes.to_vec(),
                        num_cols: k.num_cols,
                        kernarg_size: k.kernarg_size,
                    },
                )
                .expect("a parsed kernel packs");
                packed.push(k);
            }
            if packed.is_empty() {
                continue;
            }
            let bytes = b.build().expect("packs");
            let back = hsaco::parse_for_arch(&bytes, s.arch).expect("a packed section parses");
            for (a, k) in back.kernels.iter().zip(&packed) {
                assert_eq!(a.name, k.name);
                assert_eq!(a.insts.bytes, k.insts.bytes);
                assert_eq!(a.pdi.map(|p| p.bytes), k.pdi.map(|p| p.bytes));
                assert_eq!((a.num_cols, a.kernarg_size), (k.num_cols, k.kernarg_size));
            }
        }
    }
    if let Ok(elf) = FullElf::parse(data) {
        let _ = elf.xrt_columns();
        let mut b = HsacoBuilder::new();
        if b.full_elf(data, Some(1)).is_ok() {
            let bytes = b.build().expect("packs");
            let s = hsaco::parse_for_arch(&bytes, NpuGen::Npu2).expect("a packed full ELF loads");
            assert_eq!(s.kernels.len(), elf.kernels.len());
        }
    }
});
