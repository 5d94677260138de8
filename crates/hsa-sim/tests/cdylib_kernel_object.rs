//! The cdylib as a kernel-object `libhsa-runtime64.so`: an AIE hsaco loaded and dispatched
//! through symbols resolved by name, as a C client does; and the same load refused by the
//! library behaving as a G2 ROCR. One test in its own binary, since it sets the environment
//! the library reads at `hsa_init`.

#![allow(clippy::cast_possible_truncation)]

mod device_support;

use std::ffi::{CString, c_void};

use hsa_core::sys::{
    AIE_DISPATCH_COUNT, AIE_DISPATCH_HEADER, Agent, AieKernelObjectPacket, CodeObjectReader,
    Executable, ExecutableSymbol, FloatRoundingMode, HsaFns, HsaProfile, MemoryPool, PoolInfo,
    Queue, QueueType, Signal, SignalCondition, Status, SymbolInfo, WaitState,
};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

unsafe extern "C" fn push<T>(x: T, data: *mut c_void) -> Status {
    // SAFETY: `data` is the caller's Vec<T>.
    unsafe { (*data.cast::<Vec<T>>()).push(x) };
    Status::SUCCESS
}

unsafe extern "C" fn ignore_queue_error(_status: Status, _q: *mut Queue, _data: *mut c_void) {}

fn set_profile(name: &str) {
    // SAFETY: this binary's only test sets the environment before any thread reads it.
    unsafe {
        std::env::set_var("HSA_SIM_PROFILE", name);
        std::env::set_var("HSA_SIM_AGENT_NAME", "aie2p");
    }
}

/// Loads `hsaco` into a new executable for `aie` and freezes it: the load status, and the
/// handles to destroy.
///
/// # Safety
/// `f` is the emulator's table and the runtime is initialised.
unsafe fn load(f: &HsaFns, aie: Agent, hsaco: &[u8]) -> (Status, Executable, CodeObjectReader) {
    let mut r = CodeObjectReader::default();
    let mut e = Executable::default();
    // SAFETY: live out-pointers; `hsaco` outlives the load.
    unsafe {
        assert_eq!(
            (f.code_object_reader_create_from_memory.unwrap())(
                hsaco.as_ptr().cast(),
                hsaco.len(),
                &mut r
            ),
            Status::SUCCESS
        );
        assert_eq!(
            (f.executable_create_alt.unwrap())(
                HsaProfile::FULL,
                FloatRoundingMode::DEFAULT,
                std::ptr::null(),
                &mut e
            ),
            Status::SUCCESS
        );
        let st = (f.executable_load_agent_code_object.unwrap())(
            e,
            aie,
            r,
            std::ptr::null(),
            std::ptr::null_mut(),
        );
        assert_eq!(
            (f.executable_freeze.unwrap())(e, std::ptr::null()),
            Status::SUCCESS
        );
        (st, e, r)
    }
}

