//! Where the daemon is: address parsing, the default socket path, and opening a channel.
//!
//! Accepted addresses:
//!
//! | Form | Transport |
//! |---|---|
//! | `/path/npud.sock`, `./npud.sock`, `unix:/path`, `unix:///path` | the Unix socket (local: tensors shared by fd) |
//! | `http://127.0.0.1:50051`, `http://[::1]:50051`, `http://localhost:50051` | plaintext TCP, loopback only (remote: tensor bytes through the API) |
//! | `https://host:port` | TLS over TCP (remote); server certificate checked against the system roots or a CA given in [`ConnectOptions`] |
//!
//! With no address, `NPUD_ADDR` is used, and without that the daemon's default socket:
//! `/run/npud/npud.sock` for root, `$XDG_RUNTIME_DIR/npud/npud.sock` otherwise, and
//! `/tmp/npud-<uid>/npud.sock` when `XDG_RUNTIME_DIR` is unset or empty (npud's own default);
//! when no socket is there and the system service's `/run/npud/npud.sock` is, that one.
//!
//! TLS options ([`ConnectOptions`]): a CA bundle (`tls_ca` / `tls_ca_pem`; default: the system
//! roots), a client certificate and key for mTLS (`tls_cert`, `tls_key`), and the name to check
//! the server's certificate against when it is not the host (`tls_domain`). An identity token
//! (`token`, `token_file`, else the file `NPUD_TOKEN_FILE` names) is sent with every call as
//! `x-npud-token`; the daemon then treats the caller as `token:<name>@<allocation>`. A token is never sent in
//! plaintext off loopback, and one from `NPUD_TOKEN_FILE` only to the daemon it was issued for
//! (see [`ConnectOptions::identity_token_for`]).
//!
//! Plaintext `http://` to a host that is not loopback is refused unless
//! [`ConnectOptions::allow_plaintext_remote`] is set: session tokens and tensor bytes would cross
//! the network in the clear.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::ClientError;
use crate::class::SessionClass;

/// The environment variable naming the daemon's address.
pub const ADDR_ENV: &str = "NPUD_ADDR";
/// The environment variable naming a file that holds an identity token's secret.
pub const TOKEN_FILE_ENV: &str = "NPUD_TOKEN_FILE";

/// A parsed daemon address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A Unix socket path.
    Unix(PathBuf),
    /// Plaintext gRPC over TCP (`http://host:port`).
    Http(String),
    /// TLS gRPC over TCP (`https://host:port`).
    Https(String),
}

impl Address {
    /// Parses an address (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`ClientError::Address`] for an empty address, an unknown scheme, or an `http`/`https`
    /// URI without a host.
    pub fn parse(text: &str) -> Result<Address, ClientError> {
        let bad = |reason: &str| ClientError::Address {
            address: text.to_owned(),
            reason: reason.to_owned(),
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(bad("empty address"));
        }
        if let Some(rest) = t.strip_prefix("unix://") {
            return Ok(Address::Unix(PathBuf::from(rest)));
        }
        if let Some(rest) = t.strip_prefix("unix:") {
            return Ok(Address::Unix(PathBuf::from(rest)));
        }
        for (scheme, https) in [("http://", false), ("https://", true)] {
            if let Some(rest) = t.strip_prefix(scheme) {
                let authority = rest.split('/').next().unwrap_or("");
                if authority.is_empty() {
                    return Err(bad("no host after the scheme"));
                }
                let uri = format!("{scheme}{authority}");
                return Ok(if https {
                    Address::Https(uri)
                } else {
                    Address::Http(uri)
                });
            }
        }
        if t.contains("://") {
            return Err(bad(
                "unknown scheme; expected a socket path, unix:PATH, http://HOST:PORT or https://HOST:PORT",
            ));
        }
        Ok(Address::Unix(PathBuf::from(t)))
    }

    /// The address from `explicit`, else `NPUD_ADDR`, else the daemon's default socket.
    ///
    /// # Errors
    ///
    /// As [`Address::parse`].
    pub fn resolve(explicit: Option<&str>) -> Result<Address, ClientError> {
        match explicit {
            Some(a) => Address::parse(a),
            None => match std::env::var(ADDR_ENV) {
                Ok(a) if !a.trim().is_empty() => Address::parse(&a),
                _ => Ok(Address::Unix(default_socket())),
            },
        }
    }

