//! Raw C ABI of ROCR (`libhsa-runtime64.so`) as the AIE path uses it.
//!
//! Every number here comes from ROCR's public headers (`hsa.h`, `hsa_ext_amd.h`,
//! `hsa_ext_amd_aie.h`); the layout tests at the bottom of each file pin the sizes and offsets.
//! C enums and status codes are `#[repr(transparent)]` newtypes over their integer so that a
//! value this crate has never heard of stays representable: nothing here is ever transmuted
//! into a Rust enum.
//!
//! Nothing in this module is safe to call on its own; the checked wrappers live in
//! [`crate::api`] and the safe types in [`crate::device`].

mod fns;
mod packet;

pub use fns::*;
pub use packet::*;

use std::ffi::c_void;

/// Defines a `#[repr(transparent)]` newtype over a C integer with named constants.
macro_rules! c_newtype {
    (
        $(#[$meta:meta])*
        $name:ident($int:ty) { $( $(#[$cmeta:meta])* $cname:ident = $value:expr ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $int);

        impl $name {
            $( $(#[$cmeta])* pub const $cname: Self = Self($value); )*

            /// The constant's name, when this value has one.
            pub fn name(self) -> Option<&'static str> {
                match self {
                    $( Self::$cname => Some(stringify!($cname)), )*
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}::{}({:#x})", stringify!($name), n, self.0),
                    None => write!(f, "{}({:#x})", stringify!($name), self.0),
                }
            }
        }
    };
}

c_newtype! {
    /// `hsa_status_t`. Core codes are hexadecimal from 0x1000; AMD extension codes are decimal.
    #[doc(alias = "hsa_status_t")]
    Status(u32) {
        SUCCESS = 0,
        INFO_BREAK = 1,
        ERROR = 0x1000,
        ERROR_INVALID_ARGUMENT = 0x1001,
        ERROR_INVALID_QUEUE_CREATION = 0x1002,
        ERROR_INVALID_ALLOCATION = 0x1003,
        ERROR_INVALID_AGENT = 0x1004,
        ERROR_INVALID_REGION = 0x1005,
        ERROR_INVALID_SIGNAL = 0x1006,
        ERROR_INVALID_QUEUE = 0x1007,
        ERROR_OUT_OF_RESOURCES = 0x1008,
        ERROR_INVALID_PACKET_FORMAT = 0x1009,
        ERROR_RESOURCE_FREE = 0x100A,
        ERROR_NOT_INITIALIZED = 0x100B,
        ERROR_REFCOUNT_OVERFLOW = 0x100C,
        ERROR_INCOMPATIBLE_ARGUMENTS = 0x100D,
        ERROR_INVALID_INDEX = 0x100E,
        ERROR_INVALID_ISA = 0x100F,
        ERROR_INVALID_CODE_OBJECT = 0x1010,
        ERROR_INVALID_EXECUTABLE = 0x1011,
        ERROR_FROZEN_EXECUTABLE = 0x1012,
        ERROR_INVALID_SYMBOL_NAME = 0x1013,
        ERROR_VARIABLE_ALREADY_DEFINED = 0x1014,
        ERROR_VARIABLE_UNDEFINED = 0x1015,
        ERROR_EXCEPTION = 0x1016,
        ERROR_INVALID_ISA_NAME = 0x1017,
        ERROR_INVALID_CODE_SYMBOL = 0x1018,
        ERROR_INVALID_EXECUTABLE_SYMBOL = 0x1019,
        ERROR_INVALID_FILE = 0x1020,
        ERROR_INVALID_CODE_OBJECT_READER = 0x1021,
        ERROR_INVALID_CACHE = 0x1022,
        ERROR_INVALID_WAVEFRONT = 0x1023,
        ERROR_INVALID_SIGNAL_GROUP = 0x1024,
        ERROR_INVALID_RUNTIME_STATE = 0x1025,
        ERROR_FATAL = 0x1026,
        AMD_ERROR_INVALID_MEMORY_POOL = 40,
        AMD_ERROR_MEMORY_APERTURE_VIOLATION = 41,
        AMD_ERROR_ILLEGAL_INSTRUCTION = 42,
        AMD_ERROR_MEMORY_FAULT = 43,
        AMD_ERROR_CU_MASK_REDUCED = 44,
        AMD_ERROR_OUT_OF_REGISTERS = 45,
        AMD_ERROR_RESOURCE_BUSY = 46,
        AMD_ERROR_NOT_SUPPORTED = 47,
        AMD_ERROR_XNACK_DISABLED = 48,
    }
}

impl Status {
    /// True for `SUCCESS` and `INFO_BREAK` (an iteration stopped by its callback).
    pub fn is_ok(self) -> bool {
        self == Self::SUCCESS || self == Self::INFO_BREAK
    }
}

/// `hsa_agent_t`.
#[doc(alias = "hsa_agent_t")]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Agent {
    pub handle: u64,
}

/// `hsa_signal_t`. Handle 0 means "no signal" where a packet takes one.
#[doc(alias = "hsa_signal_t")]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Signal {
    pub handle: u64,
}

/// `hsa_amd_memory_pool_t`.
#[doc(alias = "hsa_amd_memory_pool_t")]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MemoryPool {
    pub handle: u64,
}

/// `hsa_amd_vmem_alloc_handle_t`.
#[doc(alias = "hsa_amd_vmem_alloc_handle_t")]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct VmemHandle {
    pub handle: u64,
}

/// `hsa_code_object_reader_t`: a code object in memory, as the loader will read it.
#[doc(alias = "hsa_code_object_reader_t")]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CodeObjectReader {
    pub handle: u64,
}

/// `hsa_executable_t`: loaded code objects and their symbols.
#[doc(alias = "hsa_executable_t")]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Executable {
    pub handle: u64,
}

