//! [`Device`]: one AIE agent, its pools, its queue, and the programs and tensors on it.
//!
//! A `Device` is owned by one thread at a time (every operation takes `&mut self`): ROCR's AIE
//! queue is not safe to enqueue into or ring from several threads, and the doorbell is
//! synchronous, so a dispatch returns when the device has finished it.

mod discover;
mod dispatch;
mod encode;
mod resource;

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

pub use discover::Generation;
pub use dispatch::{Arg, ChainError, ChainReport, Dispatch};
pub use encode::PacketAbi;

use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{
    AIE_QUEUE_SIZE, Agent, AgentInfo, DEVICE_HEAP_ALIGNMENT, DEVICE_HEAP_SIZE, DeviceType, Status,
    SystemInfo,
};
use discover::PoolChoice;
use resource::{ErrorSlot, PoolAlloc, QueueOwner, Runtime, SignalOwner, VmemAlloc};

/// How tensor memory is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TensorBacking {
    /// `hsa_amd_memory_pool_allocate` from the data pool: accepted as a kernel argument by
    /// every G2 runtime.
    #[default]
    Pool,
    /// `hsa_amd_vmem_*` (handle, reserve, map, set_access), as ROCm's newest host runtime does.
    Vmem,
}

/// Choices made when opening a device.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    pub packet_abi: PacketAbi,
    /// Overrides the generation read from the agent name.
    pub generation: Option<Generation>,
    pub tensor_backing: TensorBacking,
    /// How long to wait for a completion signal after the doorbell returned.
    pub completion_timeout: Duration,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            packet_abi: PacketAbi::G2,
            generation: None,
            tensor_backing: TensorBacking::Pool,
            completion_timeout: Duration::from_secs(30),
        }
    }
}

/// What the device is, as the runtime reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `HSA_AGENT_INFO_NAME` of the AIE agent (`aie2`, `aie2p`).
    pub agent_name: String,
    /// `HSA_AMD_AGENT_INFO_PRODUCT_NAME`, when the runtime answers it.
    pub product_name: Option<String>,
    pub generation: Generation,
    pub packet_abi: PacketAbi,
    /// `HSA_AMD_SYSTEM_INFO_BUILD_VERSION`, when the runtime answers it.
    pub runtime_version: Option<String>,
    /// Where the function table came from.
    pub library: String,
    /// Size of the device heap PDIs and instructions live in, in bytes.
    pub heap_size: usize,
    /// Whether tensors can be exported as file descriptors.
    pub fd_export: bool,
    /// Whether the runtime has the `hsa_amd_vmem_*` family.
    pub vmem: bool,
    /// Ticks per second of the runtime's timestamps.
    pub timestamp_frequency: u64,
}

/// A program loaded into the device heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramId(pub u64);

/// A tensor allocated on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u64);

/// A tensor's memory.
#[derive(Debug)]
enum TensorMem {
    Pool(PoolAlloc),
    Vmem(VmemAlloc),
}

#[derive(Debug)]
struct Tensor {
    mem: TensorMem,
    /// Bytes the caller asked for.
    size: usize,
}

impl Tensor {
    fn ptr(&self) -> *mut u8 {
        match &self.mem {
            TensorMem::Pool(p) => p.ptr(),
            TensorMem::Vmem(v) => v.ptr(),
        }
    }
}

/// What a caller may know of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorInfo {
    pub size: usize,
    /// The host VA of its first byte (also what kernel arguments point at).
    pub addr: u64,
    pub backing: TensorBacking,
}

#[derive(Debug)]
struct Program {
    pdi: PoolAlloc,
    insts: PoolAlloc,
    insts_len: usize,
    /// Device-heap bytes held (both allocations, rounded to the heap's alignment).
    heap_bytes: usize,
}

/// The queue and what this binding knows about its state.
#[derive(Debug)]
struct QueueState {
    owner: QueueOwner,
    /// Packets the queue has taken since it was created (G1a's ring does not wrap).
    taken: u64,
    /// PDI addresses this queue has seen (its runtime-side PDI cache; at most 32).
    pdis: HashSet<u64>,
    /// Set when the queue must be recreated before its next use: it failed, or a program it
    /// cached was unloaded (a new PDI at a reused address would hit the stale cache entry).
    stale: bool,
}

