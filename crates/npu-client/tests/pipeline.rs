//! Pipelined submission against the real daemon, on a session's dispatch ring and on a
//! `Submit` stream (each test runs both routes): completions in order with their ids, a
//! failing dispatch reported in its completion while the stream goes on, staged tensors
//! refused before anything is sent, written tensors lent until their completion, and a
//! dispatch too wide for a ring slot sent on the stream in its place.

mod common;

use common::Daemon;
use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ClientError, ConnectOptions, Program};

const N: u32 = 1024;
const LEN: usize = N as usize;

/// The routes a local pipeline takes: the session's ring, or (fast path off) the stream.
const ROUTES: [bool; 2] = [true, false];

async fn connect(d: &Daemon, ring: bool) -> Client {
    let c = Client::connect_with(
        Some(&d.unix()),
        ConnectOptions {
            fast_path: ring,
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(c.fast_path_active(), ring);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_of_100_add_one_dispatches_completes_in_order() {
    let d = Daemon::start();
    for ring in ROUTES {
        a_pipeline_of_100(&d, ring).await;
    }
}

async fn a_pipeline_of_100(d: &Daemon, ring: bool) {
    let client = connect(d, ring).await;
    let add = Program::emulated(
        &EmuDesign::vector_scalar_add(N, DType::I32, 1),
        client.generation(),
    )
    .unwrap();
    let input: Vec<i32> = (0..1024_i32).map(|i| i * 3 - 500).collect();
    let a = client.tensor_from(&input).await.unwrap();
    let mut outs = Vec::new();
    for _ in 0..100 {
        outs.push(client.alloc::<i32>(LEN).await.unwrap());
    }
    let mut p = client.pipeline(8).await.unwrap();
    assert_eq!(p.depth(), 8);
    assert_eq!(p.on_ring(), ring);
    let mut ids = Vec::new();
    // Every dispatch reads a and writes its own output: the pipeline holds each output
    // borrowed until it is finished, so no two dispatches in it write one tensor.
    for (k, out) in outs.iter_mut().enumerate() {
        ids.push(p.submit(&add, &[&a], vec![out]).await.unwrap());
        assert!(
            p.in_flight() <= 8,
            "at most depth in flight, {}",
            p.in_flight()
        );
        assert_eq!(
            p.pending(),
            k + 1,
            "every completion is kept until next or finish"
        );
    }
    assert_eq!(ids, (0..100).collect::<Vec<u64>>());
    let done = p.finish().await.unwrap();
    let got: Vec<u64> = done.iter().map(|c| c.request_id).collect();
    assert_eq!(got, ids, "completions in submission order");
    for c in &done {
        assert!(c.result.is_ok(), "{c:?}");
    }
    let want: Vec<i32> = input.iter().map(|v| v + 1).collect();
    for (k, out) in outs.iter().enumerate() {
        assert!(!out.is_lent(), "output {k} is taken back at its completion");
        assert_eq!(out.as_slice(), want.as_slice(), "output {k}");
    }
    assert_eq!(successes(&client).await, 100);
}

/// The dispatches the daemon counts as succeeded in `client`'s session.
async fn successes(client: &Client) -> u64 {
    let st = client.statistics().await.unwrap();
    let mine = st
        .sessions
        .iter()
        .find(|s| s.session_id == client.session_id())
        .unwrap();
    mine.dispatches
        .as_ref()
        .and_then(|d| d.success)
        .unwrap_or_default()
        .count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_dispatch_is_its_completion_and_the_stream_goes_on() {
    // A daemon each: the fault quarantines its program.
    for ring in ROUTES {
        a_failing_dispatch(&Daemon::start(), ring).await;
    }
}

async fn a_failing_dispatch(d: &Daemon, ring: bool) {
    let client = connect(d, ring).await;
    let g = client.generation();
    let add = Program::emulated(&EmuDesign::vector_scalar_add(N, DType::I32, 1), g).unwrap();
    let fault = Program::emulated(&EmuDesign::fault(N * 4), g).unwrap();
    let a = client.tensor_from(&vec![7_i32; LEN]).await.unwrap();
    let mut b = client.alloc::<i32>(LEN).await.unwrap();
    let mut c = client.alloc::<i32>(LEN).await.unwrap();
    let mut e = client.alloc::<i32>(LEN).await.unwrap();
    let mut p = client.pipeline(4).await.unwrap();
    assert_eq!(p.on_ring(), ring);
    p.submit(&add, &[&a], vec![&mut b]).await.unwrap();
    let bad = p.submit(&fault, &[&a], vec![&mut c]).await.unwrap();
    // The device recovers; the good program still runs.
    p.submit(&add, &[&a], vec![&mut e]).await.unwrap();
    let first = p.next_completion().await.unwrap().unwrap();
    assert_eq!(first.request_id, 0);
    assert!(first.result.is_ok(), "{first:?}");
    let second = p.next_completion().await.unwrap().unwrap();
    assert_eq!(second.request_id, bad);
    match &second.result {
        Err(ClientError::Daemon { call, code, .. }) => {
            assert_eq!(*call, "Submit");
            assert_eq!(*code, tonic::Code::Internal);
        }
        other => panic!("the faulting dispatch: {other:?}"),
    }
    let third = p.next_completion().await.unwrap().unwrap();
    assert_eq!(third.request_id, 2);
    assert!(third.result.is_ok(), "{third:?}");
    assert!(
        p.next_completion().await.unwrap().is_none(),
        "nothing more in flight"
    );
    drop(p);
    assert!(
        b.as_slice().iter().all(|v| *v == 8),
        "{:?}",
        &b.as_slice()[..4]
    );
    assert!(
        !c.is_lent(),
        "a failed dispatch's completion ends the loan too"
    );
    assert!(
        e.as_slice().iter().all(|v| *v == 8),
        "{:?}",
        &e.as_slice()[..4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_tensors_are_refused_before_anything_is_sent() {
    let d = Daemon::start();
    let client = Client::connect(Some(&d.http())).await.unwrap();
    assert!(!client.is_local());
    let add = Program::emulated(
        &EmuDesign::vector_scalar_add(N, DType::I32, 1),
        client.generation(),
    )
    .unwrap();
    let a = client.tensor_from(&vec![1_i32; LEN]).await.unwrap();
    let mut b = client.alloc::<i32>(LEN).await.unwrap();
    let mut p = client.pipeline(4).await.unwrap();
    let e = p.submit(&add, &[&a], vec![&mut b]).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "args[0]: tensor {} is staged through the API (a remote connection); pipelined \
             submission needs tensors shared in place: use dispatch or a chain",
            a.id()
        )
    );
    assert_eq!(p.pending(), 0);
    assert!(p.finish().await.unwrap().is_empty());
    let st = client.statistics().await.unwrap();
    let mine = st
        .sessions
        .iter()
        .find(|s| s.session_id == client.session_id())
        .unwrap();
    let counts = mine.dispatches.clone().unwrap_or_default();
    assert_eq!(
        (
            counts.success.unwrap_or_default().count,
            counts.fail.unwrap_or_default().count
        ),
        (0, 0),
        "the refused submit reached the daemon"
    );
    // The session is unharmed.
    client.dispatch(&add, &[&a], &mut [&mut b]).await.unwrap();
    assert_eq!(b.as_slice()[0], 2);
}

#[test]
fn the_blocking_facade_pipelines_too() {
    let d = Daemon::start();
    let client = npu_client::blocking::Client::connect(Some(&d.unix())).unwrap();
    assert!(client.fast_path_active());
    let add = Program::emulated(
        &EmuDesign::vector_scalar_add(N, DType::I32, 5),
        client.generation(),
    )
    .unwrap();
    let a = client.tensor_from(&vec![0_i32; LEN]).unwrap();
    let mut outs: Vec<_> = (0..10).map(|_| client.alloc::<i32>(LEN).unwrap()).collect();
    let mut p = client.pipeline(4).unwrap();
    assert!(p.on_ring());
    for out in &mut outs {
        p.submit(&add, &[&a], vec![out]).unwrap();
        assert!(p.in_flight() <= 4);
    }
    let first = p.next_completion().unwrap().unwrap();
    assert_eq!(first.request_id, 0);
    let rest = p.finish().unwrap();
    assert_eq!(rest.len(), 9);
    assert!(rest.iter().all(|c| c.result.is_ok()));
    assert!(outs.iter().all(|o| o.as_slice().iter().all(|v| *v == 5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_dropped_in_flight_leaves_its_outputs_lent() {
    let d = Daemon::start();
    for ring in ROUTES {
        dropped_in_flight(&d, ring).await;
    }
}

async fn dropped_in_flight(d: &Daemon, ring: bool) {
    let client = connect(d, ring).await;
    let g = client.generation();
    let add = Program::emulated(&EmuDesign::vector_scalar_add(N, DType::I32, 1), g).unwrap();
    let a = client.tensor_from(&vec![1_i32; LEN]).await.unwrap();
    let mut done = client.alloc::<i32>(LEN).await.unwrap();
    let mut open = client.alloc::<i32>(LEN).await.unwrap();
    let mut p = client.pipeline(4).await.unwrap();
    assert_eq!(p.on_ring(), ring);
    p.submit(&add, &[&a], vec![&mut done]).await.unwrap();
    let first = p.next_completion().await.unwrap().unwrap();
    assert!(first.result.is_ok(), "{first:?}");
    p.submit(&add, &[&a], vec![&mut open]).await.unwrap();
    // Dropped before the second completion: the daemon may still be writing `open`.
    drop(p);
    assert!(!done.is_lent());
    assert!(done.as_slice().iter().all(|v| *v == 2));
    assert!(open.is_lent(), "no completion, so the loan never ends");
    let e = open.copy_from_slice(&vec![0; LEN]).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("the memory is lent to the daemon for a call that may still write it"),
        "{e}"
    );
    // The fallible views say so instead of panicking.
    let e = open.try_as_slice().unwrap_err();
    assert!(
        matches!(
            &e,
            npu_client::ClientError::Fd {
                source: npu_fd::FdError::Lent,
                ..
            }
        ) && e
            .to_string()
            .contains(&format!("reading tensor {}", open.id())),
        "{e}"
    );
    assert!(matches!(
        open.try_as_mut_slice(),
        Err(npu_client::ClientError::Fd {
            source: npu_fd::FdError::Lent,
            ..
        })
    ));
    assert_eq!(done.try_as_slice().unwrap(), done.as_slice());
    let view = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open.as_slice()[0]));
    let why = view.expect_err("a view of lent memory panics");
    let why = why.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        why.contains(&format!(
            "tensor {} is lent to a call the daemon never answered",
            open.id()
        )),
        "{why}"
    );
    // Reading a never-written tensor in a new dispatch is fine; the lent one is only freed.
    let mut fresh = client.alloc::<i32>(LEN).await.unwrap();
    client
        .dispatch(&add, &[&done], &mut [&mut fresh])
        .await
        .unwrap();
    assert!(fresh.as_slice().iter().all(|v| *v == 3));
    open.free().await.unwrap();
}

/// A dispatch with more arguments than a ring slot holds goes on the stream, after what the
/// ring has in flight: completions stay in submission order, and the ring takes the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_too_wide_for_a_ring_slot_goes_on_the_stream_in_order() {
    let d = Daemon::start();
    let client = connect(&d, true).await;
    let g = client.generation();
    let add = Program::emulated(&EmuDesign::vector_scalar_add(N, DType::I32, 1), g).unwrap();
    let wide = Program::emulated(&EmuDesign::noop(16, N * 4), g).unwrap();
    let a = client.tensor_from(&vec![41_i32; LEN]).await.unwrap();
    let mut outs = Vec::new();
    for _ in 0..6 {
        outs.push(client.alloc::<i32>(LEN).await.unwrap());
    }
    let sixteen: Vec<&dyn npu_client::TensorArg> = (0..16).map(|_| &a as _).collect();
    let mut p = client.pipeline(8).await.unwrap();
    assert!(p.on_ring());
    let mut outs_it = outs.iter_mut();
    for _ in 0..3 {
        p.submit(&add, &[&a], vec![outs_it.next().unwrap()])
            .await
            .unwrap();
    }
    let w = p.submit(&wide, &sixteen, vec![]).await.unwrap();
    assert_eq!(w, 3);
    assert_eq!(
        p.in_flight(),
        1,
        "the ring's three completed before the stream's one left"
    );
    for _ in 0..3 {
        p.submit(&add, &[&a], vec![outs_it.next().unwrap()])
            .await
            .unwrap();
    }
    assert!(
        p.on_ring(),
        "the ring takes the dispatches that fit it again"
    );
    let done = p.finish().await.unwrap();
    let ids: Vec<u64> = done.iter().map(|c| c.request_id).collect();
    assert_eq!(ids, (0..7).collect::<Vec<u64>>());
    for c in &done {
        assert!(c.result.is_ok(), "{c:?}");
    }
    assert!(outs.iter().all(|o| o.as_slice().iter().all(|v| *v == 42)));
    assert_eq!(successes(&client).await, 7);
}
