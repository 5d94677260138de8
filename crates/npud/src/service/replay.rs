//! Request ids: Dispatch, Chain, AllocateTensor and FreeTensor run once per `npud-request-id`
//! and session, so a client that re-sends a call after a transport error (the first request
//! may have been admitted before the connection dropped) gets the first attempt's answer
//! instead of running the work again or leaking an allocation against its quota.
//!
//! A call with an id the session has not seen runs in a task of its own, so it finishes and
//! its answer is kept even when its caller's connection is gone; the caller, and every retry,
//! wait for that answer. What is remembered, for how long, and what a reused id must match is
//! `crate::request_ids`'s; this file reads the metadata and runs the call. A call without the
//! entry runs as before.

use std::future::Future;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::Request;
use tonic::metadata::MetadataMap;

use super::NpudService;
use crate::error::NpudError;
use crate::request_ids::{Claim, Replay, Reply};

/// A call's request id, as its metadata and message give it.
#[derive(Debug, Clone, Copy)]
pub(super) struct RequestId {
    claim: Claim,
    /// `npud-request-ack`: the client retries no id below this.
    ack: Option<u64>,
}

/// A decimal u64 metadata entry, if present.
///
/// # Errors
/// INVALID_ARGUMENT naming the entry when it is no decimal u64.
fn decimal(md: &MetadataMap, key: &str) -> Result<Option<u64>, NpudError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| NpudError::InvalidArgument(format!("{key}: not a decimal u64")))
}

/// The request id a call's metadata carries, if any.
///
/// # Errors
/// INVALID_ARGUMENT when the entry is no decimal u64.
pub(super) fn request_id(md: &MetadataMap) -> Result<Option<u64>, NpudError> {
    decimal(md, npu_proto::REQUEST_ID_HEADER)
}

/// A hash of a call's method and message: a reused id must name the same request.
fn fingerprint<M: prost::Message>(call: &str, message: &M) -> u64 {
    let mut bytes = Vec::with_capacity(call.len() + message.encoded_len());
    bytes.extend_from_slice(call.as_bytes());
    message.encode_raw(&mut bytes);
    foldhash::quality::FixedState::with_seed(0x6e70_7564).hash_one(bytes.as_slice())
}

impl NpudService {
    /// The request id of `req`, a `call`, if it carries one: with its fingerprint, the
    /// client's acknowledgement, and its horizon (its deadline, at most
    /// `limits.request_id_horizon_ms`, plus the session grace for a reconnect).
    ///
    /// # Errors
    /// INVALID_ARGUMENT when an entry is no decimal u64.
    pub(super) fn request_id<M: prost::Message>(
        &self,
        req: &Request<M>,
        call: &'static str,
    ) -> Result<Option<RequestId>, NpudError> {
        let md = req.metadata();
        let Some(id) = request_id(md)? else {
            return Ok(None);
        };
        let ack = decimal(md, npu_proto::REQUEST_ACK_HEADER)?;
        let cap = Duration::from_millis(self.state.limits.request_id_horizon_ms);
        let timeout = super::timeout(req).map_or(cap, |t| t.min(cap));
        Ok(Some(RequestId {
            claim: Claim {
                id,
                call,
                fingerprint: fingerprint(call, req.get_ref()),
                expires: Instant::now() + timeout + self.state.sessions.grace(),
            },
            ack,
        }))
    }

    /// Runs `work`, the body of a call of `session`, once for its request id `rid`: the first
    /// call with the id runs it (in a task of its own), a later one gets its answer.
    pub(super) async fn once<T, W>(
        &self,
        session: u64,
        rid: Option<RequestId>,
        work: W,
    ) -> Result<T, NpudError>
    where
        T: prost::Message + Clone + Send + Sync + 'static,
        W: Future<Output = Result<T, NpudError>> + Send + 'static,
    {
        let Some(RequestId { claim, ack }) = rid else {
            return work.await;
        };
        let (id, call) = (claim.id, claim.call);
        let max = self.state.limits.max_request_id_bytes_per_principal;
        let mut rx = match self.state.sessions.claim(session, claim, ack, max)? {
            Replay::First(tx) => {
                let rx = tx.subscribe();
                let sessions = self.state.sessions.clone();
                tokio::spawn(async move {
                    let r = work.await;
                    let is_final = crate::request_ids::is_final(&r);
                    let bytes = answer_bytes(&r);
                    // Kept, when final, even when no caller waits any more: a retry may still
                    // come.
                    sessions.finish_request(session, id, is_final, bytes);
                    let r: Reply = Arc::new(r);
                    tx.send_replace(Some(r));
                });
                rx
            }
            Replay::Again(rx) => rx,
        };
        let reply = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| {
                NpudError::Internal(format!(
                    "{call} with request id {id} ended without an answer"
                ))
            })?
            .clone();
        reply
            .as_deref()
            .and_then(|r| r.downcast_ref::<Result<T, NpudError>>())
            .cloned()
            .unwrap_or_else(|| {
                Err(NpudError::Internal(format!(
                    "{call} with request id {id}: the kept answer is of another call"
                )))
            })
    }
}

/// What a kept answer holds in memory: the result and the message's or the error's bytes.
fn answer_bytes<T: prost::Message>(r: &Result<T, NpudError>) -> u64 {
    let heap = match r {
        Ok(m) => m.encoded_len(),
        Err(e) => e.message().len(),
    };
    u64::try_from(std::mem::size_of::<Result<T, NpudError>>() + heap).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_a_decimal_u64() {
        let mut md = MetadataMap::new();
        assert_eq!(request_id(&md).unwrap(), None);
        md.insert(npu_proto::REQUEST_ID_HEADER, "42".parse().unwrap());
        assert_eq!(request_id(&md).unwrap(), Some(42));
        md.insert(npu_proto::REQUEST_ID_HEADER, "x1".parse().unwrap());
        let e = request_id(&md).unwrap_err();
        assert_eq!(e.message(), "npud-request-id: not a decimal u64");
    }
}
