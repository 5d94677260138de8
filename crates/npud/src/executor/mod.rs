//! The executor: one named thread that owns the `hsa_core::Device`.
//!
//! Handlers send it [`Command`]s over a bounded channel, each with a oneshot for the reply;
//! only opaque ids, bytes and validated program descriptions cross the channel.
//!
//! The executor does a bounded amount of work per turn, as firecracker's device loop does.
//! Dispatches, chains, tensor writes and reads and session releases go into per-session queues
//! served in fair turns, each session charged the time its turns take ([`sched`]), and each turn does at most one doorbell batch, the checks of
//! at most 256 links, at most one program load and [`loads::MAX_EVICTIONS_PER_TURN`] evictions
//! ([`loads`]), and at most `executor.slice_bytes` of copying (WriteTensor and ReadTensor
//! chunks, staging copies of client memfds) or of freeing an ended session's tensors (at least
//! one tensor) before the next session's turn: a 1,024-link chain is 4 turns of checks then 32
//! of doorbell batches, a 16 MiB chunk 16 turns, a chain of eight programs not yet loaded eight
//! turns before its first doorbell. Queued single dispatches of several sessions ring together,
//! one doorbell batch a turn, taken in fair order (`merge.rs`). The remaining control
//! commands (allocate, import, export, free of one tensor, info, unloads) are small and run in
//! arrival order between turns; allocation does not touch the memory (hsa-core's tensors are
//! fresh pages the kernel zeroed). A work item whose
//! deadline has passed when it reaches the front is answered DEADLINE_EXCEEDED without running.
//!
//! What the device holds and whether the thread is alive are published in [`shared`], so that
//! statistics and the systemd watchdog never wait behind work.
//!
//! On shutdown the executor finishes the work already queued, frees every tensor and program,
//! and drops the device (which releases the queue and the runtime).

mod cache;
mod classes;
mod copy;
mod idle;
mod loads;
mod merge;
mod ports;
mod sched;
mod shared;
mod tensors;
mod work;
mod worker;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hsa_core::{Device, DeviceInfo, HsaApi};
use npu_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};

use crate::config::{Backend, Config};
use crate::error::NpudError;
use crate::faults::FaultBudget;
use crate::health::DeviceHealth;
use crate::programs::{Program, Programs};
use crate::state_dir::InFlight;
use cache::ProgramCache;
use idle::Idle;
use sched::FairTurns;
use shared::Shared;
use tensors::Tensors;
use worker::Worker;

pub use ports::{Intake, Polled};
pub use work::{LinkFailure, LinkPrefix, WorkDone};