/// `hsa_executable_symbol_t`: one symbol of an executable, for one agent.
#[doc(alias = "hsa_executable_symbol_t")]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ExecutableSymbol {
    pub handle: u64,
}

/// `hsa_loaded_code_object_t`: what `hsa_executable_load_agent_code_object` may return.
#[doc(alias = "hsa_loaded_code_object_t")]
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct LoadedCodeObject {
    pub handle: u64,
}

/// `hsa_signal_value_t` (the large machine model: 64 bits, signed).
#[doc(alias = "hsa_signal_value_t")]
pub type SignalValue = i64;

/// `hsa_queue_t`, 40 bytes. The runtime owns it; the binding only reads it.
#[doc(alias = "hsa_queue_t")]
#[repr(C)]
#[derive(Debug)]
pub struct Queue {
    pub type_: u32,
    pub features: u32,
    /// The ring: `size` packets of 64 bytes.
    pub base_address: *mut c_void,
    /// Storing to this signal rings the doorbell; on the AIE queue the store returns when the
    /// batch has completed.
    pub doorbell_signal: Signal,
    /// Ring size in packets (64 on the AIE agent).
    pub size: u32,
    pub reserved1: u32,
    pub id: u64,
}

/// `hsa_amd_memory_access_desc_t`, 16 bytes (the permission is padded to 8).
#[doc(alias = "hsa_amd_memory_access_desc_t")]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessDesc {
    pub permissions: AccessPermission,
    pub agent_handle: Agent,
}

c_newtype! {
    /// `hsa_device_type_t`.
    #[doc(alias = "hsa_device_type_t")]
    DeviceType(u32) { CPU = 0, GPU = 1, DSP = 2, AIE = 3 }
}

