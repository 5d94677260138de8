//! One lifecycle for everything a principal holds.
//!
//! Whatever a caller holds open in the daemon (a gRPC call or stream, a dispatch ring and its
//! lifeline on the fd socket) holds a [`Life`]: its session's, or, for a call outside a
//! session, its principal's. Four events end lives, all here, whatever the transport:
//!
//! - **Revocation** ([`Lifecycle::revoke`]): a token identity's file was removed or rewritten.
//!   The principal's own life and the life of every session charged to it end with
//!   UNAUTHENTICATED, and the sessions are returned for their owner (the server) to end.
//! - **Cool-down** ([`Lifecycle::cool_down`]): an identity spent its device-fault budget. What
//!   keeps admitting work for the sessions charged to it (their Submit streams and rings,
//!   which watch [`Lifecycle::stream_life`]) stops admitting, answers what it admitted, and
//!   ends with RESOURCE_EXHAUSTED naming the cool-down; the sessions themselves (their tensors
//!   and programs) stay, and get fresh stream lives for whatever they open next. A unary call
//!   in flight is not ended: the executor answers it, with its own result or with the
//!   cool-down's refusal when it reaches the device, so the call whose fault spent the budget
//!   reads its fault, as does a stream's.
//! - **Session end** ([`Lifecycle::end_session`]): closed, expired, or revoked. Its life ends
//!   with UNAUTHENTICATED naming how.
//! - **Shutdown** ([`Lifecycle::shutdown`]): every life ends with UNAVAILABLE.
//!
//! A holder waits on [`Life::ended`] (or polls [`Life::is_ended`]) and answers with
//! [`Life::why`]. A life ends once; what ended it is the first reason given.
//!
//! Cost: [`Lifecycle::session_life`] and [`Lifecycle::principal_life`] are one map lookup under
//! a mutex and an `Arc` clone; the map of principals holds weak references, swept when it has
//! doubled since the last sweep, so it is bounded by the principals that hold something.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::NpudError;

/// The message of the UNAVAILABLE that ends open calls at shutdown.
pub const SHUTTING_DOWN: &str = "npud is shutting down; no work of this call was running \
                                 (retry against the daemon that replaces it)";

/// What a holder holds: it ends once, with a reason.
#[derive(Debug)]
pub struct Life {
    token: CancellationToken,
    why: OnceLock<NpudError>,
    /// The life this one ends with (a session's stream life ends with the session's life).
    parent: Option<Arc<Life>>,
}

impl Life {
    fn new(parent: &CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            token: parent.child_token(),
            why: OnceLock::new(),
            parent: None,
        })
    }

    /// A life that also ends when `parent` ends, with its reason.
    fn within(parent: &Arc<Life>) -> Arc<Self> {
        Arc::new(Self {
            token: parent.token.child_token(),
            why: OnceLock::new(),
            parent: Some(parent.clone()),
        })
    }

    /// Ends this life with `why`, unless it has ended already.
    fn end(&self, why: NpudError) {
        let _ = self.why.set(why);
        self.token.cancel();
    }

    /// Whether the life has ended.
    pub fn is_ended(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves when the life ends.
    pub fn ended(&self) -> WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }

    /// Why the life ended (UNAVAILABLE at shutdown, which ends every life at once).
    pub fn why(&self) -> NpudError {
        if let Some(w) = self.why.get() {
            return w.clone();
        }
        match &self.parent {
            Some(p) => p.why(),
            None => NpudError::Unavailable(SHUTTING_DOWN.into()),
        }
    }
}

#[derive(Debug)]
struct SessionEntry {
    life: Arc<Life>,
    /// Within `life`; also ended by a cool-down (then replaced).
    streams: Arc<Life>,
    /// The names it is charged to, its owner first (`auth::Identity::key`).
    charged: Arc<[Arc<str>]>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: crate::IdMap<u64, SessionEntry>,
    principals: HashMap<Arc<str>, Weak<Life>>,
    /// `principals.len()` after the last sweep of dead entries.
    swept: usize,
}

