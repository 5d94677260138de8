//! The cost tests' allocator: a global allocator that forwards to [`System`] and counts the
//! bytes live and their peak, so that a test can say what a parser or decoder allocated for an
//! input (`npu-artifacts`, `npu-fd` and `npud` measure their parsers and the intake with it).
//!
//! A test crate installs it and reads it around the work it measures:
//!
//! ```ignore
//! #[global_allocator]
//! static METER: cost_meter::Meter = cost_meter::Meter;
//!
//! let _one_at_a_time = cost_meter::serial();
//! let (parsed, peak) = cost_meter::peak_of(|| parse(&input));
//! ```
//!
//! The counters see the whole process: a test holds [`serial`] while it measures, so that no
//! other test of its binary allocates meanwhile. An allocation that would take the live bytes
//! past [`CEILING`] fails (the process then aborts), so that a regression fails fast instead of
//! swapping the machine. It lives here, apart from the tests, so that the one `unsafe` it needs
//! has one home.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Live bytes above which an allocation fails.
pub const CEILING: usize = 1 << 30;

/// The counting allocator; install it with `#[global_allocator]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meter;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static SERIAL: Mutex<()> = Mutex::new(());

/// Counts `n` more live bytes, unless that passes the ceiling.
fn reserve(n: usize) -> bool {
    let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    if now > CEILING {
        LIVE.fetch_sub(n, Ordering::Relaxed);
        return false;
    }
    PEAK.fetch_max(now, Ordering::Relaxed);
    true
}

/// `alloc`'s block of `size` bytes, counted; null past the ceiling or when `alloc` fails.
fn counted(size: usize, alloc: impl FnOnce() -> *mut u8) -> *mut u8 {
    if !reserve(size) {
        return std::ptr::null_mut();
    }
    let p = alloc();
    if p.is_null() {
        LIVE.fetch_sub(size, Ordering::Relaxed);
    }
    p
}

// SAFETY: every method forwards to `System` with the caller's layout and pointer; the counters
// only observe, and a refused allocation returns null, which `GlobalAlloc` allows.
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract, which `System::alloc` shares.
        counted(layout.size(), || unsafe { System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        counted(layout.size(), || unsafe { System.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with this layout, so from `System`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A realloc may copy: the old and the new block are both live for a moment.
        if !reserve(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller upholds `realloc`'s contract, which `System::realloc` shares.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            LIVE.fetch_sub(new_size, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

/// Holds every other measuring test of this process off while it lives.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Bytes live now (when [`Meter`] is the global allocator; 0 otherwise).
#[must_use]
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Runs `f`: its result, and the peak bytes it had live above what was live before it. Calls
/// may nest: an outer measurement still sees an inner one's peak. The caller holds [`serial`].
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    let outer = PEAK.swap(base, Ordering::Relaxed);
    let r = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    PEAK.fetch_max(outer, Ordering::Relaxed);
    (r, peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static METER: Meter = Meter;

    #[test]
    fn a_peak_counts_what_was_live_at_once_and_nested_peaks_reach_the_outer_one() {
        // Within 64 KiB: the test harness's own threads allocate and free meanwhile.
        let _s = serial();
        let (_, outer) = peak_of(|| {
            let a = vec![1u8; 1 << 20];
            let (_, inner) = peak_of(|| vec![2u8; 4 << 20].len());
            assert!(
                ((4 << 20) - (64 << 10)..(4 << 20) + (64 << 10)).contains(&inner),
                "{inner}"
            );
            drop(a);
        });
        assert!(
            ((5 << 20) - (64 << 10)..(5 << 20) + (64 << 10)).contains(&outer),
            "{outer}"
        );
    }

    #[test]
    fn an_allocation_past_the_ceiling_fails_instead_of_taking_the_memory() {
        let _s = serial();
        let mut v: Vec<u8> = Vec::new();
        assert!(v.try_reserve_exact(CEILING + 1).is_err());
        assert!(live() < CEILING);
    }
}
