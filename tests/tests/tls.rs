//! Remote callers: TLS and mTLS on the TCP listener, identities (client certificates, tokens),
//! the `[auth]` policy's rules, quotas and admins, sessions bound to their identity, SIGHUP
//! certificate reloads, and the refusal to listen off loopback in plaintext.
//!
//! Certificates are made here with rcgen; identities other than the test's own uid come from
//! client certificates and token files, so every test runs as root or not.

#![forbid(unsafe_code)]

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use npu_artifacts::emu::EmuDesign;
use npu_client::{Client, ConnectOptions, Operator};
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use npud_e2e::certs::Ca;
use npud_e2e::configmap::{Paths, configmap_npud_toml};
use npud_e2e::{Daemon, Options, Session, with_session};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Every test's bound.
const LIMIT: Duration = Duration::from_secs(60);

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test finished within its bound")
}

/// Writes `npud.toml` with `body` into `dir`; returns its path.
fn config(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("npud.toml");
    std::fs::write(&p, body).unwrap();
    p
}

fn tls_section(cert: &Path, key: &Path) -> String {
    format!(
        "[tls]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    )
}

fn start(cfg: &Path) -> Daemon {
    Daemon::start(
        Options {
            tcp: true,
            ..Options::default()
        }
        .arg("--config")
        .arg(&cfg.display().to_string()),
    )
}

/// A TLS channel to the daemon's TCP port, trusting `ca`, presenting `identity` (cert, key).
async fn tls_channel(
    d: &Daemon,
    ca: &str,
    identity: Option<&(PathBuf, PathBuf)>,
) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((c, k)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(c).unwrap(),
            std::fs::read(k).unwrap(),
        ));
    }
    let port = d.tcp.expect("a TCP port").port();
    let ep = Endpoint::try_from(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5));
    let ch = ep.connect().await.map_err(|e| format!("{e:?}"))?;
    // A handshake the server refuses surfaces at the first call.
    NpudClient::new(ch.clone())
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(ch)
}

fn opts(ca: &Path, identity: Option<&(PathBuf, PathBuf)>) -> ConnectOptions {
    ConnectOptions {
        tls_ca: Some(ca.to_path_buf()),
        tls_cert: identity.map(|i| i.0.clone()),
        tls_key: identity.map(|i| i.1.clone()),
        tls_domain: Some("localhost".into()),
        connect_timeout: Duration::from_secs(5),
        call_timeout: Duration::from_secs(10),
        ..ConnectOptions::default()
    }
}

/// A request carrying an identity token's secret.
fn with_token<T>(mut r: tonic::Request<T>, secret: &str) -> tonic::Request<T> {
    r.metadata_mut()
        .insert(npu_proto::IDENTITY_TOKEN_HEADER, secret.parse().unwrap());
    r
}

