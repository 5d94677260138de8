//! A fair executor: one client's long chain does not hold the device for its whole length,
//! statistics and device info answer while the device is busy (even hung), and a 1 GiB
//! allocation costs the daemon no memory until it is used. Each test observes ordering and
//! progress (what completed while what was still in flight), never a duration.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session, bytes_i32, i32_bytes};

/// Elements of one link of the long chain: 64 KiB of i32, enough that a 32-link doorbell batch
/// takes longer than another client's round trip.
const LINK: u32 = 16 << 10;
/// Elements of the other client's dispatch.
const SMALL: u32 = 1024;

async fn write(s: &mut Session, tensor: u64, data: Vec<u8>) {
    let req = s.req(tokio_stream::iter(vec![pb::WriteTensorChunk {
        tensor_id: tensor,
        offset: 0,
        data,
    }]));
    s.client.write_tensor(req).await.unwrap();
}

async fn read(s: &mut Session, tensor: u64, offset: u64, length: u64) -> Vec<u8> {
    let req = s.req(pb::ReadTensorRequest {
        tensor_id: tensor,
        offset,
        length,
        chunk_bytes: 0,
    });
    let mut stream = s.client.read_tensor(req).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        out.extend_from_slice(&chunk.data);
    }
    out
}

async fn allocate(s: &mut Session, size: u64) -> Result<u64, tonic::Status> {
    let req = s.req(pb::AllocateTensorRequest {
        size_bytes: size,
        name: String::new(),
    });
    Ok(s.client.allocate_tensor(req).await?.into_inner().tensor_id)
}

/// A client that adds 1 to its own 1024 values, checking every result.
struct Other {
    s: Session,
    program: u64,
    input: u64,
    output: u64,
}

impl Other {
    async fn open(d: &Daemon) -> Other {
        let mut s = Session::open(d.connect().await, "other").await.unwrap();
        let program = s
            .register(&EmuDesign::vector_scalar_add(SMALL, DType::I32, 1))
            .await
            .unwrap()
            .program_id;
        let input = allocate(&mut s, u64::from(SMALL) * 4).await.unwrap();
        let output = allocate(&mut s, u64::from(SMALL) * 4).await.unwrap();
        let values: Vec<i32> = (0..SMALL as i32).collect();
        write(&mut s, input, i32_bytes(&values)).await;
        Other {
            s,
            program,
            input,
            output,
        }
    }

    async fn dispatch(&mut self) {
        self.s
            .dispatch(self.program, &[self.input, self.output])
            .await
            .unwrap();
        let out = bytes_i32(&read(&mut self.s, self.output, 0, 16).await);
        assert_eq!(out, [1, 2, 3, 4]);
    }
}

