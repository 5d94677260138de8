//! npud-device-plugin: the NPU that npud owns, offered to Kubernetes pods as shares.
//!
//! The plugin speaks the kubelet's device-plugin API v1beta1 over Unix sockets. It registers
//! the extended resource (`amd.com/npu` by default) with the kubelet, advertises `shares`
//! devices `npu0-share-0` .. `npu0-share-{N-1}` for the one NPU its npud owns, marks them
//! Unhealthy while npud's `grpc.health.v1` status is not SERVING or npud cannot be reached,
//! and at `Allocate` hands a container npud's socket directory and a token file of its own
//! instead of any device node. Every pod then reaches the NPU only through npud, which
//! serializes its work with everyone else's.
//!
//! - [`config`]: flags and environment.
//! - [`shares`]: share ids, token names, the preferred allocation.
//! - [`token`]: the per-allocation token files npud's `auth.token_dir` reads.
//! - [`npud`]: following npud's health.
//! - [`plugin`]: the `DevicePlugin` service.
//! - [`kubelet`]: registration, and noticing that the kubelet restarted.
//! - [`run`]: the whole lifecycle.

#![forbid(unsafe_code)]

pub mod config;
pub mod kubelet;
pub mod npud;
pub mod plugin;
pub mod run;
pub mod shares;
pub mod token;

/// The kubelet's device-plugin API, package `v1beta1`.
pub mod v1beta1 {
    #![allow(missing_debug_implementations, clippy::cast_possible_truncation)]
    tonic::include_proto!("v1beta1");
}

/// The API version this plugin speaks, sent in `RegisterRequest.version`.
pub const API_VERSION: &str = "v1beta1";
/// `Device.health` of a share that can take work.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a share that cannot.
pub const UNHEALTHY: &str = "Unhealthy";
