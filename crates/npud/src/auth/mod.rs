//! Who may call, and how much they may hold: identities, the `[auth]` policy, admins, and
//! token identities.
//!
//! Every call has an identity (see [`Identity`]): `uid:<n>` (with groups `gid:<n>`) on the Unix
//! socket and over TCP from this host (the kernel's socket table names the peer's user; see
//! [`local`]), `cert:dns:<name>` (or `cert:uri:`, `cert:email:`, `cert:cn:`) over mTLS,
//! `anonymous` over loopback TCP when the peer's user is unknown or may not use the Unix
//! socket (and `anonymous@<address>` from any other address without credentials), or
//! `token:<file>@<allocation>` when the call carries an `x-npud-token` secret from
//! `auth.token_dir`, which replaces the transport's identity (see `tokens`; on the listeners
//! `auth.require_token` names, a local caller without one may call only GetDeviceInfo and
//! health).
//!
//! **A caller is one principal.** A connection can prove several things at once: the local
//! user on its other end (Unix socket, or TCP from this host), a client certificate, and a
//! call's token. The principal, which owns the sessions it opens and whose rule sets their
//! quotas, is the strongest of them: the token, else the certificate, else the local user,
//! else anonymous. Every other identity the connection proves that the policy would serve on
//! its own ([`Policy::charged`]) is charged as well: each session counts against its session
//! quota, and each device fault against its fault budget, and a cool-down of any of them
//! stops the session's work. So a process cannot hold more sessions or cause more faults by
//! presenting, on one listener or another, credentials it can get on its own: it can hold at
//! most what the one identity the kernel knows it by may hold. (Where the policy serves no
//! bare uid, e.g. pods that share a uid and carry tokens, the uid is not charged, and each
//! token is a principal of its own.)
//!
//! `auth.rules` is an ordered list; the first rule one of whose `match` patterns matches the
//! identity's name or one of its groups decides: `allow = false` refuses, otherwise the caller
//! may open sessions, with the rule's quotas (each unset one is the `limits.*` key's value; a
//! rule can lower a limit, never raise it). An identity no rule matches is refused. Refusals
//! name the rule: PERMISSION_DENIED for a known identity, UNAUTHENTICATED for an anonymous one.
//!
//! The default rules allow `uid:*` (any local user, on the Unix socket or over TCP from this
//! host), `cert:*` (any client certificate `tls.client_ca` signed) and `token:*` (any file in
//! `auth.token_dir`): what a caller without credentials may do (remote, or a local user the
//! Unix socket's mode keeps out) is nothing but `GetDeviceInfo` and health checks. A rule
//! matching `anonymous` serves loopback callers without a known user, all as one identity.
//!
//! Admins (`auth.admins`; default `uid:0`, `user:npud` and `self`, the uid the daemon runs as)
//! may see every session's statistics and clear quarantines.

mod identity;
pub mod local;
mod sock_diag;
mod tokens;

use std::sync::Arc;

pub use identity::{CertName, Identity, Kind, escape_controls, glob};
pub use local::{LocalUser, SocketAccess};
pub use tokens::{Revocations, Tokens};

pub use crate::config::{AuthConfig, Rule, TokenTransport, check_pattern};

use crate::config::Limits;
use crate::error::NpudError;

/// One quota and the key that set it, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota<T> {
    pub max: T,
    pub key: String,
}

/// What a rule lets each of an identity's sessions hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quotas {
    pub sessions: Quota<u32>,
    pub tensor_bytes: Quota<u64>,
    pub pending: Quota<u32>,
    pub program_bytes: Quota<u64>,
}

impl Quotas {
    /// The `limits.*` values alone.
    pub fn of_limits(l: &Limits) -> Self {
        fn q<T>(max: T, key: &str) -> Quota<T> {
            Quota {
                max,
                key: key.to_owned(),
            }
        }
        Self {
            sessions: q(l.max_sessions_per_uid, "limits.max_sessions_per_uid"),
            tensor_bytes: q(
                l.max_tensor_bytes_per_session,
                "limits.max_tensor_bytes_per_session",
            ),
            pending: q(l.max_pending_per_session, "limits.max_pending_per_session"),
            program_bytes: q(
                l.max_program_bytes_per_session,
                "limits.max_program_bytes_per_session",
            ),
        }
    }

