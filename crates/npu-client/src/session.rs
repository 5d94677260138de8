//! The connection and the session it carries: metadata, timeouts, reconnecting and resuming.
//!
//! # Contract
//!
//! - Every call is bounded: connecting by [`ConnectOptions::connect_timeout`], each call by
//!   [`ConnectOptions::call_timeout`] (also sent to the daemon as the gRPC deadline, so queued
//!   work whose deadline passed is not started), and reconnecting by
//!   [`ConnectOptions::reconnect_timeout`]. Nothing waits forever.
//! - Session calls carry `npud-session` and `npud-token` metadata, added by an interceptor.
//! - When a call fails in the transport (the connection dropped, the daemon is not there), the
//!   client opens a new connection, calls `ResumeSession`, and retries the call once. A call is
//!   therefore sent at most twice, both times with the same `npud-request-id`: the daemon runs
//!   Dispatch, Chain, AllocateTensor and FreeTensor once per id, so a retry whose first request
//!   reached the daemon before the connection dropped gets the first one's answer (an in-place
//!   chain does not run twice, an allocation is not made twice). Ids start at a random value
//!   per connection and count up, so two clients resuming one session do not share them.
//! - The session is opened once, with the class and deadline of the options
//!   ([`ConnectOptions::session_class`]); a resume keeps them (the daemon holds them with the
//!   session), and a lost session is never opened again behind the caller's back.
//! - When the daemon no longer knows the session (it restarted, or the grace period passed:
//!   `UNAUTHENTICATED` from any session call or from the resume), the call returns
//!   [`ClientError::SessionLost`] and so does every later call. The client never re-registers
//!   programs or re-creates tensors behind the caller's back: their contents are gone.
//! - An `UNAVAILABLE` the daemon itself sends (the device recovers, the daemon drains) is returned
//!   as [`ClientError::Daemon`], not retried; except at connect, before any session exists:
//!   there a daemon that drains (a `systemctl restart` whose socket unit hands the next
//!   connection to the next daemon) is asked again on a new connection, within the connect
//!   timeout. A connection such a daemon closes as it is made, or whose first call it refuses
//!   with its HTTP/2 GOAWAY or drops, is made once more (that call, `GetDeviceInfo`, changes
//!   nothing).
//! - A session a [`crate::Fleet`] opened is also lost when the fleet finds its host down (a
//!   session call in flight then ends at once, not at its timeout), and when its own reconnect
//!   fails for the reconnect timeout (it then tells the fleet): the daemon that held its
//!   tensors is gone.
//!   [`ClientError::SessionLost`] names the host in every case.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::ClientError;
use crate::class::SessionClass;
use crate::connect::{Address, ConnectOptions, open_channel};
use crate::program::ProgramInfo;

/// The gRPC client type every call uses.
pub(crate) type Rpc = NpudClient<InterceptedService<Channel, SessionAuth>>;

/// Largest message the client decodes (ReadTensor chunks are 1 MiB by default).
const MAX_DECODE_BYTES: usize = 256 << 20;

/// Adds the session metadata and the call deadline to every request.
#[derive(Debug, Clone)]
pub(crate) struct SessionAuth {
    session: Option<(AsciiMetadataValue, AsciiMetadataValue)>,
    /// The identity token (`x-npud-token`).
    identity: Option<AsciiMetadataValue>,
    timeout: Duration,
    /// The call's request id (`npud-request-id`), the same on its retry.
    request_id: Option<AsciiMetadataValue>,
    /// The lowest request id of this session whose call has not finished (`npud-request-ack`):
    /// the daemon may forget the answers of every id below it.
    request_ack: Option<AsciiMetadataValue>,
}

