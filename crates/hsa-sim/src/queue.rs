//! The AIE queue: creation rules, the ring, and the read and write indexes.
//!
//! `hsa_queue_create` accepts exactly 64 packets (`INVALID_ARGUMENT` otherwise) of type
//! SINGLE (`INVALID_QUEUE_CREATION` for MULTI or COOPERATIVE), on the AIE agent only
//! (`INVALID_AGENT`). Several live queues are allowed: ROCR advertises `QUEUES_MAX` 1 but does
//! not enforce it for the AIE agent, and each queue is its own hardware context; the
//! system-wide context limit (6 on Phoenix, 16 on Strix) is not emulated.
//!
//! The ring is a 4 KiB memfd mapping, as ROCR allocates it from pool 0; it is not a
//! registered allocation, so it cannot be passed as a kernel argument. The write index is the
//! client's; the read index moves only inside a doorbell ([`crate::dispatch`]). The profile
//! (packet ABI, chains, failure reporting) is fixed when the queue is created, from the
//! runtime's configuration.

use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hsa_core::sys::{AIE_QUEUE_SIZE, Agent, Queue, QueueErrorCallback, QueueType, Signal, Status};

use crate::agents::AgentKind;
use crate::config::SimConfig;
use crate::counters::{Counter, bump};
use crate::memory::{Mapping, new_memfd};
use crate::runtime::{guard, guard_value, runtime};
use crate::signal::SignalObj;
use crate::status::{SimError, record};

/// Bytes in one packet slot.
pub(crate) const PACKET_SIZE: usize = 64;

/// The `hsa_queue_t` handed to the client; its address is the queue's identity.
#[derive(Debug)]
struct QueueDesc(Box<Queue>);

// SAFETY: the only pointer inside, `base_address`, points at the ring mapping owned by the same
// `QueueObj`; the descriptor is written once at creation and only read afterwards.
unsafe impl Send for QueueDesc {}
// SAFETY: as above: after creation nothing mutates the descriptor, so shared reads are sound.
unsafe impl Sync for QueueDesc {}

/// What the doorbell keeps between rings.
#[derive(Debug, Default)]
pub(crate) struct QueueState {
    /// Distinct PDI addresses loaded on this queue (the CU mask has 32 bits).
    pub pdis: Vec<u64>,
    /// Programs this queue has already identified and walked (see [`crate::rules`]).
    pub parsed: crate::rules::ParsedPrograms,
    /// The kernel-object runtime's hardware context and PDI cache.
    pub ko: crate::dispatch::kernel_object::KoQueueState,
    /// The mode of the last G2 batch on a runtime with full ELF: `Some(true)` full ELF,
    /// `Some(false)` PDI + insts, `None` before the first batch.
    pub g2_full_elf: Option<bool>,
    /// ROCm 7.0: the queue's hardware-context id (`queue_id_`; 0, ROCR's invalid handle,
    /// until a doorbell builds one, and again after a configuration that failed).
    pub rocm70_context: u32,
}

/// One live queue.
#[derive(Debug)]
pub(crate) struct QueueObj {
    desc: QueueDesc,
    ring: Mapping,
    _ring_fd: OwnedFd,
    pub config: SimConfig,
    pub read: AtomicU64,
    pub write: AtomicU64,
    pub suspended: AtomicBool,
    callback: Option<QueueErrorCallback>,
    callback_data: usize,
    pub doorbell: Signal,
    state: Mutex<QueueState>,
    /// The GEM handle of the ring's shared-memory BO (ROCR allocates the ring from the AIE
    /// agent's system region).
    ring_gem: u32,
}

impl QueueObj {
    /// The ring's base address.
    pub fn ring_base(&self) -> usize {
        self.ring.addr
    }

    /// Ring size in bytes.
    pub fn ring_len(&self) -> usize {
        self.ring.len
    }

