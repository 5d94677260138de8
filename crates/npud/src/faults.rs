//! The device-fault budget: how often one identity may fault the device.
//!
//! Quarantine is keyed by a program's bytes, so a client that changes one word of a hanging
//! design gets a fresh program that stalls every client again for the runtime's whole timeout.
//! The budget bounds that by identity instead: every device fault (a failure or a hang) charges
//! the session whose work faulted and the identities it is charged to: the one that opened it
//! (`uid:1000`, `cert:...`, `token:...`, `anonymous`) and every other identity its connection
//! proved that could call alone (see `auth`'s "one principal"), each against its own budget. When an identity's faults within the last
//! `window` reach `budget`, it is cooled down: it may not register programs or dispatch until
//! the cool-down ends, which is `cooldown` after the fault that spent the budget, and never
//! before the oldest of those `budget` faults leaves the window.
//!
//! The executor checks the budget again when an item (or a chain's next doorbell batch) is about
//! to start, so work queued before the budget ran out does not slip past it. One identity can
//! therefore fault the device at most `budget` times in any interval of length `window`.
//!
//! Not every failed doorbell is a device fault. A runtime checks each packet before it runs it
//! and reports what it refuses through the same error path as a fault: a packet it cannot
//! decode or whose argument count is wrong (`INVALID_PACKET_FORMAT`), an argument that is not
//! its allocation (`INVALID_ALLOCATION`, `INVALID_ARGUMENT`), no room for what the packet needs
//! (`OUT_OF_RESOURCES`: PDI slots, device heap for a FullElf command's control code), a design
//! this runtime cannot run (`NOT_SUPPORTED`). Nothing of that packet ran, so [`refusal`] sorts
//! those statuses out: the program is not quarantined (programs are shared by content hash, and
//! a refusal says nothing against its bytes), nothing is charged, and the caller reads that it
//! was refused. Everything else a batch reports (`ERROR`, `EXCEPTION`, memory faults, a hang)
//! is a device fault.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hsa_core::sys::Status;

use crate::config::Limits;
use crate::error::NpudError;

/// Who is charged: the names (`auth::Identity::key`) of the identity that opened the session,
/// first, and of the others its connection proved (see `auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charged(Arc<[Arc<str>]>);

impl Charged {
    /// The principal `first`, then `also`.
    pub fn new(first: Arc<str>, also: impl IntoIterator<Item = Arc<str>>) -> Self {
        Self(std::iter::once(first).chain(also).collect())
    }

    /// Every charged name, the principal first.
    pub fn names(&self) -> &[Arc<str>] {
        &self.0
    }
}

impl From<String> for Charged {
    fn from(name: String) -> Self {
        Self::new(name.into(), [])
    }
}

impl std::fmt::Display for Charged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.first().map_or("", |n| n))
    }
}

#[derive(Debug, Default)]
struct Record {
    /// Faults within the window, oldest first.
    faults: VecDeque<Instant>,
    /// Refused until then.
    until: Option<Instant>,
    /// Faults since start.
    total: u64,
}

#[derive(Debug, Default)]
struct Inner {
    identities: HashMap<Arc<str>, Record>,
    /// Faults per session since it opened.
    sessions: HashMap<u64, u64>,
}

/// Faults per identity and per session, and the cool-downs they earned.
#[derive(Debug)]
pub struct FaultBudget {
    budget: u32,
    window: Duration,
    cooldown: Duration,
    inner: Mutex<Inner>,
    /// Told of every cool-down that starts, to end what the identity holds open.
    lifecycle: std::sync::OnceLock<Arc<crate::principals::Lifecycle>>,
}

impl FaultBudget {
    /// A budget of `budget` faults per `window`, then `cooldown` without device access.
    pub fn new(budget: u32, window: Duration, cooldown: Duration) -> Self {
        Self {
            budget: budget.max(1),
            window,
            cooldown,
            inner: Mutex::new(Inner::default()),
            lifecycle: std::sync::OnceLock::new(),
        }
    }

    /// From now on, a cool-down that starts ends everything the identity holds open, through
    /// `lifecycle` (its streams, rings and calls end RESOURCE_EXHAUSTED, naming the cool-down).
    pub fn end_holds_through(&self, lifecycle: Arc<crate::principals::Lifecycle>) {
        let _ = self.lifecycle.set(lifecycle);
    }

