//! Long request messages decoded on the bulk-work threads, and how a handler receives them.
//!
//! prost's decode of a long message (a chain of 1,024 links of 64 arguments is 65,536
//! `TensorArg`s, a program's code object megabytes of `bytes`) takes milliseconds; tonic runs
//! it on the I/O thread that serves every caller. So the intake decodes a message longer than
//! [`crate::intake::INLINE_BYTES`] itself, on the bulk-work thread that scanned it, and hands tonic an
//! empty message in its place: the decoded one waits in the call's [`Decoded`] (a request
//! extension) under the message's index in the call, and the handler takes it from there
//! ([`whole`] for a call of one request message, [`Inbound`] for a stream). Only the daemon's
//! own requests (`npud.v1`) are decoded so; every other method's requests (health, reflection)
//! are a few bytes, and a longer one is refused before it is gathered.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Buf, Bytes};
use npu_proto::v1 as pb;
use tonic::{Request, Status, Streaming};

/// A decoded request message, of its method's request type.
pub type Message = Box<dyn Any + Send>;
/// Decodes one message type from its bytes.
pub type DecodeFn = fn(Bytes) -> Result<Message, prost::DecodeError>;

fn decode<M: prost::Message + Default + Send + 'static>(
    bytes: Bytes,
) -> Result<Message, prost::DecodeError> {
    M::decode(Pausing::new(bytes)).map(|m| Box::new(m) as Message)
}

/// How many bytes prost consumes between two [`crate::bulk::pause`] points: a few µs of
/// decoding (a chain of 1,024 links of 64 arguments, about 260 KiB on the wire, took the bulk
/// threads about 5 ms each, scan and gather included, under the bystander's chain attack).
const PAUSE_EVERY: usize = 1 << 10;

/// The message's bytes as prost reads them, with a [`crate::bulk::pause`] point every
/// [`PAUSE_EVERY`] bytes consumed: a long message's decode, one call into prost, offers its CPU
/// to the threads that serve everyone as any other bulk work does, at every depth of the
/// message. `bytes` fields are still slices of the message (`copy_to_bytes` is the inner
/// `Bytes`' own).
struct Pausing {
    bytes: Bytes,
    consumed: usize,
}

impl Pausing {
    fn new(bytes: Bytes) -> Pausing {
        Pausing { bytes, consumed: 0 }
    }

    fn consumed(&mut self, n: usize) {
        self.consumed += n;
        if self.consumed >= PAUSE_EVERY {
            self.consumed = 0;
            crate::bulk::pause();
        }
    }
}

impl Buf for Pausing {
    fn remaining(&self) -> usize {
        self.bytes.remaining()
    }

    fn chunk(&self) -> &[u8] {
        self.bytes.chunk()
    }

    fn advance(&mut self, n: usize) {
        self.bytes.advance(n);
        self.consumed(n);
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        let b = self.bytes.copy_to_bytes(len);
        self.consumed(len);
        b
    }
}

/// How the intake decodes the message type named `name` (`npud.v1.ChainRequest`), when it
/// does: every request type of the `npud.v1` service.
pub fn decoder(name: &str) -> Option<DecodeFn> {
    Some(match name {
        "npud.v1.GetDeviceInfoRequest" => decode::<pb::GetDeviceInfoRequest>,
        "npud.v1.OpenSessionRequest" => decode::<pb::OpenSessionRequest>,
        "npud.v1.ResumeSessionRequest" => decode::<pb::ResumeSessionRequest>,
        "npud.v1.CloseSessionRequest" => decode::<pb::CloseSessionRequest>,
        "npud.v1.RegisterProgramRequest" => decode::<pb::RegisterProgramRequest>,
        "npud.v1.UnregisterProgramRequest" => decode::<pb::UnregisterProgramRequest>,
        "npud.v1.ListProgramsRequest" => decode::<pb::ListProgramsRequest>,
        "npud.v1.AllocateTensorRequest" => decode::<pb::AllocateTensorRequest>,
        "npud.v1.ImportTensorRequest" => decode::<pb::ImportTensorRequest>,
        "npud.v1.FreeTensorRequest" => decode::<pb::FreeTensorRequest>,
        "npud.v1.GetTensorInfoRequest" => decode::<pb::GetTensorInfoRequest>,
        "npud.v1.WriteTensorChunk" => decode::<pb::WriteTensorChunk>,
        "npud.v1.ReadTensorRequest" => decode::<pb::ReadTensorRequest>,
        "npud.v1.DispatchRequest" => decode::<pb::DispatchRequest>,
        "npud.v1.ChainRequest" => decode::<pb::ChainRequest>,
        "npud.v1.SubmitRequest" => decode::<pb::SubmitRequest>,
        "npud.v1.AttachRingRequest" => decode::<pb::AttachRingRequest>,
        "npud.v1.GetStatisticsRequest" => decode::<pb::GetStatisticsRequest>,
        "npud.v1.ClearQuarantineRequest" => decode::<pb::ClearQuarantineRequest>,
        _ => return None,
    })
}

