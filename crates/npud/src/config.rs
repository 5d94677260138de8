//! The daemon's configuration, layered with figment: built-in defaults, then a TOML file, then
//! `NPUD_*` environment variables, then command-line flags (each layer overrides the ones before).
//!
//! Environment variables name keys with `NPUD_` and `__` between nested keys:
//! `NPUD_SOCKET=/run/npud/npud.sock`, `NPUD_LIMITS__MAX_SESSIONS=8`, `NPUD_LOG__FORMAT=json`.
//! Every key is documented in the crate's README.

mod policy;
mod tls;

pub use policy::{AuthConfig, Rule, TokenTransport, check_pattern};
pub use tls::{ClientAuth, TlsConfig};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// The configuration file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/npud/npud.toml";

/// Most PDIs any NPU can hold at once (the AIE queue's PDI cache).
pub const MAX_PDIS: u32 = 32;

/// Most I/O threads `io_threads` may ask for.
const MAX_IO_THREADS: u32 = 64;

/// Longest executor poll `executor.spin_us` may ask for: past this, polling is just a busy core.
const MAX_SPIN_US: u64 = 10_000;

/// Bounds of `executor.slice_bytes`: below a page, turns cost more than the copies; above
/// 256 MiB, one turn is long enough to stall other clients noticeably.
const MIN_SLICE_BYTES: u64 = 4096;
const MAX_SLICE_BYTES: u64 = 256 << 20;

/// Which HSA runtime the daemon drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The built-in software AIE agent (hsa-sim), linked into the daemon.
    Emulator,
    /// ROCR (`libhsa-runtime64.so`), found at run time.
    Hsa,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Emulator => "emulator",
            Self::Hsa => "hsa",
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Plain,
    Json,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter directive (`info`, `npud=debug`, ...); `RUST_LOG` wins when set.
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Plain,
        }
    }
}

/// `[emulator]`: how the built-in software agent presents itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmulatorConfig {
    /// The NPU the emulator models: `aie2` (npu1) or `aie2p` (npu2).
    pub agent_name: String,
    /// The ROCR release the emulator behaves as, failures included: `rocr-newest`,
    /// `rocr-g2-2026-07`, `rocr-g2-2026-05`, `rocr-late-2025`, `rocm-7.0` or `kernel-object`
    /// (hsa-sim's profiles).
    pub profile: String,
    /// How long a hanging kernel blocks before it fails as the driver's watchdog would, in ms.
    pub timeout_ms: u64,
    /// `off` (the emulator's own speed) or `model`: each doorbell takes the device time
    /// hsa-sim's timing model gives what it ran (modelled, not measured).
    pub timing: String,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            agent_name: "aie2p".into(),
            profile: hsa_sim::Profile::default().as_str().into(),
            timeout_ms: 2000,
            timing: "off".into(),
        }
    }
}

/// `[executor]`: how the thread that owns the device waits for work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutorConfig {
    /// How long the executor polls for the next command before it sleeps, in µs, while
    /// dispatches arrive back to back (0: always sleep). Polling spends CPU time to spare each
    /// dispatch a thread wake-up; see `executor::idle`.
    pub spin_us: u64,
    /// Bytes of copying (tensor writes and reads, staging copies) the executor does for one
    /// request before it serves another session: a big request becomes many bounded turns.
    pub slice_bytes: u64,
    /// Whether queued single dispatches of several sessions ring as one doorbell batch (false:
    /// only one session's, while no other session waits).
    pub batch_across_sessions: bool,
    /// How many batch sessions an interactive session weighs in the device's shares (1 to
    /// 64): its turns are charged this much less.
    pub interactive_weight: u32,
    /// How long an interactive session stays active after its last queued work, in ms (1 to
    /// 60000): while one is, other doorbells are kept short for it.
    pub interactive_idle_ms: u64,
    /// An interactive session's deadline when it asks for none, in µs (1 to 10,000,000):
    /// while it is active, other doorbells are kept to half of it.
    pub interactive_deadline_us: u64,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            spin_us: npu_fd::latency::EXECUTOR_SPIN_US,
            slice_bytes: 1 << 20,
            batch_across_sessions: true,
            interactive_weight: 8,
            interactive_idle_ms: 1000,
            interactive_deadline_us: 1000,
        }
    }
}

/// `[health]`: what `grpc.health.v1.Health` tells watchers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// How long `NOT_SERVING` is reported at least once a device recovery starts, in ms, so
    /// that a watcher polling or streaming sees it (the recovery itself takes milliseconds).
    pub min_not_serving_ms: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            min_not_serving_ms: 500,
        }
    }
}

/// `[shutdown]`: how SIGTERM and SIGINT end the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// How long shutdown waits for calls the daemon is working on (dispatches, chains,
    /// registrations, tensor copies), in ms; calls that only wait for their caller end with
    /// UNAVAILABLE at once.
    pub drain_timeout_ms: u64,
    /// Once those calls are ended, how long connections are kept open after nothing moved on
    /// them (a caller still reading the rest of a stream keeps its connection, for at most the
    /// drain timeout), in ms.
    pub close_grace_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            drain_timeout_ms: 10_000,
            close_grace_ms: 300,
        }
    }
}

