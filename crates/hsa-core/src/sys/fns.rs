//! The function table: one typed pointer per ROCR entry point the binding calls.
//!
//! [`HsaFns`] is filled either by resolving symbols in a loaded `libhsa-runtime64.so`
//! (`crate::api::HsaApi::open`) or from statically linked `extern "C"` functions (how the
//! emulator, `hsa-sim`, is linked into the daemon). Required entry points are plain function
//! pointers; the ones older runtimes lack are `Option`.

use std::ffi::{c_char, c_int, c_void};

use super::{
    AccessDesc, AccessPermission, Agent, AgentInfo, CodeObjectReader, Executable, ExecutableSymbol,
    FloatRoundingMode, HsaProfile, LoadedCodeObject, MemoryPool, MemoryType, PoolInfo, Queue,
    QueueType, Signal, SignalCondition, SignalValue, Status, SymbolInfo, SystemInfo, VmemHandle,
    WaitState,
};

/// Callback of `hsa_iterate_agents`.
pub type AgentCallback = unsafe extern "C" fn(agent: Agent, data: *mut c_void) -> Status;
/// Callback of `hsa_amd_agent_iterate_memory_pools`.
pub type PoolCallback = unsafe extern "C" fn(pool: MemoryPool, data: *mut c_void) -> Status;
/// The queue error callback given to `hsa_queue_create`.
pub type QueueErrorCallback =
    unsafe extern "C" fn(status: Status, queue: *mut Queue, data: *mut c_void);

/// Declares [`HsaFns`] and the list of C symbol names, in one place so they cannot drift.
macro_rules! fn_table {
    (
        required { $( $rname:ident = $rsym:literal : fn($($rarg:ty),*) $(-> $rret:ty)? ; )* }
        optional { $( $oname:ident = $osym:literal : fn($($oarg:ty),*) $(-> $oret:ty)? ; )* }
    ) => {
        /// Typed pointers to ROCR's entry points. Field names drop the `hsa_`/`hsa_amd_`
        /// prefix; each field's doc alias is its C name.
        #[derive(Clone, Copy)]
        pub struct HsaFns {
            $(
                #[doc(alias = $rsym)]
                pub $rname: unsafe extern "C" fn($($rarg),*) $(-> $rret)?,
            )*
            $(
                #[doc(alias = $osym)]
                pub $oname: Option<unsafe extern "C" fn($($oarg),*) $(-> $oret)?>,
            )*
        }

        impl HsaFns {
            /// C names of the entry points a runtime must export.
            pub const REQUIRED: &'static [&'static str] = &[$($rsym),*];
            /// C names of the entry points used when present.
            pub const OPTIONAL: &'static [&'static str] = &[$($osym),*];

            /// Resolves every entry point through `lookup`, which returns a symbol's address or
            /// null. A missing required symbol is returned as `Err(name)`.
            ///
            /// # Safety
            /// Every non-null address `lookup` returns must be the C function of that name with
            /// the signature ROCR's headers give it, valid for as long as the table is used.
            pub unsafe fn resolve(
                mut lookup: impl FnMut(&'static str) -> *const c_void,
            ) -> Result<Self, &'static str> {
                Ok(Self {
                    $(
                        $rname: {
                            let p = lookup($rsym);
                            if p.is_null() {
                                return Err($rsym);
                            }
                            // SAFETY: the caller guarantees that this non-null address is the
                            // function named `$rsym` with exactly this signature.
                            unsafe { std::mem::transmute::<*const c_void, unsafe extern "C" fn($($rarg),*) $(-> $rret)?>(p) }
                        },
                    )*
                    $(
                        $oname: {
                            let p = lookup($osym);
                            if p.is_null() {
                                None
                            } else {
                                // SAFETY: as above, for the optional symbol `$osym`.
                                Some(unsafe { std::mem::transmute::<*const c_void, unsafe extern "C" fn($($oarg),*) $(-> $oret)?>(p) })
                            }
                        },
                    )*
                })
            }

            /// Names of the optional entry points this table lacks.
            pub fn missing_optional(&self) -> Vec<&'static str> {
                let mut v = Vec::new();
                $( if self.$oname.is_none() { v.push($osym); } )*
                v
            }
        }

        impl std::fmt::Debug for HsaFns {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("HsaFns")
                    .field("required", &Self::REQUIRED.len())
                    .field("missing_optional", &self.missing_optional())
                    .finish()
            }
        }
    };
}

