//! The tower layer that holds calls carrying an `x-npud-token` to their token.
//!
//! Before a call reaches its handler: a secret the token view does not hold waits for a scan
//! of `auth.token_dir` that started after the call arrived (see `auth::Tokens::fresh`), so the
//! handler, which looks secrets up in memory only, sees every file written before the call.
//! While the call runs: once its token is revoked (the file removed or rewritten), a call not
//! yet answered is answered UNAUTHENTICATED, and a response still streaming (Submit,
//! ReadTensor) ends with UNAUTHENTICATED trailers, within one `auth.token_poll_ms` of the
//! change. The handler's own work is then dropped as when its caller goes away.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::Frame;

use crate::auth::{Policy, Tokens};

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;
type Revoked = Pin<Box<dyn Future<Output = ()> + Send>>;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct TokenLayer {
    tokens: Option<Tokens>,
}

impl TokenLayer {
    /// The layer for `policy`'s token directory (a pass-through without one).
    pub fn new(policy: &Arc<Policy>) -> Self {
        Self {
            tokens: policy.tokens().cloned(),
        }
    }
}

impl<S> tower_layer::Layer<S> for TokenLayer {
    type Service = TokenService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenService {
            inner,
            tokens: self.tokens.clone(),
        }
    }
}

/// [`TokenLayer`] around a service.
#[derive(Debug, Clone)]
pub struct TokenService<S> {
    inner: S,
    tokens: Option<Tokens>,
}

/// The status a revoked token's call ends with.
fn revoked_status(identity: &str) -> tonic::Status {
    tonic::Status::unauthenticated(format!(
        "{identity} was revoked: its file in auth.token_dir was removed or rewritten; this call \
         ends"
    ))
}

impl<S, R> tower_service::Service<http::Request<tonic::body::Body>> for TokenService<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>, Response = http::Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    R::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let arrived = Instant::now();
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let secret = req
            .headers()
            .get(npu_proto::IDENTITY_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_owned());
        let (Some(tokens), Some(secret)) = (self.tokens.clone(), secret) else {
            return Box::pin(async move { Ok(inner.call(req).await?.map(tonic::body::Body::new)) });
        };
        Box::pin(async move {
            if tokens.lookup(&secret).is_none() {
                tokens.fresh(arrived).await;
            }
            // Unknown even now: the handler refuses it.
            let Some(identity) = tokens.lookup(&secret) else {
                return Ok(inner.call(req).await?.map(tonic::body::Body::new));
            };
            let mut revoked: Revoked = Box::pin(tokens.revoked(&identity));
            let fut = inner.call(req);
            let resp = tokio::select! {
                biased;
                () = &mut revoked => return Ok(revoked_status(&identity).into_http()),
                r = fut => r?,
            };
            Ok(resp.map(|body| {
                tonic::body::Body::new(RevocableBody {
                    inner: body,
                    revoked,
                    identity,
                    done: false,
                })
            }))
        })
    }
}

/// A response body that ends with UNAUTHENTICATED trailers once its token is revoked.
struct RevocableBody<R> {
    inner: R,
    revoked: Revoked,
    identity: String,
    done: bool,
}

impl<R> RevocableBody<R> {
    fn trailers(&mut self) -> Frame<Bytes> {
        self.done = true;
        let mut h = http::HeaderMap::new();
        let _ = revoked_status(&self.identity).add_header(&mut h);
        Frame::trailers(h)
    }
}

impl<R> http_body::Body for RevocableBody<R>
where
    R: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = R::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, R::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.revoked.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Ok(self.trailers())));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if f.is_trailers() {
                    self.done = true;
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }
}
