//! The `npud.v1.Npud` gRPC service. Each area lives in its own file (sessions and device info,
//! programs, tensors, work, statistics); this file holds the shared state, the session check
//! every call but five starts with, and the trait impl that routes to them. Handlers return
//! [`NpudError`]; it becomes a `tonic::Status` only through its `From` impl.
//!
//! Every call has an identity (its connection's, or an `x-npud-token`'s; see `auth`). Calls in
//! a session must come from the identity that opened it; OpenSession, GetStatistics and
//! ListPrograms without a session must be allowed by the `[auth]` policy; GetDeviceInfo
//! answers every caller.

pub mod collect;
mod programs;
mod replay;
mod ring;
mod sessions;
mod stats;
mod tensors;
mod work;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;
use npu_proto::v1::npud_server::Npud;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Grant, Identity, Policy};
use crate::config::Limits;
use crate::deadline::parse_grpc_timeout;
use crate::decoded::whole;
use crate::error::NpudError;
use crate::executor::{Command, DeviceFacts, ExecutorHandle};
use crate::health::Condition;
use crate::metrics::Metrics;
use crate::peer::ConnInfo;
use crate::programs::Programs;
use crate::sessions::Sessions;
use crate::stats::PendingWork;
use crate::tickets::Tickets;

pub use ring::{RingControl, Rings};
pub use work::MAX_ARGS;

/// What every handler shares.
#[derive(Debug)]
pub struct State {
    pub exec: ExecutorHandle,
    pub sessions: Arc<Sessions>,
    pub programs: Arc<Programs>,
    pub tickets: Arc<Tickets>,
    pub facts: DeviceFacts,
    pub limits: Limits,
    /// `executor.interactive_deadline_us`: an interactive session's deadline when it asks for
    /// none.
    pub interactive_deadline: std::time::Duration,
    pub fd_socket: PathBuf,
    /// The device's condition as the executor reports it (serving, recoveries).
    pub device: watch::Receiver<Condition>,
    pub started: Instant,
    /// Threads the runtime serves requests on.
    pub io_threads: u32,
    /// `executor.spin_us`.
    pub executor_spin_us: u64,
    /// Dispatches admitted and not yet answered.
    pub pending: PendingWork,
    /// What handlers count for Prometheus.
    pub metrics: Arc<Metrics>,
    /// The metrics listener's bound address; "" when metrics are off.
    pub metrics_address: String,
    /// Who may call, and with which quotas.
    pub policy: Arc<Policy>,
    /// The bound TCP address ("" without a TCP listener) and its transport
    /// (`TlsConfig::mode`).
    pub tcp_address: String,
    pub tcp_security: &'static str,
    /// The daemon-wide memory budget.
    pub budget: crate::budget::MemoryBudget,
    /// The sessions' dispatch rings.
    pub rings: Arc<Rings>,
    /// What ends everything a principal or session holds (see `principals`).
    pub lifecycle: Arc<crate::principals::Lifecycle>,
}

/// The service tonic serves; cheap to clone.
#[derive(Debug, Clone)]
pub struct NpudService {
    state: Arc<State>,
}

/// The session a request runs in, and its connection.
#[derive(Debug, Clone)]
struct Caller {
    session: u64,
    conn: Option<ConnInfo>,
}

impl NpudService {
    pub fn new(state: Arc<State>) -> Self {
        Self { state }
    }

    /// Who made a request, as [`NpudService::presented`]; refused without a token on a
    /// listener `auth.require_token` names.
    fn identity<T>(&self, req: &Request<T>) -> Result<Identity, NpudError> {
        let transport = req
            .extensions()
            .get::<ConnInfo>()
            .map_or_else(|| Identity::anonymous(None), |c| c.identity.clone());
        let has_token = req
            .metadata()
            .contains_key(npu_proto::IDENTITY_TOKEN_HEADER);
        self.state.policy.require_token(&transport, has_token)?;
        self.presented(req)
    }

