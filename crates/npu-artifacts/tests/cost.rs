//! Cost is part of each parser's contract: whatever the bytes say, parsing allocates at most a
//! small multiple of the input and does work near-linear in it.
//!
//! The oracle is the counting global allocator of `cost-meter`: each test feeds one parser an
//! adversarial input built to make a per-entry copy or a pairwise loop explode (many headers
//! sharing one long name, names that are suffixes of one long string, groups sharing their
//! member lists, relocations times kernels, one embedded PDI referenced many times, maximal
//! counts, huge declared counts with little data) and asserts the peak bytes allocated during
//! the parse stay within `PEAK_PER_INPUT_BYTE × input + PEAK_SLACK`. Work is bounded by
//! construction: the inputs are megabytes, so a quadratic loop would run for hours rather than
//! finish.
//!
//! The allocator refuses any allocation that would take the bytes live above
//! `cost_meter::CEILING` (the process then aborts with "memory allocation of N bytes failed")
//! so a regression fails fast instead of driving the machine into swap. Tests take one lock:
//! the counters are global.

use npu_artifacts::hsaco::{self, FullElf, Hsaco};
use npu_artifacts::txn::{self, TxnBuilder, TxnProgram};
use npu_artifacts::{NpuGen, pdi, xclbin};

/// Allowed peak bytes per input byte.
const PEAK_PER_INPUT_BYTE: usize = 8;
/// Allowed peak bytes on top of that (error messages, small tables).
const PEAK_SLACK: usize = 1 << 20;

#[global_allocator]
static METER: cost_meter::Meter = cost_meter::Meter;

use cost_meter::serial;

/// Asserts `parse` stays within the budget for an `input`-byte input, and prints the ratio.
fn assert_linear(what: &str, input: &[u8], parse: impl FnOnce()) {
    let ((), peak) = cost_meter::peak_of(parse);
    let limit = PEAK_PER_INPUT_BYTE * input.len() + PEAK_SLACK;
    println!(
        "{what}: {} input bytes, peak {peak} bytes ({:.2} per input byte)",
        input.len(),
        peak as f64 / input.len() as f64
    );
    assert!(
        peak <= limit,
        "{what}: peak {peak} bytes for a {}-byte input; expected at most {limit}",
        input.len()
    );
}

const MIB: usize = 1 << 20;

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn u32_of(v: usize) -> u32 {
    u32::try_from(v).unwrap()
}

// ---- ELF64 container ----

/// One ELF64 section header: (sh_name, sh_type, sh_offset, sh_size).
type Sh64 = (u32, u32, u64, u64);

/// An ELF64 file of exactly `total` bytes: header, `data` at offset 64, zero padding, then the
/// section headers at the end; section `shstrndx` names the others.
fn elf64(data: &[u8], headers: &[Sh64], shstrndx: u16, total: usize) -> Vec<u8> {
    let shoff = total - headers.len() * 64;
    assert!(64 + data.len() <= shoff, "the data overlaps the headers");
    let mut f = vec![0u8; total];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2;
    f[5] = 1;
    f[6] = 1;
    put16(&mut f, 16, 1);
    put16(&mut f, 18, 224);
    put64(&mut f, 40, shoff as u64);
    put16(&mut f, 52, 64);
    put16(&mut f, 58, 64);
    put16(&mut f, 60, u16::try_from(headers.len()).unwrap());
    put16(&mut f, 62, shstrndx);
    f[64..64 + data.len()].copy_from_slice(data);
    for (i, &(name, ty, off, size)) in headers.iter().enumerate() {
        let h = shoff + i * 64;
        put32(&mut f, h, name);
        put32(&mut f, h + 4, ty);
        put64(&mut f, h + 24, off);
        put64(&mut f, h + 32, size);
        put64(&mut f, h + 48, 1);
    }
    f
}

/// The file from issue 19: 8 MiB, 65535 section headers that all name one string of almost
/// 4 MiB. Copying each header's name costs 65535 × 4 MiB = 256 GiB.
fn issue_19_hsaco() -> Vec<u8> {
    let total = 8 * MIB;
    let count = usize::from(u16::MAX);
    let table = total - 64 - count * 64;
    let mut names = vec![b'A'; table];
    names[table - 1] = 0;
    let mut headers = vec![(0, 1, 64, table as u64); count];
    headers[0] = (0, 3, 64, table as u64);
    elf64(&names, &headers, 0, total)
}

