//! The plugin's configuration: command-line flags, each with an `NPUD_PLUGIN_*` environment
//! variable; a flag wins over its variable. Values are checked once, here, and every error
//! names the flag and the rule it broke.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

/// The largest `--shares`: the name of a token file lists its shares' indexes, and with 64 the
/// longest name stays far below the file-name limit.
pub const MAX_SHARES: u32 = 64;

/// The kubelet device-plugin for npud.
#[derive(Debug, Clone, Parser)]
#[command(name = "npud-device-plugin", version)]
pub struct Args {
    /// The kubelet's registration socket; the plugin's own socket is created beside it.
    #[arg(
        long,
        env = "NPUD_PLUGIN_KUBELET_SOCKET",
        default_value = "/var/lib/kubelet/device-plugins/kubelet.sock"
    )]
    pub kubelet_socket: PathBuf,
    /// The plugin's socket: a file name in the kubelet socket's directory.
    #[arg(
        long,
        env = "NPUD_PLUGIN_ENDPOINT",
        default_value = "npud-amd-npu.sock"
    )]
    pub endpoint: String,
    /// The extended resource pods request (`domain/name`).
    #[arg(long, env = "NPUD_PLUGIN_RESOURCE_NAME", default_value = "amd.com/npu")]
    pub resource_name: String,
    /// How many pods may hold a share of the NPU at once (1 to 64).
    #[arg(long, env = "NPUD_PLUGIN_SHARES", default_value_t = 8)]
    pub shares: u32,
    /// npud's gRPC socket as the plugin sees it; its health decides the shares' health.
    #[arg(
        long,
        env = "NPUD_PLUGIN_NPUD_SOCKET",
        default_value = "/run/npud/npud.sock"
    )]
    pub npud_socket: PathBuf,
    /// The host directory holding npud's sockets, mounted into each container at
    /// `--container-socket-dir` (default: the directory of `--npud-socket`).
    #[arg(long, env = "NPUD_PLUGIN_HOST_SOCKET_DIR")]
    pub host_socket_dir: Option<PathBuf>,
    /// Where a container sees npud's socket directory; `NPUD_ADDR` points into it.
    #[arg(
        long,
        env = "NPUD_PLUGIN_CONTAINER_SOCKET_DIR",
        default_value = "/run/npud"
    )]
    pub container_socket_dir: PathBuf,
    /// Mount npud's socket directory writable into containers (it is read-only by default:
    /// connecting to a socket needs no write access to its file system). Only needed for a
    /// `--token-mount-path` under `/var/run` that lands in `--container-socket-dir` through
    /// the usual `/var/run` -> `/run` link, where the runtime must create its mount point.
    #[arg(long, env = "NPUD_PLUGIN_SOCKET_DIR_WRITABLE")]
    pub socket_dir_writable: bool,
    /// The directory of token files npud reads (its `auth.token_dir`), as the plugin sees it.
    #[arg(
        long,
        env = "NPUD_PLUGIN_TOKEN_DIR",
        default_value = "/var/lib/npud/tokens"
    )]
    pub token_dir: PathBuf,
    /// The uid that must own `--token-dir`: npud's, which reads it (default: the plugin's
    /// own). A directory owned by another uid is refused.
    #[arg(long, env = "NPUD_PLUGIN_TOKEN_DIR_UID")]
    pub token_dir_uid: Option<u32>,
    /// The same directory on the host, the source of the token mounts (default:
    /// `--token-dir`, for a plugin that sees it at its host path).
    #[arg(long, env = "NPUD_PLUGIN_HOST_TOKEN_DIR")]
    pub host_token_dir: Option<PathBuf>,
    /// Where a container finds its token file (`NPUD_TOKEN_FILE`). Outside the socket
    /// directory, so that directory's mount can stay read-only (`/var/run` is a link to `/run`
    /// in most images, so `/var/run/npud/...` would land inside it).
    #[arg(
        long,
        env = "NPUD_PLUGIN_TOKEN_MOUNT_PATH",
        default_value = "/var/run/secrets/npud/token"
    )]
    pub token_mount_path: PathBuf,
    /// The service whose `grpc.health.v1` status is followed ("" is the server as a whole).
    #[arg(
        long,
        env = "NPUD_PLUGIN_HEALTH_SERVICE",
        default_value = "npud.v1.Npud"
    )]
    pub health_service: String,
    /// How often the kubelet's socket and the plugin's own are checked, in ms (a kubelet
    /// restart recreates the first and removes the second).
    #[arg(long, env = "NPUD_PLUGIN_WATCH_INTERVAL_MS", default_value_t = 1000)]
    pub watch_interval_ms: u64,
    /// The longest wait between attempts to reach npud or the kubelet, in ms (the first
    /// wait is 100 ms, doubling).
    #[arg(long, env = "NPUD_PLUGIN_MAX_BACKOFF_MS", default_value_t = 5000)]
    pub max_backoff_ms: u64,
    /// A tracing filter (`debug`, `npud_device_plugin=trace,info`); `RUST_LOG` wins when set.
    #[arg(long, env = "NPUD_PLUGIN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Print the resolved configuration as JSON (what registration and Allocate will use)
    /// and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// A configuration value that breaks a rule.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {message}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub message: String,
}