/// Longest `shutdown.drain_timeout_ms`: one hour.
const MAX_DRAIN_TIMEOUT_MS: u64 = 3_600_000;

/// Longest `shutdown.close_grace_ms`: one minute.
const MAX_CLOSE_GRACE_MS: u64 = 60_000;

/// `[metrics]`: the Prometheus listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where `GET /metrics` is served, e.g. `127.0.0.1:9464` (port 0: any free port); unset:
    /// no listener.
    pub listen: Option<SocketAddr>,
    /// Distinct `program` label values the dispatch counters keep; the programs past them are
    /// counted as `program="other"`, so the number of series stays bounded however many
    /// programs clients register.
    pub max_program_labels: u32,
    /// Sessions shown one by one in `npud_session_pending_work` (labels `session` and the
    /// client's own `client_name`), the rest summed as `session="other"`. 0 (the default):
    /// no client-chosen text in any label, and no series per session; the gauge is summed by
    /// the kind of identity that opened the session (`identity_kind`).
    pub max_session_labels: u32,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: None,
            max_program_labels: 64,
            max_session_labels: 0,
        }
    }
}

/// Most `metrics.max_program_labels`: each value is a set of series per outcome.
const MAX_PROGRAM_LABELS: u32 = 1024;

/// Longest `health.min_not_serving_ms`: past this, health hides a device that serves again.
const MAX_MIN_NOT_SERVING_MS: u64 = 60_000;

