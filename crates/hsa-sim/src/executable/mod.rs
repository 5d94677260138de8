//! The HSA executable API: code object readers, executables, their symbols and the kernel
//! objects a dispatch names (`rocr-aie-hsaco.md` §2, §3).
//!
//! Every profile exports the eight entry points. Only `kernel-object` has ROCR's AIE section
//! loader ([`loader`]); the other releases take any code object down ROCR's GPU loader path,
//! which cannot determine an ISA for an AIE hsaco (no `EF_AMDGPU_MACH`, no ISA note) and
//! returns `HSA_STATUS_ERROR_INVALID_CODE_OBJECT` ("LoaderError: failed to determine code
//! object's ISA", ROCR `loader/executable.cpp` `ExecutableImpl::LoadCodeObject`). That is how
//! a client tells a kernel-object runtime from a G2 one (`rocr-aie-hsaco.md` §1).
//!
//! Lifetimes are ROCR's: a reader points at the caller's bytes without copying them, so they
//! must stay alive until the load returns (they are read during `load`, never after). A
//! kernel object is the address of a descriptor the loaded code object owns, whose first u32
//! is 1; it reads 0 through `KERNEL_OBJECT` until the executable is frozen and dangles after
//! `hsa_executable_destroy`, which frees every blob the load placed in the device heap and, if
//! any kernel was `PdiInsts`, bumps the agent's PDI-release epoch so queues drop their PDI
//! caches.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::Arc;

use hsa_core::sys::{
    AIE_KERNARG_ALIGNMENT, Agent, CodeObjectReader, Executable, ExecutableSymbol,
    FloatRoundingMode, HsaProfile, LoadedCodeObject, Status, SymbolInfo, SymbolKind, SymbolLinkage,
};

use crate::agents::AgentKind;
use crate::counters::{Counter, bump};
use crate::runtime::{guard, next_handle, report, runtime};
use crate::status::SimError;

pub(crate) mod loader;

pub(crate) use loader::{KernelBody, KernelDescriptor};

/// A reader: the caller's bytes, by address.
#[derive(Debug, Clone, Copy)]
struct Reader {
    addr: usize,
    len: usize,
}

/// One symbol of an executable: a kernel for one agent.
#[derive(Debug)]
pub(crate) struct SymbolObj {
    pub handle: u64,
    pub name: String,
    pub agent: Agent,
    pub kernarg_size: u32,
    pub kernel: Arc<KernelDescriptor>,
}

#[derive(Debug, Default)]
struct ExecutableObj {
    frozen: bool,
    symbols: Vec<SymbolObj>,
    /// Device-heap addresses of every blob its loads placed.
    blobs: Vec<usize>,
    /// Whether a loaded kernel is `PdiInsts` (destroying it resets the queues' PDI caches).
    pdi_insts: bool,
}

/// The runtime's readers, executables and live kernel descriptors.
#[derive(Debug, Default)]
pub(crate) struct CodeObjects {
    readers: HashMap<u64, Reader>,
    executables: HashMap<u64, ExecutableObj>,
    /// Symbol handle → executable handle.
    symbols: HashMap<u64, u64>,
    /// Kernel object (descriptor address) → descriptor, from load until destroy.
    kernels: HashMap<u64, Arc<KernelDescriptor>>,
    /// `AieAgent::ReleasePdis`: bumped when an executable with `PdiInsts` kernels is
    /// destroyed; a queue that sees it change empties its PDI cache.
    pub pdi_epoch: u64,
}

impl CodeObjects {
    /// The live descriptor a kernel object names, if this runtime loaded it and it was not
    /// destroyed.
    pub fn kernel(&self, kernel_object: u64) -> Option<Arc<KernelDescriptor>> {
        self.kernels.get(&kernel_object).cloned()
    }
}

fn err(status: Status, detail: impl Into<String>) -> SimError {
    SimError::new(status, detail)
}

fn not_initialised(st: Status) -> SimError {
    err(st, "the runtime is not initialised (call hsa_init first)")
}