#[test]
fn hsaco_container_with_many_headers_sharing_one_long_name() {
    let _serial = serial();
    let f = issue_19_hsaco();
    assert_eq!(f.len(), 8 * MIB);
    assert_linear("issue 19 hsaco, Hsaco::parse", &f, || {
        let e = Hsaco::parse(&f).unwrap_err();
        assert!(
            e.to_string().len() < 4096,
            "{} byte message",
            e.to_string().len()
        );
    });
    assert_linear("issue 19 hsaco, parse_for_arch", &f, || {
        let e = hsaco::parse_for_arch(&f, NpuGen::Npu2).unwrap_err();
        assert!(
            e.to_string().len() < 4096,
            "{} byte message",
            e.to_string().len()
        );
    });
    assert_linear("issue 19 hsaco, is_hsaco", &f, || {
        assert!(!hsaco::is_hsaco(&f));
    });
}

/// A 48-byte AIE section header with one entry.
fn aie_stub() -> Vec<u8> {
    let mut s = vec![0u8; 48];
    put32(&mut s, 0, 0x4B45_4941);
    put16(&mut s, 4, 1);
    put32(&mut s, 8, 48);
    put32(&mut s, 16, 44);
    s
}

#[test]
fn hsaco_container_with_many_aie_sections_sharing_one_long_name() {
    let _serial = serial();
    // Every header is an AIE section (the same 48 bytes) with one long name that is no arch: the
    // ignored list and the "no section for this arch" message must not copy the name per header.
    let total = 8 * MIB;
    let count = usize::from(u16::MAX);
    let stub = aie_stub();
    let table = total - 64 - count * 64 - stub.len();
    let mut data = vec![b'B'; table];
    data[table - 1] = 0;
    data.extend_from_slice(&stub);
    let stub_at = (64 + table) as u64;
    let mut headers = vec![(0, 1, stub_at, 48); count];
    headers[0] = (0, 3, 64, table as u64);
    let f = elf64(&data, &headers, 0, total);
    assert_linear("AIE sections sharing a long name, Hsaco::parse", &f, || {
        let e = Hsaco::parse(&f).unwrap_err();
        assert!(
            e.to_string().len() < 4096,
            "{} byte message",
            e.to_string().len()
        );
    });
    assert_linear(
        "AIE sections sharing a long name, parse_for_arch",
        &f,
        || {
            let e = hsaco::parse_for_arch(&f, NpuGen::Npu1).unwrap_err();
            assert!(
                e.to_string().len() < 4096,
                "{} byte message",
                e.to_string().len()
            );
        },
    );
}

/// An hsaco whose one section, `aie2`, holds `section`.
fn hsaco_with(arch: &str, section: &[u8]) -> Vec<u8> {
    let mut data = format!("\0.shstrtab\0{arch}\0").into_bytes();
    let names_len = data.len() as u64;
    while !data.len().is_multiple_of(8) {
        data.push(0);
    }
    let sec_at = 64 + data.len();
    data.extend_from_slice(section);
    let total = 64 + data.len() + 3 * 64;
    let headers = [
        (0, 0, 0, 0),
        (1, 3, 64, names_len),
        (11, 1, sec_at as u64, section.len() as u64),
    ];
    elf64(&data, &headers, 1, total)
}

#[test]
fn aie_section_with_kernel_names_that_are_suffixes_of_one_long_string() {
    let _serial = serial();
    // 95,000 kernels whose names start at offsets 0, 1, 2, ... of one 4 MiB string: every name
    // is distinct, and together they are 95,000 × 4 MiB long.
    let count = 95_000usize;
    let strings = 4 * MIB;
    let st_off = 48 + count * 44;
    let pool = st_off + strings;
    let mut s = vec![0u8; pool + 8];
    put32(&mut s, 0, 0x4B45_4941);
    put16(&mut s, 4, 1);
    put32(&mut s, 8, 48);
    put32(&mut s, 12, u32_of(count));
    put32(&mut s, 16, 44);
    put32(&mut s, 20, u32_of(st_off));
    put32(&mut s, 24, u32_of(strings));
    put32(&mut s, 28, u32_of(pool));
    s[st_off..st_off + strings - 1].fill(b'k');
    for i in 0..count {
        let e = 48 + i * 44;
        put32(&mut s, e, u32_of(i));
        put32(&mut s, e + 4, u32_of(pool));
        put32(&mut s, e + 8, 4);
        put32(&mut s, e + 12, u32_of(pool + 4));
        put32(&mut s, e + 16, 4);
        put32(&mut s, e + 24, 1);
    }
    let f = hsaco_with("aie2", &s);
    assert_linear("suffix kernel names, Hsaco::parse", &f, || {
        let _ = Hsaco::parse(&f);
    });
    assert_linear("suffix kernel names, parse_for_arch", &f, || {
        let _ = hsaco::parse_for_arch(&f, NpuGen::Npu1);
    });
}

