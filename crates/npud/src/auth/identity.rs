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

/// Which name of a client certificate an identity rests on. Each kind is its own namespace
/// (`cert:dns:ops.example` and `cert:email:ops.example` are different callers), so a
/// certificate cannot pass for another by carrying the same text in another kind of name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertName {
    /// A DNS subject alternative name.
    Dns,
    /// A URI subject alternative name (e.g. a SPIFFE ID).
    Uri,
    /// An e-mail (RFC 822) subject alternative name.
    Email,
    /// The subject's common name, for a certificate without those; matched only by patterns
    /// that name it (`cert:cn:...`), never by `cert:*`.
    Cn,
}

impl CertName {
    /// The kind's word in identity names.
    pub fn word(self) -> &'static str {
        match self {
            CertName::Dns => "dns",
            CertName::Uri => "uri",
            CertName::Email => "email",
            CertName::Cn => "cn",
        }
    }
}

/// `text` with every control character (a newline, an escape sequence) written as an escape,
/// so that a name a client chose cannot forge or hide lines in a log.
pub fn escape_controls(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A caller's identity: its name (`uid:1000`, `cert:dns:client-a.example`, `token:pod-a`,
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

    /// A client certificate's name of kind `kind` (control characters escaped).
    pub fn cert(kind: CertName, value: &str) -> Self {
        Self {
            name: format!("cert:{}:{}", kind.word(), escape_controls(value)).into(),
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

/// Whether the policy pattern `pattern` matches the identity or group name `name`: [`glob`],
/// except that a certificate's common name (`cert:cn:...`) is matched only by a pattern that
/// names it.
pub fn matches(pattern: &str, name: &str) -> bool {
    if name.starts_with("cert:cn:") && !pattern.starts_with("cert:cn:") {
        return false;
    }
    glob(pattern, name)
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
    use crate::config::check_pattern;

    #[test]
    fn a_token_pattern_without_an_allocation_is_refused_naming_the_form() {
        let e = check_pattern("token:npu0-share-3").unwrap_err();
        assert!(e.contains("token:npu0-share-3@*"), "{e}");
        for ok in [
            "token:*",
            "token:npu0-*",
            "token:admin@*",
            "token:a@5f1c09ab",
        ] {
            check_pattern(ok).unwrap();
        }
    }

    #[test]
    fn names_and_globs() {
        assert_eq!(Identity::uid(1000, [1000, 27, 27]).name(), "uid:1000");
        assert_eq!(
            Identity::uid(1000, [1000, 27]).groups(),
            ["gid:1000", "gid:27"]
        );
        assert_eq!(
            Identity::cert(CertName::Dns, "a.example").name(),
            "cert:dns:a.example"
        );
        assert_eq!(
            Identity::cert(CertName::Cn, "x\nFORGED line").name(),
            "cert:cn:x\\nFORGED line"
        );
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
        assert!(glob("cert:dns:*.example", "cert:dns:a.example"));
        assert!(!glob("cert:dns:*.example", "cert:dns:a.example.org"));
        assert!(matches("cert:*", "cert:dns:a.example"));
        assert!(
            !matches("cert:*", "cert:cn:a.example"),
            "CN only where named"
        );
        assert!(!matches("*", "cert:cn:a.example"));
        assert!(matches("cert:cn:a.*", "cert:cn:a.example"));
        assert!(!matches("cert:dns:ops.example", "cert:email:ops.example"));
        assert!(check_pattern("cert:*").is_ok());
        assert!(check_pattern("cert:uri:spiffe://x/*").is_ok());
        let e = check_pattern("cert:ops.example").unwrap_err();
        assert!(e.contains("cert:dns:ops.example"), "{e}");
        assert!(check_pattern("cert:*.example").is_err());
        assert!(glob("*", "anything"));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "ac"));
        assert!(glob("anonymous", "anonymous"));
        assert!(!glob("anonymous", "anonymous@10.0.0.7"));
    }
}
