//! A `Pipeline` on the session's dispatch ring, driven from the Python thread: each submission
//! locks its tensors and writes its slot on the calling thread (npu-client's
//! `Client::queue_now`), and `next_completion` waits for the oldest on the calling thread, so
//! no runtime thread stands between Python and the ring (the `Submit`-stream pipeline of
//! [`crate::batch`] hands every submission to one).
//!
//! The contract is the stream pipeline's: ids in submission order, completions in that order,
//! at most `depth` in flight, each submission taking its tensors in submission order (a tensor
//! one in flight holds is taken once that one has completed). What the ring cannot take at
//! once (more arguments than a slot holds, the ring busy or full or closed) runs as a plain
//! dispatch after everything in flight has completed, so the order holds.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use npu_client::{ClientError, HeldArgs, Program as NativeProgram, Queued, TensorArg};
use pyo3::PyResult;

use crate::batch::Done;
use crate::tensor::{Held, Shared};
use crate::work::{Few, Timing, dispatch_held, in_order, lock_args, split, timing, try_lock_args};

/// How long one wait for a completion lasts before Python's signals are looked at.
pub(crate) const WAIT_SLICE: Duration = crate::runtime::SIGNAL_SLICE;

/// A submission's locked arguments, in the design's order: by position, so the ones the
/// design only reads (shared) come before the ones it may write (held alone), as [`split`]
/// needs.
pub(crate) struct Args(Few<Held>);

impl HeldArgs for Args {
    fn args(&mut self) -> (Vec<&dyn TensorArg>, Vec<&mut dyn TensorArg>) {
        // In position order a read never follows a write, so the split cannot fail.
        split(&mut self.0).unwrap_or_default()
    }
}

/// A submission: in flight on the ring, or answered.
pub(crate) enum Entry {
    Flying(Queued<Args>),
    Ready(Result<Timing, ClientError>),
}

/// The pipeline's state: its submissions not yet returned, oldest first.
pub(crate) struct RingPipe {
    pub(crate) client: npu_client::Client,
    pub(crate) depth: usize,
    state: Mutex<State>,
    /// The process that made it: a forked child must not touch the ring it shares.
    pid: u32,
}

/// Submissions are numbered in order and returned from the front, so the entry of id `k` is
/// at `k − (the front's id)`.
#[derive(Default)]
struct State {
    next_id: u64,
    entries: VecDeque<(u64, Entry)>,
    /// Ids of the entries in flight, oldest first.
    flying: VecDeque<u64>,
}

impl State {
    fn flying(&self) -> usize {
        self.flying.len()
    }

    fn push(&mut self, e: Entry) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        if matches!(e, Entry::Flying(_)) {
            self.flying.push_back(id);
        }
        self.entries.push_back((id, e));
        id
    }

    /// Waits on this thread for the oldest submission in flight; `Err` with the exception a
    /// signal handler raised meanwhile (the submission stays in flight).
    fn complete_oldest(&mut self) -> PyResult<()> {
        let Some(id) = self.flying.pop_front() else {
            return Ok(());
        };
        let front = self.entries.front().map_or(id, |(f, _)| *f);
        if let Some((_, e)) = id
            .checked_sub(front)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.entries.get_mut(i))
            && let Err(e) = complete_now(e)
        {
            self.flying.push_front(id);
            return Err(e);
        }
        Ok(())
    }

    /// The oldest submission, taken out (no longer counted in flight).
    fn pop(&mut self) -> Option<(u64, Entry)> {
        let (id, e) = self.entries.pop_front()?;
        if self.flying.front() == Some(&id) {
            self.flying.pop_front();
        }
        Some((id, e))
    }
}

/// Waits on this thread until `e` is answered, looking at Python's signals after each
/// [`WAIT_SLICE`]: `Err` with the exception a handler raised (Ctrl-C), `e` still in flight.
fn complete_now(e: &mut Entry) -> PyResult<()> {
    if let Entry::Flying(q) = e {
        let r = loop {
            if let Some(r) = q.wait_now(WAIT_SLICE) {
                break r;
            }
            if let Some(raised) = crate::runtime::signalled() {
                return Err(raised);
            }
        };
        *e = Entry::Ready(r.map(timing));
    }
    Ok(())
}

