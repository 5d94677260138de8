//! A caller is one principal (issue 20, findings 4 and 5): one process that opens sessions on
//! every listener with every credential it has (its uid on the Unix socket, its token, TLS
//! without a certificate from loopback, its client certificate) holds no more sessions and
//! causes no more device faults than one identity may; a loopback TCP caller is the uid the
//! kernel names, so two local users over loopback TCP have separate quotas, and a user the
//! Unix socket's mode keeps out is not served over loopback TCP either. The last test checks
//! the same against a daemon started from the Kubernetes ConfigMap's npud.toml.

#![forbid(unsafe_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use npu_artifacts::emu::EmuDesign;
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use npud_e2e::certs::Ca;
use npud_e2e::tokens::{TokenDir, secret};
use npud_e2e::{Daemon, Options, Session, with_identity_token};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Every test's bound.
const LIMIT: Duration = Duration::from_secs(120);

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test finished within its bound")
}

/// What one process holds: a CA-signed client certificate and a token file.
struct Credentials {
    dir: tempfile::TempDir,
    ca: Ca,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    tokens: TokenDir,
}

impl Credentials {
    fn new() -> Credentials {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "ca");
        let server = ca.server("server");
        let client = ca.leaf("client", &["client-a.example"], "client-a", false);
        Credentials {
            dir,
            ca,
            server,
            client,
            tokens: TokenDir::new(&["mine"]),
        }
    }

    /// A config file: TLS with optional client certificates, the token directory, `limits`.
    fn config(&self, limits: &str) -> String {
        let p = |s: &Path| format!("{:?}", s.display().to_string());
        let body = format!(
            "[tls]\ncert = {}\nkey = {}\nclient_ca = {}\nclient_auth = \"optional\"\n\
             [auth]\ntoken_dir = {}\n[limits]\n{limits}\n",
            p(&self.server.0),
            p(&self.server.1),
            p(&self.ca.path()),
            p(&self.tokens.path()),
        );
        let f = self.dir.path().join("npud.toml");
        std::fs::write(&f, body).unwrap();
        f.display().to_string()
    }
}

