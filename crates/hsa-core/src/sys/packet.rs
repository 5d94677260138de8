//! The AIE packet layouts ROCR has spoken (`rocr-aie.md` §0, §2; `rocr-aie-hsaco.md` §1).
//!
//! ROCR cannot be asked which one it speaks, so the caller chooses:
//! - **kernel object**: [`AieKernelObjectPacket`], the same 64 bytes as G2 with words 20/24
//!   naming a kernel object (`HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT` of a loaded AIE hsaco)
//!   and words 40/48 reserved;
//! - **G2**: [`AieDispatchPacket`] (`hsa_amd_aie_kernel_dispatch_packet_t`);
//! - **G1b**: [`ErtPacket`] with `AmdFormat` 200 and a completion signal at offset 48;
//! - **G1a**: [`ErtPacket`] with `AmdFormat` 3, header 0, no completion signal (ROCm 7.0).
//!
//! Addresses are carried as `u64`: every supported target is 64-bit, and a packet is plain data
//! copied into the runtime's ring.

use super::Signal;

/// `HSA_AMD_AIE_PACKET_TYPE_READY`: the G2 header's type field (same number as
/// `HSA_PACKET_TYPE_VENDOR_SPECIFIC`).
pub const AIE_PACKET_TYPE_READY: u16 = 0;
/// `HSA_AMD_AIE_PACKET_TYPE_INVALID`.
pub const AIE_PACKET_TYPE_INVALID: u16 = 1;
/// `HSA_AMD_AIE_PACKET_OPCODE_KMQ`: the only G2 opcode.
pub const AIE_PACKET_OPCODE_KMQ: u16 = 0;
/// The G2 header IRON and rocrtst write: READY with SYSTEM acquire and release scope.
pub const AIE_DISPATCH_HEADER: u16 = AIE_PACKET_TYPE_READY | (2 << 9) | (2 << 11);
/// The G2 `count` field: bytes after `completion_signal` up to `kernarg_address`.
pub const AIE_DISPATCH_COUNT: u16 = 24;

/// `hsa_amd_aie_kernel_dispatch_packet_t` (G2), 64 bytes.
///
/// `kernarg_address` points at `2 * num_kernargs` u64: the argument VAs, then their byte sizes.
#[doc(alias = "hsa_amd_aie_kernel_dispatch_packet_t")]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AieDispatchPacket {
    pub header: u16,
    pub opcode: u16,
    pub count: u16,
    pub reserved0: u8,
    pub reserved1: u8,
    pub completion_signal: Signal,
    pub reserved2: u32,
    pub insts_addr_low: u32,
    pub insts_addr_high: u32,
    pub num_kernargs: u16,
    pub reserved3: u16,
    pub kernarg_address: u64,
    /// Size of the instruction sequence in bytes (a multiple of 4).
    pub insts_size: u64,
    pub pdi_addr: u64,
    /// `reserved4`, later `pdi_patch_offset` (0 selects PDI + insts).
    pub reserved4: u64,
}

impl AieDispatchPacket {
    /// The instruction sequence's host VA, from its two halves.
    pub fn insts_addr(&self) -> u64 {
        u64::from(self.insts_addr_low) | (u64::from(self.insts_addr_high) << 32)
    }
}

/// The kernel-object form of `hsa_amd_aie_kernel_dispatch_packet_t`, 64 bytes
/// (`rocr-aie-hsaco.md` §1).
///
/// Header, opcode, count, completion signal and the kernarg block are G2's. Words 20/24 hold the
/// kernel object, a host pointer to a runtime-owned kernel descriptor whose first u32 is
/// [`AIE_KERNEL_DESCRIPTOR_VERSION`]; it stays valid from `hsa_executable_freeze` until
/// `hsa_executable_destroy`. Words 40 and 48 are reserved and must be 0 (the driver does not
/// read them). A kernel-object ROCR reads a G2 packet's instruction address as a descriptor
/// pointer: the two forms cannot be told apart by the runtime, only by the caller.
#[doc(alias = "hsa_amd_aie_kernel_dispatch_packet_t")]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AieKernelObjectPacket {
    pub header: u16,
    pub opcode: u16,
    pub count: u16,
    pub reserved0: u8,
    pub reserved1: u8,
    pub completion_signal: Signal,
    pub reserved2: u32,
    pub kernel_object_low: u32,
    pub kernel_object_high: u32,
    pub num_kernargs: u16,
    pub reserved3: u16,
    pub kernarg_address: u64,
    /// G2's `insts_size`; reserved, 0.
    pub reserved_insts_size: u64,
    /// G2's `pdi_addr`; reserved, 0.
    pub reserved_pdi_addr: u64,
    pub reserved4: u64,
}

