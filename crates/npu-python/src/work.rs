//! One dispatch and one chain over Python's tensors: lock the arguments, upload the staged
//! ones, run.

use std::sync::Arc;

use npu_client::{ClientError, Program as NativeProgram, TensorArg};
use pyo3::prelude::*;
use smallvec::SmallVec;

use crate::program::Program;
use crate::tensor::{Held, RawTensor, Shared, shared};

/// One item per argument (or per distinct tensor) of one call, kept inline: a dispatch's
/// handful of arguments costs no allocation on the way to the ring.
pub(crate) type Few<T> = SmallVec<[T; 8]>;

/// Timing of one dispatch: (queue_ns, device_ns).
pub(crate) type Timing = (u64, u64);

pub(crate) fn timing(r: npu_client::DispatchResult) -> Timing {
    (
        u64::try_from(r.queue.as_nanos()).unwrap_or(u64::MAX),
        u64::try_from(r.device.as_nanos()).unwrap_or(u64::MAX),
    )
}

/// The locks one call holds: each distinct tensor once, and for each argument the index of
/// its lock.
pub(crate) struct Locked {
    pub(crate) held: Few<Held>,
    pub(crate) index: Few<usize>,
}

/// Locks the distinct tensors of `args` (`args[i]` for `i < reads` only read), in id order so
/// that concurrent calls cannot deadlock. A tensor read at one position and written at another
/// is locked for writing.
pub(crate) async fn lock_args(args: &[Arc<Shared>], reads: usize) -> Locked {
    let (distinct, index) = distinct(args, reads);
    let mut held = Few::with_capacity(distinct.len());
    for (d, write) in &distinct {
        let lock = Arc::clone(&d.tensor);
        held.push(if *write {
            Held::Write(lock.write_owned().await)
        } else {
            Held::Read(lock.read_owned().await)
        });
    }
    Locked { held, index }
}

/// [`lock_args`] without waiting: `None` when another call holds one of the locks.
pub(crate) fn try_lock_args(args: &[Arc<Shared>], reads: usize) -> Option<Locked> {
    let (distinct, index) = distinct(args, reads);
    let mut held = Few::with_capacity(distinct.len());
    for (d, write) in &distinct {
        let lock = Arc::clone(&d.tensor);
        held.push(if *write {
            Held::Write(lock.try_write_owned().ok()?)
        } else {
            Held::Read(lock.try_read_owned().ok()?)
        });
    }
    Some(Locked { held, index })
}

/// The distinct tensors of `args` in id order, each with whether a call writes it, and for
/// each argument the index of its tensor among them. Sorting the arguments' positions by id
/// keeps this O(n log n) in the argument count: a chain's arguments are every link's.
fn distinct(args: &[Arc<Shared>], reads: usize) -> (Few<(&Arc<Shared>, bool)>, Few<usize>) {
    let mut order: Few<usize> = (0..args.len()).collect();
    order.sort_unstable_by_key(|&i| args[i].id);
    let mut distinct: Few<(&Arc<Shared>, bool)> = Few::new();
    let mut index: Few<usize> = SmallVec::from_elem(0, args.len());
    for i in order {
        let a = &args[i];
        let write = i >= reads;
        match distinct.last_mut() {
            Some((d, w)) if d.id == a.id => *w |= write,
            _ => distinct.push((a, write)),
        }
        index[i] = distinct.len() - 1;
    }
    (distinct, index)
}

/// Uploads every staged argument: Python writes a numpy view without the dirty mark the Rust
/// API sets, so a staged argument is always uploaded before the work (and, as in the Rust
/// client, every written one is downloaded after it).
pub(crate) async fn upload_staged(l: &Locked) -> Result<(), ClientError> {
    for h in &l.held {
        let t = h.tensor();
        if !t.is_shared() {
            t.upload().await?;
        }
    }
    Ok(())
}