// ---- the nested full ELF (ELF32) ----

/// One ELF32 section header: (sh_name, sh_type, sh_offset, sh_size, sh_link, sh_info, sh_entsize).
type Sh32 = (u32, u32, u32, u32, u32, u32, u32);

/// An ELF32 full ELF: header, `data` at offset 52, then the section headers.
fn elf32(data: &[u8], headers: &[Sh32], shstrndx: u16) -> Vec<u8> {
    let shoff = 52 + data.len();
    let mut f = vec![0u8; shoff + headers.len() * 40];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 1;
    f[5] = 1;
    f[6] = 1;
    f[7] = 69;
    put32(&mut f, 32, u32_of(shoff));
    put16(&mut f, 46, 40);
    put16(&mut f, 48, u16::try_from(headers.len()).unwrap());
    put16(&mut f, 50, shstrndx);
    f[52..52 + data.len()].copy_from_slice(data);
    for (i, &(name, ty, off, size, link, info, ent)) in headers.iter().enumerate() {
        let h = shoff + i * 40;
        put32(&mut f, h, name);
        put32(&mut f, h + 4, ty);
        put32(&mut f, h + 16, off);
        put32(&mut f, h + 20, size);
        put32(&mut f, h + 24, link);
        put32(&mut f, h + 28, info);
        put32(&mut f, h + 36, ent);
    }
    f
}

/// Appends `bytes` to `data` (4-aligned) and returns their ELF offset.
fn place(data: &mut Vec<u8>, bytes: &[u8]) -> u32 {
    while !data.len().is_multiple_of(4) {
        data.push(0);
    }
    let at = u32_of(52 + data.len());
    data.extend_from_slice(bytes);
    at
}

/// A symbol: (st_name, st_shndx).
fn symbols(syms: &[(u32, u16)]) -> Vec<u8> {
    let mut t = vec![0u8; syms.len() * 16];
    for (i, &(name, shndx)) in syms.iter().enumerate() {
        put32(&mut t, i * 16, name);
        put16(&mut t, i * 16 + 14, shndx);
    }
    t
}

/// Section names every generated full ELF uses, at fixed offsets of its `.shstrtab`.
const SHSTR: &[u8] =
    b"\0.shstrtab\0.symtab\0.strtab\0.ctrltext\0.group\0.rela.dyn\0.dynsym\0.dynstr\0.pdi\0";
const N_SHSTRTAB: u32 = 1;
const N_SYMTAB: u32 = 11;
const N_STRTAB: u32 = 19;
const N_CTRLTEXT: u32 = 27;
const N_GROUP: u32 = 37;
const N_RELA: u32 = 44;
const N_DYNSYM: u32 = 54;
const N_DYNSTR: u32 = 62;
const N_PDI: u32 = 70;

/// A full ELF with `groups` kernels: group g's instance symbol is `inst_name(g)` and all share
/// the kernel symbol named `kernel`; every group's member list is `members` (shared bytes);
/// `relocs` relocations name `.dynsym` symbol 1, called `reloc_sym`, which points at the first
/// control code, shared by every group.
struct FullElfShape<'a> {
    groups: usize,
    kernel: &'a [u8],
    group_words: usize,
    relocs: usize,
    reloc_sym: &'a [u8],
    pdi_name: &'a [u8],
}

