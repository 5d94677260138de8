//! The fd socket: a Unix socket beside the gRPC one on which tensor file descriptors travel
//! with `SCM_RIGHTS`, each exchange redeeming a one-time [`Ticket`] that a gRPC call issued.
//!
//! A ticket is bound to a session, a tensor, the peer uid of the gRPC connection that asked
//! for it, and an operation (export or import), and expires after [`TICKET_TTL`]. It is
//! consumed by a successful exchange; a refused import (an unsealed memfd, a wrong size, not a
//! memfd) keeps it, so the client can send a fixed memfd, and the tensor stays awaiting its
//! import. Frames and fd passing are `npu_fd::wire`'s; this module decides what a ticket is
//! worth.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use npu_fd::wire::{Op, Response, Status, Ticket, server};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::error::NpudError;
use crate::executor::{Command, ExecutorHandle};

/// How long a ticket may wait to be redeemed.
pub const TICKET_TTL: Duration = Duration::from_secs(60);

/// What a ticket lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Receive the fd of a daemon-allocated tensor.
    Export,
    /// Send a memfd of exactly `size` bytes for a declared tensor.
    Import { size: u64 },
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
#[derive(Debug, Default)]
pub struct Tickets {
    map: Mutex<HashMap<Ticket, Issued>>,
}

impl Tickets {
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
                expires: now + TICKET_TTL,
            },
        );
        Ok(ticket)
    }

    /// Looks a ticket up for `op` by `uid`, without consuming it.
    fn check(&self, ticket: &Ticket, uid: u32, op: Op) -> Result<Issued, Response> {
        let g = self.lock();
        let issued = g
            .get(ticket)
            .filter(|i| i.expires > Instant::now())
            .copied()
            .ok_or_else(|| {
                Response::error(
                    Status::UNKNOWN_TICKET,
                    "unknown ticket: it was never issued, has expired (60 s) or was already redeemed",
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
        };
        if expected != op {
            return Err(Response::error(
                Status::WRONG_OP,
                format!("the ticket is for {expected}, not {op}"),
            ));
        }
        Ok(issued)
    }

    fn consume(&self, ticket: &Ticket) {
        self.lock().remove(ticket);
    }

    /// Drops the tickets of an ended session.
    pub fn forget_session(&self, session: u64) {
        self.lock().retain(|_, i| i.session != session);
    }
}

/// Serves the fd socket until `stop` is cancelled.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    tickets: Arc<Tickets>,
    exec: ExecutorHandle,
    stop: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, socket = %path.display(), "accepting on the fd socket failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let tickets = tickets.clone();
        let exec = exec.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = connection(stream, tickets, exec) => {}
            }
        });
    }
}

async fn connection(stream: UnixStream, tickets: Arc<Tickets>, exec: ExecutorHandle) {
    let uid = match server::peer_uid(&stream) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "fd socket peer without credentials");
            return;
        }
    };
    loop {
        let (request, fd) = match server::read_request(&stream).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                // Out of step with the frames: answer once and hang up.
                let _ = server::write_response(&stream, &Response::from_error(&e), None).await;
                return;
            }
        };
        let issued = match tickets.check(&request.ticket, uid, request.op) {
            Ok(i) => i,
            Err(resp) => {
                if server::write_response(&stream, &resp, None).await.is_err() {
                    return;
                }
                continue;
            }
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
                        tickets.consume(&request.ticket);
                        tracing::debug!(tensor = issued.tensor, uid, "exported a tensor's fd");
                        server::write_response(
                            &stream,
                            &Response::exported(offset, size),
                            Some(fd.as_fd()),
                        )
                        .await
                    }
                    Err(e) => server::write_response(&stream, &refusal(&e), None).await,
                }
            }
            (Grant::Import { size }, Some(fd)) => {
                match npu_fd::memfd::check_import(fd.as_fd(), size) {
                    Err(e) => {
                        tracing::info!(tensor = issued.tensor, error = %e, "refused an imported fd");
                        server::write_response(&stream, &Response::from_error(&e), None).await
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
                                tickets.consume(&request.ticket);
                                tracing::debug!(tensor = issued.tensor, uid, "imported a memfd");
                                server::write_response(&stream, &Response::ok(), None).await
                            }
                            Err(e) => server::write_response(&stream, &refusal(&e), None).await,
                        }
                    }
                }
            }
            (Grant::Import { .. }, None) => {
                // read_request guarantees an IMPORT frame carries an fd.
                let r = Response::error(Status::MALFORMED, "IMPORT came without an fd");
                server::write_response(&stream, &r, None).await
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

fn refusal(e: &NpudError) -> Response {
    let status = match e {
        NpudError::NotFound(_) => Status::UNKNOWN_TICKET,
        _ => Status::INTERNAL,
    };
    // The frame keeps the first 224 bytes of the message.
    Response::error(status, e.message())
}