/// Runs one dispatch over locked arguments.
pub(crate) async fn dispatch_locked(
    client: &npu_client::Client,
    program: &NativeProgram,
    l: Locked,
) -> Result<Timing, ClientError> {
    upload_staged(&l).await?;
    let mut args = in_order(l)?;
    dispatch_held(client, program, &mut args).await
}

/// Runs one dispatch over its locked arguments, in the design's order.
pub(crate) async fn dispatch_held(
    client: &npu_client::Client,
    program: &NativeProgram,
    args: &mut [Held],
) -> Result<Timing, ClientError> {
    let (reads, mut writes): (Few<_>, Few<_>) = split(args)?;
    client
        .dispatch(program, &reads, &mut writes)
        .await
        .map(timing)
}

/// One dispatch on the calling thread through the session's ring (npu-client's
/// `Client::dispatch_now`), when its tensors are free at once: `None`, having sent nothing,
/// otherwise (the caller then waits for [`dispatch`]). Python's `dispatch` blocks anyway, and
/// on the ring the runtime's future, timer and wake-ups were a large part of a dispatch.
///
/// Once the wait sleeps, `go_on` is asked every 100 ms whether to keep waiting (the caller
/// looks at Python's signals there).
pub(crate) fn dispatch_now(
    client: &npu_client::Client,
    program: &NativeProgram,
    args: &[Arc<Shared>],
    go_on: &mut dyn FnMut() -> bool,
) -> Option<Result<Timing, ClientError>> {
    if !client.fast_path_active() {
        return None;
    }
    let l = try_lock_args(args, program.read_only_args())?;
    let mut args = match in_order(l) {
        Ok(a) => a,
        Err(e) => return Some(Err(e)),
    };
    let (reads, mut writes): (Few<_>, Few<_>) = match split(&mut args) {
        Ok(rw) => rw,
        Err(e) => return Some(Err(e)),
    };
    client
        .dispatch_now_checking(program, &reads, &mut writes, go_on)
        .map(|r| r.map(timing))
}

/// Each argument's lock, in the design's order.
pub(crate) fn in_order(mut l: Locked) -> Result<Few<Held>, ClientError> {
    let mut slots: Few<Option<Held>> = l.held.drain(..).map(Some).collect();
    // Each position takes its tensor's lock; a distinct tensor stands at one position only
    // (checked by the caller), so every slot is taken once.
    l.index
        .iter()
        .map(|&i| {
            slots[i].take().ok_or_else(|| {
                ClientError::Invalid(
                    "one tensor stands at two argument positions of one dispatch; npud's \
                     client lends each tensor to one position: use separate tensors, or a chain"
                        .into(),
                )
            })
        })
        .collect()
}

/// The arguments a dispatch reads, then the ones it may write.
pub(crate) fn split<'a, R, W>(args: &'a mut [Held]) -> Result<(R, W), ClientError>
where
    R: Default + Extend<&'a dyn TensorArg>,
    W: Default + Extend<&'a mut dyn TensorArg>,
{
    let mut reads = R::default();
    let mut writes = W::default();
    let mut wrote = false;
    for h in args {
        match h {
            Held::Read(g) if !wrote => reads.extend([&**g as &dyn TensorArg]),
            Held::Read(_) => {
                return Err(ClientError::Invalid(
                    "a read-only argument after a written one".into(),
                ));
            }
            Held::Write(g) => {
                wrote = true;
                writes.extend([&mut **g as &mut dyn TensorArg]);
            }
        }
    }
    Ok((reads, writes))
}

pub(crate) async fn dispatch(
    client: npu_client::Client,
    program: NativeProgram,
    args: Vec<Arc<Shared>>,
) -> Result<Timing, ClientError> {
    let l = lock_args(&args, program.read_only_args()).await;
    dispatch_locked(&client, &program, l).await
}

