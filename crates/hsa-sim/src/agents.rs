//! The two agents (CPU, then AIE, in ROCR's order) and their memory pools.
//!
//! The AIE agent's pools are ROCR's `AieAgent::InitRegionList`, in its order
//! (`rocr-aie.md` §4.1):
//!
//! | # | Kind | GLOBAL_FLAGS | REC_GRANULE | SIZE | Backing |
//! |---|---|---|---|---|---|
//! | 0 | kernarg (BO_SHARE) | KERNARG_INIT\|COARSE = 5 | page | total RAM | own memfd |
//! | 1 | device heap (BO_DEV) | COARSE = 4 | 0 | 64 MiB | carved from the heap memfd, 32 KiB aligned |
//! | 2 | data (BO_SHARE) | COARSE = 4 | page | total RAM | own memfd |
//!
//! The CPU agent has two system pools, in ROCR's `CpuAgent::InitRegionList` order: a
//! KERNARG_INIT|FINE_GRAINED pool (ROCR's fine-grained and kernarg regions in one), then a
//! COARSE_GRAINED pool. ROCR adds the coarse pool on a CPU node that is not an APU node
//! (`NumFComputeCores == 0`); on a Ryzen AI machine KFD lists the integrated GPU as a node of
//! its own, so the CPU node has no compute cores and ROCR reports the coarse pool there too.
//! Memory from either is host memory the AIE driver does not know, so it is refused as a
//! kernel argument.

use std::ffi::c_void;
use std::sync::OnceLock;

use hsa_core::sys::{
    AGENT_FEATURE_AGENT_DISPATCH, AIE_QUEUE_SIZE, Agent, AgentInfo, DEVICE_HEAP_SIZE, DeviceType,
    MemoryPool, PUBLIC_NAME_SIZE, PoolCallback, PoolInfo, PoolLocation, QueueType, Segment, Status,
    global_flag,
};

use crate::runtime::{guard, next_handle, runtime};

/// Which agent a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AgentKind {
    Cpu,
    Aie,
}

/// What a pool hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PoolKind {
    /// The CPU agent's fine-grained system pool (also KERNARG_INIT).
    System,
    /// The CPU agent's coarse-grained system pool.
    SystemCoarse,
    /// AIE pool 0: BO_SHARE with KERNARG_INIT.
    Kernarg,
    /// AIE pool 1: BO_DEV from the 64 MiB device heap.
    DeviceHeap,
    /// AIE pool 2: BO_SHARE for I/O buffers.
    Data,
}

impl PoolKind {
    /// Memory the AIE driver can resolve to a BO (kernel arguments, insts, kernargs).
    pub fn is_aie(self) -> bool {
        !matches!(self, Self::System | Self::SystemCoarse)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::System => "the CPU agent's system pool",
            Self::SystemCoarse => "the CPU agent's coarse-grained system pool",
            Self::Kernarg => "AIE pool 0 (kernarg, BO_SHARE)",
            Self::DeviceHeap => "AIE pool 1 (device heap, BO_DEV)",
            Self::Data => "AIE pool 2 (data, BO_SHARE)",
        }
    }

    pub(crate) fn global_flags(self) -> u32 {
        match self {
            Self::System => global_flag::KERNARG_INIT | global_flag::FINE_GRAINED,
            Self::SystemCoarse => global_flag::COARSE_GRAINED,
            Self::Kernarg => global_flag::KERNARG_INIT | global_flag::COARSE_GRAINED,
            Self::DeviceHeap | Self::Data => global_flag::COARSE_GRAINED,
        }
    }

    /// `RUNTIME_ALLOC_REC_GRANULE`: 0 marks the device heap.
    fn rec_granule(self) -> usize {
        match self {
            Self::DeviceHeap => 0,
            _ => page_size(),
        }
    }

    /// `SIZE`.
    pub fn size(self) -> usize {
        match self {
            Self::DeviceHeap => DEVICE_HEAP_SIZE,
            _ => total_ram(),
        }
    }

    /// `ALLOC_MAX_SIZE` (ROCR reports system memory even for the device heap).
    fn alloc_max(self) -> usize {
        total_ram()
    }
}

/// One pool: its handle, kind and owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolDesc {
    pub handle: MemoryPool,
    pub kind: PoolKind,
    pub owner: Agent,
}

/// The pools of a new runtime: the CPU's two, then the AIE agent's three, in ROCR's order.
pub(crate) fn make_pools(cpu: Agent, aie: Agent) -> Vec<PoolDesc> {
    let cpu_pools = [PoolKind::System, PoolKind::SystemCoarse].map(|k| (k, cpu));
    let aie_pools = [PoolKind::Kernarg, PoolKind::DeviceHeap, PoolKind::Data].map(|k| (k, aie));
    cpu_pools
        .into_iter()
        .chain(aie_pools)
        .map(|(kind, owner)| PoolDesc {
            handle: MemoryPool {
                handle: next_handle(),
            },
            kind,
            owner,
        })
        .collect()
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    rustix::param::page_size()
}

