//! hsa-sim: a software AMD XDNA NPU (a ROCR "AIE agent") behind ROCR's C ABI.
//!
//! Built as a `cdylib` it is a drop-in `libhsa-runtime64.so` for the AIE path; as an `rlib`
//! it fills an [`hsa_core::sys::HsaFns`] table directly ([`fns`]). Every number is ROCR's
//! (`rocr-aie.md`). It behaves as an AIE agent on a machine with no NPU: a CPU agent and an
//! AIE agent (`aie2` or `aie2p`), the AIE agent's three pools, a 64 MiB device heap, the
//! 64-packet SINGLE queue with a synchronous doorbell, signals, vmem and dmabuf export
//! (memfd-backed), and reference kernels in place of AIE cores, chosen by an emulated design's
//! `main.pdi` (see `npu_artifacts::emu`).
//!
//! # Modules
//! - [`config`]: agent generation, packet ABI, watchdog timeout (environment or [`set_config`]).
//! - `runtime`: `hsa_init`/`hsa_shut_down` reference counting, `hsa_system_get_info`.
//! - `agents`: agents and pools and their info queries.
//! - `memory`: pool allocations (one memfd each), the device heap, the address registry,
//!   dmabuf export. `vmem`: `hsa_amd_vmem_*`.
//! - `regions`: the core region API older clients use (`hsa_agent_iterate_regions`, ...).
//! - `signal`: signals and waits. `queue`: creation and indexes. `dispatch`: the doorbell and
//!   packet decoding per generation. `rules`: the checks. `kernels`: reference kernels.
//! - [`mod@counters`]: created/destroyed counts for leak tests. `status`: status strings and
//!   [`last_error`].
//!
//! # The doorbell
//!
//! A store to a queue's doorbell signal (`hsa_signal_store_screlease` or `_relaxed`; the value
//! is ignored) runs every packet from the read index to the write index as one chain before
//! it returns. Each packet is decoded for the configured generation, checked against the rules
//! below, run, retired (read index past it) and its completion signal decremented by 1 (G2,
//! G1b; handle 0 = none; G1a has none). The first failing packet stops the batch: the packets
//! before it are retired and their signals fired, the read index stays at the failing packet,
//! the queue is suspended (later doorbells do nothing; recreate the queue), and after the
//! batch the queue's error callback is called with the status from the ringing thread, as the
//! newest ROCR does. The sentence behind the status is [`last_error`] (C:
//! `hsa_sim_last_error`) and is logged with `tracing::warn!`.
//!
//! # Rules and the status each failure gives
//!
//!
//! | Rule | Enforced by (real stack) | Status |
//! |---|---|---|
//! | queue size not 64 | ROCR, at creation | `INVALID_ARGUMENT` (0x1001) |
//! | queue type MULTI or COOPERATIVE | ROCR, at creation | `INVALID_QUEUE_CREATION` (0x1002) |
//! | queue on the CPU agent or an unknown agent | ROCR, at creation | `INVALID_AGENT` (0x1004) |
//! | G2 header type not READY (0), opcode not KMQ (0) | ROCR | `INVALID_PACKET_FORMAT` (0x1009) |
//! | G2 `pdi_patch_offset` non-zero (full ELF) | not emulated | `NOT_SUPPORTED` (47) |
//! | G1 header not 0, AmdFormat not 3 (G1a) / 200 (G1b), state not NEW, count not 5+3N, payload NULL or data[0..2] not [3, 0] | ROCR / firmware | `INVALID_PACKET_FORMAT` |
//! | G1 ERT opcode not START_CU (real ROCR hangs forever) | ROCR | `INVALID_PACKET_FORMAT` |
//! | G1a packet index ≥ 64 (ROCm 7.0 reads past the ring) | ROCR | `INVALID_PACKET_FORMAT` |
//! | write index more than 64 ahead of the read index | (ring overflow) | `INVALID_ARGUMENT` |
//! | G1 batch's START_CU run exceeds the 4 KiB chain buffer (52 + 4·(6+3N) bytes per command) | amdxdna | `ERROR` (0x1000); nothing runs |
//! | G2 `num_kernargs` > 0 with NULL `kernarg_address` | ROCR | `INVALID_ARGUMENT` |
//! | completion signal handle not a live signal | ROCR | `INVALID_SIGNAL` (0x1006) |
//! | kernarg buffer (G2), insts, or an argument not a known AIE allocation (CPU pool, unknown, vmem without AIE access) or smaller than its declared size | ROCR `FindDriverMemoryHandle` | `INVALID_ALLOCATION` (0x1003) |
//! | `insts_size` zero or not a multiple of 4 | ROCR | `INVALID_ARGUMENT` |
//! | PDI not a known allocation | ROCR | `INVALID_ALLOCATION` |
//! | a 33rd distinct PDI on one queue | ROCR (32-bit CU mask) | `OUT_OF_RESOURCES` (0x1008) |
//! | PDI not in the device heap ("aie2_config_cu: Invalid BO type") | amdxdna | `ERROR` |
//! | insts not in the device heap (the firmware gets a wrong device address) | firmware | `ERROR` |
//! | PDI is a real partial PDI ("PPDI") or an xclbin | emulator limit | `NOT_SUPPORTED` (47) |
//! | PDI unrecognised or a broken emulated design | firmware | `ERROR` |
//! | insts rejected by the TXN parser | firmware | `ERROR` |
//! | insts built for the other generation (aie2 ↔ npu1/devGen 3, aie2p ↔ npu2/devGen 4) | firmware hangs, TDR fires | `ERROR` after the configured timeout ("Device isn't making progress") |
//! | fewer arguments than the TXN's DDR patches use, or one smaller than its `min_arg_size` | firmware (would corrupt memory) | `INVALID_ALLOCATION` |
//! | fewer or smaller arguments than the emulated design's buffers | emulator | `INVALID_ALLOCATION` |
//! | `fault` design | device | `ERROR` ("device error") |
//! | `hang` design | device + TDR | `ERROR` after the timeout ("Device isn't making progress") |
//! | vmem unmap while an agent still has access | ROCR (IRON's observation) | `ERROR` |
//! | vmem address free while mappings remain | ROCR | `RESOURCE_FREE` (0x100A) |
//! | vmem handle, reservation or mapping unknown | ROCR | `INVALID_ALLOCATION` |
//! | dmabuf export of memory that is no allocation / of CPU-pool memory | ROCR | `INVALID_ALLOCATION` / `INVALID_AGENT` |
//! | device-heap allocation > 64 MiB / heap full | ROCR | `INVALID_ALLOCATION` / `OUT_OF_RESOURCES` |
//!
//! # Where the emulator differs from ROCR
//!
//! - Failures are always reported the newest ROCR's way (suspend + callback), whatever the
//!   packet ABI: ROCm 7.0 (G1a) only `assert`s, so its failures are silent and its read index
//!   moves on; G1b and early G2 throw and abort the process. A queue created without a
//!   callback logs the error instead of aborting as ROCR's default handler does.
//! - A G1 packet whose ERT opcode is not START_CU fails instead of hanging the doorbell.
//! - The write index running more than 64 packets ahead of the read index fails the batch
//!   (ROCR would run overwritten slots).
//! - `hsa_amd_portable_export_dmabuf` also exports vmem mappings, and returns a memfd (with
//!   the offset of the pointer in that fd) rather than a dmabuf; `hsa_amd_portable_close_dmabuf`
//!   closes only fds the emulator handed out.
//! - vmem mappings are host-accessible at once; what `set_access` records matters only for
//!   the AIE agent (any permission but NONE makes a mapping a valid kernel argument).
//! - Several live queues are allowed (ROCR reports `QUEUES_MAX` 1 but does not enforce it);
//!   the system-wide hardware-context limit is not emulated.
//! - Timestamps and signal timeouts tick in nanoseconds (`TIMESTAMP_FREQUENCY` = 1 GHz).
//!
//! # Configuration
//! See [`config`]: `HSA_SIM_AGENT_NAME` (aie2 | aie2p, default aie2p), `HSA_SIM_PACKET_ABI`
//! (g2 | g1b | g1a, default g2), `HSA_SIM_TIMEOUT_MS` (default 2000), read at the 0→1
//! `hsa_init`, or [`set_config`].
//!
//! # Extra C symbols
//! `hsa_sim_last_error(char* buf, size_t len) -> size_t` and
//! `hsa_sim_counters(Counters* out) -> hsa_status_t`.

