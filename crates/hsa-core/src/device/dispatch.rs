//! Dispatches and chains: enqueue packets, ring the doorbell, wait, and recover the queue
//! after a failure.
//!
//! A chain is split into doorbell batches. G1 and early G2 runtimes submit a whole batch as one
//! firmware command chain and do not split it, so a batch must fit the driver's 4 KiB chain
//! buffer at the cost of its largest command ([`PacketAbi::commands_per_doorbell`]), and
//! never holds more than [`crate::sys::MAX_PACKETS_PER_DOORBELL`] packets. Each batch arms the
//! completion signal to its length; the doorbell store returns when the batch has finished, so
//! the wait after it is a formality.

use std::collections::HashSet;
use std::ops::Range;
use std::time::{Duration, Instant};

use npu_artifacts::hsaco::KernelKind;

use super::encode::{self, Packet, PacketAbi, PacketDesc};
use super::program::Code;
use super::resource::{PoolAlloc, QueueOwner};
use super::{Device, ProgramId, QueueState, SIDE_SLOT, TensorId};
use crate::error::HsaError;
use crate::sys::{
    AIE_QUEUE_SIZE, CHAIN_BUFFER_BYTES, MAX_PDIS_PER_QUEUE, SignalCondition, WaitState,
};

/// One buffer argument: a byte range of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arg {
    pub tensor: TensorId,
    pub offset: u64,
    /// Bytes from `offset`; `None` means to the end of the tensor.
    pub len: Option<u64>,
}

impl Arg {
    /// The whole tensor.
    pub fn whole(tensor: TensorId) -> Self {
        Self {
            tensor,
            offset: 0,
            len: None,
        }
    }
}

impl From<TensorId> for Arg {
    fn from(t: TensorId) -> Self {
        Self::whole(t)
    }
}

/// One program run with its buffer arguments, in design order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    pub program: ProgramId,
    pub args: Vec<Arg>,
}

impl Dispatch {
    pub fn new(program: ProgramId, args: impl IntoIterator<Item = impl Into<Arg>>) -> Self {
        Self {
            program,
            args: args.into_iter().map(Into::into).collect(),
        }
    }
}

/// What a chain cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChainReport {
    /// Time from the first packet's enqueue to the last completion.
    pub device_time: Duration,
    /// Doorbell rings.
    pub doorbells: u32,
    /// Queues recreated along the way (G1a's ring, the 32-PDI cache, or an earlier failure).
    pub queue_recreations: u32,
    /// Of those, the ones that came with a fresh runtime (G1a, one runtime per queue).
    pub runtime_renewals: u32,
}

/// A chain that stopped: links `0..index` completed, link `index` failed, and links after it
/// did not run.
#[derive(Debug, thiserror::Error)]
#[error("link {index} of the chain failed: {error}")]
pub struct ChainError {
    pub index: usize,
    pub error: HsaError,
    /// What the chain cost up to the failure (all zero when a link was refused before anything
    /// was enqueued).
    pub report: ChainReport,
}

impl Device {
    /// Runs one program.
    ///
    /// # Errors
    /// As [`Device::run_chain`], without the link index.
    pub fn dispatch(&mut self, d: &Dispatch) -> Result<ChainReport, HsaError> {
        self.run_chain(std::slice::from_ref(d)).map_err(|e| e.error)
    }

