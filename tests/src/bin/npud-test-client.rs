//! A separate client process for npud's end-to-end tests.
//!
//! `npud-test-client share SOCKET SEED`: opens a session, registers vector_scalar_add (+1 on
//! 1024 i32), allocates its two tensors through the fd socket, writes the input through its own
//! mapping, dispatches, checks the output in place in its mapping, and prints one JSON line
//! `{"pass":true,...}`. Exits 1 with `{"pass":false,"error":...}` otherwise.
//!
//! `npud-test-client hold SOCKET`: opens a session, registers the same program, allocates two
//! tensors, prints `{"held":true,"session":N,"program":P}` and sleeps until killed.
//!
//! `npud-test-client churn SOCKET SEED`: opens a session, registers vector_scalar_add (+1 + SEED
//! mod 3), and works until killed: each round allocates a fresh output tensor through the fd
//! socket, dispatches (every fourth round a 4-link chain), checks every output value, frees it,
//! and every other round also allocates a tensor and leaves it unredeemed. Prints
//! `{"working":true,"session":N}` after its first checked round; exits 1 with the first wrong
//! value or refusal.
//!
//! `npud-test-client foreign SOCKET FD_SOCKET SESSION TOKEN TICKET`: uses another process's
//! session and export ticket (run under another uid) and prints what the daemon answered.
//!
//! `npud-test-client tcp-sessions ADDR N`: over plaintext TCP to ADDR (`127.0.0.1:PORT`), asks
//! who it is and tries to open N sessions (left to end after their grace period); prints
//! `{"identity":...,"opened":K,"code":...,"message":...}` with the first refusal's code and
//! message ("OK" and "" when none).
//!
//! `npud-test-client groups-at-connect SOCKET GID` (as root): connects to the gRPC socket from a
//! thread whose supplementary groups are only GID (the process's main thread keeps its own),
//! then tries to open a session over that connection; prints `{"code":...,"message":...}`.
//!
//! `npud-test-client conns TARGET N silent|http2 [FROM]`: opens N connections to TARGET (a
//! socket path, or a TCP address, bound to source address FROM), each silent or past an HTTP/2
//! handshake (`npud_e2e::peers`), prints `{"held":K,"failed":F}` and holds them until its
//! standard input closes.
//!
//! `npud-test-client call TARGET [FROM]`: one GetDeviceInfo on a new connection; prints
//! `{"identity":...,"code":...,"message":...}`.
//!
//! `npud-test-client calls ADDR N`: N GetDeviceInfo calls over plaintext TCP, each on a new
//! connection; prints `{"identities":{NAME:COUNT},"codes":{CODE:COUNT}}`.
//!
//! `npud-test-client ghost ADDR NAME`: connects over TCP, writes a whole OpenSession call
//! named NAME and closes at once, reading nothing; prints `{"port":P}` (its local port).
//!
//! `npud-test-client time-wait N`: fills this network namespace's socket table with N
//! TIME_WAIT sockets; prints `{"made":N}`.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{I32Copies, Session, connect_unix};

const N: u32 = 1024;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let r = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("share"), Some(sock)) => {
            let seed = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
            share(PathBuf::from(sock), seed).await
        }
        (Some("hold"), Some(sock)) => hold(PathBuf::from(sock)).await,
        (Some("churn"), Some(sock)) => {
            let seed = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
            churn(PathBuf::from(sock), seed).await
        }
        (Some("tcp-sessions"), Some(addr)) => {
            let n = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
            tcp_sessions(addr, n).await
        }
        (Some("groups-at-connect"), Some(sock)) => {
            let gid = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
            groups_at_connect(PathBuf::from(sock), gid).await
        }
        (Some("foreign"), Some(sock)) if args.len() == 7 => {
            foreign(PathBuf::from(sock), &args[3], &args[4], &args[5], &args[6]).await
        }
        (Some("conns"), Some(target)) if args.len() >= 5 => {
            conns(target, &args[3], &args[4], args.get(5)).await
        }
        (Some("call"), Some(target)) => call(target, args.get(3)).await,
        (Some("calls"), Some(addr)) if args.len() == 4 => calls(addr, &args[3]).await,
        (Some("ghost"), Some(addr)) if args.len() == 4 => ghost(addr, &args[3]).await,
        (Some("time-wait"), Some(n)) => time_wait(n),
        _ => Err(
            "usage: npud-test-client share SOCKET SEED | hold SOCKET | churn SOCKET SEED | \
             foreign SOCKET FD_SOCKET SESSION TOKEN TICKET | tcp-sessions ADDR N | groups-at-connect SOCKET GID \
             | conns TARGET N silent|http2 [FROM] | call TARGET [FROM] | calls ADDR N | ghost ADDR NAME \
             | time-wait N"
                .into(),
        ),
    };
    match r {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{}", serde_json::json!({ "pass": false, "error": e }));
            ExitCode::FAILURE
        }
    }
}

