//! [`RpcMetrics`]: the tower layer that counts every gRPC call's outcome by method and code.
//!
//! It sits outside [`DocumentedCodes`](crate::codes::DocumentedCodes), so it counts the codes
//! clients read. A call's status is in the response headers when the response is
//! trailers-only (every unary error), otherwise in the trailers after the body; the layer
//! wraps the body to read them. A body dropped before its trailers (the client went away) is
//! counted as `CANCELLED`.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use prost::Message;

use super::Metrics;
use crate::error::code_name;

/// The paths of every method the daemon serves (`/npud.v1.Npud/Dispatch`, ...), from the
/// services' own descriptors.
pub fn api_methods() -> HashSet<Arc<str>> {
    let mut out = HashSet::new();
    for set in [
        npu_proto::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ] {
        // The sets are compiled into the binary; one that does not decode names no method.
        let Ok(set) = prost_types::FileDescriptorSet::decode(set) else {
            continue;
        };
        for file in set.file {
            let package = file.package.unwrap_or_default();
            for service in file.service {
                let service_name = service.name.unwrap_or_default();
                for m in service.method {
                    let path = format!("/{package}.{service_name}/{}", m.name.unwrap_or_default());
                    out.insert(Arc::from(path));
                }
            }
        }
    }
    out
}

/// The layer (see the module docs).
#[derive(Debug, Clone)]
pub struct RpcMetrics {
    pub metrics: Arc<Metrics>,
}

impl<S> tower_layer::Layer<S> for RpcMetrics {
    type Service = RpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// [`RpcMetrics`] around a service.
#[derive(Debug, Clone)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

/// Counts one call once: when its status is seen, or as `CANCELLED` when dropped unseen.
#[derive(Debug)]
struct Outcome {
    metrics: Arc<Metrics>,
    method: Arc<str>,
    counted: bool,
}

impl Outcome {
    fn count(&mut self, code: &'static str) {
        if !self.counted {
            self.counted = true;
            self.metrics.rpc(&self.method, code);
        }
    }

    /// Counts the status in `headers` (response headers of a trailers-only response, or
    /// trailers), if they carry one.
    fn count_status_in(&mut self, headers: &http::HeaderMap) -> bool {
        match tonic::Status::from_header_map(headers) {
            Some(s) => {
                self.count(code_name(s.code()));
                true
            }
            None => false,
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        self.count("CANCELLED");
    }
}

/// A response body that counts the call's status from its trailers.
#[derive(Debug)]
pub struct CountedBody<B> {
    inner: B,
    outcome: Option<Outcome>,
}

impl<B: Default> Default for CountedBody<B> {
    fn default() -> Self {
        Self {
            inner: B::default(),
            outcome: None,
        }
    }
}

impl<B> Body for CountedBody<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(t) = frame.trailers_ref()
                    && let Some(o) = &mut this.outcome
                    && o.count_status_in(t)
                {
                    this.outcome = None;
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(mut o) = this.outcome.take() {
                    o.count("INTERNAL");
                }
            }
            Poll::Ready(None) => {
                // A body that ended without a status: the transport reports it as UNKNOWN.
                if let Some(mut o) = this.outcome.take() {
                    o.count("UNKNOWN");
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> tower_service::Service<http::Request<B>> for RpcMetricsService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: Body + Unpin + Send + 'static,
{
    type Response = http::Response<CountedBody<R>>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let mut outcome = Outcome {
            method: self.metrics.method_label(req.uri().path()),
            metrics: self.metrics.clone(),
            counted: false,
        };
        // The service that was made ready is the one called; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let resp = inner
                .call(req)
                .await
                .inspect_err(|_| outcome.count("INTERNAL"))?;
            let (parts, body) = resp.into_parts();
            let outcome = if outcome.count_status_in(&parts.headers) {
                None
            } else {
                Some(outcome)
            };
            Ok(http::Response::from_parts(
                parts,
                CountedBody {
                    inner: body,
                    outcome,
                },
            ))
        })
    }
}
