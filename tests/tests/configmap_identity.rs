//! The Kubernetes ConfigMap's npud.toml, started as a daemon, against the ways a pod or another
//! node user could take or skip an identity: token secrets no other uid can read, no symbolic
//! link followed and a token directory open to others refused (at start and while running);
//! no call but GetDeviceInfo and health without a token on the Unix socket, and no uid (root
//! included) an admin; an identity per allocation, so the next pod given a share does not
//! inherit the previous one's fault cool-down, and a revoked token ends the calls still open
//! with it; unknown secrets that cost one directory scan per interval, not one each.
//!
//! Token files are written by the device plugin's own code (`TokenDir`), as the plugin writes
//! them. The second uid is 65534 (nobody); run as root, as CI does, for that part.

#![forbid(unsafe_code)]

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ConnectOptions};
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use npud_device_plugin::shares::Allocation;
use npud_device_plugin::token::TokenDir;
use npud_e2e::configmap::{Paths, configmap_npud_toml};
use npud_e2e::{Daemon, Options, with_session};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tonic::Code;
use tonic::transport::Channel;

/// Every test's bound.
const LIMIT: Duration = Duration::from_secs(60);

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test finished within its bound")
}

fn me() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A node as the DaemonSet leaves it: a CA and npud's certificate, the token directory as the
/// plugin prepares it (npud's uid, mode 0700), and npud.toml from the ConfigMap.
struct Node {
    dir: tempfile::TempDir,
    tokens: PathBuf,
    plugin: TokenDir,
    config: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::Builder::new()
            .prefix("cmid")
            .tempdir_in("/tmp")
            .unwrap();
        // Others may enter the node's directory: only the token directory keeps them out.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = p.self_signed(&key).unwrap();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, ca_cert.pem()).unwrap();
        let issuer = Issuer::new(p, key);
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&server_key, &issuer)
            .unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, server.pem()).unwrap();
        std::fs::write(&key, server_key.serialize_pem()).unwrap();
        let tokens = dir.path().join("tokens");
        let plugin = TokenDir::prepare(&tokens, me()).unwrap();
        let body = configmap_npud_toml(Paths {
            run: dir.path(),
            cert: &cert,
            key: &key,
            client_ca: &ca,
            tokens: &tokens,
            state: &dir.path().join("state"),
        });
        let config = dir.path().join("npud.toml");
        std::fs::write(&config, body).unwrap();
        Node {
            dir,
            tokens,
            plugin,
            config,
        }
    }

    fn options(&self) -> Options {
        Options::default()
            .arg("--config")
            .arg(&self.config.display().to_string())
    }

    /// The plugin's Allocate of `share`: a fresh secret in `npu0-share-<share>`.
    fn allocate(&self, share: u32) -> String {
        let a = Allocation::from_token_name(&format!("npu0-share-{share}")).unwrap();
        let name = self.plugin.issue(&a).unwrap();
        let text = std::fs::read_to_string(self.tokens.join(name)).unwrap();
        text.trim_end().to_owned()
    }
}

