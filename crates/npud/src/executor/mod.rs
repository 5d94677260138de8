//! The executor: one named thread that owns the `hsa_core::Device`.
//!
//! Handlers send it [`Command`]s over a bounded channel, each with a oneshot for the reply;
//! only opaque ids, bytes and validated program descriptions cross the channel.
//!
//! The executor does a bounded amount of work per turn, as firecracker's device loop does.
//! Dispatches, chains and tensor writes and reads go into per-session queues served round-robin
//! ([`sched`]), and each turn does at most one doorbell batch and at most
//! `executor.slice_bytes` of copying (WriteTensor and ReadTensor chunks, staging copies of
//! client memfds) before the next session's turn: a 1,024-link chain is 32 turns, a 16 MiB
//! chunk 16. The remaining control commands (allocate, import, export, free, info, unloads,
//! session releases) are small and run in arrival order between turns; allocation does not
//! touch the memory (hsa-core's tensors are fresh pages the kernel zeroed). A work item whose
//! deadline has passed when it reaches the front is answered DEADLINE_EXCEEDED without running.
//!
//! What the device holds and whether the thread is alive are published in [`shared`], so that
//! statistics and the systemd watchdog never wait behind work.
//!
//! On shutdown the executor finishes the work already queued, frees every tensor and program,
//! and drops the device (which releases the queue and the runtime).

mod cache;
mod copy;
mod idle;
mod sched;
mod shared;
mod tensors;
mod work;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hsa_core::{Device, DeviceInfo, HsaApi};
use npu_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::{Backend, Config};
use crate::error::NpudError;
use crate::faults::FaultBudget;
use crate::programs::{Program, Programs};
use crate::state_dir::InFlight;
use cache::ProgramCache;
use copy::CopyJob;
use idle::Idle;
use sched::RoundRobin;
use shared::Shared;
use tensors::Tensors;
use work::Running;

pub use work::{LinkFailure, LinkPrefix, WorkDone};

/// Commands queued at once before senders wait.
const CHANNEL_CAPACITY: usize = 1024;

type Reply<T> = oneshot::Sender<Result<T, NpudError>>;

/// One dispatch of a work item: a program checked out of the store for this session, and its
/// arguments as the client sent them.
#[derive(Debug)]
pub struct Link {
    pub program: Arc<Program>,
    pub args: Vec<pb::TensorArg>,
}

/// A dispatch or a chain, admitted at `admitted`.
#[derive(Debug)]
pub struct WorkItem {
    pub session: u64,
    /// The session's uid (`None` over TCP), charged for device faults.
    pub uid: Option<u32>,
    pub links: Vec<Link>,
    /// Chains name links in messages (`links[3].args[0]`); a single dispatch does not.
    pub chain: bool,
    pub admitted: Instant,
    pub deadline: Option<Instant>,
    pub reply: Reply<WorkDone>,
}

/// What the device holds now.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub heap_used: u64,
    pub programs_loaded: u32,
    /// (tensors, bytes) per session.
    pub usage: HashMap<u64, (u32, u64)>,
}

