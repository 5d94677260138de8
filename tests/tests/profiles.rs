//! Every emulator profile, reached both ways a daemon reaches a runtime: linked in
//! (`--backend emulator --emulator-profile P`) and loaded at run time as
//! `libhsa-runtime64.so` (`--backend hsa --library <hsa-sim> --packet-abi A`, `HSA_SIM_PROFILE=P`),
//! which is the path users with an NPU run. For each: DeviceInfo, a dispatch, chains (100
//! links, and 32 links of a 6-argument program, which overflow the chain buffer of runtimes
//! that do not split chains unless npud sizes its doorbell batches), the Submit stream, how
//! tensors are shared (in place or staged), what a device fault does, and a client that tries
//! to truncate or reseal every fd it was given.

#![forbid(unsafe_code)]

use std::os::fd::AsFd;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, I32Copies, Mapped, Options, PROFILES, Runtime, Session, dispatch_request};
use rustix::fs::SealFlags;
use tokio_stream::StreamExt;

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;

fn abi_of(profile: &str) -> &'static str {
    PROFILES
        .iter()
        .find(|(p, _)| *p == profile)
        .map(|(_, abi)| *abi)
        .expect("a known profile")
}

fn start(profile: &str, runtime: Runtime) -> Daemon {
    Daemon::start(Options::default().profile(profile, runtime))
}

/// Link k reads a and writes b when k is even, the other way round when odd.
fn alternating(program: u64, a: u64, b: u64, k: usize) -> pb::DispatchRequest {
    if k.is_multiple_of(2) {
        dispatch_request(program, &[a, b])
    } else {
        dispatch_request(program, &[b, a])
    }
}

/// Compares tensors, naming the first element that differs (not printing thousands).
fn same(got: &[i32], want: &[i32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{what}: element {i} is {} where {} was expected",
            got[i], want[i]
        );
    }
}

/// Registers vector_scalar_add (adding `scalar`) and maps an input and an output tensor for
/// it: (program, input, output).
async fn vsa(s: &mut Session, scalar: i64) -> (u64, Mapped, Mapped) {
    let p = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, scalar))
        .await
        .unwrap()
        .program_id;
    let a = s.alloc_mapped(BYTES).await.unwrap();
    let b = s.alloc_mapped(BYTES).await.unwrap();
    (p, a, b)
}

