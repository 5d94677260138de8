//! G1a (ROCm 7.0): one runtime per queue.
//!
//! ROCR 7.0 keeps, for the life of a runtime, a map from a hardware-context id to a list of
//! PDI BO handles (`hw_ctx_pdi_cache_map` in `core/driver/xdna/amd_xdna_driver.cpp`). A
//! doorbell looks up the id of the queue's current context (0 for a new queue); when every PDI
//! handle of the batch is in that entry it submits without configuring anything, otherwise it
//! copies the entry, appends the missing handles, builds a new context configured with the
//! whole list and stores the list under the *old* id. Entries are never removed except on a
//! miss, and survive `hsa_queue_destroy`. The driver hands out the lowest free GEM handle and
//! context ids cyclically over 1..255, so within one runtime:
//! - a second queue starts at id 0, whose entry an earlier queue left: a batch whose PDI
//!   handles are all in it (a freed PDI's handle reused by a new PDI) is submitted to no
//!   context and dropped, and a miss configures the entry's stale handles (refused when one now
//!   names a command or shared buffer: the batch is dropped);
//! - after 255 contexts an id comes back with an entry from its previous use, and a hit submits
//!   the batch to a context configured with other PDIs: another program's kernel runs.
//!
//! Every doorbell of a queue misses (its context id has no entry until the id wraps), so one
//! queue of at most 64 packets (G1a's ring does not wrap) in a fresh runtime configures exactly
//! the PDIs each batch names, and every dispatch runs its own kernel. That is what this module
//! guarantees: where another ABI recreates the queue (64 packets taken, a failed batch, 32
//! PDIs), a G1a device shuts its runtime down (`hsa_shut_down`, which drops the map), initialises
//! a fresh one, and puts back every program (same ids, same bytes, placed again below ROCR's
//! aliasing window) and every tensor (same ids, contents copied through host memory).
//!
//! Cost: one `hsa_shut_down` + `hsa_init` per queue, the programs' bytes copied out and back in,
//! and every tensor's bytes copied out and back in. ROCR 7.0 closes neither its `/dev/accel` fd
//! nor its shared-memory mappings in `hsa_shut_down` (`rocm70-observed.md` item 9): each renewal
//! would leave one fd open in the process, a renewal every 64 dispatches at most, so a daemon
//! would run out of descriptors after some two million dispatches under `LimitNOFILE=32768`.
//! Once the runtime is down (its last reference given back, which `hsa_system_get_info`
//! answering NOT_INITIALIZED proves), nothing in the process uses a descriptor of the NPU's
//! device node any more, and [`close_orphaned_device_fds`] closes them.

use super::dispatch::ChainReport;
use super::program::Code;
use super::resource::{PoolAlloc, QueueOwner, Runtime, SignalOwner};
use super::tensor::Tensor;
use super::{Device, ProgramId, QueueState, SIDE_SLOT, TensorId, discover, find_agents};
use crate::error::HsaError;
use crate::sys::AIE_QUEUE_SIZE;

/// Where the NPU's device nodes are (`/dev/accel/accel<N>`, the DRM accel class).
const ACCEL_NODES: &str = "/dev/accel/";

/// Whether the runtime is down: no `hsa_init` reference is held anywhere in the process.
fn runtime_is_down(api: &crate::api::HsaApi) -> bool {
    let mut major: u16 = 0;
    // SAFETY: VERSION_MAJOR writes a u16 into `major`, which outlives the call.
    let st = unsafe {
        (api.fns().system_get_info)(
            crate::sys::SystemInfo::VERSION_MAJOR,
            (&raw mut major).cast(),
        )
    };
    st == crate::sys::Status::ERROR_NOT_INITIALIZED
}

/// Closes the descriptors of the NPU's device nodes a runtime left open at `hsa_shut_down`
/// (ROCR 7.0 never closes its own), once the runtime is down; returns how many. Nothing when
/// it is up: a live runtime's descriptor is its own.
fn close_orphaned_device_fds(api: &crate::api::HsaApi) -> usize {
    if !runtime_is_down(api) {
        return 0;
    }
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let orphans: Vec<i32> = dir
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| {
                t.as_os_str()
                    .as_encoded_bytes()
                    .starts_with(ACCEL_NODES.as_bytes())
            })
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for &fd in &orphans {
        // SAFETY: `fd` is open on an NPU device node while no runtime is up: the runtime that
        // opened it has shut down and lost it (nothing else in the process opens these
        // nodes), so no other owner will close it or use it again, and it was never closed,
        // so its number has not been reused.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
    if !orphans.is_empty() {
        tracing::debug!(
            closed = orphans.len(),
            "closed the NPU device descriptors the shut-down runtime left open"
        );
    }
    orphans.len()
}

/// A program as a renewal puts it back: its id, PDI bytes and instruction bytes.
type SavedProgram = (ProgramId, Vec<u8>, Vec<u8>);

