//! `packet_abi = "auto"`: which packet form the runtime reads, decided from what the runtime
//! shows through the function table, and never guessed.
//!
//! ROCR has no query for its AIE packet ABI (`rocr-aie.md` §0, §8), and a wrong guess is not
//! an error the runtime reports: ROCm 7.0 reads a G2 packet as G1a and dereferences a NULL
//! payload (`rocm70-observed.md`). So `auto` takes a packet form only where evidence proves
//! it, in this order:
//!
//! 1. **Kernel objects, or G2 with the AIE loader**: the runtime loads a tiny built-in AIE
//!    code object ([`super::code_object::probe`]); the releases without the AIE loader fail the
//!    load (`rocr-aie-hsaco.md` §1). A load alone proves no packet form: ROCR's July 2026
//!    development tree loads `PdiInsts` hsacos while its packets are still G2. So one packet
//!    that both forms refuse before submission, with different statuses, tells which the
//!    driver reads ([`super::ko_probe`]): `INVALID_PACKET_FORMAT` for kernel objects,
//!    `INVALID_ALLOCATION` for G2.
//! 2. **G2**: the runtime maps a vmem handle of the AIE data pool (`hsa_amd_vmem_map`). ROCm
//!    7.0 and develop of August 2025 map only KFD memory and answer `INVALID_AGENT`
//!    (reference, read in the source: `rocr-aie.md` §4.2); the newest G2 ROCR maps it (IRON
//!    runs it); the first G2 release probably does (unconfirmed there). That late 2025's G1b
//!    still answers `INVALID_AGENT` is *inferred* (its vmem code is not in the reference; the
//!    AIE vmem support read is of 2026, after G2, PR #5595, landed): were it wrong, `auto`
//!    would take a G1b runtime for G2.
//! 3. **G1a (ROCm 7.0)**: a 2025 runtime (step 2 failed) whose AIE agent reports the product
//!    name `AIE-ML`, which is what ROCm 7.0 and develop of August 2025 report (reference:
//!    `rocr-aie.md` §3; observed on ROCm 7.0 in `rocm70-observed.md`). Later releases read
//!    the product name from sysfs (`NPU Phoenix`, PR #1459, merged about 2025-10). That
//!    every runtime answering `AIE-ML` predates G1b is *inferred* from the dates (G1b is of
//!    late 2025, after PR #1459). ROCm 7.0's answer to `hsa_amd_portable_export_dmabuf` of
//!    AIE memory, `INVALID_AGENT` (observed), is recorded as corroboration.
//! 4. Anything else (a 2025 runtime with a sysfs product name: late-2025 G1b, or a develop
//!    build between PR #1459 and G1b that still reads G1a) cannot be told apart:
//!    [`HsaError::PacketAbiUnknown`] names the settings to choose from.
//!
//! The exported-symbol set does not help: every entry point this binding uses, the vmem family
//! and `hsa_amd_portable_export_dmabuf` included, is public ROCR API older than ROCm 7.0
//! (inferred from the headers; `rocr-aie.md` §4 reads the 7.0 implementations of both). The build
//! version string (`HSA_AMD_SYSTEM_INFO_BUILD_VERSION`) is recorded but not used: which ROCR
//! build strings map to which generation is unconfirmed (`rocr-aie.md` §8).

use std::ffi::c_void;
use std::sync::Arc;

use super::discover::{self, PoolChoice};
use super::encode::PacketAbi;
use super::resource::VmemAlloc;
use super::{code_object, ko_probe};
use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{Agent, AgentInfo, Status};

/// What proved the packet ABI: decisions made on it (whether G2 full ELF runs) match on this,
/// never on the sentence that says it to a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Evidence {
    /// Set in the configuration, not proven.
    Configured,
    /// The AIE loader took a code object and the driver read its packet as a kernel object.
    LoaderReadsKernelObjects,
    /// The AIE loader took a code object and the driver resolved word 48 as the PDI: a G2
    /// ROCR with the AIE loader (July 2026), which came after G2 full ELF.
    G2WithLoader,
    /// No AIE loader, but a vmem mapping of the AIE data pool (the 2026 G2 releases).
    VmemMapping,
    /// No loader, no vmem mapping, and ROCm 7.0's AIE product name.
    Rocm70ProductName,
}

/// A packet ABI, what proved it, and the sentence that says so.
pub(crate) type Proof = (PacketAbi, Evidence, String);

