//! The fd socket: a Unix socket beside the gRPC one on which tensor file descriptors travel
//! with `SCM_RIGHTS`, each exchange redeeming a one-time [`Ticket`] that a gRPC call issued.
//!
//! A ticket is bound to a session, a tensor, the peer uid of the gRPC connection that asked
//! for it, and an operation (export or import), and expires after [`TICKET_TTL`]. Redeeming
//! takes it out of the table in one step under the table's lock ([`Tickets::take`]), so of
//! two redeems of one ticket racing on two connections exactly one gets it; the other is
//! told the ticket is unknown. A refused import (an unsealed memfd, a wrong size, not a
//! memfd) puts it back, so the client can send a fixed memfd, and the tensor stays awaiting
//! its import. Expired tickets leave the table at the next issue and at every
//! [`Tickets::sweep`] (the session reaper's tick), whether or not anything is issued again. Frames and fd passing are `npu_fd::wire`'s; this module decides what a ticket is
//! worth.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use npu_fd::wire::{Op, Response, Status, Ticket, server};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use crate::accept::{Accepted, Acceptor, Admission, REFUSED_LIFETIME};
use crate::conn::Timeouts;
use crate::error::NpudError;
use crate::executor::{Command, ExecutorHandle};
use crate::metrics::Metrics;
use crate::service::{NpudService, RingControl};

/// How long a ticket may wait to be redeemed.
pub const TICKET_TTL: Duration = Duration::from_secs(60);

/// What a ticket lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Receive the fd of a daemon-allocated tensor.
    Export,
    /// Send a memfd of exactly `size` bytes for a declared tensor.
    Import { size: u64 },
    /// Send the memfd of the session's dispatch ring (`npu_fd::ring::RING_BYTES`).
    Ring,
}

#[derive(Debug, Clone, Copy)]
struct Issued {
    session: u64,
    uid: u32,
    tensor: u64,
    grant: Grant,
    expires: Instant,
}

/// Outstanding tickets.
#[derive(Debug)]
pub struct Tickets {
    map: Mutex<HashMap<Ticket, Issued>>,
    ttl: Duration,
}

impl Default for Tickets {
    fn default() -> Self {
        Self::with_ttl(TICKET_TTL)
    }
}