fn bad(flag: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        flag,
        message: message.into(),
    }
}

/// The checked configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub kubelet_socket: PathBuf,
    /// The plugin's own socket: `endpoint` in the kubelet socket's directory.
    pub plugin_socket: PathBuf,
    pub endpoint: String,
    pub resource_name: String,
    pub shares: u32,
    pub npud_socket: PathBuf,
    pub host_socket_dir: PathBuf,
    pub container_socket_dir: PathBuf,
    pub socket_dir_writable: bool,
    /// `NPUD_ADDR` as a container sees it.
    pub container_npud_addr: String,
    pub token_dir: PathBuf,
    pub token_dir_uid: u32,
    pub host_token_dir: PathBuf,
    pub token_mount_path: PathBuf,
    pub health_service: String,
    #[serde(serialize_with = "millis")]
    pub watch_interval: Duration,
    #[serde(serialize_with = "millis")]
    pub max_backoff: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u128(d.as_millis())
}

fn absolute(flag: &'static str, p: &Path) -> Result<(), ConfigError> {
    if p.is_absolute() {
        Ok(())
    } else {
        Err(bad(
            flag,
            format!("{} is not an absolute path", p.display()),
        ))
    }
}

/// Whether `s` is a DNS-1123 label (lowercase alphanumerics and '-', 1 to 63 characters,
/// starting and ending alphanumeric), or with `dots`, a subdomain of such labels.
fn dns_name(s: &str, dots: bool) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if dots {
        s.len() <= 253 && s.split('.').all(label)
    } else {
        label(s)
    }
}