/// ROCm 7.0's (and develop's of August 2025) `HSA_AMD_AGENT_INFO_PRODUCT_NAME` for every NPU.
pub const ROCM_7_0_PRODUCT_NAME: &str = "AIE-ML";

/// The packet ABI `auto` proves for this runtime, the evidence, and it as one sentence.
///
/// # Errors
/// [`HsaError::PacketAbiUnknown`] when nothing proves one, naming what was seen.
pub(crate) fn prove(
    api: &Arc<HsaApi>,
    pools: &PoolChoice,
    cpu: Agent,
    aie: Agent,
) -> Result<Proof, HsaError> {
    let code_object = match code_object::probe(api, aie) {
        Ok(kernel) => {
            return Ok(match ko_probe::run(api, aie, kernel.kernel_object)? {
                ko_probe::Reads::KernelObjects => (
                    PacketAbi::KernelObject,
                    Evidence::LoaderReadsKernelObjects,
                    "auto: the runtime loaded a built-in AIE code object, and refused a packet \
                     naming its kernel object with NULL kernargs as INVALID_PACKET_FORMAT: its \
                     driver read words 20/24 as a kernel object"
                        .into(),
                ),
                ko_probe::Reads::G2 => (
                    PacketAbi::G2,
                    Evidence::G2WithLoader,
                    "auto: the runtime loaded a built-in AIE code object but refused a packet \
                     naming its kernel object as INVALID_ALLOCATION: its driver resolves word 48 \
                     as the PDI, so its packets are G2 (a G2 ROCR with the AIE loader, July 2026)"
                        .into(),
                ),
            });
        }
        Err(e) => e,
    };
    let size = pools.data.granule.max(1);
    let vmem = match VmemAlloc::new(api, pools.data.pool, size, cpu, aie) {
        Ok(v) => {
            drop(v);
            return Ok((
                PacketAbi::G2,
                Evidence::VmemMapping,
                format!(
                    "auto: the runtime loads no AIE code object but maps a vmem handle of the \
                     AIE data pool, which only the 2026 (G2) releases do (the code object: \
                     {code_object})"
                ),
            ));
        }
        Err(e) => e,
    };
    let product = discover::agent_name(api, aie, AgentInfo::AMD_PRODUCT_NAME).ok();
    let seen = format!(
        "no AIE code object loaded ({code_object}); no AIE vmem mapping ({vmem}); product name {}",
        product
            .as_deref()
            .map_or("unanswered".into(), |p| format!("{p:?}"))
    );
    if product.as_deref().map(str::trim) == Some(ROCM_7_0_PRODUCT_NAME) {
        let export = dmabuf_export_status(api, pools);
        return Ok((
            PacketAbi::G1a,
            Evidence::Rocm70ProductName,
            format!(
                "auto: ROCm 7.0 (G1a): a 2025 runtime (no AIE vmem mapping) whose AIE agent is \
                 named {ROCM_7_0_PRODUCT_NAME:?}, as only ROCm 7.0 and develop of August 2025 \
                 name it; dmabuf export of AIE memory answers {export}"
            ),
        ));
    }
    Err(HsaError::PacketAbiUnknown { evidence: seen })
}

/// What `hsa_amd_portable_export_dmabuf` answers for one page of AIE data-pool memory
/// (ROCm 7.0: `INVALID_AGENT`), as `0x....`; any fd it hands out is closed.
fn dmabuf_export_status(api: &Arc<HsaApi>, pools: &PoolChoice) -> String {
    let Some(export) = api.fns().portable_export_dmabuf else {
        return "nothing (not exported)".into();
    };
    let Ok(mem) = super::resource::PoolAlloc::new(api, pools.data.pool, pools.data.granule.max(1))
    else {
        return "nothing (no memory to try it on)".into();
    };
    let (mut fd, mut offset): (i32, u64) = (-1, 0);
    // SAFETY: `mem` is a live allocation of at least one byte; the out-pointers are locals.
    let st = unsafe {
        export(
            mem.ptr().cast::<c_void>().cast_const(),
            1,
            &mut fd,
            &mut offset,
        )
    };
    if st == Status::SUCCESS
        && fd >= 0
        && let Some(close) = api.fns().portable_close_dmabuf
    {
        // SAFETY: the runtime handed out `fd` just now; nothing else owns it.
        unsafe { close(fd) };
    }
    format!("{:#x}", st.0)
}
