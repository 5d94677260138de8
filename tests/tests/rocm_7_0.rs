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
    start_with(runtime, sysfs, &[])
}

/// As [`start`], with `NPUD_*`/`HSA_SIM_*` variables (`HSA_SIM_COMMAND_DELAY_MS` makes every
/// command of the emulated runtime take at least that long).
fn start_with(runtime: Runtime, sysfs: &tempfile::TempDir, env: &[(&str, &str)]) -> Daemon {
    let mut o = Options::default()
        .profile("rocm-7.0", runtime)
        .arg("--sysfs-root")
        .arg(sysfs.path().to_str().unwrap());
    for (k, v) in env {
        o = o.env(k, v);
    }
    // `NPUD_ROCM70_RUNTIME_PER_QUEUE=false` in the test's environment runs every test of this
    // file with the risk accepted (queues recreated in one runtime): how the tests were seen
    // to fail without a runtime per queue.
    if let Ok(v) = std::env::var("ROCM70_TESTS_RUNTIME_PER_QUEUE") {
        o = o.env("NPUD_ROCM70_RUNTIME_PER_QUEUE", &v);
    }
    Daemon::start(o)
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
        "a runtime of its own",
        "a fault inside a batch",
        "outcome unknown",
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

/// Outputs of dispatches, judged against their sentinels: ran (the output changed), right (it
/// holds what the dispatch computes), reported done (npud answered OK); and which dispatches
/// (numbered from 1) npud reported done whose output was untouched (dropped) or another's
/// (wrong), the two ways ROCR 7.0 fails silently.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Tally {
    dispatches: u32,
    ran: u32,
    right: u32,
    done: u32,
    dropped_but_done: Vec<u32>,
    wrong_but_done: Vec<u32>,
}

impl Tally {
    fn judge(&mut self, got: &[i32], want: &[i32], done: bool) {
        self.dispatches += 1;
        let ran = got.iter().any(|&v| v != i32::MIN);
        let right = got == want;
        self.ran += u32::from(ran);
        self.right += u32::from(right);
        self.done += u32::from(done);
        if done && !ran {
            self.dropped_but_done.push(self.dispatches);
        } else if done && !right {
            self.wrong_but_done.push(self.dispatches);
        }
    }

    /// No dispatch reported done whose output is not right, and every one right.
    fn all_right(&self, what: &str) {
        let first = |v: &[u32]| {
            let shown: Vec<String> = v.iter().take(8).map(|n| format!("#{n}")).collect();
            format!(
                "{}{}",
                shown.join(", "),
                if v.len() > 8 { ", ..." } else { "" }
            )
        };
        assert_eq!(
            (self.ran, self.right, self.done),
            (self.dispatches, self.dispatches, self.dispatches),
            "{what}: ran / right / reported done of {} dispatches; dropped but reported done: {} \
             ({}); another kernel's output but reported done: {} ({})",
            self.dispatches,
            self.dropped_but_done.len(),
            first(&self.dropped_but_done),
            self.wrong_but_done.len(),
            first(&self.wrong_but_done),
        );
    }
}

/// A session's add-`k` programs (`ks`), and its tensors a (input) and b (output).
struct Work {
    s: Session,
    programs: Vec<(u64, i32)>,
    a: npud_e2e::Mapped,
    b: npud_e2e::Mapped,
}

impl Work {
    async fn open(d: &Daemon, name: &str, ks: &[i32]) -> Self {
        let mut s = Session::open(d.connect().await, name).await.unwrap();
        let mut programs = Vec::new();
        for &k in ks {
            let design = EmuDesign::vector_scalar_add(N, DType::I32, i64::from(k));
            programs.push((s.register(&design).await.unwrap().program_id, k));
        }
        let a = s.alloc_mapped(BYTES).await.unwrap();
        let b = s.alloc_mapped(BYTES).await.unwrap();
        Self { s, programs, a, b }
    }

    /// Dispatches program `i` on an input of `base..`, the output filled with a sentinel.
    async fn run(&mut self, i: usize, base: i32, t: &mut Tally) -> Result<(), tonic::Status> {
        let (id, k) = self.programs[i];
        let input: Vec<i32> = (0..N as i32).map(|j| base + j).collect();
        self.a.map.set_i32s(&input).unwrap();
        self.b.map.fill_i32(i32::MIN).unwrap();
        let r = self.s.dispatch(id, &[self.a.id, self.b.id]).await;
        let want: Vec<i32> = input.iter().map(|v| v + k).collect();
        t.judge(&self.b.map.i32s().unwrap(), &want, r.is_ok());
        r.map(|_| ())
    }

    async fn close(mut self) {
        self.s
            .client
            .close_session(self.s.req(pb::CloseSessionRequest {}))
            .await
            .unwrap();
    }
}

