//! [`Device`]: one AIE agent, its pools, its queue, and the programs and tensors on it.
//!
//! A `Device` is owned by one thread at a time (every operation takes `&mut self`): ROCR's AIE
//! queue is not safe to enqueue into or ring from several threads, and the doorbell is
//! synchronous, so a dispatch returns when the device has finished it.

pub mod abi;
mod code_object;
mod discover;
mod dispatch;
pub mod driver;
mod encode;
pub mod generation;
mod ko_probe;
mod program;
mod renew;
mod resource;
mod tensor;

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char};
use std::path::PathBuf;
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
    /// Decided when the device opens ([`TensorSharing`]): vmem where a vmem allocation can be
    /// exported as a file descriptor, else the pool.
    #[default]
    Auto,
    /// `hsa_amd_memory_pool_allocate` from the data pool: accepted as a kernel argument by
    /// every runtime.
    Pool,
    /// `hsa_amd_vmem_*` (handle, reserve, map, set_access), as ROCm's newest host runtime does.
    Vmem,
}

/// How tensors reach other processes, as probed when the device opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorSharing {
    /// vmem allocations exported with `hsa_amd_vmem_export_shareable_handle`.
    VmemExport,
    /// Pool allocations exported with `hsa_amd_portable_export_dmabuf`.
    PoolExport,
    /// No export works: [`Device::export_tensor`] fails, and a caller that shares memory with
    /// other processes must copy it in and out around each dispatch.
    None,
}

impl TensorSharing {
    /// `vmem-export`, `pool-export` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::VmemExport => "vmem-export",
            Self::PoolExport => "pool-export",
            Self::None => "none",
        }
    }
}

/// Choices made when opening a device.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// The packet ABI to speak when `probe_code_objects` is off.
    pub packet_abi: PacketAbi,
    /// `packet_abi = "auto"`: prove the packet ABI from what the runtime shows when the device
    /// opens ([`abi`]), and refuse to open where nothing proves one; `packet_abi` is then
    /// ignored.
    pub probe_code_objects: bool,
    /// Overrides the generation read from the agent name or sysfs.
    pub generation: Option<Generation>,
    /// Where sysfs is mounted (`/sys`): the generation is read from the NPU's PCI id there
    /// when the agent name does not tell it.
    pub sysfs_root: PathBuf,
    pub tensor_backing: TensorBacking,
    /// How long to wait for a completion signal after the doorbell returned.
    pub completion_timeout: Duration,
    /// Whether the G2 runtime takes full-ELF packets (`pdi_patch_offset`): `None` decides from
    /// what the runtime showed ([`DeviceInfo::g2_full_elf`]), `Some` as configured.
    pub g2_full_elf: Option<bool>,
    /// G1a (ROCm 7.0): give every queue a runtime of its own (`hsa_shut_down`, `hsa_init`,
    /// then every program and tensor put back), so that no entry of ROCR 7.0's PDI cache can
    /// outlive the queue that made it ([`renew`](self#)). `false` recreates the queue in the
    /// same runtime, as on every other ABI, at the risk of dropped or wrong dispatches
    /// (`rocm70-observed.md` item 4). Ignored on other ABIs.
    pub g1a_runtime_per_queue: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            packet_abi: PacketAbi::G2,
            probe_code_objects: true,
            generation: None,
            sysfs_root: PathBuf::from("/sys"),
            tensor_backing: TensorBacking::Auto,
            completion_timeout: Duration::from_secs(30),
            g2_full_elf: None,
            g1a_runtime_per_queue: true,
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
    /// Where the generation came from: the agent name, a sysfs file, or the configuration.
    pub generation_source: String,
    /// The packet ABI spoken: configured, or found by loading a code object.
    pub packet_abi: PacketAbi,
    /// How it was chosen: `configured`, `probe: ...` with what the probe saw.
    pub packet_abi_source: String,
    /// `HSA_AMD_SYSTEM_INFO_BUILD_VERSION`, when the runtime answers it.
    pub runtime_version: Option<String>,
    /// Where the function table came from.
    pub library: String,
    /// Size of the device heap PDIs and instructions live in, in bytes.
    pub heap_size: usize,
    /// Whether tensors can be exported as file descriptors (`tensor_sharing` is not `None`).
    pub fd_export: bool,
    /// How tensors are allocated.
    pub tensor_backing: TensorBacking,
    /// How tensors reach other processes, and why.
    pub tensor_sharing: TensorSharing,
    pub tensor_sharing_reason: String,
    /// Whether the runtime has the `hsa_amd_vmem_*` family.
    pub vmem: bool,
    /// Ticks per second of the runtime's timestamps.
    pub timestamp_frequency: u64,
    /// Whether FullElf kernels run as G2 full-ELF packets: configured, or proven when `auto`
    /// found a G2 runtime with the AIE loader (ROCR's July 2026 tree, which has both). Nothing
    /// a runtime shows tells the newest G2 release, which has full ELF, from the first, which
    /// reads word 56 as reserved and would run the control code as an instruction stream, so
    /// elsewhere it must be configured. Always false off G2 and on aie2 (full ELF is aie2p
    /// only).
    pub g2_full_elf: bool,
    /// How `g2_full_elf` was decided.
    pub g2_full_elf_source: String,
    /// G1a (ROCm 7.0) only: whether every queue gets a runtime of its own
    /// ([`DeviceOptions::g1a_runtime_per_queue`]); false on other ABIs.
    pub g1a_runtime_per_queue: bool,
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
    /// Set when the queue must be recreated before its next use: a batch failed on it.
    stale: bool,
    /// Per ring slot, the device-heap buffer a G2 full-ELF packet's patched control code is
    /// copied to (allocated on first use, grown as needed).
    ctrl: Vec<Option<(PoolAlloc, usize)>>,
    /// Per ring slot, the kernarg buffer of a packet with more arguments than [`SIDE_SLOT`]
    /// holds (allocated on first use, grown as needed). Kept, not freed after each batch: on
    /// ROCR every allocation is a buffer object the driver creates and maps, and freeing one
    /// unmaps it, which costs every CPU running the process a TLB shootdown.
    wide: Vec<Option<(PoolAlloc, usize)>>,
}

