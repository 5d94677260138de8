//! ROCm 7.0 fails silently (`rocr-aie.md` §5.6): its doorbell only `assert`s, which release
//! builds compile out, so a failed batch calls no callback, suspends nothing, and moves the
//! read index to the write index as if every packet had run. What a client can still see is
//! what did not happen: the output untouched.

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::*;
use hsa_core::sys::{Signal, Status};
use hsa_sim::*;
use npu_artifacts::emu::EmuDesign;

/// Rings a fault or hang design writing into a zeroed output, then a valid packet, in one batch.
fn ring_failing(sim: &Sim, q: &TestQueue, design: &EmuDesign) -> (u64, Dispatch) {
    let (a, b) = (sim.put(DATA, &[7; 64]), sim.alloc(DATA, 64));
    let bad = Dispatch::new(sim.load(design), &[(a, 64), (b, 64)], Signal::default());
    let after = valid(sim, Signal::default());
    q.submit(&[sim.packet(&bad), sim.packet(&after)]);
    (b, after)
}

#[test]
fn a_fault_is_silent_and_the_rest_of_the_batch_does_not_run() {
    let sim = Sim::new(Profile::Rocm70);
    let q = sim.queue();
    let before = counters();
    let (out, after) = ring_failing(&sim, &q, &EmuDesign::fault(64));
    let seen = counters().since(&before);
    assert_eq!(q.errors(), vec![], "no callback");
    assert!(!q.suspended());
    assert_eq!((q.read_index(), q.write_index()), (2, 2));
    assert_eq!(
        read(out, 64),
        vec![0; 64],
        "the fault left its output untouched"
    );
    assert_eq!(
        read(after.args[1].0, 1024),
        vec![0; 1024],
        "the packet after it never ran"
    );
    assert_eq!((seen.packets_completed, seen.packets_failed), (0, 1));
    assert_eq!(last_error_status(), Some(Status::ERROR));
    assert!(last_error().unwrap().contains("device error"));
    // The queue takes the next batch as if nothing happened.
    let d = valid(&sim, Signal::default());
    q.submit(&[sim.packet(&d)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 3));
    assert_eq!(bytes_i32(&read(d.args[1].0, 1024)), vec![6; 256]);
}

#[test]
fn a_hang_gives_up_at_the_50_ms_command_wait_silently() {
    // A watchdog far longer than ROCm 7.0's WAIT_CMD timeout: the runtime gives up first.
    let sim = Sim::with(SimConfig {
        profile: Profile::Rocm70,
        timeout: std::time::Duration::from_secs(3600),
        ..Default::default()
    });
    let q = sim.queue();
    let (out, _) = ring_failing(&sim, &q, &EmuDesign::hang(64));
    assert_eq!(q.errors(), vec![]);
    assert_eq!((q.read_index(), q.write_index()), (2, 2));
    assert_eq!(read(out, 64), vec![0; 64]);
    let detail = last_error().unwrap();
    assert!(
        detail.contains("WAIT_CMD timed out") && detail.contains("50 ms"),
        "{detail}"
    );
}

// What ROCm 7.0 does with packets npud could send, each as observed over a model of the
// amdxdna driver (`reference/rocm70-observed.md`). "Silently": the doorbell returns, the read
// index advances, nothing reports an error.

/// Set in a child process to the name of the test whose body it runs.
const CHILD: &str = "HSA_SIM_ROCM70_CHILD";

