//! What one fd-socket connection may ask of the daemon's I/O thread per second.
//!
//! Each frame costs the daemon a read, a ticket lookup and an answer on the thread every gRPC
//! caller shares. An exchange the daemon serves redeemed a ticket a gRPC call issued, so its
//! rate is bounded by those calls; a refused one (a ticket that is unknown, another uid's, for
//! another op, a memfd that fails its checks) costs the client nothing but the frame. So a
//! connection is held to two bounds before its next frame is read:
//!
//! - a rate: [`FRAMES_PER_SECOND`] frames a second after a burst of [`BURST`] (one client
//!   redeeming every tensor of a session at once stays well inside it: each redeem is a
//!   connection of its own in npu-client);
//! - a backoff on refusals: after [`FREE_REFUSALS`] refusals in a row, the next frame waits
//!   [`FIRST_BACKOFF`], doubling with each further refusal up to [`MAX_BACKOFF`]; an exchange
//!   served resets it. A client retrying an import with a fixed memfd never meets it.
//!
//! A connection that waits is only not read: the wait is a timer on the I/O thread, and the
//! client's frames wait in its socket, not in the daemon's memory.

use std::time::{Duration, Instant};

/// Frames a connection may send a second, after its burst.
pub const FRAMES_PER_SECOND: f64 = 1000.0;
/// Frames a connection may send at once.
pub const BURST: f64 = 64.0;
/// Refusals in a row a connection gets without waiting.
pub const FREE_REFUSALS: u32 = 4;
/// The wait after the first refusal past the free ones.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest wait between two frames after refusals.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One connection's budget.
#[derive(Debug)]
pub struct FrameBudget {
    /// Frames the connection may send now; below zero, how far it has run ahead.
    tokens: f64,
    at: Instant,
    /// Refusals since the last exchange served.
    refusals: u32,
}

impl FrameBudget {
    /// A full budget at `now`.
    pub fn new(now: Instant) -> Self {
        FrameBudget {
            tokens: BURST,
            at: now,
            refusals: 0,
        }
    }

    /// Charges the next frame at `now`: how long to wait before reading it.
    pub fn next_frame(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * FRAMES_PER_SECOND).min(BURST) - 1.0;
        let rate = if self.tokens < 0.0 {
            Duration::from_secs_f64(-self.tokens / FRAMES_PER_SECOND)
        } else {
            Duration::ZERO
        };
        rate.max(self.backoff())
    }

    /// Notes how the last frame was answered: served (`true`) or refused.
    pub fn answered(&mut self, served: bool) {
        self.refusals = if served {
            0
        } else {
            self.refusals.saturating_add(1)
        };
    }

    fn backoff(&self) -> Duration {
        let Some(past) = self.refusals.checked_sub(FREE_REFUSALS + 1) else {
            return Duration::ZERO;
        };
        FIRST_BACKOFF
            .checked_mul(1_u32 << past.min(16))
            .map_or(MAX_BACKOFF, |d| d.min(MAX_BACKOFF))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_free_then_frames_wait_for_the_rate() {
        let t0 = Instant::now();
        let mut b = FrameBudget::new(t0);
        for _ in 0..64 {
            assert_eq!(b.next_frame(t0), Duration::ZERO);
        }
        let wait = b.next_frame(t0);
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(1),
            "{wait:?}"
        );
        // A second later the burst is back.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..63 {
            assert_eq!(b.next_frame(t1), Duration::ZERO);
        }
    }

    #[test]
    fn refusals_past_the_free_ones_double_the_wait_to_a_cap_and_a_served_one_resets_it() {
        let t0 = Instant::now();
        let mut b = FrameBudget::new(t0);
        let mut waits = Vec::new();
        for i in 0..16 {
            b.answered(false);
            // Spaced a second apart: only the backoff counts.
            waits.push(b.next_frame(t0 + Duration::from_secs(i + 1)));
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(
            ms,
            [
                0, 0, 0, 0, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000, 1000
            ]
        );
        b.answered(true);
        assert_eq!(b.next_frame(t0 + Duration::from_secs(30)), Duration::ZERO);
    }
}
