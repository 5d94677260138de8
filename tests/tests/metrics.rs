//! Prometheus metrics of a real daemon: scrape `GET /metrics`, do known work (dispatches, a
//! chain, a device fault, a hang, RPC errors, fd-socket exchanges), scrape again, and check
//! that every counter and histogram moved by exactly that work; the program label is capped;
//! the text passes `promtool check metrics`; every metric the Grafana dashboard and the alert
//! rules use is one the daemon exports, and the rules pass `promtool check rules`. No label
//! carries client-chosen text unless asked for, series per session are capped, and connections
//! that say nothing cannot keep a scraper out (issue 20, finding 9).

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_fd::wire::{Ticket, client};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session, dispatch_request};
use tonic::Code;

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;

fn options() -> Options {
    Options::default()
        .arg("--metrics-listen")
        .arg("127.0.0.1:0")
        .arg("--emulator-timeout-ms")
        .arg("300")
}

/// One HTTP/1.1 request to the metrics listener: (status, content type, body).
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

/// A parsed scrape: (name, labels) → value.
#[derive(Debug)]
struct Scrape {
    text: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    fn parse(text: String) -> Scrape {
        let mut samples = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => (name.to_owned(), labels(rest.trim_end_matches('}'))),
            };
            samples.push((name, labels, value));
        }
        Scrape { text, samples }
    }

    /// The sum over the series of `name` that carry every label in `want`.
    fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name && want.iter().all(|(k, v)| l.get(*k).is_some_and(|x| x == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    fn has(&self, name: &str, want: &[(&str, &str)]) -> bool {
        self.samples.iter().any(|(n, l, _)| {
            n == name && want.iter().all(|(k, v)| l.get(*k).is_some_and(|x| x == v))
        })
    }

    fn names(&self) -> BTreeSet<String> {
        self.samples.iter().map(|(n, _, _)| n.clone()).collect()
    }
}

/// `a="x",b="y\"z"` → {a: x, b: y"z}.
fn labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((k, v)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = v.char_indices();
        let mut end = v.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(k.trim_start_matches(',').to_owned(), value);
        rest = &v[end..];
    }
    out
}

fn metrics_addr(d: &Daemon) -> SocketAddr {
    d.ready_value("metrics")
        .expect("a metrics= line in the ready file")
        .parse()
        .unwrap()
}