async fn info(s: &mut Session) -> pb::DeviceInfo {
    s.client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

async fn storage(s: &mut Session, t: &Mapped) -> pb::TensorStorage {
    let req = s.req(pb::GetTensorInfoRequest { tensor_id: t.id });
    s.client
        .get_tensor_info(req)
        .await
        .unwrap()
        .into_inner()
        .storage()
}

/// The work every profile must do through the daemon, on either path.
async fn core_work(profile: &str, runtime: Runtime) {
    let d = start(profile, runtime);
    let mut s = Session::open(d.connect().await, "profiles").await.unwrap();

    let i = info(&mut s).await;
    assert_eq!(i.emulator_profile, profile, "{i:?}");
    assert_eq!(i.packet_abi, abi_of(profile));
    let backend = match runtime {
        Runtime::Linked => "emulator",
        Runtime::Loaded => "hsa",
    };
    assert_eq!(i.backend, backend);
    assert!(i.runtime_version.contains(profile), "{}", i.runtime_version);
    // Only the newest runtimes export tensor memory (from vmem); the others are staged.
    let in_place = matches!(profile, "rocr-g2-2026-07" | "rocr-newest" | "kernel-object");
    assert_eq!(
        i.tensor_sharing,
        if in_place { "vmem-export" } else { "staged" },
        "{i:?}"
    );
    if !in_place {
        assert!(
            i.tensor_sharing_reason.contains("no export works"),
            "{}",
            i.tensor_sharing_reason
        );
    }

    // One dispatch.
    let (p, mut a, b) = vsa(&mut s, 1).await;
    let want_storage = if in_place {
        pb::TensorStorage::DeviceShared
    } else {
        pb::TensorStorage::DaemonMemfdStaged
    };
    assert_eq!(storage(&mut s, &a).await, want_storage);
    let input: Vec<i32> = (0..N as i32).map(|v| v * 3 - 1000).collect();
    a.map.set_i32s(&input).unwrap();
    s.dispatch(p, &[a.id, b.id]).await.unwrap();
    let plus = |k: i32| input.iter().map(|v| v + k).collect::<Vec<i32>>();
    same(&b.map.i32s().unwrap(), &plus(1), "b after one dispatch");

    // A chain of 100: batches of 32, 32, 32 and 4.
    let links = (0..100).map(|k| alternating(p, a.id, b.id, k)).collect();
    let r = s.chain(links).await.unwrap();
    assert!(r.failure.is_none(), "{r:?}");
    assert_eq!((r.completed, r.doorbells), (100, 4));
    // Link k writes input + k + 1; link 99 is odd, so it wrote a.
    same(&a.map.i32s().unwrap(), &plus(100), "a after the chain");

    // 32 links of six arguments: 27 fit the G1 chain buffer and 31 the early G2 one; one
    // doorbell for all 32 fails on those runtimes. A kernel-object command is two dwords
    // shorter, so 33 fit and one doorbell carries all 32.
    let six = s
        .register(&EmuDesign::noop(6, 4096))
        .await
        .unwrap()
        .program_id;
    let mut ids = Vec::new();
    let mut keep = Vec::new();
    for _ in 0..6 {
        let t = s.alloc_mapped(4096).await.unwrap();
        ids.push(t.id);
        keep.push(t);
    }
    let links = (0..32).map(|_| dispatch_request(six, &ids)).collect();
    let r = s.chain(links).await.unwrap();
    assert!(r.failure.is_none(), "{profile}: {r:?}\n{}", d.stderr());
    assert_eq!(r.completed, 32);
    let doorbells = if profile == "kernel-object" { 1 } else { 2 };
    assert_eq!(
        r.doorbells, doorbells,
        "27 + 5 on G1, 31 + 1 on G2, 32 on kernel objects"
    );

    // The Submit stream: 20 dispatches in flight, completed in order.
    let (tx, rx) = tokio::sync::mpsc::channel(32);
    let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut inbound = s.client.submit(s.req(outbound)).await.unwrap().into_inner();
    for id in 0..20u64 {
        tx.send(pb::SubmitRequest {
            request_id: id,
            work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
                p,
                &[a.id, b.id],
            ))),
            timeout_ms: 0,
        })
        .await
        .unwrap();
    }
    drop(tx);
    let mut done = Vec::new();
    while let Some(r) = inbound.next().await {
        let r = r.unwrap();
        assert_eq!(r.code, 0, "{r:?}");
        done.push(r.request_id);
    }
    assert_eq!(done, (0..20).collect::<Vec<u64>>());
    same(&b.map.i32s().unwrap(), &plus(101), "b after the stream");
}

/// A fault on the runtimes that report one: INTERNAL, the program quarantined, the device
/// serving again. ROCm 7.0 only asserts (compiled out), so there the fault is silent: the
/// dispatch "succeeds" and its output is untouched, which is all a daemon can see.
async fn device_fault(profile: &str, runtime: Runtime) {
    let d = start(profile, runtime);
    let mut s = Session::open(d.connect().await, "faults").await.unwrap();
    let (p, mut a, b) = vsa(&mut s, 1).await;
    let fault = s
        .register(&EmuDesign::fault(N * 4))
        .await
        .unwrap()
        .program_id;
    a.map.fill_i32(7).unwrap();
    let r = s.dispatch(fault, &[a.id, b.id]).await;
    match profile {
        "rocm-7.0" => {
            r.expect("ROCm 7.0 reports no device fault");
            assert!(b.map.i32s().unwrap().iter().all(|v| *v == 0));
            let st = s.statistics().await.unwrap();
            assert_eq!(st.device_faults, 0);
        }
        _ => {
            let e = r.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");
            assert!(e.message().contains("quarantined"), "{e:?}");
            let e = s.dispatch(fault, &[a.id, b.id]).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        }
    }
    // The device serves the next program either way.
    s.dispatch(p, &[a.id, b.id]).await.unwrap();
    assert!(b.map.i32s().unwrap().iter().all(|v| *v == 8));
}

