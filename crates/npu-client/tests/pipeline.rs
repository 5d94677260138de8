//! Pipelined submission against the real daemon: completions in order with their ids, a
//! failing dispatch reported in its completion while the stream goes on, and staged tensors
//! refused before anything is sent.

mod common;

use common::Daemon;
use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ClientError, Program};

const N: u32 = 1024;
const LEN: usize = N as usize;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_of_100_add_one_dispatches_completes_in_order() {
    let d = Daemon::start();
    let client = Client::connect(Some(&d.unix())).await.unwrap();
    let add = Program::emulated(
        &EmuDesign::vector_scalar_add(N, DType::I32, 1),
        client.generation(),
    )
    .unwrap();
    let input: Vec<i32> = (0..1024_i32).map(|i| i * 3 - 500).collect();
    let a = client.tensor_from(&input).await.unwrap();
    let b = client.alloc::<i32>(LEN).await.unwrap();
    let mut p = client.pipeline(8).await.unwrap();
    assert_eq!(p.depth(), 8);
    let mut ids = Vec::new();
    for k in 0..100 {
        // Even links read a and write b, odd ones the other way round: each depends on the one
        // before, so only in-order execution gives input + 100.
        let args: [&dyn npu_client::TensorArg; 2] = if k % 2 == 0 { [&a, &b] } else { [&b, &a] };
        ids.push(p.submit(&add, &args).await.unwrap());
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
    let want: Vec<i32> = input.iter().map(|v| v + 100).collect();
    assert_eq!(a.as_slice(), want.as_slice());
    let st = client.statistics().await.unwrap();
    let mine = st
        .sessions
        .iter()
        .find(|s| s.session_id == client.session_id())
        .unwrap();
    assert_eq!(
        mine.dispatches.as_ref().unwrap().success.unwrap().count,
        100
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_dispatch_is_its_completion_and_the_stream_goes_on() {
    let d = Daemon::start();
    let client = Client::connect(Some(&d.unix())).await.unwrap();
    let g = client.generation();
    let add = Program::emulated(&EmuDesign::vector_scalar_add(N, DType::I32, 1), g).unwrap();
    let fault = Program::emulated(&EmuDesign::fault(N * 4), g).unwrap();
    let a = client.tensor_from(&vec![7_i32; LEN]).await.unwrap();
    let b = client.alloc::<i32>(LEN).await.unwrap();
    let mut p = client.pipeline(4).await.unwrap();
    p.submit(&add, &[&a, &b]).await.unwrap();
    let bad = p.submit(&fault, &[&a, &b]).await.unwrap();
    // The device recovers; the good program still runs, now over b.
    p.submit(&add, &[&b, &a]).await.unwrap();
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
    assert!(
        a.as_slice().iter().all(|v| *v == 9),
        "{:?}",
        &a.as_slice()[..4]
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
    let b = client.alloc::<i32>(LEN).await.unwrap();
    let mut p = client.pipeline(4).await.unwrap();
    let e = p.submit(&add, &[&a, &b]).await.unwrap_err();
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
    client.dispatch(&add, &[&a, &b]).await.unwrap();
    assert_eq!(b.as_slice()[0], 2);
}

#[test]
fn the_blocking_facade_pipelines_too() {
    let d = Daemon::start();
    let client = npu_client::blocking::Client::connect(Some(&d.unix())).unwrap();
    let add = Program::emulated(
        &EmuDesign::vector_scalar_add(N, DType::I32, 5),
        client.generation(),
    )
    .unwrap();
    let a = client.tensor_from(&vec![0_i32; LEN]).unwrap();
    let b = client.alloc::<i32>(LEN).unwrap();
    let mut p = client.pipeline(4).unwrap();
    for k in 0..10 {
        let args: [&dyn npu_client::TensorArg; 2] = if k % 2 == 0 { [&a, &b] } else { [&b, &a] };
        p.submit(&add, &args).unwrap();
        assert!(p.in_flight() <= 4);
    }
    let first = p.next_completion().unwrap().unwrap();
    assert_eq!(first.request_id, 0);
    let rest = p.finish().unwrap();
    assert_eq!(rest.len(), 9);
    assert!(rest.iter().all(|c| c.result.is_ok()));
    assert!(a.as_slice().iter().all(|v| *v == 50));
}