    /// Runs `links` in order on the queue.
    ///
    /// Every link is checked (known program and tensors, ranges inside their tensors) before
    /// anything is enqueued. After a device failure the queue is left suspended, as the runtime
    /// leaves it: [`Device::recover`] recreates it, or the next call does.
    ///
    /// # Errors
    /// [`ChainError`] with the index of the link that was refused or failed.
    pub fn run_chain(&mut self, links: &[Dispatch]) -> Result<ChainReport, ChainError> {
        let descs: Vec<PacketDesc> = links
            .iter()
            .enumerate()
            .map(|(index, l)| {
                self.describe(l).map_err(|error| ChainError {
                    index,
                    error,
                    report: ChainReport::default(),
                })
            })
            .collect::<Result<_, _>>()?;
        let batches =
            doorbell_batches(self.info.packet_abi, &descs).map_err(|(index, error)| {
                ChainError {
                    index,
                    error,
                    report: ChainReport::default(),
                }
            })?;
        let mut report = ChainReport::default();
        let start = Instant::now();
        for range in batches {
            let first = range.start;
            if let Err(error) = self.prepare_queue(&descs[range.clone()], &mut report) {
                report.device_time = start.elapsed();
                return Err(ChainError {
                    index: first,
                    error,
                    report,
                });
            }
            // A fresh runtime (for this batch or an earlier one) placed every program and
            // tensor anew: describe the batch again.
            let renewed;
            let batch = if report.runtime_renewals == 0 {
                &descs[range]
            } else {
                renewed = links[range]
                    .iter()
                    .zip(first..)
                    .map(|(l, index)| {
                        self.describe(l).map_err(|error| ChainError {
                            index,
                            error,
                            report,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                &renewed[..]
            };
            let fresh = match self.fresh_first_pdi(batch) {
                Ok(f) => f,
                Err(error) => {
                    report.device_time = start.elapsed();
                    return Err(ChainError {
                        index: first,
                        error,
                        report,
                    });
                }
            };
            let mut rang = false;
            let result = match &fresh {
                Some((_, copied)) => self.run_batch(copied, &mut rang),
                None => self.run_batch(batch, &mut rang),
            };
            if let Some((copy, _)) = fresh
                && rang
            {
                // The copy stays allocated, so that no later buffer takes its BO handle, until
                // the next queue's first doorbell has named a newer one. A batch that failed
                // before its doorbell named nothing: the runtime's cache still names the copy
                // kept before, which must stay, and this one is freed.
                self.first_batch_pdi = Some(copy);
            }
            if let Err((k, error)) = result {
                if rang {
                    report.doorbells += 1;
                }
                self.mark_queue_failed();
                report.device_time = start.elapsed();
                return Err(ChainError {
                    index: first + k,
                    error,
                    report,
                });
            }
            report.doorbells += 1;
        }
        report.device_time = start.elapsed();
        Ok(report)
    }

    /// How `links` would be rung: the number of links in each doorbell batch, in order.
    ///
    /// # Errors
    /// [`ChainError`] for a link whose one command does not fit the driver's chain buffer.
    pub fn doorbell_plan(&self, links: &[Dispatch]) -> Result<Vec<usize>, ChainError> {
        let counts: Vec<Cost> = links
            .iter()
            .map(|l| Cost {
                args: l.args.len(),
                full_elf: self.programs.get(&l.program).is_some_and(|p| {
                    matches!(
                        p.code,
                        Code::Loaded {
                            kind: KernelKind::FullElf,
                            ..
                        } | Code::G2FullElf { .. }
                    )
                }),
            })
            .collect();
        plan(self.info.packet_abi, &counts)
            .map(|v| v.into_iter().map(|r| r.len()).collect())
            .map_err(|(index, error)| ChainError {
                index,
                error,
                report: ChainReport::default(),
            })
    }

    fn describe(&self, d: &Dispatch) -> Result<PacketDesc, HsaError> {
        let p = self
            .programs
            .get(&d.program)
            .ok_or(HsaError::UnknownHandle {
                kind: "program",
                id: d.program.0,
            })?;
        let args = d
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let t = self.tensor(a.tensor)?;
                let size = t.size as u64;
                let len = a.len.unwrap_or(size.saturating_sub(a.offset));
                match a.offset.checked_add(len) {
                    Some(end) if end <= size && len > 0 => Ok((t.ptr() as u64 + a.offset, len)),
                    _ => Err(HsaError::InvalidArgument(format!(
                        "argument {i}: bytes {}..{} are outside tensor {} of {size} bytes",
                        a.offset,
                        a.offset.saturating_add(len),
                        a.tensor.0
                    ))),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(match &p.code {
            Code::Heap {
                pdi,
                pdi_len,
                insts,
                insts_len,
            } => PacketDesc {
                pdi: pdi.addr(),
                pdi_len: *pdi_len,
                insts: insts.addr(),
                insts_size: *insts_len as u64,
                args,
                ..PacketDesc::default()
            },
            Code::Loaded { kernel, kind } => {
                let full_elf = *kind == KernelKind::FullElf;
                PacketDesc {
                    // The runtime caches one PDI per loaded PdiInsts kernel; FullElf PDIs are
                    // listed per command, not cached.
                    pdi: if full_elf { 0 } else { kernel.kernel_object },
                    kernel_object: kernel.kernel_object,
                    full_elf,
                    args,
                    ..PacketDesc::default()
                }
            }
            // No PDI-cache key: a full-ELF command uses no compute-unit slot.
            Code::G2FullElf { elf, .. } => PacketDesc {
                insts_size: elf.ctrl.len() as u64,
                full_elf: true,
                args,
                g2_elf: Some(elf.clone()),
                ..PacketDesc::default()
            },
        })
    }

    /// ROCm 7.0 (G1a) keeps an agent-wide PDI cache keyed by the previous hardware context's
    /// handle, which outlives the queue: a queue's first doorbell is looked up under "no
    /// context", and when every PDI it names is in the entry an earlier queue's first doorbell
    /// left there, no context is created and the batch is dropped while the read index
    /// advances (`rocm70-observed.md` item 4). So the first doorbell of every queue names a
    /// fresh copy of its first PDI, allocated while the copy the previous queue's first doorbell
    /// named is still allocated (so the two never share an address or a BO handle): the lookup
    /// misses and a context is built. Returns the copy and the batch naming it; `None` where
    /// nothing needs copying. Costs one PDI's bytes of device heap and one copy per queue.
    fn fresh_first_pdi(
        &self,
        batch: &[PacketDesc],
    ) -> Result<Option<(PoolAlloc, Vec<PacketDesc>)>, HsaError> {
        let first_doorbell = self.queue.as_ref().is_some_and(|q| q.taken == 0);
        let Some(head) = batch.first() else {
            return Ok(None);
        };
        // With a runtime per queue the first doorbell meets an empty cache: nothing to avoid.
        if self.info.packet_abi != PacketAbi::G1a
            || self.info.g1a_runtime_per_queue
            || !first_doorbell
            || head.pdi == 0
            || head.pdi_len == 0
        {
            return Ok(None);
        }
        let copy = PoolAlloc::new(&self.api, self.pools.heap.pool, head.pdi_len)?;
        // SAFETY: `head.pdi` is the start of a live device-heap allocation of `pdi_len` bytes
        // this binding wrote (the program's PDI), and `copy` is a fresh allocation of as many
        // bytes; the device does not write PDIs.
        unsafe {
            std::ptr::copy_nonoverlapping(head.pdi as *const u8, copy.ptr(), head.pdi_len);
        }
        let mut copied = batch.to_vec();
        copied[0].pdi = copy.addr();
        Ok(Some((copy, copied)))
    }

    /// Recreates the queue after a device failure (the runtime suspends a failed queue), so
    /// that a caller can report the device as recovering while it happens. Without this call
    /// the next dispatch recreates the queue itself. Does nothing when the queue is healthy.
    ///
    /// # Errors
    /// The runtime's error when the queue cannot be created.
    pub fn recover(&mut self) -> Result<bool, HsaError> {
        if self.queue.as_ref().is_some_and(|q| !q.stale) {
            return Ok(false);
        }
        let mut report = ChainReport::default();
        self.prepare_queue(&[], &mut report)?;
        Ok(true)
    }

    fn mark_queue_failed(&mut self) {
        if let Some(q) = &mut self.queue {
            q.stale = true;
        }
    }

    /// Makes sure the queue can take `batch`: recreates it when it is stale, when G1a's
    /// non-wrapping ring would pass 64 packets, or when the batch would bring its PDI cache
    /// past 32 distinct PDIs. On G1a with a runtime per queue
    /// ([`DeviceOptions::g1a_runtime_per_queue`](super::DeviceOptions)) the new queue comes with
    /// a fresh runtime ([`Device::renew_runtime`]).
    fn prepare_queue(
        &mut self,
        batch: &[PacketDesc],
        report: &mut ChainReport,
    ) -> Result<(), HsaError> {
        let recreate = match &self.queue {
            None => true,
            Some(q) => {
                let new_pdis: HashSet<u64> = batch
                    .iter()
                    .map(|d| d.pdi)
                    .filter(|p| *p != 0 && !q.pdis.contains(p))
                    .collect();
                q.stale
                    || (self.info.packet_abi == PacketAbi::G1a
                        && q.taken + batch.len() as u64 > u64::from(AIE_QUEUE_SIZE))
                    || q.pdis.len() + new_pdis.len() > MAX_PDIS_PER_QUEUE
            }
        };
        if recreate {
            if self.info.g1a_runtime_per_queue {
                self.renew_runtime(report)?;
            } else {
                // Destroy before creating: the agent has one queue.
                self.queue = None;
                self.errors.take();
                let owner =
                    QueueOwner::new(&self.api, self.aie, AIE_QUEUE_SIZE, self.errors.clone())?;
                self.queue = Some(QueueState::new(owner));
            }
            report.queue_recreations += 1;
        }
        Ok(())
    }

    /// Enqueues `batch`, rings once, and waits. On failure returns the index within the batch
    /// of the packet that failed; `rang` says whether the doorbell was rung.
    fn run_batch(
        &mut self,
        batch: &[PacketDesc],
        rang: &mut bool,
    ) -> Result<(), (usize, HsaError)> {
        let api = self.api.clone();
        let f = api.fns();
        let abi = self.info.packet_abi;
        let timeout = self.opts.completion_timeout;
        let no_runtime = || {
            (
                0,
                HsaError::Contract {
                    call: "hsa_init",
                    detail: "the runtime could not be initialised again after the last queue; \
                             reopen the device"
                        .into(),
                },
            )
        };
        let signal = self.signal.as_ref().ok_or_else(no_runtime)?.signal;
        let side_base = self.side.as_ref().ok_or_else(no_runtime)?.ptr();
        let q = self.queue.as_mut().ok_or((
            0,
            HsaError::Contract {
                call: "hsa_queue_create",
                detail: "no queue for the batch".into(),
            },
        ))?;
        let raw = q.owner.raw();
        let ring = q.owner.info().base_address.cast::<u8>();
        let size = u64::from(q.owner.info().size);
        let doorbell = q.owner.info().doorbell_signal;
        let n = batch.len();
        // SAFETY: the signal is live; storing a value has no other precondition.
        unsafe { (f.signal_store_relaxed)(signal, n as i64) };
        let mut first_index = 0;
        let mut last_index = 0;
        for (j, d) in batch.iter().enumerate() {
            // SAFETY: `raw` is this device's live queue; reserving one slot.
            let wr = unsafe { (f.queue_add_write_index_relaxed)(raw, 1) };
            if j == 0 {
                first_index = wr;
            }
            last_index = wr;
            let deadline = Instant::now() + timeout;
            loop {
                // SAFETY: `raw` is live; loading the read index has no precondition.
                let rd = unsafe { (f.queue_load_read_index_scacquire)(raw) };
                if wr - rd < size {
                    break;
                }
                if Instant::now() > deadline {
                    return Err((
                        j,
                        HsaError::Timeout {
                            waited: timeout,
                            value: -1,
                        },
                    ));
                }
                std::thread::yield_now();
            }
            let slot = usize::try_from(wr % size).unwrap_or(0);
            let need = abi.side_buffer_len(d.args.len());
            let side_ptr = if need <= SIDE_SLOT {
                // SAFETY: the side area has one SIDE_SLOT per ring slot and slot < size == 64.
                unsafe { side_base.add(slot * SIDE_SLOT) }
            } else {
                // The slot is reserved and its previous packet has completed, so its buffer is
                // free to overwrite.
                slot_buffer(&api, self.pools.kernarg.pool, &mut q.wide, slot, need, 1)
                    .map_err(|e| (j, e))?
            };
            let ctrl_desc;
            let d = match &d.g2_elf {
                Some(elf) => {
                    let ctrl = elf.patched(&d.args).map_err(|e| (j, e))?;
                    let at = slot_buffer(
                        &api,
                        self.pools.heap.pool,
                        &mut q.ctrl,
                        slot,
                        ctrl.len(),
                        CTRL_CODE_ALIGNMENT,
                    )
                    .map_err(|e| (j, e))?;
                    // SAFETY: `at` is 16 KiB-aligned inside a live device-heap buffer of this
                    // ring slot with room for `ctrl.len()` bytes; the slot is reserved and its
                    // previous packet has completed (the read index passed it).
                    unsafe { std::ptr::copy_nonoverlapping(ctrl.as_ptr(), at, ctrl.len()) };
                    ctrl_desc = PacketDesc {
                        insts: at as u64,
                        ..d.clone()
                    };
                    &ctrl_desc
                }
                None => d,
            };
            let (packet, side) =
                encode::encode(abi, d, signal, side_ptr as u64).map_err(|e| (j, e))?;
            // SAFETY: `side_ptr` has room for `need == side.len()` bytes and does not overlap
            // `side`; the ring slot is 64 bytes inside the runtime's ring, reserved above and
            // not yet handed to the device (the doorbell has not been rung for it).
            unsafe {
                std::ptr::copy_nonoverlapping(side.as_ptr(), side_ptr, side.len());
                let dst = ring.add(slot * 64);
                match packet {
                    Packet::G2(p) => std::ptr::write_volatile(dst.cast(), p),
                    Packet::KernelObject(p) => std::ptr::write_volatile(dst.cast(), p),
                    Packet::G1(p) => std::ptr::write_volatile(dst.cast(), p),
                }
            }
            if d.pdi != 0 {
                q.pdis.insert(d.pdi);
            }
        }
        q.taken += n as u64;
        let rung_at = Instant::now();
        *rang = true;
        // SAFETY: the doorbell signal belongs to this queue; the store submits every pending
        // packet and returns when they have finished.
        unsafe { (f.signal_store_screlease)(doorbell, last_index as i64) };
        let doorbell_time = rung_at.elapsed();
        if let Some(status) = self.errors.take() {
            let completed = if abi.has_completion_signal() {
                // SAFETY: the signal is live.
                let left = unsafe { (f.signal_load_scacquire)(signal) };
                n.saturating_sub(usize::try_from(left.max(0)).unwrap_or(n))
            } else {
                // SAFETY: `raw` is live.
                let rd = unsafe { (f.queue_load_read_index_scacquire)(raw) };
                usize::try_from(rd.saturating_sub(first_index))
                    .unwrap_or(0)
                    .min(n - 1)
            };
            let index = completed.min(n - 1);
            return Err((
                index,
                HsaError::Device {
                    index,
                    status,
                    message: api.status_string(status),
                },
            ));
        }
        if abi.has_completion_signal() {
            let ticks = wait_ticks(timeout, self.info.timestamp_frequency);
            let deadline = Instant::now() + timeout;
            loop {
                // SAFETY: the signal is live; the runtime returns its value when the condition
                // holds or the hint expires.
                let v = unsafe {
                    (f.signal_wait_scacquire)(
                        signal,
                        SignalCondition::EQ,
                        0,
                        ticks,
                        WaitState::BLOCKED,
                    )
                };
                if v == 0 {
                    break;
                }
                if Instant::now() >= deadline {
                    let done = n.saturating_sub(usize::try_from(v.max(0)).unwrap_or(n));
                    return Err((
                        done.min(n - 1),
                        HsaError::Timeout {
                            waited: timeout,
                            value: v,
                        },
                    ));
                }
            }
        } else {
            // G1a has no completion signal: the doorbell's return means done, except that
            // ROCm 7.0 waits for a chain only 50 ms (one WAIT_CMD, no retry) and then
            // advances the read index as if it had run (`rocm70-observed.md` item 8). A
            // doorbell that took that long may have been given up on: its outcome is unknown,
            // never a success, and never a device fault (nothing says the device failed: a
            // correct kernel slower than 50 ms, or a loaded host that descheduled this thread,
            // looks the same). A chain that finished just under the limit on a busy machine
            // is reported too; the caller may run it again.
            if doorbell_time >= G1A_COMMAND_WAIT {
                return Err((
                    0,
                    HsaError::OutcomeUnknown {
                        index: 0,
                        took: doorbell_time,
                        limit: G1A_COMMAND_WAIT,
                    },
                ));
            }
            // SAFETY: `raw` is live.
            let rd = unsafe { (f.queue_load_read_index_scacquire)(raw) };
            if rd <= last_index {
                let index = usize::try_from(rd.saturating_sub(first_index))
                    .unwrap_or(0)
                    .min(n - 1);
                return Err((
                    index,
                    HsaError::Device {
                        index,
                        status: crate::sys::Status::ERROR,
                        message: format!(
                            "the queue stopped at packet {rd} without reporting an error"
                        ),
                    },
                ));
            }
        }
        Ok(())
    }
}

/// How long ROCm 7.0 (G1a) waits for a command chain before it gives up without a word
/// (`WAIT_CMD`'s `DEFAULT_TIMEOUT_VAL`, `rocr-aie.md` §5.2).
pub(crate) const G1A_COMMAND_WAIT: Duration = Duration::from_millis(50);

/// `timeout` in ticks of the runtime's timestamp frequency (`freq` per second), exactly and
/// never 0: a zero hint would make every wait return at once and the loop spin.
fn wait_ticks(timeout: Duration, freq: u64) -> u64 {
    let ticks = timeout.as_nanos().saturating_mul(u128::from(freq.max(1))) / 1_000_000_000;
    u64::try_from(ticks).unwrap_or(u64::MAX).max(1)
}

/// The alignment ROCR requires of a full-ELF control code's device address (measured on aie2p
/// by ROCR's authors; `CTRL_CODE_DEV_ADDR_ALIGNMENT`). The device heap's host mapping is
/// 64 MiB-aligned, so a host address with this alignment has it on the device too.
const CTRL_CODE_ALIGNMENT: usize = 16 << 10;

/// The `align`-aligned start of ring slot `slot`'s buffer in `slots` (a control-code or a
/// wide kernarg buffer), with room for `len` bytes: allocated from `pool` on first use and
/// replaced when too small.
fn slot_buffer(
    api: &std::sync::Arc<crate::api::HsaApi>,
    pool: crate::sys::MemoryPool,
    slots: &mut Vec<Option<(PoolAlloc, usize)>>,
    slot: usize,
    len: usize,
    align: usize,
) -> Result<*mut u8, HsaError> {
    // The bytes from a buffer's start to its first `align` boundary.
    let offset = |a: &PoolAlloc| a.ptr().align_offset(align);
    if slots.len() <= slot {
        slots.resize_with(slot + 1, || None);
    }
    let fits = |(a, size): &(PoolAlloc, usize)| *size >= offset(a) + len;
    if !slots[slot].as_ref().is_some_and(fits) {
        slots[slot] = None;
        let need = len + align;
        slots[slot] = Some((PoolAlloc::new(api, pool, need)?, need));
    }
    let (a, _) = slots[slot].as_ref().ok_or_else(|| HsaError::Contract {
        call: "hsa_amd_memory_pool_allocate",
        detail: "no buffer for the ring slot".into(),
    })?;
    // SAFETY: `fits` held or the buffer was just allocated `len + align` long, so the aligned
    // start and `len` bytes after it lie inside it.
    Ok(unsafe { a.ptr().add(offset(a)) })
}

fn doorbell_batches(
    abi: PacketAbi,
    descs: &[PacketDesc],
) -> Result<Vec<Range<usize>>, (usize, HsaError)> {
    let counts: Vec<Cost> = descs
        .iter()
        .map(|d| Cost {
            args: d.args.len(),
            full_elf: d.full_elf,
        })
        .collect();
    plan(abi, &counts)
}

/// What decides where a link's doorbell batch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cost {
    args: usize,
    /// A FullElf kernel: kernel-object runtimes refuse a batch that mixes kinds.
    full_elf: bool,
}

/// Splits links into doorbell batches: each as long as it can be while every command, sized as
/// the batch's largest, fits the chain buffer, and (kernel objects) holding one kernel kind.
fn plan(abi: PacketAbi, costs: &[Cost]) -> Result<Vec<Range<usize>>, (usize, HsaError)> {
    let mut batches = Vec::new();
    let mut start = 0;
    let mut widest = 0;
    for (i, &Cost { args: n, full_elf }) in costs.iter().enumerate() {
        if abi.commands_per_doorbell(n) == 0 {
            return Err((
                i,
                HsaError::InvalidArgument(format!(
                    "{n} arguments: one command of that size takes {} bytes, more than the \
                     driver's {CHAIN_BUFFER_BYTES}-byte command buffer holds",
                    abi.chain_command_bytes(n)
                )),
            ));
        }
        let wider = widest.max(n);
        let kind_changes = i > start && full_elf != costs[start].full_elf;
        if i > start && (kind_changes || i - start >= abi.commands_per_doorbell(wider)) {
            batches.push(start..i);
            start = i;
            widest = n;
        } else {
            widest = wider;
        }
    }
    if start < costs.len() {
        batches.push(start..costs.len());
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(counts: &[usize]) -> Vec<Cost> {
        counts
            .iter()
            .map(|&args| Cost {
                args,
                full_elf: false,
            })
            .collect()
    }

    fn lens(abi: PacketAbi, counts: &[usize]) -> Vec<usize> {
        plan(abi, &costs(counts))
            .unwrap()
            .into_iter()
            .map(|r| r.len())
            .collect()
    }

    #[test]
    fn batches_are_sized_by_the_widest_command_in_them() {
        // Two-argument links: 32 per doorbell on every ABI.
        for abi in [PacketAbi::G2, PacketAbi::G1b, PacketAbi::G1a] {
            assert_eq!(lens(abi, &[2; 100]), vec![32, 32, 32, 4], "{abi}");
        }
        // Six arguments: 31 on G2, 27 on G1.
        assert_eq!(lens(PacketAbi::G2, &[6; 32]), vec![31, 1]);
        assert_eq!(lens(PacketAbi::G1b, &[6; 32]), vec![27, 5]);
        // One wide link late in a batch closes it where the wide cost no longer fits.
        let mut counts = vec![2; 40];
        counts[30] = 6;
        assert_eq!(lens(PacketAbi::G1a, &counts), vec![30, 10]);
        assert!(lens(PacketAbi::G2, &[]).is_empty());
    }

    #[test]
    fn kernel_object_batches_hold_one_kernel_kind() {
        let abi = PacketAbi::KernelObject;
        // 44 two-argument commands fit a chain; a doorbell still carries at most 32.
        assert_eq!(lens(abi, &[2; 100]), vec![32, 32, 32, 4]);
        assert_eq!(lens(abi, &[6; 40]), vec![32, 8]);
        assert_eq!(lens(abi, &[16; 40]), vec![20, 20]);
        let mut mixed = costs(&[2; 10]);
        for c in &mut mixed[3..5] {
            c.full_elf = true;
        }
        let plan: Vec<usize> = plan(abi, &mixed)
            .unwrap()
            .into_iter()
            .map(|r| r.len())
            .collect();
        assert_eq!(plan, vec![3, 2, 5]);
    }

    #[test]
    fn wait_hints_are_exact_ticks_and_never_zero() {
        let ms = Duration::from_millis;
        assert_eq!(wait_ticks(ms(250), 1_000_000_000), 250_000_000);
        assert_eq!(wait_ticks(ms(1500), 100_000_000), 150_000_000);
        assert_eq!(wait_ticks(ms(250), 1000), 250);
        assert_eq!(wait_ticks(Duration::from_nanos(1), 1000), 1);
        assert_eq!(wait_ticks(Duration::ZERO, 1_000_000_000), 1);
        assert_eq!(wait_ticks(Duration::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn a_link_too_wide_for_any_batch_is_refused_by_index() {
        let (index, e) = plan(PacketAbi::G1a, &costs(&[2, 2, 400])).unwrap_err();
        assert_eq!(index, 2);
        assert!(e.to_string().contains("4096-byte"), "{e}");
    }
}