/// Runs `body` in a child (this test binary again, only `test`), and returns the child's
/// status and stderr. In the child, runs `body` and exits 0.
fn in_child(test: &str, body: impl FnOnce()) -> Option<(std::process::ExitStatus, String)> {
    if std::env::var(CHILD).as_deref() == Ok(test) {
        body();
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the test binary runs again");
    Some((
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn a_g2_packet_is_read_as_g1a_and_its_null_payload_kills_the_process() {
    let name = "a_g2_packet_is_read_as_g1a_and_its_null_payload_kills_the_process";
    let Some((status, stderr)) = in_child(name, || {
        let sim = Sim::new(Profile::Rocm70);
        let q = sim.queue();
        // What npud sent under `auto` before it could tell ROCm 7.0 apart: a G2 packet.
        let d = valid(&sim, sim.signal(1));
        q.submit(&[g2_bytes(&g2_packet(&sim, &d))]);
        eprintln!("child: the G2 packet did not kill the process");
        std::process::exit(3);
    }) else {
        return;
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}: {stderr}");
    assert!(
        stderr.contains("payload_data is NULL") && stderr.contains("rocm-7.0"),
        "{stderr}"
    );
}

#[test]
fn an_opcode_other_than_start_cu_hangs_the_ringing_thread() {
    let name = "an_opcode_other_than_start_cu_hangs_the_ringing_thread";
    let Some((status, stderr)) = in_child(name, || {
        let sim = Sim::new(Profile::Rocm70);
        let q = sim.queue();
        let mut p = g1_packet(&sim, &valid(&sim, Signal::default()));
        let mut bits = p.bits();
        bits.opcode = hsa_core::sys::ert_opcode::START_CU + 1;
        p.ert = bits.pack();
        q.enqueue(&[g1_bytes(&p)]);
        let (tx, rx) = std::sync::mpsc::channel();
        // SAFETY: a live queue's descriptor.
        let doorbell = unsafe { (*q.q).doorbell_signal };
        let wr = q.write_index();
        std::thread::spawn(move || {
            // SAFETY: the queue's doorbell signal; the queue outlives the child.
            unsafe { hsa_signal_store_screlease(doorbell, wr as i64 - 1) };
            let _ = tx.send(());
        });
        // The doorbell never returns; a generous bound only ends the child.
        let returned = rx.recv_timeout(std::time::Duration::from_secs(2)).is_ok();
        eprintln!("child: returned={returned} read_index={}", q.read_index());
        std::process::exit(if returned { 3 } else { 0 });
    }) else {
        return;
    };
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        stderr.contains("returned=false read_index=0"),
        "the ringing thread never returns and the packet never retires: {stderr}"
    );
}

#[test]
fn every_doorbell_builds_a_hardware_context_even_for_the_same_pdi() {
    let sim = Sim::new(Profile::Rocm70);
    let q = sim.queue();
    let d = valid(&sim, Signal::default());
    let before = counters();
    for _ in 0..5 {
        // A fresh payload each time (ROCm 7.0 rewrites a payload it has run).
        q.submit(&[sim.packet(&d)]);
    }
    let seen = counters().since(&before);
    assert_eq!(seen.packets_completed, 5);
    assert_eq!(seen.hw_context_builds, 5, "one context per doorbell");
    assert_eq!(bytes_i32(&read(d.args[1].0, 1024)), vec![6; 256]);
}

#[test]
fn a_later_queues_first_doorbell_with_the_same_pdi_buffer_is_silently_dropped() {
    let sim = Sim::new(Profile::Rocm70);
    let d = valid(&sim, Signal::default());
    let out = d.args[1].0;
    let first = sim.queue();
    first.submit(&[sim.packet(&d)]);
    assert_eq!(bytes_i32(&read(out, 1024)), vec![6; 256]);
    drop(first);

    // The cache entry the first queue left under key 0 outlives it.
    write(out, &[0; 1024]);
    let q = sim.queue();
    let before = counters();
    q.submit(&[sim.packet(&d)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 1), "silently");
    assert_eq!(read(out, 1024), vec![0; 1024], "nothing ran");
    assert_eq!(counters().since(&before).hw_context_builds, 0);
    assert!(
        last_error().unwrap().contains("under key 0"),
        "{:?}",
        last_error()
    );
    // The queue still has no context: the same PDI keeps hitting the stale entry.
    q.submit(&[sim.packet(&d)]);
    assert_eq!((q.read_index(), read(out, 1024)), (2, vec![0; 1024]));

    // A fresh copy of the same PDI, allocated while the old buffer lives, misses: the queue
    // gets a context, and from then on the old buffer runs too.
    let fresh = sim.put(HEAP, &add_one().to_pdi());
    let copy = Dispatch {
        pdi: fresh,
        ..d.clone()
    };
    q.submit(&[sim.packet(&copy)]);
    assert_eq!(bytes_i32(&read(out, 1024)), vec![6; 256]);
    write(out, &[0; 1024]);
    q.submit(&[sim.packet(&d)]);
    assert_eq!(bytes_i32(&read(out, 1024)), vec![6; 256]);
    assert_eq!(counters().since(&before).hw_context_builds, 2);
}

#[test]
fn re_initialising_the_runtime_clears_the_pdi_cache() {
    let design = add_one();
    let sim = Sim::new(Profile::Rocm70);
    let d = valid(&sim, Signal::default());
    sim.queue().submit(&[sim.packet(&d)]);
    drop(sim);
    // The same design placed at the same heap offset in a new runtime runs on its first queue.
    let sim = Sim::new(Profile::Rocm70);
    let (a, b) = io_i32(&sim, &[5; 256]);
    let d = Dispatch::new(
        sim.load(&design),
        &[(a, 1024), (b, 1024)],
        Signal::default(),
    );
    let q = sim.queue();
    q.submit(&[sim.packet(&d)]);
    assert_eq!(bytes_i32(&read(d.args[1].0, 1024)), vec![6; 256]);
}

#[test]
fn re_submitting_the_same_payload_is_silently_dropped() {
    let sim = Sim::new(Profile::Rocm70);
    let q = sim.queue();
    let d = valid(&sim, Signal::default());
    let out = d.args[1].0;
    let packet = sim.packet(&d);
    q.submit(&[packet]);
    assert_eq!(bytes_i32(&read(out, 1024)), vec![6; 256]);
    // The runtime wrote the instruction address's translation into the payload.
    let payload = g1_payload(&packet);
    let low = u32::from_le_bytes(read(payload + 16, 4).try_into().unwrap());
    assert_eq!(low & 0xFC00_0000, 0x0400_0000, "{low:#x}");
    write(out, &[0; 1024]);
    q.submit(&[packet]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 2));
    assert_eq!(
        read(out, 1024),
        vec![0; 1024],
        "the second submission never ran"
    );
    // `PrepareBOs` finds no buffer at the translated address.
    assert_eq!(last_error_status(), Some(Status::ERROR_INVALID_ALLOCATION));
    assert!(last_error().unwrap().contains("FindBOHandle"));
}

fn g1_payload(packet: &[u8; 64]) -> u64 {
    u64::from_le_bytes(packet[56..64].try_into().unwrap())
}

#[test]
fn operands_that_are_not_driver_buffers_drop_the_packet_before_any_context() {
    let sim = Sim::new(Profile::Rocm70);
    let q = sim.queue();
    let (input, out) = io_i32(&sim, &[5; 256]);
    let host = vec![0u8; 1024];
    let d = Dispatch::new(
        sim.load(&add_one()),
        &[(input, 1024), (host.as_ptr() as u64, 1024)],
        Signal::default(),
    );
    let before = counters();
    q.submit(&[sim.packet(&d)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 1), "silently");
    assert_eq!(host, vec![0; 1024]);
    assert_eq!(counters().since(&before).hw_context_builds, 0);
    assert!(
        last_error().unwrap().contains("argument 1"),
        "{:?}",
        last_error()
    );
    let _ = out;
}

#[test]
fn an_instruction_buffer_at_16_mib_plus_x_runs_the_buffer_at_x() {
    const MIB: u64 = 1 << 20;
    let sim = Sim::new(Profile::Rocm70);
    let design = add_one();
    let insts = design.insts(sim.generation());
    // Heap offset 0 first: the heap is 64 MiB aligned and empty.
    let low = sim.put(HEAP, &vec![0u8; insts.len()]);
    let base = low & !(64 * MIB - 1);
    assert_eq!(low, base, "the first heap allocation is at offset 0");
    let filler = sim.alloc(HEAP, (16 * MIB - (1 << 15)) as usize);
    let high = sim.put(HEAP, &insts);
    assert_eq!(high - base, 16 * MIB, "the stream sits at 16 MiB");
    let pdi = sim.put(HEAP, &design.to_pdi());
    let (a, b) = io_i32(&sim, &[5; 256]);
    let d = Dispatch::new(
        (pdi, high, insts.len() as u64),
        &[(a, 1024), (b, 1024)],
        Signal::default(),
    );
    let q = sim.queue();
    // The device fetches offset 0, which holds zeros: a device error, reported as nothing.
    q.submit(&[sim.packet(&d)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 1));
    assert_eq!(read(b, 1024), vec![0; 1024]);
    assert!(
        last_error()
            .unwrap()
            .contains("instruction sequence is malformed"),
        "{:?}",
        last_error()
    );
    // Put the stream at offset 0 and the same packet runs: the device read offset 0.
    write(low, &insts);
    q.submit(&[sim.packet(&d)]);
    assert_eq!(bytes_i32(&read(b, 1024)), vec![6; 256]);
    let _ = filler;
}

#[test]
fn hsa_shut_down_leaves_the_accel_device_open() {
    let open = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t.to_string_lossy().contains("hsa-sim-accel0"))
            .count()
    };
    let before = open();
    drop(Sim::new(Profile::Rocm70));
    assert_eq!(open(), before + 1, "hsa_shut_down closed nothing");
    drop(Sim::new(Profile::Rocm70));
    assert_eq!(open(), before + 2, "a second hsa_init opens it again");
    drop(Sim::new(Profile::RocrNewest));
    assert_eq!(open(), before + 2, "the later releases close it");
}