/// Every life, and the four events that end them (see the module docs).
#[derive(Debug)]
pub struct Lifecycle {
    root: CancellationToken,
    inner: Mutex<Inner>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    pub fn new() -> Self {
        Self {
            root: CancellationToken::new(),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update is a single map operation: consistent across a panic elsewhere.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives session `id`, charged to `charged` (its owner first), a life.
    pub fn open_session(&self, id: u64, charged: &[Arc<str>]) {
        let life = Life::new(&self.root);
        let streams = Life::within(&life);
        self.lock().sessions.insert(
            id,
            SessionEntry {
                life,
                streams,
                charged: charged.into(),
            },
        );
    }

    /// The life of session `id`'s unary calls; `None` for a session that has no life (never
    /// opened, or ended).
    pub fn session_life(&self, id: u64) -> Option<Arc<Life>> {
        self.lock().sessions.get(&id).map(|s| s.life.clone())
    }

    /// The life of what keeps admitting work for session `id` (its streams and its ring):
    /// ended by a cool-down too.
    pub fn stream_life(&self, id: u64) -> Option<Arc<Life>> {
        self.lock().sessions.get(&id).map(|s| s.streams.clone())
    }

    /// The life of principal `name`'s calls outside a session.
    pub fn principal_life(&self, name: &Arc<str>) -> Arc<Life> {
        let mut g = self.lock();
        if let Some(l) = g.principals.get(name).and_then(Weak::upgrade)
            && !l.is_ended()
        {
            return l;
        }
        let life = Life::new(&self.root);
        g.principals.insert(name.clone(), Arc::downgrade(&life));
        if g.principals.len() >= 2 * g.swept.max(64) {
            g.principals.retain(|_, w| w.strong_count() > 0);
            g.swept = g.principals.len();
        }
        life
    }

    /// Ends session `id`'s life with `why` and forgets it.
    pub fn end_session(&self, id: u64, why: NpudError) {
        if let Some(s) = self.lock().sessions.remove(&id) {
            s.life.end(why);
        }
    }

    /// Revokes principal `name`: its life and every life of the sessions charged to it end
    /// with `why`; returns those sessions (forgotten here), for the caller to end.
    pub fn revoke(&self, name: &str, why: &NpudError) -> Vec<u64> {
        let mut g = self.lock();
        if let Some(l) = g.principals.remove(name).and_then(|w| w.upgrade()) {
            l.end(why.clone());
        }
        let ended: Vec<u64> = g
            .sessions
            .iter()
            .filter(|(_, s)| s.charged.iter().any(|c| &**c == name))
            .map(|(id, _)| *id)
            .collect();
        for id in &ended {
            if let Some(s) = g.sessions.remove(id) {
                s.life.end(why.clone());
            }
        }
        ended
    }

    /// Cools principal `name` down: the stream lives of the sessions charged to it end with
    /// `why`, and are replaced. Returns how many ended.
    pub fn cool_down(&self, name: &str, why: &NpudError) -> usize {
        let mut g = self.lock();
        let mut n = 0;
        for s in g.sessions.values_mut() {
            if s.charged.iter().any(|c| &**c == name) {
                s.streams.end(why.clone());
                s.streams = Life::within(&s.life);
                n += 1;
            }
        }
        n
    }

    /// Ends every life with UNAVAILABLE.
    pub fn shutdown(&self) {
        self.root.cancel();
    }

    /// Whether [`Lifecycle::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.root.is_cancelled()
    }

    /// Sessions with a life.
    pub fn sessions(&self) -> usize {
        self.lock().sessions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<Arc<str>> {
        v.iter().map(|s| Arc::<str>::from(*s)).collect()
    }

    #[test]
    fn revocation_ends_the_principal_and_every_session_charged_to_it() {
        let l = Lifecycle::new();
        l.open_session(1, &names(&["token:a@x", "uid:1000"]));
        l.open_session(2, &names(&["uid:1000"]));
        l.open_session(3, &names(&["token:b@x", "uid:1000"]));
        let s1 = l.session_life(1).unwrap();
        let s2 = l.session_life(2).unwrap();
        let p = l.principal_life(&"token:a@x".into());
        let why = NpudError::Unauthenticated("token:a@x was revoked".into());
        assert_eq!(l.revoke("token:a@x", &why), vec![1]);
        assert!(s1.is_ended() && p.is_ended() && !s2.is_ended());
        assert_eq!(s1.why(), why);
        assert!(l.session_life(1).is_none());
        assert_eq!(l.sessions(), 2);
    }

    #[test]
    fn a_cool_down_ends_streams_and_rings_and_the_session_lives_on() {
        let l = Lifecycle::new();
        l.open_session(1, &names(&["token:a@x", "uid:1000"]));
        let calls = l.session_life(1).unwrap();
        let before = l.stream_life(1).unwrap();
        let why = NpudError::ResourceExhausted("uid:1000 faulted the device 3 times".into());
        assert_eq!(l.cool_down("uid:1000", &why), 1);
        assert!(before.is_ended());
        assert_eq!(before.why(), why);
        assert!(
            !calls.is_ended(),
            "unary calls are answered by the executor"
        );
        let after = l.stream_life(1).unwrap();
        assert!(!after.is_ended());
        // The session's end ends its streams with the session's reason.
        let gone = NpudError::Unauthenticated("session 1 was closed".into());
        l.end_session(1, gone.clone());
        assert!(after.is_ended());
        assert_eq!(after.why(), gone);
    }

    #[tokio::test]
    async fn session_end_and_shutdown_end_lives_with_their_reasons() {
        let l = Lifecycle::new();
        l.open_session(1, &names(&["uid:1"]));
        let s = l.session_life(1).unwrap();
        let ended = s.ended();
        l.end_session(1, NpudError::Unauthenticated("session 1 was closed".into()));
        ended.await;
        assert_eq!(s.why().message(), "session 1 was closed");
        l.open_session(2, &names(&["uid:1"]));
        let s2 = l.session_life(2).unwrap();
        let p = l.principal_life(&"anonymous".into());
        l.shutdown();
        s2.ended().await;
        assert!(p.is_ended());
        assert_eq!(s2.why().code(), tonic::Code::Unavailable);
        assert_eq!(s2.why().message(), SHUTTING_DOWN);
        // A life given after shutdown is born ended.
        assert!(l.principal_life(&"uid:2".into()).is_ended());
    }

    #[test]
    fn the_map_of_principals_keeps_only_those_that_hold_something() {
        let l = Lifecycle::new();
        let kept = l.principal_life(&"uid:1".into());
        for i in 0..10_000 {
            drop(l.principal_life(&format!("anonymous@10.0.{}.{}", i / 256, i % 256).into()));
        }
        assert!(
            l.lock().principals.len() < 200,
            "{}",
            l.lock().principals.len()
        );
        assert!(Arc::ptr_eq(&kept, &l.principal_life(&"uid:1".into())));
    }
}
