//! What `Device::open` finds on the runtime: agents, pools, and the generation.

use std::ffi::c_void;
use std::fmt;
use std::str::FromStr;

use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{
    Agent, AgentInfo, DeviceType, MemoryPool, PUBLIC_NAME_SIZE, PoolInfo, Segment, Status,
    global_flag,
};

/// The NPU generation a design must be built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Generation {
    /// Phoenix and Hawk Point (`aie2`, TXN device generation 3).
    Npu1,
    /// Strix, Strix Halo and Krackan (`aie2p`, TXN device generation 4).
    Npu2,
}

impl Generation {
    /// Maps an agent or product name as ROCm's host runtime does: `aie2p`, `strix`, `krackan`
    /// or `npu2` mean npu2; `aie2`, `phoenix` or `npu1` mean npu1 (checked in that order).
    pub fn from_agent_name(name: &str) -> Option<Self> {
        let n = name.to_ascii_lowercase();
        if ["aie2p", "strix", "krackan", "npu2"]
            .iter()
            .any(|k| n.contains(k))
        {
            Some(Self::Npu2)
        } else if ["aie2", "phoenix", "npu1"].iter().any(|k| n.contains(k)) {
            Some(Self::Npu1)
        } else {
            None
        }
    }

    /// `npu1` or `npu2`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Npu1 => "npu1",
            Self::Npu2 => "npu2",
        }
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Generation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_agent_name(s)
            .ok_or_else(|| format!("unknown NPU generation {s:?}: expected npu1 or npu2"))
    }
}

/// One agent as `hsa_iterate_agents` reported it.
#[derive(Debug, Clone)]
pub(crate) struct AgentDesc {
    pub agent: Agent,
    pub kind: DeviceType,
    pub name: String,
}

/// One memory pool of the AIE agent.
#[derive(Debug, Clone)]
pub(crate) struct PoolDesc {
    pub pool: MemoryPool,
    pub segment: Segment,
    pub flags: u32,
    pub size: usize,
    pub granule: usize,
    pub rec_granule: usize,
    pub alloc_allowed: bool,
}

impl fmt::Display for PoolDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "segment {} flags {:#x} size {} granule {} rec_granule {}",
            self.segment.0, self.flags, self.size, self.granule, self.rec_granule
        )
    }
}

/// Plain integers a runtime may write whole: every bit pattern is a valid value, so whatever C
/// writes into one is one. `bool` is not one (only 0 and 1 are `bool`s): read a flag as `u8`.
trait CInt: Copy + Default + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! c_int {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl CInt for $t {}
    )*};
}

c_int!(u8, u16, u32, u64, usize);

/// Reads one fixed-size attribute with `hsa_agent_get_info`.
fn agent_info<T: CInt>(api: &HsaApi, agent: Agent, attr: AgentInfo) -> Result<T, HsaError> {
    let mut v = T::default();
    // SAFETY: `v` is a `T` the caller chose to match the size ROCR writes for `attr`, and `T`
    // is a plain integer (`CInt`), valid for any bytes the runtime writes.
    let st = unsafe { (api.fns().agent_get_info)(agent, attr, (&raw mut v).cast()) };
    api.check("hsa_agent_get_info", st)?;
    Ok(v)
}