/// A pod: npu-client on the Unix socket with its token.
async fn pod(d: &Daemon, secret: &str) -> Client {
    Client::connect_with(
        Some(&d.socket.display().to_string()),
        ConnectOptions {
            token: Some(secret.to_owned()),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap()
}

fn with_token<T>(mut r: tonic::Request<T>, secret: &str) -> tonic::Request<T> {
    r.metadata_mut()
        .insert(npu_proto::IDENTITY_TOKEN_HEADER, secret.parse().unwrap());
    r
}

async fn raw(d: &Daemon) -> NpudClient<Channel> {
    d.connect().await
}

/// Runs `cmd arg` as uid and gid 65534; its stderr when it fails.
fn as_nobody(cmd: &str, arg: &Path) -> Result<String, String> {
    let out = Command::new(cmd)
        .arg(arg)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Calls GetDeviceInfo with `secret` until `done` accepts the answer, within the bound.
async fn until_info(
    c: &mut NpudClient<Channel>,
    secret: &str,
    done: impl Fn(&Result<pb::DeviceInfo, tonic::Status>) -> bool,
) -> Result<pb::DeviceInfo, tonic::Status> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .get_device_info(with_token(
                tonic::Request::new(pb::GetDeviceInfoRequest {}),
                secret,
            ))
            .await
            .map(tonic::Response::into_inner);
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < until, "not within 10 s: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_npud_and_the_pod_read_a_secret_no_link_is_followed_and_an_open_directory_is_refused()
{
    bounded(async {
        let node = Node::new();
        let secret = node.allocate(3);
        let file = node.tokens.join("npu0-share-3");
        assert_eq!(
            std::fs::metadata(&node.tokens)
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o700
        );
        if me() == 0 {
            // Another node user can neither read the token by its (well-known) name nor list
            // the directory.
            let e = as_nobody("cat", &file).unwrap_err();
            assert!(e.contains("Permission denied"), "{e}");
            let e = as_nobody("ls", &node.tokens).unwrap_err();
            assert!(e.contains("Permission denied"), "{e}");
            // ... which it could with a file of its own in an open directory.
            let open = node.dir.path().join("open");
            std::fs::write(&open, &secret).unwrap();
            assert_eq!(as_nobody("cat", &open).unwrap(), secret);
            std::fs::remove_file(&open).unwrap();
        } else {
            eprintln!("not root: no second uid to try");
        }

        let d = Daemon::start(node.options());
        let mut c = raw(&d).await;
        let info = until_info(&mut c, &secret, Result::is_ok).await.unwrap();
        assert!(
            info.caller_identity.starts_with("token:npu0-share-3@"),
            "{info:?}"
        );

        // A symbolic link in the directory is no token file, whatever it points to.
        let outside = node.dir.path().join("outside");
        let linked = "L".repeat(48);
        std::fs::write(&outside, &linked).unwrap();
        std::os::unix::fs::symlink(&outside, node.tokens.join("npu0-share-5")).unwrap();
        let e = c
            .get_device_info(with_token(
                tonic::Request::new(pb::GetDeviceInfoRequest {}),
                &linked,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("unknown secret"), "{e:?}");

        // Opened to others while npud runs: refused at the next scan, saying why.
        std::fs::set_permissions(&node.tokens, std::fs::Permissions::from_mode(0o711)).unwrap();
        let e = until_info(&mut c, &secret, Result::is_err)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert_eq!(
            e.message(),
            format!(
                "x-npud-token: no token identity works: auth.token_dir {} is owned by uid {} \
                 with mode 0711; it must be a directory (not a symbolic link) owned by npud's \
                 uid {} with no access for group or others (mode 0700): token files hold \
                 secrets",
                node.tokens.display(),
                me(),
                me()
            )
        );
        std::fs::set_permissions(&node.tokens, std::fs::Permissions::from_mode(0o700)).unwrap();
        until_info(&mut c, &secret, Result::is_ok).await.unwrap();
        drop(d);

        // And at start.
        std::fs::set_permissions(&node.tokens, std::fs::Permissions::from_mode(0o711)).unwrap();
        let (status, stderr) = Daemon::try_start(node.options()).unwrap_err();
        assert!(!status.success());
        assert!(
            stderr.contains(&format!(
                "auth.token_dir {} is owned by uid {} with mode 0711; it must be a directory",
                node.tokens.display(),
                me()
            )),
            "{stderr}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_token_a_caller_gets_device_info_and_health_only_and_no_uid_is_an_admin() {
    bounded(async {
        let node = Node::new();
        let secret = node.allocate(3);
        let d = Daemon::start(node.options());
        let mut c = raw(&d).await;
        let uid = format!("uid:{}", me());

        // No token (this test's uid, root in CI, as a pod running as root would be).
        let info = c
            .get_device_info(tonic::Request::new(pb::GetDeviceInfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.caller_identity, uid);
        assert!(!info.caller_admin, "{info:?}");
        let health = Command::new(npud_e2e::npuctl_binary())
            .arg("--addr")
            .arg(format!("unix:{}", d.socket.display()))
            .arg("health")
            .env_remove("NPUD_TOKEN_FILE")
            .env_remove("NPUD_ADDR")
            .output()
            .unwrap();
        assert!(
            health.status.success(),
            "the DaemonSet's probe: {}",
            String::from_utf8_lossy(&health.stderr)
        );
        // `npuctl status` without a token shows the device (GetDeviceInfo answers) and says
        // why the counters are not shown; it printed nothing before. Not a terminal: no line
        // is padded.
        let status = Command::new(npud_e2e::npuctl_binary())
            .arg("--addr")
            .arg(format!("unix:{}", d.socket.display()))
            .arg("status")
            .env_remove("NPUD_TOKEN_FILE")
            .env_remove("NPUD_ADDR")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(
            status.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&status.stderr)
        );
        assert!(
            text.contains("device:") && text.contains("emulator"),
            "{text}"
        );
        let refused = text
            .lines()
            .find_map(|l| l.strip_prefix("statistics:"))
            .map(str::trim_start);
        assert!(
            refused.is_some_and(|r| r.starts_with(&format!(
                "not shown: GetStatistics failed (UNAUTHENTICATED): {uid} presented no identity \
                 token"
            ))),
            "{text}"
        );
        assert!(
            text.lines().all(|l| l == l.trim_end()),
            "padded lines: {text:?}"
        );
        let expected = format!(
            "{uid} presented no identity token (the x-npud-token metadata: npuctl \
             --token-file, NPUD_TOKEN_FILE), which auth.require_token = [\"unix\"] requires on \
             the unix listener; without one a caller may call only GetDeviceInfo and the health \
             service"
        );
        let refusals = [
            c.open_session(tonic::Request::new(pb::OpenSessionRequest {
                client_name: "root-pod".into(),
                ..Default::default()
            }))
            .await
            .map(drop),
            c.get_statistics(tonic::Request::new(pb::GetStatisticsRequest::default()))
                .await
                .map(drop),
            c.list_programs(tonic::Request::new(pb::ListProgramsRequest::default()))
                .await
                .map(drop),
            c.clear_quarantine(tonic::Request::new(pb::ClearQuarantineRequest {
                content_hash: "0".repeat(64),
            }))
            .await
            .map(drop),
        ];
        for r in refusals {
            let e = r.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
            assert_eq!(e.message(), expected);
        }

        // With its token a pod is its allocation, and no admin.
        let e = c
            .clear_quarantine(with_token(
                tonic::Request::new(pb::ClearQuarantineRequest {
                    content_hash: "0".repeat(64),
                }),
                &secret,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().starts_with(
                "ClearQuarantine is allowed only to admins (auth.admins: token:admin@*); this \
                 caller is token:npu0-share-3@"
            ),
            "{e:?}"
        );

        // The admin token, as deploy/kubernetes/README.md has an operator make it: readable by
        // npud's uid only, in the directory no pod can reach.
        let admin = "A".repeat(48);
        let admin_file = node.tokens.join("admin");
        std::fs::write(&admin_file, format!("{admin}\n")).unwrap();
        std::fs::set_permissions(&admin_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let info = until_info(&mut c, &admin, Result::is_ok).await.unwrap();
        assert!(info.caller_admin, "{info:?}");
        assert!(info.caller_identity.starts_with("token:admin@"), "{info:?}");
        let r = c
            .clear_quarantine(with_token(
                tonic::Request::new(pb::ClearQuarantineRequest {
                    content_hash: "0".repeat(64),
                }),
                &admin,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(!r.removed);
    })
    .await;
}

/// A design that faults at once on the emulator.
fn program(c: &Client, design: &EmuDesign, name: &str) -> npu_client::Program {
    npu_client::Program::from_bytes(name, design.to_pdi(), design.insts(c.generation())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_pod_given_a_share_is_a_new_identity_and_revocation_ends_open_calls() {
    bounded(async {
        let node = Node::new();
        let d = Daemon::start(
            node.options()
                .env("NPUD_LIMITS__FAULT_BUDGET", "1")
                .env("NPUD_LIMITS__FAULT_COOLDOWN_MS", "600000"),
        );

        // Pod A faults the device once: its identity is cooled down.
        let first = node.allocate(3);
        let a = pod(&d, &first).await;
        let a_identity = a.device_info().await.unwrap().caller_identity;
        assert!(
            a_identity.starts_with("token:npu0-share-3@"),
            "{a_identity}"
        );
        let fault = program(&a, &EmuDesign::fault(4096), "fault");
        a.register(&fault).await.unwrap();
        let i = a.alloc::<u8>(4096).await.unwrap();
        let mut o = a.alloc::<u8>(4096).await.unwrap();
        assert!(a.dispatch(&fault, &[&i], &mut [&mut o]).await.is_err());
        let good = program(
            &a,
            &EmuDesign::vector_scalar_add(1024, DType::I32, 1),
            "good",
        );
        let e = a.register(&good).await.unwrap_err().to_string();
        assert!(
            e.contains("RESOURCE_EXHAUSTED") && e.contains(&a_identity),
            "{e}"
        );

        // Calls A has open with its token: a Submit stream and a WriteTensor, both idle.
        let mut c = raw(&d).await;
        let s = c
            .open_session(with_token(
                tonic::Request::new(pb::OpenSessionRequest {
                    client_name: "a-raw".into(),
                    ..Default::default()
                }),
                &first,
            ))
            .await
            .unwrap()
            .into_inner();
        let submit = with_token(
            with_session(
                tokio_stream::pending::<pb::SubmitRequest>(),
                s.session_id,
                &s.token,
            ),
            &first,
        );
        let mut submitted = c.submit(submit).await.unwrap().into_inner();
        let write = with_token(
            with_session(
                tokio_stream::pending::<pb::WriteTensorChunk>(),
                s.session_id,
                &s.token,
            ),
            &first,
        );
        let mut c2 = c.clone();
        let writing = tokio::spawn(async move { c2.write_tensor(write).await });
        tokio::time::sleep(Duration::from_millis(100)).await;

        // The kubelet gives share 3 to pod B: a fresh secret, a new identity.
        let second = node.allocate(3);
        let revoked_at = Instant::now();
        let e = submitted.message().await.unwrap_err();
        let submit_ended = revoked_at.elapsed();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert_eq!(
            e.message(),
            format!(
                "{a_identity} was revoked: its file in auth.token_dir was removed or rewritten; \
                 its calls, streams, rings and sessions end"
            )
        );
        let e = writing.await.unwrap().unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("was revoked"), "{e:?}");
        eprintln!("the Submit stream ended {submit_ended:?} after the token was rewritten");
        // A's secret no longer works for anything.
        let e = a.device_info().await.unwrap_err().to_string();
        assert!(e.contains("UNAUTHENTICATED"), "{e}");

        // B does not inherit A's cool-down.
        let b = pod(&d, &second).await;
        let b_identity = b.device_info().await.unwrap().caller_identity;
        assert!(
            b_identity.starts_with("token:npu0-share-3@"),
            "{b_identity}"
        );
        assert_ne!(b_identity, a_identity);
        let good = program(
            &b,
            &EmuDesign::vector_scalar_add(1024, DType::I32, 1),
            "good",
        );
        b.register(&good).await.unwrap();
        let i = b.tensor_from(&[0i32; 1024]).await.unwrap();
        let mut o = b.alloc::<i32>(1024).await.unwrap();
        b.dispatch(&good, &[&i], &mut [&mut o]).await.unwrap();
        o.download().await.unwrap();
        assert_eq!(o.as_slice()[..3], [1, 1, 1]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_secrets_cost_one_directory_scan_per_interval_not_one_each() {
    bounded(async {
        let node = Node::new();
        for share in 0..8 {
            node.allocate(share);
        }
        let d = Daemon::start(
            node.options()
                .env("RUST_LOG", "info,npud::auth::tokens=debug")
                .env("NPUD_AUTH__TOKEN_POLL_MS", "1000"),
        );
        let scans = |d: &Daemon| d.stderr().matches("token directory scanned").count();
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(raw(&d).await);
        }
        const CALLS: usize = 200;
        let before = scans(&d);
        let started = Instant::now();
        let mut calls = Vec::new();
        for k in 0..CALLS {
            let mut c = clients[k % clients.len()].clone();
            calls.push(tokio::spawn(async move {
                let unknown = format!("{:0>48}", k);
                c.get_device_info(with_token(
                    tonic::Request::new(pb::GetDeviceInfoRequest {}),
                    &unknown,
                ))
                .await
            }));
        }
        for call in calls {
            let e = call.await.unwrap().unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
            assert!(e.message().contains("unknown secret"), "{e:?}");
        }
        let elapsed = started.elapsed();
        let during = scans(&d) - before;
        // One scan per auth.token_poll_ms (and the one under way), however many calls.
        let allowed = 2 + usize::try_from(elapsed.as_millis() / 1000).unwrap();
        eprintln!("{CALLS} unknown secrets in {elapsed:?}: {during} scans");
        assert!(
            (1..=allowed).contains(&during),
            "{during} scans for {CALLS} unknown secrets in {elapsed:?}"
        );
    })
    .await;
}