/// `hsa_code_object_reader_create_from_memory`: a reader over `size` bytes at `code_object`.
/// The bytes are not copied; they are read when a load uses the reader.
///
/// # Safety
/// `code_object` points at `size` readable bytes that stay valid until every load through
/// the reader has returned; `reader` is null (the call fails) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_code_object_reader_create_from_memory(
    code_object: *const c_void,
    size: usize,
    reader: *mut CodeObjectReader,
) -> Status {
    guard(|| {
        report((|| {
            let rt = runtime().map_err(not_initialised)?;
            if code_object.is_null() || size == 0 || reader.is_null() {
                return Err(err(
                    Status::ERROR_INVALID_ARGUMENT,
                    "hsa_code_object_reader_create_from_memory: the code object is NULL, its size \
                     is 0, or the reader pointer is NULL",
                ));
            }
            let handle = next_handle();
            rt.code().readers.insert(
                handle,
                Reader {
                    addr: code_object as usize,
                    len: size,
                },
            );
            bump(Counter::CodeObjectReadersCreated);
            // SAFETY: `reader` is non-null and valid for one write by the contract.
            unsafe { reader.write(CodeObjectReader { handle }) };
            Ok(())
        })())
    })
}

/// `hsa_code_object_reader_destroy`.
///
/// # Safety
/// None beyond the handle being any value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_code_object_reader_destroy(reader: CodeObjectReader) -> Status {
    guard(|| {
        report((|| {
            let rt = runtime().map_err(not_initialised)?;
            rt.code().readers.remove(&reader.handle).ok_or_else(|| {
                err(
                    Status::ERROR_INVALID_CODE_OBJECT_READER,
                    format!(
                        "hsa_code_object_reader_destroy: {:#x} is not a live code object reader",
                        reader.handle
                    ),
                )
            })?;
            bump(Counter::CodeObjectReadersDestroyed);
            Ok(())
        })())
    })
}

/// `hsa_executable_create_alt`: an empty, unfrozen executable. The profile and rounding mode
/// must be values `hsa.h` defines; ROCR's AIE branch does not compare them with the code
/// object (`rocr-aie-hsaco.md` §3).
///
/// # Safety
/// `executable` is null (the call fails) or valid for one write; `options` is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_executable_create_alt(
    profile: HsaProfile,
    rounding: FloatRoundingMode,
    _options: *const c_char,
    executable: *mut Executable,
) -> Status {
    guard(|| {
        report((|| {
            let rt = runtime().map_err(not_initialised)?;
            if executable.is_null() || profile.name().is_none() || rounding.name().is_none() {
                return Err(err(
                    Status::ERROR_INVALID_ARGUMENT,
                    format!(
                        "hsa_executable_create_alt: profile {profile:?}, rounding mode \
                         {rounding:?}, or a NULL executable pointer"
                    ),
                ));
            }
            let handle = next_handle();
            rt.code()
                .executables
                .insert(handle, ExecutableObj::default());
            bump(Counter::ExecutablesCreated);
            // SAFETY: `executable` is non-null and valid for one write by the contract.
            unsafe { executable.write(Executable { handle }) };
            Ok(())
        })())
    })
}