c_newtype! {
    /// `hsa_agent_info_t` together with the AMD extension ids of `hsa_amd_agent_info_t`
    /// (the same parameter of `hsa_agent_get_info` takes both).
    #[doc(alias = "hsa_agent_info_t")]
    AgentInfo(u32) {
        NAME = 0,
        VENDOR_NAME = 1,
        FEATURE = 2,
        MACHINE_MODEL = 3,
        PROFILE = 4,
        DEFAULT_FLOAT_ROUNDING_MODE = 5,
        WAVEFRONT_SIZE = 6,
        WORKGROUP_MAX_DIM = 7,
        WORKGROUP_MAX_SIZE = 8,
        GRID_MAX_DIM = 9,
        GRID_MAX_SIZE = 10,
        FBARRIER_MAX_SIZE = 11,
        QUEUES_MAX = 12,
        QUEUE_MIN_SIZE = 13,
        QUEUE_MAX_SIZE = 14,
        QUEUE_TYPE = 15,
        NODE = 16,
        DEVICE = 17,
        CACHE_SIZE = 18,
        ISA = 19,
        EXTENSIONS = 20,
        VERSION_MAJOR = 21,
        VERSION_MINOR = 22,
        BASE_PROFILE_DEFAULT_FLOAT_ROUNDING_MODES = 23,
        FAST_F16_OPERATION = 24,
        AMD_CHIP_ID = 0xA000,
        AMD_DRIVER_NODE_ID = 0xA004,
        AMD_BDFID = 0xA006,
        AMD_PRODUCT_NAME = 0xA009,
        AMD_UUID = 0xA011,
        AMD_NEAREST_CPU = 0xA113,
    }
}

/// Size of the buffers `NAME`, `VENDOR_NAME` and `AMD_PRODUCT_NAME` write (`HSA_PUBLIC_NAME_SIZE`).
pub const PUBLIC_NAME_SIZE: usize = 64;

/// `HSA_AGENT_FEATURE_AGENT_DISPATCH`: what the AIE agent reports for `FEATURE`.
pub const AGENT_FEATURE_AGENT_DISPATCH: u32 = 2;

c_newtype! {
    /// `hsa_system_info_t` (the ids this binding reads).
    #[doc(alias = "hsa_system_info_t")]
    SystemInfo(u32) {
        VERSION_MAJOR = 0,
        VERSION_MINOR = 1,
        TIMESTAMP = 2,
        TIMESTAMP_FREQUENCY = 3,
        SIGNAL_MAX_WAIT = 4,
        ENDIANNESS = 5,
        MACHINE_MODEL = 6,
        EXTENSIONS = 7,
        /// `HSA_AMD_SYSTEM_INFO_BUILD_VERSION`: writes a `const char*`.
        AMD_BUILD_VERSION = 0x200,
    }
}

c_newtype! {
    /// `hsa_amd_memory_pool_info_t`.
    #[doc(alias = "hsa_amd_memory_pool_info_t")]
    PoolInfo(u32) {
        SEGMENT = 0,
        GLOBAL_FLAGS = 1,
        SIZE = 2,
        RUNTIME_ALLOC_ALLOWED = 5,
        RUNTIME_ALLOC_GRANULE = 6,
        RUNTIME_ALLOC_ALIGNMENT = 7,
        ACCESSIBLE_BY_ALL = 15,
        ALLOC_MAX_SIZE = 16,
        LOCATION = 17,
        RUNTIME_ALLOC_REC_GRANULE = 18,
    }
}

c_newtype! {
    /// `hsa_amd_segment_t`.
    #[doc(alias = "hsa_amd_segment_t")]
    Segment(u32) { GLOBAL = 0, READONLY = 1, PRIVATE = 2, GROUP = 3 }
}

/// `hsa_amd_memory_pool_global_flag_t` bits.
#[doc(alias = "hsa_amd_memory_pool_global_flag_t")]
pub mod global_flag {
    pub const KERNARG_INIT: u32 = 1;
    pub const FINE_GRAINED: u32 = 2;
    pub const COARSE_GRAINED: u32 = 4;
    pub const EXTENDED_SCOPE_FINE_GRAINED: u32 = 8;
}

c_newtype! {
    /// `hsa_amd_memory_pool_location_t`.
    PoolLocation(u32) { CPU = 0, GPU = 1 }
}

