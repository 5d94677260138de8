//! Requests are bounded before they are decoded (issue 36, "Bounded before allocation"): a
//! 32 KB gzip `Chain` of 16.7 M empty links, or `Dispatch` of 16.7 M empty arguments, once
//! decoded to 0.8-1.1 GiB, from a TCP caller with no credentials, before any handler counted
//! the links or asked the policy. Here, under a 1 GiB address-space limit, each is refused with
//! its documented code (UNAUTHENTICATED before the body is read for a caller the policy does
//! not allow; RESOURCE_EXHAUSTED for an allowed caller's bomb, which inflates past its ratio;
//! the handlers' own codes for counts past their limits), and the daemon's peak RSS stays near
//! its idle peak. A `Submit` stream's queued messages count in `limits.max_queued_request_bytes`.

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::tokens::{TokenDir, secret};
use npud_e2e::{Daemon, I32Copies, Options, RawCodec, Session, dispatch_request, with_session};
use prost::Message;
use tokio_stream::StreamExt;
use tonic::Code;

/// 2^24 copies of `element` (one empty repeated-field entry), gzip-compressed: the issue's
/// bombs, 32 MiB once inflated.
fn gzip_bomb(element: [u8; 2]) -> Vec<u8> {
    gzip(&element.repeat(1 << 24))
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A gRPC message frame: the compressed flag, the length, the bytes.
fn frame(compressed: bool, message: &[u8]) -> Vec<u8> {
    let mut f = vec![u8::from(compressed)];
    f.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    f.extend_from_slice(message);
    f
}

/// One unary call over plaintext TCP with a bare HTTP/2 client: `body` is the whole request
/// body (message frames). Returns the `grpc-status` and `grpc-message`.
async fn tcp_call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (Code, String) {
    use http_body_util::BodyExt;
    let io = hyper_util::rt::TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = send.send_request(req).await.expect("a response");
    let (parts, body) = resp.into_parts();
    let status = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .map(Code::from_i32)
    };
    let text = |h: &http::HeaderMap| {
        let m = h
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        percent_decode(m)
    };
    if let Some(code) = status(&parts.headers) {
        return (code, text(&parts.headers));
    }
    let collected = body.collect().await.expect("the response body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (status(&trailers).unwrap_or(Code::Unknown), text(&trailers))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The headers of a gzip-compressed call, with `token` as its `x-npud-token`.
fn gzip_headers(token: Option<&str>) -> Vec<(&str, &str)> {
    let mut h = vec![("grpc-encoding", "gzip")];
    if let Some(t) = token {
        h.push((npu_proto::IDENTITY_TOKEN_HEADER, t));
    }
    h
}

/// A field of `/proc/PID/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// A daemon on TCP whose token directory holds `pod`, and whose local users must present a
/// token (`auth.require_token = ["unix"]`): a TCP caller without one has no credentials the
/// policy takes, as a remote caller without a certificate.
fn daemon_with_tokens(tokens: &TokenDir) -> Daemon {
    let cfg = tokens.scratch().join("npud.toml");
    std::fs::write(
        &cfg,
        format!(
            "[auth]\ntoken_dir = \"{}\"\nrequire_token = [\"unix\"]\n",
            tokens.path().display()
        ),
    )
    .unwrap();
    Daemon::start(
        Options {
            tcp: true,
            // 1 GiB of address space, as the Kubernetes DaemonSet's memory limit: the issue's
            // bombs asked for 1 GiB more, and aborted npud under 1.25 GiB.
            address_space: Some(1 << 30),
            ..Options::default()
        }
        .arg("--config")
        .arg(&cfg.display().to_string()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bombs_are_refused_with_their_codes_and_cost_no_memory_under_a_1_gib_limit() {
    let tokens = TokenDir::new(&["pod"]);
    let mut d = daemon_with_tokens(&tokens);
    let addr = d.tcp.unwrap();
    let pid = d.pid().unwrap();
    let info = tcp_call(addr, "/npud.v1.Npud/GetDeviceInfo", &[], frame(false, &[])).await;
    assert_eq!(info.0, Code::Ok, "{info:?}");
    let idle = status_kib(pid, "VmHWM:");

    let chain = gzip_bomb([0x0a, 0x00]);
    let dispatch = gzip_bomb([0x12, 0x00]);
    assert!(
        chain.len() < 40 << 10 && dispatch.len() < 40 << 10,
        "{}",
        chain.len()
    );
    let good = secret("pod");
    let good = good.as_str();
    for (what, path, bomb) in [
        ("chain", "/npud.v1.Npud/Chain", &chain),
        ("dispatch", "/npud.v1.Npud/Dispatch", &dispatch),
    ] {
        // No credentials, and an unknown token: refused before the body is read.
        for token in [None, Some("not-a-token-of-this-daemon-00000000000000")] {
            let (code, msg) = tcp_call(addr, path, &gzip_headers(token), frame(true, bomb)).await;
            assert_eq!(code, Code::Unauthenticated, "{what} {token:?}: {msg}");
            assert!(
                msg.contains("compressed requests (grpc-encoding: gzip) are accepted only"),
                "{what} {token:?}: {msg}"
            );
        }
        // An allowed caller: the bomb inflates past 32 x its size + 1 MiB, and stops there.
        let (code, msg) = tcp_call(addr, path, &gzip_headers(Some(good)), frame(true, bomb)).await;
        assert_eq!(code, Code::ResourceExhausted, "{what}: {msg}");
        assert!(msg.contains("inflates past"), "{what}: {msg}");
    }

    // Smaller bombs that inflate within the ratio are counted before they are decoded: the
    // handlers' codes, naming the limits.
    let links = gzip(&[0x0a_u8, 0x00].repeat(100_000));
    let (code, msg) = tcp_call(
        addr,
        "/npud.v1.Npud/Chain",
        &gzip_headers(Some(good)),
        frame(true, &links),
    )
    .await;
    assert_eq!(code, Code::ResourceExhausted, "{msg}");
    assert!(
        msg.starts_with("links: more than 1024 links; at most 1024 (limits.max_chain_links)"),
        "{msg}"
    );
    let args = [0x12_u8, 0x00].repeat(100_000);
    let (code, msg) = tcp_call(
        addr,
        "/npud.v1.Npud/Dispatch",
        &[(npu_proto::IDENTITY_TOKEN_HEADER, good)],
        frame(false, &args),
    )
    .await;
    assert_eq!(code, Code::InvalidArgument, "{msg}");
    assert!(
        msg.starts_with("args: more than 64 arguments; at most 64"),
        "{msg}"
    );
    // An uncompressed message longer than 64 KiB from a caller without credentials is refused
    // from its header.
    let (code, msg) = tcp_call(addr, "/npud.v1.Npud/Dispatch", &[], frame(false, &args)).await;
    assert_eq!(code, Code::Unauthenticated, "{msg}");
    assert!(msg.contains("at most 65536 bytes"), "{msg}");

    assert!(d.running(), "npud died:\n{}", d.stderr());
    let info = tcp_call(addr, "/npud.v1.Npud/GetDeviceInfo", &[], frame(false, &[])).await;
    assert_eq!(info.0, Code::Ok, "{info:?}");
    let peak = status_kib(pid, "VmHWM:");
    eprintln!(
        "npud VmHWM: idle {} KiB, after the bombs {} KiB (+{} KiB)",
        idle,
        peak,
        peak - idle
    );
    // Each allowed bomb holds at most its 2 MiB inflate bound (3 MiB while the buffer grows
    // from 1 to 2 MiB) on a bulk-work thread, whose allocator keeps it for a while: about
    // 4 MiB each (measured: +8.2 to +8.3 MiB for both; +18.3 MiB when jobs went round the
    // threads instead of to the one idle last; the code took 0.8-1.1 GiB, or aborted).
    assert!(
        peak <= idle + 16 * 1024,
        "peak RSS {peak} KiB, idle {idle} KiB"
    );
    assert!(!d.stderr().contains("memory allocation"), "{}", d.stderr());
}

/// A `Submit` message's bytes count in `limits.max_queued_request_bytes` while its item is
/// queued, and are given back once it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_streams_queued_messages_count_in_the_queued_request_budget() {
    const BUDGET: usize = 1 << 20;
    const PAD: usize = 300_000;
    let d = Daemon::start(
        Options::default()
            .env("NPUD_LIMITS__MAX_QUEUED_REQUEST_BYTES", &BUDGET.to_string())
            .arg("--emulator-timeout-ms")
            .arg("2000"),
    );
    // The device, held by a design that hangs until the emulator's timeout (everything else
    // is set up first: allocations wait for the device too).
    let mut s = Session::open(d.connect().await, "submit").await.unwrap();
    let p = s
        .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let (a, b) = (
        s.alloc_mapped(4096).await.unwrap(),
        s.alloc_mapped(4096).await.unwrap(),
    );
    let mut h = Session::open(d.connect().await, "hang").await.unwrap();
    let hang = h.register(&EmuDesign::hang(4096)).await.unwrap().program_id;
    let (ha, hb) = (
        h.alloc_mapped(4096).await.unwrap(),
        h.alloc_mapped(4096).await.unwrap(),
    );
    let req = h.req(dispatch_request(hang, &[ha.id, hb.id]));
    let mut hc = h.client.clone();
    let hanging = tokio::spawn(async move { hc.dispatch(req).await });
    // Wait until the hang runs: the stream's items then stay queued behind it.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let st = s.statistics().await.unwrap();
        if st.pending_dispatches >= 1 {
            break;
        }
        if Instant::now() > until {
            hanging.abort();
            panic!(
                "the hang never started: {:?}\n{}",
                hanging.await,
                d.stderr()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Four messages of 300 KB (a dispatch and an unknown field that pads it): the fourth
    // passes the 1 MiB budget while the first three are queued.
    let padded = |k: u64| {
        let mut m = pb::SubmitRequest {
            request_id: k,
            work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
                p,
                &[a.id, b.id],
            ))),
            timeout_ms: 0,
        }
        .encode_to_vec();
        // Field 100, length-delimited.
        prost::encoding::encode_key(100, prost::encoding::WireType::LengthDelimited, &mut m);
        prost::encoding::encode_varint(PAD as u64, &mut m);
        m.resize(m.len() + PAD, 7);
        m
    };
    let messages: Vec<Vec<u8>> = (0..4).map(padded).collect();
    let mut grpc = tonic::client::Grpc::new(d.channel().await)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    grpc.ready().await.unwrap();
    let req = with_session(tokio_stream::iter(messages), s.id, &s.token);
    let mut out = grpc
        .streaming(
            req,
            http::uri::PathAndQuery::from_static("/npud.v1.Npud/Submit"),
            RawCodec,
        )
        .await
        .unwrap()
        .into_inner();
    let mut answered = Vec::new();
    let end = loop {
        match out.next().await {
            Some(Ok(bytes)) => {
                let r = pb::SubmitResponse::decode(&bytes[..]).unwrap();
                assert_eq!(r.code, 0, "{r:?}");
                answered.push(r.request_id);
            }
            Some(Err(e)) => break Some(e),
            None => break None,
        }
    };
    let e = end.expect("the fourth message ends the stream");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("message 3: "), "{e:?}");
    assert!(
        e.message().contains("limits.max_queued_request_bytes"),
        "{e:?}"
    );
    assert_eq!(answered, [0, 1, 2]);
    let _ = hanging.await;

    // Answered, they are given back: a unary request of 900 KB fits again.
    let mut m = pb::GetDeviceInfoRequest {}.encode_to_vec();
    prost::encoding::encode_key(100, prost::encoding::WireType::LengthDelimited, &mut m);
    prost::encoding::encode_varint(900_000, &mut m);
    m.resize(m.len() + 900_000, 1);
    npud_e2e::raw_unary(
        d.channel().await,
        "/npud.v1.Npud/GetDeviceInfo",
        tonic::Request::new(m),
    )
    .await
    .expect("the budget is free again");
}

/// Latencies of a bystander's calls, in µs, sorted.
fn summary(mut lat: Vec<u64>, secs: f64) -> String {
    lat.sort_unstable();
    let at = |q: f64| {
        // q in [0, 1]: an index within the list.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let at = ((lat.len() as f64 - 1.0) * q) as usize;
        lat.get(at).copied().unwrap_or(0)
    };
    format!(
        "{} calls ({:.0}/s), p50 {} µs, p99 {} µs, max {} µs",
        lat.len(),
        lat.len() as f64 / secs,
        at(0.5),
        at(0.99),
        lat.last().copied().unwrap_or(0)
    )
}

/// A bystander's `GetDeviceInfo` latency on the Unix socket, alone and while one client sends
/// 32 MiB messages (a 30 MiB `RegisterProgram`; 32 MiB of unknown fields; the gzip
/// `Chain` bomb from a TCP caller without credentials), against the daemon at `NPUD_MEASURE`
/// (a path; this build's `npud` by default). Prints the figures; asserts nothing about time.
/// `NPUD_MEASURE=/path/to/npud cargo nextest run -p npud-e2e --test decode_bounds
/// --run-ignored only --no-capture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints figures, run by hand"]
async fn measure_a_bystanders_latency_while_another_client_sends_32_mib_messages() {
    const SECS: f64 = 3.0;
    let bin = std::env::var("NPUD_MEASURE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| npud_e2e::binary("npud"));
    let tokens = TokenDir::new(&["pod"]);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("npud.toml");
    std::fs::write(
        &cfg,
        format!(
            "[auth]\ntoken_dir = \"{}\"\nrequire_token = [\"unix\"]\n",
            tokens.path().display()
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let ready = dir.path().join("ready");
    let socket = dir.path().join("s");
    let mut child = std::process::Command::new(&bin)
        .args(["--backend", "emulator", "--log-level", "warn", "--socket"])
        .arg(&socket)
        .arg("--fd-socket")
        .arg(dir.path().join("f"))
        .arg("--ready-file")
        .arg(&ready)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--tcp")
        .arg(port.to_string())
        .arg("--config")
        .arg(&cfg)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(Instant::now() < until, "{} not ready", bin.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = child.id();
    let good = secret("pod");
    let channel = npud_e2e::connect_unix(&socket).await;
    let bystand = |channel: tonic::transport::Channel| async move {
        let mut c = pb::npud_client::NpudClient::new(channel);
        let mut lat = Vec::new();
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < SECS {
            let t = Instant::now();
            c.get_device_info(pb::GetDeviceInfoRequest {})
                .await
                .unwrap();
            lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
        }
        lat
    };
    println!(
        "{}: alone: {}",
        bin.display(),
        summary(bystand(channel.clone()).await, SECS)
    );
    let mut unknown = Vec::with_capacity(32 << 20);
    while unknown.len() + 3 <= (32 << 20) - 16 {
        unknown.extend_from_slice(&[0xf8, 0x7f, 0x00]);
    }
    let program = pb::RegisterProgramRequest {
        pdi: vec![7; 30 << 20],
        insts: vec![0; 4],
        ..Default::default()
    }
    .encode_to_vec();
    let bomb = gzip_bomb([0x0a, 0x00]);
    let scenarios: Vec<(&str, Vec<u8>, bool, &str, bool)> = vec![
        (
            "a 30 MiB RegisterProgram",
            program,
            false,
            "/npud.v1.Npud/RegisterProgram",
            true,
        ),
        (
            "32 MiB of unknown fields",
            unknown,
            false,
            "/npud.v1.Npud/GetDeviceInfo",
            true,
        ),
        (
            "the gzip Chain bomb, no credentials (TCP)",
            bomb,
            true,
            "/npud.v1.Npud/Chain",
            false,
        ),
    ];
    for (what, message, compressed, path, with_token) in scenarios {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (socket, token, flag) = (socket.clone(), good.clone(), stop.clone());
        let hostile = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut sent = 0u32;
                let mut codes = std::collections::BTreeMap::new();
                let body = frame(compressed, &message);
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    let (code, _) = if compressed {
                        tcp_call(port, path, &gzip_headers(None), body.clone()).await
                    } else {
                        let mut h = vec![];
                        if with_token {
                            h.push((npu_proto::IDENTITY_TOKEN_HEADER, token.as_str()));
                        }
                        let (c, m) = npud_e2e::raw_h2_call(&socket, path, &h, &message).await;
                        (Code::from_i32(c), m)
                    };
                    sent += 1;
                    *codes.entry(format!("{code:?}")).or_insert(0u32) += 1;
                }
                (sent, codes)
            })
        });
        let s = summary(bystand(channel.clone()).await, SECS);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let hwm = status_kib(pid, "VmHWM:");
        let (sent, codes) = hostile.join().unwrap();
        println!(
            "{}: beside {what} ({sent} sent, {codes:?}): {s}; VmHWM {hwm} KiB",
            bin.display()
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A message longer than 64 KiB is decoded on a bulk-work thread and handed to its handler
/// whole: a chain of 256 links of 64 arguments (67 KB) and a Submit stream carrying it between
/// two short messages run and answer as sent. Health and reflection take no long message: a
/// 100 KB health check is refused from its header, naming the type and its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_messages_reach_their_handlers_whole_and_other_services_refuse_them() {
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "long").await.unwrap();
    let p = s
        .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 3))
        .await
        .unwrap()
        .program_id;
    let mut a = s.alloc_mapped(4096).await.unwrap();
    let b = s.alloc_mapped(4096).await.unwrap();
    a.map.fill_i32(1).unwrap();
    // Link k reads a and writes b when k is even, the other way round when odd; the program
    // reads the first two of its 64 arguments.
    let link = |k: usize| {
        let (x, y) = if k.is_multiple_of(2) {
            (a.id, b.id)
        } else {
            (b.id, a.id)
        };
        let args: Vec<u64> = (0..64).map(|i| if i % 2 == 0 { x } else { y }).collect();
        dispatch_request(p, &args)
    };
    let chain = pb::ChainRequest {
        links: (0..256).map(link).collect(),
    };
    assert!(chain.encoded_len() > 64 << 10, "{}", chain.encoded_len());
    let r = s.client.chain(s.req(chain.clone())).await.unwrap();
    assert!(r.get_ref().failure.is_none(), "{:?}", r.get_ref());
    assert_eq!(r.get_ref().completed, 256);
    assert!(a.map.i32s().unwrap().iter().all(|v| *v == 1 + 256 * 3));

    // In a stream: message 1 of 3 is the long one.
    let short = |id| pb::SubmitRequest {
        request_id: id,
        work: Some(pb::submit_request::Work::Dispatch(link(0))),
        timeout_ms: 0,
    };
    let long = pb::SubmitRequest {
        request_id: 2,
        work: Some(pb::submit_request::Work::Chain(chain)),
        timeout_ms: 0,
    };
    let outbound = tokio_stream::iter(vec![short(1), long, short(3)]);
    let mut inbound = s.client.submit(s.req(outbound)).await.unwrap().into_inner();
    let mut answers = Vec::new();
    while let Some(r) = inbound.next().await {
        let r = r.unwrap();
        assert_eq!(r.code, 0, "{r:?}");
        answers.push(r.request_id);
    }
    assert_eq!(answers, vec![1, 2, 3]);
    // The chain added 768 to a; each single dispatch wrote b from a.
    assert!(a.map.i32s().unwrap().iter().all(|v| *v == 1 + 512 * 3));

    let tokens = TokenDir::new(&["pod"]);
    let d = daemon_with_tokens(&tokens);
    let addr = d.tcp.unwrap();
    let good = secret("pod");
    let mut check = pb_health_check("npud.v1.Npud");
    check.extend_from_slice(&[0x82, 0x06, 0x80, 0x8d, 0x06]);
    check.resize(check.len() + 100_000, 0);
    let (code, msg) = tcp_call(
        addr,
        "/grpc.health.v1.Health/Check",
        &[(npu_proto::IDENTITY_TOKEN_HEADER, good.as_str())],
        frame(false, &check),
    )
    .await;
    assert_eq!(code, Code::ResourceExhausted, "{msg}");
    assert!(
        msg.contains("grpc.health.v1.HealthCheckRequest is at most 65536 bytes"),
        "{msg}"
    );
    let (code, msg) = tcp_call(
        addr,
        "/grpc.health.v1.Health/Check",
        &[],
        frame(false, &pb_health_check("npud.v1.Npud")),
    )
    .await;
    assert_eq!(code, Code::Ok, "{msg}");
}

/// A `grpc.health.v1.HealthCheckRequest` naming `service`, encoded.
fn pb_health_check(service: &str) -> Vec<u8> {
    let mut m = vec![0x0a, u8::try_from(service.len()).unwrap()];
    m.extend_from_slice(service.as_bytes());
    m
}
