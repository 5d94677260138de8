//! No group of peers can refuse another: pre-authentication pools per local uid and per remote
//! prefix on every listener. Eight silent loopback TCP connections from one local user against
//! another local user; 64 silent connections from eight /24s against a ninth /24 (network
//! namespaces on a bridge, plaintext TCP with `--allow-insecure-tcp`); eight uids x 128 idle Unix
//! connections against root and a ninth uid. Each victim must be served (`GetDeviceInfo` OK, as
//! itself); the attackers' connections past their own pool may be refused.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;

use npud_e2e::Options;
use npud_e2e::bystander::Stand;
use npud_e2e::bystander::creds::{Caller, tokio_tcp, tokio_unix};
use npud_e2e::netns::{Net, run};

use crate::who_is;

/// The HTTP/2 client preface and an empty SETTINGS frame: a connection past its handshake that
/// then stays idle.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// Lets every local user connect to the daemon's Unix socket, so that each is a user of its own
/// (over loopback TCP too) rather than `anonymous`.
fn open_to_all(stand: &Stand) {
    std::fs::set_permissions(&stand.daemon.socket, std::fs::Permissions::from_mode(0o666))
        .expect("chmod the socket");
}

fn served_as(who: &str, expected: &str) -> Result<String, String> {
    let seen = format!("the victim got {who}");
    if who == expected {
        Ok(seen)
    } else {
        Err(format!("{seen}, expected to be served as {expected}"))
    }
}

#[cfg_attr(not(as_root), ignore = "needs root to connect as other users")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_silent_loopback_tcp_connections_of_one_user_against_another_user() {
    let stand = Stand::start(Options {
        tcp: true,
        ..Options::default()
    })
    .await;
    open_to_all(&stand);
    let to = stand.daemon.tcp.expect("TCP");
    let attack = async {
        let silent = tokio::task::spawn_blocking(move || Caller::user(65534).tcp(None, to, 8))
            .await
            .expect("the attacker's connections");
        let victim = tokio::task::spawn_blocking(move || Caller::user(65533).tcp(None, to, 1))
            .await
            .expect("the victim's connection")
            .pop()
            .expect("one");
        let who = match victim {
            Ok(s) => who_is(tokio_tcp(s)).await,
            Err(e) => format!("connect: {e}"),
        };
        drop(silent);
        who
    };
    stand
        .attack("8 silent loopback TCP connections of uid 65534", attack)
        .await
        .expect("another user served", |who| served_as(who, "uid:65533"))
        .finish();
}

#[cfg_attr(not(has_netns), ignore = "needs root and iproute2 (ip netns)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_silent_connections_from_eight_24s_against_a_ninth() {
    const PORT: u16 = 50051;
    let mut net = Net::create();
    let srv = net.host("srv", 1);
    let cli = net.host("cli", 2);
    // Nine /24s on the one link: the daemon's host is .1 in each, the peers' .2.
    for k in 1..=9u8 {
        for (ns, host) in [(&srv, 1u8), (&cli, 2)] {
            run(std::process::Command::new("ip").args([
                "-n",
                ns,
                "addr",
                "add",
                &format!("10.9.{k}.{host}/24"),
                "dev",
                "eth0",
            ]));
        }
    }
    let stand = Stand::start(
        Options {
            netns: Some(srv.clone()),
            ..Options::default()
        }
        .arg("--tcp")
        .arg(&format!("0.0.0.0:{PORT}"))
        .arg("--allow-insecure-tcp"),
    )
    .await;
    let peer = |k: u8| IpAddr::V4(Ipv4Addr::new(10, 9, k, 2));
    let daemon = |k: u8| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 9, k, 1)), PORT);
    // The daemon serves the ninth /24 before the attack.
    let ns = cli.clone();
    let before = tokio::task::spawn_blocking(move || {
        Caller::in_netns(&ns)
            .tcp(Some(peer(9)), daemon(9), 1)
            .pop()
            .expect("one")
    })
    .await
    .expect("connecting");
    let before = who_is(tokio_tcp(before.expect("a connection before the attack"))).await;
    assert_eq!(before, "anonymous@10.9.9.2", "before the attack");

    let attack = async {
        let ns = cli.clone();
        let silent = tokio::task::spawn_blocking(move || {
            (1..=8u8)
                .flat_map(|k| Caller::in_netns(&ns).tcp(Some(peer(k)), daemon(k), 8))
                .collect::<Vec<_>>()
        })
        .await
        .expect("the attackers' connections");
        let ns = cli.clone();
        let victim = tokio::task::spawn_blocking(move || {
            Caller::in_netns(&ns)
                .tcp(Some(peer(9)), daemon(9), 1)
                .pop()
                .expect("one")
        })
        .await
        .expect("connecting");
        let who = match victim {
            Ok(s) => who_is(tokio_tcp(s)).await,
            Err(e) => format!("connect: {e}"),
        };
        let opened = silent.iter().filter(|s| s.is_ok()).count();
        drop(silent);
        (who, opened)
    };
    stand
        .attack("64 silent connections from eight /24s", attack)
        .await
        .expect("a ninth /24 served", |(who, opened)| {
            served_as(who, "anonymous@10.9.9.2")
                .map(|s| format!("{s} ({opened} silent connections)"))
        })
        .finish();
    drop(stand);
    drop(net);
}

#[cfg_attr(not(as_root), ignore = "needs root to connect as other users")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_uids_with_128_idle_unix_connections_each_against_root_and_a_ninth_uid() {
    let stand = Stand::start(Options::default()).await;
    open_to_all(&stand);
    let socket = stand.daemon.socket.clone();
    let attack = async {
        let s = socket.clone();
        let idle = tokio::task::spawn_blocking(move || {
            let mut idle = Vec::new();
            for uid in 60_001..=60_008 {
                for c in Caller::user(uid).unix(&s, 128).into_iter().flatten() {
                    // Past the handshake, then quiet; a connection the daemon refused is gone.
                    if (&c).write_all(PREFACE).is_ok() {
                        idle.push(c);
                    }
                }
            }
            idle
        })
        .await
        .expect("the attackers' connections");
        let root = match tokio::net::UnixStream::connect(&socket).await {
            Ok(c) => who_is(c).await,
            Err(e) => format!("connect: {e}"),
        };
        let s = socket.clone();
        let ninth = tokio::task::spawn_blocking(move || Caller::user(60_009).unix(&s, 1))
            .await
            .expect("connecting")
            .pop()
            .expect("one");
        let ninth = match ninth {
            Ok(c) => who_is(tokio_unix(c)).await,
            Err(e) => format!("connect: {e}"),
        };
        let held = idle.len();
        drop(idle);
        (root, ninth, held)
    };
    let me = format!("uid:{}", rustix::process::getuid().as_raw());
    stand
        .attack("8 uids x 128 idle Unix connections", attack)
        .await
        .expect("root and a ninth uid served", |(root, ninth, held)| {
            let seen = format!("root got {root}, uid 60009 got {ninth} ({held} idle connections)");
            if *root == me && ninth == "uid:60009" {
                Ok(seen)
            } else {
                Err(seen)
            }
        })
        .finish();
}
