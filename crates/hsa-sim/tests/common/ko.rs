//! A client of the executable API for the `kernel-object` profile: load an hsaco, read a
//! kernel object, write packets naming it.

use std::ffi::CString;

use hsa_core::sys::{
    AIE_DISPATCH_COUNT, AIE_DISPATCH_HEADER, Agent, AieKernelObjectPacket, CodeObjectReader,
    Executable, ExecutableSymbol, FloatRoundingMode, HsaProfile, Signal, Status, SymbolInfo,
};
use hsa_sim::*;

use super::Sim;

pub fn reader(bytes: &[u8]) -> CodeObjectReader {
    let mut r = CodeObjectReader::default();
    // SAFETY: `bytes` outlives every load through the reader in these tests.
    let st = unsafe {
        hsa_code_object_reader_create_from_memory(bytes.as_ptr().cast(), bytes.len(), &mut r)
    };
    assert_eq!(st, Status::SUCCESS);
    r
}

pub fn executable() -> Executable {
    let mut e = Executable::default();
    // SAFETY: a live out-pointer; NULL options.
    let st = unsafe {
        hsa_executable_create_alt(
            HsaProfile::FULL,
            FloatRoundingMode::DEFAULT,
            std::ptr::null(),
            &mut e,
        )
    };
    assert_eq!(st, Status::SUCCESS);
    e
}

pub fn load_into(e: Executable, agent: Agent, r: CodeObjectReader) -> Status {
    // SAFETY: handles from the runtime; the reader's bytes are alive; NULL outputs allowed.
    unsafe {
        hsa_executable_load_agent_code_object(e, agent, r, std::ptr::null(), std::ptr::null_mut())
    }
}

pub fn freeze(e: Executable) -> Status {
    // SAFETY: any handle; NULL options.
    unsafe { hsa_executable_freeze(e, std::ptr::null()) }
}

pub fn destroy(e: Executable, r: CodeObjectReader) {
    // SAFETY: handles from the runtime, destroyed once, in ROCR's order.
    unsafe {
        assert_eq!(hsa_executable_destroy(e), Status::SUCCESS);
        assert_eq!(hsa_code_object_reader_destroy(r), Status::SUCCESS);
    }
}

/// Loads `bytes` into a fresh executable for the AIE agent: the status and the handles.
pub fn try_load(sim: &Sim, bytes: &[u8]) -> (Status, Executable, CodeObjectReader) {
    let (r, e) = (reader(bytes), executable());
    (load_into(e, sim.aie, r), e, r)
}

/// A loaded, frozen hsaco.
pub struct Loaded {
    pub exec: Executable,
    pub reader: CodeObjectReader,
    pub agent: Agent,
}

impl Loaded {
    pub fn new(sim: &Sim, bytes: &[u8]) -> Self {
        let (st, exec, reader) = try_load(sim, bytes);
        assert_eq!(st, Status::SUCCESS, "{:?}", last_error());
        assert_eq!(freeze(exec), Status::SUCCESS);
        Self {
            exec,
            reader,
            agent: sim.aie,
        }
    }

    pub fn symbol(&self, name: &str) -> ExecutableSymbol {
        let mut s = ExecutableSymbol::default();
        let c = CString::new(name).unwrap();
        // SAFETY: live pointers; the agent is the AIE agent.
        let st = unsafe {
            hsa_executable_get_symbol_by_name(self.exec, c.as_ptr(), &self.agent, &mut s)
        };
        assert_eq!(st, Status::SUCCESS, "{name}: {:?}", last_error());
        s
    }

    pub fn kernel_object(&self, name: &str) -> u64 {
        symbol_u64(self.symbol(name), SymbolInfo::KERNEL_OBJECT)
    }

    pub fn destroy(self) {
        destroy(self.exec, self.reader);
    }
}

pub fn symbol_u64(s: ExecutableSymbol, attr: SymbolInfo) -> u64 {
    let mut v = 0u64;
    // SAFETY: a u64 out-pointer, large enough for every numeric attribute.
    let st = unsafe { hsa_executable_symbol_get_info(s, attr, (&raw mut v).cast()) };
    assert_eq!(st, Status::SUCCESS, "{attr:?}");
    v
}

/// A kernel-object packet naming `ko` with `args` in a fresh kernarg buffer.
pub fn ko_packet(sim: &Sim, ko: u64, args: &[(u64, u64)], sig: Signal) -> [u8; 64] {
    let kernarg = if args.is_empty() {
        0
    } else {
        sim.kernargs(args)
    };
    let mut p = AieKernelObjectPacket {
        header: AIE_DISPATCH_HEADER,
        count: AIE_DISPATCH_COUNT,
        completion_signal: sig,
        num_kernargs: args.len() as u16,
        kernarg_address: kernarg,
        ..Default::default()
    };
    p.set_kernel_object(ko);
    packet_bytes(&p)
}

pub fn packet_bytes(p: &AieKernelObjectPacket) -> [u8; 64] {
    // SAFETY: the packet is 64 bytes of plain data with no padding.
    unsafe { std::mem::transmute_copy(p) }
}
