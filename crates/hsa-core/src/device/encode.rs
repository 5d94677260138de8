//! Encoding one dispatch into the packet ABI the runtime speaks.
//!
//! Pure functions: they return the 64-byte packet and the bytes of its side buffer (G2
//! kernargs or the G1 payload), given the address the side buffer will be copied to.

use std::fmt;
use std::str::FromStr;

use crate::error::HsaError;
use crate::sys::{
    AIE_DISPATCH_COUNT, AIE_DISPATCH_HEADER, AIE_PACKET_OPCODE_KMQ, AMD_PACKET_TYPE_AIE_ERT,
    AMD_PACKET_TYPE_RESERVED200, AieDispatchPacket, AieKernelObjectPacket, CHAIN_BUFFER_BYTES,
    CHAIN_SLOT_HEADER_BYTES, ERT_TXN_OPCODE, ErtBits, ErtPacket, MAX_PACKETS_PER_DOORBELL, Signal,
    ert_opcode, ert_payload_count, ert_state,
};

/// Which AIE packet ABI the runtime speaks (`rocr-aie.md` §0). ROCR cannot be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PacketAbi {
    /// `hsa_amd_aie_kernel_dispatch_packet_t`: rocm-systems develop from May 2026, TheRock
    /// releases after it.
    #[default]
    G2,
    /// The vendor ERT packet with `AmdFormat` 200 and a completion signal (develop, late 2025 to
    /// early 2026).
    G1b,
    /// The vendor ERT packet with `AmdFormat` 3, no completion signal, and a ring that does not
    /// wrap (ROCm 7.0).
    G1a,
    /// The G2 packet's layout with words 20/24 holding a kernel object: the address of a
    /// descriptor ROCR's loader built when an AIE hsaco was loaded through the executable API
    /// (`rocr-aie-hsaco.md` §1, §3). Words 40 and 48 are reserved and zero. ROCR cannot tell
    /// this form from G2; a runtime of this kind is found by loading a code object.
    KernelObject,
}

impl PacketAbi {
    /// The lower-case name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::G2 => "g2",
            Self::G1b => "g1b",
            Self::G1a => "g1a",
            Self::KernelObject => "kernel-object",
        }
    }

    /// Whether a program on this ABI is a loaded code object (an executable and its symbols),
    /// not a PDI and an instruction stream in the device heap.
    pub fn loads_code_objects(self) -> bool {
        matches!(self, Self::KernelObject)
    }

    /// Whether packets of this ABI carry a completion signal.
    pub fn has_completion_signal(self) -> bool {
        !matches!(self, Self::G1a)
    }

    /// Bytes one command of `n` arguments takes in the driver's chain buffer, on the runtime
    /// of this ABI that packs commands most loosely (`rocr-aie.md` §2.1, §7;
    /// `rocr-aie-hsaco.md` §4):
    /// - G1a and G1b: a slot header plus the CU mask and `5 + 3N` payload dwords,
    ///   `52 + 4·(6 + 3N)`;
    /// - G2: early G2 runtimes declare `count = 6 + 2N + 3` (three pad dwords) and the slot
    ///   holds `count − 1` dwords, `52 + 4·(8 + 2N)`: 40 commands of two arguments, as IRON
    ///   measured. The newest G2 runtimes pad one dword and split batches themselves, but
    ///   nothing tells the two apart, so every G2 runtime is sized as the early one.
    /// - kernel objects: a PdiInsts command declares `count = 7 + 2N` (one pad dword) and its
    ///   slot holds `count − 1` dwords, `52 + 4·(6 + 2N)`: 44 commands of two arguments. A
    ///   FullElf command is smaller (60 bytes), so sizing every command as PdiInsts is safe.
    pub fn chain_command_bytes(self, n: usize) -> usize {
        let dwords = match self {
            Self::G2 => 8 + 2 * n,
            Self::KernelObject => 6 + 2 * n,
            Self::G1a | Self::G1b => 1 + ert_payload_count(n),
        };
        CHAIN_SLOT_HEADER_BYTES + 4 * dwords
    }

    /// How many commands of at most `max_args` arguments one doorbell may carry: as many as
    /// fit the driver's chain buffer ([`PacketAbi::chain_command_bytes`]), and never more than
    /// [`MAX_PACKETS_PER_DOORBELL`]. 0 when not even one fits.
    pub fn commands_per_doorbell(self, max_args: usize) -> usize {
        (CHAIN_BUFFER_BYTES / self.chain_command_bytes(max_args)).min(MAX_PACKETS_PER_DOORBELL)
    }

    /// Bytes of side buffer (kernargs or payload) a dispatch with `n` arguments needs.
    pub fn side_buffer_len(self, n: usize) -> usize {
        match self {
            Self::G2 | Self::KernelObject => 16 * n,
            Self::G1a | Self::G1b => 8 + 4 * ert_payload_count(n),
        }
    }
}

