//! Peers at the socket level, for the identity and connection-pool tests: connections that are
//! held without a call (silent, or past an HTTP/2 handshake), a call made over a connection
//! from a chosen source address, a raw gRPC request written by a peer that closes at once,
//! and a socket table filled with TIME_WAIT rows. `npud-test-client` runs them as processes
//! under other uids and in other network namespaces.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};
use std::time::Duration;

use prost::Message as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream, UnixStream};

use npu_proto::v1 as pb;

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
/// How long a handshake or a call may take.
const PATIENCE: Duration = Duration::from_secs(20);

/// Where to connect: a Unix socket (a path) or a TCP address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with('/') {
            Ok(Target::Unix(PathBuf::from(s)))
        } else {
            s.parse()
                .map(Target::Tcp)
                .map_err(|e| format!("{s}: not a path or a socket address: {e}"))
        }
    }
}

/// A connection to a [`Target`].
#[derive(Debug)]
pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    /// A connection to `target`, from source address `from` (TCP only).
    ///
    /// # Errors
    /// When the socket cannot be bound or connected.
    pub async fn open(target: &Target, from: Option<IpAddr>) -> io::Result<Conn> {
        match target {
            Target::Unix(p) => UnixStream::connect(p).await.map(Conn::Unix),
            Target::Tcp(a) => {
                let s = if a.is_ipv4() {
                    TcpSocket::new_v4()?
                } else {
                    TcpSocket::new_v6()?
                };
                if let Some(ip) = from {
                    s.bind(SocketAddr::new(ip, 0))?;
                }
                s.connect(*a).await.map(Conn::Tcp)
            }
        }
    }

    /// This end's TCP port (0 on a Unix socket).
    pub fn local_port(&self) -> u16 {
        match self {
            Conn::Tcp(s) => s.local_addr().map_or(0, |a| a.port()),
            Conn::Unix(_) => 0,
        }
    }

    /// Sends the HTTP/2 preface, an empty SETTINGS frame and a PING, and waits for the PING's
    /// acknowledgement: the server has then read the preface (the connection is past the
    /// pre-authentication pool) and stays open, idle, with no call and no session.
    ///
    /// # Errors
    /// When the server closes the connection or does not answer within 20 s.
    pub async fn http2_handshake(&mut self) -> io::Result<()> {
        let mut out = PREFACE.to_vec();
        out.extend_from_slice(&SETTINGS);
        out.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0]);
        out.extend_from_slice(b"npudping");
        self.write_all(&out).await?;
        let acked = async {
            loop {
                let mut h = [0_u8; 9];
                self.read_exact(&mut h).await?;
                let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                let mut payload = vec![0_u8; len];
                self.read_exact(&mut payload).await?;
                if h[3] == 6 && h[4] & 1 == 1 {
                    return Ok::<_, io::Error>(());
                }
            }
        };
        tokio::time::timeout(PATIENCE, acked)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no PING acknowledgement"))?
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Opens `n` connections to `target` (from `from`), each silent or past an HTTP/2 handshake
/// ([`Conn::http2_handshake`]), one after the other: those that opened, and how many failed
/// (refused, or closed by the daemon before their handshake ended).
pub async fn hold(
    target: &Target,
    n: u32,
    handshake: bool,
    from: Option<IpAddr>,
) -> (Vec<Conn>, u32) {
    let mut held = Vec::new();
    let mut failed = 0;
    for _ in 0..n {
        match Conn::open(target, from).await {
            Ok(mut c) => {
                if handshake && c.http2_handshake().await.is_err() {
                    failed += 1;
                } else {
                    held.push(c);
                }
            }
            Err(_) => failed += 1,
        }
    }
    (held, failed)
}

/// A connector that hands tonic one connection opened beforehand.
#[derive(Debug, Clone)]
struct One(std::sync::Arc<std::sync::Mutex<Option<Conn>>>);

impl tonic::codegen::Service<tonic::codegen::http::Uri> for One {
    type Response = hyper_util::rt::TokioIo<Conn>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::codegen::http::Uri) -> Self::Future {
        let c = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        std::future::ready(
            c.map(hyper_util::rt::TokioIo::new)
                .ok_or_else(|| io::Error::other("the one connection was used")),
        )
    }
}

