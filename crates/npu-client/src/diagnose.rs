//! What a failed connection means, and what to do next.
//!
//! The transport's own errors name a symptom (`No such file or directory (os error 2)`,
//! `h2 protocol error`, `invalid peer certificate: UnknownIssuer`); a person needs the cause and
//! the next step. [`connect_failure`] reads the error chain of a connection that failed;
//! [`first_call`] looks at a first call that failed below gRPC and, where the chain does not
//! tell, asks the address itself what it speaks: a TLS port answers a plaintext HTTP/2 preface
//! with a TLS alert record, and a socket that is not npud's gRPC socket (its fd socket) answers
//! none with a SETTINGS frame. [`refusal_note`] adds the next step to a refusal whose reason
//! lies on the client's side (an anonymous local user over loopback).
//!
//! Cost: nothing on success. On a failure, at most one extra connection to the address the
//! caller named, bounded by [`PROBE_TIMEOUT`] for the connect and for the answer.

use std::error::Error;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::connect::{Address, error_chain};

/// How long a probe waits to connect, and then for an answer.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// The HTTP/2 client preface and an empty SETTINGS frame: what a gRPC client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// The kind of the first I/O error in an error's chain.
fn io_kind(e: &(dyn Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = c.source();
    }
    None
}

/// The uid this process runs as.
fn my_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// A group's name from `/etc/group`, when it has one there.
fn group_name(gid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let id = f.nth(1)?;
        (id.parse::<u32>().ok()? == gid).then(|| name.to_owned())
    })
}