#[test]
fn dmabuf_export_of_aie_memory_is_invalid_agent() {
    let sim = Sim::new(Profile::Rocm70);
    let p = sim.alloc(DATA, 4096);
    let (mut fd, mut off) = (7, 0u64);
    // SAFETY: out-pointers are live locals; the range lies in the allocation.
    let st = unsafe {
        hsa_amd_portable_export_dmabuf(p as *const std::ffi::c_void, 64, &mut fd, &mut off)
    };
    assert_eq!(st, Status::ERROR_INVALID_AGENT);
    assert_eq!(st.0, 0x1004);
}

/// An add-`k` design over 256 i32 and its dispatch on fresh buffers holding `input`.
/// The PDI and instructions are placed first, so they take the lowest free GEM handles.
fn add_k(sim: &Sim, k: i64, input: i32) -> Dispatch {
    let design = EmuDesign::vector_scalar_add(256, npu_artifacts::emu::DType::I32, k);
    let loaded = sim.load(&design);
    let (a, b) = io_i32(sim, &[input; 256]);
    Dispatch::new(loaded, &[(a, 1024), (b, 1024)], Signal::default())
}

#[test]
fn a_new_pdi_that_gets_a_freed_pdis_gem_handle_hits_the_stale_key_0_entry() {
    let sim = Sim::new(Profile::Rocm70);
    let first = add_k(&sim, 1, 5);
    let q = sim.queue();
    q.submit(&[sim.packet(&first)]);
    assert_eq!(bytes_i32(&read(first.args[1].0, 1024)), vec![6; 256]);
    drop(q);
    // The PDI goes; another program's PDI, loaded after it, gets the lowest free GEM handle:
    // the one the first queue's entry under key 0 still lists.
    sim.free(first.pdi);
    let second = add_k(&sim, 2, 5);
    let q = sim.queue();
    let before = counters();
    q.submit(&[sim.packet(&second)]);
    let seen = counters().since(&before);
    assert_eq!((q.errors(), q.read_index()), (vec![], 1), "silently");
    assert_eq!(read(second.args[1].0, 1024), vec![0; 1024], "nothing ran");
    assert_eq!((seen.rocm70_cache_hits, seen.hw_context_builds), (1, 0));
    assert!(
        last_error().unwrap().contains("under key 0"),
        "{:?}",
        last_error()
    );
}

