//! hsa-core's `Device` on the statically linked emulator: what the daemon runs with
//! `--backend emulator`.

mod device_support;

use device_support::*;
use hsa_core::{DeviceOptions, Dispatch, HsaError, TensorBacking};
use hsa_sim::Profile;
use npu_artifacts::emu::{DType, EmuDesign};

#[test]
fn vector_scalar_add_passes_for_each_profile() {
    let _g = hsa_sim::serial_test_guard();
    for profile in packet_profiles() {
        let before = hsa_sim::counters();
        {
            let mut dev = open_static(profile, DeviceOptions::default());
            assert_eq!(dev.info().packet_abi, profile.packet_abi());
            let name = profile.agent_name(agent_for(profile));
            assert_eq!(dev.info().agent_name, name, "{profile}");
            vector_scalar_add_passes(&mut dev);
        }
        let after = hsa_sim::counters().since(&before);
        assert!(
            after.balanced(),
            "{profile}: unbalanced after drop: {:?}",
            after.unbalanced()
        );
    }
}

#[test]
fn a_chain_of_100_wraps_the_ring_rings_four_doorbells_and_recreates_g1a_queues() {
    let _g = hsa_sim::serial_test_guard();
    for profile in packet_profiles() {
        let abi = profile.packet_abi();
        let mut dev = open_static(profile, DeviceOptions::default());
        let report = add_one_chain(&mut dev, 100);
        assert_eq!(report.doorbells, 4, "{abi}");
        if abi == hsa_core::PacketAbi::G1a {
            // 100 packets in batches of 32, 32, 32 and 4 through a ring that never wraps: the
            // third batch would take it past 64, so the queue is recreated exactly once.
            assert_eq!(report.queue_recreations, 1, "{abi}: {report:?}");
        } else {
            assert_eq!(report.queue_recreations, 0, "{abi}: {report:?}");
        }
        // A second chain on the same device keeps working (the G1a queue keeps being renewed).
        add_one_chain(&mut dev, 70);
    }
}

/// 32 links of six arguments: 27 commands fit a G1 chain buffer and 31 an early-G2 one, so
/// runtimes that do not split chains (rocm-7.0, rocr-late-2025, rocr-g2-2026-05) refuse one
/// doorbell for all 32. hsa-core sizes its batches by that cost on every profile, and the
/// emulator's own doorbell counter shows what reached it.
#[test]
fn thirty_two_links_of_six_arguments_ring_as_many_doorbells_as_the_chain_buffer_needs() {
    let _g = hsa_sim::serial_test_guard();
    for profile in packet_profiles() {
        let mut dev = open_static(profile, DeviceOptions::default());
        let prog = load(&mut dev, &EmuDesign::noop(6, 4096));
        let args: Vec<_> = (0..6).map(|_| dev.alloc_tensor(4096).unwrap()).collect();
        let links: Vec<Dispatch> = (0..32).map(|_| Dispatch::new(prog, args.clone())).collect();
        let plan = dev.doorbell_plan(&links).unwrap();
        let want = match profile.packet_abi() {
            hsa_core::PacketAbi::G2 => vec![31, 1],
            _ => vec![27, 5],
        };
        assert_eq!(plan, want, "{profile}");
        let before = hsa_sim::counters();
        let report = dev
            .run_chain(&links)
            .unwrap_or_else(|e| panic!("{profile}: {e}"));
        let seen = hsa_sim::counters().since(&before);
        assert_eq!(report.doorbells, 2, "{profile}");
        assert_eq!(seen.doorbells, 2, "{profile}: doorbells the emulator saw");
        assert_eq!(seen.packets_completed, 32, "{profile}");
        assert_eq!(seen.packets_failed, 0, "{profile}");
    }
}

#[test]
fn vmem_backed_tensors_work_as_arguments() {
    let _g = hsa_sim::serial_test_guard();
    let before = hsa_sim::counters();
    {
        let mut dev = open_static(
            Profile::RocrNewest,
            DeviceOptions {
                tensor_backing: TensorBacking::Vmem,
                ..Default::default()
            },
        );
        vector_scalar_add_passes(&mut dev);
    }
    let after = hsa_sim::counters().since(&before);
    assert!(after.balanced(), "{:?}", after.unbalanced());
}