impl Tickets {
    /// Tickets that expire `ttl` after they are issued.
    pub fn with_ttl(ttl: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Ticket, Issued>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Issues a ticket for `tensor` of `session` to the user `uid`.
    ///
    /// # Errors
    /// INTERNAL when the kernel gives no random bytes.
    pub fn issue(
        &self,
        session: u64,
        uid: u32,
        tensor: u64,
        grant: Grant,
    ) -> Result<Ticket, NpudError> {
        let ticket = Ticket::random().map_err(|e| NpudError::Internal(e.to_string()))?;
        let now = Instant::now();
        let mut g = self.lock();
        g.retain(|_, i| i.expires > now);
        g.insert(
            ticket,
            Issued {
                session,
                uid,
                tensor,
                grant,
                expires: now + self.ttl,
            },
        );
        Ok(ticket)
    }

    /// Checks a ticket for `op` by `uid` and takes it out of the table, in one step under
    /// the lock: of concurrent redeems of one ticket, one gets it and the rest are refused
    /// as unknown. A ticket refused for another uid or op stays.
    fn take(&self, ticket: &Ticket, uid: u32, op: Op) -> Result<Issued, Response> {
        let mut g = self.lock();
        let issued = g
            .get(ticket)
            .filter(|i| i.expires > Instant::now())
            .copied()
            .ok_or_else(|| {
                Response::error(
                    Status::UNKNOWN_TICKET,
                    "unknown ticket: it was never issued, has expired (60 s) or was already \
                     redeemed (or is being redeemed on another connection)",
                )
            })?;
        if issued.uid != uid {
            return Err(Response::error(
                Status::WRONG_UID,
                format!(
                    "the ticket was issued to uid {}; this peer is uid {uid}",
                    issued.uid
                ),
            ));
        }
        let expected = match issued.grant {
            Grant::Export => Op::RedeemExport,
            Grant::Import { .. } => Op::Import,
            Grant::Ring => Op::AttachRing,
        };
        if expected != op {
            return Err(Response::error(
                Status::WRONG_OP,
                format!("the ticket is for {expected}, not {op}"),
            ));
        }
        g.remove(ticket);
        Ok(issued)
    }

    /// Puts back a ticket whose exchange was refused (a memfd that failed the import
    /// checks), so the client can try again with a fixed one, unless it has expired.
    fn put_back(&self, ticket: Ticket, issued: Issued) {
        if issued.expires > Instant::now() {
            self.lock().insert(ticket, issued);
        }
    }

    /// Drops the tickets that have expired; returns how many.
    pub fn sweep(&self, now: Instant) -> usize {
        let mut g = self.lock();
        let before = g.len();
        g.retain(|_, i| i.expires > now);
        before - g.len()
    }

    /// Outstanding tickets.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no ticket is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the tickets of an ended session.
    pub fn forget_session(&self, session: u64) {
        self.lock().retain(|_, i| i.session != session);
    }
}

/// Serves the fd socket until `stop` is cancelled.
///
/// Each connection must send its first frame within `limits.handshake_timeout_ms` and each
/// later one within `limits.idle_timeout_ms`, or it is closed. A connection over a
/// connection limit (or accepted while the daemon is out of descriptors) gets its first
/// request answered with RESOURCE_EXHAUSTED naming the limit, and is closed.
pub async fn serve(
    mut acceptor: Acceptor,
    tickets: Arc<Tickets>,
    service: NpudService,
    exec: ExecutorHandle,
    timeouts: Timeouts,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    loop {
        let (stream, admission) = tokio::select! {
            () = stop.cancelled() => break,
            a = acceptor.next() => a,
        };
        let Accepted::Unix(stream) = stream else {
            continue;
        };
        let tickets = tickets.clone();
        let exec = exec.clone();
        tokio::spawn(connection(
            stream,
            admission,
            tickets,
            service.clone(),
            exec,
            timeouts,
            metrics.clone(),
            stop.clone(),
        ));
    }
}

/// Serves one connection until it closes, times out, or the daemon stops: a request being
/// served when `stop` comes is answered first, so shutdown cuts off only idle connections.
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: UnixStream,
    admission: Admission,
    tickets: Arc<Tickets>,
    service: NpudService,
    exec: ExecutorHandle,
    timeouts: Timeouts,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let respond = |r: &Response, op: Option<Op>| {
        metrics.fd_exchange(
            op.map_or("UNKNOWN", op_name),
            r.status.name().unwrap_or("UNKNOWN"),
        );
    };
    // Fds the client sent that the daemon has not taken: closed off the async workers.
    let mut received = Received::default();
    if let Admission::Refused { why, .. } = &admission {
        // Read the request so the client reads the answer.
        let read = tokio::time::timeout(
            REFUSED_LIFETIME,
            server::read_request_into(&stream, &mut received.0),
        )
        .await;
        if let Ok(Ok(Some(request))) = read {
            let r = Response::error(Status::RESOURCE_EXHAUSTED, why.to_string());
            respond(&r, Some(request.op));
            let _ = server::write_response(&stream, &r, None).await;
        }
        return;
    }
    let uid = match server::peer_uid(&stream) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "fd socket peer without credentials");
            return;
        }
    };
    let mut wait = timeouts.handshake;
    // Closed between requests when a full pool evicts it (`accept`).
    let evicted = admission.evicted();
    loop {
        received.close().await;
        let read = tokio::select! {
            () = stop.cancelled() => return,
            () = evicted.cancelled() => return,
            r = tokio::time::timeout(wait, server::read_request_into(&stream, &mut received.0)) => r,
        };
        wait = timeouts.idle;
        let request = match read {
            Err(_) => {
                tracing::debug!(uid, "fd socket connection silent past its timeout; closed");
                return;
            }
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                // Out of step with the frames: answer once and hang up.
                let r = Response::from_error(&e);
                respond(&r, None);
                let _ = server::write_response(&stream, &r, None).await;
                return;
            }
        };
        let issued = match tickets.take(&request.ticket, uid, request.op) {
            Ok(i) => i,
            Err(resp) => {
                respond(&resp, Some(request.op));
                if server::write_response(&stream, &resp, None).await.is_err() {
                    return;
                }
                continue;
            }
        };
        // An IMPORT's fd is the last one received (read_request_into); it stays in
        // `received`, closed off the workers, unless the import takes it.
        let fd = match issued.grant {
            Grant::Import { .. } | Grant::Ring => received.0.pop(),
            Grant::Export => None,
        };
        let sent = match (issued.grant, fd) {
            (Grant::Export, _) => {
                let r = exec
                    .call(|reply| Command::Export {
                        session: issued.session,
                        tensor: issued.tensor,
                        reply,
                    })
                    .await;
                match r {
                    Ok((fd, offset, size)) => {
                        tracing::debug!(tensor = issued.tensor, uid, "exported a tensor's fd");
                        let r = Response::exported(offset, size);
                        respond(&r, Some(request.op));
                        server::write_response(&stream, &r, Some(fd.as_fd())).await
                    }
                    Err(e) => {
                        tickets.put_back(request.ticket, issued);
                        let r = refusal(&e);
                        respond(&r, Some(request.op));
                        server::write_response(&stream, &r, None).await
                    }
                }
            }
            (Grant::Import { size }, Some(fd)) => {
                // fstat and fcntl on an fd the client chose (a file on a FUSE mount it
                // serves answers when it likes): on a blocking thread, one at a time per
                // connection.
                let checked = tokio::task::spawn_blocking(move || {
                    let r = npu_fd::memfd::check_import(fd.as_fd(), size);
                    (fd, r)
                })
                .await;
                let Ok((fd, checked)) = checked else {
                    return;
                };
                match checked {
                    Err(e) => {
                        tracing::info!(tensor = issued.tensor, error = %e, "refused an imported fd");
                        received.0.push(fd);
                        tickets.put_back(request.ticket, issued);
                        let r = Response::from_error(&e);
                        respond(&r, Some(request.op));
                        server::write_response(&stream, &r, None).await
                    }
                    Ok(_) => {
                        let r = exec
                            .call(|reply| Command::AttachImport {
                                session: issued.session,
                                tensor: issued.tensor,
                                fd,
                                reply,
                            })
                            .await;
                        match r {
                            Ok(()) => {
                                tracing::debug!(tensor = issued.tensor, uid, "imported a memfd");
                                let r = Response::ok();
                                respond(&r, Some(request.op));
                                server::write_response(&stream, &r, None).await
                            }
                            Err(e) => {
                                tickets.put_back(request.ticket, issued);
                                let r = refusal(&e);
                                respond(&r, Some(request.op));
                                server::write_response(&stream, &r, None).await
                            }
                        }
                    }
                }
            }
            (Grant::Ring, Some(fd)) => {
                let size = npu_fd::ring::RING_BYTES as u64;
                let checked = tokio::task::spawn_blocking(move || {
                    let r = npu_fd::memfd::check_import(fd.as_fd(), size);
                    (fd, r)
                })
                .await;
                let Ok((fd, checked)) = checked else {
                    return;
                };
                let started = match checked {
                    Err(e) => Err(Response::from_error(&e)),
                    Ok(_) => service
                        .start_ring(issued.session, fd)
                        .await
                        .map_err(|e| refusal(&e)),
                };
                match started {
                    Err(r) => {
                        tickets.put_back(request.ticket, issued);
                        respond(&r, Some(request.op));
                        server::write_response(&stream, &r, None).await
                    }
                    Ok(ring) => {
                        let r = Response::ok();
                        respond(&r, Some(request.op));
                        if server::write_response(&stream, &r, None).await.is_ok() {
                            // A ring's lifeline is never evicted (at most one per session).
                            admission.mark(crate::accept::Use::Pinned);
                            lifeline(&stream, &ring, &stop).await;
                        }
                        ring.stop();
                        return;
                    }
                }
            }
            (Grant::Import { .. } | Grant::Ring, None) => {
                // read_request guarantees an IMPORT frame carries an fd.
                let r = Response::error(Status::MALFORMED, "IMPORT came without an fd");
                respond(&r, Some(request.op));
                server::write_response(&stream, &r, None).await
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Fds a client sent that the daemon did not keep. Closing one can block for as long as the
/// client wants (the last close of a TCP socket with `SO_LINGER` and unsent data; a file on a
/// FUSE mount the client serves, whose FLUSH it answers late), so they are closed on a
/// blocking thread: [`Received::close`] waits for it (a connection has at most one such close
/// at a time, and connections are limited per peer), and drop hands whatever is left to one
/// without waiting.
#[derive(Debug, Default)]
struct Received(Vec<OwnedFd>);

impl Received {
    async fn close(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let fds = std::mem::take(&mut self.0);
        let _ = tokio::task::spawn_blocking(move || drop(fds)).await;
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let fds = std::mem::take(&mut self.0);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || drop(fds));
            }
            Err(_) => drop(fds),
        }
    }
}

