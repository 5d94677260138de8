//! The request body tonic reads through the intake, and the response body that counts a
//! bidirectional stream's answers.
//!
//! [`IntakeBody`] reads the HTTP/2 body's frames into a queue only as far as the message being
//! read needs, checks its 5-byte header as soon as it is in (flag, length, the caller's size,
//! the budget), and hands tonic each message whole, uncompressed, in one frame: the frame
//! received when the message came in one (no copy), else the message gathered into one buffer
//! (a long one frame by frame as its bytes arrive, into a buffer of its length, charged before
//! it is allocated, and allocated with its pages brought in on a bulk-work thread). A long message is decoded on a bulk-work thread and tonic is handed an
//! empty stand-in ([`crate::decoded`]), so tonic never copies or decodes more than
//! [`INLINE_BYTES`] of one message on the I/O thread.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Frame;

use super::inflate::{Encoding, Inflate, InflateError};
use super::ledger::Ledger;
use super::scan::scan;
use super::schema::{MessageId, Method};
use super::{
    Caller, INFLATE_RATIO, INFLATE_SLACK, INLINE_BYTES, Intake, UNKNOWN_CALLER_MAX_MESSAGE,
};
use crate::decoded::{self, DecodeFn, Decoded};
use crate::error::NpudError;

/// A gRPC message's header: the compressed flag and the length.
const HEADER: usize = 5;
/// How many bytes of a gather buffer are written (their pages faulted in) between two
/// [`crate::bulk::pause`] points.
const PREPARE_PIECE: usize = 64 << 10;

type Job = Pin<Box<dyn Future<Output = Result<Processed, NpudError>> + Send>>;

/// A long message's buffer on its way from a bulk-work thread.
type Preparing = Pin<Box<dyn Future<Output = Result<BytesMut, NpudError>> + Send>>;

/// Where a message longer than [`INLINE_BYTES`] is gathered.
///
/// Its buffer is allocated, and each of its pages written once, on a bulk-work thread
/// ([`prepared`]) while the body reads nothing more: the I/O thread then only copies frames
/// into memory that is already there. Allocated on the I/O thread, an 8 MiB buffer's first
/// touches were 2,048 page faults there, frame by frame, on the thread every caller shares.
enum Gather {
    /// The buffer is being prepared; the bytes received so far wait in the queue.
    Preparing(Preparing),
    /// The buffer, the header and the bytes received so far in it.
    Filling(BytesMut),
}

/// A message ready for tonic.
struct Processed {
    /// Header and message, uncompressed; for a message decoded here, an empty one.
    frame: Bytes,
    /// What it holds in the budget: its bytes and its decoded size.
    charge: u64,
    /// The message, decoded here (a long one, see [`decoded`]).
    decoded: Option<decoded::Message>,
}

/// The frame handed to tonic in place of a message the intake decoded: an empty message.
static STAND_IN: [u8; HEADER] = [0; HEADER];

/// See the module docs.
pub(super) struct IntakeBody {
    inner: tonic::body::Body,
    intake: Arc<Intake>,
    input: MessageId,
    /// How a long message is decoded here; `None` for a method whose messages are never long.
    decoder: Option<DecodeFn>,
    /// Where the messages decoded here wait for the handler, and the next message's index.
    decoded: Decoded,
    index: u64,
    encoding: Option<Encoding>,
    caller: Caller,
    /// Whether the policy allows the caller, once asked.
    allowed: Option<Result<(), NpudError>>,
    ledger: Arc<Ledger>,
    /// Bytes received and not yet handed on.
    rx: VecDeque<Bytes>,
    rx_len: usize,
    /// The header of the message being read: compressed, length.
    header: Option<(bool, usize)>,
    /// A message longer than [`INLINE_BYTES`] being gathered, frame by frame as its bytes
    /// arrive (so that no single copy of it stalls the I/O thread); its header included.
    gather: Option<Gather>,
    job: Option<Job>,
    /// A message was handed to tonic since the last poll.
    handed: bool,
    ended: bool,
    done: bool,
    trailers: Option<http::HeaderMap>,
}