/// `limits.max_programs_per_session` unless configured.
pub const DEFAULT_MAX_PROGRAMS_PER_SESSION: u32 = 1024;

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_sessions: u32,
    pub max_tensors_per_session: u32,
    pub max_tensor_bytes_per_session: u64,
    pub max_chain_links: u32,
    pub max_pending_per_session: u32,
    /// Programs kept loaded in the device heap at once (at most 32, the NPU's PDI limit).
    pub max_cached_programs: u32,
    /// Largest gRPC request the daemon accepts, in bytes.
    pub max_message_bytes: u64,
    /// Largest PDI plus instruction stream a program may have, in bytes.
    pub max_program_bytes: u64,
    /// Open sessions one identity may hold (a session also counts against the other
    /// identities its connection proves; see `auth`).
    pub max_sessions_per_uid: u32,
    /// Bytes of the programs one session references, each distinct content counted once.
    pub max_program_bytes_per_session: u64,
    /// Distinct programs one session may reference: each costs the daemon its bookkeeping
    /// beside its bytes, and listings walk them.
    pub max_programs_per_session: u32,
    /// Open connections on the gRPC Unix socket and the fd socket together (the local pool;
    /// TCP connections never draw on it). At this total a newcomer whose uid holds fewer evicts
    /// a connection of the uid holding the most (see `accept`).
    pub max_connections: u32,
    /// Open connections on the Unix sockets from one uid.
    pub max_connections_per_peer: u32,
    /// Open connections on the TCP listener (its own pool, fair at its total as the local one).
    pub max_tcp_connections: u32,
    /// Open TCP connections from one key: a network prefix (an IPv4 address's /24, an IPv6
    /// address's /64), or a local user over TCP from this host (its uid; local callers the
    /// kernel names no user for share one key for all of loopback).
    pub max_tcp_connections_per_prefix: u32,
    /// TCP connections that have not yet finished their TLS handshake and HTTP/2 preface
    /// (fair at this total as the other pools).
    pub max_preauth_connections: u32,
    /// Of those, from one key (as `max_tcp_connections_per_prefix`); more are closed
    /// unanswered.
    pub max_preauth_connections_per_prefix: u32,
    /// How long a new connection may take to send its first request bytes (the HTTP/2
    /// preface, or an fd-socket frame), in ms.
    pub handshake_timeout_ms: u64,
    /// How long a connection may stay without receiving a byte before it is closed, in ms.
    pub idle_timeout_ms: u64,
    /// How long a gRPC connection may stay with no session attached and no call open before
    /// it is closed (HTTP/2 PINGs or not), in ms: peers that never open a session cannot hold
    /// a connection pool.
    pub idle_connection_ms: u64,
    /// Device faults (failures and hangs) one uid may cause within `fault_window_ms` before it
    /// is cooled down (a fault is charged to every identity the session's connection proved;
    /// see `auth`).
    pub fault_budget: u32,
    /// The window the fault budget counts over, in ms.
    pub fault_window_ms: u64,
    /// How long a uid that spent its fault budget may not register programs or dispatch, in ms.
    pub fault_cooldown_ms: u64,
    /// Bytes of tensors all sessions together may hold (allocated and imported), so that
    /// callers within their own quotas cannot together grow the daemon past its memory limit.
    /// The default (8 GiB, twice one session's default) suits a host; the Kubernetes
    /// ConfigMap sets 512 MiB to fit its DaemonSet's 1 GiB memory limit.
    pub max_total_tensor_bytes: u64,
    /// Bytes of registered programs (PDI plus instruction stream, each content once) all
    /// sessions together may hold.
    pub max_total_program_bytes: u64,
    /// Bytes of gRPC request messages received and not yet answered (queued dispatches and
    /// chains, tensor bytes being written, programs being registered), daemon-wide.
    pub max_queued_request_bytes: u64,
    /// Longest time a call's request id (`npud-request-id`) is remembered after the call
    /// arrived, in ms, when the call's own deadline is longer or absent; the session grace
    /// period is added, for a client to reconnect and retry. A client that acknowledges ids
    /// (`npud-request-ack`) lets them go sooner.
    pub request_id_horizon_ms: u64,
    /// Bytes of remembered request ids (with their answers) one identity's sessions may hold;
    /// a call with a new id past this is RESOURCE_EXHAUSTED, and no id is forgotten early.
    pub max_request_id_bytes_per_principal: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_sessions: 64,
            max_tensors_per_session: 256,
            max_tensor_bytes_per_session: 4 << 30,
            max_chain_links: 1024,
            max_pending_per_session: 256,
            max_cached_programs: 16,
            max_message_bytes: 16 << 20,
            max_program_bytes: 8 << 20,
            max_sessions_per_uid: 16,
            max_program_bytes_per_session: 64 << 20,
            max_programs_per_session: DEFAULT_MAX_PROGRAMS_PER_SESSION,
            max_connections: 1024,
            max_connections_per_peer: 128,
            max_tcp_connections: 256,
            max_tcp_connections_per_prefix: 64,
            max_preauth_connections: 64,
            max_preauth_connections_per_prefix: 8,
            handshake_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            idle_connection_ms: 60_000,
            fault_budget: 3,
            fault_window_ms: 60_000,
            fault_cooldown_ms: 300_000,
            // With the two below and the daemon's own ~50 MiB, within the DaemonSet's 1 GiB.
            max_total_tensor_bytes: 8 << 30,
            max_total_program_bytes: 128 << 20,
            max_queued_request_bytes: 192 << 20,
            request_id_horizon_ms: 60_000,
            max_request_id_bytes_per_principal: 4 << 20,
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The gRPC Unix socket.
    pub socket: PathBuf,
    /// The fd socket (SCM_RIGHTS), beside the gRPC socket.
    pub fd_socket: PathBuf,
    /// An optional TCP listener for remote clients, e.g. "127.0.0.1:50051".
    pub tcp: Option<String>,
    /// Listen on a TCP address that is not loopback without `[tls]` (session tokens and tensor
    /// bytes then cross the network in the clear).
    pub allow_insecure_tcp: bool,
    pub tls: TlsConfig,
    pub auth: AuthConfig,
    pub backend: Backend,
    /// Path of libhsa-runtime64.so for the `hsa` backend (otherwise discovered).
    pub library: Option<PathBuf>,
    /// `g2`, `g1b` or `g1a`; unset: `g2` on `hsa`, the profile's own on the emulator.
    pub packet_abi: Option<String>,
    /// Whether a G2 runtime takes full-ELF packets, so FullElf kernels run there: unset
    /// (auto) proves it only for a G2 runtime with the AIE loader; `true` for the newest G2
    /// ROCR, which `auto` cannot tell from the first G2 release (which has none).
    pub g2_full_elf: Option<bool>,
    /// ROCm 7.0 (G1a): give every queue a runtime of its own (`hsa_shut_down`, `hsa_init`, and
    /// every program and tensor put back), so that ROCR 7.0's PDI cache can never send a
    /// dispatch to no context or to another program's (the default). `false` accepts that
    /// risk: queues are recreated in one runtime, which costs less and drops or miscomputes
    /// dispatches while reporting them done. Ignored on other runtimes.
    pub rocm70_runtime_per_queue: bool,
    /// `npu1` or `npu2`, overriding the generation read from the agent name or sysfs.
    pub generation: Option<String>,
    /// Where sysfs is mounted: the NPU's PCI id is read there when the agent name does not
    /// tell the generation (ROCm 7.0 names every NPU `aie2`).
    pub sysfs_root: PathBuf,
    pub emulator: EmulatorConfig,
    pub executor: ExecutorConfig,
    pub health: HealthConfig,
    pub metrics: MetricsConfig,
    pub shutdown: ShutdownConfig,
    pub limits: Limits,
    /// Where quarantine records and the in-flight record live across restarts (default: see
    /// `default_state_dir`); empty: nowhere (quarantine lasts until the daemon stops).
    pub state_dir: PathBuf,
    /// How long a session outlives its last connection, in ms.
    pub session_grace_ms: u64,
    /// Threads serving gRPC and the fd socket (the executor has its own); 0: as
    /// [`Config::io_threads`] chooses.
    pub io_threads: u32,
    pub log: LogConfig,
}

impl Default for Config {
    fn default() -> Self {
        let dir = default_runtime_dir();
        Self {
            socket: dir.join("npud.sock"),
            fd_socket: dir.join("npud.fd.sock"),
            tcp: None,
            allow_insecure_tcp: false,
            tls: TlsConfig::default(),
            auth: AuthConfig::default(),
            backend: Backend::Emulator,
            library: None,
            packet_abi: None,
            g2_full_elf: None,
            rocm70_runtime_per_queue: true,
            generation: None,
            sysfs_root: PathBuf::from("/sys"),
            emulator: EmulatorConfig::default(),
            executor: ExecutorConfig::default(),
            health: HealthConfig::default(),
            metrics: MetricsConfig::default(),
            shutdown: ShutdownConfig::default(),
            limits: Limits::default(),
            state_dir: default_state_dir(),
            session_grace_ms: 10_000,
            io_threads: 0,
            log: LogConfig::default(),
        }
    }
}