#[test]
fn config_cu_refuses_a_stale_handle_that_now_names_a_shared_buffer() {
    let sim = Sim::new(Profile::Rocm70);
    let first = add_k(&sim, 1, 5);
    sim.queue().submit(&[sim.packet(&first)]);
    // The PDI's handle goes to a shared (data-pool) buffer; a new PDI misses under key 0, and
    // the context is configured with the stale entry plus the new PDI: CONFIG_CU refuses the
    // shared buffer and the batch is dropped.
    sim.free(first.pdi);
    let _shared = sim.alloc(DATA, 4096);
    let second = add_k(&sim, 2, 5);
    let q = sim.queue();
    q.submit(&[sim.packet(&second)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 1), "silently");
    assert_eq!(read(second.args[1].0, 1024), vec![0; 1024], "nothing ran");
    let e = last_error().unwrap();
    assert!(e.contains("CONFIG_CU") && e.contains("Shmem"), "{e}");
    // The refused miss erased the key-0 entry: the next doorbell configures only its own PDI.
    let again = Dispatch {
        args: second.args.clone(),
        ..second.clone()
    };
    q.submit(&[sim.packet(&again)]);
    assert_eq!(bytes_i32(&read(second.args[1].0, 1024)), vec![7; 256]);
}

#[test]
fn after_255_contexts_a_stale_entry_runs_another_programs_kernel() {
    // Queues of 64 packets in one runtime (G1a's ring does not wrap), alternating two programs
    // with two PDI buffers each, as a client that copies a PDI per queue would: past 255
    // contexts, ids come back with the entries of their first use.
    let sim = Sim::new(Profile::Rocm70);
    let (one, two) = (add_k(&sim, 1, 0), add_k(&sim, 1000, 0));
    let pdi_bytes = |d: &Dispatch| read(d.pdi, 4096);
    let before = counters();
    let (mut wrong, mut dropped) = (0, 0);
    let mut q = sim.queue();
    // The fresh copy of the PDI a queue's first doorbell names, and the one before it (kept
    // until a newer one has been named, so that the two never share a handle).
    let mut copies: Vec<u64> = Vec::new();
    for i in 0..600usize {
        let d = if i % 2 == 0 { &one } else { &two };
        let mut d = d.clone();
        if i % 64 == 0 {
            drop(q);
            q = sim.queue();
            copies.push(sim.put(HEAP, &pdi_bytes(&d)));
            if copies.len() > 2 {
                sim.free(copies.remove(0));
            }
            d.pdi = *copies.last().unwrap();
        }
        let input = i32::try_from(i).unwrap();
        write(d.args[0].0, &i32_bytes(&[input; 256]));
        write(d.args[1].0, &i32_bytes(&[i32::MIN; 256]));
        q.submit(&[sim.packet(&d)]);
        let got = bytes_i32(&read(d.args[1].0, 1024))[0];
        let k = if i % 2 == 0 { 1 } else { 1000 };
        if got == i32::MIN {
            dropped += 1;
        } else if got != input + k {
            wrong += 1;
        }
    }
    let seen = counters().since(&before);
    assert!(
        seen.rocm70_cache_hits > 0 && wrong > 0,
        "hits {}, wrong {wrong}, dropped {dropped}",
        seen.rocm70_cache_hits
    );
}