fn full_elf(shape: &FullElfShape<'_>) -> Vec<u8> {
    let mut data = Vec::new();
    let mut shstr = SHSTR.to_vec();
    let pdi_name_at = u32_of(shstr.len());
    shstr.extend_from_slice(shape.pdi_name);
    shstr.push(0);
    let shstr_at = place(&mut data, &shstr);
    // .strtab: the kernel name, then one decimal instance name per group.
    let mut strtab = vec![0u8];
    strtab.extend_from_slice(shape.kernel);
    strtab.push(0);
    let mut syms = vec![(0u32, 0u16), (1, 0)];
    for g in 0..shape.groups {
        syms.push((u32_of(strtab.len()), 1));
        strtab.extend_from_slice(format!("i{g}").as_bytes());
        strtab.push(0);
    }
    let strtab_at = place(&mut data, &strtab);
    let symtab_at = place(&mut data, &symbols(&syms));
    let ctrl_at = place(&mut data, &[0u8; 64]);
    let pdi_at = place(&mut data, &[0x5Au8; 16]);
    // Group words: GRP_COMDAT, then the control code (section 4) as every member.
    let mut words = vec![0u8; 4 * shape.group_words.max(2)];
    put32(&mut words, 0, 1);
    for w in 1..shape.group_words.max(2) {
        put32(&mut words, w * 4, 4);
    }
    let group_at = place(&mut data, &words);
    // .dynstr: the relocation symbol's name.
    let mut dynstr = vec![0u8];
    dynstr.extend_from_slice(shape.reloc_sym);
    dynstr.push(0);
    let dynstr_at = place(&mut data, &dynstr);
    let dynsym_at = place(&mut data, &symbols(&[(0, 0), (1, 4)]));
    let mut rela = vec![0u8; shape.relocs * 12];
    let scheme = if shape.reloc_sym.starts_with(b".pdi") {
        8
    } else {
        5
    };
    for r in 0..shape.relocs {
        put32(&mut rela, r * 12, 8);
        put32(&mut rela, r * 12 + 4, (1 << 8) | scheme);
    }
    let rela_at = place(&mut data, &rela);
    let len = |b: usize| u32_of(b);
    let mut headers: Vec<Sh32> = vec![
        (0, 0, 0, 0, 0, 0, 0),
        (N_SHSTRTAB, 3, shstr_at, len(shstr.len()), 0, 0, 0),
        (N_SYMTAB, 2, symtab_at, len(syms.len() * 16), 3, 0, 16),
        (N_STRTAB, 3, strtab_at, len(strtab.len()), 0, 0, 0),
        (N_CTRLTEXT, 1, ctrl_at, 64, 0, 0, 0),
        (N_RELA, 4, rela_at, len(rela.len()), 0, 0, 12),
        (N_DYNSYM, 11, dynsym_at, 32, 7, 0, 16),
        (N_DYNSTR, 3, dynstr_at, len(dynstr.len()), 0, 0, 0),
        (N_PDI, 1, pdi_at, 16, 0, 0, 0),
        (pdi_name_at, 1, pdi_at, 16, 0, 0, 0),
    ];
    for g in 0..shape.groups {
        headers.push((N_GROUP, 17, group_at, len(words.len()), 2, u32_of(2 + g), 4));
    }
    elf32(&data, &headers, 1)
}

#[test]
fn full_elf_with_many_groups_sharing_one_long_kernel_name() {
    let _serial = serial();
    let kernel = vec![b'K'; 4 * MIB];
    let f = full_elf(&FullElfShape {
        groups: 60_000,
        kernel: &kernel,
        group_words: 2,
        relocs: 1,
        reloc_sym: b".pdi",
        pdi_name: b"",
    });
    assert_linear("groups sharing a long kernel name", &f, || {
        let _ = FullElf::parse(&f);
    });
}

#[test]
fn full_elf_with_many_groups_sharing_one_long_member_list() {
    let _serial = serial();
    // 2,000 groups, each listing the same 1M members: 2 × 10^9 member reads if each group walks
    // its list.
    let f = full_elf(&FullElfShape {
        groups: 2_000,
        kernel: b"main",
        group_words: MIB,
        relocs: 1,
        reloc_sym: b".pdi",
        pdi_name: b"",
    });
    assert_linear("groups sharing a long member list", &f, || {
        let _ = FullElf::parse(&f);
    });
}

