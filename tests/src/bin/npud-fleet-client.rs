//! A fleet client process for the network-namespace tests: it runs where the test puts it
//! (`ip netns exec CLIENT npud-fleet-client ...`), so it resolves the fleet's name through that
//! namespace's resolv.conf and reaches the hosts over that namespace's network.
//!
//! `npud-fleet-client FLEET CA_PEM CERT_PEM KEY_PEM` connects `npu_client::Fleet` to FLEET
//! (`dns+https:///...`), trusting CA_PEM and presenting the client certificate, and prints `{"ready":true,...}`. Then it reads one command a line on stdin
//! and answers each with one JSON line on stdout:
//!
//! - `open N`: opens N sessions through the fleet; each registers vector_scalar_add (+1 on 256
//!   i32) and then works until stopped or lost: dispatch number k writes k into every input
//!   element and checks that every output element is k + 1, every 50 ms. Answers each
//!   session's id and host.
//! - `mark`: the instant the next figures count from (the test injects a fault right after).
//! - `wait-lost ADDR MS`: waits up to MS for the fleet to find ADDR down and for every session
//!   on ADDR to fail with `SessionLost` naming it; answers when each happened (ms after
//!   `mark`) and the sessions' messages.
//! - `wait-serving ADDR MS`: waits up to MS for the fleet to take sessions on ADDR again;
//!   answers when (ms after `mark`).
//! - `hosts`: the fleet as `npuctl fleet --json` prints it.
//! - `tally`: each session's calls: issued, checked ok, failed by kind, in flight.
//! - `stop`: stops every session's work (each within its call timeout), answers the tally and
//!   exits.
//!
//! Every wait is bounded; a malformed command is answered with `{"error":...}`.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ClientError, ConnectOptions, Fleet, FleetOptions, FleetSpec, HostHealth};
use serde_json::{Value, json};

const N: usize = 256;
/// The pause between one session's calls.
const PACE: Duration = Duration::from_millis(50);

/// The timeouts the figures are measured against.
fn options(ca: &str, cert: &str, key: &str) -> FleetOptions {
    FleetOptions {
        connect: ConnectOptions {
            tls_ca: Some(ca.into()),
            tls_cert: Some(cert.into()),
            tls_key: Some(key.into()),
            connect_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(4),
            reconnect_timeout: Duration::from_secs(2),
            ..ConnectOptions::default()
        },
        refresh_interval: Duration::from_millis(200),
        retry_min: Duration::from_millis(100),
        retry_max: Duration::from_millis(500),
        ..FleetOptions::default()
    }
}

/// One session's calls so far.
#[derive(Debug, Default)]
struct Tally {
    issued: u64,
    ok: u64,
    /// Failures by kind (`session_lost`, `timeout`, `connect`, `wrong_output`, `other`).
    failed: BTreeMap<&'static str, u64>,
    /// When the first `SessionLost` came (after `mark`), and its message.
    lost: Option<(Option<u64>, String, bool)>,
    last_error: Option<String>,
}

#[derive(Debug)]
struct Worker {
    session: u64,
    address: String,
    tally: Arc<Mutex<Tally>>,
    task: tokio::task::JoinHandle<()>,
}

struct State {
    fleet: Fleet,
    workers: Vec<Worker>,
    mark: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
}

fn ms_since(mark: &Mutex<Option<Instant>>) -> Option<u64> {
    let m = *mark.lock().unwrap_or_else(PoisonError::into_inner);
    m.map(|t| u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX))
}

fn kind(e: &ClientError) -> &'static str {
    match e {
        ClientError::SessionLost { .. } => "session_lost",
        ClientError::Timeout { .. } => "timeout",
        ClientError::Connect { .. } => "connect",
        _ => "other",
    }
}