fn https(d: &Daemon) -> String {
    format!("https://127.0.0.1:{}", d.tcp.expect("a TCP port").port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_the_right_ca_connects_and_one_with_another_ca_is_refused() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "ca");
        let other = Ca::new(dir.path(), "other");
        let (cert, key) = ca.server("server");
        let d = start(&config(dir.path(), &tls_section(&cert, &key)));

        // npu-client with the CA file: TLS from this host without a client certificate, so the
        // caller is the local user the kernel names, as on the Unix socket; allowed a session.
        let me = format!("uid:{}", rustix::process::getuid().as_raw());
        let c = Client::connect_with(Some(&https(&d)), opts(&ca.path(), None))
            .await
            .unwrap();
        let info = c.device_info().await.unwrap();
        assert_eq!(info.tcp_security, "tls");
        assert_eq!(info.tcp_address, d.tcp.unwrap().to_string());
        assert_eq!(info.caller_identity, me);
        let mut t = c.tensor_from(&[1i32, 2, 3]).await.unwrap();
        t.upload().await.unwrap();
        t.copy_from_slice(&[0, 0, 0]).unwrap();
        t.download().await.unwrap();
        assert_eq!(t.to_vec(), vec![1, 2, 3]);
        let stats = c.statistics().await.unwrap();
        assert_eq!(stats.sessions.len(), 1);
        assert_eq!(stats.sessions[0].identity, me);

        // Another CA: the server's certificate is not trusted.
        let e = Client::connect_with(Some(&https(&d)), opts(&other.path(), None))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot reach npud"), "{e}");
        assert!(
            e.to_lowercase().contains("certificate") || e.contains("UnknownIssuer"),
            "{e}"
        );
        assert!(tls_channel(&d, &other.pem, None).await.is_err());

        // Plaintext to the TLS port gets no answer from npud.v1.
        let plain = Endpoint::try_from(format!("http://{}", d.tcp.unwrap()))
            .unwrap()
            .connect()
            .await;
        if let Ok(ch) = plain {
            let r = NpudClient::new(ch)
                .get_device_info(pb::GetDeviceInfoRequest {})
                .await;
            assert!(r.is_err(), "plaintext was served on the TLS port");
        }
        // The ready file names both listeners.
        let ready = std::fs::read_to_string(d.dir.path().join("ready")).unwrap();
        assert_eq!(
            ready,
            format!(
                "ready\nunix={}\ntcp={}\n",
                d.socket.display(),
                d.tcp.unwrap()
            )
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_identities_rules_quotas_admins_and_sessions_bound_to_their_identity() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "ca");
        let (cert, key) = ca.server("server");
        let a = ca.leaf("a", &["client-a.example"], "ignored", false);
        let b = ca.leaf("b", &[], "client-b", false);
        let ops = ca.leaf("ops", &["ops.example"], "ops", false);
        let body = format!(
            "{}client_ca = {:?}\nclient_auth = \"required\"\n\n[auth]\n\
             admins = [\"cert:dns:ops.example\"]\n\
             [[auth.rules]]\nname = \"no-b\"\nmatch = [\"cert:cn:client-b\"]\nallow = false\n\
             [[auth.rules]]\nname = \"clients\"\nmatch = [\"cert:*\"]\nmax_sessions = 1\n\
             max_tensor_bytes_per_session = 8192\n",
            tls_section(&cert, &key),
            ca.path().display().to_string()
        );
        let d = start(&config(dir.path(), &body));

        // No client certificate: the handshake is refused.
        let e = tls_channel(&d, &ca.pem, None).await.unwrap_err();
        assert!(!e.is_empty());
        // (With TLS 1.3 the client's side of the handshake completes first; the refusal ends
        // the connection, and the first call fails.)
        assert!(
            Client::connect_with(Some(&https(&d)), opts(&ca.path(), None))
                .await
                .is_err()
        );

        // client-a: its identity is its certificate's SAN.
        let ca_ch = tls_channel(&d, &ca.pem, Some(&a)).await.unwrap();
        let mut sa = Session::open(NpudClient::new(ca_ch.clone()), "a")
            .await
            .unwrap();
        let info = sa
            .client
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.tcp_security, "mtls-required");
        assert_eq!(info.caller_identity, "cert:dns:client-a.example");
        assert!(!info.caller_admin);

        // The rule's quotas: one session, 8 KiB of tensors per session.
        let e = Session::open(NpudClient::new(ca_ch.clone()), "a2")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert_eq!(
            e.message(),
            "cert:dns:client-a.example already has 1 sessions (auth.rules[\"clients\"].max_sessions); \
             close one, or let an abandoned one end after its grace period"
        );
        for _ in 0..2 {
            let r = sa
                .client
                .allocate_tensor(sa.req(pb::AllocateTensorRequest {
                    size_bytes: 4096,
                    name: String::new(),
                }))
                .await
                .unwrap();
            assert!(r.into_inner().fd_ticket.is_empty(), "no fd over TCP");
        }
        let e = sa
            .client
            .allocate_tensor(sa.req(pb::AllocateTensorRequest {
                size_bytes: 1,
                name: String::new(),
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message()
                .ends_with("at most 8192 (auth.rules[\"clients\"].max_tensor_bytes_per_session)"),
            "{e:?}"
        );

        // client-b (CN only): a rule refuses it, by name.
        let cb = tls_channel(&d, &ca.pem, Some(&b)).await.unwrap();
        let e = Session::open(NpudClient::new(cb.clone()), "b")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert_eq!(
            e.message(),
            "cert:cn:client-b is refused by rule \"no-b\" (auth.rules)"
        );
        let e = NpudClient::new(cb)
            .get_statistics(pb::GetStatisticsRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

        // ops presents a's session id and token: refused, the session is a's.
        let ops_ch = tls_channel(&d, &ca.pem, Some(&ops)).await.unwrap();
        let mut ops_client = NpudClient::new(ops_ch);
        let e = ops_client
            .allocate_tensor(with_session(
                pb::AllocateTensorRequest {
                    size_bytes: 16,
                    name: String::new(),
                },
                sa.id,
                &sa.token,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert_eq!(
            e.message(),
            format!(
                "session {} belongs to cert:dns:client-a.example; this caller is cert:dns:ops.example",
                sa.id
            )
        );
        let e = ops_client
            .resume_session(pb::ResumeSessionRequest {
                session_id: sa.id,
                token: sa.token.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

        // Admin-only calls: a may see only its own session and may not clear a quarantine;
        // ops (an admin) sees every session and may.
        let mut so = Session::open(ops_client.clone(), "ops").await.unwrap();
        let mine = sa.statistics().await.unwrap();
        assert_eq!(
            mine.sessions
                .iter()
                .map(|s| s.identity.as_str())
                .collect::<Vec<_>>(),
            ["cert:dns:client-a.example"]
        );
        let all = so.statistics().await.unwrap();
        let mut who: Vec<_> = all.sessions.iter().map(|s| s.identity.clone()).collect();
        who.sort();
        assert_eq!(who, ["cert:dns:client-a.example", "cert:dns:ops.example"]);
        let hash = "0".repeat(64);
        let e = sa
            .client
            .clear_quarantine(pb::ClearQuarantineRequest {
                content_hash: hash.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert_eq!(
            e.message(),
            "ClearQuarantine is allowed only to admins (auth.admins: cert:dns:ops.example); this \
             caller is cert:dns:client-a.example"
        );
        let r = so
            .client
            .clear_quarantine(pb::ClearQuarantineRequest { content_hash: hash })
            .await;
        assert!(
            r.as_ref()
                .map_or_else(|e| e.code() != Code::PermissionDenied, |_| true),
            "{r:?}"
        );
        let info = so
            .client
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(info.caller_admin);

        // Issue 20, finding 6: certificates whose e-mail SAN, URI SAN or bare common name is
        // the admin's DNS name are other callers, not the admin: each kind of name is its own
        // namespace, and a bare common name is matched only where a rule names it.
        let email = ca.leaf_with("imp-email", vec![rcgen::SanType::Rfc822Name(
            "ops.example".try_into().unwrap(),
        )]);
        let uri = ca.leaf_with("imp-uri", vec![rcgen::SanType::URI(
            "ops.example".try_into().unwrap(),
        )]);
        let cn = ca.leaf("imp-cn", &[], "ops.example", false);
        for (imp, name) in [
            (&email, "cert:email:ops.example"),
            (&uri, "cert:uri:ops.example"),
            (&cn, "cert:cn:ops.example"),
        ] {
            let mut c = NpudClient::new(tls_channel(&d, &ca.pem, Some(imp)).await.unwrap());
            let info = c
                .get_device_info(pb::GetDeviceInfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(info.caller_identity, name);
            assert!(!info.caller_admin, "{name} is not the admin");
            let e = c
                .clear_quarantine(pb::ClearQuarantineRequest {
                    content_hash: "0".repeat(64),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
            let e = c
                .allocate_tensor(with_session(
                    pb::AllocateTensorRequest {
                        size_bytes: 16,
                        name: String::new(),
                    },
                    so.id,
                    &so.token,
                ))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied, "{name} may not use the admin's session");
        }
        // `cert:*` does not reach a bare common name: no rule allows it.
        let e = Session::open(
            NpudClient::new(tls_channel(&d, &ca.pem, Some(&cn)).await.unwrap()),
            "cn",
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert_eq!(e.message(), "no rule in auth.rules allows cert:cn:ops.example");

        // npuctl with --ca/--cert/--key shows who owns each session.
        let out = std::process::Command::new(npud_e2e::npuctl_binary())
            .args([
                "sessions",
                "--json",
                "--addr",
                &https(&d),
                "--tls-server-name",
                "localhost",
            ])
            .arg("--ca")
            .arg(ca.path())
            .arg("--cert")
            .arg(&ops.0)
            .arg("--key")
            .arg(&ops.1)
            .env_remove("NPUD_ADDR")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("\"identity\": \"cert:dns:client-a.example\""),
            "{text}"
        );
        let out = std::process::Command::new(npud_e2e::npuctl_binary())
            .args(["status", "--addr", &https(&d)])
            .env("NPUD_CA", ca.path())
            .env("NPUD_CERT", &a.0)
            .env("NPUD_KEY", &a.1)
            .env("NPUD_TLS_SERVER_NAME", "localhost")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("cert:dns:client-a.example"), "{text}");
        assert!(text.contains("mtls-required"), "{text}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_serves_a_new_certificate_to_new_connections_and_keeps_old_ones() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let ca1 = Ca::new(dir.path(), "ca1");
        let ca2 = Ca::new(dir.path(), "ca2");
        let (cert, key) = ca1.server("server");
        let d = start(&config(dir.path(), &tls_section(&cert, &key)));

        let old = tls_channel(&d, &ca1.pem, None).await.unwrap();
        let mut s = Session::open(NpudClient::new(old), "old").await.unwrap();

        // The files now hold a certificate of another CA.
        let (c2, k2) = ca2.server("server2");
        std::fs::copy(&c2, &cert).unwrap();
        std::fs::copy(&k2, &key).unwrap();
        d.send_signal(rustix::process::Signal::HUP);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !d.stderr().contains("SIGHUP: reloaded") {
            assert!(std::time::Instant::now() < until, "{}", d.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(tls_channel(&d, &ca2.pem, None).await.is_ok());
        assert!(tls_channel(&d, &ca1.pem, None).await.is_err());
        // The old connection still serves its session.
        let r = s
            .client
            .allocate_tensor(s.req(pb::AllocateTensorRequest {
                size_bytes: 64,
                name: String::new(),
            }))
            .await;
        assert!(r.is_ok(), "{r:?}");

        // A reload that fails keeps the certificate in use, and says why.
        std::fs::write(&key, "not a key").unwrap();
        d.send_signal(rustix::process::Signal::HUP);
        while !d.stderr().contains("reloading TLS failed") {
            assert!(std::time::Instant::now() < until, "{}", d.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(d.stderr().contains("tls.key"), "{}", d.stderr());
        assert!(tls_channel(&d, &ca2.pem, None).await.is_ok());
    })
    .await;
}

/// Puts `files` (name, source) into a new directory `..<version>` of `dir` and points `..data`
/// at it with one rename, as the kubelet updates a mounted Secret; the names in `dir` are
/// symlinks through `..data`.
fn kubelet_update(dir: &Path, version: &str, files: &[(&str, &Path)]) {
    let new = dir.join(format!("..{version}"));
    std::fs::create_dir(&new).unwrap();
    for (name, from) in files {
        std::fs::copy(from, new.join(name)).unwrap();
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

/// Issue 20, finding 10: in Kubernetes nothing sends SIGHUP when a Secret rotates; the daemon
/// sees the kubelet's symlink swap and serves the new certificate to new connections, and
/// keeps the old one when the new files do not load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_rotated_as_the_kubelet_does_it_is_served_without_a_signal() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let ca1 = Ca::new(dir.path(), "ca1");
        let ca2 = Ca::new(dir.path(), "ca2");
        let ca3 = Ca::new(dir.path(), "ca3");
        let (c1, k1) = ca1.server("server1");
        let (c2, k2) = ca2.server("server2");
        let (c3, _) = ca3.server("server3");
        let mount = dir.path().join("secret");
        std::fs::create_dir(&mount).unwrap();
        kubelet_update(
            &mount,
            "2026_12_01_a",
            &[("tls.crt", &c1), ("tls.key", &k1)],
        );
        let body = format!(
            "{}reload_interval_ms = 100\n",
            tls_section(&mount.join("tls.crt"), &mount.join("tls.key"))
        );
        let d = start(&config(dir.path(), &body));
        let old = tls_channel(&d, &ca1.pem, None).await.unwrap();

        // The Secret rotates to a certificate of another CA: new connections get it.
        kubelet_update(
            &mount,
            "2026_12_01_b",
            &[("tls.crt", &c2), ("tls.key", &k2)],
        );
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while tls_channel(&d, &ca2.pem, None).await.is_err() {
            assert!(
                std::time::Instant::now() < until,
                "the rotated certificate was never served: {}",
                d.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(tls_channel(&d, &ca1.pem, None).await.is_err());
        // The connection made before still works.
        NpudClient::new(old)
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .unwrap();

        // A rotation to files that do not fit (a certificate with another's key) keeps the
        // certificate in use, and says why.
        kubelet_update(
            &mount,
            "2026_12_01_c",
            &[("tls.crt", &c3), ("tls.key", &k2)],
        );
        while !d.stderr().contains("reloading them failed") {
            assert!(std::time::Instant::now() < until, "{}", d.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(tls_channel(&d, &ca2.pem, None).await.is_ok());
        assert!(tls_channel(&d, &ca3.pem, None).await.is_err());
    })
    .await;
}

#[test]
fn plaintext_off_loopback_is_refused_at_start_unless_allowed() {
    let e = Daemon::try_start(Options::default().arg("--tcp").arg("0.0.0.0:0")).unwrap_err();
    assert_eq!(e.0.code(), Some(2), "{}", e.1);
    assert!(
        e.1.contains(
            "configuration key tcp: 0.0.0.0:0 is not a loopback address, and without TLS session \
             tokens and tensor bytes would cross the network in the clear"
        ),
        "{}",
        e.1
    );
    assert!(e.1.contains("--allow-insecure-tcp"), "{}", e.1);

    let d = Daemon::start(
        Options::default()
            .arg("--tcp")
            .arg("0.0.0.0:0")
            .arg("--allow-insecure-tcp"),
    );
    let ready = std::fs::read_to_string(d.dir.path().join("ready")).unwrap();
    let tcp = ready
        .lines()
        .find_map(|l| l.strip_prefix("tcp="))
        .expect("a tcp= line");
    let port: u16 = tcp.strip_prefix("0.0.0.0:").unwrap().parse().unwrap();
    assert_ne!(port, 0, "the real port");
    assert!(d.stderr().contains(&format!("npud listening on tcp {tcp}")));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(bounded(async {
        let op = Operator::connect(Some(&format!("http://127.0.0.1:{port}")))
            .await
            .unwrap();
        let info = op.device_info().await.unwrap();
        assert_eq!(info.tcp_address, tcp);
        assert_eq!(info.tcp_security, "plaintext");
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_files_are_identities_until_removed_with_their_rules_quotas() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::create_dir(&tokens).unwrap();
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o700)).unwrap();
        let secret = "s3cr3t-Token_for-pod-a-0123456789abcdef";
        std::fs::write(tokens.join("pod-a"), format!("{secret}\n")).unwrap();
        std::fs::write(tokens.join("pod-b"), "b".repeat(64)).unwrap();
        let body = format!(
            "[auth]\ntoken_dir = {:?}\n\
             [[auth.rules]]\nname = \"batch\"\nmatch = [\"token:pod-b@*\"]\n\
             max_pending_per_session = 1\n\
             [[auth.rules]]\nname = \"pods\"\nmatch = [\"token\"]\n\
             max_program_bytes_per_session = 64\n\
             [[auth.rules]]\nname = \"local\"\nmatch = [\"uid:*\"]\n",
            tokens.display().to_string()
        );
        let d = Daemon::start(
            Options::default()
                .arg("--config")
                .arg(&config(dir.path(), &body).display().to_string())
                .arg("--emulator-timeout-ms")
                .arg("1000"),
        );

        // pod-b's rule allows one dispatch in flight: a second, while a hanging one waits for
        // the emulator's timeout, is refused naming the rule's key. Through gRPC: a ring's
        // submission is admitted when the executor next looks at the ring, after the hang
        // (`fastpath.rs` checks the rule's limit on a ring).
        let cb = Client::connect_with(
            Some(&d.socket.display().to_string()),
            ConnectOptions {
                token: Some("b".repeat(64)),
                fast_path: false,
                ..ConnectOptions::default()
            },
        )
        .await
        .unwrap();
        let design = EmuDesign::hang(4);
        let hang =
            npu_client::Program::from_bytes("hang", design.to_pdi(), design.insts(cb.generation()))
                .unwrap();
        cb.register(&hang).await.unwrap();
        let (i1, i2) = (
            cb.alloc::<u8>(4).await.unwrap(),
            cb.alloc::<u8>(4).await.unwrap(),
        );
        let (mut o1, mut o2) = (
            cb.alloc::<u8>(4).await.unwrap(),
            cb.alloc::<u8>(4).await.unwrap(),
        );
        let (first, second) = tokio::join!(
            async { cb.dispatch(&hang, &[&i1], &mut [&mut o1]).await },
            async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                cb.dispatch(&hang, &[&i2], &mut [&mut o2]).await
            }
        );
        assert!(first.is_err(), "the hang times out");
        let e = second.unwrap_err().to_string();
        assert_eq!(
            e,
            "Dispatch failed (RESOURCE_EXHAUSTED): the session already has 1 dispatches queued \
             (auth.rules[\"batch\"].max_pending_per_session)"
        );

        // npu-client with token_file: the session is token:pod-a's.
        let token_file = tokens.join("pod-a");
        let c = Client::connect_with(
            Some(&d.socket.display().to_string()),
            ConnectOptions {
                token_file: Some(token_file.clone()),
                ..ConnectOptions::default()
            },
        )
        .await
        .unwrap();
        // The identity names the file and the allocation (the secret's digest).
        let pod_a = c.device_info().await.unwrap().caller_identity;
        assert!(pod_a.starts_with("token:pod-a@"), "{pod_a}");
        assert_eq!(pod_a.len(), "token:pod-a@".len() + 8, "{pod_a}");
        let stats = c.statistics().await.unwrap();
        assert_eq!(stats.sessions.len(), 1);
        assert_eq!(stats.sessions[0].identity, pod_a);

        // The rule's program-byte quota.
        let e = c
            .register(&{
                let design = EmuDesign::noop(2, 4096);
                npu_client::Program::from_bytes(
                    "noop",
                    design.to_pdi(),
                    design.insts(c.generation()),
                )
                .unwrap()
            })
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("(auth.rules[\"pods\"].max_program_bytes_per_session)"),
            "{e}"
        );

        // The local uid's own session is not the token's, and the token's is not the uid's.
        let mut raw = d.connect().await;
        let r = raw
            .open_session(with_token(
                tonic::Request::new(pb::OpenSessionRequest {
                    client_name: "raw".into(),
                    ..Default::default()
                }),
                secret,
            ))
            .await
            .unwrap()
            .into_inner();
        let e = raw
            .allocate_tensor(with_session(
                pb::AllocateTensorRequest {
                    size_bytes: 16,
                    name: String::new(),
                },
                r.session_id,
                &r.token,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().starts_with(&format!(
                "session {} belongs to {pod_a}; this caller is uid:",
                r.session_id
            )),
            "{e:?}"
        );
        // The daemon's own uid is an admin (auth.admins' default "self"): it sees every session.
        let uid_stats = Session::open(d.connect().await, "uid")
            .await
            .unwrap()
            .statistics()
            .await
            .unwrap();
        assert!(
            uid_stats
                .sessions
                .iter()
                .any(|s| s.identity.starts_with("uid:"))
        );
        assert!(uid_stats.sessions.iter().any(|s| s.identity == pod_a));
        // A token identity is no admin.
        let e = raw
            .clear_quarantine(with_token(
                tonic::Request::new(pb::ClearQuarantineRequest {
                    content_hash: "0".repeat(64),
                }),
                secret,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().contains(&format!("this caller is {pod_a}")),
            "{e:?}"
        );
        let token_stats = raw
            .get_statistics(with_token(
                tonic::Request::new(pb::GetStatisticsRequest::default()),
                secret,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(
            token_stats.sessions.iter().all(|s| s.identity == pod_a),
            "{token_stats:?}"
        );
        assert_eq!(token_stats.sessions.len(), 2);

        // An unknown secret is UNAUTHENTICATED.
        let e = raw
            .get_device_info(with_token(
                tonic::Request::new(pb::GetDeviceInfoRequest {}),
                "unknown-secret-unknown-secret-unknown-secret",
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("unknown secret"), "{e:?}");

        // A removed file stops working within auth.token_poll_ms, for calls in its sessions
        // too.
        std::fs::remove_file(&token_file).unwrap();
        let e = loop {
            match c.statistics().await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => break e.to_string(),
            }
        };
        assert!(e.contains("UNAUTHENTICATED"), "{e}");
        assert!(c.tensor_from(&[1i32]).await.is_err());
    })
    .await;
}

/// deploy/kubernetes/configmap.yaml's npud.toml, with its paths moved into a temporary
/// directory and its ports made free, starts a daemon: TLS with optional client certificates
/// on a non-loopback listener, metrics, and the device plugin's token files as identities.
/// (The manifests' own test checks the file against the DaemonSet; this checks it against
/// the daemon that reads it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_configmaps_npud_toml_starts_a_daemon() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "ca");
        let (cert, key) = ca.server("server");
        let tokens = dir.path().join("tokens");
        std::fs::create_dir(&tokens).unwrap();
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o700)).unwrap();
        let secret = "k".repeat(48);
        std::fs::write(tokens.join("npu0-share-3"), format!("{secret}\n")).unwrap();
        let p = |s: &Path| s.display().to_string();
        let body = configmap_npud_toml(Paths {
            run: dir.path(),
            cert: &cert,
            key: &key,
            client_ca: &ca.path(),
            tokens: &tokens,
            state: &dir.path().join("state"),
        });
        let d = Daemon::start(
            Options::default()
                .arg("--config")
                .arg(&p(&config(dir.path(), &body))),
        );
        let ready = std::fs::read_to_string(d.dir.path().join("ready")).unwrap();
        let port: u16 = ready
            .lines()
            .find_map(|l| l.strip_prefix("tcp=0.0.0.0:"))
            .expect("a tcp= line on every address")
            .parse()
            .unwrap();
        assert!(
            ready.lines().any(|l| l.starts_with("metrics=127.0.0.1:")),
            "{ready}"
        );

        // A remote caller with the CA but no client certificate (client_auth = "optional").
        let op = Operator::connect_with(
            Some(&format!("https://127.0.0.1:{port}")),
            opts(&ca.path(), None),
        )
        .await
        .unwrap();
        let info = op.device_info().await.unwrap();
        assert_eq!(info.tcp_security, "mtls-optional");
        assert!(info.metrics_address.starts_with("127.0.0.1:"), "{info:?}");

        // A pod's token, over the socket the device plugin mounts, is the pod's identity.
        let pod = Client::connect_with(
            Some(&p(&d.socket)),
            ConnectOptions {
                token: Some(secret),
                ..ConnectOptions::default()
            },
        )
        .await
        .unwrap();
        let info = pod.device_info().await.unwrap();
        assert!(
            info.caller_identity.starts_with("token:npu0-share-3@"),
            "{info:?}"
        );
    })
    .await;
}