    /// Whether tensors can be shared by fd (a Unix socket on this host).
    #[must_use]
    pub fn is_local(&self) -> bool {
        matches!(self, Address::Unix(_))
    }

    /// The host part of an `http`/`https` address.
    fn host(&self) -> Option<&str> {
        let uri = match self {
            Address::Unix(_) => return None,
            Address::Http(u) => u.strip_prefix("http://")?,
            Address::Https(u) => u.strip_prefix("https://")?,
        };
        if let Some(rest) = uri.strip_prefix('[') {
            return rest.split(']').next();
        }
        uri.rsplit_once(':').map_or(Some(uri), |(h, _)| Some(h))
    }

    pub(crate) fn is_loopback(&self) -> bool {
        match self.host() {
            None => true,
            Some("localhost") => true,
            Some(h) => h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()),
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Http(u) | Address::Https(u) => f.write_str(u),
        }
    }
}

/// The system service's gRPC socket (`systemd/npud.socket`).
pub const SYSTEM_SOCKET: &str = "/run/npud/npud.sock";

/// The daemon's default gRPC socket: the one npud run by this user would take (computed as
/// npud computes it), else, when no socket is there and the system service's is, the system
/// service's (`/run/npud/npud.sock`), so that a member of the service's group needs no
/// `NPUD_ADDR`.
#[must_use]
pub fn default_socket() -> PathBuf {
    let own = own_default_socket();
    if !own.exists() && Path::new(SYSTEM_SOCKET).exists() {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    own
}

/// The socket npud takes by default when this user runs it.
fn own_default_socket() -> PathBuf {
    let uid = rustix::process::getuid();
    let dir = if uid.is_root() {
        PathBuf::from("/run/npud")
    } else {
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d).join("npud"),
            _ => PathBuf::from(format!("/tmp/npud-{}", uid.as_raw())),
        }
    };
    dir.join("npud.sock")
}

/// How a [`crate::Client`] connects and how long it waits.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// A name for the daemon's logs and statistics (at most 128 bytes).
    pub client_name: String,
    /// Limit on establishing a connection.
    pub connect_timeout: Duration,
    /// Limit on any one call, including a dispatch's time in the daemon's queue.
    pub call_timeout: Duration,
    /// How long to keep trying to reconnect after the connection dropped before giving up.
    pub reconnect_timeout: Duration,
    /// Allow `http://` to a host that is not loopback.
    pub allow_plaintext_remote: bool,
    /// PEM of a CA to trust for `https://`, instead of the system's roots.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// A PEM CA bundle file to trust for `https://` (read at connect; `tls_ca_pem` wins).
    pub tls_ca: Option<PathBuf>,
    /// A PEM client certificate (chain) presented for mTLS; needs `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// The server name to check the certificate against, when it differs from the host.
    pub tls_domain: Option<String>,
    /// An identity token's secret, sent as `x-npud-token` with every call.
    pub token: Option<String>,
    /// A file holding the secret (read at connect); without `token` and `token_file`, the file
    /// `NPUD_TOKEN_FILE` names, when set.
    pub token_file: Option<PathBuf>,
    /// Dispatch through the session's shared-memory ring when the daemon is on a Unix socket
    /// (see [`crate::fastpath`]); results, errors and statistics are the same as through gRPC.
    /// On by default unless `NPUD_FAST_PATH` is `0`, `off`, `false` or `no`.
    pub fast_path: bool,
    /// The class of the session a [`crate::Client`] opens (default batch). The daemon's policy
    /// may refuse it (`PERMISSION_DENIED`); see [`crate::class`].
    pub session_class: SessionClass,
    /// An interactive session's deadline: the time each of its dispatches may take from
    /// admission to its answer (at most 10 s; sent in whole microseconds, rounded up). `None`
    /// (or zero): the daemon's default for an interactive session (npud's
    /// `executor.interactive_deadline_us`); [`crate::Client::deadline`] says what it granted.
    /// The daemon refuses one for a batch session (`INVALID_ARGUMENT`).
    pub deadline: Option<Duration>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            client_name: default_client_name(),
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(60),
            reconnect_timeout: Duration::from_secs(5),
            allow_plaintext_remote: false,
            tls_ca_pem: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tls_domain: None,
            token: None,
            token_file: None,
            fast_path: crate::fastpath::enabled_by_env(),
            session_class: SessionClass::Batch,
            deadline: None,
        }
    }
}

