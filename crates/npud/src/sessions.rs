//! The session registry: ids, secret tokens, the identity each session is bound to and the
//! quotas its rule grants, the connections that used each
//! session, and when the last of them closed.
//!
//! A session ends when it is closed, or when it has had no open connection for the grace
//! period ([`Sessions::take_expired`], polled by the reaper in `server`). The registry holds
//! plain data behind a `std::sync::Mutex` (never held across an await); what a session owns on
//! the device is released by the caller of [`Sessions::close`] / [`Sessions::take_expired`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;

use crate::auth::{Grant, Identity};
use crate::error::NpudError;
use crate::peer::ConnInfo;
use crate::priority::{Class, Priority};
use crate::request_ids::{Claim, Replay, SessionIds};
use crate::stats::{DispatchStats, Tally};

/// Longest client name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

#[derive(Debug)]
struct Session {
    token: String,
    client_name: String,
    uid: Option<u32>,
    owner: Identity,
    /// The owner and the other identities its connection proved, which the session counts
    /// against (see `auth`).
    charged: crate::faults::Charged,
    grant: Arc<Grant>,
    /// Its class and deadline, as its rule allowed them.
    priority: Priority,
    /// Dispatches and chains of this session waiting or running (for a rule's
    /// `max_pending_per_session`).
    pending: Arc<AtomicU32>,
    conns: HashSet<u64>,
    disconnected_at: Option<Instant>,
    stats: DispatchStats,
    /// The request ids of the session's calls (see `request_ids`).
    ids: SessionIds,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: crate::IdMap<u64, Session>,
    next_id: u64,
    opened: u64,
    ended: u64,
    /// The last [`ENDED_WINDOW`] sessions that ended, oldest first, with their token and how
    /// they ended, so that a caller still holding the token is told which it was.
    gone: VecDeque<(u64, String, Ended)>,
    /// Bytes of remembered request ids, by the principal owning their sessions
    /// ([`Identity::key`]).
    id_bytes: HashMap<Arc<str>, u64>,
    /// What each class's sessions did, in [`Class::ALL`] order (ended sessions' work too).
    classes: [ClassTotals; 2],
}

/// A class's work since start.
#[derive(Debug, Default)]
struct ClassTotals {
    stats: DispatchStats,
    deadline_missed: u64,
}

/// What statistics report of one class.
#[derive(Debug, Clone)]
pub struct ClassSnapshot {
    pub class: Class,
    /// Its sessions open now.
    pub open: usize,
    pub stats: DispatchStats,
    /// Its completed dispatches that took longer than their session's deadline.
    pub deadline_missed: u64,
}

/// Ended sessions remembered for their callers' error messages (about 64 bytes each).
pub const ENDED_WINDOW: usize = 1024;

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// CloseSession.
    Closed,
    /// No connection for the grace period.
    Expired,
    /// Its identity was revoked (its token file removed or rewritten).
    Revoked,
}

impl Inner {
    /// Removes a session, giving back what its request ids were charged.
    fn remove(&mut self, id: u64) -> Option<Session> {
        let s = self.sessions.remove(&id)?;
        self.charge_ids(
            &s.owner.key(),
            -i64::try_from(s.ids.bytes()).unwrap_or(i64::MAX),
        );
        Some(s)
    }

    /// Changes what `principal`'s request ids are charged by `delta` bytes.
    fn charge_ids(&mut self, principal: &Arc<str>, delta: i64) {
        if delta == 0 {
            return;
        }
        let now = self.id_bytes.get(principal).copied().unwrap_or(0);
        let next = now.saturating_add_signed(delta);
        if next == 0 {
            self.id_bytes.remove(principal);
        } else {
            self.id_bytes.insert(principal.clone(), next);
        }
    }

    fn remember_gone(&mut self, id: u64, token: String, how: Ended) {
        while self.gone.len() >= ENDED_WINDOW {
            self.gone.pop_front();
        }
        self.gone.push_back((id, token, how));
    }
}