    /// The doorbell's state; holding it serialises doorbell rings on this queue.
    pub fn state(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn desc_ptr(&self) -> *mut Queue {
        (&raw const *self.desc.0).cast_mut()
    }

    /// Reports a failed batch as the newest ROCR does: the queue's error callback, called
    /// from the ringing thread. Without a callback ROCR's default handler prints the error
    /// and aborts the process (`rocr-aie.md` §5.6), and so does the emulator.
    pub fn notify_error(&self, err: &SimError) {
        match self.callback {
            // SAFETY: the client passed this callback and its data to `hsa_queue_create` for
            // exactly this use; the queue pointer is live while `self` is.
            Some(cb) => unsafe {
                cb(
                    err.status,
                    self.desc_ptr(),
                    self.callback_data as *mut c_void,
                )
            },
            None => crate::dispatch::abort_process(
                self.config.profile,
                err,
                "the queue has no error callback, and ROCR's default queue error handler aborts",
            ),
        }
    }
}

fn create(
    agent: Agent,
    size: u32,
    type_: QueueType,
    callback: Option<QueueErrorCallback>,
    data: *mut c_void,
) -> Result<*mut Queue, SimError> {
    let rt = runtime().map_err(|st| SimError::new(st, "the runtime is not initialised"))?;
    // The order of ROCR's checks: arguments, the agent, the agent's queue type, then the
    // AIE agent's size range.
    if !size.is_power_of_two() || type_.0 > QueueType::COOPERATIVE.0 {
        return Err(SimError::new(
            Status::ERROR_INVALID_ARGUMENT,
            format!(
                "hsa_queue_create: size {size} is not a power of two or type {type_:?} is unknown"
            ),
        ));
    }
    match rt.agent_kind(agent) {
        Some(AgentKind::Aie) => {}
        Some(AgentKind::Cpu) => {
            return Err(SimError::new(
                Status::ERROR_INVALID_AGENT,
                "hsa_queue_create: the CPU agent has no queues; use the AIE agent",
            ));
        }
        None => {
            return Err(SimError::new(
                Status::ERROR_INVALID_AGENT,
                format!("hsa_queue_create: unknown agent {:#x}", agent.handle),
            ));
        }
    }
    if type_ != QueueType::SINGLE {
        return Err(SimError::new(
            Status::ERROR_INVALID_QUEUE_CREATION,
            format!("hsa_queue_create: type {type_:?}; the AIE agent supports only SINGLE queues"),
        ));
    }
    if size != AIE_QUEUE_SIZE {
        return Err(SimError::new(
            Status::ERROR_INVALID_ARGUMENT,
            format!(
                "hsa_queue_create: size {size}; the AIE queue has exactly {AIE_QUEUE_SIZE} packets"
            ),
        ));
    }
    let ring_len = AIE_QUEUE_SIZE as usize * PACKET_SIZE;
    let fd = new_memfd("hsa-sim-queue-ring", ring_len)?;
    // SAFETY: a fresh mapping at a kernel-chosen address.
    let ring = unsafe { Mapping::shared(&fd, 0, ring_len, None) }?;
    let doorbell_handle = crate::runtime::next_handle();
    let ring_gem = rt
        .memory()
        .gem
        .create(crate::memory::BoKind::Shmem, ring.addr as u64);
    let mut doorbell_obj = None;
    let q = Arc::new_cyclic(|weak| {
        doorbell_obj = Some(Arc::new(SignalObj::doorbell(weak.clone())));
        QueueObj {
            desc: QueueDesc(Box::new(Queue {
                type_: QueueType::SINGLE.0,
                features: 0,
                base_address: ring.addr as *mut c_void,
                doorbell_signal: Signal {
                    handle: doorbell_handle,
                },
                size: AIE_QUEUE_SIZE,
                reserved1: 0,
                id: doorbell_handle,
            })),
            ring,
            _ring_fd: fd,
            config: rt.config,
            read: AtomicU64::new(0),
            write: AtomicU64::new(0),
            suspended: AtomicBool::new(false),
            callback,
            callback_data: data as usize,
            doorbell: Signal {
                handle: doorbell_handle,
            },
            state: Mutex::new(QueueState::default()),
            ring_gem,
        }
    });
    if let Some(obj) = doorbell_obj {
        rt.signals().insert(doorbell_handle, obj);
    }
    let ptr = q.desc_ptr();
    rt.queues().insert(ptr as usize, q);
    Ok(ptr)
}

/// `hsa_queue_create`: a 64-packet SINGLE queue on the AIE agent. Under `rocr-newest`,
/// `callback` receives the status of a failed doorbell batch, and a queue without one aborts
/// the process on a failure; the older profiles never call it (see the crate docs). The
/// segment sizes are ignored.
///
/// # Safety
/// `queue` is null (the call fails) or valid for one pointer write; `callback`, if given, is
/// a valid function that may be called with `data` from any thread that rings the doorbell.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_queue_create(
    agent: Agent,
    size: u32,
    type_: QueueType,
    callback: Option<QueueErrorCallback>,
    data: *mut c_void,
    _private_segment_size: u32,
    _group_segment_size: u32,
    queue: *mut *mut Queue,
) -> Status {
    guard(|| {
        if let Err(st) = runtime() {
            return st;
        }
        if queue.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        match create(agent, size, type_, callback, data) {
            Ok(q) => {
                bump(Counter::QueuesCreated);
                // SAFETY: `queue` is non-null and valid for one pointer write by the contract.
                unsafe { queue.write(q) };
                Status::SUCCESS
            }
            Err(e) => {
                record(&e);
                e.status
            }
        }
    })
}

/// `hsa_queue_destroy`: frees the queue and its ring; unknown queues give `INVALID_QUEUE`.
///
/// # Safety
/// The caller must not use the queue, its ring or its doorbell afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_queue_destroy(queue: *mut Queue) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        let Some(q) = rt.queues().remove(&(queue as usize)) else {
            return Status::ERROR_INVALID_QUEUE;
        };
        rt.signals().remove(&q.doorbell.handle);
        if q.config.profile == crate::Profile::Rocm70 {
            // `AieAqlQueue::Inactivate`: DESTROY_HWCTX of the queue's context, if it has one.
            let ctx = q.state().rocm70_context;
            rt.rocm70().destroy_queue_context(ctx);
        }
        rt.memory().gem.close(q.ring_gem);
        bump(Counter::QueuesDestroyed);
        Status::SUCCESS
    })
}