/// One AIE agent, opened through a function table.
///
/// Fields drop in order: tensors and programs, the queue, the signal, scratch memory, and
/// last the runtime reference (`hsa_shut_down`).
#[derive(Debug)]
pub struct Device {
    tensors: HashMap<TensorId, Tensor>,
    programs: HashMap<ProgramId, Program>,
    queue: Option<QueueState>,
    signal: SignalOwner,
    /// One side-buffer slot per ring slot (kernargs or G1 payloads).
    side: PoolAlloc,
    errors: Arc<ErrorSlot>,
    pools: PoolChoice,
    cpu: Agent,
    aie: Agent,
    info: DeviceInfo,
    opts: DeviceOptions,
    next_id: u64,
    heap_used: usize,
    rt: Runtime,
}

// SAFETY: the raw pointers inside (queue, allocations) refer to runtime objects that are not
// tied to the thread that created them; every access goes through `&mut self`, so moving the
// whole `Device` to another thread cannot create shared access.
unsafe impl Send for Device {}

/// Bytes of side buffer per ring slot: 16 arguments in either ABI.
const SIDE_SLOT: usize = 256;

impl Device {
    /// Initialises the runtime and opens its AIE agent.
    ///
    /// # Errors
    /// The failing runtime call with its status string; [`HsaError::NoAgent`] when there is no
    /// AIE or CPU agent; [`HsaError::UnknownGeneration`] when the agent name maps to no
    /// generation and none was given; [`HsaError::NoPool`] when the AIE pools are not as ROCR
    /// lays them out.
    pub fn open(api: HsaApi, opts: DeviceOptions) -> Result<Self, HsaError> {
        let api = Arc::new(api);
        let rt = Runtime::init(api.clone())?;
        let timestamp_frequency = system_u64(&api, SystemInfo::TIMESTAMP_FREQUENCY)?;
        let agents = discover::agents(&api)?;
        let describe = || {
            agents
                .iter()
                .map(|a| format!("{} (device type {})", a.name, a.kind.0))
                .collect()
        };
        let aie = agents
            .iter()
            .find(|a| a.kind == DeviceType::AIE)
            .ok_or_else(|| HsaError::NoAgent { what: "no AIE agent (device type 3): is an XDNA NPU present and is this ROCR new enough?", found: describe() })?
            .clone();
        let cpu = agents
            .iter()
            .find(|a| a.kind == DeviceType::CPU)
            .ok_or_else(|| HsaError::NoAgent {
                what: "no CPU agent",
                found: describe(),
            })?
            .agent;
        let generation = match opts.generation {
            Some(g) => g,
            None => Generation::from_agent_name(&aie.name).ok_or_else(|| {
                HsaError::UnknownGeneration {
                    name: aie.name.clone(),
                }
            })?,
        };
        let pools = discover::choose_pools(&discover::pools(&api, aie.agent)?)?;
        let fns = api.fns();
        let info = DeviceInfo {
            product_name: discover::agent_name(&api, aie.agent, AgentInfo::AMD_PRODUCT_NAME).ok(),
            agent_name: aie.name.clone(),
            generation,
            packet_abi: opts.packet_abi,
            runtime_version: build_version(&api),
            library: api.source().to_string(),
            heap_size: pools.heap.size,
            fd_export: fns.portable_export_dmabuf.is_some()
                || (opts.tensor_backing == TensorBacking::Vmem
                    && fns.vmem_export_shareable_handle.is_some()),
            vmem: fns.vmem_handle_create.is_some() && fns.vmem_map.is_some(),
            timestamp_frequency,
        };
        let side = PoolAlloc::new(
            &api,
            pools.kernarg.pool,
            SIDE_SLOT * AIE_QUEUE_SIZE as usize,
        )?;
        let signal = SignalOwner::new(&api, 0)?;
        let errors = Arc::new(ErrorSlot::default());
        let queue = QueueOwner::new(&api, aie.agent, AIE_QUEUE_SIZE, errors.clone())?;
        tracing::info!(
            agent = %info.agent_name, generation = %generation, abi = %opts.packet_abi,
            library = %info.library, "opened the NPU"
        );
        Ok(Self {
            tensors: HashMap::new(),
            programs: HashMap::new(),
            queue: Some(QueueState {
                owner: queue,
                taken: 0,
                pdis: HashSet::new(),
                stale: false,
            }),
            signal,
            side,
            errors,
            pools,
            cpu,
            aie: aie.agent,
            info,
            opts,
            next_id: 1,
            heap_used: 0,
            rt,
        })
    }