/// A session with a 1,024-link chain of +1 over 64 KiB ready to run; returns it and the chain.
async fn long_chain(d: &Daemon) -> (Session, Vec<pb::DispatchRequest>, u64) {
    let mut s = Session::open(d.connect().await, "long-chain")
        .await
        .unwrap();
    let p = s
        .register(&EmuDesign::vector_scalar_add(LINK, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let a = allocate(&mut s, u64::from(LINK) * 4).await.unwrap();
    let b = allocate(&mut s, u64::from(LINK) * 4).await.unwrap();
    let links = (0..1024)
        .map(|k| {
            let (i, o) = if k % 2 == 0 { (a, b) } else { (b, a) };
            npud_e2e::dispatch_request(p, &[i, o])
        })
        .collect();
    (s, links, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_client_keeps_dispatching_while_a_1024_link_chain_runs() {
    let d = Daemon::start(Options::default());
    let (mut chainer, links, first) = long_chain(&d).await;
    let mut other = Other::open(&d).await;
    // The other client is warmed up: its program is loaded, its first dispatch done.
    other.dispatch().await;

    let mut c = chainer.clone();
    let chain = tokio::spawn(async move { c.chain(links).await });
    let mut during = 0;
    let until = Instant::now() + Duration::from_secs(60);
    while !chain.is_finished() {
        other.dispatch().await;
        if !chain.is_finished() {
            during += 1;
        }
        assert!(Instant::now() < until, "the chain never finished");
    }
    let r = chain.await.unwrap().unwrap();
    assert_eq!((r.completed, r.doorbells), (1024, 32), "{r:?}");
    assert!(r.failure.is_none(), "{r:?}");
    // 1,024 links of +1, alternating between two tensors: the first ends at +1024.
    let out = bytes_i32(&read(&mut chainer, first, 0, 8).await);
    assert_eq!(out, [1024, 1024]);
    // The chain rang 32 doorbells, and the executor served the other client between them;
    // before, the chain held the device for all 32 and the other client got at most the turn
    // it had already queued.
    assert!(
        during >= 8,
        "the other client completed {during} dispatches while the chain ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_and_device_info_answer_while_the_device_hangs() {
    // A hang holds the device (and the executor's turn) until the runtime's timeout; the
    // statistics must not wait for it.
    let d = Daemon::start(Options::default().arg("--emulator-timeout-ms").arg("20000"));
    let state = d.dir.path().join("state");
    let mut s = Session::open(d.connect().await, "hangs").await.unwrap();
    let hang = s.register(&EmuDesign::hang(4096)).await.unwrap();
    let a = allocate(&mut s, 4096).await.unwrap();
    let b = allocate(&mut s, 4096).await.unwrap();
    let mut s2 = s.clone();
    let running = tokio::spawn(async move { s2.dispatch(hang.program_id, &[a, b]).await });
    // The executor records the program as in flight just before it rings the doorbell.
    let until = Instant::now() + Duration::from_secs(15);
    while !npud::state_dir::InFlight::peek(&state)
        .unwrap_or_default()
        .iter()
        .any(|p| p.content_hash == hang.content_hash)
    {
        assert!(Instant::now() < until, "the hang never went in flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut watcher = Session::open(d.connect().await, "watcher").await.unwrap();
    for _ in 0..3 {
        let stats = watcher.statistics().await.unwrap();
        let info = watcher
            .client
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(
            !running.is_finished(),
            "statistics and device info waited for the hang to end"
        );
        assert_eq!(stats.device_faults, 0);
        assert!(info.heap_used_bytes > 0, "{info:?}");
        let hs = stats
            .sessions
            .iter()
            .find(|x| x.session_id == s.id)
            .unwrap();
        assert_eq!((hs.tensors, hs.tensor_bytes), (2, 8192));
    }
    d.send_signal(rustix::process::Signal::KILL);
    let _ = running.await;
}

/// Resident memory of a process (anonymous, file and shared pages), in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gib_allocation_touches_no_memory_and_reads_back_zeros() {
    const GIB: u64 = 1 << 30;
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "big").await.unwrap();
    let mut other = Other::open(&d).await;
    other.dispatch().await;
    let pid = d.pid().unwrap();
    let before = rss(pid);
    let t = allocate(&mut s, GIB).await.unwrap();
    let after = rss(pid);
    // Zeroing it on the executor thread made the daemon resident for the whole gigabyte (and
    // stalled every client for as long as that took).
    assert!(
        after.saturating_sub(before) < 64 << 20,
        "allocating 1 GiB made the daemon {} MiB larger",
        after.saturating_sub(before) >> 20
    );
    other.dispatch().await;
    for offset in [0, GIB / 2 + 12_345, GIB - 4096] {
        let bytes = read(&mut s, t, offset, 4096).await;
        assert_eq!(bytes.len(), 4096);
        assert!(
            bytes.iter().all(|b| *b == 0),
            "tensor bytes at {offset} are not zero"
        );
    }
    let req = s.req(pb::FreeTensorRequest { tensor_id: t });
    s.client.free_tensor(req).await.unwrap();
}
