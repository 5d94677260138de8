//! The fd socket: a Unix socket beside the gRPC one on which tensor file descriptors travel
//! with `SCM_RIGHTS`, each exchange redeeming a one-time [`Ticket`](npu_fd::wire::Ticket) that
//! a gRPC call issued (`tickets`). Frames and fd passing are `npu_fd::wire`'s; this module
//! decides what a ticket is worth, and keeps what clients send from costing anyone else:
//!
//! - Every read takes every fd the client attached (`npu_fd::wire` makes room for a whole
//!   message's), so the kernel closes none inside a read on the I/O thread; a frame with more
//!   fds than its op takes is refused naming their count.
//! - Every fd the daemon does not keep, and every connection that may still hold some in its
//!   queue, is closed on a blocking thread, bounded per uid ([`closer`]).
//! - A connection's frames are held to a rate, and its refusals back off ([`budget`]).
//! - After ATTACH_RING the connection is the ring's lifeline and carries nothing: the first
//!   byte or fd on it ends the ring (`ring.md`, `broken` 3) and the connection.
//!
//! Each connection ends promptly when the daemon stops. A connection holds nothing of a
//! principal's but through a ticket, which the session's end forgets (revocation, expiry,
//! CloseSession: `principals`), and a ring's lifeline, which ends with its ring
//! (`Rings::stop`, called when the session's life ends) and the ring with it.

pub mod budget;
pub mod closer;
pub use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};

use std::sync::Arc;
use std::time::Instant;

use npu_fd::wire::server::{self, LifelineEnd};
use npu_fd::wire::{Op, Request, Response, Status};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

pub use self::budget::FrameBudget;
pub use self::closer::Closer;
use crate::accept::{Accepted, Acceptor, Admission, REFUSED_LIFETIME};
use crate::conn::Timeouts;
use crate::error::NpudError;
use crate::executor::{Command, ExecutorHandle};
use crate::metrics::Metrics;
use crate::service::{NpudService, RingControl};
use crate::tickets::{Grant, Issued, Tickets};

/// What every connection shares.
#[derive(Debug)]
struct Shared {
    tickets: Arc<Tickets>,
    service: NpudService,
    exec: ExecutorHandle,
    timeouts: Timeouts,
    metrics: Arc<Metrics>,
    closer: Closer,
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
    let shared = Arc::new(Shared {
        tickets,
        service,
        exec,
        timeouts,
        metrics,
        closer: Closer::default(),
    });
    loop {
        let (stream, admission) = tokio::select! {
            () = stop.cancelled() => break,
            a = acceptor.next() => a,
        };
        let Accepted::Unix(stream) = stream else {
            continue;
        };
        tokio::spawn(connection(
            shared.clone(),
            stream,
            admission,
            stop.child_token(),
        ));
    }
}

/// Serves one connection until it closes, times out, is ended, or the daemon stops (`stop`,
/// a child of the daemon's token): a request
/// being served then is answered first, so shutdown cuts off only idle connections. The
/// connection is closed on the spot when the client closed it cleanly (nothing can be left in
/// it), else by the [`Closer`] with whatever else the client sent.
async fn connection(
    shared: Arc<Shared>,
    stream: UnixStream,
    admission: Admission,
    stop: CancellationToken,
) {
    let uid = match server::peer_uid(&stream) {
        Ok(u) => Some(u),
        Err(e) => {
            tracing::warn!(error = %e, "fd socket peer without credentials");
            None
        }
    };
    let mut c = Conn {
        budget: FrameBudget::new(Instant::now()),
        received: Vec::new(),
        refused: None,
        shared: shared.clone(),
        stream,
        uid: uid.unwrap_or(u32::MAX),
        // Closed between requests when a full pool evicts it (`accept`).
        evicted: admission.evicted(),
        admission: &admission,
        stop,
    };
    let ready = server::accepted(&c.stream)
        .inspect_err(|e| tracing::warn!(error = %e, "fd socket connection"))
        .is_ok();
    let clean = match (&admission, uid) {
        (_, None) => false,
        _ if !ready => false,
        (Admission::Refused { why, .. }, Some(_)) => {
            c.refuse(why.to_string()).await;
            false
        }
        (_, Some(_)) => c.serve().await,
    };
    let Conn {
        stream,
        mut received,
        uid,
        ..
    } = c;
    if clean {
        // The client closed it after its last frame: nothing of its is left in the queue.
        drop(stream);
    } else if let Ok(s) = stream.into_std() {
        // Its queue may hold fds the client sent after the last frame read: closing it closes
        // them.
        received.push(OwnedFd::from(s));
    }
    shared.closer.close(uid, received).await;
    drop(admission);
}

