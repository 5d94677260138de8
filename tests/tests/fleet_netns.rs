//! The fleet across network stacks: three npud hosts, each in a network namespace of its own
//! on a bridge, serving TLS with a certificate for its name and address; dnsmasq in a fifth
//! namespace answers `npud.fleet.test` with the three addresses; the clients run in a fourth
//! namespace whose resolv.conf names that dnsmasq, so `dns+https:///npud.fleet.test:50051`
//! resolves through the system resolver (getaddrinfo), not an injected one.
//!
//! The client is a process of its own (`npud-fleet-client`, run under `ip netns exec`): its
//! sessions dispatch and check every result continuously while the test takes a host's link
//! down, makes it slow and lossy (a `tc` token bucket, iptables dropping 2 %), makes it slower
//! than its traffic, or SIGKILLs its daemon. Each fault: the lost host's sessions
//! fail with `SessionLost` naming it within the configured timeouts (connect 1 s, call 4 s,
//! reconnect 2 s, probe every 200 ms), new sessions go to the others, nothing hangs, and the
//! host rejoins when its link (or its daemon) returns. No call is lost or run twice: every
//! call the client issued ended, every success was checked, and each daemon's own count of a
//! session's dispatches matches what the client saw (on a host that stayed up exactly; on a
//! cut-off host at most the one call in flight more). The failover and rejoin times are
//! printed (`--no-capture`).
//!
//! Needs root, iproute2 (`ip`, `tc`), iptables and dnsmasq (Debian: dnsmasq-base); otherwise
//! reported as ignored (tests/build.rs).

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::certs::Ca;
use npud_e2e::netns::{Net, ip};
use npud_e2e::{Daemon, Options, Session};
use serde_json::Value;

const NAME: &str = "npud.fleet.test";
const PORT: u16 = 50051;
/// The client's certificate name, the only identity the hosts' rules allow.
const CLIENT: &str = "client.fleet.test";
/// What any one answer of the client process may take.
const PATIENCE: Duration = Duration::from_secs(60);
/// What a fault may take to be noticed, or a host to rejoin (the timeouts are 1 s to 4 s).
const WAIT_MS: u64 = 15_000;

fn host_ip(i: usize) -> std::net::Ipv4Addr {
    ip(11 + u8::try_from(i).expect("a few hosts"))
}

/// Three hosts, a name server and a client namespace.
struct World {
    hosts: Vec<Daemon>,
    ca: PathBuf,
    /// The client's certificate and key (mTLS).
    identity: (PathBuf, PathBuf),
    // Dropped last: the daemons stop before their namespaces go.
    net: Net,
}

impl World {
    fn new() -> World {
        let mut net = Net::create();
        let ca = Ca::new(net.dir(), "ca");
        let mut hosts = Vec::new();
        let mut records = Vec::new();
        for i in 0..3 {
            let role = format!("h{}", i + 1);
            let addr = host_ip(i);
            let ns = net.host(&role, 11 + u8::try_from(i).expect("a few hosts"));
            let name = format!("{role}.fleet.test");
            let (cert, key) = ca.leaf(&role, &[&name, &addr.to_string()], &name, true);
            let cfg = net.dir().join(format!("{role}.toml"));
            std::fs::write(
                &cfg,
                format!(
                    "[tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\nclient_auth = \"required\"\n\
                     [[auth.rules]]\nname = \"fleet-clients\"\nmatch = [\"cert:dns:{CLIENT}\"]\n\
                     [[auth.rules]]\nname = \"the-test\"\nmatch = [\"uid:0\"]\n",
                    cert.display().to_string(),
                    key.display().to_string(),
                    ca.path().display().to_string(),
                ),
            )
            .expect("a config file");
            let opts = Options {
                netns: Some(ns),
                ..Options::default()
            }
            .arg("--config")
            .arg(&cfg.display().to_string())
            .arg("--tcp")
            .arg(&format!("{addr}:{PORT}"));
            hosts.push(Daemon::start(opts));
            records.push(addr);
        }
        let identity = ca.leaf("client", &[CLIENT], CLIENT, false);
        net.host("client", 100);
        net.host("dns", 2);
        net.dns("dns", 2, &[(NAME, &records)], &["client"]);
        World {
            hosts,
            ca: ca.path(),
            identity,
            net,
        }
    }

