//! What every row shares: connecting, the timing loops, and a session on npud driven through
//! the generated gRPC client (plus npu-fd for fd-shared tensors).

use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use npu_artifacts::NpuGen;
use npu_artifacts::emu::EmuDesign;
use npu_fd::Mapping;
use npu_fd::wire::{Ticket, client as fdclient};
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status, Streaming};

use crate::stats::{Summary, nanos, summarize};
use crate::{BenchError, Result};

/// Iterations of a row: warm-up (not recorded), then measured.
#[derive(Debug, Clone, Copy)]
pub struct Iters {
    pub warmup: usize,
    pub measured: usize,
}

impl Iters {
    /// The same, scaled down by `div` (at least 2 measured, 1 warm-up).
    #[must_use]
    pub fn scaled_down(self, div: usize) -> Iters {
        Iters {
            warmup: (self.warmup / div).max(1),
            measured: (self.measured / div).max(2),
        }
    }
}

/// A gRPC channel on a Unix socket.
///
/// # Errors
/// When the socket does not accept.
pub async fn connect_unix(path: &Path) -> Result<Channel> {
    Ok(Endpoint::try_from(format!("unix:{}", path.display()))?
        .connect()
        .await?)
}

/// A gRPC channel over TCP (`host:port`), with Nagle off as npu-client sets it.
///
/// # Errors
/// When the address does not accept.
pub async fn connect_tcp(addr: &str) -> Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?)
}

/// Runs `op` `it.warmup` times unrecorded, then `it.measured` times, recording each latency.
/// Returns the samples (ns) and the measured wall time.
///
/// # Errors
/// The first error `op` returns.
pub async fn time_loop<F, Fut>(it: Iters, mut op: F) -> Result<(Vec<u64>, Duration)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    for _ in 0..it.warmup {
        op().await?;
    }
    let mut ns = Vec::with_capacity(it.measured);
    let start = Instant::now();
    for _ in 0..it.measured {
        let t = Instant::now();
        op().await?;
        ns.push(nanos(t.elapsed()));
    }
    Ok((ns, start.elapsed()))
}

/// [`time_loop`], summarised with one operation per call.
///
/// # Errors
/// As [`time_loop`].
pub async fn timed<F, Fut>(it: Iters, op: F) -> Result<Summary>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let (ns, wall) = time_loop(it, op).await?;
    let n = ns.len() as u64;
    Ok(summarize(ns, n, wall))
}

/// What a pipelined run measured.
#[derive(Debug)]
pub struct Pipelined {
    /// Time per operation over each window of `depth` consecutive completions.
    pub per_op: Summary,
    /// Submit-to-completion latency of each operation.
    pub latency: Summary,
}

/// Keeps up to `depth` requests in flight on one bidirectional stream opened by `open`, for
/// `it.warmup + it.measured` requests; `make(i)` builds request `i` and `id_of` reads the
/// request id a response carries (responses come in submission order).
///
/// # Errors
/// A stream error, a response out of order, or `check` refusing a response.
pub async fn pipelined<Req, Resp, Open, Fut>(
    depth: usize,
    it: Iters,
    mut make: impl FnMut(u64) -> Req,
    check: impl Fn(&Resp) -> Result<u64>,
    open: Open,
) -> Result<Pipelined>
where
    Req: Send + 'static,
    Open: FnOnce(ReceiverStream<Req>) -> Fut,
    Fut: Future<Output = std::result::Result<tonic::Response<Streaming<Resp>>, Status>>,
{
    let total = it.warmup + it.measured;
    let (tx, rx) = mpsc::channel::<Req>(depth.max(1) * 2);
    let mut responses = open(ReceiverStream::new(rx)).await?.into_inner();
    let mut sent_at: Vec<Instant> = Vec::with_capacity(total);
    let gone = || BenchError("the stream's receiver closed".into());
    for i in 0..depth.min(total) {
        sent_at.push(Instant::now());
        tx.send(make(i as u64)).await.map_err(|_| gone())?;
    }
    let mut done_at: Vec<Instant> = Vec::with_capacity(it.measured + 1);
    let mut latency = Vec::with_capacity(it.measured);
    for received in 0..total {
        let r = responses
            .message()
            .await?
            .ok_or_else(|| BenchError("the stream ended early".into()))?;
        let now = Instant::now();
        let id = check(&r)?;
        if id != received as u64 {
            return Err(BenchError(format!(
                "completion {received} carried request id {id}"
            )));
        }
        if received + 1 >= it.warmup {
            done_at.push(now);
        }
        if received >= it.warmup {
            latency.push(nanos(now.duration_since(sent_at[received])));
        }
        let next = sent_at.len();
        if next < total {
            sent_at.push(Instant::now());
            tx.send(make(next as u64)).await.map_err(|_| gone())?;
        }
    }
    drop(tx);
    // done_at[0] is the last warm-up completion; windows of `depth` completions after it.
    let d = depth.max(1);
    let windows: Vec<u64> = done_at
        .windows(d + 1)
        .step_by(d)
        .map(|w| nanos(w[d].duration_since(w[0])) / d as u64)
        .collect();
    let wall = match (done_at.first(), done_at.last()) {
        (Some(a), Some(b)) => b.duration_since(*a),
        _ => Duration::ZERO,
    };
    let n = latency.len() as u64;
    Ok(Pipelined {
        per_op: summarize(windows, n, wall),
        latency: summarize(latency, n, wall),
    })
}