/// The cause and the next step for a connection to `addr` that failed with `e`.
pub(crate) fn connect_failure(addr: &Address, e: &(dyn Error + 'static)) -> String {
    let chain = error_chain(e);
    if let Some(hint) = tls_hint(addr, &chain) {
        return format!("{chain}: {hint}");
    }
    let kind = io_kind(e);
    let hint = match (addr, kind) {
        (Address::Unix(path), Some(std::io::ErrorKind::NotFound)) => format!(
            "no socket at {}: npud is not running there. Start it (`npud --backend emulator` on a \
             machine without an NPU; `systemctl start npud.socket` where its systemd units are \
             installed), or give the socket it listens on (npuctl --addr, NPUD_ADDR)",
            path.display()
        ),
        (Address::Unix(path), Some(std::io::ErrorKind::ConnectionRefused)) => format!(
            "nothing listens on {}: the file is left from a daemon that stopped. Start npud again \
             (it replaces the file), or give the socket it listens on (npuctl --addr, NPUD_ADDR)",
            path.display()
        ),
        (Address::Unix(path), Some(std::io::ErrorKind::PermissionDenied)) => unix_denied(path),
        (Address::Http(_) | Address::Https(_), Some(std::io::ErrorKind::ConnectionRefused)) => {
            format!(
                "nothing listens on {addr}: npud serves TCP only where its configuration says \
                 (`tcp`, or `npud --tcp HOST:PORT`); its log and `npuctl status` on its Unix \
                 socket name the address"
            )
        }
        _ => return chain,
    };
    format!("{chain}: {hint}")
}

/// Why this uid may not connect to the socket at `path`, and who may.
fn unix_denied(path: &Path) -> String {
    let uid = my_uid();
    match std::fs::metadata(path) {
        Ok(m) => {
            let group = group_name(m.gid()).unwrap_or_else(|| format!("gid {}", m.gid()));
            format!(
                "uid {uid} may not connect to {} (mode {:04o}, owner uid {}, group {group}): ask \
                 the daemon's operator to add you to {group} (then log in again), or use a \
                 token or the daemon's TCP port",
                path.display(),
                m.mode() & 0o7777,
                m.uid()
            )
        }
        Err(_) => format!(
            "uid {uid} may not reach {}: a directory above it is closed to you",
            path.display()
        ),
    }
}

/// What a TLS failure in `chain` means for a client of `addr`.
fn tls_hint(addr: &Address, chain: &str) -> Option<String> {
    if chain.contains("CertificateRequired") || chain.contains("certificate required") {
        return Some(
            "the daemon requires a client certificate (its tls.client_auth is \"required\"): \
             give yours with --cert and --key (NPUD_CERT, NPUD_KEY), or ask its operator for \
             client_auth = \"optional\" to come in with a token alone"
                .to_owned(),
        );
    }
    if chain.contains("UnknownIssuer") {
        return Some(
            "the daemon's certificate is not signed by a CA this client trusts: give the CA \
             that signed it with --ca (NPUD_CA)"
                .to_owned(),
        );
    }
    if chain.contains("NotValidForName") {
        return Some(format!(
            "the daemon's certificate does not carry the name in {addr}: give a name it carries \
             with --tls-server-name (NPUD_TLS_SERVER_NAME)"
        ));
    }
    if chain.contains("UnknownCA") || chain.contains("BadCertificate") {
        return Some(
            "the daemon refused this client's certificate: its tls.client_ca did not sign it"
                .to_owned(),
        );
    }
    None
}

/// A first call on a new connection that failed below gRPC (`chain`: the status and its
/// sources): the cause and the next step when one is found, probing the address if the chain
/// does not tell.
pub(crate) async fn first_call(
    addr: &Address,
    chain: &str,
    has_client_cert: bool,
) -> Option<String> {
    if let Some(hint) = tls_hint(addr, chain) {
        return Some(format!("{chain}: {hint}"));
    }
    match addr {
        Address::Http(uri) => {
            let authority = uri.strip_prefix("http://")?;
            speaks_tls(authority).await.then(|| {
                format!(
                    "{chain}: {authority} speaks TLS (npud's [tls] is set for its TCP listener): \
                     use https://{authority}, with --ca naming the CA that signed its \
                     certificate"
                )
            })
        }
        Address::Unix(path) => {
            if speaks_http2(path).await {
                return None;
            }
            let what = if speaks_fd_protocol(path).await {
                "npud's fd socket (it answers the fd-socket protocol), which carries tensor file \
                 descriptors only"
            } else {
                "not npud's gRPC socket: it does not answer HTTP/2"
            };
            Some(format!(
                "{chain}: {} is {what}; give the gRPC socket beside it (npud.sock: the daemon's \
                 `socket`, or the socket its log says it listens on)",
                path.display()
            ))
        }
        // A TLS 1.3 server that refuses the client's certificate (or its lack of one) does so
        // after the client's side of the handshake has finished: its alert may be lost to the
        // connection's close, and the client sees only the close.
        Address::Https(_)
            if chain.contains("connection closed")
                || chain.contains("connection reset")
                || chain.contains("broken pipe") =>
        {
            Some(format!(
                "{chain}: the daemon closed the connection after the TLS handshake, as npud does \
                 for {}: {}",
                if has_client_cert {
                    "a client certificate its tls.client_ca did not sign"
                } else {
                    "a client without a certificate where its tls.client_auth is \"required\""
                },
                if has_client_cert {
                    "give a certificate that CA signed (--cert and --key)"
                } else {
                    "give yours with --cert and --key (NPUD_CERT, NPUD_KEY)"
                }
            ))
        }
        Address::Https(_) => None,
    }
}

/// Whether the Unix socket answers a request frame of npud's fd-socket protocol
/// (`proto/npud/v1/fdsocket.md`: a 64-byte request, a 256-byte response, both starting with
/// the magic `NPFD`). The request redeems the all-zero ticket, which no call issues: the
/// daemon answers `UNKNOWN_TICKET` and hands out nothing.
async fn speaks_fd_protocol(path: &Path) -> bool {
    let Ok(Ok(mut s)) =
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::UnixStream::connect(path)).await
    else {
        return false;
    };
    let mut request = [0u8; 64];
    request[..4].copy_from_slice(b"NPFD");
    request[4..6].copy_from_slice(&1u16.to_le_bytes());
    request[6..8].copy_from_slice(&1u16.to_le_bytes());
    if s.write_all(&request).await.is_err() {
        return false;
    }
    let mut head = [0u8; 4];
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, s.read_exact(&mut head)).await,
        Ok(Ok(_)) if &head == b"NPFD"
    )
}