/// What statistics report of one session.
#[derive(Debug, Clone)]
pub struct SessionSnapshot {
    pub id: u64,
    pub client_name: String,
    pub uid: Option<u32>,
    pub owner: Identity,
    pub connected: bool,
    pub stats: DispatchStats,
    /// Work items admitted and not answered yet.
    pub pending: u32,
    pub priority: Priority,
}

/// What admitting a session's work needs of it.
#[derive(Debug)]
pub struct ForAdmission {
    pub grant: Arc<Grant>,
    /// Its pending count.
    pub pending: Arc<AtomicU32>,
    /// The identities its faults charge.
    pub charged: crate::faults::Charged,
    pub priority: Priority,
}

/// Every open session.
#[derive(Debug)]
pub struct Sessions {
    inner: Mutex<Inner>,
    grace: Duration,
    max: u32,
}

impl Sessions {
    /// A registry of at most `max` sessions (each identity's own limit is its rule's).
    pub fn new(grace: Duration, max: u32) -> Self {
        Self {
            inner: Mutex::new(Inner {
                next_id: 1,
                ..Inner::default()
            }),
            grace,
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The data stays consistent across a panic in another thread: every update is a
        // single map operation.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Opens a session bound to `owner`, with the quotas of `grant`, also counted against
    /// each identity of `also` (with its own grant's session quota).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a name over 128 bytes; RESOURCE_EXHAUSTED at `max_sessions`, or
    /// when `owner` or one of `also` holds its rule's number of sessions
    /// (`limits.max_sessions_per_uid` unless the rule lowers it).
    pub fn open(
        &self,
        client_name: &str,
        conn: Option<&ConnInfo>,
        owner: &Identity,
        grant: &Arc<Grant>,
        also: &[(Identity, Arc<Grant>)],
        priority: Priority,
    ) -> Result<(u64, String), NpudError> {
        grant.allows(priority.class)?;
        if client_name.len() > MAX_NAME_BYTES {
            return Err(NpudError::InvalidArgument(format!(
                "client_name: {} bytes; at most {MAX_NAME_BYTES}",
                client_name.len()
            )));
        }
        let token = new_token()?;
        let mut g = self.lock();
        if g.sessions.len() >= self.max as usize {
            return Err(NpudError::ResourceExhausted(format!(
                "the daemon already has {} sessions (limits.max_sessions)",
                g.sessions.len()
            )));
        }
        let uid = conn.and_then(|c| c.uid);
        for (who, grant) in std::iter::once((owner, grant)).chain(also.iter().map(|(w, g)| (w, g)))
        {
            let key = who.key();
            let mine = g
                .sessions
                .values()
                .filter(|s| s.charged.names().contains(&key))
                .count();
            let quota = &grant.quotas.sessions;
            if mine >= quota.max as usize {
                let via = if who == owner {
                    String::new()
                } else {
                    format!(" (this {owner} connection is also {who}, and counts as it)")
                };
                return Err(NpudError::ResourceExhausted(format!(
                    "{who} already has {mine} sessions ({}){via}; close one, or let an \
                     abandoned one end after its grace period",
                    quota.key
                )));
            }
        }
        let charged = crate::faults::Charged::new(owner.key(), also.iter().map(|(w, _)| w.key()));
        let id = g.next_id;
        g.next_id += 1;
        g.opened += 1;
        let (conns, disconnected_at) = match conn {
            Some(c) => (HashSet::from([c.id]), None),
            None => (HashSet::new(), Some(Instant::now())),
        };
        g.sessions.insert(
            id,
            Session {
                token: token.clone(),
                // Shown in statistics, metrics and logs: control characters escaped.
                client_name: crate::auth::escape_controls(client_name),
                uid,
                owner: owner.clone(),
                charged,
                grant: grant.clone(),
                priority,
                pending: Arc::new(AtomicU32::new(0)),
                conns,
                disconnected_at,
                stats: DispatchStats::default(),
                ids: SessionIds::default(),
            },
        );
        Ok((id, token))
    }

    /// The session a request's metadata names, after checking its token and that `who`
    /// opened it; the request's connection is attached to it.
    ///
    /// # Errors
    /// UNAUTHENTICATED for missing or wrong metadata; PERMISSION_DENIED for another identity.
    pub fn authenticate(
        &self,
        md: &MetadataMap,
        conn: Option<&ConnInfo>,
        who: &Identity,
    ) -> Result<u64, NpudError> {
        let text = |key: &str| md.get(key).and_then(|v| v.to_str().ok());
        let id = text(npu_proto::SESSION_HEADER).ok_or_else(|| {
            NpudError::Unauthenticated(format!(
                "missing {} metadata: call OpenSession first",
                npu_proto::SESSION_HEADER
            ))
        })?;
        let id: u64 = id.trim().parse().map_err(|_| {
            NpudError::Unauthenticated(format!(
                "{}: {id:?} is not a session id",
                npu_proto::SESSION_HEADER
            ))
        })?;
        let token = text(npu_proto::TOKEN_HEADER).ok_or_else(|| {
            NpudError::Unauthenticated(format!(
                "missing {} metadata: send the token OpenSession returned",
                npu_proto::TOKEN_HEADER
            ))
        })?;
        self.attach(id, token, conn, who)
    }

    /// Checks a session's token and that `who` opened it, and attaches the connection.
    ///
    /// # Errors
    /// As [`Sessions::authenticate`].
    pub fn attach(
        &self,
        id: u64,
        token: &str,
        conn: Option<&ConnInfo>,
        who: &Identity,
    ) -> Result<u64, NpudError> {
        let mut g = self.lock();
        let grace = self.grace.as_millis();
        let bad = || {
            NpudError::Unauthenticated(format!(
                "session {id}: unknown session or wrong token (a session ends when it is closed, \
                 or after {grace} ms without a connection: open a new one)"
            ))
        };
        if !g.sessions.contains_key(&id) {
            let how = g
                .gone
                .iter()
                .rev()
                .find(|(gone, t, _)| *gone == id && same_token(t, token))
                .map(|(.., how)| *how);
            return Err(match how {
                Some(Ended::Closed) => NpudError::Unauthenticated(format!(
                    "session {id} was closed (CloseSession): open a new one"
                )),
                Some(Ended::Expired) => NpudError::Unauthenticated(format!(
                    "session {id} ended after {grace} ms without a connection (the grace \
                     period, DeviceInfo.session_grace_ms): open a new one, and keep a \
                     connection open between calls"
                )),
                Some(Ended::Revoked) => NpudError::Unauthenticated(format!(
                    "session {id} ended: the identity that opened it was revoked (its file in \
                     auth.token_dir was removed or rewritten)"
                )),
                None => bad(),
            });
        }
        let s = g.sessions.get_mut(&id).ok_or_else(bad)?;
        if !same_token(&s.token, token) {
            return Err(bad());
        }
        if s.owner != *who {
            return Err(NpudError::PermissionDenied(format!(
                "session {id} belongs to {}; this caller is {who}",
                s.owner
            )));
        }
        if let Some(c) = conn
            && s.conns.insert(c.id)
        {
            s.disconnected_at = None;
        }
        Ok(id)
    }

    /// Removes a session; returns whether it existed.
    pub fn close(&self, id: u64) -> bool {
        self.end(id, Ended::Closed)
    }

    /// Removes a session whose identity was revoked; returns whether it existed.
    pub fn revoke(&self, id: u64) -> bool {
        self.end(id, Ended::Revoked)
    }

    fn end(&self, id: u64, how: Ended) -> bool {
        let mut g = self.lock();
        let Some(s) = g.remove(id) else {
            return false;
        };
        g.ended += 1;
        g.remember_gone(id, s.token, how);
        true
    }

    /// A connection closed: sessions it was the last connection of start their grace period.
    pub fn connection_closed(&self, conn: u64) {
        let mut g = self.lock();
        let now = Instant::now();
        for s in g.sessions.values_mut() {
            if s.conns.remove(&conn) && s.conns.is_empty() {
                s.disconnected_at = Some(now);
            }
        }
    }

    /// Removes and returns the sessions that have been without a connection for the grace
    /// period at `now`.
    pub fn take_expired(&self, now: Instant) -> Vec<u64> {
        let mut g = self.lock();
        let expired: Vec<u64> = g
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.disconnected_at
                    .is_some_and(|t| now.saturating_duration_since(t) >= self.grace)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if let Some(s) = g.remove(*id) {
                g.ended += 1;
                g.remember_gone(*id, s.token, Ended::Expired);
            }
        }
        expired
    }

    /// Counts a finished work item against its session and its session's class.
    pub fn record(&self, id: u64, t: Tally) {
        let g = &mut *self.lock();
        if let Some(s) = g.sessions.get_mut(&id) {
            s.stats.record(t);
            let class = &mut g.classes[s.priority.class.index()];
            class.stats.record(t);
            if let Some(d) = s.priority.deadline
                && t.outcome == crate::stats::Outcome::Success
                && t.queue_ns.saturating_add(t.device_ns)
                    > u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
            {
                class.deadline_missed += t.links;
            }
        }
    }

    /// What each class's sessions did since start, in [`Class::ALL`] order, with the sessions
    /// of each open now.
    pub fn classes(&self) -> Vec<ClassSnapshot> {
        let g = self.lock();
        Class::ALL
            .iter()
            .map(|&class| ClassSnapshot {
                class,
                open: g
                    .sessions
                    .values()
                    .filter(|s| s.priority.class == class)
                    .count(),
                stats: g.classes[class.index()].stats.clone(),
                deadline_missed: g.classes[class.index()].deadline_missed,
            })
            .collect()
    }

    /// The identities a session is charged to, as the fault budget's keys ("" for a session
    /// that has ended).
    pub fn charged(&self, id: u64) -> crate::faults::Charged {
        self.lock()
            .sessions
            .get(&id)
            .map_or_else(|| String::new().into(), |s| s.charged.clone())
    }

    /// What admitting work for session `id` needs, in one lookup: its grant, its count of
    /// pending work, and the identities it is charged to (the fault budget's keys); `None`
    /// for a session that has ended.
    pub fn for_admission(&self, id: u64) -> Option<ForAdmission> {
        self.lock().sessions.get(&id).map(|s| ForAdmission {
            grant: s.grant.clone(),
            pending: s.pending.clone(),
            charged: s.charged.clone(),
            priority: s.priority,
        })
    }

    /// Whether connection `conn` is attached to a session.
    pub fn has_connection(&self, conn: u64) -> bool {
        self.lock()
            .sessions
            .values()
            .any(|s| s.conns.contains(&conn))
    }

    /// Claims request id `c.id` in `session` (see `request_ids`), after forgetting the ids
    /// the client acknowledged (`ack`, from `npud-request-ack`) and those past their horizon;
    /// `max` is `limits.max_request_id_bytes_per_principal`.
    ///
    /// # Errors
    /// As [`SessionIds::claim`]; UNAUTHENTICATED when the session has ended.
    pub fn claim(
        &self,
        session: u64,
        c: Claim,
        ack: Option<u64>,
        max: u64,
    ) -> Result<Replay, NpudError> {
        let mut g = self.lock();
        let inner = &mut *g;
        let s = inner
            .sessions
            .get_mut(&session)
            .ok_or_else(|| NpudError::Unauthenticated(format!("session {session} has ended")))?;
        let principal = s.owner.key();
        let freed = s.ids.forget(ack, Instant::now());
        let held = inner.id_bytes.get(&principal).copied().unwrap_or(0);
        let held = held.saturating_sub(freed);
        let before = s.ids.bytes();
        let r = s.ids.claim(c, max.saturating_sub(held), &s.owner, max);
        let added = s.ids.bytes() - before;
        let delta =
            i64::try_from(added).unwrap_or(i64::MAX) - i64::try_from(freed).unwrap_or(i64::MAX);
        inner.charge_ids(&principal, delta);
        r
    }

    /// Records the end of request id `id`'s call in `session` (see [`SessionIds::finish`]).
    pub fn finish_request(&self, session: u64, id: u64, is_final: bool, answer_bytes: u64) {
        let mut g = self.lock();
        let inner = &mut *g;
        let Some(s) = inner.sessions.get_mut(&session) else {
            return;
        };
        let delta = s.ids.finish(id, is_final, answer_bytes);
        let principal = s.owner.key();
        inner.charge_ids(&principal, delta);
    }

    /// Bytes of remembered request ids `who`'s sessions hold.
    pub fn request_id_bytes(&self, who: &Identity) -> u64 {
        self.lock().id_bytes.get(&who.key()).copied().unwrap_or(0)
    }

    /// The grant a session was opened with, and its count of pending work.
    pub fn grant(&self, id: u64) -> Option<(Arc<Grant>, Arc<AtomicU32>)> {
        self.lock()
            .sessions
            .get(&id)
            .map(|s| (s.grant.clone(), s.pending.clone()))
    }

    pub fn count(&self) -> usize {
        self.lock().sessions.len()
    }

    /// (opened, ended) since start.
    pub fn totals(&self) -> (u64, u64) {
        let g = self.lock();
        (g.opened, g.ended)
    }

    pub fn snapshot(&self) -> Vec<SessionSnapshot> {
        let g = self.lock();
        let mut v: Vec<SessionSnapshot> = g
            .sessions
            .iter()
            .map(|(id, s)| SessionSnapshot {
                id: *id,
                client_name: s.client_name.clone(),
                uid: s.uid,
                owner: s.owner.clone(),
                connected: !s.conns.is_empty(),
                stats: s.stats.clone(),
                pending: s.pending.load(std::sync::atomic::Ordering::Acquire),
                priority: s.priority,
            })
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }
}

/// 16 random bytes as 32 lowercase hex characters.
fn new_token() -> Result<String, NpudError> {
    let mut b = [0u8; 16];
    let mut filled = 0;
    while filled < b.len() {
        match rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(NpudError::Internal(format!(
                    "getrandom failed making a session token: {e}"
                )));
            }
        }
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Compares tokens in time independent of where they differ.
fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn conn(id: u64, uid: u32) -> ConnInfo {
        ConnInfo {
            uid: Some(uid),
            ..ConnInfo::of(id, Identity::uid(uid, [uid]))
        }
    }