/// The fd socket's default: beside the gRPC socket, named after it (`npud.sock` gives
/// `npud.fd.sock`, `a.sock` `a.fd.sock`), so that two daemons given two sockets get two fd
/// sockets.
pub fn fd_socket_beside(socket: &Path) -> PathBuf {
    let stem = socket
        .file_stem()
        .map_or_else(|| "npud".into(), |s| s.to_string_lossy().into_owned());
    socket.with_file_name(format!("{stem}.fd.sock"))
}

/// `/run/npud` for root, `$XDG_RUNTIME_DIR/npud` otherwise, `/tmp/npud-<uid>` as a last resort.
fn default_runtime_dir() -> PathBuf {
    let uid = rustix::process::getuid();
    if uid.is_root() {
        return PathBuf::from("/run/npud");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("npud"),
        _ => PathBuf::from(format!("/tmp/npud-{}", uid.as_raw())),
    }
}

/// `$STATE_DIRECTORY` (systemd sets it from `StateDirectory=`; the first when it lists several),
/// else `/var/lib/npud` for root, else `$XDG_STATE_HOME/npud`, else `~/.local/state/npud`, and
/// `/tmp/npud-<uid>/state` without `HOME`.
fn default_state_dir() -> PathBuf {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = std::env::var("STATE_DIRECTORY")
        .ok()
        .and_then(|v| v.split(':').next().map(str::to_owned))
        .filter(|v| !v.is_empty())
    {
        return PathBuf::from(d);
    }
    let uid = rustix::process::getuid();
    if uid.is_root() {
        return PathBuf::from("/var/lib/npud");
    }
    if let Some(d) = var("XDG_STATE_HOME").filter(|d| d.is_absolute()) {
        return d.join("npud");
    }
    match var("HOME") {
        Some(h) => h.join(".local/state/npud"),
        None => PathBuf::from(format!("/tmp/npud-{}/state", uid.as_raw())),
    }
}

/// A configuration that cannot be used, with the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Figment(#[from] Box<figment::Error>),
    #[error("configuration key {key}: {reason}")]
    Invalid { key: &'static str, reason: String },
}

/// The top-level keys; `NPUD_*` variables outside them belong to other tools (`NPUD_ADDR` is
/// npuctl's, `NPUD_BIN` names this binary for scripts) and are not configuration. A misspelt
/// nested key (`NPUD_LIMITS__MAX_SESION`) is still an error.
const TOP_LEVEL_KEYS: &[&str] = &[
    "socket",
    "fd_socket",
    "tcp",
    "allow_insecure_tcp",
    "tls",
    "auth",
    "backend",
    "library",
    "packet_abi",
    "g2_full_elf",
    "rocm70_runtime_per_queue",
    "generation",
    "sysfs_root",
    "emulator",
    "executor",
    "health",
    "metrics",
    "shutdown",
    "limits",
    "state_dir",
    "session_grace_ms",
    "io_threads",
    "log",
];

fn is_config_key(k: &str) -> bool {
    let root = k.split("__").next().unwrap_or(k);
    let root = root.split('.').next().unwrap_or(root);
    TOP_LEVEL_KEYS.iter().any(|t| t.eq_ignore_ascii_case(root))
}

