//! The task behind a `Pipeline`: submissions batched onto npu-client pipelines (the session's
//! dispatch ring, or `Submit` streams), completions answered in submission order.

use std::collections::VecDeque;
use std::sync::Arc;

use npu_client::{ClientError, Program as NativeProgram, Tensor, TensorArg};
use tokio::sync::{mpsc, oneshot};

use crate::tensor::{Held, Shared};
use crate::work::{Timing, timing};

pub(crate) enum Cmd {
    /// Send a dispatch; its outcome comes back as a completion (a refusal before sending, too).
    Submit {
        py_id: u64,
        program: NativeProgram,
        args: Vec<Arc<Shared>>,
    },
    /// The next completion in submission order.
    Next {
        reply: oneshot::Sender<Result<Option<Done>, ClientError>>,
    },
    /// Every completion still pending, in order.
    Drain {
        reply: oneshot::Sender<Result<Vec<Done>, ClientError>>,
    },
}

/// A completion: (request_id, timing or None, exception or None) once in Python.
pub(crate) type Done = (u64, Result<Timing, ClientError>);

/// A submission waiting for its batch.
pub(crate) struct Pending {
    pub(crate) py_id: u64,
    pub(crate) program: NativeProgram,
    pub(crate) args: Vec<Arc<Shared>>,
}

impl Pending {
    /// (tensors only read, tensors written), by id; `Err` when one tensor stands at two
    /// positions (the client lends a tensor to one position).
    fn access(&self) -> Result<(Vec<u64>, Vec<u64>), ClientError> {
        let k = self.program.read_only_args();
        let mut seen = std::collections::HashSet::new();
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for (i, t) in self.args.iter().enumerate() {
            if !seen.insert(t.id) {
                return Err(ClientError::Invalid(format!(
                    "args[{i}]: tensor {} stands at two argument positions of one dispatch; \
                     npud's client lends each tensor to one position",
                    t.id
                )));
            }
            if i < k {
                reads.push(t.id);
            } else {
                writes.push(t.id);
            }
        }
        Ok((reads, writes))
    }
}

