//! `npu_client::Fleet` over three real daemons on Unix sockets: sessions spread by load (each
//! daemon's own statistics count them), a host with pending work gets fewer, a killed host's
//! sessions fail with `SessionLost` naming it while new sessions go to the others, a restarted
//! host rejoins; a call in flight on a host that stops answering ends with `SessionLost` when
//! the fleet finds the host down; and `npuctl --fleet`. Every wait is bounded.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ClientError, ConnectOptions, Fleet, FleetOptions, FleetSpec, HostHealth};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session};

/// A bound for anything the tests wait for.
const PATIENCE: Duration = Duration::from_secs(20);

fn address(d: &Daemon) -> String {
    format!("unix:{}", d.socket.display())
}

fn spec(daemons: &[&Daemon]) -> String {
    daemons
        .iter()
        .map(|d| address(d))
        .collect::<Vec<_>>()
        .join(",")
}

/// A fleet that refreshes quickly and retries a failed host soon, so a test sees rejoining.
async fn fleet(daemons: &[&Daemon]) -> Fleet {
    let opts = FleetOptions {
        connect: ConnectOptions {
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(20),
            reconnect_timeout: Duration::from_secs(2),
            ..ConnectOptions::default()
        },
        refresh_interval: Duration::from_millis(200),
        retry_min: Duration::from_millis(100),
        retry_max: Duration::from_millis(500),
        ..FleetOptions::default()
    };
    Fleet::connect_with(FleetSpec::parse(&spec(daemons)).unwrap(), opts)
        .await
        .unwrap()
}

/// The daemon's own statistics.
async fn stats(d: &Daemon) -> pb::Statistics {
    let mut c = d.connect().await;
    tokio::time::timeout(
        PATIENCE,
        c.get_statistics(pb::GetStatisticsRequest::default()),
    )
    .await
    .expect("statistics within the bound")
    .unwrap()
    .into_inner()
}

/// Sessions open on the daemon, by its own count (and its list agrees).
async fn open_sessions(d: &Daemon) -> u32 {
    let s = stats(d).await;
    assert_eq!(s.open_sessions as usize, s.sessions.len(), "{s:?}");
    s.open_sessions
}