c_newtype! {
    /// `hsa_amd_memory_type_t`.
    #[doc(alias = "hsa_amd_memory_type_t")]
    MemoryType(u32) { NONE = 0, PINNED = 1 }
}

/// `HSA_AMD_VMEM_ADDRESS_NO_REGISTER`: reserve a plain anonymous range.
pub const VMEM_ADDRESS_NO_REGISTER: u64 = 1;

c_newtype! {
    /// `hsa_access_permission_t`.
    #[doc(alias = "hsa_access_permission_t")]
    AccessPermission(u32) { NONE = 0, RO = 1, WO = 2, RW = 3 }
}

c_newtype! {
    /// `hsa_queue_type_t` (passed as `hsa_queue_type32_t`).
    #[doc(alias = "hsa_queue_type_t")]
    QueueType(u32) { MULTI = 0, SINGLE = 1, COOPERATIVE = 2 }
}

c_newtype! {
    /// `hsa_signal_condition_t`.
    #[doc(alias = "hsa_signal_condition_t")]
    SignalCondition(u32) { EQ = 0, NE = 1, LT = 2, GTE = 3 }
}

c_newtype! {
    /// `hsa_wait_state_t`.
    #[doc(alias = "hsa_wait_state_t")]
    WaitState(u32) { BLOCKED = 0, ACTIVE = 1 }
}

c_newtype! {
    /// `hsa_fence_scope_t`.
    #[doc(alias = "hsa_fence_scope_t")]
    FenceScope(u32) { NONE = 0, AGENT = 1, SYSTEM = 2 }
}

c_newtype! {
    /// `hsa_profile_t`: what `hsa_executable_create_alt` is built for. Named `HsaProfile`
    /// because "profile" in this workspace means an emulated ROCR release.
    #[doc(alias = "hsa_profile_t")]
    HsaProfile(u32) { BASE = 0, FULL = 1 }
}

c_newtype! {
    /// `hsa_default_float_rounding_mode_t`.
    #[doc(alias = "hsa_default_float_rounding_mode_t")]
    FloatRoundingMode(u32) { DEFAULT = 0, ZERO = 1, NEAR = 2 }
}

c_newtype! {
    /// `hsa_executable_symbol_info_t`: the attributes `hsa_executable_symbol_get_info` reads.
    /// The numbers are not in declaration order in `hsa.h`; these are its values.
    #[doc(alias = "hsa_executable_symbol_info_t")]
    SymbolInfo(u32) {
        /// `hsa_symbol_kind_t` (u32).
        TYPE = 0,
        /// u32, without the terminating NUL.
        NAME_LENGTH = 1,
        /// `NAME_LENGTH` chars, not NUL-terminated.
        NAME = 2,
        MODULE_NAME_LENGTH = 3,
        MODULE_NAME = 4,
        /// `hsa_symbol_linkage_t` (u32).
        LINKAGE = 5,
        VARIABLE_ALLOCATION = 6,
        VARIABLE_SEGMENT = 7,
        VARIABLE_ALIGNMENT = 8,
        VARIABLE_SIZE = 9,
        VARIABLE_IS_CONST = 10,
        /// u32.
        KERNEL_KERNARG_SEGMENT_SIZE = 11,
        /// u32.
        KERNEL_KERNARG_SEGMENT_ALIGNMENT = 12,
        /// u32.
        KERNEL_GROUP_SEGMENT_SIZE = 13,
        /// u32.
        KERNEL_PRIVATE_SEGMENT_SIZE = 14,
        KERNEL_DYNAMIC_CALLSTACK = 15,
        INDIRECT_FUNCTION_CALL_CONVENTION = 16,
        /// bool (one byte).
        IS_DEFINITION = 17,
        KERNEL_CALL_CONVENTION = 18,
        /// `hsa_agent_t`.
        AGENT = 20,
        VARIABLE_ADDRESS = 21,
        /// u64: the handle a dispatch packet names; 0 until the executable is frozen.
        KERNEL_OBJECT = 22,
        INDIRECT_FUNCTION_OBJECT = 23,
    }
}