/// One locked tensor of a batch, as the batch's submissions borrow it.
pub(crate) enum Lent<'a> {
    Read(&'a Tensor<u8>),
    Write(Option<&'a mut Tensor<u8>>),
}

/// How many times `depth` one `Submit` stream carries before it is drained and a new one opened:
/// the stream keeps at most `depth` in flight as it goes (npu-client's pipeline waits for a
/// completion before sending past it), so a batch of several windows pays for opening and
/// draining a stream once rather than once per window.
pub(crate) const WINDOWS_PER_BATCH: usize = 8;

/// Runs submissions from the front of `backlog` on one `Submit` stream: as many as
/// `depth` × [`WINDOWS_PER_BATCH`] (at most `depth` in flight at once),
/// stopping before one that writes a tensor an earlier one of the batch uses (or uses one it
/// writes), so that every tensor is locked once for the whole batch, in id order. Their
/// completions go to `done` in submission order.
pub(crate) async fn run_batch(
    client: &npu_client::Client,
    depth: usize,
    backlog: &mut VecDeque<Pending>,
    done: &mut VecDeque<Done>,
) {
    let mut batch: Vec<Pending> = Vec::new();
    let (mut read, mut written) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    while batch.len() < depth.saturating_mul(WINDOWS_PER_BATCH) {
        let Some(next) = backlog.front() else { break };
        let (r, w) = match next.access() {
            Ok(rw) => rw,
            Err(e) => {
                if let Some(p) = backlog.pop_front() {
                    if batch.is_empty() {
                        done.push_back((p.py_id, Err(e)));
                        continue;
                    }
                    // Keep submission order: answer it after this batch.
                    backlog.push_front(p);
                }
                break;
            }
        };
        let conflicts = w.iter().any(|id| read.contains(id) || written.contains(id))
            || r.iter().any(|id| written.contains(id));
        if conflicts {
            break;
        }
        read.extend(r);
        written.extend(w);
        if let Some(p) = backlog.pop_front() {
            batch.push(p);
        }
    }
    if batch.is_empty() {
        return;
    }
    // Lock every tensor of the batch once, in id order (as lock_args does).
    let mut tensors: Vec<&Arc<Shared>> = Vec::new();
    for p in &batch {
        for t in &p.args {
            if !tensors.iter().any(|u| u.id == t.id) {
                tensors.push(t);
            }
        }
    }
    tensors.sort_by_key(|t| t.id);
    let mut held: Vec<(u64, Held)> = Vec::with_capacity(tensors.len());
    for t in tensors {
        let lock = Arc::clone(&t.tensor);
        held.push((
            t.id,
            if written.contains(&t.id) {
                Held::Write(lock.write_owned().await)
            } else {
                Held::Read(lock.read_owned().await)
            },
        ));
    }
    let mut lent: std::collections::HashMap<u64, Lent<'_>> = held
        .iter_mut()
        .map(|(id, h)| {
            (
                *id,
                match h {
                    Held::Read(g) => Lent::Read(g),
                    Held::Write(g) => Lent::Write(Some(&mut **g)),
                },
            )
        })
        .collect();
    let mut p = match client.pipeline(depth).await {
        Ok(p) => p,
        Err(e) => {
            spread(done, batch.iter().map(|b| b.py_id), e);
            return;
        }
    };
    // (py_id, the pipeline's request id, or why the submission was refused).
    let mut sent: Vec<(u64, Result<u64, ClientError>)> = Vec::with_capacity(batch.len());
    for b in &batch {
        let k = b.program.read_only_args();
        let mut reads: Vec<&dyn TensorArg> = Vec::new();
        let mut writes: Vec<&mut dyn TensorArg> = Vec::new();
        for (i, t) in b.args.iter().enumerate() {
            match lent.get_mut(&t.id) {
                Some(Lent::Read(r)) if i < k => reads.push(*r as &dyn TensorArg),
                Some(Lent::Write(w)) if i >= k => {
                    if let Some(w) = w.take() {
                        writes.push(w as &mut dyn TensorArg);
                    }
                }
                _ => {}
            }
        }
        let r = if reads.len() + writes.len() == b.args.len() {
            p.submit(&b.program, &reads, writes).await
        } else {
            Err(ClientError::Invalid(
                "the pipeline's batch lost a tensor (a bug in the npud package)".into(),
            ))
        };
        sent.push((b.py_id, r));
    }
    let completions = p.finish().await;
    let mut by_request: std::collections::HashMap<u64, Result<Timing, ClientError>> =
        match completions {
            Ok(all) => all
                .into_iter()
                .map(|c| (c.request_id, c.result.map(timing)))
                .collect(),
            Err(e) => {
                spread(done, sent.iter().map(|(py_id, _)| *py_id), e);
                return;
            }
        };
    for (py_id, r) in sent {
        done.push_back((
            py_id,
            match r {
                Ok(request) => by_request.remove(&request).unwrap_or_else(|| {
                    Err(ClientError::Invalid(format!(
                        "the Submit stream ended without request {request}'s completion"
                    )))
                }),
                Err(e) => Err(e),
            },
        ));
    }
}

/// One error for several submissions: the first gets it, the rest its message.
pub(crate) fn spread(done: &mut VecDeque<Done>, ids: impl Iterator<Item = u64>, e: ClientError) {
    let message = e.to_string();
    let mut first = Some(e);
    for id in ids {
        let e = first
            .take()
            .unwrap_or_else(|| ClientError::Invalid(message.clone()));
        done.push_back((id, Err(e)));
    }
}

/// Dispatches for the Python object that sends it commands, on `Submit` streams: whatever
/// has been submitted runs as one batch (see [`run_batch`]) while Python goes on submitting.
/// Submissions are not answered (the Python side numbers them), so submitting costs no round
/// trip between threads.
pub(crate) async fn pipeline_task(
    client: npu_client::Client,
    depth: usize,
    mut rx: mpsc::Receiver<Cmd>,
    opened: oneshot::Sender<Result<usize, ClientError>>,
) {
    let depth = depth.max(1);
    let _ = opened.send(Ok(depth));
    let mut backlog: VecDeque<Pending> = VecDeque::new();
    let mut done: VecDeque<Done> = VecDeque::new();
    let mut next: VecDeque<oneshot::Sender<Result<Option<Done>, ClientError>>> = VecDeque::new();
    let mut drain: Vec<oneshot::Sender<Result<Vec<Done>, ClientError>>> = Vec::new();
    let mut closed = false;
    loop {
        // Take every command already waiting, so a batch holds as much as was submitted.
        loop {
            let cmd = match rx.try_recv() {
                Ok(c) => c,
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            };
            match cmd {
                Cmd::Submit {
                    py_id,
                    program,
                    args,
                } => backlog.push_back(Pending {
                    py_id,
                    program,
                    args,
                }),
                Cmd::Next { reply } => next.push_back(reply),
                Cmd::Drain { reply } => drain.push(reply),
            }
        }
        // Answer in order what can be answered now.
        while !next.is_empty() && (!done.is_empty() || backlog.is_empty()) {
            if let Some(reply) = next.pop_front() {
                let _ = reply.send(Ok(done.pop_front()));
            }
        }
        if backlog.is_empty() && next.is_empty() {
            for reply in drain.drain(..) {
                let _ = reply.send(Ok(done.drain(..).collect()));
            }
        }
        if !backlog.is_empty() {
            run_batch(&client, depth, &mut backlog, &mut done).await;
            continue;
        }
        if closed {
            break;
        }
        match rx.recv().await {
            Some(Cmd::Submit {
                py_id,
                program,
                args,
            }) => backlog.push_back(Pending {
                py_id,
                program,
                args,
            }),
            Some(Cmd::Next { reply }) => next.push_back(reply),
            Some(Cmd::Drain { reply }) => drain.push(reply),
            None => closed = true,
        }
    }
}
