//! Row 13: unary dispatch over TLS beside plaintext TCP, measured in turn over the same rounds.
//!
//! The plaintext side is the daemon under test's TCP listener (as row 4). The TLS side is a
//! second npud on the emulator, started here with the same settings and `[tls]` (a certificate
//! for `localhost` and `127.0.0.1` from a CA made for the run with rcgen; no client
//! certificates), reached as npu-client reaches it: tonic with rustls and the ring provider.
//! Both sessions dispatch the noop design over device tensors, so the difference is the
//! record layer's encryption and the larger frames, not the kernel.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::client::{Iters, Session, connect_tcp};
use crate::daemon::Daemon;
use crate::report::{Report, Row, keys};
use crate::rows::{MIN_ROUND_WARMUP, Ready};
use crate::stats::Acc;
use crate::{BenchError, Result};

fn pki_error(e: rcgen::Error) -> BenchError {
    BenchError(format!("making the TLS row's certificates: {e}"))
}

/// Writes a CA (`ca.pem`) and a server certificate for localhost (`server.crt`, `server.key`)
/// into `dir`; returns the CA's PEM.
fn make_pki(dir: &Path) -> Result<String> {
    let ca_key = KeyPair::generate().map_err(pki_error)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(pki_error)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "npu-bench row 13 CA");
    let ca_pem = ca.self_signed(&ca_key).map_err(pki_error)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().map_err(pki_error)?;
    let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .map_err(pki_error)?
        .signed_by(&key, &issuer)
        .map_err(pki_error)?;
    std::fs::write(dir.join("server.crt"), leaf.pem())?;
    std::fs::write(dir.join("server.key"), key.serialize_pem())?;
    Ok(ca_pem)
}

/// A TLS channel to `addr` (`host:port`), trusting `ca_pem`, with Nagle off.
///
/// # Errors
/// When the address does not accept or the handshake fails.
pub async fn connect_tls(addr: &str, ca_pem: &str) -> Result<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    Ok(Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .tcp_nodelay(true)
        .connect()
        .await?)
}

/// Row 13: `tcp_plain` against the daemon's TCP address `plain`, and `tcp_tls` against a TLS
/// daemon started here, `n_rounds` rounds of `it` split between them.
///
/// # Errors
/// When the TLS daemon cannot start or a dispatch fails.
pub async fn rows(report: &mut Report, plain: &str, it: Iters, n_rounds: usize) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("npub-tls")
        .tempdir_in("/tmp")?;
    let ca = make_pki(dir.path())?;
    let cfg = dir.path().join("npud.toml");
    std::fs::write(
        &cfg,
        format!(
            "[tls]\ncert = {:?}\nkey = {:?}\n",
            dir.path().join("server.crt").display().to_string(),
            dir.path().join("server.key").display().to_string()
        ),
    )?;
    let cfg = cfg.display().to_string();
    let mut daemon = Daemon::start_with(None, &["--config", &cfg])?;
    let plain_s = Ready::new(
        Session::open(connect_tcp(plain).await?, "bench-tcp-plain").await?,
        false,
    )
    .await?;
    let tls_s = Ready::new(
        Session::open(connect_tls(&daemon.tcp, &ca).await?, "bench-tcp-tls").await?,
        false,
    )
    .await?;
    let round = Iters {
        warmup: (it.warmup / n_rounds).max(MIN_ROUND_WARMUP),
        measured: (it.measured / n_rounds).max(1),
    };
    let (mut plain_acc, mut tls_acc) = (Acc::default(), Acc::default());
    for _ in 0..n_rounds {
        plain_acc.add(plain_s.dispatches(round).await?);
        tls_acc.add(tls_s.dispatches(round).await?);
    }
    for (key, name, acc, s) in [
        (
            keys::TCP_PLAIN,
            "npud dispatch over plaintext TCP loopback, one client (beside row 13's TLS)",
            plain_acc,
            &plain_s,
        ),
        (
            keys::TCP_TLS,
            "npud dispatch over TLS (rustls, ring) on TCP loopback, one client",
            tls_acc,
            &tls_s,
        ),
    ] {
        let mut r = Row::new("13", key, name, acc.summary());
        r.message_bytes = Some(s.message_bytes());
        report.rows.push(r);
    }
    for s in [&plain_s, &tls_s] {
        let mut session = s.session.clone();
        crate::load::close(&mut session).await;
    }
    drop((plain_s, tls_s));
    daemon.stop();
    Ok(())
}