impl ConnectOptions {
    /// The identity token to send: `token`, else `token_file`'s, else `NPUD_TOKEN_FILE`'s.
    ///
    /// # Errors
    /// [`ClientError::Io`] when the file cannot be read; [`ClientError::Invalid`] when it does
    /// not hold one line of a secret.
    pub fn identity_token(&self) -> Result<Option<String>, ClientError> {
        Ok(self.identity_token_source()?.map(|(secret, _)| secret))
    }

    /// The identity token to send to the daemon at `addr`, if it may go there. A token's secret
    /// never crosses a network in the clear: to a plaintext `http://` address off loopback, an
    /// explicit `token` or `token_file` is refused and `NPUD_TOKEN_FILE`'s is not sent. A token
    /// from `NPUD_TOKEN_FILE` (which a device plugin hands out together with `NPUD_ADDR`) goes
    /// only to the daemon it was issued for: the address `NPUD_ADDR` names, or, without
    /// `NPUD_ADDR`, a Unix socket.
    ///
    /// # Errors
    /// As [`Self::identity_token`]; [`ClientError::Invalid`] for an explicit token to a plaintext
    /// address off loopback.
    pub fn identity_token_for(&self, addr: &Address) -> Result<Option<String>, ClientError> {
        let Some((secret, explicit)) = self.identity_token_source()? else {
            return Ok(None);
        };
        let clear_off_loopback = matches!(addr, Address::Http(_)) && !addr.is_loopback();
        if explicit {
            if clear_off_loopback {
                return Err(ClientError::Invalid(format!(
                    "the identity token is not sent to {addr} in plaintext: use https://"
                )));
            }
            return Ok(Some(secret));
        }
        let issued_for = match std::env::var(ADDR_ENV) {
            Ok(a) if !a.trim().is_empty() => Address::parse(&a).ok().is_some_and(|a| &a == addr),
            _ => matches!(addr, Address::Unix(_)),
        };
        Ok((issued_for && !clear_off_loopback).then_some(secret))
    }

    /// The token's secret and whether the options name it (rather than `NPUD_TOKEN_FILE`).
    fn identity_token_source(&self) -> Result<Option<(String, bool)>, ClientError> {
        if let Some(t) = &self.token {
            return Ok(Some((t.trim().to_owned(), true)));
        }
        let (file, explicit) = match &self.token_file {
            Some(f) => (f.clone(), true),
            None => match std::env::var_os(TOKEN_FILE_ENV) {
                Some(f) if !f.is_empty() => (PathBuf::from(f), false),
                _ => return Ok(None),
            },
        };
        let text = std::fs::read_to_string(&file).map_err(|source| ClientError::Io {
            path: file.clone(),
            source,
        })?;
        let secret = text.trim();
        if secret.is_empty() || secret.contains(char::is_whitespace) {
            return Err(ClientError::Invalid(format!(
                "{}: expected one line holding the token's secret",
                file.display()
            )));
        }
        Ok(Some((secret.to_owned(), explicit)))
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|source| ClientError::Io {
        path: path.clone(),
        source,
    })
}

fn default_client_name() -> String {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "npu-client".to_owned());
    let mut name = format!("{exe}[{}]", std::process::id());
    name.truncate(128);
    name
}