    fn of_rule(r: &Rule, l: &Limits) -> Self {
        fn lower<T: Ord + Copy>(q: &mut Quota<T>, v: Option<T>, rule: &str, field: &str) {
            if let Some(v) = v
                && v < q.max
            {
                *q = Quota {
                    max: v,
                    key: format!("auth.rules[{rule:?}].{field}"),
                };
            }
        }
        let mut q = Self::of_limits(l);
        lower(&mut q.sessions, r.max_sessions, &r.name, "max_sessions");
        lower(
            &mut q.tensor_bytes,
            r.max_tensor_bytes_per_session,
            &r.name,
            "max_tensor_bytes_per_session",
        );
        lower(
            &mut q.pending,
            r.max_pending_per_session,
            &r.name,
            "max_pending_per_session",
        );
        lower(
            &mut q.program_bytes,
            r.max_program_bytes_per_session,
            &r.name,
            "max_program_bytes_per_session",
        );
        q
    }
}

/// What the policy granted a caller: the rule that allowed it and its quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub rule: String,
    pub quotas: Quotas,
    /// The session classes the rule's callers may open.
    pub classes: Vec<crate::priority::Class>,
}

impl Grant {
    /// Refuses a session class the rule does not allow.
    ///
    /// # Errors
    /// PERMISSION_DENIED naming the rule and the classes it allows.
    pub fn allows(&self, class: crate::priority::Class) -> Result<(), NpudError> {
        if self.classes.contains(&class) {
            return Ok(());
        }
        let allowed: Vec<&str> = self.classes.iter().map(|c| c.as_str()).collect();
        Err(NpudError::PermissionDenied(format!(
            "session_class: rule {:?} allows {} sessions only, not {class} \
             (auth.rules[{:?}].classes)",
            self.rule,
            allowed.join(" and "),
            self.rule
        )))
    }
}

/// `[auth]`, resolved: rules with their quotas, admins, the token directory.
#[derive(Debug)]
pub struct Policy {
    rules: Vec<(Rule, Arc<Grant>)>,
    admins: Vec<String>,
    tokens: Option<Tokens>,
    require_token: Vec<TokenTransport>,
}

