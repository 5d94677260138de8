//! ROCm 7.0's doorbell, as ROCR 7.0's code does it (`release/rocm-rel-7.0` @ `64cf36de`,
//! `core/runtime/amd_aie_aql_queue.cpp` `AieAqlQueue::SubmitPackets` and
//! `core/driver/xdna/amd_xdna_driver.cpp` `XdnaDriver::SubmitCmdChain`, `ConfigHwCtx`,
//! `ExecCmdAndWait`), over the amdxdna driver's rules as the driver model has them.
//!
//! **The PDI cache.** ROCR keeps, for the life of the runtime, `hw_ctx_pdi_cache_map`: a map
//! from a hardware-context id to a list of PDI **BO handles** (at most 32, in CU order). A
//! doorbell takes every packet from the read index to the write index as one chain and:
//! 1. copies the entry of the queue's current context id (`queue_id_`, 0 for a queue that has
//!    none) or starts from an empty list;
//! 2. per packet (`PrepareBOs`): finds the BO of the instruction stream and of every operand
//!    by address (any address inside a buffer; not a driver buffer: the doorbell returns an
//!    error before any ioctl, which ROCR only `assert`s, so the batch is dropped), writes the
//!    instruction address's device translation into the payload in place, creates a command
//!    BO, finds the PDI's BO, and takes its index in the list, or appends it (a 33rd: error)
//!    and marks the context for reconfiguration;
//! 3. on a miss (`ConfigHwCtx`): erases the entry of the current id, destroys that context,
//!    creates a new one (ids cyclic over 1..255, as `xa_alloc_cyclic`), configures it with
//!    the whole list (`CONFIG_CU` takes only `AMDXDNA_BO_DEV` handles: any other, or a closed
//!    one, is `EINVAL`, the new context stays allocated and the queue is left with id 0), and
//!    stores the list under the **old** id; on a hit it configures nothing;
//! 4. creates the chain BO and submits to the queue's context: id 0 is `INVALID_QUEUE`
//!    (dropped); otherwise each command runs the PDI its CU index names *in the context*,
//!    which after a hit on a stale entry may be another program's: another kernel runs;
//! 5. waits once, 50 ms (`WAIT_CMD`); the commands' ERT states (an error, the aborted rest of
//!    the chain) are never read back;
//! 6. closes every command BO, and the read index moves to the write index whatever happened.
//!
//! GEM handles are the lowest free ([`crate::memory::GemHandles`]): a PDI loaded after another
//! was freed usually gets its handle, which an old entry still lists. Entries survive
//! `hsa_queue_destroy`; only `hsa_shut_down` drops them (the map lives in the [`Runtime`]).
//! Consequences, each as seen over the driver model with the real ROCR 7.0: a later queue's
//! first doorbell whose PDI handles are all under key 0 is dropped; a miss under key 0
//! configures stale handles (refused, and dropped, when one now names a shared or command
//! buffer); after 255 contexts a stale entry hits and another program's kernel runs.
//!
//! `HSA_SIM_COMMAND_DELAY_MS` (read at each doorbell) makes every command take at least that
//! long, for a correct kernel slower than the 50 ms wait or a loaded host.
//!
//! Not modelled: vmem handles take no GEM handle (ROCR 7.0 creates a BO for one; hsa-core
//! creates and releases its probe handle before any PDI exists).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hsa_core::sys::Status;

use crate::counters::{Counter, bump};
use crate::dispatch::decode::{self, Command};
use crate::memory::BoKind;
use crate::profile::ROCM_7_0_WAIT;
use crate::queue::{QueueObj, QueueState};
use crate::rules;
use crate::runtime::Runtime;
use crate::status::SimError;

/// The driver's highest hardware-context id (`MAX_HWCTX_ID`); ids run 1..=255.
pub(crate) const MAX_HWCTX_ID: u32 = 255;
/// Entries of one PDI cache list (the CU mask's 32 bits).
const PDI_CACHE_SLOTS: usize = 32;

/// A CU of a live context: the PDI BO `CONFIG_CU` was given, as it was then.
#[derive(Clone, Copy, Debug)]
struct Cu {
    handle: u32,
    serial: u64,
}

/// ROCR 7.0's agent-wide PDI cache and the driver's hardware contexts.
#[derive(Debug)]
pub(crate) struct AgentContexts {
    /// `hw_ctx_pdi_cache_map`: context id → PDI BO handles in CU order.
    cache: HashMap<u32, Vec<u32>>,
    /// The driver's live contexts: id → the CUs configured on it.
    contexts: BTreeMap<u32, Vec<Cu>>,
    /// `xa_alloc_cyclic`'s next id to try.
    next_id: u32,
}

impl Default for AgentContexts {
    fn default() -> Self {
        Self {
            cache: HashMap::new(),
            contexts: BTreeMap::new(),
            next_id: 1,
        }
    }
}

