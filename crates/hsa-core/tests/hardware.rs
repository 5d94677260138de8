//! Tests that need a real XDNA NPU and a ROCm with AIE support. Compiled in CI with
//! `--features hw-tests`, run only on an NPU host:
//!
//! ```text
//! NPUD_HW_DESIGN_DIR=path/to/vector_scalar_add \
//! NPUD_HW_PACKET_ABI=g2 \
//! cargo test -p hsa-core --features hw-tests --test hardware -- --test-threads 1
//! ```
//!
//! `NPUD_HW_DESIGN_DIR` is IRON's `programming_examples/basic/vector_scalar_add` built for this
//! NPU's generation (its `build/` holds `main.pdi` and `insts.bin`: in, out = 1024 × i32, out =
//! in + 1). The library is found as `npud --backend hsa` finds it (`ROCM_PATH`, a pip ROCm,
//! `/opt/rocm`, the system loader).

#![cfg(feature = "hw-tests")]

use std::path::PathBuf;

use hsa_core::{Device, DeviceOptions, Dispatch, HsaApi, PacketAbi};

fn open() -> Device {
    // Unset or `auto`: probe for kernel objects, else G2.
    let (abi, probe) = match std::env::var("NPUD_HW_PACKET_ABI").as_deref() {
        Err(_) | Ok("auto") => (PacketAbi::G2, true),
        Ok(abi) => (
            abi.parse::<PacketAbi>()
                .expect("NPUD_HW_PACKET_ABI is auto, kernel-object, g2, g1b or g1a"),
            false,
        ),
    };
    let api = HsaApi::discover(None).expect("a ROCm with AIE support is installed");
    Device::open(
        api,
        DeviceOptions {
            packet_abi: abi,
            probe_code_objects: probe,
            ..Default::default()
        },
    )
    .expect("the NPU opens")
}

fn design() -> (Vec<u8>, Vec<u8>) {
    let dir = PathBuf::from(std::env::var("NPUD_HW_DESIGN_DIR").expect("set NPUD_HW_DESIGN_DIR"));
    let d = npu_artifacts::design::Design::open(&dir).expect("the design directory is complete");
    (d.pdi, d.insts)
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn the_npu_opens_and_reports_a_known_generation() {
    let dev = open();
    let info = dev.info();
    assert!(info.agent_name.starts_with("aie2"), "{info:?}");
    assert!(info.heap_size >= 64 << 20, "{info:?}");
    eprintln!("{info:#?}");
}

#[test]
fn vector_scalar_add_passes_on_the_npu() {
    let mut dev = open();
    let (pdi, insts) = design();
    let prog = dev.load_program(&pdi, &insts).unwrap();
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    let input: Vec<i32> = (1..=1024).collect();
    let bytes: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
    dev.write_tensor(a, 0, &bytes).unwrap();
    dev.dispatch(&Dispatch::new(prog, [a, b])).unwrap();
    let mut out = vec![0u8; 4096];
    dev.read_tensor(b, 0, &mut out).unwrap();
    assert_eq!(i32s(&out), input.iter().map(|x| x + 1).collect::<Vec<_>>());
}

#[test]
fn a_chain_of_100_passes_on_the_npu() {
    let mut dev = open();
    let (pdi, insts) = design();
    let prog = dev.load_program(&pdi, &insts).unwrap();
    let bufs = [
        dev.alloc_tensor(4096).unwrap(),
        dev.alloc_tensor(4096).unwrap(),
    ];
    let input: Vec<i32> = (1..=1024).collect();
    let bytes: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
    dev.write_tensor(bufs[0], 0, &bytes).unwrap();
    let links: Vec<Dispatch> = (0..100)
        .map(|i| Dispatch::new(prog, [bufs[i % 2], bufs[(i + 1) % 2]]))
        .collect();
    let report = dev.run_chain(&links).unwrap();
    assert_eq!(report.doorbells, 4);
    let mut out = vec![0u8; 4096];
    dev.read_tensor(bufs[0], 0, &mut out).unwrap();
    assert_eq!(
        i32s(&out),
        input.iter().map(|x| x + 100).collect::<Vec<_>>()
    );
}

#[test]
fn an_exported_tensor_can_be_read_through_its_fd_on_the_npu() {
    use std::os::unix::fs::FileExt;
    let mut dev = open();
    if !dev.info().fd_export {
        eprintln!("this runtime cannot export tensors as fds; nothing to check");
        return;
    }
    let t = dev.alloc_tensor(4096).unwrap();
    dev.write_tensor(t, 0, &[7u8; 4096]).unwrap();
    let (fd, off) = dev.export_tensor(t).unwrap();
    let mut buf = vec![0u8; 4096];
    std::fs::File::from(fd)
        .read_exact_at(&mut buf, off)
        .unwrap();
    assert!(buf.iter().all(|&b| b == 7));
}