/// Rings `d` alone on `q` with `input` in and the sentinel `i32::MIN` out, and returns the
/// output's first element.
fn ring_one(sim: &Sim, q: &TestQueue, d: &Dispatch, input: i32) -> i32 {
    write(d.args[0].0, &i32_bytes(&[input; 256]));
    write(d.args[1].0, &i32_bytes(&[i32::MIN; 256]));
    q.submit(&[sim.packet(d)]);
    bytes_i32(&read(d.args[1].0, 1024))[0]
}

#[test]
fn a_hit_on_a_reused_context_id_runs_the_pdi_its_cu_was_configured_with_or_fails_if_freed() {
    // ROCR 7.0 (`SubmitCmdChain`): a doorbell on a queue whose context id is `k` looks up the
    // entry under `k`, which the doorbell that replaced the *earlier* context `k` stored (the
    // list it configured its own, newer context with). When the PDI's handle is in it, nothing
    // is configured: the commands go to the live context `k` with that entry's CU index, and
    // run whatever PDI the live context `k` was configured with at that index. The driver
    // reads a CU's PDI buffer as it was at CONFIG_CU: freed since, the command ends
    // ERT_STATE_ERROR, which ROCR never reads back.
    let sim = Sim::new(Profile::Rocm70);
    let p = add_k(&sim, 1, 0);
    let other = add_k(&sim, 2, 0);
    let pdi_bytes = read(p.pdi, 4096);
    let before = counters();
    // A queue every 60 packets (G1a's ring does not wrap at 64). The first queue's first
    // doorbell names the program's PDI; every later queue's a fresh copy of it, kept alive, so
    // that it misses under key 0. So every doorbell misses and builds a context: ids 1..=255
    // in turn, then 1 again. Doorbell 2 stored the list of context 2 ([the PDI]) under key 1.
    let mut q = sim.queue();
    let mut copies = Vec::new();
    for n in 1..=255usize {
        let mut d = p.clone();
        if n % 60 == 1 && n > 1 {
            drop(q);
            q = sim.queue();
            copies.push(sim.put(HEAP, &pdi_bytes));
            d.pdi = *copies.last().unwrap();
        }
        let input = i32::try_from(n).unwrap();
        assert_eq!(ring_one(&sim, &q, &d, input), input + 1, "doorbell {n}");
    }
    // Doorbell 256 runs the other program: key 255 has no entry, a miss; the new context's
    // id wraps to 1, configured with [the other PDI].
    assert_eq!(ring_one(&sim, &q, &other, 256), 256 + 2);
    let seen = counters().since(&before);
    assert_eq!((seen.hw_context_builds, seen.rocm70_cache_hits), (256, 0));

    // Doorbell 257 runs the program again: key 1's entry lists its PDI at index 0, a hit;
    // context 1's CU 0 is the other program's PDI, which runs on this dispatch's data.
    assert_eq!(ring_one(&sim, &q, &p, 257), 257 + 2, "another kernel ran");
    assert_eq!(
        (q.errors(), q.read_index()),
        (vec![], 257 - 240),
        "silently"
    );
    // The other program's PDI buffer is freed; the same hit again: the command fails on the
    // device, and nothing says so.
    sim.free(other.pdi);
    assert_eq!(ring_one(&sim, &q, &p, 258), i32::MIN, "nothing ran");
    assert_eq!(q.errors(), vec![], "silently");
    let e = last_error().unwrap();
    assert!(e.contains("closed since CONFIG_CU"), "{e}");
    let seen = counters().since(&before);
    assert_eq!((seen.hw_context_builds, seen.rocm70_cache_hits), (256, 2));
    assert_eq!(
        seen.packets_completed, 257,
        "the failed command did not complete"
    );
}