#[test]
fn full_elf_with_many_relocations_naming_a_long_pdi_section() {
    let _serial = serial();
    // 400,000 relocations naming a PDI section whose name is 2 MiB long.
    let mut name = b".pdi".to_vec();
    name.resize(2 * MIB, b'P');
    let f = full_elf(&FullElfShape {
        groups: 1,
        kernel: b"main",
        group_words: 2,
        relocs: 400_000,
        reloc_sym: &name,
        pdi_name: &name,
    });
    assert_linear("relocations naming a long PDI name", &f, || {
        let _ = FullElf::parse(&f);
    });
}

#[test]
fn full_elf_with_relocations_times_kernels_sharing_one_control_code() {
    let _serial = serial();
    // 2,000 kernels share one control code and 400,000 relocations patch it: 8 × 10^8 sites if
    // each kernel gets its own copy of each.
    let f = full_elf(&FullElfShape {
        groups: 2_000,
        kernel: b"main",
        group_words: 2,
        relocs: 400_000,
        reloc_sym: b".pdi",
        pdi_name: b"",
    });
    assert_linear("relocations × kernels", &f, || {
        let _ = FullElf::parse(&f);
    });
    let f = full_elf(&FullElfShape {
        groups: 2_000,
        kernel: b"main",
        group_words: 2,
        relocs: 400_000,
        reloc_sym: b"7",
        pdi_name: b"",
    });
    assert_linear("argument relocations × kernels", &f, || {
        let _ = FullElf::parse(&f);
    });
}

#[test]
fn hsaco_with_full_elf_blobs_of_many_lengths() {
    let _serial = serial();
    // One full ELF of 2,000 kernels (sharing one control code with a PDI site) and as many
    // kernel entries naming it, each with a different blob length: a cache keyed by
    // (offset, length) parses it again per entry, 2,000 × 2,000 kernels.
    let elf = full_elf(&FullElfShape {
        groups: 2_000,
        kernel: b"main",
        group_words: 2,
        relocs: 1,
        reloc_sym: b".pdi",
        pdi_name: b"",
    });
    let count = 2_000usize;
    let mut strings = Vec::new();
    let mut name_at = Vec::new();
    for g in 0..count {
        name_at.push(u32_of(strings.len()));
        strings.extend_from_slice(format!("main:i{g}\0").as_bytes());
    }
    let st_off = 48 + count * 44;
    let pool = st_off + strings.len();
    let mut s = vec![0u8; pool + elf.len() + 4 * count];
    put32(&mut s, 0, 0x4B45_4941);
    put16(&mut s, 4, 1);
    put32(&mut s, 8, 48);
    put32(&mut s, 12, u32_of(count));
    put32(&mut s, 16, 44);
    put32(&mut s, 20, u32_of(st_off));
    put32(&mut s, 24, u32_of(strings.len()));
    put32(&mut s, 28, u32_of(pool));
    s[st_off..pool].copy_from_slice(&strings);
    s[pool..pool + elf.len()].copy_from_slice(&elf);
    for (i, &name) in name_at.iter().enumerate() {
        let e = 48 + i * 44;
        put32(&mut s, e, name);
        put32(&mut s, e + 4, u32_of(pool));
        put32(&mut s, e + 8, u32_of(elf.len() + 4 * i));
        put32(&mut s, e + 24, 1);
        put32(&mut s, e + 28, 1);
    }
    let f = hsaco_with("aie2p", &s);
    assert_linear("full ELF blobs of many lengths", &f, || {
        let _ = hsaco::parse_for_arch(&f, NpuGen::Npu2);
    });
}

// ---- PDI and xclbin ----

/// Sets the last word of the `words`-long header at `at` so the header sums to 0xFFFFFFFF.
fn seal(b: &mut [u8], at: usize, words: usize) {
    let last = at + (words - 1) * 4;
    put32(b, last, 0);
    let sum = (0..words).fold(0u32, |s, i| {
        let w = at + i * 4;
        s.wrapping_add(u32::from_le_bytes([b[w], b[w + 1], b[w + 2], b[w + 3]]))
    });
    put32(b, last, !sum);
}

