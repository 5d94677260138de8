//! What one call's request messages hold in the daemon's queued-bytes budget
//! (`limits.max_queued_request_bytes`, [`crate::budget`]), and when each is given back.
//!
//! A message is charged in two steps: before its bytes are gathered, what they may take at
//! most (its length on the wire, or for a compressed one that plus the most it may inflate
//! to); once scanned, what it holds (its bytes plus the estimate of its decoded size). It is
//! given back by the call's [`Hold`]: a one-request call's when its handler returns (the
//! handler owned the decoded message until then); a client stream's (`WriteTensor`) when the
//! handler asks for the next message (it has written the previous one); a bidirectional
//! stream's (`Submit`) when the response message that answers it goes out, oldest first.
//! Whatever is still held is given back when the call is gone.
//!
//! Cost: one uncontended mutex and one atomic compare-and-swap per message and step.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use crate::budget::{MemoryBudget, Queued};
use crate::error::NpudError;

use super::schema::Flow;

/// When a call's messages are given back (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    UntilReturned,
    UntilNext,
    UntilAnswered,
}

impl Hold {
    pub fn of(flow: Flow) -> Self {
        match flow {
            Flow::OneRequest => Self::UntilReturned,
            Flow::ClientStream => Self::UntilNext,
            Flow::Bidi => Self::UntilAnswered,
        }
    }
}

#[derive(Debug)]
struct State {
    /// Everything the call holds.
    queued: Queued,
    /// The message being gathered or scanned.
    pending: u64,
    /// The last message handed to the handler (`UntilNext`).
    last: u64,
    /// Messages handed and not yet answered, oldest first (`UntilAnswered`).
    unanswered: VecDeque<u64>,
}

/// One call's charges (see the module docs).
#[derive(Debug)]
pub struct Ledger {
    budget: MemoryBudget,
    hold: Hold,
    state: Mutex<State>,
}

impl Ledger {
    pub fn new(budget: MemoryBudget, hold: Hold) -> Self {
        let queued = budget.queued();
        Self {
            budget,
            hold,
            state: Mutex::new(State {
                queued,
                pending: 0,
                last: 0,
                unanswered: VecDeque::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The message being read will hold `n` bytes from now: more are reserved, or the excess
    /// given back.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming `limits.max_queued_request_bytes` when more would pass it
    /// (the message keeps what it held).
    pub fn settle(&self, n: u64) -> Result<(), NpudError> {
        let mut s = self.state();
        let s = &mut *s;
        if n > s.pending {
            self.budget.reserve(&mut s.queued, n - s.pending)?;
        } else {
            s.queued.release(s.pending - n);
        }
        s.pending = n;
        Ok(())
    }

    /// The message read, holding `n` bytes, is handed to the handler: as [`Ledger::settle`],
    /// then it is held as the call's [`Hold`] says. One lock for both.
    ///
    /// # Errors
    /// As [`Ledger::settle`]; the message is then not handed.
    pub fn hand(&self, n: u64) -> Result<(), NpudError> {
        let mut s = self.state();
        let st = &mut *s;
        if n > st.pending {
            self.budget.reserve(&mut st.queued, n - st.pending)?;
        } else {
            st.queued.release(st.pending - n);
        }
        st.pending = 0;
        match self.hold {
            Hold::UntilReturned => {}
            Hold::UntilNext => {
                let last = std::mem::replace(&mut st.last, n);
                st.queued.release(last);
            }
            Hold::UntilAnswered => st.unanswered.push_back(n),
        }
        Ok(())
    }

    /// The message read is handed to the handler: it is held as the call's [`Hold`] says.
    #[cfg(test)]
    fn handed(&self) {
        let mut s = self.state();
        let n = std::mem::take(&mut s.pending);
        match self.hold {
            Hold::UntilReturned => {}
            Hold::UntilNext => {
                let last = std::mem::replace(&mut s.last, n);
                s.queued.release(last);
            }
            Hold::UntilAnswered => s.unanswered.push_back(n),
        }
    }

    /// The handler asks for the next message: under `UntilNext`, the last one is given back.
    pub fn next_asked(&self) {
        if self.hold == Hold::UntilNext {
            let mut s = self.state();
            let last = std::mem::take(&mut s.last);
            s.queued.release(last);
        }
    }

    /// `n` response messages went out: under `UntilAnswered`, the oldest `n` messages are
    /// given back.
    pub fn answered(&self, n: usize) {
        if self.hold != Hold::UntilAnswered {
            return;
        }
        let mut s = self.state();
        for _ in 0..n {
            match s.unanswered.pop_front() {
                Some(b) => s.queued.release(b),
                None => break,
            }
        }
    }

    /// The handler returned: under `UntilReturned` and `UntilNext` everything handed to it is
    /// given back.
    pub fn returned(&self) {
        if self.hold == Hold::UntilAnswered {
            return;
        }
        let mut s = self.state();
        let keep = s.pending;
        let all = s.queued.held();
        s.queued.release(all - keep);
        s.last = 0;
    }

    /// Bytes the call holds now.
    pub fn held(&self) -> u64 {
        self.state().queued.held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits;

    fn budget(max: u64) -> MemoryBudget {
        MemoryBudget::new(&Limits {
            max_queued_request_bytes: max,
            ..Limits::default()
        })
    }

    #[test]
    fn each_hold_gives_messages_back_when_it_says() {
        let b = budget(1000);
        let l = Ledger::new(b.clone(), Hold::UntilAnswered);
        for n in [100, 200, 300] {
            l.settle(n / 2).unwrap();
            l.settle(n).unwrap();
            l.handed();
        }
        assert_eq!(b.queued_now(), 600);
        l.answered(2);
        assert_eq!(b.queued_now(), 300);
        l.returned();
        assert_eq!(
            b.queued_now(),
            300,
            "a stream's returned handler holds its messages"
        );
        drop(l);
        assert_eq!(b.queued_now(), 0);

        let l = Ledger::new(b.clone(), Hold::UntilNext);
        l.settle(400).unwrap();
        l.handed();
        l.settle(500).unwrap();
        let e = l.settle(700).unwrap_err();
        assert!(
            e.message().contains("limits.max_queued_request_bytes"),
            "{e}"
        );
        assert_eq!(b.queued_now(), 900);
        l.next_asked();
        assert_eq!(b.queued_now(), 500);
        l.settle(700).unwrap();
        l.handed();
        l.returned();
        assert_eq!(b.queued_now(), 0);

        let l = Ledger::new(b.clone(), Hold::UntilReturned);
        l.settle(10).unwrap();
        l.handed();
        l.next_asked();
        l.answered(1);
        assert_eq!(l.held(), 10);
        l.returned();
        assert_eq!(b.queued_now(), 0);
    }
}
