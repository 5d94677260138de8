//! The floors: what local IPC and a bare gRPC service cost on this machine before any work.
//!
//! - Row 1, [`RawEcho`]: a length-prefixed request/response echo over a Unix stream socket,
//!   blocking std sockets on both sides, no gRPC.
//! - Row 1b, [`EchoServer`] + [`TonicEcho`]: a tonic unary echo over a Unix socket with
//!   nothing behind it, served on a runtime like npud's for as many I/O threads as npud reports
//!   (its device info's `io_threads`), called from the same client runtime the npud rows use.
//! - Row 1c, [`tonic_stream`]: the same service's bidirectional stream with a fixed number of
//!   messages in flight: the floor of pipelined submission.
//!
//! Both servers run in a child process ([`FloorServers`]), so that every floor crosses a
//! process boundary as npud's rows do: switching between threads of two processes costs more
//! than between threads of one (on this kind of VM, a third more for the tonic echo).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status, Streaming};

use crate::client::{Iters, Pipelined, pipelined, time_loop};
use crate::echo_pb::EchoMessage;
use crate::echo_pb::echo_client::EchoClient;
use crate::echo_pb::echo_server::{Echo, EchoServer as EchoService};
use crate::stats::nanos;
use crate::{BenchError, Result};

/// Row 1: a client of the raw echo server, exchanging `size`-byte payloads behind a 4-byte
/// length.
#[derive(Debug)]
pub struct RawEcho {
    stream: UnixStream,
    frame: Vec<u8>,
    back: Vec<u8>,
}

/// Serves the raw echo on `listener`: each connection on a thread of its own, echoing
/// length-prefixed frames until the peer closes.
pub fn serve_raw(listener: UnixListener) {
    for s in listener.incoming() {
        let Ok(mut s) = s else { return };
        let _ = std::thread::Builder::new()
            .name("raw-echo".into())
            .spawn(move || {
                let mut frame = Vec::new();
                loop {
                    let mut len = [0u8; 4];
                    if s.read_exact(&mut len).is_err() {
                        return;
                    }
                    let n = u32::from_le_bytes(len) as usize;
                    frame.clear();
                    frame.extend_from_slice(&len);
                    frame.resize(4 + n, 0);
                    if s.read_exact(&mut frame[4..]).is_err() || s.write_all(&frame).is_err() {
                        return;
                    }
                }
            });
    }
}

impl RawEcho {
    /// Connects to the raw echo server at `path`.
    ///
    /// # Errors
    /// Socket errors.
    pub fn connect(path: &Path, size: usize) -> Result<RawEcho> {
        let stream = UnixStream::connect(path)?;
        let len = u32::try_from(size).map_err(|e| BenchError(e.to_string()))?;
        let mut frame = len.to_le_bytes().to_vec();
        frame.extend(std::iter::repeat_n(0xA5u8, size));
        let back = vec![0u8; frame.len()];
        Ok(RawEcho {
            stream,
            frame,
            back,
        })
    }

    /// `it` round trips: the samples (ns) and the measured wall time.
    ///
    /// # Errors
    /// Socket errors.
    pub fn measure(&mut self, it: Iters) -> Result<(Vec<u64>, Duration)> {
        for _ in 0..it.warmup {
            self.round()?;
        }
        let mut ns = Vec::with_capacity(it.measured);
        let start = Instant::now();
        for _ in 0..it.measured {
            let t = Instant::now();
            self.round()?;
            ns.push(nanos(t.elapsed()));
        }
        Ok((ns, start.elapsed()))
    }

    fn round(&mut self) -> Result<()> {
        self.stream.write_all(&self.frame)?;
        self.stream.read_exact(&mut self.back)?;
        Ok(())
    }
}

/// The echo service. With a hop, each unary echo goes through a second thread of the
/// server process and back (a blocking channel there, a oneshot back), as each of npud's
/// dispatches goes from its I/O thread to its device thread: the floor of a design with one
/// device owner.
#[derive(Debug, Default)]
struct EchoSvc {
    hop: Option<std::sync::mpsc::Sender<Hop>>,
}