    fn address(i: usize) -> String {
        format!("https://{}:{PORT}", host_ip(i))
    }

    fn spec() -> String {
        format!("dns+https:///{NAME}:{PORT}")
    }

    fn client(&self) -> Driver {
        Driver::start(self)
    }
}

/// The client process in the client namespace, asked one line at a time.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
}

impl Driver {
    fn start(w: &World) -> Driver {
        let stderr = w.net.dir().join("client.stderr");
        let mut child = w
            .net
            .exec("client", Path::new(env!("CARGO_BIN_EXE_npud-fleet-client")))
            .arg(World::spec())
            .arg(&w.ca)
            .arg(&w.identity.0)
            .arg(&w.identity.1)
            .env("RUST_LOG", "npu_client=info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("a stderr file"))
            .spawn()
            .expect("the client starts");
        let stdin = child.stdin.take().expect("its stdin");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut d = Driver {
            child,
            stdin,
            lines,
            stderr,
        };
        let ready = d.answer("ready");
        assert_eq!(ready["ready"], true, "{ready}");
        d
    }

    fn answer(&mut self, what: &str) -> Value {
        match self.lines.recv_timeout(PATIENCE) {
            Ok(line) => serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}")),
            Err(e) => panic!(
                "no answer to {what} within {PATIENCE:?} ({e}); client stderr:\n{}",
                std::fs::read_to_string(&self.stderr).unwrap_or_default()
            ),
        }
    }

    fn ask(&mut self, command: &str) -> Value {
        writeln!(self.stdin, "{command}").expect("the client reads its commands");
        let v = self.answer(command);
        assert!(v.get("error").is_none(), "{command}: {v}");
        v
    }