impl AieKernelObjectPacket {
    /// The kernel object, from its two halves.
    pub fn kernel_object(&self) -> u64 {
        u64::from(self.kernel_object_low) | (u64::from(self.kernel_object_high) << 32)
    }

    /// Stores `kernel_object` in its two halves.
    pub fn set_kernel_object(&mut self, kernel_object: u64) {
        self.kernel_object_low = (kernel_object & 0xFFFF_FFFF) as u32;
        self.kernel_object_high = (kernel_object >> 32) as u32;
    }
}

/// `kAieKernelDescriptorVersion`: the first u32 of every AIE kernel descriptor, the only word
/// of it that is ABI (`rocr-aie-hsaco.md` §2).
pub const AIE_KERNEL_DESCRIPTOR_VERSION: u32 = 1;

/// `HSA_AMD_PACKET_TYPE_AIE_ERT`: the G1a `AmdFormat`.
pub const AMD_PACKET_TYPE_AIE_ERT: u8 = 3;
/// `HSA_AMD_PACKET_TYPE_RESERVED200`: the G1b `AmdFormat`.
pub const AMD_PACKET_TYPE_RESERVED200: u8 = 200;

/// `hsa_amd_aie_ert_state` values.
pub mod ert_state {
    pub const NEW: u32 = 1;
    pub const QUEUED: u32 = 2;
    pub const RUNNING: u32 = 3;
    pub const COMPLETED: u32 = 4;
    pub const ERROR: u32 = 5;
    pub const ABORT: u32 = 6;
    pub const SUBMITTED: u32 = 7;
    pub const TIMEOUT: u32 = 8;
    pub const NORESPONSE: u32 = 9;
    pub const SKERROR: u32 = 10;
    pub const SKCRASHED: u32 = 11;
}

/// `hsa_amd_aie_ert_cmd_opcode_t` values this crate names.
pub mod ert_opcode {
    pub const START_CU: u32 = 0;
    pub const CMD_CHAIN: u32 = 19;
    pub const START_NPU: u32 = 20;
}

/// `hsa_amd_aie_ert_packet_t` (G1a and G1b), 64 bytes.
///
/// The word at offset 4 is the ERT bitfield, LSB first: `state:4`, `custom:8`, `count:11`,
/// `opcode:5`, `type:4` (see [`ErtPacket::bits`]). In G1b the u64 at offset 48 is the
/// completion signal; in G1a it is reserved.
#[doc(alias = "hsa_amd_aie_ert_packet_t")]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErtPacket {
    pub header: u16,
    pub amd_format: u8,
    pub reserved: u8,
    pub ert: u32,
    pub reserved0: u64,
    pub reserved1: u64,
    pub reserved2: u64,
    pub reserved3: u64,
    pub reserved4: u64,
    /// `reserved5` in G1a, `completion_signal` in G1b.
    pub completion_signal: Signal,
    /// Host pointer to an [`ErtStartKernelData`] payload.
    pub payload_data: u64,
}

/// The ERT bitfield of [`ErtPacket::ert`], unpacked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErtBits {
    pub state: u32,
    pub custom: u32,
    pub count: u32,
    pub opcode: u32,
    pub type_: u32,
}

impl ErtBits {
    /// Packs the fields; values wider than their field are masked.
    pub fn pack(self) -> u32 {
        (self.state & 0xF)
            | (self.custom & 0xFF) << 4
            | (self.count & 0x7FF) << 12
            | (self.opcode & 0x1F) << 23
            | (self.type_ & 0xF) << 28
    }

    /// Unpacks a bitfield word.
    pub fn unpack(word: u32) -> Self {
        Self {
            state: word & 0xF,
            custom: (word >> 4) & 0xFF,
            count: (word >> 12) & 0x7FF,
            opcode: (word >> 23) & 0x1F,
            type_: (word >> 28) & 0xF,
        }
    }
}

impl ErtPacket {
    /// The unpacked ERT bitfield.
    pub fn bits(&self) -> ErtBits {
        ErtBits::unpack(self.ert)
    }
}

/// Head of `hsa_amd_aie_ert_start_kernel_data_t`: `{ void* pdi_addr; uint32_t data[]; }`.
///
/// `data` follows at offset 8: `[3, 0, insts_lo, insts_hi, insts_dwords, (arg_lo, arg_hi) * N,
/// arg_size * N]`, so the packet's `count` is `5 + 3N`.
#[doc(alias = "hsa_amd_aie_ert_start_kernel_data_t")]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErtStartKernelData {
    pub pdi_addr: u64,
}

/// Offset of `data[]` in [`ErtStartKernelData`].
pub const ERT_PAYLOAD_DATA_OFFSET: usize = 8;
/// `data[0..2]`: the transaction opcode (3) as a u64.
pub const ERT_TXN_OPCODE: u32 = 3;

