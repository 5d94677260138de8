//! A pipeline's dispatch sent from the calling thread: [`Client::queue_now`] publishes it on
//! the session's dispatch ring as a queued slot (a `Submit` stream's item, see
//! [`crate::Pipeline`]) and returns a [`Queued`] that owns its arguments until the daemon
//! answers. For a caller that keeps its tensors in guards of its own rather than borrows (the
//! Python package's pipeline): no future, runtime or thread stands between it and the ring.
//!
//! The arguments stay with the [`Queued`], and the tensors it may write stay lent to the
//! daemon, until [`Queued::wait_now`] or [`Queued::wait`] has its answer. A [`Queued`] dropped
//! before that leaves them lent for good, as a [`crate::Pipeline`] dropped in flight does: the
//! daemon still runs the dispatch.

use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::dispatch::DispatchResult;
use crate::error::ClientError;
use crate::fastpath::{FastPath, RingMiss};
use crate::program::Program;
use crate::tensor::{RawTensor, TensorArg};

/// What a [`Queued`] dispatch holds until it is answered: its arguments, the ones the design
/// only reads first, then the ones it may write, in the design's order (as
/// [`Client::dispatch`] takes them). `args` must name the same tensors each time it is called.
pub trait HeldArgs: Send {
    /// The reads, then the writes.
    fn args(&mut self) -> (Vec<&dyn TensorArg>, Vec<&mut dyn TensorArg>);
}

/// A dispatch on the session's ring, not yet answered; see the module documentation.
#[derive(Debug)]
pub struct Queued<A: HeldArgs> {
    client: Client,
    fp: Arc<FastPath>,
    ring_id: u64,
    index: u32,
    /// `None` only once [`Queued::into_args`] took them.
    args: Option<A>,
    /// The answer came: the writes are taken back.
    answered: bool,
}

impl Client {
    /// Sends `program` over `args` on the session's ring as a pipeline's dispatch, from the
    /// calling thread, and returns at once. `Err((args, None))`, having sent nothing, when it
    /// cannot send at once: no ring (or a daemon without queued slots), a program not
    /// registered in this session yet, a staged tensor, more arguments than a slot holds, or
    /// the ring busy or full; the caller then dispatches another way, after what it has in
    /// flight on the ring, to keep their order. `Err((args, Some(e)))` for what
    /// [`Client::dispatch`] refuses before sending (a tensor of another session, too many
    /// reads).
    ///
    /// # Errors
    ///
    /// As above; the daemon's answer comes from [`Queued::wait_now`] or [`Queued::wait`].
    #[allow(clippy::result_large_err)]
    pub fn queue_now<A: HeldArgs>(
        &self,
        program: &Program,
        mut args: A,
    ) -> Result<Queued<A>, (A, Option<ClientError>)> {
        let Some(fp) = self.inner.fast_path().filter(|fp| fp.queues()) else {
            return Err((args, None));
        };
        let req = {
            let (reads, mut writes) = args.args();
            let mut writes: Vec<&mut RawTensor> = writes.iter_mut().map(|a| a.raw_mut()).collect();
            let all: Vec<&RawTensor> = reads
                .iter()
                .map(|a| a.raw())
                .chain(writes.iter().map(|w| &**w))
                .collect();
            let req = self.ring_request(program, &all, reads.len());
            drop(all);
            if let Some(Ok(_)) = req {
                // Lent before the slot is published: the daemon may write them as soon as it
                // has it.
                for w in &mut writes {
                    w.lend();
                }
            }
            req
        };
        let req = match req {
            None => return Err((args, None)),
            Some(Err(e)) => return Err((args, Some(e))),
            Some(Ok(req)) => req,
        };
        match fp.submit_queued_now(&req) {
            Ok((ring_id, index)) => Ok(Queued {
                client: self.clone(),
                fp,
                ring_id,
                index,
                args: Some(args),
                answered: false,
            }),
            Err(_) => {
                reclaim(&mut args);
                Err((args, None))
            }
        }
    }
}

impl Client {
    /// Whether `program` is registered in this session already (so [`Client::queue_now`] can
    /// send it at once).
    #[must_use]
    pub fn is_registered(&self, program: &Program) -> bool {
        self.inner.programs.id_now(program.key()).is_some()
    }
}

/// Takes back the tensors `args` may write, once the daemon is done with them (or never had
/// them).
fn reclaim(args: &mut impl HeldArgs) {
    let (_, mut writes) = args.args();
    for w in &mut writes {
        w.raw_mut().reclaim();
    }
}

impl<A: HeldArgs> Queued<A> {
    /// Waits on the calling thread for the daemon's answer (spinning briefly, then parked until
    /// the ring's thread wakes it), for at most `timeout`: `None` if it has not come by then
    /// (the dispatch is still in flight: wait again). Once it has, the written tensors are
    /// taken back and [`Queued::into_args`] returns the arguments.
    ///
    /// # Errors
    ///
    /// In `Some`: the daemon's refusal or the device's failure (`ClientError::Daemon` for the
    /// `Submit` call, as a [`crate::Pipeline`]'s completion), or the ring closing with the
    /// dispatch taken and unanswered.
    pub fn wait_now(&mut self, timeout: Duration) -> Option<Result<DispatchResult, ClientError>> {
        match self.fp.wait_now(self.ring_id, self.index, timeout) {
            Err(RingMiss::TimedOut | RingMiss::Interrupted) => None,
            r => Some(self.answer(r)),
        }
    }

    /// [`Queued::wait_now`] as a future, without a timeout.
    ///
    /// # Errors
    ///
    /// As [`Queued::wait_now`].
    pub async fn wait(&mut self) -> Result<DispatchResult, ClientError> {
        let r = self.fp.wait_kept(self.ring_id, self.index).await;
        self.answer(r)
    }

    /// Whether the answer came (the written tensors are taken back).
    #[must_use]
    pub fn is_answered(&self) -> bool {
        self.answered
    }

    /// The arguments. Before the answer came, the dispatch is left to the daemon, and the
    /// tensors it may write stay lent for good.
    ///
    /// # Panics
    ///
    /// Never: the arguments are taken only here, which consumes the `Queued`.
    pub fn into_args(mut self) -> A {
        self.args
            .take()
            .expect("a Queued holds its arguments until into_args")
    }

    fn answer(
        &mut self,
        r: Result<npu_fd::ring::Completion, RingMiss>,
    ) -> Result<DispatchResult, ClientError> {
        let address = || self.client.address().to_string();
        let r = match r {
            Ok(c) => crate::pipeline::ring_result(c),
            // Taken and unanswered: the daemon may still write what it was lent.
            Err(RingMiss::Lost(why)) => {
                return Err(ClientError::Connect {
                    address: address(),
                    message: format!("Submit: {why}"),
                });
            }
            Err(RingMiss::NotTaken | RingMiss::TimedOut | RingMiss::Interrupted) => {
                Err(ClientError::Connect {
                    address: address(),
                    message:
                        "Submit: the dispatch ring closed before the daemon took the dispatch \
                          (it did not run)"
                            .into(),
                })
            }
        };
        if let Some(a) = &mut self.args {
            reclaim(a);
        }
        self.answered = true;
        r
    }
}

impl<A: HeldArgs> Drop for Queued<A> {
    /// Unanswered, the request is left to the daemon (its completion is dropped when it comes)
    /// and the written tensors stay lent.
    fn drop(&mut self) {
        if !self.answered {
            self.fp.abandon(self.ring_id);
        }
    }
}
