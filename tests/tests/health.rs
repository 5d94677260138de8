//! Health that watchers can see: NOT_SERVING held through a fault recovery and counted in
//! DeviceInfo, NOT_SERVING when draining begins, and Watch streams that end at shutdown.

#![forbid(unsafe_code)]

use std::time::{Duration, SystemTime};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const N: u32 = 1024;

fn npud() -> HealthCheckRequest {
    HealthCheckRequest {
        service: "npud.v1.Npud".into(),
    }
}

/// The next status on a Watch stream, within a generous bound.
async fn next_status(
    stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
) -> Option<ServingStatus> {
    tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("a Watch message or the stream's end within 20 s")
        .expect("the Watch stream ends cleanly, not with an error")
        .map(|r| r.status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_recovery_is_seen_by_watchers_and_counted_in_device_info() {
    // A hold far longer than the recovery and the calls below: Check after the faulted
    // dispatch's reply must still see it.
    let d = Daemon::start(Options::default().env("NPUD_HEALTH__MIN_NOT_SERVING_MS", "3000"));
    let mut health = HealthClient::new(d.channel().await);
    let mut watch = health.watch(npud()).await.unwrap().into_inner();
    assert_eq!(next_status(&mut watch).await, Some(ServingStatus::Serving));

    let mut s = Session::open(d.connect().await, "faulty").await.unwrap();
    let info = s
        .client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.recoveries, info.last_recovery_unix_ms), (0, 0));

    let fault = s.register(&EmuDesign::fault(N * 4)).await.unwrap();
    let good = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap();
    let a = s.alloc_mapped(u64::from(N) * 4).await.unwrap();
    let b = s.alloc_mapped(u64::from(N) * 4).await.unwrap();
    let before = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let e = s
        .dispatch(fault.program_id, &[a.id, b.id])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");

    // The recovery is over when the fault is answered; health still says NOT_SERVING.
    let now = health.check(npud()).await.unwrap().into_inner();
    assert_eq!(now.status(), ServingStatus::NotServing);
    let whole = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(whole.status(), ServingStatus::NotServing);
    let info = s
        .client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.recoveries, 1);
    assert!(
        u128::from(info.last_recovery_unix_ms) >= before,
        "last recovery {} before the dispatch at {before}",
        info.last_recovery_unix_ms
    );
    // Work is accepted again as soon as the device serves: the hold is for watchers.
    assert!(info.serving);
    s.dispatch(good.program_id, &[a.id, b.id]).await.unwrap();

    // The watcher saw it, and sees SERVING once the hold ends.
    assert_eq!(
        next_status(&mut watch).await,
        Some(ServingStatus::NotServing)
    );
    assert_eq!(next_status(&mut watch).await, Some(ServingStatus::Serving));

    // npuctl status shows the count.
    let out = std::process::Command::new(npud_e2e::npuctl_binary())
        .args(["--addr", &format!("unix:{}", d.socket.display()), "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("recoveries"))
        .unwrap_or_else(|| panic!("no recoveries line in {text}"));
    assert!(line.contains(" 1 (the last started"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_says_not_serving_and_ends_watch_streams_so_exit_is_prompt() {
    let mut d = Daemon::start(Options::default());
    let mut health = HealthClient::new(d.channel().await);
    let mut watches = Vec::new();
    for service in ["npud.v1.Npud", ""] {
        let mut w = health
            .watch(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(next_status(&mut w).await, Some(ServingStatus::Serving));
        watches.push(w);
    }
    d.send_signal(rustix::process::Signal::TERM);
    for mut w in watches {
        assert_eq!(next_status(&mut w).await, Some(ServingStatus::NotServing));
        assert_eq!(
            next_status(&mut w).await,
            None,
            "the stream ends at shutdown"
        );
    }
    // With the streams over, nothing holds the drain open: the daemon exits well before its
    // 10 s drain timeout would have cut the streams off.
    let status = tokio::task::spawn_blocking(move || {
        let s = d.wait_exit(Duration::from_secs(8));
        (s, d)
    })
    .await
    .unwrap();
    let (exit, d) = status;
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "{}", d.stderr());
    assert!(
        !d.stderr().contains("still in flight"),
        "the drain timed out: {}",
        d.stderr()
    );
}