/// Reads a 64-byte name attribute.
pub(crate) fn agent_name(api: &HsaApi, agent: Agent, attr: AgentInfo) -> Result<String, HsaError> {
    let mut buf = [0u8; PUBLIC_NAME_SIZE];
    // SAFETY: name attributes write at most HSA_PUBLIC_NAME_SIZE (64) bytes into `buf`.
    let st = unsafe { (api.fns().agent_get_info)(agent, attr, buf.as_mut_ptr().cast()) };
    api.check("hsa_agent_get_info", st)?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// `hsa_iterate_agents`, collecting device type and name.
pub(crate) fn agents(api: &HsaApi) -> Result<Vec<AgentDesc>, HsaError> {
    unsafe extern "C" fn collect(agent: Agent, data: *mut c_void) -> Status {
        // SAFETY: `data` is the `Vec<Agent>` passed below, alive for the whole iteration.
        let v = unsafe { &mut *data.cast::<Vec<Agent>>() };
        v.push(agent);
        Status::SUCCESS
    }
    let mut found: Vec<Agent> = Vec::new();
    // SAFETY: `collect` only pushes into the Vec `data` points at, which outlives the call.
    let st = unsafe { (api.fns().iterate_agents)(Some(collect), (&raw mut found).cast()) };
    api.check("hsa_iterate_agents", st)?;
    found
        .into_iter()
        .map(|agent| {
            let kind = DeviceType(agent_info::<u32>(api, agent, AgentInfo::DEVICE)?);
            let name = agent_name(api, agent, AgentInfo::NAME)?;
            Ok(AgentDesc { agent, kind, name })
        })
        .collect()
}

fn pool_info<T: CInt>(api: &HsaApi, pool: MemoryPool, attr: PoolInfo) -> Result<T, HsaError> {
    let mut v = T::default();
    // SAFETY: `v` is a `T` the caller chose to match the size ROCR writes for `attr`, and `T`
    // is a plain integer (`CInt`), valid for any bytes the runtime writes; boolean attributes
    // are read as `u8` and compared with 0.
    let st = unsafe { (api.fns().memory_pool_get_info)(pool, attr, (&raw mut v).cast()) };
    api.check("hsa_amd_memory_pool_get_info", st)?;
    Ok(v)
}

/// `hsa_amd_agent_iterate_memory_pools` on `agent`, with the attributes pool choice needs.
pub(crate) fn pools(api: &HsaApi, agent: Agent) -> Result<Vec<PoolDesc>, HsaError> {
    unsafe extern "C" fn collect(pool: MemoryPool, data: *mut c_void) -> Status {
        // SAFETY: `data` is the `Vec<MemoryPool>` passed below, alive for the whole iteration.
        let v = unsafe { &mut *data.cast::<Vec<MemoryPool>>() };
        v.push(pool);
        Status::SUCCESS
    }
    let mut found: Vec<MemoryPool> = Vec::new();
    // SAFETY: `collect` only pushes into the Vec `data` points at, which outlives the call.
    let st = unsafe {
        (api.fns().agent_iterate_memory_pools)(agent, Some(collect), (&raw mut found).cast())
    };
    api.check("hsa_amd_agent_iterate_memory_pools", st)?;
    found
        .into_iter()
        .map(|pool| {
            Ok(PoolDesc {
                pool,
                segment: Segment(pool_info::<u32>(api, pool, PoolInfo::SEGMENT)?),
                flags: pool_info::<u32>(api, pool, PoolInfo::GLOBAL_FLAGS)?,
                size: pool_info::<usize>(api, pool, PoolInfo::SIZE)?,
                granule: pool_info::<usize>(api, pool, PoolInfo::RUNTIME_ALLOC_GRANULE)?,
                rec_granule: pool_info::<usize>(api, pool, PoolInfo::RUNTIME_ALLOC_REC_GRANULE)?,
                // A C `bool` is one byte; read it as `u8`, since a Rust `bool` with any other bit
                // pattern than 0 or 1 would be undefined behaviour.
                alloc_allowed: pool_info::<u8>(api, pool, PoolInfo::RUNTIME_ALLOC_ALLOWED)? != 0,
            })
        })
        .collect()
}

/// The pools a device uses.
#[derive(Debug, Clone)]
pub(crate) struct PoolChoice {
    /// The device heap (REC_GRANULE == 0): PDI and instructions.
    pub heap: PoolDesc,
    /// Kernargs and G1 payloads (the KERNARG_INIT pool when there is one).
    pub kernarg: PoolDesc,
    /// Tensors.
    pub data: PoolDesc,
}

/// Chooses pools as ROCm's host runtime does: GLOBAL and COARSE_GRAINED, REC_GRANULE == 0 for
/// the device heap and != 0 for data, first match wins.
pub(crate) fn choose_pools(pools: &[PoolDesc]) -> Result<PoolChoice, HsaError> {
    let found = || pools.iter().map(ToString::to_string).collect::<Vec<_>>();
    let coarse_global = |p: &&PoolDesc| {
        p.segment == Segment::GLOBAL
            && p.flags & global_flag::COARSE_GRAINED != 0
            && p.alloc_allowed
    };
    let heap = pools
        .iter()
        .filter(coarse_global)
        .find(|p| p.rec_granule == 0)
        .ok_or_else(|| HsaError::NoPool {
            what: "device-heap (coarse-grained, REC_GRANULE 0)",
            found: found(),
        })?;
    let data_pools: Vec<&PoolDesc> = pools
        .iter()
        .filter(coarse_global)
        .filter(|p| p.rec_granule != 0)
        .collect();
    let kernarg = data_pools
        .iter()
        .find(|p| p.flags & global_flag::KERNARG_INIT != 0)
        .or(data_pools.first())
        .ok_or_else(|| HsaError::NoPool {
            what: "data (coarse-grained, REC_GRANULE != 0)",
            found: found(),
        })?;
    let data = data_pools
        .iter()
        .find(|p| p.flags & global_flag::KERNARG_INIT == 0)
        .unwrap_or(kernarg);
    Ok(PoolChoice {
        heap: heap.clone(),
        kernarg: (*kernarg).clone(),
        data: (*data).clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(handle: u64, flags: u32, rec: usize) -> PoolDesc {
        PoolDesc {
            pool: MemoryPool { handle },
            segment: Segment::GLOBAL,
            flags,
            size: 1 << 30,
            granule: 4096,
            rec_granule: rec,
            alloc_allowed: true,
        }
    }

    #[test]
    fn pools_are_chosen_by_granule_and_flags() {
        let aie = [pool(1, 5, 4096), pool(2, 4, 0), pool(3, 4, 4096)];
        let c = choose_pools(&aie).unwrap();
        assert_eq!(
            (
                c.heap.pool.handle,
                c.kernarg.pool.handle,
                c.data.pool.handle
            ),
            (2, 1, 3)
        );
        let only_two = [pool(1, 5, 4096), pool(2, 4, 0)];
        let c = choose_pools(&only_two).unwrap();
        assert_eq!(
            (
                c.heap.pool.handle,
                c.kernarg.pool.handle,
                c.data.pool.handle
            ),
            (2, 1, 1)
        );
        let e = choose_pools(&[pool(1, 5, 4096)]).unwrap_err();
        assert!(e.to_string().contains("no device-heap"), "{e}");
    }

    #[test]
    fn generation_follows_the_agent_name() {
        assert_eq!(Generation::from_agent_name("aie2"), Some(Generation::Npu1));
        assert_eq!(Generation::from_agent_name("AIE2P"), Some(Generation::Npu2));
        assert_eq!(
            Generation::from_agent_name("NPU Strix"),
            Some(Generation::Npu2)
        );
        assert_eq!(Generation::from_agent_name("gfx1151"), None);
        assert_eq!("npu1".parse::<Generation>().unwrap(), Generation::Npu1);
    }
}
