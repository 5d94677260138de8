//! AllocateTensor, ImportTensor, FreeTensor, GetTensorInfo, WriteTensor, ReadTensor.

use npu_proto::v1 as pb;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

use crate::decoded::Inbound;

use super::{BoxStream, NpudService};
use crate::error::NpudError;
use crate::executor::Command;
use crate::tickets::Grant;

/// ReadTensor's chunk size when the request leaves it 0.
const DEFAULT_CHUNK: u64 = 1 << 20;
/// Room for a chunk's framing within the message limit.
const CHUNK_OVERHEAD: u64 = 1 << 10;
/// The largest ReadTensor chunk sent, whatever `chunk_bytes` asks: a chunk and its framing
/// stay under the 4 MiB that gRPC clients (grpc-go, grpcio, grpc-js, tonic) accept by
/// default, so a client that asks for bigger chunks still receives them.
const MAX_CHUNK: u64 = (4 << 20) - CHUNK_OVERHEAD;

impl NpudService {
    pub(super) async fn allocate_tensor(
        &self,
        req: Request<pb::AllocateTensorRequest>,
    ) -> Result<pb::AllocateTensorResponse, NpudError> {
        let caller = self.caller(&req)?;
        let rid = self.request_id(&req, "AllocateTensor")?;
        let r = req.into_inner();
        let session = caller.session;
        let size = r.size_bytes;
        // A local caller always gets an fd: the device memory's own where the runtime exports
        // it, otherwise a staged memfd of the daemon's (see DeviceInfo.tensor_sharing).
        let uid = caller.conn.as_ref().and_then(|c| c.uid);
        let cap = self.tensor_cap(session);
        let svc = self.clone();
        self.once(session, rid, async move {
            let tensor_id = svc
                .state
                .exec
                .call(|reply| Command::Allocate {
                    session,
                    size,
                    name: r.name,
                    cap,
                    local: uid.is_some(),
                    reply,
                })
                .await?;
            let (fd_ticket, fd_socket) = match uid {
                Some(uid) => {
                    let t = svc
                        .state
                        .tickets
                        .issue(session, uid, tensor_id, Grant::Export)?;
                    (t.as_bytes().to_vec(), svc.fd_socket())
                }
                _ => (Vec::new(), String::new()),
            };
            Ok(pb::AllocateTensorResponse {
                tensor_id,
                fd_ticket,
                fd_socket,
                size_bytes: size,
            })
        })
        .await
    }

    pub(super) async fn import_tensor(
        &self,
        req: Request<pb::ImportTensorRequest>,
    ) -> Result<pb::ImportTensorResponse, NpudError> {
        let caller = self.caller(&req)?;
        let Some(uid) = caller.conn.as_ref().and_then(|c| c.uid) else {
            return Err(NpudError::FailedPrecondition(
                "ImportTensor needs a local client on the Unix socket (file descriptors cannot \
                 cross TCP); use AllocateTensor and WriteTensor"
                    .into(),
            ));
        };
        let r = req.into_inner();
        let session = caller.session;
        let size = r.size_bytes;
        let tensor_id = self
            .state
            .exec
            .call(|reply| Command::DeclareImport {
                session,
                size,
                name: r.name,
                cap: self.tensor_cap(session),
                reply,
            })
            .await?;
        let t = self
            .state
            .tickets
            .issue(session, uid, tensor_id, Grant::Import { size })?;
        Ok(pb::ImportTensorResponse {
            tensor_id,
            fd_ticket: t.as_bytes().to_vec(),
            fd_socket: self.fd_socket(),
        })
    }

    /// The session's rule's tensor-byte quota, for the executor to check.
    fn tensor_cap(&self, session: u64) -> Option<crate::auth::Quota<u64>> {
        self.state
            .sessions
            .grant(session)
            .map(|(g, _)| g.quotas.tensor_bytes.clone())
    }

    pub(super) fn fd_socket(&self) -> String {
        self.state.fd_socket.display().to_string()
    }

    pub(super) async fn free_tensor(
        &self,
        req: Request<pb::FreeTensorRequest>,
    ) -> Result<pb::FreeTensorResponse, NpudError> {
        let caller = self.caller(&req)?;
        let rid = self.request_id(&req, "FreeTensor")?;
        let tensor = req.get_ref().tensor_id;
        let (svc, session) = (self.clone(), caller.session);
        self.once(session, rid, async move {
            svc.state
                .exec
                .call(|reply| Command::Free {
                    session,
                    tensor,
                    reply,
                })
                .await?;
            Ok(pb::FreeTensorResponse {})
        })
        .await
    }

