//! Signals: a 64-bit value behind a mutex, with a condition variable for waiters.
//!
//! A queue's doorbell is a signal too: a store to it (`hsa_signal_store_screlease` or
//! `_relaxed`) runs the queue's pending packets before returning (see [`crate::dispatch`]);
//! the value stored is ignored, and it cannot be destroyed with `hsa_signal_destroy`.
//!
//! Functions that return a value rather than a status cannot report a bad handle; they return
//! 0 (or do nothing) and record the detail as the last error.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use hsa_core::sys::{Agent, Signal, SignalCondition, SignalValue, Status, WaitState};

use crate::counters::{Counter, bump};
use crate::queue::QueueObj;
use crate::runtime::{TIMESTAMP_FREQUENCY, guard, guard_value, next_handle, runtime};
use crate::status::{SimError, record};

/// One signal.
#[derive(Debug, Default)]
pub(crate) struct SignalObj {
    value: Mutex<SignalValue>,
    changed: Condvar,
    /// Set when this is a queue's doorbell.
    doorbell: OnceLock<Weak<QueueObj>>,
}

impl SignalObj {
    pub fn new(initial: SignalValue) -> Self {
        Self {
            value: Mutex::new(initial),
            ..Self::default()
        }
    }

    /// A doorbell signal for `queue`.
    pub fn doorbell(queue: Weak<QueueObj>) -> Self {
        let s = Self::new(0);
        let _ = s.doorbell.set(queue);
        s
    }

    fn lock(&self) -> MutexGuard<'_, SignalValue> {
        self.value.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn load(&self) -> SignalValue {
        *self.lock()
    }

    pub fn store(&self, v: SignalValue) {
        *self.lock() = v;
        self.changed.notify_all();
    }

    /// Adds `d` (wrapping) and wakes waiters.
    pub fn add(&self, d: SignalValue) {
        let mut g = self.lock();
        *g = g.wrapping_add(d);
        drop(g);
        self.changed.notify_all();
    }

    fn is_doorbell(&self) -> bool {
        self.doorbell.get().is_some()
    }

    /// Waits until `cond(value, compare)` holds or `timeout` passes; returns the value seen
    /// last (so a caller that times out sees the current value, as IRON's loop expects).
    pub fn wait(
        &self,
        cond: SignalCondition,
        compare: SignalValue,
        timeout: Option<Duration>,
    ) -> SignalValue {
        let holds = |v: SignalValue| match cond {
            SignalCondition::EQ => v == compare,
            SignalCondition::NE => v != compare,
            SignalCondition::LT => v < compare,
            SignalCondition::GTE => v >= compare,
            // An unknown condition never holds: the wait returns at its timeout.
            _ => false,
        };
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut g = self.lock();
        loop {
            if holds(*g) {
                return *g;
            }
            match deadline {
                None => g = self.changed.wait(g).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return *g;
                    }
                    g = self
                        .changed
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }
}

/// The live signal behind `s`.
pub(crate) fn lookup(s: Signal) -> Result<Arc<SignalObj>, SimError> {
    let rt = runtime().map_err(|st| SimError::new(st, "the runtime is not initialised"))?;
    let found = rt.signals().get(&s.handle).cloned();
    found.ok_or_else(|| {
        SimError::new(
            Status::ERROR_INVALID_SIGNAL,
            format!("unknown signal handle {:#x}", s.handle),
        )
    })
}

/// Registers `obj` and returns its handle.
pub(crate) fn register(rt: &crate::runtime::Runtime, obj: Arc<SignalObj>) -> Signal {
    let h = next_handle();
    rt.signals().insert(h, obj);
    Signal { handle: h }
}

/// Decrements a completion signal by one (a packet retired).
pub(crate) fn complete(obj: &SignalObj) {
    obj.add(-1);
}

fn with_signal<T: Copy>(s: Signal, default: T, f: impl FnOnce(&SignalObj) -> T) -> T {
    guard_value(default, || match lookup(s) {
        Ok(obj) => f(&obj),
        Err(e) => {
            record(&e);
            default
        }
    })
}

/// `hsa_signal_create`.
///
/// # Safety
/// `consumers` is valid for `num_consumers` reads (or null when it is 0); `out` is null (the
/// call fails) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_create(
    initial: SignalValue,
    num_consumers: u32,
    consumers: *const Agent,
    out: *mut Signal,
) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        if out.is_null() || (num_consumers > 0 && consumers.is_null()) {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        for i in 0..num_consumers as usize {
            // SAFETY: `consumers` is valid for `num_consumers` reads by the contract.
            let a = unsafe { consumers.add(i).read_unaligned() };
            if rt.agent_kind(a).is_none() {
                return Status::ERROR_INVALID_AGENT;
            }
        }
        let s = register(&rt, Arc::new(SignalObj::new(initial)));
        bump(Counter::SignalsCreated);
        // SAFETY: `out` is non-null and valid for one write by the contract.
        unsafe { out.write(s) };
        Status::SUCCESS
    })
}