/// What one call answered: the caller's identity (`GetDeviceInfo`), or the status's code
/// and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub identity: String,
    pub code: String,
    pub message: String,
}

/// `GetDeviceInfo` over a new connection to `target` from `from`, within 20 s.
pub async fn device_info(target: &Target, from: Option<IpAddr>) -> Answer {
    let failed = |code: &str, message: String| Answer {
        identity: String::new(),
        code: code.to_owned(),
        message,
    };
    let call = async {
        let conn = match Conn::open(target, from).await {
            Ok(c) => c,
            Err(e) => return failed("Connect", e.to_string()),
        };
        let one = One(std::sync::Arc::new(std::sync::Mutex::new(Some(conn))));
        let ch = match tonic::transport::Endpoint::from_static("http://npud.invalid")
            .connect_with_connector(one)
            .await
        {
            Ok(c) => c,
            Err(e) => return failed("Connect", e.to_string()),
        };
        match pb::npud_client::NpudClient::new(ch)
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await
        {
            Ok(r) => Answer {
                identity: r.into_inner().caller_identity,
                code: "OK".into(),
                message: String::new(),
            },
            Err(s) => failed(&format!("{:?}", s.code()), s.message().to_owned()),
        }
    };
    tokio::time::timeout(PATIENCE, call)
        .await
        .unwrap_or_else(|_| failed("Timeout", "no answer within 20 s".into()))
}

/// HPACK: a literal header field without indexing, with a new name, no Huffman coding.
fn literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0);
    for s in [name, value] {
        let len = u8::try_from(s.len()).expect("a short header");
        assert!(len < 127, "a header longer than one HPACK length byte");
        out.push(len);
        out.extend_from_slice(s.as_bytes());
    }
}

/// An HTTP/2 frame.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a small frame");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// A whole gRPC call on a new HTTP/2 connection, as bytes: the preface, SETTINGS, and
/// `OpenSession` named `client_name` on stream 1 (HEADERS, then DATA that ends the stream).
pub fn open_session_bytes(client_name: &str) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend_from_slice(&SETTINGS);
    let mut headers = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/npud.v1.Npud/OpenSession"),
        (":authority", "npud.invalid"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        literal(&mut headers, n, v);
    }
    // END_HEADERS
    frame(&mut out, 1, 4, 1, &headers);
    let msg = pb::OpenSessionRequest {
        client_name: client_name.to_owned(),
        ..Default::default()
    }
    .encode_to_vec();
    let mut data = vec![0_u8];
    data.extend_from_slice(&u32::try_from(msg.len()).expect("small").to_be_bytes());
    data.extend_from_slice(&msg);
    // END_STREAM
    frame(&mut out, 0, 1, 1, &data);
    out
}

/// Connects to `addr`, writes an `OpenSession` call named `client_name`, and closes at once
/// without reading a byte: the local port it used.
///
/// # Errors
/// When it cannot connect or write.
pub async fn ghost(addr: SocketAddr, client_name: &str) -> io::Result<u16> {
    let mut c = TcpStream::connect(addr).await?;
    let port = c.local_addr()?.port();
    c.write_all(&open_session_bytes(client_name)).await?;
    drop(c);
    Ok(port)
}

/// Fills this network namespace's socket table with `n` TIME_WAIT sockets (each a loopback
/// connection its client closed first), over `listeners` listening ports; returns how many it
/// made. The namespace should not reuse TIME_WAIT ports (`net.ipv4.tcp_tw_reuse = 0`) and
/// have a wide port range, or connections run out of ports.
///
/// # Errors
/// When a listener cannot be bound, or a connection fails.
pub fn time_wait(n: u32, listeners: usize) -> io::Result<u32> {
    let ls: Vec<std::net::TcpListener> = (0..listeners)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<io::Result<_>>()?;
    let addrs: Vec<SocketAddr> = ls
        .iter()
        .map(std::net::TcpListener::local_addr)
        .collect::<io::Result<_>>()?;
    let mut made = 0;
    for i in 0..n {
        let k = usize::try_from(i).unwrap_or(0) % ls.len();
        let c = std::net::TcpStream::connect(addrs[k])?;
        let (s, _) = ls[k].accept()?;
        // The client closes first, so its end waits in TIME_WAIT once the server closes too.
        drop(c);
        drop(s);
        made += 1;
    }
    Ok(made)
}