type Hop = (EchoMessage, oneshot::Sender<EchoMessage>);

impl EchoSvc {
    fn with_hop() -> std::io::Result<EchoSvc> {
        let (tx, rx) = std::sync::mpsc::channel::<Hop>();
        std::thread::Builder::new()
            .name("echo-hop".into())
            .spawn(move || {
                while let Ok((m, back)) = rx.recv() {
                    let _ = back.send(m);
                }
            })?;
        Ok(EchoSvc { hop: Some(tx) })
    }
}

type EchoStream =
    std::pin::Pin<Box<dyn Stream<Item = std::result::Result<EchoMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Echo for EchoSvc {
    async fn echo(
        &self,
        req: Request<EchoMessage>,
    ) -> std::result::Result<Response<EchoMessage>, Status> {
        let m = req.into_inner();
        let Some(hop) = &self.hop else {
            return Ok(Response::new(m));
        };
        let (tx, rx) = oneshot::channel();
        hop.send((m, tx))
            .map_err(|_| Status::internal("the hop thread is gone"))?;
        rx.await
            .map(Response::new)
            .map_err(|_| Status::internal("the hop thread is gone"))
    }

    type EchoStreamStream = EchoStream;

    async fn echo_stream(
        &self,
        req: Request<Streaming<EchoMessage>>,
    ) -> std::result::Result<Response<EchoStream>, Status> {
        let s = req.into_inner();
        Ok(Response::new(Box::pin(s)))
    }
}

/// The bare echo service, served on a Unix socket by its own runtime thread until dropped.
#[derive(Debug)]
pub struct EchoServer {
    pub path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    /// Serves the echo service at `path` on a runtime like npud's with `workers` I/O threads:
    /// one is the current-thread scheduler on the server's own thread, more are the
    /// multi-threaded scheduler's workers.
    ///
    /// # Errors
    /// When the socket cannot be bound or the runtime cannot start.
    pub fn start(path: &Path, workers: usize) -> Result<EchoServer> {
        EchoServer::serve(path, workers, EchoSvc::default())
    }

    /// As [`EchoServer::start`], with each unary echo going through a second thread and back.
    ///
    /// # Errors
    /// As [`EchoServer::start`].
    pub fn start_with_hop(path: &Path, workers: usize) -> Result<EchoServer> {
        EchoServer::serve(path, workers, EchoSvc::with_hop()?)
    }