    /// Who made a request: its connection's identity, or its `x-npud-token`'s.
    fn presented<T>(&self, req: &Request<T>) -> Result<Identity, NpudError> {
        let transport = req
            .extensions()
            .get::<ConnInfo>()
            .map_or_else(|| Identity::anonymous(None), |c| c.identity.clone());
        let token = match req.metadata().get(npu_proto::IDENTITY_TOKEN_HEADER) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| {
                NpudError::Unauthenticated(format!(
                    "{}: not a token secret",
                    npu_proto::IDENTITY_TOKEN_HEADER
                ))
            })?),
        };
        self.state.policy.identify(&transport, token)
    }

    /// Who made a request, and what the policy grants it.
    ///
    /// # Errors
    /// As [`Policy::identify`] and [`Policy::decide`].
    fn allowed<T>(&self, req: &Request<T>) -> Result<(Identity, Arc<Grant>), NpudError> {
        let who = self.identity(req)?;
        let grant = self.state.policy.decide(&who)?;
        Ok((who, grant))
    }

    /// The session a request names, which must be the caller's. (The policy allowed the
    /// caller when it opened the session.)
    fn caller<T>(&self, req: &Request<T>) -> Result<Caller, NpudError> {
        let conn = req.extensions().get::<ConnInfo>().cloned();
        let who = self.identity(req)?;
        let session = self
            .state
            .sessions
            .authenticate(req.metadata(), conn.as_ref(), &who)?;
        Ok(Caller { session, conn })
    }

    /// Like [`NpudService::caller`], but a request without session metadata runs in none (and
    /// must be allowed by the policy).
    /// The sessions whose programs `who` may see: `None` (all) for an admin, else the sessions
    /// `who` opened.
    fn visible_sessions(&self, who: &crate::auth::Identity) -> Option<Vec<u64>> {
        if self.state.policy.is_admin(who) {
            return None;
        }
        Some(
            self.state
                .sessions
                .snapshot()
                .into_iter()
                .filter(|x| &x.owner == who)
                .map(|x| x.id)
                .collect(),
        )
    }

    fn maybe_caller<T>(&self, req: &Request<T>) -> Result<Option<Caller>, NpudError> {
        if req.metadata().get(npu_proto::SESSION_HEADER).is_none() {
            self.allowed(req)?;
            return Ok(None);
        }
        self.caller(req).map(Some)
    }

    /// Ends a session and releases everything it holds: what it holds open (calls, streams, its
    /// ring) ends with `why`.
    pub async fn end_session(state: &State, session: u64, why: NpudError) {
        state.lifecycle.end_session(session, why);
        state.tickets.forget_session(session);
        state.rings.stop(session);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let freed = match state
            .exec
            .send(Command::ReleaseSession { session, reply: tx })
            .await
        {
            Ok(()) => rx.await.unwrap_or(0),
            Err(_) => 0,
        };
        let dropped = state.programs.release_session(session);
        for program in &dropped {
            let _ = state.exec.send(Command::Unload { program: *program }).await;
        }
        tracing::info!(
            session,
            tensors = freed,
            programs_dropped = dropped.len(),
            "session ended"
        );
    }

    fn check_serving(&self) -> Result<(), NpudError> {
        if self.state.device.borrow().serving {
            Ok(())
        } else {
            Err(NpudError::Unavailable(
                "the device is recovering from a fault; retry".into(),
            ))
        }
    }
}

/// The timeout a request carries in `grpc-timeout`.
fn timeout<T>(req: &Request<T>) -> Option<Duration> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    parse_grpc_timeout(v)
}

/// The deadline a request carries in `grpc-timeout`, from now.
fn deadline<T>(req: &Request<T>) -> Option<Instant> {
    timeout(req).map(|d| Instant::now() + d)
}

