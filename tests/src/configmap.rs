//! The Kubernetes ConfigMap's npud.toml (`deploy/kubernetes/configmap.yaml`), for tests that
//! start a daemon from it.

use std::path::Path;

/// The ConfigMap's npud.toml as shipped.
///
/// # Panics
/// When the file cannot be read or holds no npud.toml with `[tls]` and `[auth]`.
pub fn shipped_npud_toml() -> String {
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/configmap.yaml"
    ))
    .expect("deploy/kubernetes/configmap.yaml");
    let shipped: String = yaml
        .lines()
        .skip_while(|l| l.trim() != "npud.toml: |")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    assert!(
        shipped.contains("[tls]") && shipped.contains("[auth]"),
        "{shipped}"
    );
    shipped
}

/// Where a test puts what the ConfigMap's npud.toml finds on a node.
#[derive(Debug, Clone, Copy)]
pub struct Paths<'a> {
    /// Replaces /run/npud (the sockets).
    pub run: &'a Path,
    pub cert: &'a Path,
    pub key: &'a Path,
    pub client_ca: &'a Path,
    /// Replaces /var/lib/npud/tokens.
    pub tokens: &'a Path,
    /// Replaces /var/lib/npud/state.
    pub state: &'a Path,
}

/// The ConfigMap's npud.toml with its host paths moved to `paths`, the emulator for the NPU,
/// and its ports made free (TCP on every address, metrics on loopback).
///
/// # Panics
/// When a host path or a fixed port is left in a value.
pub fn configmap_npud_toml(paths: Paths<'_>) -> String {
    let p = |s: &Path| s.display().to_string();
    let body = shipped_npud_toml()
        .replace("/run/npud/", &format!("{}/", p(paths.run)))
        .replace("/etc/npud/tls/tls.crt", &p(paths.cert))
        .replace("/etc/npud/tls/tls.key", &p(paths.key))
        .replace("/etc/npud/tls/ca.crt", &p(paths.client_ca))
        .replace("/var/lib/npud/tokens", &p(paths.tokens))
        .replace("/var/lib/npud/state", &p(paths.state))
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