    /// The budget `limits` configures (`fault_budget`, `fault_window_ms`, `fault_cooldown_ms`).
    pub fn from_limits(l: &Limits) -> Self {
        Self::new(
            l.fault_budget,
            Duration::from_millis(l.fault_window_ms),
            Duration::from_millis(l.fault_cooldown_ms),
        )
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Charges one fault at `now` to `session` and each of `who`'s identities; returns whether
    /// this fault started a cool-down of any of them.
    pub fn charge(&self, session: u64, who: &Charged, now: Instant) -> bool {
        let mut g = self.lock();
        *g.sessions.entry(session).or_default() += 1;
        let mut cooled = Vec::new();
        for name in who.names() {
            if self.charge_one(&mut g, name, now)
                && let Err(why) = self.check_one(&g, name, "dispatch", now)
            {
                cooled.push((name.clone(), why));
            }
        }
        drop(g);
        if let Some(l) = self.lifecycle.get() {
            for (name, why) in &cooled {
                l.cool_down(name, why);
            }
        }
        !cooled.is_empty()
    }

    fn charge_one(&self, g: &mut Inner, who: &Arc<str>, now: Instant) -> bool {
        let r = g.identities.entry(who.clone()).or_default();
        r.total += 1;
        prune(&mut r.faults, self.window, now);
        r.faults.push_back(now);
        if r.faults.len() < self.budget as usize {
            return false;
        }
        // The oldest fault that counts toward the budget leaves the window at `leaves`.
        let k = r.faults.len() - self.budget as usize;
        let leaves = r.faults[k] + self.window;
        let until = (now + self.cooldown).max(leaves);
        let started = r.until.is_none_or(|u| u <= now);
        r.until = Some(r.until.map_or(until, |u| u.max(until)));
        started
    }

    /// Whether `who` may use the device at `now` to `doing` (`dispatch`, `register programs`):
    /// none of its identities is cooling down.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED during a cool-down, naming the identity, saying why and for how
    /// long.
    pub fn check(&self, who: &Charged, doing: &str, now: Instant) -> Result<(), NpudError> {
        let g = self.lock();
        // No identity has faulted the device (the usual case): nothing to look up.
        if g.identities.is_empty() {
            return Ok(());
        }
        for name in who.names() {
            self.check_one(&g, name, doing, now)?;
        }
        Ok(())
    }

    fn check_one(
        &self,
        g: &Inner,
        who: &Arc<str>,
        doing: &str,
        now: Instant,
    ) -> Result<(), NpudError> {
        let Some(r) = g.identities.get(who) else {
            return Ok(());
        };
        match r.until {
            Some(until) if now < until => {
                let left = until - now;
                Err(NpudError::ResourceExhausted(format!(
                    "{who} faulted the device {} within {} (limits.fault_budget, \
                     limits.fault_window_ms); it may not {doing} for another {:.1} s \
                     (limits.fault_cooldown_ms)",
                    if self.budget == 1 {
                        "once".to_owned()
                    } else {
                        format!("{} times", self.budget)
                    },
                    fmt_window(self.window),
                    left.as_secs_f64()
                )))
            }
            _ => Ok(()),
        }
    }

    /// Faults charged to `session` since it opened.
    pub fn session_faults(&self, session: u64) -> u64 {
        self.lock().sessions.get(&session).copied().unwrap_or(0)
    }

    /// Forgets an ended session's count (its identity keeps its own).
    pub fn forget_session(&self, session: u64) {
        self.lock().sessions.remove(&session);
    }
}

/// Whether the runtime reports `status` for a packet it refused before running it (see the
/// module docs), rather than for a device fault.
pub fn is_refusal(status: Status) -> bool {
    refusal_code(status).is_some()
}

/// The error a caller reads when the runtime refused a packet of `program` with `status`
/// before running it (`detail` is hsa-core's description), or `None` when `status` is a device
/// fault. Argument and format refusals are INVALID_ARGUMENT, a lack of room
/// RESOURCE_EXHAUSTED, a design the runtime cannot run FAILED_PRECONDITION.
pub fn refusal(status: Status, program: &str, detail: &dyn std::fmt::Display) -> Option<NpudError> {
    refusal_code(status).map(|code| {
        code(format!(
            "the runtime refused program {program} before running it, a refusal and not a \
             device fault (the program is not quarantined and no fault is charged): {detail}"
        ))
    })
}

fn refusal_code(status: Status) -> Option<fn(String) -> NpudError> {
    Some(match status {
        Status::ERROR_INVALID_PACKET_FORMAT
        | Status::ERROR_INVALID_ALLOCATION
        | Status::ERROR_INVALID_ARGUMENT
        | Status::ERROR_INCOMPATIBLE_ARGUMENTS
        | Status::ERROR_INVALID_INDEX => NpudError::InvalidArgument,
        Status::ERROR_OUT_OF_RESOURCES => NpudError::ResourceExhausted,
        Status::AMD_ERROR_NOT_SUPPORTED => NpudError::FailedPrecondition,
        _ => return None,
    })
}

fn prune(faults: &mut VecDeque<Instant>, window: Duration, now: Instant) {
    while faults
        .front()
        .is_some_and(|t| now.duration_since(*t) >= window)
    {
        faults.pop_front();
    }
}

fn fmt_window(w: Duration) -> String {
    if w.subsec_millis() == 0 {
        format!("{} s", w.as_secs())
    } else {
        format!("{} ms", w.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statuses a runtime reports for a packet it refused before running it are refusals that
    /// say so; a failure while running, or anything else, is a device fault.
    #[test]
    fn refusals_are_told_from_device_faults_by_status() {
        let detail = "the device failed packet 0 of the batch with 0x1009: bad";
        for (status, code) in [
            (Status::ERROR_INVALID_PACKET_FORMAT, "INVALID_ARGUMENT"),
            (Status::ERROR_INVALID_ALLOCATION, "INVALID_ARGUMENT"),
            (Status::ERROR_INVALID_ARGUMENT, "INVALID_ARGUMENT"),
            (Status::ERROR_OUT_OF_RESOURCES, "RESOURCE_EXHAUSTED"),
            (Status::AMD_ERROR_NOT_SUPPORTED, "FAILED_PRECONDITION"),
        ] {
            assert!(is_refusal(status));
            let e = refusal(status, "7 (fe)", &detail).unwrap();
            assert_eq!(e.code_name(), code);
            assert_eq!(
                e.message(),
                format!(
                    "the runtime refused program 7 (fe) before running it, a refusal and not a \
                     device fault (the program is not quarantined and no fault is charged): \
                     {detail}"
                )
            );
        }
        for status in [
            Status::ERROR,
            Status::ERROR_EXCEPTION,
            Status::AMD_ERROR_MEMORY_FAULT,
            Status::AMD_ERROR_MEMORY_APERTURE_VIOLATION,
            Status::AMD_ERROR_ILLEGAL_INSTRUCTION,
            Status::ERROR_FATAL,
        ] {
            assert!(!is_refusal(status));
            assert!(refusal(status, "7", &detail).is_none());
        }
    }

    const MS: Duration = Duration::from_millis(1);

    fn k(name: &str) -> Charged {
        Charged::new(Arc::from(name), [])
    }

    #[test]
    fn a_fault_charges_every_identity_and_any_cool_down_stops_the_session() {
        let b = FaultBudget::new(2, 1000 * MS, 5000 * MS);
        let t = Instant::now();
        let token = Charged::new("token:a".into(), ["uid:1000".into()]);
        let cert = Charged::new("cert:dns:a.example".into(), ["uid:1000".into()]);
        assert!(!b.charge(1, &token, t));
        assert!(b.charge(2, &cert, t + MS), "uid:1000's second fault");
        let e = b.check(&token, "dispatch", t + 2 * MS).unwrap_err();
        assert!(
            e.message()
                .starts_with("uid:1000 faulted the device 2 times"),
            "{e}"
        );
        b.check(&k("token:a"), "dispatch", t + 2 * MS).unwrap();
        assert_eq!(token.to_string(), "token:a");
    }

    #[test]
    fn the_fault_that_spends_the_budget_starts_a_cool_down_with_the_time_left() {
        let b = FaultBudget::new(3, 1000 * MS, 5000 * MS);
        let t = Instant::now();
        assert!(!b.charge(1, &k("uid:1000"), t));
        assert!(!b.charge(2, &k("uid:1000"), t + 10 * MS));
        b.check(&k("uid:1000"), "dispatch", t + 20 * MS).unwrap();
        assert!(b.charge(1, &k("uid:1000"), t + 20 * MS));
        let e = b
            .check(&k("uid:1000"), "dispatch", t + 1020 * MS)
            .unwrap_err();
        assert_eq!(e.code_name(), "RESOURCE_EXHAUSTED");
        assert_eq!(
            e.to_string(),
            "uid:1000 faulted the device 3 times within 1 s (limits.fault_budget, \
             limits.fault_window_ms); it may not dispatch for another 4.0 s \
             (limits.fault_cooldown_ms)"
        );
        // Another uid, and anonymous callers, are not affected; sessions are counted apart.
        b.check(&k("uid:1001"), "dispatch", t + 30 * MS).unwrap();
        b.check(&k("anonymous"), "dispatch", t + 30 * MS).unwrap();
        assert_eq!(b.session_faults(1), 2);
        assert_eq!(b.session_faults(2), 1);
        // After the cool-down the uid works again.
        b.check(&k("uid:1000"), "dispatch", t + 5020 * MS).unwrap();
    }

    #[test]
    fn faults_older_than_the_window_do_not_count() {
        let b = FaultBudget::new(2, 100 * MS, 1000 * MS);
        let t = Instant::now();
        assert!(!b.charge(1, &k("anonymous"), t));
        assert!(!b.charge(1, &k("anonymous"), t + 100 * MS));
        assert!(!b.charge(1, &k("anonymous"), t + 200 * MS));
        b.check(&k("anonymous"), "dispatch", t + 201 * MS).unwrap();
        assert!(b.charge(1, &k("anonymous"), t + 250 * MS));
        let e = b
            .check(&k("anonymous"), "register programs", t + 251 * MS)
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("anonymous faulted the device 2 times within 100 ms")
        );
    }

    #[test]
    fn a_cool_down_shorter_than_the_window_still_bounds_faults_per_window() {
        // Budget 2 per 1 s, cool-down 10 ms: the uid stays refused until the older of its two
        // faults leaves the window.
        let b = FaultBudget::new(2, 1000 * MS, 10 * MS);
        let t = Instant::now();
        b.charge(1, &k("uid:7"), t);
        assert!(b.charge(1, &k("uid:7"), t + 100 * MS));
        assert!(b.check(&k("uid:7"), "dispatch", t + 500 * MS).is_err());
        assert!(b.check(&k("uid:7"), "dispatch", t + 999 * MS).is_err());
        b.check(&k("uid:7"), "dispatch", t + 1000 * MS).unwrap();
    }
}