/// A dispatch argument: a tensor, and the byte range of it the program gets, `(offset,
/// length)`; `(0, 0)` is the whole tensor, a length of 0 runs to its end.
pub(crate) type Arg = (Arc<Shared>, u64, u64);

/// Runs one dispatch whose arguments are byte ranges of tensors, in the design's order; one
/// tensor may stand at several positions (sub-views of one buffer, as IRON's `subview`). Sent
/// as a one-link chain, which the daemon runs as a dispatch: a chain names each tensor once,
/// and its links take views of it.
pub(crate) async fn dispatch_views(
    client: npu_client::Client,
    program: NativeProgram,
    args: Vec<Arg>,
) -> Result<Timing, ClientError> {
    let (_, queue, device, _) = chain(client, vec![(program, args)]).await?;
    Ok((queue, device))
}

/// (completed, queue_ns, device_ns, doorbells).
pub(crate) type ChainTiming = (u32, u64, u64, u32);

/// Runs `links` as one chain. A tensor only read by every link that names it is shared; any
/// other is written. Each tensor is named to the daemon once; a link takes it whole or a view
/// of it.
pub(crate) async fn chain(
    client: npu_client::Client,
    links: Vec<(NativeProgram, Vec<Arg>)>,
) -> Result<ChainTiming, ClientError> {
    let mut written: Vec<u64> = Vec::new();
    let mut order: Vec<Arc<Shared>> = Vec::new();
    for (p, a) in &links {
        for (i, (t, ..)) in a.iter().enumerate() {
            if i >= p.read_only_args() && !written.contains(&t.id) {
                written.push(t.id);
            }
            if !order.iter().any(|o| o.id == t.id) {
                order.push(Arc::clone(t));
            }
        }
    }
    order.sort_by_key(|t| written.contains(&t.id));
    let reads = order.iter().filter(|t| !written.contains(&t.id)).count();
    let mut l = lock_args(&order, reads).await;
    upload_staged(&l).await?;
    let mut b = client.chain();
    let handles: Vec<npu_client::ChainArg> = l
        .held
        .iter_mut()
        .map(|h| match h {
            Held::Read(g) => b.read(&**g),
            Held::Write(g) => b.write(&mut **g),
        })
        .collect();
    for (p, a) in &links {
        let args: Vec<npu_client::ChainArg> = a
            .iter()
            .map(|(t, offset, len)| {
                let at = order.iter().position(|o| o.id == t.id).unwrap_or(0);
                let whole = handles[l.index[at]];
                if *offset == 0 && (*len == 0 || usize::try_from(*len) == Ok(t.len)) {
                    whole
                } else {
                    whole.view(*offset, *len)
                }
            })
            .collect();
        b.then(p, &args);
    }
    let r = b.run().await?.ok()?;
    Ok((
        r.completed,
        u64::try_from(r.queue.as_nanos()).unwrap_or(u64::MAX),
        u64::try_from(r.device.as_nanos()).unwrap_or(u64::MAX),
        r.doorbells,
    ))
}

/// Links as Python gives them: a program and `(tensor, offset, length)` arguments.
pub(crate) type Links<'py> = Vec<(Bound<'py, Program>, Vec<PyArg<'py>>)>;

/// A dispatch argument as Python gives it: `(tensor, offset, length)`.
pub(crate) type PyArg<'py> = (Bound<'py, RawTensor>, u64, u64);

/// The tensors of `args`, checked as [`shared`] checks them, with their ranges.
pub(crate) fn args(args: &[PyArg<'_>]) -> PyResult<Vec<Arg>> {
    args.iter()
        .map(|(t, offset, len)| Ok((shared(t)?, *offset, *len)))
        .collect()
}

pub(crate) fn links(l: &Links<'_>) -> PyResult<Vec<(NativeProgram, Vec<Arg>)>> {
    l.iter()
        .map(|(p, a)| Ok((p.get().program.clone(), args(a)?)))
        .collect()
}
