//! How the executor waits for its next command.
//!
//! A thread blocked in the kernel is expensive to wake: its waker makes a system call and the
//! sleeper waits to be scheduled, and on a VM whose idle virtual CPU has halted the pair costs
//! 15–25 µs, several times the emulator's whole dispatch (measured by `npuctl bench`: a
//! one-client dispatch costs 1.5× the bare tonic echo when the executor sleeps between
//! dispatches, under 1× when it polls). So while commands arrive back to back the executor
//! polls its channel for up to `spin` before it blocks, yielding the CPU every few µs of polling
//! so that a thread waiting for that CPU runs soon.
//!
//! Polling only pays while commands keep coming within the window. When a poll runs out the
//! executor blocks, and it polls again only after a command has arrived within `spin` of the
//! executor going idle: a client dispatching every few milliseconds costs no polling at all,
//! and an idle daemon none. `spin = 0` never polls.
//!
//! Nor does it poll while it serves several sessions (two within [`SHARED`]). One client's
//! dispatches arrive strictly one after another, so the executor idles before each and the
//! wake-up lies on every dispatch's path. With several clients their requests queue up while
//! others run, one wake-up serves several, and the CPU a poll would take is the CPU their
//! requests are decoded on: on 2 cores, polling cut 16 clients' throughput by a tenth.

use std::time::{Duration, Instant};

// Tuned latencies: `npu_fd::latency` says why each has its value and what measured it.
const LOOKS_PER_YIELD: u32 = npu_fd::latency::EXECUTOR_LOOKS_PER_YIELD;
const CHANNEL_EVERY: u32 = npu_fd::latency::EXECUTOR_CHANNEL_EVERY;

pub const SHARED: Duration = npu_fd::latency::EXECUTOR_SHARED;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;

/// Work the executor waits for besides its channel.
pub trait Elsewhere {
    /// Looks for work; whether any was found.
    fn poll(&mut self) -> bool;
    /// The wait blocks from now (`true`; answers whether work is waiting, and then it does
    /// not block) or has ended (`false`).
    fn park(&mut self, parked: bool) -> bool;
}

/// Nothing besides the channel.
#[cfg(test)]
struct Nowhere;

#[cfg(test)]
impl Elsewhere for Nowhere {
    fn poll(&mut self) -> bool {
        false
    }
    fn park(&mut self, _: bool) -> bool {
        false
    }
}

/// What ended a wait.
#[derive(Debug)]
pub enum Woke<T> {
    Command(T),
    /// The poll found work.
    Elsewhere,
    /// Every sender is gone.
    Closed,
}

/// The executor's waiting policy.
#[derive(Debug)]
pub struct Idle {
    spin: Duration,
    /// Whether the last idle period was short enough for a poll to have caught its end.
    armed: bool,
    /// The session served last, and when.
    last: Option<(u64, Instant)>,
    /// No polling before this: several sessions are being served.
    shared_until: Option<Instant>,
}

impl Idle {
    pub fn new(spin: Duration) -> Idle {
        Idle {
            spin,
            armed: !spin.is_zero(),
            last: None,
            shared_until: None,
        }
    }

    /// Notes that the executor starts work for `session` at `now`.
    pub fn serving(&mut self, session: u64, now: Instant) {
        if let Some((last, at)) = self.last
            && last != session
            && now.duration_since(at) < SHARED
        {
            self.shared_until = Some(now + SHARED);
        }
        self.last = Some((session, now));
    }

    fn shared(&self, now: Instant) -> bool {
        self.shared_until.is_some_and(|t| now < t)
    }

    /// Whether a wait starting at `now` polls before it blocks.
    fn polls(&self, now: Instant) -> bool {
        self.armed && !self.shared(now)
    }

    /// The next command, or `None` when every sender is gone.
    #[cfg(test)]
    pub fn next<T>(&mut self, rx: &mut mpsc::Receiver<T>) -> Option<T> {
        match self.next_or(rx, &mut Nowhere) {
            Woke::Command(c) => Some(c),
            Woke::Elsewhere => unreachable!("nothing else was polled"),
            Woke::Closed => None,
        }
    }