    fn serve(path: &Path, workers: usize, svc: EchoSvc) -> Result<EchoServer> {
        let path = path.to_path_buf();
        let mut b = if workers <= 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(workers);
            b
        };
        let rt = b.thread_name("echo-io").enable_all().build()?;
        let listener = {
            let _g = rt.enter();
            tokio::net::UnixListener::bind(&path)?
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("echo-server".into())
            .spawn(move || {
                rt.block_on(async move {
                    let _ = tonic::transport::Server::builder()
                        .add_service(EchoService::new(svc))
                        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                            let _ = stopped.await;
                        })
                        .await;
                });
            })?;
        Ok(EchoServer {
            path,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Row 1b: a client of the echo service sending `size`-byte payloads.
#[derive(Debug, Clone)]
pub struct TonicEcho {
    client: EchoClient<tonic::transport::Channel>,
    msg: EchoMessage,
}

impl TonicEcho {
    /// Connects to `server`.
    ///
    /// # Errors
    /// Transport errors.
    pub async fn connect(path: &Path, size: usize) -> Result<TonicEcho> {
        Ok(TonicEcho {
            client: EchoClient::new(crate::client::connect_unix(path).await?),
            msg: EchoMessage {
                payload: vec![0xA5; size],
            },
        })
    }

    /// `it` unary echoes: the samples (ns) and the measured wall time.
    ///
    /// # Errors
    /// Transport errors.
    pub async fn measure(&self, it: Iters) -> Result<(Vec<u64>, Duration)> {
        time_loop(it, || {
            let mut c = self.client.clone();
            let m = self.msg.clone();
            async move {
                c.echo(m).await?;
                Ok(())
            }
        })
        .await
    }
}

/// Row 1c: the echo stream with `depth` messages in flight.
///
/// # Errors
/// Transport errors.
pub async fn tonic_stream(path: &Path, size: usize, depth: usize, it: Iters) -> Result<Pipelined> {
    let mut client = EchoClient::new(crate::client::connect_unix(path).await?);
    // The request id rides in the payload's first 8 bytes.
    let width = size.max(8);
    pipelined(
        depth,
        it,
        |i| {
            let mut payload = vec![0xA5; width];
            payload[..8].copy_from_slice(&i.to_le_bytes());
            EchoMessage { payload }
        },
        |m: &EchoMessage| {
            m.payload
                .get(..8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| BenchError("an echo without its id".into()))
        },
        |s| client.echo_stream(s),
    )
    .await
}

/// The floors' servers (raw and tonic echo), run in a child process of their own (this
/// executable with `--serve-floors DIR`), so that a floor crosses the same process boundary
/// npud's rows do. Stopped when dropped (the child exits when its stdin closes).
#[derive(Debug)]
pub struct FloorServers {
    child: Child,
    pub raw: PathBuf,
    pub echo: PathBuf,
    pub echo_hop: PathBuf,
    _dir: tempfile::TempDir,
}

impl FloorServers {
    /// Starts the child serving in a new directory under `dir`, the tonic echo on `threads`
    /// runtime threads, and waits for both sockets.
    ///
    /// # Errors
    /// When the child cannot start or does not bind within 10 s.
    pub fn start(dir: &Path, threads: u32) -> Result<FloorServers> {
        let exe = std::env::current_exe()?;
        let sub = tempfile::Builder::new().prefix("fl").tempdir_in(dir)?;
        let dir = sub.path().to_path_buf();
        let child = Command::new(exe)
            .arg("--serve-floors")
            .arg(&dir)
            .arg("--floor-threads")
            .arg(threads.max(1).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        let mut f = FloorServers {
            child,
            raw: dir.join("raw"),
            echo: dir.join("echo"),
            echo_hop: dir.join("echo-hop"),
            _dir: sub,
        };
        let until = Instant::now() + Duration::from_secs(10);
        while !dir.join("floors-ready").exists() {
            if let Ok(Some(status)) = f.child.try_wait() {
                return Err(BenchError(format!(
                    "the floors' server process exited with {status}"
                )));
            }
            if Instant::now() > until {
                return Err(BenchError(
                    "the floors' server process did not bind its sockets in 10 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(f)
    }
}

impl FloorServers {
    /// The process serving the floors.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the child: closes its stdin and waits for it to exit (at most 5 s, then kills it),
    /// sleeping on the runtime between checks so that this process's client connections to it
    /// can close (the child's servers end when their connections have).
    pub async fn stop(mut self) {
        drop(self.child.stdin.take());
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for FloorServers {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's side of [`FloorServers`]: serves the raw echo at `dir/raw` and the tonic echo
/// at `dir/echo` (on `workers` threads) until stdin closes.
///
/// # Errors
/// When a socket cannot be bound.
pub fn serve_floors(dir: &Path, workers: usize) -> Result<()> {
    let listener = UnixListener::bind(dir.join("raw"))?;
    std::thread::Builder::new()
        .name("raw-accept".into())
        .spawn(move || serve_raw(listener))?;
    let echo = EchoServer::start(&dir.join("echo"), workers)?;
    let hop = EchoServer::start_with_hop(&dir.join("echo-hop"), workers)?;
    // Both sockets listen (bind and listen happened above): tell the parent.
    std::fs::write(dir.join("floors-ready"), b"ready")?;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop((echo, hop));
    Ok(())
}