impl IntakeBody {
    pub(super) fn new(
        inner: tonic::body::Body,
        intake: Arc<Intake>,
        method: Method,
        decoded: Decoded,
        encoding: Option<Encoding>,
        caller: Caller,
        ledger: Arc<Ledger>,
    ) -> Self {
        Self {
            inner,
            intake,
            input: method.input,
            decoder: method.decoder,
            decoded,
            index: 0,
            encoding,
            caller,
            allowed: None,
            ledger,
            rx: VecDeque::new(),
            rx_len: 0,
            header: None,
            gather: None,
            job: None,
            handed: false,
            ended: false,
            done: false,
            trailers: None,
        }
    }

    fn allowed(&mut self) -> Result<(), NpudError> {
        let policy = &self.intake.policy;
        self.allowed
            .get_or_insert_with(|| self.caller.allowed(policy))
            .clone()
    }

    /// The first `n` bytes received, removed from the queue: the front frame's own bytes when
    /// it holds them all.
    fn take(&mut self, n: usize) -> Bytes {
        self.rx_len -= n;
        if let Some(front) = self.rx.front_mut()
            && front.len() >= n
        {
            let b = front.split_to(n);
            if front.is_empty() {
                self.rx.pop_front();
            }
            return b;
        }
        let mut out = BytesMut::with_capacity(n);
        while out.len() < n {
            let Some(front) = self.rx.front_mut() else {
                break;
            };
            let k = front.len().min(n - out.len());
            out.put_slice(&front[..k]);
            front.advance(k);
            if front.is_empty() {
                self.rx.pop_front();
            }
        }
        out.freeze()
    }

