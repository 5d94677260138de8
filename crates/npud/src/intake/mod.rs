//! The intake: one tower layer, around every gRPC service the daemon serves (npud.v1, health,
//! reflection), through which every request body passes before tonic and prost decode it.
//! Every message is bounded before anything is allocated for its decoded form:
//!
//! - **Compression.** Only callers the `[auth]` policy allows may compress: a call with a
//!   `grpc-encoding` from any other caller (anonymous, an unknown `x-npud-token`, a uid that
//!   must present a token, one a rule refuses) is answered with the policy's own code
//!   (UNAUTHENTICATED, or PERMISSION_DENIED for a known identity) before its body is read.
//!   For allowed callers the intake inflates gzip and deflate itself, a message to at most
//!   [`INFLATE_RATIO`] × its compressed size + [`INFLATE_SLACK`] (and twice
//!   `limits.max_message_bytes`), stopping as soon as the output would pass that
//!   (RESOURCE_EXHAUSTED); tonic then sees only uncompressed messages, and the services accept
//!   no compression of their own.
//! - **Size.** A message longer than twice `limits.max_message_bytes` is refused from its
//!   5-byte header (RESOURCE_EXHAUSTED naming the key); a caller the policy does not allow may
//!   send messages of at most [`UNKNOWN_CALLER_MAX_MESSAGE`] bytes (its own code past that).
//! - **Counts.** Each message is scanned ([`scan`]) against its method's request type, read
//!   from the services' descriptor sets ([`schema`]): every repeated field is counted against
//!   its limit (`ChainRequest.links` against `limits.max_chain_links`, RESOURCE_EXHAUSTED;
//!   `DispatchRequest.args` against the 64 arguments a dispatch may pass, INVALID_ARGUMENT, as
//!   the handlers say), and the decoded size is estimated and refused past
//!   [`DECODED_PER_WIRE_BYTE`] × the message's length + [`DECODED_SLACK`], as is a message of
//!   more than [`MAX_FIELDS`] fields (RESOURCE_EXHAUSTED): prost's decode, which tonic runs on
//!   the I/O thread, is then at most a bounded number of steps and copies of `bytes` fields.
//!   Bytes that are no valid message are INVALID_ARGUMENT naming the field.
//! - **Budget.** Each message's bytes and estimated decoded size are charged to
//!   `limits.max_queued_request_bytes` before they are gathered, and given back when the
//!   handler is done with it ([`ledger`]), for every call, streams included.
//! - **Threads.** A message longer than [`INLINE_BYTES`] (uncompressed), or whose inflate goes
//!   past that, is inflated, scanned and decoded as bulk work ([`crate::bulk`]: below the
//!   priority of the I/O threads and the executor), at most [`Intake::workers`] at a time,
//!   never on the I/O threads that serve every caller; the handler receives it decoded
//!   ([`crate::decoded`]). Only the daemon's own methods take long messages: a longer one for health
//!   or reflection is refused from its header (RESOURCE_EXHAUSTED).
//!
//! A refused message ends its call with the status (a stream's handler names the message's
//! index: `Submit` ends the stream, `WriteTensor` fails). Cost for a caller the policy does
//! not allow: its bytes up to [`UNKNOWN_CALLER_MAX_MESSAGE`] per message, and a scan of them.

mod body;
pub mod inflate;
pub mod ledger;
pub mod scan;
pub mod schema;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::auth::{Identity, Policy};
use crate::budget::MemoryBudget;
use crate::config::Limits;
use crate::error::NpudError;
use crate::peer::ConnInfo;

use crate::decoded::Decoded;
use body::{Answered, IntakeBody};
use inflate::Header;
use ledger::{Hold, Ledger};
use schema::{Flow, Schema};

pub use schema::SchemaError;

