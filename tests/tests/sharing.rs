//! Two client processes share one daemon through fds; imported memfds; refused fds.

#![forbid(unsafe_code)]

use std::os::fd::AsFd;
use std::process::Command;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, I32Copies, Options, Session, binary};

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;
const LEN: usize = N as usize * 4;

fn vsa() -> EmuDesign {
    EmuDesign::vector_scalar_add(N, DType::I32, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_client_processes_share_one_stored_program_through_fds() {
    let d = Daemon::start(Options::default());
    let spawn = |seed: &str| {
        Command::new(binary("npud-test-client"))
            .arg("share")
            .arg(&d.socket)
            .arg(seed)
            .output()
            .expect("the test client runs")
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| spawn("11"));
        let b = s.spawn(|| spawn("-5"));
        (a.join().unwrap(), b.join().unwrap())
    });
    let parse = |o: &std::process::Output| -> serde_json::Value {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "client failed: {text}\n{}\ndaemon:\n{}",
            String::from_utf8_lossy(&o.stderr),
            d.stderr()
        );
        serde_json::from_str(text.trim()).expect("one JSON line")
    };
    let (a, b) = (parse(&a), parse(&b));
    assert_eq!(a["pass"], true);
    assert_eq!(b["pass"], true);
    assert_ne!(a["session"], b["session"]);
    assert_eq!(a["program"], b["program"], "one stored program");
    assert_eq!(a["content_hash"], b["content_hash"]);
    let newly: Vec<bool> = [&a, &b]
        .iter()
        .map(|v| v["newly_stored"].as_bool().unwrap())
        .collect();
    assert_eq!(newly.iter().filter(|x| **x).count(), 1, "{newly:?}");

    let mut s = Session::open(d.connect().await, "observer").await.unwrap();
    let st = s.statistics().await.unwrap();
    assert_eq!(st.programs.len(), 1, "{st:?}");
    let p = &st.programs[0];
    assert_eq!(p.references, 2);
    assert_eq!(p.loads, 1);
    assert_eq!(p.dispatches.as_ref().unwrap().success.unwrap().count, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_memfd_is_staged_around_the_dispatch() {
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "import").await.unwrap();
    let reg = s.register(&vsa()).await.unwrap();

    let in_fd = npu_fd::memfd::create("in", BYTES).unwrap();
    let out_fd = npu_fd::memfd::create("out", BYTES).unwrap();
    let mut in_map = npu_fd::Mapping::new(in_fd.as_fd(), 0, LEN).unwrap();
    let out_map = npu_fd::Mapping::new(out_fd.as_fd(), 0, LEN).unwrap();
    let values: Vec<i32> = (0..N as i32).map(|i| 1000 - 3 * i).collect();
    in_map.set_i32s(&values).unwrap();
    let (tin, sent) = s.import(in_fd.as_fd(), BYTES).await.unwrap();
    sent.unwrap();
    let (tout, sent) = s.import(out_fd.as_fd(), BYTES).await.unwrap();
    sent.unwrap();

    s.dispatch(reg.program_id, &[tin, tout]).await.unwrap();
    let out = out_map.i32s().unwrap();
    let want: Vec<i32> = values.iter().map(|v| v + 1).collect();
    assert_eq!(out, &want[..]);

    // The client writes its next input in place; the next dispatch sees it.
    in_map.fill_i32(41).unwrap();
    s.dispatch(reg.program_id, &[tin, tout]).await.unwrap();
    assert!(out_map.i32s().unwrap().iter().all(|v| *v == 42));

    let info = s
        .client
        .get_tensor_info(s.req(pb::GetTensorInfoRequest { tensor_id: tin }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.storage(), pb::TensorStorage::ClientMemfdStaged);
    assert!(!info.in_place);
    assert_eq!(info.size_bytes, BYTES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsealed_short_and_non_memfd_fds_are_refused() {
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "refused").await.unwrap();
    let reg = s.register(&vsa()).await.unwrap();
    let out = s.alloc_mapped(BYTES).await.unwrap();

    let unsealed = npu_fd::memfd::create_unsealed("unsealed", BYTES).unwrap();
    let (t_unsealed, sent) = s.import(unsealed.as_fd(), BYTES).await.unwrap();
    let e = sent.unwrap_err();
    assert!(
        e.contains("lacks the F_SEAL_SHRINK and F_SEAL_GROW seals"),
        "{e}"
    );

    let short = npu_fd::memfd::create("short", BYTES / 2).unwrap();
    let (_, sent) = s.import(short.as_fd(), BYTES).await.unwrap();
    let e = sent.unwrap_err();
    assert!(
        e.contains(&format!(
            "memfd is {} bytes but the tensor was declared as {BYTES} bytes",
            BYTES / 2
        )),
        "{e}"
    );

    let file = tempfile::tempfile().unwrap();
    file.set_len(BYTES).unwrap();
    let (_, sent) = s.import(file.as_fd(), BYTES).await.unwrap();
    let e = sent.unwrap_err();
    assert!(e.contains("fd is a regular file, not a memfd"), "{e}");

    // The refused import stays awaiting its memfd: a dispatch names it.
    let err = s
        .dispatch(reg.program_id, &[t_unsealed, out.id])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().starts_with(&format!(
            "args[0].tensor_id: tensor {t_unsealed} awaits its memfd"
        )),
        "{err:?}"
    );
    let info = s
        .client
        .get_tensor_info(s.req(pb::GetTensorInfoRequest {
            tensor_id: t_unsealed,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.storage(), pb::TensorStorage::AwaitingImport);

    // A sealed memfd of the declared size is accepted.
    let sealed = npu_fd::memfd::create("fixed", BYTES).unwrap();
    let (t_fixed, sent) = s.import(sealed.as_fd(), BYTES).await.unwrap();
    sent.unwrap();
    s.dispatch(reg.program_id, &[t_fixed, out.id])
        .await
        .unwrap();
    assert!(out.map.i32s().unwrap().iter().all(|v| *v == 1));
}

/// The daemon copies to and from client memory only through raw pointers, so a client that
/// writes its memory while the daemon copies it gets torn data at worst: every call still
/// answers, the daemon stays up, and once the client stops, results are right again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_writing_its_memory_during_dispatches_and_reads_cannot_hurt_the_daemon() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let mut d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "scribbler").await.unwrap();
    let reg = s.register(&vsa()).await.unwrap();

    // An imported memfd (the daemon maps it and stages it around each dispatch) and an
    // exported tensor (the emulator reads and writes the memory the client maps).
    let in_fd = npu_fd::memfd::create("scribbled-in", BYTES).unwrap();
    let (tin, sent) = s.import(in_fd.as_fd(), BYTES).await.unwrap();
    sent.unwrap();
    let out = s.alloc_mapped(BYTES).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let mut maps = vec![
        npu_fd::Mapping::new(in_fd.as_fd(), 0, LEN).unwrap(),
        npu_fd::Mapping::new(out.fd.as_fd(), 0, LEN).unwrap(),
    ];
    let scribbler = {
        let (stop, writes) = (stop.clone(), writes.clone());
        std::thread::spawn(move || {
            let mut v = 0_i32;
            while !stop.load(Ordering::Relaxed) {
                for m in &mut maps {
                    m.fill_i32(v).unwrap();
                }
                v = v.wrapping_add(1);
                writes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    for i in 0..200 {
        s.dispatch(reg.program_id, &[tin, out.id])
            .await
            .unwrap_or_else(|e| panic!("dispatch {i} while the client writes: {e}"));
        for id in [tin, out.id] {
            let mut chunks = s
                .client
                .read_tensor(s.req(pb::ReadTensorRequest {
                    tensor_id: id,
                    offset: 0,
                    length: 0,
                    chunk_bytes: 0,
                }))
                .await
                .unwrap()
                .into_inner();
            let mut got = 0;
            while let Some(c) = chunks.message().await.unwrap() {
                got += c.data.len();
            }
            assert_eq!(got, LEN, "read {i} of tensor {id}");
        }
        let chunk = pb::WriteTensorChunk {
            tensor_id: tin,
            offset: 0,
            data: vec![7; LEN],
        };
        s.client
            .write_tensor(s.req(tokio_stream::iter([chunk])))
            .await
            .unwrap_or_else(|e| panic!("write {i} while the client writes: {e}"));
    }
    stop.store(true, Ordering::Relaxed);
    scribbler.join().unwrap();
    assert!(
        writes.load(Ordering::Relaxed) > 0,
        "the client wrote while the daemon worked"
    );
    assert!(d.running(), "the daemon is up");

    // Quiet again: results are exact.
    let mut input = npu_fd::Mapping::new(in_fd.as_fd(), 0, LEN).unwrap();
    input.fill_i32(41).unwrap();
    s.dispatch(reg.program_id, &[tin, out.id]).await.unwrap();
    assert!(out.map.i32s().unwrap().iter().all(|v| *v == 42));
}

/// After a link faults, the daemon lends itself no slice of device memory (the failed queue may
/// still write it until it is replaced), yet the imported memfd still receives what the links
/// before the fault wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_memfd_gets_the_links_before_a_fault() {
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "fault-staged")
        .await
        .unwrap();
    let add = s.register(&vsa()).await.unwrap().program_id;
    let fault = s
        .register(&EmuDesign::fault(N * 4))
        .await
        .unwrap()
        .program_id;
    let in_fd = npu_fd::memfd::create("in", BYTES).unwrap();
    let out_fd = npu_fd::memfd::create("out", BYTES).unwrap();
    npu_fd::Mapping::new(in_fd.as_fd(), 0, LEN)
        .unwrap()
        .fill_i32(5)
        .unwrap();
    let (tin, sent) = s.import(in_fd.as_fd(), BYTES).await.unwrap();
    sent.unwrap();
    let (tout, sent) = s.import(out_fd.as_fd(), BYTES).await.unwrap();
    sent.unwrap();
    let r = s
        .chain(vec![
            npud_e2e::dispatch_request(add, &[tin, tout]),
            npud_e2e::dispatch_request(fault, &[tin, tout]),
        ])
        .await
        .unwrap();
    assert_eq!(r.completed, 1, "{r:?}");
    assert_eq!(r.failure.as_ref().map(|f| f.index), Some(1), "{r:?}");
    let out = npu_fd::Mapping::new(out_fd.as_fd(), 0, LEN).unwrap();
    assert!(
        out.i32s().unwrap().iter().all(|v| *v == 6),
        "link 0's output reached the client's memfd"
    );
}