/// One session's work: a checked dispatch every `PACE` until stopped or lost for good.
async fn work(
    client: Client,
    tally: Arc<Mutex<Tally>>,
    mark: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
) {
    let design = EmuDesign::vector_scalar_add(u32::try_from(N).unwrap_or(256), DType::I32, 1);
    let program = match npu_client::Program::emulated(&design, client.generation()) {
        Ok(p) => p,
        Err(e) => {
            tally
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last_error = Some(e.to_string());
            return;
        }
    };
    let lock = || tally.lock().unwrap_or_else(PoisonError::into_inner);
    let mut tensors = None;
    let mut k: i32 = 0;
    while !stop.load(Ordering::SeqCst) {
        k = k.wrapping_add(1);
        lock().issued += 1;
        let outcome = async {
            if tensors.is_none() {
                tensors = Some((client.alloc::<i32>(N).await?, client.alloc::<i32>(N).await?));
            }
            let Some((input, output)) = tensors.as_mut() else {
                return Ok(false);
            };
            input.as_mut_slice().fill(k);
            client
                .dispatch(&program, &[&*input], &mut [&mut *output])
                .await?;
            Ok::<bool, ClientError>(output.as_slice().iter().all(|&x| x == k.wrapping_add(1)))
        }
        .await;
        let lost = {
            let mut t = lock();
            match outcome {
                Ok(true) => {
                    t.ok += 1;
                    false
                }
                Ok(false) => {
                    *t.failed.entry("wrong_output").or_default() += 1;
                    false
                }
                Err(e) => {
                    *t.failed.entry(kind(&e)).or_default() += 1;
                    t.last_error = Some(e.to_string());
                    if let ClientError::SessionLost { address, .. } = &e {
                        let named = *address == client.address().to_string();
                        t.lost = Some((ms_since(&mark), e.to_string(), named));
                        true
                    } else {
                        // A failed dispatch may leave its output lent: start over with new
                        // tensors.
                        tensors = None;
                        false
                    }
                }
            }
        };
        if lost {
            return;
        }
        tokio::time::sleep(PACE).await;
    }
}

fn tally_json(st: &State) -> Value {
    let sessions: Vec<Value> = st
        .workers
        .iter()
        .map(|w| {
            let t = w.tally.lock().unwrap_or_else(PoisonError::into_inner);
            let failed: u64 = t.failed.values().sum();
            json!({
                "session": w.session,
                "address": w.address,
                "issued": t.issued,
                "ok": t.ok,
                "failed": t.failed,
                "in_flight": t.issued - t.ok - failed,
                "lost": t.lost.is_some(),
                "last_error": t.last_error,
            })
        })
        .collect();
    json!({ "sessions": sessions })
}

fn health_of(fleet: &Fleet, addr: &str) -> Option<HostHealth> {
    fleet
        .hosts()
        .into_iter()
        .find(|h| h.address.to_string() == addr)
        .map(|h| h.health)
}

async fn open(st: &mut State, n: usize) -> Result<Value, String> {
    let mut opened = Vec::new();
    for _ in 0..n {
        let client = tokio::time::timeout(Duration::from_secs(20), st.fleet.open())
            .await
            .map_err(|_| "no session within 20 s".to_owned())?
            .map_err(|e| e.to_string())?;
        let tally = Arc::new(Mutex::new(Tally::default()));
        let (session, address) = (client.session_id(), client.address().to_string());
        opened.push(json!({ "session": session, "address": address }));
        let task = tokio::spawn(work(
            client,
            tally.clone(),
            st.mark.clone(),
            st.stop.clone(),
        ));
        st.workers.push(Worker {
            session,
            address,
            tally,
            task,
        });
    }
    Ok(json!({ "sessions": opened }))
}