/// Holds a ring's fd-socket connection, its lifeline, until the client closes it, the ring's
/// reader finishes (the session ended, the client broke the ring) or the daemon stops. Bytes
/// the client sends on it are read and ignored (fds that come with them are closed by the
/// kernel: a plain read takes none).
async fn lifeline(stream: &UnixStream, ring: &RingControl, stop: &CancellationToken) {
    let mut buf = [0_u8; 256];
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = ring.finished() => return,
            r = stream.readable() => {
                if r.is_err() {
                    return;
                }
                match stream.try_read(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        }
    }
}

/// An op's name on the wire, as metrics label it.
fn op_name(op: Op) -> &'static str {
    match op {
        Op::RedeemExport => "REDEEM_EXPORT",
        Op::Import => "IMPORT",
        Op::AttachRing => "ATTACH_RING",
    }
}

/// The fd-socket status for a refusal of the executor's: one status per kind of refusal.
fn refusal(e: &NpudError) -> Response {
    let status = match e {
        NpudError::NotFound(_) => Status::TENSOR_GONE,
        NpudError::FailedPrecondition(_) | NpudError::InvalidArgument(_) => Status::TENSOR_STATE,
        NpudError::ResourceExhausted(_) => Status::RESOURCE_EXHAUSTED,
        NpudError::Unavailable(_) | NpudError::DeadlineExceeded(_) => Status::UNAVAILABLE,
        NpudError::PermissionDenied(_) | NpudError::Unauthenticated(_) => Status::WRONG_UID,
        NpudError::Internal(_) | NpudError::OutcomeUnknown(_) => Status::INTERNAL,
    };
    // The frame keeps the first 224 bytes of the message.
    Response::error(status, e.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_taken_once_and_expired_ones_are_swept_without_a_new_issue() {
        let t = Tickets::with_ttl(Duration::from_millis(50));
        let a = t.issue(1, 1000, 7, Grant::Export).unwrap();
        let b = t.issue(1, 1000, 8, Grant::Export).unwrap();
        assert_eq!(t.len(), 2);
        // Another uid or op is refused and leaves it in place.
        assert_eq!(
            t.take(&a, 1001, Op::RedeemExport).unwrap_err().status,
            Status::WRONG_UID
        );
        assert_eq!(
            t.take(&a, 1000, Op::Import).unwrap_err().status,
            Status::WRONG_OP
        );
        assert_eq!(t.take(&a, 1000, Op::RedeemExport).unwrap().tensor, 7);
        assert_eq!(
            t.take(&a, 1000, Op::RedeemExport).unwrap_err().status,
            Status::UNKNOWN_TICKET
        );
        assert_eq!(t.len(), 1);
        // b is never redeemed: a sweep after its lifetime frees it, with nothing issued since.
        assert_eq!(t.sweep(Instant::now()), 0);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.sweep(Instant::now()), 1);
        assert!(t.is_empty());
        assert_eq!(
            t.take(&b, 1000, Op::RedeemExport).unwrap_err().status,
            Status::UNKNOWN_TICKET
        );
    }

    #[test]
    fn every_executor_refusal_has_its_own_status() {
        let cases = [
            (NpudError::NotFound("x".into()), Status::TENSOR_GONE),
            (
                NpudError::FailedPrecondition("x".into()),
                Status::TENSOR_STATE,
            ),
            (
                NpudError::ResourceExhausted("x".into()),
                Status::RESOURCE_EXHAUSTED,
            ),
            (NpudError::Unavailable("x".into()), Status::UNAVAILABLE),
            (NpudError::Internal("x".into()), Status::INTERNAL),
        ];
        for (e, want) in cases {
            assert_eq!(refusal(&e).status, want, "{e:?}");
        }
    }
}