    fn peek_header(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        let mut i = 0;
        'outer: for b in &self.rx {
            for &x in b.iter() {
                h[i] = x;
                i += 1;
                if i == HEADER {
                    break 'outer;
                }
            }
        }
        h
    }

    /// Checks the next message's header once it is in, and reserves what the message may
    /// hold. `Ok(None)` while more bytes are needed.
    fn read_header(&mut self) -> Result<Option<(bool, usize)>, NpudError> {
        if let Some(h) = self.header {
            return Ok(Some(h));
        }
        if self.rx_len < HEADER {
            return Ok(None);
        }
        let h = self.peek_header();
        let compressed = match h[0] {
            0 => false,
            1 => true,
            f => {
                return Err(NpudError::InvalidArgument(format!(
                    "the request is not a valid gRPC message: compressed flag {f} (valid flags \
                     are 0 and 1)"
                )));
            }
        };
        if compressed && self.encoding.is_none() {
            return Err(NpudError::InvalidArgument(
                "the request is not a valid gRPC message: it is marked compressed, but the \
                 call names no grpc-encoding"
                    .into(),
            ));
        }
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        let max = self.intake.max_message;
        if len > max {
            return Err(NpudError::ResourceExhausted(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: \
                 {max} bytes (limits.max_message_bytes is {}; the transport accepts messages \
                 up to twice that)",
                self.intake.max_message_bytes
            )));
        }
        if len > INLINE_BYTES && self.decoder.is_none() {
            return Err(too_long(&self.intake, self.input, len));
        }
        if len > UNKNOWN_CALLER_MAX_MESSAGE
            && let Err(refused) = self.allowed()
        {
            let why = format!(
                "{}; a caller the [auth] policy does not allow may send messages of at most \
                 {UNKNOWN_CALLER_MAX_MESSAGE} bytes, and this one is {len}",
                refused.message()
            );
            return Err(match refused {
                NpudError::PermissionDenied(_) => NpudError::PermissionDenied(why),
                _ => NpudError::Unauthenticated(why),
            });
        }
        // What the message may hold, reserved before its bytes are gathered (a message
        // already all in, the usual small one, is charged once, when it is handed on).
        if compressed || self.rx_len < HEADER + len {
            let most = if compressed {
                len + self.intake.inflate_bound(len)
            } else {
                len
            };
            self.ledger.settle(most as u64)?;
        }
        self.header = Some((compressed, len));
        Ok(Some((compressed, len)))
    }

    /// The next message, once it is all in: ready to hand on, or a job that makes it so.
    fn next_message(&mut self) -> Result<Option<Step>, NpudError> {
        let Some((compressed, len)) = self.read_header()? else {
            return Ok(None);
        };
        let message = match self.gather.take() {
            Some(Gather::Filling(g)) if g.len() == HEADER + len => g.freeze(),
            Some(g) => {
                self.gather = Some(g);
                return Ok(None);
            }
            None if self.rx_len < HEADER + len => {
                if len > INLINE_BYTES {
                    // Everything received belongs to this message: gather it from here on,
                    // in a buffer prepared off this thread.
                    self.gather = Some(Gather::Preparing(self.prepared(HEADER + len)));
                }
                return Ok(None);
            }
            None => self.take(HEADER + len),
        };
        self.header = None;
        let (intake, input, decoder) = (self.intake.clone(), self.input, self.decoder);
        if !compressed {
            if len <= INLINE_BYTES {
                return Ok(Some(Step::Ready(processed(
                    &intake, input, decoder, message,
                )?)));
            }
            return Ok(Some(Step::Job(
                self.job(move |i| processed(i, input, decoder, message)),
            )));
        }
        let message = message.slice(HEADER..);
        let encoding = self.encoding.ok_or_else(|| {
            NpudError::Internal("a compressed message without an encoding passed the header".into())
        })?;
        let bound = intake.inflate_bound(len);
        let mut inflate = Inflate::new(encoding, message, bound, HEADER);
        // Inline, at most `INLINE_BYTES` of input and about as much output (deflate's empty
        // blocks produce nothing from any amount of input: the input bounds the work too).
        if len <= INLINE_BYTES
            && inflate_step(&mut inflate, encoding, len, bound, &intake, INLINE_BYTES)?
        {
            let out = inflate.finish();
            if out.len() - HEADER <= INLINE_BYTES {
                return Ok(Some(Step::Ready(framed(
                    &intake, input, decoder, out, len,
                )?)));
            }
            return Ok(Some(Step::Job(
                self.job(move |i| framed(i, input, decoder, out, len)),
            )));
        }
        Ok(Some(Step::Job(self.job(move |i| {
            while !inflate_step(&mut inflate, encoding, len, bound, i, usize::MAX)? {}
            framed(i, input, decoder, inflate.finish(), len)
        }))))
    }

    /// `work`, as bulk work (`crate::bulk`) once one of the intake's places is free.
    fn job(
        &self,
        work: impl FnOnce(&Intake) -> Result<Processed, NpudError> + Send + 'static,
    ) -> Job {
        Box::pin(on_bulk(self.intake.clone(), work))
    }

    /// A buffer of `n` bytes' capacity whose pages are all in memory, made on a bulk-work
    /// thread once one of the intake's places is free. The message's bytes were charged when
    /// its header was read.
    fn prepared(&self, n: usize) -> Preparing {
        Box::pin(on_bulk(self.intake.clone(), move |_| {
            let mut g = BytesMut::with_capacity(n);
            // Written once, so that every page is in, a piece at a time between pause points;
            // the length goes back to 0 and the capacity stays.
            while g.len() < n {
                let to = (g.len() + PREPARE_PIECE).min(n);
                g.resize(to, 0);
                crate::bulk::pause();
            }
            g.clear();
            Ok(g)
        }))
    }

    /// The gather buffer, once prepared: the bytes queued meanwhile go into it. `Pending`
    /// while it is being prepared.
    fn poll_gather(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), NpudError>> {
        let Some(Gather::Preparing(p)) = self.gather.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut g = ready!(p.as_mut().poll(cx))?;
        for b in self.rx.drain(..) {
            g.put_slice(&b);
        }
        self.rx_len = 0;
        self.gather = Some(Gather::Filling(g));
        Poll::Ready(Ok(()))
    }

    /// Bytes received: into the message being gathered, as far as it needs them; the rest
    /// queued.
    fn push(&mut self, mut d: Bytes) {
        if let (Some(Gather::Filling(g)), Some((_, len))) = (&mut self.gather, self.header) {
            let k = (HEADER + len - g.len()).min(d.len());
            g.put_slice(&d[..k]);
            d.advance(k);
        }
        if !d.is_empty() {
            self.rx_len += d.len();
            self.rx.push_back(d);
        }
    }

    fn fail(&mut self, e: NpudError) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        self.done = true;
        Poll::Ready(Some(Err(tonic::Status::from(e))))
    }

    fn hand(&mut self, p: Processed) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if let Err(e) = self.ledger.hand(p.charge) {
            return self.fail(e);
        }
        // The decoded message is in place before tonic reads its stand-in.
        if let Some(m) = p.decoded {
            self.decoded.put(self.index, m);
        }
        self.index += 1;
        self.handed = true;
        Poll::Ready(Some(Ok(Frame::data(p.frame))))
    }
}