/// A partial PDI of `total` bytes whose image and partition tables fill it: the most headers a
/// file of this size can declare (the two tables overlap).
fn pdi_with_max_tables(total: usize) -> Vec<u8> {
    let mut b = vec![0u8; total];
    for (i, w) in pdi::SMAP_WORDS.iter().enumerate() {
        put32(&mut b, i * 4, *w);
    }
    let iht = pdi::IHT_OFFSET;
    let tables = 256usize;
    let images = (total - tables) / pdi::IMAGE_HEADER_BYTES;
    let partitions = (total - tables) / pdi::PARTITION_HEADER_BYTES;
    put32(&mut b, iht, 0x0004_0000);
    put32(&mut b, iht + 4, u32_of(images));
    put32(&mut b, iht + 8, u32_of(tables / 4));
    put32(&mut b, iht + 12, u32_of(partitions));
    put32(&mut b, iht + 16, u32_of(tables / 4));
    put32(&mut b, iht + 40, pdi::PPDI);
    seal(&mut b, iht, pdi::IHT_BYTES / 4);
    b
}

#[test]
fn pdi_with_maximal_header_counts() {
    let _serial = serial();
    let f = pdi_with_max_tables(8 * MIB);
    assert_linear("PDI with maximal tables", &f, || {
        let _ = pdi::identify(&f);
    });
    // Huge declared counts with little data.
    let mut small = pdi_with_max_tables(4096);
    put32(&mut small, pdi::IHT_OFFSET + 4, u32::MAX);
    put32(&mut small, pdi::IHT_OFFSET + 12, u32::MAX);
    seal(&mut small, pdi::IHT_OFFSET, pdi::IHT_BYTES / 4);
    assert_linear("PDI declaring 2^32 headers", &small, || {
        assert!(pdi::identify(&small).is_err());
    });
}

/// An xclbin whose AIE_PARTITION section lists `entries` aie_pdi entries, all pointing at `pdi`.
fn xclbin_with_shared_pdi(pdi: &[u8], entries: usize) -> Vec<u8> {
    let cols_at = xclbin::AIE_PARTITION_BYTES;
    let pdis_at = cols_at + 8;
    let img_at = pdis_at + entries * xclbin::AIE_PDI_BYTES;
    let mut sec = vec![0u8; img_at + pdi.len()];
    put16(&mut sec, 32, 4);
    put32(&mut sec, 40, 1);
    put32(&mut sec, 44, u32_of(cols_at));
    put16(&mut sec, cols_at, 1);
    put32(&mut sec, 120, u32_of(entries));
    put32(&mut sec, 124, u32_of(pdis_at));
    for i in 0..entries {
        let e = pdis_at + i * xclbin::AIE_PDI_BYTES;
        put32(&mut sec, e + 16, u32_of(pdi.len()));
        put32(&mut sec, e + 20, u32_of(img_at));
    }
    sec[img_at..].copy_from_slice(pdi);
    let sec_at = xclbin::SECTIONS_OFFSET + xclbin::SECTION_HEADER_BYTES;
    let mut b = vec![0u8; sec_at + sec.len()];
    b[..8].copy_from_slice(xclbin::MAGIC);
    let len = b.len() as u64;
    put64(&mut b, xclbin::HEADER_OFFSET, len);
    b[xclbin::HEADER_OFFSET + 26] = 2;
    put32(&mut b, xclbin::HEADER_OFFSET + 144, 1);
    let s = xclbin::SECTIONS_OFFSET;
    put32(&mut b, s, xclbin::AIE_PARTITION);
    b[s + 4..s + 17].copy_from_slice(b"aie_partition");
    put64(&mut b, s + 24, sec_at as u64);
    put64(&mut b, s + 32, sec.len() as u64);
    b[sec_at..].copy_from_slice(&sec);
    b
}

#[test]
fn xclbin_with_many_entries_sharing_one_large_pdi() {
    let _serial = serial();
    let f = xclbin_with_shared_pdi(&pdi_with_max_tables(4 * MIB), 40_000);
    assert_linear("xclbin aie_pdi entries sharing one PDI", &f, || {
        let _ = xclbin::summarize(&f);
    });
    assert_linear("xclbin extract_pdi", &f, || {
        let _ = xclbin::extract_pdi(&f);
    });
    assert_linear("identify of that xclbin", &f, || {
        let _ = pdi::identify(&f);
    });
}

