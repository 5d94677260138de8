//! Unit tests: the format document's example byte for byte, round trips, and one test per
//! validation rule asserting that the error names the rule and its offset.

use super::build::write_container;
use super::*;
use crate::le::u32_at;

fn kernel(
    name: &str,
    insts: &[u8],
    pdi: &[u8],
    kernarg_size: u32,
    num_cols: u32,
) -> PdiInstsKernel {
    PdiInstsKernel {
        name: name.into(),
        pdi: pdi.to_vec(),
        insts: insts.to_vec(),
        num_cols,
        kernarg_size,
    }
}

const INSTS: &[u8] = &[1, 2, 3, 4, 5, 6, 7, 8];
const PDI: &[u8] = b"PDIDATA!";

/// `aie-hsaco --arch aie2p --kernel k1:insts.bin:main.pdi:32:4 --kernel k2:...:16:4`.
fn doc_builder() -> HsacoBuilder {
    let mut b = HsacoBuilder::new();
    b.pdi_insts(NpuGen::Npu2, kernel("k1", INSTS, PDI, 32, 4))
        .unwrap();
    b.pdi_insts(NpuGen::Npu2, kernel("k2", INSTS, PDI, 16, 4))
        .unwrap();
    b
}

/// The section from the format document's §13, copied out of its hex dump.
const DOC_SECTION: &str = "
    41 49 45 4b 01 00 00 00 30 00 00 00 02 00 00 00
    2c 00 00 00 88 00 00 00 06 00 00 00 8e 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 00 00 8e 00 00 00 08 00 00 00 96 00 00 00
    08 00 00 00 20 00 00 00 04 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 03 00 00 00
    8e 00 00 00 08 00 00 00 96 00 00 00 08 00 00 00
    10 00 00 00 04 00 00 00 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 6b 31 00 6b 32 00 01 02
    03 04 05 06 07 08 50 44 49 44 41 54 41 21";

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