enum Step {
    Ready(Processed),
    Job(Job),
}

/// `work` on a bulk-work thread (`crate::bulk`) once one of the intake's places is free.
async fn on_bulk<T: Send + 'static>(
    intake: Arc<Intake>,
    work: impl FnOnce(&Intake) -> Result<T, NpudError> + Send + 'static,
) -> Result<T, NpudError> {
    let permit = intake
        .workers
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| NpudError::Unavailable("the daemon is shutting down".into()))?;
    let i = intake.clone();
    crate::bulk::run(move || {
        let _permit = permit;
        work(&i)
    })
    .await
    .unwrap_or_else(|e| {
        Err(NpudError::Internal(format!(
            "reading the request failed: {e}"
        )))
    })
}

/// Inflates up to `budget` more bytes: `Ok(true)` once done.
fn inflate_step(
    inflate: &mut Inflate,
    encoding: Encoding,
    len: usize,
    bound: usize,
    intake: &Intake,
    budget: usize,
) -> Result<bool, NpudError> {
    inflate.step(budget).map_err(|e| match e {
        InflateError::TooLarge => NpudError::ResourceExhausted(format!(
            "a {enc} message of {len} bytes inflates past {bound} bytes: a compressed message \
             may inflate to at most {INFLATE_RATIO} times its size + {INFLATE_SLACK} bytes, \
             and to at most twice limits.max_message_bytes ({}); refused before decoding \
             (send it uncompressed)",
            intake.max_message_bytes,
            enc = encoding.name()
        )),
        InflateError::Corrupt(e) => NpudError::InvalidArgument(format!(
            "the request's {} data is corrupt: {e}",
            encoding.name()
        )),
    })
}

/// An inflated message (after `HEADER` bytes of room), scanned and framed (decoded when
/// long, see [`handed_on`]); `compressed` is its length on the wire.
fn framed(
    intake: &Intake,
    input: MessageId,
    decoder: Option<DecodeFn>,
    mut out: Vec<u8>,
    compressed: usize,
) -> Result<Processed, NpudError> {
    let len = out.len() - HEADER;
    let scanned = scan(&intake.schema, input, &out[HEADER..], Intake::bounds())?;
    out[0] = 0;
    out[1..HEADER].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    let charge = (len + compressed) as u64 + scanned.decoded;
    handed_on(intake, input, decoder, Bytes::from(out), charge)
}

/// An uncompressed message (its header and bytes), scanned (and decoded when long, see
/// [`handed_on`]).
fn processed(
    intake: &Intake,
    input: MessageId,
    decoder: Option<DecodeFn>,
    message: Bytes,
) -> Result<Processed, NpudError> {
    let scanned = scan(&intake.schema, input, &message[HEADER..], Intake::bounds())?;
    let charge = (message.len() - HEADER) as u64 + scanned.decoded;
    handed_on(intake, input, decoder, message, charge)
}

/// A scanned message (its header and bytes) as tonic is handed it: itself when at most
/// [`INLINE_BYTES`] long; else decoded here (on the bulk-work thread that scanned it) and
/// replaced by an empty stand-in, so that prost's decode of it never runs on an I/O thread.
fn handed_on(
    intake: &Intake,
    input: MessageId,
    decoder: Option<DecodeFn>,
    frame: Bytes,
    charge: u64,
) -> Result<Processed, NpudError> {
    let len = frame.len() - HEADER;
    if len <= INLINE_BYTES {
        return Ok(Processed {
            frame,
            charge,
            decoded: None,
        });
    }
    let Some(decode) = decoder else {
        return Err(too_long(intake, input, len));
    };
    let message = decode(frame.slice(HEADER..)).map_err(|e| {
        NpudError::InvalidArgument(format!(
            "the request is not a valid {}: {e}",
            intake.schema.message(input).name
        ))
    })?;
    Ok(Processed {
        frame: Bytes::from_static(&STAND_IN),
        charge,
        decoded: Some(message),
    })
}