    /// Opens `n` sessions; the host of each.
    fn open(&mut self, n: usize) -> Vec<String> {
        let v = self.ask(&format!("open {n}"));
        v["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .map(|s| s["address"].as_str().expect("an address").to_owned())
            .collect()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn count(addrs: &[String], addr: &str) -> usize {
    addrs.iter().filter(|a| *a == addr).count()
}

/// Each session's completed dispatches, by the daemon's own count (root is an admin: every
/// session is listed).
async fn daemon_counts(d: &Daemon) -> Vec<(u64, u64)> {
    let mut c = d.connect().await;
    let s = tokio::time::timeout(
        PATIENCE,
        c.get_statistics(pb::GetStatisticsRequest::default()),
    )
    .await
    .expect("statistics within the bound")
    .expect("statistics")
    .into_inner();
    s.sessions
        .iter()
        .map(|x| {
            (
                x.session_id,
                x.dispatches
                    .as_ref()
                    .and_then(|d| d.success.as_ref())
                    .map_or(0, |d| d.count),
            )
        })
        .collect()
}

/// What the fault did: when the fleet saw the host down and its sessions failed.
fn check_lost(v: &Value, addr: &str, what: &str) {
    assert_eq!(
        v["done"], true,
        "{what}: not every session on {addr} was lost: {v}"
    );
    assert_eq!(v["named"], true, "{what}: {v}");
    for m in v["messages"].as_array().expect("messages") {
        let m = m.as_str().expect("a message");
        assert!(
            m.contains(&format!("its host {addr} went down")),
            "{what}: {m}"
        );
    }
    eprintln!(
        "figure {what}: fleet saw {addr} down after {} ms; its sessions failed with SessionLost \
         after {}..{} ms",
        v["fleet_down_ms"], v["first_lost_ms"], v["all_lost_ms"]
    );
}

fn rejoin(client: &mut Driver, addr: &str, what: &str) {
    let v = client.ask(&format!("wait-serving {addr} {WAIT_MS}"));
    assert!(
        v["serving_ms"].is_u64(),
        "{what}: {addr} never rejoined: {v}"
    );
    eprintln!(
        "figure {what}: {addr} took sessions again {} ms after it came back",
        v["serving_ms"]
    );
}

/// Stops the client's work and checks that no call hung, failed on a host that stayed up, or
/// ran a different number of times than the client saw. `alive` are the daemons whose
/// statistics can be read; `faulted` is the host the fault hit; `restarted` when its daemon
/// started again (its lost sessions' counts died with the old one, and their ids are reused).
async fn settle(
    client: &mut Driver,
    hosts: &[Daemon],
    alive: &[usize],
    faulted: usize,
    restarted: bool,
    what: &str,
) {
    let tally = client.ask("stop");
    assert_eq!(tally["hung"], 0, "{what}: {tally}");
    let sessions = tally["sessions"].as_array().expect("sessions");
    let (mut issued, mut ok, mut failed, mut extra) = (0, 0, 0, 0);
    // Session ids are per daemon: (host address, session id).
    let mut counts = Vec::new();
    for &i in alive {
        for (id, ran) in daemon_counts(&hosts[i]).await {
            counts.push((World::address(i), id, ran));
        }
    }
    for s in sessions {
        let id = s["session"].as_u64().expect("a session id");
        let addr = s["address"].as_str().expect("an address");
        let client_ok = s["ok"].as_u64().expect("ok");
        let f: u64 = s["failed"]
            .as_object()
            .expect("failed")
            .values()
            .filter_map(Value::as_u64)
            .sum();
        assert_eq!(s["in_flight"], 0, "{what}: a call never ended: {s}");
        assert_eq!(s["failed"].get("wrong_output"), None, "{what}: {s}");
        issued += s["issued"].as_u64().expect("issued");
        ok += client_ok;
        failed += f;
        let on_faulted = addr == World::address(faulted);
        if on_faulted && restarted && s["lost"] == true {
            continue;
        }
        if !on_faulted {
            assert_eq!(
                f, 0,
                "{what}: a session on a host that stayed up failed: {s}"
            );
        }
        let Some(&(_, _, ran)) = counts.iter().find(|(a, sid, _)| a == addr && *sid == id) else {
            assert!(on_faulted, "{what}: {addr} does not know session {id}");
            continue;
        };
        if on_faulted {
            assert!(
                ran >= client_ok && ran <= client_ok + 1,
                "{what}: session {id} on {addr}: the daemon ran {ran}, the client saw {client_ok} succeed"
            );
            extra += ran - client_ok;
        } else {
            assert_eq!(
                ran, client_ok,
                "{what}: session {id} on {addr}: the daemon ran {ran}, the client saw {client_ok} succeed"
            );
        }
    }
    eprintln!(
        "figure {what}: {issued} calls issued, {ok} checked ok, {failed} failed (all on the \
         faulted host), 0 hung, 0 lost, 0 run twice; {extra} of the failed had run on the \
         cut-off host, their answers cut off with it (the client got SessionLost)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_netns),
    ignore = "needs root, iproute2 (ip, tc), iptables and dnsmasq (Debian package dnsmasq-base)"
)]
async fn a_partitioned_host_loses_its_sessions_new_ones_go_elsewhere_and_it_rejoins() {
    let w = World::new();
    let mut client = w.client();
    let hosts = client.ask("hosts");
    let listed: Vec<&str> = hosts["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| {
            assert_eq!(h["health"], "serving", "{hosts}");
            h["address"].as_str().expect("an address")
        })
        .collect();
    let want: Vec<String> = (0..3).map(World::address).collect();
    assert_eq!(listed, want, "{NAME} resolved through dnsmasq");

    // Spread over the three (a probe refreshing host loads between opens may split them 4/3/2,
    // not 3/3/3).
    let first = client.open(9);
    for i in 0..3 {
        assert!(count(&first, &World::address(i)) >= 1, "{first:?}");
    }
    std::thread::sleep(Duration::from_secs(1));

    let cut = World::address(0);
    client.ask("mark");
    w.net.link("h1", false);
    let v = client.ask(&format!("wait-lost {cut} {WAIT_MS}"));
    check_lost(&v, &cut, "partition");
    let more = client.open(4);
    assert_eq!(count(&more, &cut), 0, "new sessions go elsewhere: {more:?}");

    client.ask("mark");
    w.net.link("h1", true);
    rejoin(&mut client, &cut, "partition");
    // It holds its three old sessions (their clients gave them up); the others hold five each.
    let back = client.open(3);
    assert!(
        count(&back, &cut) >= 1,
        "the rejoined host takes sessions: {back:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    settle(&mut client, &w.hosts, &[0, 1, 2], 0, false, "partition").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_netns),
    ignore = "needs root, iproute2 (ip, tc), iptables and dnsmasq (Debian package dnsmasq-base)"
)]
async fn a_slow_lossy_link_keeps_its_sessions_and_one_slower_than_its_traffic_loses_them() {
    let w = World::new();
    let mut client = w.client();
    let first = client.open(9);
    let slow = World::address(1);
    // Spread over the three (a probe refreshing host loads between opens may split them 4/3/2,
    // not 3/3/3): what follows needs sessions on this host.
    assert!(count(&first, &slow) >= 1, "{first:?}");

    // Slower and lossy, inside the timeouts: TCP retransmits, nothing fails.
    w.net.rate("h2", Some("4mbit"));
    w.net.loss("h2", Some(0.02));
    let before = client.ask("tally");
    std::thread::sleep(Duration::from_secs(3));
    let t = client.ask("tally");
    let ok = |t: &Value, host: &str| -> u64 {
        t["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .filter(|s| s["address"] == host)
            .filter_map(|s| s["ok"].as_u64())
            .sum()
    };
    for s in t["sessions"].as_array().expect("sessions") {
        assert_eq!(s["failed"], serde_json::json!({}), "{s}");
    }
    let during = ok(&t, &slow) - ok(&before, &slow);
    assert!(during > 0, "{t}");
    eprintln!(
        "figure slow lossy link (4 mbit/s, 2 % loss): {during} calls on {slow} in 3 s, all \
         checked ok, none failed"
    );
    w.net.loss("h2", None);
    w.net.rate("h2", None);

    // Slower than its traffic: packets wait longer and longer, past the probes' bound (1 s):
    // down, its sessions lost, new ones elsewhere.
    client.ask("mark");
    w.net.rate("h2", Some("16kbit"));
    let v = client.ask(&format!("wait-lost {slow} {WAIT_MS}"));
    check_lost(&v, &slow, "slow link (16 kbit/s)");
    let more = client.open(3);
    assert_eq!(
        count(&more, &slow),
        0,
        "new sessions go elsewhere: {more:?}"
    );

    client.ask("mark");
    w.net.rate("h2", None);
    rejoin(&mut client, &slow, "slow link");
    settle(&mut client, &w.hosts, &[0, 1, 2], 1, false, "slow link").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_netns),
    ignore = "needs root, iproute2 (ip, tc), iptables and dnsmasq (Debian package dnsmasq-base)"
)]
async fn a_killed_host_loses_its_sessions_and_rejoins_when_restarted() {
    let mut w = World::new();
    let mut client = w.client();
    let first = client.open(9);
    let killed = World::address(2);
    // Spread over the three (a probe refreshing host loads between opens may split them 4/3/2,
    // not 3/3/3): what follows needs sessions on this host.
    assert!(count(&first, &killed) >= 1, "{first:?}");
    std::thread::sleep(Duration::from_secs(1));

    client.ask("mark");
    w.hosts[2].send_signal(rustix::process::Signal::KILL);
    let v = client.ask(&format!("wait-lost {killed} {WAIT_MS}"));
    check_lost(&v, &killed, "SIGKILL");
    assert!(
        w.hosts[2].wait_exit(PATIENCE).is_some(),
        "SIGKILL ends npud"
    );
    let more = client.open(4);
    assert_eq!(
        count(&more, &killed),
        0,
        "new sessions go elsewhere: {more:?}"
    );

    w.hosts[2].restart();
    client.ask("mark");
    rejoin(&mut client, &killed, "SIGKILL (from ready)");
    let back = client.open(3);
    assert_eq!(
        count(&back, &killed),
        3,
        "the empty restarted host takes them: {back:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    settle(&mut client, &w.hosts, &[0, 1, 2], 2, true, "SIGKILL").await;
}

fn npuctl(w: &World, args: &[&str]) -> (bool, String, String) {
    let out = npud_e2e::netns::run_status(
        w.net
            .exec("client", &npud_e2e::npuctl_binary())
            .arg("--fleet")
            .arg(World::spec())
            .arg("--ca")
            .arg(&w.ca)
            .arg("--cert")
            .arg(&w.identity.0)
            .arg("--key")
            .arg(&w.identity.1)
            .args(args)
            .env_remove("NPUD_ADDR")
            .env_remove("NPUD_FLEET"),
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_netns),
    ignore = "needs root, iproute2 (ip, tc), iptables and dnsmasq (Debian package dnsmasq-base)"
)]
async fn npuctl_lists_the_fleet_by_its_name_and_runs_on_a_host_that_serves() {
    let w = World::new();
    let (ok, out, err) = npuctl(&w, &["fleet", "--json"]);
    assert!(ok, "{out}{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["fleet"], World::spec(), "{v}");
    let hosts = v["hosts"].as_array().expect("hosts");
    assert_eq!(hosts.len(), 3, "{v}");
    for (i, h) in hosts.iter().enumerate() {
        assert_eq!(h["address"], World::address(i), "{v}");
        assert_eq!(h["health"], "serving", "{v}");
    }

    let dir = w.net.dir().join("work");
    std::fs::create_dir_all(dir.join("vsa")).expect("a work directory");
    let g = Session::open(w.hosts[0].connect().await, "generation")
        .await
        .expect("a session")
        .generation()
        .await
        .expect("the generation");
    EmuDesign::vector_scalar_add(256, DType::I32, 7)
        .write_dir(&dir.join("vsa"), g)
        .expect("the design");
    let input: Vec<i32> = (0..256).collect();
    std::fs::write(dir.join("in.bin"), npud_e2e::i32_bytes(&input)).expect("the input");
    let p = |n: &str| dir.join(n).display().to_string();

    // One host cut off: the listing says so, and `run` goes to a host that serves.
    w.net.link("h1", false);
    let (ok, out, err) = npuctl(&w, &["fleet", "--json"]);
    assert!(ok, "{out}{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["hosts"][0]["health"], "down", "{v}");
    assert_eq!(v["hosts"][1]["health"], "serving", "{v}");
    for _ in 0..2 {
        let (ok, out, err) = npuctl(
            &w,
            &[
                "--json",
                "run",
                &p("vsa"),
                "--input",
                &p("in.bin"),
                "--output",
                &p("out.bin"),
            ],
        );
        assert!(ok, "{out}{err}");
        let v: Value = serde_json::from_str(&out).expect("JSON");
        assert_ne!(v["address"], World::address(0), "{v}");
        let got = npud_e2e::bytes_i32(&std::fs::read(dir.join("out.bin")).expect("the output"));
        assert_eq!(got, input.iter().map(|x| x + 7).collect::<Vec<_>>());
    }
    w.net.link("h1", true);
    let (ok, out, err) = npuctl(&w, &["fleet", "--json"]);
    assert!(ok, "{out}{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["hosts"][0]["health"], "serving", "{v}");
}
