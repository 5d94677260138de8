//! Dispatch arguments that are byte ranges of tensors (`TensorArg.offset`/`length`, IRON's
//! sub-views): the program sees exactly those bytes, on every path a tensor takes (in place,
//! staged, remote, an imported memfd), in a dispatch, a chain and a Submit stream, with
//! `read_only`; and a range outside its tensor or too short for the program is refused.

#![forbid(unsafe_code)]

use std::os::fd::AsFd;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, DispatchArg, Program};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, I32Copies, Options, Runtime, Session};
use tokio_stream::StreamExt;

const N: usize = 256;
const NI: i32 = 256;
const B: u64 = (N * 4) as u64;
const SENTINEL: i32 = -7;

fn add_one() -> EmuDesign {
    EmuDesign::vector_scalar_add(256, DType::I32, 1)
}

async fn client(d: &Daemon, remote: bool) -> Client {
    let addr = match (remote, d.tcp) {
        (true, Some(a)) => format!("http://{a}"),
        _ => format!("unix:{}", d.socket.display()),
    };
    Client::connect(Some(&addr)).await.unwrap()
}

/// `out[N..2N] = a[N..2N] + 1` through views, and nothing else of `out` touched.
async fn one_view_dispatch(c: &Client) {
    let p = Program::emulated(&add_one(), c.generation()).unwrap();
    let input: Vec<i32> = (0..2 * NI).map(|i| 3 * i - 100).collect();
    let a = c.tensor_from(&input).await.unwrap();
    let mut out = c.tensor_from(&vec![SENTINEL; 3 * N]).await.unwrap();
    c.dispatch_args(
        &p,
        vec![
            DispatchArg::read(&a).view(B, B),
            DispatchArg::write(&mut out).view(B, B),
        ],
    )
    .await
    .unwrap();
    let got = out.to_vec();
    assert!(got[..N].iter().all(|v| *v == SENTINEL), "{:?}", &got[..4]);
    assert!(
        got[2 * N..].iter().all(|v| *v == SENTINEL),
        "{:?}",
        &got[2 * N..][..4]
    );
    let want: Vec<i32> = input[N..].iter().map(|v| v + 1).collect();
    assert_eq!(&got[N..2 * N], &want[..]);

    // A view outside its tensor is refused before anything is sent.
    let e = c
        .dispatch_args(
            &p,
            vec![
                DispatchArg::read(&a).view(B, B + 4),
                DispatchArg::write(&mut out),
            ],
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "args[0]: bytes {B}..{} are outside tensor",
            2 * B + 4
        )),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_dispatch_in_place() {
    let d = Daemon::start(Options::default());
    let c = client(&d, false).await;
    assert_eq!(c.device().tensor_sharing, "vmem-export");
    one_view_dispatch(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_dispatch_staged() {
    let d = Daemon::start(Options::default().profile("rocr-g2-2026-05", Runtime::Linked));
    let c = client(&d, false).await;
    assert_eq!(c.device().tensor_sharing, "staged");
    one_view_dispatch(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_dispatch_remote() {
    let d = Daemon::start(Options {
        tcp: true,
        ..Options::default()
    });
    let c = client(&d, true).await;
    assert!(!c.is_local());
    one_view_dispatch(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_passes_views_between_links() {
    let d = Daemon::start(Options::default());
    let c = client(&d, false).await;
    let p = Program::emulated(&add_one(), c.generation()).unwrap();
    let input: Vec<i32> = (0..NI).collect();
    let a = c.tensor_from(&input).await.unwrap();
    let mut mid = c.tensor_from(&vec![SENTINEL; 2 * N]).await.unwrap();
    let mut out = c.tensor_from(&vec![SENTINEL; N]).await.unwrap();
    let mut chain = c.chain();
    let (i, m, o) = (chain.read(&a), chain.write(&mut mid), chain.write(&mut out));
    chain
        .then(&p, &[i, m.view(B, B)])
        .then(&p, &[m.view(B, B), o]);
    chain.run().await.unwrap().ok().unwrap();
    let want: Vec<i32> = input.iter().map(|v| v + 2).collect();
    assert_eq!(out.to_vec(), want);
    let mid = mid.to_vec();
    assert!(mid[..N].iter().all(|v| *v == SENTINEL));
    assert_eq!(
        mid[N..].to_vec(),
        input.iter().map(|v| v + 1).collect::<Vec<_>>()
    );
}

fn view(tensor: u64, offset: u64, length: u64, read_only: bool) -> pb::TensorArg {
    pb::TensorArg {
        tensor_id: tensor,
        offset,
        length,
        read_only,
    }
}

/// The daemon's own checks and its other paths, with the API's messages: an imported memfd
/// (the fd path, staged), a read-only view of it, a Submit stream, and the refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_honours_views_on_the_fd_path_and_in_submit_and_refuses_bad_ones() {
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "views").await.unwrap();
    let reg = s.register(&add_one()).await.unwrap();
    let p = reg.program_id;

    // An imported memfd of 2N: the input is its second half.
    let in_fd = npu_fd::memfd::create("in", 2 * B).unwrap();
    let mut in_map = npu_fd::Mapping::new(in_fd.as_fd(), 0, 2 * N * 4).unwrap();
    let input: Vec<i32> = (0..2 * NI).map(|i| 1000 - i).collect();
    in_map.set_i32s(&input).unwrap();
    let (tin, sent) = s.import(in_fd.as_fd(), 2 * B).await.unwrap();
    sent.unwrap();
    let mut out = s.alloc_mapped(3 * B).await.unwrap();
    out.map.fill_i32(SENTINEL).unwrap();

    let req = pb::DispatchRequest {
        program_id: p,
        args: vec![view(tin, B, B, true), view(out.id, 2 * B, 0, false)],
    };
    s.client.dispatch(s.req(req)).await.unwrap();
    let got = out.map.i32s().unwrap();
    assert!(got[..2 * N].iter().all(|v| *v == SENTINEL));
    let want: Vec<i32> = input[N..].iter().map(|v| v + 1).collect();
    assert_eq!(&got[2 * N..], &want[..]);
    // The read-only input is never copied back over the client's memory.
    assert_eq!(in_map.i32s().unwrap(), input);

    // Submit: two views of one output, in order.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut inbound = s
        .client
        .submit(s.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    out.map.fill_i32(SENTINEL).unwrap();
    for (k, at) in [(1u64, 0u64), (2, B)] {
        tx.send(pb::SubmitRequest {
            request_id: k,
            work: Some(pb::submit_request::Work::Dispatch(pb::DispatchRequest {
                program_id: p,
                args: vec![view(tin, 0, B, true), view(out.id, at, B, false)],
            })),
            timeout_ms: 0,
        })
        .await
        .unwrap();
    }
    for k in [1u64, 2] {
        let r = inbound.next().await.unwrap().unwrap();
        assert_eq!((r.request_id, r.code), (k, 0), "{r:?}");
    }
    drop(tx);
    let got = out.map.i32s().unwrap();
    let want: Vec<i32> = input[..N].iter().map(|v| v + 1).collect();
    assert_eq!(&got[..N], &want[..]);
    assert_eq!(&got[N..2 * N], &want[..]);
    assert!(got[2 * N..].iter().all(|v| *v == SENTINEL));

    // Refusals, naming the argument.
    let refuse = |args: Vec<pb::TensorArg>| pb::DispatchRequest {
        program_id: p,
        args,
    };
    let e = s
        .client
        .dispatch(s.req(refuse(vec![
            view(tin, B + 4, B, true),
            view(out.id, 0, B, false),
        ])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains(&format!(
            "args[0]: bytes {}..{} are outside tensor {tin} of {} bytes",
            B + 4,
            2 * B + 4,
            2 * B
        )),
        "{e:?}"
    );
    let e = s
        .client
        .dispatch(s.req(refuse(vec![
            view(tin, 0, B, true),
            view(out.id, 0, B - 4, false),
        ])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .contains(&format!("args[1]: {} bytes, but program {p}", B - 4)),
        "{e:?}"
    );
    let e = s
        .client
        .dispatch(s.req(refuse(vec![
            view(tin, 2 * B, 0, true),
            view(out.id, 0, B, false),
        ])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
}
