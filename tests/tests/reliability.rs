//! The reliability suite: client processes SIGKILLed mid-work leak nothing, 64 sessions each
//! verify every call, faults and hangs hit only their culprit, SIGTERM under load.
//!
//! Hostile input is `hostile.rs`, fd exhaustion `quotas.rs`. Each test here is bounded to tens
//! of seconds. `soak` runs the same probes over and over for `NPUD_SOAK_SECS` (default 300) and
//! prints its figures:
//!
//! ```sh
//! NPUD_SOAK_SECS=600 cargo nextest run -p npud-e2e --test reliability --run-ignored only --no-capture
//! ```

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session, binary};
use tonic::Code;

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;

/// What a probe saw.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    /// Calls that reached the daemon (dispatches and chain links counted by it, plus the
    /// probe's own calls).
    calls: u64,
    /// Daemon exits that were not asked for.
    crashes: u64,
    /// Sessions, tensors, tensor bytes, program references or fds left behind.
    leaks: u64,
    /// Wrong values read back.
    wrong: u64,
}

impl std::ops::AddAssign for Figures {
    fn add_assign(&mut self, o: Figures) {
        self.calls += o.calls;
        self.crashes += o.crashes;
        self.leaks += o.leaks;
        self.wrong += o.wrong;
    }
}

fn options() -> Options {
    Options {
        grace_ms: 300,
        ..Options::default()
    }
    .env("NPUD_LIMITS__MAX_SESSIONS_PER_UID", "64")
    // Every client here is this uid; the culprit rounds fault on purpose, many times in the
    // soak, and what they check is isolation, not the fault budget (tests/tests/faults.rs).
    .env("NPUD_LIMITS__FAULT_BUDGET", "1000000")
}

/// What the daemon holds, as seen from outside: sessions, their tensors and bytes, program
/// references, open fds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    sessions: usize,
    device_info_sessions: u32,
    tensors: u64,
    tensor_bytes: u64,
    references: u64,
    programs: usize,
    fds: usize,
}

async fn held(d: &Daemon, keeper: &mut Session) -> Held {
    let st = keeper.statistics().await.unwrap();
    let info = keeper
        .client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    Held {
        sessions: st.sessions.len(),
        device_info_sessions: info.sessions,
        tensors: st.sessions.iter().map(|s| u64::from(s.tensors)).sum(),
        tensor_bytes: st.sessions.iter().map(|s| s.tensor_bytes).sum(),
        references: st.programs.iter().map(|p| u64::from(p.references)).sum(),
        programs: st.programs.len(),
        fds: d.open_fds(),
    }
}

/// Dispatches (chain links count one each) the daemon has counted over the keeper's programs.
async fn dispatches(keeper: &mut Session) -> u64 {
    let st = keeper.statistics().await.unwrap();
    st.programs
        .iter()
        .filter_map(|p| p.dispatches.as_ref())
        .map(|d| d.success.map_or(0, |x| x.count) + d.fail.map_or(0, |x| x.count))
        .sum()
}