/// A compressed message may inflate to at most this many times its compressed size (plus
/// [`INFLATE_SLACK`]): protobuf and tensor data compress 2-10×; a bomb of zeros 1000×.
pub const INFLATE_RATIO: u64 = 32;
/// What a compressed message may inflate to beyond [`INFLATE_RATIO`] × its size, so that
/// small messages of repetitive data need not be sent uncompressed.
pub const INFLATE_SLACK: u64 = 1 << 20;
/// A message may decode to at most this many bytes per byte of it (plus [`DECODED_SLACK`]).
/// The densest request the limits allow, a chain of 64-argument links each naming a tensor,
/// takes 8 bytes of `TensorArg` per 4 wire bytes, twice that while its `Vec` grows.
pub const DECODED_PER_WIRE_BYTE: u64 = 8;
/// What a message may decode to beyond [`DECODED_PER_WIRE_BYTE`] × its length.
pub const DECODED_SLACK: u64 = 1 << 20;
/// Most fields (known or unknown, at every depth) one message may have: each is a step of
/// prost's decode, which runs on the I/O thread serving the call. The densest request the
/// limits allow, a chain of 1024 links of 64 four-field arguments, has 330,000.
pub const MAX_FIELDS: u64 = 1 << 20;
/// Longest message a caller the policy does not allow may send: it may call only
/// GetDeviceInfo, health and reflection, whose requests are a few bytes.
pub const UNKNOWN_CALLER_MAX_MESSAGE: usize = 64 << 10;
/// Messages up to this long are scanned (and compressed ones inflated this far) on the I/O
/// thread that read them, and decoded there by tonic: about 100 µs of work. Longer ones are
/// scanned and decoded on the bulk-work threads.
pub const INLINE_BYTES: usize = 64 << 10;

/// What the intake needs, shared by every call.
#[derive(Debug)]
pub struct Intake {
    schema: Schema,
    policy: Arc<Policy>,
    budget: MemoryBudget,
    /// Longest message on the wire: twice `limits.max_message_bytes`.
    max_message: usize,
    max_message_bytes: u64,
    /// Places for blocking-pool jobs (inflating, scanning): [`Intake::workers`] of them.
    workers: Arc<Semaphore>,
    places: usize,
}

impl Intake {
    /// The intake for `limits`, `policy` and `budget`, running at most `workers` blocking jobs
    /// at once.
    ///
    /// # Errors
    /// [`SchemaError`] when the compiled-in descriptor sets are broken.
    pub fn new(
        limits: &Limits,
        policy: Arc<Policy>,
        budget: MemoryBudget,
        workers: usize,
    ) -> Result<Self, SchemaError> {
        Ok(Self {
            schema: Schema::served(limits)?,
            policy,
            budget,
            max_message: usize::try_from(limits.max_message_bytes.saturating_mul(2))
                .unwrap_or(usize::MAX),
            max_message_bytes: limits.max_message_bytes,
            workers: Arc::new(Semaphore::new(workers.max(1))),
            places: workers.max(1),
        })
    }

    /// Blocking-pool jobs that may run at once.
    pub fn workers(&self) -> usize {
        self.places
    }

    fn bounds() -> scan::Bounds {
        scan::Bounds {
            per_wire_byte: DECODED_PER_WIRE_BYTE,
            slack: DECODED_SLACK,
            max_fields: MAX_FIELDS,
        }
    }

    /// The most a compressed message of `len` bytes may inflate to.
    fn inflate_bound(&self, len: usize) -> usize {
        let ratio = INFLATE_RATIO
            .saturating_mul(len as u64)
            .saturating_add(INFLATE_SLACK);
        usize::try_from(ratio)
            .unwrap_or(usize::MAX)
            .min(self.max_message)
    }
}

/// Who a call says it is, kept to ask the policy only when it matters (a compressed call, a
/// long message).
#[derive(Debug, Clone)]
struct Caller {
    transport: Identity,
    token: Option<http::HeaderValue>,
}

impl Caller {
    fn of<B>(req: &http::Request<B>) -> Self {
        Self {
            transport: req
                .extensions()
                .get::<ConnInfo>()
                .map_or_else(|| Identity::anonymous(None), |c| c.identity.clone()),
            token: req.headers().get(npu_proto::IDENTITY_TOKEN_HEADER).cloned(),
        }
    }

