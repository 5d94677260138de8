//! Local identity from the kernel, exactly: a loopback TCP peer is the user holding its socket.
//! A peer that writes a request and closes at once leaves a `TIME_WAIT` row (an orphaned
//! socket, printed with uid 0) where the daemon looks its user up: the caller must never become
//! `uid:0` (checked in the sessions the peers opened and in the daemon's log). 20,000 rows in
//! the table (`TIME_WAIT`s of earlier connections, as any user's churn leaves them) make the
//! daemon's read of it slow enough for the peers to have closed when it reaches their rows.
//! Both tests run the daemon in a network namespace of its own, whose table is theirs alone. And with 60,000 sockets in the table, the lookup must stay cheap and
//! exact: a churn of loopback connections (50 a second) neither turns callers `anonymous` nor
//! costs the daemon more per connection than three times what it costs with a small table.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;
use npud_e2e::bystander::Stand;
use npud_e2e::bystander::creds::{Caller, root, tcp_from, tokio_tcp};
use npud_e2e::bystander::wire::raw_h2_request;
use npud_e2e::netns::Net;
use npud_e2e::{Options, Session};

/// The peers' uid: as root, a user of no importance; otherwise this process's own.
/// Connections the peer opens, in bursts of `BURST`.
const PEERS: usize = 320;
const BURST: usize = 32;

fn peer_uid() -> u32 {
    if root() {
        65534
    } else {
        rustix::process::getuid().as_raw()
    }
}