fn_table! {
    required {
        init = "hsa_init": fn() -> Status;
        shut_down = "hsa_shut_down": fn() -> Status;
        status_string = "hsa_status_string": fn(Status, *mut *const c_char) -> Status;
        system_get_info = "hsa_system_get_info": fn(SystemInfo, *mut c_void) -> Status;
        iterate_agents = "hsa_iterate_agents": fn(Option<AgentCallback>, *mut c_void) -> Status;
        agent_get_info = "hsa_agent_get_info": fn(Agent, AgentInfo, *mut c_void) -> Status;
        agent_iterate_memory_pools = "hsa_amd_agent_iterate_memory_pools":
            fn(Agent, Option<PoolCallback>, *mut c_void) -> Status;
        memory_pool_get_info = "hsa_amd_memory_pool_get_info":
            fn(MemoryPool, PoolInfo, *mut c_void) -> Status;
        memory_pool_allocate = "hsa_amd_memory_pool_allocate":
            fn(MemoryPool, usize, u32, *mut *mut c_void) -> Status;
        memory_pool_free = "hsa_amd_memory_pool_free": fn(*mut c_void) -> Status;
        queue_create = "hsa_queue_create": fn(
            Agent, u32, QueueType, Option<QueueErrorCallback>, *mut c_void, u32, u32,
            *mut *mut Queue
        ) -> Status;
        queue_destroy = "hsa_queue_destroy": fn(*mut Queue) -> Status;
        queue_load_read_index_scacquire = "hsa_queue_load_read_index_scacquire":
            fn(*const Queue) -> u64;
        queue_load_write_index_relaxed = "hsa_queue_load_write_index_relaxed":
            fn(*const Queue) -> u64;
        queue_add_write_index_relaxed = "hsa_queue_add_write_index_relaxed":
            fn(*const Queue, u64) -> u64;
        signal_create = "hsa_signal_create":
            fn(SignalValue, u32, *const Agent, *mut Signal) -> Status;
        signal_destroy = "hsa_signal_destroy": fn(Signal) -> Status;
        signal_load_scacquire = "hsa_signal_load_scacquire": fn(Signal) -> SignalValue;
        signal_store_relaxed = "hsa_signal_store_relaxed": fn(Signal, SignalValue);
        signal_store_screlease = "hsa_signal_store_screlease": fn(Signal, SignalValue);
        signal_wait_scacquire = "hsa_signal_wait_scacquire":
            fn(Signal, SignalCondition, SignalValue, u64, WaitState) -> SignalValue;
    }
    optional {
        vmem_handle_create = "hsa_amd_vmem_handle_create":
            fn(MemoryPool, usize, MemoryType, u64, *mut VmemHandle) -> Status;
        vmem_handle_release = "hsa_amd_vmem_handle_release": fn(VmemHandle) -> Status;
        vmem_address_reserve_align = "hsa_amd_vmem_address_reserve_align":
            fn(*mut *mut c_void, usize, u64, u64, u64) -> Status;
        vmem_address_free = "hsa_amd_vmem_address_free": fn(*mut c_void, usize) -> Status;
        vmem_map = "hsa_amd_vmem_map": fn(*mut c_void, usize, usize, VmemHandle, u64) -> Status;
        vmem_unmap = "hsa_amd_vmem_unmap": fn(*mut c_void, usize) -> Status;
        vmem_set_access = "hsa_amd_vmem_set_access":
            fn(*mut c_void, usize, *const AccessDesc, usize) -> Status;
        vmem_get_access = "hsa_amd_vmem_get_access":
            fn(*mut c_void, *mut AccessPermission, Agent) -> Status;
        vmem_export_shareable_handle = "hsa_amd_vmem_export_shareable_handle":
            fn(*mut c_int, VmemHandle, u64) -> Status;
        portable_export_dmabuf = "hsa_amd_portable_export_dmabuf":
            fn(*const c_void, usize, *mut c_int, *mut u64) -> Status;
        portable_close_dmabuf = "hsa_amd_portable_close_dmabuf": fn(c_int) -> Status;
        // The executable API (`hsa.h`): how a kernel-object runtime loads an AIE hsaco
        // (`rocr-aie-hsaco.md` §3). Every ROCR exports these; only a kernel-object ROCR loads
        // an AIE hsaco with them.
        code_object_reader_create_from_memory = "hsa_code_object_reader_create_from_memory":
            fn(*const c_void, usize, *mut CodeObjectReader) -> Status;
        code_object_reader_destroy = "hsa_code_object_reader_destroy":
            fn(CodeObjectReader) -> Status;
        executable_create_alt = "hsa_executable_create_alt":
            fn(HsaProfile, FloatRoundingMode, *const c_char, *mut Executable) -> Status;
        executable_load_agent_code_object = "hsa_executable_load_agent_code_object":
            fn(Executable, Agent, CodeObjectReader, *const c_char, *mut LoadedCodeObject)
                -> Status;
        executable_freeze = "hsa_executable_freeze": fn(Executable, *const c_char) -> Status;
        executable_get_symbol_by_name = "hsa_executable_get_symbol_by_name":
            fn(Executable, *const c_char, *const Agent, *mut ExecutableSymbol) -> Status;
        executable_symbol_get_info = "hsa_executable_symbol_get_info":
            fn(ExecutableSymbol, SymbolInfo, *mut c_void) -> Status;
        executable_destroy = "hsa_executable_destroy": fn(Executable) -> Status;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_lists_have_no_duplicates() {
        let mut all: Vec<_> = HsaFns::REQUIRED.iter().chain(HsaFns::OPTIONAL).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(HsaFns::REQUIRED.contains(&"hsa_signal_store_screlease"));
        assert!(HsaFns::OPTIONAL.contains(&"hsa_amd_vmem_map"));
        assert!(HsaFns::OPTIONAL.contains(&"hsa_executable_load_agent_code_object"));
    }

    #[test]
    fn resolve_names_the_first_missing_required_symbol() {
        // SAFETY: the lookup never returns a non-null address, so nothing is transmuted.
        let err = unsafe { HsaFns::resolve(|_| std::ptr::null()) }.unwrap_err();
        assert_eq!(err, "hsa_init");
    }
}
