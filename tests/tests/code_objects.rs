//! AIE code objects (hsaco) through the real daemon: `packet_abi = "auto"` finds kernel objects
//! only on a runtime that loads them (and proves the other packet forms the same way); the same client code runs vector_scalar_add, a chain of
//! 100 and the demo's designs from PDI+insts and from `.hsaco` on the kernel-object runtime and
//! on the G2 runtimes; FullElf kernels run where code objects load or the G2 runtime takes
//! full-ELF packets, and are refused by name elsewhere; a malformed hsaco is
//! refused by rule before the device sees it.

#![forbid(unsafe_code)]

use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, Program};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Runtime, Session, npuctl_binary};

/// The runtimes whose packets carry instruction addresses or kernel objects and which the
/// same client code must serve.
const G2_AND_KO: [&str; 4] = [
    "rocr-g2-2026-05",
    "rocr-g2-2026-07",
    "rocr-newest",
    "kernel-object",
];

async fn device(d: &Daemon) -> pb::DeviceInfo {
    let mut s = Session::open(d.connect().await, "info").await.unwrap();
    s.client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

fn generation(info: &pb::DeviceInfo) -> NpuGen {
    match info.generation.as_str() {
        "npu1" => NpuGen::Npu1,
        _ => NpuGen::Npu2,
    }
}

async fn client(d: &Daemon) -> Client {
    Client::connect(Some(&format!("unix:{}", d.socket.display())))
        .await
        .unwrap()
}

/// What `auto` must have proved for `profile`'s `abi`, as its source says.
fn proof_of(profile: &str, abi: &str) -> &'static str {
    match (profile, abi) {
        (_, "kernel-object") => {
            "refused a packet naming its kernel object with NULL kernargs \
                                 as INVALID_PACKET_FORMAT"
        }
        // A G2 runtime with the AIE loader: the load proves no packet form, the probe packet's
        // refusal does.
        ("rocr-g2-2026-07", _) => {
            "refused a packet naming its kernel object as \
                                   INVALID_ALLOCATION"
        }
        (_, "g2") => "maps a vmem handle of the AIE data pool",
        _ => "auto: ROCm 7.0 (G1a)",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_proves_each_runtimes_packet_form_the_same_way_linked_and_loaded() {
    // Every profile whose packet form the runtime shows (late 2025's does not: `rocm_7_0.rs`
    // checks the refusal), linked in and loaded as libhsa-runtime64.so, as on a machine with
    // an NPU: the same evidence decides, never the emulator's profile.
    for (profile, abi) in npud_e2e::PROFILES
        .into_iter()
        .filter(|(p, _)| *p != npud_e2e::AUTO_CANNOT_TELL)
    {
        for runtime in [Runtime::Linked, Runtime::Loaded] {
            let d = Daemon::start(
                Options::default()
                    .profile(profile, runtime)
                    .arg("--packet-abi")
                    .arg("auto"),
            );
            let i = device(&d).await;
            assert_eq!(i.packet_abi, abi, "{profile} {runtime:?}: {i:?}");
            assert!(
                i.packet_abi_source.starts_with("auto: ")
                    && i.packet_abi_source.contains(proof_of(profile, abi)),
                "{profile} {runtime:?}: {}",
                i.packet_abi_source
            );
            if runtime == Runtime::Linked {
                continue;
            }
            // npuctl status says the same, and how it was chosen.
            let out = std::process::Command::new(npuctl_binary())
                .args(["--json", "--addr"])
                .arg(format!("unix:{}", d.socket.display()))
                .arg("status")
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let dev = &v["device"];
            assert_eq!(dev["packet_abi"], abi, "{v}");
            assert!(
                dev["packet_abi_source"]
                    .as_str()
                    .is_some_and(|s| s.contains(proof_of(profile, abi))),
                "{v}"
            );
        }
    }
    // A configured ABI is not probed.
    let d = Daemon::start(
        Options::default()
            .profile("rocr-newest", Runtime::Loaded)
            .arg("--packet-abi")
            .arg("g2"),
    );
    assert_eq!(device(&d).await.packet_abi_source, "configured");
}

/// vector_scalar_add, a chain of 100 and the demo's three designs, each from `program`.
async fn run_designs(
    c: &Client,
    profile: &str,
    form: &str,
    program: impl Fn(&EmuDesign) -> Program,
) {
    let what = |w: &str| format!("{profile}, {form}: {w}");
    let vsa = program(&EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let input: Vec<i32> = (0..1024).map(|v| v * 3 - 1000).collect();
    let mut a = c.tensor_from(&input).await.unwrap();
    let mut b = c.alloc::<i32>(1024).await.unwrap();
    // Every argument as written: whatever the program's form, the library lends them all.
    c.dispatch(&vsa, &[], &mut [&mut a, &mut b]).await.unwrap();
    assert!(
        b.as_slice().iter().zip(&input).all(|(o, i)| *o == i + 1),
        "{}",
        what("vector_scalar_add")
    );

    // A chain of 100 alternating a→b and b→a: batches of 32, 32, 32, 4 on every runtime
    // (44 commands of two arguments fit a kernel-object chain, but a doorbell carries 32).
    let mut chain = c.chain();
    let (ca, cb) = (chain.write(&mut a), chain.write(&mut b));
    for k in 0..100 {
        if k % 2 == 0 {
            chain.then(&vsa, &[ca, cb]);
        } else {
            chain.then(&vsa, &[cb, ca]);
        }
    }
    let r = chain.run().await.unwrap();
    assert!(r.failure.is_none(), "{}: {r:?}", what("chain"));
    assert_eq!((r.completed, r.doorbells), (100, 4), "{}", what("chain"));
    assert!(
        a.as_slice().iter().zip(&input).all(|(o, i)| *o == i + 100),
        "{}",
        what("a after the chain")
    );
    a.as_mut_slice().fill(0);

    // The demo's designs.
    let vva = program(&EmuDesign::vector_vector_add(1024, DType::I32));
    let x: Vec<i32> = (0..1024).map(|i| (i * 7919) % 100).collect();
    let y: Vec<i32> = (0..1024).map(|i| (i * 104_729) % 100).collect();
    let (mut tx, mut ty, mut tz) = (
        c.tensor_from(&x).await.unwrap(),
        c.tensor_from(&y).await.unwrap(),
        c.alloc::<i32>(1024).await.unwrap(),
    );
    c.dispatch(&vva, &[], &mut [&mut tx, &mut ty, &mut tz])
        .await
        .unwrap();
    assert!(
        tz.as_slice()
            .iter()
            .zip(x.iter().zip(&y))
            .all(|(s, (p, q))| *s == p + q),
        "{}",
        what("vector_vector_add")
    );
    let n = 64_usize;
    let mm = program(&EmuDesign::matmul(64, 64, 64, DType::I16, DType::I32));
    let ma: Vec<i16> = (0..n * n)
        .map(|i| i16::try_from(i % 31).unwrap() - 15)
        .collect();
    let mb: Vec<i16> = (0..n * n)
        .map(|i| i16::try_from(i % 23).unwrap() - 11)
        .collect();
    let (mut ta, mut tb, mut tc) = (
        c.tensor_from(&ma).await.unwrap(),
        c.tensor_from(&mb).await.unwrap(),
        c.alloc::<i32>(n * n).await.unwrap(),
    );
    c.dispatch(&mm, &[], &mut [&mut ta, &mut tb, &mut tc])
        .await
        .unwrap();
    for row in 0..n {
        for col in 0..n {
            let want: i32 = (0..n)
                .map(|k| i32::from(ma[row * n + k]) * i32::from(mb[k * n + col]))
                .sum();
            assert_eq!(tc.as_slice()[row * n + col], want, "{}", what("matmul"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_client_code_runs_pdi_insts_and_hsaco_on_g2_and_kernel_object_runtimes() {
    for profile in G2_AND_KO {
        for runtime in [Runtime::Linked, Runtime::Loaded] {
            let d = Daemon::start(
                Options::default()
                    .profile(profile, runtime)
                    .arg("--packet-abi")
                    .arg("auto"),
            );
            let g = generation(&device(&d).await);
            let c = client(&d).await;
            run_designs(&c, profile, "pdi+insts", |e| {
                Program::emulated(e, g).unwrap()
            })
            .await;
            run_designs(&c, profile, "hsaco", |e| {
                Program::from_hsaco(e.to_hsaco(g).unwrap(), "").unwrap()
            })
            .await;
            // The listing tells the forms apart and names the kernel.
            let list = c.programs().await.unwrap();
            let hsaco: Vec<&pb::ProgramListing> = list
                .iter()
                .filter(|p| p.summary.as_ref().is_some_and(|s| s.form == "hsaco"))
                .collect();
            assert_eq!(hsaco.len(), 3, "{profile}: {list:?}");
            let s = hsaco[0].summary.as_ref().unwrap();
            assert_eq!(
                (s.kernel_name.as_str(), s.kernel_kind.as_str()),
                ("vector_scalar_add", "PdiInsts"),
                "{profile}"
            );
            assert_eq!(
                list.iter()
                    .filter(|p| p.summary.as_ref().is_some_and(|s| s.form == "pdi+insts"))
                    .count(),
                3
            );
            c.close().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hsaco_registers_once_by_content_and_its_statistics_name_the_kernel() {
    let d = Daemon::start(Options::default().profile("kernel-object", Runtime::Linked));
    let mut a = Session::open(d.connect().await, "a").await.unwrap();
    let mut b = Session::open(d.connect().await, "b").await.unwrap();
    let hsaco = EmuDesign::vector_scalar_add(1024, DType::I32, 5)
        .to_hsaco(NpuGen::Npu2)
        .unwrap();
    let r1 = a.register_hsaco(hsaco.clone(), "", "one").await.unwrap();
    // Naming the only kernel is the same program; so are the same bytes from another session.
    let r2 = b
        .register_hsaco(hsaco.clone(), "vector_scalar_add", "two")
        .await
        .unwrap();
    assert!(r1.newly_stored && !r2.newly_stored);
    assert_eq!(r1.program_id, r2.program_id);
    assert_eq!(r1.content_hash, r2.content_hash);
    let st = a.statistics().await.unwrap();
    let p = st
        .programs
        .iter()
        .find(|p| p.program_id == r1.program_id)
        .unwrap();
    assert_eq!(
        (
            p.form.as_str(),
            p.kernel_name.as_str(),
            p.kernel_kind.as_str()
        ),
        ("hsaco", "vector_scalar_add", "PdiInsts")
    );
}

/// The runtimes FullElf kernels run on, and the arguments the daemon needs for each: kernel
/// objects; G2 full-ELF packets where `auto` proves them (a G2 runtime with the AIE loader) or
/// where they are configured (the newest G2, which `auto` cannot tell from the first).
const FULL_ELF_RUNS: [(&str, &[&str]); 3] = [
    ("kernel-object", &[]),
    ("rocr-g2-2026-07", &[]),
    ("rocr-newest", &["--g2-full-elf", "true"]),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_elf_kernels_run_on_kernel_object_and_g2_full_elf_runtimes_and_are_refused_elsewhere()
{
    let design = EmuDesign::vector_scalar_add(1024, DType::I32, 2);
    let hsaco = design.to_full_elf_hsaco().unwrap();
    for (profile, args) in FULL_ELF_RUNS {
        for runtime in [Runtime::Linked, Runtime::Loaded] {
            let mut o = Options::default().profile(profile, runtime);
            for a in args {
                o = o.arg(a);
            }
            let d = Daemon::start(o);
            let c = client(&d).await;
            let p = Program::from_hsaco(hsaco.clone(), "").unwrap();
            assert_eq!(p.min_arg_sizes().len(), 2);
            let pdi_insts = Program::emulated(&design, NpuGen::Npu2).unwrap();
            let input: Vec<i32> = (0..1024).collect();
            let mut a = c.tensor_from(&input).await.unwrap();
            let mut b = c.alloc::<i32>(1024).await.unwrap();
            // The same kernel twice with other arguments in one chain: its patches go to
            // fresh copies of the control code, so each link reads and writes its own tensors.
            // Then a PdiInsts link: the daemon rings the two kinds as separate batches.
            let mut b2 = c.alloc::<i32>(1024).await.unwrap();
            let mut b3 = c.alloc::<i32>(1024).await.unwrap();
            let mut chain = c.chain();
            let (ca, cb, cb2, cb3) = (
                chain.write(&mut a),
                chain.write(&mut b),
                chain.write(&mut b2),
                chain.write(&mut b3),
            );
            chain
                .then(&p, &[ca, cb])
                .then(&p, &[cb, cb2])
                .then(&pdi_insts, &[cb2, cb3]);
            let r = chain.run().await.unwrap();
            assert!(r.failure.is_none(), "{profile} {runtime:?}: {r:?}");
            assert_eq!(r.doorbells, 2, "{profile} {runtime:?}: {r:?}");
            assert!(b.as_slice().iter().zip(&input).all(|(o, i)| *o == i + 2));
            assert!(b2.as_slice().iter().zip(&input).all(|(o, i)| *o == i + 4));
            assert!(b3.as_slice().iter().zip(&input).all(|(o, i)| *o == i + 6));
            c.close().await.unwrap();
        }
    }
    // The first G2 release has no full ELF, and auto cannot tell the newest from it: both are
    // refused by name before the device sees the kernel.
    for (profile, why) in [
        ("rocr-newest", "g2_full_elf = true"),
        ("rocr-g2-2026-05", "g2_full_elf = true"),
    ] {
        let d = Daemon::start(Options::default().profile(profile, Runtime::Linked));
        let mut s = Session::open(d.connect().await, "g2").await.unwrap();
        let e = s.register_hsaco(hsaco.clone(), "", "fe").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains("FullElf kernel")
                && e.message()
                    .contains("neither loads code objects nor takes G2 full-ELF")
                && e.message().contains(why),
            "{profile}: {}",
            e.message()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_hsaco_is_refused_by_rule_before_the_device_sees_it() {
    let d = Daemon::start(Options::default().profile("kernel-object", Runtime::Linked));
    let mut s = Session::open(d.connect().await, "bad").await.unwrap();
    let good = EmuDesign::vector_scalar_add(1024, DType::I32, 1)
        .to_hsaco(NpuGen::Npu2)
        .unwrap();
    // A kernel the file lacks: the message lists the ones it has.
    let e = s
        .register_hsaco(good.clone(), "nope", "x")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("no kernel \"nope\"")
            && e.message().contains("[\"vector_scalar_add\"]"),
        "{}",
        e.message()
    );
    // A section only for the other arch: this device cannot run it.
    let other = EmuDesign::vector_scalar_add(1024, DType::I32, 1)
        .to_hsaco(NpuGen::Npu1)
        .unwrap();
    let e = s.register_hsaco(other, "", "x").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("aie2p"), "{}", e.message());
    // Not an ELF at all, and both forms at once.
    let e = s
        .register_hsaco(b"not an elf".to_vec(), "", "x")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("hsaco: "), "{}", e.message());
    let req = s.req(pb::RegisterProgramRequest {
        pdi: vec![1; 4],
        insts: vec![0; 4],
        hsaco: good,
        ..Default::default()
    });
    let e = s.client.register_program(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("not both"), "{}", e.message());
    // Nothing reached the device.
    assert!(s.statistics().await.unwrap().programs.is_empty());
}