impl RingPipe {
    pub(crate) fn new(client: npu_client::Client, depth: usize) -> RingPipe {
        RingPipe {
            client,
            depth,
            state: Mutex::new(State::default()),
            pid: crate::runtime::pid(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends one dispatch (its program registered) and returns its id; its refusal, if any,
    /// is its completion. Blocks while `depth` are in flight, or while a tensor it names is
    /// held elsewhere. Call without the GIL.
    ///
    /// # Errors
    ///
    /// The exception a signal handler raised while it waited (Ctrl-C): nothing was sent.
    pub(crate) fn submit(
        &self,
        rt: &tokio::runtime::Runtime,
        program: &NativeProgram,
        args: &[Arc<Shared>],
    ) -> PyResult<u64> {
        let mut st = self.lock();
        while st.flying() >= self.depth {
            st.complete_oldest()?;
        }
        let reads = program.read_only_args();
        // The tensors, in submission order: one this pipeline holds comes back when the
        // submission holding it completes; one held elsewhere is waited for.
        let locked = loop {
            if let Some(l) = try_lock_args(args, reads) {
                break l;
            }
            if st.flying() == 0 {
                break crate::runtime::block_on_checking(rt, lock_args(args, reads))?;
            }
            st.complete_oldest()?;
        };
        // By position: the reads (shared) first, then the writes (held alone).
        let held = match in_order(locked) {
            Ok(h) => h,
            Err(e) => return Ok(st.push(Entry::Ready(Err(e)))),
        };
        Ok(match self.client.queue_now(program, Args(held)) {
            Ok(q) => st.push(Entry::Flying(q)),
            Err((_, Some(e))) => st.push(Entry::Ready(Err(e))),
            Err((Args(mut held), None)) => {
                // Not on the ring at once: a plain dispatch, after what is in flight.
                while st.flying() > 0 {
                    st.complete_oldest()?;
                }
                let r = crate::runtime::block_on_checking(
                    rt,
                    dispatch_held(&self.client, program, &mut held),
                )?;
                st.push(Entry::Ready(r))
            }
        })
    }

    /// The oldest submission's completion, waiting for it on this thread; `None` when none is
    /// pending. Call without the GIL.
    ///
    /// # Errors
    ///
    /// The exception a signal handler raised while it waited (Ctrl-C): the submission is put
    /// back, first, still in flight.
    pub(crate) fn next_now(&self) -> PyResult<Option<Done>> {
        let mut st = self.lock();
        let Some((id, mut e)) = st.pop() else {
            return Ok(None);
        };
        drop(st);
        if let Err(raised) = complete_now(&mut e) {
            self.put_back(vec![(id, e)]);
            return Err(raised);
        }
        Ok(Some((id, ready(e))))
    }

    /// Every submission not yet returned, in order, waiting for them on this thread.
    ///
    /// # Errors
    ///
    /// As [`RingPipe::next_now`]: those already answered are put back with the rest.
    pub(crate) fn drain_now(&self) -> PyResult<Vec<Done>> {
        let mut all = Vec::new();
        loop {
            match self.next_now() {
                Ok(Some(d)) => all.push(d),
                Ok(None) => return Ok(all),
                Err(raised) => {
                    self.put_back(
                        all.into_iter()
                            .map(|(id, r)| (id, Entry::Ready(r)))
                            .collect(),
                    );
                    return Err(raised);
                }
            }
        }
    }

    /// Puts entries taken out with [`RingPipe::next_now`] back at the front, in their order.
    fn put_back(&self, taken: Vec<(u64, Entry)>) {
        let mut st = self.lock();
        for (id, e) in taken.into_iter().rev() {
            if matches!(e, Entry::Flying(_)) {
                st.flying.push_front(id);
            }
            st.entries.push_front((id, e));
        }
    }

    /// The oldest submission, taken out to be awaited (by a task, for Python's asyncio).
    pub(crate) fn take_next(&self) -> Option<(u64, Entry)> {
        self.lock().pop()
    }

    /// Every submission not yet returned, taken out in order.
    pub(crate) fn take_all(&self) -> Vec<(u64, Entry)> {
        let mut st = self.lock();
        st.flying.clear();
        st.entries.drain(..).collect()
    }
}

/// An entry's outcome, awaiting it if it is still in flight.
pub(crate) async fn settle(e: Entry) -> Result<Timing, ClientError> {
    match e {
        Entry::Ready(r) => r,
        Entry::Flying(mut q) => q.wait().await.map(timing),
    }
}

fn ready(e: Entry) -> Result<Timing, ClientError> {
    match e {
        Entry::Ready(r) => r,
        Entry::Flying(_) => Err(ClientError::Invalid(
            "a pipelined dispatch was returned before its answer (a bug in the npud package)"
                .into(),
        )),
    }
}

impl Drop for RingPipe {
    /// Submissions still in flight keep their tensors until the daemon answers them: a task
    /// waits for them, then lets the tensors go.
    fn drop(&mut self) {
        if self.pid != crate::runtime::pid() {
            // A forked child: waiting would consume the parent's completions from the memory
            // they share, and the ring's locks may have been held at the fork. Its copy of the
            // submissions is let go without a look.
            let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
            std::mem::forget(std::mem::take(st));
            return;
        }
        let flying: Vec<Entry> = self
            .take_all()
            .into_iter()
            .map(|(_, e)| e)
            .filter(|e| matches!(e, Entry::Flying(_)))
            .collect();
        if flying.is_empty() {
            return;
        }
        if let Ok(rt) = crate::runtime::runtime() {
            drop(rt.spawn(async move {
                for e in flying {
                    let _ = settle(e).await;
                }
            }));
        }
    }
}
