//! [`DocumentedCodes`], a tower layer around every gRPC service: the statuses tonic makes on
//! its own, before or beside a handler, in the codes the README documents.
//!
//! Some statuses are tonic's own: a request body that is not the method's protobuf
//! (tonic-prost says INTERNAL), a message over the transport's size limit (OUT_OF_RANGE), a
//! `grpc-timeout` that expires (CANCELLED, from tonic's timeout layer). [`transport_status`]
//! puts them into the documented codes, and the layer applies it to trailers-only responses,
//! answers a refused connection's requests, and enforces `grpc-timeout` itself a millisecond
//! before tonic's own timeout would.
//!
//! Cost: one header parse and one timer per call with a `grpc-timeout`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::deadline::parse_grpc_timeout;
use crate::error::{deadline_passed, transport_status};
use crate::peer::ConnInfo;

/// How much earlier than tonic's own timeout [`DocumentedCodes`] ends a call, so that the
/// client reads DEADLINE_EXCEEDED and never tonic's CANCELLED.
const DEADLINE_MARGIN: Duration = Duration::from_millis(1);

/// The tower layer that makes tonic's own statuses the documented ones (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct DocumentedCodes {
    pub max_message_bytes: u64,
}

impl<S> tower_layer::Layer<S> for DocumentedCodes {
    type Service = DocumentedCodesService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DocumentedCodesService {
            inner,
            max_message_bytes: self.max_message_bytes,
        }
    }
}

/// [`DocumentedCodes`] around a service.
#[derive(Debug, Clone)]
pub struct DocumentedCodesService<S> {
    inner: S,
    max_message_bytes: u64,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> tower_service::Service<http::Request<B>> for DocumentedCodesService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let refused: Option<Arc<str>> = req
            .extensions()
            .get::<ConnInfo>()
            .and_then(|c| c.refused.clone());
        if let Some(why) = refused {
            let s = tonic::Status::resource_exhausted(why.to_string());
            return Box::pin(async move { Ok(s.into_http()) });
        }
        let deadline = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map(|d| tokio::time::Instant::now() + d.saturating_sub(DEADLINE_MARGIN));
        // The service that was made ready is the one called; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let max = self.max_message_bytes;
        Box::pin(async move {
            let fut = inner.call(req);
            let mut resp = match deadline {
                Some(d) => match tokio::time::timeout_at(d, fut).await {
                    Ok(r) => r?,
                    Err(_) => return Ok(deadline_passed().into_http()),
                },
                None => fut.await?,
            };
            // A trailers-only response carries its status in the headers.
            if let Some(st) = tonic::Status::from_header_map(resp.headers())
                && let Some(fixed) = transport_status(st.code(), st.message(), max)
            {
                resp.headers_mut().remove("grpc-status-details-bin");
                if fixed.add_header(resp.headers_mut()).is_err() {
                    return Ok(fixed.into_http());
                }
            }
            Ok(resp)
        })
    }
}