impl Interceptor for SessionAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(id) = &self.request_id {
            req.metadata_mut()
                .insert(npu_proto::REQUEST_ID_HEADER, id.clone());
        }
        if let Some(ack) = &self.request_ack {
            req.metadata_mut()
                .insert(npu_proto::REQUEST_ACK_HEADER, ack.clone());
        }
        if let Some(t) = &self.identity {
            req.metadata_mut()
                .insert(npu_proto::IDENTITY_TOKEN_HEADER, t.clone());
        }
        if let Some((id, token)) = &self.session {
            req.metadata_mut()
                .insert(npu_proto::SESSION_HEADER, id.clone());
            req.metadata_mut()
                .insert(npu_proto::TOKEN_HEADER, token.clone());
        }
        req.set_timeout(self.timeout);
        Ok(req)
    }
}

/// A request id in flight: listed in [`Inner`]'s set until dropped.
struct InFlight<'a> {
    set: &'a Mutex<std::collections::BTreeSet<u64>>,
    id: u64,
}

impl<'a> InFlight<'a> {
    fn enter(set: &'a Mutex<std::collections::BTreeSet<u64>>, id: u64) -> Self {
        set.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id);
        Self { set, id }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// The link from a session opened through a [`crate::Fleet`] to the fleet's record of its
/// host: the fleet tells the session when the host went down, and the session tells the fleet
/// when it could not reach the host.
pub(crate) trait HostWatch: Send + Sync + std::fmt::Debug {
    /// Why the session's host went down after the session was opened (the session is gone with
    /// it), or `None`.
    fn lost(&self) -> Option<String>;
    /// Resolves with [`HostWatch::lost`]'s reason once the host is found down: a call in flight
    /// on a cut-off host then ends at once instead of at its timeout.
    fn gone(&self) -> Pin<Box<dyn Future<Output = String> + Send + '_>>;
    /// The session could not reconnect to its host: `why`.
    fn unreachable(&self, why: &str);
}

/// A session: its id and token, and the class and deadline the daemon granted it.
#[derive(Debug, Clone)]
pub(crate) struct SessionKey {
    pub id: u64,
    pub token: String,
    pub class: SessionClass,
    pub deadline: Option<Duration>,
}

/// What a connection shares with its tensors and programs.
#[derive(Debug)]
pub(crate) struct Inner {
    pub addr: Address,
    pub opts: ConnectOptions,
    channel: Mutex<(u64, Channel)>,
    reconnecting: tokio::sync::Mutex<()>,
    pub session: Option<SessionKey>,
    lost: AtomicBool,
    /// The runtime that frees tensors dropped outside async code.
    pub runtime: tokio::runtime::Handle,
    /// Program registrations of this session, by [`crate::Program`] key.
    pub programs: ProgramCache,
    pub device: pb::DeviceInfo,
    reconnects: AtomicU64,
    /// The next call's request id.
    next_request: AtomicU64,
    /// Request ids of calls not finished yet: the lowest is acknowledged to the daemon.
    in_flight: Mutex<std::collections::BTreeSet<u64>>,
    /// Set when a [`crate::Fleet`] opened the session.
    pub(crate) host: std::sync::OnceLock<Arc<dyn HostWatch>>,
    /// The identity token, read once at connect.
    identity: Option<AsciiMetadataValue>,
    /// The session's dispatch ring, when it has one ([`crate::fastpath`]).
    fast: Mutex<Option<Arc<crate::fastpath::FastPath>>>,
    /// A ring closed under the session: attach a new one after the next gRPC dispatch.
    reattach: AtomicBool,
}

impl Inner {
    /// Connects; with `client_name`, opens a session too.
    pub(crate) async fn connect(
        addr: Address,
        opts: ConnectOptions,
        open_session: bool,
    ) -> Result<Arc<Inner>, ClientError> {
        let identity = identity_header(&addr, &opts)?;
        // A daemon that is shutting down answers UNAVAILABLE on a connection it accepted just
        // before: under socket activation the next daemon takes the next connection from the
        // same socket, so a new connection is tried until the connect timeout. It may also
        // refuse the first call with its HTTP/2 GOAWAY, or close the connection under it: that
        // call (GetDeviceInfo, which changes nothing) is sent once more on a new connection.
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        let mut resent = false;
        let (channel, mut plain, device) = loop {
            let channel = open_channel(&addr, &opts).await?;
            let mut plain = plain_client(channel.clone(), &opts, identity.clone());
            match tokio::time::timeout(
                opts.call_timeout,
                plain.get_device_info(pb::GetDeviceInfoRequest {}),
            )
            .await
            {
                Ok(Ok(r)) => break (channel, plain, r.into_inner()),
                Ok(Err(st)) if is_transport(&st) && !resent => {
                    tracing::debug!(error = %crate::connect::status_chain(&st), "the first call failed in the transport; sending it again on a new connection");
                    resent = true;
                }
                Ok(Err(st))
                    if st.code() == Code::Unavailable
                        && !is_transport(&st)
                        && started.elapsed() + pause < opts.connect_timeout =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(250));
                }
                Ok(Err(st)) => {
                    return Err(first_call_failed(&addr, &opts, "GetDeviceInfo", &st).await);
                }
                Err(_) => {
                    return Err(ClientError::Timeout {
                        call: "GetDeviceInfo",
                        timeout: opts.call_timeout,
                    });
                }
            }
        };
        let session = if open_session {
            let r = bounded(&opts, "OpenSession", async {
                plain
                    .open_session(pb::OpenSessionRequest {
                        client_name: opts.client_name.clone(),
                        session_class: pb::SessionClass::from(opts.session_class).into(),
                        deadline_us: crate::class::deadline_us(opts.deadline),
                    })
                    .await
            })
            .await?
            .into_inner();
            Some(SessionKey {
                id: r.session_id,
                token: r.token,
                // A daemon older than classes sends none (batch, as it treats every session);
                // the proto rules out any other class than the two asked for.
                class: SessionClass::from_proto(r.session_class).unwrap_or_default(),
                deadline: crate::class::deadline_from_us(r.deadline_us),
            })
        } else {
            None
        };
        let inner = Arc::new(Inner {
            addr,
            opts,
            channel: Mutex::new((0, channel)),
            reconnecting: tokio::sync::Mutex::new(()),
            session,
            lost: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::current(),
            programs: ProgramCache::default(),
            device,
            reconnects: AtomicU64::new(0),
            next_request: AtomicU64::new(random_u64() >> 1),
            in_flight: Mutex::new(std::collections::BTreeSet::new()),
            host: std::sync::OnceLock::new(),
            identity,
            fast: Mutex::new(None),
            reattach: AtomicBool::new(false),
        });
        if inner.session.is_some() && inner.opts.fast_path && matches!(inner.addr, Address::Unix(_))
        {
            inner.attach_fast_path().await;
        }
        Ok(inner)
    }

    /// Attaches a dispatch ring to the session; without one (an older daemon, any refusal)
    /// dispatches go through gRPC.
    pub(crate) async fn attach_fast_path(&self) {
        let r = self
            .call("AttachRing", |mut c| async move {
                c.attach_ring(pb::AttachRingRequest {})
                    .await
                    .map(tonic::Response::into_inner)
            })
            .await;
        let attached = match r {
            Ok(r) => tokio::task::spawn_blocking(move || crate::fastpath::FastPath::attach(&r))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r),
            Err(e) => Err(e.to_string()),
        };
        match attached {
            Ok(fp) => {
                *self.fast.lock().unwrap_or_else(PoisonError::into_inner) = Some(fp);
            }
            Err(why) => {
                tracing::debug!(session = self.session_id(), %why, "no dispatch ring; dispatching through gRPC");
            }
        }
    }

    /// The session's ring while the daemon serves it. A closed one is dropped (and a new one
    /// attached after the next dispatch through gRPC).
    pub(crate) fn fast_path(&self) -> Option<Arc<crate::fastpath::FastPath>> {
        let mut g = self.fast.lock().unwrap_or_else(PoisonError::into_inner);
        match g.as_ref() {
            Some(f) if f.is_open() => Some(f.clone()),
            Some(_) => {
                *g = None;
                self.reattach.store(true, Ordering::SeqCst);
                None
            }
            None => None,
        }
    }

    /// After a dispatch through gRPC: attaches a ring again if the last one closed.
    pub(crate) async fn maybe_reattach(&self) {
        if self.reattach.swap(false, Ordering::SeqCst) && !self.lost.load(Ordering::SeqCst) {
            self.attach_fast_path().await;
        }
    }

    /// The error a status from the daemon stands for, as a session call `name` that got it
    /// through gRPC would report it.
    pub(crate) fn daemon_error(&self, name: &'static str, status: &Status) -> ClientError {
        self.failed(name, false, status)
    }

    pub(crate) fn session_id(&self) -> u64 {
        self.session.as_ref().map_or(0, |s| s.id)
    }

    /// The class the daemon granted the session (batch without one).
    pub(crate) fn session_class(&self) -> SessionClass {
        self.session
            .as_ref()
            .map_or(SessionClass::Batch, |s| s.class)
    }

    /// The deadline the daemon granted the session.
    pub(crate) fn deadline(&self) -> Option<Duration> {
        self.session.as_ref().and_then(|s| s.deadline)
    }

    /// How many times the client reconnected and resumed its session.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    fn current(&self) -> (u64, Channel) {
        self.channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn rpc(&self, channel: Channel, anonymous: bool) -> Rpc {
        self.rpc_with_id(channel, anonymous, None)
    }

    /// As [`Inner::rpc`], with request id `request_id` on every call, and the lowest id of a
    /// call not finished as its acknowledgement.
    fn rpc_with_id(&self, channel: Channel, anonymous: bool, request_id: Option<u64>) -> Rpc {
        let value = |v: u64| MetadataValue::try_from(v.to_string()).ok();
        let request_ack = request_id.and_then(|_| {
            let low = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .first()
                .copied();
            low.and_then(value)
        });
        let session = if anonymous {
            None
        } else {
            self.session.as_ref().and_then(|s| {
                let id: AsciiMetadataValue = MetadataValue::try_from(s.id.to_string()).ok()?;
                let token: AsciiMetadataValue = MetadataValue::try_from(s.token.as_str()).ok()?;
                Some((id, token))
            })
        };
        NpudClient::with_interceptor(
            channel,
            SessionAuth {
                session,
                identity: self.identity.clone(),
                timeout: self.opts.call_timeout,
                request_id: request_id.and_then(value),
                request_ack,
            },
        )
        .max_decoding_message_size(MAX_DECODE_BYTES)
        .max_encoding_message_size(MAX_DECODE_BYTES)
    }

    fn lost_error(&self, call: &'static str, message: String) -> ClientError {
        self.lost.store(true, Ordering::SeqCst);
        ClientError::SessionLost {
            session: self.session_id(),
            address: self.addr.to_string(),
            call,
            message,
        }
    }

    /// The error for a session call when the session is known to be gone: an earlier call found
    /// it so, or the fleet that opened it saw its host go down.
    /// The host's going down is the better reason, so it comes first: every later call names
    /// it, not only the call that found out.
    fn check_lost(&self, call: &'static str) -> Option<ClientError> {
        if let Some(why) = self.host.get().and_then(|w| w.lost()) {
            return Some(self.lost_error(call, why));
        }
        self.lost
            .load(Ordering::SeqCst)
            .then(|| self.lost_error(call, "an earlier call found the session gone".to_owned()))
    }

    /// Runs a session call (see the module docs for retries and errors).
    pub(crate) async fn call<T, F, Fut>(&self, name: &'static str, f: F) -> Result<T, ClientError>
    where
        F: Fn(Rpc) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.call_as(name, false, f).await
    }

    /// Runs a call without session metadata (device info, statistics, the operator's listing).
    pub(crate) async fn call_anonymous<T, F, Fut>(
        &self,
        name: &'static str,
        f: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Rpc) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.call_as(name, true, f).await
    }

    async fn call_as<T, F, Fut>(
        &self,
        name: &'static str,
        anonymous: bool,
        f: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Rpc) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        if !anonymous && let Some(e) = self.check_lost(name) {
            return Err(e);
        }
        let mut retried = false;
        // One id for the call and its retry (session calls only), in flight until the call
        // returns or is dropped.
        let request_id = (!anonymous).then(|| self.next_request.fetch_add(1, Ordering::Relaxed));
        let _in_flight = request_id.map(|id| InFlight::enter(&self.in_flight, id));
        loop {
            let (epoch, channel) = self.current();
            let rpc = self.rpc_with_id(channel, anonymous, request_id);
            let call = tokio::time::timeout(self.opts.call_timeout, f(rpc));
            let outcome = match self.host.get() {
                Some(watch) if !anonymous => tokio::select! {
                    o = call => o,
                    why = watch.gone() => return Err(self.lost_error(name, why)),
                },
                _ => call.await,
            };
            let status = match outcome {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(status)) => status,
                Err(_) => {
                    return Err(ClientError::Timeout {
                        call: name,
                        timeout: self.opts.call_timeout,
                    });
                }
            };
            // A daemon that is shutting down ends the calls it holds with UNAVAILABLE (nothing
            // of them ran); under socket activation the daemon that replaces it takes the next
            // connection. A call without a session only reads, or clears a quarantine (which a
            // repeat leaves as it is), so it too is sent once more on a new connection.
            let drained = anonymous && status.code() == Code::Unavailable;
            if (is_transport(&status) || drained) && !retried {
                retried = true;
                self.recover(epoch, name).await?;
                continue;
            }
            return Err(self.failed(name, anonymous, &status));
        }
    }

    fn lost_by(&self, anonymous: bool, status: &Status) -> bool {
        status.code() == Code::Unauthenticated && !anonymous && self.session.is_some()
    }

    /// The error a call's final status stands for: the session gone, the transport, or the
    /// daemon's own refusal.
    fn failed(&self, name: &'static str, anonymous: bool, status: &Status) -> ClientError {
        if self.lost_by(anonymous, status) {
            return self.lost_error(name, status.message().to_owned());
        }
        if is_transport(status) {
            return ClientError::Connect {
                address: self.addr.to_string(),
                message: format!("{name}: {}", crate::connect::status_chain(status)),
            };
        }
        let mut e = ClientError::daemon(name, status);
        if let ClientError::Daemon {
            code,
            message,
            note,
            ..
        } = &mut e
        {
            *note = crate::diagnose::refusal_note(&self.addr, *code, message);
        }
        e
    }

    /// Opens a streaming call once, without the retry of [`Inner::call`]: the stream's request
    /// side can be consumed only once. `call_timeout` bounds the opening, not the stream.
    pub(crate) async fn open_stream<T, F, Fut>(
        &self,
        name: &'static str,
        f: F,
    ) -> Result<T, ClientError>
    where
        F: FnOnce(Rpc) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        if let Some(e) = self.check_lost(name) {
            return Err(e);
        }
        let (_, channel) = self.current();
        let status =
            match tokio::time::timeout(self.opts.call_timeout, f(self.rpc(channel, false))).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(status)) => status,
                Err(_) => {
                    return Err(ClientError::Timeout {
                        call: name,
                        timeout: self.opts.call_timeout,
                    });
                }
            };
        Err(self.failed(name, false, &status))
    }

    /// Drops the current connection and opens a new one, resuming the session on it.
    ///
    /// `epoch` is the connection the caller saw fail: when another task already replaced it,
    /// this returns at once.
    pub(crate) async fn recover(&self, epoch: u64, call: &'static str) -> Result<(), ClientError> {
        let _guard = self.reconnecting.lock().await;
        if self.current().0 != epoch {
            return Ok(());
        }
        let deadline = Instant::now() + self.opts.reconnect_timeout;
        let mut backoff = Duration::from_millis(25);
        let mut last;
        loop {
            match open_channel(&self.addr, &self.opts).await {
                Ok(channel) => match self.resume(channel.clone(), call).await {
                    Ok(()) => {
                        *self.channel.lock().unwrap_or_else(PoisonError::into_inner) =
                            (epoch + 1, channel);
                        self.reconnects.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(session = self.session_id(), "reconnected");
                        return Ok(());
                    }
                    Err(Resume::Lost(e)) => return Err(e),
                    Err(Resume::Retry(m)) => last = m,
                },
                Err(e) => last = e.to_string(),
            }
            if let Some(watch) = self.host.get() {
                if let Some(why) = watch.lost() {
                    return Err(self.lost_error(call, why));
                }
                if Instant::now() + backoff > deadline {
                    let why = format!(
                        "no connection to the host within {:?} ({last})",
                        self.opts.reconnect_timeout
                    );
                    watch.unreachable(&why);
                    return Err(self.lost_error(call, watch.lost().unwrap_or(why)));
                }
            }
            if Instant::now() + backoff > deadline {
                return Err(ClientError::Connect {
                    address: self.addr.to_string(),
                    message: format!(
                        "{call}: the connection dropped and no new one could be made within \
                         {:?} ({last})",
                        self.opts.reconnect_timeout
                    ),
                });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    async fn resume(&self, channel: Channel, call: &'static str) -> Result<(), Resume> {
        let Some(s) = &self.session else {
            return Ok(());
        };
        let mut c = plain_client(channel, &self.opts, self.identity.clone());
        let req = pb::ResumeSessionRequest {
            session_id: s.id,
            token: s.token.clone(),
        };
        match tokio::time::timeout(self.opts.call_timeout, c.resume_session(req)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(st)) if matches!(st.code(), Code::Unauthenticated | Code::NotFound) => Err(
                Resume::Lost(self.lost_error(call, format!("ResumeSession: {}", st.message()))),
            ),
            Ok(Err(st)) => Err(Resume::Retry(crate::connect::error_chain(&st))),
            Err(_) => Err(Resume::Retry("ResumeSession timed out".into())),
        }
    }

    /// Forces a new connection and resumes the session on it.
    pub(crate) async fn reconnect(&self) -> Result<(), ClientError> {
        let (epoch, _) = self.current();
        self.recover(epoch, "reconnect").await
    }

    /// Closes the session on the daemon; later calls fail with [`ClientError::SessionLost`].
    pub(crate) async fn close(&self) -> Result<(), ClientError> {
        if self.session.is_none() || self.lost.load(Ordering::SeqCst) {
            return Ok(());
        }
        let r = self
            .call("CloseSession", |mut c| async move {
                c.close_session(pb::CloseSessionRequest {})
                    .await
                    .map(tonic::Response::into_inner)
            })
            .await;
        self.lost.store(true, Ordering::SeqCst);
        r.map(|_| ())
    }
}

enum Resume {
    Lost(ClientError),
    Retry(String),
}

pub(crate) fn plain_client(
    channel: Channel,
    opts: &ConnectOptions,
    identity: Option<AsciiMetadataValue>,
) -> Rpc {
    NpudClient::with_interceptor(
        channel,
        SessionAuth {
            session: None,
            identity,
            timeout: opts.call_timeout,
            request_id: None,
            request_ack: None,
        },
    )
    .max_decoding_message_size(MAX_DECODE_BYTES)
}

/// The `x-npud-token` value from the options' token or token file, if it may be sent to `addr`
/// (see [`ConnectOptions::identity_token_for`]).
pub(crate) fn identity_header(
    addr: &Address,
    opts: &ConnectOptions,
) -> Result<Option<AsciiMetadataValue>, ClientError> {
    match opts.identity_token_for(addr)? {
        Some(t) => Ok(Some(AsciiMetadataValue::try_from(t.as_str()).map_err(
            |_| ClientError::Invalid("the identity token is not ASCII text".into()),
        )?)),
        None => Ok(None),
    }
}

/// A call before the session exists: bounded, errors kept.
async fn bounded<T>(
    opts: &ConnectOptions,
    call: &'static str,
    fut: impl Future<Output = Result<T, Status>>,
) -> Result<T, ClientError> {
    match tokio::time::timeout(opts.call_timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(st)) => Err(ClientError::daemon(call, &st)),
        Err(_) => Err(ClientError::Timeout {
            call,
            timeout: opts.call_timeout,
        }),
    }
}