impl fmt::Display for PacketAbi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PacketAbi {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "g2" => Ok(Self::G2),
            "g1b" => Ok(Self::G1b),
            "g1a" => Ok(Self::G1a),
            "kernel-object" => Ok(Self::KernelObject),
            other => Err(format!(
                "unknown packet ABI {other:?}: expected kernel-object, g2, g1b or g1a"
            )),
        }
    }
}

/// Everything a packet says about one dispatch, as addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PacketDesc {
    /// The PDI's address (G1, G2), or on kernel objects the key of the PDI the runtime caches
    /// for this program (its kernel object; 0 for a FullElf kernel, whose PDIs are not cached).
    pub pdi: u64,
    /// The PDI's length in bytes where this binding placed it (0 otherwise).
    pub pdi_len: usize,
    pub insts: u64,
    pub insts_size: u64,
    /// The symbol's `KERNEL_OBJECT` (kernel objects only).
    pub kernel_object: u64,
    /// Whether the kernel is a FullElf kernel (kernel objects only): one doorbell batch holds
    /// kernels of one kind.
    pub full_elf: bool,
    /// (host VA, byte size) per buffer argument, in design order.
    pub args: Vec<(u64, u64)>,
    /// A FullElf kernel on a G2 runtime: its PDI and pristine control code. `insts` is then
    /// the ring slot's patched copy, filled in when the packet is written.
    pub g2_elf: Option<std::sync::Arc<G2Elf>>,
}

/// A FullElf kernel as a G2 runtime with full ELF dispatches it (ROCR's
/// `core/driver/xdna/README.md` @ `159fb22f`): the application patches its argument addresses
/// into a copy of the control code in the device heap, and the packet names that copy (words
/// 20/24, size in word 40), the PDI (word 48) and the control code's PDI site (word 56), where
/// the runtime writes the PDI's device address.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct G2Elf {
    /// The PDI's address in the device heap.
    pub pdi: u64,
    /// The control code as the ELF holds it.
    pub ctrl: Vec<u8>,
    /// The byte offset of the control code's one PDI site (never 0: the control code starts
    /// with a transaction header).
    pub pdi_site: u32,
    /// (offset, argument, addend) of each `ShimDma48` site.
    pub arg_sites: Vec<(u32, u16, u32)>,
}

impl G2Elf {
    /// The control code with argument `i`'s address plus each site's addend patched in.
    pub(crate) fn patched(&self, args: &[(u64, u64)]) -> Result<Vec<u8>, HsaError> {
        let mut ctrl = self.ctrl.clone();
        for &(offset, arg, addend) in &self.arg_sites {
            let addr = args.get(usize::from(arg)).map(|a| a.0).ok_or_else(|| {
                HsaError::InvalidArgument(format!(
                    "the control code patches argument {arg}, which the dispatch lacks"
                ))
            })?;
            npu_artifacts::hsaco::patch_shim_dma48(
                &mut ctrl,
                offset,
                addr.wrapping_add(u64::from(addend)),
            )
            .ok_or_else(|| {
                HsaError::InvalidArgument(format!(
                    "the control code's site for argument {arg} at {offset} does not fit it"
                ))
            })?;
        }
        Ok(ctrl)
    }
}

/// A packet ready to be stored in a ring slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Packet {
    G2(AieDispatchPacket),
    KernelObject(AieKernelObjectPacket),
    G1(ErtPacket),
}

