//! A small client of the emulator's C functions, shared by the crate's tests: discovery,
//! allocation, designs in the device heap, and packets of each generation.

#![allow(dead_code, clippy::cast_possible_truncation)]

pub mod ko;
pub mod profiles;
pub mod suite;

use std::ffi::c_void;
use std::sync::Mutex;
use std::time::Duration;

use hsa_core::sys::{
    AIE_DISPATCH_COUNT, AIE_DISPATCH_HEADER, AMD_PACKET_TYPE_AIE_ERT, AMD_PACKET_TYPE_RESERVED200,
    Agent, AgentInfo, AieDispatchPacket, ErtBits, ErtPacket, MemoryPool, PoolInfo, Queue,
    QueueType, Signal, SignalCondition, Status, WaitState, ert_payload_count, ert_state,
};
use hsa_sim::*;
use npu_artifacts::emu::{DType, EmuDesign};

/// Pool indexes in the AIE agent's list.
pub const KERNARG: usize = 0;
pub const HEAP: usize = 1;
pub const DATA: usize = 2;

/// An initialised emulator; shuts down on drop. Holds the process-wide test lock.
pub struct Sim {
    pub cpu: Agent,
    pub aie: Agent,
    /// The AIE agent's pools in ROCR's order.
    pub pools: Vec<MemoryPool>,
    pub cpu_pools: Vec<MemoryPool>,
    pub profile: Profile,
    pub abi: PacketAbi,
    /// The emulated hardware generation (which TXN generation runs), whatever the agent's
    /// name says (ROCm 7.0 always says `aie2`).
    pub agent: npu_artifacts::NpuGen,
    _guard: hsa_sim::SerialGuard,
}

unsafe extern "C" fn collect_agent(a: Agent, data: *mut c_void) -> Status {
    // SAFETY: `data` is the `Vec<Agent>` the caller passed.
    unsafe { (*data.cast::<Vec<Agent>>()).push(a) };
    Status::SUCCESS
}

unsafe extern "C" fn collect_pool(p: MemoryPool, data: *mut c_void) -> Status {
    // SAFETY: `data` is the `Vec<MemoryPool>` the caller passed.
    unsafe { (*data.cast::<Vec<MemoryPool>>()).push(p) };
    Status::SUCCESS
}

pub fn u32_info(agent: Agent, attr: AgentInfo) -> u32 {
    let mut v = 0u32;
    // SAFETY: a u32 out-pointer for a u32 attribute.
    let st = unsafe { hsa_agent_get_info(agent, attr, (&raw mut v).cast()) };
    assert_eq!(st, Status::SUCCESS, "{attr:?}");
    v
}

pub fn pool_usize(pool: MemoryPool, attr: PoolInfo) -> usize {
    let mut v = 0usize;
    // SAFETY: a size_t out-pointer for a size_t attribute.
    let st = unsafe { hsa_amd_memory_pool_get_info(pool, attr, (&raw mut v).cast()) };
    assert_eq!(st, Status::SUCCESS, "{attr:?}");
    v
}

impl Sim {
    pub fn new(profile: Profile) -> Self {
        Self::with(SimConfig {
            profile,
            timeout: Duration::from_millis(100),
            ..Default::default()
        })
    }

    pub fn with(cfg: SimConfig) -> Self {
        let guard = serial_test_guard();
        set_config(cfg);
        clear_last_error();
        // SAFETY: (whole constructor) out-pointers are live locals of the right types.
        unsafe {
            assert_eq!(hsa_init(), Status::SUCCESS);
            let mut agents: Vec<Agent> = Vec::new();
            assert_eq!(
                hsa_iterate_agents(Some(collect_agent), (&raw mut agents).cast()),
                Status::SUCCESS
            );
            assert_eq!(agents.len(), 2);
            let (cpu, aie) = (agents[0], agents[1]);
            let mut pools: Vec<MemoryPool> = Vec::new();
            hsa_amd_agent_iterate_memory_pools(aie, Some(collect_pool), (&raw mut pools).cast());
            let mut cpu_pools: Vec<MemoryPool> = Vec::new();
            hsa_amd_agent_iterate_memory_pools(
                cpu,
                Some(collect_pool),
                (&raw mut cpu_pools).cast(),
            );
            Self {
                cpu,
                aie,
                pools,
                cpu_pools,
                profile: cfg.profile,
                abi: cfg.packet_abi(),
                agent: cfg.agent,
                _guard: guard,
            }
        }
    }

    /// Allocates from AIE pool `pool` and returns the address.
    pub fn alloc(&self, pool: usize, size: usize) -> u64 {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let st = unsafe { hsa_amd_memory_pool_allocate(self.pools[pool], size, 0, &mut p) };
        assert_eq!(st, Status::SUCCESS, "allocate {size} from pool {pool}");
        p as u64
    }

    pub fn free(&self, p: u64) {
        // SAFETY: `p` came from `alloc`.
        let st = unsafe { hsa_amd_memory_pool_free(p as *mut c_void) };
        assert_eq!(st, Status::SUCCESS);
    }