/// `hsa_signal_destroy`. Unknown handles and doorbells give `INVALID_SIGNAL`.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI. Waiters on a destroyed signal keep
/// waiting on the detached object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_destroy(s: Signal) -> Status {
    guard(|| {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(st) => return st,
        };
        let mut sigs = rt.signals();
        match sigs.get(&s.handle) {
            Some(obj) if !obj.is_doorbell() => {
                sigs.remove(&s.handle);
                bump(Counter::SignalsDestroyed);
                Status::SUCCESS
            }
            _ => Status::ERROR_INVALID_SIGNAL,
        }
    })
}

/// `hsa_signal_load_scacquire`.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_load_scacquire(s: Signal) -> SignalValue {
    with_signal(s, 0, SignalObj::load)
}

/// `hsa_signal_load_relaxed`.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_load_relaxed(s: Signal) -> SignalValue {
    with_signal(s, 0, SignalObj::load)
}

fn store(s: Signal, v: SignalValue) {
    guard_value((), || {
        let obj = match lookup(s) {
            Ok(o) => o,
            Err(e) => return record(&e),
        };
        match obj.doorbell.get().and_then(Weak::upgrade) {
            Some(queue) => crate::dispatch::ring(&queue),
            None if obj.is_doorbell() => {}
            None => obj.store(v),
        }
    })
}

/// `hsa_signal_store_screlease`. On a queue's doorbell this runs the pending packets and
/// returns when they are done.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI. On a doorbell, the packets in the ring
/// must be well formed (their addresses are read as ROCR reads them).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_store_screlease(s: Signal, v: SignalValue) {
    store(s, v)
}

/// `hsa_signal_store_relaxed`: as [`hsa_signal_store_screlease`].
///
/// # Safety
/// As for [`hsa_signal_store_screlease`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_store_relaxed(s: Signal, v: SignalValue) {
    store(s, v)
}

/// `hsa_signal_subtract_screlease`.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_subtract_screlease(s: Signal, v: SignalValue) {
    with_signal(s, (), |o| o.add(v.wrapping_neg()))
}

/// `hsa_signal_subtract_relaxed`.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_subtract_relaxed(s: Signal, v: SignalValue) {
    with_signal(s, (), |o| o.add(v.wrapping_neg()))
}

/// `hsa_signal_add_screlease`.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_add_screlease(s: Signal, v: SignalValue) {
    with_signal(s, (), |o| o.add(v))
}

/// `hsa_signal_add_relaxed`.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_add_relaxed(s: Signal, v: SignalValue) {
    with_signal(s, (), |o| o.add(v))
}

fn wait(s: Signal, cond: SignalCondition, compare: SignalValue, timeout_hint: u64) -> SignalValue {
    let timeout = (timeout_hint != u64::MAX).then(|| {
        let ns = u128::from(timeout_hint) * 1_000_000_000 / u128::from(TIMESTAMP_FREQUENCY);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    });
    with_signal(s, 0, |o| o.wait(cond, compare, timeout))
}

/// `hsa_signal_wait_scacquire`: blocks until the condition holds or `timeout_hint` ticks
/// (of `TIMESTAMP_FREQUENCY`, nanoseconds; `u64::MAX` = forever) pass, and returns the
/// signal's value at that moment. `wait_state` is accepted and ignored.
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_wait_scacquire(
    s: Signal,
    cond: SignalCondition,
    compare: SignalValue,
    timeout_hint: u64,
    _wait_state: WaitState,
) -> SignalValue {
    wait(s, cond, compare, timeout_hint)
}

/// `hsa_signal_wait_relaxed`: as [`hsa_signal_wait_scacquire`].
///
/// # Safety
/// Always safe; `unsafe` only as part of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_signal_wait_relaxed(
    s: Signal,
    cond: SignalCondition,
    compare: SignalValue,
    timeout_hint: u64,
    _wait_state: WaitState,
) -> SignalValue {
    wait(s, cond, compare, timeout_hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_returns_the_value_when_the_condition_holds_or_at_timeout() {
        let s = SignalObj::new(3);
        let t = Some(Duration::from_millis(20));
        assert_eq!(s.wait(SignalCondition::EQ, 0, t), 3);
        assert_eq!(s.wait(SignalCondition::NE, 0, t), 3);
        assert_eq!(s.wait(SignalCondition::LT, 4, t), 3);
        assert_eq!(s.wait(SignalCondition::GTE, 3, t), 3);
        assert_eq!(s.wait(SignalCondition::LT, 3, t), 3);
        assert_eq!(s.wait(SignalCondition(9), 3, t), 3);
    }

    #[test]
    fn a_waiter_wakes_when_another_thread_decrements() {
        let s = Arc::new(SignalObj::new(2));
        let s2 = s.clone();
        let h = std::thread::spawn(move || s2.wait(SignalCondition::EQ, 0, None));
        complete(&s);
        complete(&s);
        assert_eq!(h.join().unwrap(), 0);
    }
}