impl Config {
    /// Layers defaults, the TOML file (`file`, or [`DEFAULT_CONFIG_FILE`] when it exists), the
    /// `NPUD_*` environment and `overrides` (command-line flags), then checks the result.
    ///
    /// # Errors
    /// A key with a value of the wrong type or an unknown key (naming it), or a value out of
    /// range ([`ConfigError::Invalid`]).
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        // What the operator set (file, environment, flags), apart from the defaults: an fd
        // socket nobody named follows the gRPC socket wherever that was put.
        let mut given = Figment::new();
        match file {
            Some(f) => given = given.merge(Toml::file_exact(f)),
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => {
                given = given.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
            }
            None => {}
        }
        let given = given
            .merge(
                Env::prefixed("NPUD_")
                    .split("__")
                    .filter(|k| is_config_key(k.as_str())),
            )
            .merge(Serialized::defaults(overrides));
        let mut cfg: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(given.clone())
            .extract()
            .map_err(Box::new)?;
        if !given.contains("fd_socket") {
            cfg.fd_socket = fd_socket_beside(&cfg.socket);
        }
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| ConfigError::Invalid {
            key,
            reason: reason.into(),
        };
        let profile = self
            .emulator
            .profile
            .parse::<hsa_sim::Profile>()
            .map_err(|_| {
                invalid(
                    "emulator.profile",
                    "expected rocr-newest, rocr-g2-2026-07, rocr-g2-2026-05, rocr-late-2025, rocm-7.0 or \
                     kernel-object",
                )
            })?;
        if let Some(abi) = self.packet_abi.as_deref().filter(|a| *a != "auto") {
            let abi = abi.parse::<hsa_core::PacketAbi>().map_err(|_| {
                invalid("packet_abi", "expected auto, kernel-object, g2, g1b or g1a")
            })?;
            if self.backend == Backend::Emulator && abi != spoken_by(profile) {
                return Err(ConfigError::Invalid {
                    key: "packet_abi",
                    reason: format!(
                        "the emulator profile {profile} speaks {}, not {abi}; leave packet_abi \
                         unset on the emulator, or choose a profile that speaks {abi}",
                        spoken_by(profile)
                    ),
                });
            }
        }
        if let Some(g) = &self.generation
            && g.parse::<hsa_core::Generation>().is_err()
        {
            return Err(invalid("generation", "expected npu1 or npu2"));
        }
        if !matches!(self.emulator.agent_name.as_str(), "aie2" | "aie2p") {
            return Err(invalid("emulator.agent_name", "expected aie2 or aie2p"));
        }
        if self
            .emulator
            .timing
            .parse::<hsa_sim::timing::Timing>()
            .is_err()
        {
            return Err(invalid("emulator.timing", "expected off or model"));
        }
        if let Some(t) = &self.tcp
            && t.parse::<SocketAddr>().is_err()
        {
            return Err(invalid(
                "tcp",
                "expected an address and port such as 127.0.0.1:50051",
            ));
        }
        if self.metrics.max_program_labels > MAX_PROGRAM_LABELS {
            return Err(invalid(
                "metrics.max_program_labels",
                "must be at most 1024 (programs past it are counted as \"other\")",
            ));
        }
        if self.metrics.max_session_labels > MAX_PROGRAM_LABELS {
            return Err(invalid(
                "metrics.max_session_labels",
                "must be at most 1024 (sessions past it are summed as \"other\")",
            ));
        }
        if let Some(t) = &self.tcp
            && let Ok(addr) = t.parse::<SocketAddr>()
            && !addr.ip().is_loopback()
            && !self.tls.enabled()
            && !self.allow_insecure_tcp
        {
            return Err(ConfigError::Invalid {
                key: "tcp",
                reason: format!(
                    "{addr} is not a loopback address, and without TLS session tokens and tensor \
                     bytes would cross the network in the clear: set [tls] cert and key (see \
                     \"Exposing npud on a network\" in the README), listen on 127.0.0.1, or \
                     pass --allow-insecure-tcp (allow_insecure_tcp = true) on a network you trust"
                ),
            });
        }
        self.tls.check()?;
        self.auth.check()?;
        if self.io_threads > MAX_IO_THREADS {
            return Err(invalid("io_threads", "must be at most 64 (0 chooses)"));
        }
        if !(1..=64).contains(&self.executor.interactive_weight) {
            return Err(invalid(
                "executor.interactive_weight",
                "must be within 1 to 64 (1: an interactive session's share is a batch session's)",
            ));
        }
        if !(1..=10_000_000).contains(&self.executor.interactive_deadline_us) {
            return Err(invalid(
                "executor.interactive_deadline_us",
                "must be within 1 to 10000000 (10 s)",
            ));
        }
        if !(1..=60_000).contains(&self.executor.interactive_idle_ms) {
            return Err(invalid(
                "executor.interactive_idle_ms",
                "must be within 1 to 60000 (1 min)",
            ));
        }
        if self.executor.spin_us > MAX_SPIN_US {
            return Err(invalid(
                "executor.spin_us",
                "must be at most 10000 (10 ms); 0 never polls",
            ));
        }
        if self.health.min_not_serving_ms > MAX_MIN_NOT_SERVING_MS {
            return Err(invalid(
                "health.min_not_serving_ms",
                "must be at most 60000 (1 min); 0 reports only what the device does",
            ));
        }
        if self.shutdown.drain_timeout_ms > MAX_DRAIN_TIMEOUT_MS {
            return Err(invalid(
                "shutdown.drain_timeout_ms",
                "must be at most 3600000 (1 h)",
            ));
        }
        if self.shutdown.close_grace_ms > MAX_CLOSE_GRACE_MS {
            return Err(invalid(
                "shutdown.close_grace_ms",
                "must be at most 60000 (1 min)",
            ));
        }
        if !(MIN_SLICE_BYTES..=MAX_SLICE_BYTES).contains(&self.executor.slice_bytes) {
            return Err(invalid(
                "executor.slice_bytes",
                "must be between 4096 and 268435456 (256 MiB)",
            ));
        }
        let l = &self.limits;
        if l.max_cached_programs == 0 || l.max_cached_programs > MAX_PDIS {
            return Err(invalid(
                "limits.max_cached_programs",
                "must be between 1 and 32 (the NPU holds at most 32 PDIs)",
            ));
        }
        for (key, v) in [
            ("limits.max_sessions", u64::from(l.max_sessions)),
            (
                "limits.max_tensors_per_session",
                u64::from(l.max_tensors_per_session),
            ),
            (
                "limits.max_tensor_bytes_per_session",
                l.max_tensor_bytes_per_session,
            ),
            ("limits.max_chain_links", u64::from(l.max_chain_links)),
            (
                "limits.max_pending_per_session",
                u64::from(l.max_pending_per_session),
            ),
            ("limits.max_program_bytes", l.max_program_bytes),
            (
                "limits.max_sessions_per_uid",
                u64::from(l.max_sessions_per_uid),
            ),
            (
                "limits.max_program_bytes_per_session",
                l.max_program_bytes_per_session,
            ),
            (
                "limits.max_programs_per_session",
                u64::from(l.max_programs_per_session),
            ),
            ("limits.max_connections", u64::from(l.max_connections)),
            (
                "limits.max_connections_per_peer",
                u64::from(l.max_connections_per_peer),
            ),
            (
                "limits.max_tcp_connections",
                u64::from(l.max_tcp_connections),
            ),
            (
                "limits.max_tcp_connections_per_prefix",
                u64::from(l.max_tcp_connections_per_prefix),
            ),
            (
                "limits.max_preauth_connections",
                u64::from(l.max_preauth_connections),
            ),
            (
                "limits.max_preauth_connections_per_prefix",
                u64::from(l.max_preauth_connections_per_prefix),
            ),
            ("limits.handshake_timeout_ms", l.handshake_timeout_ms),
            ("limits.idle_timeout_ms", l.idle_timeout_ms),
            ("limits.idle_connection_ms", l.idle_connection_ms),
            ("limits.fault_budget", u64::from(l.fault_budget)),
            ("limits.fault_window_ms", l.fault_window_ms),
            ("limits.fault_cooldown_ms", l.fault_cooldown_ms),
            ("limits.max_total_tensor_bytes", l.max_total_tensor_bytes),
            ("limits.max_total_program_bytes", l.max_total_program_bytes),
            (
                "limits.max_queued_request_bytes",
                l.max_queued_request_bytes,
            ),
            ("limits.request_id_horizon_ms", l.request_id_horizon_ms),
            (
                "limits.max_request_id_bytes_per_principal",
                l.max_request_id_bytes_per_principal,
            ),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if l.max_message_bytes < 64 << 10 {
            return Err(invalid(
                "limits.max_message_bytes",
                "must be at least 64 KiB",
            ));
        }
        if usize::try_from(l.max_message_bytes.saturating_mul(2)).is_err() {
            return Err(invalid("limits.max_message_bytes", "too large"));
        }
        if self.socket == self.fd_socket {
            return Err(invalid("fd_socket", "must differ from socket"));
        }
        Ok(())
    }

