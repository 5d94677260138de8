//! Code objects: an AIE hsaco loaded through ROCR's executable API (`rocr-aie-hsaco.md` §3).
//!
//! A loaded kernel is a code object reader over the hsaco's bytes, an executable the reader
//! was loaded into for the AIE agent and then frozen, and the kernel's symbol, whose
//! `KERNEL_OBJECT` a kernel-object packet names. ROCR keeps pointers into the reader's buffer
//! while it loads, so the bytes live as long as the reader. Teardown follows ROCR's own tests:
//! the executable is destroyed first (ROCR frees the blobs it placed in the device heap and
//! bumps the agent's PDI-release epoch, so queues flush their PDI cache), then the reader.
//! A queue that ran the kernel may outlive the executable: the epoch makes it drop the PDI.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use npu_artifacts::NpuGen;
use npu_artifacts::emu::EmuDesign;
use npu_artifacts::hsaco::{HsacoBuilder, PdiInstsKernel};

use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{
    Agent, CodeObjectReader, Executable, ExecutableSymbol, FloatRoundingMode, HsaProfile,
    SymbolInfo,
};

/// Names the optional executable-API symbol `$field` for an [`HsaError::Unsupported`] error.
macro_rules! exe_fn {
    ($api:expr, $field:ident, $sym:literal) => {
        $api.fns().$field.ok_or(HsaError::Unsupported {
            operation: "loading a code object",
            symbol: $sym,
        })?
    };
}

/// A code object reader and the bytes it reads.
#[derive(Debug)]
pub(crate) struct ReaderOwner {
    api: Arc<HsaApi>,
    reader: CodeObjectReader,
    /// ROCR reads from this buffer (it does not copy it): it must outlive the reader.
    _bytes: Vec<u8>,
}

impl ReaderOwner {
    fn from_memory(api: &Arc<HsaApi>, bytes: Vec<u8>) -> Result<Self, HsaError> {
        let create = exe_fn!(
            api,
            code_object_reader_create_from_memory,
            "hsa_code_object_reader_create_from_memory"
        );
        // Checked up front so that Drop can always destroy what was created.
        exe_fn!(
            api,
            code_object_reader_destroy,
            "hsa_code_object_reader_destroy"
        );
        let mut reader = CodeObjectReader::default();
        // SAFETY: `bytes` is a live buffer of `bytes.len()` bytes that this owner keeps alive
        // (its heap allocation does not move) until after the reader is destroyed.
        let st = unsafe { create(bytes.as_ptr().cast::<c_void>(), bytes.len(), &mut reader) };
        api.check("hsa_code_object_reader_create_from_memory", st)?;
        Ok(Self {
            api: api.clone(),
            reader,
            _bytes: bytes,
        })
    }
}

impl Drop for ReaderOwner {
    fn drop(&mut self) {
        if let Some(destroy) = self.api.fns().code_object_reader_destroy {
            // SAFETY: the reader was created by this owner and is destroyed exactly once.
            let st = unsafe { destroy(self.reader) };
            if let Err(e) = self.api.check("hsa_code_object_reader_destroy", st) {
                tracing::warn!(error = %e, "destroying a code object reader failed");
            }
        }
    }
}

/// An executable; `Drop` destroys it (and with it every descriptor its symbols named).
#[derive(Debug)]
pub(crate) struct ExecutableOwner {
    api: Arc<HsaApi>,
    exe: Executable,
}

impl ExecutableOwner {
    fn new(api: &Arc<HsaApi>) -> Result<Self, HsaError> {
        let create = exe_fn!(api, executable_create_alt, "hsa_executable_create_alt");
        exe_fn!(api, executable_destroy, "hsa_executable_destroy");
        let mut exe = Executable::default();
        // SAFETY: `exe` is a valid out-pointer; a null options string is allowed.
        let st = unsafe {
            create(
                HsaProfile::FULL,
                FloatRoundingMode::DEFAULT,
                std::ptr::null(),
                &mut exe,
            )
        };
        api.check("hsa_executable_create_alt", st)?;
        Ok(Self {
            api: api.clone(),
            exe,
        })
    }