async fn share(sock: PathBuf, seed: i32) -> Result<serde_json::Value, String> {
    let client = npu_proto::v1::npud_client::NpudClient::new(connect_unix(&sock).await);
    let mut s = Session::open(client, &format!("share-{seed}"))
        .await
        .map_err(|e| e.to_string())?;
    let design = EmuDesign::vector_scalar_add(N, DType::I32, 1);
    let reg = s.register(&design).await.map_err(|e| e.to_string())?;
    let bytes = u64::from(N) * 4;
    let mut input = s.alloc_mapped(bytes).await?;
    let output = s.alloc_mapped(bytes).await?;
    let values: Vec<i32> = (0..N as i32)
        .map(|i| i.wrapping_mul(7).wrapping_add(seed))
        .collect();
    input.map.set_i32s(&values).map_err(|e| e.to_string())?;
    let d = s
        .dispatch(reg.program_id, &[input.id, output.id])
        .await
        .map_err(|e| e.to_string())?;
    let out = output.map.i32s().map_err(|e| e.to_string())?;
    for (i, (o, v)) in out.iter().zip(&values).enumerate() {
        if *o != v.wrapping_add(1) {
            return Err(format!("out[{i}] = {o}, expected {}", v.wrapping_add(1)));
        }
    }
    let info = s
        .client
        .get_tensor_info(s.req(pb::GetTensorInfoRequest {
            tensor_id: output.id,
        }))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    if !info.in_place || info.storage() != pb::TensorStorage::DeviceShared {
        return Err(format!("output tensor is not shared in place: {info:?}"));
    }
    Ok(serde_json::json!({
        "pass": true,
        "session": s.id,
        "program": reg.program_id,
        "content_hash": reg.content_hash,
        "newly_stored": reg.newly_stored,
        "device_ns": d.device_ns,
    }))
}