/// `hsa_executable_load_agent_code_object`: loads the reader's code object for `agent`.
///
/// On `kernel-object` with the AIE agent and an hsaco, ROCR's AIE loader runs (see
/// the crate docs for every failure and its status); anything else goes down the GPU loader path
/// and fails with `INVALID_CODE_OBJECT`.
///
/// # Safety
/// The reader's bytes are readable (see [`hsa_code_object_reader_create_from_memory`]);
/// `loaded` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_executable_load_agent_code_object(
    executable: Executable,
    agent: Agent,
    reader: CodeObjectReader,
    _options: *const c_char,
    loaded: *mut LoadedCodeObject,
) -> Status {
    guard(|| {
        report((|| {
            let rt = runtime().map_err(not_initialised)?;
            let mut code = rt.code();
            let exec = code.executables.get(&executable.handle).ok_or_else(|| {
                err(
                    Status::ERROR_INVALID_EXECUTABLE,
                    format!(
                        "hsa_executable_load_agent_code_object: {:#x} is not a live executable",
                        executable.handle
                    ),
                )
            })?;
            let r = *code.readers.get(&reader.handle).ok_or_else(|| {
                err(
                    Status::ERROR_INVALID_CODE_OBJECT_READER,
                    format!(
                        "hsa_executable_load_agent_code_object: {:#x} is not a live code object \
                         reader",
                        reader.handle
                    ),
                )
            })?;
            if exec.frozen {
                return Err(err(
                    Status::ERROR_FROZEN_EXECUTABLE,
                    "hsa_executable_load_agent_code_object: the executable is already frozen",
                ));
            }
            // SAFETY: the reader's contract keeps its `len` bytes at `addr` readable until
            // this load returns; the slice is dropped before it does.
            let bytes = unsafe { std::slice::from_raw_parts(r.addr as *const u8, r.len) };
            let aie = rt.agent_kind(agent) == Some(AgentKind::Aie);
            let profile = rt.config.profile;
            if !(aie && profile.loads_code_objects() && npu_artifacts::hsaco::is_hsaco(bytes)) {
                let why = if !aie {
                    "the agent is not the AIE agent".to_owned()
                } else if !profile.loads_code_objects() {
                    format!(
                        "this runtime ({profile}) has no AIE section loader: AIE hsacos load only \
                         on a ROCR with the AIE loader (kernel-object, rocr-g2-2026-07)"
                    )
                } else {
                    "the code object has no AIE section (none of 48 bytes or more starting with \
                     \"AIEK\")"
                        .to_owned()
                };
                return Err(err(
                    Status::ERROR_INVALID_CODE_OBJECT,
                    format!(
                        "hsa_executable_load_agent_code_object: LoaderError: failed to determine \
                         code object's ISA ({why}; the GPU loader path cannot load it)"
                    ),
                ));
            }
            let defined: Vec<String> = exec
                .symbols
                .iter()
                .filter(|s| s.agent == agent)
                .map(|s| s.name.clone())
                .collect();
            let loaded_object = {
                let mut mem = rt.memory();
                loader::load(
                    &mut mem,
                    rt.config.agent,
                    bytes,
                    &defined,
                    profile.loads_full_elf_code_objects(),
                )?
            };
            let exec = code
                .executables
                .get_mut(&executable.handle)
                .ok_or_else(|| err(Status::ERROR_INVALID_EXECUTABLE, "executable vanished"))?;
            exec.blobs.extend(loaded_object.blobs);
            let mut new_symbols = Vec::new();
            for k in loaded_object.kernels {
                exec.pdi_insts |= matches!(k.descriptor.body, KernelBody::PdiInsts { .. });
                let handle = next_handle();
                let kernel = Arc::new(k.descriptor);
                new_symbols.push((handle, kernel.clone()));
                exec.symbols.push(SymbolObj {
                    handle,
                    name: k.name,
                    agent,
                    kernarg_size: k.kernarg_size,
                    kernel,
                });
            }
            for (handle, kernel) in new_symbols {
                code.symbols.insert(handle, executable.handle);
                code.kernels.insert(kernel.kernel_object(), kernel);
            }
            if !loaded.is_null() {
                // SAFETY: `loaded` is non-null and valid for one write by the contract.
                unsafe {
                    loaded.write(LoadedCodeObject {
                        handle: next_handle(),
                    })
                };
            }
            Ok(())
        })())
    })
}

/// `hsa_executable_freeze`: from now on `KERNEL_OBJECT` reads the descriptors' addresses.
///
/// # Safety
/// None beyond the handle being any value; `options` is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_executable_freeze(
    executable: Executable,
    _options: *const c_char,
) -> Status {
    guard(|| {
        report((|| {
            let rt = runtime().map_err(not_initialised)?;
            let mut code = rt.code();
            let exec = code
                .executables
                .get_mut(&executable.handle)
                .ok_or_else(|| {
                    err(
                        Status::ERROR_INVALID_EXECUTABLE,
                        format!(
                            "hsa_executable_freeze: {:#x} is not a live executable",
                            executable.handle
                        ),
                    )
                })?;
            if exec.frozen {
                return Err(err(
                    Status::ERROR_FROZEN_EXECUTABLE,
                    "hsa_executable_freeze: the executable is already frozen",
                ));
            }
            exec.frozen = true;
            Ok(())
        })())
    })
}