    /// Allocates `bytes.len()` bytes from `pool` and copies `bytes` in.
    pub fn put(&self, pool: usize, bytes: &[u8]) -> u64 {
        let p = self.alloc(pool, bytes.len().max(1));
        write(p, bytes);
        p
    }

    /// Loads a design's PDI and insts into the device heap: (pdi, insts, insts_len).
    pub fn load(&self, design: &EmuDesign) -> (u64, u64, u64) {
        let generation = self.generation();
        let insts = design.insts(generation);
        (
            self.put(HEAP, &design.to_pdi()),
            self.put(HEAP, &insts),
            insts.len() as u64,
        )
    }

    pub fn generation(&self) -> npu_artifacts::NpuGen {
        self.agent
    }

    pub fn signal(&self, initial: i64) -> Signal {
        let mut s = Signal::default();
        // SAFETY: `s` is a valid out-pointer; no consumers.
        let st = unsafe { hsa_signal_create(initial, 0, std::ptr::null(), &mut s) };
        assert_eq!(st, Status::SUCCESS);
        s
    }

    pub fn queue(&self) -> TestQueue {
        self.queue_with(true)
    }

    /// A queue whose error callback records statuses, or one with no callback.
    pub fn queue_with(&self, callback: bool) -> TestQueue {
        let errors = Box::new(Mutex::new(Vec::new()));
        let mut q: *mut Queue = std::ptr::null_mut();
        let cb: Option<hsa_core::sys::QueueErrorCallback> =
            if callback { Some(on_error) } else { None };
        // SAFETY: the callback data is the boxed vector, which outlives the queue (TestQueue
        // destroys the queue before dropping the box).
        let st = unsafe {
            hsa_queue_create(
                self.aie,
                64,
                QueueType::SINGLE,
                cb,
                (&raw const *errors).cast_mut().cast(),
                0,
                0,
                &mut q,
            )
        };
        assert_eq!(st, Status::SUCCESS);
        TestQueue {
            q,
            abi: self.abi,
            errors,
        }
    }

    /// Kernargs for G2 (N VAs then N sizes) in pool 0.
    pub fn kernargs(&self, args: &[(u64, u64)]) -> u64 {
        let mut words: Vec<u64> = args.iter().map(|a| a.0).collect();
        words.extend(args.iter().map(|a| a.1));
        self.put(
            KERNARG,
            &words
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<_>>(),
        )
    }

    /// A packet of this runtime's generation for one dispatch.
    pub fn packet(&self, d: &Dispatch) -> [u8; 64] {
        match self.abi {
            PacketAbi::G2 | PacketAbi::KernelObject => g2_bytes(&g2_packet(self, d)),
            PacketAbi::G1a | PacketAbi::G1b => g1_bytes(&g1_packet(self, d)),
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        // SAFETY: balances the `hsa_init` of `with`.
        unsafe { hsa_shut_down() };
        reset_config();
    }
}

/// What one packet dispatches.
#[derive(Clone, Debug, Default)]
pub struct Dispatch {
    pub pdi: u64,
    pub insts: u64,
    pub insts_size: u64,
    pub args: Vec<(u64, u64)>,
    pub completion: Signal,
}

impl Dispatch {
    pub fn new(loaded: (u64, u64, u64), args: &[(u64, u64)], completion: Signal) -> Self {
        Self {
            pdi: loaded.0,
            insts: loaded.1,
            insts_size: loaded.2,
            args: args.to_vec(),
            completion,
        }
    }
}

pub fn g2_packet(sim: &Sim, d: &Dispatch) -> AieDispatchPacket {
    let kernarg = if d.args.is_empty() {
        0
    } else {
        sim.kernargs(&d.args)
    };
    AieDispatchPacket {
        header: AIE_DISPATCH_HEADER,
        opcode: 0,
        count: AIE_DISPATCH_COUNT,
        completion_signal: d.completion,
        insts_addr_low: (d.insts & 0xFFFF_FFFF) as u32,
        insts_addr_high: (d.insts >> 32) as u32,
        num_kernargs: d.args.len() as u16,
        kernarg_address: kernarg,
        insts_size: d.insts_size,
        pdi_addr: d.pdi,
        ..Default::default()
    }
}

pub fn g1_packet(sim: &Sim, d: &Dispatch) -> ErtPacket {
    let n = d.args.len();
    let mut payload = d.pdi.to_le_bytes().to_vec();
    let mut data = vec![
        3u32,
        0,
        d.insts as u32,
        (d.insts >> 32) as u32,
        (d.insts_size / 4) as u32,
    ];
    for &(a, _) in &d.args {
        data.push(a as u32);
        data.push((a >> 32) as u32);
    }
    data.extend(d.args.iter().map(|&(_, s)| s as u32));
    payload.extend(data.iter().flat_map(|w| w.to_le_bytes()));
    let bits = ErtBits {
        state: ert_state::NEW,
        count: ert_payload_count(n) as u32,
        ..Default::default()
    };
    let g1a = sim.abi == PacketAbi::G1a;
    ErtPacket {
        header: 0,
        amd_format: if g1a {
            AMD_PACKET_TYPE_AIE_ERT
        } else {
            AMD_PACKET_TYPE_RESERVED200
        },
        ert: bits.pack(),
        completion_signal: if g1a { Signal::default() } else { d.completion },
        payload_data: sim.put(DATA, &payload),
        ..Default::default()
    }
}

pub fn g2_bytes(p: &AieDispatchPacket) -> [u8; 64] {
    // SAFETY: the packet is 64 bytes of plain data with no padding.
    unsafe { std::mem::transmute_copy(p) }
}

pub fn g1_bytes(p: &ErtPacket) -> [u8; 64] {
    // SAFETY: the packet is 64 bytes of plain data with no padding.
    unsafe { std::mem::transmute_copy(p) }
}

unsafe extern "C" fn on_error(status: Status, _q: *mut Queue, data: *mut c_void) {
    // SAFETY: `data` is the TestQueue's boxed Mutex, alive while the queue is.
    let errors = unsafe { &*data.cast::<Mutex<Vec<Status>>>() };
    errors.lock().unwrap().push(status);
}

/// A queue with an error callback that records statuses; destroyed on drop.
pub struct TestQueue {
    pub q: *mut Queue,
    pub abi: PacketAbi,
    errors: Box<Mutex<Vec<Status>>>,
}

impl TestQueue {
    pub fn errors(&self) -> Vec<Status> {
        self.errors.lock().unwrap().clone()
    }