/// Dword count of a G1 payload with `n` arguments (the packet's `count` field).
pub const fn ert_payload_count(n: usize) -> usize {
    5 + 3 * n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn g2_layout_matches_the_reference() {
        assert_eq!(size_of::<AieDispatchPacket>(), 64);
        assert_eq!(align_of::<AieDispatchPacket>(), 8);
        assert_eq!(offset_of!(AieDispatchPacket, header), 0);
        assert_eq!(offset_of!(AieDispatchPacket, opcode), 2);
        assert_eq!(offset_of!(AieDispatchPacket, count), 4);
        assert_eq!(offset_of!(AieDispatchPacket, reserved0), 6);
        assert_eq!(offset_of!(AieDispatchPacket, reserved1), 7);
        assert_eq!(offset_of!(AieDispatchPacket, completion_signal), 8);
        assert_eq!(offset_of!(AieDispatchPacket, reserved2), 16);
        assert_eq!(offset_of!(AieDispatchPacket, insts_addr_low), 20);
        assert_eq!(offset_of!(AieDispatchPacket, insts_addr_high), 24);
        assert_eq!(offset_of!(AieDispatchPacket, num_kernargs), 28);
        assert_eq!(offset_of!(AieDispatchPacket, reserved3), 30);
        assert_eq!(offset_of!(AieDispatchPacket, kernarg_address), 32);
        assert_eq!(offset_of!(AieDispatchPacket, insts_size), 40);
        assert_eq!(offset_of!(AieDispatchPacket, pdi_addr), 48);
        assert_eq!(offset_of!(AieDispatchPacket, reserved4), 56);
        assert_eq!(AIE_DISPATCH_HEADER, 0x1400);
    }

    #[test]
    fn kernel_object_layout_is_g2_with_words_20_24_renamed() {
        assert_eq!(size_of::<AieKernelObjectPacket>(), 64);
        assert_eq!(align_of::<AieKernelObjectPacket>(), 8);
        assert_eq!(offset_of!(AieKernelObjectPacket, opcode), 2);
        assert_eq!(offset_of!(AieKernelObjectPacket, count), 4);
        assert_eq!(offset_of!(AieKernelObjectPacket, completion_signal), 8);
        assert_eq!(offset_of!(AieKernelObjectPacket, kernel_object_low), 20);
        assert_eq!(offset_of!(AieKernelObjectPacket, kernel_object_high), 24);
        assert_eq!(offset_of!(AieKernelObjectPacket, num_kernargs), 28);
        assert_eq!(offset_of!(AieKernelObjectPacket, kernarg_address), 32);
        assert_eq!(offset_of!(AieKernelObjectPacket, reserved_insts_size), 40);
        assert_eq!(offset_of!(AieKernelObjectPacket, reserved_pdi_addr), 48);
        assert_eq!(offset_of!(AieKernelObjectPacket, reserved4), 56);
        let mut p = AieKernelObjectPacket::default();
        p.set_kernel_object(0x1234_5678_9ABC_DEF0);
        assert_eq!(p.kernel_object(), 0x1234_5678_9ABC_DEF0);
        assert_eq!(
            (p.kernel_object_low, p.kernel_object_high),
            (0x9ABC_DEF0, 0x1234_5678)
        );
    }

    #[test]
    fn g1_layout_matches_the_reference() {
        assert_eq!(size_of::<ErtPacket>(), 64);
        assert_eq!(align_of::<ErtPacket>(), 8);
        assert_eq!(offset_of!(ErtPacket, header), 0);
        assert_eq!(offset_of!(ErtPacket, amd_format), 2);
        assert_eq!(offset_of!(ErtPacket, reserved), 3);
        assert_eq!(offset_of!(ErtPacket, ert), 4);
        assert_eq!(offset_of!(ErtPacket, reserved0), 8);
        assert_eq!(offset_of!(ErtPacket, reserved4), 40);
        assert_eq!(offset_of!(ErtPacket, completion_signal), 48);
        assert_eq!(offset_of!(ErtPacket, payload_data), 56);
        assert_eq!(size_of::<ErtStartKernelData>(), ERT_PAYLOAD_DATA_OFFSET);
    }

    #[test]
    fn ert_bitfield_round_trips_lsb_first() {
        let bits = ErtBits {
            state: ert_state::NEW,
            custom: 0,
            count: 11,
            opcode: 0,
            type_: 0,
        };
        assert_eq!(bits.pack(), 1 | (11 << 12));
        let all = ErtBits {
            state: 0xF,
            custom: 0xAB,
            count: 0x5A5,
            opcode: 19,
            type_: 0x9,
        };
        assert_eq!(ErtBits::unpack(all.pack()), all);
        assert_eq!(ErtBits::unpack(0x7FF << 12).count, 0x7FF);
        assert_eq!(ert_payload_count(2), 11);
    }
}