    /// Whether the policy allows this caller, as the handlers decide it (a token the listener
    /// requires, the token's identity, the rules).
    fn allowed(&self, policy: &Policy) -> Result<(), NpudError> {
        policy.require_token(&self.transport, self.token.is_some())?;
        let token = match &self.token {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| {
                NpudError::Unauthenticated(format!(
                    "{}: not a token secret",
                    npu_proto::IDENTITY_TOKEN_HEADER
                ))
            })?),
        };
        let who = policy.identify(&self.transport, token)?;
        policy.decide(&who).map(drop)
    }
}

/// The tower layer (see the module docs).
#[derive(Debug, Clone)]
pub struct IntakeLayer {
    intake: Arc<Intake>,
}

impl IntakeLayer {
    pub fn new(intake: Intake) -> Self {
        Self {
            intake: Arc::new(intake),
        }
    }
}

impl<S> tower_layer::Layer<S> for IntakeLayer {
    type Service = IntakeService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IntakeService {
            inner,
            intake: self.intake.clone(),
        }
    }
}

/// [`IntakeLayer`] around a service.
#[derive(Debug, Clone)]
pub struct IntakeService<S> {
    inner: S,
    intake: Arc<Intake>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, R> tower_service::Service<http::Request<tonic::body::Body>> for IntakeService<S>
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

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let intake = &self.intake;
        // An unknown method's body is never read: tonic answers UNIMPLEMENTED.
        let Some(method) = intake.schema.method(req.uri().path()) else {
            return Box::pin(async move { Ok(inner.call(req).await?.map(tonic::body::Body::new)) });
        };
        let caller = Caller::of(&req);
        let encoding = match Header::of(req.headers().get("grpc-encoding")) {
            Header::Identity => None,
            // tonic refuses another encoding (UNIMPLEMENTED) before it reads the body.
            Header::Other => {
                return Box::pin(
                    async move { Ok(inner.call(req).await?.map(tonic::body::Body::new)) },
                );
            }
            Header::Known(e) => {
                if let Err(refused) = caller.allowed(&intake.policy) {
                    let status = tonic::Status::from(compression_refused(refused, e.name()));
                    return Box::pin(async move { Ok(status.into_http()) });
                }
                // The body tonic reads is uncompressed.
                req.headers_mut().remove("grpc-encoding");
                Some(e)
            }
        };
        // Where the messages the intake decodes itself wait for the handler.
        let decoded = Decoded::default();
        if method.decoder.is_some() {
            req.extensions_mut().insert(decoded.clone());
        }
        let hold = Hold::of(method.flow);
        let ledger = Arc::new(Ledger::new(intake.budget.clone(), hold));
        let intake = intake.clone();
        let body_ledger = ledger.clone();
        let req = req.map(move |body| {
            tonic::body::Body::new(IntakeBody::new(
                body,
                intake,
                method,
                decoded,
                encoding,
                caller,
                body_ledger,
            ))
        });
        Box::pin(async move {
            let resp = inner.call(req).await;
            ledger.returned();
            let resp = resp?;
            Ok(if method.flow == Flow::Bidi {
                resp.map(|b| tonic::body::Body::new(Answered::new(b, ledger)))
            } else {
                resp.map(tonic::body::Body::new)
            })
        })
    }
}

/// A compressed call from a caller the policy does not allow: its own refusal, saying why
/// compression is refused.
fn compression_refused(refused: NpudError, encoding: &str) -> NpudError {
    let why = format!(
        "compressed requests (grpc-encoding: {encoding}) are accepted only from callers the \
         [auth] policy allows, and this one is not: {}",
        refused.message()
    );
    match refused {
        NpudError::PermissionDenied(_) => NpudError::PermissionDenied(why),
        _ => NpudError::Unauthenticated(why),
    }
}