/// The error for a connection's first call that failed: below gRPC (the transport), a
/// connection failure with its cause and the next step ([`crate::diagnose::first_call`]);
/// otherwise the daemon's refusal.
pub(crate) async fn first_call_failed(
    addr: &Address,
    opts: &ConnectOptions,
    call: &'static str,
    status: &Status,
) -> ClientError {
    if !is_transport(status) {
        return ClientError::daemon(call, status);
    }
    let chain = crate::connect::status_chain(status);
    let cert = opts.tls_cert.is_some();
    let message = match crate::diagnose::first_call(addr, &chain, cert).await {
        Some(m) => format!("{call}: {m}"),
        None => format!("{call}: {chain}"),
    };
    ClientError::Connect {
        address: addr.to_string(),
        message,
    }
}

/// A random u64 (the standard library's per-process hasher keys), so that the request ids of
/// two clients of one session do not meet.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Whether a status came from the transport (connection refused, reset, closed) rather than
/// from the daemon. Statuses the daemon sends carry no source error; the transport's do.
pub(crate) fn is_transport(status: &Status) -> bool {
    use std::error::Error as _;
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
    ) && status.source().is_some()
}

/// A session's program registrations, by [`crate::Program`] key. Each key has its own cell:
/// a registration in flight makes only callers of the same program wait for its answer (they
/// need it), never a dispatch of another program; no lock is held across an RPC.
#[derive(Debug, Default)]
pub(crate) struct ProgramCache {
    cells: Mutex<HashMap<u64, Arc<tokio::sync::OnceCell<ProgramInfo>>>>,
}