    /// The next command, or work found `elsewhere` (the dispatch rings), or that every sender
    /// is gone. While polling, `elsewhere` is polled between looks at the channel; before
    /// blocking, it is parked, and unparked after.
    pub fn next_or<T>(
        &mut self,
        rx: &mut mpsc::Receiver<T>,
        elsewhere: &mut impl Elsewhere,
    ) -> Woke<T> {
        let idle_since = Instant::now();
        if self.polls(idle_since) {
            let until = idle_since + self.spin;
            let mut looks = 0u32;
            loop {
                if looks.is_multiple_of(CHANNEL_EVERY) {
                    match rx.try_recv() {
                        Ok(cmd) => return Woke::Command(cmd),
                        Err(TryRecvError::Disconnected) => return Woke::Closed,
                        Err(TryRecvError::Empty) => {}
                    }
                }
                if elsewhere.poll() {
                    return Woke::Elsewhere;
                }
                looks += 1;
                if !looks.is_multiple_of(LOOKS_PER_YIELD) {
                    std::hint::spin_loop();
                    continue;
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        if elsewhere.park(true) {
            elsewhere.park(false);
            return Woke::Elsewhere;
        }
        let cmd = rx.blocking_recv();
        elsewhere.park(false);
        self.armed = idle_since.elapsed() < self.spin;
        cmd.map_or(Woke::Closed, Woke::Command)
    }

    /// Whether the next wait starts by polling.
    #[cfg(test)]
    fn armed(&self) -> bool {
        self.armed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_already_queued_is_taken_at_once() {
        let (tx, mut rx) = mpsc::channel(4);
        tx.try_send(7).unwrap();
        // A window of an hour: were a queued command not taken at once, the test would hang
        // (and the runner's timeout would say so); nothing here reads a clock.
        let mut idle = Idle::new(Duration::from_secs(3600));
        assert_eq!(idle.next(&mut rx), Some(7));
        assert!(idle.armed());
    }

    #[test]
    fn a_poll_that_runs_out_disarms_until_a_command_comes_soon() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut idle = Idle::new(Duration::from_millis(20));
        // Nothing comes within the window: the poll runs out and the wait blocks.
        let late = std::thread::spawn({
            let tx = tx.clone();
            move || {
                std::thread::sleep(Duration::from_millis(80));
                tx.blocking_send(1).unwrap();
            }
        });
        assert_eq!(idle.next(&mut rx), Some(1));
        late.join().unwrap();
        assert!(
            !idle.armed(),
            "a poll that could not have caught the command stays off"
        );
        // The next command comes at once: polling is worth it again.
        tx.try_send(2).unwrap();
        assert_eq!(idle.next(&mut rx), Some(2));
        assert!(idle.armed());
    }

    #[test]
    fn serving_two_sessions_stops_polling_until_one_is_served_alone() {
        let (tx, mut rx) = mpsc::channel::<u8>(4);
        let mut idle = Idle::new(Duration::from_secs(5));
        idle.serving(1, Instant::now());
        idle.serving(1, Instant::now());
        assert!(
            !idle.shared(Instant::now()),
            "one session is not shared use"
        );
        assert!(idle.polls(Instant::now()));
        idle.serving(2, Instant::now());
        assert!(idle.shared(Instant::now()));
        assert!(!idle.polls(Instant::now()), "shared use blocks at once");
        // The command comes within the window, so polling stays armed for later.
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            tx.blocking_send(9).unwrap();
        });
        assert_eq!(idle.next(&mut rx), Some(9));
        sender.join().unwrap();
        assert!(idle.armed());
        std::thread::sleep(SHARED);
        assert!(!idle.shared(Instant::now()), "shared use ends after SHARED");
        assert!(idle.polls(Instant::now()));
        // Sessions served further apart than SHARED are not shared use.
        idle.serving(3, Instant::now());
        assert!(!idle.shared(Instant::now()));
    }

    #[test]
    fn zero_never_polls_and_a_closed_channel_ends_the_wait() {
        let (tx, mut rx) = mpsc::channel::<u8>(1);
        let mut idle = Idle::new(Duration::ZERO);
        assert!(!idle.armed());
        drop(tx);
        assert_eq!(idle.next(&mut rx), None);
        assert!(!idle.armed());
        let (tx, mut rx) = mpsc::channel::<u8>(1);
        let mut idle = Idle::new(Duration::from_millis(10));
        drop(tx);
        assert_eq!(idle.next(&mut rx), None);
    }
}
