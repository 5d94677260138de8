//! The device-fault budget: each fault (a failure or a hang) charges the session and its uid;
//! a uid past `limits.fault_budget` faults within the window may not register programs or
//! dispatch until its cool-down ends, and the refusal says for how long. Changing one word of a
//! hanging design (new bytes, so no quarantine applies) no longer lets one user stall everyone
//! again and again. The callers here are pods: token identities over the Unix socket, under a
//! policy that serves only tokens (so the uid the test's process runs as, which every caller
//! of one process shares, is not charged; `principal.rs` checks that it is where bare uids
//! are served).

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::tokens::{TokenDir, secret};
use npud_e2e::{Daemon, I32Copies, Options, Session, bytes_i32, i32_bytes};
use tonic::Code;

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;

/// Token identities, one file each, and a policy that serves only them; `token:culprit` is an
/// admin.
struct Pods {
    tokens: TokenDir,
}

impl Pods {
    fn new(names: &[&str]) -> Pods {
        let tokens = TokenDir::new(names);
        std::fs::write(
            tokens.scratch().join("npud.toml"),
            format!(
                "[auth]\ntoken_dir = {:?}\nadmins = [\"token:culprit*\"]\n\
                 [[auth.rules]]\nname = \"pods\"\nmatch = [\"token:*\"]\n",
                tokens.path().display().to_string()
            ),
        )
        .unwrap();
        Pods { tokens }
    }

    fn config(&self) -> String {
        self.tokens
            .scratch()
            .join("npud.toml")
            .display()
            .to_string()
    }
}

/// A session of token identity `name`, over the Unix socket.
async fn pod_session(d: &Daemon, name: &str) -> Session {
    Session::open_as(d.connect().await, name, Some(&secret(name)))
        .await
        .unwrap()
}

fn budget(pods: &Pods, n: u32, window_ms: u64, cooldown_ms: u64) -> Options {
    Options::default()
        .arg("--config")
        .arg(&pods.config())
        .env("NPUD_LIMITS__FAULT_BUDGET", &n.to_string())
        .env("NPUD_LIMITS__FAULT_WINDOW_MS", &window_ms.to_string())
        .env("NPUD_LIMITS__FAULT_COOLDOWN_MS", &cooldown_ms.to_string())
        .arg("--emulator-timeout-ms")
        .arg("300")
}

async fn tensor(s: &mut Session, values: Option<&[i32]>) -> u64 {
    let req = s.req(pb::AllocateTensorRequest {
        size_bytes: BYTES,
        name: String::new(),
    });
    let id = s
        .client
        .allocate_tensor(req)
        .await
        .unwrap()
        .into_inner()
        .tensor_id;
    if let Some(v) = values {
        let req = s.req(tokio_stream::iter(vec![pb::WriteTensorChunk {
            tensor_id: id,
            offset: 0,
            data: i32_bytes(v),
        }]));
        s.client.write_tensor(req).await.unwrap();
    }
    id
}

async fn read(s: &mut Session, tensor: u64) -> Vec<i32> {
    let req = s.req(pb::ReadTensorRequest {
        tensor_id: tensor,
        offset: 0,
        length: BYTES,
        chunk_bytes: 0,
    });
    let mut stream = s.client.read_tensor(req).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(c) = stream.message().await.unwrap() {
        out.extend_from_slice(&c.data);
    }
    bytes_i32(&out)
}

/// A design that faults (`hang` false) or hangs, made distinct by `word`: the same kernel over a
/// different length, as a client changing one word of its design would send.
fn culprit_design(hang: bool, word: u32) -> EmuDesign {
    let n = N - 8 * word;
    if hang {
        EmuDesign::hang(n * 4)
    } else {
        EmuDesign::fault(n * 4)
    }
}

/// The time left that a cool-down refusal names ("... for another 1.4 s ...").
fn seconds_left(msg: &str) -> f64 {
    let rest = msg
        .split("for another ")
        .nth(1)
        .unwrap_or_else(|| panic!("no time left in {msg:?}"));
    rest.split(' ').next().unwrap().parse().unwrap()
}

async fn session_faults(s: &mut Session) -> u64 {
    let id = s.id;
    let stats = s.statistics().await.unwrap();
    stats
        .sessions
        .iter()
        .find(|x| x.session_id == id)
        .map(|x| x.device_faults)
        .unwrap()
}

