//! The cost oracle every fuzz target shares: a counting global allocator, and [`check`], which
//! fails the run when one parse holds more than `per_byte` bytes per input byte (plus a
//! constant) at its peak. Issue 19's 8 MiB hsaco passed every correctness oracle while asking for
//! 256 GiB: the fuzzers must also see what a parse costs. libFuzzer runs one input at a time,
//! so the process-wide counters are the parse's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Peak bytes allowed on top of `per_byte` × input (messages, small tables).
pub const SLACK: usize = 1 << 20;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's layout; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract, which `System::alloc` shares.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with this layout, so from `System`.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `realloc`'s contract, which `System::realloc` shares.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `parse` on an `input_len`-byte input and panics (a finding) when its peak live bytes
/// pass `per_byte` × `input_len` + [`SLACK`].
pub fn check<T>(what: &str, input_len: usize, per_byte: usize, parse: impl FnOnce() -> T) -> T {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = parse();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let limit = per_byte.saturating_mul(input_len).saturating_add(SLACK);
    assert!(
        peak <= limit,
        "{what}: peak {peak} bytes for a {input_len}-byte input; the cost contract allows {limit}"
    );
    out
}
