//! `npuctl health`, the exec probe of the Kubernetes manifests: exit 0 and `SERVING` while the
//! daemon serves, exit 1 naming `NOT_SERVING` while its device recovers, exit 1 naming the
//! socket when no daemon answers.

#![forbid(unsafe_code)]

use std::process::Output;

use npu_artifacts::emu::EmuDesign;
use npud_e2e::{Daemon, Options, Session, npuctl_binary};

async fn health(addr: &str, extra: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(npuctl_binary());
    cmd.args(["--addr", addr, "health", "--timeout-ms", "5000"])
        .args(extra)
        .env_remove("NPUD_ADDR");
    tokio::time::timeout(std::time::Duration::from_secs(20), cmd.output())
        .await
        .expect("npuctl health answers within 20 s")
        .expect("npuctl runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_exits_0_while_serving_and_1_while_recovering_or_unreachable() {
    let d = Daemon::start(Options::default().env("NPUD_HEALTH__MIN_NOT_SERVING_MS", "10000"));
    let addr = format!("unix:{}", d.socket.display());
    let out = health(&addr, &[]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SERVING\n");
    let out = health(&addr, &["--service", "npud.v1.Npud"]).await;
    assert!(out.status.success(), "{out:?}");

    // A device fault: the daemon reports NOT_SERVING for the hold.
    let mut s = Session::open(d.connect().await, "faulty").await.unwrap();
    let fault = s.register(&EmuDesign::fault(4096)).await.unwrap();
    let a = s.alloc_mapped(4096).await.unwrap();
    let b = s.alloc_mapped(4096).await.unwrap();
    s.dispatch(fault.program_id, &[a.id, b.id])
        .await
        .unwrap_err();
    let out = health(&addr, &["--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["status"], "NOT_SERVING");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("npud health is NOT_SERVING"),
        "{out:?}"
    );

    // An unknown service is the daemon's NOT_FOUND, named.
    let out = health(&addr, &["--service", "nope"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NOT_FOUND"),
        "{out:?}"
    );

    // No daemon.
    drop(s);
    drop(d);
    let out = health(&addr, &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot reach npud at unix:"), "{stderr}");
}