async fn hold(sock: PathBuf) -> Result<serde_json::Value, String> {
    let client = npu_proto::v1::npud_client::NpudClient::new(connect_unix(&sock).await);
    let mut s = Session::open(client, "hold")
        .await
        .map_err(|e| e.to_string())?;
    let design = EmuDesign::vector_scalar_add(N, DType::I32, 1);
    let reg = s.register(&design).await.map_err(|e| e.to_string())?;
    let a = s.alloc_mapped(u64::from(N) * 4).await?;
    let b = s.alloc_mapped(u64::from(N) * 4).await?;
    println!(
        "{}",
        serde_json::json!({ "held": true, "session": s.id, "program": reg.program_id, "tensors": [a.id, b.id] })
    );
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

async fn churn(sock: PathBuf, seed: i32) -> Result<serde_json::Value, String> {
    let client = npu_proto::v1::npud_client::NpudClient::new(connect_unix(&sock).await);
    let mut s = Session::open(client, &format!("churn-{seed}"))
        .await
        .map_err(|e| e.to_string())?;
    let add = seed.rem_euclid(3) + 1;
    let design = EmuDesign::vector_scalar_add(N, DType::I32, i64::from(add));
    let mut reg = s.register(&design).await.map_err(|e| e.to_string())?;
    let bytes = u64::from(N) * 4;
    let mut input = s.alloc_mapped(bytes).await?;
    let mut round: u32 = 0;
    loop {
        let values: Vec<i32> = (0..N as i32)
            .map(|i| {
                i.wrapping_mul(31)
                    .wrapping_add(seed)
                    .wrapping_add(round as i32)
            })
            .collect();
        input
            .map
            .write_from(0, &values)
            .map_err(|e| e.to_string())?;
        let output = s.alloc_mapped(bytes).await?;
        let links = if round % 4 == 3 { 4 } else { 1 };
        if links == 1 {
            s.dispatch(reg.program_id, &[input.id, output.id])
                .await
                .map_err(|e| e.to_string())?;
        } else {
            // in -> out -> in -> out -> in: 4 additions, ending in `input`... and out holds 3.
            let there = npud_e2e::dispatch_request(reg.program_id, &[input.id, output.id]);
            let back = npud_e2e::dispatch_request(reg.program_id, &[output.id, input.id]);
            let r = s
                .chain(vec![there.clone(), back.clone(), there, back])
                .await
                .map_err(|e| e.to_string())?;
            if let Some(f) = r.failure {
                return Err(format!("chain failed: {f:?}"));
            }
        }
        // One link: out = in + add. Four: in = v + 4 add, out = v + 3 add.
        let want_out = |v: i32| v.wrapping_add(add * if links == 1 { 1 } else { 3 });
        let out = output
            .map
            .read_vec::<i32>(0, values.len())
            .map_err(|e| e.to_string())?;
        for (i, (o, v)) in out.iter().zip(&values).enumerate() {
            if *o != want_out(*v) {
                return Err(format!(
                    "round {round}: out[{i}] = {o}, expected {}",
                    want_out(*v)
                ));
            }
        }
        let id = output.id;
        drop(output);
        s.client
            .free_tensor(s.req(pb::FreeTensorRequest { tensor_id: id }))
            .await
            .map_err(|e| e.to_string())?;
        if round % 2 == 1 {
            // A ticket left unredeemed, and a tensor left to the session's end.
            s.client
                .allocate_tensor(s.req(pb::AllocateTensorRequest {
                    size_bytes: 4096,
                    name: "left".into(),
                }))
                .await
                .map_err(|e| e.to_string())?;
            if round % 64 == 63 {
                // Keep under the per-session tensor quota.
                drop(input);
                s = reopen(s, seed).await?;
                reg = s.register(&design).await.map_err(|e| e.to_string())?;
                input = s.alloc_mapped(bytes).await?;
            }
        }
        if round == 0 {
            println!(
                "{}",
                serde_json::json!({ "working": true, "session": s.id })
            );
        }
        round = round.wrapping_add(1);
    }
}

/// Closes `s` and opens a new session on its channel.
async fn reopen(mut s: Session, seed: i32) -> Result<Session, String> {
    s.client
        .close_session(s.req(pb::CloseSessionRequest {}))
        .await
        .map_err(|e| e.to_string())?;
    Session::open(s.client.clone(), &format!("churn-{seed}"))
        .await
        .map_err(|e| e.to_string())
}

/// A connector that hands tonic one stream connected beforehand.
#[derive(Clone)]
struct OneStream(std::sync::Arc<std::sync::Mutex<Option<tokio::net::UnixStream>>>);

impl tonic::codegen::Service<tonic::codegen::http::Uri> for OneStream {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::codegen::http::Uri) -> Self::Future {
        let s = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        std::future::ready(
            s.map(hyper_util::rt::TokioIo::new)
                .ok_or_else(|| std::io::Error::other("the one connection was used")),
        )
    }
}

async fn groups_at_connect(sock: PathBuf, gid: u32) -> Result<serde_json::Value, String> {
    let std_stream = std::thread::spawn(move || {
        rustix::thread::set_thread_groups(&[rustix::process::Gid::from_raw(gid)])
            .map_err(|e| format!("setgroups: {e}"))?;
        std::os::unix::net::UnixStream::connect(&sock).map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| "the connecting thread panicked".to_owned())??;
    std_stream
        .set_nonblocking(true)
        .map_err(|e| e.to_string())?;
    let stream = tokio::net::UnixStream::from_std(std_stream).map_err(|e| e.to_string())?;
    let ch = tonic::transport::Endpoint::from_static("http://npud.invalid")
        .connect_with_connector(OneStream(std::sync::Arc::new(std::sync::Mutex::new(Some(
            stream,
        )))))
        .await
        .map_err(|e| e.to_string())?;
    let r = npu_proto::v1::npud_client::NpudClient::new(ch)
        .open_session(pb::OpenSessionRequest {
            client_name: "groups".into(),
            ..Default::default()
        })
        .await;
    let (code, message) = match r {
        Ok(_) => ("OK".to_owned(), String::new()),
        Err(s) => (format!("{:?}", s.code()), s.message().to_owned()),
    };
    Ok(serde_json::json!({ "code": code, "message": message }))
}

async fn tcp_sessions(addr: &str, n: u32) -> Result<serde_json::Value, String> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut client = npu_proto::v1::npud_client::NpudClient::new(ch);
    let identity = client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .map_err(|e| e.to_string())?
        .into_inner()
        .caller_identity;
    let mut opened = 0;
    let (mut code, mut message) = ("OK".to_owned(), String::new());
    for i in 0..n {
        match client
            .open_session(pb::OpenSessionRequest {
                client_name: format!("tcp-{i}"),
                ..Default::default()
            })
            .await
        {
            Ok(_) => opened += 1,
            Err(s) => {
                code = format!("{:?}", s.code());
                message = s.message().to_owned();
                break;
            }
        }
    }
    Ok(serde_json::json!({
        "identity": identity, "opened": opened, "code": code, "message": message
    }))
}