#[test]
fn an_hsaco_loads_and_runs_through_the_library_only_as_a_kernel_object_runtime() {
    let lib = // SAFETY: loading the emulator runs no initialisers beyond Rust's own statics.
        unsafe { libloading::Library::new(device_support::cdylib_path()) }.unwrap();
    // SAFETY: (whole test) every symbol is the emulator's function of the C name's signature;
    // calls follow ROCR's contracts.
    unsafe {
        let f = HsaFns::resolve(|n| {
            lib.get::<*const c_void>(n.as_bytes())
                .map_or(std::ptr::null(), |s| *s)
        })
        .unwrap();
        assert!(f.missing_optional().is_empty());
        let design = EmuDesign::vector_scalar_add(1024, DType::I32, 3);
        let hsaco = design.to_hsaco(NpuGen::Npu2).unwrap();

        // A G2 runtime has no AIE section loader.
        set_profile("rocr-newest");
        assert_eq!((f.init)(), Status::SUCCESS);
        let mut agents: Vec<Agent> = Vec::new();
        (f.iterate_agents)(Some(push::<Agent>), (&raw mut agents).cast());
        let (st, e, r) = load(&f, agents[1], &hsaco);
        assert_eq!(st, Status::ERROR_INVALID_CODE_OBJECT);
        assert_eq!((f.executable_destroy.unwrap())(e), Status::SUCCESS);
        assert_eq!((f.code_object_reader_destroy.unwrap())(r), Status::SUCCESS);
        assert_eq!((f.shut_down)(), Status::SUCCESS);

        set_profile("kernel-object");
        assert_eq!((f.init)(), Status::SUCCESS);
        let mut agents: Vec<Agent> = Vec::new();
        (f.iterate_agents)(Some(push::<Agent>), (&raw mut agents).cast());
        let aie = agents[1];
        let (st, e, r) = load(&f, aie, &hsaco);
        assert_eq!(st, Status::SUCCESS);
        let name = CString::new("vector_scalar_add").unwrap();
        let mut sym = ExecutableSymbol::default();
        assert_eq!(
            (f.executable_get_symbol_by_name.unwrap())(e, name.as_ptr(), &aie, &mut sym),
            Status::SUCCESS
        );
        let (mut ko, mut kernarg) = (0u64, 0u32);
        (f.executable_symbol_get_info.unwrap())(
            sym,
            SymbolInfo::KERNEL_OBJECT,
            (&raw mut ko).cast(),
        );
        (f.executable_symbol_get_info.unwrap())(
            sym,
            SymbolInfo::KERNEL_KERNARG_SEGMENT_SIZE,
            (&raw mut kernarg).cast(),
        );
        assert_ne!(ko, 0);
        assert_eq!(kernarg, 32);

        let mut pools: Vec<MemoryPool> = Vec::new();
        (f.agent_iterate_memory_pools)(aie, Some(push::<MemoryPool>), (&raw mut pools).cast());
        let rec = |p: MemoryPool| {
            let mut g = 0usize;
            (f.memory_pool_get_info)(p, PoolInfo::RUNTIME_ALLOC_REC_GRANULE, (&raw mut g).cast());
            g
        };
        let data = *pools.iter().find(|&&p| rec(p) != 0).unwrap();
        let alloc = |bytes: &[u8]| {
            let mut p: *mut c_void = std::ptr::null_mut();
            assert_eq!(
                (f.memory_pool_allocate)(data, bytes.len(), 0, &mut p),
                Status::SUCCESS
            );
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast(), bytes.len());
            p as u64
        };
        let input: Vec<u8> = (1..=1024i32).flat_map(|x| x.to_le_bytes()).collect();
        let (a, b) = (alloc(&input), alloc(&[0; 4096]));
        let kernargs: Vec<u8> = [a, b, 4096, 4096]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let ka = alloc(&kernargs);
        let mut sig = Signal::default();
        (f.signal_create)(1, 0, std::ptr::null(), &mut sig);
        let mut q: *mut Queue = std::ptr::null_mut();
        assert_eq!(
            (f.queue_create)(
                aie,
                64,
                QueueType::SINGLE,
                Some(ignore_queue_error),
                std::ptr::null_mut(),
                0,
                0,
                &mut q
            ),
            Status::SUCCESS
        );
        let mut packet = AieKernelObjectPacket {
            header: AIE_DISPATCH_HEADER,
            count: AIE_DISPATCH_COUNT,
            completion_signal: sig,
            num_kernargs: 2,
            kernarg_address: ka,
            ..Default::default()
        };
        packet.set_kernel_object(ko);
        let wr = (f.queue_add_write_index_relaxed)(q, 1);
        (*q).base_address
            .cast::<AieKernelObjectPacket>()
            .add(wr as usize % 64)
            .write(packet);
        (f.signal_store_screlease)((*q).doorbell_signal, wr as i64);
        assert_eq!(
            (f.signal_wait_scacquire)(sig, SignalCondition::EQ, 0, u64::MAX, WaitState::BLOCKED),
            0
        );
        let out = std::slice::from_raw_parts(b as *const i32, 1024);
        assert!(out.iter().enumerate().all(|(i, &v)| v == i as i32 + 4));
        assert_eq!((f.queue_destroy)(q), Status::SUCCESS);
        assert_eq!((f.executable_destroy.unwrap())(e), Status::SUCCESS);
        assert_eq!((f.code_object_reader_destroy.unwrap())(r), Status::SUCCESS);
        assert_eq!((f.shut_down)(), Status::SUCCESS);
    }
}
