//! Who a caller is.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// What kind of credentials an identity rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A local user on the Unix socket (`SO_PEERCRED`).
    Uid(u32),
    /// A client certificate checked against `tls.client_ca`.
    Cert,
    /// A secret from `auth.token_dir`.
    Token,
    /// No credentials: plaintext TCP, or TLS without a client certificate.
    Anonymous,
}

/// A caller's identity: its name (`uid:1000`, `cert:client-a.example`, `token:pod-a`,
/// `anonymous`, `anonymous@10.0.0.7`) and the groups it is a member of (`gid:27`, `token`).
/// Two identities are the same when their names are.
#[derive(Debug, Clone)]
pub struct Identity {
    name: Arc<str>,
    groups: Arc<[String]>,
    kind: Kind,
}

impl PartialEq for Identity {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Identity {}

impl Identity {
    /// A local user with its primary and supplementary groups.
    pub fn uid(uid: u32, gids: impl IntoIterator<Item = u32>) -> Self {
        let mut groups: Vec<String> = gids.into_iter().map(|g| format!("gid:{g}")).collect();
        groups.sort();
        groups.dedup();
        Self {
            name: format!("uid:{uid}").into(),
            groups: groups.into(),
            kind: Kind::Uid(uid),
        }
    }

    /// The subject of a client certificate.
    pub fn cert(subject: &str) -> Self {
        Self {
            name: format!("cert:{subject}").into(),
            groups: Arc::new([]),
            kind: Kind::Cert,
        }
    }

    /// A token file's name.
    pub fn token(name: &str) -> Self {
        Self {
            name: format!("token:{name}").into(),
            groups: Arc::new(["token".to_owned()]),
            kind: Kind::Token,
        }
    }

    /// A caller without credentials: `anonymous` from a loopback address, else
    /// `anonymous@<address>` (so that a policy can tell the two apart, and quotas of remote
    /// anonymous callers are per address).
    pub fn anonymous(from: Option<IpAddr>) -> Self {
        let name = match from {
            Some(ip) if !ip.is_loopback() && !ip.to_canonical().is_loopback() => {
                format!("anonymous@{}", ip.to_canonical())
            }
            _ => "anonymous".to_owned(),
        };
        Self {
            name: name.into(),
            groups: Arc::new([]),
            kind: Kind::Anonymous,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name, shared.
    pub fn key(&self) -> Arc<str> {
        self.name.clone()
    }

    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The local uid, for an identity from the Unix socket.
    pub fn local_uid(&self) -> Option<u32> {
        match self.kind {
            Kind::Uid(u) => Some(u),
            _ => None,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Whether `pattern` matches `text`; `*` in a pattern matches any run of characters.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_globs() {
        assert_eq!(Identity::uid(1000, [1000, 27, 27]).name(), "uid:1000");
        assert_eq!(
            Identity::uid(1000, [1000, 27]).groups(),
            ["gid:1000", "gid:27"]
        );
        assert_eq!(Identity::cert("a.example").name(), "cert:a.example");
        assert_eq!(Identity::token("pod-a").groups(), ["token"]);
        assert_eq!(
            Identity::anonymous("127.0.0.1".parse().ok()).name(),
            "anonymous"
        );
        assert_eq!(
            Identity::anonymous("::ffff:127.0.0.1".parse().ok()).name(),
            "anonymous"
        );
        assert_eq!(
            Identity::anonymous("10.0.0.7".parse().ok()).name(),
            "anonymous@10.0.0.7"
        );
        assert!(glob("uid:*", "uid:0"));
        assert!(glob("cert:*.example", "cert:a.example"));
        assert!(!glob("cert:*.example", "cert:a.example.org"));
        assert!(glob("*", "anything"));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "ac"));
        assert!(glob("anonymous", "anonymous"));
        assert!(!glob("anonymous", "anonymous@10.0.0.7"));
    }
}