#[test]
fn a_chain_past_the_50_ms_wait_ran_but_the_runtime_cannot_tell() {
    // SAFETY: nextest runs each test in its own process; nothing else reads the environment
    // concurrently in this one.
    unsafe { std::env::set_var("HSA_SIM_COMMAND_DELAY_MS", "80") };
    let sim = Sim::new(Profile::Rocm70);
    let q = sim.queue();
    let d = valid(&sim, Signal::default());
    let t = std::time::Instant::now();
    q.submit(&[sim.packet(&d)]);
    assert!(t.elapsed() >= std::time::Duration::from_millis(80));
    assert_eq!((q.errors(), q.read_index()), (vec![], 1), "silently");
    assert_eq!(bytes_i32(&read(d.args[1].0, 1024)), vec![6; 256], "it ran");
    assert!(
        last_error().unwrap().contains("WAIT_CMD gave up"),
        "{:?}",
        last_error()
    );
    // SAFETY: as when it was set: this test process runs one test (nextest), on this thread.
    unsafe { std::env::remove_var("HSA_SIM_COMMAND_DELAY_MS") };
}

#[test]
fn a_33rd_pdi_in_one_chain_drops_the_whole_batch() {
    // ROCR 7.0 builds the chain (and its PDI list) before it submits anything: `SetNext` on a
    // full list fails the doorbell with nothing run.
    let sim = Sim::new(Profile::Rocm70);
    let (a, b) = io_i32(&sim, &[1; 256]);
    let insts = add_one().insts(sim.generation());
    let insts_va = sim.put(HEAP, &insts);
    let packets: Vec<[u8; 64]> = (0..33)
        .map(|_| {
            let pdi = sim.put(HEAP, &add_one().to_pdi());
            let d = Dispatch::new(
                (pdi, insts_va, insts.len() as u64),
                &[(a, 1024), (b, 1024)],
                Signal::default(),
            );
            sim.packet(&d)
        })
        .collect();
    let q = sim.queue();
    let before = counters();
    q.submit(&packets);
    assert_eq!((q.errors(), q.read_index()), (vec![], 33), "silently");
    assert_eq!(read(b, 1024), vec![0; 1024], "nothing ran");
    assert_eq!(counters().since(&before).packets_completed, 0);
    assert_eq!(last_error_status(), Some(Status::ERROR_OUT_OF_RESOURCES));
}