/// Total system memory (`MemTotal` of `/proc/meminfo`), or 16 GiB if that cannot be read.
pub(crate) fn total_ram() -> usize {
    static RAM: OnceLock<usize> = OnceLock::new();
    *RAM.get_or_init(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            })
            .map_or(16 << 30, |kb| kb.saturating_mul(1024))
    })
}

/// Writes `s` NUL-padded into a `PUBLIC_NAME_SIZE`-byte buffer.
///
/// # Safety
/// `value` is valid for writes of `PUBLIC_NAME_SIZE` bytes.
unsafe fn write_name(value: *mut c_void, s: &str) {
    let mut buf = [0u8; PUBLIC_NAME_SIZE];
    let n = s.len().min(PUBLIC_NAME_SIZE - 1);
    buf[..n].copy_from_slice(&s.as_bytes()[..n]);
    // SAFETY: the caller guarantees `PUBLIC_NAME_SIZE` writable bytes at `value`.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), value.cast::<u8>(), PUBLIC_NAME_SIZE) };
}

/// `hsa_iterate_agents`: calls `callback` for the CPU agent, then the AIE agent. A callback
/// result other than `SUCCESS` stops the walk and is returned (`INFO_BREAK` = 1 for "found").
///
/// # Safety
/// `callback` is a valid function (or null, which fails); it is called with `data` as given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_iterate_agents(
    callback: Option<unsafe extern "C" fn(Agent, *mut c_void) -> Status>,
    data: *mut c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        let Some(cb) = callback else {
            return Status::ERROR_INVALID_ARGUMENT;
        };
        for agent in [rt.cpu_agent, rt.aie_agent] {
            // SAFETY: the caller guarantees `callback` is a valid function taking `data`.
            let st = unsafe { cb(agent, data) };
            if st != Status::SUCCESS {
                return st;
            }
        }
        Status::SUCCESS
    })
}

/// `hsa_agent_get_info`, with the answers of `rocr-aie.md` §3 for the AIE agent. `NAME` and
/// `PRODUCT_NAME` are the profile's ([`crate::Profile::agent_name`]): ROCm 7.0 says `aie2` and
/// `AIE-ML` whatever the generation.
///
/// # Safety
/// `value` is null (the call fails) or valid for a write of the attribute's type: 64 bytes
/// for `NAME`, `VENDOR_NAME` and `PRODUCT_NAME`, 21 bytes for `UUID`, a `u64` for
/// `NEAREST_CPU`, 6 bytes for `WORKGROUP_MAX_DIM` and `GRID_MAX_DIM`, and at least a `u32`
/// otherwise (also for an attribute the emulator refuses: it zeroes a `u32` first, as ROCR).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_agent_get_info(
    agent: Agent,
    attr: AgentInfo,
    value: *mut c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if value.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        let Some(kind) = rt.agent_kind(agent) else {
            return Status::ERROR_INVALID_AGENT;
        };
        let aie = kind == AgentKind::Aie;
        let u32_answer = match attr {
            AgentInfo::FEATURE => Some(if aie { AGENT_FEATURE_AGENT_DISPATCH } else { 0 }),
            // HSA_MACHINE_MODEL_LARGE
            AgentInfo::MACHINE_MODEL => Some(1),
            // BASE for the AIE agent, FULL for the CPU.
            AgentInfo::PROFILE => Some(if aie { 0 } else { 1 }),
            AgentInfo::QUEUES_MAX => Some(u32::from(aie)),
            AgentInfo::QUEUE_MIN_SIZE | AgentInfo::QUEUE_MAX_SIZE => {
                Some(if aie { AIE_QUEUE_SIZE } else { 0 })
            }
            AgentInfo::QUEUE_TYPE => Some(if aie {
                QueueType::SINGLE.0
            } else {
                QueueType::MULTI.0
            }),
            AgentInfo::NODE | AgentInfo::AMD_DRIVER_NODE_ID => Some(u32::from(aie)),
            AgentInfo::DEVICE => Some(if aie {
                DeviceType::AIE.0
            } else {
                DeviceType::CPU.0
            }),
            // HSA_DEFAULT_FLOAT_ROUNDING_MODE_NEAR, as ROCR's AieAgent answers both.
            AgentInfo::DEFAULT_FLOAT_ROUNDING_MODE
            | AgentInfo::BASE_PROFILE_DEFAULT_FLOAT_ROUNDING_MODES => Some(2),
            AgentInfo::VERSION_MAJOR => Some(1),
            AgentInfo::VERSION_MINOR
            | AgentInfo::WAVEFRONT_SIZE
            | AgentInfo::WORKGROUP_MAX_SIZE
            | AgentInfo::GRID_MAX_SIZE
            | AgentInfo::FBARRIER_MAX_SIZE
            | AgentInfo::CACHE_SIZE
            | AgentInfo::AMD_CHIP_ID
            | AgentInfo::AMD_BDFID => Some(0),
            _ => None,
        };
        if let Some(v) = u32_answer {
            // SAFETY: `value` is non-null and valid for a u32 write for these attributes.
            unsafe { value.cast::<u32>().write_unaligned(v) };
            return Status::SUCCESS;
        }
        let (npu, profile) = (rt.config.agent, rt.config.profile);
        // SAFETY: (every arm) `value` is non-null and valid for the attribute's documented
        // size (64-byte names, 21-byte UUID, u64 agent handle, three u16 dimensions; ROCR's
        // AieAgent writes three u16 for GRID_MAX_DIM too, and so does the emulator).
        unsafe {
            match attr {
                AgentInfo::NAME => {
                    let name = if aie {
                        profile.agent_name(npu)
                    } else {
                        "hsa-sim CPU"
                    };
                    write_name(value, name)
                }
                AgentInfo::VENDOR_NAME => write_name(value, if aie { "AMD" } else { "CPU" }),
                AgentInfo::AMD_PRODUCT_NAME => write_name(
                    value,
                    if aie {
                        profile.product_name(npu)
                    } else {
                        "hsa-sim host CPU"
                    },
                ),
                AgentInfo::AMD_UUID => {
                    let mut buf = [0u8; 21];
                    let s: &[u8] = if aie { b"AIE-XX" } else { b"CPU-XX" };
                    buf[..s.len()].copy_from_slice(s);
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), value.cast::<u8>(), buf.len());
                }
                AgentInfo::AMD_NEAREST_CPU => {
                    value.cast::<u64>().write_unaligned(rt.cpu_agent.handle)
                }
                AgentInfo::WORKGROUP_MAX_DIM | AgentInfo::GRID_MAX_DIM => {
                    value.cast::<u8>().write_bytes(0, 3 * size_of::<u16>())
                }
                _ => {
                    // ROCR zeroes a u32 before refusing an attribute it does not know.
                    value.cast::<u32>().write_unaligned(0);
                    return Status::ERROR_INVALID_ARGUMENT;
                }
            }
        }
        Status::SUCCESS
    })
}