#[test]
fn xclbin_with_maximal_and_huge_declared_section_counts() {
    let _serial = serial();
    let mut f = xclbin_with_shared_pdi(&[], 0);
    let sections = (8 * MIB - xclbin::SECTIONS_OFFSET) / xclbin::SECTION_HEADER_BYTES;
    f.resize(
        xclbin::SECTIONS_OFFSET + sections * xclbin::SECTION_HEADER_BYTES,
        0,
    );
    let len = f.len() as u64;
    put64(&mut f, xclbin::HEADER_OFFSET, len);
    put32(&mut f, xclbin::HEADER_OFFSET + 144, u32_of(sections));
    assert_linear("xclbin with maximal sections", &f, || {
        let _ = xclbin::summarize(&f);
    });
    put32(&mut f, xclbin::HEADER_OFFSET + 144, u32::MAX);
    assert_linear("xclbin declaring 2^32 sections", &f, || {
        assert!(xclbin::summarize(&f).is_err());
    });
}

// ---- TXN ----

fn txn_of(build: impl Fn(&mut TxnBuilder), total: usize) -> Vec<u8> {
    let mut b = TxnBuilder::new(NpuGen::Npu1);
    let start = b.finish().len();
    build(&mut b);
    let one = b.finish().len() - start;
    let mut b = TxnBuilder::new(NpuGen::Npu1);
    for _ in 0..(total - start) / one.max(1) {
        build(&mut b);
    }
    b.finish()
}

#[test]
fn txn_with_maximal_op_counts() {
    let _serial = serial();
    let noops = txn_of(
        |b| {
            b.noop();
        },
        4 * MIB,
    );
    let writes = txn_of(
        |b| {
            b.write(TxnBuilder::reg(0, 2, 0x1000), 1);
        },
        4 * MIB,
    );
    let block = txn_of(
        |b| {
            b.block_write(0, 2, 0x1000, &[7; 16]);
        },
        4 * MIB,
    );
    // Distinct shim registers, so the register model holds one entry per write.
    let mut distinct = TxnBuilder::new(NpuGen::Npu1);
    for i in 0..u32_of(4 * MIB / 24) {
        distinct.write(TxnBuilder::reg(0, 0, (i * 4) & 0xF_FFFC), i);
    }
    let distinct = distinct.finish();
    let patches = txn_of(
        |b| {
            b.shim_buffer(0, 0, 0, 64);
        },
        4 * MIB,
    );
    for (what, f) in [
        ("TXN noops", &noops),
        ("TXN writes", &writes),
        ("TXN block writes", &block),
        ("TXN distinct writes", &distinct),
        ("TXN patches", &patches),
    ] {
        assert_linear(&format!("{what}: parse"), f, || {
            TxnProgram::parse(f).unwrap();
        });
    }
}

/// Listing bytes per input byte that `txn::listing` and `txn::explain` document as their bound.
const LISTING_PER_INPUT_BYTE: usize = 12;

/// The listing is a text of one line per op: its cost is its output, at most
/// `LISTING_PER_INPUT_BYTE` bytes of text per input byte (the shortest op, a 4-byte NOOP, gets
/// the longest line relative to its size), and twice that while the text grows.
#[test]
fn txn_listing_and_explain_cost_their_output() {
    let _serial = serial();
    let noops = txn_of(
        |b| {
            b.noop();
        },
        4 * MIB,
    );
    let mut broken = noops.clone();
    let last = broken.len() - 4;
    broken[last] = 0xEE;
    for (what, f) in [
        ("listing", &noops),
        ("explain", &noops),
        ("explain, broken", &broken),
    ] {
        let ((), peak) = cost_meter::peak_of(|| {
            let text = if what == "listing" {
                txn::listing(f).unwrap()
            } else {
                txn::explain(f)
            };
            assert!(
                text.len() <= LISTING_PER_INPUT_BYTE * f.len() + 4096,
                "{what}: {} bytes of text for {} input bytes",
                text.len(),
                f.len()
            );
        });
        println!(
            "TXN {what} of noops: {} input bytes, peak {peak} ({:.2} per input byte)",
            f.len(),
            peak as f64 / f.len() as f64
        );
        assert!(
            peak <= 2 * LISTING_PER_INPUT_BYTE * f.len() + PEAK_SLACK,
            "{what}: peak {peak}"
        );
    }
}
