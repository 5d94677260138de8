//! Shutdown that waits for work, not for idle callers.
//!
//! [`Drain`] is a tower layer around every gRPC service that knows, for each call in flight,
//! whether the daemon is working on it or waiting for its caller: a call whose request body
//! the handler is waiting on (an idle `WriteTensor` or `Submit`), or whose response stream has
//! not moved for [`QUIET`] (a `ReadTensor` its caller does not read, a `Submit` with nothing
//! admitted), is waiting for its caller. At shutdown the server asks [`Drain::busy`] until it
//! is zero and nothing is pending in the executor, then ends every life
//! (`principals::Lifecycle::shutdown`): every call still open ends with UNAVAILABLE through
//! `lives`, the one layer that ends calls (a response not yet sent becomes a trailers-only
//! UNAVAILABLE; a response stream gets UNAVAILABLE trailers). The server then keeps the
//! connections open while calls still move (a caller reading the rest of a `ReadTensor` before
//! its UNAVAILABLE), and drops them once nothing moved for `shutdown.close_grace_ms`
//! ([`Drain::quiet_for`]): a connection that sent only its preface, a caller that does not read.
//!
//! Cost: one mutex-guarded map insert and remove per call, a few atomic stores per frame.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Frame;

/// How long a response stream must not have moved before its call counts as waiting for its
/// caller.
pub const QUIET: Duration = Duration::from_millis(200);

/// One call in flight.
#[derive(Debug)]
struct Call {
    /// The handler waits for the caller's next request frame.
    waiting_for_caller: AtomicBool,
    /// The response head has been produced.
    responded: AtomicBool,
    /// When the call last moved (a request or response frame), in ms since [`Shared::epoch`].
    moved_ms: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    calls: Mutex<HashMap<u64, Arc<Call>>>,
    next: AtomicU64,
    epoch: Instant,
    /// When any call last moved or closed, in ms since `epoch`.
    last_moved_ms: AtomicU64,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records that `call` moved now.
    fn moved(&self, call: &Call) {
        let now = self.now_ms();
        call.moved_ms.store(now, Ordering::Release);
        self.last_moved_ms.fetch_max(now, Ordering::AcqRel);
    }
}

/// The calls in flight, and the switch that ends the idle ones (see the module docs).
#[derive(Debug, Clone)]
pub struct Drain {
    shared: Arc<Shared>,
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

impl Drain {
    /// A drain with no call yet.
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                calls: Mutex::new(HashMap::new()),
                next: AtomicU64::new(0),
                epoch: Instant::now(),
                last_moved_ms: AtomicU64::new(0),
            }),
        }
    }

    /// Calls in flight that the daemon is working on (not waiting for their caller).
    pub fn busy(&self) -> usize {
        let now = self.shared.now_ms();
        let quiet = u64::try_from(QUIET.as_millis()).unwrap_or(u64::MAX);
        let calls = self
            .shared
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        calls
            .values()
            .filter(|c| {
                let handling = !c.responded.load(Ordering::Acquire)
                    && !c.waiting_for_caller.load(Ordering::Acquire);
                let recent = now.saturating_sub(c.moved_ms.load(Ordering::Acquire)) < quiet;
                handling || recent
            })
            .count()
    }

    /// How long no call has moved (a request or response frame) or closed: while a caller
    /// still takes what it was sent, this stays short.
    pub fn quiet_for(&self) -> Duration {
        let last = self.shared.last_moved_ms.load(Ordering::Acquire);
        Duration::from_millis(self.shared.now_ms().saturating_sub(last))
    }

    /// Calls in flight.
    pub fn open(&self) -> usize {
        self.shared
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn register(&self) -> (u64, Arc<Call>) {
        let id = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let call = Arc::new(Call {
            waiting_for_caller: AtomicBool::new(false),
            responded: AtomicBool::new(false),
            moved_ms: AtomicU64::new(0),
        });
        self.shared.moved(&call);
        self.shared
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, call.clone());
        (id, call)
    }
}

/// Takes a call out of the table when the last of its request body, response future and
/// response body is gone.
#[derive(Debug)]
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let call = self
            .shared
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
        if let Some(c) = call {
            // Its last frames may still be on their way to the socket.
            self.shared.moved(&c);
        }
    }
}

impl<S> tower_layer::Layer<S> for Drain {
    type Service = DrainService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DrainService {
            inner,
            drain: self.clone(),
        }
    }
}

/// [`Drain`] around a service.
#[derive(Debug, Clone)]
pub struct DrainService<S> {
    inner: S,
    drain: Drain,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, R> tower_service::Service<http::Request<tonic::body::Body>> for DrainService<S>
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
        let (id, call) = self.drain.register();
        let registration = Arc::new(Registration {
            shared: self.drain.shared.clone(),
            id,
        });
        let shared = self.drain.shared.clone();
        let req = req.map(|body| {
            tonic::body::Body::new(RequestBody {
                inner: body,
                call: call.clone(),
                shared: shared.clone(),
                _registration: registration.clone(),
            })
        });
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let resp = inner.call(req).await?;
            call.responded.store(true, Ordering::Release);
            shared.moved(&call);
            Ok(resp.map(|body| {
                tonic::body::Body::new(ResponseBody {
                    inner: body,
                    call,
                    shared,
                    done: false,
                    _registration: registration,
                })
            }))
        })
    }
}

/// A request body that records whether the handler waits for the caller.
struct RequestBody {
    inner: tonic::body::Body,
    call: Arc<Call>,
    shared: Arc<Shared>,
    _registration: Arc<Registration>,
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        let waiting = r.is_pending();
        self.call
            .waiting_for_caller
            .store(waiting, Ordering::Release);
        if !waiting {
            self.shared.moved(&self.call);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that records when the call last moved.
struct ResponseBody<R> {
    inner: R,
    call: Arc<Call>,
    shared: Arc<Shared>,
    done: bool,
    _registration: Arc<Registration>,
}

impl<R> http_body::Body for ResponseBody<R>
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
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                self.shared.moved(&self.call);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_busy_until_it_waits_for_its_caller_and_has_been_quiet() {
        let d = Drain::new();
        let (id, call) = d.register();
        let _r = Registration {
            shared: d.shared.clone(),
            id,
        };
        assert_eq!((d.open(), d.busy()), (1, 1));
        call.waiting_for_caller.store(true, Ordering::Release);
        // Moved just now: still counted until it has been quiet.
        assert_eq!(d.busy(), 1);
        call.moved_ms.store(0, Ordering::Release);
        std::thread::sleep(QUIET + Duration::from_millis(20));
        assert_eq!(d.busy(), 0);
        drop(_r);
        assert_eq!(d.open(), 0);
    }

    #[test]
    fn quiet_for_counts_from_the_last_frame_or_close_of_any_call() {
        let d = Drain::new();
        let (id, call) = d.register();
        let r = Registration {
            shared: d.shared.clone(),
            id,
        };
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            d.quiet_for() >= Duration::from_millis(50),
            "{:?}",
            d.quiet_for()
        );
        // At most the time since the move (ms are whole, so up to 1 ms more).
        let since = |t: Instant| t.elapsed() + Duration::from_millis(1);
        let t = Instant::now();
        d.shared.moved(&call);
        assert!(d.quiet_for() <= since(t), "{:?}", d.quiet_for());
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            d.quiet_for() >= Duration::from_millis(50),
            "{:?}",
            d.quiet_for()
        );
        // Closing is a move too: its last frames may still be on their way.
        let t = Instant::now();
        drop(r);
        assert!(d.quiet_for() <= since(t), "{:?}", d.quiet_for());
    }
}