/// Builds the endpoint for an address, with the options' timeouts and TLS.
pub(crate) fn endpoint(addr: &Address, opts: &ConnectOptions) -> Result<Endpoint, ClientError> {
    let bad = |reason: String| ClientError::Address {
        address: addr.to_string(),
        reason,
    };
    if let Address::Http(_) = addr
        && !opts.allow_plaintext_remote
        && !addr.is_loopback()
    {
        return Err(bad(
            "plaintext http:// is allowed to loopback only; use https:// (or allow_plaintext_remote)"
                .into(),
        ));
    }
    let ep = Endpoint::from_shared(addr.to_string()).map_err(|e| bad(e.to_string()))?;
    let mut ep = ep
        .connect_timeout(opts.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        // npud closes connections that send nothing for limits.idle_timeout_ms (5 min by
        // default); pings while idle keep a quiet client's channel, and with it its session.
        .keep_alive_while_idle(true);
    if let Address::Https(_) = addr {
        let mut tls = ClientTlsConfig::new();
        tls = match (&opts.tls_ca_pem, &opts.tls_ca) {
            (Some(pem), _) => tls.ca_certificate(Certificate::from_pem(pem)),
            (None, Some(path)) => tls.ca_certificate(Certificate::from_pem(read(path)?)),
            (None, None) => tls.with_native_roots(),
        };
        match (&opts.tls_cert, &opts.tls_key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            (None, None) => {}
            _ => {
                return Err(bad(
                    "a client certificate needs its key, and a key its certificate (tls_cert and \
                     tls_key)"
                        .into(),
                ));
            }
        }
        if let Some(d) = &opts.tls_domain {
            tls = tls.domain_name(d.clone());
        }
        ep = ep.tls_config(tls).map_err(|e| bad(format!("TLS: {e}")))?;
    }
    Ok(ep)
}

/// Opens a channel, bounded by the connect timeout.
pub(crate) async fn open_channel(
    addr: &Address,
    opts: &ConnectOptions,
) -> Result<Channel, ClientError> {
    let ep = endpoint(addr, opts)?;
    let failed = |message: String| ClientError::Connect {
        address: addr.to_string(),
        message,
    };
    // A connection the server accepted and closed at once (a daemon that stopped with it
    // accepted and unserved, the next one of a socket unit waiting behind it) is made once more.
    let connect = async {
        match ep.connect().await {
            Err(e) if closed_by_the_server(&e) => {
                tracing::debug!(error = %error_chain(&e), "the server closed the new connection; connecting again");
                ep.connect().await
            }
            r => r,
        }
    };
    match tokio::time::timeout(opts.connect_timeout, connect).await {
        Ok(Ok(ch)) => Ok(ch),
        Ok(Err(e)) => Err(failed(crate::diagnose::connect_failure(addr, &e))),
        Err(_) => Err(failed(format!(
            "no connection within {:?}",
            opts.connect_timeout
        ))),
    }
}

/// The connection was made and the server closed it (not: nobody listens).
fn closed_by_the_server(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        cur = c.source();
    }
    false
}

/// A status from the transport: its message and the sources below it, joined with ": "
/// (a status's own `Display` shows its fields with their Rust debug form).
pub(crate) fn status_chain(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut s = status.message().to_owned();
    let mut cur = status.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// An error and its sources, joined with ": ".
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_parse() {
        assert_eq!(
            Address::parse("/run/npud/npud.sock").unwrap(),
            Address::Unix("/run/npud/npud.sock".into())
        );
        assert_eq!(
            Address::parse("unix:/tmp/s").unwrap(),
            Address::Unix("/tmp/s".into())
        );
        assert_eq!(
            Address::parse("unix:///tmp/s").unwrap(),
            Address::Unix("/tmp/s".into())
        );
        assert_eq!(
            Address::parse("http://127.0.0.1:5/").unwrap(),
            Address::Http("http://127.0.0.1:5".into())
        );
        assert_eq!(
            Address::parse("https://npu.example:443").unwrap(),
            Address::Https("https://npu.example:443".into())
        );
        assert!(Address::parse("ftp://x").is_err());
        assert!(Address::parse("http://").is_err());
        assert!(Address::parse("  ").is_err());
    }

    #[test]
    fn loopback_is_recognized() {
        for a in ["http://127.0.0.1:1", "http://[::1]:1", "http://localhost:1"] {
            assert!(Address::parse(a).unwrap().is_loopback(), "{a}");
        }
        assert!(!Address::parse("http://10.0.0.1:1").unwrap().is_loopback());
        let e = endpoint(
            &Address::parse("http://10.0.0.1:1").unwrap(),
            &ConnectOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("loopback only"), "{e}");
    }

    #[test]
    fn a_token_goes_only_where_it_was_issued_for_and_never_in_the_clear_off_loopback() {
        let explicit = ConnectOptions {
            token: Some("s3cret".into()),
            ..ConnectOptions::default()
        };
        let at = |a: &str| Address::parse(a).unwrap();
        assert_eq!(
            explicit
                .identity_token_for(&at("https://npu.example:443"))
                .unwrap(),
            Some("s3cret".into())
        );
        assert_eq!(
            explicit
                .identity_token_for(&at("http://127.0.0.1:5"))
                .unwrap(),
            Some("s3cret".into())
        );
        let e = explicit
            .identity_token_for(&at("http://10.0.0.1:5"))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("not sent to http://10.0.0.1:5 in plaintext"),
            "{e}"
        );
    }

    #[test]
    fn default_socket_ends_in_npud_sock() {
        let p = default_socket();
        assert!(p.ends_with("npud/npud.sock") || p.to_string_lossy().contains("/tmp/npud-"));
    }
}