    /// What the device is.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Device-heap bytes in use by loaded programs (rounded to the heap's 32 KiB alignment).
    pub fn heap_used(&self) -> usize {
        self.heap_used
    }

    /// Number of loaded programs.
    pub fn program_count(&self) -> usize {
        self.programs.len()
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Copies a PDI and its instruction stream into the device heap.
    ///
    /// # Errors
    /// [`HsaError::InvalidArgument`] for an empty PDI or an instruction stream that is empty or
    /// not a whole number of 32-bit words; [`HsaError::HeapFull`] when the device heap has no
    /// room (unload a program and retry); the runtime's error otherwise.
    pub fn load_program(&mut self, pdi: &[u8], insts: &[u8]) -> Result<ProgramId, HsaError> {
        if pdi.is_empty() {
            return Err(HsaError::InvalidArgument("the PDI is empty".into()));
        }
        if insts.is_empty() || !insts.len().is_multiple_of(4) {
            return Err(HsaError::InvalidArgument(format!(
                "the instruction stream is {} bytes: it must be a non-empty multiple of 4",
                insts.len()
            )));
        }
        let api = self.rt.api.clone();
        let heap_full = |reason: String| HsaError::HeapFull {
            needed: round_up(pdi.len(), DEVICE_HEAP_ALIGNMENT)
                + round_up(insts.len(), DEVICE_HEAP_ALIGNMENT),
            used: self.heap_used,
            size: self.info.heap_size,
            reason,
        };
        let out_of_heap = |e: HsaError| match e.status() {
            Some(Status::ERROR_OUT_OF_RESOURCES | Status::ERROR_INVALID_ALLOCATION) => {
                heap_full(e.to_string())
            }
            _ => e,
        };
        // Instructions first: they are small and must stay out of the windows ROCR's address
        // mask gets wrong, which is easiest while the low heap is free.
        let insts_mem = alloc_insts(&api, &self.pools, insts.len()).map_err(|e| match e {
            HsaError::InvalidArgument(reason) => heap_full(reason),
            e => out_of_heap(e),
        })?;
        let pdi_mem = PoolAlloc::new(&api, self.pools.heap.pool, pdi.len()).map_err(out_of_heap)?;
        // SAFETY: both allocations are at least as long as the slices copied into them, and
        // fresh device-heap memory cannot overlap caller memory.
        unsafe {
            std::ptr::copy_nonoverlapping(pdi.as_ptr(), pdi_mem.ptr(), pdi.len());
            std::ptr::copy_nonoverlapping(insts.as_ptr(), insts_mem.ptr(), insts.len());
        }
        let heap_bytes = round_up(pdi.len(), DEVICE_HEAP_ALIGNMENT)
            + round_up(insts.len(), DEVICE_HEAP_ALIGNMENT);
        self.heap_used += heap_bytes;
        let id = ProgramId(self.next_id());
        self.programs.insert(
            id,
            Program {
                pdi: pdi_mem,
                insts: insts_mem,
                insts_len: insts.len(),
                heap_bytes,
            },
        );
        Ok(id)
    }

    /// Frees a program's device-heap memory.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`] for an id this device did not give out.
    pub fn unload_program(&mut self, id: ProgramId) -> Result<(), HsaError> {
        let p = self.programs.remove(&id).ok_or(HsaError::UnknownHandle {
            kind: "program",
            id: id.0,
        })?;
        self.heap_used -= p.heap_bytes;
        if let Some(q) = &mut self.queue
            && q.pdis.contains(&p.pdi.addr())
        {
            q.stale = true;
        }
        Ok(())
    }

    /// Allocates `size` bytes of tensor memory, zeroed.
    ///
    /// # Errors
    /// [`HsaError::InvalidArgument`] for size 0; the runtime's allocation error.
    pub fn alloc_tensor(&mut self, size: usize) -> Result<TensorId, HsaError> {
        if size == 0 {
            return Err(HsaError::InvalidArgument(
                "a tensor must have at least one byte".into(),
            ));
        }
        let api = self.rt.api.clone();
        let mem = match self.opts.tensor_backing {
            TensorBacking::Pool => {
                TensorMem::Pool(PoolAlloc::new(&api, self.pools.data.pool, size)?)
            }
            TensorBacking::Vmem => {
                let rounded = round_up(size, self.pools.data.granule.max(1));
                TensorMem::Vmem(VmemAlloc::new(
                    &api,
                    self.pools.data.pool,
                    rounded,
                    self.cpu,
                    self.aie,
                )?)
            }
        };
        let t = Tensor { mem, size };
        // SAFETY: the allocation holds at least `size` bytes and nothing else refers to it yet.
        unsafe { std::ptr::write_bytes(t.ptr(), 0, size) };
        let id = TensorId(self.next_id());
        self.tensors.insert(id, t);
        Ok(id)
    }

    /// Frees a tensor.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`] for an id this device did not give out.
    pub fn free_tensor(&mut self, id: TensorId) -> Result<(), HsaError> {
        self.tensors
            .remove(&id)
            .map(drop)
            .ok_or(HsaError::UnknownHandle {
                kind: "tensor",
                id: id.0,
            })
    }

    fn tensor(&self, id: TensorId) -> Result<&Tensor, HsaError> {
        self.tensors.get(&id).ok_or(HsaError::UnknownHandle {
            kind: "tensor",
            id: id.0,
        })
    }

    /// Size, address and backing of a tensor.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`] for an id this device did not give out.
    pub fn tensor_info(&self, id: TensorId) -> Result<TensorInfo, HsaError> {
        let t = self.tensor(id)?;
        let backing = match t.mem {
            TensorMem::Pool(_) => TensorBacking::Pool,
            TensorMem::Vmem(_) => TensorBacking::Vmem,
        };
        Ok(TensorInfo {
            size: t.size,
            addr: t.ptr() as u64,
            backing,
        })
    }

    fn range(&self, id: TensorId, offset: usize, len: usize) -> Result<*mut u8, HsaError> {
        let t = self.tensor(id)?;
        match offset.checked_add(len) {
            Some(end) if end <= t.size => {
                // SAFETY: `offset + len <= size`, so the result stays inside the allocation.
                Ok(unsafe { t.ptr().add(offset) })
            }
            _ => Err(HsaError::InvalidArgument(format!(
                "bytes {offset}..{} are outside tensor {} of {} bytes",
                offset.saturating_add(len),
                id.0,
                t.size
            ))),
        }
    }

    /// Copies `data` into a tensor at `offset`.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`], or [`HsaError::InvalidArgument`] when the range does not fit.
    pub fn write_tensor(
        &mut self,
        id: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<(), HsaError> {
        let dst = self.range(id, offset, data.len())?;
        // SAFETY: `range` checked that `dst..dst+len` lies inside the tensor; the caller's slice
        // is not device memory, so the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copies bytes out of a tensor at `offset` into `out`.
    ///
    /// # Errors
    /// [`HsaError::UnknownHandle`], or [`HsaError::InvalidArgument`] when the range does not fit.
    pub fn read_tensor(&self, id: TensorId, offset: usize, out: &mut [u8]) -> Result<(), HsaError> {
        let src = self.range(id, offset, out.len())?;
        // SAFETY: as in `write_tensor`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Exports a tensor's memory as a file descriptor another process can map, with the byte
    /// offset of the tensor inside it. On the emulator this is a memfd; on ROCR, a dmabuf
    /// (whether an amdxdna dmabuf can be mapped by another process is unverified on hardware).
    ///
    /// # Errors
    /// [`HsaError::Unsupported`] when the runtime cannot export; the runtime's error otherwise.
    pub fn export_tensor(&self, id: TensorId) -> Result<(OwnedFd, u64), HsaError> {
        let t = self.tensor(id)?;
        let api = &self.rt.api;
        let mut fd: i32 = -1;
        let mut offset: u64 = 0;
        match (
            &t.mem,
            api.fns().vmem_export_shareable_handle,
            api.fns().portable_export_dmabuf,
        ) {
            (TensorMem::Vmem(v), Some(export), _) => {
                // SAFETY: `fd` is a valid out-pointer and the handle is live.
                let st = unsafe { export(&mut fd, v.handle(), 0) };
                api.check("hsa_amd_vmem_export_shareable_handle", st)?;
            }
            (_, _, Some(export)) => {
                // SAFETY: `t.ptr()..+size` is a live allocation of this runtime; the
                // out-pointers are valid.
                let st =
                    unsafe { export(t.ptr().cast_const().cast(), t.size, &mut fd, &mut offset) };
                api.check("hsa_amd_portable_export_dmabuf", st)?;
            }
            _ => {
                return Err(HsaError::Unsupported {
                    operation: "exporting a tensor as a file descriptor",
                    symbol: "hsa_amd_portable_export_dmabuf",
                });
            }
        }
        if fd < 0 {
            return Err(HsaError::InvalidArgument(format!(
                "the runtime exported an invalid descriptor {fd}"
            )));
        }
        // SAFETY: on success the runtime hands over a new descriptor that nothing else owns.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, offset))
    }
}

/// Allocates device-heap memory for an instruction stream at an address ROCR translates
/// correctly. ROCR turns an instruction VA into a device address as
/// `0x04000000 | (va & 0x02FFFFFF)`, which clears bit 24: a buffer at a heap offset in
/// [16, 32) or [48, 64) MiB would be given the wrong device address (read from ROCR's source;
/// unverified on hardware). A placement there is held, the rest of that window is filled so the
/// next try lands past it, and both are released once a good placement is found.
fn alloc_insts(api: &Arc<HsaApi>, pools: &PoolChoice, len: usize) -> Result<PoolAlloc, HsaError> {
    const BAD_BIT: u64 = 0x0100_0000;
    let mut held = Vec::new();
    for _ in 0..8 {
        let a = PoolAlloc::new(api, pools.heap.pool, len)?;
        let start = a.addr() & (DEVICE_HEAP_SIZE as u64 - 1);
        let end = start + len as u64 - 1;
        if start & BAD_BIT == 0 && end & BAD_BIT == 0 {
            return Ok(a);
        }
        tracing::debug!(
            offset = start,
            "instruction buffer landed where ROCR's address mask is wrong; retrying"
        );
        // Where the bad window this buffer touches ends.
        let window_end = (end | (BAD_BIT - 1)) + 1;
        let used = round_up(len, DEVICE_HEAP_ALIGNMENT) as u64;
        held.push(a);
        if let Some(rest) = window_end.checked_sub(start + used).filter(|&r| r > 0)
            && let Ok(filler) = PoolAlloc::new(
                api,
                pools.heap.pool,
                usize::try_from(rest).unwrap_or(usize::MAX),
            )
        {
            held.push(filler);
        }
    }
    Err(HsaError::InvalidArgument(
        "no device-heap placement for the instruction stream below 16 MiB or in [32, 48) MiB"
            .into(),
    ))
}

fn system_u64(api: &HsaApi, attr: SystemInfo) -> Result<u64, HsaError> {
    let mut v: u64 = 0;
    // SAFETY: the attributes read here write a u64.
    let st = unsafe { (api.fns().system_get_info)(attr, (&raw mut v).cast()) };
    api.check("hsa_system_get_info", st)?;
    Ok(v)
}

fn build_version(api: &HsaApi) -> Option<String> {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: BUILD_VERSION writes a `const char*`; older runtimes reject the attribute.
    let st =
        unsafe { (api.fns().system_get_info)(SystemInfo::AMD_BUILD_VERSION, (&raw mut p).cast()) };
    if !st.is_ok() || p.is_null() {
        return None;
    }
    // SAFETY: the runtime points at a NUL-terminated string it owns.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

pub(crate) fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}
