//! Listeners, health, reflection, the session reaper, and shutdown.
//!
//! The daemon serves `npud.v1.Npud`, `grpc.health.v1.Health` and server reflection (v1 and
//! v1alpha) on its Unix socket and, when configured, on TCP; the fd socket runs beside them.
//! With `[tls]` the TCP listener speaks TLS (each handshake bounded by
//! `limits.handshake_timeout_ms`), and SIGHUP reloads its certificate, key and client CA for
//! new connections. SIGTERM or SIGINT turns health to `NOT_SERVING` and ends its `Watch` streams, stops the
//! listeners, lets requests in flight finish (for at most `shutdown.drain_timeout_ms`), lets the executor finish its queued work and release the device, and
//! removes the socket files.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use npu_proto::v1::npud_server::NpudServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::Router;
use tower_layer::{Identity, Stack};

use crate::accept::{Accepted, Acceptor, Admission, Limiter, Listener};
use crate::auth::Policy;
use crate::budget::MemoryBudget;
use crate::codes::DocumentedCodes;
use crate::config::Config;
use crate::conn::{Conn, CountCalls, Timeouts};
use crate::drain::Drain;
use crate::executor::{Executor, Opened};
use crate::fdsock;
use crate::health::{self, Condition, DeviceHealth, HealthService};
use crate::intake::{Intake, IntakeLayer};
use crate::lives::LifeLayer;
use crate::metrics::rpc::RpcMetrics;
use crate::metrics::{Exporter, Metrics};
use crate::programs::{Programs, Runs};
use crate::service::collect::StateCollector;
use crate::service::{NpudService, State};
use crate::sessions::Sessions;
use crate::state_dir::Persisted;
use crate::stats::PendingWork;
use crate::systemd::{self, Activated};
use crate::tickets::Tickets;
use crate::tls::Tls;

/// The tower layers around every gRPC service: [`RpcMetrics`] outside, so that it counts the
/// codes [`DocumentedCodes`] gives clients; [`Drain`] inside it, tracking which calls the
/// daemon works on for shutdown; [`CountCalls`] counts each connection's open calls for its
/// idle timer; [`LifeLayer`] around the handlers, ending each call when the life it runs in
/// ends (revocation, cool-down, session end, shutdown), so that every layer outside sees the
/// status it ends a call with; [`IntakeLayer`] innermost, so that a call's life holds while it
/// reads a body (it bounds every request body before tonic decodes it: see `intake`).
type Layers = Stack<
    IntakeLayer,
    Stack<
        LifeLayer,
        Stack<Drain, Stack<CountCalls, Stack<DocumentedCodes, Stack<RpcMetrics, Identity>>>>,
    >,
>;

