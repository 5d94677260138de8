//! Fds across a real process boundary.
//!
//! The parent runs the daemon side in tokio and starts this same test binary again as the
//! client, running only [`peer`] with the socket path and tickets in its environment. The child
//! redeems an exported memfd and writes a pattern into it, then imports a memfd of its own; the
//! parent checks both through its own mappings.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream as StdStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use npu_fd::wire::{Op, Response, Ticket, client, server};
use npu_fd::{Mapping, memfd};
use tokio::net::UnixListener;

const SOCKET_ENV: &str = "NPU_FD_PEER_SOCKET";
const EXPORT_ENV: &str = "NPU_FD_PEER_EXPORT_TICKET";
const IMPORT_ENV: &str = "NPU_FD_PEER_IMPORT_TICKET";
const SIZE: usize = 64 * 1024;

fn pattern(i: usize, seed: usize) -> u8 {
    u8::try_from((i * 31 + seed) % 256).expect("below 256")
}

/// The child's side. Does nothing when run as an ordinary test.
#[test]
fn peer() {
    let Ok(path) = std::env::var(SOCKET_ENV) else {
        return;
    };
    let export: Ticket = std::env::var(EXPORT_ENV)
        .expect("export ticket")
        .parse()
        .expect("hex");
    let import: Ticket = std::env::var(IMPORT_ENV)
        .expect("import ticket")
        .parse()
        .expect("hex");
    let stream = StdStream::connect(path).expect("connect");

    let (fd, offset, size) = client::redeem_export(&stream, &export).expect("redeem");
    let mut shared = Mapping::new(fd.as_fd(), offset, usize::try_from(size).expect("size"))
        .expect("map the exported fd");
    let bytes: Vec<u8> = (0..SIZE).map(|i| pattern(i, 1)).collect();
    shared.copy_from_slice(0, &bytes).expect("write the export");

    let own = memfd::create("npu-fd-peer", SIZE as u64).expect("memfd");
    let mut mine = Mapping::new(own.as_fd(), 0, SIZE).expect("map own");
    let bytes: Vec<u8> = (0..SIZE).map(|i| pattern(i, 2)).collect();
    mine.copy_from_slice(0, &bytes).expect("write own");
    client::import(&stream, &import, own.as_fd()).expect("import");
}

#[tokio::test]
async fn child_process_writes_through_a_redeemed_fd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fd.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let export = Ticket::random().expect("ticket");
    let import = Ticket::random().expect("ticket");

    // The tensor starts 100 bytes into the fd, as a staged tensor inside a larger memfd would.
    let offset = 100;
    let fd = memfd::create("npu-fd-export", (offset + SIZE) as u64).expect("memfd");
    let daemon_view = Mapping::new(fd.as_fd(), offset as u64, SIZE).expect("map");

    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["peer", "--exact", "--nocapture", "--test-threads=1"])
        .env(SOCKET_ENV, &path)
        .env(EXPORT_ENV, export.to_string())
        .env(IMPORT_ENV, import.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the peer");

    // If the child fails before it connects, give up instead of waiting forever.
    let exchange = async {
        let (stream, _) = listener.accept().await.expect("accept");
        assert_eq!(
            server::peer_uid(&stream).expect("uid"),
            rustix::process::getuid().as_raw()
        );

        let (request, _) = server::read_request(&stream)
            .await
            .expect("read")
            .expect("req");
        assert_eq!((request.op, request.ticket), (Op::RedeemExport, export));
        let response = Response::exported(offset as u64, SIZE as u64);
        server::write_response(&stream, &response, Some(fd.as_fd()))
            .await
            .expect("write");

        let (request, received) = server::read_request(&stream)
            .await
            .expect("read")
            .expect("req");
        assert_eq!((request.op, request.ticket), (Op::Import, import));
        let received = received.expect("IMPORT carries an fd");
        memfd::check_import(received.as_fd(), SIZE as u64).expect("the child's memfd passes");
        server::write_response(&stream, &Response::ok(), None)
            .await
            .expect("write");
        received
    };
    let served = tokio::time::timeout(Duration::from_secs(60), exchange).await;

    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "peer failed: {status}");
    let received = served.expect("the peer connected and finished both exchanges");

    // The child has exited; what it wrote stays in the shared pages.
    let written = daemon_view.read_vec::<u8>(0, SIZE).expect("read");
    assert!(written.iter().enumerate().all(|(i, &b)| b == pattern(i, 1)));
    let imported = Mapping::new(received.as_fd(), 0, SIZE).expect("map import");
    let imported = imported.read_vec::<u8>(0, SIZE).expect("read import");
    assert!(
        imported
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i, 2))
    );
}
