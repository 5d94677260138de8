//! npud: a daemon that owns one AMD XDNA NPU through ROCm's HSA runtime (or the built-in
//! emulator) and serves it to local and remote clients over gRPC.
//!
//! Modules, from the outside in: [`server`] (listeners, reflection, shutdown), [`health`]
//! (what health watchers and `DeviceInfo` see of recoveries and draining),
//! [`service`] (the `npud.v1.Npud` handlers), [`fdsock`] (file descriptors over SCM_RIGHTS),
//! [`sessions`] and [`conn`] (who is calling, and when they left), [`programs`] (the content-hash
//! program store), [`executor`] (the one thread that owns the device), [`config`] and
//! [`error`] (the one place errors become gRPC statuses), [`faults`] (the device-fault budget
//! per uid), [`state_dir`] (quarantine records and
//! the in-flight record, kept across restarts), [`systemd`] (socket activation, readiness, the
//! watchdog), [`metrics`] (Prometheus metrics and their listener).

#![forbid(unsafe_code)]

pub mod accept;
pub mod auth;
pub mod budget;
pub mod bulk;
pub mod codes;
pub mod config;
pub mod conn;
pub mod deadline;
pub mod decoded;
pub mod drain;
pub mod error;
pub mod executor;
pub mod faults;
pub mod fds;
pub mod fdsock;
pub mod health;
pub mod intake;
pub mod lives;
pub mod logging;
pub mod metrics;
pub mod peer;
pub mod principals;
pub mod priority;
pub mod programs;
pub mod request_ids;
pub mod server;
pub mod service;
pub mod sessions;
pub mod signals;
pub mod state_dir;
pub mod stats;
pub mod systemd;
pub mod tickets;
pub mod tls;
pub mod token_dir;

/// A map keyed by ids the daemon assigns (sessions, tensors, programs), on the dispatch path:
/// foldhash, seeded per process, instead of SipHash. SipHash's strength is against keys an
/// attacker chooses; these keys are the daemon's own (a client can only look one up), and
/// SipHash cost a few percent of a fast-path dispatch.
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// A set of ids, as [`IdMap`].
pub(crate) type IdSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