async fn scrape(addr: SocketAddr) -> Scrape {
    let (status, ct, body) = tokio::task::spawn_blocking(move || http(addr, "GET", "/metrics"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    Scrape::parse(body)
}

async fn tensor(s: &mut Session) -> u64 {
    let req = s.req(pb::AllocateTensorRequest {
        size_bytes: BYTES,
        name: String::new(),
    });
    s.client
        .allocate_tensor(req)
        .await
        .unwrap()
        .into_inner()
        .tensor_id
}

/// Redeems a ticket that was never issued on the fd socket: refused UNKNOWN_TICKET.
fn redeem_unknown(fd_socket: &Path) -> String {
    let sock = std::os::unix::net::UnixStream::connect(fd_socket).unwrap();
    let ticket = Ticket::random().unwrap();
    client::redeem_export(&sock, &ticket)
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

/// The known work: `DISPATCHES` dispatches and a chain of `LINKS` links of vector_scalar_add,
/// one dispatch that faults the device, one refused for an unknown program (NOT_FOUND), one
/// fd-socket export redeemed and one unknown ticket refused.
const DISPATCHES: u64 = 5;
const LINKS: u64 = 3;

struct Work {
    add: u64,
    fault: u64,
    a: u64,
    b: u64,
}

async fn prepare(s: &mut Session) -> Work {
    let add = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let fault = s
        .register(&EmuDesign::fault(N * 4))
        .await
        .unwrap()
        .program_id;
    let (a, b) = (tensor(s).await, tensor(s).await);
    Work { add, fault, a, b }
}

async fn run(s: &mut Session, w: &Work, fd_socket: &Path) {
    for _ in 0..DISPATCHES {
        s.dispatch(w.add, &[w.a, w.b]).await.unwrap();
    }
    let links = (0..LINKS)
        .map(|_| dispatch_request(w.add, &[w.a, w.b]))
        .collect();
    let c = s.chain(links).await.unwrap();
    assert_eq!(u64::from(c.completed), LINKS);
    let e = s.dispatch(w.fault, &[w.a, w.b]).await.unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    let e = s.dispatch(999_999, &[w.a, w.b]).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let m = s.alloc_mapped(BYTES).await.unwrap();
    assert_eq!(m.map.len(), usize::try_from(BYTES).unwrap());
    let refused = redeem_unknown(fd_socket);
    assert!(refused.contains("UNKNOWN_TICKET"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_and_histograms_move_by_exactly_the_work_done() {
    // Per-session series, with the client's name, asked for.
    let d = Daemon::start(options().env("NPUD_METRICS__MAX_SESSION_LABELS", "8"));
    let addr = metrics_addr(&d);
    let mut s = Session::open(d.connect().await, "metrics-e2e")
        .await
        .unwrap();
    let info = s
        .client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.metrics_address, addr.to_string());
    assert!(
        d.stderr()
            .contains(&format!("serving metrics on http://{addr}/metrics")),
        "{}",
        d.stderr()
    );
    let w = prepare(&mut s).await;
    let before = scrape(addr).await;
    run(&mut s, &w, &d.fd_socket).await;
    let after = scrape(addr).await;
    let delta =
        |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);

    let add = [("program", "vector_scalar_add")];
    assert_eq!(
        delta("npud_dispatches_total", &[add[0], ("outcome", "OK")]),
        DISPATCHES as f64
    );
    assert_eq!(delta("npud_dispatches_total", &add), DISPATCHES as f64);
    assert_eq!(
        delta("npud_chain_links_total", &[add[0], ("outcome", "OK")]),
        LINKS as f64
    );
    assert_eq!(
        delta(
            "npud_dispatches_total",
            &[("program", "fault"), ("outcome", "INTERNAL")]
        ),
        1.0
    );
    assert_eq!(delta("npud_dispatches_total", &[]), DISPATCHES as f64 + 1.0);
    assert_eq!(
        delta(
            "npud_refused_links_total",
            &[("kind", "dispatch"), ("code", "NOT_FOUND")]
        ),
        1.0
    );
    // One observation per item the device queue answered: the dispatches and the fault, and
    // the chain as one.
    for h in ["npud_queue_time_seconds", "npud_device_time_seconds"] {
        assert_eq!(
            delta(&format!("{h}_count"), &[("kind", "dispatch")]),
            DISPATCHES as f64 + 1.0,
            "{h}"
        );
        assert_eq!(delta(&format!("{h}_count"), &[("kind", "chain")]), 1.0);
        assert_eq!(
            delta(&format!("{h}_bucket"), &[("kind", "chain"), ("le", "+Inf")]),
            1.0
        );
    }
    assert!(delta("npud_device_time_seconds_sum", &[]) > 0.0);
    // The same observations by class: every one batch.
    for h in ["npud_queue_time_seconds", "npud_device_time_seconds"] {
        assert_eq!(
            delta(&format!("{h}_count"), &[("class", "batch")]),
            DISPATCHES as f64 + 2.0,
            "{h}"
        );
        assert_eq!(
            delta(&format!("{h}_count"), &[("class", "interactive")]),
            0.0
        );
    }
    assert_eq!(delta("npud_device_faults_total", &[]), 1.0);
    assert_eq!(delta("npud_recoveries_total", &[]), 1.0);
    assert_eq!(delta("npud_programs_quarantined", &[]), 1.0);

    let dispatch = ("method", "/npud.v1.Npud/Dispatch");
    assert_eq!(
        delta("npud_rpcs_total", &[dispatch]),
        DISPATCHES as f64 + 2.0
    );
    assert_eq!(
        delta("npud_rpcs_total", &[("method", "/npud.v1.Npud/Chain")]),
        1.0
    );
    assert_eq!(
        delta("npud_rpc_errors_total", &[dispatch, ("code", "INTERNAL")]),
        1.0
    );
    assert_eq!(
        delta("npud_rpc_errors_total", &[dispatch, ("code", "NOT_FOUND")]),
        1.0
    );
    assert_eq!(delta("npud_rpc_errors_total", &[dispatch]), 2.0);
    assert_eq!(
        delta(
            "npud_fd_exchanges_total",
            &[("op", "REDEEM_EXPORT"), ("status", "OK")]
        ),
        1.0
    );
    assert_eq!(
        delta(
            "npud_fd_exchanges_total",
            &[("op", "REDEEM_EXPORT"), ("status", "UNKNOWN_TICKET")]
        ),
        1.0
    );

    // State read at scrape time agrees with GetStatistics and DeviceInfo.
    let sid = s.id.to_string();
    let mine = [("session", sid.as_str()), ("client", "metrics-e2e")];
    assert_eq!(after.sum("npud_sessions", &[]), 1.0);
    assert_eq!(after.sum("npud_session_pending_work", &mine), 0.0);
    assert!(after.has("npud_session_pending_work", &mine));
    assert_eq!(after.sum("npud_tensors", &[]), 3.0);
    assert_eq!(after.sum("npud_tensor_bytes", &[]), 3.0 * BYTES as f64);
    let info = s
        .client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        after.sum("npud_heap_used_bytes", &[]),
        info.heap_used_bytes as f64
    );
    assert_eq!(
        after.sum("npud_heap_size_bytes", &[]),
        info.heap_size_bytes as f64
    );
    assert!(after.sum("npud_program_loads_total", &[]) >= 1.0);
    assert!(after.has(
        "npud_build_info",
        &[
            ("backend", "emulator"),
            ("packet_abi", info.packet_abi.as_str()),
            ("generation", info.generation.as_str()),
            ("emulator_profile", "rocr-newest"),
        ]
    ));
    let stats = s.statistics().await.unwrap();
    assert_eq!(
        after.sum("npud_device_faults_total", &[]),
        stats.device_faults as f64
    );

    // Work in flight shows as the session's pending work: a dispatch that hangs until the
    // emulator's timeout.
    let hang = s
        .register(&EmuDesign::hang(N * 4))
        .await
        .unwrap()
        .program_id;
    let mut hanging = s.clone();
    let (a, b) = (w.a, w.b);
    let call = tokio::spawn(async move { hanging.dispatch(hang, &[a, b]).await });
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let now = scrape(addr).await;
        if now.sum("npud_session_pending_work", &mine) == 1.0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the hanging dispatch never showed as pending"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert_eq!(
        scrape(addr).await.sum("npud_session_pending_work", &mine),
        0.0
    );

    // A session's series leaves with it.
    let req = s.req(pb::CloseSessionRequest {});
    s.client.close_session(req).await.unwrap();
    let closed = scrape(addr).await;
    assert!(!closed.has("npud_session_pending_work", &[("session", sid.as_str())]));
    assert_eq!(closed.sum("npud_sessions", &[]), 0.0);
    assert_eq!(
        closed.sum("npud_sessions_ended_total", &[]) - after.sum("npud_sessions_ended_total", &[]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn program_labels_past_the_cap_are_other_and_other_paths_are_404() {
    let d = Daemon::start(options().env("NPUD_METRICS__MAX_PROGRAM_LABELS", "2"));
    let addr = metrics_addr(&d);
    let mut s = Session::open(d.connect().await, "cap").await.unwrap();
    let g = s.generation().await.unwrap();
    let (a, b) = (tensor(&mut s).await, tensor(&mut s).await);
    for (k, name) in ["p1", "p2", "p3", "p4"].into_iter().enumerate() {
        // Distinct bytes each, so each is a program of its own.
        let design = EmuDesign::vector_scalar_add(N, DType::I32, i64::try_from(k).unwrap() + 1);
        let id = s
            .register_bytes(design.to_pdi(), design.insts(g), name)
            .await
            .unwrap()
            .program_id;
        s.dispatch(id, &[a, b]).await.unwrap();
    }
    let m = scrape(addr).await;
    let programs: BTreeSet<&str> = m
        .samples
        .iter()
        .filter(|(n, _, _)| n == "npud_dispatches_total")
        .map(|(_, l, _)| l["program"].as_str())
        .collect();
    assert_eq!(programs, BTreeSet::from(["p1", "p2", "other"]));
    assert_eq!(m.sum("npud_dispatches_total", &[("program", "other")]), 2.0);

    let (status, _, body) = tokio::task::spawn_blocking(move || http(addr, "GET", "/"))
        .await
        .unwrap();
    assert_eq!(status, 404, "{body}");
    let (status, _, _) = tokio::task::spawn_blocking(move || http(addr, "POST", "/metrics"))
        .await
        .unwrap();
    assert_eq!(status, 405);
}

/// A connection to `addr` from `from` (any port) that sends `head` and then nothing.
async fn silent_connection(
    from: std::net::IpAddr,
    addr: SocketAddr,
    head: &[u8],
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    s.write_all(head).await.unwrap();
    s
}

/// One scrape on a new connection, or why it failed.
fn try_scrape(addr: SocketAddr) -> Result<u16, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(|e| e.to_string())?;
    raw.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP response: {raw:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_connections_from_many_addresses_do_not_keep_a_scraper_out() {
    let d = Daemon::start(options());
    let addr = metrics_addr(&d);
    let mut held = Vec::new();
    let mut results = Vec::new();
    for round in 0..15u8 {
        // Before each scrape, 24 more connections that never finish a request: from eight
        // loopback addresses, half of them with a request line and no end of headers.
        for k in 0..24u8 {
            let from = std::net::IpAddr::from([127, 0, 0, 2 + k % 8]);
            let head: &[u8] = if k % 2 == 0 {
                b""
            } else {
                b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
            };
            held.push(silent_connection(from, addr, head).await);
        }
        let r = tokio::task::spawn_blocking(move || try_scrape(addr))
            .await
            .unwrap();
        results.push((round, r));
    }
    let failed: Vec<_> = results.iter().filter(|(_, r)| *r != Ok(200)).collect();
    assert!(failed.is_empty(), "scrapes that failed: {failed:?}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_label_carries_client_chosen_text_by_default_and_session_series_are_capped() {
    let d = Daemon::start(options());
    let addr = metrics_addr(&d);
    let mut sessions = Vec::new();
    for i in 0..3 {
        let name = format!("client-chosen-{i}");
        sessions.push(Session::open(d.connect().await, &name).await.unwrap());
    }
    let m = scrape(addr).await;
    assert!(
        !m.text.contains("client-chosen"),
        "a client's name in the metrics:\n{}",
        m.text
    );
    assert!(
        m.samples.iter().all(|(_, l, _)| !l.contains_key("client")),
        "{}",
        m.text
    );
    let kinds: BTreeSet<&str> = m
        .samples
        .iter()
        .filter(|(n, _, _)| n == "npud_session_pending_work")
        .map(|(_, l, _)| l["identity_kind"].as_str())
        .collect();
    assert_eq!(kinds, BTreeSet::from(["anonymous", "cert", "token", "uid"]));
    sessions.clear();

    // Per-session series when asked for, at most metrics.max_session_labels of them.
    let d = Daemon::start(options().env("NPUD_METRICS__MAX_SESSION_LABELS", "1"));
    let addr = metrics_addr(&d);
    let mut ids = Vec::new();
    for i in 0..3 {
        let s = Session::open(d.connect().await, &format!("c{i}"))
            .await
            .unwrap();
        ids.push(s.id);
        sessions.push(s);
    }
    let m = scrape(addr).await;
    let series: BTreeSet<(String, String)> = m
        .samples
        .iter()
        .filter(|(n, _, _)| n == "npud_session_pending_work")
        .map(|(_, l, _)| (l["session"].clone(), l["client"].clone()))
        .collect();
    assert_eq!(
        series,
        BTreeSet::from([
            (ids[0].to_string(), "c0".to_owned()),
            ("other".to_owned(), "other".to_owned())
        ])
    );
}

#[test]
fn without_metrics_listen_there_is_no_listener() {
    let d = Daemon::start(Options::default());
    assert_eq!(d.ready_value("metrics"), None);
    assert_eq!(
        d.ready_value("unix").as_deref(),
        Some(d.socket.to_str().unwrap())
    );
}

/// Metric names in PromQL expressions: every `npud_...` word.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(k) = text[i..].find("npud_") {
        let start = i + k;
        let before_ok =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if before_ok {
            out.insert(text[start..end].to_owned());
        }
        i = end;
    }
    out
}

fn deploy(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The PromQL of every panel target of the dashboard.
fn dashboard_exprs() -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(&deploy("deploy/grafana/npud-dashboard.json"))
        .expect("the dashboard is JSON");
    let mut out = Vec::new();
    for p in v["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().expect("a target's expr").to_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_use_is_exported() {
    let d = Daemon::start(options());
    let addr = metrics_addr(&d);
    let mut s = Session::open(d.connect().await, "names").await.unwrap();
    let w = prepare(&mut s).await;
    run(&mut s, &w, &d.fd_socket).await;
    let exported = scrape(addr).await.names();

    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut used = BTreeSet::new();
    for e in &exprs {
        used.extend(metric_names(e));
    }
    let alerts = deploy("deploy/prometheus/npud-alerts.yml");
    let in_alerts = metric_names(&alerts);
    assert!(in_alerts.len() >= 6, "{in_alerts:?}");
    used.extend(in_alerts);
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "used by the dashboard or the alerts but not exported: {missing:?}\nexported: {exported:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_promtool),
    ignore = "needs promtool (Debian package prometheus)"
)]
async fn the_text_and_the_alert_rules_pass_promtool() {
    let d = Daemon::start(options());
    let addr = metrics_addr(&d);
    let mut s = Session::open(d.connect().await, "promtool \"quoted\" \\ name")
        .await
        .unwrap();
    let w = prepare(&mut s).await;
    run(&mut s, &w, &d.fd_socket).await;
    let text = scrape(addr).await.text;

    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/npud-alerts.yml");
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