type Res<T> = Result<Response<T>, Status>;
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn ok<T>(r: Result<T, NpudError>) -> Res<T> {
    r.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl Npud for NpudService {
    async fn get_device_info(&self, req: Request<pb::GetDeviceInfoRequest>) -> Res<pb::DeviceInfo> {
        ok(self.device_info(whole(req)?).await)
    }

    async fn open_session(
        &self,
        req: Request<pb::OpenSessionRequest>,
    ) -> Res<pb::OpenSessionResponse> {
        ok(self.open_session(whole(req)?))
    }

    async fn resume_session(
        &self,
        req: Request<pb::ResumeSessionRequest>,
    ) -> Res<pb::ResumeSessionResponse> {
        ok(self.resume_session(whole(req)?).await)
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Res<pb::CloseSessionResponse> {
        ok(self.close_session(whole(req)?).await)
    }

    async fn register_program(
        &self,
        req: Request<pb::RegisterProgramRequest>,
    ) -> Res<pb::RegisterProgramResponse> {
        ok(self.register_program(whole(req)?).await)
    }

    async fn unregister_program(
        &self,
        req: Request<pb::UnregisterProgramRequest>,
    ) -> Res<pb::UnregisterProgramResponse> {
        ok(self.unregister_program(whole(req)?).await)
    }

    async fn list_programs(
        &self,
        req: Request<pb::ListProgramsRequest>,
    ) -> Res<pb::ListProgramsResponse> {
        ok(self.list_programs(whole(req)?))
    }

    async fn allocate_tensor(
        &self,
        req: Request<pb::AllocateTensorRequest>,
    ) -> Res<pb::AllocateTensorResponse> {
        ok(self.allocate_tensor(whole(req)?).await)
    }

    async fn import_tensor(
        &self,
        req: Request<pb::ImportTensorRequest>,
    ) -> Res<pb::ImportTensorResponse> {
        ok(self.import_tensor(whole(req)?).await)
    }

    async fn free_tensor(
        &self,
        req: Request<pb::FreeTensorRequest>,
    ) -> Res<pb::FreeTensorResponse> {
        ok(self.free_tensor(whole(req)?).await)
    }

    async fn get_tensor_info(&self, req: Request<pb::GetTensorInfoRequest>) -> Res<pb::TensorInfo> {
        ok(self.tensor_info(whole(req)?).await)
    }

    async fn write_tensor(
        &self,
        req: Request<Streaming<pb::WriteTensorChunk>>,
    ) -> Res<pb::WriteTensorResponse> {
        ok(self.write_tensor(req).await)
    }

    type ReadTensorStream = BoxStream<pb::ReadTensorChunk>;

    async fn read_tensor(
        &self,
        req: Request<pb::ReadTensorRequest>,
    ) -> Res<Self::ReadTensorStream> {
        ok(self.read_tensor(whole(req)?).await)
    }

    async fn dispatch(&self, req: Request<pb::DispatchRequest>) -> Res<pb::DispatchResponse> {
        ok(self.dispatch(whole(req)?).await)
    }

    async fn chain(&self, req: Request<pb::ChainRequest>) -> Res<pb::ChainResponse> {
        ok(self.chain(whole(req)?).await)
    }

    type SubmitStream = BoxStream<pb::SubmitResponse>;

    async fn submit(&self, req: Request<Streaming<pb::SubmitRequest>>) -> Res<Self::SubmitStream> {
        ok(self.submit(req))
    }

    async fn attach_ring(
        &self,
        req: Request<pb::AttachRingRequest>,
    ) -> Res<pb::AttachRingResponse> {
        ok(self.attach_ring(whole(req)?))
    }

    async fn get_statistics(&self, req: Request<pb::GetStatisticsRequest>) -> Res<pb::Statistics> {
        ok(self.statistics(whole(req)?).await)
    }

    async fn clear_quarantine(
        &self,
        req: Request<pb::ClearQuarantineRequest>,
    ) -> Res<pb::ClearQuarantineResponse> {
        ok(self.clear_quarantine(whole(req)?))
    }
}