    pub fn read_index(&self) -> u64 {
        // SAFETY: a live queue.
        unsafe { hsa_queue_load_read_index_scacquire(self.q) }
    }

    pub fn write_index(&self) -> u64 {
        // SAFETY: a live queue.
        unsafe { hsa_queue_load_write_index_relaxed(self.q) }
    }

    /// Writes packets into the ring without ringing.
    pub fn enqueue(&self, packets: &[[u8; 64]]) {
        for p in packets {
            // SAFETY: a live queue; the slot lies in its 4 KiB ring (G1a tests never go past 64
            // here without expecting the overrun, and slot indexes wrap below).
            unsafe {
                let wr = hsa_queue_add_write_index_relaxed(self.q, 1);
                let base = (*self.q).base_address.cast::<u8>();
                let slot = base.add(((wr % 64) * 64) as usize);
                std::ptr::copy_nonoverlapping(p.as_ptr(), slot, 64);
            }
        }
    }

    pub fn ring(&self) {
        // SAFETY: a live queue's doorbell.
        unsafe {
            let wr = hsa_queue_load_write_index_relaxed(self.q);
            hsa_signal_store_screlease((*self.q).doorbell_signal, wr as i64 - 1);
        }
    }

    /// Enqueues and rings once.
    pub fn submit(&self, packets: &[[u8; 64]]) {
        self.enqueue(packets);
        self.ring();
    }

    pub fn suspended(&self) -> bool {
        is_suspended(self.q).unwrap()
    }
}

impl Drop for TestQueue {
    fn drop(&mut self) {
        // SAFETY: the queue is live and not used afterwards.
        unsafe { hsa_queue_destroy(self.q) };
    }
}

pub fn write(addr: u64, bytes: &[u8]) {
    // SAFETY: tests write only into allocations they made, within their size.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
}

pub fn read(addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: tests read only allocations they made, within their size.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
    v
}

pub fn load_signal(s: Signal) -> i64 {
    // SAFETY: a signal handle; unknown ones read 0.
    unsafe { hsa_signal_load_scacquire(s) }
}

pub fn wait_eq(s: Signal, v: i64, timeout_ns: u64) -> i64 {
    // SAFETY: a signal handle.
    unsafe { hsa_signal_wait_scacquire(s, SignalCondition::EQ, v, timeout_ns, WaitState::BLOCKED) }
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Fills `n` i32 in a new data buffer and returns (input, output) buffers of `n` i32.
pub fn io_i32(sim: &Sim, input: &[i32]) -> (u64, u64) {
    let bytes = i32_bytes(input);
    (sim.put(DATA, &bytes), sim.alloc(DATA, bytes.len()))
}

pub fn add_one() -> EmuDesign {
    EmuDesign::vector_scalar_add(256, DType::I32, 1)
}

/// A valid add-one dispatch (256 × i32) and its buffers.
pub fn valid(sim: &Sim, sig: hsa_core::sys::Signal) -> Dispatch {
    let (a, b) = io_i32(sim, &[5; 256]);
    Dispatch::new(sim.load(&add_one()), &[(a, 1024), (b, 1024)], sig)
}

/// Submits one packet that breaks a rule and returns the detail, checking the failure as the
/// profile reports it (callback or silent; see [`profiles::fails_on`] for the aborting ones).
pub fn fails_with(sim: &Sim, packet: [u8; 64], want: Status) -> String {
    let q = sim.queue();
    q.submit(&[packet]);
    profiles::check_in_process(sim, &q, want, 0)
}
