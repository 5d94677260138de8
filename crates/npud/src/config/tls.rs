//! `[tls]`: the TCP listener's certificate, key and client-certificate settings, and the
//! checks of their combinations. Loading the files is `tls`'s.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Whether and how clients present certificates (`tls.client_auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No client certificates: TCP callers are anonymous unless they present a token.
    #[default]
    Off,
    /// A client may present a certificate signed by `client_ca`; one without is anonymous.
    Optional,
    /// Every client must present a certificate signed by `client_ca`; the handshake fails
    /// otherwise.
    Required,
}

/// `[tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain the TCP listener presents (leaf first).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert` (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// PEM bundle of the CAs client certificates must chain to.
    pub client_ca: Option<PathBuf>,
    pub client_auth: ClientAuth,
    /// How often the files are looked at for changes, in ms (0: only SIGHUP reloads them).
    pub reload_interval_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert: None,
            key: None,
            client_ca: None,
            client_auth: ClientAuth::Off,
            reload_interval_ms: 5_000,
        }
    }
}

impl TlsConfig {
    /// Whether the TCP listener speaks TLS.
    pub fn enabled(&self) -> bool {
        self.cert.is_some() || self.key.is_some()
    }

    /// The TCP listener's transport as `DeviceInfo.tcp_security` reports it.
    pub fn mode(&self) -> &'static str {
        match (self.enabled(), self.client_auth) {
            (false, _) => "plaintext",
            (true, ClientAuth::Off) => "tls",
            (true, ClientAuth::Optional) => "mtls-optional",
            (true, ClientAuth::Required) => "mtls-required",
        }
    }

    /// Checks the keys' combinations (the files are read by [`Tls::load`]).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| ConfigError::Invalid {
            key,
            reason: reason.into(),
        };
        match (&self.cert, &self.key) {
            (Some(_), None) => return Err(invalid("tls.key", "tls.cert is set; set its key too")),
            (None, Some(_)) => {
                return Err(invalid(
                    "tls.cert",
                    "tls.key is set; set its certificate too",
                ));
            }
            _ => {}
        }
        if self.client_auth != ClientAuth::Off && self.client_ca.is_none() {
            return Err(invalid(
                "tls.client_ca",
                "tls.client_auth asks for client certificates; name the CA bundle that signs \
                 them",
            ));
        }
        if self.client_ca.is_some() && self.client_auth == ClientAuth::Off {
            return Err(invalid(
                "tls.client_auth",
                "tls.client_ca is set but client_auth is \"off\"; set it to \"optional\" or \
                 \"required\"",
            ));
        }
        if self.client_ca.is_some() && !self.enabled() {
            return Err(invalid(
                "tls.cert",
                "tls.client_ca is set; client certificates need TLS: set tls.cert and tls.key",
            ));
        }
        Ok(())
    }
}