/// The live queue behind a client's pointer.
pub(crate) fn lookup(queue: *const Queue) -> Option<Arc<QueueObj>> {
    let rt = runtime().ok()?;
    rt.queues().get(&(queue as usize)).cloned()
}

fn with_queue<T: Copy>(queue: *const Queue, default: T, f: impl FnOnce(&QueueObj) -> T) -> T {
    guard_value(default, || match lookup(queue) {
        Some(q) => f(&q),
        None => {
            record(&SimError::new(
                Status::ERROR_INVALID_QUEUE,
                format!("unknown queue {queue:p}"),
            ));
            default
        }
    })
}

macro_rules! index_fns {
    ($( $(#[$m:meta])* $name:ident($($arg:ident: $t:ty),*) -> $ret:ty = |$q:ident| $body:expr; )*) => {
        $(
            $(#[$m])*
            ///
            /// # Safety
            /// `queue` is any pointer; one that `hsa_queue_create` did not return is ignored
            /// (loads return 0).
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name(queue: *const Queue $(, $arg: $t)*) -> $ret {
                with_queue(queue, Default::default(), |$q| $body)
            }
        )*
    };
}

index_fns! {
    /// `hsa_queue_load_read_index_scacquire`.
    hsa_queue_load_read_index_scacquire() -> u64 = |q| q.read.load(Ordering::Acquire);
    /// `hsa_queue_load_read_index_relaxed`.
    hsa_queue_load_read_index_relaxed() -> u64 = |q| q.read.load(Ordering::Relaxed);
    /// `hsa_queue_load_write_index_relaxed`.
    hsa_queue_load_write_index_relaxed() -> u64 = |q| q.write.load(Ordering::Relaxed);
    /// `hsa_queue_load_write_index_scacquire`.
    hsa_queue_load_write_index_scacquire() -> u64 = |q| q.write.load(Ordering::Acquire);
    /// `hsa_queue_add_write_index_relaxed`: returns the previous index.
    hsa_queue_add_write_index_relaxed(v: u64) -> u64 = |q| q.write.fetch_add(v, Ordering::Relaxed);
    /// `hsa_queue_add_write_index_screlease`: returns the previous index.
    hsa_queue_add_write_index_screlease(v: u64) -> u64 = |q| q.write.fetch_add(v, Ordering::Release);
    /// `hsa_queue_add_write_index_scacquire`: returns the previous index.
    hsa_queue_add_write_index_scacquire(v: u64) -> u64 = |q| q.write.fetch_add(v, Ordering::Acquire);
    /// `hsa_queue_add_write_index_scacq_screl`: returns the previous index.
    hsa_queue_add_write_index_scacq_screl(v: u64) -> u64 = |q| q.write.fetch_add(v, Ordering::AcqRel);
    /// `hsa_queue_store_write_index_relaxed`.
    hsa_queue_store_write_index_relaxed(v: u64) -> () = |q| q.write.store(v, Ordering::Relaxed);
    /// `hsa_queue_store_write_index_screlease`.
    hsa_queue_store_write_index_screlease(v: u64) -> () = |q| q.write.store(v, Ordering::Release);
    /// `hsa_queue_cas_write_index_relaxed`: returns the value observed.
    hsa_queue_cas_write_index_relaxed(expected: u64, v: u64) -> u64 =
        |q| q.write.compare_exchange(expected, v, Ordering::Relaxed, Ordering::Relaxed).unwrap_or_else(|x| x);
    /// `hsa_queue_cas_write_index_screlease`: returns the value observed.
    hsa_queue_cas_write_index_screlease(expected: u64, v: u64) -> u64 =
        |q| q.write.compare_exchange(expected, v, Ordering::Release, Ordering::Relaxed).unwrap_or_else(|x| x);
    /// `hsa_queue_cas_write_index_scacquire`: returns the value observed.
    hsa_queue_cas_write_index_scacquire(expected: u64, v: u64) -> u64 =
        |q| q.write.compare_exchange(expected, v, Ordering::Acquire, Ordering::Acquire).unwrap_or_else(|x| x);
    /// `hsa_queue_cas_write_index_scacq_screl`: returns the value observed.
    hsa_queue_cas_write_index_scacq_screl(expected: u64, v: u64) -> u64 =
        |q| q.write.compare_exchange(expected, v, Ordering::AcqRel, Ordering::Acquire).unwrap_or_else(|x| x);
}

/// Whether the queue is suspended by a failed batch (tests and diagnostics).
pub fn is_suspended(queue: *const Queue) -> Option<bool> {
    lookup(queue).map(|q| q.suspended.load(Ordering::Acquire))
}