async fn open(fleet: &Fleet, n: usize) -> Vec<Client> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let c = tokio::time::timeout(PATIENCE, fleet.open())
            .await
            .expect("a session within the bound")
            .unwrap();
        out.push(c);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_sessions_spread_ten_per_idle_host() {
    let ds = [0; 3].map(|_| Daemon::start(Options::default()));
    let fleet = fleet(&[&ds[0], &ds[1], &ds[2]]).await;
    for h in fleet.hosts() {
        assert_eq!(h.health, HostHealth::Serving, "{h:?}");
    }
    let clients = open(&fleet, 30).await;
    for d in &ds {
        assert_eq!(open_sessions(d).await, 10, "{}", address(d));
    }
    // Each client says where it is, and that daemon knows its session.
    for d in &ds {
        let ids: Vec<u64> = stats(d)
            .await
            .sessions
            .iter()
            .map(|s| s.session_id)
            .collect();
        let here: Vec<u64> = clients
            .iter()
            .filter(|c| c.address().to_string() == address(d))
            .map(Client::session_id)
            .collect();
        assert_eq!(here.len(), 10);
        assert!(
            here.iter().all(|id| ids.contains(id)),
            "{here:?} vs {ids:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_pending_work_gets_fewer_sessions() {
    // The busy daemon's device hangs on its first dispatch for far longer than the test, and
    // four more wait behind it: five dispatches pending.
    let busy = Daemon::start(Options::default().arg("--emulator-timeout-ms").arg("60000"));
    let idle = [0; 2].map(|_| Daemon::start(Options::default()));
    let mut s = Session::open(busy.connect().await, "busy").await.unwrap();
    let hang = s.register(&EmuDesign::hang(4096)).await.unwrap();
    let mut tensors = Vec::new();
    for _ in 0..2 {
        let r = s
            .client
            .allocate_tensor(s.req(pb::AllocateTensorRequest {
                size_bytes: 4096,
                name: String::new(),
            }))
            .await
            .unwrap();
        tensors.push(r.into_inner().tensor_id);
    }
    let mut running = Vec::new();
    for _ in 0..5 {
        let mut s = s.clone();
        let t = tensors.clone();
        running.push(tokio::spawn(async move {
            s.dispatch(hang.program_id, &t).await
        }));
    }
    let until = Instant::now() + PATIENCE;
    while stats(&busy).await.pending_dispatches != 5 {
        assert!(
            Instant::now() < until,
            "the five dispatches never were pending"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let fleet = fleet(&[&idle[0], &busy, &idle[1]]).await;
    fleet.refresh().await;
    let seen = fleet.hosts();
    assert_eq!(seen[1].pending_dispatches, 5, "{seen:?}");
    assert!(!seen[1].next, "{seen:?}");
    let _clients = open(&fleet, 30).await;

    let on_busy = open_sessions(&busy).await - 1;
    let on_idle = [open_sessions(&idle[0]).await, open_sessions(&idle[1]).await];
    assert_eq!(on_busy + on_idle[0] + on_idle[1], 30);
    // The least pending work comes first: while the busy host's queue holds, it gets none.
    assert_eq!(on_busy, 0, "busy {on_busy}, idle {on_idle:?}");
    assert!(
        on_idle[0].abs_diff(on_idle[1]) <= 1,
        "the idle hosts share evenly: {on_idle:?}"
    );
    busy.send_signal(rustix::process::Signal::KILL);
    for r in running {
        let _ = r.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_host_loses_its_sessions_the_others_take_new_ones_and_it_rejoins() {
    let mut ds = [0; 3].map(|_| Daemon::start(Options::default()));
    let fleet = fleet(&[&ds[0], &ds[1], &ds[2]]).await;
    let clients = open(&fleet, 30).await;
    for d in &ds {
        assert_eq!(open_sessions(d).await, 10);
    }
    let killed = address(&ds[0]);
    ds[0].send_signal(rustix::process::Signal::KILL);
    assert!(ds[0].wait_exit(PATIENCE).is_some(), "SIGKILL ends npud");

    // New sessions go to the two others (the next turn was the killed host's: it fails over).
    let more = open(&fleet, 10).await;
    assert!(more.iter().all(|c| c.address().to_string() != killed));
    assert_eq!(
        open_sessions(&ds[1]).await + open_sessions(&ds[2]).await,
        30
    );
    let down = fleet
        .hosts()
        .into_iter()
        .find(|h| h.address.to_string() == killed)
        .unwrap();
    assert!(matches!(down.health, HostHealth::Down(_)), "{down:?}");

    // The killed host's sessions fail at once, naming it; the others' go on.
    let (lost, kept): (Vec<&Client>, Vec<&Client>) = clients
        .iter()
        .partition(|c| c.address().to_string() == killed);
    assert_eq!(lost.len(), 10);
    for c in &lost {
        let e = tokio::time::timeout(PATIENCE, c.programs())
            .await
            .expect("an answer within the bound")
            .unwrap_err();
        let ClientError::SessionLost { address, .. } = &e else {
            panic!("expected SessionLost, got {e}");
        };
        assert_eq!(*address, killed);
        let text = e.to_string();
        assert!(
            text.contains(&format!("its host {killed} went down")),
            "{text}"
        );
    }
    for c in &kept {
        c.programs().await.unwrap();
    }

    // Restarted, it rejoins by itself (its backoff is short here) and takes the next sessions,
    // having none; the sessions it lost stay lost.
    ds[0].restart();
    let until = Instant::now() + PATIENCE;
    while !fleet
        .hosts()
        .iter()
        .any(|h| h.address.to_string() == killed && h.health == HostHealth::Serving)
    {
        assert!(
            Instant::now() < until,
            "the restarted host never rejoined: {:?}",
            fleet.hosts()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let back = open(&fleet, 5).await;
    assert!(back.iter().all(|c| c.address().to_string() == killed));
    assert_eq!(open_sessions(&ds[0]).await, 5);
    assert!(matches!(
        lost[0].programs().await,
        Err(ClientError::SessionLost { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_finds_its_host_gone_before_the_fleet_does() {
    // The fleet does not refresh during the test: the session's own reconnect finds the host
    // gone, and the fleet learns it from the session.
    let mut ds = [0; 2].map(|_| Daemon::start(Options::default()));
    let opts = FleetOptions {
        connect: ConnectOptions {
            reconnect_timeout: Duration::from_millis(500),
            ..ConnectOptions::default()
        },
        refresh_interval: Duration::from_secs(3600),
        ..FleetOptions::default()
    };
    let fleet = Fleet::connect_with(FleetSpec::parse(&spec(&[&ds[0], &ds[1]])).unwrap(), opts)
        .await
        .unwrap();
    let first = fleet.open().await.unwrap();
    let gone = first.address().to_string();
    let i = usize::from(gone != address(&ds[0]));
    ds[i].send_signal(rustix::process::Signal::KILL);
    assert!(ds[i].wait_exit(PATIENCE).is_some());
    let e = tokio::time::timeout(PATIENCE, first.programs())
        .await
        .expect("an answer within the bound")
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::SessionLost { address, .. } if *address == gone),
        "{e}"
    );
    assert!(e.to_string().contains("went down"), "{e}");
    let h = fleet
        .hosts()
        .into_iter()
        .find(|h| h.address.to_string() == gone)
        .unwrap();
    assert!(matches!(h.health, HostHealth::Down(_)), "{h:?}");
    let next = fleet.open().await.unwrap();
    assert_ne!(next.address().to_string(), gone);
}

fn npuctl(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(npud_e2e::npuctl_binary())
        .args(args)
        .env_remove("NPUD_ADDR")
        .env_remove("NPUD_FLEET")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npuctl_lists_the_fleet_and_runs_through_it() {
    let ds = [0; 2].map(|_| Daemon::start(Options::default()));
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nobody.sock");
    let list = format!("{},unix:{}", spec(&[&ds[0], &ds[1]]), missing.display());

    let (ok, out, err) = npuctl(&["--fleet", &list, "fleet", "--json"]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let hosts = v["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 3, "{v}");
    assert_eq!(hosts[0]["health"], "serving", "{v}");
    assert_eq!(hosts[1]["health"], "serving", "{v}");
    assert_eq!(hosts[2]["health"], "down", "{v}");
    assert!(
        hosts[2]["reason"]
            .as_str()
            .unwrap()
            .contains("No such file"),
        "{v}"
    );
    assert_eq!(hosts.iter().filter(|h| h["next"] == true).count(), 1, "{v}");
    assert_eq!(v["next"], hosts[0]["address"], "{v}");

    let (ok, out, _) = npuctl(&["--fleet", &list, "fleet"]);
    assert!(ok);
    assert!(out.contains("<- next") && out.contains("down: "), "{out}");

    // `run` opens its session through the fleet: on the host with fewer sessions.
    let mut held = Session::open(ds[0].connect().await, "held").await.unwrap();
    let g = held.generation().await.unwrap();
    let design = EmuDesign::vector_scalar_add(256, DType::I32, 7);
    std::fs::create_dir(dir.path().join("vsa")).unwrap();
    design.write_dir(&dir.path().join("vsa"), g).unwrap();
    let input: Vec<i32> = (0..256).collect();
    let bytes: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(dir.path().join("in.bin"), bytes).unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let (ok, out, err) = npuctl(&[
        "--fleet",
        &list,
        "--json",
        "run",
        &p("vsa"),
        "--input",
        &p("in.bin"),
        "--output",
        &p("out.bin"),
    ]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["address"], address(&ds[1]), "{v}");
    let got = std::fs::read(dir.path().join("out.bin")).unwrap();
    let got: Vec<i32> = got
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, input.iter().map(|x| x + 7).collect::<Vec<_>>());

    // No host serves: exit 1, every host and why.
    let nowhere = format!("unix:{},unix:{}", missing.display(), p("other.sock"));
    let (ok, _, err) = npuctl(&["--fleet", &nowhere, "run", &p("vsa")]);
    assert!(!ok);
    assert!(
        err.contains("no npud host of the fleet can take a session")
            && err.contains("nobody.sock: down (")
            && err.contains("other.sock: down ("),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_ends_with_session_lost_when_the_fleet_finds_its_host_down() {
    // A stopped daemon keeps its connections open and answers nothing, as a host cut off by
    // the network does: the call waits, the fleet's probe gets no answer within the connect
    // timeout, and the call ends then, long before its own timeout.
    let ds = [0; 2].map(|_| Daemon::start(Options::default()));
    let opts = FleetOptions {
        connect: ConnectOptions {
            connect_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(60),
            ..ConnectOptions::default()
        },
        refresh_interval: Duration::from_millis(200),
        ..FleetOptions::default()
    };
    let fleet = Fleet::connect_with(FleetSpec::parse(&spec(&[&ds[0], &ds[1]])).unwrap(), opts)
        .await
        .unwrap();
    let c = fleet.open().await.unwrap();
    let gone = c.address().to_string();
    let i = usize::from(gone != address(&ds[0]));
    ds[i].send_signal(rustix::process::Signal::STOP);
    let answer = tokio::time::timeout(PATIENCE, c.programs()).await;
    ds[i].send_signal(rustix::process::Signal::CONT);
    let e = answer
        .expect("the call ends when the fleet finds the host down, not at its 60 s timeout")
        .unwrap_err();
    let ClientError::SessionLost { address, .. } = &e else {
        panic!("expected SessionLost, got {e}");
    };
    assert_eq!(*address, gone);
    assert!(
        e.to_string()
            .contains(&format!("its host {gone} went down")),
        "{e}"
    );
    // Every later call names the host too.
    let later = c.programs().await.unwrap_err().to_string();
    assert!(
        later.contains(&format!("its host {gone} went down")),
        "{later}"
    );
}