impl Args {
    /// Checks every value and derives the rest.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first flag whose value breaks a rule.
    pub fn check(&self) -> Result<Config, ConfigError> {
        absolute("--kubelet-socket", &self.kubelet_socket)?;
        let Some(dir) = self.kubelet_socket.parent() else {
            return Err(bad("--kubelet-socket", "has no directory"));
        };
        let endpoint_ok = !self.endpoint.is_empty()
            && !self.endpoint.starts_with('.')
            && self
                .endpoint
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !endpoint_ok {
            return Err(bad(
                "--endpoint",
                format!(
                    "{:?} must be a file name of [A-Za-z0-9._-] not starting with '.'",
                    self.endpoint
                ),
            ));
        }
        let plugin_socket = dir.join(&self.endpoint);
        if plugin_socket == self.kubelet_socket {
            return Err(bad("--endpoint", "is the kubelet's own socket"));
        }
        // Extended resources: a domain-prefixed name, not in kubernetes.io.
        let resource_ok = self
            .resource_name
            .split_once('/')
            .is_some_and(|(domain, name)| {
                dns_name(domain, true)
                    && domain.contains('.')
                    && !domain.ends_with("kubernetes.io")
                    && dns_name(name, false)
            });
        if !resource_ok {
            return Err(bad(
                "--resource-name",
                format!(
                    "{:?} must be an extended resource name, `domain/name` with a DNS domain \
                     outside kubernetes.io and a DNS label (e.g. amd.com/npu)",
                    self.resource_name
                ),
            ));
        }
        if !(1..=MAX_SHARES).contains(&self.shares) {
            return Err(bad(
                "--shares",
                format!("{} is outside 1 to {MAX_SHARES}", self.shares),
            ));
        }
        absolute("--npud-socket", &self.npud_socket)?;
        let Some(socket_name) = self.npud_socket.file_name() else {
            return Err(bad("--npud-socket", "names no file"));
        };
        let host_socket_dir = match &self.host_socket_dir {
            Some(d) => d.clone(),
            None => self
                .npud_socket
                .parent()
                .map(Path::to_path_buf)
                .ok_or_else(|| bad("--npud-socket", "has no directory"))?,
        };
        absolute("--host-socket-dir", &host_socket_dir)?;
        absolute("--container-socket-dir", &self.container_socket_dir)?;
        let container_npud_addr = format!(
            "unix:{}",
            self.container_socket_dir.join(socket_name).display()
        );
        absolute("--token-dir", &self.token_dir)?;
        let host_token_dir = self
            .host_token_dir
            .clone()
            .unwrap_or_else(|| self.token_dir.clone());
        absolute("--host-token-dir", &host_token_dir)?;
        absolute("--token-mount-path", &self.token_mount_path)?;
        if self
            .token_mount_path
            .starts_with(&self.container_socket_dir)
        {
            return Err(bad(
                "--token-mount-path",
                format!(
                    "{} is inside --container-socket-dir {}: the token would be mounted into \
                     npud's socket directory",
                    self.token_mount_path.display(),
                    self.container_socket_dir.display()
                ),
            ));
        }
        // Most images link /var/run to /run: a token there may still land in the socket
        // directory's mount, whose mount point the runtime could not create read-only.
        let through_run = self
            .token_mount_path
            .strip_prefix("/var/run")
            .map(|rest| Path::new("/run").join(rest));
        if !self.socket_dir_writable
            && through_run.is_ok_and(|p| p.starts_with(&self.container_socket_dir))
        {
            return Err(bad(
                "--token-mount-path",
                format!(
                    "{} is inside --container-socket-dir {} where /var/run links to /run, and \
                     that directory is mounted read-only: choose a path outside it, or give \
                     --socket-dir-writable",
                    self.token_mount_path.display(),
                    self.container_socket_dir.display()
                ),
            ));
        }
        if self.watch_interval_ms == 0 || self.watch_interval_ms > 60_000 {
            return Err(bad(
                "--watch-interval-ms",
                format!("{} is outside 1 to 60000", self.watch_interval_ms),
            ));
        }
        if !(100..=600_000).contains(&self.max_backoff_ms) {
            return Err(bad(
                "--max-backoff-ms",
                format!("{} is outside 100 to 600000", self.max_backoff_ms),
            ));
        }
        Ok(Config {
            kubelet_socket: self.kubelet_socket.clone(),
            plugin_socket,
            endpoint: self.endpoint.clone(),
            resource_name: self.resource_name.clone(),
            shares: self.shares,
            npud_socket: self.npud_socket.clone(),
            host_socket_dir,
            container_socket_dir: self.container_socket_dir.clone(),
            socket_dir_writable: self.socket_dir_writable,
            container_npud_addr,
            token_dir: self.token_dir.clone(),
            token_dir_uid: self
                .token_dir_uid
                .unwrap_or_else(|| rustix::process::geteuid().as_raw()),
            host_token_dir,
            token_mount_path: self.token_mount_path.clone(),
            health_service: self.health_service.clone(),
            watch_interval: Duration::from_millis(self.watch_interval_ms),
            max_backoff: Duration::from_millis(self.max_backoff_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["npud-device-plugin"];
        v.extend_from_slice(extra);
        Args::try_parse_from(v).unwrap()
    }

    #[test]
    fn defaults_follow_the_contract() {
        let c = args(&[]).check().unwrap();
        assert_eq!(
            c.plugin_socket,
            Path::new("/var/lib/kubelet/device-plugins/npud-amd-npu.sock")
        );
        assert_eq!(c.resource_name, "amd.com/npu");
        assert_eq!(c.host_socket_dir, Path::new("/run/npud"));
        assert_eq!(c.container_npud_addr, "unix:/run/npud/npud.sock");
        assert_eq!(c.token_mount_path, Path::new("/var/run/secrets/npud/token"));
        assert!(!c.socket_dir_writable);
        assert_eq!(c.host_token_dir, c.token_dir);
    }

    #[test]
    fn each_bad_value_names_its_flag() {
        for (extra, flag, words) in [
            (&["--shares", "0"][..], "--shares", "outside 1 to 64"),
            (&["--shares", "65"], "--shares", "outside 1 to 64"),
            (
                &["--resource-name", "npu"],
                "--resource-name",
                "domain/name",
            ),
            (
                &["--resource-name", "kubernetes.io/npu"],
                "--resource-name",
                "outside kubernetes.io",
            ),
            (
                &["--resource-name", "amd.com/NPU"],
                "--resource-name",
                "DNS label",
            ),
            (&["--endpoint", "../x.sock"], "--endpoint", "file name"),
            (
                &["--endpoint", "kubelet.sock"],
                "--endpoint",
                "kubelet's own",
            ),
            (&["--token-dir", "tokens"], "--token-dir", "absolute"),
            (
                &["--token-mount-path", "/run/npud/token"],
                "--token-mount-path",
                "inside --container-socket-dir",
            ),
            (
                &["--token-mount-path", "/var/run/npud/token"],
                "--token-mount-path",
                "where /var/run links to /run",
            ),
            (
                &["--watch-interval-ms", "0"],
                "--watch-interval-ms",
                "outside",
            ),
            (&["--max-backoff-ms", "5"], "--max-backoff-ms", "outside"),
        ] {
            let e = args(extra).check().unwrap_err();
            assert_eq!(e.flag, flag, "{extra:?}");
            assert!(e.to_string().contains(words), "{extra:?}: {e}");
        }
    }

    #[test]
    fn the_container_address_follows_the_socket_name() {
        let c = args(&["--npud-socket", "/srv/n/api.sock"]).check().unwrap();
        assert_eq!(c.host_socket_dir, Path::new("/srv/n"));
        assert_eq!(c.container_npud_addr, "unix:/run/npud/api.sock");
    }
}
