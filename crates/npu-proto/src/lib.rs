//! Generated code for the npud gRPC API, package `npud.v1`.
//!
//! The API and every field's unit and limits are documented in `proto/npud/v1/npud.proto`.

#![forbid(unsafe_code)]

/// The `npud.v1` package.
pub mod v1 {
    #![allow(missing_debug_implementations, clippy::cast_possible_truncation)]
    tonic::include_proto!("npud.v1");
}

/// The encoded `FileDescriptorSet` of the API, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/npud_descriptor.bin"));

/// Metadata key carrying the session id (decimal).
pub const SESSION_HEADER: &str = "npud-session";
/// Metadata key carrying the session's secret token.
pub const TOKEN_HEADER: &str = "npud-token";
/// Metadata key carrying a request id (decimal u64) the client chose for one call and sends
/// again, unchanged, when it retries that call: the daemon runs Dispatch, Chain,
/// AllocateTensor and FreeTensor once per id and session, and answers a retry with the first
/// attempt's answer (see `npud.proto`).
pub const REQUEST_ID_HEADER: &str = "npud-request-id";
/// Metadata key a client may send beside [`REQUEST_ID_HEADER`]: a decimal u64 below which it
/// will retry no request id of the session (every call with a lower id has its answer, or was
/// given up). The daemon then forgets those ids' answers at once instead of keeping them for
/// the retry horizon.
pub const REQUEST_ACK_HEADER: &str = "npud-request-ack";
/// Metadata key carrying an identity token's secret (a file in the daemon's `auth.token_dir`);
/// the call's identity is then `token:<file name>@<allocation>`.
pub const IDENTITY_TOKEN_HEADER: &str = "x-npud-token";