async fn an_identity_past_its_fault_budget_is_cooled_down_and_no_one_else_is_probe() {
    const BUDGET: u32 = 2;
    let pods = Pods::new(&["culprit", "other"]);
    let d = Daemon::start(budget(&pods, BUDGET, 2000, 3000));
    let mut culprit = pod_session(&d, "culprit").await;
    let mut same_uid = pod_session(&d, "culprit").await;
    let mut remote = pod_session(&d, "other").await;
    let good = EmuDesign::vector_scalar_add(N, DType::I32, 1);
    let good_id = culprit.register(&good).await.unwrap().program_id;
    let input: Vec<i32> = (0..N as i32).collect();
    let (a, b) = (
        tensor(&mut culprit, Some(&input)).await,
        tensor(&mut culprit, None).await,
    );

    // BUDGET faults, one a failure and one a hang, each from new bytes.
    for (k, hang) in [false, true].into_iter().enumerate() {
        let design = culprit_design(hang, u32::try_from(k).unwrap());
        let reg = culprit.register(&design).await.unwrap();
        let e = culprit.dispatch(reg.program_id, &[a, b]).await.unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{e:?}");
    }
    assert_eq!(session_faults(&mut culprit).await, u64::from(BUDGET));

    // Fault BUDGET + 1 cannot happen: new programs and dispatches are refused, with the time
    // left, for every session of the identity.
    let e = culprit
        .register(&culprit_design(true, 7))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message()
            .contains("faulted the device 2 times within 2 s")
            && e.message()
                .contains("may not register programs for another"),
        "{e:?}"
    );
    let left = seconds_left(e.message());
    assert!(left > 0.0 && left <= 3.0, "{e:?}");
    let e = culprit.dispatch(good_id, &[a, b]).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("may not dispatch for another"),
        "{e:?}"
    );
    let e = same_uid.register(&good).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");

    // Another identity is not affected.
    let rid = remote.register(&good).await.unwrap().program_id;
    let (ra, rb) = (
        tensor(&mut remote, Some(&input)).await,
        tensor(&mut remote, None).await,
    );
    remote.dispatch(rid, &[ra, rb]).await.unwrap();
    assert_eq!(read(&mut remote, rb).await[..3], [1, 2, 3]);
    assert_eq!(session_faults(&mut remote).await, 0);

    // After the cool-down the identity works again.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match culprit.dispatch(good_id, &[a, b]).await {
            Ok(_) => break,
            Err(e) if e.code() == Code::ResourceExhausted => {
                assert!(Instant::now() < until, "the cool-down never ended: {e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(read(&mut culprit, b).await[..3], [1, 2, 3]);
    same_uid.register(&good).await.unwrap();
}

async fn faults_and_hangs_hit_only_the_culprit_probe() {
    const BUDGET: u32 = 3;
    let pods = Pods::new(&["culprit", "innocent"]);
    let d = Daemon::start(budget(&pods, BUDGET, 600_000, 600_000));
    let mut culprit = pod_session(&d, "culprit").await;
    let (ca, cb) = (
        tensor(&mut culprit, None).await,
        tensor(&mut culprit, None).await,
    );
    let mut innocent = pod_session(&d, "innocent").await;
    let add = innocent
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 5))
        .await
        .unwrap()
        .program_id;
    let (ia, ib) = (
        tensor(&mut innocent, None).await,
        tensor(&mut innocent, None).await,
    );

    // The innocent client dispatches and checks every result, retrying only UNAVAILABLE (the
    // device recovering), while the culprit faults and hangs until it is cut off.
    let mut inn = innocent.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let worker = tokio::spawn(async move {
        let mut done = 0u32;
        let mut seed = 0i32;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) || done < 10 {
            seed += 1;
            let input: Vec<i32> = (0..N as i32).map(|x| x * seed).collect();
            let req = inn.req(tokio_stream::iter(vec![pb::WriteTensorChunk {
                tensor_id: ia,
                offset: 0,
                data: i32_bytes(&input),
            }]));
            inn.client.write_tensor(req).await.unwrap();
            loop {
                match inn.dispatch(add, &[ia, ib]).await {
                    Ok(_) => break,
                    Err(e) if e.code() == Code::Unavailable => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => panic!("the innocent client's dispatch failed: {e:?}"),
                }
            }
            let out = read(&mut inn, ib).await;
            let want: Vec<i32> = input.iter().map(|x| x + 5).collect();
            assert_eq!(out, want, "dispatch {seed}");
            done += 1;
        }
        done
    });

    let mut codes = Vec::new();
    for k in 0..BUDGET + 2 {
        let design = culprit_design(k % 2 == 1, k);
        let r = match culprit.register(&design).await {
            Ok(reg) => culprit
                .dispatch(reg.program_id, &[ca, cb])
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        codes.push(r.unwrap_err().code());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let done = worker.await.unwrap();
    assert!(done >= 10);
    assert_eq!(
        codes,
        [
            Code::Internal,
            Code::Internal,
            Code::Internal,
            Code::ResourceExhausted,
            Code::ResourceExhausted
        ]
    );
    // The innocent client sees only its own session; the culprit (an admin here) sees both.
    let own = innocent.statistics().await.unwrap();
    assert_eq!(own.device_faults, u64::from(BUDGET));
    assert_eq!(own.sessions.len(), 1);
    assert!(
        own.sessions[0].identity.starts_with("token:innocent"),
        "{:?}",
        own.sessions[0]
    );
    let stats = culprit.statistics().await.unwrap();
    let faults = |id: u64| {
        stats
            .sessions
            .iter()
            .find(|x| x.session_id == id)
            .unwrap()
            .device_faults
    };
    assert_eq!((faults(culprit.id), faults(innocent.id)), (3, 0));
}

/// A refusal is not a fault. A FullElf kernel dispatched with one argument too many is a packet
/// the runtime refuses before it runs anything (`INVALID_PACKET_FORMAT`): admission now refuses
/// it, the error says how many the kernel takes, nothing is quarantined (programs are shared by
/// content hash: one caller's mistake would refuse them to everyone) and no fault is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_elf_dispatch_with_one_argument_too_many_is_a_refusal_not_a_device_fault() {
    let d = Daemon::start(Options::default().profile("kernel-object", npud_e2e::Runtime::Linked));
    let mut s = Session::open(d.connect().await, "one too many")
        .await
        .unwrap();
    let design = EmuDesign::vector_scalar_add(N, DType::I32, 2);
    let hsaco = design.to_full_elf_hsaco().unwrap();
    let reg = s.register_hsaco(hsaco.clone(), "", "fe").await.unwrap();
    let mut a = s.alloc_mapped(BYTES).await.unwrap();
    let b = s.alloc_mapped(BYTES).await.unwrap();
    let c = s.alloc_mapped(BYTES).await.unwrap();
    for _ in 0..3 {
        let e = s
            .dispatch(reg.program_id, &[a.id, b.id, c.id])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(&format!(
                "program {} (fe) is a FullElf kernel that takes exactly 2 buffer arguments; 3 \
                 given",
                reg.program_id
            )),
            "{}",
            e.message()
        );
    }
    let stats = s.statistics().await.unwrap();
    assert_eq!(stats.device_faults, 0);
    assert_eq!(session_faults(&mut s).await, 0);
    // The program runs for this caller and registers for another.
    a.map.fill_i32(40).unwrap();
    s.dispatch(reg.program_id, &[a.id, b.id]).await.unwrap();
    assert!(b.map.i32s().unwrap().iter().all(|v| *v == 42));
    let mut other = Session::open(d.connect().await, "other").await.unwrap();
    let again = other.register_hsaco(hsaco, "", "fe").await.unwrap();
    assert_eq!(again.content_hash, reg.content_hash);
}

// ---------------------------------------------------------------------------------------------
// The same probes on fast-path sessions: every `Session` of the test (and of the client
// processes it starts) dispatches through its dispatch ring (`npud_e2e::ring`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_past_its_fault_budget_is_cooled_down_and_no_one_else_is() {
    an_identity_past_its_fault_budget_is_cooled_down_and_no_one_else_is_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_past_its_fault_budget_is_cooled_down_and_no_one_else_is_on_the_fast_path() {
    npud_e2e::ring::dispatch_through_rings();
    an_identity_past_its_fault_budget_is_cooled_down_and_no_one_else_is_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_and_hangs_hit_only_the_culprit() {
    faults_and_hangs_hit_only_the_culprit_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_and_hangs_hit_only_the_culprit_on_the_fast_path() {
    npud_e2e::ring::dispatch_through_rings();
    faults_and_hangs_hit_only_the_culprit_probe().await;
}