    fn load(&self, agent: Agent, reader: &ReaderOwner) -> Result<(), HsaError> {
        let load = exe_fn!(
            self.api,
            executable_load_agent_code_object,
            "hsa_executable_load_agent_code_object"
        );
        // SAFETY: the executable and the reader are live; null options and a null
        // loaded-code-object out-pointer are allowed.
        let st = unsafe {
            load(
                self.exe,
                agent,
                reader.reader,
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        };
        self.api.check("hsa_executable_load_agent_code_object", st)
    }

    fn freeze(&self) -> Result<(), HsaError> {
        let freeze = exe_fn!(self.api, executable_freeze, "hsa_executable_freeze");
        // SAFETY: the executable is live; null options are allowed.
        let st = unsafe { freeze(self.exe, std::ptr::null()) };
        self.api.check("hsa_executable_freeze", st)
    }

    /// The symbol `name` for `agent` (AIE kernels are agent symbols: a null agent would look
    /// among program symbols, where ROCR does not put them).
    fn symbol(&self, name: &str, agent: Agent) -> Result<ExecutableSymbol, HsaError> {
        let get = exe_fn!(
            self.api,
            executable_get_symbol_by_name,
            "hsa_executable_get_symbol_by_name"
        );
        let cname = CString::new(name).map_err(|_| {
            HsaError::InvalidArgument(format!("kernel name {name:?} contains a NUL byte"))
        })?;
        let mut sym = ExecutableSymbol::default();
        // SAFETY: the executable is live, `cname` is NUL-terminated, `agent` and `sym` are
        // valid for the call.
        let st = unsafe { get(self.exe, cname.as_ptr(), &agent, &mut sym) };
        self.api.check("hsa_executable_get_symbol_by_name", st)?;
        Ok(sym)
    }

    fn symbol_u64(&self, sym: ExecutableSymbol, attr: SymbolInfo) -> Result<u64, HsaError> {
        let info = exe_fn!(
            self.api,
            executable_symbol_get_info,
            "hsa_executable_symbol_get_info"
        );
        let mut v: u64 = 0;
        // SAFETY: the attributes read through this function write at most 8 bytes (a u64 or
        // a u32 into the zeroed low half).
        let st = unsafe { info(sym, attr, (&raw mut v).cast()) };
        self.api.check("hsa_executable_symbol_get_info", st)?;
        Ok(v)
    }
}

impl Drop for ExecutableOwner {
    fn drop(&mut self) {
        if let Some(destroy) = self.api.fns().executable_destroy {
            // SAFETY: the executable was created by this owner and is destroyed exactly once.
            let st = unsafe { destroy(self.exe) };
            if let Err(e) = self.api.check("hsa_executable_destroy", st) {
                tracing::warn!(error = %e, "destroying an executable failed");
            }
        }
    }
}

/// A kernel of a loaded, frozen executable.
///
/// Fields drop in order: the executable before the reader (ROCR's own order).
#[derive(Debug)]
pub(crate) struct LoadedKernel {
    _exe: ExecutableOwner,
    _reader: ReaderOwner,
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT`: what a packet's words 20/24 hold.
    pub(crate) kernel_object: u64,
}

impl LoadedKernel {
    /// Reader, create_alt, load for `agent`, freeze, symbol `kernel` with the agent, and its
    /// kernel object (which must be non-zero once frozen).
    pub(crate) fn load(
        api: &Arc<HsaApi>,
        agent: Agent,
        bytes: Vec<u8>,
        kernel: &str,
    ) -> Result<Self, HsaError> {
        let reader = ReaderOwner::from_memory(api, bytes)?;
        let exe = ExecutableOwner::new(api)?;
        exe.load(agent, &reader)?;
        exe.freeze()?;
        let sym = exe.symbol(kernel, agent)?;
        let kernel_object = exe.symbol_u64(sym, SymbolInfo::KERNEL_OBJECT)?;
        if kernel_object == 0 {
            return Err(HsaError::Contract {
                call: "hsa_executable_symbol_get_info",
                detail: format!("kernel {kernel:?} has kernel object 0 after freeze"),
            });
        }
        Ok(Self {
            _exe: exe,
            _reader: reader,
            kernel_object,
        })
    }
}

/// The kernel name the built-in probe and in-memory packing use.
pub(crate) const PACKED_KERNEL: &str = "npud";

/// One `PdiInsts` kernel named [`PACKED_KERNEL`] for `arch`.
fn packed(pdi: &[u8], insts: &[u8], num_cols: u32, args: u32) -> PdiInstsKernel {
    PdiInstsKernel {
        name: PACKED_KERNEL.into(),
        pdi: pdi.to_vec(),
        insts: insts.to_vec(),
        num_cols: num_cols.max(1),
        kernarg_size: args.saturating_mul(16),
    }
}

fn pack_err(e: npu_artifacts::ArtifactError) -> HsaError {
    HsaError::InvalidArgument(format!("packing the program as a code object: {e}"))
}

/// Packs a PDI and its instruction stream into an hsaco holding one `PdiInsts` kernel named
/// [`PACKED_KERNEL`] in the `arch` section.
pub(crate) fn pack_pdi_insts(
    arch: NpuGen,
    pdi: &[u8],
    insts: &[u8],
    num_cols: u32,
    args: u32,
) -> Result<Vec<u8>, HsaError> {
    let mut b = HsacoBuilder::new();
    b.pdi_insts(arch, packed(pdi, insts, num_cols, args))
        .map_err(pack_err)?;
    b.build().map_err(pack_err)
}

/// Whether the runtime loads AIE code objects: load a tiny built-in hsaco (an emulated
/// passthrough kernel in both arch sections, never run) on `agent`. The loaded kernel when it
/// loaded and has a non-zero kernel object after freeze (dropping it destroys it); otherwise
/// the call that failed.
pub(crate) fn probe(api: &Arc<HsaApi>, agent: Agent) -> Result<LoadedKernel, HsaError> {
    let design = EmuDesign::passthrough(64);
    // Passthrough takes three buffers (in, out, trace).
    let mut b = HsacoBuilder::new();
    for arch in [NpuGen::Npu1, NpuGen::Npu2] {
        b.pdi_insts(arch, packed(&design.to_pdi(), &design.insts(arch), 1, 3))
            .map_err(pack_err)?;
    }
    let bytes = b.build().map_err(pack_err)?;
    LoadedKernel::load(api, agent, bytes, PACKED_KERNEL)
}
