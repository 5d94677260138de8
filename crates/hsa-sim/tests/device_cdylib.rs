//! The emulator's cdylib as a drop-in `libhsa-runtime64.so`: found by discovery under
//! `$ROCM_PATH/lib`, driven by hsa-core, and driven through the raw C ABI exactly as ROCm's own
//! Python host runtime (IRON) drives ROCR (`rocr-aie.md` §10).

mod device_support;

use std::ffi::c_void;
use std::path::Path;
use std::time::{Duration, Instant};

use device_support::*;
use hsa_core::discovery::{RootKind, SearchEnv};
use hsa_core::sys::*;
use hsa_core::{ApiSource, Device, DeviceOptions, HsaApi};
use hsa_sim::Profile;
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

/// A `$ROCM_PATH` whose `lib/libhsa-runtime64.so` is the emulator.
fn rocm_root() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("lib")).unwrap();
    std::fs::copy(cdylib_path(), t.path().join("lib/libhsa-runtime64.so")).unwrap();
    t
}

fn discover(root: &Path) -> HsaApi {
    let env = SearchEnv {
        rocm_path: Some(root.to_path_buf()),
        opt_rocm: root.join("no-opt-rocm"),
        ..Default::default()
    };
    HsaApi::discover_in(None, &env).expect("discovery finds the emulator under ROCM_PATH")
}

/// The cdylib reads its configuration from the environment at the first hsa_init. The agent
/// is a Phoenix (`aie2`), whose name every profile reports truthfully.
fn set_env(profile: Profile) {
    // SAFETY: every test in this binary holds `serial_test_guard` while it runs, so no other
    // thread reads or writes the environment concurrently.
    unsafe {
        std::env::set_var("HSA_SIM_PROFILE", profile.as_str());
        std::env::set_var("HSA_SIM_AGENT_NAME", "aie2");
    }
}

