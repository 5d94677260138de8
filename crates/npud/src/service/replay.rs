//! Request ids: Dispatch, Chain, AllocateTensor and FreeTensor run once per `npud-request-id`
//! and session, so a client that re-sends a call after a transport error (the first request
//! may have been admitted before the connection dropped) gets the first attempt's answer
//! instead of running the work again or leaking an allocation against its quota.
//!
//! A call with an id the session has not seen runs in a task of its own, so it finishes and
//! its answer is kept even when its caller's connection is gone; the caller, and every retry,
//! wait for that answer. The session remembers the last [`REPLAY_WINDOW`] ids
//! ([`crate::sessions::Sessions::replay`]). A call without the entry runs as before.
//!
//! [`REPLAY_WINDOW`]: crate::sessions::REPLAY_WINDOW

use std::future::Future;
use std::sync::Arc;

use tonic::metadata::MetadataMap;

use super::NpudService;
use crate::error::NpudError;
use crate::sessions::{Replay, Reply};

/// The request id a call's metadata carries, if any.
///
/// # Errors
/// INVALID_ARGUMENT when the entry is no decimal u64.
pub(super) fn request_id(md: &MetadataMap) -> Result<Option<u64>, NpudError> {
    let Some(v) = md.get(npu_proto::REQUEST_ID_HEADER) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            NpudError::InvalidArgument(format!(
                "{}: not a decimal u64",
                npu_proto::REQUEST_ID_HEADER
            ))
        })
}

impl NpudService {
    /// Runs `work`, the body of a `call` of `session`, once for request id `id`: the first
    /// call with the id runs it (in a task of its own), a later one gets its answer.
    pub(super) async fn once<T, W>(
        &self,
        session: u64,
        id: Option<u64>,
        call: &'static str,
        work: W,
    ) -> Result<T, NpudError>
    where
        T: Clone + Send + Sync + 'static,
        W: Future<Output = Result<T, NpudError>> + Send + 'static,
    {
        let Some(id) = id else {
            return work.await;
        };
        let mut rx = match self.state.sessions.replay(session, id, call)? {
            Replay::First(tx) => {
                let rx = tx.subscribe();
                tokio::spawn(async move {
                    let r: Reply = Arc::new(work.await);
                    // Kept even when no caller waits any more: a retry may still come.
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
