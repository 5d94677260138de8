//! [`Device`]: one AIE agent, its pools, its queue, and the programs and tensors on it.
//!
//! A `Device` is owned by one thread at a time (every operation takes `&mut self`): ROCR's AIE
//! queue is not safe to enqueue into or ring from several threads, and the doorbell is
//! synchronous, so a dispatch returns when the device has finished it.

mod discover;
mod dispatch;
mod encode;
mod program;
mod resource;
mod tensor;

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char};
use std::sync::Arc;
use std::time::Duration;

pub use discover::Generation;
pub use dispatch::{Arg, ChainError, ChainReport, Dispatch};
pub use encode::PacketAbi;
pub use tensor::TensorInfo;

use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{AIE_QUEUE_SIZE, Agent, AgentInfo, DeviceType, SystemInfo};
use discover::PoolChoice;
use program::Program;
use resource::{ErrorSlot, PoolAlloc, QueueOwner, Runtime, SignalOwner};
use tensor::Tensor;

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