/// One AIE agent, opened through a function table.
///
/// Fields drop in order: the queue first (its hardware context holds the PDIs it loaded and
/// its packets point at tensors, kernargs and the signal), then programs and tensors, the
/// signal, scratch memory, and last the runtime reference (`hsa_shut_down`). The signal, the
/// scratch memory and the runtime reference are `None` only while a G1a runtime is being
/// renewed ([`renew`]), or after a renewal failed.
#[derive(Debug)]
pub struct Device {
    queue: Option<QueueState>,
    programs: HashMap<ProgramId, Program>,
    /// G1a (ROCm 7.0): the copy of a PDI the current queue's first doorbell named, kept until
    /// a later queue's first doorbell has named a newer copy ([`Device::run_chain`]).
    first_batch_pdi: Option<PoolAlloc>,
    tensors: HashMap<TensorId, Tensor>,
    signal: Option<SignalOwner>,
    /// One side-buffer slot per ring slot (kernargs or G1 payloads).
    side: Option<PoolAlloc>,
    errors: Arc<ErrorSlot>,
    pools: PoolChoice,
    cpu: Agent,
    aie: Agent,
    info: DeviceInfo,
    opts: DeviceOptions,
    next_id: u64,
    heap_used: usize,
    /// Runtimes initialised after the first (G1a: one per queue).
    renewals: u64,
    /// Device-node descriptors closed after renewals (ROCR 7.0 leaves one open at each).
    orphans_closed: u64,
    /// The function table; it outlives every runtime reference.
    api: Arc<HsaApi>,
    rt: Option<Runtime>,
}