c_newtype! {
    /// `hsa_symbol_kind_t`.
    #[doc(alias = "hsa_symbol_kind_t")]
    SymbolKind(u32) { VARIABLE = 0, KERNEL = 1, INDIRECT_FUNCTION = 2 }
}

c_newtype! {
    /// `hsa_symbol_linkage_t`.
    #[doc(alias = "hsa_symbol_linkage_t")]
    SymbolLinkage(u32) { MODULE = 0, PROGRAM = 1 }
}

/// The kernarg alignment ROCR reports for an AIE kernel symbol
/// (`KERNEL_KERNARG_SEGMENT_ALIGNMENT`, `rocr-aie-hsaco.md` §3).
pub const AIE_KERNARG_ALIGNMENT: u32 = 64;

c_newtype! {
    /// `hsa_packet_type_t` (the low 8 bits of an AQL header).
    #[doc(alias = "hsa_packet_type_t")]
    PacketType(u8) {
        VENDOR_SPECIFIC = 0,
        INVALID = 1,
        KERNEL_DISPATCH = 2,
        BARRIER_AND = 3,
        AGENT_DISPATCH = 4,
        BARRIER_OR = 5,
    }
}

/// AQL header bit positions (`hsa_packet_header_t`).
pub mod header {
    pub const TYPE_SHIFT: u16 = 0;
    pub const BARRIER_SHIFT: u16 = 8;
    pub const ACQUIRE_FENCE_SCOPE_SHIFT: u16 = 9;
    pub const RELEASE_FENCE_SCOPE_SHIFT: u16 = 11;
}

/// The AIE queue's fixed size in packets (`QUEUE_MIN_SIZE == QUEUE_MAX_SIZE == 64`).
pub const AIE_QUEUE_SIZE: u32 = 64;

/// The most packets hsa-core puts behind one doorbell, whatever their size (IRON rings as
/// often). Fewer fit when the commands are large: see [`CHAIN_BUFFER_BYTES`].
pub const MAX_PACKETS_PER_DOORBELL: usize = 32;

/// The amdxdna driver's command-chain buffer (`MAX_CHAIN_CMDBUF_SIZE`): every command of one
/// doorbell batch must fit in it on runtimes that do not split batches (G1a, G1b, early G2).
pub const CHAIN_BUFFER_BYTES: usize = 4096;

/// Bytes of one slot header (`cmd_chain_slot_npu`) in the chain buffer; each slot then holds
/// its command's payload dwords.
pub const CHAIN_SLOT_HEADER_BYTES: usize = 52;

/// At most this many distinct PDIs per queue (the CU mask is 32 bits).
pub const MAX_PDIS_PER_QUEUE: usize = 32;

/// The process device heap ROCR creates on the XDNA device.
pub const DEVICE_HEAP_SIZE: usize = 64 << 20;

/// Alignment of allocations from the device heap (`AMDXDNA_BO_DEV`).
pub const DEVICE_HEAP_ALIGNMENT: usize = 32 << 10;

/// Device address of the device heap's first byte.
pub const DEVICE_HEAP_DEVICE_BASE: u64 = 0x0400_0000;

