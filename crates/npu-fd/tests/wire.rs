//! The fd socket end to end: a tokio server task and a blocking client on another thread, over
//! real Unix sockets.

use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream as StdStream;

use npu_fd::wire::{self, Op, REQUEST_LEN, Request, Response, Status, Ticket, client, server};
use npu_fd::{FdError, Mapping, memfd};
use rustix::io::FdFlags;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use tokio::net::{UnixListener, UnixStream};

/// A connected pair: the daemon's tokio end and the client's blocking end.
fn pair() -> (UnixStream, StdStream) {
    let (daemon, client) = StdStream::pair().expect("socketpair");
    daemon.set_nonblocking(true).expect("nonblocking");
    (UnixStream::from_std(daemon).expect("tokio stream"), client)
}

fn is_cloexec(fd: BorrowedFd<'_>) -> bool {
    rustix::io::fcntl_getfd(fd)
        .expect("F_GETFD")
        .contains(FdFlags::CLOEXEC)
}

/// Sends raw bytes with `fds` attached in one `sendmsg`, as a misbehaving client would.
fn send_raw(stream: &StdStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let sent = rustix::net::sendmsg(
        stream,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .expect("sendmsg");
    assert_eq!(sent, bytes.len());
}

fn frame(op: Op, ticket: Ticket) -> [u8; REQUEST_LEN] {
    Request { op, ticket }.encode()
}

async fn malformed(stream: &UnixStream) -> String {
    match server::read_request(stream).await {
        Err(err @ (FdError::Malformed(_) | FdError::Truncated { .. })) => {
            assert_eq!(err.wire_status(), Status::MALFORMED);
            err.to_string()
        }
        other => panic!("expected a malformed frame, got {other:?}"),
    }
}

#[tokio::test]
async fn redeem_export_shares_memory_with_the_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fd.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let ticket = Ticket::random().expect("ticket");

    let page = rustix::param::page_size();
    let fd = memfd::create("npu-fd-export", 2 * page as u64).expect("memfd");
    let mut daemon_view = Mapping::new(fd.as_fd(), 0, 2 * page).expect("map");
    daemon_view.copy_from_slice(page, b"hello").expect("write");

    let client = tokio::task::spawn_blocking(move || {
        let stream = StdStream::connect(&path).expect("connect");
        let (fd, offset, size) = client::redeem_export(&stream, &ticket).expect("redeem");
        assert!(is_cloexec(fd.as_fd()), "received fds are close-on-exec");
        let mut view = Mapping::new(fd.as_fd(), offset, usize::try_from(size).expect("size"))
            .expect("client map");
        assert_eq!(view.read_vec::<u8>(0, 5).expect("read"), b"hello");
        view.copy_from_slice(5, b"world").expect("write");
        (offset, size)
    });

    let (stream, _) = listener.accept().await.expect("accept");
    assert_eq!(
        server::peer_uid(&stream).expect("peer uid"),
        rustix::process::getuid().as_raw()
    );
    let (request, no_fd) = server::read_request(&stream)
        .await
        .expect("read")
        .expect("a request");
    assert_eq!(
        request,
        Request {
            op: Op::RedeemExport,
            ticket
        }
    );
    assert!(no_fd.is_none());
    let response = Response::exported(page as u64, 100);
    server::write_response(&stream, &response, Some(fd.as_fd()))
        .await
        .expect("write");

    assert_eq!(client.await.expect("client"), (page as u64, 100));
    assert_eq!(
        daemon_view.read_vec::<u8>(page, 10).expect("read"),
        b"helloworld"
    );
    assert!(server::read_request(&stream).await.expect("eof").is_none());
}