// SAFETY: the raw pointers inside (queue, allocations) refer to runtime objects that are not
// tied to the thread that created them (ROCR's calls may come from any thread), and the queue's
// error callback reaches the device only through an `Arc` of atomics. `Device` is not `Sync`,
// so one thread at a time uses it, and moving it to another thread moves all of that use.
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
    /// lays them out; [`HsaError::PacketAbiUnknown`] when `auto` cannot prove the packet ABI.
    pub fn open(api: HsaApi, opts: DeviceOptions) -> Result<Self, HsaError> {
        let api = Arc::new(api);
        let rt = Runtime::init(api.clone())?;
        let timestamp_frequency = system_u64(&api, SystemInfo::TIMESTAMP_FREQUENCY)?;
        let (aie, cpu) = find_agents(&api)?;
        let pools = discover::choose_pools(&discover::pools(&api, aie.agent)?)?;
        let (abi, evidence, packet_abi_source) = resolve_abi(&api, &pools, cpu, aie.agent, &opts)?;
        tracing::info!(abi = %abi, how = %packet_abi_source, "chose the packet ABI");
        if abi == PacketAbi::G1a {
            match driver::amdxdna_origin(&opts.sysfs_root) {
                driver::AmdxdnaOrigin::InTree => {
                    return Err(HsaError::DriverUnsupported {
                        sysfs: opts.sysfs_root.clone(),
                    });
                }
                driver::AmdxdnaOrigin::OutOfTree => {}
                driver::AmdxdnaOrigin::Unknown => tracing::info!(
                    sysfs = %opts.sysfs_root.display(),
                    "no amdxdna module listed in sysfs: cannot check that the driver has WAIT_CMD, \
                     which ROCm 7.0 needs (only the out-of-tree xdna-driver has it)"
                ),
            }
        }
        let (generation, generation_source) = resolve_generation(&aie.name, abi, &opts)?;
        let fns = api.fns();
        let probe = tensor::probe_sharing(&api, &pools, cpu, aie.agent, opts.tensor_backing);
        tracing::info!(
            backing = ?probe.backing, sharing = probe.sharing.as_str(), reason = %probe.reason,
            "chose how tensors are allocated and shared"
        );
        let (g2_full_elf, g2_full_elf_source) =
            g2_full_elf(abi, evidence, generation, opts.g2_full_elf);
        tracing::info!(
            g2_full_elf, how = %g2_full_elf_source,
            "decided whether FullElf kernels run as G2 full-ELF packets"
        );
        let mut opts = opts;
        opts.tensor_backing = probe.backing;
        let info = DeviceInfo {
            product_name: discover::agent_name(&api, aie.agent, AgentInfo::AMD_PRODUCT_NAME).ok(),
            agent_name: aie.name.clone(),
            generation,
            generation_source,
            packet_abi: abi,
            packet_abi_source,
            runtime_version: build_version(&api),
            library: api.source().to_string(),
            heap_size: pools.heap.size,
            fd_export: probe.sharing != TensorSharing::None,
            tensor_backing: probe.backing,
            tensor_sharing: probe.sharing,
            tensor_sharing_reason: probe.reason,
            vmem: fns.vmem_handle_create.is_some() && fns.vmem_map.is_some(),
            timestamp_frequency,
            g2_full_elf,
            g2_full_elf_source,
            g1a_runtime_per_queue: abi == PacketAbi::G1a && opts.g1a_runtime_per_queue,
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
            agent = %info.agent_name, generation = %generation, abi = %abi,
            library = %info.library, "opened the NPU"
        );
        Ok(Self {
            tensors: HashMap::new(),
            programs: HashMap::new(),
            first_batch_pdi: None,
            queue: Some(QueueState {
                owner: queue,
                taken: 0,
                pdis: HashSet::new(),
                stale: false,
                ctrl: Vec::new(),
                wide: Vec::new(),
            }),
            signal: Some(signal),
            side: Some(side),
            errors,
            pools,
            cpu,
            aie: aie.agent,
            info,
            opts,
            next_id: 1,
            heap_used: 0,
            renewals: 0,
            orphans_closed: 0,
            api,
            rt: Some(rt),
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

    /// How many times the runtime was initialised again after the device opened (G1a: once
    /// per queue after the first, see [`DeviceOptions::g1a_runtime_per_queue`]).
    pub fn runtime_renewals(&self) -> u64 {
        self.renewals
    }

    /// Descriptors of the NPU's device node that shut-down runtimes left open and the renewals
    /// closed (ROCR 7.0 leaves one at each `hsa_shut_down`).
    pub fn device_fds_closed(&self) -> u64 {
        self.orphans_closed
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }
}

/// The AIE agent and the CPU agent.
pub(super) fn find_agents(api: &HsaApi) -> Result<(discover::AgentDesc, Agent), HsaError> {
    let agents = discover::agents(api)?;
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
    Ok((aie, cpu))
}

/// The generation and where it came from: the configuration, a specific agent name, or the
/// PCI id in sysfs (see [`generation`]).
fn resolve_generation(
    name: &str,
    abi: PacketAbi,
    opts: &DeviceOptions,
) -> Result<(Generation, String), HsaError> {
    if let Some(g) = opts.generation {
        return Ok((g, "configuration".into()));
    }
    if let Some(g) = generation::from_specific_name(name, abi) {
        return Ok((g, format!("agent name {name}")));
    }
    match generation::from_sysfs(&opts.sysfs_root) {
        Ok((g, file)) => Ok((g, format!("sysfs {file}"))),
        Err(sysfs) => Err(HsaError::UnknownGeneration {
            name: name.to_string(),
            why_name: if name == "aie2" {
                "ROCm 7.0 (packet ABI g1a) reports for every NPU"
            } else {
                "is no AIE agent name this binding knows"
            },
            sysfs,
        }),
    }
}

/// The packet ABI and how it was chosen: as configured, or (`auto`, `probe_code_objects`)
/// proven from what the runtime shows ([`abi::prove`]).
fn resolve_abi(
    api: &Arc<HsaApi>,
    pools: &PoolChoice,
    cpu: Agent,
    aie: Agent,
    opts: &DeviceOptions,
) -> Result<abi::Proof, HsaError> {
    if !opts.probe_code_objects {
        return Ok((
            opts.packet_abi,
            abi::Evidence::Configured,
            "configured".into(),
        ));
    }
    abi::prove(api, pools, cpu, aie)
}

/// Whether FullElf kernels run as G2 full-ELF packets, and why ([`DeviceInfo::g2_full_elf`]).
fn g2_full_elf(
    abi: PacketAbi,
    evidence: abi::Evidence,
    generation: Generation,
    configured: Option<bool>,
) -> (bool, String) {
    if abi != PacketAbi::G2 {
        return (false, format!("the runtime speaks {abi}, not G2"));
    }
    if generation != Generation::Npu2 {
        return (false, "full ELF is aie2p (npu2) only".into());
    }
    match configured {
        Some(on) => (on, "configured".into()),
        None if evidence == abi::Evidence::G2WithLoader => (
            true,
            "auto: a G2 runtime with the AIE loader, which came after G2 full ELF".into(),
        ),
        None => (
            false,
            "auto cannot tell a G2 runtime with full ELF (the newest) from the first G2 release; \
             set g2_full_elf = true for the newest"
                .into(),
        ),
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
