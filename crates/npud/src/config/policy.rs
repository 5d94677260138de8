//! `[auth]`: the policy's rules, admins and token settings as the configuration gives them,
//! and the checks of their shape. What they mean for a caller is `auth`'s.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::priority::Class;
use crate::token_dir;

/// One rule of `auth.rules`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rule {
    /// Named in refusals and quota messages.
    pub name: String,
    /// Identity or group patterns (`uid:1000`, `gid:27`, `cert:dns:*.example`, `token:*`,
    /// `token`, `anonymous`, `anonymous@*`); `*` matches any run of characters.
    #[serde(rename = "match")]
    pub patterns: Vec<String>,
    /// Whether a matching caller may open sessions.
    pub allow: bool,
    /// Open sessions one identity may hold (default `limits.max_sessions_per_uid`).
    pub max_sessions: Option<u32>,
    /// Tensor bytes one of its sessions may hold (default `limits.max_tensor_bytes_per_session`).
    pub max_tensor_bytes_per_session: Option<u64>,
    /// Dispatches and chains one of its sessions may have waiting or running (default
    /// `limits.max_pending_per_session`).
    pub max_pending_per_session: Option<u32>,
    /// Program bytes one of its sessions may reference (default
    /// `limits.max_program_bytes_per_session`).
    pub max_program_bytes_per_session: Option<u64>,
    /// The session classes a matching caller may open (default: batch only).
    pub classes: Vec<Class>,
}

impl Default for Rule {
    fn default() -> Self {
        Self {
            name: String::new(),
            patterns: Vec::new(),
            allow: true,
            max_sessions: None,
            max_tensor_bytes_per_session: None,
            max_pending_per_session: None,
            max_program_bytes_per_session: None,
            classes: vec![Class::Batch],
        }
    }
}

fn allow(name: &str, pattern: &str) -> Rule {
    Rule {
        name: name.to_owned(),
        patterns: vec![pattern.to_owned()],
        ..Rule::default()
    }
}

/// `[auth]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Where token identities live (unset: no token identities).
    pub token_dir: Option<PathBuf>,
    /// Identities that may see every session's statistics and clear quarantines: patterns
    /// as in rules, `user:<name>` (looked up in /etc/passwd at start; absent is fine), and
    /// `self` (the uid the daemon runs as).
    pub admins: Vec<String>,
    pub rules: Vec<Rule>,
    /// Listeners on which a caller must present a token for anything but GetDeviceInfo and
    /// health (`"unix"`, `"tcp"`); see `tokens`.
    pub require_token: Vec<TokenTransport>,
    /// How often `token_dir` is read: a removed or rewritten token file stops working, and
    /// its open calls end, within this.
    pub token_poll_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            token_dir: None,
            admins: vec!["uid:0".into(), "user:npud".into(), "self".into()],
            rules: vec![
                // Local users are the desktop's applications: a video call's effects, a
                // dictation app.
                Rule {
                    classes: vec![Class::Batch, Class::Interactive],
                    ..allow("local", "uid:*")
                },
                allow("certificates", "cert:*"),
                allow("tokens", "token:*"),
            ],
            require_token: Vec::new(),
            token_poll_ms: 250,
        }
    }
}

impl AuthConfig {
    /// Checks the rules' shape.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `auth.rules` and the rule.
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            key: "auth.rules",
            reason,
        };
        let mut names = std::collections::HashSet::new();
        for (i, r) in self.rules.iter().enumerate() {
            if r.name.is_empty() {
                return Err(invalid(format!("rule {i} has no name")));
            }
            if !names.insert(&r.name) {
                return Err(invalid(format!("two rules are named {:?}", r.name)));
            }
            if r.patterns.is_empty() {
                return Err(invalid(format!(
                    "rule {:?} matches nothing: give it match = [...]",
                    r.name
                )));
            }
            for p in &r.patterns {
                check_pattern(p).map_err(|why| invalid(format!("rule {:?}: {why}", r.name)))?;
            }
            for (k, v) in [
                ("max_sessions", r.max_sessions.map(u64::from)),
                (
                    "max_tensor_bytes_per_session",
                    r.max_tensor_bytes_per_session,
                ),
                (
                    "max_pending_per_session",
                    r.max_pending_per_session.map(u64::from),
                ),
                (
                    "max_program_bytes_per_session",
                    r.max_program_bytes_per_session,
                ),
            ] {
                if v == Some(0) {
                    return Err(invalid(format!(
                        "rule {:?}: {k} must be at least 1 (allow = false refuses)",
                        r.name
                    )));
                }
            }
            if r.allow && r.classes.is_empty() {
                return Err(invalid(format!(
                    "rule {:?}: classes is empty, so its callers could open no session: name \
                     \"batch\" and/or \"interactive\" (allow = false refuses)",
                    r.name
                )));
            }
        }
        for a in &self.admins {
            check_pattern(a).map_err(|reason| ConfigError::Invalid {
                key: "auth.admins",
                reason,
            })?;
        }
        self.check_tokens()
    }

    /// Checks the token keys, and that `token_dir` is a directory only the daemon can read.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    fn check_tokens(&self) -> Result<(), ConfigError> {
        if !(10..=60_000).contains(&self.token_poll_ms) {
            return Err(ConfigError::Invalid {
                key: "auth.token_poll_ms",
                reason: format!("{} is not within 10 to 60000", self.token_poll_ms),
            });
        }
        match &self.token_dir {
            None if !self.require_token.is_empty() => Err(ConfigError::Invalid {
                key: "auth.require_token",
                reason: "tokens are required, but auth.token_dir is not set".into(),
            }),
            None => Ok(()),
            Some(d) => token_dir::open_dir(d, rustix::process::geteuid().as_raw())
                .map(drop)
                .map_err(|e| ConfigError::Invalid {
                    key: "auth.token_dir",
                    reason: e.to_string(),
                }),
        }
    }
}

/// A listener on which `auth.require_token` makes callers present a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenTransport {
    /// Local users: the Unix socket, and TCP from this host, whose callers the kernel's socket
    /// table names (`uid:` identities either way, so that the TCP port is no way around it).
    Unix,
    /// The TCP listener (certificates and anonymous callers).
    Tcp,
}

impl TokenTransport {
    /// Its name in `auth.require_token`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Unix => "unix",
            Self::Tcp => "tcp",
        }
    }
}

/// Why `pattern` cannot be a policy pattern, if it cannot: a certificate pattern must say
/// which kind of name it matches (`cert:*` for any but the common name).
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("an empty pattern matches nothing".into());
    }
    if let Some(rest) = pattern.strip_prefix("cert:")
        && rest != "*"
        && !["dns:", "uri:", "email:", "cn:"]
            .iter()
            .any(|k| rest.starts_with(k))
    {
        return Err(format!(
            "{pattern:?} does not say which name of a certificate it matches: write \
             cert:dns:{rest} (a DNS name), cert:uri:{rest}, cert:email:{rest}, or cert:cn:{rest} \
             (the common name, matched only where a pattern names it); cert:* matches any but \
             the common name"
        ));
    }
    // Token identities are `token:<file>@<allocation>`: a pattern naming a file without
    // `@` or `*` would silently match nothing.
    if let Some(rest) = pattern.strip_prefix("token:")
        && !rest.contains('@')
        && !rest.contains('*')
    {
        return Err(format!(
            "{pattern:?} matches no token identity: they are token:<file>@<allocation> (one per \
             secret the file held); write token:{rest}@* for every allocation of that file"
        ));
    }
    Ok(())
}
