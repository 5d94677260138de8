//! CPU-heavy work for one caller, at a lower CPU priority than the threads that serve everyone.
//!
//! Parsing a registered program and decoding or inflating a large request take milliseconds of
//! CPU for the one caller that sent them. On tokio's blocking pool they ran at the priority of
//! the I/O threads and the executor: on a 2-core host, two parsers and a decode took every core,
//! and every other caller's calls waited for a CPU (a bystander's p99 went 10.5 times its
//! baseline while two sessions registered 8 MiB code objects without pause). Here they run on
//! threads of their own, each 10 nice levels below the daemon (at most 19), so the scheduler
//! gives the I/O threads and the executor the CPU first and this work everything left over. It
//! still runs at full speed on an otherwise idle host; how many jobs run at once stays bounded by
//! their callers (the intake's decoders, the program parsers).
//!
//! Lowering a thread's priority needs no privilege, and these threads never raise it again
//! (which would need `CAP_SYS_NICE`): they do nothing else.
//!
//! A job takes no lock that the I/O threads or the executor take (the program store's, the
//! sessions'): Linux's mutexes do not lend a waiter's priority to the holder, so a job
//! preempted inside one would hold up a thread that serves everyone for as long as the
//! scheduler keeps the job waiting. Registration therefore hashes and parses here and takes the
//! store's lock in its handler (`Programs::admit`, `Programs::insert`).

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

/// How far below the daemon's own nice value the threads run.
pub const NICE_BELOW: i32 = 10;
/// Program registrations that parse at once; later ones wait (holding no thread) for a turn.
pub const PARSERS: usize = 2;

/// Large or compressed messages the intake decodes at once: one fewer than the cores (at least
/// one), so that however many callers send them, one core is left to the I/O threads and the
/// executor even before the scheduler prefers them.
#[must_use]
pub fn decoders() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .saturating_sub(1)
        .max(1)
}

type Job = Box<dyn FnOnce() + Send>;

/// A job panicked; what it was computing is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the work failed (it panicked)")]
pub struct Lost;

struct Pool {
    tx: mpsc::Sender<Job>,
}

static POOL: LazyLock<Pool> = LazyLock::new(Pool::start);

impl Pool {
    fn start() -> Pool {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        // Enough threads for every job the callers let run at once: the intake's decoders (one
        // per core past the first, at least one) and the program parsers.
        let threads = decoders() + PARSERS;
        for i in 0..threads {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("npud-bulk-{i}"))
                .spawn(move || serve(&rx));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "starting a bulk-work thread failed");
            }
        }
        Pool { tx }
    }
}

fn serve(rx: &Mutex<mpsc::Receiver<Job>>) {
    lower_priority();
    loop {
        let job = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(job) = job else { return };
        // A panicking job drops its reply sender (its caller sees `Lost`); the thread goes on.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
    }
}

/// Lowers the calling thread's priority by [`NICE_BELOW`] (Linux keeps the nice value per
/// thread).
fn lower_priority() {
    let now = rustix::process::getpriority_process(None).unwrap_or(0);
    let to = (now + NICE_BELOW).min(19);
    if let Err(e) = rustix::process::setpriority_process(None, to) {
        tracing::debug!(error = %e, "lowering a bulk-work thread's priority failed");
    }
}

/// Runs `work` on a bulk-work thread and waits for its result without holding the caller's
/// thread.
///
/// # Errors
/// [`Lost`] when `work` panicked (or no bulk-work thread could be started).
pub async fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Lost> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = reply.send(work());
    });
    POOL.tx.send(job).map_err(|_| Lost)?;
    answer.await.map_err(|_| Lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_below_the_callers_priority_and_a_panic_is_lost_not_fatal() {
        let mine = rustix::process::getpriority_process(None).unwrap();
        let theirs = run(|| rustix::process::getpriority_process(None).unwrap())
            .await
            .unwrap();
        assert_eq!(theirs, (mine + NICE_BELOW).min(19));
        assert_eq!(run(|| -> u32 { panic!("a job") }).await, Err(Lost));
        // The pool goes on after a panic.
        assert_eq!(run(|| 7).await, Ok(7));
    }
}