    fn grant(max_sessions: u32) -> Arc<Grant> {
        let mut quotas = crate::auth::Quotas::of_limits(&crate::config::Limits::default());
        quotas.sessions.max = max_sessions;
        Arc::new(Grant {
            rule: "local".into(),
            quotas,
            classes: vec![Class::Batch],
        })
    }

    /// Opens a session as the connection's identity.
    fn open(
        s: &Sessions,
        name: &str,
        c: Option<&ConnInfo>,
        max: u32,
    ) -> Result<(u64, String), NpudError> {
        let who = c.map_or_else(|| Identity::anonymous(None), |c| c.identity.clone());
        s.open(name, c, &who, &grant(max), &[], Priority::BATCH)
    }

    fn auth(s: &Sessions, m: &MetadataMap, c: Option<&ConnInfo>) -> Result<u64, NpudError> {
        let who = c.map_or_else(|| Identity::anonymous(None), |c| c.identity.clone());
        s.authenticate(m, c, &who)
    }

    fn md(id: u64, token: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(
            npu_proto::SESSION_HEADER,
            MetadataValue::try_from(id.to_string()).unwrap(),
        );
        m.insert(
            npu_proto::TOKEN_HEADER,
            MetadataValue::try_from(token).unwrap(),
        );
        m
    }

