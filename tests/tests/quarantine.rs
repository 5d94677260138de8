//! Quarantine across restarts: a program that faulted the device stays refused after the daemon
//! restarts with the same state directory, until `npuctl programs --clear-quarantine` clears it;
//! a daemon killed while a program runs on the device suspects that program at its next start,
//! quarantines it when a daemon dies with it on the device a second time before a run of it
//! completed, and serves everyone else.

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, I32Copies, Options, Session, npuctl_binary};

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;

fn with_state(state: &Path) -> Options {
    Options {
        state_dir: Some(state.to_path_buf()),
        ..Options::default()
    }
}

fn npuctl(d: &Daemon, args: &[&str]) -> Output {
    let o = Command::new(npuctl_binary())
        .args(args)
        .arg("--addr")
        .arg(&d.socket)
        .env_remove("NPUD_ADDR")
        .output()
        .expect("npuctl runs");
    assert!(
        o.status.success(),
        "npuctl {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulted_program_stays_quarantined_across_a_restart_until_npuctl_clears_it() {
    let state = tempfile::tempdir().unwrap();
    let fault = EmuDesign::fault(N * 4);

    let mut d = Daemon::start(with_state(state.path()));
    let mut s = Session::open(d.connect().await, "first").await.unwrap();
    let reg = s.register(&fault).await.unwrap();
    let hash = reg.content_hash.clone();
    let a = s.alloc_mapped(BYTES).await.unwrap();
    let b = s.alloc_mapped(BYTES).await.unwrap();
    let e = s.dispatch(reg.program_id, &[a.id, b.id]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");
    let record = state.path().join("quarantine").join(format!("{hash}.json"));
    assert!(record.is_file(), "no record at {}", record.display());
    drop((s, a, b));
    assert_eq!(
        d.terminate().and_then(|s| s.code()),
        Some(0),
        "{}",
        d.stderr()
    );

    // The restarted daemon refuses the same bytes at registration, and says how to clear them.
    let tokens = npud_e2e::tokens::TokenDir::new(&["tenant"]);
    let d = Daemon::start(
        with_state(state.path()).env("NPUD_AUTH__TOKEN_DIR", &tokens.path().display().to_string()),
    );
    let mut s = Session::open(d.connect().await, "second").await.unwrap();
    let e = s.register(&fault).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    for needle in [
        format!("program {hash} (fault) is quarantined since 20"),
        "it faulted the device: ".to_owned(),
        format!("clear it with `npuctl programs --clear-quarantine {hash}`"),
    ] {
        assert!(
            e.message().contains(&needle),
            "{needle:?} in {:?}",
            e.message()
        );
    }

    // The operator's listing shows it, with when it faulted.
    let text = stdout(&npuctl(&d, &["programs"]));
    assert!(text.contains(&hash), "{text}");
    assert!(text.contains("faulted at"), "{text}");
    let v: serde_json::Value =
        serde_json::from_slice(&npuctl(&d, &["programs", "--json"]).stdout).unwrap();
    let q = &v["quarantine"][0];
    assert_eq!(q["content_hash"], hash.as_str(), "{v}");
    assert_eq!(q["name"], "fault");
    assert!(q["faulted_at"].as_str().unwrap().ends_with('Z'), "{q}");
    assert!(q["faulted_unix_s"].as_u64().unwrap() > 1_600_000_000, "{q}");

    // A tenant (a token identity) may not clear it.
    let e = d
        .connect()
        .await
        .clear_quarantine(npud_e2e::with_identity_token(
            pb::ClearQuarantineRequest {
                content_hash: hash.clone(),
            },
            Some(&npud_e2e::tokens::secret("tenant")),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(
        e.message()
            .starts_with("ClearQuarantine is allowed only to admins (auth.admins: uid:0"),
        "{e:?}"
    );
    assert!(e.message().contains("this caller is token:tenant"), "{e:?}");

    // The operator clears it (this test runs as root or as the daemon's own user).
    let text = stdout(&npuctl(&d, &["programs", "--clear-quarantine", &hash]));
    assert!(
        text.starts_with(&format!(
            "cleared the quarantine of {hash} (fault), quarantined since 20"
        )),
        "{text}"
    );
    assert!(!record.exists());
    let v: serde_json::Value = serde_json::from_slice(
        &npuctl(&d, &["programs", "--clear-quarantine", &hash, "--json"]).stdout,
    )
    .unwrap();
    assert_eq!(v["removed"], false, "{v}");

    // The same bytes register and run again (and, being the fault design, fault again).
    let reg = s.register(&fault).await.unwrap();
    assert_eq!(reg.content_hash, hash);
    let a = s.alloc_mapped(BYTES).await.unwrap();
    let b = s.alloc_mapped(BYTES).await.unwrap();
    let e = s.dispatch(reg.program_id, &[a.id, b.id]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");
    assert!(record.is_file());
}

/// Starts a daemon on `state`, has session `who` dispatch `hang` and SIGKILLs the daemon once
/// the executor has recorded the program as on the device (as it does before it rings the
/// doorbell), as a runtime's abort(), the OOM killer or an operator would end it. Returns the
/// program's content hash.
async fn kill_mid_dispatch(state: &Path, who: &str, hang: &EmuDesign) -> String {
    // The emulated hang would last a minute: the daemon is killed long before.
    let d = Daemon::start(Options {
        args: vec!["--emulator-timeout-ms".into(), "60000".into()],
        ..with_state(state)
    });
    let mut s = Session::open(d.connect().await, who).await.unwrap();
    let reg = s.register(hang).await.unwrap();
    let a = s.alloc_mapped(BYTES).await.unwrap();
    let b = s.alloc_mapped(BYTES).await.unwrap();
    let mut s2 = s.clone();
    let (ia, ib, p) = (a.id, b.id, reg.program_id);
    let running = tokio::spawn(async move { s2.dispatch(p, &[ia, ib]).await });
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let now = npud::state_dir::InFlight::peek(state).unwrap_or_default();
        if now.iter().any(|x| x.content_hash == reg.content_hash) {
            assert_eq!(now.len(), 1);
            assert_eq!(now[0].name, "hang");
            break;
        }
        assert!(
            Instant::now() < until,
            "the dispatch never went in flight:\n{}",
            d.stderr()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    d.send_signal(rustix::process::Signal::KILL);
    let e = running.await.unwrap().unwrap_err();
    assert_ne!(e.code(), tonic::Code::Ok);
    drop((s, a, b, d));
    reg.content_hash
}

/// One death is no evidence against the program that was on the device: the daemon may have been
/// killed for any reason while a bystander's program ran. The next start makes it a suspect and
/// runs it; a second death with it on the device, before a run of it completed, quarantines it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_dispatch_suspects_that_program_and_quarantines_it_at_a_second_death() {
    let state = tempfile::tempdir().unwrap();
    let hang = EmuDesign::hang(N * 4);
    let hash = kill_mid_dispatch(state.path(), "bystander", &hang).await;

    // Killed once: the bystander's program is not quarantined.
    let d = Daemon::start(with_state(state.path()));
    assert!(
        d.stderr().contains(
            "the previous daemon died while this program ran on the device; it is a suspect now"
        ),
        "{}",
        d.stderr()
    );
    assert!(
        npud::state_dir::InFlight::peek(state.path())
            .unwrap()
            .is_empty()
    );
    assert!(
        !state
            .path()
            .join("quarantine")
            .join(format!("{hash}.json"))
            .exists()
    );
    let mut s = Session::open(d.connect().await, "bystander").await.unwrap();
    let again = s.register(&hang).await.unwrap();
    assert_eq!(again.content_hash, hash);
    drop((s, d));

    // Killed again with the same program on the device, no run of it completed between: that
    // is evidence, and the program is quarantined.
    assert_eq!(kill_mid_dispatch(state.path(), "doomed", &hang).await, hash);
    let d = Daemon::start(with_state(state.path()));
    assert!(
        d.stderr().contains(
            "the previous daemon died while this program ran on the device, as one did the last \
             time it ran; quarantined it"
        ),
        "{}",
        d.stderr()
    );
    let mut s = Session::open(d.connect().await, "after").await.unwrap();
    let e = s.register(&hang).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(&hash), "{e:?}");
    assert!(
        e.message()
            .contains("the daemon died while it ran on the device, at two deaths"),
        "{e:?}"
    );
    assert!(
        e.message().contains("npuctl programs --clear-quarantine"),
        "{e:?}"
    );

    // Everyone else is served: another client registers and runs a design.
    let mut other = Session::open(d.connect().await, "bystander").await.unwrap();
    let vsa = other
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap();
    let mut x = other.alloc_mapped(BYTES).await.unwrap();
    let y = other.alloc_mapped(BYTES).await.unwrap();
    x.map.fill_i32(41).unwrap();
    other.dispatch(vsa.program_id, &[x.id, y.id]).await.unwrap();
    assert!(y.map.i32s().unwrap().iter().all(|v| *v == 42));
}

/// Another local user may not clear a quarantine: the quarantined program could abort the
/// daemon again.
#[cfg_attr(not(as_root), ignore = "needs root to run npuctl under another uid")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_local_user_may_not_clear_a_quarantine() {
    assert!(
        rustix::process::getuid().is_root(),
        "built as root (tests/build.rs) but run as another user: rebuild as this user"
    );
    let state = tempfile::tempdir().unwrap();
    let d = Daemon::start(with_state(state.path()));
    let mut s = Session::open(d.connect().await, "faulting").await.unwrap();
    let reg = s.register(&EmuDesign::fault(N * 4)).await.unwrap();
    let hash = reg.content_hash.clone();
    let a = s.alloc_mapped(BYTES).await.unwrap();
    let b = s.alloc_mapped(BYTES).await.unwrap();
    let e = s.dispatch(reg.program_id, &[a.id, b.id]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");
    let record = state.path().join("quarantine").join(format!("{hash}.json"));
    assert!(record.is_file());
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = Command::new(npuctl_binary())
        .args(["programs", "--clear-quarantine", &hash, "--addr"])
        .arg(&d.socket)
        .env_remove("NPUD_ADDR")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(
            "ClearQuarantine failed (PERMISSION_DENIED): ClearQuarantine is allowed only to \
             admins (auth.admins: uid:0"
        ) && err.contains("; this caller is uid:65534"),
        "{err}"
    );
    assert!(record.is_file());
}