    /// The number of I/O threads to start: `io_threads` when set, otherwise one for every two
    /// cores beyond the first, at least one and at most four. Dispatches are serialized on the
    /// executor; what I/O threads add is decoding and encoding in parallel, paid for in
    /// wake-ups between them.
    pub fn io_threads(&self) -> usize {
        if self.io_threads > 0 {
            return self.io_threads as usize;
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (cores.saturating_sub(1) / 2).clamp(1, 4)
    }

    /// Whether the emulator's doorbells take modelled device time (checked by
    /// [`Config::load`]; off if unparsable).
    pub fn emulator_timing(&self) -> hsa_sim::timing::Timing {
        self.emulator.timing.parse().unwrap_or_default()
    }

    /// The emulator profile (checked by [`Config::load`]; the default if unparsable).
    pub fn emulator_profile(&self) -> hsa_sim::Profile {
        self.emulator.profile.parse().unwrap_or_default()
    }

    /// How the packet ABI is chosen, as (ABI, probe): `packet_abi` when it names one; else
    /// (`auto`, the default) proven by hsa-core from what the runtime shows when the device
    /// opens, the same way on both backends (the ABI returned is then unused).
    pub fn packet_abi(&self) -> (hsa_core::PacketAbi, bool) {
        match self.packet_abi.as_deref().filter(|a| *a != "auto") {
            Some(abi) => (abi.parse().unwrap_or_default(), false),
            None => (hsa_core::PacketAbi::G2, true),
        }
    }

    /// The device options this configuration asks for.
    pub fn device_options(&self) -> hsa_core::DeviceOptions {
        let (packet_abi, probe_code_objects) = self.packet_abi();
        hsa_core::DeviceOptions {
            packet_abi,
            probe_code_objects,
            generation: self.generation.as_deref().and_then(|g| g.parse().ok()),
            sysfs_root: self.sysfs_root.clone(),
            g2_full_elf: self.g2_full_elf,
            g1a_runtime_per_queue: self.rocm70_runtime_per_queue,
            ..hsa_core::DeviceOptions::default()
        }
    }
}

/// The packet ABI an emulator profile speaks: kernel objects where it loads code objects.
fn spoken_by(profile: hsa_sim::Profile) -> hsa_core::PacketAbi {
    if profile.speaks_kernel_objects() {
        hsa_core::PacketAbi::KernelObject
    } else {
        profile.packet_abi()
    }
}

/// Command-line values that override every other layer; `None` leaves a key alone.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fd_socket: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_insecure_tcp: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packet_abi: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub g2_full_elf: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sysfs_root: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_grace_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_threads: Option<u32>,
    #[serde(skip_serializing_if = "OverrideLog::is_empty")]
    pub log: OverrideLog,
    #[serde(skip_serializing_if = "OverrideEmulator::is_empty")]
    pub emulator: OverrideEmulator,
    #[serde(skip_serializing_if = "OverrideExecutor::is_empty")]
    pub executor: OverrideExecutor,
    #[serde(skip_serializing_if = "OverrideMetrics::is_empty")]
    pub metrics: OverrideMetrics,
}

/// `[metrics]` overrides.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OverrideMetrics {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
}

impl OverrideMetrics {
    fn is_empty(&self) -> bool {
        self.listen.is_none()
    }
}

