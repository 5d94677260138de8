//! Every latency constant tuned by measurement, for both sides of the dispatch ring and the
//! daemon's threads that serve it, in one place: how long something spins before it sleeps,
//! how long it sleeps, how it backs off. Each says why it has its value and what measured it.
//!
//! They were tuned on one machine: the 2-core development VM whose figures the bench README
//! gives (`crates/npu-bench/README.md`, its rows by number). A host with more cores or a real
//! NPU (whose doorbell costs tens of µs more than the emulator's) may want others; the ones a
//! user may change are configuration (`executor.spin_us`), the rest are here to be changed
//! together, with the bench run side by side before and after (`npuctl bench --only
//! fastpath`, rows 3, 10 and 15).
//!
//! Nothing here is a correctness bound: every wait that uses them also wakes on its event (a
//! futex bell, a channel), so a different value changes CPU time and latency, never outcomes.

use std::time::Duration;

// --- The client's side of the ring (npu-client, npu-bench, Python through npu-client) -----

/// How long a client spins (yielding to its runtime) for its completion, or for a free slot in
/// a full submission ring, before it sleeps on the completion bell. The emulator answers a
/// dispatch the executor has in hand in 3–5 µs; a sleep and wake costs the client a futex
/// wait, the daemon a `FUTEX_WAKE`, and a context switch (≈ 11 µs when both threads share a
/// vCPU, 40–50 µs when they do not, on the VM). 50 µs covers a lone dispatch's answer with
/// room, and a client whose answer is further away (others' work queued) sleeps after it.
pub const CLIENT_SPIN: Duration = Duration::from_micros(50);

/// Looks at the completion ring's tail between two looks at the completions while spinning.
pub const CLIENT_SPIN_LOOKS: u32 = 16;

/// The first sleep of a submitter that found the submission ring full after spinning for
/// [`CLIENT_SPIN`] (the daemon holds a ring's worth and frees slots as it answers); each
/// further one doubles, up to [`CLIENT_FULL_SLEEP_MAX`]. Measured: a client waiting on a full
/// ring used 4 ticks of CPU in 1 s, against 59 with the yield loop this replaced
/// (`tests/tests/fastpath.rs`).
pub const CLIENT_FULL_SLEEP_FIRST: Duration = Duration::from_micros(100);

/// The longest sleep of a submitter waiting for a free slot: how late it may notice one.
pub const CLIENT_FULL_SLEEP_MAX: Duration = Duration::from_millis(4);

/// How long a parked blocking wait sleeps before it asks its caller whether to go on waiting
/// (Python's Ctrl-C is looked at this often).
pub const CLIENT_CHECK_EVERY: Duration = Duration::from_millis(100);

/// The client's waiter thread's longest sleep while a task waits: it bounds a lost wake-up.
pub const CLIENT_WAITER_SLEEP: Duration = Duration::from_millis(5);

/// The client's waiter thread's sleep while no task waits.
pub const CLIENT_IDLE_SLEEP: Duration = Duration::from_millis(500);

// --- The daemon's side of the ring (npud's bell thread) -------------------------------------

/// The bell thread's first sleep while its port holds answers it could not post (a full
/// completion ring is looked at again this soon); it doubles at each look that finds the
/// client consumed nothing, up to [`BELL_BUSY_SLEEP_MAX`].
pub const BELL_BUSY_SLEEP: Duration = Duration::from_millis(10);

/// The longest: a client that never consumes costs a wake-up of its bell thread a few times a
/// second, and one that resumes waits at most this long for the rest of its answers.
pub const BELL_BUSY_SLEEP_MAX: Duration = Duration::from_millis(160);

/// The bell thread's longest sleep otherwise: how soon a submission whose bell the client did
/// not ring is noticed while the executor blocks. 64 idle rings cost 0–0.4 % of a core.
pub const BELL_IDLE_SLEEP: Duration = Duration::from_secs(1);

/// Rings of the bell in a row with nothing behind them that the bell thread answers at once.
/// A client that publishes then rings can make one now and then (the executor took its
/// submission before the bell thread looked); only one that rings for nothing makes many.
pub const BELL_WASTED_FREE: u32 = 4;

/// The bell thread's pause after the first wasted ring past [`BELL_WASTED_FREE`]; it doubles
/// with each further one up to [`BELL_BACKOFF_MAX`]. While it pauses, the bell's rings cost
/// their client a `FUTEX_WAKE` that wakes nobody. Measured: a client ringing without work cut
/// a bystander's calls 3–34× before the back-off, within the bystander's 3× bound after it
/// (`tests/tests/bystander/lifeline.rs`).
pub const BELL_BACKOFF_FIRST: Duration = Duration::from_millis(1);

/// The longest pause: how late a backed-off client's next real submission may be noticed while
/// the executor blocks.
pub const BELL_BACKOFF_MAX: Duration = Duration::from_millis(100);

// --- The daemon's executor and handlers ------------------------------------------------------

/// `executor.spin_us`'s default: how long the executor polls for the next command before it
/// sleeps, while one client's dispatches arrive back to back; 200 µs covers a client's
/// turnaround between two dispatches on the VM. Measured (two alternating runs): one client's
/// unary dispatch 136.1, 112.0 µs sleeping against 62.2, 57.2 µs polling (1.46–1.71× the
/// tonic echo against 0.75–0.77×), the daemon's CPU per dispatch 94, 82 against 104, 92 µs.
pub const EXECUTOR_SPIN_US: u64 = 200;