async fn wait_lost(st: &State, addr: &str, limit: Duration) -> Value {
    let until = Instant::now() + limit;
    let mut fleet_down_ms = None;
    loop {
        if fleet_down_ms.is_none()
            && matches!(health_of(&st.fleet, addr), Some(HostHealth::Down(_)))
        {
            fleet_down_ms = ms_since(&st.mark);
        }
        let on_host: Vec<&Worker> = st.workers.iter().filter(|w| w.address == addr).collect();
        let lost: Vec<(Option<u64>, String, bool)> = on_host
            .iter()
            .filter_map(|w| {
                w.tally
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .lost
                    .clone()
            })
            .collect();
        let done = fleet_down_ms.is_some() && lost.len() == on_host.len();
        if done || Instant::now() >= until {
            let times: Vec<u64> = lost.iter().filter_map(|l| l.0).collect();
            return json!({
                "done": done,
                "fleet_down_ms": fleet_down_ms,
                "sessions": on_host.len(),
                "lost": lost.len(),
                "first_lost_ms": times.iter().min(),
                "all_lost_ms": times.iter().max(),
                "named": lost.iter().all(|l| l.2),
                "messages": lost.iter().map(|l| l.1.clone()).collect::<Vec<_>>(),
                "failed": on_host.iter().map(|w| {
                    w.tally.lock().unwrap_or_else(PoisonError::into_inner).failed.clone()
                }).collect::<Vec<_>>(),
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_serving(st: &State, addr: &str, limit: Duration) -> Value {
    let until = Instant::now() + limit;
    loop {
        if health_of(&st.fleet, addr) == Some(HostHealth::Serving) {
            return json!({ "serving_ms": ms_since(&st.mark) });
        }
        if Instant::now() >= until {
            return json!({ "serving_ms": null, "hosts": npu_client::json::fleet_json(&st.fleet) });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn stop(st: &mut State) -> Value {
    st.stop.store(true, Ordering::SeqCst);
    let mut hung = 0;
    for w in &mut st.workers {
        // A call ends within its call timeout (4 s) plus a reconnect (2 s).
        if tokio::time::timeout(Duration::from_secs(10), &mut w.task)
            .await
            .is_err()
        {
            w.task.abort();
            hung += 1;
        }
    }
    let mut v = tally_json(st);
    v["hung"] = json!(hung);
    v
}

async fn command(st: &mut State, line: &str) -> Result<Value, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let ms = |w: Option<&&str>| -> Result<Duration, String> {
        w.and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| format!("{line:?}: expected a number of milliseconds"))
    };
    match words.as_slice() {
        ["open", n] => open(st, n.parse().map_err(|_| format!("{line:?}: bad count"))?).await,
        ["mark"] => {
            *st.mark.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
            Ok(json!({ "marked": true }))
        }
        ["wait-lost", addr, _] => Ok(wait_lost(st, addr, ms(words.get(2))?).await),
        ["wait-serving", addr, _] => Ok(wait_serving(st, addr, ms(words.get(2))?).await),
        ["hosts"] => Ok(npu_client::json::fleet_json(&st.fleet)),
        ["tally"] => Ok(tally_json(st)),
        ["stop"] => Ok(stop(st).await),
        _ => Err(format!("unknown command {line:?}")),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, spec, ca, cert, key] = args.as_slice() else {
        eprintln!("usage: npud-fleet-client FLEET CA_PEM CERT_PEM KEY_PEM");
        return ExitCode::from(2);
    };
    let fleet = match FleetSpec::parse(spec) {
        Ok(s) => Fleet::connect_with(s, options(ca, cert, key)).await,
        Err(e) => Err(e),
    };
    let fleet = match fleet {
        Ok(f) => f,
        Err(e) => {
            println!("{}", json!({ "ready": false, "error": e.to_string() }));
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{}",
        json!({ "ready": true, "fleet": npu_client::json::fleet_json(&fleet) })
    );
    let mut st = State {
        fleet,
        workers: Vec::new(),
        mark: Arc::new(Mutex::new(None)),
        stop: Arc::new(AtomicBool::new(false)),
    };
    // Commands come from a blocking reader thread, so the sessions' work goes on meanwhile.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(8);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = rx.recv().await {
        let reply = command(&mut st, &line).await;
        let last = line.trim() == "stop";
        println!("{}", reply.unwrap_or_else(|e| json!({ "error": e })));
        if last {
            break;
        }
    }
    if !st.stop.load(Ordering::SeqCst) {
        stop(&mut st).await;
    }
    ExitCode::SUCCESS
}