#[test]
fn discovery_finds_the_cdylib_under_rocm_path_and_vector_scalar_add_passes() {
    let _g = hsa_sim::serial_test_guard();
    let root = rocm_root();
    for profile in packet_profiles() {
        let abi = profile.packet_abi();
        set_env(profile);
        let api = discover(root.path());
        assert_eq!(
            api.source(),
            &ApiSource::Loaded {
                path: root.path().join("lib/libhsa-runtime64.so"),
                root: RootKind::RocmPath
            }
        );
        let mut dev = Device::open(
            api,
            DeviceOptions {
                packet_abi: abi,
                // The emulated agent is aie2 (npu1); G1a runtimes name every NPU aie2, so the
                // name does not tell the generation there.
                generation: Some(hsa_core::Generation::Npu1),
                // `auto` everywhere but late 2025, which nothing tells apart from a G1a build.
                probe_code_objects: profile != Profile::RocrLate2025,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            dev.info().packet_abi,
            abi,
            "{profile}: {}",
            dev.info().packet_abi_source
        );
        assert_eq!(dev.info().agent_name, "aie2");
        assert_eq!(dev.info().generation, hsa_core::Generation::Npu1);
        vector_scalar_add_passes(&mut dev);
        add_one_chain(&mut dev, 100);
    }
}

#[test]
fn the_cdylib_opened_by_path_passes_vector_scalar_add_for_each_packet_abi() {
    let _g = hsa_sim::serial_test_guard();
    let path = cdylib_path();
    for profile in packet_profiles() {
        let abi = profile.packet_abi();
        set_env(profile);
        let api = HsaApi::open(&path).expect("the cdylib loads and exports every required symbol");
        assert!(
            api.fns().missing_optional().is_empty(),
            "{:?}",
            api.fns().missing_optional()
        );
        let mut dev = Device::open(
            api,
            DeviceOptions {
                packet_abi: abi,
                // The emulated agent is aie2 (npu1); G1a runtimes name every NPU aie2, so the
                // name does not tell the generation there.
                generation: Some(hsa_core::Generation::Npu1),
                // `auto` everywhere but late 2025, which nothing tells apart from a G1a build.
                probe_code_objects: profile != Profile::RocrLate2025,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            dev.info().packet_abi,
            abi,
            "{profile}: {}",
            dev.info().packet_abi_source
        );
        assert!(
            dev.info().library.contains("libhsa_sim.so"),
            "{}",
            dev.info().library
        );
        vector_scalar_add_passes(&mut dev);
    }
}

#[test]
fn create_and_destroy_counts_balance_after_the_device_is_dropped() {
    let _g = hsa_sim::serial_test_guard();
    let root = rocm_root();
    set_env(Profile::Rocm70);
    let api = discover(root.path());
    // The cdylib's own counters, read through its extra C symbol.
    // SAFETY: the same library discovery already loaded; loading it again only takes a reference.
    let lib =
        unsafe { libloading::Library::new(root.path().join("lib/libhsa-runtime64.so")) }.unwrap();
    let read_counters = || {
        let mut c = hsa_sim::Counters::default();
        // SAFETY: the symbol is `extern "C" fn(*mut Counters)` in the emulator, and `c` is a
        // valid Counters with the same #[repr(C)] layout (same crate, same build).
        unsafe {
            let f = lib
                .get::<unsafe extern "C" fn(*mut hsa_sim::Counters)>("hsa_sim_counters")
                .unwrap();
            f(&mut c);
        }
        c
    };
    let before = read_counters();
    {
        let mut dev = Device::open(
            api,
            DeviceOptions {
                packet_abi: hsa_core::PacketAbi::G1a,
                generation: Some(hsa_core::Generation::Npu1),
                ..Default::default()
            },
        )
        .unwrap();
        add_one_chain(&mut dev, 100);
        let mid = read_counters().since(&before);
        assert!(!mid.balanced(), "objects are live while the device is open");
    }
    let after = read_counters().since(&before);
    assert!(after.balanced(), "{:?}", after.unbalanced());
}

// ---- the raw C ABI, as IRON's HSA backend drives it ----------------------------------------

struct Iron;

impl Iron {
    fn ok(&self, what: &str, st: Status) {
        assert_eq!(st, Status::SUCCESS, "{what}");
    }
}

unsafe extern "C" fn push_agent(a: Agent, data: *mut c_void) -> Status {
    // SAFETY: data is the Vec<Agent> the caller passed.
    unsafe { (*data.cast::<Vec<Agent>>()).push(a) };
    Status::SUCCESS
}

unsafe extern "C" fn push_pool(p: MemoryPool, data: *mut c_void) -> Status {
    // SAFETY: data is the Vec<MemoryPool> the caller passed.
    unsafe { (*data.cast::<Vec<MemoryPool>>()).push(p) };
    Status::SUCCESS
}

#[test]
fn a_client_driving_the_c_abi_like_iron_runs_vector_scalar_add_and_a_chain() {
    let _g = hsa_sim::serial_test_guard();
    let root = rocm_root();
    // Every profile that speaks G2; IRON's vmem sequence needs a runtime that maps AIE memory.
    for profile in [Profile::RocrG2May2026, Profile::RocrNewest] {
        set_env(profile);
        iron_sequence(&discover(root.path()), profile);
    }
}

fn iron_sequence(api: &HsaApi, profile: Profile) {
    let f = api.fns();
    let iron = Iron;
    // SAFETY: every call below follows ROCR's documented contract: valid out-pointers, handles
    // obtained from the runtime, buffers allocated from it and sized as declared. This is the
    // sequence IRON's ctypes backend performs. Buffers are viewed as slices only once the
    // signal says the work finished, when nothing writes them.
    unsafe {
        iron.ok("hsa_init", (f.init)());
        let (mut freq, mut max_wait) = (0u64, 0u64);
        iron.ok(
            "timestamp frequency",
            (f.system_get_info)(SystemInfo::TIMESTAMP_FREQUENCY, (&raw mut freq).cast()),
        );
        iron.ok(
            "signal max wait",
            (f.system_get_info)(SystemInfo::SIGNAL_MAX_WAIT, (&raw mut max_wait).cast()),
        );
        assert!(freq > 0 && max_wait > 0);
        // A client can tell the emulator and its profile from the build version.
        let mut version: *const std::ffi::c_char = std::ptr::null();
        iron.ok(
            "build version",
            (f.system_get_info)(SystemInfo::AMD_BUILD_VERSION, (&raw mut version).cast()),
        );
        let version = std::ffi::CStr::from_ptr(version).to_str().unwrap();
        assert_eq!(hsa_sim::profile_of_build_version(version), Some(profile));

        let mut agents: Vec<Agent> = Vec::new();
        iron.ok(
            "iterate agents",
            (f.iterate_agents)(Some(push_agent), (&raw mut agents).cast()),
        );
        let kind = |a: Agent| {
            let mut d = 0u32;
            iron.ok(
                "device",
                (f.agent_get_info)(a, AgentInfo::DEVICE, (&raw mut d).cast()),
            );
            d
        };
        let aie = *agents
            .iter()
            .find(|&&a| kind(a) == 3)
            .expect("an AIE agent");
        let cpu = *agents.iter().find(|&&a| kind(a) == 0).expect("a CPU agent");
        let mut name = [0u8; 64];
        iron.ok(
            "name",
            (f.agent_get_info)(aie, AgentInfo::NAME, name.as_mut_ptr().cast()),
        );
        let name =
            std::str::from_utf8(&name[..name.iter().position(|&b| b == 0).unwrap()]).unwrap();
        let generation = NpuGen::from_agent_name(name).expect("aie2 or aie2p");
        let mut qmin = 0u32;
        iron.ok(
            "queue min size",
            (f.agent_get_info)(aie, AgentInfo::QUEUE_MIN_SIZE, (&raw mut qmin).cast()),
        );
        assert_eq!(qmin, 64);

        let mut pools: Vec<MemoryPool> = Vec::new();
        iron.ok(
            "pools",
            (f.agent_iterate_memory_pools)(aie, Some(push_pool), (&raw mut pools).cast()),
        );
        let info = |p: MemoryPool, attr: PoolInfo| {
            let mut v = 0u64;
            iron.ok(
                "pool info",
                (f.memory_pool_get_info)(p, attr, (&raw mut v).cast()),
            );
            v
        };
        let usable = |p: MemoryPool| {
            info(p, PoolInfo::SEGMENT) == 0 && info(p, PoolInfo::GLOBAL_FLAGS) & 4 != 0
        };
        let data = *pools
            .iter()
            .find(|&&p| usable(p) && info(p, PoolInfo::RUNTIME_ALLOC_REC_GRANULE) != 0)
            .unwrap();
        let heap = *pools
            .iter()
            .find(|&&p| usable(p) && info(p, PoolInfo::RUNTIME_ALLOC_REC_GRANULE) == 0)
            .unwrap();
        let granule = usize::try_from(info(data, PoolInfo::RUNTIME_ALLOC_GRANULE)).unwrap();

        // vmem_alloc as IRON does it.
        let vmem_alloc = |size: usize| -> *mut u8 {
            let size = size.div_ceil(granule) * granule;
            let mut h = VmemHandle::default();
            iron.ok(
                "handle",
                (f.vmem_handle_create.unwrap())(data, size, MemoryType::PINNED, 0, &mut h),
            );
            let mut va: *mut c_void = std::ptr::null_mut();
            iron.ok(
                "reserve",
                (f.vmem_address_reserve_align.unwrap())(
                    &mut va,
                    size,
                    0,
                    0,
                    VMEM_ADDRESS_NO_REGISTER,
                ),
            );
            iron.ok("map", (f.vmem_map.unwrap())(va, size, 0, h, 0));
            let desc = [
                AccessDesc {
                    permissions: AccessPermission::RW,
                    agent_handle: cpu,
                },
                AccessDesc {
                    permissions: AccessPermission::RW,
                    agent_handle: aie,
                },
            ];
            iron.ok(
                "set access",
                (f.vmem_set_access.unwrap())(va, size, desc.as_ptr(), 2),
            );
            va.cast()
        };

        let mut q: *mut Queue = std::ptr::null_mut();
        iron.ok(
            "queue",
            (f.queue_create)(
                aie,
                qmin,
                QueueType::SINGLE,
                None,
                std::ptr::null_mut(),
                0,
                0,
                &mut q,
            ),
        );
        let size = u64::from((*q).size);
        let ring = (*q).base_address.cast::<AieDispatchPacket>();
        let doorbell = (*q).doorbell_signal;
        let kernargs = vmem_alloc(256 * usize::try_from(size).unwrap());
        let mut sig = Signal::default();
        iron.ok(
            "signal",
            (f.signal_create)(0, 0, std::ptr::null(), &mut sig),
        );

        // load: PDI and insts into the device heap with a plain memmove.
        let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
        let (pdi, insts) = (design.to_pdi(), design.insts(generation));
        let heap_copy = |bytes: &[u8]| {
            let mut p: *mut c_void = std::ptr::null_mut();
            iron.ok(
                "heap alloc",
                (f.memory_pool_allocate)(heap, bytes.len(), 0, &mut p),
            );
            std::ptr::copy(bytes.as_ptr(), p.cast(), bytes.len());
            p as u64
        };
        let (pdi_va, insts_va) = (heap_copy(&pdi), heap_copy(&insts));

        let bufs = [vmem_alloc(4096), vmem_alloc(4096)];
        let input: Vec<i32> = (1..=1024).collect();
        std::ptr::copy(input.as_ptr().cast::<u8>(), bufs[0], 4096);

        let enqueue = |src: *mut u8, dst: *mut u8| -> u64 {
            let wr = (f.queue_load_write_index_relaxed)(q);
            let start = Instant::now();
            while wr - (f.queue_load_read_index_scacquire)(q) >= size {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "ring full and never drained"
                );
                std::thread::yield_now();
            }
            let wr = (f.queue_add_write_index_relaxed)(q, 1);
            let slot = usize::try_from(wr % size).unwrap();
            let ka = kernargs.add(slot * 256).cast::<u64>();
            ka.write(src as u64);
            ka.add(1).write(dst as u64);
            ka.add(2).write(4096);
            ka.add(3).write(4096);
            let pkt = AieDispatchPacket {
                header: 0x1400,
                opcode: 0,
                count: 24,
                completion_signal: sig,
                insts_addr_low: (insts_va & 0xFFFF_FFFF) as u32,
                insts_addr_high: (insts_va >> 32) as u32,
                num_kernargs: 2,
                kernarg_address: ka as u64,
                insts_size: insts.len() as u64,
                pdi_addr: pdi_va,
                ..Default::default()
            };
            ring.add(slot).write(pkt);
            wr
        };
        // IRON's wait: a finite hint, repeated until the signal reads 0.
        let wait = || {
            let start = Instant::now();
            loop {
                let v = (f.signal_wait_scacquire)(
                    sig,
                    SignalCondition::EQ,
                    0,
                    freq / 100,
                    WaitState::BLOCKED,
                );
                if v == 0 {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "signal stuck at {v}"
                );
            }
        };

        // One dispatch.
        (f.signal_store_screlease)(sig, 1);
        let wr = enqueue(bufs[0], bufs[1]);
        (f.signal_store_screlease)(doorbell, wr as i64);
        wait();
        let out = std::slice::from_raw_parts(bufs[1].cast::<i32>(), 1024);
        assert!(out.iter().zip(&input).all(|(o, i)| *o == i + 1));

        // A chain of 100, ringing every min(32, size) packets and once at the end, one signal
        // armed to the chain length.
        (f.signal_store_screlease)(sig, 100);
        let mut last = 0;
        for i in 0..100 {
            last = enqueue(bufs[i % 2], bufs[(i + 1) % 2]);
            if (i + 1) % 32 == 0 {
                (f.signal_store_screlease)(doorbell, last as i64);
            }
        }
        (f.signal_store_screlease)(doorbell, last as i64);
        wait();
        assert_eq!((f.queue_load_read_index_scacquire)(q), last + 1);
        // 100 add-ones starting from bufs[0] (still the input), ending in bufs[0] (100 is even).
        let out = std::slice::from_raw_parts(bufs[0].cast::<i32>(), 1024);
        assert!(
            out.iter().zip(&input).all(|(o, i)| *o == i + 100),
            "chain result"
        );
        // IRON never releases the queue, the kernarg pool or the signal, and never calls
        // hsa_shut_down: the runtime must tolerate that. Balance the init for later tests.
        iron.ok("shut down", (f.shut_down)());
    }
}