/// A message of `len` bytes for a method whose requests are never long (health, reflection).
fn too_long(intake: &Intake, input: MessageId, len: usize) -> NpudError {
    NpudError::ResourceExhausted(format!(
        "a {} is at most {INLINE_BYTES} bytes long, and this one is {len}",
        intake.schema.message(input).name
    ))
}

impl http_body::Body for IntakeBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if std::mem::take(&mut this.handed) {
            this.ledger.next_asked();
        }
        loop {
            if let Some(job) = this.job.as_mut() {
                let r = ready!(job.as_mut().poll(cx));
                this.job = None;
                return match r {
                    Ok(p) => this.hand(p),
                    Err(e) => this.fail(e),
                };
            }
            // No more bytes are read while a long message's buffer is being prepared: the
            // caller's flow-control window holds them back meanwhile.
            if let Err(e) = ready!(this.poll_gather(cx)) {
                return this.fail(e);
            }
            match this.next_message() {
                Err(e) => return this.fail(e),
                Ok(Some(Step::Ready(p))) => return this.hand(p),
                Ok(Some(Step::Job(j))) => {
                    this.job = Some(j);
                    continue;
                }
                Ok(None) => {}
            }
            if this.ended {
                if this.rx_len > 0 || this.header.is_some() {
                    let want = this.header.map_or(HEADER, |(_, len)| HEADER + len);
                    let gathered = match &this.gather {
                        Some(Gather::Filling(g)) => g.len(),
                        _ => 0,
                    };
                    let have = this.rx_len + gathered;
                    let missing = want.saturating_sub(have);
                    return this.fail(NpudError::InvalidArgument(format!(
                        "the request is not a valid message for this method: it ended {missing} \
                         bytes short of the end of its last message"
                    )));
                }
                this.done = true;
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => this.ended = true,
                Some(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => this.push(d),
                    Err(f) => {
                        if let Ok(t) = f.into_trailers() {
                            this.trailers = Some(t);
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// A bidirectional stream's response body: each response message that goes out answers the
/// oldest request message, which the call's ledger then gives back.
pub(super) struct Answered<R> {
    inner: R,
    ledger: Arc<Ledger>,
    counter: Counter,
}

impl<R> Answered<R> {
    pub(super) fn new(inner: R, ledger: Arc<Ledger>) -> Self {
        Self {
            inner,
            ledger,
            counter: Counter::default(),
        }
    }
}

/// Counts the gRPC messages that start in a stream of bytes.
#[derive(Debug, Default)]
struct Counter {
    header: [u8; HEADER],
    have: usize,
    /// Bytes of the current message's body still to come.
    body: u64,
}

impl Counter {
    /// Messages whose header completes in `data`.
    fn feed(&mut self, mut data: &[u8]) -> usize {
        let mut n = 0;
        while !data.is_empty() {
            if self.body > 0 {
                // At most data.len(), so it fits a usize.
                let k = usize::try_from(self.body).map_or(data.len(), |b| b.min(data.len()));
                self.body -= k as u64;
                data = &data[k..];
                continue;
            }
            let k = (HEADER - self.have).min(data.len());
            self.header[self.have..self.have + k].copy_from_slice(&data[..k]);
            self.have += k;
            data = &data[k..];
            if self.have == HEADER {
                self.have = 0;
                n += 1;
                self.body = u64::from(u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]));
            }
        }
        n
    }
}

impl<R> http_body::Body for Answered<R>
where
    R: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = R::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, R::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r
            && let Some(d) = f.data_ref()
        {
            let this = &mut *self;
            let n = this.counter.feed(d);
            if n > 0 {
                this.ledger.answered(n);
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{AuthConfig, Identity, Policy};
    use crate::budget::MemoryBudget;
    use crate::config::Limits;
    use crate::intake::ledger::Hold;
    use http_body_util::BodyExt;
    use npu_proto::v1 as pb;
    use prost::Message as _;
    use std::io::Write;

    fn intake(budget: &MemoryBudget) -> Arc<Intake> {
        let limits = Limits::default();
        let policy = Arc::new(Policy::new(&AuthConfig::default(), &limits, 0, ""));
        Arc::new(Intake::new(&limits, policy, budget.clone(), 2).unwrap())
    }

    fn framed_message(flag: u8, m: &[u8]) -> Vec<u8> {
        let mut f = vec![flag];
        f.extend_from_slice(&u32::try_from(m.len()).unwrap().to_be_bytes());
        f.extend_from_slice(m);
        f
    }

    /// What an `IntakeBody` for `path` hands on from `wire` cut into `cut`-byte frames: each
    /// data frame, or the error that ended it, and the messages it decoded itself.
    async fn read(
        path: &str,
        caller: Identity,
        encoding: Option<Encoding>,
        wire: Vec<u8>,
        cut: usize,
        budget: &MemoryBudget,
    ) -> (Vec<Bytes>, Option<tonic::Status>, Decoded) {
        let intake = intake(budget);
        let method = intake.schema.method(path).unwrap();
        let frames: Vec<Result<Frame<Bytes>, tonic::Status>> = wire
            .chunks(cut)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let inner =
            tonic::body::Body::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)));
        let ledger = Arc::new(Ledger::new(budget.clone(), Hold::of(method.flow)));
        let caller = Caller {
            transport: caller,
            token: None,
        };
        let decoded = Decoded::default();
        let mut body = IntakeBody::new(
            inner,
            intake,
            method,
            decoded.clone(),
            encoding,
            caller,
            ledger,
        );
        let mut out = Vec::new();
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => out.push(f.into_data().unwrap()),
                Err(e) => return (out, Some(e), decoded),
            }
        }
        (out, None, decoded)
    }

    #[tokio::test]
    async fn messages_come_out_whole_however_the_frames_cut_them() {
        let budget = MemoryBudget::new(&Limits::default());
        let d = pb::DispatchRequest {
            program_id: 5,
            args: (1..=3)
                .map(|t| pb::TensorArg {
                    tensor_id: t,
                    ..Default::default()
                })
                .collect(),
        }
        .encode_to_vec();
        // A large one is decoded on the bulk-work threads.
        let big = pb::SubmitRequest {
            request_id: 1,
            work: Some(pb::submit_request::Work::Dispatch(pb::DispatchRequest {
                program_id: 1,
                args: Vec::new(),
            })),
            timeout_ms: 0,
        }
        .encode_to_vec();
        let mut big = big;
        big.extend_from_slice(&[0x82, 0x06, 0x80, 0x80, 0x08]);
        big.resize(big.len() + (128 << 10), 0);
        let mut huge = pb::GetDeviceInfoRequest {}.encode_to_vec();
        huge.extend_from_slice(&[0x82, 0x06, 0x80, 0x80, 0x28]);
        huge.resize(huge.len() + (640 << 10), 1);
        let small = pb::SubmitRequest::default().encode_to_vec();
        let wire = [
            framed_message(0, &small),
            framed_message(0, &big),
            framed_message(0, &small),
        ]
        .concat();
        for cut in [1, 3, 5, 4096, wire.len()] {
            let (out, err, decoded) = read(
                "/npud.v1.Npud/Submit",
                Identity::uid(1000, []),
                None,
                wire.clone(),
                cut,
                &budget,
            )
            .await;
            assert!(err.is_none(), "{cut}: {err:?}");
            assert_eq!(out.len(), 3, "{cut}");
            assert_eq!(&out[0][..], &framed_message(0, &small)[..], "{cut}");
            // The long one: an empty stand-in, and the message decoded, as message 1.
            assert_eq!(&out[1][..], &STAND_IN[..], "{cut}");
            assert_eq!(&out[2][..], &framed_message(0, &small)[..], "{cut}");
            assert_eq!(decoded.take::<pb::SubmitRequest>(0).unwrap(), None);
            let got = decoded.take::<pb::SubmitRequest>(1).unwrap().unwrap();
            assert_eq!(got, pb::SubmitRequest::decode(&big[..]).unwrap(), "{cut}");
            assert_eq!(decoded.take::<pb::SubmitRequest>(2).unwrap(), None);
        }
        let wire = framed_message(0, &huge);
        let (out, err, decoded) = read(
            "/npud.v1.Npud/GetDeviceInfo",
            Identity::uid(1000, []),
            None,
            wire.clone(),
            16 << 10,
            &budget,
        )
        .await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(out, vec![Bytes::from_static(&STAND_IN)]);
        decoded
            .take::<pb::GetDeviceInfoRequest>(0)
            .unwrap()
            .unwrap();
        // A method of another service takes no long message: refused from its header.
        let (out, err, _) = read(
            "/grpc.health.v1.Health/Check",
            Identity::uid(1000, []),
            None,
            wire.clone(),
            16 << 10,
            &budget,
        )
        .await;
        assert!(out.is_empty());
        let e = err.unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message()
                .contains("grpc.health.v1.HealthCheckRequest is at most 65536 bytes"),
            "{e:?}"
        );
        let (out, err, _) = read(
            "/npud.v1.Npud/Dispatch",
            Identity::uid(1000, []),
            None,
            framed_message(0, &d),
            7,
            &budget,
        )
        .await;
        assert!(err.is_none());
        assert_eq!(&out[0][5..], &d[..]);
        // Every body is gone: nothing is held.
        assert_eq!(budget.queued_now(), 0);
    }

    #[tokio::test]
    async fn a_compressed_message_comes_out_inflated_and_a_bomb_is_refused() {
        let budget = MemoryBudget::new(&Limits::default());
        let gzip = |data: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        };
        let chunk = pb::WriteTensorChunk {
            tensor_id: 1,
            offset: 0,
            data: vec![3; 200_000],
        }
        .encode_to_vec();
        let wire = framed_message(1, &gzip(&chunk));
        let (out, err, decoded) = read(
            "/npud.v1.Npud/WriteTensor",
            Identity::uid(1000, []),
            Some(Encoding::Gzip),
            wire,
            1000,
            &budget,
        )
        .await;
        assert!(err.is_none(), "{err:?}");
        // Inflated past what is decoded inline: decoded here.
        assert_eq!(&out[0][..], &STAND_IN[..]);
        let got = decoded.take::<pb::WriteTensorChunk>(0).unwrap().unwrap();
        assert_eq!(got, pb::WriteTensorChunk::decode(&chunk[..]).unwrap());
        let small = pb::WriteTensorChunk {
            tensor_id: 1,
            offset: 0,
            data: vec![3; 2000],
        }
        .encode_to_vec();
        let (out, err, _) = read(
            "/npud.v1.Npud/WriteTensor",
            Identity::uid(1000, []),
            Some(Encoding::Gzip),
            framed_message(1, &gzip(&small)),
            1000,
            &budget,
        )
        .await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(&out[0][..], &framed_message(0, &small)[..]);
        let bomb = framed_message(1, &gzip(&[0x0a, 0x00].repeat(1 << 24)));
        let (out, err, _) = read(
            "/npud.v1.Npud/Chain",
            Identity::uid(1000, []),
            Some(Encoding::Gzip),
            bomb,
            16 << 10,
            &budget,
        )
        .await;
        assert!(out.is_empty());
        let e = err.unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("inflates past"), "{e:?}");
        // A caller the policy does not allow sends no message over 64 KiB.
        let (_, err, _) = read(
            "/npud.v1.Npud/GetDeviceInfo",
            Identity::anonymous(None),
            None,
            framed_message(0, &vec![0; 70_000]),
            16 << 10,
            &budget,
        )
        .await;
        let e = err.unwrap();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("at most 65536 bytes"), "{e:?}");
        // A body that ends inside a message.
        let (_, err, _) = read(
            "/npud.v1.Npud/GetDeviceInfo",
            Identity::uid(1000, []),
            None,
            framed_message(0, &[0x08, 0x01])[..6].to_vec(),
            2,
            &budget,
        )
        .await;
        assert!(err.unwrap().message().contains("1 bytes short"));
        assert_eq!(budget.queued_now(), 0);
    }

    #[test]
    fn the_counter_counts_messages_split_anywhere() {
        let mut stream = Vec::new();
        for len in [0u32, 3, 70_000, 1] {
            stream.push(0);
            stream.extend_from_slice(&len.to_be_bytes());
            stream.extend(std::iter::repeat_n(7u8, len as usize));
        }
        for cut in [1, 2, 5, 6, 4096, stream.len()] {
            let mut c = Counter::default();
            let n: usize = stream.chunks(cut).map(|ch| c.feed(ch)).sum();
            assert_eq!(n, 4, "chunks of {cut}");
        }
    }
}