#[test]
fn an_exported_vmem_tensor_fd_shares_bytes_with_the_device_on_the_newest_runtime_only() {
    use std::os::unix::fs::FileExt;
    let _g = hsa_sim::serial_test_guard();
    for profile in [Profile::RocrG2May2026, Profile::RocrNewest] {
        // Pool memory is never exportable (ROCR's AIE memory test expects the export to fail).
        let mut dev = open_static(
            profile,
            DeviceOptions {
                tensor_backing: TensorBacking::Pool,
                ..Default::default()
            },
        );
        let t = dev.alloc_tensor(4096).unwrap();
        assert!(dev.export_tensor(t).is_err(), "{profile}: pool export");
        drop(dev);
        let mut dev = open_static(
            profile,
            DeviceOptions {
                tensor_backing: TensorBacking::Vmem,
                ..Default::default()
            },
        );
        let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
        let prog = load(&mut dev, &design);
        let a = dev.alloc_tensor(4096).unwrap();
        let b = dev.alloc_tensor(4096).unwrap();
        if profile != Profile::RocrNewest {
            assert!(dev.export_tensor(a).is_err(), "{profile}: vmem export");
            continue;
        }
        let (fa, off_a) = dev.export_tensor(a).unwrap();
        let (fb, off_b) = dev.export_tensor(b).unwrap();
        let (fa, fb) = (std::fs::File::from(fa), std::fs::File::from(fb));
        let input: Vec<i32> = (100..1124).collect();
        fa.write_all_at(&i32s_to_bytes(&input), off_a).unwrap();
        dev.dispatch(&Dispatch::new(prog, [a, b])).unwrap();
        let mut out = vec![0u8; 4096];
        fb.read_exact_at(&mut out, off_b).unwrap();
        assert_eq!(
            bytes_to_i32s(&out),
            input.iter().map(|x| x + 1).collect::<Vec<_>>()
        );
    }
}

fn fault_chain(dev: &mut hsa_core::Device) -> (Vec<hsa_core::TensorId>, Vec<Dispatch>) {
    let add = load(dev, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let fault = load(dev, &EmuDesign::fault(4096));
    let bufs: Vec<_> = (0..13).map(|_| dev.alloc_tensor(4096).unwrap()).collect();
    // Link i adds one from bufs[i] into bufs[i + 1]; link 10 faults.
    let links: Vec<Dispatch> = (0..12)
        .map(|i| Dispatch::new(if i == 10 { fault } else { add }, [bufs[i], bufs[i + 1]]))
        .collect();
    (bufs, links)
}

#[test]
fn a_fault_in_link_10_stops_the_chain_there_and_the_queue_recovers() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open_static(Profile::RocrNewest, DeviceOptions::default());
    let (bufs, links) = fault_chain(&mut dev);
    let err = dev.run_chain(&links).unwrap_err();
    assert_eq!(err.index, 10, "{err}");
    assert!(matches!(err.error, HsaError::Device { .. }), "{err}");
    assert_eq!(err.report.doorbells, 1, "the failed batch was rung once");
    assert_eq!(
        err.report.queue_recreations, 0,
        "the failed queue is left suspended"
    );
    // Until the failed queue is gone, its work may still write device memory: no slice of
    // it is lent, while raw copies still work.
    let refused = dev
        .with_tensor(bufs[10], 0, 4, |b| b.to_vec())
        .expect_err("no slice while the failed queue lives");
    assert!(
        refused
            .to_string()
            .contains("may still write device memory until recover() replaces its queue"),
        "{refused}"
    );
    assert!(dev.with_tensor_mut(bufs[10], 0, 4, |_| ()).is_err());
    assert_eq!(read_i32s(&dev, bufs[10], 4)[0], 10, "raw copies still work");
    assert!(
        dev.recover().unwrap(),
        "recover() recreates the failed queue"
    );
    assert_eq!(
        dev.with_tensor(bufs[10], 0, 4, |b| b.to_vec()).unwrap(),
        10_i32.to_le_bytes(),
        "slices again once the queue is replaced"
    );
    assert!(!dev.recover().unwrap(), "and then has nothing to do");
    assert_eq!(read_i32s(&dev, bufs[10], 4)[0], 10, "links before 10 ran");
    assert_eq!(read_i32s(&dev, bufs[12], 4)[0], 0, "link 11 did not run");
    // The queue was recreated: the next dispatch works.
    vector_scalar_add_passes(&mut dev);
}