/// Polls until the daemon holds `want` again, for at most 20 s; what it holds then.
async fn settle(d: &Daemon, keeper: &mut Session, want: &Held) -> Held {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let now = held(d, keeper).await;
        if &now == want || Instant::now() > until {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A session holding the three churn programs (so their statistics outlive the clients).
async fn keeper(d: &Daemon) -> Session {
    let mut k = Session::open(d.connect().await, "keeper").await.unwrap();
    for add in 1..=3 {
        k.register(&EmuDesign::vector_scalar_add(N, DType::I32, add))
            .await
            .unwrap();
    }
    k
}

/// Starts a churn client and waits for its first checked round.
fn start_churn(d: &Daemon, seed: usize) -> Child {
    start_churn_at(&d.socket, seed)
}

/// `clients` churn processes, each SIGKILLed after its own short while of work; then, after
/// the grace period, the daemon must hold exactly what it held before.
async fn killed_clients_round(
    d: &Daemon,
    keeper: &mut Session,
    clients: usize,
    round: usize,
) -> Figures {
    let before = held(d, keeper).await;
    let calls_before = dispatches(keeper).await;
    let sock = d.socket.clone();
    let mut children = tokio::task::spawn_blocking(move || {
        (0..clients)
            .map(|i| start_churn_at(&sock, round * 1000 + i))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    // Kill them one by one, a few ms apart, so that each dies at another point of its work.
    for (i, c) in children.iter_mut().enumerate() {
        tokio::time::sleep(Duration::from_millis(((i * 7 + round * 13) % 23) as u64)).await;
        if let Ok(Some(status)) = c.try_wait() {
            panic!(
                "churn client {i} exited by itself ({status}): it saw a wrong value or a refusal"
            );
        }
        npud_e2e::signal(c, rustix::process::Signal::KILL);
    }
    for c in &mut children {
        let status = c.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "a churn client ended otherwise than by SIGKILL: {status}"
        );
    }
    let after = settle(d, keeper, &before).await;
    let calls = dispatches(keeper).await - calls_before;
    let mut f = Figures {
        calls,
        ..Figures::default()
    };
    if after != before {
        eprintln!("round {round}: held {before:?} before, {after:?} after");
        f.leaks += 1;
    }
    f
}

/// A churn client on the socket `sock`, once it has checked its first round.
fn start_churn_at(sock: &std::path::Path, seed: usize) -> Child {
    let mut child = Command::new(binary("npud-test-client"));
    if npud_e2e::ring::rings_on() {
        child.env("NPUD_E2E_RING", "1");
    }
    let mut child = child
        .arg("churn")
        .arg(sock)
        .arg(seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("churn client {seed}: no JSON line ({e}): {line:?}"));
    assert_eq!(v["working"], true, "churn client {seed}: {line}");
    child
}

/// A baseline after one client has come and gone: the programs are loaded, the runtime has
/// opened what it keeps open.
async fn warmed_up(d: &Daemon) -> Session {
    let mut k = keeper(d).await;
    let mut warm = start_churn(d, 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    npud_e2e::signal(&warm, rustix::process::Signal::KILL);
    warm.wait().unwrap();
    // Its session ends first; work it had admitted keeps its program's reference until the
    // executor answers it, a moment later.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let h = held(d, &mut k).await;
        if h.sessions == 1 && u64::try_from(h.programs) == Ok(h.references) {
            break;
        }
        assert!(
            Instant::now() < until,
            "the warm-up client's session or its references never ended: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    k
}

async fn twenty_four_client_processes_killed_mid_work_leak_nothing_probe() {
    let mut d = Daemon::start(options());
    let mut k = warmed_up(&d).await;
    let base = held(&d, &mut k).await;
    assert_eq!(
        (base.sessions, base.tensors, base.references, base.programs),
        (1, 0, 3, 3),
        "{base:?}"
    );
    let f = killed_clients_round(&d, &mut k, 24, 1).await;
    assert!(d.running(), "the daemon died: {}", d.stderr());
    assert_eq!(f.leaks, 0, "see the held figures above");
    assert!(f.calls >= 24, "each client completed a round: {f:?}");
    let after = held(&d, &mut k).await;
    assert_eq!(after, base);
    // The survivor still works.
    let p = k
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    verify_rounds(&mut k, p, 1, 3, 7).await.unwrap();
}

/// `rounds` dispatches of `program` (+`add`) on fresh tensors, each output checked.
async fn verify_rounds(
    s: &mut Session,
    program: u64,
    add: i32,
    rounds: usize,
    seed: i32,
) -> Result<u64, String> {
    let mut a = s.alloc_mapped(BYTES).await?;
    let b = s.alloc_mapped(BYTES).await?;
    for r in 0..rounds {
        let values: Vec<i32> = (0..N as i32)
            .map(|i| {
                i.wrapping_mul(seed)
                    .wrapping_add(i32::try_from(r).unwrap_or(0) * 1000 + seed)
            })
            .collect();
        a.map.write_from(0, &values).map_err(|e| e.to_string())?;
        s.dispatch(program, &[a.id, b.id])
            .await
            .map_err(|e| format!("session {} round {r}: {e}", s.id))?;
        let out = b
            .map
            .read_vec::<i32>(0, values.len())
            .map_err(|e| e.to_string())?;
        if let Some(i) = (0..values.len()).find(|&i| out[i] != values[i].wrapping_add(add)) {
            return Err(format!(
                "session {} round {r}: out[{i}] = {}, expected {}",
                s.id,
                out[i],
                values[i].wrapping_add(add)
            ));
        }
    }
    for id in [a.id, b.id] {
        s.client
            .free_tensor(s.req(pb::FreeTensorRequest { tensor_id: id }))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(rounds as u64)
}

/// Sessions up to the daemon's whole `max_sessions` (64; one uid is allowed all of them) beside
/// the `already` open, each on its own task dispatching and checking every output; one more is
/// refused.
async fn sixty_four_sessions_round(d: &Daemon, already: usize, rounds: usize) -> Figures {
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(d.connect().await);
    }
    let mut sessions = Vec::new();
    for i in 0..64 - already {
        sessions.push(
            Session::open(channels[i % 8].clone(), &format!("s{i}"))
                .await
                .unwrap_or_else(|e| panic!("session {i}: {e}")),
        );
    }
    let over = Session::open(channels[0].clone(), "65th")
        .await
        .unwrap_err();
    assert_eq!(over.code(), Code::ResourceExhausted, "{over:?}");
    let mut tasks = Vec::new();
    for (i, mut s) in sessions.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let add = i32::try_from(i % 4).unwrap_or(0) + 1;
            let p = s
                .register(&EmuDesign::vector_scalar_add(N, DType::I32, i64::from(add)))
                .await
                .map_err(|e| e.to_string())?
                .program_id;
            let seed = i32::try_from(i).unwrap_or(0) + 3;
            let n = verify_rounds(&mut s, p, add, rounds, seed).await?;
            s.client
                .close_session(s.req(pb::CloseSessionRequest {}))
                .await
                .map_err(|e| e.to_string())?;
            Ok::<u64, String>(n + 5)
        }));
    }
    let mut f = Figures::default();
    for t in tasks {
        match t.await.unwrap() {
            Ok(n) => f.calls += n,
            Err(e) => {
                eprintln!("{e}");
                f.wrong += 1;
            }
        }
    }
    f
}

async fn sixty_four_sessions_each_verify_every_call_probe() {
    let mut d = Daemon::start(options());
    let f = sixty_four_sessions_round(&d, 0, 8).await;
    assert_eq!(f.wrong, 0, "{f:?}");
    assert_eq!(f.calls, 64 * (8 + 5));
    assert!(d.running(), "{}", d.stderr());
    let info = d
        .connect()
        .await
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.sessions, 0, "every session was closed");
}