/// A client holding every kind of fd the daemon hands out or accepts tries to truncate, grow
/// and reseal it: each attempt fails in the client, and the daemon keeps serving, reading and
/// dispatching over those tensors.
async fn truncation(profile: &str, runtime: Runtime) {
    let d = start(profile, runtime);
    let mut s = Session::open(d.connect().await, "attacker").await.unwrap();
    let (p, mut a, out) = vsa(&mut s, 1).await;
    // The client's own memfd, imported: the daemon accepts it only sealed.
    let imported_fd = npu_fd::memfd::create("attacker", BYTES).unwrap();
    let (imported, sent) = s.import(imported_fd.as_fd(), BYTES).await.unwrap();
    sent.unwrap();
    for (what, fd, handed_out) in [
        ("an exported tensor", a.fd.as_fd(), true),
        ("an output tensor", out.fd.as_fd(), true),
        ("an imported memfd", imported_fd.as_fd(), false),
    ] {
        for len in [0, BYTES / 2, BYTES * 4] {
            let e = rustix::fs::ftruncate(fd, len).expect_err(what);
            assert_eq!(
                e,
                rustix::io::Errno::PERM,
                "{profile}: truncating {what} to {len}"
            );
        }
        // The fds the daemon hands out take no further seal either (F_SEAL_SEAL): a write seal
        // would turn the daemon's own later mappings into errors.
        if handed_out {
            for seal in [SealFlags::WRITE, SealFlags::FUTURE_WRITE, SealFlags::SEAL] {
                assert!(
                    rustix::fs::fcntl_add_seals(fd, seal).is_err(),
                    "{profile}: {what} took the seal {seal:?}"
                );
            }
        }
    }
    a.map.fill_i32(41).unwrap();
    s.dispatch(p, &[a.id, out.id]).await.unwrap();
    s.dispatch(p, &[imported, out.id]).await.unwrap();
    assert!(out.map.i32s().unwrap().iter().all(|v| *v == 1));
    let req = s.req(pb::ReadTensorRequest {
        tensor_id: a.id,
        offset: 0,
        length: BYTES,
        chunk_bytes: 0,
    });
    let mut chunks = s.client.read_tensor(req).await.unwrap().into_inner();
    let mut got = Vec::new();
    while let Some(c) = chunks.next().await {
        got.extend_from_slice(&c.unwrap().data);
    }
    assert_eq!(got, npud_e2e::i32_bytes(&vec![41; N as usize]));
    assert!(info(&mut s).await.serving);
}