#[test]
fn rocm_7_0_hides_a_fault_in_link_10_from_its_client() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open_static(Profile::Rocm70, DeviceOptions::default());
    let (bufs, links) = fault_chain(&mut dev);
    // No callback, the read index at the write index: the client cannot tell.
    dev.run_chain(&links)
        .expect("ROCm 7.0 reports nothing and moves the read index on");
    assert_eq!(read_i32s(&dev, bufs[10], 4)[0], 10, "links before 10 ran");
    assert_eq!(
        read_i32s(&dev, bufs[11], 4)[0],
        0,
        "the fault wrote nothing"
    );
    assert_eq!(read_i32s(&dev, bufs[12], 4)[0], 0, "link 11 never ran");
    assert!(
        hsa_sim::last_error()
            .unwrap()
            .contains("the fault design failed")
    );
    vector_scalar_add_passes(&mut dev);
}

#[test]
fn more_than_32_distinct_programs_recreate_the_queue_instead_of_failing() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open_static(Profile::RocrNewest, DeviceOptions::default());
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    let mut recreations = 0;
    for s in 1..=40 {
        let p = load(&mut dev, &EmuDesign::vector_scalar_add(1024, DType::I32, s));
        let r = dev.dispatch(&Dispatch::new(p, [a, b])).unwrap();
        recreations += r.queue_recreations;
        assert_eq!(read_i32s(&dev, b, 1)[0], i32::try_from(s).unwrap());
    }
    assert_eq!(recreations, 1);
    assert_eq!(dev.program_count(), 40);
}

#[test]
fn unloading_a_cached_program_renews_the_queue_before_the_next_dispatch() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open_static(Profile::RocrNewest, DeviceOptions::default());
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    let p1 = load(&mut dev, &EmuDesign::vector_scalar_add(1024, DType::I32, 5));
    dev.dispatch(&Dispatch::new(p1, [a, b])).unwrap();
    let heap = dev.heap_used();
    dev.unload_program(p1).unwrap();
    assert!(dev.heap_used() < heap);
    let p2 = load(&mut dev, &EmuDesign::vector_scalar_add(1024, DType::I32, 7));
    let r = dev.dispatch(&Dispatch::new(p2, [a, b])).unwrap();
    assert_eq!(r.queue_recreations, 1);
    assert_eq!(read_i32s(&dev, b, 1)[0], 7);
}

#[test]
fn bad_handles_and_ranges_are_refused_before_anything_is_enqueued() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open_static(Profile::RocrNewest, DeviceOptions::default());
    let p = load(&mut dev, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    let bad = Dispatch::new(
        p,
        [
            hsa_core::Arg {
                tensor: a,
                offset: 4000,
                len: Some(200),
            },
            b.into(),
        ],
    );
    let links = vec![Dispatch::new(p, [a, b]), bad];
    let err = dev.run_chain(&links).unwrap_err();
    assert_eq!(err.index, 1);
    assert_eq!(
        err.error.to_string(),
        format!(
            "argument 0: bytes 4000..4200 are outside tensor {} of 4096 bytes",
            a.0
        )
    );
    let err = dev
        .dispatch(&Dispatch::new(hsa_core::ProgramId(999), [a]))
        .unwrap_err();
    assert_eq!(err.to_string(), "unknown program handle 999");
    assert!(dev.free_tensor(hsa_core::TensorId(12345)).is_err());
    assert!(
        dev.alloc_tensor(0)
            .unwrap_err()
            .to_string()
            .contains("at least one byte")
    );
    let e = dev.load_program(b"pdi", &[0u8; 6]).unwrap_err();
    assert!(e.to_string().contains("multiple of 4"), "{e}");
}

#[test]
fn a_full_device_heap_is_reported_as_such_and_unloading_makes_room() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open_static(Profile::RocrNewest, DeviceOptions::default());
    let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    let insts = design.insts(npu_gen(dev.info().generation));
    // 8 MiB PDIs fill the 64 MiB heap in a few loads, while hsa-core keeps every instruction
    // buffer out of the windows ROCR's device-address mask gets wrong.
    let big = vec![0u8; 8 << 20];
    let mut loaded = Vec::new();
    let err = loop {
        match dev.load_program(&big, &insts) {
            Ok(p) => loaded.push(p),
            Err(e) => break e,
        }
        assert!(loaded.len() < 16, "the heap never filled");
    };
    assert!(matches!(err, HsaError::HeapFull { .. }), "{err}");
    assert!(
        err.to_string().starts_with("the device heap has no room"),
        "{err}"
    );
    assert!(
        (4..8).contains(&loaded.len()),
        "{} programs fit",
        loaded.len()
    );
    dev.unload_program(loaded.pop().unwrap()).unwrap();
    dev.load_program(&big, &insts)
        .expect("room after an unload");
}