#[cfg_attr(not(has_netns), ignore = "needs root and iproute2 (ip netns)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_writes_and_closes_at_once_is_never_uid_0() {
    let (_net, ns) = namespace();
    let stand = Stand::start(Options {
        tcp: true,
        grace_ms: 60_000,
        netns: Some(ns.clone()),
        ..Options::default()
    })
    .await;
    let addr = stand.daemon.tcp.expect("TCP");
    // 20,000 rows (any user's churn leaves them): reading the table takes long enough that the
    // peers have closed by the time the daemon reads their rows.
    let rows = time_wait_rows(&ns, 20_000).await;
    assert!(rows >= 20_000, "{rows} rows");
    let peer = peer_uid();
    let attack = async {
        tokio::task::spawn_blocking(move || {
            Caller {
                uid: (peer != rustix::process::getuid().as_raw()).then_some(peer),
                netns: Some(ns),
            }
            .run(move || {
                // Bursts: the later connections of a burst are closed before the daemon
                // accepts them and looks their user up.
                let requests: Vec<Vec<u8>> = (0..PEERS)
                    .map(|i| {
                        let open = prost::Message::encode_to_vec(&pb::OpenSessionRequest {
                            client_name: format!("closed-peer-{i}"),
                            ..Default::default()
                        });
                        raw_h2_request("/npud.v1.Npud/OpenSession", &[], &open)
                    })
                    .collect();
                for burst in requests.chunks(BURST) {
                    for bytes in burst {
                        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
                            let _ = std::io::Write::write_all(&mut s, bytes);
                            // Closed at once: the socket is orphaned, and its row is printed
                            // with uid 0 until it is gone.
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .await
        .expect("the peer");
        // What the daemon made of them, once it has read what they sent.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut me = Session::open(stand.daemon.connect().await, "admin")
            .await
            .unwrap();
        let stats = me.statistics().await.unwrap();
        stats
            .sessions
            .iter()
            .filter(|s| s.client_name.starts_with("closed-peer-"))
            .map(|s| s.identity.clone())
            .collect::<Vec<String>>()
    };
    let v = stand
        .attack("peers that write and close at once", attack)
        .await;
    let logged_root = stand
        .daemon
        .stderr()
        .lines()
        .filter(|l| l.contains("session opened") && l.contains("closed-peer-"))
        .filter(|l| l.contains("identity=uid:0 "))
        .count();
    v.expect("identity (never uid:0)", |identities| {
        let as_root = identities.iter().filter(|i| *i == "uid:0").count();
        let seen = format!(
            "the peers (uid {peer}) opened {} sessions: {as_root} as uid:0 ({logged_root} logged), \
             the others {:?}",
            identities.len(),
            identities
                .iter()
                .filter(|i| *i != "uid:0")
                .take(3)
                .collect::<Vec<_>>()
        );
        if as_root == 0 && logged_root == 0 {
            Ok(seen)
        } else {
            Err(seen)
        }
    })
    .finish();
}

/// A network namespace of its own, so that its socket table is the test's alone.
fn namespace() -> (Net, String) {
    let mut net = Net::create();
    let ns = net.host("npud", 1);
    (net, ns)
}

/// `n` rows in namespace `ns`'s TCP table that hold no descriptor: connections closed first by
/// their client, whose sockets stay in `TIME_WAIT` for 60 s (from four loopback addresses to
/// four listeners, as connection churn leaves them). Returns the rows the table then has.
async fn time_wait_rows(ns: &str, n: usize) -> usize {
    let ns = ns.to_owned();
    tokio::task::spawn_blocking(move || {
        Caller::in_netns(&ns).run(move || {
            let listeners: Vec<std::net::TcpListener> = (0..4)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a listener"))
                .collect();
            let to: Vec<SocketAddr> = listeners
                .iter()
                .map(|l| l.local_addr().expect("an address"))
                .collect();
            for i in 0..n {
                // Ports chosen here: the kernel's search for a free one slows as they fill.
                let from = SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(127, 0, 0, [2, 3, 4, 5][i % 4])),
                    10_000 + u16::try_from(i / 4).expect("at most 222,140 rows"),
                );
                let client = tcp_from(Some(from), to[i % 4])
                    .unwrap_or_else(|e| panic!("connection {i} from {from}: {e}"));
                let (server, _) = listeners[i % 4].accept().expect("accept");
                // The client closes first, so its end is the one in TIME_WAIT.
                drop(client);
                drop(server);
            }
            std::fs::read_to_string("/proc/thread-self/net/tcp")
                .map(|t| t.lines().count().saturating_sub(1))
                .unwrap_or(0)
        })
    })
    .await
    .expect("the rows")
}

/// `n` connections to the daemon's loopback port from namespace `ns`, one every `every`, each
/// asking who it is. Returns the identities (or what failed) in order.
async fn who_am_i(ns: &str, to: SocketAddr, n: usize, every: Duration) -> Vec<String> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let ns = ns.to_owned();
        tasks.push(tokio::spawn(async move {
            let s = tokio::task::spawn_blocking(move || {
                Caller::in_netns(&ns).tcp(None, to, 1).pop().expect("one")
            })
            .await
            .expect("connecting");
            let s = match s {
                Ok(s) => s,
                Err(e) => return format!("connect: {e}"),
            };
            crate::who_is(tokio_tcp(s)).await
        }));
        tokio::time::sleep(every).await;
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a caller"));
    }
    out
}

/// The daemon's CPU time per connection, in ms, while 100 callers (one every 20 ms) ask who
/// they are with the bystander paused; and what they were told.
async fn cost(stand: &Stand, ns: &str, to: SocketAddr) -> (f64, Vec<String>) {
    const N: usize = 100;
    stand.bystander.pause();
    let before = stand.daemon.cpu_ticks();
    let who = who_am_i(ns, to, N, Duration::from_millis(20)).await;
    let ticks = stand.daemon.cpu_ticks() - before;
    stand.bystander.resume();
    let ms = ticks as f64 * 1e3 / rustix::param::clock_ticks_per_second() as f64;
    (ms / N as f64, who)
}

#[cfg_attr(not(has_netns), ignore = "needs root and iproute2 (ip netns)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_thousand_sockets_in_the_table() {
    let (_net, ns) = namespace();
    let stand = Stand::start(Options {
        tcp: true,
        netns: Some(ns.clone()),
        ..Options::default()
    })
    .await;
    let to = stand.daemon.tcp.expect("TCP");
    let me = format!("uid:{}", rustix::process::getuid().as_raw());

    // The cost with a small table, in the same run.
    let started = Instant::now();
    let (small, who) = cost(&stand, &ns, to).await;
    assert!(
        who.iter().all(|w| *w == me),
        "before the table grew: {who:?}"
    );
    let rows = time_wait_rows(&ns, 60_000).await;
    assert!(rows >= 60_000, "{rows} rows");
    eprintln!("{rows} rows after {:.1} s", started.elapsed().as_secs_f64());

    let attack = who_am_i(&ns, to, 200, Duration::from_millis(20));
    let v = stand
        .attack("60,000 sockets, 50 loopback connections a second", attack)
        .await;
    let (large, who_after) = cost(&stand, &ns, to).await;
    eprintln!("measured after {:.1} s", started.elapsed().as_secs_f64());
    v.expect("identity and lookup cost", |who| {
        let wrong: Vec<&String> = who.iter().chain(&who_after).filter(|w| **w != me).collect();
        let bound = (3.0 * small).max(1.0);
        let seen = format!(
            "{} of {} callers were not {me} (e.g. {:?}); daemon CPU per connection {large:.2} ms \
             with 60,000 sockets, {small:.2} ms with a small table (at most {bound:.2})",
            wrong.len(),
            who.len() + who_after.len(),
            wrong.first()
        );
        if wrong.is_empty() && large <= bound {
            Ok(seen)
        } else {
            Err(seen)
        }
    })
    .finish();
}