/// One call's messages the intake decoded, by their index in the call, oldest first: a
/// request extension of every call whose messages it may decode.
#[derive(Clone, Default)]
pub struct Decoded(Arc<Mutex<VecDeque<(u64, Message)>>>);

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.queue().len();
        f.debug_struct("Decoded").field("waiting", &n).finish()
    }
}

impl Decoded {
    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, Message)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Message `index` of the call, decoded: put before tonic is handed its empty stand-in.
    pub(crate) fn put(&self, index: u64, message: Message) {
        self.queue().push_back((index, message));
    }

    /// Message `index` of the call, if the intake decoded it (tonic then decoded an empty
    /// stand-in).
    ///
    /// # Errors
    /// INTERNAL when the decoded message is not a `T`: the handler's request type and the
    /// method's, as the descriptor set names it, disagree.
    pub fn take<T: 'static>(&self, index: u64) -> Result<Option<T>, Status> {
        let mut q = self.queue();
        if q.front().is_none_or(|(i, _)| *i != index) {
            return Ok(None);
        }
        let Some((_, m)) = q.pop_front() else {
            return Ok(None);
        };
        m.downcast::<T>().map(|m| Some(*m)).map_err(|_| {
            Status::internal(format!(
                "the request's message {index} was decoded as another type than {}",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// `req` with its message as the intake decoded it, when it did (a method of one request
/// message: its index is 0).
///
/// # Errors
/// See [`Decoded::take`].
pub fn whole<T: 'static>(mut req: Request<T>) -> Result<Request<T>, Status> {
    let Some(d) = req.extensions_mut().remove::<Decoded>() else {
        return Ok(req);
    };
    Ok(match d.take::<T>(0)? {
        Some(m) => req.map(|_| m),
        None => req,
    })
}

/// A stream of request messages, each as the intake decoded it when it did.
#[derive(Debug)]
pub struct Inbound<T> {
    stream: Streaming<T>,
    decoded: Option<Decoded>,
    next: u64,
}

impl<T: 'static> Inbound<T> {
    /// The messages of `req`.
    pub fn of(mut req: Request<Streaming<T>>) -> Self {
        let decoded = req.extensions_mut().remove::<Decoded>();
        Self {
            stream: req.into_inner(),
            decoded,
            next: 0,
        }
    }

    /// The next message, `None` at the stream's end.
    ///
    /// # Errors
    /// The stream's own (what the intake refused, a reset), and [`Decoded::take`]'s.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        let Some(m) = self.stream.message().await? else {
            return Ok(None);
        };
        let index = self.next;
        self.next += 1;
        Ok(Some(match &self.decoded {
            Some(d) => d.take::<T>(index)?.unwrap_or(m),
            None => m,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_decodes_through_its_pause_points_as_prost_decodes_it() {
        let link = pb::DispatchRequest {
            program_id: 3,
            args: (0..64)
                .map(|t| pb::TensorArg {
                    tensor_id: t,
                    offset: t * 4,
                    length: 4,
                    read_only: t % 2 == 0,
                })
                .collect(),
        };
        let chain = pb::ChainRequest {
            links: vec![link; 1024],
        };
        let wire = prost::Message::encode_to_vec(&chain);
        assert!(wire.len() > 64 * PAUSE_EVERY, "{} bytes", wire.len());
        let d = decoder("npud.v1.ChainRequest").unwrap();
        let m = d(Bytes::from(wire.clone())).unwrap();
        assert_eq!(*m.downcast::<pb::ChainRequest>().unwrap(), chain);
        let program = pb::RegisterProgramRequest {
            pdi: vec![7; 3 << 20],
            insts: vec![9; 5 * PAUSE_EVERY + 3],
            name: "long".into(),
            ..Default::default()
        };
        let d = decoder("npud.v1.RegisterProgramRequest").unwrap();
        let m = d(Bytes::from(prost::Message::encode_to_vec(&program))).unwrap();
        assert_eq!(
            *m.downcast::<pb::RegisterProgramRequest>().unwrap(),
            program
        );
        // Cut short: prost's own error.
        let cut = Bytes::from(wire[..wire.len() - 7].to_vec());
        let ours = decoder("npud.v1.ChainRequest").unwrap()(cut.clone()).err();
        let theirs = <pb::ChainRequest as prost::Message>::decode(cut).err();
        assert_eq!(ours.map(|e| e.to_string()), theirs.map(|e| e.to_string()));
    }

    #[tokio::test]
    async fn a_long_decode_on_a_bulk_thread_offers_its_cpu_at_every_depth() {
        // A Submit stream's message holds its chain one level down: a single top-level field.
        let link = pb::DispatchRequest {
            program_id: 3,
            args: (0..64)
                .map(|t| pb::TensorArg {
                    tensor_id: t,
                    ..Default::default()
                })
                .collect(),
        };
        let submit = pb::SubmitRequest {
            request_id: 9,
            work: Some(pb::submit_request::Work::Chain(pb::ChainRequest {
                links: vec![link; 1024],
            })),
            timeout_ms: 0,
        };
        let wire = Bytes::from(prost::Message::encode_to_vec(&submit));
        let d = decoder("npud.v1.SubmitRequest").unwrap();
        let (offered, decoded) = crate::bulk::run(move || {
            let before = crate::bulk::offered();
            let started = std::time::Instant::now();
            let m = d(wire).unwrap();
            (
                (crate::bulk::offered() - before, started.elapsed()),
                *m.downcast::<pb::SubmitRequest>().unwrap(),
            )
        })
        .await
        .unwrap();
        assert_eq!(decoded, submit);
        // One pause point per KiB, and a turn of `BULK_TURN`: a decode that took n turns
        // offered the CPU about n times.
        let turns = offered.1.as_micros() / npu_fd::latency::BULK_TURN.as_micros();
        assert!(
            turns < 2 || offered.0 >= 1,
            "a decode of {:?} ({turns} turns) never offered its CPU",
            offered.1
        );
        assert!(
            u128::from(offered.0) <= turns + 1,
            "{offered:?}, {turns} turns"
        );
    }

    #[test]
    fn every_npud_request_type_has_a_decoder_that_decodes_it() {
        let schema = crate::intake::schema::Schema::served(&crate::config::Limits::default())
            .expect("the served schema");
        let mut seen = 0;
        for path in schema.method_paths() {
            let Some(m) = schema.method(path) else {
                continue;
            };
            let name = &schema.message(m.input).name;
            if path.starts_with("/npud.v1.") {
                let d = decoder(name).unwrap_or_else(|| panic!("{path}: no decoder for {name}"));
                d(Bytes::new()).unwrap_or_else(|e| panic!("{name}: {e}"));
                seen += 1;
            } else {
                assert!(decoder(name).is_none(), "{path}: {name}");
            }
        }
        assert!(seen >= 19, "{seen} npud.v1 methods");
        let d = decoder("npud.v1.ChainRequest").unwrap();
        let c = pb::ChainRequest {
            links: vec![pb::DispatchRequest {
                program_id: 7,
                args: Vec::new(),
            }],
        };
        let m = d(Bytes::from(prost::Message::encode_to_vec(&c))).unwrap();
        assert_eq!(*m.downcast::<pb::ChainRequest>().unwrap(), c);
    }

    #[test]
    fn a_message_is_taken_by_its_index_once_and_as_its_type() {
        let d = Decoded::default();
        d.put(1, Box::new(5u32));
        d.put(3, Box::new(7u32));
        assert_eq!(d.take::<u32>(0).unwrap(), None);
        assert_eq!(d.take::<u32>(1).unwrap(), Some(5));
        assert_eq!(d.take::<u32>(1).unwrap(), None);
        assert_eq!(d.take::<u32>(2).unwrap(), None);
        let e = d.take::<u64>(3).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal);
    }
}