impl AgentContexts {
    /// `CREATE_HWCTX`: the next free id at or after the cursor, wrapping over 1..=255.
    fn create_context(&mut self) -> Option<u32> {
        for i in 0..MAX_HWCTX_ID {
            let id = (self.next_id - 1 + i) % MAX_HWCTX_ID + 1;
            if let std::collections::btree_map::Entry::Vacant(e) = self.contexts.entry(id) {
                e.insert(Vec::new());
                self.next_id = id % MAX_HWCTX_ID + 1;
                bump(Counter::HwContextBuilds);
                crate::timing::context();
                return Some(id);
            }
        }
        None
    }

    /// `hsa_queue_destroy`'s `DESTROY_HWCTX` of the queue's context (nothing for id 0). The
    /// cache keeps every entry.
    pub(crate) fn destroy_queue_context(&mut self, id: u32) {
        if id != 0 {
            self.contexts.remove(&id);
        }
    }
}

/// A batch ROCR submits nowhere or gives up on, with the status the emulator's rules give that
/// failure on every profile (ROCm 7.0 reports nothing; the status and detail go to the
/// emulator's last error and log only).
fn dropped(index: u64, status: Status, why: String) -> SimError {
    SimError::new(
        status,
        format!(
            "packet {index}: {why}; ROCm 7.0 only asserts, so the read index advanced as if the batch ran"
        ),
    )
}

/// One doorbell of a ROCm 7.0 queue: packets `rd..wr` as one chain.
///
/// # Errors
/// Whatever stopped the chain (a buffer that is no driver BO, a 33rd PDI, a refused
/// `CONFIG_CU`, no context, a command the device failed, a wait past 50 ms); the caller reports
/// it silently, as ROCm 7.0 does.
pub(crate) fn doorbell(
    rt: &Runtime,
    q: &QueueObj,
    state: &mut QueueState,
    rd: u64,
    wr: u64,
) -> Result<(), SimError> {
    let at = |index: u64| {
        move |e: SimError| SimError::new(e.status, format!("packet {index}: {}", e.detail))
    };
    let mut cmds = Vec::new();
    for index in rd..wr {
        cmds.push(decode::decode(rt, q, index).map_err(at(index))?);
    }
    let mut cmd_bos = Vec::new();
    let result = submit(rt, q, state, rd, &cmds, &mut cmd_bos);
    // The scope guards: every command BO of the doorbell is closed, whatever happened.
    let mut mem = rt.memory();
    for h in cmd_bos {
        mem.gem.close(h);
    }
    drop(mem);
    if result.is_ok() {
        q.read.store(wr, Ordering::Release);
    }
    result
}