/// Encodes `desc`; `side_addr` is where the returned side buffer will be copied.
pub(crate) fn encode(
    abi: PacketAbi,
    desc: &PacketDesc,
    completion: Signal,
    side_addr: u64,
) -> Result<(Packet, Vec<u8>), HsaError> {
    let n = desc.args.len();
    match abi {
        PacketAbi::G2 | PacketAbi::KernelObject => {
            let num_kernargs = u16::try_from(n).map_err(|_| {
                HsaError::InvalidArgument(format!(
                    "{n} arguments: a {abi} packet holds at most 65535"
                ))
            })?;
            let mut side = Vec::with_capacity(16 * n);
            for &(va, _) in &desc.args {
                side.extend_from_slice(&va.to_le_bytes());
            }
            for &(_, size) in &desc.args {
                side.extend_from_slice(&size.to_le_bytes());
            }
            let kernarg_address = if n == 0 { 0 } else { side_addr };
            if abi == PacketAbi::KernelObject {
                // Words 20/24 name the descriptor; 40 and 48 are reserved (zero).
                let mut pkt = AieKernelObjectPacket {
                    header: AIE_DISPATCH_HEADER,
                    opcode: AIE_PACKET_OPCODE_KMQ,
                    count: AIE_DISPATCH_COUNT,
                    completion_signal: completion,
                    num_kernargs,
                    kernarg_address,
                    ..Default::default()
                };
                pkt.set_kernel_object(desc.kernel_object);
                return Ok((Packet::KernelObject(pkt), side));
            }
            let pkt = AieDispatchPacket {
                header: AIE_DISPATCH_HEADER,
                opcode: AIE_PACKET_OPCODE_KMQ,
                count: AIE_DISPATCH_COUNT,
                completion_signal: completion,
                insts_addr_low: low(desc.insts),
                insts_addr_high: high(desc.insts),
                num_kernargs,
                kernarg_address,
                insts_size: desc.insts_size,
                pdi_addr: desc.g2_elf.as_ref().map_or(desc.pdi, |e| e.pdi),
                reserved4: desc.g2_elf.as_ref().map_or(0, |e| u64::from(e.pdi_site)),
                ..Default::default()
            };
            Ok((Packet::G2(pkt), side))
        }
        PacketAbi::G1a | PacketAbi::G1b => {
            let count = u32::try_from(ert_payload_count(n))
                .ok()
                .filter(|&c| c <= 0x7FF)
                .ok_or_else(|| {
                    HsaError::InvalidArgument(format!(
                        "{n} arguments: a G1 packet's 11-bit count holds at most 680"
                    ))
                })?;
            let dwords = u32::try_from(desc.insts_size / 4).map_err(|_| {
                HsaError::InvalidArgument(format!(
                    "instruction stream of {} bytes is too long",
                    desc.insts_size
                ))
            })?;
            let mut words: Vec<u32> =
                vec![ERT_TXN_OPCODE, 0, low(desc.insts), high(desc.insts), dwords];
            for &(va, _) in &desc.args {
                words.extend([low(va), high(va)]);
            }
            for (i, &(_, size)) in desc.args.iter().enumerate() {
                words.push(u32::try_from(size).map_err(|_| {
                    HsaError::InvalidArgument(format!(
                        "argument {i} is {size} bytes: a G1 payload holds 32-bit sizes"
                    ))
                })?);
            }
            let mut side = Vec::with_capacity(8 + 4 * words.len());
            side.extend_from_slice(&desc.pdi.to_le_bytes());
            for w in words {
                side.extend_from_slice(&w.to_le_bytes());
            }
            let bits = ErtBits {
                state: ert_state::NEW,
                custom: 0,
                count,
                opcode: ert_opcode::START_CU,
                type_: 0,
            };
            let pkt = ErtPacket {
                header: 0,
                amd_format: if abi == PacketAbi::G1a {
                    AMD_PACKET_TYPE_AIE_ERT
                } else {
                    AMD_PACKET_TYPE_RESERVED200
                },
                ert: bits.pack(),
                completion_signal: if abi == PacketAbi::G1b {
                    completion
                } else {
                    Signal::default()
                },
                payload_data: side_addr,
                ..Default::default()
            };
            Ok((Packet::G1(pkt), side))
        }
    }
}