macro_rules! per_profile {
    ($($name:ident => $profile:literal;)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn core_work_linked() {
                core_work($profile, Runtime::Linked).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn core_work_loaded() {
                core_work($profile, Runtime::Loaded).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn truncating_fds_hurts_nobody_linked() {
                truncation($profile, Runtime::Linked).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn truncating_fds_hurts_nobody_loaded() {
                truncation($profile, Runtime::Loaded).await;
            }
        }
    )*};
}

per_profile! {
    rocm_7_0 => "rocm-7.0";
    rocr_late_2025 => "rocr-late-2025";
    rocr_g2_2026_05 => "rocr-g2-2026-05";
    rocr_g2_2026_07 => "rocr-g2-2026-07";
    rocr_newest => "rocr-newest";
    kernel_object => "kernel-object";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_on_the_newest_runtime_is_reported_and_quarantined_both_ways() {
    device_fault("rocr-newest", Runtime::Linked).await;
    device_fault("rocr-newest", Runtime::Loaded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_on_a_kernel_object_runtime_is_reported_and_quarantined_both_ways() {
    device_fault("kernel-object", Runtime::Linked).await;
    device_fault("kernel-object", Runtime::Loaded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_on_rocm_7_0_is_silent_both_ways() {
    device_fault("rocm-7.0", Runtime::Linked).await;
    device_fault("rocm-7.0", Runtime::Loaded).await;
}

/// A stand-in sysfs with one accel device of the given PCI vendor and device id.
fn sysfs(vendor: &str, device: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("class/accel/accel0/device");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
    std::fs::write(dir.join("device"), format!("{device}\n")).unwrap();
    root
}

/// ROCm 7.0 names every NPU `aie2`, Strix included: the daemon takes the generation from the
/// PCI id in sysfs or from `--generation`, and refuses to guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocm_7_0_takes_the_generation_from_sysfs_or_the_flag_and_never_guesses() {
    for runtime in [Runtime::Linked, Runtime::Loaded] {
        // No NPU in sysfs and no flag: refused, saying what to set.
        let empty = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(empty.path().join("class/accel")).unwrap();
        let opts = Options::default()
            .profile("rocm-7.0", runtime)
            .arg("--sysfs-root")
            .arg(empty.path().to_str().unwrap());
        let (status, stderr) = Daemon::try_start(opts).expect_err("no generation, no start");
        assert!(!status.success());
        assert!(
            stderr.contains("cannot tell the NPU generation"),
            "{stderr}"
        );
        assert!(stderr.contains("\"aie2\""), "{stderr}");
        assert!(stderr.contains("--generation npu1"), "{stderr}");
        assert!(stderr.contains("lists no accel device"), "{stderr}");

        // Another vendor's accelerator is no NPU.
        let other = sysfs("0x8086", "0x643e");
        let opts = Options::default()
            .profile("rocm-7.0", runtime)
            .arg("--sysfs-root")
            .arg(other.path().to_str().unwrap());
        let (_, stderr) = Daemon::try_start(opts).expect_err("a foreign device");
        assert!(stderr.contains("0x8086:0x643e"), "{stderr}");

        // Each PCI id gives its generation, and designs for it run.
        for (id, agent, generation) in [("0x1502", "aie2", "npu1"), ("0x17f0", "aie2p", "npu2")] {
            let root = sysfs("0x1022", id);
            let mut opts = Options::default()
                .profile("rocm-7.0", runtime)
                .arg("--sysfs-root")
                .arg(root.path().to_str().unwrap());
            // The emulated NPU is the one sysfs describes.
            match runtime {
                Runtime::Linked => opts = opts.arg("--emulator-agent").arg(agent),
                Runtime::Loaded => opts = opts.env("HSA_SIM_AGENT_NAME", agent),
            }
            let d = Daemon::start(opts);
            let mut s = Session::open(d.connect().await, "sysfs").await.unwrap();
            let i = info(&mut s).await;
            assert_eq!(
                (i.agent_name.as_str(), i.generation.as_str()),
                ("aie2", generation)
            );
            assert!(
                i.generation_source.starts_with("sysfs ")
                    && i.generation_source
                        .ends_with(&format!("accel0/device/device = {id}")),
                "{}",
                i.generation_source
            );
            let (p, mut a, b) = vsa(&mut s, 2).await;
            a.map.fill_i32(40).unwrap();
            s.dispatch(p, &[a.id, b.id]).await.unwrap();
            assert!(b.map.i32s().unwrap().iter().all(|v| *v == 42));
        }
    }
}

/// Where the name is specific, it decides, and sysfs is not needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_specific_agent_name_decides_the_generation() {
    let empty = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        Options::default()
            .profile("rocr-late-2025", Runtime::Linked)
            .arg("--sysfs-root")
            .arg(empty.path().to_str().unwrap()),
    );
    let mut s = Session::open(d.connect().await, "name").await.unwrap();
    let i = info(&mut s).await;
    assert_eq!(
        (i.generation.as_str(), i.generation_source.as_str()),
        ("npu2", "agent name aie2p")
    );
}

/// On the runtimes that abort the process from the queue's error path, a faulting program
/// kills the daemon. Restarted as systemd's `Restart=on-failure` would, on the same state
/// directory, the daemon suspects those bytes (the in-flight record says it died running them,
/// which alone is no evidence: any death leaves the record) and runs them once more; that kills
/// it again, and the next start refuses them (the same program on the device at two deaths in a
/// row), and other clients reconnect and work: one bad program is not a crash loop.
async fn a_fault_that_kills_the_daemon(profile: &str, runtime: Runtime) {
    use std::os::unix::process::ExitStatusExt;
    let mut d = start(profile, runtime);

    let mut good = Session::open(d.connect().await, "innocent").await.unwrap();
    let (p, mut a, b) = vsa(&mut good, 1).await;
    a.map.fill_i32(1).unwrap();
    good.dispatch(p, &[a.id, b.id]).await.unwrap();

    let mut bad = Session::open(d.connect().await, "faulting").await.unwrap();
    let fault = EmuDesign::fault(N * 4);
    let f = bad.register(&fault).await.unwrap();
    let x = bad.alloc_mapped(BYTES).await.unwrap();
    let y = bad.alloc_mapped(BYTES).await.unwrap();
    let e = bad
        .dispatch(f.program_id, &[x.id, y.id])
        .await
        .expect_err("the daemon dies during the dispatch");
    assert!(
        matches!(
            e.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal
        ),
        "{e:?}"
    );
    let status = d
        .wait_exit(std::time::Duration::from_secs(20))
        .expect("the runtime aborted the daemon");
    assert_eq!(
        status.signal(),
        Some(6),
        "{status:?}: SIGABRT\n{}",
        d.stderr()
    );
    assert!(d.stderr().contains(profile), "{}", d.stderr());

    // One death: the program is a suspect, and runs again (into the same abort).
    d.restart();
    let mut bad = Session::open(d.connect().await, "faulting, once more")
        .await
        .unwrap();
    let f2 = bad.register(&fault).await.unwrap();
    assert_eq!(f2.content_hash, f.content_hash);
    let x = bad.alloc_mapped(BYTES).await.unwrap();
    let y = bad.alloc_mapped(BYTES).await.unwrap();
    bad.dispatch(f2.program_id, &[x.id, y.id])
        .await
        .expect_err("the daemon dies during the dispatch again");
    let status = d
        .wait_exit(std::time::Duration::from_secs(20))
        .expect("the runtime aborted the daemon again");
    assert_eq!(status.signal(), Some(6), "{status:?}\n{}", d.stderr());

    d.restart();
    let mut again = Session::open(d.connect().await, "faulting again")
        .await
        .unwrap();
    let e = again.register(&fault).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    for says in [
        f.content_hash.as_str(),
        "the daemon died while it ran on the device",
        "npuctl programs --clear-quarantine",
    ] {
        assert!(e.message().contains(says), "{says}: {}", e.message());
    }

    // The innocent client's session died with the daemon; it reconnects and works again.
    let mut good = Session::open(d.connect().await, "innocent, reconnected")
        .await
        .unwrap();
    let (p, mut a, b) = vsa(&mut good, 1).await;
    a.map.fill_i32(9).unwrap();
    good.dispatch(p, &[a.id, b.id]).await.unwrap();
    assert!(b.map.i32s().unwrap().iter().all(|v| *v == 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_on_rocr_late_2025_kills_the_daemon_twice_not_in_a_loop() {
    a_fault_that_kills_the_daemon("rocr-late-2025", Runtime::Linked).await;
    a_fault_that_kills_the_daemon("rocr-late-2025", Runtime::Loaded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_on_rocr_g2_2026_05_kills_the_daemon_twice_not_in_a_loop() {
    a_fault_that_kills_the_daemon("rocr-g2-2026-05", Runtime::Linked).await;
    a_fault_that_kills_the_daemon("rocr-g2-2026-05", Runtime::Loaded).await;
}