/// Whether [`Session::req`] gives every call a request id.
static REQUEST_IDS: AtomicBool = AtomicBool::new(false);
/// The next request id (unique in this process, so in every session).
static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// Makes every call of every session carry an `npud-request-id` (as npu-client's calls do),
/// or none.
pub fn set_request_ids(on: bool) {
    REQUEST_IDS.store(on, Ordering::Relaxed);
}

/// A session on npud and the metadata every call carries.
#[derive(Debug, Clone)]
pub struct Session {
    pub client: NpudClient<Channel>,
    pub id: u64,
    id_value: AsciiMetadataValue,
    token: AsciiMetadataValue,
    /// The identity token (`x-npud-token`, a secret from `auth.token_dir`) every call carries,
    /// if any.
    identity: Option<AsciiMetadataValue>,
    pub generation: NpuGen,
    /// The daemon's threads: I/O threads and the executor's poll (µs), from its device info.
    pub threads: (u32, u64),
}

/// A tensor mapped through the fd socket.
#[derive(Debug)]
pub struct Mapped {
    pub id: u64,
    pub map: Mapping,
    pub fd: OwnedFd,
}

impl Session {
    /// Opens a session on `channel`.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn open(channel: Channel, name: &str) -> Result<Session> {
        Session::open_as(channel, name, None).await
    }

    /// Opens a session on `channel` as the identity whose token (a secret from the daemon's
    /// `auth.token_dir`) is `identity`, which every call of the session then carries; as
    /// [`Session::open`] when `None`.
    ///
    /// # Errors
    /// The daemon's status, or a token that is no metadata value.
    pub async fn open_as(channel: Channel, name: &str, identity: Option<&str>) -> Result<Session> {
        let req = pb::OpenSessionRequest {
            client_name: name.to_owned(),
            ..Default::default()
        };
        Session::open_with(channel, req, identity).await
    }

    /// Opens a session of `class` (with a deadline of `deadline_us`, 0 for none) on
    /// `channel`.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn open_class(
        channel: Channel,
        name: &str,
        class: pb::SessionClass,
        deadline_us: u64,
    ) -> Result<Session> {
        let req = pb::OpenSessionRequest {
            client_name: name.to_owned(),
            session_class: class.into(),
            deadline_us,
        };
        Session::open_with(channel, req, None).await
    }

    /// Opens the session `req` asks for on `channel`, as [`Session::open_as`] does.
    async fn open_with(
        channel: Channel,
        req: pb::OpenSessionRequest,
        identity: Option<&str>,
    ) -> Result<Session> {
        let bad = BenchError::ctx("session metadata");
        let identity: Option<AsciiMetadataValue> = identity
            .map(|t| t.parse().map_err(|e| bad(&e)))
            .transpose()?;
        let mut client = Self::client(channel);
        let info = client
            .get_device_info(with_identity(pb::GetDeviceInfoRequest {}, &identity))
            .await?
            .into_inner();
        let r = client
            .open_session(with_identity(req, &identity))
            .await?
            .into_inner();
        Ok(Session {
            client,
            id: r.session_id,
            id_value: r.session_id.to_string().parse().map_err(|e| bad(&e))?,
            token: r.token.parse().map_err(|e| bad(&e))?,
            identity,
            generation: if info.generation == "npu1" {
                NpuGen::Npu1
            } else {
                NpuGen::Npu2
            },
            threads: (info.io_threads, info.executor_spin_us),
        })
    }

    /// The generated client on `channel`, with the bench's message size limits.
    fn client(channel: Channel) -> NpudClient<Channel> {
        NpudClient::new(channel)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20)
    }

    /// The same session on another connection (for a thread that drives its own runtime).
    #[must_use]
    pub fn on(&self, channel: Channel) -> Session {
        Session {
            client: Self::client(channel),
            ..self.clone()
        }
    }

    /// A request carrying this session's metadata, and a fresh request id when
    /// [`set_request_ids`] asked for them.
    pub fn req<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        let md = r.metadata_mut();
        md.insert(npu_proto::SESSION_HEADER, self.id_value.clone());
        md.insert(npu_proto::TOKEN_HEADER, self.token.clone());
        if let Some(t) = &self.identity {
            md.insert(npu_proto::IDENTITY_TOKEN_HEADER, t.clone());
        }
        if REQUEST_IDS.load(Ordering::Relaxed) {
            let id = NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed);
            md.insert(npu_proto::REQUEST_ID_HEADER, AsciiMetadataValue::from(id));
            // The bench never retries: no id below this one will come again, so the daemon
            // keeps no answers for it (as npu-client, whose acknowledgement is its lowest id
            // in flight).
            md.insert(npu_proto::REQUEST_ACK_HEADER, AsciiMetadataValue::from(id));
        }
        r
    }

    /// Registers an emulated design packed as an hsaco (one PdiInsts kernel); returns its
    /// program id.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn register_hsaco(&mut self, d: &EmuDesign) -> Result<u64> {
        let req = self.req(pb::RegisterProgramRequest {
            hsaco: d.to_hsaco(self.generation)?,
            kernel: String::new(),
            name: format!("{} (hsaco)", d.kernel.name()),
            ..Default::default()
        });
        Ok(self
            .client
            .register_program(req)
            .await?
            .into_inner()
            .program_id)
    }

    /// Registers an emulated design; returns its program id.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn register(&mut self, d: &EmuDesign) -> Result<u64> {
        let req = self.req(pb::RegisterProgramRequest {
            hsaco: Vec::new(),
            kernel: String::new(),
            pdi: d.to_pdi(),
            insts: d.insts(self.generation),
            name: d.kernel.name().to_owned(),
        });
        Ok(self
            .client
            .register_program(req)
            .await?
            .into_inner()
            .program_id)
    }

    /// Allocates a tensor (not mapped).
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn alloc(&mut self, size: u64) -> Result<u64> {
        let req = self.req(pb::AllocateTensorRequest {
            size_bytes: size,
            name: String::new(),
        });
        Ok(self
            .client
            .allocate_tensor(req)
            .await?
            .into_inner()
            .tensor_id)
    }

    /// Allocates a tensor and maps it through the fd socket.
    ///
    /// # Errors
    /// The daemon's status, or the fd socket's refusal.
    pub async fn alloc_mapped(&mut self, size: u64) -> Result<Mapped> {
        let req = self.req(pb::AllocateTensorRequest {
            size_bytes: size,
            name: String::new(),
        });
        let r = self.client.allocate_tensor(req).await?.into_inner();
        if r.fd_ticket.is_empty() {
            return Err(BenchError(
                "AllocateTensor returned no fd ticket (not a local connection?)".into(),
            ));
        }
        let ticket = Ticket::from_slice(&r.fd_ticket)?;
        let (fd, offset, len) = tokio::task::spawn_blocking(move || {
            let sock = StdUnixStream::connect(&r.fd_socket)?;
            Ok::<_, BenchError>(fdclient::redeem_export(&sock, &ticket)?)
        })
        .await
        .map_err(|e| BenchError(e.to_string()))??;
        let len = usize::try_from(len).map_err(|e| BenchError(e.to_string()))?;
        let map = Mapping::new(fd.as_fd(), offset, len)?;
        Ok(Mapped {
            id: r.tensor_id,
            map,
            fd,
        })
    }

    /// Runs one dispatch.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn dispatch(&mut self, d: &pb::DispatchRequest) -> Result<pb::DispatchResponse> {
        let req = self.req(d.clone());
        Ok(self.client.dispatch(req).await?.into_inner())
    }
}

/// `msg` carrying the identity token `identity`, if any.
fn with_identity<T>(msg: T, identity: &Option<AsciiMetadataValue>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(t) = identity {
        r.metadata_mut()
            .insert(npu_proto::IDENTITY_TOKEN_HEADER, t.clone());
    }
    r
}

/// A dispatch over whole tensors.
#[must_use]
pub fn dispatch_request(program: u64, tensors: &[u64]) -> pb::DispatchRequest {
    pb::DispatchRequest {
        program_id: program,
        args: tensors
            .iter()
            .map(|t| pb::TensorArg {
                tensor_id: *t,
                offset: 0,
                length: 0,
                read_only: false,
            })
            .collect(),
    }
}