/// Why the daemon could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{what} {}: {source}", path.display())]
    Socket {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("metrics.listen {addr}: {source}")]
    Metrics {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("listening on tcp {addr}: {source}")]
    Tcp {
        addr: String,
        source: std::io::Error,
    },
    #[error(
        "tcp {addr} is bound to {bound}, which is not a loopback address, and without TLS session \
         tokens and tensor bytes would cross the network in the clear: set [tls] cert and key, \
         listen on 127.0.0.1, or pass --allow-insecure-tcp (allow_insecure_tcp = true) on a \
         network you trust"
    )]
    InsecureTcp {
        addr: String,
        bound: std::net::SocketAddr,
    },
    #[error("writing the ready file {}: {source}", path.display())]
    ReadyFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("building server reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error(transparent)]
    Intake(#[from] crate::intake::SchemaError),
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
    #[error("serving gRPC: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Activation(#[from] systemd::ActivationError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// Serves until SIGTERM or SIGINT, then shuts down cleanly.
///
/// # Errors
/// [`ServeError`] when a socket cannot be bound or the server fails.
pub async fn run(
    mut cfg: Config,
    opened: Opened,
    device: watch::Receiver<Condition>,
    persisted: Persisted,
    ready_file: Option<PathBuf>,
) -> Result<(), ServeError> {
    // Sockets systemd passed are used as they are, and their files are left to systemd.
    let activated = Activated::from_env()?;
    let mut owned_files: Vec<PathBuf> = Vec::new();
    let uds = match activated.grpc {
        Some(l) => {
            if let Some(p) = l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_path_buf))
            {
                cfg.socket = p;
            }
            from_std_unix(l, &cfg.socket, "gRPC socket")?
        }
        None => {
            owned_files.push(cfg.socket.clone());
            bind_unix(&cfg.socket, "gRPC socket")?
        }
    };
    let fds = match activated.fd {
        Some(l) => {
            // Tell clients where systemd put it.
            if let Some(p) = l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_path_buf))
            {
                cfg.fd_socket = p;
            }
            from_std_unix(l, &cfg.fd_socket, "fd socket")?
        }
        None => {
            owned_files.push(cfg.fd_socket.clone());
            bind_unix(&cfg.fd_socket, "fd socket")?
        }
    };
    let tls = Tls::load(&cfg.tls)?;
    let tcp = match (activated.tcp, &cfg.tcp) {
        (Some(l), _) => Some(
            l.set_nonblocking(true)
                .and_then(|()| TcpListener::from_std(l))
                .map_err(|source| ServeError::Tcp {
                    addr: "(from systemd)".into(),
                    source,
                })?,
        ),
        (None, Some(addr)) => {
            Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| ServeError::Tcp {
                        addr: addr.clone(),
                        source,
                    })?,
            )
        }
        (None, None) => None,
    };
    // The configuration refuses a literal address that is not loopback; a host name, or a
    // socket systemd passed, is known only once bound.
    if let Some(l) = &tcp
        && let Ok(bound) = l.local_addr()
        && !bound.ip().is_loopback()
        && !cfg.tls.enabled()
        && !cfg.allow_insecure_tcp
    {
        return Err(ServeError::InsecureTcp {
            addr: cfg.tcp.clone().unwrap_or_else(|| "(from systemd)".into()),
            bound,
        });
    }
    let metrics_listener = match cfg.metrics.listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Metrics { addr, source })?,
        ),
        None => None,
    };
    let metrics_address = metrics_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .unwrap_or_default();
    let metrics = Arc::new(Metrics::new(cfg.metrics.max_program_labels));

    let generation = match opened.facts.info.generation {
        hsa_core::Generation::Npu1 => npu_artifacts::NpuGen::Npu1,
        hsa_core::Generation::Npu2 => npu_artifacts::NpuGen::Npu2,
    };
    let programs = Arc::new(
        Programs::new(
            cfg.limits.max_program_bytes,
            cfg.limits.max_program_bytes_per_session,
            generation,
            Runs::of_runtime(opened.facts.info.runtime_version.as_deref()),
            persisted.quarantine,
            persisted.records,
        )
        .with_packet_abi(opened.facts.info.packet_abi)
        .with_max_programs_per_session(cfg.limits.max_programs_per_session)
        .with_g2_full_elf(if opened.facts.info.g2_full_elf {
            Ok(())
        } else {
            Err(opened.facts.info.g2_full_elf_source.clone())
        })
        .with_budget(MemoryBudget::new(&cfg.limits)),
    );
    let facts = opened.facts.clone();
    let executor = opened.run(programs.clone(), persisted.inflight);
    let sessions = Arc::new(Sessions::new(
        Duration::from_millis(cfg.session_grace_ms),
        cfg.limits.max_sessions,
    ));
    let policy = Arc::new(Policy::new(
        &cfg.auth,
        &cfg.limits,
        rustix::process::geteuid().as_raw(),
        &std::fs::read_to_string("/etc/passwd").unwrap_or_default(),
    ));
    let tcp_address = tcp
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .unwrap_or_default();
    let tickets = Arc::new(Tickets::default());
    let state = Arc::new(State {
        exec: executor.handle(),
        sessions: sessions.clone(),
        programs,
        tickets: tickets.clone(),
        facts,
        limits: cfg.limits.clone(),
        interactive_deadline: Duration::from_micros(cfg.executor.interactive_deadline_us),
        // Clients are told this path; they may run in another directory.
        fd_socket: std::path::absolute(&cfg.fd_socket).unwrap_or_else(|_| cfg.fd_socket.clone()),
        device: device.clone(),
        started: Instant::now(),
        io_threads: u32::try_from(cfg.io_threads()).unwrap_or(u32::MAX),
        executor_spin_us: cfg.executor.spin_us,
        pending: PendingWork::default(),
        metrics: metrics.clone(),
        metrics_address: metrics_address.clone(),
        policy,
        tcp_address: tcp_address.clone(),
        tcp_security: if tcp.is_some() { cfg.tls.mode() } else { "" },
        budget: MemoryBudget::new(&cfg.limits),
        rings: Arc::default(),
        lifecycle: Arc::new(crate::principals::Lifecycle::new()),
    });
    let drain = Drain::new();
    // A cool-down ends what the identity holds open, as revocation does.
    state
        .exec
        .fault_budget()
        .end_holds_through(state.lifecycle.clone());
    let life_layer = LifeLayer::new(state.policy.tokens().cloned(), state.lifecycle.clone());
    // Inflating and scanning large messages as bulk work (`bulk`): below the priority of the
    // I/O threads and the executor, which serve every caller, and bounded in number.
    let intake = IntakeLayer::new(Intake::new(
        &cfg.limits,
        state.policy.clone(),
        state.budget.clone(),
        crate::bulk::decoders(),
    )?);

    let stop = CancellationToken::new();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServeError::Signal)?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(ServeError::Signal)?;
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = sigint.recv() => tracing::info!("SIGINT: shutting down"),
            }
            systemd::stopping();
            stop.cancel();
        });
    }
    // A SIGTERM or SIGINT that came while the daemon started (signals.rs caught it).
    if crate::signals::terminate_requested() {
        tracing::info!("SIGTERM or SIGINT while starting: shutting down");
        systemd::stopping();
        stop.cancel();
    }
    if let Some(t) = &tls {
        tokio::spawn(t.clone().watch(stop.clone()));
    }
    let mut sighup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(ServeError::Signal)?;
    {
        let tls = tls.clone();
        tokio::spawn(async move {
            while sighup.recv().await.is_some() {
                match &tls {
                    None => tracing::info!("SIGHUP: no [tls] to reload"),
                    Some(t) => match t.reload() {
                        Ok(()) => tracing::info!(
                            "SIGHUP: reloaded tls.cert, tls.key and tls.client_ca; new \
                             connections use them, established ones keep theirs"
                        ),
                        Err(e) => tracing::error!(
                            "SIGHUP: reloading TLS failed, still serving the previous \
                             certificate: {e}"
                        ),
                    },
                }
            }
        });
    }

    let (health, published) = HealthService::new(stop.clone());
    tokio::spawn(health::publish(
        device,
        Duration::from_millis(cfg.health.min_not_serving_ms),
        published,
        stop.clone(),
    ));

    tokio::spawn(reaper(state.clone(), stop.clone()));
    if let Some(tokens) = state.policy.tokens() {
        tokio::spawn(revoker(state.clone(), tokens.revocations(), stop.clone()));
    }
    tokio::spawn(systemd::watchdog(state.exec.clone(), stop.clone()));
    // Local callers and TCP peers draw on separate pools (see `accept`).
    let limiter = Limiter::local(&cfg.limits);
    let timeouts = Timeouts {
        handshake: Duration::from_millis(cfg.limits.handshake_timeout_ms),
        idle: Duration::from_millis(cfg.limits.idle_timeout_ms),
        unused: Duration::from_millis(cfg.limits.idle_connection_ms),
    };
    // Whose TCP connections from this host are local users is decided by this socket's mode.
    let socket_path: Arc<Path> = Arc::from(cfg.socket.as_path());
    let fd_task = tokio::spawn(fdsock::serve(
        Acceptor::new(Listener::Unix(fds), "fd socket", limiter.clone()),
        tickets,
        NpudService::new(state.clone()),
        state.exec.clone(),
        timeouts,
        metrics.clone(),
        stop.clone(),
    ));
    let metrics_task = metrics_listener.map(|l| {
        let exporter = Arc::new(Exporter::new(
            &metrics,
            Box::new(StateCollector::new(
                Arc::downgrade(&state),
                cfg.metrics.max_session_labels,
            )),
        ));
        tracing::info!("npud serving metrics on http://{metrics_address}/metrics");
        tokio::spawn(crate::metrics::http::serve(l, exporter, stop.clone()))
    });

    let service = NpudService::new(state.clone());
    let max = usize::try_from(cfg.limits.max_message_bytes).unwrap_or(usize::MAX);
    let router = |svc: NpudService| -> Result<Router<Layers>, ServeError> {
        let v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(npu_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(npu_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;
        Ok(Server::builder()
            // Outside DocumentedCodes: it counts the codes clients read.
            .layer(RpcMetrics {
                metrics: metrics.clone(),
            })
            .layer(DocumentedCodes {
                max_message_bytes: cfg.limits.max_message_bytes,
            })
            .layer(CountCalls)
            .layer(drain.clone())
            .layer(life_layer.clone())
            .layer(intake.clone())
            .add_service(health.clone())
            .add_service(v1)
            .add_service(v1alpha)
            .add_service(
                // Compressed requests (grpcurl, grpcio and buf curl offer gzip) are inflated by
                // the intake, within its bounds, for callers the policy allows: the service
                // itself sees only uncompressed messages.
                NpudServer::new(svc)
                    .max_decoding_message_size(max.saturating_mul(2))
                    .max_encoding_message_size(max.saturating_mul(2)),
            ))
    };

    let incoming = accepted(
        Acceptor::new(Listener::Unix(uds), "gRPC socket", limiter.clone()),
        None,
        sessions.clone(),
        timeouts,
        socket_path.clone(),
        stop.clone(),
    );
    let uds_server = router(service.clone())?
        .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned());
    let mut servers = vec![tokio::spawn(uds_server)];
    if let Some(tcp) = tcp {
        let local = tcp.local_addr().ok();
        let incoming = accepted(
            Acceptor::new(Listener::Tcp(tcp), "tcp", Limiter::tcp(&cfg.limits))
                .with_preauth(Limiter::preauth(&cfg.limits)),
            tls.clone(),
            sessions.clone(),
            timeouts,
            socket_path.clone(),
            stop.clone(),
        );
        servers.push(tokio::spawn(
            router(service.clone())?
                .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned()),
        ));
        if let Some(a) = local {
            tracing::info!(
                security = cfg.tls.mode(),
                client_auth = ?cfg.tls.client_auth,
                "npud listening on tcp {a}"
            );
        }
    }
    tracing::info!(
        "npud listening on unix:{} (fd socket {})",
        cfg.socket.display(),
        cfg.fd_socket.display()
    );
    if let Some(p) = &ready_file {
        // The first line is "ready"; key=value lines after it tell where the daemon listens.
        let mut text = format!("ready\nunix={}\n", cfg.socket.display());
        if !tcp_address.is_empty() {
            text.push_str(&format!("tcp={tcp_address}\n"));
        }
        if !metrics_address.is_empty() {
            text.push_str(&format!("metrics={metrics_address}\n"));
        }
        // Written beside it and renamed, so that whoever sees the file sees all of it.
        let mut tmp = p.clone().into_os_string();
        tmp.push(".tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, p))
            .map_err(|source| ServeError::ReadyFile {
                path: p.clone(),
                source,
            })?;
    }
    systemd::ready(&format!("serving on unix:{}", cfg.socket.display()));

    stop.cancelled().await;
    let stopped = Instant::now();
    drain_calls(
        &drain,
        &state.lifecycle,
        &state.pending,
        &mut servers,
        Duration::from_millis(cfg.shutdown.drain_timeout_ms),
        Duration::from_millis(cfg.shutdown.close_grace_ms),
    )
    .await;
    let _ = fd_task.await;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    drop(service);
    executor.shutdown(Duration::from_secs(60)).await;
    for p in &owned_files {
        if let Err(e) = std::fs::remove_file(p) {
            tracing::warn!(socket = %p.display(), error = %e, "removing a socket file failed");
        }
    }
    if let Some(p) = &ready_file {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!(
        "npud stopped {} ms after it was asked to",
        stopped.elapsed().as_millis()
    );
    Ok(())
}

/// Shutdown's wait for calls in flight: until the listeners' connections have all closed, or
/// nothing is pending in the executor and every call left only waits for its caller (then
/// those calls end with UNAVAILABLE), or `timeout` (then every call left is ended the same
/// way). The connections are then kept while their calls still move (a caller taking the rest
/// of a stream and its UNAVAILABLE), until `timeout` has passed, and dropped once nothing moved
/// for `close_grace` (a connection that sent only its preface, a caller that does not read).
async fn drain_calls(
    drain: &Drain,
    lifecycle: &crate::principals::Lifecycle,
    pending: &PendingWork,
    servers: &mut Vec<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
    timeout: Duration,
    close_grace: Duration,
) {
    let deadline = Instant::now() + timeout;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let finished = |servers: &Vec<tokio::task::JoinHandle<_>>| {
        servers.iter().all(tokio::task::JoinHandle::is_finished)
    };
    loop {
        tick.tick().await;
        if finished(servers) {
            break;
        }
        let idle = pending.get() == 0 && drain.busy() == 0;
        if idle || Instant::now() >= deadline {
            if !idle {
                tracing::warn!(
                    calls = drain.busy(),
                    "requests still in flight after shutdown.drain_timeout_ms ({timeout:?}); \
                     ending them"
                );
            } else if drain.open() > 0 {
                tracing::info!(
                    calls = drain.open(),
                    "nothing is executing; ending the calls that wait for their callers with \
                     UNAVAILABLE"
                );
            }
            lifecycle.shutdown();
            break;
        }
    }
    let ended = Instant::now();
    let last_chance = deadline.max(ended + close_grace);
    while !finished(servers) {
        let now = Instant::now();
        let quiet = drain.quiet_for().min(now - ended);
        if quiet >= close_grace || now >= last_chance {
            tracing::debug!(
                calls = drain.open(),
                "connections still open {} ms after anything moved on them; closing them",
                quiet.as_millis()
            );
            for s in servers.iter() {
                s.abort();
            }
            break;
        }
        tick.tick().await;
    }
    for s in servers.drain(..) {
        match s.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "a listener failed while draining"),
            Err(_) => {}
        }
    }
}