    #[test]
    fn work_counts_in_its_sessions_class_and_misses_against_its_deadline() {
        let s = Sessions::new(Duration::from_secs(1), 8);
        let c = conn(1, 1000);
        let who = c.identity.clone();
        let g = Arc::new(Grant {
            classes: vec![Class::Batch, Class::Interactive],
            ..(*grant(8)).clone()
        });
        let ui = Priority::interactive(Some(Duration::from_millis(1)));
        let (i, _) = s.open("ui", Some(&c), &who, &g, &[], ui).unwrap();
        let (b, _) = s
            .open("job", Some(&c), &who, &g, &[], Priority::BATCH)
            .unwrap();
        let done = |ms: u64| Tally {
            links: 1,
            outcome: crate::stats::Outcome::Success,
            queue_ns: ms * 500_000,
            device_ns: ms * 500_000,
            at_ms: 1,
        };
        // 0.5 ms and 2 ms against a 1 ms deadline; batch work has none to miss.
        s.record(i, done(1));
        s.record(i, done(4));
        s.record(b, done(4));
        s.record(b, Tally::refused(2, "NOT_FOUND"));
        let classes = s.classes();
        let [batch, interactive] = &classes[..] else {
            panic!("{classes:?}")
        };
        assert_eq!((batch.class, batch.open), (Class::Batch, 1));
        assert_eq!(
            (interactive.class, interactive.open),
            (Class::Interactive, 1)
        );
        assert_eq!(interactive.stats.to_proto().success.unwrap().count, 2);
        assert_eq!(interactive.deadline_missed, 1);
        assert_eq!(batch.deadline_missed, 0);
        let b_stats = batch.stats.to_proto();
        assert_eq!(
            (b_stats.success.unwrap().count, b_stats.fail.unwrap().count),
            (1, 2)
        );
        // A class's figures outlive its sessions.
        s.close(i);
        assert_eq!(s.classes()[1].open, 0);
        assert_eq!(s.classes()[1].deadline_missed, 1);
    }

