//! The daemon's `grpc.health.v1` status, as a probe asks for it.
//!
//! npud reports `SERVING` while its device takes work and `NOT_SERVING` while the device
//! recovers from a fault (held for at least `health.min_not_serving_ms`) and from the moment it
//! starts draining at shutdown. It answers for `""` (the server as a whole) and
//! `npud.v1.Npud`. [`check`] opens no session and makes no other call, so it costs the daemon
//! one connection and one unary call: what a Kubernetes exec probe (`npuctl health`) needs,
//! since the kubelet's own gRPC probe reaches neither a Unix socket nor a TLS port.

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

pub use tonic_health::pb::health_check_response::ServingStatus;

use crate::ClientError;
use crate::connect::{Address, ConnectOptions, open_channel};

/// The health status the daemon at `address` (as [`Address::resolve`] takes it) reports for
/// `service`, within the options' connect and call timeouts, over the options' TLS and with
/// their identity token.
///
/// # Errors
///
/// [`ClientError::Address`] or [`ClientError::Connect`] when the daemon cannot be reached,
/// [`ClientError::Timeout`] when it does not answer in time, [`ClientError::Daemon`] when it
/// refuses the call (`NOT_FOUND` for a service it does not report on).
pub async fn check(
    address: Option<&str>,
    opts: &ConnectOptions,
    service: &str,
) -> Result<ServingStatus, ClientError> {
    let addr = Address::resolve(address)?;
    let identity = crate::session::identity_header(&addr, opts)?;
    let channel = open_channel(&addr, opts).await?;
    let mut client = HealthClient::new(channel);
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    // The identity token, as every other call carries it (health answers without one too).
    if let Some(token) = identity {
        request
            .metadata_mut()
            .insert(npu_proto::IDENTITY_TOKEN_HEADER, token);
    }
    let call = client.check(request);
    match tokio::time::timeout(opts.call_timeout, call).await {
        Ok(Ok(r)) => Ok(r.into_inner().status()),
        Ok(Err(st)) => {
            Err(crate::session::first_call_failed(&addr, opts, "Health/Check", &st).await)
        }
        Err(_) => Err(ClientError::Timeout {
            call: "Health/Check",
            timeout: opts.call_timeout,
        }),
    }
}