/// `[executor]` overrides.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OverrideExecutor {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spin_us: Option<u64>,
}

impl OverrideExecutor {
    fn is_empty(&self) -> bool {
        self.spin_us.is_none()
    }
}

/// `[log]` overrides.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OverrideLog {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<LogFormat>,
}

impl OverrideLog {
    fn is_empty(&self) -> bool {
        self.level.is_none() && self.format.is_none()
    }
}

/// `[emulator]` overrides.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OverrideEmulator {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl OverrideEmulator {
    fn is_empty(&self) -> bool {
        self.agent_name.is_none() && self.profile.is_none() && self.timeout_ms.is_none()
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn other_tools_npud_variables_are_not_configuration_but_misspelt_keys_are_errors() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("NPUD_ADDR", "unix:/somewhere");
            jail.set_env("NPUD_BIN", "/usr/bin/npud");
            jail.set_env("NPUD_LIMITS__MAX_SESSIONS", "3");
            let c = Config::load(None, &Overrides::default()).expect("loads");
            assert_eq!(c.limits.max_sessions, 3);
            jail.set_env("NPUD_LIMITS__MAX_SESION", "3");
            let e = Config::load(None, &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains("max_sesion"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn layers_apply_in_order_defaults_file_env_flags() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "npud.toml",
                r#"
                socket = "/tmp/from-file.sock"
                session_grace_ms = 1
                tcp = "127.0.0.1:1"
                [limits]
                max_sessions = 3
                max_chain_links = 7
                [log]
                level = "debug"
                "#,
            )?;
            jail.set_env("NPUD_SESSION_GRACE_MS", "2");
            jail.set_env("NPUD_LIMITS__MAX_CHAIN_LINKS", "9");
            jail.set_env("NPUD_TCP", "127.0.0.1:2");
            let flags = Overrides {
                tcp: Some("127.0.0.1:3".into()),
                ..Overrides::default()
            };
            let c =
                Config::load(Some(Path::new("npud.toml")), &flags).map_err(|e| e.to_string())?;
            // file over defaults
            assert_eq!(c.socket, PathBuf::from("/tmp/from-file.sock"));
            assert_eq!(c.limits.max_sessions, 3);
            assert_eq!(c.log.level, "debug");
            // env over file
            assert_eq!(c.session_grace_ms, 2);
            assert_eq!(c.limits.max_chain_links, 9);
            // flags over env
            assert_eq!(c.tcp.as_deref(), Some("127.0.0.1:3"));
            // untouched defaults
            assert_eq!(c.limits.max_pending_per_session, 256);
            assert_eq!(c.emulator.agent_name, "aie2p");
            Ok(())
        });
    }

    #[test]
    fn out_of_range_values_name_the_key() {
        Jail::expect_with(|jail| {
            jail.set_env("NPUD_LIMITS__MAX_CACHED_PROGRAMS", "33");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert!(e.to_string().contains("limits.max_cached_programs"), "{e}");
            jail.set_env("NPUD_LIMITS__MAX_CACHED_PROGRAMS", "4");
            jail.set_env("NPUD_PACKET_ABI", "g3");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert!(e.to_string().contains("packet_abi"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn packet_abi_is_auto_by_default_and_a_named_one_must_be_the_profiles() {
        use hsa_core::PacketAbi;
        Jail::expect_with(|jail| {
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.packet_abi(), (PacketAbi::G2, true));
            // `auto` never takes the emulator profile's ABI: hsa-core proves it on both
            // backends from what the runtime shows.
            jail.set_env("NPUD_EMULATOR__PROFILE", "kernel-object");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.packet_abi(), (PacketAbi::G2, true));
            jail.set_env("NPUD_PACKET_ABI", "kernel-object");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.packet_abi(), (PacketAbi::KernelObject, false));
            jail.set_env("NPUD_PACKET_ABI", "g2");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert!(
                e.to_string()
                    .contains("the emulator profile kernel-object speaks kernel-object, not g2"),
                "{e}"
            );
            jail.set_env("NPUD_EMULATOR__PROFILE", "rocm-7.0");
            jail.set_env("NPUD_PACKET_ABI", "auto");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.packet_abi(), (PacketAbi::G2, true));
            jail.set_env("NPUD_BACKEND", "hsa");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.packet_abi(), (PacketAbi::G2, true));
            Ok(())
        });
    }

    #[test]
    fn threads_and_polling_are_configurable_and_bounded() {
        Jail::expect_with(|jail| {
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.io_threads, 0);
            assert!((1..=4).contains(&c.io_threads()), "{}", c.io_threads());
            assert_eq!(c.executor.spin_us, 200);
            jail.set_env("NPUD_IO_THREADS", "3");
            jail.set_env("NPUD_EXECUTOR__SPIN_US", "0");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!((c.io_threads(), c.executor.spin_us), (3, 0));
            let flags = Overrides {
                io_threads: Some(2),
                executor: OverrideExecutor { spin_us: Some(50) },
                ..Overrides::default()
            };
            let c = Config::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!((c.io_threads(), c.executor.spin_us), (2, 50));
            jail.set_env("NPUD_IO_THREADS", "65");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert_eq!(
                e.to_string(),
                "configuration key io_threads: must be at most 64 (0 chooses)"
            );
            jail.set_env("NPUD_IO_THREADS", "1");
            jail.set_env("NPUD_EXECUTOR__SPIN_US", "10001");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert_eq!(
                e.to_string(),
                "configuration key executor.spin_us: must be at most 10000 (10 ms); 0 never polls"
            );
            jail.set_env("NPUD_EXECUTOR__SPIN_US", "0");
            jail.set_env("NPUD_EXECUTOR__SLICE_BYTES", "4095");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert_eq!(
                e.to_string(),
                "configuration key executor.slice_bytes: must be between 4096 and 268435456 \
                 (256 MiB)"
            );
            jail.set_env("NPUD_EXECUTOR__SLICE_BYTES", "65536");
            jail.set_env("NPUD_LIMITS__FAULT_BUDGET", "0");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert_eq!(
                e.to_string(),
                "configuration key limits.fault_budget: must be at least 1"
            );
            jail.set_env("NPUD_LIMITS__FAULT_BUDGET", "5");
            jail.set_env("NPUD_LIMITS__FAULT_COOLDOWN_MS", "1500");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.executor.slice_bytes, 65536);
            assert_eq!(
                (
                    c.limits.fault_budget,
                    c.limits.fault_window_ms,
                    c.limits.fault_cooldown_ms
                ),
                (5, 60_000, 1500)
            );
            jail.set_env("NPUD_EXECUTOR__SPIN_MS", "1");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert!(e.to_string().contains("spin_ms"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn the_fd_socket_follows_the_grpc_socket_unless_it_is_named() {
        Jail::expect_with(|jail| {
            let flags = Overrides {
                socket: Some("/tmp/a/one.sock".into()),
                ..Overrides::default()
            };
            let c = Config::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!(c.fd_socket, PathBuf::from("/tmp/a/one.fd.sock"));
            jail.set_env("NPUD_SOCKET", "/tmp/b/npud.sock");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.fd_socket, PathBuf::from("/tmp/b/npud.fd.sock"));
            jail.set_env("NPUD_FD_SOCKET", "/tmp/c/fd");
            let c = Config::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!(c.fd_socket, PathBuf::from("/tmp/c/fd"));
            Ok(())
        });
    }

    #[test]
    fn the_state_directory_follows_systemd_then_the_user_and_empty_turns_it_off() {
        Jail::expect_with(|jail| {
            jail.set_env(
                "STATE_DIRECTORY",
                "/var/lib/npud-from-systemd:/var/lib/other",
            );
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.state_dir, PathBuf::from("/var/lib/npud-from-systemd"));
            jail.set_env("STATE_DIRECTORY", "");
            if !rustix::process::getuid().is_root() {
                jail.set_env("XDG_STATE_HOME", "/home/u/.state");
                let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
                assert_eq!(c.state_dir, PathBuf::from("/home/u/.state/npud"));
            }
            jail.set_env("NPUD_STATE_DIR", "/srv/npud");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.state_dir, PathBuf::from("/srv/npud"));
            let flags = Overrides {
                state_dir: Some(PathBuf::new()),
                ..Overrides::default()
            };
            let c = Config::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!(c.state_dir, PathBuf::new());
            jail.set_env("NPUD_STATE_DIR", "");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.state_dir, PathBuf::new());
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_are_refused() {
        Jail::expect_with(|jail| {
            jail.create_file("x.toml", "[limits]\nmax_sesions = 3\n")?;
            let e = Config::load(Some(Path::new("x.toml")), &Overrides::default()).unwrap_err();
            assert!(e.to_string().contains("max_sesions"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn the_metrics_listener_is_off_by_default_and_set_by_file_env_or_flag() {
        Jail::expect_with(|jail| {
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.metrics.listen, None);
            assert_eq!(c.metrics.max_program_labels, 64);
            jail.create_file("m.toml", "[metrics]\nlisten = \"127.0.0.1:9464\"\n")?;
            let c = Config::load(Some(Path::new("m.toml")), &Overrides::default())
                .map_err(|e| e.to_string())?;
            assert_eq!(c.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
            jail.set_env("NPUD_METRICS__LISTEN", "[::1]:0");
            let c = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.metrics.listen, Some("[::1]:0".parse().unwrap()));
            let flags = Overrides {
                metrics: OverrideMetrics {
                    listen: Some("127.0.0.2:1".parse().unwrap()),
                },
                ..Overrides::default()
            };
            let c = Config::load(None, &flags).map_err(|e| e.to_string())?;
            assert_eq!(c.metrics.listen, Some("127.0.0.2:1".parse().unwrap()));
            // The environment layer names the key in capitals.
            jail.set_env("NPUD_METRICS__LISTEN", "localhost");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            let text = e.to_string().to_lowercase();
            assert!(
                text.contains("metrics.listen") && text.contains("invalid socket address"),
                "{e}"
            );
            jail.set_env("NPUD_METRICS__LISTEN", "127.0.0.1:0");
            jail.set_env("NPUD_METRICS__MAX_PROGRAM_LABELS", "5000");
            let e = Config::load(None, &Overrides::default()).unwrap_err();
            assert!(e.to_string().contains("metrics.max_program_labels"), "{e}");
            Ok(())
        });
    }
}