/// What the runtime behind `info` cannot report, and what npud does about it, for
/// `DeviceInfo.runtime_notes` and `npuctl status`; empty where there is nothing to say.
pub fn runtime_notes(info: &DeviceInfo) -> String {
    if info.packet_abi != hsa_core::PacketAbi::G1a {
        return String::new();
    }
    let scheme = if info.g1a_runtime_per_queue {
        "every queue (64 packets at most) gets a runtime of its own, so that ROCR 7.0's \
         agent-wide PDI cache can never drop a dispatch or run another program's kernel: the \
         runtime is shut down and initialised again every 64 dispatches (every program and \
         tensor copied back; the descriptor of /dev/accel ROCR leaves open each time is \
         closed once that runtime is down), and every \
         doorbell builds a new hardware context"
    } else {
        "rocm70_runtime_per_queue = false accepts the risk: queues are recreated in one \
         runtime, and ROCR 7.0's PDI cache then drops dispatches or runs another program's \
         kernel while npud reports them done"
    };
    format!(
        "ROCR 7.0 reads no command state back: a fault inside a batch (a link the device \
         failed) is not seen, and that dispatch is reported done; a doorbell past its 50 ms \
         command wait is answered UNKNOWN \"outcome unknown\" (not a device fault: nothing \
         is quarantined or charged). {scheme}. Install a newer ROCR (rocm-systems develop \
         from May 2026, or a TheRock nightly: pip install --index-url \
         https://rocm.nightlies.amd.com/whl-multi-arch/ rocm)"
    )
}

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
    /// The identity that opened the session, charged for device faults.
    pub who: crate::faults::Charged,
    /// Its session's class and deadline (see `classes`).
    pub priority: crate::priority::Priority,
    pub links: Vec<Link>,
    /// Chains name links in messages (`links[3].args[0]`); a single dispatch does not.
    pub chain: bool,
    pub admitted: Instant,
    pub deadline: Option<Instant>,
    /// Admitted from a `Submit` stream, whose window already bounds what it has queued: it
    /// waits behind the session's queue instead of being refused when unary calls filled it,
    /// so that a flow-controlled stream never sees RESOURCE_EXHAUSTED for a full queue.
    pub flow_controlled: bool,
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
        /// The session's rule's tensor-byte quota, when it is below the limit's.
        cap: Option<crate::auth::Quota<u64>>,
        /// The caller is on the Unix socket and will redeem an fd for the tensor.
        local: bool,
        reply: Reply<u64>,
    },
    DeclareImport {
        session: u64,
        size: u64,
        name: String,
        cap: Option<crate::auth::Quota<u64>>,
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
    /// A session ended: answer its queued work UNAVAILABLE and free its tensors (in turns of
    /// `executor.slice_bytes`); the reply is how many, once all are freed.
    ReleaseSession {
        session: u64,
        reply: oneshot::Sender<usize>,
    },
    /// Poll this session's dispatch ring from now on ([`ports`]).
    AttachIntake(Box<dyn Intake>),
    /// A ring's client rang while the executor may be blocked: poll the rings.
    Nudge,
    /// What each of `sessions` has been charged in the fair turns, ns (tests read the charges
    /// the device's time was booked to).
    #[cfg(test)]
    Charges {
        sessions: Vec<u64>,
        reply: oneshot::Sender<Vec<u64>>,
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
    /// The linked-in emulator takes the timing model's device time (`emulator.timing`).
    pub device_time_modelled: bool,
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
    /// A [`Command::Nudge`] is queued (nudges coalesce into one).
    nudged: Arc<AtomicBool>,
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

    /// Wakes the executor to poll the dispatch rings (a ring's bell rang). At most one nudge
    /// waits in the channel; a full channel means the executor is awake and polls anyway.
    pub fn nudge(&self) {
        if !self.nudged.swap(true, Ordering::AcqRel) && self.tx.try_send(Command::Nudge).is_err() {
            self.nudged.store(false, Ordering::Release);
        }
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

    /// [`ExecutorHandle::snapshot`] for code that cannot await (a metrics scrape).
    pub fn snapshot_now(&self) -> Snapshot {
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
    pub fn start(cfg: &Config, serving: DeviceHealth) -> Result<Opened, StartError> {
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
        let nudged = Arc::new(AtomicBool::new(false));
        let thread_nudged = nudged.clone();
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
                            device_time_modelled: backend == Backend::Emulator
                                && cfg.emulator_timing() == hsa_sim::timing::Timing::Model,
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
                        crate::budget::MemoryBudget::new(l),
                    ),
                    cache: ProgramCache::new(l.max_cached_programs as usize),
                    rr: FairTurns::new(l.max_pending_per_session as usize),
                    programs,
                    serving,
                    faults: thread_faults,
                    budget: thread_budget,
                    shared: thread_shared,
                    usage_changed: true,
                    published: (u64::MAX, usize::MAX),
                    slice_bytes: usize::try_from(cfg.executor.slice_bytes).unwrap_or(usize::MAX),
                    batch_across_sessions: cfg.executor.batch_across_sessions,
                    interactive_weight: cfg.executor.interactive_weight,
                    interactive: classes::Interactive::new(Duration::from_millis(
                        cfg.executor.interactive_idle_ms,
                    )),
                    recovering: None,
                    turn_debtor: None,
                    suspended: None,
                    merged_charges: Vec::new(),
                    inflight,
                    idle: Idle::new(Duration::from_micros(cfg.executor.spin_us)),
                    loader: None,
                    turn: loads::TurnLoads::default(),
                    turn_started: Instant::now(),
                    busy_since: None,
                    ports: ports::Ports::default(),
                    nudged: thread_nudged,
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
                nudged,
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
                timing: cfg.emulator_timing(),
            });
            Ok(hsa_sim::api("hsa-sim (emulator)"))
        }
        Backend::Hsa => HsaApi::discover(cfg.library.as_deref()),
    };
    let backend = cfg.backend.as_str();
    let api = api.map_err(|source| StartError::Open { backend, source })?;
    Device::open(api, cfg.device_options()).map_err(|source| StartError::Open { backend, source })
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