impl Policy {
    /// The policy `auth` and `limits` configure, running as `daemon_uid`; `user:` admins are
    /// looked up in `passwd` (the text of /etc/passwd).
    pub fn new(auth: &AuthConfig, limits: &Limits, daemon_uid: u32, passwd: &str) -> Self {
        let mut admins: Vec<String> = auth
            .admins
            .iter()
            .filter_map(|a| {
                if a == "self" {
                    return Some(format!("uid:{daemon_uid}"));
                }
                match a.strip_prefix("user:") {
                    Some(user) => {
                        let uid = passwd.lines().find_map(|l| {
                            let mut f = l.split(':');
                            (f.next() == Some(user)).then(|| f.nth(1)).flatten()
                        });
                        if uid.is_none() {
                            tracing::debug!(user, "auth.admins: no such user; skipped");
                        }
                        uid.map(|u| format!("uid:{u}"))
                    }
                    None => Some(a.clone()),
                }
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        admins.retain(|a| seen.insert(a.clone()));
        Self {
            rules: auth
                .rules
                .iter()
                .map(|r| {
                    let g = Arc::new(Grant {
                        rule: r.name.clone(),
                        quotas: Quotas::of_rule(r, limits),
                        classes: r.classes.clone(),
                    });
                    (r.clone(), g)
                })
                .collect(),
            admins,
            tokens: auth.token_dir.clone().map(|d| {
                Tokens::start(
                    d,
                    daemon_uid,
                    std::time::Duration::from_millis(auth.token_poll_ms),
                )
            }),
            require_token: auth.require_token.clone(),
        }
    }

    fn matches(patterns: &[String], who: &Identity) -> bool {
        patterns.iter().any(|p| {
            identity::matches(p, who.name()) || who.groups().iter().any(|g| identity::matches(p, g))
        })
    }

    /// The identity a call has: its connection's, or the token's when it carries
    /// `x-npud-token`.
    ///
    /// # Errors
    /// UNAUTHENTICATED for a token secret no file holds, or any token when `auth.token_dir` is
    /// unset.
    pub fn identify(
        &self,
        transport: &Identity,
        token: Option<&str>,
    ) -> Result<Identity, NpudError> {
        match (token, &self.tokens) {
            (None, _) => Ok(transport.clone()),
            (Some(secret), Some(t)) => t.resolve(secret.trim()),
            (Some(_), None) => Err(NpudError::Unauthenticated(format!(
                "{}: this daemon has no token identities (auth.token_dir is not set)",
                npu_proto::IDENTITY_TOKEN_HEADER
            ))),
        }
    }

    /// The token directory, when `auth.token_dir` is set.
    pub fn tokens(&self) -> Option<&Tokens> {
        self.tokens.as_ref()
    }

    /// Refuses a caller that presented no token on a listener `auth.require_token` names.
    ///
    /// # Errors
    /// UNAUTHENTICATED naming `auth.require_token`.
    pub fn require_token(&self, transport: &Identity, has_token: bool) -> Result<(), NpudError> {
        tokens::require_token(&self.require_token, transport, has_token)
    }

    /// Whether `who` may use the daemon, and with which quotas.
    ///
    /// # Errors
    /// PERMISSION_DENIED (UNAUTHENTICATED for an anonymous caller) naming the rule that
    /// refused, or saying that none allows the caller.
    pub fn decide(&self, who: &Identity) -> Result<Arc<Grant>, NpudError> {
        let refusal = match self
            .rules
            .iter()
            .find(|(r, _)| Self::matches(&r.patterns, who))
        {
            Some((r, g)) if r.allow => return Ok(g.clone()),
            Some((r, _)) => format!("{who} is refused by rule {:?} (auth.rules)", r.name),
            None => format!("no rule in auth.rules allows {who}"),
        };
        Err(if who.kind() == Kind::Anonymous {
            NpudError::Unauthenticated(format!(
                "{refusal}: this caller presented no credentials (a client certificate, see \
                 tls.client_auth, or an {} secret from auth.token_dir)",
                npu_proto::IDENTITY_TOKEN_HEADER
            ))
        } else {
            NpudError::PermissionDenied(refusal)
        })
    }

    /// The identities charged for the sessions and device faults of `principal`, on a
    /// connection that also proves `proven` (its transport's identity and the local user on
    /// its other end): the principal first, then each other proven identity the policy would
    /// serve on its own (not an anonymous one), with the grant that sets its session quota.
    pub fn charged(
        &self,
        principal: &Identity,
        proven: &[&Identity],
    ) -> Vec<(Identity, Arc<Grant>)> {
        let mut out: Vec<(Identity, Arc<Grant>)> = Vec::new();
        for who in proven {
            if *who == principal
                || who.kind() == Kind::Anonymous
                || out.iter().any(|(x, _)| x == *who)
                // A uid that must present a token (`auth.require_token`) cannot call alone:
                // pods sharing it would otherwise share its quotas and fault budget.
                || tokens::require_token(&self.require_token, who, false).is_err()
            {
                continue;
            }
            if let Ok(g) = self.decide(who) {
                out.push(((*who).clone(), g));
            }
        }
        out
    }

    /// Whether `who` is an admin.
    pub fn is_admin(&self, who: &Identity) -> bool {
        Self::matches(&self.admins, who)
    }

    /// Refuses a caller that is not an admin.
    ///
    /// # Errors
    /// PERMISSION_DENIED naming `auth.admins` and what they are.
    pub fn require_admin(&self, who: &Identity, what: &str) -> Result<(), NpudError> {
        if self.is_admin(who) {
            return Ok(());
        }
        Err(NpudError::PermissionDenied(format!(
            "{what} is allowed only to admins (auth.admins: {}); this caller is {who}",
            self.admins.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(toml: &str) -> Policy {
        let auth: AuthConfig = figment::Figment::new()
            .merge(figment::providers::Serialized::defaults(
                AuthConfig::default(),
            ))
            .merge(<figment::providers::Toml as figment::providers::Format>::string(toml))
            .extract()
            .unwrap();
        auth.check().unwrap();
        Policy::new(
            &auth,
            &Limits::default(),
            990,
            "root:x:0:0::/root:/bin/sh\nnpud:x:991:991::/:/bin/false\n",
        )
    }

    #[test]
    fn the_defaults_allow_local_users_certificates_and_tokens_only() {
        let p = policy("");
        for who in [
            Identity::uid(1000, [1000]),
            Identity::cert(CertName::Dns, "a.example"),
            Identity::token("pod-a"),
        ] {
            let g = p.decide(&who).unwrap();
            assert_eq!(g.quotas, Quotas::of_limits(&Limits::default()), "{who}");
        }
        let e = p
            .decide(&Identity::anonymous("127.0.0.1".parse().ok()))
            .unwrap_err();
        assert_eq!(e.code_name(), "UNAUTHENTICATED");
        let e = p
            .decide(&Identity::anonymous("10.0.0.7".parse().ok()))
            .unwrap_err();
        assert_eq!(e.code_name(), "UNAUTHENTICATED");
        assert!(
            e.message()
                .starts_with("no rule in auth.rules allows anonymous@10.0.0.7: this caller"),
            "{e}"
        );
        assert!(p.is_admin(&Identity::uid(0, [])));
        assert!(p.is_admin(&Identity::uid(990, [])), "self");
        assert!(p.is_admin(&Identity::uid(991, [])), "user:npud");
        assert!(!p.is_admin(&Identity::uid(1000, [])));
        let e = p
            .require_admin(
                &Identity::cert(CertName::Dns, "a.example"),
                "ClearQuarantine",
            )
            .unwrap_err();
        assert_eq!(
            e.message(),
            "ClearQuarantine is allowed only to admins (auth.admins: uid:0, uid:991, uid:990); \
             this caller is cert:dns:a.example"
        );
    }

    #[test]
    fn every_identity_a_connection_proves_that_could_call_alone_is_charged() {
        let p = policy("");
        let uid = Identity::uid(1000, [1000]);
        let cert = Identity::cert(CertName::Dns, "a.example");
        let token = Identity::token("pod-a");
        let anon = Identity::anonymous("127.0.0.1".parse().ok());
        let names = |v: Vec<(Identity, Arc<Grant>)>| {
            v.into_iter()
                .map(|(i, _)| i.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(p.charged(&token, &[&cert, &uid, &uid])),
            ["cert:dns:a.example", "uid:1000"]
        );
        assert!(p.charged(&uid, &[&uid, &anon]).is_empty());
        // Where the policy serves no bare uid (tokens required), the uid is not charged.
        let p = policy(
            r#"
            [[rules]]
            name = "pods"
            match = ["token:*"]
            "#,
        );
        assert!(p.charged(&token, &[&uid]).is_empty());
        // Nor where the rules serve uids but the Unix socket (and local users over TCP)
        // must present tokens: pods that share a uid must not share its quotas.
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let p = policy(&format!(
            "token_dir = {:?}\nrequire_token = [\"unix\"]",
            dir.path().display().to_string()
        ));
        assert!(p.charged(&token, &[&uid]).is_empty());
        assert_eq!(
            names(p.charged(&token, &[&cert, &uid])),
            ["cert:dns:a.example"]
        );
    }

    #[test]
    fn the_first_matching_rule_decides_and_lowers_quotas() {
        let p = policy(
            r#"
            admins = ["cert:dns:ops.example"]
            [[rules]]
            name = "no-b"
            match = ["cert:dns:b.*"]
            allow = false
            [[rules]]
            name = "video"
            match = ["gid:44", "cert:*"]
            max_sessions = 2
            max_tensor_bytes_per_session = 999999999999999
            "#,
        );
        let e = p
            .decide(&Identity::cert(CertName::Dns, "b.example"))
            .unwrap_err();
        assert_eq!(e.code_name(), "PERMISSION_DENIED");
        assert_eq!(
            e.message(),
            "cert:dns:b.example is refused by rule \"no-b\" (auth.rules)"
        );
        let g = p.decide(&Identity::uid(1000, [1000, 44])).unwrap();
        assert_eq!(g.rule, "video");
        assert_eq!(g.quotas.sessions.max, 2);
        assert_eq!(g.quotas.sessions.key, "auth.rules[\"video\"].max_sessions");
        // A rule cannot raise a limit.
        assert_eq!(
            g.quotas.tensor_bytes.key,
            "limits.max_tensor_bytes_per_session"
        );
        let e = p.decide(&Identity::uid(1000, [1000])).unwrap_err();
        assert_eq!(e.message(), "no rule in auth.rules allows uid:1000");
        assert!(p.is_admin(&Identity::cert(CertName::Dns, "ops.example")));
        assert!(!p.is_admin(&Identity::uid(0, [])));
    }
}
