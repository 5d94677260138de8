//! npud on ROCm 7.0 as that runtime really behaves (hsa-sim's `rocm-7.0` profile, which drops
//! work silently where ROCR 7.0 does: `reference/rocm70-observed.md`), with the daemon's
//! default configuration, reached both ways: linked in (`--backend emulator`) and loaded as
//! `libhsa-runtime64.so` (`--backend hsa`). Only the generation is given, through a stand-in
//! sysfs, since ROCm 7.0 names every NPU `aie2`.
//!
//! A thousand dispatches and chains of the demo's kind of work (vector_scalar_add over 1024
//! i32) run across queue re-creations (G1a's ring never wraps: a queue lives 64 packets),
//! program evictions (18 programs used round-robin against the default cache of 16) and
//! session ends (each session's programs are unloaded with it, and the next session's load
//! at the same heap addresses): every output is right, which it is not when a dispatch is
//! dropped and counted as done.

#![forbid(unsafe_code)]

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, I32Copies, Options, Runtime, Session, dispatch_request, npuctl_binary};

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;
/// More programs than the default `limits.max_cached_programs` (16): using them round-robin
/// evicts one at almost every dispatch once all are loaded.
const PROGRAMS: usize = 18;
const SESSIONS: usize = 5;
/// Dispatches per session, chain links counted one each: 5 × 200 = 1000.
const PER_SESSION: usize = 200;
/// Every this many steps a step is a chain of two links instead of one dispatch.
const CHAIN_EVERY: usize = 10;

/// A stand-in sysfs with one AMD NPU of PCI id `device`.
fn sysfs(device: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("class/accel/accel0/device");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("vendor"), "0x1022\n").unwrap();
    std::fs::write(dir.join("device"), format!("{device}\n")).unwrap();
    root
}

fn start(runtime: Runtime, sysfs: &tempfile::TempDir) -> Daemon {
    Daemon::start(
        Options::default()
            .profile("rocm-7.0", runtime)
            .arg("--sysfs-root")
            .arg(sysfs.path().to_str().unwrap()),
    )
}

/// Compares tensors, naming the first element that differs.
fn same(got: &[i32], want: &[i32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{what}: element {i} is {} where {} was expected (a dispatch that did not run \
             was counted as done)",
            got[i], want[i]
        );
    }
}

async fn a_thousand_dispatches(runtime: Runtime) {
    let root = sysfs("0x17f0");
    let d = start(runtime, &root);
    let mut done = 0usize;
    let mut reloads = 0u64;
    for session in 0..SESSIONS {
        let mut s = Session::open(d.connect().await, &format!("rocm-7.0 session {session}"))
            .await
            .unwrap();
        if session == 0 {
            let i = s
                .client
                .get_device_info(pb::GetDeviceInfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(i.packet_abi, "g1a", "{i:?}");
            assert!(
                i.packet_abi_source.contains("ROCm 7.0 (G1a)"),
                "auto proved it: {}",
                i.packet_abi_source
            );
            assert_eq!(i.generation, "npu2");
            assert!(i.generation_source.starts_with("sysfs "), "{i:?}");
        }
        let mut programs = Vec::new();
        for k in 1..=PROGRAMS {
            let design = EmuDesign::vector_scalar_add(N, DType::I32, i64::try_from(k).unwrap());
            programs.push(s.register(&design).await.unwrap().program_id);
        }
        let mut a = s.alloc_mapped(BYTES).await.unwrap();
        let mut b = s.alloc_mapped(BYTES).await.unwrap();
        let mut c = s.alloc_mapped(BYTES).await.unwrap();
        let mut ran = 0;
        let mut step = 0usize;
        while ran < PER_SESSION {
            let k = (step + session * 7) % PROGRAMS;
            let base = i32::try_from(session * 100_000 + step * 10).unwrap();
            let input: Vec<i32> = (0..N as i32).map(|j| base + j).collect();
            a.map.set_i32s(&input).unwrap();
            // Outputs the step must overwrite: a stale value cannot pass.
            b.map.fill_i32(i32::MIN).unwrap();
            c.map.fill_i32(i32::MIN).unwrap();
            let plus = |n: usize| {
                let n = i32::try_from(n).unwrap();
                input.iter().map(|v| v + n).collect::<Vec<i32>>()
            };
            let what = format!("session {session}, step {step}");
            if step % CHAIN_EVERY == CHAIN_EVERY - 1 && ran + 2 <= PER_SESSION {
                let k2 = (k + 5) % PROGRAMS;
                s.chain(vec![
                    dispatch_request(programs[k], &[a.id, b.id]),
                    dispatch_request(programs[k2], &[b.id, c.id]),
                ])
                .await
                .unwrap_or_else(|e| panic!("{what}: {e:?}\n{}", d.stderr()));
                same(&c.map.i32s().unwrap(), &plus(k + 1 + k2 + 1), &what);
                ran += 2;
            } else {
                s.dispatch(programs[k], &[a.id, b.id])
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e:?}\n{}", d.stderr()));
                same(&b.map.i32s().unwrap(), &plus(k + 1), &what);
                ran += 1;
            }
            step += 1;
        }
        done += ran;
        let st = s.statistics().await.unwrap();
        assert_eq!(st.device_faults, 0);
        reloads += st
            .programs
            .iter()
            .filter(|p| programs.contains(&p.program_id))
            .map(|p| p.loads.saturating_sub(1))
            .sum::<u64>();
        // The session ends: its programs go with it.
        s.client
            .close_session(s.req(pb::CloseSessionRequest {}))
            .await
            .unwrap();
    }
    assert_eq!(done, SESSIONS * PER_SESSION);
    // `npuctl status` says what this runtime costs and what to install instead.
    let out = std::process::Command::new(npuctl_binary())
        .args(["--addr"])
        .arg(format!("unix:{}", d.socket.display()))
        .arg("status")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for says in [
        "a new hardware context for every dispatch",
        "Install a newer ROCR",
    ] {
        assert!(text.contains(says), "{says}:\n{text}");
    }
    assert!(
        reloads >= 100,
        "programs were evicted and reloaded ({reloads} reloads)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_dispatches_are_right_across_queues_evictions_and_sessions_linked() {
    a_thousand_dispatches(Runtime::Linked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_dispatches_are_right_across_queues_evictions_and_sessions_loaded() {
    a_thousand_dispatches(Runtime::Loaded).await;
}

/// Where nothing the runtime shows tells its packet form (late 2025's G1b from a G1a develop
/// build), `auto` refuses to start and names the settings, on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_refuses_a_runtime_it_cannot_tell_and_names_the_setting() {
    for runtime in [Runtime::Linked, Runtime::Loaded] {
        let (status, stderr) = Daemon::try_start(
            Options::default()
                .profile("rocr-late-2025", runtime)
                .arg("--packet-abi")
                .arg("auto"),
        )
        .expect_err("npud refuses to guess");
        assert!(!status.success(), "{runtime:?}");
        for says in [
            "cannot tell which AIE packet form",
            "packet_abi = \"g1b\"",
            "packet_abi = \"g1a\"",
        ] {
            assert!(stderr.contains(says), "{runtime:?}: {says}\n{stderr}");
        }
    }
}
