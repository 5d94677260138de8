//! FullElf kernels through the device layer on every emulated ROCR release: as kernel objects
//! where the runtime loads them, as G2 full-ELF packets where the G2 runtime has them (proven
//! for `rocr-g2-2026-07`, configured for `rocr-newest`), and refused by name elsewhere, before
//! anything reaches the runtime.

use hsa_core::{Device, DeviceOptions, Dispatch, Generation, HsaError, PacketAbi, TensorId};
use hsa_sim::{Profile, SimConfig};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

const N: usize = 1024;
const NU: u32 = 1024;
const NI: i32 = 1024;

fn open(profile: Profile, agent: NpuGen, g2_full_elf: Option<bool>) -> Result<Device, HsaError> {
    hsa_sim::set_config(SimConfig {
        profile,
        agent,
        ..SimConfig::default()
    });
    let opts = DeviceOptions {
        generation: Some(match agent {
            NpuGen::Npu1 => Generation::Npu1,
            NpuGen::Npu2 => Generation::Npu2,
        }),
        // Late 2025's packet form cannot be proven: it is named, as its users must.
        probe_code_objects: profile != Profile::RocrLate2025,
        packet_abi: PacketAbi::G1b,
        g2_full_elf,
        ..DeviceOptions::default()
    };
    Device::open(hsa_sim::api("hsa-sim"), opts)
}

fn name(hsaco: &[u8]) -> String {
    npu_artifacts::hsaco::parse_for_arch(hsaco, NpuGen::Npu2)
        .unwrap()
        .kernels[0]
        .name
        .to_owned()
}

fn write(dev: &mut Device, t: TensorId, v: &[i32]) {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    dev.write_tensor(t, 0, &b).unwrap();
}

fn read(dev: &Device, t: TensorId) -> Vec<i32> {
    let mut b = vec![0u8; N * 4];
    dev.read_tensor(t, 0, &mut b).unwrap();
    b.chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Where FullElf kernels run on `profile` (aie2p, `g2_full_elf` as given).
fn runs(profile: Profile, g2_full_elf: Option<bool>) -> bool {
    match profile {
        Profile::KernelObject | Profile::RocrG2Jul2026 => true,
        Profile::RocrNewest => g2_full_elf == Some(true),
        Profile::Rocm70 | Profile::RocrLate2025 | Profile::RocrG2May2026 => false,
    }
}

/// A FullElf kernel, the same design as PdiInsts, dispatched alone, repatched with other
/// tensors, in a chain of 100, and in a chain that switches kinds.
fn full_elf_work(dev: &mut Device, profile: Profile) {
    let d = EmuDesign::vector_scalar_add(NU, DType::I32, 1);
    let hsaco = d.to_full_elf_hsaco().unwrap();
    let full = dev
        .load_hsaco(&hsaco, &name(&hsaco))
        .unwrap_or_else(|e| panic!("{profile}: {e}"));
    let pdi_insts = dev
        .load_program(&d.to_pdi(), &d.insts(NpuGen::Npu2))
        .unwrap();
    let tensors: Vec<TensorId> = (0..4).map(|_| dev.alloc_tensor(N * 4).unwrap()).collect();
    // The same program on other tensors: each dispatch patches a pristine control code.
    for (k, pair) in tensors.chunks(2).enumerate() {
        let input: Vec<i32> = (0..NI)
            .map(|v| v * (i32::try_from(k).unwrap() + 2))
            .collect();
        write(dev, pair[0], &input);
        dev.dispatch(&Dispatch::new(full, [pair[0], pair[1]]))
            .unwrap_or_else(|e| panic!("{profile}: {e}"));
        let want: Vec<i32> = input.iter().map(|v| v + 1).collect();
        assert_eq!(read(dev, pair[1]), want, "{profile}");
    }
    let (a, b) = (tensors[0], tensors[1]);
    write(dev, a, &vec![0; N]);
    let links: Vec<Dispatch> = (0..100)
        .map(|k| {
            if k % 2 == 0 {
                Dispatch::new(full, [a, b])
            } else {
                Dispatch::new(full, [b, a])
            }
        })
        .collect();
    let r = dev
        .run_chain(&links)
        .unwrap_or_else(|e| panic!("{profile}: {e}"));
    assert_eq!(r.doorbells, 4, "{profile}");
    assert_eq!(read(dev, a), vec![100; N], "{profile}");
    // Kinds alternate between doorbells, never within one.
    let mixed = vec![
        Dispatch::new(pdi_insts, [a, b]),
        Dispatch::new(pdi_insts, [b, a]),
        Dispatch::new(full, [a, b]),
        Dispatch::new(full, [b, a]),
        Dispatch::new(pdi_insts, [a, b]),
    ];
    assert_eq!(
        dev.doorbell_plan(&mixed).unwrap(),
        vec![2, 2, 1],
        "{profile}"
    );
    dev.run_chain(&mixed)
        .unwrap_or_else(|e| panic!("{profile}: {e}"));
    assert_eq!(read(dev, b), vec![105; N], "{profile}");
}

#[test]
fn full_elf_kernels_run_wherever_the_runtime_has_a_form_for_them_and_are_refused_elsewhere() {
    let _g = hsa_sim::serial_test_guard();
    for profile in Profile::ALL {
        for g2_full_elf in [None, Some(true)] {
            // The first G2 release has no full ELF: told it has, it would run the control code
            // as an instruction stream and abort. Only its refusal under auto is checked.
            if profile == Profile::RocrG2May2026 && g2_full_elf.is_some() {
                continue;
            }
            let before = hsa_sim::counters();
            let mut dev = open(profile, NpuGen::Npu2, g2_full_elf).unwrap();
            if runs(profile, g2_full_elf) {
                full_elf_work(&mut dev, profile);
            } else {
                let hsaco = EmuDesign::vector_scalar_add(NU, DType::I32, 1)
                    .to_full_elf_hsaco()
                    .unwrap();
                let e = dev.load_hsaco(&hsaco, &name(&hsaco)).unwrap_err();
                assert!(
                    matches!(e, HsaError::NeedsCodeObjects { .. }),
                    "{profile}: {e}"
                );
                if profile == Profile::RocrNewest {
                    assert!(e.to_string().contains("g2_full_elf = true"), "{e}");
                }
            }
            drop(dev);
            let all = hsa_sim::counters().since(&before);
            assert!(all.balanced(), "{profile}: {:?}", all.unbalanced());
        }
    }
}

#[test]
fn full_elf_is_aie2p_only_on_g2() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open(Profile::RocrG2Jul2026, NpuGen::Npu1, Some(true)).unwrap();
    assert!(!dev.info().g2_full_elf);
    assert!(
        dev.info().g2_full_elf_source.contains("aie2p"),
        "{}",
        dev.info().g2_full_elf_source
    );
    let hsaco = EmuDesign::vector_scalar_add(NU, DType::I32, 1)
        .to_full_elf_hsaco()
        .unwrap();
    // The hsaco holds an aie2p section only: an aie2 device finds no section for it.
    assert!(dev.load_hsaco(&hsaco, &name(&hsaco)).is_err());
}