/// How an exchange left the connection.
enum After {
    /// Read the next frame; the exchange was served (or refused).
    Next { served: bool },
    /// Answered (or could not be): close the connection.
    Hangup,
    /// The ring is attached: the connection is its lifeline from now on.
    Lifeline(Arc<RingControl>),
}

/// One connection.
struct Conn<'a> {
    shared: Arc<Shared>,
    stream: UnixStream,
    uid: u32,
    stop: CancellationToken,
    /// Cancelled when a full pool evicts the connection: it is closed between requests.
    evicted: CancellationToken,
    /// Its place in the connection pool.
    admission: &'a Admission,
    budget: FrameBudget,
    /// Fds the client sent that the daemon has not taken: closed by the [`Closer`] before the
    /// next frame is read.
    received: Vec<OwnedFd>,
    /// Why [`Conn::check`] refused the last fd.
    refused: Option<Response>,
}

impl Conn<'_> {
    /// Answers the first request of a connection over a limit, naming the limit.
    async fn refuse(&mut self, why: String) {
        let read = tokio::select! {
            () = self.stop.cancelled() => return,
            r = tokio::time::timeout(
                REFUSED_LIFETIME,
                server::read_request_into(&self.stream, &mut self.received),
            ) => r,
        };
        if let Ok(Ok(Some(request))) = read {
            let r = Response::error(Status::RESOURCE_EXHAUSTED, why);
            self.answer(&r, Some(request.op), None).await;
        }
    }

    /// Serves frames until the connection ends; whether the client closed it cleanly.
    async fn serve(&mut self) -> bool {
        let mut wait = self.shared.timeouts.handshake;
        loop {
            if !self.received.is_empty() {
                let fds = std::mem::take(&mut self.received);
                tokio::select! {
                    () = self.stop.cancelled() => return false,
                    () = self.shared.closer.close(self.uid, fds) => {}
                }
            }
            let pause = self.budget.next_frame(Instant::now());
            if !pause.is_zero() {
                tokio::select! {
                    () = self.stop.cancelled() => return false,
                    () = tokio::time::sleep(pause) => {}
                }
            }
            let read = tokio::select! {
                () = self.stop.cancelled() => return false,
                () = self.evicted.cancelled() => return false,
                r = tokio::time::timeout(
                    wait,
                    server::read_request_into(&self.stream, &mut self.received),
                ) => r,
            };
            wait = self.shared.timeouts.idle;
            let request = match read {
                Err(_) => {
                    tracing::debug!(
                        uid = self.uid,
                        "fd socket connection silent past its timeout; closed"
                    );
                    return false;
                }
                Ok(Ok(Some(r))) => r,
                Ok(Ok(None)) => return true,
                Ok(Err(e)) => {
                    // Out of step with the frames: answer once and hang up.
                    self.answer(&Response::from_error(&e), None, None).await;
                    return false;
                }
            };
            match self.exchange(request).await {
                After::Next { served } => self.budget.answered(served),
                After::Hangup => return false,
                After::Lifeline(ring) => {
                    // A ring's lifeline is never evicted (at most one per session).
                    self.admission.mark(crate::accept::Use::Pinned);
                    return self.lifeline(&ring).await;
                }
            }
        }
    }

    /// Sends `r` and counts it; whether it was sent.
    async fn answer(
        &self,
        r: &Response,
        op: Option<Op>,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> bool {
        self.shared.metrics.fd_exchange(
            op.map_or("UNKNOWN", op_name),
            r.status.name().unwrap_or("UNKNOWN"),
        );
        server::write_response(&self.stream, r, fd).await.is_ok()
    }

    /// Answers `r`: the connection goes on if it was sent.
    async fn next(&self, r: &Response, op: Op) -> After {
        if self.answer(r, Some(op), None).await {
            After::Next { served: r.is_ok() }
        } else {
            After::Hangup
        }
    }

    /// Serves one request.
    async fn exchange(&mut self, request: Request) -> After {
        let op = request.op;
        let issued = match self.shared.tickets.take(&request.ticket, self.uid, op) {
            Ok(i) => i,
            Err(r) => return self.next(&r, op).await,
        };
        // An IMPORT's or ATTACH_RING's fd is the last one received (read_request_into); it
        // stays in `received`, closed off the workers, unless the exchange takes it.
        let fd = match issued.grant {
            Grant::Import { .. } | Grant::Ring => self.received.pop(),
            Grant::Export => None,
        };
        match (issued.grant, fd) {
            (Grant::Export, _) => self.export(&request, issued).await,
            (Grant::Import { size }, Some(fd)) => {
                let Some(fd) = self.check(fd, size).await else {
                    self.shared.tickets.put_back(request.ticket, issued);
                    return self.refused_fd(op).await;
                };
                let r = self
                    .shared
                    .exec
                    .call(|reply| Command::AttachImport {
                        session: issued.session,
                        tensor: issued.tensor,
                        fd,
                        reply,
                    })
                    .await;
                match r {
                    Ok(()) => {
                        tracing::debug!(tensor = issued.tensor, uid = self.uid, "imported a memfd");
                        self.next(&Response::ok(), op).await
                    }
                    Err(e) => {
                        self.shared.tickets.put_back(request.ticket, issued);
                        self.next(&refusal(&e), op).await
                    }
                }
            }
            (Grant::Ring, Some(fd)) => {
                let size = npu_fd::ring::RING_BYTES as u64;
                let Some(fd) = self.check(fd, size).await else {
                    self.shared.tickets.put_back(request.ticket, issued);
                    return self.refused_fd(op).await;
                };
                match self.shared.service.start_ring(issued.session, fd).await {
                    Err(e) => {
                        self.shared.tickets.put_back(request.ticket, issued);
                        self.next(&refusal(&e), op).await
                    }
                    Ok(ring) => {
                        if self.answer(&Response::ok(), Some(op), None).await {
                            After::Lifeline(ring)
                        } else {
                            ring.stop();
                            After::Hangup
                        }
                    }
                }
            }
            (Grant::Import { .. } | Grant::Ring, None) => {
                // read_request_into guarantees an IMPORT or ATTACH_RING frame carries an fd.
                let r = Response::error(Status::MALFORMED, format!("{op} came without an fd"));
                self.answer(&r, Some(op), None).await;
                After::Hangup
            }
        }
    }

    async fn export(&mut self, request: &Request, issued: Issued) -> After {
        let r = self
            .shared
            .exec
            .call(|reply| Command::Export {
                session: issued.session,
                tensor: issued.tensor,
                reply,
            })
            .await;
        match r {
            Ok((fd, offset, size)) => {
                tracing::debug!(
                    tensor = issued.tensor,
                    uid = self.uid,
                    "exported a tensor's fd"
                );
                let r = Response::exported(offset, size);
                if self.answer(&r, Some(request.op), Some(fd.as_fd())).await {
                    After::Next { served: true }
                } else {
                    After::Hangup
                }
            }
            Err(e) => {
                self.shared.tickets.put_back(request.ticket, issued);
                self.next(&refusal(&e), request.op).await
            }
        }
    }

    /// Checks a memfd the client sent as an import of `size` bytes: `fstat` and `fcntl` on an
    /// fd the client chose (a file on a FUSE mount it serves answers when it likes), so on a
    /// blocking thread, one at a time per connection. A refused fd goes to `received` (to be
    /// closed off the workers), and its refusal to `self.refused`.
    async fn check(&mut self, fd: OwnedFd, size: u64) -> Option<OwnedFd> {
        let checked = tokio::task::spawn_blocking(move || {
            let r = npu_fd::memfd::check_import(fd.as_fd(), size);
            (fd, r)
        })
        .await;
        let Ok((fd, checked)) = checked else {
            self.refused = Some(Response::error(
                Status::INTERNAL,
                "the daemon's check of the fd did not finish",
            ));
            return None;
        };
        match checked {
            Ok(_) => Some(fd),
            Err(e) => {
                tracing::info!(uid = self.uid, error = %e, "refused an fd a client sent");
                self.received.push(fd);
                self.refused = Some(Response::from_error(&e));
                None
            }
        }
    }

    /// Answers the refusal [`Conn::check`] found.
    async fn refused_fd(&mut self, op: Op) -> After {
        let r = self
            .refused
            .take()
            .unwrap_or_else(|| Response::error(Status::INTERNAL, "the fd was refused"));
        self.next(&r, op).await
    }

    /// Holds a ring's lifeline until the client closes it, the ring's port finishes (the
    /// session ended, the client broke the ring), the connection is ended or the daemon
    /// stops; then stops the ring. A lifeline carries nothing: the first byte or fd on it
    /// ends the ring (`broken` 3) with one read, whatever else the client keeps sending.
    /// Whether the client closed it cleanly.
    async fn lifeline(&mut self, ring: &RingControl) -> bool {
        let end = tokio::select! {
            () = self.stop.cancelled() => None,
            () = ring.finished() => None,
            r = server::watch_lifeline(&self.stream, &mut self.received) => Some(r),
        };
        match end {
            Some(Ok(LifelineEnd::Closed)) => {
                ring.stop();
                true
            }
            Some(Ok(LifelineEnd::Sent { bytes, fds })) => {
                tracing::info!(
                    uid = self.uid,
                    bytes,
                    fds,
                    "a client sent bytes on its dispatch ring's lifeline, which carries none; \
                     the ring is torn down"
                );
                ring.break_lifeline();
                false
            }
            Some(Err(_)) | None => {
                ring.stop();
                false
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
