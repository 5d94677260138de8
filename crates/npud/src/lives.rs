//! The tower layer that holds every gRPC call to the life of what it runs in (see
//! `principals`): its session's, or its principal's outside a session.
//!
//! Before a call reaches its handler: a call carrying an `x-npud-token` secret the token view
//! does not hold waits for a scan of `auth.token_dir` that started after the call arrived (see
//! `auth::Tokens::fresh`), so the handler, which looks secrets up in memory only, sees every
//! file written before the call.
//!
//! While the call runs: once its life ends (its token identity revoked, its session ended, the
//! daemon shutting down), a call not yet answered is answered with the life's reason, and a
//! response still streaming (Submit, ReadTensor) ends with the reason in its trailers, at once.
//! (A fault cool-down ends a session's stream life instead, which the Submit stream and the
//! dispatch ring watch themselves: they admit nothing more, answer what they admitted, then
//! end with the cool-down's reason.) The handler's own work is then dropped as when its caller
//! goes away. CloseSession holds its principal's life, not the session it ends.
//!
//! Cost: the headers read, one lookup in the lifecycle's map and an `Arc` clone per call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::Frame;
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::auth::{Identity, Tokens};
use crate::peer::ConnInfo;
use crate::principals::{Life, Lifecycle};

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct LifeLayer {
    tokens: Option<Tokens>,
    lifecycle: Arc<Lifecycle>,
}

impl LifeLayer {
    /// The layer for `lifecycle`, waiting for fresh scans of `tokens` (when token identities
    /// are configured).
    pub fn new(tokens: Option<Tokens>, lifecycle: Arc<Lifecycle>) -> Self {
        Self { tokens, lifecycle }
    }
}

impl<S> tower_layer::Layer<S> for LifeLayer {
    type Service = LifeService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LifeService {
            inner,
            layer: self.clone(),
        }
    }
}

/// [`LifeLayer`] around a service.
#[derive(Debug, Clone)]
pub struct LifeService<S> {
    inner: S,
    layer: LifeLayer,
}

/// The session a call's metadata names, if it parses.
fn session_of(req: &http::Request<tonic::body::Body>) -> Option<u64> {
    if req.uri().path() == "/npud.v1.Npud/CloseSession" {
        return None;
    }
    req.headers()
        .get(npu_proto::SESSION_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl<S, R> tower_service::Service<http::Request<tonic::body::Body>> for LifeService<S>
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
        let layer = self.layer.clone();
        let secret = req
            .headers()
            .get(npu_proto::IDENTITY_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_owned());
        let session = session_of(&req);
        let transport: Option<Arc<str>> =
            req.extensions().get::<ConnInfo>().map(|c| c.identity.key());
        Box::pin(async move {
            let held = session.and_then(|s| layer.lifecycle.session_life(s));
            let life: Arc<Life> = match held {
                Some(l) => l,
                None => {
                    let principal = match (&layer.tokens, secret) {
                        (Some(tokens), Some(secret)) => {
                            if tokens.lookup(&secret).is_none() {
                                tokens.fresh(arrived).await;
                            }
                            // Unknown even now: the handler refuses it.
                            tokens.lookup(&secret).map(Arc::<str>::from)
                        }
                        _ => None,
                    };
                    let name = principal
                        .or(transport)
                        .unwrap_or_else(|| Identity::anonymous(None).key());
                    layer.lifecycle.principal_life(&name)
                }
            };
            if life.is_ended() {
                return Ok(tonic::Status::from(life.why()).into_http());
            }
            let mut ended = Box::pin(life.ended());
            let fut = inner.call(req);
            let resp = tokio::select! {
                biased;
                () = &mut ended => return Ok(tonic::Status::from(life.why()).into_http()),
                r = fut => r?,
            };
            Ok(resp.map(|body| {
                tonic::body::Body::new(LivingBody {
                    inner: body,
                    ended,
                    life,
                    done: false,
                })
            }))
        })
    }
}

/// A response body that ends with its life's reason in its trailers once the life ends.
struct LivingBody<R> {
    inner: R,
    ended: Pin<Box<WaitForCancellationFutureOwned>>,
    life: Arc<Life>,
    done: bool,
}

impl<R> LivingBody<R> {
    fn trailers(&mut self) -> Frame<Bytes> {
        self.done = true;
        let mut h = http::HeaderMap::new();
        let _ = tonic::Status::from(self.life.why()).add_header(&mut h);
        Frame::trailers(h)
    }
}

impl<R> http_body::Body for LivingBody<R>
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
        if self.ended.as_mut().poll(cx).is_ready() {
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