    pub(super) async fn tensor_info(
        &self,
        req: Request<pb::GetTensorInfoRequest>,
    ) -> Result<pb::TensorInfo, NpudError> {
        let caller = self.caller(&req)?;
        let tensor = req.get_ref().tensor_id;
        self.state
            .exec
            .call(|reply| Command::Info {
                session: caller.session,
                tensor,
                reply,
            })
            .await
    }

    pub(super) async fn write_tensor(
        &self,
        req: Request<Streaming<pb::WriteTensorChunk>>,
    ) -> Result<pb::WriteTensorResponse, NpudError> {
        let caller = self.caller(&req)?;
        let mut stream = Inbound::of(req);
        let mut tensor = 0u64;
        let mut written = 0u64;
        let mut index = 0usize;
        loop {
            let chunk = match stream.message().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(status) => {
                    return Err(stream_error(
                        &status,
                        index,
                        self.state.limits.max_message_bytes,
                    ));
                }
            };
            if tensor == 0 {
                if chunk.tensor_id == 0 {
                    return Err(NpudError::InvalidArgument(
                        "tensor_id: the first chunk must name the tensor".into(),
                    ));
                }
                tensor = chunk.tensor_id;
            } else if chunk.tensor_id != 0 && chunk.tensor_id != tensor {
                return Err(NpudError::InvalidArgument(format!(
                    "chunks[{index}].tensor_id: {} differs from the first chunk's {tensor}",
                    chunk.tensor_id
                )));
            }
            let len = chunk.data.len() as u64;
            let max = self.state.limits.max_message_bytes;
            if len > max {
                return Err(NpudError::ResourceExhausted(format!(
                    "chunks[{index}].data: {len} bytes; at most {max} per chunk \
                     (limits.max_message_bytes)"
                )));
            }
            self.state
                .exec
                .call(|reply| Command::Write {
                    session: caller.session,
                    tensor,
                    offset: chunk.offset,
                    data: chunk.data,
                    reply,
                })
                .await
                .map_err(|e| e.within(&format!("chunks[{index}]")))?;
            written += len;
            index += 1;
        }
        if tensor == 0 {
            return Err(NpudError::InvalidArgument(
                "the stream carried no chunk: the first chunk must name the tensor".into(),
            ));
        }
        Ok(pb::WriteTensorResponse {
            bytes_written: written,
        })
    }

    pub(super) async fn read_tensor(
        &self,
        req: Request<pb::ReadTensorRequest>,
    ) -> Result<BoxStream<pb::ReadTensorChunk>, NpudError> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let session = caller.session;
        let tensor = r.tensor_id;
        let size = self
            .state
            .exec
            .call(|reply| Command::Size {
                session,
                tensor,
                reply,
            })
            .await?;
        if r.offset > size {
            return Err(NpudError::InvalidArgument(format!(
                "offset: {} is past the end of tensor {tensor} of {size} bytes",
                r.offset
            )));
        }
        let len = if r.length == 0 {
            size - r.offset
        } else {
            r.length
        };
        if r.offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(NpudError::InvalidArgument(format!(
                "length: bytes {}..{} are outside tensor {tensor} of {size} bytes",
                r.offset,
                r.offset.saturating_add(len)
            )));
        }
        let cap = self
            .state
            .limits
            .max_message_bytes
            .saturating_sub(CHUNK_OVERHEAD)
            .clamp(1, MAX_CHUNK);
        let chunk = match u64::from(r.chunk_bytes) {
            0 => DEFAULT_CHUNK,
            c => c,
        }
        .clamp(1, cap);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let exec = self.state.exec.clone();
        let start = r.offset;
        tokio::spawn(async move {
            let mut at = start;
            let end = start + len;
            while at < end {
                let n = chunk.min(end - at);
                let res = exec
                    .call(|reply| Command::Read {
                        session,
                        tensor,
                        offset: at,
                        len: n,
                        reply,
                    })
                    .await;
                let item = res
                    .map(|data| pb::ReadTensorChunk { offset: at, data })
                    .map_err(Status::from);
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
                at += n;
            }
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

/// A broken request stream, naming the chunk it broke at. An oversized chunk is the transport's
/// OUT_OF_RANGE; it is a size limit, so it is reported as RESOURCE_EXHAUSTED.
fn stream_error(status: &Status, index: usize, max_message_bytes: u64) -> NpudError {
    let fixed = crate::error::transport_status(status.code(), status.message(), max_message_bytes);
    let status = fixed.as_ref().unwrap_or(status);
    let msg = format!("chunks[{index}]: {}", status.message());
    match status.code() {
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => {
            NpudError::ResourceExhausted(msg)
        }
        tonic::Code::Cancelled => NpudError::Unavailable(msg),
        _ => NpudError::InvalidArgument(msg),
    }
}