/// Innocent sessions dispatch and check their outputs while a culprit runs a faulting and a
/// hanging design: only the culprit's programs are quarantined, the innocents' outputs are all
/// right, and an innocent is at most asked to retry (UNAVAILABLE while the queue is recreated).
async fn culprit_round(d: &Daemon, round: usize) -> Figures {
    let mut culprit = Session::open(d.connect().await, "culprit").await.unwrap();
    // Distinct bytes each round: a quarantined design stays refused.
    let size = N * 4 + 64 * u32::try_from(round).unwrap_or(0);
    let fault = culprit.register(&EmuDesign::fault(size)).await.unwrap();
    let hang = culprit.register(&EmuDesign::hang(size)).await.unwrap();
    let a = culprit.alloc_mapped(u64::from(size)).await.unwrap();
    let b = culprit.alloc_mapped(u64::from(size)).await.unwrap();
    let stop = stop_flag();
    let mut innocents = Vec::new();
    for i in 0..3 {
        let mut s = Session::open(d.connect().await, &format!("innocent{i}"))
            .await
            .unwrap();
        let stop = stop.clone();
        innocents.push(tokio::spawn(async move {
            let p = s
                .register(&EmuDesign::vector_scalar_add(N, DType::I32, 2))
                .await
                .unwrap()
                .program_id;
            let (mut ok, mut retried) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || ok < 3 {
                match verify_rounds(&mut s, p, 2, 1, i + 11).await {
                    Ok(_) => ok += 1,
                    Err(e) if e.contains("Unavailable") || e.contains("recovering") => {
                        retried += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok((ok, retried, p))
        }));
    }
    let mut calls = 0;
    for (program, code) in [
        (fault.program_id, Code::Internal),
        (hang.program_id, Code::Internal),
    ] {
        let e = culprit.dispatch(program, &[a.id, b.id]).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains("quarantined"), "{e:?}");
        let again = culprit.dispatch(program, &[a.id, b.id]).await.unwrap_err();
        assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
        calls += 2;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut f = Figures::default();
    let mut innocent_programs = Vec::new();
    for t in innocents {
        match t.await.unwrap() {
            Ok((ok, retried, p)) => {
                calls += ok + retried;
                innocent_programs.push(p);
            }
            Err(e) => {
                eprintln!("an innocent session failed: {e}");
                f.wrong += 1;
            }
        }
    }
    let st = culprit.statistics().await.unwrap();
    for p in &st.programs {
        let culprits = p.program_id == fault.program_id || p.program_id == hang.program_id;
        if p.quarantined != culprits {
            eprintln!("program {} quarantined: {}", p.program_id, p.quarantined);
            f.wrong += 1;
        }
    }
    f.calls = calls;
    f
}

/// A flag the probes stop on.
fn stop_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false))
}

