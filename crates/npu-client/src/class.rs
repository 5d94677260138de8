//! [`SessionClass`]: what a session's work is, batch or interactive, and how an interactive
//! session's deadline travels.
//!
//! A session says its class when it opens ([`crate::ConnectOptions::session_class`] and
//! [`crate::ConnectOptions::deadline`]); the daemon's policy (`auth.rules[].classes`) says
//! which callers may ask for which, and refuses the others with `PERMISSION_DENIED`. A deadline
//! is for interactive sessions only (`INVALID_ARGUMENT` otherwise) and at most 10 s. The client
//! leaves both checks to the daemon, which owns the policy, and reports what the daemon granted
//! ([`crate::Client::session_class`], [`crate::Client::deadline`]). A daemon older than classes
//! ignores them and grants batch, which the client then reports.
//!
//! The meaning of a class (who goes first into a doorbell, the weights, how short other work's
//! doorbells are kept) is the daemon's: see the README's "Priorities: interactive and batch
//! sessions".

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use npu_proto::v1 as pb;

/// A session's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionClass {
    /// Throughput work (the default): sessions share the device equally by device time.
    #[default]
    Batch,
    /// Latency work a person waits for: its dispatches go first into the next doorbell, and
    /// while it is active other work's doorbells are kept short.
    Interactive,
}

impl SessionClass {
    /// Every class, in the order the daemon's statistics list them.
    pub const ALL: [SessionClass; 2] = [SessionClass::Batch, SessionClass::Interactive];

    /// Its name: `batch` or `interactive`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Batch => "batch",
            Self::Interactive => "interactive",
        }
    }

    /// The class a proto `session_class` value stands for: unspecified (an older peer) is
    /// batch; `None` for a value this client does not know.
    #[must_use]
    pub fn from_proto(value: i32) -> Option<SessionClass> {
        match pb::SessionClass::try_from(value).ok()? {
            pb::SessionClass::Unspecified | pb::SessionClass::Batch => Some(Self::Batch),
            pb::SessionClass::Interactive => Some(Self::Interactive),
        }
    }

    /// The name of a proto `session_class` value: `batch`, `interactive`, or `class N` for a
    /// value this client does not know.
    #[must_use]
    pub fn proto_name(value: i32) -> String {
        Self::from_proto(value).map_or_else(|| format!("class {value}"), |c| c.to_string())
    }
}

impl From<SessionClass> for pb::SessionClass {
    fn from(c: SessionClass) -> Self {
        match c {
            SessionClass::Batch => pb::SessionClass::Batch,
            SessionClass::Interactive => pb::SessionClass::Interactive,
        }
    }
}

impl fmt::Display for SessionClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no session class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown session class {name:?}: expected \"batch\" or \"interactive\"")]
pub struct UnknownSessionClass {
    /// The name as given.
    pub name: String,
}

impl FromStr for SessionClass {
    type Err = UnknownSessionClass;

    /// `batch` or `interactive`, as [`SessionClass`]'s `Display` writes them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownSessionClass { name: s.to_owned() })
    }
}

/// A deadline as `deadline_us` carries it: whole microseconds, rounded up (so a deadline under
/// a microsecond is not sent as 0, which asks for the daemon's default); 0 for none. Past `u64::MAX` µs it saturates, and the
/// daemon refuses it as over its 10 s bound.
pub(crate) fn deadline_us(deadline: Option<Duration>) -> u64 {
    deadline.map_or(0, |d| {
        u64::try_from(d.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX)
    })
}

/// A `deadline_us` as a deadline: `None` for 0.
pub(crate) fn deadline_from_us(us: u64) -> Option<Duration> {
    (us > 0).then(|| Duration::from_micros(us))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_display_as_each_other() {
        for c in SessionClass::ALL {
            assert_eq!(c.to_string().parse::<SessionClass>(), Ok(c));
        }
        assert_eq!("batch".parse(), Ok(SessionClass::Batch));
        assert_eq!("interactive".parse(), Ok(SessionClass::Interactive));
        assert_eq!(SessionClass::default(), SessionClass::Batch);
        let e = "Interactive".parse::<SessionClass>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown session class \"Interactive\": expected \"batch\" or \"interactive\""
        );
        assert!("".parse::<SessionClass>().is_err());
    }

    #[test]
    fn proto_values_convert_and_unspecified_is_batch() {
        assert_eq!(SessionClass::from_proto(0), Some(SessionClass::Batch));
        assert_eq!(SessionClass::from_proto(1), Some(SessionClass::Batch));
        assert_eq!(SessionClass::from_proto(2), Some(SessionClass::Interactive));
        assert_eq!(SessionClass::from_proto(7), None);
        for c in SessionClass::ALL {
            assert_eq!(
                SessionClass::from_proto(pb::SessionClass::from(c) as i32),
                Some(c)
            );
        }
        assert_eq!(SessionClass::proto_name(0), "batch");
        assert_eq!(SessionClass::proto_name(2), "interactive");
        assert_eq!(SessionClass::proto_name(7), "class 7");
    }

    #[test]
    fn deadlines_travel_in_whole_microseconds_rounded_up() {
        assert_eq!(deadline_us(None), 0);
        assert_eq!(deadline_us(Some(Duration::from_millis(5))), 5_000);
        assert_eq!(deadline_us(Some(Duration::from_nanos(1))), 1);
        assert_eq!(deadline_us(Some(Duration::from_nanos(2_001))), 3);
        assert_eq!(deadline_us(Some(Duration::MAX)), u64::MAX);
        assert_eq!(deadline_from_us(0), None);
        assert_eq!(deadline_from_us(2_500), Some(Duration::from_micros(2_500)));
    }
}