impl ProgramCache {
    fn cells(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<tokio::sync::OnceCell<ProgramInfo>>>> {
        self.cells.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The registration of `key`, if it has been made.
    pub fn id_now(&self, key: u64) -> Option<u64> {
        self.cells().get(&key).and_then(|c| c.get().map(|p| p.id))
    }

    /// The registration of `key`, made by `register` if there is none yet (a failed one is
    /// tried again by the next caller).
    pub async fn get_or_register<F, Fut, E>(&self, key: u64, register: F) -> Result<ProgramInfo, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<ProgramInfo, E>>,
    {
        let cell = self.cells().entry(key).or_default().clone();
        cell.get_or_try_init(register).await.cloned()
    }

    /// Forgets `key`; its registration, when it had one.
    pub fn remove(&self, key: u64) -> Option<ProgramInfo> {
        self.cells().remove(&key).and_then(|c| c.get().cloned())
    }
}

#[cfg(test)]
mod program_cache_tests {
    use super::*;

    fn info(id: u64) -> ProgramInfo {
        ProgramInfo {
            id,
            content_hash: String::new(),
            newly_stored: true,
            summary: None,
        }
    }

    #[tokio::test]
    async fn a_registration_in_flight_holds_up_no_other_program() {
        let cache = Arc::new(ProgramCache::default());
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let slow = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .get_or_register(1, || async move {
                        let _ = wait.await;
                        Ok::<_, ()>(info(10))
                    })
                    .await
            })
        };
        tokio::task::yield_now().await;
        // Program 2 registers while program 1's registration is still in flight.
        let other = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            cache.get_or_register(2, || async { Ok::<_, ()>(info(20)) }),
        )
        .await
        .expect("another program's registration does not wait for program 1's");
        assert_eq!(other.unwrap().id, 20);
        release.send(()).unwrap();
        assert_eq!(slow.await.unwrap().unwrap().id, 10);
        // Registered once: later callers get the first answer without registering.
        let again = cache
            .get_or_register(1, || async { Err::<ProgramInfo, ()>(()) })
            .await;
        assert_eq!(again.unwrap().id, 10);
        // A failed registration is tried again by the next caller.
        assert!(
            cache
                .get_or_register(3, || async { Err::<ProgramInfo, ()>(()) })
                .await
                .is_err()
        );
        assert_eq!(
            cache
                .get_or_register(3, || async { Ok::<_, ()>(info(30)) })
                .await
                .unwrap()
                .id,
            30
        );
        assert_eq!(cache.remove(1).map(|i| i.id), Some(10));
        assert!(cache.remove(1).is_none());
    }
}