async fn faults_and_hangs_hit_only_the_culprit_probe() {
    let mut d = Daemon::start(options().arg("--emulator-timeout-ms").arg("300"));
    let f = culprit_round(&d, 0).await;
    assert_eq!(f.wrong, 0, "{f:?}");
    assert!(d.running(), "{}", d.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_gives_clean_errors_and_a_prompt_clean_exit() {
    let mut d = Daemon::start(options());
    let mut workers = Vec::new();
    // Workers that have finished a round: SIGTERM comes once all have, however loaded the
    // machine is.
    let running = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for i in 0..8 {
        let mut s = Session::open(d.connect().await, &format!("load{i}"))
            .await
            .unwrap();
        let p = s
            .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
            .await
            .unwrap()
            .program_id;
        let running = running.clone();
        workers.push(tokio::spawn(async move {
            let mut ok = 0u64;
            loop {
                match verify_rounds(&mut s, p, 1, 1, i + 5).await {
                    Ok(_) => {
                        ok += 1;
                        if ok == 1 {
                            running.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    Err(e) => return (ok, e),
                }
            }
        }));
    }
    let until = Instant::now() + Duration::from_secs(20);
    while running.load(std::sync::atomic::Ordering::SeqCst) < 8 {
        assert!(
            Instant::now() < until,
            "every worker finishes a round within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    d.send_signal(rustix::process::Signal::TERM);
    for w in workers {
        let (ok, e) = tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .expect("every client gets an answer within 20 s of SIGTERM")
            .unwrap();
        assert!(ok > 0, "the worker ran before SIGTERM");
        // Refused while draining (UNAVAILABLE), a call the closing connection did not take
        // (CANCELLED "connection closed", or the graceful GOAWAY with NO_ERROR, which tonic's
        // client reports as INTERNAL "h2 protocol error"), or a socket closed under it
        // (refused, reset): never a wrong value, a device error or another status.
        eprintln!("worker: {ok} rounds, then {e}");
        let clean = [
            "unavailable",
            "cancel",
            "connection refused",
            "connection reset",
            "no such file",
        ];
        let lower = e.to_lowercase();
        let graceful_goaway = lower.contains("goaway") && lower.contains("no_error");
        assert!(
            !e.contains("out[") && (graceful_goaway || clean.iter().any(|c| lower.contains(c))),
            "not a clean error: {e}"
        );
    }
    let (exit, d) = tokio::task::spawn_blocking(move || (d.wait_exit(Duration::from_secs(20)), d))
        .await
        .unwrap();
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "{}", d.stderr());
    assert!(!d.socket.exists(), "gRPC socket left behind");
    assert!(!d.fd_socket.exists(), "fd socket left behind");
    assert!(
        !d.stderr().contains("still in flight"),
        "the drain timed out: {}",
        d.stderr()
    );
}

/// The soak: the probes above, over and over for `NPUD_SOAK_SECS` (default 300), on one
/// daemon; prints calls tried, crashes and leaks per probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the soak runs by hand: NPUD_SOAK_SECS=600 cargo nextest run -p npud-e2e --test reliability --run-ignored only --no-capture"]
async fn soak() {
    let secs: u64 = std::env::var("NPUD_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let until = Instant::now() + Duration::from_secs(secs);
    let mut d = Daemon::start(options().arg("--emulator-timeout-ms").arg("300"));
    let mut k = warmed_up(&d).await;
    let base = held(&d, &mut k).await;
    let (mut killed, mut sixty_four, mut culprit) =
        (Figures::default(), Figures::default(), Figures::default());
    let mut round = 0;
    while Instant::now() < until {
        round += 1;
        killed += killed_clients_round(&d, &mut k, 24, round).await;
        // The keeper's session and 63 more.
        sixty_four += sixty_four_sessions_round(&d, 1, 8).await;
        culprit += culprit_round(&d, round).await;
        for f in [&mut killed, &mut sixty_four, &mut culprit] {
            if !d.running() {
                f.crashes += 1;
            }
        }
        if !d.running() {
            break;
        }
        // Every probe's sessions are gone; the daemon holds what it held at the start, except
        // the culprits' quarantined programs' records.
        let now = settle(&d, &mut k, &base).await;
        if now != base {
            eprintln!("round {round}: held {base:?} at the start, {now:?} now");
            killed.leaks += 1;
        }
    }
    println!("soak: {round} rounds in {secs} s on one daemon");
    for (name, f) in [
        ("24 clients SIGKILLed mid-work", killed),
        ("64 sessions, every call verified", sixty_four),
        ("faults and hangs hit only the culprit", culprit),
    ] {
        println!(
            "{name:<40} calls tried {:>8}  crashes {}  leaks {}  wrong values {}",
            f.calls, f.crashes, f.leaks, f.wrong
        );
    }
    for f in [killed, sixty_four, culprit] {
        assert_eq!((f.crashes, f.leaks, f.wrong), (0, 0, 0), "{f:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The same probes on fast-path sessions: every `Session` of the test (and of the client
// processes it starts) dispatches through its dispatch ring (`npud_e2e::ring`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_four_client_processes_killed_mid_work_leak_nothing() {
    twenty_four_client_processes_killed_mid_work_leak_nothing_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_four_client_processes_killed_mid_work_leak_nothing_on_the_fast_path() {
    npud_e2e::ring::dispatch_through_rings();
    twenty_four_client_processes_killed_mid_work_leak_nothing_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_sessions_each_verify_every_call() {
    sixty_four_sessions_each_verify_every_call_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_sessions_each_verify_every_call_on_the_fast_path() {
    npud_e2e::ring::dispatch_through_rings();
    sixty_four_sessions_each_verify_every_call_probe().await;
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