/// Everything the executor does.
#[derive(Debug)]
pub enum Command {
    Work(WorkItem),
    Allocate {
        session: u64,
        size: u64,
        name: String,
        /// The caller is on the Unix socket and will redeem an fd for the tensor.
        local: bool,
        reply: Reply<u64>,
    },
    DeclareImport {
        session: u64,
        size: u64,
        name: String,
        reply: Reply<u64>,
    },
    AttachImport {
        session: u64,
        tensor: u64,
        fd: OwnedFd,
        reply: Reply<()>,
    },
    /// Replies (fd, offset of the tensor in it, size).
    Export {
        session: u64,
        tensor: u64,
        reply: Reply<(OwnedFd, u64, u64)>,
    },
    Free {
        session: u64,
        tensor: u64,
        reply: Reply<()>,
    },
    Info {
        session: u64,
        tensor: u64,
        reply: Reply<pb::TensorInfo>,
    },
    /// The size of a tensor of `session` (to plan a read).
    Size {
        session: u64,
        tensor: u64,
        reply: Reply<u64>,
    },
    Write {
        session: u64,
        tensor: u64,
        offset: u64,
        data: Vec<u8>,
        reply: Reply<()>,
    },
    Read {
        session: u64,
        tensor: u64,
        offset: u64,
        len: u64,
        reply: Reply<Vec<u8>>,
    },
    /// The program store dropped a program: unload it and refuse it from now on.
    Unload {
        program: u64,
    },
    /// A session ended: answer its queued work UNAVAILABLE and free its tensors.
    ReleaseSession {
        session: u64,
        reply: oneshot::Sender<usize>,
    },
    /// Finish queued work, release the device, then reply.
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// What the device is, as opened.
#[derive(Debug, Clone)]
pub struct DeviceFacts {
    pub info: DeviceInfo,
    pub backend: Backend,
    /// The emulator's profile, when the runtime is hsa-sim (linked in or loaded).
    pub emulator_profile: Option<String>,
}

/// The profile hsa-sim names in its build version (`hsa-sim 0.1.0 (software AIE agent,
/// profile rocm-7.0)`), or `None` for any other runtime.
fn emulator_profile(build_version: Option<&str>) -> Option<String> {
    build_version
        .and_then(hsa_sim::profile_of_build_version)
        .map(|p| p.as_str().to_owned())
}

/// The handlers' side of the executor.
#[derive(Debug, Clone)]
pub struct ExecutorHandle {
    tx: mpsc::Sender<Command>,
    faults: Arc<AtomicU64>,
    budget: Arc<FaultBudget>,
    shared: Arc<Shared>,
}

impl ExecutorHandle {
    /// Sends a command.
    ///
    /// # Errors
    /// UNAVAILABLE when the executor has stopped.
    pub async fn send(&self, cmd: Command) -> Result<(), NpudError> {
        self.tx
            .send(cmd)
            .await
            .map_err(|_| NpudError::executor_gone())
    }

    /// Sends a command built around a fresh reply channel and waits for the reply.
    ///
    /// # Errors
    /// The command's error, or UNAVAILABLE when the executor has stopped.
    pub async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, NpudError> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx)).await?;
        rx.await.map_err(|_| NpudError::executor_gone())?
    }

    /// What the device holds, as the executor last published it (never waits for the
    /// executor).
    pub async fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// Whether the executor thread runs and is waiting for work or started its current turn
    /// less than `within` ago (the watchdog's liveness check; turns are bounded, so a longer
    /// one means the device or the thread is wedged).
    pub fn responsive(&self, within: Duration) -> bool {
        !self.tx.is_closed() && self.shared.responsive(within)
    }

    /// The device-fault budget every identity is charged against.
    pub fn fault_budget(&self) -> &Arc<FaultBudget> {
        &self.budget
    }

    /// Device faults since start.
    pub fn faults(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }
}

/// The running executor thread.
#[derive(Debug)]
pub struct Executor {
    handle: ExecutorHandle,
    thread: Option<JoinHandle<()>>,
}

/// An executor whose device is open, waiting for the program store.
#[derive(Debug)]
pub struct Opened {
    pub facts: DeviceFacts,
    setup: std::sync::mpsc::Sender<Setup>,
    handle: ExecutorHandle,
    thread: JoinHandle<()>,
}

/// Why the executor could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("opening the NPU through {backend}: {source}")]
    Open {
        backend: &'static str,
        source: hsa_core::HsaError,
    },
    #[error("starting the executor thread: {0}")]
    Thread(std::io::Error),
}