impl Device {
    /// Replaces the runtime with a fresh one and puts every program and tensor back, then
    /// creates the queue in it.
    ///
    /// # Errors
    /// A program that is not a PDI and an instruction stream in the device heap (G1a has no
    /// other kind), an exported tensor (its fd would outlive its memory), or the runtime's
    /// error initialising, allocating or creating the queue. After a failure past the shutdown
    /// the device has no runtime: its programs and tensors are gone and later calls fail.
    pub(super) fn renew_runtime(&mut self, report: &mut ChainReport) -> Result<(), HsaError> {
        let programs = self.saved_programs()?;
        let tensors = self.saved_tensors()?;
        // Release everything the old runtime made, the queue first, then its reference.
        self.queue = None;
        self.first_batch_pdi = None;
        self.programs.clear();
        self.tensors.clear();
        self.side = None;
        self.signal = None;
        self.rt = None;
        let closed = close_orphaned_device_fds(&self.api);
        self.orphans_closed += closed as u64;
        self.heap_used = 0;
        self.errors.take();
        let api = self.api.clone();
        let rt = Runtime::init(api.clone())?;
        let (aie, cpu) = find_agents(&api)?;
        self.pools = discover::choose_pools(&discover::pools(&api, aie.agent)?)?;
        self.aie = aie.agent;
        self.cpu = cpu;
        self.rt = Some(rt);
        self.side = Some(PoolAlloc::new(
            &api,
            self.pools.kernarg.pool,
            SIDE_SLOT * AIE_QUEUE_SIZE as usize,
        )?);
        self.signal = Some(SignalOwner::new(&api, 0)?);
        for (id, pdi, insts) in programs {
            self.place_in_heap(id, &pdi, &insts)?;
        }
        for (id, bytes) in tensors {
            let mem = self.tensor_mem(bytes.len())?;
            let t = Tensor {
                mem,
                size: bytes.len(),
                exported: false,
            };
            // SAFETY: the fresh tensor memory holds at least `size` bytes and is no memory
            // any other process or reference can reach yet.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), t.ptr(), bytes.len()) };
            self.tensors.insert(id, t);
        }
        let owner = QueueOwner::new(&api, self.aie, AIE_QUEUE_SIZE, self.errors.clone())?;
        self.queue = Some(QueueState::new(owner));
        self.renewals += 1;
        report.runtime_renewals += 1;
        tracing::debug!(
            renewals = self.renewals,
            programs = self.programs.len(),
            tensors = self.tensors.len(),
            "ROCm 7.0: initialised a fresh runtime for the next queue"
        );
        Ok(())
    }

    /// Every program's PDI and instruction bytes, by id, in id order.
    fn saved_programs(&self) -> Result<Vec<SavedProgram>, HsaError> {
        let mut out = Vec::with_capacity(self.programs.len());
        for (&id, p) in &self.programs {
            let Code::Heap {
                pdi,
                pdi_len,
                insts,
                insts_len,
            } = &p.code
            else {
                return Err(HsaError::InvalidArgument(format!(
                    "program {} is not a PDI and an instruction stream in the device heap; the \
                     runtime cannot be renewed with it loaded",
                    id.0
                )));
            };
            // SAFETY: both are live device-heap allocations this binding wrote, at least as
            // long as the lengths recorded with them; the device does not write them.
            let (pdi, insts) = unsafe {
                (
                    std::slice::from_raw_parts(pdi.ptr(), *pdi_len).to_vec(),
                    std::slice::from_raw_parts(insts.ptr(), *insts_len).to_vec(),
                )
            };
            out.push((id, pdi, insts));
        }
        out.sort_by_key(|(id, ..)| *id);
        Ok(out)
    }

    /// Every tensor's bytes, by id.
    fn saved_tensors(&self) -> Result<Vec<(TensorId, Vec<u8>)>, HsaError> {
        let mut out = Vec::with_capacity(self.tensors.len());
        for (&id, t) in &self.tensors {
            if t.exported {
                return Err(HsaError::InvalidArgument(format!(
                    "tensor {} is exported to another process; the runtime cannot be renewed \
                     under it",
                    id.0
                )));
            }
            let mut bytes = vec![0u8; t.size];
            // SAFETY: the tensor's memory is live and at least `size` bytes long; no queue is
            // running (the device is owned by this thread and its doorbells are synchronous),
            // and the copy forms no reference to that memory.
            unsafe { std::ptr::copy_nonoverlapping(t.ptr(), bytes.as_mut_ptr(), t.size) };
            out.push((id, bytes));
        }
        out.sort_by_key(|(id, _)| *id);
        Ok(out)
    }
}

impl QueueState {
    /// A queue that has taken nothing yet.
    pub(super) fn new(owner: QueueOwner) -> Self {
        Self {
            owner,
            taken: 0,
            pdis: Default::default(),
            stale: false,
            ctrl: Vec::new(),
            wide: Vec::new(),
        }
    }
}
