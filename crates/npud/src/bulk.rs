//! CPU-heavy work for one caller, at a lower CPU priority than the threads that serve everyone.
//!
//! Parsing a registered program and decoding or inflating a large request take milliseconds of
//! CPU for the one caller that sent them. On tokio's blocking pool they ran at the priority of
//! the I/O threads and the executor: on a 2-core host, two parsers and a decode took every core,
//! and every other caller's calls waited for a CPU (a bystander's p99 went 10.5 times its
//! baseline while two sessions registered 8 MiB code objects without pause). Here they run on
//! threads of their own under `SCHED_IDLE`, so the scheduler gives the I/O threads and the
//! executor the CPU first and this work everything left over. It still runs at full speed on an
//! otherwise idle host; how many jobs run at once stays bounded by their callers (the intake's
//! decoders, the program parsers).
//!
//! Why `SCHED_IDLE` and not a lower nice value (these threads ran 10 nice levels below the
//! daemon before): on the EEVDF scheduler (Linux 6.6 and later) a running thread keeps its CPU
//! for its whole slice whatever its nice value, so a nice-10 job held a core for 2-8 ms at a time
//! while the I/O thread, woken by a caller, waited for it (`perf sched timehist`, 2-core 6.18
//! kernel, the chain and code-object attacks of `tests/tests/bystander/`); a `SCHED_IDLE` thread
//! is preempted as soon as a normal one wakes. Not when one is already runnable: EEVDF picks a
//! `SCHED_IDLE` thread when the runnable normal ones have run past their share (they are not
//! eligible), and then lets it run until the next tick (4 ms at 250 Hz) unless another thread
//! wakes on its CPU: under four sessions' 1,024-link chains the I/O thread waited behind the
//! decoders in stalls of up to 3.2 ms while the other vCPU idled. So every job's loops call
//! [`pause`], which offers the CPU (`sched_yield`) once the job has computed for
//! `npu_fd::latency::BULK_TURN`; by then the job is not eligible (its weight is 3) and a waiting
//! thread runs at once. With it the bystander's p99 under those chains went from 5.7-7.2 times
//! its baseline to 1.2-1.7 times. Same run, same bystander, two runs each: a gzip
//! Chain on a Unix session 2.61-3.35x the bystander's baseline p99 at nice 10, 2.12-2.51x
//! idle; 8 MiB hsacos 3.55-4.19x and 2.58-2.81x. The cost: when every core is busy with
//! normal threads, a job gets about 3/1024 of a core's share per busy thread (a large program's
//! registration on a saturated host takes that much longer); that is the caller's own work
//! waiting, never another caller's. Where the kernel refuses the policy, the threads fall back
//! to 10 nice levels below the daemon.
//!
//! Lowering a thread's priority needs no privilege, and these threads never raise it again
//! (which would need `CAP_SYS_NICE`, or `RLIMIT_NICE` to leave `SCHED_IDLE`): they do nothing
//! else.
//!
//! A job takes no lock that the I/O threads or the executor take (the program store's, the
//! sessions'): Linux's mutexes do not lend a waiter's priority to the holder, so a job
//! preempted inside one would hold up a thread that serves everyone for as long as the
//! scheduler keeps the job waiting. Registration therefore hashes and parses here and takes the
//! store's lock in its handler (`Programs::admit`, `Programs::insert`).

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Instant;

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

/// A job computes, and gives back how to deliver what it computed: the thread marks itself
/// idle before delivering, so that a caller that submits again on its answer finds it idle.
type Job = Box<dyn FnOnce() -> Deliver + Send>;
type Deliver = Box<dyn FnOnce() + Send>;

/// A job panicked; what it was computing is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the work failed (it panicked)")]
pub struct Lost;

/// The threads and the work waiting for one. The thread that went idle last takes the next
/// job (last in, first out, as tokio's blocking pool does): its allocator still holds the
/// memory the last job freed, which the next one reuses, where handing jobs round the threads
/// would leave a job's worth of freed memory in each (a peak 10 MiB higher in the gzip-bomb
/// test's daemon).
struct Pool {
    state: Mutex<State>,
    /// One channel to each thread.
    threads: Vec<mpsc::Sender<Job>>,
}

#[derive(Default)]
struct State {
    /// Idle threads, the one that went idle last at the end.
    idle: Vec<usize>,
    /// Jobs no thread was idle for, oldest first.
    waiting: VecDeque<Job>,
}

static POOL: LazyLock<Pool> = LazyLock::new(Pool::start);