fn put(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn doc_section() -> Vec<u8> {
    doc_builder().section_bytes(NpuGen::Npu2).unwrap()
}

/// Parses `section` as the only section, named `aie2p`, and returns the error.
fn section_error(section: &[u8]) -> ArtifactError {
    parse_for_arch(&write_container(&[("aie2p", section)]), NpuGen::Npu2).unwrap_err()
}

/// Asserts that the error is the rule at the section offset, and that its message says both.
#[track_caller]
fn assert_section_rule(e: &ArtifactError, rule: HsacoRule, offset: u64) {
    let msg = e.to_string();
    match e {
        ArtifactError::HsacoSection {
            rule: r,
            offset: o,
            file_offset,
            ..
        } => {
            assert_eq!((*r, *o), (rule, offset), "{msg}");
            assert_eq!(*file_offset, 0x51 + offset, "{msg}");
        }
        other => panic!("expected a section error for {rule:?}, got {other:?}"),
    }
    assert!(msg.contains(rule.text()), "{msg}");
    assert!(
        msg.contains(&format!("section offset {offset:#x}")),
        "{msg}"
    );
}

#[track_caller]
fn mutated(f: impl FnOnce(&mut Vec<u8>), rule: HsacoRule, offset: u64) {
    let mut s = doc_section();
    f(&mut s);
    assert_section_rule(&section_error(&s), rule, offset);
}

#[test]
fn packs_the_format_documents_example_byte_for_byte() {
    assert_eq!(doc_section(), hex(DOC_SECTION));
    // "In the container, the section starts at file offset 0x51."
    let file = doc_builder().build().unwrap();
    let c = parse_container(&file).unwrap();
    assert_eq!((c.e_type, c.e_machine), (1, EM_AMDGPU));
    let names: Vec<&str> = c.sections.iter().filter_map(|s| s.name.to_str()).collect();
    assert_eq!(names, ["", ".shstrtab", "aie2p"]);
    let s = &c.sections[2];
    assert_eq!((s.offset, s.sh_type, s.flags, s.addralign), (0x51, 1, 0, 1));
    assert_eq!(s.bytes(&file).unwrap(), hex(DOC_SECTION));
}

#[test]
fn pack_parse_round_trips_both_arches() {
    let mut b = HsacoBuilder::new();
    b.pdi_insts(NpuGen::Npu1, kernel("a", &[0; 12], b"P1", 32, 4))
        .unwrap();
    b.pdi_insts(NpuGen::Npu2, kernel("a", &[1; 8], b"P2", 48, 8))
        .unwrap();
    b.pdi_insts(NpuGen::Npu2, kernel("b", &[1; 8], b"P3", 16, 1))
        .unwrap();
    let bytes = b.build().unwrap();
    let h = Hsaco::parse(&bytes).unwrap();
    assert_eq!(h.sections.len(), 2);
    let s1 = h.section(NpuGen::Npu1).unwrap();
    assert_eq!(s1.kernels[0].insts.bytes, &[0; 12]);
    assert_eq!(s1.kernels[0].pdi.unwrap().bytes, b"P1");
    let s2 = parse_for_arch(&bytes, NpuGen::Npu2).unwrap();
    assert_eq!(s2.kernels.len(), 2);
    assert_eq!(
        s2.kernels[0].insts, s2.kernels[1].insts,
        "identical insts stored once"
    );
    assert_eq!(s2.kernels[1].pdi.unwrap().bytes, b"P3");
    assert_eq!(
        (s2.kernels[1].kernarg_size, s2.kernels[1].num_cols),
        (16, 1)
    );
    assert!(is_hsaco(&bytes));
}

#[test]
fn readers_stride_by_the_files_sizes() {
    // A header of 52 bytes and entries of 48: a newer minor version an old reader must skip over.
    let old = doc_section();
    let mut s = old[..48].to_vec();
    s.extend_from_slice(&[0xEE; 4]);
    for e in 0..2 {
        s.extend_from_slice(&old[48 + e * 44..48 + (e + 1) * 44]);
        s.extend_from_slice(&[0xEE; 4]);
    }
    s.extend_from_slice(&old[0x88..]);
    let shift = 4 + 2 * 4;
    put(&mut s, 8, 52);
    put(&mut s, 16, 48);
    put(&mut s, 20, 0x88 + shift);
    put(&mut s, 28, 0x8e + shift);
    for e in 0..2 {
        let at = 52 + e * 48;
        for field in [4, 12] {
            let v = u32_at(&s, at + field).unwrap();
            put(&mut s, at + field, v + shift);
        }
    }
    let file = write_container(&[("aie2p", &s)]);
    let sec = parse_for_arch(&file, NpuGen::Npu2).unwrap();
    assert_eq!((sec.header_size, sec.kernel_entry_size), (52, 48));
    assert_eq!(sec.kernels[1].name, "k2");
    assert_eq!(sec.kernels[1].pdi.unwrap().bytes, PDI);
}

#[test]
fn container_rules() {
    let file = doc_builder().build().unwrap();
    let rule_of = |b: &[u8]| match parse_for_arch(b, NpuGen::Npu2).unwrap_err() {
        e @ ArtifactError::HsacoContainer { .. } => {
            let ArtifactError::HsacoContainer { rule, .. } = &e else {
                unreachable!()
            };
            assert!(e.to_string().contains(rule.text()), "{e}");
            *rule
        }
        e => panic!("{e}"),
    };
    assert_eq!(rule_of(b"MZ\0\0"), HsacoRule::ElfMagic);
    let mut f = file.clone();
    f[4] = 1;
    assert_eq!(rule_of(&f), HsacoRule::Elf64);
    assert_eq!(rule_of(&file[..40]), HsacoRule::Elf64);
    let mut f = file.clone();
    f[5] = 2;
    assert_eq!(rule_of(&f), HsacoRule::ElfLittleEndian);
    let mut f = file.clone();
    f[58] = 40;
    assert_eq!(rule_of(&f), HsacoRule::SectionHeaders);
    let mut f = file.clone();
    f[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(rule_of(&f), HsacoRule::SectionHeaders);
    let mut f = file.clone();
    f[62] = 9;
    assert_eq!(rule_of(&f), HsacoRule::SectionNames);
    // No AIE section: the magic is gone.
    let mut f = file.clone();
    f[0x51] = b'X';
    assert_eq!(rule_of(&f), HsacoRule::AieSectionPresent);
    // An AIE section, but for the other arch.
    assert_eq!(
        parse_for_arch(&file, NpuGen::Npu1).unwrap_err().to_string(),
        "hsaco container: rule \"an AIE section named like the arch\" broken at file offset 0x0: \
         no AIE section is named aie2; AIE sections: [\"aie2p\"]"
    );
    // Under 48 bytes, or past the file end, a section is not an AIE section.
    let short = write_container(&[("aie2p", &doc_section()[..47])]);
    assert_eq!(rule_of(&short), HsacoRule::AieSectionPresent);
}

#[test]
fn the_first_section_named_for_the_arch_is_used() {
    let good = doc_section();
    let mut bad = good.clone();
    put(&mut bad, 4, 2);
    // A non-AIE section of the arch's name first, then the good one, then a broken duplicate.
    let file = write_container(&[
        ("aie2p", b"not an AIE section"),
        ("aie2p", &good),
        ("aie2p", &bad),
        ("aie4", &good),
    ]);
    let s = parse_for_arch(&file, NpuGen::Npu2).unwrap();
    assert_eq!(s.section_index, 3);
    let h = Hsaco::parse(&file).unwrap();
    assert_eq!(h.ignored, ["aie2p", "aie4"]);
    let file = write_container(&[("aie2p", &bad), ("aie2p", &good)]);
    assert!(parse_for_arch(&file, NpuGen::Npu2).is_err());
}

#[test]
fn header_rules() {
    mutated(|s| s[4] = 2, HsacoRule::VersionMajor, 4);
    mutated(|s| put(s, 8, 47), HsacoRule::HeaderSize, 8);
    mutated(|s| put(s, 16, 43), HsacoRule::KernelEntrySize, 16);
    mutated(|s| put(s, 12, 100), HsacoRule::KernelTableInSection, 12);
    mutated(
        |s| put(s, 12, u32::MAX),
        HsacoRule::KernelTableInSection,
        12,
    );
    mutated(|s| put(s, 20, 0x87), HsacoRule::StringTableAfterTable, 20);
    mutated(|s| put(s, 24, 0x17), HsacoRule::StringTableInSection, 24);
    mutated(
        |s| put(s, 24, u32::MAX),
        HsacoRule::StringTableInSection,
        24,
    );
    mutated(|s| put(s, 28, 0x8d), HsacoRule::BlobPoolAfterStrings, 28);
    mutated(|s| put(s, 28, 0x9f), HsacoRule::BlobPoolAfterStrings, 28);
    mutated(|s| put(s, 12, 0), HsacoRule::KernelCount, 12);
    // Reserved words are not checked.
    let mut s = doc_section();
    put(&mut s, 32, 7);
    put(&mut s, 0x30 + 40, 7);
    parse_for_arch(&write_container(&[("aie2p", &s)]), NpuGen::Npu2).unwrap();
}

#[test]
fn entry_rules() {
    const E0: usize = 0x30;
    const E1: usize = 0x5c;
    mutated(|s| put(s, E0 + 28, 2), HsacoRule::Kind, 0x30 + 28);
    mutated(|s| put(s, E0 + 8, 0), HsacoRule::InstsSize, 0x38);
    mutated(|s| put(s, E0 + 8, 6), HsacoRule::InstsWords, 0x38);
    mutated(|s| put(s, E0 + 4, 0x8d), HsacoRule::BlobInPool, 0x34);
    mutated(|s| put(s, E1 + 8, 0x14), HsacoRule::BlobInPool, 0x60);
    mutated(|s| put(s, E0 + 16, 9), HsacoRule::BlobInPool, 0x3c);
    mutated(|s| put(s, E0 + 12, u32::MAX), HsacoRule::BlobInPool, 0x3c);
    mutated(|s| put(s, E0 + 16, 0), HsacoRule::PdiAbsent, 0x3c);
    mutated(|s| put(s, E0 + 28, 1), HsacoRule::FullElfNoPdi, 0x40);
    mutated(|s| put(s, E0, 6), HsacoRule::NameInStringTable, 0x30);
    // "k2" without its NUL inside a string table shortened to 5 bytes.
    mutated(|s| put(s, 24, 5), HsacoRule::NameInStringTable, 0x5c);
    mutated(|s| put(s, E1, 0), HsacoRule::UniqueNames, 0x5c);
    mutated(|s| put(s, E1, 2), HsacoRule::KernelNameText, 0x5c);
    mutated(|s| s[0x89] = 0xff, HsacoRule::KernelNameText, 0x30);
    mutated(|s| put(s, E1 + 24, 0), HsacoRule::NumCols, 0x5c + 24);
    mutated(
        |s| {
            put(s, E0 + 12, 0);
            put(s, E0 + 16, 0);
        },
        HsacoRule::PdiPresent,
        0x40,
    );
    // A FullElf insts blob need not be whole words (its kind is checked first).
    let e = section_error(&{
        let mut s = doc_section();
        put(&mut s, E0 + 28, 1);
        put(&mut s, E0 + 12, 0);
        put(&mut s, E0 + 16, 0);
        put(&mut s, E0 + 8, 7);
        s
    });
    assert!(
        matches!(
            e,
            ArtifactError::HsacoFullElf {
                rule: HsacoRule::NestedElfHeader,
                blob_file_offset: Some(0xdf),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("kernel 0 \"k1\""), "{e}");
}

#[test]
fn agent_columns_are_checked_on_request() {
    let file = doc_builder().build().unwrap();
    let s = parse_for_arch(&file, NpuGen::Npu2).unwrap();
    s.check_columns(4).unwrap();
    assert_section_rule(
        &s.check_columns(3).unwrap_err(),
        HsacoRule::NumCols,
        0x30 + 24,
    );
}

// ---- FullElf ----

fn elf_kernel(kernel: &str, instance: &str, args: u16) -> ElfKernelSpec {
    ElfKernelSpec {
        kernel: kernel.into(),
        instance: instance.into(),
        ctrl_code: (0u8..64).collect(),
        pdi_sites: vec![(8, ".pdi".into())],
        arg_sites: (0..args)
            .map(|i| (16 + 12 * u32::from(i), i, 4 * u32::from(i)))
            .collect(),
    }
}

fn elf(kernels: Vec<ElfKernelSpec>) -> FullElfBuilder {
    FullElfBuilder {
        kernels,
        pdis: vec![(".pdi".into(), b"the pdi".to_vec())],
        columns: Some(4),
        abi_version: 1,
    }
}

/// A one-entry section holding `elf` as a FullElf kernel named `name`.
fn full_elf_section(elf: &[u8], name: &str, kernarg: u32) -> Vec<u8> {
    let st = 48 + 44;
    let pool = st + name.len() + 1;
    let mut s = Vec::new();
    s.extend_from_slice(&AIE_MAGIC.to_le_bytes());
    s.extend_from_slice(&[1, 0, 0, 0]);
    let w =
        |s: &mut Vec<u8>, v: usize| s.extend_from_slice(&u32::try_from(v).unwrap().to_le_bytes());
    for v in [48, 1, 44, st, name.len() + 1, pool, 0, 0, 0, 0] {
        w(&mut s, v);
    }
    for v in [0, pool, elf.len(), 0, 0, kernarg as usize, 4, 1, 0, 0, 0] {
        w(&mut s, v);
    }
    s.extend_from_slice(name.as_bytes());
    s.push(0);
    s.extend_from_slice(elf);
    s
}

#[track_caller]
fn elf_rule(bytes: &[u8], rule: HsacoRule) {
    let e = FullElf::parse(bytes).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, ArtifactError::HsacoFullElf { rule: r, .. } if r == rule),
        "{msg}"
    );
    assert!(msg.contains(rule.text()), "{msg}");
    assert!(msg.contains("at ELF offset 0x"), "{msg}");
}

/// (header offset, data offset, data size) of the first section named `name`.
fn shdr(elf: &[u8], name: &str) -> (usize, usize, usize) {
    let shoff = u32_at(elf, 32).unwrap() as usize;
    let shnum = usize::from(crate::le::u16_at(elf, 48).unwrap());
    let strs = u32_at(elf, shoff + 40 + 16).unwrap() as usize;
    for i in 0..shnum {
        let h = shoff + i * 40;
        let n = strs + u32_at(elf, h).unwrap() as usize;
        if elf[n..].starts_with(name.as_bytes()) && elf[n + name.len()] == 0 {
            return (
                h,
                u32_at(elf, h + 16).unwrap() as usize,
                u32_at(elf, h + 20).unwrap() as usize,
            );
        }
    }
    panic!("no section {name}");
}

#[test]
fn full_elf_round_trips_in_both_relocation_encodings() {
    for abi in [0, 1] {
        let mut b = elf(vec![
            elf_kernel("main", "sequence", 3),
            elf_kernel("other", "seq2", 0),
        ]);
        b.abi_version = abi;
        let bytes = b.build();
        let e = FullElf::parse(&bytes).unwrap();
        assert_eq!(e.abi_version, abi);
        assert_eq!(e.xrt_columns().unwrap(), Some(4));
        let k = e.kernel("main:sequence").unwrap();
        assert_eq!(k.ctrl_code, (0u8..64).collect::<Vec<_>>());
        assert_eq!(k.arg_count, 3);
        assert_eq!(k.kernarg_size(), 48);
        assert_eq!(
            k.pdis,
            [ElfPdi {
                name: ".pdi".into(),
                bytes: b"the pdi"
            }]
        );
        assert_eq!(
            k.sites,
            [
                PatchSite {
                    scheme: PatchScheme::ADDRESS_64,
                    offset: 8,
                    addend: 0,
                    target: SiteTarget::Pdi(".pdi".into())
                },
                PatchSite {
                    scheme: PatchScheme::SHIM_DMA_48,
                    offset: 16,
                    addend: 0,
                    target: SiteTarget::Arg(0)
                },
                PatchSite {
                    scheme: PatchScheme::SHIM_DMA_48,
                    offset: 28,
                    addend: 4,
                    target: SiteTarget::Arg(1)
                },
                PatchSite {
                    scheme: PatchScheme::SHIM_DMA_48,
                    offset: 40,
                    addend: 8,
                    target: SiteTarget::Arg(2)
                },
            ]
        );
        assert_eq!(e.kernel("other:seq2").unwrap().arg_count, 0);

        // Packed: one entry per kernel, in name order, sharing one blob padded to whole words.
        let file = HsacoBuilder::new()
            .full_elf(&bytes, None)
            .unwrap()
            .build()
            .unwrap();
        let s = parse_for_arch(&file, NpuGen::Npu2).unwrap();
        let names: Vec<&str> = s.kernels.iter().map(|k| k.name).collect();
        assert_eq!(names, ["main:sequence", "other:seq2"]);
        assert_eq!(s.kernels[0].insts, s.kernels[1].insts);
        assert_eq!(s.kernels[0].insts.bytes.len() % 4, 0);
        assert_eq!(
            (
                s.kernels[0].kind,
                s.kernels[0].num_cols,
                s.kernels[0].kernarg_size
            ),
            (KernelKind::FullElf, 4, 48)
        );
        assert_eq!(s.kernels[0].full_elf.as_ref().unwrap().sites, k.sites);
        assert!(s.kernels[0].pdi.is_none());
    }
}

#[test]
fn full_elf_packer_takes_columns_from_the_note() {
    let mut b = elf(vec![elf_kernel("main", "sequence", 1)]);
    let bytes = b.build();
    HsacoBuilder::new().full_elf(&bytes, Some(4)).unwrap();
    let e = HsacoBuilder::new()
        .full_elf(&bytes, Some(2))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "hsaco packer: --num-cols 2 disagrees with the full ELF's .note.xrt.configuration (4)"
    );
    b.columns = None;
    let bytes = b.build();
    assert!(HsacoBuilder::new().full_elf(&bytes, None).is_err());
    HsacoBuilder::new().full_elf(&bytes, Some(2)).unwrap();
    b.kernels[0].pdi_sites.clear();
    let e = HsacoBuilder::new()
        .full_elf(&b.build(), Some(2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no PDI patch site"), "{e}");
}

#[test]
fn full_elf_loader_rules() {
    let good = elf(vec![elf_kernel("main", "sequence", 2)]).build();
    let parse = |s: &[u8], arch: NpuGen| {
        let file = write_container(&[(arch.agent_name(), s)]);
        parse_for_arch(&file, arch).map(|_| ())
    };
    parse(&full_elf_section(&good, "main:sequence", 0), NpuGen::Npu2).unwrap();
    parse(&full_elf_section(&good, "main:sequence", 32), NpuGen::Npu2).unwrap();
    let rule = |s: &[u8], arch| match parse(s, arch).unwrap_err() {
        ArtifactError::HsacoSection {
            rule,
            offset,
            detail,
            ..
        } => (rule, offset, detail),
        e => panic!("{e}"),
    };
    assert_eq!(
        rule(&full_elf_section(&good, "main:sequence", 0), NpuGen::Npu1).0,
        HsacoRule::FullElfArch
    );
    let (r, o, d) = rule(&full_elf_section(&good, "main:other", 0), NpuGen::Npu2);
    assert_eq!((r, o), (HsacoRule::FullElfKernelName, 48));
    assert!(d.contains("[\"main:sequence\"]"), "{d}");
    assert_eq!(
        rule(&full_elf_section(&good, "main:sequence", 48), NpuGen::Npu2).0,
        HsacoRule::KernargSize
    );
    let mut b = elf(vec![elf_kernel("main", "sequence", 2)]);
    b.kernels[0].pdi_sites.clear();
    assert_eq!(
        rule(
            &full_elf_section(&b.build(), "main:sequence", 0),
            NpuGen::Npu2
        )
        .0,
        HsacoRule::PdiSitePresent
    );
}

#[test]
fn nested_elf_header_rules() {
    let good = elf(vec![elf_kernel("main", "sequence", 1)]).build();
    elf_rule(&good[..51], HsacoRule::NestedElfHeader);
    let with = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    elf_rule(&with(4, &[2]), HsacoRule::NestedElfClass);
    elf_rule(&with(5, &[2]), HsacoRule::NestedElfData);
    elf_rule(&with(7, &[0]), HsacoRule::NestedElfOsAbi);
    elf_rule(&with(46, &[41, 0]), HsacoRule::NestedSectionHeaders);
    elf_rule(&with(48, &[0, 0]), HsacoRule::NestedSectionHeaders);
    elf_rule(&with(50, &[99, 0]), HsacoRule::NestedSectionHeaders);
    elf_rule(
        &with(32, &u32::MAX.to_le_bytes()),
        HsacoRule::NestedSectionHeaders,
    );
    let (h, _, _) = shdr(&good, ".pdi");
    elf_rule(
        &with(h + 20, &u32::MAX.to_le_bytes()),
        HsacoRule::NestedSectionHeaders,
    );
}

#[test]
fn nested_elf_symbol_and_group_rules() {
    let good = elf(vec![elf_kernel("main", "sequence", 1)]).build();
    let rename = |from: &str, to: &str| {
        let mut b = good.clone();
        let at = b
            .windows(from.len())
            .position(|w| w == from.as_bytes())
            .unwrap();
        b[at..at + to.len()].copy_from_slice(to.as_bytes());
        b
    };
    elf_rule(&rename(".symtab\0", ".symtaX\0"), HsacoRule::Symtab);
    let (sym_h, _, _) = shdr(&good, ".symtab");
    let mut b = good.clone();
    put(&mut b, sym_h + 36, 12);
    elf_rule(&b, HsacoRule::Symtab);
    let (g_h, g_off, _) = shdr(&good, ".group");
    let mut b = good.clone();
    put(&mut b, g_off, 0);
    elf_rule(&b, HsacoRule::ComdatGroup);
    let mut b = good.clone();
    put(&mut b, g_off + 4, 999);
    elf_rule(&b, HsacoRule::ComdatGroup);
    let mut b = good.clone();
    put(&mut b, g_h + 28, 999);
    elf_rule(&b, HsacoRule::ComdatGroup);
    // The group's member is not a .ctrltext section: no kernel.
    let mut b = good.clone();
    put(&mut b, g_off + 4, 3);
    elf_rule(&b, HsacoRule::KernelPresent);
    let (c_h, _, _) = shdr(&good, ".ctrltext.sequence");
    let mut b = good.clone();
    put(&mut b, c_h + 4, 8);
    elf_rule(&b, HsacoRule::CtrlText);
    let mut b = good.clone();
    put(&mut b, c_h + 20, 0);
    elf_rule(&b, HsacoRule::CtrlText);
    let dup = elf(vec![
        elf_kernel("main", "sequence", 1),
        elf_kernel("main", "sequence", 0),
    ])
    .build();
    elf_rule(&dup, HsacoRule::UniqueElfKernels);
    // Without .rela.dyn (or .dynsym, .dynstr) no site is read.
    let no_rela = rename(".rela.dyn\0", ".rela.dyX\0");
    assert!(
        FullElf::parse(&no_rela).unwrap().kernels[0]
            .sites
            .is_empty()
    );
}

#[test]
fn nested_elf_relocation_rules() {
    let build = |f: &dyn Fn(&mut FullElfBuilder)| {
        let mut b = elf(vec![elf_kernel("main", "sequence", 2)]);
        f(&mut b);
        b.build()
    };
    let good = build(&|_| {});
    let (r_h, r_off, _) = shdr(&good, ".rela.dyn");
    let mut b = good.clone();
    put(&mut b, r_h + 36, 13);
    elf_rule(&b, HsacoRule::Relocations);
    let mut b = good.clone();
    put(&mut b, r_off + 4, 99 << 8);
    elf_rule(&b, HsacoRule::Relocations);
    // Scheme 5 on the PDI site (ABI version 1: the low 4 bits of r_addend).
    let mut b = good.clone();
    put(&mut b, r_off + 8, 5);
    elf_rule(&b, HsacoRule::RelocationSymbol);
    elf_rule(
        &build(&|b| b.kernels[0].pdi_sites[0].1 = "scratch".into()),
        HsacoRule::RelocationSymbol,
    );
    elf_rule(
        &build(&|b| b.kernels[0].arg_sites[0].1 = 4096),
        HsacoRule::RelocationSymbol,
    );
    elf_rule(
        &build(&|b| b.kernels[0].pdi_sites[0].1 = ".pdi.missing".into()),
        HsacoRule::PdiSection,
    );
    elf_rule(
        &build(&|b| b.pdis.push((".pdi".into(), b"other".to_vec()))),
        HsacoRule::PdiSection,
    );
    let same = build(&|b| b.pdis.push((".pdi".into(), b"the pdi".to_vec())));
    assert_eq!(FullElf::parse(&same).unwrap().kernels[0].pdis.len(), 1);
    for off in [0, 6, 57] {
        elf_rule(
            &build(&|b| b.kernels[0].pdi_sites[0].0 = off),
            HsacoRule::PdiSite,
        );
    }
    build_ok(&build(&|b| b.kernels[0].pdi_sites[0].0 = 56));
    for off in [2, 56] {
        elf_rule(
            &build(&|b| b.kernels[0].arg_sites[0].0 = off),
            HsacoRule::ArgSite,
        );
    }
    build_ok(&build(&|b| b.kernels[0].arg_sites[0].0 = 52));
    // Two PDIs, an empty one before and after (as MLIR-AIR's control code loads them).
    let two = build(&|b| {
        b.pdis.push((".pdi.empty".into(), vec![0; 4]));
        b.kernels[0].pdi_sites.push((48, ".pdi.empty".into()));
    });
    let e = FullElf::parse(&two).unwrap();
    assert_eq!(e.kernels[0].pdis.len(), 2);
}

fn build_ok(bytes: &[u8]) {
    FullElf::parse(bytes).unwrap();
}

#[test]
fn xrt_configuration_note_rule() {
    let good = elf(vec![elf_kernel("main", "sequence", 1)]).build();
    let (_, n_off, _) = shdr(&good, ".note.xrt.configuration");
    let mut b = good.clone();
    put(&mut b, n_off + 8, 5);
    let e = FullElf::parse(&b).unwrap().xrt_columns().unwrap_err();
    assert!(
        matches!(
            e,
            ArtifactError::HsacoFullElf {
                rule: HsacoRule::XrtConfigurationNote,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(HsacoRule::XrtConfigurationNote.text())
    );
}

#[test]
fn packer_refuses_what_rocr_would() {
    let mut b = HsacoBuilder::new();
    let msg = |r: Result<&mut HsacoBuilder, ArtifactError>| r.unwrap_err().to_string();
    assert!(
        msg(b.pdi_insts(NpuGen::Npu2, kernel("k", &[1, 2, 3], PDI, 0, 1)))
            .contains("multiple of 4")
    );
    assert!(msg(b.pdi_insts(NpuGen::Npu2, kernel("k", INSTS, &[], 0, 1))).contains("PDI is empty"));
    assert!(
        msg(b.pdi_insts(NpuGen::Npu2, kernel("k", INSTS, PDI, 0, 0))).contains("num_cols is 0")
    );
    assert!(
        msg(b.pdi_insts(NpuGen::Npu2, kernel("", INSTS, PDI, 0, 1))).contains("non-empty name")
    );
    b.pdi_insts(NpuGen::Npu2, kernel("k", INSTS, PDI, 0, 1))
        .unwrap();
    assert_eq!(
        msg(b.pdi_insts(NpuGen::Npu2, kernel("k", INSTS, PDI, 0, 1))),
        "hsaco packer: kernel name \"k\" is already in the aie2p section"
    );
    b.pdi_insts(NpuGen::Npu1, kernel("k", INSTS, PDI, 0, 1))
        .unwrap();
    assert!(HsacoBuilder::new().build().is_err());
}
