//! The `kernel-object` profile: AIE hsacos loaded through the executable API, packets naming
//! kernel objects (`rocr-aie-hsaco.md` §3, §4). One test per loader rule and per dispatch
//! check, each asserting the status the caller sees; the full-ELF patches; vector_scalar_add
//! and a chain of 100; and the wrong-form hazards in both directions.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::ffi::{CString, c_void};

use common::ko::*;
use common::profiles::check_in_process;
use common::*;
use hsa_core::sys::{
    Agent, AieKernelObjectPacket, CodeObjectReader, Executable, ExecutableSymbol,
    FloatRoundingMode, HsaProfile, Signal, Status, SymbolInfo,
};
use hsa_sim::*;
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};
use npu_artifacts::hsaco::{Hsaco, HsacoBuilder, PdiInstsKernel};

const KO: Profile = Profile::KernelObject;

fn ko_sim() -> Sim {
    Sim::new(KO)
}

fn add(n: u32, scalar: i64) -> EmuDesign {
    EmuDesign::vector_scalar_add(n, DType::I32, scalar)
}

fn pdi_insts_hsaco(d: &EmuDesign) -> Vec<u8> {
    d.to_hsaco(NpuGen::Npu2).unwrap()
}

/// Byte offset of the aie2p section in `bytes`.
fn section_at(bytes: &[u8]) -> usize {
    Hsaco::parse(bytes)
        .unwrap()
        .section(NpuGen::Npu2)
        .unwrap()
        .file_offset as usize
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Kernel entry `i`'s field at `field` (header 48 bytes, entries 44).
fn entry_field(bytes: &[u8], i: usize, field: usize) -> usize {
    section_at(bytes) + 48 + 44 * i + field
}

fn load_fails(sim: &Sim, bytes: &[u8], want: Status, says: &str) {
    let before = counters();
    let (st, e, r) = try_load(sim, bytes);
    assert_eq!(st, want, "{:?}", last_error());
    let detail = last_error().unwrap();
    assert!(detail.contains(says), "{detail}");
    destroy(e, r);
    let d = counters().since(&before);
    assert_eq!(
        d.code_blobs_placed, d.code_blobs_freed,
        "a failed load frees what it placed"
    );
}

// ---------------------------------------------------------------- the executable API

#[test]
fn kernel_object_is_0_before_freeze_and_a_version_1_descriptor_after() {
    let sim = ko_sim();
    let bytes = pdi_insts_hsaco(&add(256, 1));
    let (st, e, r) = try_load(&sim, &bytes);
    assert_eq!(st, Status::SUCCESS);
    let c = CString::new("vector_scalar_add").unwrap();
    let mut s = ExecutableSymbol::default();
    // SAFETY: live pointers.
    let st = unsafe { hsa_executable_get_symbol_by_name(e, c.as_ptr(), &sim.aie, &mut s) };
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(symbol_u64(s, SymbolInfo::KERNEL_OBJECT), 0);
    assert_eq!(freeze(e), Status::SUCCESS);
    let ko = symbol_u64(s, SymbolInfo::KERNEL_OBJECT);
    assert_ne!(ko, 0);
    // SAFETY: the kernel object points at the live descriptor's first u32.
    assert_eq!(unsafe { (ko as *const u32).read() }, 1);
    assert_eq!(
        symbol_u64(s, SymbolInfo::KERNEL_KERNARG_SEGMENT_SIZE) as u32,
        32
    );
    assert_eq!(
        symbol_u64(s, SymbolInfo::KERNEL_KERNARG_SEGMENT_ALIGNMENT) as u32,
        64
    );
    assert_eq!(
        symbol_u64(s, SymbolInfo::KERNEL_GROUP_SEGMENT_SIZE) as u32,
        0
    );
    assert_eq!(symbol_u64(s, SymbolInfo::TYPE) as u32, 1);
    assert_eq!(symbol_u64(s, SymbolInfo::NAME_LENGTH) as u32, 17);
    let mut name = [0u8; 17];
    // SAFETY: NAME writes NAME_LENGTH bytes.
    let st =
        unsafe { hsa_executable_symbol_get_info(s, SymbolInfo::NAME, name.as_mut_ptr().cast()) };
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(&name, b"vector_scalar_add");
    assert_eq!(symbol_u64(s, SymbolInfo::AGENT), sim.aie.handle);
    // Freezing twice, loading after freeze.
    assert_eq!(freeze(e), Status::ERROR_FROZEN_EXECUTABLE);
    assert_eq!(load_into(e, sim.aie, r), Status::ERROR_FROZEN_EXECUTABLE);
    destroy(e, r);
    let mut ko = 0u64;
    // SAFETY: a destroyed symbol's handle and a live out-pointer.
    let st = unsafe {
        hsa_executable_symbol_get_info(s, SymbolInfo::KERNEL_OBJECT, (&raw mut ko).cast())
    };
    assert_eq!(st, Status::ERROR_INVALID_EXECUTABLE_SYMBOL);
}

#[test]
fn aie_kernels_are_agent_symbols_and_unknown_names_fail() {
    let sim = ko_sim();
    let bytes = pdi_insts_hsaco(&add(256, 1));
    let l = Loaded::new(&sim, &bytes);
    let c = CString::new("vector_scalar_add").unwrap();
    let mut s = ExecutableSymbol::default();
    // SAFETY: live pointers; a NULL agent asks for program symbols.
    let st =
        unsafe { hsa_executable_get_symbol_by_name(l.exec, c.as_ptr(), std::ptr::null(), &mut s) };
    assert_eq!(st, Status::ERROR_INVALID_SYMBOL_NAME);
    let c = CString::new("vector_scalar_ad").unwrap();
    // SAFETY: live pointers.
    let st = unsafe { hsa_executable_get_symbol_by_name(l.exec, c.as_ptr(), &sim.aie, &mut s) };
    assert_eq!(st, Status::ERROR_INVALID_SYMBOL_NAME);
    assert!(last_error().unwrap().contains("vector_scalar_add"));
    l.destroy();
}

#[test]
fn bad_handles_and_arguments_are_refused() {
    let _sim = ko_sim();
    let mut r = CodeObjectReader::default();
    let mut e = Executable::default();
    // SAFETY: (whole block) NULL or bogus arguments the runtime must refuse without use.
    unsafe {
        assert_eq!(
            hsa_code_object_reader_create_from_memory([0u8; 4].as_ptr().cast(), 0, &mut r),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_code_object_reader_create_from_memory(std::ptr::null(), 4, &mut r),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_executable_create_alt(
                HsaProfile(7),
                FloatRoundingMode::DEFAULT,
                std::ptr::null(),
                &mut e
            ),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_code_object_reader_destroy(CodeObjectReader { handle: 0x77 }),
            Status::ERROR_INVALID_CODE_OBJECT_READER
        );
        assert_eq!(
            hsa_executable_destroy(Executable { handle: 0x77 }),
            Status::ERROR_INVALID_EXECUTABLE
        );
        assert_eq!(
            freeze(Executable { handle: 0x77 }),
            Status::ERROR_INVALID_EXECUTABLE
        );
    }
    let e = executable();
    let st = load_into(e, Agent::default(), CodeObjectReader { handle: 0x77 });
    assert_eq!(st, Status::ERROR_INVALID_CODE_OBJECT_READER);
    // SAFETY: a live executable.
    assert_eq!(unsafe { hsa_executable_destroy(e) }, Status::SUCCESS);
}

// ---------------------------------------------------------------- loader rules, in ROCR's order

#[test]
fn loader_a_frozen_executable_takes_no_code_object() {
    let sim = ko_sim();
    let bytes = pdi_insts_hsaco(&add(256, 1));
    let (r, e) = (reader(&bytes), executable());
    assert_eq!(freeze(e), Status::SUCCESS);
    assert_eq!(load_into(e, sim.aie, r), Status::ERROR_FROZEN_EXECUTABLE);
    destroy(e, r);
}

#[test]
fn loader_no_aie_section_goes_down_the_gpu_path_and_fails() {
    let sim = ko_sim();
    let mut bytes = pdi_insts_hsaco(&add(256, 1));
    let at = section_at(&bytes);
    put_u32(&mut bytes, at, 0x4B45_4942); // "BIEK"
    load_fails(
        &sim,
        &bytes,
        Status::ERROR_INVALID_CODE_OBJECT,
        "no AIE section",
    );
    load_fails(
        &sim,
        b"not an ELF at all",
        Status::ERROR_INVALID_CODE_OBJECT,
        "ISA",
    );
}

#[test]
fn loader_the_cpu_agent_takes_no_aie_hsaco() {
    let sim = ko_sim();
    let bytes = pdi_insts_hsaco(&add(256, 1));
    let (r, e) = (reader(&bytes), executable());
    assert_eq!(load_into(e, sim.cpu, r), Status::ERROR_INVALID_CODE_OBJECT);
    destroy(e, r);
}

#[test]
fn loader_no_section_for_the_agents_arch_is_incompatible() {
    let sim = ko_sim(); // aie2p
    let bytes = add(256, 1).to_hsaco(NpuGen::Npu1).unwrap();
    load_fails(&sim, &bytes, Status::ERROR_INCOMPATIBLE_ARGUMENTS, "aie2p");
}

#[test]
fn loader_the_section_matching_the_agent_is_the_one_loaded() {
    // One hsaco with an aie2 and an aie2p section, the kernels adding different scalars: each
    // agent runs its own.
    for (agent, scalar) in [(NpuGen::Npu1, 10), (NpuGen::Npu2, 20)] {
        let sim = Sim::with(SimConfig {
            agent,
            profile: KO,
            ..Default::default()
        });
        let mut b = HsacoBuilder::new();
        for (g, s) in [(NpuGen::Npu1, 10), (NpuGen::Npu2, 20)] {
            b.pdi_insts(g, add(256, s).hsaco_kernel(g)).unwrap();
        }
        let bytes = b.build().unwrap();
        let l = Loaded::new(&sim, &bytes);
        let (a, o) = io_i32(&sim, &[1; 256]);
        let q = sim.queue();
        let sig = sim.signal(1);
        q.submit(&[ko_packet(
            &sim,
            l.kernel_object("vector_scalar_add"),
            &[(a, 1024), (o, 1024)],
            sig,
        )]);
        assert_eq!(wait_eq(sig, 0, 1_000_000_000), 0, "{:?}", last_error());
        assert_eq!(bytes_i32(&read(o, 1024)), vec![1 + scalar; 256]);
        drop(q);
        l.destroy();
    }
}

#[test]
fn loader_a_broken_section_is_an_invalid_code_object() {
    let sim = ko_sim();
    let mut bytes = pdi_insts_hsaco(&add(256, 1));
    let at = section_at(&bytes);
    put_u32(&mut bytes, at + 4, 2); // version_major 2
    load_fails(
        &sim,
        &bytes,
        Status::ERROR_INVALID_CODE_OBJECT,
        "version_major",
    );
}

#[test]
fn loader_a_name_already_defined_for_the_agent_is_refused_before_anything_is_placed() {
    let sim = ko_sim();
    let bytes = pdi_insts_hsaco(&add(256, 1));
    let (st, e, r) = try_load(&sim, &bytes);
    assert_eq!(st, Status::SUCCESS);
    let before = counters();
    let r2 = reader(&bytes);
    assert_eq!(
        load_into(e, sim.aie, r2),
        Status::ERROR_VARIABLE_ALREADY_DEFINED
    );
    assert!(last_error().unwrap().contains("vector_scalar_add"));
    assert_eq!(counters().since(&before).code_blobs_placed, 0);
    // ROCR checks names before the kind: a duplicate with kind 5 is still a duplicate.
    let mut bad_kind = bytes.clone();
    let at = entry_field(&bad_kind, 0, 28);
    put_u32(&mut bad_kind, at, 5);
    let r3 = reader(&bad_kind);
    assert_eq!(
        load_into(e, sim.aie, r3),
        Status::ERROR_VARIABLE_ALREADY_DEFINED
    );
    destroy(e, r);
    // SAFETY: live readers.
    unsafe {
        assert_eq!(hsa_code_object_reader_destroy(r2), Status::SUCCESS);
        assert_eq!(hsa_code_object_reader_destroy(r3), Status::SUCCESS);
    }
}

#[test]
fn loader_kind_2_or_more_is_an_invalid_code_object() {
    let sim = ko_sim();
    let mut bytes = pdi_insts_hsaco(&add(256, 1));
    let at = entry_field(&bytes, 0, 28);
    put_u32(&mut bytes, at, 2);
    load_fails(&sim, &bytes, Status::ERROR_INVALID_CODE_OBJECT, "kind");
}

#[test]
fn loader_num_cols_must_be_1_to_the_agents_columns() {
    let sim = ko_sim(); // aie2p: 8 columns
    let mut bytes = pdi_insts_hsaco(&add(256, 1));
    let at = entry_field(&bytes, 0, 24);
    put_u32(&mut bytes, at, 0);
    load_fails(&sim, &bytes, Status::ERROR_INVALID_CODE_OBJECT, "num_cols");
    put_u32(&mut bytes, at, 9);
    load_fails(&sim, &bytes, Status::ERROR_INVALID_CODE_OBJECT, "9");
    put_u32(&mut bytes, at, 8);
    Loaded::new(&sim, &bytes).destroy();
}

#[test]
fn loader_pdi_insts_without_a_pdi_is_an_invalid_code_object() {
    let sim = ko_sim();
    let mut bytes = pdi_insts_hsaco(&add(256, 1));
    let (off, size) = (entry_field(&bytes, 0, 12), entry_field(&bytes, 0, 16));
    put_u32(&mut bytes, off, 0);
    put_u32(&mut bytes, size, 0);
    load_fails(&sim, &bytes, Status::ERROR_INVALID_CODE_OBJECT, "PDI");
}

#[test]
fn loader_a_broken_full_elf_is_an_invalid_code_object() {
    let sim = ko_sim();
    let d = add(256, 1);
    let good = d.to_full_elf_hsaco().unwrap();
    // kernarg_size neither 0 nor 16 x arguments.
    let mut bytes = good.clone();
    let at = entry_field(&bytes, 0, 20);
    put_u32(&mut bytes, at, 48);
    load_fails(
        &sim,
        &bytes,
        Status::ERROR_INVALID_CODE_OBJECT,
        "kernarg_size",
    );
    // The nested ELF's EI_OSABI is not aie2p's.
    let s = Hsaco::parse(&good).unwrap();
    let k = &s.section(NpuGen::Npu2).unwrap().kernels[0];
    let elf_at = section_at(&good) + k.insts.offset as usize;
    let mut bytes = good.clone();
    bytes[elf_at + 7] = 0;
    load_fails(&sim, &bytes, Status::ERROR_INVALID_CODE_OBJECT, "EI_OSABI");
    // A full ELF in an aie2 section, loaded on a Phoenix.
    let sim1 = {
        drop(sim);
        Sim::with(SimConfig {
            agent: NpuGen::Npu1,
            profile: KO,
            ..Default::default()
        })
    };
    // Rename the section "aie2p" to "aie2" in the container's .shstrtab.
    let mut bytes = good.clone();
    let c = Hsaco::parse(&good).unwrap().container;
    let names = c.sections.iter().find(|s| s.name == ".shstrtab").unwrap();
    let (start, len) = (names.offset as usize, names.size as usize);
    let pos = bytes[start..start + len]
        .windows(6)
        .position(|w| w == b"aie2p\0")
        .unwrap();
    bytes[start + pos + 4] = 0;
    load_fails(&sim1, &bytes, Status::ERROR_INVALID_CODE_OBJECT, "aie2p");
}

#[test]
fn loader_a_full_device_heap_is_out_of_resources_and_frees_what_it_placed() {
    let sim = ko_sim();
    // Leave one 32 KiB block: the PDI fits, the instructions do not.
    let hog = sim.alloc(HEAP, (64 << 20) - (32 << 10));
    let bytes = pdi_insts_hsaco(&add(256, 1));
    load_fails(&sim, &bytes, Status::ERROR_OUT_OF_RESOURCES, "device heap");
    sim.free(hog);
    Loaded::new(&sim, &bytes).destroy();
}

#[test]
fn loads_place_blobs_in_the_device_heap_and_destroy_frees_them() {
    let sim = ko_sim();
    let before = counters();
    // Two kernels sharing one PDI and one instruction stream: placed once each.
    let d = add(256, 1);
    let mut b = HsacoBuilder::new();
    for name in ["one", "two"] {
        b.pdi_insts(
            NpuGen::Npu2,
            PdiInstsKernel {
                name: name.into(),
                ..d.hsaco_kernel(NpuGen::Npu2)
            },
        )
        .unwrap();
    }
    let bytes = b.build().unwrap();
    let l = Loaded::new(&sim, &bytes);
    let mid = counters().since(&before);
    assert_eq!((mid.code_blobs_placed, mid.code_blobs_freed), (2, 0));
    assert_ne!(l.kernel_object("one"), l.kernel_object("two"));
    l.destroy();
    let d = counters().since(&before);
    assert_eq!((d.code_blobs_placed, d.code_blobs_freed), (2, 2));
    assert_eq!((d.executables_created, d.executables_destroyed), (1, 1));
    assert_eq!(
        (
            d.code_object_readers_created,
            d.code_object_readers_destroyed
        ),
        (1, 1)
    );
}

#[test]
fn every_other_profile_fails_the_load_as_a_g2_only_rocr_does() {
    for profile in common::profiles::ALL {
        let agent = if profile == Profile::Rocm70 {
            NpuGen::Npu1
        } else {
            NpuGen::Npu2
        };
        let sim = Sim::with(SimConfig {
            agent,
            profile,
            ..Default::default()
        });
        let bytes = add(256, 1).to_hsaco(agent).unwrap();
        let (st, e, r) = try_load(&sim, &bytes);
        assert_eq!(st, Status::ERROR_INVALID_CODE_OBJECT, "{profile}");
        assert!(
            last_error().unwrap().contains("no AIE section loader"),
            "{profile}"
        );
        // The executable stays usable, and empty.
        assert_eq!(freeze(e), Status::SUCCESS);
        destroy(e, r);
    }
}

// ---------------------------------------------------------------- dispatch

fn add_one_hsaco() -> Vec<u8> {
    pdi_insts_hsaco(&add(256, 1))
}

/// Submits `packets` in one doorbell and checks the refusal: the status, nothing retired.
fn refused(sim: &Sim, packets: &[[u8; 64]], want: Status, says: &str) {
    let q = sim.queue();
    let before = counters();
    q.submit(packets);
    let detail = check_in_process(sim, &q, want, 0);
    assert!(detail.contains(says), "{detail}");
    assert!(detail.contains("refused before submission"), "{detail}");
    let d = counters().since(&before);
    assert_eq!((d.packets_completed, d.packets_failed), (0, 1));
}

#[test]
fn vector_scalar_add_runs_from_pdi_insts_and_from_a_full_elf() {
    let sim = ko_sim();
    let d = EmuDesign::vector_scalar_add(1024, DType::I32, 7);
    for (bytes, name) in [
        (pdi_insts_hsaco(&d), "vector_scalar_add"),
        (d.to_full_elf_hsaco().unwrap(), "vector_scalar_add:sequence"),
    ] {
        let l = Loaded::new(&sim, &bytes);
        let input: Vec<i32> = (0..1024).map(|i| i * 3 - 500).collect();
        let (a, o) = io_i32(&sim, &input);
        let sig = sim.signal(1);
        let q = sim.queue();
        q.submit(&[ko_packet(
            &sim,
            l.kernel_object(name),
            &[(a, 4096), (o, 4096)],
            sig,
        )]);
        assert_eq!(
            wait_eq(sig, 0, 1_000_000_000),
            0,
            "{name}: {:?}",
            last_error()
        );
        let want: Vec<i32> = input.iter().map(|x| x + 7).collect();
        assert_eq!(bytes_i32(&read(o, 4096)), want, "{name}");
        assert_eq!(q.read_index(), 1);
        drop(q);
        l.destroy();
    }
}

/// A full ELF hsaco of `d` in ELF ABI version `abi` whose input site carries `addend`: ABI 0 (what aiecc writes) keeps the scheme in
/// `ELF32_R_TYPE` and the addend in `r_addend`, ABI 1 packs both into `r_addend`.
fn full_elf_with_addend(d: &EmuDesign, abi: u8, addend: u32) -> Vec<u8> {
    use npu_artifacts::emu::{EMU_CTRL_ARG_SITES, EMU_CTRL_MAGIC, EMU_CTRL_PDI_SITE};
    use npu_artifacts::hsaco::{ElfKernelSpec, FullElfBuilder};
    let mut ctrl = EMU_CTRL_MAGIC.to_vec();
    ctrl.resize(
        EMU_CTRL_ARG_SITES as usize + 12 * usize::from(d.num_args),
        0,
    );
    let elf = FullElfBuilder {
        kernels: vec![ElfKernelSpec {
            kernel: d.kernel.name().to_owned(),
            instance: "sequence".to_owned(),
            ctrl_code: ctrl,
            pdi_sites: vec![(EMU_CTRL_PDI_SITE, ".pdi".to_owned())],
            arg_sites: (0..u16::from(d.num_args))
                .map(|i| {
                    (
                        EMU_CTRL_ARG_SITES + 12 * u32::from(i),
                        i,
                        if i == 0 { addend } else { 0 },
                    )
                })
                .collect(),
        }],
        pdis: vec![(".pdi".to_owned(), d.to_pdi())],
        columns: Some(1),
        abi_version: abi,
    }
    .build();
    HsacoBuilder::new()
        .full_elf(&elf, None)
        .unwrap()
        .build()
        .unwrap()
}

#[test]
fn full_elf_relocations_of_both_elf_abi_versions_load_and_patch() {
    let sim = ko_sim();
    let d = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    // The relocation reader gives the same sites, addend included, in either encoding.
    let sites = |abi| {
        let bytes = full_elf_with_addend(&d, abi, 16);
        let h = Hsaco::parse(&bytes).unwrap();
        let k = h
            .section(NpuGen::Npu2)
            .unwrap()
            .kernel("vector_scalar_add:sequence")
            .unwrap();
        k.full_elf.as_ref().unwrap().sites.clone()
    };
    let (v0, v1) = (sites(0), sites(1));
    assert_eq!(v0, v1);
    assert_eq!(v0.iter().map(|s| s.addend).max(), Some(16));
    // The emulated designs' own full ELFs load and run in either version.
    for abi in [0u8, 1] {
        let bytes = d.to_full_elf_hsaco_abi(abi).unwrap();
        let l = Loaded::new(&sim, &bytes);
        let input: Vec<i32> = (0..1024).collect();
        let (a, o) = io_i32(&sim, &input);
        let sig = sim.signal(1);
        let q = sim.queue();
        q.submit(&[ko_packet(
            &sim,
            l.kernel_object("vector_scalar_add:sequence"),
            &[(a, 4096), (o, 4096)],
            sig,
        )]);
        assert_eq!(
            wait_eq(sig, 0, 1_000_000_000),
            0,
            "ABI {abi}: {:?}",
            last_error()
        );
        let want: Vec<i32> = (1..=1024).collect();
        assert!(bytes_i32(&read(o, 4096)) == want, "ABI {abi}: wrong output");
        drop(q);
        l.destroy();
    }
}

#[test]
fn a_chain_of_100_runs_in_chains_of_44() {
    let sim = ko_sim();
    let bytes = add_one_hsaco();
    let l = Loaded::new(&sim, &bytes);
    let ko = l.kernel_object("vector_scalar_add");
    let bufs = [sim.put(DATA, &i32_bytes(&[0; 256])), sim.alloc(DATA, 1024)];
    let q = sim.queue();
    let sig = sim.signal(100);
    let before = counters();
    let packets: Vec<[u8; 64]> = (0..100)
        .map(|i| {
            ko_packet(
                &sim,
                ko,
                &[(bufs[i % 2], 1024), (bufs[(i + 1) % 2], 1024)],
                sig,
            )
        })
        .collect();
    // Rings of 44 (one chain), 45 (44 + 1) and 11 (one chain).
    q.submit(&packets[..44]);
    q.submit(&packets[44..89]);
    q.submit(&packets[89..]);
    assert_eq!(wait_eq(sig, 0, 1_000_000_000), 0, "{:?}", last_error());
    assert_eq!(bytes_i32(&read(bufs[0], 1024)), vec![100; 256]);
    let d = counters().since(&before);
    // 44 commands of two arguments fill one 4096-byte chain (92 bytes each); the 45th starts
    // another.
    assert_eq!(d.chain_submissions, 4);
    assert_eq!(d.doorbells, 3);
    assert_eq!(d.packets_completed, 100);
    drop(q);
    l.destroy();
}

#[test]
fn full_elf_patches_apply_to_a_fresh_copy_for_every_packet() {
    // The same full-ELF kernel twice in one batch with different buffers: each reads and writes
    // its own, which it finds only through its own ShimDma48 patches (an additive patch applied
    // twice to one copy would point the second packet elsewhere).
    let sim = ko_sim();
    let d = EmuDesign::vector_scalar_add(256, DType::I32, 5);
    let bytes = d.to_full_elf_hsaco().unwrap();
    let l = Loaded::new(&sim, &bytes);
    let ko = l.kernel_object("vector_scalar_add:sequence");
    let (a1, o1) = io_i32(&sim, &[100; 256]);
    let (a2, o2) = io_i32(&sim, &[-7; 256]);
    let sig = sim.signal(2);
    let q = sim.queue();
    q.submit(&[
        ko_packet(&sim, ko, &[(a1, 1024), (o1, 1024)], sig),
        ko_packet(&sim, ko, &[(a2, 1024), (o2, 1024)], sig),
    ]);
    assert_eq!(wait_eq(sig, 0, 1_000_000_000), 0, "{:?}", last_error());
    assert_eq!(bytes_i32(&read(o1, 1024)), vec![105; 256]);
    assert_eq!(bytes_i32(&read(o2, 1024)), vec![-2; 256]);
    // And once more in a later batch, with the buffers swapped.
    q.submit(&[ko_packet(&sim, ko, &[(o2, 1024), (a1, 1024)], sig)]);
    assert_eq!(bytes_i32(&read(a1, 1024)), vec![3; 256]);
    drop(q);
    l.destroy();
}

#[test]
fn dispatch_opcode_other_than_kmq_is_refused() {
    let sim = ko_sim();
    let bytes = add_one_hsaco();
    let l = Loaded::new(&sim, &bytes);
    let (a, o) = io_i32(&sim, &[1; 256]);
    let mut p = ko_packet(
        &sim,
        l.kernel_object("vector_scalar_add"),
        &[(a, 1024), (o, 1024)],
        Signal::default(),
    );
    p[2] = 1;
    refused(&sim, &[p], Status::ERROR_INVALID_PACKET_FORMAT, "opcode 1");
    l.destroy();
}

#[test]
fn dispatch_a_g2_packet_is_refused_as_a_descriptor_whose_version_is_not_1() {
    // The wrong-form hazard: a kernel-object runtime reads a G2 packet's instruction address
    // as a kernel object.
    let sim = ko_sim();
    let q_sig = Signal::default();
    let d = valid(&sim, q_sig);
    let p = g2_bytes(&g2_packet(&sim, &d));
    refused(&sim, &[p], Status::ERROR_INVALID_PACKET_FORMAT, "version");
    // NULL, and a live allocation whose first word happens to be 1.
    refused(
        &sim,
        &[ko_packet(&sim, 0, &[], q_sig)],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "NULL",
    );
    let fake = sim.put(DATA, &1u32.to_le_bytes());
    refused(
        &sim,
        &[ko_packet(&sim, fake, &[], q_sig)],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "not a descriptor",
    );
}

#[test]
fn dispatch_a_destroyed_executables_kernel_object_is_refused() {
    let sim = ko_sim();
    let bytes = add_one_hsaco();
    let l = Loaded::new(&sim, &bytes);
    let ko = l.kernel_object("vector_scalar_add");
    l.destroy();
    let (a, o) = io_i32(&sim, &[1; 256]);
    let p = ko_packet(&sim, ko, &[(a, 1024), (o, 1024)], Signal::default());
    refused(
        &sim,
        &[p],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "kernel object",
    );
}

#[test]
fn dispatch_one_kind_per_batch_and_the_context_follows_the_mode() {
    let sim = ko_sim();
    let d = add(256, 1);
    // narrow (1 column) and wide (4 columns) share one PDI.
    let mut b = HsacoBuilder::new();
    for (name, cols) in [("narrow", 1), ("wide", 4)] {
        b.pdi_insts(
            NpuGen::Npu2,
            PdiInstsKernel {
                name: name.into(),
                num_cols: cols,
                ..d.hsaco_kernel(NpuGen::Npu2)
            },
        )
        .unwrap();
    }
    let pdi_bytes = b.build().unwrap();
    let elf_bytes = d.to_full_elf_hsaco().unwrap();
    let (pi, fe) = (Loaded::new(&sim, &pdi_bytes), Loaded::new(&sim, &elf_bytes));
    let (a, o) = io_i32(&sim, &[1; 256]);
    let args = [(a, 1024), (o, 1024)];
    let pk =
        |k: &Loaded, name: &str| ko_packet(&sim, k.kernel_object(name), &args, Signal::default());
    let (narrow, wide, elf) = (
        pk(&pi, "narrow"),
        pk(&pi, "wide"),
        pk(&fe, "vector_scalar_add:sequence"),
    );

    // Mixed kinds in one doorbell: refused whole, nothing retired.
    refused(
        &sim,
        &[narrow, elf],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "one kind",
    );

    let q = sim.queue();
    let step = |packets: &[[u8; 64]]| {
        let before = counters();
        q.submit(packets);
        assert!(!q.suspended(), "{:?}", last_error());
        let d = counters().since(&before);
        (
            d.hw_context_builds,
            d.hw_context_mode_switches,
            d.hw_context_columns,
        )
    };
    assert_eq!(
        step(&[narrow]),
        (1, 0, 1),
        "the first batch builds a 1-column context"
    );
    assert_eq!(
        step(&[narrow]),
        (0, 0, 0),
        "nothing new: the context is reused"
    );
    assert_eq!(step(&[wide]), (1, 0, 4), "grows within the mode");
    assert_eq!(step(&[narrow]), (0, 0, 0), "never shrinks within the mode");
    assert_eq!(
        step(&[elf]),
        (1, 1, 1),
        "a mode switch sizes from the batch alone"
    );
    assert_eq!(step(&[wide, narrow]), (1, 1, 4));
    drop(q);
    pi.destroy();
    fe.destroy();
}

#[test]
fn dispatch_full_elf_argument_count_must_match_the_elf() {
    let sim = ko_sim();
    let bytes = add(256, 1).to_full_elf_hsaco().unwrap();
    let l = Loaded::new(&sim, &bytes);
    let (a, _) = io_i32(&sim, &[1; 256]);
    let p = ko_packet(
        &sim,
        l.kernel_object("vector_scalar_add:sequence"),
        &[(a, 1024)],
        Signal::default(),
    );
    refused(
        &sim,
        &[p],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "ELF has 2 arguments",
    );
    l.destroy();
}

#[test]
fn dispatch_kernarg_checks() {
    let sim = ko_sim();
    let bytes = add_one_hsaco();
    let l = Loaded::new(&sim, &bytes);
    let ko = l.kernel_object("vector_scalar_add");
    let (a, o) = io_i32(&sim, &[1; 256]);
    let packet = |kernarg: u64, n: u16| {
        let mut p = AieKernelObjectPacket {
            num_kernargs: n,
            kernarg_address: kernarg,
            ..Default::default()
        };
        p.set_kernel_object(ko);
        packet_bytes(&p)
    };
    // NULL with arguments.
    refused(
        &sim,
        &[packet(0, 2)],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "NULL",
    );
    // Not a runtime allocation: host memory the runtime never saw.
    let host = [0u64; 4];
    refused(
        &sim,
        &[packet(host.as_ptr() as u64, 2)],
        Status::ERROR_INVALID_ALLOCATION,
        "kernarg buffer",
    );
    // More arguments than the buffer holds: a 4 KiB page holds 256.
    let ka = sim.kernargs(&[(a, 1024), (o, 1024)]);
    refused(
        &sim,
        &[packet(ka, 257)],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "room for 256",
    );
    // An unregistered argument pointer, even with size 0.
    let p = ko_packet(
        &sim,
        ko,
        &[(host.as_ptr() as u64, 0), (o, 1024)],
        Signal::default(),
    );
    refused(&sim, &[p], Status::ERROR_INVALID_ALLOCATION, "argument 0");
    // A size past the end of its allocation (4 KiB page).
    let p = ko_packet(&sim, ko, &[(a, 1024), (o + 4000, 1024)], Signal::default());
    refused(
        &sim,
        &[p],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "argument 1",
    );
    l.destroy();
}

#[test]
fn dispatch_a_refused_packet_refuses_the_whole_batch() {
    let sim = ko_sim();
    let bytes = add_one_hsaco();
    let l = Loaded::new(&sim, &bytes);
    let ko = l.kernel_object("vector_scalar_add");
    let (a, o) = io_i32(&sim, &[1; 256]);
    let sig = sim.signal(2);
    let good = ko_packet(&sim, ko, &[(a, 1024), (o, 1024)], sig);
    let mut bad = good;
    bad[2] = 3;
    refused(
        &sim,
        &[good, bad],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "packet 1",
    );
    assert_eq!(load_signal(sig), 2, "the signal is untouched");
    assert_eq!(
        bytes_i32(&read(o, 1024)),
        vec![0; 256],
        "the good packet never ran"
    );
    l.destroy();
}

#[test]
fn dispatch_the_33rd_pdi_on_a_queue_is_out_of_resources_until_an_executable_is_destroyed() {
    let sim = ko_sim();
    let bytes = add_one_hsaco();
    // Every load of the same hsaco is a new PDI.
    let loads: Vec<Loaded> = (0..33).map(|_| Loaded::new(&sim, &bytes)).collect();
    let (a, o) = io_i32(&sim, &[1; 256]);
    let q = sim.queue();
    let packet = |l: &Loaded| {
        ko_packet(
            &sim,
            l.kernel_object("vector_scalar_add"),
            &[(a, 1024), (o, 1024)],
            Signal::default(),
        )
    };
    for l in &loads[..32] {
        q.submit(&[packet(l)]);
    }
    assert!(!q.suspended(), "{:?}", last_error());
    q.submit(&[packet(&loads[32])]);
    let detail = check_in_process(&sim, &q, Status::ERROR_OUT_OF_RESOURCES, 32);
    assert!(detail.contains("distinct PDI number 33"), "{detail}");
    drop(q);
    // A queue holding 32 PDIs takes a new one once an executable was destroyed: the
    // PDI-release epoch empties its cache.
    let mut loads = loads;
    let q = sim.queue();
    for l in &loads[1..33] {
        q.submit(&[packet(l)]);
    }
    assert!(!q.suspended(), "{:?}", last_error());
    loads.remove(1).destroy();
    q.submit(&[packet(&loads[0])]);
    assert!(!q.suspended(), "{:?}", last_error());
    drop(q);
    for l in loads {
        l.destroy();
    }
}

#[test]
fn dispatch_a_command_over_2047_dwords_is_refused() {
    let sim = ko_sim();
    let bytes = add_one_hsaco();
    let l = Loaded::new(&sim, &bytes);
    let ko = l.kernel_object("vector_scalar_add");
    let (a, o) = io_i32(&sim, &[1; 256]);
    let args = |n: usize| {
        let mut v = vec![(a, 1024), (o, 1024)];
        v.resize(n, (a, 0));
        v
    };
    // 7 + 2 x 1020 = 2047 dwords fit; 1021 arguments do not.
    let q = sim.queue();
    let sig = sim.signal(1);
    q.submit(&[ko_packet(&sim, ko, &args(1020), sig)]);
    assert_eq!(wait_eq(sig, 0, 1_000_000_000), 0, "{:?}", last_error());
    drop(q);
    let p = ko_packet(&sim, ko, &args(1021), Signal::default());
    refused(
        &sim,
        &[p],
        Status::ERROR_INVALID_PACKET_FORMAT,
        "2049 dwords",
    );
    l.destroy();
}

#[test]
fn a_device_failure_retires_the_packets_before_it() {
    let sim = ko_sim();
    let good = add_one_hsaco();
    let fault = pdi_insts_hsaco(&EmuDesign::fault(256));
    let (g, f) = (Loaded::new(&sim, &good), Loaded::new(&sim, &fault));
    let (a, o) = io_i32(&sim, &[1; 256]);
    let o2 = sim.alloc(DATA, 256);
    let sig = sim.signal(2);
    let q = sim.queue();
    q.submit(&[
        ko_packet(
            &sim,
            g.kernel_object("vector_scalar_add"),
            &[(a, 1024), (o, 1024)],
            sig,
        ),
        ko_packet(&sim, f.kernel_object("fault"), &[(a, 256), (o2, 256)], sig),
    ]);
    check_in_process(&sim, &q, Status::ERROR, 1);
    assert_eq!(load_signal(sig), 1);
    assert_eq!(bytes_i32(&read(o, 1024)), vec![2; 256]);
    drop(q);
    g.destroy();
    f.destroy();
}

#[test]
fn the_executable_api_through_the_resolved_table_on_every_profile() {
    // The table the daemon links holds every new entry point.
    let f = hsa_sim::fns();
    assert!(f.missing_optional().is_empty());
    let sim = ko_sim();
    let bytes = add_one_hsaco();
    let (create, load, fr, get, info, des) = (
        f.executable_create_alt.unwrap(),
        f.executable_load_agent_code_object.unwrap(),
        f.executable_freeze.unwrap(),
        f.executable_get_symbol_by_name.unwrap(),
        f.executable_symbol_get_info.unwrap(),
        f.executable_destroy.unwrap(),
    );
    let mut r = CodeObjectReader::default();
    let mut e = Executable::default();
    let mut s = ExecutableSymbol::default();
    let mut ko = 0u64;
    let name = CString::new("vector_scalar_add").unwrap();
    // SAFETY: (whole block) the emulator's own functions with live out-pointers.
    unsafe {
        assert_eq!(
            (f.code_object_reader_create_from_memory.unwrap())(
                bytes.as_ptr().cast::<c_void>(),
                bytes.len(),
                &mut r
            ),
            Status::SUCCESS
        );
        assert_eq!(
            create(
                HsaProfile::FULL,
                FloatRoundingMode::DEFAULT,
                std::ptr::null(),
                &mut e
            ),
            Status::SUCCESS
        );
        assert_eq!(
            load(e, sim.aie, r, std::ptr::null(), std::ptr::null_mut()),
            Status::SUCCESS
        );
        assert_eq!(fr(e, std::ptr::null()), Status::SUCCESS);
        assert_eq!(get(e, name.as_ptr(), &sim.aie, &mut s), Status::SUCCESS);
        assert_eq!(
            info(s, SymbolInfo::KERNEL_OBJECT, (&raw mut ko).cast()),
            Status::SUCCESS
        );
        assert_ne!(ko, 0);
        assert_eq!(des(e), Status::SUCCESS);
        assert_eq!((f.code_object_reader_destroy.unwrap())(r), Status::SUCCESS);
    }
}

/// Deterministic contents for buffer `i` of `len` bytes.
fn fill(i: usize, len: u64) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u8).wrapping_mul(31).wrapping_add(7 ^ i as u8) % 17)
        .collect()
}