impl Pool {
    fn start() -> Pool {
        // Enough threads for every job the callers let run at once: the intake's decoders (one
        // per core past the first, at least one) and the program parsers.
        let mut threads = Vec::new();
        let mut idle = Vec::new();
        for i in 0..decoders() + PARSERS {
            let (tx, rx) = mpsc::channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name(format!("npud-bulk-{i}"))
                .spawn(move || serve(i, &rx));
            match spawned {
                Ok(_) => {
                    idle.push(threads.len());
                    threads.push(tx);
                }
                Err(e) => tracing::warn!(error = %e, "starting a bulk-work thread failed"),
            }
        }
        Pool {
            state: Mutex::new(State {
                idle,
                waiting: VecDeque::new(),
            }),
            threads,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `job` to the thread that went idle last, or queues it.
    fn submit(&self, job: Job) -> Result<(), Lost> {
        if self.threads.is_empty() {
            return Err(Lost);
        }
        let mut st = self.state();
        match st.idle.pop() {
            Some(i) => self.threads[i].send(job).map_err(|_| Lost),
            None => {
                st.waiting.push_back(job);
                Ok(())
            }
        }
    }

    /// The next waiting job for thread `i`, or `None` after marking it idle.
    fn next_for(&self, i: usize) -> Option<Job> {
        let mut st = self.state();
        let job = st.waiting.pop_front();
        if job.is_none() {
            st.idle.push(i);
        }
        job
    }
}

thread_local! {
    /// On a bulk-work thread, when its job last started or offered its CPU ([`pause`]); `None`
    /// on every other thread.
    static TURN: Cell<Option<Instant>> = const { Cell::new(None) };
    /// How many times this thread offered its CPU ([`offered`]).
    static OFFERED: Cell<u64> = const { Cell::new(0) };
}

/// How many times the calling thread's jobs have offered the CPU at a [`pause`] point.
pub fn offered() -> u64 {
    OFFERED.with(Cell::get)
}

// Tuned latencies: `npu_fd::latency` says why each has its value and what measured it.
const BULK_TURN: std::time::Duration = npu_fd::latency::BULK_TURN;

/// Where a job may stop for a moment: on a bulk-work thread whose job has computed for
/// [`BULK_TURN`] since it started or last paused, offers the CPU to any thread waiting for it
/// (`sched_yield`), which returns at once when none is. A clock read otherwise, and nothing on
/// any other thread, so code that runs both inline and as bulk work (the intake's scan) calls
/// it unconditionally. True when it offered the CPU.
///
/// Why: the scheduler does not preempt a `SCHED_IDLE` job often enough by itself (see
/// `npu_fd::latency::BULK_TURN`). Every loop of a job over a caller's bytes calls this at
/// least every few kilobytes or every few hundred fields.
pub fn pause() -> bool {
    TURN.with(|t| {
        let Some(since) = t.get() else {
            return false;
        };
        if since.elapsed() < BULK_TURN {
            return false;
        }
        std::thread::yield_now();
        t.set(Some(Instant::now()));
        OFFERED.with(|n| n.set(n.get() + 1));
        true
    })
}

fn serve(i: usize, rx: &mpsc::Receiver<Job>) {
    lower_priority();
    while let Ok(mut job) = rx.recv() {
        loop {
            TURN.with(|t| t.set(Some(Instant::now())));
            // A panicking job drops its reply sender (its caller sees `Lost`); the thread goes
            // on.
            let deliver = std::panic::catch_unwind(AssertUnwindSafe(job)).ok();
            let next = POOL.next_for(i);
            if let Some(deliver) = deliver {
                deliver();
            }
            match next {
                Some(n) => job = n,
                None => break,
            }
        }
    }
}

/// Puts the calling thread under `SCHED_IDLE` (see the module docs), or where the kernel
/// refuses it, lowers its priority by [`NICE_BELOW`] (Linux keeps both per thread).
fn lower_priority() {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id,
    };
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    match set_thread_priority_and_policy(thread_native_id(), ThreadPriority::Min, idle) {
        Ok(()) => return,
        Err(e) => tracing::debug!(error = ?e, "SCHED_IDLE refused for a bulk-work thread"),
    }
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
        let done = work();
        Box::new(move || {
            let _ = reply.send(done);
        })
    });
    POOL.submit(job)?;
    answer.await.map_err(|_| Lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_below_the_callers_priority_and_a_panic_is_lost_not_fatal() {
        use thread_priority::{NormalThreadSchedulePolicy, ThreadSchedulePolicy};
        let theirs = run(|| thread_priority::thread_schedule_policy().unwrap())
            .await
            .unwrap();
        assert_eq!(
            theirs,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle)
        );
        assert_eq!(run(|| -> u32 { panic!("a job") }).await, Err(Lost));
        // The pool goes on after a panic.
        assert_eq!(run(|| 7).await, Ok(7));
    }

    #[tokio::test]
    async fn a_job_offers_its_cpu_once_a_turn_at_most_and_no_other_thread_does() {
        let spin = || {
            let t = Instant::now();
            while t.elapsed() < BULK_TURN * 2 {
                std::hint::spin_loop();
            }
        };
        let (due, offered, took) = run(move || {
            spin();
            let due = pause();
            let (before, t) = (offered(), Instant::now());
            for _ in 0..10_000 {
                pause();
            }
            (due, offered() - before, t.elapsed())
        })
        .await
        .unwrap();
        assert!(due, "a job that computed for two turns offers its CPU");
        // However the thread is preempted meanwhile, never twice within a turn.
        let turns = took.as_micros() / BULK_TURN.as_micros();
        assert!(u128::from(offered) <= turns + 1, "{offered} in {took:?}");
        // Not a bulk-work thread: never.
        spin();
        assert!(!pause());
    }

    #[tokio::test]
    async fn the_thread_idle_last_takes_the_next_job() {
        let name = || std::thread::current().name().map(str::to_owned);
        let first = run(name).await.unwrap();
        for _ in 0..10 {
            assert_eq!(run(name).await.unwrap(), first);
        }
    }
}