/// Whether the TCP address answers a plaintext HTTP/2 preface with a TLS record (an alert).
async fn speaks_tls(authority: &str) -> bool {
    let Ok(Ok(mut s)) =
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(authority)).await
    else {
        return false;
    };
    first_byte(&mut s)
        .await
        .is_some_and(|b| matches!(b, 0x15 | 0x16))
}

/// Whether the Unix socket answers the HTTP/2 preface with a SETTINGS frame, as a gRPC server
/// does. A socket that is not one is left alone after [`PROBE_TIMEOUT`].
async fn speaks_http2(path: &Path) -> bool {
    let is_socket = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if !is_socket {
        return false;
    }
    let Ok(Ok(mut s)) =
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::UnixStream::connect(path)).await
    else {
        // Connecting worked a moment ago; when it no longer does, say nothing of it.
        return true;
    };
    if s.write_all(PREFACE).await.is_err() {
        return false;
    }
    let mut head = [0u8; 9];
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, s.read_exact(&mut head)).await,
        Ok(Ok(_)) if head[3] == 0x4
    )
}

/// Sends the HTTP/2 preface and returns the first byte of the answer, if one comes in time.
async fn first_byte<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
) -> Option<u8> {
    s.write_all(PREFACE).await.ok()?;
    let mut b = [0u8; 1];
    match tokio::time::timeout(PROBE_TIMEOUT, s.read_exact(&mut b)).await {
        Ok(Ok(_)) => Some(b[0]),
        _ => None,
    }
}

/// The next step for a refusal the daemon explains from its side but whose remedy is on this
/// client's: an anonymous caller over loopback TCP is a local user the daemon would serve as
/// its uid only if that user could use its Unix socket.
pub(crate) fn refusal_note(addr: &Address, code: tonic::Code, message: &str) -> Option<String> {
    let loopback_tcp = !matches!(addr, Address::Unix(_)) && addr.is_loopback();
    (loopback_tcp && code == tonic::Code::Unauthenticated && message.contains("allows anonymous"))
        .then(|| {
            format!(
                "over loopback TCP npud names a local user (this one is uid {}) only if that \
                 user may connect to its Unix socket (the socket's mode and group); anyone else \
                 is anonymous. Ask the daemon's operator to add uid {} to the socket's group \
                 (npu where npud runs under systemd), or present a token (--token-file, \
                 NPUD_TOKEN_FILE)",
                my_uid(),
                my_uid()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_socket_says_npud_is_not_running_and_how_to_start_it() {
        let addr = Address::Unix("/nonexistent/npud.sock".into());
        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        let m = connect_failure(&addr, &e);
        assert!(
            m.contains("no socket at /nonexistent/npud.sock: npud is not running there")
                && m.contains("npud --backend emulator")
                && m.contains("systemctl start npud.socket"),
            "{m}"
        );
    }

    #[test]
    fn tls_failures_name_the_flag_that_fixes_them() {
        let addr = Address::Https("https://npu.example:50051".into());
        for (chain, want) in [
            ("invalid peer certificate: UnknownIssuer", "--ca"),
            (
                "received fatal alert: CertificateRequired",
                "--cert and --key",
            ),
            (
                "invalid peer certificate: NotValidForName",
                "--tls-server-name",
            ),
        ] {
            let h = tls_hint(&addr, chain).unwrap_or_default();
            assert!(h.contains(want), "{chain}: {h}");
        }
        assert_eq!(tls_hint(&addr, "connection reset"), None);
    }

    #[test]
    fn only_loopback_tcp_refusals_of_anonymous_get_the_local_user_note() {
        let tcp = Address::parse("http://127.0.0.1:1").unwrap();
        let unix = Address::parse("unix:/x").unwrap();
        let m = "no rule in auth.rules allows anonymous: this caller presented no credentials";
        let c = tonic::Code::Unauthenticated;
        assert!(refusal_note(&tcp, c, m).is_some_and(|n| n.contains("socket's group")));
        assert!(refusal_note(&unix, c, m).is_none());
        assert!(refusal_note(&tcp, tonic::Code::PermissionDenied, m).is_none());
        let remote = Address::parse("https://10.0.0.1:1").unwrap();
        assert!(refusal_note(&remote, c, m).is_none());
    }
}