/// Runs `design` on buffers filled by [`fill`] and returns every buffer after the run: through
/// a G2 packet on `rocr-newest`, or through a kernel object of `hsaco` on `kernel-object`.
fn outputs(design: &EmuDesign, hsaco: Option<(&[u8], &str)>) -> Vec<Vec<u8>> {
    let profile = if hsaco.is_some() {
        KO
    } else {
        Profile::RocrNewest
    };
    let sim = Sim::new(profile);
    let args: Vec<(u64, u64)> = design
        .arg_sizes()
        .iter()
        .enumerate()
        .map(|(i, &len)| (sim.put(DATA, &fill(i, len)), len))
        .collect();
    let sig = sim.signal(1);
    let q = sim.queue();
    let loaded = hsaco.map(|(bytes, _)| Loaded::new(&sim, bytes));
    let packet = match (&loaded, hsaco) {
        (Some(l), Some((_, name))) => ko_packet(&sim, l.kernel_object(name), &args, sig),
        _ => sim.packet(&Dispatch::new(sim.load(design), &args, sig)),
    };
    q.submit(&[packet]);
    assert_eq!(q.errors(), vec![], "{:?}", last_error());
    assert_eq!(load_signal(sig), 0);
    drop(q);
    if let Some(l) = loaded {
        l.destroy();
    }
    args.iter().map(|&(a, len)| read(a, len as usize)).collect()
}