/// A TLS channel to `port` on loopback, with the client certificate or without.
async fn tls(c: &Credentials, port: u16, with_cert: bool) -> Channel {
    let mut t = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&c.ca.pem))
        .domain_name("localhost");
    if with_cert {
        t = t.identity(Identity::from_pem(
            std::fs::read(&c.client.0).unwrap(),
            std::fs::read(&c.client.1).unwrap(),
        ));
    }
    Endpoint::try_from(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(t)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

/// Every way the process can reach the daemon: (what it is, channel, token secret).
async fn every_way(
    d: &Daemon,
    c: &Credentials,
    port: u16,
) -> Vec<(&'static str, Channel, Option<String>)> {
    let mine = Some(secret("mine"));
    vec![
        ("uid on the Unix socket", d.channel().await, None),
        ("token on the Unix socket", d.channel().await, mine.clone()),
        ("TLS from loopback", tls(c, port, false).await, None),
        ("client certificate", tls(c, port, true).await, None),
        ("token over TLS", tls(c, port, false).await, mine.clone()),
        ("certificate and token", tls(c, port, true).await, mine),
    ]
}

/// Opens sessions every way until each is refused; returns how many opened, and the refusals.
async fn open_every_way(
    ways: &[(&'static str, Channel, Option<String>)],
    per_way: u32,
) -> (u32, Vec<String>) {
    let mut opened = 0;
    let mut refusals = Vec::new();
    for (what, ch, token) in ways {
        for i in 0..per_way {
            match NpudClient::new(ch.clone())
                .open_session(with_identity_token(
                    pb::OpenSessionRequest {
                        client_name: format!("{what} {i}"),
                        ..Default::default()
                    },
                    token.as_deref(),
                ))
                .await
            {
                Ok(_) => opened += 1,
                Err(e) => {
                    assert_eq!(e.code(), Code::ResourceExhausted, "{what}: {e:?}");
                    refusals.push(format!("{what}: {}", e.message()));
                    break;
                }
            }
        }
    }
    (opened, refusals)
}

/// Faults the device every way, `tries` times each, with new bytes each time; returns the
/// faults caused and the refusals seen.
async fn fault_every_way(
    ways: &[(&'static str, Channel, Option<String>)],
    tries: u32,
) -> (u32, Vec<String>) {
    let mut faults = 0;
    let mut refusals = Vec::new();
    let mut word = 0u32;
    for (what, ch, token) in ways {
        let mut s =
            match Session::open_as(NpudClient::new(ch.clone()), what, token.as_deref()).await {
                Ok(s) => s,
                Err(e) => {
                    refusals.push(format!("{what}: {}", e.message()));
                    continue;
                }
            };
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
        for _ in 0..tries {
            word += 1;
            let r = match s.register(&EmuDesign::fault(4096 - 32 * word)).await {
                Ok(reg) => s.dispatch(reg.program_id, &tensors).await.map(|_| ()),
                Err(e) => Err(e),
            };
            match r {
                Err(e) if e.code() == Code::Internal => faults += 1,
                Err(e) if e.code() == Code::ResourceExhausted => {
                    refusals.push(format!("{what}: {}", e.message()));
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    (faults, refusals)
}

/// Under `auth.require_token = ["unix"]`: checks that the ways without a token or a
/// certificate (the local user, on the Unix socket or over TCP) may not open a session, naming
/// the key, and returns the ways that carry the token.
async fn with_a_token_or_refused(
    ways: Vec<(&'static str, Channel, Option<String>)>,
) -> Vec<(&'static str, Channel, Option<String>)> {
    let mut carrying = Vec::new();
    for (what, ch, token) in ways {
        if token.is_some() {
            carrying.push((what, ch, token));
        } else if what != "client certificate" {
            let e = NpudClient::new(ch.clone())
                .open_session(pb::OpenSessionRequest {
                    client_name: what.into(),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
            assert!(e.message().contains("auth.require_token"), "{what}: {e:?}");
        }
    }
    assert_eq!(carrying.len(), 3);
    carrying
}

fn start(config: &str) -> Daemon {
    Daemon::start(
        Options {
            tcp: true,
            ..Options::default()
        }
        .arg("--config")
        .arg(config),
    )
}

fn me() -> String {
    format!("uid:{}", rustix::process::getuid().as_raw())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_with_every_credential_holds_one_principals_sessions() {
    bounded(async {
        let c = Credentials::new();
        let d = start(&c.config("max_sessions_per_uid = 3"));
        let port = d.tcp.unwrap().port();
        let ways = every_way(&d, &c, port).await;
        let (opened, refusals) = open_every_way(&ways, 3).await;
        assert_eq!(opened, 3, "{refusals:#?}");
        // Each refusal says which identity is full and why this caller counts as it.
        let me = me();
        assert!(
            refusals.iter().any(|r| r.starts_with(&format!(
                "token on the Unix socket: {me} already has 3 sessions \
                 (limits.max_sessions_per_uid) (this token:mine"
            )) && r
                .contains(&format!("connection is also {me}, and counts as it"))),
            "{refusals:#?}"
        );
        assert!(
            refusals.iter().any(|r| r.starts_with(&format!(
                "client certificate: {me} already has 3 sessions"
            ))),
            "{refusals:#?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_with_every_credential_has_one_principals_fault_budget() {
    bounded(async {
        let c = Credentials::new();
        let d = start(
            &c.config("fault_budget = 2\nfault_window_ms = 600000\nfault_cooldown_ms = 600000"),
        );
        let port = d.tcp.unwrap().port();
        let ways = every_way(&d, &c, port).await;
        let (faults, refusals) = fault_every_way(&ways, 2).await;
        assert_eq!(faults, 2, "{refusals:#?}");
        let me = me();
        assert!(
            refusals.iter().any(|r| r.starts_with(&format!(
                "client certificate: {me} faulted the device 2 times"
            ))),
            "{refusals:#?}"
        );
        // The daemon counted no more than that.
        let stats = NpudClient::new(d.channel().await)
            .get_statistics(pb::GetStatisticsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stats.device_faults, 2);
    })
    .await;
}

/// What `npud-test-client tcp-sessions` said, run as `uid`.
fn tcp_sessions_as(uid: u32, addr: &str, n: u32) -> serde_json::Value {
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(npud_e2e::binary("npud-test-client"))
        .arg("tcp-sessions")
        .arg(addr)
        .arg(n.to_string())
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim()).unwrap()
}

#[cfg_attr(not(as_root), ignore = "needs root to run clients under other uids")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_local_users_over_loopback_tcp_have_separate_quotas_and_the_sockets_mode_applies() {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        rustix::process::getuid().is_root(),
        "built as root (tests/build.rs) but run as another user: rebuild as this user"
    );
    let d = Daemon::start(
        Options {
            tcp: true,
            ..Options::default()
        }
        .env("NPUD_LIMITS__MAX_SESSIONS_PER_UID", "2"),
    );
    let addr = d.tcp.unwrap().to_string();
    let socket = d.socket.clone();
    let chmod = move |mode| {
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let v = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            chmod(0o666);
            let a = tcp_sessions_as(65534, &addr, 3);
            let b = tcp_sessions_as(65533, &addr, 2);
            // A user the socket's mode keeps out is not its uid over TCP either.
            chmod(0o660);
            let c = tcp_sessions_as(65532, &addr, 1);
            (a, b, c)
        }
    })
    .await
    .unwrap();
    let (a, b, c) = v;
    assert_eq!(a["identity"], "uid:65534", "{a}");
    assert_eq!(a["opened"], 2, "{a}");
    assert_eq!(a["code"], "ResourceExhausted", "{a}");
    assert!(
        a["message"]
            .as_str()
            .unwrap()
            .starts_with("uid:65534 already has 2 sessions"),
        "{a}"
    );
    assert_eq!(b["identity"], "uid:65533", "{b}");
    assert_eq!(b["opened"], 2, "another local user is not locked out: {b}");
    assert_eq!(c["identity"], "anonymous", "{c}");
    assert_eq!(c["opened"], 0, "{c}");
    assert_eq!(c["code"], "Unauthenticated", "{c}");
}

/// deploy/kubernetes/configmap.yaml's npud.toml, as shipped (paths moved, ports free), against
/// findings 4 and 5: one process over every listener with every credential it has holds one
/// identity's sessions (`limits.max_sessions_per_uid`, 16) and fault budget (3); and a loopback
/// TCP caller is its uid, not a shared `anonymous`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_configmap_serves_each_caller_as_one_principal() {
    bounded(async {
        let c = Credentials::new();
        let body = npud_e2e::configmap::configmap_npud_toml(npud_e2e::configmap::Paths {
            run: c.dir.path(),
            cert: &c.server.0,
            key: &c.server.1,
            client_ca: &c.ca.path(),
            tokens: &c.tokens.path(),
            state: &c.dir.path().join("state"),
        });
        let cfg = c.dir.path().join("configmap-npud.toml");
        std::fs::write(&cfg, &body).unwrap();
        let d = Daemon::start(
            Options::default()
                .arg("--config")
                .arg(&cfg.display().to_string()),
        );
        let ready = std::fs::read_to_string(d.dir.path().join("ready")).unwrap();
        let port: u16 = ready
            .lines()
            .find_map(|l| l.strip_prefix("tcp=0.0.0.0:"))
            .expect("a tcp= line")
            .parse()
            .unwrap();
        let ways = every_way(&d, &c, port).await;

        // Finding 5: TLS from loopback without a certificate is the local user.
        let info = NpudClient::new(ways[2].1.clone())
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.caller_identity, me());

        // Finding 3 holds on every way a local user has: the ConfigMap requires tokens of
        // local users (auth.require_token = ["unix"]), so skipping the token over the TCP port
        // is no way around it. Those ways get device info only.
        let ways = with_a_token_or_refused(ways).await;

        // Finding 4: sessions. The shipped quota is 16 (limits.max_sessions_per_uid): the
        // token's, however many listeners and credentials carry it (a certificate alone is
        // another principal the operator issued).
        let (opened, refusals) = open_every_way(&ways, 17).await;
        assert!(opened <= 16, "{opened} sessions: {refusals:#?}");
        drop(d);

        // Finding 4: faults. The shipped budget is 3.
        let d = Daemon::start(
            Options::default()
                .arg("--config")
                .arg(&cfg.display().to_string()),
        );
        let ready = std::fs::read_to_string(d.dir.path().join("ready")).unwrap();
        let port: u16 = ready
            .lines()
            .find_map(|l| l.strip_prefix("tcp=0.0.0.0:"))
            .expect("a tcp= line")
            .parse()
            .unwrap();
        let ways = with_a_token_or_refused(every_way(&d, &c, port).await).await;
        let (faults, refusals) = fault_every_way(&ways, 3).await;
        assert!(faults <= 3, "{faults} faults: {refusals:#?}");
    })
    .await;
}

/// Issue 20, finding 10: a caller's supplementary groups are those of the task that connected,
/// as the kernel recorded them at `connect` (`SO_PEERGROUPS`), not what `/proc/<pid>` says
/// later (another thread's, or another process's after the pid is reused). The client
/// connects from a thread whose only supplementary group is the one a rule requires; its
/// process's main thread is not in it.
#[cfg_attr(
    not(as_root),
    ignore = "needs root to set a thread's supplementary groups"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supplementary_groups_are_those_the_connecting_task_had() {
    assert!(
        rustix::process::getuid().is_root(),
        "built as root (tests/build.rs) but run as another user: rebuild as this user"
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("npud.toml");
    std::fs::write(
        &cfg,
        "[auth]\n[[auth.rules]]\nname = \"group-4242\"\nmatch = [\"gid:4242\"]\n",
    )
    .unwrap();
    let d = Daemon::start(
        Options::default()
            .arg("--config")
            .arg(&cfg.display().to_string()),
    );
    let socket = d.socket.clone();
    let run = move |gid: &str| {
        let out = std::process::Command::new(npud_e2e::binary("npud-test-client"))
            .arg("groups-at-connect")
            .arg(&socket)
            .arg(gid)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<serde_json::Value>(text.trim()).unwrap()
    };
    let v = tokio::task::spawn_blocking(move || (run("4242"), run("4243")))
        .await
        .unwrap();
    assert_eq!(v.0["code"], "OK", "{}", v.0);
    assert_eq!(v.1["code"], "PermissionDenied", "{}", v.1);
    assert_eq!(v.1["message"], "no rule in auth.rules allows uid:0");
}