    #[test]
    fn a_session_class_its_rule_does_not_allow_is_refused_before_anything_is_held() {
        let s = Sessions::new(Duration::from_secs(1), 8);
        let c = conn(1, 1000);
        let e = s
            .open(
                "ui",
                Some(&c),
                &c.identity,
                &grant(8),
                &[],
                Priority::interactive(None),
            )
            .unwrap_err();
        assert_eq!(e.code_name(), "PERMISSION_DENIED", "{e}");
        assert_eq!(s.count(), 0);
    }

    #[test]
    fn a_gone_session_says_whether_it_was_closed_or_expired() {
        let s = Sessions::new(Duration::from_millis(1500), 4);
        let c = conn(1, 1000);
        let (closed, t1) = open(&s, "a", Some(&c), 4).unwrap();
        let (expired, t2) = open(&s, "b", Some(&c), 4).unwrap();
        assert!(s.close(closed));
        let e = auth(&s, &md(closed, &t1), Some(&c)).unwrap_err();
        assert!(matches!(e, NpudError::Unauthenticated(_)), "{e}");
        assert_eq!(
            e.message(),
            format!("session {closed} was closed (CloseSession): open a new one")
        );
        assert!(!e.message().contains("grace"), "{e}");
        s.connection_closed(1);
        let later = Instant::now() + Duration::from_secs(2);
        assert_eq!(s.take_expired(later), vec![expired]);
        let e = auth(&s, &md(expired, &t2), Some(&c)).unwrap_err();
        assert!(
            e.message().starts_with(&format!(
                "session {expired} ended after 1500 ms without a connection (the grace period"
            )),
            "{e}"
        );
        // Without its token, a caller learns nothing of how a session ended.
        let e = auth(&s, &md(closed, &t2), Some(&c)).unwrap_err();
        assert!(
            e.message().contains("unknown session or wrong token"),
            "{e}"
        );
    }