fn low(v: u64) -> u32 {
    (v & 0xFFFF_FFFF) as u32
}

fn high(v: u64) -> u32 {
    (v >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> PacketDesc {
        PacketDesc {
            pdi: 0x7f00_0400_0000,
            insts: 0x7f00_0400_8000,
            insts_size: 64,
            args: vec![(0x7f11_0000_1000, 4096), (0x7f22_0000_2000, 4096)],
            ..PacketDesc::default()
        }
    }

    fn u64s(b: &[u8]) -> Vec<u64> {
        b.chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn u32s(b: &[u8]) -> Vec<u32> {
        b.chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn chain_costs_match_the_driver_and_irons_measurement() {
        // IRON measured 40 commands of two arguments per G1/early-G2 chain; 41 failed.
        for abi in [PacketAbi::G2, PacketAbi::G1b, PacketAbi::G1a] {
            assert_eq!(abi.chain_command_bytes(2), 100, "{abi}");
            assert_eq!(CHAIN_BUFFER_BYTES / abi.chain_command_bytes(2), 40, "{abi}");
            assert_eq!(
                abi.commands_per_doorbell(2),
                MAX_PACKETS_PER_DOORBELL,
                "{abi}"
            );
        }
        // G1: 52 + 4·(6+3N); five arguments no longer fit 32 commands, six give 27.
        assert_eq!(PacketAbi::G1a.chain_command_bytes(5), 136);
        assert_eq!(PacketAbi::G1b.commands_per_doorbell(4), 32);
        assert_eq!(PacketAbi::G1b.commands_per_doorbell(5), 30);
        assert_eq!(PacketAbi::G1a.commands_per_doorbell(6), 27);
        // Early G2: 52 + 4·(8+2N); six arguments give 31.
        assert_eq!(PacketAbi::G2.commands_per_doorbell(5), 32);
        assert_eq!(PacketAbi::G2.commands_per_doorbell(6), 31);
        assert_eq!(PacketAbi::G2.commands_per_doorbell(64), 6);
        // Past the buffer: not even one command.
        assert_eq!(PacketAbi::G1a.commands_per_doorbell(400), 0);
    }

    #[test]
    fn g2_kernargs_are_addresses_then_sizes() {
        let (p, side) = encode(PacketAbi::G2, &desc(), Signal { handle: 9 }, 0xAAA0).unwrap();
        let Packet::G2(p) = p else { panic!() };
        assert_eq!(p.header, 0x1400);
        assert_eq!((p.opcode, p.count, p.num_kernargs), (0, 24, 2));
        assert_eq!(p.completion_signal, Signal { handle: 9 });
        assert_eq!(p.insts_addr(), 0x7f00_0400_8000);
        assert_eq!(
            (p.insts_size, p.pdi_addr, p.kernarg_address, p.reserved4),
            (64, 0x7f00_0400_0000, 0xAAA0, 0)
        );
        assert_eq!(
            u64s(&side),
            vec![0x7f11_0000_1000, 0x7f22_0000_2000, 4096, 4096]
        );
        assert_eq!(side.len(), PacketAbi::G2.side_buffer_len(2));
    }

    #[test]
    fn kernel_object_packets_name_the_descriptor_and_zero_words_40_and_48() {
        let d = PacketDesc {
            kernel_object: 0x5555_1234_5678,
            ..desc()
        };
        let (p, side) = encode(PacketAbi::KernelObject, &d, Signal { handle: 9 }, 0xAAA0).unwrap();
        let Packet::KernelObject(p) = p else { panic!() };
        assert_eq!(p.kernel_object(), 0x5555_1234_5678);
        let bytes: [u8; 64] = packet_bytes(&p);
        let word = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let quad = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        assert_eq!(u16::from_le_bytes([bytes[0], bytes[1]]), 0x1400);
        assert_eq!((word(20), word(24)), (0x1234_5678, 0x5555));
        assert_eq!(u16::from_le_bytes([bytes[28], bytes[29]]), 2);
        assert_eq!((quad(32), quad(40), quad(48), quad(56)), (0xAAA0, 0, 0, 0));
        assert_eq!(
            u64s(&side),
            vec![0x7f11_0000_1000, 0x7f22_0000_2000, 4096, 4096]
        );
    }

    /// The packet's 64 bytes as the ring holds them.
    fn packet_bytes(p: &AieKernelObjectPacket) -> [u8; 64] {
        let mut out = [0u8; 64];
        // SAFETY: the packet is a 64-byte `repr(C)` value of integers with no padding (its
        // layout test asserts every offset); reading its bytes is reading initialised memory.
        unsafe {
            std::ptr::copy_nonoverlapping(std::ptr::from_ref(p).cast::<u8>(), out.as_mut_ptr(), 64);
        }
        out
    }

    #[test]
    fn kernel_object_chains_hold_44_two_argument_commands() {
        let abi = PacketAbi::KernelObject;
        assert_eq!(abi.chain_command_bytes(2), 92);
        assert_eq!(CHAIN_BUFFER_BYTES / abi.chain_command_bytes(2), 44);
        assert_eq!(abi.commands_per_doorbell(2), MAX_PACKETS_PER_DOORBELL);
        // 52 + 4·(6+2N): six arguments give 33 (G2: 31), sixteen give 20.
        assert_eq!(CHAIN_BUFFER_BYTES / abi.chain_command_bytes(6), 33);
        assert_eq!(abi.commands_per_doorbell(16), 20);
        assert_eq!(PacketAbi::G2.commands_per_doorbell(16), 19);
        assert_eq!(abi.side_buffer_len(3), 48);
        assert!(abi.loads_code_objects() && !PacketAbi::G2.loads_code_objects());
    }

    #[test]
    fn g2_without_arguments_has_no_kernarg_address() {
        let d = PacketDesc {
            args: vec![],
            ..desc()
        };
        let (Packet::G2(p), side) = encode(PacketAbi::G2, &d, Signal::default(), 0xAAA0).unwrap()
        else {
            panic!()
        };
        assert_eq!((p.num_kernargs, p.kernarg_address), (0, 0));
        assert!(side.is_empty());
    }

    #[test]
    fn g1_payload_follows_the_ert_layout() {
        for (abi, fmt, sig) in [(PacketAbi::G1a, 3, 0), (PacketAbi::G1b, 200, 9)] {
            let (p, side) = encode(abi, &desc(), Signal { handle: 9 }, 0xBBB0).unwrap();
            let Packet::G1(p) = p else { panic!() };
            assert_eq!((p.header, p.amd_format), (0, fmt));
            assert_eq!(p.completion_signal.handle, sig);
            assert_eq!(p.payload_data, 0xBBB0);
            let bits = p.bits();
            assert_eq!((bits.state, bits.opcode, bits.count), (1, 0, 11));
            assert_eq!(
                u64::from_le_bytes(side[..8].try_into().unwrap()),
                0x7f00_0400_0000
            );
            assert_eq!(
                u32s(&side[8..]),
                vec![
                    3,
                    0,
                    0x0400_8000,
                    0x7f00,
                    16,
                    0x0000_1000,
                    0x7f11,
                    0x0000_2000,
                    0x7f22,
                    4096,
                    4096
                ]
            );
            assert_eq!(side.len(), abi.side_buffer_len(2));
        }
    }

    #[test]
    fn g1_refuses_what_its_fields_cannot_hold() {
        let d = PacketDesc {
            args: vec![(0, 1 << 33)],
            ..desc()
        };
        let e = encode(PacketAbi::G1b, &d, Signal::default(), 0).unwrap_err();
        assert!(e.to_string().contains("32-bit sizes"), "{e}");
        let d = PacketDesc {
            args: vec![(0, 4); 681],
            ..desc()
        };
        assert!(encode(PacketAbi::G1a, &d, Signal::default(), 0).is_err());
    }

    #[test]
    fn abi_names_parse() {
        assert_eq!("G1A".parse::<PacketAbi>().unwrap(), PacketAbi::G1a);
        assert_eq!(
            "kernel-object".parse::<PacketAbi>().unwrap(),
            PacketAbi::KernelObject
        );
        assert_eq!(PacketAbi::KernelObject.to_string(), "kernel-object");
        assert!(
            "g3".parse::<PacketAbi>()
                .unwrap_err()
                .contains("expected kernel-object, g2, g1b or g1a")
        );
    }
}
