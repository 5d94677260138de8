//! npud's allocator: mimalloc, and [`collect`], the safe wrapper of the one mimalloc call the
//! daemon needs that the `mimalloc` crate does not offer. It lives here so that npud itself
//! stays `#![forbid(unsafe_code)]`.

pub use mimalloc::MiMalloc;

/// Makes mimalloc hand the calling thread's freed memory back: it takes the blocks other
/// threads freed into this thread's pages, retires empty pages and runs the purges that are
/// due (`mi_collect(false)`). Costs a walk of the thread's pages; call it when a thread goes
/// idle, not on every event.
#[doc(alias = "mi_collect")]
pub fn collect() {
    // SAFETY: `mi_collect` takes no pointer; it works on the calling thread's own heap and on
    // mimalloc's shared arenas under mimalloc's own synchronisation, and may be called from
    // any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(false) }
}
