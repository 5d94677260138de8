//! What a session's work is: batch or interactive, and an interactive session's deadline.
//!
//! A session says its class when it opens (`OpenSessionRequest.session_class`), and the policy
//! (`auth.rules[].classes`) says which callers may ask for which. The executor reads it from
//! every work item ([`crate::executor::WorkItem::priority`]) whatever transport admitted it:
//!
//! - **Batch** (the default): sessions share the device equally by device time, and their
//!   single dispatches ring together in doorbell batches of up to 32.
//! - **Interactive**: work a person waits for. Its dispatches go first into the next doorbell,
//!   which carries interactive work only; in the device's shares it weighs
//!   `executor.interactive_weight` batch sessions, so it is served ahead of them without
//!   starving them (with `k` interactive sessions saturating the device, `n` batch sessions
//!   still share at least `n / (n + k·weight)` of it). While it is active (it had work queued
//!   within `executor.interactive_idle_ms`), every other doorbell is kept short enough that
//!   its next dispatch waits for at most one of them: half its deadline (by default
//!   `executor.interactive_deadline_us`, 1 ms), never less than a lone dispatch's doorbell (a
//!   tight deadline has batch sessions ring one dispatch a doorbell, at their throughput's
//!   cost).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest deadline a session may ask for.
pub const MAX_DEADLINE: Duration = Duration::from_secs(10);

/// A session's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    #[default]
    Batch,
    Interactive,
}

impl Class {
    /// Every class, in the order statistics list them.
    pub const ALL: [Class; 2] = [Class::Batch, Class::Interactive];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Batch => "batch",
            Self::Interactive => "interactive",
        }
    }

    /// Its index in [`Class::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Class {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "batch" => Ok(Self::Batch),
            "interactive" => Ok(Self::Interactive),
            other => Err(format!(
                "unknown session class {other:?}: \"batch\" or \"interactive\""
            )),
        }
    }
}

/// A session's class and, for an interactive one, its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Priority {
    pub class: Class,
    /// The time each dispatch may take from admission to its answer.
    pub deadline: Option<Duration>,
}

impl Priority {
    pub const BATCH: Priority = Priority {
        class: Class::Batch,
        deadline: None,
    };

    pub fn interactive(deadline: Option<Duration>) -> Self {
        Self {
            class: Class::Interactive,
            deadline,
        }
    }

    /// A priority as a session asks for it: an interactive session that asks for no deadline
    /// (0) has `default` (`executor.interactive_deadline_us`).
    ///
    /// # Errors
    /// The reason, for INVALID_ARGUMENT: a deadline on a batch session, or one past
    /// [`MAX_DEADLINE`].
    pub fn asked(class: Class, deadline_us: u64, default: Duration) -> Result<Self, String> {
        let deadline = match (class, deadline_us) {
            (Class::Interactive, 0) => Some(default),
            (_, 0) => None,
            (_, us) => Some(Duration::from_micros(us)),
        };
        if class == Class::Batch && deadline.is_some() {
            return Err(
                "deadline_us: only interactive sessions have a deadline (session_class is batch)"
                    .into(),
            );
        }
        if deadline.is_some_and(|d| d > MAX_DEADLINE) {
            return Err(format!(
                "deadline_us: {deadline_us} µs; at most {} µs",
                MAX_DEADLINE.as_micros()
            ));
        }
        Ok(Self { class, deadline })
    }

    /// The deadline in µs, 0 for none.
    pub fn deadline_us(&self) -> u64 {
        self.deadline
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    pub fn is_interactive(&self) -> bool {
        self.class == Class::Interactive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_named_as_the_configuration_names_it() {
        for c in Class::ALL {
            assert_eq!(c.as_str().parse::<Class>(), Ok(c));
            assert_eq!(Class::ALL[c.index()], c);
        }
        assert!("Interactive".parse::<Class>().is_err());
    }

    #[test]
    fn only_interactive_sessions_have_a_bounded_deadline() {
        let default = Duration::from_millis(1);
        let asked = |class, us| Priority::asked(class, us, default);
        assert_eq!(asked(Class::Batch, 0), Ok(Priority::BATCH));
        assert!(asked(Class::Batch, 1000).unwrap_err().contains("batch"));
        let p = asked(Class::Interactive, 2000).unwrap();
        assert_eq!(
            (p.deadline, p.deadline_us()),
            (Some(Duration::from_millis(2)), 2000)
        );
        assert_eq!(
            asked(Class::Interactive, 0).unwrap().deadline,
            Some(default),
            "none asked: the default"
        );
        assert!(
            asked(Class::Interactive, 10_000_001)
                .unwrap_err()
                .contains("at most 10000000")
        );
    }
}
