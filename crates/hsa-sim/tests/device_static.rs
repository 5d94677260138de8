//! hsa-core's `Device` on the statically linked emulator: what the daemon runs with
//! `--backend emulator`.

mod device_support;

use device_support::*;
use hsa_core::{DeviceOptions, Dispatch, HsaError, TensorBacking};
use npu_artifacts::emu::{DType, EmuDesign};

#[test]
fn vector_scalar_add_passes_for_each_packet_abi() {
    let _g = hsa_sim::serial_test_guard();
    for abi in ABIS {
        let before = hsa_sim::counters();
        {
            let mut dev = open_static(abi, DeviceOptions::default());
            assert_eq!(dev.info().packet_abi, abi);
            assert_eq!(dev.info().agent_name, "aie2p");
            vector_scalar_add_passes(&mut dev);
        }
        let after = hsa_sim::counters().since(&before);
        assert!(
            after.balanced(),
            "{abi}: unbalanced after drop: {:?}",
            after.unbalanced()
        );
    }
}

#[test]
fn a_chain_of_100_wraps_the_ring_rings_four_doorbells_and_recreates_g1a_queues() {
    let _g = hsa_sim::serial_test_guard();
    for abi in ABIS {
        let mut dev = open_static(abi, DeviceOptions::default());
        let report = add_one_chain(&mut dev, 100);
        assert_eq!(report.doorbells, 4, "{abi}");
        if abi == hsa_core::PacketAbi::G1a {
            // 100 packets through a ring that never wraps: recreated before 64, 128.
            assert!(report.queue_recreations >= 1, "{abi}: {report:?}");
        } else {
            assert_eq!(report.queue_recreations, 0, "{abi}: {report:?}");
        }
        // A second chain on the same device keeps working (the G1a queue keeps being renewed).
        add_one_chain(&mut dev, 70);
    }
}

#[test]
fn vmem_backed_tensors_work_as_arguments() {
    let _g = hsa_sim::serial_test_guard();
    let before = hsa_sim::counters();
    {
        let mut dev = open_static(
            hsa_core::PacketAbi::G2,
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
fn an_exported_tensor_fd_shares_bytes_with_the_device() {
    use std::os::unix::fs::FileExt;
    let _g = hsa_sim::serial_test_guard();
    for backing in [TensorBacking::Pool, TensorBacking::Vmem] {
        let mut dev = open_static(
            hsa_core::PacketAbi::G2,
            DeviceOptions {
                tensor_backing: backing,
                ..Default::default()
            },
        );
        let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
        let prog = load(&mut dev, &design);
        let a = dev.alloc_tensor(4096).unwrap();
        let b = dev.alloc_tensor(4096).unwrap();
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
            input.iter().map(|x| x + 1).collect::<Vec<_>>(),
            "{backing:?}"
        );
    }
}

#[test]
fn a_fault_in_link_10_stops_the_chain_there_and_the_queue_recovers() {
    let _g = hsa_sim::serial_test_guard();
    for abi in ABIS {
        let mut dev = open_static(abi, DeviceOptions::default());
        let add = load(&mut dev, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
        let fault = load(&mut dev, &EmuDesign::fault(4096));
        let bufs: Vec<_> = (0..13).map(|_| dev.alloc_tensor(4096).unwrap()).collect();
        // Link i adds one from bufs[i] into bufs[i + 1]; link 10 faults.
        let links: Vec<Dispatch> = (0..12)
            .map(|i| Dispatch::new(if i == 10 { fault } else { add }, [bufs[i], bufs[i + 1]]))
            .collect();
        let err = dev.run_chain(&links).unwrap_err();
        assert_eq!(err.index, 10, "{abi}: {err}");
        assert!(matches!(err.error, HsaError::Device { .. }), "{abi}: {err}");
        assert_eq!(
            err.report.doorbells, 1,
            "{abi}: the failed batch was rung once"
        );
        assert_eq!(
            err.report.queue_recreations, 0,
            "{abi}: the failed queue is left suspended"
        );
        assert!(
            dev.recover().unwrap(),
            "{abi}: recover() recreates the failed queue"
        );
        assert!(!dev.recover().unwrap(), "{abi}: and then has nothing to do");
        assert_eq!(
            read_i32s(&dev, bufs[10], 4)[0],
            10,
            "{abi}: links before 10 ran"
        );
        assert_eq!(
            read_i32s(&dev, bufs[12], 4)[0],
            0,
            "{abi}: link 11 did not run"
        );
        // The queue was recreated: the next dispatch works.
        vector_scalar_add_passes(&mut dev);
    }
}

#[test]
fn more_than_32_distinct_programs_recreate_the_queue_instead_of_failing() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open_static(hsa_core::PacketAbi::G2, DeviceOptions::default());
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
    let mut dev = open_static(hsa_core::PacketAbi::G2, DeviceOptions::default());
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
    let mut dev = open_static(hsa_core::PacketAbi::G2, DeviceOptions::default());
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
    let mut dev = open_static(hsa_core::PacketAbi::G2, DeviceOptions::default());
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