impl Executor {
    /// Starts the executor thread and opens the device on it.
    ///
    /// # Errors
    /// [`StartError`] with the runtime's own message when the device cannot be opened.
    pub fn start(cfg: &Config, serving: watch::Sender<bool>) -> Result<Opened, StartError> {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let (setup_tx, setup_rx) = std::sync::mpsc::channel::<Setup>();
        let cfg = cfg.clone();
        let faults = Arc::new(AtomicU64::new(0));
        let thread_faults = faults.clone();
        let budget = Arc::new(FaultBudget::from_limits(&cfg.limits));
        let thread_budget = budget.clone();
        let shared = Arc::new(Shared::default());
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("npud-executor".into())
            .spawn(move || {
                let backend = cfg.backend;
                let opened = open_device(&cfg);
                let dev = match opened {
                    Ok(dev) => {
                        let facts = DeviceFacts {
                            info: dev.info().clone(),
                            backend,
                            emulator_profile: emulator_profile(
                                dev.info().runtime_version.as_deref(),
                            ),
                        };
                        if opened_tx.send(Ok(facts)).is_err() {
                            return;
                        }
                        dev
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e));
                        return;
                    }
                };
                let Ok(Setup { programs, inflight }) = setup_rx.recv() else {
                    return;
                };
                let l = &cfg.limits;
                let worker = Worker {
                    dev,
                    tensors: Tensors::new(
                        l.max_tensors_per_session,
                        l.max_tensor_bytes_per_session,
                    ),
                    cache: ProgramCache::new(l.max_cached_programs as usize),
                    rr: RoundRobin::new(l.max_pending_per_session as usize),
                    programs,
                    serving,
                    faults: thread_faults,
                    budget: thread_budget,
                    shared: thread_shared,
                    usage_changed: true,
                    published: (u64::MAX, usize::MAX),
                    slice_bytes: usize::try_from(cfg.executor.slice_bytes).unwrap_or(usize::MAX),
                    suspended: None,
                    inflight,
                    idle: Idle::new(Duration::from_micros(cfg.executor.spin_us)),
                };
                worker.run(rx);
            })
            .map_err(StartError::Thread)?;
        let facts = match opened_rx.recv() {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(StartError::Thread(std::io::Error::other(
                    "the executor thread stopped while opening the device",
                )));
            }
        };
        Ok(Opened {
            facts,
            setup: setup_tx,
            handle: ExecutorHandle {
                tx,
                faults,
                budget,
                shared,
            },
            thread,
        })
    }

    pub fn handle(&self) -> ExecutorHandle {
        self.handle.clone()
    }

    /// Finishes queued work, releases the device and joins the thread, waiting at most
    /// `timeout` for the work.
    pub async fn shutdown(mut self, timeout: Duration) {
        let (tx, rx) = oneshot::channel();
        if self
            .handle
            .send(Command::Shutdown { reply: tx })
            .await
            .is_ok()
            && tokio::time::timeout(timeout, rx).await.is_err()
        {
            tracing::warn!("the executor did not finish its queued work in time");
            return;
        }
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// What the executor needs besides the device, handed over once it is open.
#[derive(Debug)]
struct Setup {
    programs: Arc<Programs>,
    inflight: Option<InFlight>,
}

impl Opened {
    /// Hands the executor its program store and its in-flight record (`None` without a state
    /// directory), and lets it start serving.
    pub fn run(self, programs: Arc<Programs>, inflight: Option<InFlight>) -> Executor {
        if self.setup.send(Setup { programs, inflight }).is_err() {
            tracing::error!("the executor thread stopped before it started serving");
        }
        Executor {
            handle: self.handle,
            thread: Some(self.thread),
        }
    }
}

fn open_device(cfg: &Config) -> Result<Device, StartError> {
    let api = match cfg.backend {
        Backend::Emulator => {
            let agent =
                hsa_sim::agent_from_name(&cfg.emulator.agent_name).unwrap_or(hsa_sim::NpuGen::Npu2);
            hsa_sim::set_config(hsa_sim::SimConfig {
                agent,
                profile: cfg.emulator_profile(),
                timeout: Duration::from_millis(cfg.emulator.timeout_ms),
            });
            Ok(HsaApi::from_static(hsa_sim::fns(), "hsa-sim (emulator)"))
        }
        Backend::Hsa => HsaApi::discover(cfg.library.as_deref()),
    };
    let backend = cfg.backend.as_str();
    let api = api.map_err(|source| StartError::Open { backend, source })?;
    Device::open(api, cfg.device_options()).map_err(|source| StartError::Open { backend, source })
}

/// The executor thread's state.
#[derive(Debug)]
struct Worker {
    dev: Device,
    tensors: Tensors,
    cache: ProgramCache,
    rr: RoundRobin<Job>,
    programs: Arc<Programs>,
    serving: watch::Sender<bool>,
    faults: Arc<AtomicU64>,
    budget: Arc<FaultBudget>,
    shared: Arc<Shared>,
    /// Whether tensor usage changed since the last publication.
    usage_changed: bool,
    /// (heap used, programs loaded) as last published.
    published: (u64, usize),
    /// `executor.slice_bytes`: the most bytes one turn copies.
    slice_bytes: usize,
    /// The job that had the last turn and has work left, until the commands that arrived
    /// during that turn have been queued.
    suspended: Option<(u64, Job)>,
    /// Which programs are on the device, for the next start if this process dies meanwhile.
    inflight: Option<InFlight>,
    idle: Idle,
}

/// What waits in a session's queue: a work item (maybe part done), or a copy.
#[derive(Debug)]
enum Job {
    Work(Box<Running>),
    Copy(CopyJob),
}

impl Job {
    fn refuse(self, e: NpudError) {
        match self {
            Job::Work(r) => {
                let _ = r.item.reply.send(Err(e));
            }
            Job::Copy(c) => c.refuse(e),
        }
    }
}

impl Worker {
    fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        let mut closed = false;
        loop {
            // Take every command that is already waiting, so control commands and newly
            // admitted work are seen between work items.
            while !closed {
                match rx.try_recv() {
                    Ok(Command::Shutdown { reply }) => shutdown = Some(reply),
                    Ok(cmd) => self.handle(cmd, shutdown.is_some()),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
                }
            }
            // The item that just had its turn goes behind the sessions whose work arrived
            // during that turn.
            if let Some((session, job)) = self.suspended.take() {
                self.rr.resume(session, job);
            }
            self.publish();
            if let Some((session, job)) = self.rr.pop() {
                self.shared.beat();
                self.idle.serving(session);
                let left = match job {
                    Job::Work(r) => self.work_turn(r).map(Job::Work),
                    Job::Copy(c) => self.copy_turn(c).map(Job::Copy),
                };
                self.suspended = left.map(|job| (session, job));
                continue;
            }
            if shutdown.is_some() || closed {
                break;
            }
            self.shared.idle();
            let next = self.idle.next(&mut rx);
            self.shared.beat();
            match next {
                Some(Command::Shutdown { reply }) => shutdown = Some(reply),
                Some(cmd) => self.handle(cmd, false),
                None => closed = true,
            }
        }
        self.release_all();
        drop(self);
        tracing::info!("released the NPU");
        if let Some(reply) = shutdown {
            let _ = reply.send(());
        }
    }

    fn handle(&mut self, cmd: Command, draining: bool) {
        if !matches!(
            cmd,
            Command::Work(_)
                | Command::Write { .. }
                | Command::Read { .. }
                | Command::Info { .. }
                | Command::Size { .. }
        ) {
            self.usage_changed = true;
        }
        let dev = &mut self.dev;
        let t = &mut self.tensors;
        match cmd {
            Command::Work(item) => {
                if draining {
                    let _ = item.reply.send(Err(NpudError::Unavailable(
                        "the daemon is shutting down".into(),
                    )));
                    return;
                }
                let session = item.session;
                if let Err(job) = self
                    .rr
                    .push(session, Job::Work(Box::new(Running::new(item))))
                {
                    job.refuse(NpudError::ResourceExhausted(
                        "the session already has limits.max_pending_per_session dispatches \
                         queued"
                            .into(),
                    ));
                }
            }
            Command::Allocate {
                session,
                size,
                name,
                local,
                reply,
            } => {
                let _ = reply.send(t.allocate(dev, session, size, name, local));
            }
            Command::DeclareImport {
                session,
                size,
                name,
                reply,
            } => {
                let _ = reply.send(t.declare_import(session, size, name));
            }
            Command::AttachImport {
                session,
                tensor,
                fd,
                reply,
            } => {
                let _ = reply.send(t.attach_import(dev, session, tensor, fd));
            }
            Command::Export {
                session,
                tensor,
                reply,
            } => {
                let _ = reply.send(t.export(dev, session, tensor));
            }
            Command::Free {
                session,
                tensor,
                reply,
            } => {
                let _ = reply.send(t.free(dev, session, tensor));
            }
            Command::Info {
                session,
                tensor,
                reply,
            } => {
                let _ = reply.send(t.info(session, tensor));
            }
            Command::Size {
                session,
                tensor,
                reply,
            } => {
                let _ = reply.send(t.size(session, tensor, "tensor_id"));
            }
            Command::Write {
                session,
                tensor,
                offset,
                data,
                reply,
            } => {
                let job = CopyJob::Write {
                    session,
                    tensor,
                    offset,
                    data,
                    done: 0,
                    reply,
                };
                self.rr.push_unbounded(job.session(), Job::Copy(job));
            }
            Command::Read {
                session,
                tensor,
                offset,
                len,
                reply,
            } => {
                let job = CopyJob::Read {
                    session,
                    tensor,
                    offset,
                    len,
                    out: Vec::new(),
                    reply,
                };
                self.rr.push_unbounded(job.session(), Job::Copy(job));
            }
            Command::Unload { program } => self.unload(program),
            Command::ReleaseSession { session, reply } => {
                let suspended = self
                    .suspended
                    .take_if(|(s, _)| *s == session)
                    .map(|(_, job)| job);
                for job in suspended.into_iter().chain(self.rr.take_session(session)) {
                    job.refuse(NpudError::Unavailable(
                        "the session ended before this work finished".into(),
                    ));
                }
                let freed = t.release_session(dev, session);
                self.budget.forget_session(session);
                let _ = reply.send(freed);
            }
            Command::Shutdown { reply } => {
                // Handled by the loop; answering here keeps the match total.
                let _ = reply.send(());
            }
        }
    }

    /// Publishes what the device holds when it changed since the last time.
    fn publish(&mut self) {
        let now = (self.dev.heap_used() as u64, self.cache.len());
        if !self.usage_changed && now == self.published {
            return;
        }
        self.shared.publish(Snapshot {
            heap_used: now.0,
            programs_loaded: u32::try_from(now.1).unwrap_or(u32::MAX),
            usage: self.tensors.all_usage(),
        });
        self.published = now;
        self.usage_changed = false;
    }

    fn unload(&mut self, program: u64) {
        if let Some(d) = self.cache.remove(program) {
            if let Err(e) = self.dev.unload_program(d) {
                tracing::warn!(program, error = %e, "unloading a program failed");
            }
            self.programs.set_loaded(program, false);
        }
    }

    fn release_all(&mut self) {
        self.tensors.clear(&mut self.dev);
        for (id, d) in self.cache.drain() {
            if let Err(e) = self.dev.unload_program(d) {
                tracing::warn!(program = id, error = %e, "unloading a program failed");
            }
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod profile_tests {
    use super::emulator_profile;

    #[test]
    fn the_emulator_profile_is_read_from_hsa_sims_build_version() {
        let v = "hsa-sim 0.1.0 (software AIE agent, profile rocm-7.0)";
        assert_eq!(emulator_profile(Some(v)).as_deref(), Some("rocm-7.0"));
        assert_eq!(
            emulator_profile(Some("hsa-sim 0.1.0 (software AIE agent)")),
            None
        );
        assert_eq!(emulator_profile(Some("1.18.0 profile x")), None);
        assert_eq!(emulator_profile(None), None);
    }
}
