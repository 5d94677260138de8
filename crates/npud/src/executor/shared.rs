//! What the executor publishes for other threads, so that statistics and the watchdog's
//! liveness check never wait behind the device: a snapshot of what the device holds, updated
//! after every turn that changed it, and a heartbeat, the time the executor last started a turn
//! (or "idle" while it waits for commands).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Snapshot;

/// The heartbeat's value while the executor waits for commands.
const IDLE: u64 = 0;

#[derive(Debug)]
pub struct Shared {
    snapshot: Mutex<Snapshot>,
    epoch: Instant,
    /// Nanoseconds after `epoch` (plus one) at which the current turn started; [`IDLE`].
    busy_since: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            snapshot: Mutex::new(Snapshot::default()),
            epoch: Instant::now(),
            busy_since: AtomicU64::new(IDLE),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Snapshot> {
        self.snapshot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn snapshot(&self) -> Snapshot {
        self.lock().clone()
    }

    pub fn publish(&self, s: Snapshot) {
        *self.lock() = s;
    }

    /// The executor starts a turn (or handles a command).
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    /// [`Shared::beat`] with the time the caller read already.
    pub fn beat_at(&self, now: Instant) {
        let since = u64::try_from(now.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX - 1);
        self.busy_since.store(since + 1, Ordering::Relaxed);
    }

    /// The executor waits for commands.
    pub fn idle(&self) {
        self.busy_since.store(IDLE, Ordering::Relaxed);
    }

    /// Whether the executor is waiting, or started its current turn less than `within` ago.
    pub fn responsive(&self, within: Duration) -> bool {
        match self.busy_since.load(Ordering::Relaxed) {
            IDLE => true,
            since => {
                let now = self.epoch.elapsed().as_nanos();
                now.saturating_sub(u128::from(since - 1)) < within.as_nanos()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_executor_is_responsive_and_a_long_turn_is_not() {
        let s = Shared::default();
        assert!(s.responsive(Duration::ZERO));
        s.beat();
        assert!(s.responsive(Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!s.responsive(Duration::from_millis(1)));
        s.idle();
        assert!(s.responsive(Duration::ZERO));
    }
}
