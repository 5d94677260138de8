//! hsa-core does not trust what a runtime hands back, and releases objects in the order the
//! runtime needs. The emulator's function table is wrapped here so that a call returns what a
//! broken or different runtime might (a queue of the wrong size, a null ring) or records the
//! order of the release calls.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use hsa_core::sys::{Agent, HsaFns, Queue, QueueErrorCallback, QueueType, Status};
use hsa_core::{Device, DeviceOptions, Dispatch, HsaApi, HsaError};
use hsa_sim::{NpuGen, Profile, SimConfig};
use npu_artifacts::emu::{DType, EmuDesign};

/// What the wrapped `hsa_queue_create` does to the queue it returns.
static TAMPER: AtomicU32 = AtomicU32::new(0);
const SIZE_32: u32 = 1;
const NULL_RING: u32 = 2;

/// Release calls in the order they were made: ("queue", ptr) or ("free", ptr).
static CALLS: Mutex<Vec<(&'static str, usize)>> = Mutex::new(Vec::new());

fn log(what: &'static str, p: usize) {
    CALLS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((what, p));
}

unsafe extern "C" fn queue_create(
    agent: Agent,
    size: u32,
    type_: QueueType,
    cb: Option<QueueErrorCallback>,
    data: *mut c_void,
    private: u32,
    group: u32,
    out: *mut *mut Queue,
) -> Status {
    // SAFETY: the arguments are the caller's, passed on unchanged.
    let st =
        unsafe { hsa_sim::hsa_queue_create(agent, size, type_, cb, data, private, group, out) };
    if st == Status::SUCCESS {
        // SAFETY: on success `*out` is the emulator's live queue descriptor; this test alone
        // changes it, before the binding reads it, to play a runtime that returns other values.
        unsafe {
            let q = *out;
            match TAMPER.load(Ordering::SeqCst) {
                SIZE_32 => (*q).size = 32,
                NULL_RING => (*q).base_address = std::ptr::null_mut(),
                _ => {}
            }
        }
    }
    st
}

unsafe extern "C" fn queue_destroy(q: *mut Queue) -> Status {
    log("queue", q as usize);
    // SAFETY: passed on unchanged.
    unsafe { hsa_sim::hsa_queue_destroy(q) }
}

unsafe extern "C" fn pool_free(p: *mut c_void) -> Status {
    log("free", p as usize);
    // SAFETY: passed on unchanged.
    unsafe { hsa_sim::hsa_amd_memory_pool_free(p) }
}

fn open(tamper: u32) -> Result<Device, HsaError> {
    hsa_sim::set_config(SimConfig {
        agent: NpuGen::Npu2,
        profile: Profile::RocrNewest,
        timeout: std::time::Duration::from_millis(300),
        ..SimConfig::default()
    });
    TAMPER.store(tamper, Ordering::SeqCst);
    let fns = HsaFns {
        queue_create,
        queue_destroy,
        memory_pool_free: pool_free,
        ..hsa_sim::fns()
    };
    // SAFETY: the wrappers pass the caller's arguments on to the emulator's own functions and
    // write through no pointer the emulator would not; the one liberty they take, a queue
    // descriptor whose size or ring differs from the one asked for, is what this test shows
    // the device layer checks before it uses either.
    let api = unsafe { HsaApi::from_static(fns, "hsa-sim (wrapped)") };
    Device::open(api, DeviceOptions::default())
}

#[test]
fn a_queue_of_the_wrong_size_or_without_a_ring_is_refused_and_destroyed() {
    let _g = hsa_sim::serial_test_guard();
    let before = hsa_sim::counters();
    for (tamper, says) in [
        (SIZE_32, "a queue of 32 packets where 64 were asked for"),
        (NULL_RING, "ring (base_address) is null"),
    ] {
        let e = open(tamper).expect_err("the binding refuses the queue");
        assert!(
            matches!(
                e,
                HsaError::Contract {
                    call: "hsa_queue_create",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains(says), "{e}");
    }
    TAMPER.store(0, Ordering::SeqCst);
    let after = hsa_sim::counters().since(&before);
    assert!(after.balanced(), "{:?}", after.unbalanced());
}

#[test]
fn the_queue_is_destroyed_before_the_pdis_it_loaded_are_freed() {
    let _g = hsa_sim::serial_test_guard();
    let mut dev = open(0).expect("opens");
    let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
    let (pdi, insts) = (design.to_pdi(), design.insts(NpuGen::Npu2));
    let kept = dev.load_program(&pdi, &insts).unwrap();
    let gone = dev.load_program(&pdi, &insts).unwrap();
    let a = dev.alloc_tensor(4096).unwrap();
    let b = dev.alloc_tensor(4096).unwrap();
    for p in [kept, gone] {
        dev.dispatch(&Dispatch::new(p, [a, b])).unwrap();
    }
    let order = |calls: &[(&str, usize)]| -> (usize, usize) {
        let queue = calls
            .iter()
            .position(|c| c.0 == "queue")
            .expect("a queue destroy");
        let free = calls.iter().position(|c| c.0 == "free").expect("a free");
        (queue, free)
    };

    // Unloading a program the queue ran: the queue goes first, then its PDI and insts.
    CALLS.lock().unwrap().clear();
    dev.unload_program(gone).unwrap();
    let calls = CALLS.lock().unwrap().clone();
    let (queue, free) = order(&calls);
    assert!(queue < free, "{calls:?}");
    // The device recreates its queue for the next dispatch.
    dev.dispatch(&Dispatch::new(kept, [a, b])).unwrap();

    // Dropping the device: the queue before any program or tensor memory.
    CALLS.lock().unwrap().clear();
    drop(dev);
    let calls = CALLS.lock().unwrap().clone();
    let (queue, free) = order(&calls);
    assert_eq!(queue, 0, "{calls:?}");
    assert!(queue < free, "{calls:?}");
}