    #[test]
    fn tokens_are_32_hex_and_checked() {
        let s = Sessions::new(Duration::from_secs(1), 4);
        let (id, token) = open(&s, "t", Some(&conn(1, 1000)), 4).unwrap();
        assert_eq!(token.len(), 32);
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(auth(&s, &md(id, &token), Some(&conn(1, 1000))), Ok(id));
        let e = auth(&s, &md(id, "00000000000000000000000000000000"), None).unwrap_err();
        assert!(matches!(e, NpudError::Unauthenticated(_)));
        let e = auth(&s, &MetadataMap::new(), None).unwrap_err();
        assert_eq!(
            e.message(),
            "missing npud-session metadata: call OpenSession first"
        );
        let e = auth(&s, &md(id, &token), Some(&conn(2, 1001))).unwrap_err();
        assert!(matches!(e, NpudError::PermissionDenied(_)), "{e}");
        assert_eq!(
            e.message(),
            format!("session {id} belongs to uid:1000; this caller is uid:1001")
        );
        let tcp = ConnInfo::of(3, Identity::anonymous(None));
        let e = auth(&s, &md(id, &token), Some(&tcp)).unwrap_err();
        assert!(matches!(e, NpudError::PermissionDenied(_)), "{e}");
    }

    #[test]
    fn grace_starts_when_the_last_connection_closes() {
        let s = Sessions::new(Duration::from_millis(100), 4);
        let (id, token) = open(&s, "t", Some(&conn(1, 5)), 4).unwrap();
        s.attach(id, &token, Some(&conn(2, 5)), &Identity::uid(5, [5]))
            .unwrap();
        s.connection_closed(1);
        let later = Instant::now() + Duration::from_secs(10);
        assert!(s.take_expired(later).is_empty(), "conn 2 is still open");
        s.connection_closed(2);
        assert!(s.take_expired(Instant::now()).is_empty(), "within grace");
        assert_eq!(s.take_expired(later), vec![id]);
        assert_eq!(s.totals(), (1, 1));
    }

