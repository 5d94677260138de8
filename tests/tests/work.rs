//! Chains (64 links; a fault part way), quarantine, the Submit stream, deadlines.

#![forbid(unsafe_code)]

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, I32Copies, Options, Session, bytes_i32, dispatch_request, i32_bytes};
use tokio_stream::StreamExt;

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;

async fn setup(d: &Daemon) -> (Session, u64, npud_e2e::Mapped, npud_e2e::Mapped) {
    let mut s = Session::open(d.connect().await, "work").await.unwrap();
    let reg = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap();
    let a = s.alloc_mapped(BYTES).await.unwrap();
    let b = s.alloc_mapped(BYTES).await.unwrap();
    (s, reg.program_id, a, b)
}

/// Link k reads a and writes b when k is even, the other way round when odd.
fn alternating(program: u64, a: u64, b: u64, k: usize) -> pb::DispatchRequest {
    if k.is_multiple_of(2) {
        dispatch_request(program, &[a, b])
    } else {
        dispatch_request(program, &[b, a])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_64_links_adds_64() {
    let d = Daemon::start(Options::default());
    let (mut s, p, mut a, b) = setup(&d).await;
    let input: Vec<i32> = (0..N as i32).map(|i| i * 5 - 300).collect();
    a.map.set_i32s(&input).unwrap();
    let links = (0..64).map(|k| alternating(p, a.id, b.id, k)).collect();
    let r = s.chain(links).await.unwrap();
    assert_eq!(r.completed, 64);
    assert!(r.failure.is_none(), "{r:?}");
    assert_eq!(r.doorbells, 2, "64 packets ring at most every 32");
    // Link 63 is odd: it wrote a.
    let want: Vec<i32> = input.iter().map(|v| v + 64).collect();
    assert_eq!(a.map.i32s().unwrap(), &want[..]);
    let want_b: Vec<i32> = input.iter().map(|v| v + 63).collect();
    assert_eq!(b.map.i32s().unwrap(), &want_b[..]);
    let st = s.statistics().await.unwrap();
    let mine = st.sessions.iter().find(|x| x.session_id == s.id).unwrap();
    assert_eq!(mine.dispatches.as_ref().unwrap().success.unwrap().count, 64);
    // By default the emulator runs at its own speed: no device time is modelled.
    assert!(!s.device_info().await.unwrap().device_time_modelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_whose_10th_link_faults_reports_index_10_and_the_rest_did_not_run() {
    let d = Daemon::start(Options::default());
    let (mut s, p, mut a, b) = setup(&d).await;
    let fault = s.register(&EmuDesign::fault(N * 4)).await.unwrap();
    a.map.fill_i32(7).unwrap();
    let links: Vec<pb::DispatchRequest> = (0..16)
        .map(|k| {
            if k == 10 {
                dispatch_request(fault.program_id, &[a.id, b.id])
            } else {
                alternating(p, a.id, b.id, k)
            }
        })
        .collect();
    let r = s.chain(links).await.unwrap();
    assert_eq!(r.completed, 10);
    assert_eq!(r.doorbells, 1, "the failing batch was rung once");
    let f = r.failure.expect("the chain reports its failing link");
    assert_eq!(f.index, 10);
    assert_eq!(f.code, tonic::Code::Internal as i32);
    assert!(f.message.contains("quarantined"), "{}", f.message);
    assert_eq!(f.not_run, (11..16).collect::<Vec<u32>>());
    // Links 0..10 ran (link 9 wrote a); links 11.. did not (they would have changed a again).
    assert!(a.map.i32s().unwrap().iter().all(|v| *v == 17));

    // The faulting program is quarantined; the others keep working.
    let e = s
        .dispatch(fault.program_id, &[a.id, b.id])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("is quarantined"), "{e:?}");
    s.dispatch(p, &[a.id, b.id]).await.unwrap();
    assert!(b.map.i32s().unwrap().iter().all(|v| *v == 18));

    let st = s.statistics().await.unwrap();
    assert_eq!(st.device_faults, 1);
    let fp = st
        .programs
        .iter()
        .find(|x| x.program_id == fault.program_id)
        .unwrap();
    assert!(fp.quarantined);
    let errors = &fp.dispatches.as_ref().unwrap().errors;
    assert_eq!(errors.get("INTERNAL"), Some(&1), "{errors:?}");
    assert_eq!(errors.get("FAILED_PRECONDITION"), Some(&1), "{errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_completes_in_submission_order_with_request_ids() {
    let d = Daemon::start(Options::default());
    let (mut s, p, mut a, b) = setup(&d).await;
    a.map.fill_i32(0).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(128);
    let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut inbound = s.client.submit(s.req(outbound)).await.unwrap().into_inner();
    let count = 100u64;
    for i in 0..count {
        let work = if i % 10 == 9 {
            pb::submit_request::Work::Chain(pb::ChainRequest {
                links: vec![
                    dispatch_request(p, &[a.id, b.id]),
                    dispatch_request(p, &[b.id, a.id]),
                ],
            })
        } else {
            pb::submit_request::Work::Dispatch(dispatch_request(p, &[a.id, b.id]))
        };
        tx.send(pb::SubmitRequest {
            request_id: 1000 + i,
            work: Some(work),
            timeout_ms: 0,
        })
        .await
        .unwrap();
    }
    // One refused item in the middle of the stream does not end it.
    tx.send(pb::SubmitRequest {
        request_id: 5,
        work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
            999,
            &[a.id],
        ))),
        timeout_ms: 0,
    })
    .await
    .unwrap();
    drop(tx);
    let mut ids = Vec::new();
    while let Some(r) = inbound.next().await {
        let r = r.unwrap();
        if r.request_id == 5 {
            assert_eq!(r.code, tonic::Code::NotFound as i32);
            assert!(r.message.starts_with("program_id: "), "{}", r.message);
        } else {
            assert_eq!(r.code, 0, "{r:?}");
            assert!(r.result.is_some());
        }
        ids.push(r.request_id);
    }
    let mut want: Vec<u64> = (1000..1000 + count).collect();
    want.push(5);
    assert_eq!(ids, want);
    // Single dispatches write b only; each of the 10 chains adds 2 to a.
    assert!(a.map.i32s().unwrap().iter().all(|v| *v == 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_whose_deadline_passed_in_the_queue_does_not_run() {
    let d = Daemon::start(Options {
        args: vec!["--emulator-timeout-ms".into(), "400".into()],
        ..Options::default()
    });
    let (mut s, p, a, b) = setup(&d).await;
    let hang = s.register(&EmuDesign::hang(N * 4)).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut inbound = s
        .client
        .submit(s.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    let item = |id, program, timeout_ms| pb::SubmitRequest {
        request_id: id,
        work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
            program,
            &[a.id, b.id],
        ))),
        timeout_ms,
    };
    // Item 2 alone writes c: c staying zero shows that it did not run.
    let c = s.alloc_mapped(BYTES).await.unwrap();
    tx.send(item(1, hang.program_id, 0)).await.unwrap();
    tx.send(pb::SubmitRequest {
        request_id: 2,
        work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
            p,
            &[a.id, c.id],
        ))),
        timeout_ms: 50,
    })
    .await
    .unwrap();
    tx.send(item(3, p, 0)).await.unwrap();
    drop(tx);
    let r1 = inbound.next().await.unwrap().unwrap();
    assert_eq!(r1.code, tonic::Code::Internal as i32, "{r1:?}");
    let r2 = inbound.next().await.unwrap().unwrap();
    assert_eq!(r2.request_id, 2);
    assert_eq!(r2.code, tonic::Code::DeadlineExceeded as i32, "{r2:?}");
    assert!(r2.message.contains("did not run"), "{}", r2.message);
    let r3 = inbound.next().await.unwrap().unwrap();
    assert_eq!(r3.code, 0, "{r3:?}");
    assert!(c.map.i32s().unwrap().iter().all(|v| *v == 0));
    let st = s.statistics().await.unwrap();
    let mine = st.sessions.iter().find(|x| x.session_id == s.id).unwrap();
    let errors = &mine.dispatches.as_ref().unwrap().errors;
    assert_eq!(errors.get("DEADLINE_EXCEEDED"), Some(&1), "{errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_and_read_through_the_api_round_trip_in_chunks() {
    let d = Daemon::start(Options::default().env("NPUD_LIMITS__MAX_MESSAGE_BYTES", "65536"));
    let mut s = Session::open(d.connect().await, "bytes").await.unwrap();
    let size: u64 = 256 * 1024;
    let elements: i32 = 64 * 1024;
    let t = s
        .client
        .allocate_tensor(s.req(pb::AllocateTensorRequest {
            size_bytes: size,
            name: "big".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    let values: Vec<i32> = (0..elements).map(|i| i ^ 0x5a5a).collect();
    let bytes = i32_bytes(&values);
    let chunks: Vec<pb::WriteTensorChunk> = bytes
        .chunks(32 * 1024)
        .enumerate()
        .map(|(i, c)| pb::WriteTensorChunk {
            tensor_id: if i == 0 { t.tensor_id } else { 0 },
            offset: (i * 32 * 1024) as u64,
            data: c.to_vec(),
        })
        .collect();
    let w = s
        .client
        .write_tensor(s.req(tokio_stream::iter(chunks)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.bytes_written, size);
    let mut stream = s
        .client
        .read_tensor(s.req(pb::ReadTensorRequest {
            tensor_id: t.tensor_id,
            offset: 0,
            length: 0,
            chunk_bytes: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut back = Vec::new();
    let mut n = 0;
    while let Some(c) = stream.next().await {
        let c = c.unwrap();
        assert_eq!(c.offset, back.len() as u64);
        back.extend_from_slice(&c.data);
        n += 1;
    }
    assert!(
        n >= 4,
        "a 256 KiB tensor under a 64 KiB message limit comes in chunks ({n})"
    );
    assert_eq!(bytes_i32(&back), values);

    // A chunk larger than the message limit is refused as a size limit.
    let e = s
        .client
        .write_tensor(s.req(tokio_stream::iter(vec![pb::WriteTensorChunk {
            tensor_id: t.tensor_id,
            offset: 0,
            data: vec![0; 100 * 1024],
        }])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("limits.max_message_bytes"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_are_evicted_least_recently_used_and_reloaded_on_demand() {
    let d = Daemon::start(Options::default().env("NPUD_LIMITS__MAX_CACHED_PROGRAMS", "2"));
    let (mut s, p1, mut a, b) = setup(&d).await;
    let p2 = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 2))
        .await
        .unwrap()
        .program_id;
    let p3 = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 3))
        .await
        .unwrap()
        .program_id;
    a.map.fill_i32(10).unwrap();
    for (p, want) in [(p1, 11), (p2, 12), (p3, 13), (p1, 11)] {
        s.dispatch(p, &[a.id, b.id]).await.unwrap();
        assert!(b.map.i32s().unwrap().iter().all(|v| *v == want));
    }
    let st = s.statistics().await.unwrap();
    let by_id = |id| st.programs.iter().find(|x| x.program_id == id).unwrap();
    // p1 was evicted by p3 (least recently used), then reloaded; p2 went out for it.
    assert_eq!((by_id(p1).loads, by_id(p1).loaded), (2, true));
    assert_eq!((by_id(p2).loads, by_id(p2).loaded), (1, false));
    assert_eq!((by_id(p3).loads, by_id(p3).loaded), (1, true));
    let info = s
        .client
        .get_device_info(pb::GetDeviceInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.programs_loaded, 2);
    assert!(info.heap_used_bytes > 0);

    // Unregistering the last reference unloads and drops it.
    s.client
        .unregister_program(s.req(pb::UnregisterProgramRequest { program_id: p3 }))
        .await
        .unwrap();
    let e = s.dispatch(p3, &[a.id, b.id]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let st = s.statistics().await.unwrap();
    assert!(st.programs.iter().all(|x| x.program_id != p3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_session_queue_is_resource_exhausted() {
    let d = Daemon::start(Options {
        args: vec!["--emulator-timeout-ms".into(), "1000".into()],
        ..Options::default().env("NPUD_LIMITS__MAX_PENDING_PER_SESSION", "2")
    });
    let (mut s, p, a, b) = setup(&d).await;
    let hang = s.register(&EmuDesign::hang(N * 4)).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut inbound = s
        .client
        .submit(s.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    let item = |id, program| pb::SubmitRequest {
        request_id: id,
        work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
            program,
            &[a.id, b.id],
        ))),
        timeout_ms: 0,
    };
    tx.send(item(0, hang.program_id)).await.unwrap();
    for i in 1..=3 {
        tx.send(item(i, p)).await.unwrap();
    }
    drop(tx);
    // The stream is flow-controlled (lost_work.rs); unary calls beside it find the queue full.
    let mut keeper = Session::open(d.connect().await, "keeper").await.unwrap();
    while keeper.statistics().await.unwrap().pending_dispatches < 2 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (mut s1, mut s2, mut s3) = (s.clone(), s.clone(), s.clone());
    let args = [a.id, b.id];
    let (r1, r2, r3) = tokio::join!(
        s1.dispatch(p, &args),
        s2.dispatch(p, &args),
        s3.dispatch(p, &args)
    );
    let exhausted: Vec<_> = [r1, r2, r3]
        .into_iter()
        .filter_map(Result::err)
        .inspect(|e| {
            assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
            assert!(
                e.message().contains("limits.max_pending_per_session"),
                "{e:?}"
            );
        })
        .collect();
    assert!(!exhausted.is_empty(), "a third queued item is refused");
    while let Some(r) = inbound.next().await {
        assert_ne!(r.unwrap().code, tonic::Code::ResourceExhausted as i32);
    }
    // Another session is not affected by this one's full queue.
    let mut other = Session::open(d.connect().await, "other").await.unwrap();
    let q = other
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let x = other.alloc_mapped(BYTES).await.unwrap();
    let y = other.alloc_mapped(BYTES).await.unwrap();
    other.dispatch(q, &[x.id, y.id]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_served_round_robin() {
    let d = Daemon::start(Options {
        args: vec!["--emulator-timeout-ms".into(), "300".into()],
        ..Options::default()
    });
    // Session a queues three long items (each a different hanging design, failed by the
    // emulator's watchdog); session b's dispatch arrives while a's first one runs.
    let mut a = Session::open(d.connect().await, "a").await.unwrap();
    let size: u32 = 3 * 4096;
    let mut hangs = Vec::new();
    for k in 1..=3 {
        hangs.push(
            a.register(&EmuDesign::hang(k * 4096))
                .await
                .unwrap()
                .program_id,
        );
    }
    let x = a.alloc_mapped(u64::from(size)).await.unwrap();
    let y = a.alloc_mapped(u64::from(size)).await.unwrap();
    let (mut b, p, bx, by) = setup(&d).await;

    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut inbound = a
        .client
        .submit(a.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    for (i, h) in hangs.iter().enumerate() {
        tx.send(pb::SubmitRequest {
            request_id: i as u64 + 1,
            work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
                *h,
                &[x.id, y.id],
            ))),
            timeout_ms: 0,
        })
        .await
        .unwrap();
    }
    drop(tx);
    let a_events = events_tx.clone();
    let reader = tokio::spawn(async move {
        while let Some(r) = inbound.next().await {
            let r = r.unwrap();
            assert_eq!(r.code, tonic::Code::Internal as i32, "{r:?}");
            a_events.send(format!("a{}", r.request_id)).unwrap();
        }
    });
    // b's dispatch goes in once a's first item has started: its program is loaded at the
    // start of its turn (a fixed wait let b in first on a loaded machine).
    let first = hangs[0];
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let st = a.statistics().await.unwrap();
        if st
            .programs
            .iter()
            .any(|q| q.program_id == first && q.loaded)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "a's first item never started"
        );
        tokio::task::yield_now().await;
    }
    b.dispatch(p, &[bx.id, by.id]).await.unwrap();
    events_tx.send("b".into()).unwrap();
    reader.await.unwrap();
    drop(events_tx);
    let mut order = Vec::new();
    while let Some(e) = events.recv().await {
        order.push(e);
    }
    // Served first-come-first-served, b would wait for all of a's items. Round-robin runs it
    // after at most one more of a's (a2 may have re-entered the rotation before b arrived).
    assert_eq!(order.len(), 4, "{order:?}");
    assert_eq!(order[0], "a1", "{order:?}");
    assert_eq!(order[3], "a3", "b is not served last: {order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_timeout_that_expires_in_the_queue_keeps_the_dispatch_from_running() {
    // The hang holds the device for 3 s: room for the next dispatch to be sent and expire
    // behind it however slowly a loaded machine runs this test.
    let d = Daemon::start(Options {
        args: vec!["--emulator-timeout-ms".into(), "3000".into()],
        ..Options::default()
    });
    let (mut s, p, mut a, b) = setup(&d).await;
    let hang = s
        .register(&EmuDesign::hang(N * 4))
        .await
        .unwrap()
        .program_id;
    a.map.fill_i32(5).unwrap();
    let mut s2 = s.clone();
    let (ia, ib) = (a.id, b.id);
    let blocker = tokio::spawn(async move { s2.dispatch(hang, &[ia, ib]).await });
    // Once the hang is admitted, this session's next dispatch queues behind it (a session's
    // work runs in order). A fixed 100 ms wait here failed on a machine with load 8.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while s.statistics().await.unwrap().pending_dispatches == 0 {
        assert!(
            std::time::Instant::now() < until,
            "the hanging dispatch was never admitted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut req = s.req(dispatch_request(p, &[a.id, b.id]));
    req.set_timeout(std::time::Duration::from_millis(50));
    let e = s.client.dispatch(req).await.unwrap_err();
    assert!(
        matches!(
            e.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{e:?}"
    );
    assert_eq!(
        blocker.await.unwrap().unwrap_err().code(),
        tonic::Code::Internal
    );
    // The hang left b as it was; the timed-out dispatch (5 + 1 into b) never ran.
    assert!(b.map.i32s().unwrap().iter().all(|v| *v != 6));
    let st = s.statistics().await.unwrap();
    let mine = st.sessions.iter().find(|x| x.session_id == s.id).unwrap();
    let errors = &mine.dispatches.as_ref().unwrap().errors;
    assert_eq!(errors.get("DEADLINE_EXCEEDED"), Some(&1), "{errors:?}");
}

/// Adds `n` to `a`'s contents with `n` add-one dispatches, back and forth between `a` and `b`
/// (`n` even, so the last one writes `a`).
async fn add_back_and_forth(s: &mut Session, program: u64, a: u64, b: u64, n: usize) {
    for k in 0..n {
        let (from, to) = if k.is_multiple_of(2) { (a, b) } else { (b, a) };
        s.dispatch(program, &[from, to]).await.unwrap();
    }
}

/// The executor's two ways of waiting (polling between back-to-back dispatches, or sleeping)
/// serve the same work: one client's dispatches back to back, then two clients' interleaved
/// (which stops the polling), and the daemon reports how it was configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatches_are_served_whether_the_executor_polls_or_sleeps() {
    for (io, spin) in [(2, 0), (1, 5000)] {
        let d = Daemon::start(Options {
            args: vec![
                "--io-threads".into(),
                io.to_string(),
                "--executor-spin-us".into(),
                spin.to_string(),
            ],
            ..Options::default()
        });
        let info = d
            .connect()
            .await
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!((info.io_threads, info.executor_spin_us), (io, spin));
        let (mut s, p, mut a, b) = setup(&d).await;
        let (mut t, q, mut c, e) = setup(&d).await;
        a.map.fill_i32(0).unwrap();
        c.map.fill_i32(100).unwrap();
        // One client alone, then two at once.
        add_back_and_forth(&mut s, p, a.id, b.id, 20).await;
        assert!(a.map.i32s().unwrap().iter().all(|v| *v == 20));
        tokio::join!(
            add_back_and_forth(&mut s, p, a.id, b.id, 20),
            add_back_and_forth(&mut t, q, c.id, e.id, 20),
        );
        assert!(a.map.i32s().unwrap().iter().all(|v| *v == 40));
        assert!(c.map.i32s().unwrap().iter().all(|v| *v == 120));
    }
}

/// Work queued behind a long item is checked again when its turn comes: a program unregistered
/// while the work waited is refused then, and the item does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_whose_program_was_unregistered_while_queued_is_refused() {
    let d = Daemon::start(Options {
        args: vec!["--emulator-timeout-ms".into(), "1000".into()],
        ..Options::default()
    });
    let (mut s, _, a, _) = setup(&d).await;
    let hang = s.register(&EmuDesign::hang(N * 4)).await.unwrap();
    let doomed = s
        .register(&EmuDesign::vector_scalar_add(N, DType::I32, 5))
        .await
        .unwrap()
        .program_id;
    let c = s.alloc_mapped(BYTES).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut inbound = s
        .client
        .submit(s.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    for (id, program) in [(1, hang.program_id), (2, doomed)] {
        tx.send(pb::SubmitRequest {
            request_id: id,
            work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
                program,
                &[a.id, c.id],
            ))),
            timeout_ms: 0,
        })
        .await
        .unwrap();
    }
    drop(tx);
    // Admission takes microseconds; the hang holds the executor for a second. (Statistics
    // cannot tell when item 2 is queued: they too wait for the executor.)
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    s.client
        .unregister_program(s.req(pb::UnregisterProgramRequest { program_id: doomed }))
        .await
        .unwrap();
    let r1 = inbound.next().await.unwrap().unwrap();
    assert_eq!(r1.code, tonic::Code::Internal as i32, "{r1:?}");
    let r2 = inbound.next().await.unwrap().unwrap();
    assert_eq!(r2.request_id, 2);
    assert_eq!(r2.code, tonic::Code::NotFound as i32, "{r2:?}");
    assert_eq!(
        r2.message,
        format!("program_id: program {doomed} was unregistered")
    );
    assert!(c.map.i32s().unwrap().iter().all(|v| *v == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_timing_model_a_dispatch_takes_at_least_the_modelled_device_time() {
    let d = Daemon::start(Options::default().env("NPUD_EMULATOR__TIMING", "model"));
    let (mut s, p, mut a, b) = setup(&d).await;
    assert!(
        s.device_info().await.unwrap().device_time_modelled,
        "DeviceInfo says the device time is modelled"
    );
    // `npuctl status` says so too.
    let out = std::process::Command::new(npud_e2e::npuctl_binary())
        .args(["--addr", &format!("unix:{}", d.socket.display()), "status"])
        .env_remove("NPUD_ADDR")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("modelled (emulator.timing = model)"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    a.map.fill_i32(1).unwrap();
    let m = hsa_sim::timing::Model::of(npu_artifacts::NpuGen::Npu2);
    // One command chain of one command, its kernel moving the two 4 KiB tensors.
    let least = m.submit + m.per_command + m.kernel(2 * BYTES, 0);
    for _ in 0..3 {
        let r = s.dispatch(p, &[a.id, b.id]).await.unwrap();
        assert!(
            u128::from(r.device_ns) >= least.as_nanos(),
            "device {} ns, the model's least {least:?}",
            r.device_ns
        );
    }
    assert_eq!(b.map.i32s().unwrap(), &vec![2; N as usize][..]);
}
