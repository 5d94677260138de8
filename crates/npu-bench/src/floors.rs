//! The floors: what local IPC and a bare gRPC service cost on this machine before any work.
//!
//! - Row 1, [`RawEcho`]: a length-prefixed request/response echo over a Unix stream socket,
//!   blocking std sockets on both sides, no gRPC.
//! - Row 1b, [`EchoServer`] + [`TonicEcho`]: a tonic unary echo over a Unix socket with
//!   nothing behind it, served on its own multi-threaded runtime (as npud serves), called from
//!   the same client runtime the npud rows use.
//! - Row 1c, [`tonic_stream`]: the same service's bidirectional stream with a fixed number of
//!   messages in flight: the floor of pipelined submission.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
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

/// Row 1: a client and an echo server thread on a Unix socket in `dir`, exchanging
/// `size`-byte payloads behind a 4-byte length.
#[derive(Debug)]
pub struct RawEcho {
    stream: UnixStream,
    frame: Vec<u8>,
    back: Vec<u8>,
    path: PathBuf,
    server: Option<JoinHandle<()>>,
}

impl RawEcho {
    /// Binds the socket, starts the server thread and connects.
    ///
    /// # Errors
    /// Socket errors.
    pub fn start(dir: &Path, size: usize) -> Result<RawEcho> {
        let path = dir.join("raw");
        let listener = UnixListener::bind(&path)?;
        let server = std::thread::Builder::new()
            .name("raw-echo".into())
            .spawn(move || {
                let Ok((mut s, _)) = listener.accept() else {
                    return;
                };
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
            })?;
        let stream = UnixStream::connect(&path)?;
        let len = u32::try_from(size).map_err(|e| BenchError(e.to_string()))?;
        let mut frame = len.to_le_bytes().to_vec();
        frame.extend(std::iter::repeat_n(0xA5u8, size));
        let back = vec![0u8; frame.len()];
        Ok(RawEcho {
            stream,
            frame,
            back,
            path,
            server: Some(server),
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

impl Drop for RawEcho {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[derive(Debug, Default)]
struct EchoSvc;

type EchoStream =
    std::pin::Pin<Box<dyn Stream<Item = std::result::Result<EchoMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Echo for EchoSvc {
    async fn echo(
        &self,
        req: Request<EchoMessage>,
    ) -> std::result::Result<Response<EchoMessage>, Status> {
        Ok(Response::new(req.into_inner()))
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
    /// Serves the echo service at `dir/echo` on a runtime with `workers` threads.
    ///
    /// # Errors
    /// When the socket cannot be bound or the runtime cannot start.
    pub fn start(dir: &Path, workers: usize) -> Result<EchoServer> {
        let path = dir.join("echo");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name("echo-io")
            .enable_all()
            .build()?;
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
                        .add_service(EchoService::new(EchoSvc))
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
    pub async fn connect(server: &EchoServer, size: usize) -> Result<TonicEcho> {
        Ok(TonicEcho {
            client: EchoClient::new(crate::client::connect_unix(&server.path).await?),
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
pub async fn tonic_stream(
    server: &EchoServer,
    size: usize,
    depth: usize,
    it: Iters,
) -> Result<Pipelined> {
    let mut client = EchoClient::new(crate::client::connect_unix(&server.path).await?);
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