#[tokio::test]
async fn import_delivers_the_clients_memfd() {
    let (daemon, client_end) = pair();
    let ticket = Ticket::random().expect("ticket");
    let client = tokio::task::spawn_blocking(move || {
        let fd = memfd::create("npu-fd-import", 4096).expect("memfd");
        let mut view = Mapping::new(fd.as_fd(), 0, 4096).expect("map");
        view.write_from(0, &[7u32, 8, 9]).expect("write");
        client::import(&client_end, &ticket, fd.as_fd()).expect("import");
        // A second exchange on the same connection.
        client::import(&client_end, &ticket, fd.as_fd())
    });

    let (request, fd) = server::read_request(&daemon)
        .await
        .expect("read")
        .expect("a request");
    assert_eq!(
        request,
        Request {
            op: Op::Import,
            ticket
        }
    );
    let fd = fd.expect("IMPORT carries an fd");
    assert!(is_cloexec(fd.as_fd()));
    memfd::check_import(fd.as_fd(), 4096).expect("the client's memfd passes");
    let view = Mapping::new(fd.as_fd(), 0, 4096).expect("daemon map");
    assert_eq!(view.read_vec::<u32>(0, 3).expect("read"), [7, 8, 9]);
    server::write_response(&daemon, &Response::ok(), None)
        .await
        .expect("write");

    let (_, second) = server::read_request(&daemon)
        .await
        .expect("read")
        .expect("a request");
    let second = second.expect("fd");
    let err = memfd::check_import(second.as_fd(), 8192).expect_err("wrong declared size");
    server::write_response(&daemon, &Response::from_error(&err), None)
        .await
        .expect("write");
    match client.await.expect("client") {
        Err(FdError::Rejected { status, message }) => {
            assert_eq!(status, Status::SIZE_MISMATCH);
            assert!(message.starts_with("memfd is 4096 bytes but the tensor was declared as 8192"));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn refusals_reach_the_client_with_the_daemons_message() {
    let (daemon, client_end) = pair();
    let ticket = Ticket::random().expect("ticket");
    let client = tokio::task::spawn_blocking(move || {
        let unsealed = memfd::create_unsealed("npu-fd-unsealed", 64).expect("memfd");
        let import = client::import(&client_end, &ticket, unsealed.as_fd());
        let redeem = client::redeem_export(&client_end, &ticket).map(|_| ());
        (import, redeem)
    });

    let (_, fd) = server::read_request(&daemon)
        .await
        .expect("read")
        .expect("req");
    let err = memfd::check_import(fd.expect("fd").as_fd(), 64).expect_err("unsealed");
    server::write_response(&daemon, &Response::from_error(&err), None)
        .await
        .expect("write");
    let _ = server::read_request(&daemon)
        .await
        .expect("read")
        .expect("req");
    let unknown = Response::error(Status::UNKNOWN_TICKET, "no such ticket (tickets live 30 s)");
    server::write_response(&daemon, &unknown, None)
        .await
        .expect("write");

    let (import, redeem) = client.await.expect("client");
    let import = import.expect_err("refused").to_string();
    assert!(
        import.starts_with("the daemon refused the request (MISSING_SEALS): memfd lacks the F_SEAL_SHRINK and F_SEAL_GROW seals"),
        "{import}"
    );
    assert_eq!(
        redeem.expect_err("refused").to_string(),
        "the daemon refused the request (UNKNOWN_TICKET): no such ticket (tickets live 30 s)"
    );
}

#[tokio::test]
async fn frames_split_across_reads_keep_their_fd() {
    let (daemon, client_end) = pair();
    let ticket = Ticket::random().expect("ticket");
    let fd = memfd::create("npu-fd-split", 64).expect("memfd");
    let bytes = frame(Op::Import, ticket);
    send_raw(&client_end, &bytes[..5], &[fd.as_fd()]);
    let reader = tokio::spawn(async move {
        let got = server::read_request(&daemon).await;
        (got, daemon)
    });
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    send_raw(&client_end, &bytes[5..], &[]);
    let (got, _daemon) = reader.await.expect("reader");
    let (request, received) = got.expect("read").expect("req");
    assert_eq!(request.ticket, ticket);
    memfd::check_import(received.expect("fd").as_fd(), 64).expect("same memfd");
}

#[tokio::test]
async fn malformed_frames_are_named() {
    let ticket = Ticket::from_bytes([1; 16]);
    let good = frame(Op::RedeemExport, ticket);

    let (daemon, mut client_end) = pair();
    client_end.write_all(&[b'X'; REQUEST_LEN]).expect("write");
    assert!(malformed(&daemon).await.contains("bad magic \"XXXX\""));

    let (daemon, mut client_end) = pair();
    let mut bad = good;
    bad[4] = 2;
    client_end.write_all(&bad).expect("write");
    assert!(
        malformed(&daemon)
            .await
            .contains("unsupported protocol version 2")
    );

    let (daemon, mut client_end) = pair();
    let mut bad = good;
    bad[6] = 4;
    client_end.write_all(&bad).expect("write");
    assert!(malformed(&daemon).await.contains("unknown op 4"));

    let (daemon, mut client_end) = pair();
    client_end
        .write_all(&frame(Op::Import, ticket))
        .expect("write");
    assert_eq!(
        malformed(&daemon).await,
        "malformed fd-socket frame: IMPORT carries the memfd of the tensor, but the frame came \
         without an fd"
    );

    let (daemon, mut client_end) = pair();
    client_end.write_all(&good[..10]).expect("write");
    drop(client_end);
    assert_eq!(
        malformed(&daemon).await,
        "the fd socket closed after 10 of the 64 bytes of a frame"
    );
}

#[tokio::test]
async fn unwanted_fds_are_refused_and_closed() {
    let ticket = Ticket::from_bytes([2; 16]);

    // An fd on REDEEM_EXPORT: refused, and the daemon's copy closed. The client keeps only the
    // read end, so the read end sees EOF once no write end is left open anywhere.
    let (daemon, client_end) = pair();
    let (mut reader, writer) = std::io::pipe().expect("pipe");
    send_raw(
        &client_end,
        &frame(Op::RedeemExport, ticket),
        &[writer.as_fd()],
    );
    drop(writer);
    assert_eq!(
        malformed(&daemon).await,
        "malformed fd-socket frame: REDEEM_EXPORT takes no fd, but the frame carried one; it was \
         closed"
    );
    rustix::fs::fcntl_setfl(&reader, rustix::fs::OFlags::NONBLOCK).expect("O_NONBLOCK");
    let mut rest = Vec::new();
    let read = reader.read_to_end(&mut rest);
    assert_eq!(read.ok(), Some(0), "EOF: no write end is open any more");

    // Two fds on IMPORT.
    let (daemon, client_end) = pair();
    let a = memfd::create("npu-fd-a", 8).expect("memfd");
    let b = memfd::create("npu-fd-b", 8).expect("memfd");
    send_raw(
        &client_end,
        &frame(Op::Import, ticket),
        &[a.as_fd(), b.as_fd()],
    );
    assert_eq!(
        malformed(&daemon).await,
        "malformed fd-socket frame: the frame carried 2 fds; IMPORT takes one"
    );

    // Many fds: the reader makes room for the kernel's most a message can carry (SCM_MAX_FD),
    // so none is closed inside the read; the frame is refused naming the count.
    let (daemon, client_end) = pair();
    let many: Vec<_> = (0..16)
        .map(|_| memfd::create("npu-fd-many", 8).expect("memfd"))
        .collect();
    let borrowed: Vec<_> = many.iter().map(AsFd::as_fd).collect();
    send_raw(&client_end, &frame(Op::Import, ticket), &borrowed);
    assert_eq!(
        malformed(&daemon).await,
        "malformed fd-socket frame: the frame carried 16 fds; IMPORT takes one"
    );
}

#[tokio::test]
async fn client_refuses_a_broken_daemon() {
    let ticket = Ticket::from_bytes([3; 16]);

    // An ok answer to REDEEM_EXPORT without the fd.
    let (daemon, client_end) = pair();
    let client = tokio::task::spawn_blocking(move || client::redeem_export(&client_end, &ticket));
    let _ = server::read_request(&daemon)
        .await
        .expect("read")
        .expect("req");
    server::write_response(&daemon, &Response::exported(0, 8), None)
        .await
        .expect("write");
    let err = client.await.expect("client").expect_err("no fd");
    assert_eq!(
        err.to_string(),
        "malformed fd-socket frame: the daemon's ok answer to REDEEM_EXPORT carried no fd"
    );

    // A daemon that hangs up without answering.
    let (daemon, client_end) = pair();
    let client = tokio::task::spawn_blocking(move || client::redeem_export(&client_end, &ticket));
    let _ = server::read_request(&daemon)
        .await
        .expect("read")
        .expect("req");
    drop(daemon);
    let err = client.await.expect("client").expect_err("no answer");
    assert!(matches!(err, FdError::NoResponse), "{err}");
}

#[test]
fn frame_sizes_are_part_of_the_protocol() {
    assert_eq!(wire::REQUEST_LEN, 64);
    assert_eq!(wire::RESPONSE_LEN, 256);
    assert_eq!(wire::MAX_MESSAGE_LEN, 224);
    assert_eq!(&wire::MAGIC, b"NPFD");
    assert_eq!(wire::VERSION, 1);
}