    #[test]
    fn max_sessions_is_resource_exhausted() {
        let s = Sessions::new(Duration::from_secs(1), 1);
        open(&s, "a", None, 4).unwrap();
        let e = open(&s, "b", None, 4).unwrap_err();
        assert!(matches!(e, NpudError::ResourceExhausted(_)));
        assert!(e.message().contains("limits.max_sessions"));
    }

    #[test]
    fn one_uid_cannot_take_every_session() {
        let s = Sessions::new(Duration::from_secs(1), 8);
        open(&s, "a", Some(&conn(1, 1000)), 2).unwrap();
        open(&s, "b", Some(&conn(1, 1000)), 2).unwrap();
        let e = open(&s, "c", Some(&conn(1, 1000)), 2).unwrap_err();
        assert!(matches!(e, NpudError::ResourceExhausted(_)));
        assert!(
            e.message()
                .starts_with("uid:1000 already has 2 sessions (limits.max_sessions_per_uid)"),
            "{e}"
        );
        // Another user still gets one.
        open(&s, "d", Some(&conn(2, 1001)), 4).unwrap();
    }

    #[test]
    fn request_ids_are_charged_to_the_principal_across_its_sessions_and_end_with_them() {
        use crate::request_ids::ENTRY_BYTES;
        let s = Sessions::new(Duration::from_secs(1), 4);
        let c = conn(1, 1000);
        let who = c.identity.clone();
        let (a, _) = open(&s, "a", Some(&c), 4).unwrap();
        let (b, _) = open(&s, "b", Some(&c), 4).unwrap();
        let max = 3 * ENTRY_BYTES;
        let later = Instant::now() + Duration::from_secs(60);
        let claim = |id| Claim {
            id,
            call: "Dispatch",
            fingerprint: 1,
            expires: later,
        };
        assert!(matches!(
            s.claim(a, claim(1), None, max),
            Ok(Replay::First(_))
        ));
        s.finish_request(a, 1, true, 0);
        assert!(matches!(
            s.claim(b, claim(1), None, max),
            Ok(Replay::First(_))
        ));
        assert!(matches!(
            s.claim(b, claim(2), None, max),
            Ok(Replay::First(_))
        ));
        assert_eq!(s.request_id_bytes(&who), 3 * ENTRY_BYTES);
        let e = s.claim(a, claim(2), None, max).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        // Another principal is not charged for them.
        let other = conn(2, 1001);
        let (x, _) = open(&s, "x", Some(&other), 4).unwrap();
        assert!(matches!(
            s.claim(x, claim(1), None, max),
            Ok(Replay::First(_))
        ));
        // The client acknowledges id 1 of session a: room for one.
        assert!(matches!(
            s.claim(a, claim(2), Some(2), max),
            Ok(Replay::First(_))
        ));
        // They end with their sessions.
        s.close(a);
        s.close(b);
        assert_eq!(s.request_id_bytes(&who), 0);
        assert_eq!(
            s.claim(a, claim(3), None, max).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }
}
