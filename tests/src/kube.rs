//! The Kubernetes ConfigMap's `npud.toml`, as the tests start daemons from it.

use std::path::Path;

/// deploy/kubernetes/configmap.yaml's `npud.toml`, as shipped.
pub fn shipped_npud_toml() -> String {
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/configmap.yaml"
    ))
    .expect("deploy/kubernetes/configmap.yaml is readable");
    yaml.lines()
        .skip_while(|l| l.trim() != "npud.toml: |")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect()
}

/// Where a test puts what the ConfigMap names on the host.
#[derive(Debug)]
pub struct Paths<'a> {
    /// Holds the sockets (the ConfigMap's `/run/npud/`) and the state directory.
    pub dir: &'a Path,
    pub cert: &'a Path,
    pub key: &'a Path,
    pub client_ca: &'a Path,
    pub tokens: &'a Path,
}

/// The shipped `npud.toml` with its host paths moved to `to`, the emulator as its backend, and
/// free ports (the TCP listener stays on every address; metrics on loopback). Panics if a
/// host path is left in a value.
pub fn moved_npud_toml(to: &Paths<'_>) -> String {
    let p = |s: &Path| s.display().to_string();
    let body = shipped_npud_toml()
        .replace("/run/npud/", &format!("{}/", p(to.dir)))
        .replace("/etc/npud/tls/tls.crt", &p(to.cert))
        .replace("/etc/npud/tls/tls.key", &p(to.key))
        .replace("/etc/npud/tls/ca.crt", &p(to.client_ca))
        .replace("/var/lib/npud/tokens", &p(to.tokens))
        .replace("/var/lib/npud/state", &p(&to.dir.join("state")))
        .replace("backend = \"hsa\"", "backend = \"emulator\"")
        .replace("0.0.0.0:50051", "0.0.0.0:0")
        .replace("0.0.0.0:9464", "127.0.0.1:0");
    let values: String = body
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    for host_path in ["/run/npud", "/etc/npud", "/var/lib/npud", ":50051", ":9464"] {
        assert!(!values.contains(host_path), "{host_path} left in:\n{body}");
    }
    body
}