/// `hsa_amd_agent_iterate_memory_pools`: the agent's pools in ROCR's order.
///
/// # Safety
/// `callback` is a valid function (or null, which fails); it is called with `data` as given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_agent_iterate_memory_pools(
    agent: Agent,
    callback: Option<PoolCallback>,
    data: *mut c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if rt.agent_kind(agent).is_none() {
            return Status::ERROR_INVALID_AGENT;
        }
        let Some(cb) = callback else {
            return Status::ERROR_INVALID_ARGUMENT;
        };
        for pool in rt.pools.iter().filter(|p| p.owner == agent) {
            // SAFETY: the caller guarantees `callback` is a valid function taking `data`.
            let st = unsafe { cb(pool.handle, data) };
            if st != Status::SUCCESS {
                return st;
            }
        }
        Status::SUCCESS
    })
}

/// `hsa_amd_memory_pool_get_info`.
///
/// # Safety
/// `value` is null (the call fails) or valid for a write of the attribute's type: `u32` for
/// SEGMENT, GLOBAL_FLAGS and LOCATION, `bool` (1 byte) for RUNTIME_ALLOC_ALLOWED and
/// ACCESSIBLE_BY_ALL, `size_t` otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_amd_memory_pool_get_info(
    pool: MemoryPool,
    attr: PoolInfo,
    value: *mut c_void,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        let Some(desc) = rt.pools.iter().find(|p| p.handle == pool) else {
            return Status::AMD_ERROR_INVALID_MEMORY_POOL;
        };
        if value.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        let kind = desc.kind;
        // SAFETY: (every arm) `value` is non-null and valid for the attribute's documented
        // type; unaligned writes assume no alignment.
        unsafe {
            match attr {
                PoolInfo::SEGMENT => value.cast::<u32>().write_unaligned(Segment::GLOBAL.0),
                PoolInfo::GLOBAL_FLAGS => value.cast::<u32>().write_unaligned(kind.global_flags()),
                PoolInfo::SIZE => value.cast::<usize>().write_unaligned(kind.size()),
                PoolInfo::RUNTIME_ALLOC_ALLOWED | PoolInfo::ACCESSIBLE_BY_ALL => {
                    value.cast::<bool>().write(true)
                }
                PoolInfo::RUNTIME_ALLOC_GRANULE | PoolInfo::RUNTIME_ALLOC_ALIGNMENT => {
                    value.cast::<usize>().write_unaligned(page_size())
                }
                PoolInfo::ALLOC_MAX_SIZE => value.cast::<usize>().write_unaligned(kind.alloc_max()),
                PoolInfo::LOCATION => value.cast::<u32>().write_unaligned(PoolLocation::CPU.0),
                PoolInfo::RUNTIME_ALLOC_REC_GRANULE => {
                    value.cast::<usize>().write_unaligned(kind.rec_granule())
                }
                _ => return Status::ERROR_INVALID_ARGUMENT,
            }
        }
        Status::SUCCESS
    })
}