/// The connections an acceptor admits (or accepts only to refuse), as tonic's incoming
/// stream. The acceptor runs in its own task, one connection ahead of tonic, and drops its
/// listener at shutdown; it names the local user of a TCP connection from this host (the
/// kernel's socket table, `auth::local`) before it counts the connection. Each TCP
/// connection's TLS handshake (with `tls`) and the reading of that user's groups (and whether
/// it may use the Unix socket at `socket`) run in a task of its own (bounded by the handshake
/// timeout, holding the connection's slot, ended if a full pool evicts it), so a slow client
/// delays no other.
fn accepted(
    mut acceptor: Acceptor,
    tls: Option<Arc<Tls>>,
    sessions: Arc<Sessions>,
    timeouts: Timeouts,
    socket: Arc<Path>,
    stop: CancellationToken,
) -> ReceiverStream<Result<Conn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let (s, admission) = tokio::select! {
                () = stop.cancelled() => break,
                a = acceptor.next() => a,
            };
            let Accepted::Tcp(tcp) = s else {
                let conn = Conn::new(s, admission, sessions.clone(), timeouts, None);
                if tx.send(Ok(conn)).await.is_err() {
                    break;
                }
                continue;
            };
            let peer = tcp.peer_addr().ok();
            let local_uid = match &admission {
                Admission::Admitted { local_uid, .. } => *local_uid,
                Admission::Refused { .. } => None,
            };
            let evicted = admission.evicted();
            let acceptor = tls.as_ref().map(|t| t.acceptor());
            let (tx, sessions, socket) = (tx.clone(), sessions.clone(), socket.clone());
            tokio::spawn(async move {
                let start = async {
                    let local = match local_uid {
                        Some(uid) => crate::auth::local::local_user(uid, socket).await,
                        None => None,
                    };
                    let s = match acceptor {
                        Some(a) => Accepted::Tls(Box::new(a.accept(tcp).await?)),
                        None => Accepted::Tcp(tcp),
                    };
                    Ok::<_, std::io::Error>((s, local))
                };
                let started = tokio::select! {
                    r = tokio::time::timeout(timeouts.handshake, start) => r,
                    () = evicted.cancelled() => {
                        tracing::debug!(?peer, "evicted by a full pool during its handshake; closed");
                        return;
                    }
                };
                match started {
                    Ok(Ok((s, local))) => {
                        let conn = Conn::new(s, admission, sessions, timeouts, local);
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::info!(?peer, "TLS handshake failed: {e}"),
                    Err(_) => tracing::info!(
                        ?peer,
                        "no TLS handshake within limits.handshake_timeout_ms; closed"
                    ),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Ends sessions whose connections have been gone for the grace period, and drops tickets
/// that expired unredeemed.
async fn reaper(state: Arc<State>, stop: CancellationToken) {
    let every =
        (state.sessions.grace() / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let expired = state.tickets.sweep(Instant::now());
        if expired > 0 {
            tracing::debug!(expired, "dropped tickets that were never redeemed");
        }
        for session in state.sessions.take_expired(Instant::now()) {
            tracing::info!(
                session,
                "no connection for the grace period; ending the session"
            );
            let why = crate::error::NpudError::Unauthenticated(format!(
                "session {session} ended after {} ms without a connection (the grace period, \
                 DeviceInfo.session_grace_ms): open a new one, and keep a connection open \
                 between calls",
                state.sessions.grace().as_millis()
            ));
            NpudService::end_session(&state, session, why).await;
        }
    }
}

/// Ends everything a revoked token identity holds, on every transport at once: its calls and
/// streams, its sessions (their rings and lifelines with them), through the one lifecycle.
async fn revoker(
    state: Arc<State>,
    mut revocations: crate::auth::Revocations,
    stop: CancellationToken,
) {
    loop {
        let names = tokio::select! {
            () = stop.cancelled() => break,
            n = revocations.next() => match n {
                Some(n) => n,
                None => break,
            },
        };
        for name in names {
            let why = crate::error::NpudError::Unauthenticated(format!(
                "{name} was revoked: its file in auth.token_dir was removed or rewritten; its \
                 calls, streams, rings and sessions end"
            ));
            // What it holds open ends here, at once; its sessions' resources are released in
            // a task of their own, so that a busy executor delays no later revocation.
            let sessions = state.lifecycle.revoke(&name, &why);
            tracing::info!(identity = %name, sessions = sessions.len(), "identity revoked");
            let state = state.clone();
            tokio::spawn(async move {
                for session in sessions {
                    if state.sessions.revoke(session) {
                        NpudService::end_session(&state, session, why.clone()).await;
                    }
                }
            });
        }
    }
}

/// Binds a Unix socket at `path`: creates the parent directory (0755) if needed, removes a
/// stale socket file, and makes the socket 0660 (created no looser than that).
fn bind_unix(path: &Path, what: &'static str) -> Result<UnixListener, ServeError> {
    let err = |source| ServeError::Socket {
        what,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another daemon is listening there",
                )));
            }
            std::fs::remove_file(path).map_err(err)?;
        }
        Ok(_) => {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            )));
        }
        Err(_) => {}
    }
    // Bound under a umask that leaves no bit for others, so there is no moment between bind
    // and chmod in which a loose umask lets any local user connect. (The umask is the
    // process's: a file another thread creates meanwhile is only made stricter.)
    let before = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o117));
    let bound = UnixListener::bind(path);
    rustix::process::umask(before);
    let l = bound.map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(err)?;
    Ok(l)
}

/// A listener systemd passed, made non-blocking for tokio.
fn from_std_unix(
    l: std::os::unix::net::UnixListener,
    path: &Path,
    what: &'static str,
) -> Result<UnixListener, ServeError> {
    l.set_nonblocking(true)
        .and_then(|()| UnixListener::from_std(l))
        .map_err(|source| ServeError::Socket {
            what,
            path: path.to_path_buf(),
            source,
        })
}

/// The executor opened, and the device's condition it reports.
///
/// # Errors
/// The executor's start error.
pub fn open(
    cfg: &Config,
) -> Result<(Opened, watch::Receiver<Condition>), crate::executor::StartError> {
    let (tx, rx) = DeviceHealth::new();
    let opened = Executor::start(cfg, tx)?;
    Ok((opened, rx))
}