async fn foreign(
    sock: PathBuf,
    fd_socket: &str,
    session: &str,
    token: &str,
    ticket: &str,
) -> Result<serde_json::Value, String> {
    let mut client = npu_proto::v1::npud_client::NpudClient::new(connect_unix(&sock).await);
    let session: u64 = session.parse().map_err(|_| "SESSION is not a number")?;
    let req = npud_e2e::with_session(
        pb::AllocateTensorRequest {
            size_bytes: 64,
            name: String::new(),
        },
        session,
        token,
    );
    let (code, message) = match client.allocate_tensor(req).await {
        Ok(_) => ("OK".to_owned(), String::new()),
        Err(s) => (format!("{:?}", s.code()), s.message().to_owned()),
    };
    let ticket: npu_fd::wire::Ticket = ticket.parse().map_err(|e| format!("{e}"))?;
    let fd_sock = std::os::unix::net::UnixStream::connect(fd_socket).map_err(|e| e.to_string())?;
    let redeem = match npu_fd::wire::client::redeem_export(&fd_sock, &ticket) {
        Ok(_) => "redeemed".to_owned(),
        Err(e) => e.to_string(),
    };
    Ok(serde_json::json!({ "code": code, "message": message, "redeem": redeem }))
}

fn parse<T: std::str::FromStr>(what: &str, s: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e| format!("{what} {s:?}: {e}"))
}

async fn conns(
    target: &str,
    n: &str,
    mode: &str,
    from: Option<&String>,
) -> Result<serde_json::Value, String> {
    use npud_e2e::peers;
    let target: peers::Target = target.parse()?;
    let n: u32 = parse("N", n)?;
    let http2 = match mode {
        "silent" => false,
        "http2" => true,
        m => return Err(format!("{m}: not silent or http2")),
    };
    let from = from.map(|f| parse("FROM", f)).transpose()?;
    let (held, failed) = peers::hold(&target, n, http2, from).await;
    println!(
        "{}",
        serde_json::json!({ "held": held.len(), "failed": failed })
    );
    // Held until standard input closes (the test drops its end, or dies).
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink)
    })
    .await;
    drop(held);
    Ok(serde_json::json!({ "released": true }))
}

async fn call(target: &str, from: Option<&String>) -> Result<serde_json::Value, String> {
    let target: npud_e2e::peers::Target = target.parse()?;
    let from = from.map(|f| parse("FROM", f)).transpose()?;
    let a = npud_e2e::peers::device_info(&target, from).await;
    Ok(serde_json::json!({ "identity": a.identity, "code": a.code, "message": a.message }))
}

async fn calls(addr: &str, n: &str) -> Result<serde_json::Value, String> {
    let target = npud_e2e::peers::Target::Tcp(parse("ADDR", addr)?);
    let n: u32 = parse("N", n)?;
    let mut identities = std::collections::BTreeMap::<String, u32>::new();
    let mut codes = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..n {
        let a = npud_e2e::peers::device_info(&target, None).await;
        *identities.entry(a.identity).or_default() += 1;
        *codes.entry(a.code).or_default() += 1;
    }
    Ok(serde_json::json!({ "identities": identities, "codes": codes }))
}

async fn ghost(addr: &str, name: &str) -> Result<serde_json::Value, String> {
    let port = npud_e2e::peers::ghost(parse("ADDR", addr)?, name)
        .await
        .map_err(|e| e.to_string())?;
    Ok(serde_json::json!({ "port": port }))
}

fn time_wait(n: &str) -> Result<serde_json::Value, String> {
    let made = npud_e2e::peers::time_wait(parse("N", n)?, 4).map_err(|e| e.to_string())?;
    Ok(serde_json::json!({ "made": made }))
}
