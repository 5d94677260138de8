//! The device layer on a kernel-object runtime (hsa-sim's `kernel-object` profile, linked in):
//! the open-time probe, programs as executables, kernel-object dispatch and chains, and the
//! lifetimes of queue, executables and readers, checked with the emulator's counters.

use hsa_core::{Device, DeviceOptions, Dispatch, HsaError, PacketAbi, TensorId};
use hsa_sim::{Profile, SimConfig};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

fn open(profile: Profile, opts: DeviceOptions) -> Device {
    hsa_sim::set_config(SimConfig {
        profile,
        ..SimConfig::default()
    });
    Device::open(hsa_sim::api("hsa-sim"), opts).expect("the device opens")
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_i32s(dev: &Device, t: TensorId, n: usize) -> Vec<i32> {
    let mut b = vec![0u8; n * 4];
    dev.read_tensor(t, 0, &mut b).unwrap();
    b.chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The one kernel's name (`<kernel>:<instance>`) of an emulated FullElf hsaco.
fn full_elf_name(hsaco: &[u8]) -> String {
    npu_artifacts::hsaco::parse_for_arch(hsaco, NpuGen::Npu2)
        .unwrap()
        .kernels[0]
        .name
        .to_owned()
}

#[test]
fn the_probe_finds_kernel_objects_only_where_code_objects_load_and_leaves_nothing_behind() {
    let _g = hsa_sim::serial_test_guard();
    for profile in Profile::ALL {
        let before = hsa_sim::counters();
        hsa_sim::set_config(SimConfig {
            profile,
            ..SimConfig::default()
        });
        // ROCm 7.0 names every NPU aie2: its generation comes from configuration here.
        let opts = DeviceOptions {
            generation: Some(hsa_core::Generation::Npu1),
            ..DeviceOptions::default()
        };
        let opened = Device::open(hsa_sim::api("hsa-sim"), opts);
        let probed = hsa_sim::counters().since(&before);
        match profile {
            Profile::KernelObject => {
                let info = opened.expect("the device opens").info().clone();
                assert_eq!(info.packet_abi, PacketAbi::KernelObject);
                assert!(
                    info.packet_abi_source
                        .starts_with("auto: the runtime loaded a built-in AIE code object")
                        && info.packet_abi_source.contains("INVALID_PACKET_FORMAT"),
                    "{}",
                    info.packet_abi_source
                );
            }
            Profile::RocrG2Jul2026 => {
                let info = opened.expect("the device opens").info().clone();
                assert_eq!(info.packet_abi, PacketAbi::G2, "{profile}");
                assert!(
                    info.packet_abi_source.contains("INVALID_ALLOCATION"),
                    "{profile}: {}",
                    info.packet_abi_source
                );
            }
            Profile::RocrNewest | Profile::RocrG2May2026 => {
                let info = opened.expect("the device opens").info().clone();
                assert_eq!(info.packet_abi, PacketAbi::G2, "{profile}");
                assert!(
                    info.packet_abi_source.contains("maps a vmem handle"),
                    "{profile}: {}",
                    info.packet_abi_source
                );
            }
            Profile::Rocm70 => {
                let info = opened.expect("the device opens").info().clone();
                assert_eq!(info.packet_abi, PacketAbi::G1a, "{profile}");
                assert!(
                    info.packet_abi_source.contains("ROCm 7.0 (G1a)")
                        && info.packet_abi_source.contains("AIE-ML"),
                    "{}",
                    info.packet_abi_source
                );
            }
            Profile::RocrLate2025 => {
                let e = opened.expect_err("auto cannot tell G1b from G1a");
                assert!(matches!(e, HsaError::PacketAbiUnknown { .. }), "{e:?}");
                let e = e.to_string();
                assert!(
                    e.contains("packet_abi = \"g1b\"") && e.contains("packet_abi = \"g1a\""),
                    "{e}"
                );
            }
        }
        // The probe's executable and reader are gone before the device is used.
        assert_eq!(probed.executables_created, probed.executables_destroyed);
        assert_eq!(
            probed.code_object_readers_created,
            probed.code_object_readers_destroyed
        );
        let all = hsa_sim::counters().since(&before);
        assert!(all.balanced(), "{profile}: {:?}", all.unbalanced());
    }
}

#[test]
fn auto_on_rocm_7_0_never_takes_the_generation_from_the_name_aie2() {
    let _g = hsa_sim::serial_test_guard();
    let empty = tempfile::tempdir().unwrap();
    hsa_sim::set_config(SimConfig {
        profile: Profile::Rocm70,
        ..SimConfig::default()
    });
    let e = Device::open(
        hsa_sim::api("hsa-sim"),
        DeviceOptions {
            sysfs_root: empty.path().to_owned(),
            ..DeviceOptions::default()
        },
    )
    .expect_err("aie2 does not tell the generation on ROCm 7.0");
    assert!(matches!(e, HsaError::UnknownGeneration { .. }), "{e:?}");
    assert!(e.to_string().contains("--generation npu1"), "{e}");
}

#[test]
fn a_configured_abi_is_not_probed() {
    let _g = hsa_sim::serial_test_guard();
    // A configured ABI is not probed.
    let before = hsa_sim::counters();
    let dev = open(
        Profile::KernelObject,
        DeviceOptions {
            packet_abi: PacketAbi::G2,
            probe_code_objects: false,
            ..DeviceOptions::default()
        },
    );
    assert_eq!(dev.info().packet_abi_source, "configured");
    assert_eq!(hsa_sim::counters().since(&before).executables_created, 0);
}

#[test]
fn a_program_is_an_executable_that_the_queue_outlives_and_every_object_is_released() {
    let _g = hsa_sim::serial_test_guard();
    let before = hsa_sim::counters();
    let mut dev = open(Profile::KernelObject, DeviceOptions::default());
    assert_eq!(dev.info().packet_abi, PacketAbi::KernelObject);
    let opened = hsa_sim::counters();
    let d = EmuDesign::vector_scalar_add(1024, DType::I32, 3);
    let p = dev
        .load_program(&d.to_pdi(), &d.insts(NpuGen::Npu2))
        .unwrap();
    let loaded = hsa_sim::counters().since(&opened);
    assert_eq!(
        (
            loaded.code_object_readers_created,
            loaded.executables_created
        ),
        (1, 1),
        "PDI+insts are packed into a code object and loaded"
    );
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    let input: Vec<i32> = (0..1024).collect();
    dev.write_tensor(a, 0, &i32s(&input)).unwrap();
    dev.dispatch(&Dispatch::new(p, [a, b])).unwrap();
    assert_eq!(
        read_i32s(&dev, b, 1024),
        input.iter().map(|v| v + 3).collect::<Vec<_>>()
    );

    // Unloading destroys the executable, then the reader; the queue stays (the runtime's
    // PDI-release epoch flushes its cache) and the next program runs on it.
    let mid = hsa_sim::counters();
    dev.unload_program(p).unwrap();
    let unloaded = hsa_sim::counters().since(&mid);
    assert_eq!(
        (
            unloaded.executables_destroyed,
            unloaded.code_object_readers_destroyed,
            unloaded.queues_destroyed
        ),
        (1, 1, 0)
    );
    assert_eq!(unloaded.code_blobs_freed, loaded.code_blobs_placed);
    let hsaco = EmuDesign::vector_scalar_add(1024, DType::I32, 5)
        .to_hsaco(NpuGen::Npu2)
        .unwrap();
    let q = dev.load_hsaco(&hsaco, "vector_scalar_add").unwrap();
    let r = dev.dispatch(&Dispatch::new(q, [a, b])).unwrap();
    assert_eq!(r.queue_recreations, 0);
    assert_eq!(
        read_i32s(&dev, b, 1024),
        input.iter().map(|v| v + 5).collect::<Vec<_>>()
    );
    drop(dev);
    let all = hsa_sim::counters().since(&before);
    assert!(all.balanced(), "{:?}", all.unbalanced());
}

#[test]
fn chains_split_by_kernel_object_cost_and_by_kernel_kind() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open(Profile::KernelObject, DeviceOptions::default());
    let d = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    let pdi_insts = dev
        .load_program(&d.to_pdi(), &d.insts(NpuGen::Npu2))
        .unwrap();
    let hsaco = d.to_full_elf_hsaco().unwrap();
    let full = dev.load_hsaco(&hsaco, &full_elf_name(&hsaco)).unwrap();
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    dev.write_tensor(a, 0, &i32s(&vec![0; 1024])).unwrap();
    // 100 links: 32 per doorbell (44 two-argument commands would fit one chain).
    let links: Vec<Dispatch> = (0..100)
        .map(|k| {
            if k % 2 == 0 {
                Dispatch::new(pdi_insts, [a, b])
            } else {
                Dispatch::new(pdi_insts, [b, a])
            }
        })
        .collect();
    assert_eq!(dev.doorbell_plan(&links).unwrap(), vec![32, 32, 32, 4]);
    let r = dev.run_chain(&links).unwrap();
    assert_eq!(r.doorbells, 4);
    assert_eq!(read_i32s(&dev, a, 1024), vec![100; 1024]);
    // A runtime of this kind refuses a batch that mixes kinds: the plan never makes one.
    let mixed = vec![
        Dispatch::new(pdi_insts, [a, b]),
        Dispatch::new(pdi_insts, [b, a]),
        Dispatch::new(full, [a, b]),
        Dispatch::new(full, [b, a]),
        Dispatch::new(pdi_insts, [a, b]),
    ];
    assert_eq!(dev.doorbell_plan(&mixed).unwrap(), vec![2, 2, 1]);
    dev.run_chain(&mixed).unwrap();
    assert_eq!(read_i32s(&dev, b, 1024), vec![105; 1024]);
}

#[test]
fn full_elf_kernels_need_a_runtime_that_loads_code_objects() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open(Profile::RocrNewest, DeviceOptions::default());
    assert_eq!(dev.info().packet_abi, PacketAbi::G2);
    let d = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    let hsaco = d.to_full_elf_hsaco().unwrap();
    let e = dev.load_hsaco(&hsaco, &full_elf_name(&hsaco)).unwrap_err();
    assert!(matches!(e, HsaError::NeedsCodeObjects { .. }), "{e}");
    assert!(e.to_string().contains("this one speaks g2"), "{e}");
    // A PdiInsts kernel of an hsaco runs here, unpacked.
    let p = dev
        .load_hsaco(&d.to_hsaco(NpuGen::Npu2).unwrap(), "vector_scalar_add")
        .unwrap();
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    dev.dispatch(&Dispatch::new(p, [a, b])).unwrap();
    assert_eq!(read_i32s(&dev, b, 1024), vec![1; 1024]);
}