/// The mask ROCR applies to a device-heap VA before adding [`DEVICE_HEAP_DEVICE_BASE`].
pub const DEV_ADDR_OFFSET_MASK: u64 = 0x02FF_FFFF;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn handles_are_one_u64() {
        for (size, align) in [
            (size_of::<Agent>(), align_of::<Agent>()),
            (size_of::<Signal>(), align_of::<Signal>()),
            (size_of::<MemoryPool>(), align_of::<MemoryPool>()),
            (size_of::<VmemHandle>(), align_of::<VmemHandle>()),
        ] {
            assert_eq!((size, align), (8, 8));
        }
        assert_eq!(size_of::<SignalValue>(), 8);
        assert_eq!(size_of::<Status>(), 4);
    }

    #[test]
    fn queue_layout_matches_hsa_queue_t() {
        assert_eq!(size_of::<Queue>(), 40);
        assert_eq!(offset_of!(Queue, type_), 0);
        assert_eq!(offset_of!(Queue, features), 4);
        assert_eq!(offset_of!(Queue, base_address), 8);
        assert_eq!(offset_of!(Queue, doorbell_signal), 16);
        assert_eq!(offset_of!(Queue, size), 24);
        assert_eq!(offset_of!(Queue, reserved1), 28);
        assert_eq!(offset_of!(Queue, id), 32);
    }

    #[test]
    fn access_desc_is_16_bytes_with_padded_permission() {
        assert_eq!(size_of::<AccessDesc>(), 16);
        assert_eq!(offset_of!(AccessDesc, permissions), 0);
        assert_eq!(offset_of!(AccessDesc, agent_handle), 8);
    }

    #[test]
    fn status_values_match_the_headers() {
        assert_eq!(Status::ERROR_OUT_OF_RESOURCES.0, 4104);
        assert_eq!(Status::ERROR_NOT_INITIALIZED.0, 0x100B);
        assert_eq!(Status::ERROR_FATAL.0, 0x1026);
        assert_eq!(Status::AMD_ERROR_MEMORY_FAULT.0, 43);
        assert_eq!(Status(0x4242).name(), None);
        assert_eq!(format!("{:?}", Status::ERROR), "Status::ERROR(0x1000)");
        assert_eq!(format!("{:?}", Status(0x4242)), "Status(0x4242)");
    }

    #[test]
    fn executable_api_values_match_hsa_h() {
        for (size, align) in [
            (
                size_of::<CodeObjectReader>(),
                align_of::<CodeObjectReader>(),
            ),
            (size_of::<Executable>(), align_of::<Executable>()),
            (
                size_of::<ExecutableSymbol>(),
                align_of::<ExecutableSymbol>(),
            ),
            (
                size_of::<LoadedCodeObject>(),
                align_of::<LoadedCodeObject>(),
            ),
        ] {
            assert_eq!((size, align), (8, 8));
        }
        assert_eq!(HsaProfile::FULL.0, 1);
        assert_eq!(FloatRoundingMode::DEFAULT.0, 0);
        assert_eq!(FloatRoundingMode::NEAR.0, 2);
        assert_eq!(SymbolInfo::KERNEL_OBJECT.0, 22);
        assert_eq!(SymbolInfo::KERNEL_KERNARG_SEGMENT_SIZE.0, 11);
        assert_eq!(SymbolInfo::KERNEL_KERNARG_SEGMENT_ALIGNMENT.0, 12);
        assert_eq!(SymbolInfo::AGENT.0, 20);
        assert_eq!(SymbolInfo::IS_DEFINITION.0, 17);
        assert_eq!(SymbolKind::KERNEL.0, 1);
        assert_eq!(SymbolLinkage::PROGRAM.0, 1);
        assert_eq!(Status::ERROR_INVALID_CODE_OBJECT_READER.0, 0x1021);
    }

    #[test]
    fn info_ids_match_the_headers() {
        assert_eq!(AgentInfo::DEVICE.0, 17);
        assert_eq!(AgentInfo::QUEUE_MIN_SIZE.0, 13);
        assert_eq!(AgentInfo::AMD_PRODUCT_NAME.0, 0xA009);
        assert_eq!(AgentInfo::AMD_NEAREST_CPU.0, 0xA113);
        assert_eq!(PoolInfo::RUNTIME_ALLOC_REC_GRANULE.0, 18);
        assert_eq!(PoolInfo::RUNTIME_ALLOC_GRANULE.0, 6);
        assert_eq!(SystemInfo::SIGNAL_MAX_WAIT.0, 4);
        assert_eq!(SystemInfo::AMD_BUILD_VERSION.0, 0x200);
        assert_eq!(DeviceType::AIE.0, 3);
        assert_eq!(QueueType::SINGLE.0, 1);
        assert_eq!(global_flag::KERNARG_INIT | global_flag::COARSE_GRAINED, 5);
    }
}