fn submit(
    rt: &Runtime,
    q: &QueueObj,
    state: &mut QueueState,
    rd: u64,
    cmds: &[Command],
    cmd_bos: &mut Vec<u32>,
) -> Result<(), SimError> {
    let key = state.rocm70_context;
    let mut list = rt.rocm70().cache.get(&key).cloned().unwrap_or_default();
    let mut reconfigure = false;
    let mut cus = Vec::with_capacity(cmds.len());
    for (index, cmd) in (rd..).zip(cmds) {
        {
            let mem = rt.memory();
            if mem.gem_of(cmd.insts).is_none() {
                return Err(dropped(
                    index,
                    Status::ERROR_INVALID_ALLOCATION,
                    format!(
                        "the instruction buffer address {:#x} is in no driver buffer (FindBOHandle); \
                         a payload submitted a second time names the device address ROCR \
                         wrote into it the first time",
                        cmd.insts
                    ),
                ));
            }
            for (i, &(addr, size)) in cmd.args.iter().enumerate() {
                rules::kernel_buffer(&mem, format_args!("argument {i}"), addr, size)
                    .map_err(|e| dropped(index, e.status, e.detail))?;
                if mem.gem_of(addr).is_none() {
                    return Err(dropped(
                        index,
                        Status::ERROR_INVALID_ALLOCATION,
                        format!("argument {i} at {addr:#x} is in no driver buffer (FindBOHandle)"),
                    ));
                }
            }
        }
        decode::translate_in_place(rt, q, index);
        let mut mem = rt.memory();
        cmd_bos.push(mem.gem.create(BoKind::Cmd, 0));
        let pdi = mem.gem_of(cmd.pdi).ok_or_else(|| {
            SimError::new(
                Status::ERROR_INVALID_ALLOCATION,
                format!(
                    "packet {index}: the PDI at {:#x} is in no driver buffer",
                    cmd.pdi
                ),
            )
        })?;
        let slot = match list.iter().position(|&h| h == pdi) {
            Some(i) => i,
            None => {
                if list.len() == PDI_CACHE_SLOTS {
                    return Err(SimError::new(
                        Status::ERROR_OUT_OF_RESOURCES,
                        format!(
                            "packet {index}: the PDI cache entry of context {key} already lists \
                             {PDI_CACHE_SLOTS} PDI handles"
                        ),
                    ));
                }
                list.push(pdi);
                reconfigure = true;
                list.len() - 1
            }
        };
        cus.push(slot);
    }
    if reconfigure {
        configure(rt, state, key, list).map_err(|why| dropped(rd, Status::ERROR, why))?;
    } else {
        bump(Counter::Rocm70CacheHits);
    }
    cmd_bos.push(rt.memory().gem.create(BoKind::Cmd, 0));
    let ctx = state.rocm70_context;
    if ctx == 0 {
        return Err(dropped(
            rd,
            Status::ERROR,
            format!(
                "every PDI handle of the batch is in the cache entry under key 0, which an \
                 earlier queue left: no hardware context was created and EXEC_CMD was not \
                 issued (HSA_STATUS_ERROR_INVALID_QUEUE); nothing ran ({} packets)",
                cmds.len()
            ),
        ));
    }
    bump(Counter::ChainSubmissions);
    crate::timing::chain();
    let delay = command_delay();
    let started = Instant::now();
    let configured = rt.rocm70().contexts.get(&ctx).cloned().unwrap_or_default();
    for (index, (cmd, &cu)) in (rd..).zip(cmds.iter().zip(&cus)) {
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let bo = configured.get(cu).and_then(|c| {
            rt.memory()
                .gem
                .get(c.handle)
                .filter(|bo| bo.serial == c.serial && bo.kind == BoKind::Dev)
        });
        let Some(bo) = bo else {
            // The command's ERT state is ERROR and the rest of the chain ABORT; ROCR never
            // reads them back.
            return Err(dropped(
                index,
                Status::ERROR,
                format!(
                    "the command selects CU {cu} of context {ctx}, which has {} CUs or whose PDI \
                     buffer was closed since CONFIG_CU: the device failed the command \
                     (ERT_STATE_ERROR, never read back)",
                    configured.len()
                ),
            ));
        };
        if bo.base != cmd.pdi {
            tracing::debug!(
                "hsa-sim (rocm-7.0): packet {index} names the PDI at {:#x}, but CU {cu} of \
                 context {ctx} is configured with the PDI at {:#x}: that kernel runs",
                cmd.pdi,
                bo.base
            );
        }
        let run = Command {
            pdi: bo.base,
            insts: cmd.insts,
            insts_size: cmd.insts_size,
            args: cmd.args.clone(),
            completion: None,
            pdi_patch_offset: 0,
        };
        rules::execute(rt, q, state, &run).map_err(|e| {
            dropped(
                index,
                e.status,
                format!(
                    "the device failed the command ({}; ERT_STATE_ERROR, and the rest of the \
                     chain ABORT, never read back)",
                    e.detail
                ),
            )
        })?;
        bump(Counter::PacketsCompleted);
        crate::timing::command();
    }
    let took = started.elapsed();
    if took > ROCM_7_0_WAIT {
        return Err(dropped(
            rd,
            Status::ERROR,
            format!(
                "the chain took {} ms: WAIT_CMD gave up after {} ms (the commands ran; ROCR \
                 cannot tell)",
                took.as_millis(),
                ROCM_7_0_WAIT.as_millis()
            ),
        ));
    }
    Ok(())
}

/// `ConfigHwCtx` after a miss: replaces the queue's context with a new one configured with
/// `list`, and stores `list` under the old id `key`.
///
/// # Errors
/// What the driver refused, as a sentence: no free context id, or a `CONFIG_CU` handle that
/// is closed or not a DEV BO (the new context then stays allocated and the queue has id 0).
fn configure(rt: &Runtime, state: &mut QueueState, key: u32, list: Vec<u32>) -> Result<(), String> {
    let mut ctxs = rt.rocm70();
    ctxs.cache.remove(&key);
    if key != 0 {
        ctxs.contexts.remove(&key);
        state.rocm70_context = 0;
    }
    let id = ctxs.create_context().ok_or_else(|| {
        format!("CREATE_HWCTX failed: all {MAX_HWCTX_ID} hardware-context ids are in use")
    })?;
    let mem = rt.memory();
    let mut cus = Vec::with_capacity(list.len());
    for (i, &h) in list.iter().enumerate() {
        match mem.gem.get(h) {
            Some(bo) if bo.kind == BoKind::Dev => cus.push(Cu {
                handle: h,
                serial: bo.serial,
            }),
            other => {
                return Err(format!(
                    "CONFIG_CU of context {id} failed with EINVAL: cu[{i}] names BO handle {h}, \
                     {} (aie2_config_cu: Invalid BO type: the PDI is not in the device heap); \
                     the list came from the cache entry under key {key}",
                    match other {
                        Some(bo) => format!("a {:?} buffer", bo.kind),
                        None => "closed".to_owned(),
                    }
                ));
            }
        }
    }
    ctxs.contexts.insert(id, cus);
    state.rocm70_context = id;
    ctxs.cache.insert(key, list);
    Ok(())
}

/// `HSA_SIM_COMMAND_DELAY_MS`: how long every command takes at least (0 when unset).
fn command_delay() -> Duration {
    std::env::var("HSA_SIM_COMMAND_DELAY_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
}