/// `hsa_executable_get_symbol_by_name`. AIE kernels are agent symbols: pass the AIE agent.
/// With a NULL agent the lookup is among program symbols, where ROCR does not put AIE kernels
/// (`rocr-aie-hsaco.md` §3), so it fails with `INVALID_SYMBOL_NAME`.
///
/// # Safety
/// `name` is null (the call fails) or a NUL-terminated string; `agent` is null or valid for
/// one read; `symbol` is null (the call fails) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_executable_get_symbol_by_name(
    executable: Executable,
    name: *const c_char,
    agent: *const Agent,
    symbol: *mut ExecutableSymbol,
) -> Status {
    guard(|| {
        report((|| {
            let rt = runtime().map_err(not_initialised)?;
            let code = rt.code();
            let exec = code.executables.get(&executable.handle).ok_or_else(|| {
                err(
                    Status::ERROR_INVALID_EXECUTABLE,
                    format!(
                        "hsa_executable_get_symbol_by_name: {:#x} is not a live executable",
                        executable.handle
                    ),
                )
            })?;
            if name.is_null() || symbol.is_null() {
                return Err(err(
                    Status::ERROR_INVALID_ARGUMENT,
                    "hsa_executable_get_symbol_by_name: NULL name or symbol pointer",
                ));
            }
            // SAFETY: `name` is a non-null NUL-terminated string by the contract.
            let wanted = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            // SAFETY: `agent` is null or valid for one read by the contract.
            let agent = unsafe { agent.as_ref() }.copied();
            let Some(agent) = agent else {
                return Err(err(
                    Status::ERROR_INVALID_SYMBOL_NAME,
                    format!(
                        "hsa_executable_get_symbol_by_name: no program symbol {wanted:?}; AIE \
                         kernels are agent symbols, so pass the AIE agent"
                    ),
                ));
            };
            let found = exec
                .symbols
                .iter()
                .find(|s| s.agent == agent && s.name == wanted)
                .ok_or_else(|| {
                    let known: Vec<&str> = exec
                        .symbols
                        .iter()
                        .filter(|s| s.agent == agent)
                        .take(8)
                        .map(|s| s.name.as_str())
                        .collect();
                    err(
                        Status::ERROR_INVALID_SYMBOL_NAME,
                        format!(
                            "hsa_executable_get_symbol_by_name: no symbol {wanted:?} for agent \
                             {:#x}; it has {known:?}",
                            agent.handle
                        ),
                    )
                })?;
            // SAFETY: `symbol` is non-null and valid for one write by the contract.
            unsafe {
                symbol.write(ExecutableSymbol {
                    handle: found.handle,
                })
            };
            Ok(())
        })())
    })
}