#[test]
fn every_reference_design_runs_from_both_hsaco_forms() {
    for d in [
        EmuDesign::passthrough(4096),
        EmuDesign::vector_vector_add(64, DType::I32),
        EmuDesign::vector_mul(64, DType::I16),
        EmuDesign::relu(64, DType::I8),
        EmuDesign::matmul(8, 8, 8, DType::I16, DType::I32),
    ] {
        let name = d.kernel.name();
        let g2 = outputs(&d, None);
        let before: Vec<Vec<u8>> = d
            .arg_sizes()
            .iter()
            .enumerate()
            .map(|(i, &len)| fill(i, len))
            .collect();
        assert_ne!(g2, before, "{name} writes its output");
        let pdi_insts = pdi_insts_hsaco(&d);
        assert_eq!(outputs(&d, Some((&pdi_insts, name))), g2, "{name} PdiInsts");
        let full_elf = d.to_full_elf_hsaco().unwrap();
        let full_name = format!("{name}:sequence");
        assert_eq!(
            outputs(&d, Some((&full_elf, &full_name))),
            g2,
            "{name} FullElf"
        );
    }
}

#[test]
fn full_elf_kernels_have_no_32_pdi_ceiling() {
    // A full ELF loads its PDI from the control code, not through the CU mask: 40 loads (40
    // distinct PDIs) all run on one queue.
    let sim = ko_sim();
    let bytes = add(256, 1).to_full_elf_hsaco().unwrap();
    let loads: Vec<Loaded> = (0..40).map(|_| Loaded::new(&sim, &bytes)).collect();
    let (a, o) = io_i32(&sim, &[1; 256]);
    let q = sim.queue();
    for l in &loads {
        let ko = l.kernel_object("vector_scalar_add:sequence");
        q.submit(&[ko_packet(
            &sim,
            ko,
            &[(a, 1024), (o, 1024)],
            Signal::default(),
        )]);
    }
    assert!(!q.suspended(), "{:?}", last_error());
    assert_eq!(q.read_index(), 40);
    drop(q);
    for l in loads {
        l.destroy();
    }
}
