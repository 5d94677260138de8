//! TLS on the TCP listener: rustls (ring provider) with the certificate and key of `[tls]`,
//! and, with `client_auth` `optional` or `required`, client certificates checked against the
//! `client_ca` bundle (mTLS).
//!
//! [`Tls`] holds the current `rustls::ServerConfig`; each accepted connection takes the one
//! current at its handshake. [`Tls::reload`] (on SIGHUP) reads the files again and swaps the
//! config only when all of them load: connections already established keep the session they
//! negotiated, new connections get the new certificate, and a reload that fails keeps the old
//! config and says why.
//!
//! In Kubernetes nothing sends SIGHUP when a Secret rotates: the kubelet writes the new files
//! into a new directory and swaps the `..data` symlink the mounted names point through. So
//! [`Tls::watch`] also looks at the files every `tls.reload_interval_ms` (their metadata,
//! symlinks followed: device, inode, size, modification and change times) and reloads as
//! SIGHUP does when any of them changed. Cost: three `stat`s per interval, in a blocking task.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConfig, WebPkiClientVerifier};

use crate::auth::CertName;
#[cfg(test)]
use crate::config::ConfigError;
pub use crate::config::{ClientAuth, TlsConfig};

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key} {}: {reason}", path.display())]
    File {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("tls.client_ca: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// What tells that a file changed: device, inode, size, modification and change times.
type Stamp = (u64, u64, u64, i64, i64, i64, i64);

/// The TCP listener's TLS configuration, swapped whole on reload.
#[derive(Debug)]
pub struct Tls {
    cfg: TlsConfig,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Reads the files `[tls]` names; `None` when TLS is off.
    ///
    /// # Errors
    /// [`TlsError`] naming the key and file that failed.
    pub fn load(cfg: &TlsConfig) -> Result<Option<Arc<Self>>, TlsError> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let sc = server_config(cfg)?;
        Ok(Some(Arc::new(Self {
            cfg: cfg.clone(),
            current: RwLock::new(Arc::new(sc)),
        })))
    }

    /// Reads the files again; on success new connections get them, on failure the config in
    /// use stays.
    ///
    /// # Errors
    /// As [`Tls::load`].
    pub fn reload(&self) -> Result<(), TlsError> {
        let sc = Arc::new(server_config(&self.cfg)?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = sc;
        Ok(())
    }

    /// The files' stamps: what changes when one is rewritten or a symlink on its path is
    /// swapped (`None` for a file that cannot be read).
    fn stamps(&self) -> Vec<Option<Stamp>> {
        use std::os::unix::fs::MetadataExt;
        [&self.cfg.cert, &self.cfg.key, &self.cfg.client_ca]
            .into_iter()
            .flatten()
            .map(|p| {
                std::fs::metadata(p).ok().map(|m| {
                    (
                        m.dev(),
                        m.ino(),
                        m.size(),
                        m.mtime(),
                        m.mtime_nsec(),
                        m.ctime(),
                        m.ctime_nsec(),
                    )
                })
            })
            .collect()
    }

    /// Reloads the files whenever they change (see the module docs), until `stop`; does
    /// nothing when `tls.reload_interval_ms` is 0.
    pub async fn watch(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        if self.cfg.reload_interval_ms == 0 {
            return;
        }
        let every = std::time::Duration::from_millis(self.cfg.reload_interval_ms);
        let look = |t: Arc<Self>| async move {
            tokio::task::spawn_blocking(move || t.stamps()).await.ok()
        };
        let mut seen = look(self.clone()).await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let now = look(self.clone()).await;
            if now.is_none() || now == seen {
                continue;
            }
            seen = now;
            let t = self.clone();
            match tokio::task::spawn_blocking(move || t.reload()).await {
                Ok(Ok(())) => tracing::info!(
                    "tls files changed: reloaded tls.cert, tls.key and tls.client_ca; new \
                     connections use them, established ones keep theirs"
                ),
                Ok(Err(e)) => tracing::error!(
                    "tls files changed, but reloading them failed; still serving the previous \
                     certificate: {e}"
                ),
                Err(e) => tracing::error!("reloading the tls files panicked: {e}"),
            }
        }
    }

    /// An acceptor for one connection, with the config current now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

fn file_error(key: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        key,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(key, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(key, path, e))?;
    if certs.is_empty() {
        return Err(file_error(key, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn server_config(cfg: &TlsConfig) -> Result<ServerConfig, TlsError> {
    let (Some(cert), Some(key)) = (&cfg.cert, &cfg.key) else {
        return Err(TlsError::Rustls(rustls::Error::General(
            "tls.cert and tls.key must both be set".into(),
        )));
    };
    let chain = certs("tls.cert", cert)?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("tls.key", key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (cfg.client_auth, &cfg.client_ca) {
        (ClientAuth::Off, _) | (_, None) => builder.with_no_client_auth(),
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for c in certs("tls.client_ca", ca)? {
                roots
                    .add(c)
                    .map_err(|e| file_error("tls.client_ca", ca, e))?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if auth == ClientAuth::Optional {
                v.allow_unauthenticated()
            } else {
                v
            };
            builder.with_client_cert_verifier(v.build()?)
        }
    };
    let mut sc = builder
        .with_single_cert(chain, private)
        .map_err(|e| file_error("tls.key", key, format!("does not fit tls.cert: {e}")))?;
    sc.alpn_protocols = vec![b"h2".to_vec()];
    Ok(sc)
}

/// The name a client certificate stands for, and its kind: its first DNS, URI or e-mail subject
/// alternative name, else its subject's common name.
pub fn certificate_subject(der: &[u8]) -> Option<(CertName, String)> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(s) => return Some((CertName::Dns, (*s).to_owned())),
                GeneralName::URI(s) => return Some((CertName::Uri, (*s).to_owned())),
                GeneralName::RFC822Name(s) => return Some((CertName::Email, (*s).to_owned())),
                _ => {}
            }
        }
    }
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(|cn| (CertName::Cn, cn.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(cert: bool, key: bool, ca: bool, auth: ClientAuth) -> TlsConfig {
        TlsConfig {
            cert: cert.then(|| "c.pem".into()),
            key: key.then(|| "k.pem".into()),
            client_ca: ca.then(|| "ca.pem".into()),
            client_auth: auth,
            ..TlsConfig::default()
        }
    }

    #[test]
    fn combinations_that_cannot_work_name_the_key() {
        let key = |c: TlsConfig| match c.check() {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        assert_eq!(key(cfg(true, false, false, ClientAuth::Off)), "tls.key");
        assert_eq!(key(cfg(false, true, false, ClientAuth::Off)), "tls.cert");
        assert_eq!(
            key(cfg(true, true, false, ClientAuth::Required)),
            "tls.client_ca"
        );
        assert_eq!(
            key(cfg(true, true, true, ClientAuth::Off)),
            "tls.client_auth"
        );
        assert_eq!(
            key(cfg(false, false, true, ClientAuth::Optional)),
            "tls.cert"
        );
        cfg(true, true, true, ClientAuth::Optional).check().unwrap();
        assert_eq!(
            cfg(true, true, true, ClientAuth::Required).mode(),
            "mtls-required"
        );
        assert_eq!(TlsConfig::default().mode(), "plaintext");
    }

    #[test]
    fn unreadable_files_name_the_key_and_the_file() {
        let d = tempfile::tempdir().unwrap();
        let c = TlsConfig {
            cert: Some(d.path().join("missing.pem")),
            key: Some(d.path().join("k.pem")),
            ..TlsConfig::default()
        };
        let e = Tls::load(&c).unwrap_err().to_string();
        assert!(e.starts_with("tls.cert "), "{e}");
        assert!(e.contains("missing.pem"), "{e}");
        std::fs::write(d.path().join("empty.pem"), "").unwrap();
        let c = TlsConfig {
            cert: Some(d.path().join("empty.pem")),
            ..c
        };
        let e = Tls::load(&c).unwrap_err().to_string();
        assert!(e.ends_with("no PEM certificate in the file"), "{e}");
    }
}
