//! The standing hostile bystander (issue 36): every attack the issue lists, and last round's that
//! still apply, against a release-profile npud under a 1 GiB address-space limit beside a
//! bystander client. Each test asserts, for its attack (`npud_e2e::bystander`): the bystander's
//! p99 at most 3x its baseline measured right before on the same daemon and none of its calls
//! failed, the daemon's peak RSS at most twice its idle RSS plus the configured budgets, the
//! daemon alive, and the attack answered with its documented code. Every test prints a
//! `bystander verdict [...]` line with its figures (`--no-capture`).
//!
//! One file per family of attacks; a new attack is a test in its family's file (or a new file
//! declared below) that starts a `Stand`, sets up, and passes its attack to `Stand::attack`.
//! Tests that connect as other users or from network namespaces need root (and iproute2), and
//! are reported as ignored without (tests/build.rs).

#![forbid(unsafe_code)]

mod decode;
mod exactly_once;
mod last_round;
mod lifeline;
mod lockouts;
mod loopback;
mod programs;
mod revocation;

use std::time::Duration;

use npu_proto::v1 as pb;
use npud_e2e::Session;
use npud_e2e::bystander::wire::{grpc_frame, h2_call};
use tokio::io::{AsyncRead, AsyncWrite};

/// The session metadata of `s` as raw headers.
pub fn session_headers(s: &Session) -> Vec<(&'static str, String)> {
    let mut h = vec![
        (npu_proto::SESSION_HEADER, s.id.to_string()),
        (npu_proto::TOKEN_HEADER, s.token.clone()),
    ];
    if let Some(t) = &s.identity_token {
        h.push((npu_proto::IDENTITY_TOKEN_HEADER, t.clone()));
    }
    h
}

/// The most any one raw call of an attack may take.
pub const CALL_LIMIT: Duration = Duration::from_secs(20);

/// `GetDeviceInfo` on `io` (a fresh connection) with a bare HTTP/2 client: the identity the
/// daemon says the caller is, or what it answered instead.
pub async fn who_is<IO>(io: IO) -> String
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let body = grpc_frame(
        &prost::Message::encode_to_vec(&pb::GetDeviceInfoRequest {}),
        false,
    );
    let a = h2_call(io, "/npud.v1.Npud/GetDeviceInfo", &[], body, CALL_LIMIT).await;
    match (a.code, a.messages.first()) {
        (Some(0), Some(m)) => prost::Message::decode(&m[..])
            .map(|i: pb::DeviceInfo| i.caller_identity)
            .unwrap_or_else(|e| format!("undecodable: {e}")),
        _ => a.describe(),
    }
}
