//! Samples and their summary: p50, p99, mean, and throughput over the measured wall time.
//!
//! A sample is one operation's latency (or, for pipelined rows, one window's time per
//! operation). Warm-up operations are never recorded. Percentiles are nearest-rank over the
//! sorted samples: p50 and p99 are real measured values, never interpolated.

use std::time::Duration;

use serde::Serialize;

/// What one row measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Samples recorded (after the warm-up).
    pub samples: usize,
    /// Operations the throughput counts (a chain counts its links when the row is per link).
    pub ops: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    /// The slowest sample.
    pub max_us: f64,
    /// Operations per second over the measured wall time.
    pub throughput_per_s: f64,
}

/// Nanoseconds of a duration, saturating.
#[must_use]
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Lossless for any count this tool makes (below 2^53).
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn f64_of(v: u64) -> f64 {
    v as f64
}

/// Summarises latencies in nanoseconds, with `ops` operations over `wall`.
#[must_use]
pub fn summarize(mut ns: Vec<u64>, ops: u64, wall: Duration) -> Summary {
    ns.sort_unstable();
    let n = ns.len();
    let rank = |q: f64| -> f64 {
        if n == 0 {
            return 0.0;
        }
        // Nearest rank: the smallest sample with at least q of the samples at or below it.
        let k = (q * f64_of(n as u64)).ceil();
        let k = if k < 1.0 { 1 } else { usize_of(k).min(n) };
        f64_of(ns[k - 1]) / 1000.0
    };
    let mean = if n == 0 {
        0.0
    } else {
        f64_of(ns.iter().sum::<u64>()) / f64_of(n as u64) / 1000.0
    };
    let secs = wall.as_secs_f64();
    Summary {
        samples: n,
        ops,
        p50_us: rank(0.50),
        p99_us: rank(0.99),
        mean_us: mean,
        max_us: ns.last().map_or(0.0, |v| f64_of(*v) / 1000.0),
        throughput_per_s: if secs > 0.0 { f64_of(ops) / secs } else { 0.0 },
    }
}

/// A non-negative, finite f64 below 2^53 as usize (rank arithmetic only).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn usize_of(v: f64) -> usize {
    v as usize
}

/// Samples gathered over several rounds (rows measured in turn, side by side).
#[derive(Debug, Default)]
pub struct Acc {
    ns: Vec<u64>,
    wall: Duration,
}

impl Acc {
    /// Adds one round's samples and wall time.
    pub fn add(&mut self, (ns, wall): (Vec<u64>, Duration)) {
        self.ns.extend(ns);
        self.wall += wall;
    }

    /// One operation per sample.
    #[must_use]
    pub fn summary(self) -> Summary {
        self.summary_of(1)
    }

    /// `ops` operations per sample (a chain's links, its samples divided by their count).
    #[must_use]
    pub fn summary_of(self, ops: u64) -> Summary {
        let n = self.ns.len() as u64;
        summarize(self.ns, n * ops, self.wall)
    }
}

/// Divides every sample by `k` (per-link figures of a chain).
#[must_use]
pub fn per(ns: &[u64], k: u64) -> Vec<u64> {
    ns.iter().map(|v| v / k.max(1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_samples() {
        let ns: Vec<u64> = (1..=100).map(|v| v * 1000).collect();
        let s = summarize(ns, 100, Duration::from_secs(2));
        assert_eq!(s.samples, 100);
        assert!((s.p50_us - 50.0).abs() < 1e-9);
        assert!((s.p99_us - 99.0).abs() < 1e-9);
        assert!((s.mean_us - 50.5).abs() < 1e-9);
        assert!((s.throughput_per_s - 50.0).abs() < 1e-9);
    }

    #[test]
    fn a_single_sample_is_every_percentile() {
        let s = summarize(vec![7000], 1, Duration::from_millis(7));
        assert!((s.p50_us - 7.0).abs() < 1e-9);
        assert!((s.p99_us - 7.0).abs() < 1e-9);
    }

    #[test]
    fn no_samples_give_zeros() {
        let s = summarize(Vec::new(), 0, Duration::ZERO);
        assert_eq!(s.samples, 0);
        assert!(s.p50_us == 0.0 && s.throughput_per_s == 0.0);
    }
}
