//! `packet_abi = "auto"` on every emulated ROCR release: the form it chooses, and a dispatch in
//! that form giving the right output. The July 2026 development runtime (`rocr-g2-2026-07`)
//! loads AIE code objects while its packets are still G2, so a load alone must not make `auto`
//! choose kernel objects there.

use hsa_core::{Device, DeviceOptions, Dispatch, Generation, HsaError, PacketAbi};
use hsa_sim::{Profile, SimConfig};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

/// The form `auto` must choose on `profile`, or `None` where it cannot tell (late 2025's G1b
/// looks like a develop build that still reads G1a).
fn expected(profile: Profile) -> Option<PacketAbi> {
    match profile {
        Profile::Rocm70 => Some(PacketAbi::G1a),
        Profile::RocrLate2025 => None,
        Profile::RocrG2May2026 | Profile::RocrG2Jul2026 | Profile::RocrNewest => {
            Some(PacketAbi::G2)
        }
        Profile::KernelObject => Some(PacketAbi::KernelObject),
    }
}

#[test]
fn auto_chooses_the_form_each_release_reads_and_a_dispatch_in_it_is_right() {
    let _g = hsa_sim::serial_test_guard();
    for profile in Profile::ALL {
        let before = hsa_sim::counters();
        hsa_sim::set_config(SimConfig {
            profile,
            ..SimConfig::default()
        });
        // ROCm 7.0 names every NPU aie2: the generation is configured so every release opens.
        let opts = DeviceOptions {
            generation: Some(Generation::Npu2),
            ..DeviceOptions::default()
        };
        let opened = Device::open(hsa_sim::api("hsa-sim"), opts);
        let Some(abi) = expected(profile) else {
            let e = opened.expect_err("auto cannot tell this release");
            assert!(matches!(e, HsaError::PacketAbiUnknown { .. }), "{e:?}");
            continue;
        };
        let mut dev = opened.unwrap_or_else(|e| panic!("{profile}: {e}"));
        assert_eq!(
            dev.info().packet_abi,
            abi,
            "{profile}: {}",
            dev.info().packet_abi_source
        );
        let d = EmuDesign::vector_scalar_add(1024, DType::I32, 7);
        let p = dev
            .load_program(&d.to_pdi(), &d.insts(NpuGen::Npu2))
            .unwrap_or_else(|e| panic!("{profile}: {e}"));
        let a = dev.alloc_tensor(4096).unwrap();
        let b = dev.alloc_tensor(4096).unwrap();
        let input: Vec<i32> = (0..1024).collect();
        let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
        dev.write_tensor(a, 0, &bytes).unwrap();
        dev.dispatch(&Dispatch::new(p, [a, b]))
            .unwrap_or_else(|e| panic!("{profile}: {e}"));
        let mut out = vec![0u8; 4096];
        dev.read_tensor(b, 0, &mut out).unwrap();
        let got: Vec<i32> = out
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            got,
            input.iter().map(|v| v + 7).collect::<Vec<_>>(),
            "{profile}"
        );
        drop(dev);
        let all = hsa_sim::counters().since(&before);
        assert!(all.balanced(), "{profile}: {:?}", all.unbalanced());
    }
}