/// `hsa_executable_symbol_get_info` for an AIE kernel symbol (`rocr-aie-hsaco.md` §3):
/// `KERNEL_OBJECT` (u64, 0 until frozen), `KERNEL_KERNARG_SEGMENT_SIZE` (u32), its alignment
/// (u32, 64), group and private segment sizes (u32, 0), `TYPE` (KERNEL), `LINKAGE` (PROGRAM),
/// `NAME_LENGTH` (u32) and `NAME` (not NUL-terminated), `AGENT`, `IS_DEFINITION` (true). Any
/// other attribute fails with `INVALID_ARGUMENT`.
///
/// # Safety
/// `value` is null (the call fails) or valid for a write of the attribute's type (for `NAME`,
/// `NAME_LENGTH` bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_executable_symbol_get_info(
    symbol: ExecutableSymbol,
    attribute: SymbolInfo,
    value: *mut c_void,
) -> Status {
    guard(|| {
        report((|| {
            let rt = runtime().map_err(not_initialised)?;
            let code = rt.code();
            let s = code
                .symbols
                .get(&symbol.handle)
                .and_then(|e| code.executables.get(e))
                .and_then(|e| {
                    e.symbols
                        .iter()
                        .find(|s| s.handle == symbol.handle)
                        .map(|s| (e.frozen, s))
                })
                .ok_or_else(|| {
                    err(
                        Status::ERROR_INVALID_EXECUTABLE_SYMBOL,
                        format!(
                            "hsa_executable_symbol_get_info: {:#x} is not a symbol of a live \
                             executable",
                            symbol.handle
                        ),
                    )
                })?;
            let (frozen, s) = s;
            if value.is_null() {
                return Err(err(
                    Status::ERROR_INVALID_ARGUMENT,
                    "hsa_executable_symbol_get_info: NULL value pointer",
                ));
            }
            let name_len = u32::try_from(s.name.len()).unwrap_or(u32::MAX);
            // SAFETY: `value` is non-null and, by the contract, valid for a write of the
            // attribute's type (NAME: `NAME_LENGTH` bytes); every write is unaligned-safe.
            unsafe {
                match attribute {
                    SymbolInfo::KERNEL_OBJECT => {
                        let ko = if frozen { s.kernel.kernel_object() } else { 0 };
                        value.cast::<u64>().write_unaligned(ko);
                    }
                    SymbolInfo::KERNEL_KERNARG_SEGMENT_SIZE => {
                        value.cast::<u32>().write_unaligned(s.kernarg_size);
                    }
                    SymbolInfo::KERNEL_KERNARG_SEGMENT_ALIGNMENT => {
                        value.cast::<u32>().write_unaligned(AIE_KERNARG_ALIGNMENT);
                    }
                    SymbolInfo::KERNEL_GROUP_SEGMENT_SIZE
                    | SymbolInfo::KERNEL_PRIVATE_SEGMENT_SIZE => {
                        value.cast::<u32>().write_unaligned(0);
                    }
                    SymbolInfo::TYPE => value.cast::<u32>().write_unaligned(SymbolKind::KERNEL.0),
                    SymbolInfo::LINKAGE => {
                        value
                            .cast::<u32>()
                            .write_unaligned(SymbolLinkage::PROGRAM.0);
                    }
                    SymbolInfo::NAME_LENGTH => value.cast::<u32>().write_unaligned(name_len),
                    SymbolInfo::NAME => std::ptr::copy_nonoverlapping(
                        s.name.as_ptr(),
                        value.cast::<u8>(),
                        s.name.len(),
                    ),
                    SymbolInfo::AGENT => value.cast::<Agent>().write_unaligned(s.agent),
                    SymbolInfo::IS_DEFINITION => value.cast::<u8>().write(1),
                    other => {
                        return Err(err(
                            Status::ERROR_INVALID_ARGUMENT,
                            format!(
                                "hsa_executable_symbol_get_info: attribute {other:?} does not \
                                 apply to an AIE kernel symbol"
                            ),
                        ));
                    }
                }
            }
            Ok(())
        })())
    })
}

/// `hsa_executable_destroy`: frees every blob its loads placed and drops its descriptors
/// (their kernel objects dangle). If a kernel was `PdiInsts`, the PDI-release epoch moves so
/// every queue empties its PDI cache before its next batch.
///
/// # Safety
/// None beyond the handle being any value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_executable_destroy(executable: Executable) -> Status {
    guard(|| {
        report((|| {
            let rt = runtime().map_err(not_initialised)?;
            let mut code = rt.code();
            let exec = code.executables.remove(&executable.handle).ok_or_else(|| {
                err(
                    Status::ERROR_INVALID_EXECUTABLE,
                    format!(
                        "hsa_executable_destroy: {:#x} is not a live executable",
                        executable.handle
                    ),
                )
            })?;
            if exec.pdi_insts {
                code.pdi_epoch += 1;
            }
            for s in &exec.symbols {
                code.symbols.remove(&s.handle);
                code.kernels.remove(&s.kernel.kernel_object());
            }
            drop(code);
            loader::free_blobs(&mut rt.memory(), &exec.blobs);
            bump(Counter::ExecutablesDestroyed);
            Ok(())
        })())
    })
}
