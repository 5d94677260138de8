//! A daemon restart mid-way gives a clear error within a bounded time; a dropped connection
//! within the grace period resumes transparently. Every wait here is wrapped in a timeout: a
//! hang fails the test.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Daemon;
use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ClientError, ConnectOptions, Program};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const BOUND: Duration = Duration::from_secs(30);

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {BOUND:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_means_session_lost_never_a_hang() {
    let mut d = Daemon::start();
    let client = Client::connect(Some(&d.unix())).await.expect("connect");
    let p = Program::emulated(
        &EmuDesign::vector_scalar_add(256, DType::I32, 1),
        client.generation(),
    )
    .expect("program");
    let a = client.tensor_from(&[1_i32; 256]).await.expect("a");
    let mut b = client.alloc::<i32>(256).await.expect("b");
    client
        .dispatch(&p, &[&a], &mut [&mut b])
        .await
        .expect("first dispatch");

    tokio::task::block_in_place(|| d.restart());
    let started = Instant::now();
    let e = bounded(
        "dispatch after a restart",
        client.dispatch(&p, &[&a], &mut [&mut b]),
    )
    .await
    .expect_err("the new daemon does not know the session");
    assert!(
        matches!(e, ClientError::SessionLost { .. }),
        "expected SessionLost, got {e}"
    );
    assert!(e.to_string().contains("connect again"), "{e}");
    assert!(started.elapsed() < BOUND);
    // And every later call says so at once.
    let e = bounded("a second call", client.alloc::<i32>(4))
        .await
        .expect_err("still lost");
    assert!(matches!(e, ClientError::SessionLost { .. }), "{e}");
    // A new client works against the new daemon.
    let fresh = Client::connect(Some(&d.unix()))
        .await
        .expect("a new session");
    let x = fresh.tensor_from(&[5_i32; 256]).await.expect("x");
    let mut y = fresh.alloc::<i32>(256).await.expect("y");
    fresh
        .dispatch(&p, &[&x], &mut [&mut y])
        .await
        .expect("dispatch");
    assert!(y.as_slice().iter().all(|&v| v == 6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_daemon_is_a_connect_error_within_the_reconnect_timeout() {
    let mut d = Daemon::start();
    let opts = ConnectOptions {
        reconnect_timeout: Duration::from_secs(1),
        ..ConnectOptions::default()
    };
    let client = Client::connect_with(Some(&d.unix()), opts)
        .await
        .expect("connect");
    let _a = client.alloc::<u8>(64).await.expect("a");
    tokio::task::block_in_place(|| d.kill());
    let e = bounded("a call to a dead daemon", client.alloc::<u8>(64))
        .await
        .expect_err("nobody answers");
    assert!(matches!(e, ClientError::Connect { .. }), "{e}");
    assert!(e.to_string().contains("cannot reach npud"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_reconnect_resumes_the_session() {
    let d = Daemon::start();
    let client = Client::connect(Some(&d.unix())).await.expect("connect");
    let p = Program::emulated(
        &EmuDesign::vector_scalar_add(64, DType::I32, 1),
        client.generation(),
    )
    .expect("program");
    let a = client.tensor_from(&[9_i32; 64]).await.expect("a");
    let mut b = client.alloc::<i32>(64).await.expect("b");
    client
        .dispatch(&p, &[&a], &mut [&mut b])
        .await
        .expect("dispatch");
    let session = client.session_id();
    bounded("reconnect", client.reconnect())
        .await
        .expect("resumed");
    assert_eq!(client.reconnects(), 1);
    assert_eq!(client.session_id(), session);
    // Same tensors, same registered program: still valid in the resumed session.
    let mut a = a;
    a.as_mut_slice().fill(20);
    client
        .dispatch(&p, &[&a], &mut [&mut b])
        .await
        .expect("dispatch after resume");
    assert!(b.as_slice().iter().all(|&v| v == 21));
    assert_eq!(client.programs().await.expect("programs").len(), 1);
}

/// A TCP proxy whose connections can be cut, to drop the client's connection under it, and
/// that can refuse new ones for a while (closing them at once).
struct Proxy {
    addr: std::net::SocketAddr,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    refusing: Arc<std::sync::atomic::AtomicBool>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: std::net::SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let refusing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c = conns.clone();
        let r = refusing.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                if r.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(down);
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                c.lock().expect("lock").push(task);
            }
        });
        Proxy {
            addr,
            conns,
            refusing,
            accept,
        }
    }

    /// Closes every proxied connection.
    fn cut(&self) -> usize {
        let mut v = self.conns.lock().expect("lock");
        let n = v.len();
        for t in v.drain(..) {
            t.abort();
        }
        n
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_resumes_transparently() {
    let d = Daemon::start();
    let proxy = Proxy::start(d.tcp()).await;
    let client = Client::connect(Some(&format!("http://{}", proxy.addr)))
        .await
        .expect("connect through the proxy");
    let p = Program::emulated(
        &EmuDesign::vector_vector_add(128, DType::F32),
        client.generation(),
    )
    .expect("program");
    let a = client.tensor_from(&[1.5_f32; 128]).await.expect("a");
    let b = client.tensor_from(&[2.0_f32; 128]).await.expect("b");
    let mut c = client.alloc::<f32>(128).await.expect("c");
    client
        .dispatch(&p, &[&a, &b], &mut [&mut c])
        .await
        .expect("dispatch");
    assert!(c.as_slice().iter().all(|&v| v == 3.5));

    for round in 0_u8..3 {
        assert!(proxy.cut() >= 1, "round {round}: a connection to cut");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut a2 = client
            .tensor_from(&[f32::from(round); 128])
            .await
            .expect("alloc");
        a2.as_mut_slice()[0] = 100.0;
        bounded(
            "dispatch after a cut",
            client.dispatch(&p, &[&a2, &b], &mut [&mut c]),
        )
        .await
        .expect("the session resumes and the dispatch runs");
        assert_eq!(c.as_slice()[0], 102.0);
        assert_eq!(c.as_slice()[1], f32::from(round) + 2.0);
    }
    // Rounds 1 and 2 each found a connection to cut, so the transport was re-established after
    // every cut. Whether the client's own reconnect path ran or tonic's channel reconnected
    // before a call saw the error depends on timing; either way it is the same session.
    let stats = client.statistics().await.expect("statistics");
    let me = stats
        .sessions
        .iter()
        .find(|s| s.session_id == client.session_id())
        .expect("the same session is still there");
    assert_eq!(
        me.dispatches
            .as_ref()
            .and_then(|x| x.success.as_ref())
            .map(|s| s.count),
        Some(4)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_outlived_its_grace_period_is_lost() {
    let d = Daemon::start_with_grace(200);
    let proxy = Proxy::start(d.tcp()).await;
    let opts = ConnectOptions {
        reconnect_timeout: Duration::from_secs(3),
        ..ConnectOptions::default()
    };
    let client = Client::connect_with(Some(&format!("http://{}", proxy.addr)), opts)
        .await
        .expect("connect through the proxy");
    let _a = client.alloc::<u8>(64).await.expect("a");
    proxy
        .refusing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    proxy.cut();
    // No connection for longer than the grace period: the daemon ends the session.
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy
        .refusing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let e = bounded("a call after the grace period", client.alloc::<u8>(64))
        .await
        .expect_err("the session ended");
    assert!(matches!(e, ClientError::SessionLost { .. }), "{e}");
    assert!(e.to_string().contains("grace period"), "{e}");
}
