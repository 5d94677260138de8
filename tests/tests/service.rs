//! Health, reflection, the remote (TCP) path, and SIGTERM.

#![forbid(unsafe_code)]

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use npud_e2e::{Daemon, Options, Session, bytes_i32, i32_bytes};
use tokio_stream::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

const N: u32 = 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_serving_and_reflection_lists_the_service() {
    let d = Daemon::start(Options::default());
    let ch = d.channel().await;
    let mut health = HealthClient::new(ch.clone());
    for service in ["npud.v1.Npud", ""] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }

    let mut refl = ServerReflectionClient::new(ch);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let msg = resp.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("not a service list: {msg:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "npud.v1.Npud",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }

    let info = NpudClient::new(d.channel().await)
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.backend, "emulator");
    assert_eq!(info.generation, "npu2");
    assert_eq!(info.agent_name, "aie2p");
    assert!(info.serving);
    assert!(info.fd_export);
    assert_eq!(info.session_grace_ms, 10_000);
    assert_eq!(info.limits.unwrap().max_chain_links, 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remote_path_runs_vector_scalar_add_over_tcp_with_bytes_through_the_api() {
    let d = Daemon::start(Options {
        tcp: true,
        ..Options::default()
    });
    let addr = d.tcp.unwrap();
    let ch = tonic::transport::Endpoint::try_from(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut s = Session::open(NpudClient::new(ch), "remote").await.unwrap();
    let reg = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap();
    let alloc = |name: &str| pb::AllocateTensorRequest {
        size_bytes: u64::from(N) * 4,
        name: name.into(),
    };
    let tin = s
        .client
        .allocate_tensor(s.req(alloc("in")))
        .await
        .unwrap()
        .into_inner();
    let tout = s
        .client
        .allocate_tensor(s.req(alloc("out")))
        .await
        .unwrap()
        .into_inner();
    assert!(tin.fd_ticket.is_empty(), "no fds over TCP");
    let info = s
        .client
        .get_tensor_info(s.req(pb::GetTensorInfoRequest {
            tensor_id: tin.tensor_id,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.storage(), pb::TensorStorage::Device);
    assert!(!info.in_place);

    let values: Vec<i32> = (0..N as i32).map(|i| 3 * i - 77).collect();
    let bytes = i32_bytes(&values);
    let (first, second) = bytes.split_at(1000);
    let chunks = vec![
        pb::WriteTensorChunk {
            tensor_id: tin.tensor_id,
            offset: 0,
            data: first.to_vec(),
        },
        pb::WriteTensorChunk {
            tensor_id: 0,
            offset: 1000,
            data: second.to_vec(),
        },
    ];
    let w = s
        .client
        .write_tensor(s.req(tokio_stream::iter(chunks)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.bytes_written, u64::from(N) * 4);

    let r = s
        .dispatch(reg.program_id, &[tin.tensor_id, tout.tensor_id])
        .await
        .unwrap();
    assert!(r.device_ns > 0);

    let mut stream = s
        .client
        .read_tensor(s.req(pb::ReadTensorRequest {
            tensor_id: tout.tensor_id,
            offset: 0,
            length: 0,
            chunk_bytes: 1000,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut back = Vec::new();
    while let Some(c) = stream.next().await {
        back.extend_from_slice(&c.unwrap().data);
    }
    let want: Vec<i32> = values.iter().map(|v| v + 1).collect();
    assert_eq!(bytes_i32(&back), want);

    // Importing a memfd needs the Unix socket.
    let e = s
        .client
        .import_tensor(s.req(pb::ImportTensorRequest {
            size_bytes: 16,
            name: String::new(),
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);

    let st = s.statistics().await.unwrap();
    let mine = st.sessions.iter().find(|x| x.session_id == s.id).unwrap();
    assert_eq!(mine.uid, None, "no uid over TCP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_and_removes_both_sockets() {
    let mut d = Daemon::start(Options::default());
    {
        let mut s = Session::open(d.connect().await, "t").await.unwrap();
        s.alloc_mapped(4096).await.unwrap();
    }
    assert!(d.socket.exists() && d.fd_socket.exists());
    let status = d.terminate().expect("the daemon was running");
    assert_eq!(status.code(), Some(0), "{}", d.stderr());
    assert!(!d.socket.exists(), "gRPC socket left behind");
    assert!(!d.fd_socket.exists(), "fd socket left behind");
    let log = d.stderr();
    assert!(log.contains("SIGTERM: shutting down"), "{log}");
    assert!(log.contains("released the NPU"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_sets_limits_and_json_logs_are_json() {
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        cfg.path(),
        "[limits]\nmax_chain_links = 5\nmax_sessions = 7\n[log]\nformat = \"json\"\n",
    )
    .unwrap();
    let d = Daemon::start(Options {
        args: vec!["--config".into(), cfg.path().display().to_string()],
        ..Options::default()
    });
    let info = NpudClient::new(d.channel().await)
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let l = info.limits.unwrap();
    assert_eq!((l.max_chain_links, l.max_sessions), (5, 7));
    let log = d.stderr();
    let listening = log
        .lines()
        .find(|l| l.contains("npud listening on unix:"))
        .unwrap_or_else(|| panic!("no listening line in {log}"));
    let v: serde_json::Value = serde_json::from_str(listening).expect("a JSON log line");
    assert_eq!(v["level"], "INFO");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_work_in_flight_finish() {
    let mut d = Daemon::start(Options {
        args: vec!["--emulator-timeout-ms".into(), "600".into()],
        ..Options::default()
    });
    let mut s = Session::open(d.connect().await, "drain").await.unwrap();
    let slow = s.register(&EmuDesign::hang(4096)).await.unwrap().program_id;
    let a = s.alloc_mapped(4096).await.unwrap();
    let b = s.alloc_mapped(4096).await.unwrap();
    let mut s2 = s.clone();
    let (ia, ib) = (a.id, b.id);
    let running = tokio::spawn(async move { s2.dispatch(slow, &[ia, ib]).await });
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    d.send_signal(rustix::process::Signal::TERM);
    // The dispatch that was running when SIGTERM came is answered by the device (the emulated
    // watchdog fails it), not cut off by the shutdown.
    let e = running.await.unwrap().unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");
    assert!(e.message().contains("quarantined"), "{e:?}");
    drop((s, a, b));
    let status = tokio::task::spawn_blocking(move || {
        let st = d.terminate();
        (st, d)
    })
    .await
    .unwrap();
    assert_eq!(
        status.0.and_then(|s| s.code()),
        Some(0),
        "{}",
        status.1.stderr()
    );
}