/// `sessions` sessions of `per_session` dispatches cycling through `ks`, one after another.
async fn sessions(d: &Daemon, sessions: usize, per_session: usize, ks: &[i32]) -> Tally {
    let mut t = Tally::default();
    for n in 0..sessions {
        let mut w = Work::open(d, &format!("session {n}"), ks).await;
        for j in 0..per_session {
            let base = i32::try_from(n * 100_000 + j * 10).unwrap();
            w.run(j % ks.len(), base, &mut t)
                .await
                .unwrap_or_else(|e| panic!("session {n}, dispatch {j}: {e:?}\n{}", d.stderr()));
        }
        w.close().await;
    }
    t
}

// The table of `reference/rocm70-observed.md` and issue 37, each scenario on the emulated
// ROCm 7.0 with the daemon's default configuration. Before a runtime per queue each of these
// dropped dispatches (or ran the other program's kernel) and reported them done.
//
// Each runs on the emulator loaded as `libhsa-runtime64.so` (`Runtime::Loaded`), the library
// this tree builds, so that the scenario judges whatever daemon binary sits in target/ against
// this tree's model of ROCR 7.0. Linked in (`--backend emulator`), the daemon brings its own
// copy of hsa-sim: a daemon built before the model followed ROCR's SubmitCmdChain (main at
// fd69c79) passed six of these scenarios on its own older model while it fails them on the
// real ROCR 7.0. Loaded, that daemon fails each with the counts it has over the real ROCR 7.0
// and the driver model, all reported done: 8 of 10 one-dispatch sessions ran; 17 of the first
// 100 in 20 sessions of 5 alternating two programs; 68, 64 and 0 of 70 after an earlier run;
// #129 and #130 of 200 dropped; 78 of 80 across 40 programs ran; 564 of 600 alternating two
// programs ran, 519 right; 270 of 2,000 across four programs and ten sessions ran, 269 right;
// the second of four chains dropped.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_one_dispatch_sessions_are_all_right() {
    let root = sysfs("0x17f0");
    let d = start(Runtime::Loaded, &root);
    sessions(&d, 10, 1, &[1])
        .await
        .all_right("10 sessions of 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sessions_of_five_alternating_two_programs_twice_are_all_right() {
    let root = sysfs("0x17f0");
    let d = start(Runtime::Loaded, &root);
    for round in 0..2 {
        sessions(&d, 20, 5, &[1, 2])
            .await
            .all_right(&format!("round {round}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_times_seventy_after_an_earlier_run_are_all_right() {
    let root = sysfs("0x17f0");
    let d = start(Runtime::Loaded, &root);
    sessions(&d, 1, 1, &[1]).await.all_right("the earlier run");
    for round in 0..4 {
        sessions(&d, 1, 70, &[1])
            .await
            .all_right(&format!("70 in session {round}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_dispatches_of_one_program_are_all_right() {
    let root = sysfs("0x17f0");
    let d = start(Runtime::Loaded, &root);
    sessions(&d, 1, 200, &[1])
        .await
        .all_right("200 of one program");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_programs_twice_are_all_right() {
    let root = sysfs("0x17f0");
    let d = start(Runtime::Loaded, &root);
    let ks: Vec<i32> = (1..=40).collect();
    sessions(&d, 1, 80, &ks).await.all_right("40 programs x 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_dispatches_alternating_two_programs_are_all_right() {
    let root = sysfs("0x17f0");
    let d = start(Runtime::Loaded, &root);
    sessions(&d, 1, 600, &[1, 1000])
        .await
        .all_right("600 alternating");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_dispatches_of_four_programs_across_ten_sessions_are_all_right() {
    // Past several wraps of the driver's 255 hardware-context ids (a context per doorbell).
    let root = sysfs("0x17f0");
    let d = start(Runtime::Loaded, &root);
    sessions(&d, 10, 200, &[1, 10, 100, 1000])
        .await
        .all_right("2,000 of four programs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_after_three_chains_is_right() {
    let root = sysfs("0x17f0");
    let d = start(Runtime::Loaded, &root);
    for n in 0..4 {
        let mut w = Work::open(&d, &format!("chains {n}"), &[1, 2, 3, 4]).await;
        let c = w.s.alloc_mapped(BYTES).await.unwrap();
        let input: Vec<i32> = (0..N as i32).map(|j| j * 3 + n).collect();
        w.a.map.set_i32s(&input).unwrap();
        w.b.map.fill_i32(i32::MIN).unwrap();
        let mut c = c;
        c.map.fill_i32(i32::MIN).unwrap();
        let p = |i: usize| w.programs[i].0;
        let r =
            w.s.chain(vec![
                dispatch_request(p(0), &[w.a.id, w.b.id]),
                dispatch_request(p(1), &[w.b.id, c.id]),
                dispatch_request(p(2), &[c.id, w.b.id]),
                dispatch_request(p(3), &[w.b.id, c.id]),
            ])
            .await
            .unwrap();
        assert_eq!(r.completed, 4, "chain {n}: {r:?}");
        let want: Vec<i32> = input.iter().map(|v| v + 10).collect();
        same(&c.map.i32s().unwrap(), &want, &format!("chain {n}"));
        w.close().await;
    }
}

/// A correct kernel slower than ROCR 7.0's 50 ms wait, or a loaded host that makes a doorbell
/// take that long, is "outcome unknown" (UNKNOWN), never a device fault: four in a row (the
/// default fault budget is 3 in 60 s) quarantine nothing and cool nobody down, and the next
/// dispatch, once the doorbells are fast again, runs.
async fn slow_doorbells_are_outcome_unknown_never_faults(delay_ms: &str) {
    let root = sysfs("0x17f0");
    let d = start_with(
        Runtime::Loaded,
        &root,
        &[("HSA_SIM_COMMAND_DELAY_MS", delay_ms)],
    );
    let mut w = Work::open(&d, "slow", &[1]).await;
    let mut t = Tally::default();
    for j in 0..4 {
        let e = w
            .run(0, j * 10, &mut t)
            .await
            .expect_err("a doorbell past 50 ms is not reported done");
        assert_eq!(e.code(), tonic::Code::Unknown, "{e:?}");
        assert!(e.message().starts_with("outcome unknown"), "{e:?}");
    }
    assert_eq!(t.done, 0);
    let st = w.s.statistics().await.unwrap();
    assert_eq!(st.device_faults, 0, "{st:?}");
    assert!(st.programs.iter().all(|p| !p.quarantined), "{st:?}");
    // Not cooled down: the session may still register and dispatch.
    let design = EmuDesign::vector_scalar_add(N, DType::I32, 5);
    w.s.register(&design).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_80_ms_kernel_is_outcome_unknown_never_a_fault() {
    slow_doorbells_are_outcome_unknown_never_faults("80").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_host_s_slow_doorbells_are_outcome_unknown_never_faults() {
    // A healthy kernel whose doorbell the host made take 55 ms.
    slow_doorbells_are_outcome_unknown_never_faults("55").await;
}

/// The descriptors of npud (`pid`) open on an NPU device node.
fn accel_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("/dev/accel/"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// ROCR 7.0 never closes its `/dev/accel/accel0` descriptor at `hsa_shut_down`, and npud shuts
/// the runtime down every 64 dispatches at most: left alone, a daemon runs out of descriptors
/// after some two million dispatches. Here npud runs in a mount namespace of its own whose
/// `/dev` (a tmpfs holding the few nodes a process needs) has an `accel/accel0`, which the
/// emulator opens in `hsa_init` and leaves open as ROCR 7.0 does: after 300 dispatches across
/// four queues, one descriptor of it is open (the live runtime's), not one per runtime.
#[cfg_attr(not(as_root), ignore = "needs root for a mount namespace")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_descriptors_shut_down_runtimes_leave_open_are_closed() {
    const SETUP: &str = r#"set -e
d=$(mktemp -d)
mkdir "$d/dev"
mount --bind /dev "$d/dev"
mount -t tmpfs -o mode=755 npud-test-dev /dev
for n in null zero full random urandom; do
    touch "/dev/$n"
    mount --bind "$d/dev/$n" "/dev/$n"
done
mkdir /dev/accel
: > /dev/accel/accel0
umount -l "$d/dev"
rmdir "$d/dev" "$d"
exec "$@""#;
    let root = sysfs("0x17f0");
    let program = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        SETUP,
        "sh",
    ]
    .iter()
    .map(std::ffi::OsString::from)
    .chain(std::iter::once(npud_e2e::binary("npud").into_os_string()))
    .collect();
    let d = Daemon::start(Options {
        program: Some(program),
        ..Options::default()
            .profile("rocm-7.0", Runtime::Linked)
            .arg("--sysfs-root")
            .arg(root.path().to_str().unwrap())
    });
    let pid = d.pid().expect("the daemon's pid");
    assert_eq!(accel_fds(pid), 1, "the first runtime's descriptor");
    let mut s = Session::open(d.connect().await, "descriptors")
        .await
        .unwrap();
    let p = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let mut a = s.alloc_mapped(BYTES).await.unwrap();
    let mut b = s.alloc_mapped(BYTES).await.unwrap();
    for i in 0..300 {
        let input: Vec<i32> = (0..N as i32).map(|j| i * 7 + j).collect();
        a.map.set_i32s(&input).unwrap();
        b.map.fill_i32(i32::MIN).unwrap();
        s.dispatch(p, &[a.id, b.id])
            .await
            .unwrap_or_else(|e| panic!("dispatch {i}: {e:?}"));
        let want: Vec<i32> = input.iter().map(|v| v + 1).collect();
        same(&b.map.i32s().unwrap(), &want, &format!("dispatch {i}"));
    }
    let status = std::process::Command::new(npuctl_binary())
        .args(["--addr", d.socket.to_str().unwrap(), "status"])
        .output()
        .unwrap();
    let status = format!(
        "{}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    assert_eq!(
        accel_fds(pid),
        1,
        "descriptors of /dev/accel/accel0 after 300 dispatches; npuctl status:\n{status}"
    );
}
