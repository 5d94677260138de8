//! Shared by the tests that drive `hsa_core::Device` on the emulator.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use hsa_core::{Device, DeviceOptions, Dispatch, Generation, PacketAbi, ProgramId, TensorId};
use hsa_sim::{Profile, SimConfig};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

/// The profiles hsa-core's device layer drives with PDI + insts packets: every profile but
/// `kernel-object`, whose packets name kernel objects of loaded hsacos (its own tests are in
/// `kernel_object.rs`).
pub fn packet_profiles() -> impl Iterator<Item = Profile> {
    Profile::ALL
        .into_iter()
        .filter(|p| !p.speaks_kernel_objects())
}

/// The hardware each profile is emulated on here: ROCm 7.0 names every AIE agent `aie2`, and
/// hsa-core picks the instruction generation by that name, so under ROCm 7.0 only a Phoenix
/// (npu1) runs what hsa-core builds. The later releases run on a Strix (npu2).
pub fn agent_for(profile: Profile) -> NpuGen {
    match profile {
        Profile::Rocm70 => NpuGen::Npu1,
        _ => NpuGen::Npu2,
    }
}

pub fn npu_gen(g: Generation) -> NpuGen {
    match g {
        Generation::Npu1 => NpuGen::Npu1,
        Generation::Npu2 => NpuGen::Npu2,
    }
}

/// Opens the statically linked emulator behaving as `profile`.
pub fn open_static(profile: Profile, opts: DeviceOptions) -> Device {
    hsa_sim::set_config(SimConfig {
        agent: agent_for(profile),
        profile,
        timeout: Duration::from_millis(300),
        ..SimConfig::default()
    });
    let abi: PacketAbi = profile.packet_abi();
    let api = hsa_sim::api("hsa-sim");
    // ROCm 7.0 names every NPU aie2, so the binding cannot tell the generation from the name:
    // say it, as a user of that runtime would (or its sysfs would).
    let generation = opts.generation.or(match profile {
        Profile::Rocm70 => Some(match agent_for(profile) {
            NpuGen::Npu1 => Generation::Npu1,
            NpuGen::Npu2 => Generation::Npu2,
        }),
        _ => None,
    });
    // `auto` proves every profile's packet form but late 2025's, which nothing tells apart
    // from a G1a develop build: say it, as its users must.
    let probe_code_objects = opts.probe_code_objects && profile != Profile::RocrLate2025;
    Device::open(
        api,
        DeviceOptions {
            packet_abi: abi,
            generation,
            probe_code_objects,
            ..opts
        },
    )
    .expect("the emulator opens")
}

/// Loads `design` for the device's generation.
pub fn load(dev: &mut Device, design: &EmuDesign) -> ProgramId {
    let g = npu_gen(dev.info().generation);
    dev.load_program(&design.to_pdi(), &design.insts(g))
        .expect("program loads")
}

pub fn i32s_to_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_to_i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn read_i32s(dev: &Device, t: TensorId, n: usize) -> Vec<i32> {
    let mut b = vec![0u8; n * 4];
    dev.read_tensor(t, 0, &mut b).unwrap();
    bytes_to_i32s(&b)
}

/// vector_scalar_add, 1024 × i32, out = in + 1, as IRON's example checks it.
pub fn vector_scalar_add_passes(dev: &mut Device) {
    let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    let prog = load(dev, &design);
    let input: Vec<i32> = (1..=1024).collect();
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    dev.write_tensor(a, 0, &i32s_to_bytes(&input)).unwrap();
    let report = dev.dispatch(&Dispatch::new(prog, [a, b])).unwrap();
    assert_eq!(report.doorbells, 1);
    let out = read_i32s(dev, b, 1024);
    let want: Vec<i32> = input.iter().map(|x| x + 1).collect();
    assert_eq!(out, want);
}

/// A chain of `n` add-one links alternating between two buffers gives in + n.
pub fn add_one_chain(dev: &mut Device, n: usize) -> hsa_core::ChainReport {
    let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    let prog = load(dev, &design);
    let input: Vec<i32> = (0..1024).map(|i| i * 3 - 700).collect();
    let bufs = [
        dev.alloc_tensor(4096).unwrap(),
        dev.alloc_tensor(4096).unwrap(),
    ];
    dev.write_tensor(bufs[0], 0, &i32s_to_bytes(&input))
        .unwrap();
    let links: Vec<Dispatch> = (0..n)
        .map(|i| Dispatch::new(prog, [bufs[i % 2], bufs[(i + 1) % 2]]))
        .collect();
    let report = dev.run_chain(&links).expect("the chain runs");
    let out = read_i32s(dev, bufs[n % 2], 1024);
    let add = i32::try_from(n).unwrap();
    let want: Vec<i32> = input.iter().map(|x| x + add).collect();
    assert_eq!(out, want, "chain of {n}");
    report
}

/// The emulator's cdylib as cargo built it beside the test binary.
pub fn cdylib_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let mut dir = exe.parent().map(PathBuf::from);
    while let Some(d) = dir {
        for cand in [d.join("libhsa_sim.so"), d.join("deps/libhsa_sim.so")] {
            if cand.is_file() {
                return cand;
            }
        }
        dir = d.parent().map(PathBuf::from);
    }
    panic!(
        "libhsa_sim.so not found near {}: build it with `cargo build -p hsa-sim`",
        exe.display()
    );
}