/// Looks at the channel and the rings between two yields of the CPU while the executor polls:
/// a look costs tens of ns, a yield a system call, during which a submission waits. 128 looks
/// is a few µs between yields: fast-path unary over its floor read 1.27–1.85× in six runs,
/// against 1.62–2.39× yielding every 16 looks in six runs alternating with them, the gRPC and
/// many-client rows within their spread.
pub const EXECUTOR_LOOKS_PER_YIELD: u32 = 128;

/// While polling, the executor looks at its channel every this many looks at the rings: a look
/// at the channel costs several times a quiet ring's two loads, and a command waits a few
/// looks at most (tens of ns) where its gRPC call took tens of µs to arrive.
pub const EXECUTOR_CHANNEL_EVERY: u32 = 4;

/// Serving two sessions this close together counts as shared use, which stops the executor's
/// polling for as long again: polling took the CPU 16 clients' requests are decoded on (16
/// clients 30.1k, 31.4k dispatches/s polling against 33.1k, 35.4k not, on 2 cores).
pub const EXECUTOR_SHARED: Duration = Duration::from_millis(2);

/// The longest the executor runs turns back to back before it offers its CPU (`sched_yield`)
/// to a thread waiting for that CPU. The executor's wake-ups land the gRPC I/O thread (which
/// every caller shares) on the executor's CPU, and the kernel let that thread wait behind the
/// executor for a whole scheduler slice: under four sessions' 1,024-link chains, 43 of its 54
/// waits over 1 ms in 3 s (up to 5.7 ms, 375 ms in all against 340 ms of running) were behind
/// the executor while the other CPU idled half the time (`perf sched timehist`, 2-vCPU VM,
/// 6.18 kernel). A yield with nothing waiting returns at once; every 250 µs it is a system
/// call per several turns.
pub const EXECUTOR_YIELD_AFTER: Duration = Duration::from_micros(250);

/// How long a gRPC handler whose item is the only one in the daemon polls (yielding) for its
/// reply before it sleeps. The executor answers such an item in about 15 µs; a worker thread
/// that slept must be woken by the executor thread (an eventfd or futex write, then a context
/// switch), which costs more on a small VM. Measured (five runs): unary over the in-process
/// floor (row 3 over row 1b) 1.242–1.319 sleeping against 1.175–1.314 polling, one client
/// 161.2, 167.5 against 141.7, 143.8 µs, 16 and 64 clients unchanged. With other items in
/// hand the reply is further away and the handler sleeps at once, and so it does when the
/// executor never polls (`executor.spin_us = 0`, the user's choice of CPU over latency): the
/// executor is then asleep when an item reaches it, its wake-up alone outlasts the poll, and
/// the poll spun through it. Without it there, npud's I/O thread took 100.0-118.6 µs per
/// dispatch against 117.8-130.3 (row 10 by thread, three alternated pairs), the process
/// 2.13-2.52 times the tonic echo's CPU against 2.62-3.02, and the wall time per call stayed
/// (187.9 against 192.8 µs). Skipping it whenever the executor was blocked, polling or not,
/// cost TLS calls (whose round trips outlast the executor's poll) their latency: TLS over
/// plain TCP 1.06-1.93 against 0.96-1.46 over six alternated runs.
pub const HANDLER_IDLE_POLL: Duration = Duration::from_micros(50);

/// The bytes one gRPC connection reads in a row before it lets the I/O thread look for other
/// connections' events (`tokio::task::yield_now`, which wakes it again only after the runtime
/// has polled for I/O). Without it a connection whose bytes keep coming was read for as long
/// as its HTTP/2 flow-control windows allowed (1 MiB a stream by default), and every byte was
/// framed and gathered on the I/O thread before another caller's request was even seen: while
/// sessions registered 8 MiB code objects back to back, a bystander's p99 was 3.5-4.7 times its
/// baseline, and 2.2-2.6 times with a 64 KiB turn (2-vCPU VM, release, three runs each of
/// `tests/tests/bystander/last_round.rs`'s hsaco attack). Smaller flow-control windows
/// (128 KiB a stream) did as well (1.5-2.3x) but made 16 MiB inline tensors 10-50% slower and
/// would cap a remote caller at a window per round trip; the turn left them as fast (16 MiB
/// inline 33-37 ms against 42-45 ms without it, `npuctl-bench --only sizes`).
pub const CONN_READ_TURN: usize = 64 << 10;

/// How long a bulk-work job (decoding, inflating, scanning or gathering one caller's long
/// message on a `SCHED_IDLE` thread, `npud`'s `bulk.rs`) computes before it offers its CPU to
/// a thread waiting for it (`sched_yield`). The scheduler does not take the CPU from such a job
/// by itself often enough: EEVDF picks a `SCHED_IDLE` thread while the runnable normal ones
/// have run past their share, and then lets it run until the next tick (4 ms at 250 Hz) unless
/// another thread wakes on that CPU. Under four sessions' 1,024-link chains the daemon's I/O
/// thread waited behind its own bulk threads 100 ms of 3.9 s, in stalls of up to 3.2 ms while
/// the other vCPU idled (`perf sched timehist`, 2-vCPU VM, 6.18 kernel). A job that yields is
/// not eligible any more (its weight is 3, so 100 µs of it counts as 34 ms of a normal thread)
/// and the waiting thread runs at once; with nothing waiting the yield returns at once, a system
/// call per 100 µs of work.
pub const BULK_TURN: Duration = Duration::from_micros(100);
