//! The device layer on ROCm 7.0 as it behaves (hsa-sim's `rocm-7.0` profile, linked in): what
//! the binding does about the runtime's silent drops, checked by outputs and counters.

use hsa_core::{Device, DeviceOptions, Dispatch, Generation, HsaError, TensorId};
use hsa_sim::{Profile, SimConfig};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

fn open() -> Device {
    open_with(DeviceOptions::default()).expect("the device opens")
}

/// The device on the `rocm-7.0` profile with `opts` (the generation set: ROCm 7.0's agent name
/// does not tell it).
fn open_with(opts: DeviceOptions) -> Result<Device, HsaError> {
    hsa_sim::set_config(SimConfig {
        profile: Profile::Rocm70,
        agent: NpuGen::Npu1,
        // A watchdog far past ROCm 7.0's 50 ms command wait: the runtime gives up first.
        timeout: std::time::Duration::from_secs(3600),
        ..SimConfig::default()
    });
    Device::open(
        hsa_sim::api("hsa-sim"),
        DeviceOptions {
            generation: Some(Generation::Npu1),
            ..opts
        },
    )
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_i32s(dev: &Device, t: TensorId) -> Vec<i32> {
    let mut b = vec![0u8; 4096];
    dev.read_tensor(t, 0, &mut b).unwrap();
    b.chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn auto_speaks_g1a_and_every_queue_runs_its_first_dispatch() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open();
    assert_eq!(dev.info().packet_abi, hsa_core::PacketAbi::G1a);
    let design = |k| EmuDesign::vector_scalar_add(1024, DType::I32, k);
    let g = NpuGen::Npu1;
    let (a, b) = (
        dev.alloc_tensor(4096).unwrap(),
        dev.alloc_tensor(4096).unwrap(),
    );
    let before = hsa_sim::counters();
    let mut recreations = 0;
    // 150 dispatches: the queue is recreated at 64 packets, and a program is unloaded and
    // loaded again at the same heap address now and then (the PDI buffer a stale cache entry
    // names); each dispatch writes what it must.
    let mut p = dev
        .load_program(&design(1).to_pdi(), &design(1).insts(g))
        .unwrap();
    for i in 0..150 {
        if i % 40 == 39 {
            dev.unload_program(p).unwrap();
            p = dev
                .load_program(&design(1).to_pdi(), &design(1).insts(g))
                .unwrap();
        }
        let input: Vec<i32> = (0..1024).map(|j| j + i * 7).collect();
        dev.write_tensor(a, 0, &i32s(&input)).unwrap();
        dev.write_tensor(b, 0, &i32s(&[i32::MIN; 1024])).unwrap();
        recreations += dev
            .dispatch(&Dispatch::new(p, [a, b]))
            .unwrap()
            .queue_recreations;
        let want: Vec<i32> = input.iter().map(|v| v + 1).collect();
        assert_eq!(read_i32s(&dev, b), want, "dispatch {i}");
    }
    assert!(recreations >= 2, "{recreations}");
    let seen = hsa_sim::counters().since(&before);
    assert_eq!((seen.packets_completed, seen.packets_failed), (150, 0));
    assert_eq!(
        seen.hw_context_builds, 150,
        "ROCm 7.0 builds a context per dispatch"
    );
}

#[test]
fn a_command_the_runtime_stopped_waiting_for_is_an_error_not_a_success() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open();
    let hang = EmuDesign::hang(4096);
    let p = dev
        .load_program(&hang.to_pdi(), &hang.insts(NpuGen::Npu1))
        .unwrap();
    let (a, b) = (
        dev.alloc_tensor(4096).unwrap(),
        dev.alloc_tensor(4096).unwrap(),
    );
    let e = dev
        .dispatch(&Dispatch::new(p, [a, b]))
        .expect_err("ROCm 7.0 advances the read index; the binding does not call that done");
    // Not a device fault: a correct kernel slower than 50 ms, or a loaded host, looks the same.
    assert!(matches!(e, HsaError::OutcomeUnknown { .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.starts_with("outcome unknown") && e.contains("50 ms"),
        "{e}"
    );
    // The device serves the next program.
    let add = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    let q = dev
        .load_program(&add.to_pdi(), &add.insts(NpuGen::Npu1))
        .unwrap();
    dev.write_tensor(a, 0, &i32s(&[4; 1024])).unwrap();
    dev.dispatch(&Dispatch::new(q, [a, b])).unwrap();
    assert_eq!(read_i32s(&dev, b), vec![5; 1024]);
}

#[test]
fn the_in_tree_amdxdna_driver_is_refused_and_the_out_of_tree_one_taken() {
    let _g = hsa_sim::serial_test_guard();
    let sysfs = tempfile::tempdir().unwrap();
    let module = sysfs.path().join("module/amdxdna");
    std::fs::create_dir_all(&module).unwrap();
    let open_with = |sysfs: &std::path::Path| {
        open_with(DeviceOptions {
            sysfs_root: sysfs.to_path_buf(),
            ..DeviceOptions::default()
        })
    };
    // Upstream Linux's driver: no taint flag O. ROCm 7.0 could complete no command on it.
    std::fs::write(module.join("taint"), "\n").unwrap();
    let e = open_with(sysfs.path()).unwrap_err();
    assert!(matches!(e, HsaError::DriverUnsupported { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("WAIT_CMD") && text.contains("out-of-tree xdna-driver"),
        "{text}"
    );
    // xdna-driver, built out of tree (DKMS marks it OE).
    std::fs::write(module.join("taint"), "OE\n").unwrap();
    let dev = open_with(sysfs.path()).expect("the out-of-tree driver is taken");
    assert_eq!(dev.info().packet_abi, hsa_core::PacketAbi::G1a);
}

/// With the risk accepted (queues recreated in one runtime), each queue's first doorbell names
/// a fresh copy of its first PDI, kept until a later first doorbell has named a newer one: ROCR
/// 7.0's cache lists the copy's BO handle under key 0, and GEM handles are the lowest free, so
/// a freed copy's handle would come back to the next copy and hit that stale entry. A first
/// batch that fails before its doorbell names nothing: the copy named before must stay.
#[test]
fn a_first_batch_failing_before_its_doorbell_keeps_the_pdi_copy_the_cache_names() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open_with(DeviceOptions {
        g1a_runtime_per_queue: false,
        ..DeviceOptions::default()
    })
    .expect("the device opens");
    assert!(!dev.info().g1a_runtime_per_queue);
    let add = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    let p = dev
        .load_program(&add.to_pdi(), &add.insts(NpuGen::Npu1))
        .unwrap();
    let (a, b) = (
        dev.alloc_tensor(4096).unwrap(),
        dev.alloc_tensor(4096).unwrap(),
    );
    // An argument a G1 payload's 32-bit size cannot hold: the batch fails while its packet is
    // written, before the doorbell (the memory is never touched).
    let big = dev.alloc_tensor((4 << 30) + 4096).unwrap();
    let run = |dev: &mut Device, k: i32| {
        dev.write_tensor(a, 0, &i32s(&[k; 1024])).unwrap();
        dev.write_tensor(b, 0, &i32s(&[i32::MIN; 1024])).unwrap();
        dev.dispatch(&Dispatch::new(p, [a, b])).unwrap();
        let got = read_i32s(dev, b);
        assert!(
            got == vec![k + 1; 1024],
            "input {k}: output starts {:?} (i32::MIN: the dispatch did not run)",
            &got[..4]
        );
    };
    run(&mut dev, 1);
    let refused = |dev: &mut Device| {
        let e = dev.dispatch(&Dispatch::new(p, [a, big])).unwrap_err();
        assert!(e.to_string().contains("32-bit sizes"), "{e}");
    };
    // On the first queue (it has rung), then as the first batch of a new queue.
    refused(&mut dev);
    refused(&mut dev);
    // The next queue's first doorbell runs.
    run(&mut dev, 2);
    run(&mut dev, 3);
}

/// With a runtime per queue (the default), nothing of ROCR 7.0's cache outlives a queue:
/// queues recreated at 64 packets, after a program was unloaded and another loaded in its
/// place, and after a refused batch, all run their first dispatch, and every program and
/// tensor keeps its id and contents across the renewals.
#[test]
fn a_runtime_per_queue_keeps_programs_and_tensors_across_renewals() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open();
    assert!(dev.info().g1a_runtime_per_queue);
    let g = NpuGen::Npu1;
    let design = |k| EmuDesign::vector_scalar_add(1024, DType::I32, k);
    let mut p = dev
        .load_program(&design(1).to_pdi(), &design(1).insts(g))
        .unwrap();
    let (a, b) = (
        dev.alloc_tensor(4096).unwrap(),
        dev.alloc_tensor(4096).unwrap(),
    );
    let keep = dev.alloc_tensor(64).unwrap();
    dev.write_tensor(keep, 0, &[7; 64]).unwrap();
    let mut k = 1;
    for i in 0..200 {
        if i % 50 == 49 {
            dev.unload_program(p).unwrap();
            k = if k == 1 { 2 } else { 1 };
            p = dev
                .load_program(&design(k.into()).to_pdi(), &design(k.into()).insts(g))
                .unwrap();
        }
        dev.write_tensor(a, 0, &i32s(&[i; 1024])).unwrap();
        dev.write_tensor(b, 0, &i32s(&[i32::MIN; 1024])).unwrap();
        dev.dispatch(&Dispatch::new(p, [a, b])).unwrap();
        let got = read_i32s(&dev, b);
        assert!(
            got == vec![i + k; 1024],
            "dispatch {i}: output starts {:?}",
            &got[..4]
        );
    }
    assert!(dev.runtime_renewals() >= 3, "{}", dev.runtime_renewals());
    let mut kept = [0u8; 64];
    dev.read_tensor(keep, 0, &mut kept).unwrap();
    assert_eq!(kept, [7; 64], "a tensor's contents survive the renewals");
}