mod agents;
pub mod config;
pub mod counters;
mod dispatch;
mod kernels;
mod memory;
pub mod profile;
mod queue;
mod regions;
mod rules;
mod runtime;
mod signal;
mod status;
mod vmem;

pub use agents::*;
pub use config::{
    PacketAbi, SimConfig, agent_from_name, product_name, reset_config, serial_test_guard,
    set_config,
};
pub use profile::{Profile, UnknownProfile, profile_of_build_version};
pub use counters::{Counters, counters, hsa_sim_counters};
pub use memory::*;
pub use npu_artifacts::NpuGen;
pub use queue::*;
pub use regions::*;
pub use runtime::{TIMESTAMP_FREQUENCY, hsa_init, hsa_shut_down, hsa_system_get_info};
pub use signal::*;
pub use status::{
    SimError, clear_last_error, hsa_sim_last_error, hsa_status_string, last_error,
    last_error_status,
};
pub use vmem::*;

/// The emulator's entry points as a function table: how the daemon links it statically.
/// Every field, required and optional, is filled.
pub fn fns() -> hsa_core::sys::HsaFns {
    hsa_core::sys::HsaFns {
        init: hsa_init,
        shut_down: hsa_shut_down,
        status_string: hsa_status_string,
        system_get_info: hsa_system_get_info,
        iterate_agents: hsa_iterate_agents,
        agent_get_info: hsa_agent_get_info,
        agent_iterate_memory_pools: hsa_amd_agent_iterate_memory_pools,
        memory_pool_get_info: hsa_amd_memory_pool_get_info,
        memory_pool_allocate: hsa_amd_memory_pool_allocate,
        memory_pool_free: hsa_amd_memory_pool_free,
        queue_create: hsa_queue_create,
        queue_destroy: hsa_queue_destroy,
        queue_load_read_index_scacquire: hsa_queue_load_read_index_scacquire,
        queue_load_write_index_relaxed: hsa_queue_load_write_index_relaxed,
        queue_add_write_index_relaxed: hsa_queue_add_write_index_relaxed,
        signal_create: hsa_signal_create,
        signal_destroy: hsa_signal_destroy,
        signal_load_scacquire: hsa_signal_load_scacquire,
        signal_store_relaxed: hsa_signal_store_relaxed,
        signal_store_screlease: hsa_signal_store_screlease,
        signal_wait_scacquire: hsa_signal_wait_scacquire,
        vmem_handle_create: Some(hsa_amd_vmem_handle_create),
        vmem_handle_release: Some(hsa_amd_vmem_handle_release),
        vmem_address_reserve_align: Some(hsa_amd_vmem_address_reserve_align),
        vmem_address_free: Some(hsa_amd_vmem_address_free),
        vmem_map: Some(hsa_amd_vmem_map),
        vmem_unmap: Some(hsa_amd_vmem_unmap),
        vmem_set_access: Some(hsa_amd_vmem_set_access),
        vmem_get_access: Some(hsa_amd_vmem_get_access),
        vmem_export_shareable_handle: Some(hsa_amd_vmem_export_shareable_handle),
        portable_export_dmabuf: Some(hsa_amd_portable_export_dmabuf),
        portable_close_dmabuf: Some(hsa_amd_portable_close_dmabuf),
    }
}
