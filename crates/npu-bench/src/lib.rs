//! `npuctl bench`: what sharing the NPU through npud costs, measured side by side with the
//! floors it cannot go below, in one process and one run.
//!
//! Rows (each with p50, p99, mean and throughput, after a warm-up; see the crate README for
//! what each one measures and the goals stated as ratios between them):
//!
//! | row | module | what |
//! |---|---|---|
//! | 1, 1b, 1c | [`floors`] | raw Unix-socket echo; bare tonic unary echo; tonic streaming echo |
//! | 2 | [`inproc`] | dispatch through hsa-core on the emulator, no daemon |
//! | 3, 4, 5, 6, 9 | [`rows`] | npud over Unix and TCP, chains, tensor sizes, pipelined Submit |
//! | 7, 8 | [`load`] | concurrent clients; the daemon's resident memory |
//! | 12 | [`stall`] | another client's dispatches while one allocates 1 GiB, or runs 1,024-link chains |
//! | 14 | [`rss`] | the daemon's memory before, during and after a quota-sized queue of chains (`--only rss`) |
//! | 13 | [`tls`] | unary dispatch over TLS beside plaintext TCP |
//! | 16 (faults) | [`faulting`] | 15 healthy sessions' throughput while a 16th faults every tenth dispatch |
//!
//! [`daemon`] starts npud on the emulator (or takes a running one); [`run::run`] runs every row
//! and returns a [`report::Report`].

#![forbid(unsafe_code)]

pub mod client;
pub mod daemon;
pub mod device;
pub mod fastpath;
pub mod faulting;
pub mod floors;
pub mod inproc;
pub mod interactive;
pub mod load;
pub mod place;
pub mod profiles;
pub mod report;
pub mod rows;
pub mod rss;
pub mod run;
pub mod stall;
pub mod stats;
pub mod tls;

/// The bare echo service (`proto/bench/v1/echo.proto`).
pub mod echo_pb {
    #![allow(missing_debug_implementations, clippy::cast_possible_truncation)]
    tonic::include_proto!("npud.bench.v1");
}

/// Why a row could not run.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BenchError(pub String);

impl BenchError {
    /// An error with context.
    pub fn ctx(what: &str) -> impl Fn(&dyn std::fmt::Display) -> BenchError + '_ {
        move |e| BenchError(format!("{what}: {e}"))
    }
}

impl From<tonic::Status> for BenchError {
    fn from(s: tonic::Status) -> Self {
        BenchError(format!("{:?}: {}", s.code(), s.message()))
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> Self {
        BenchError(e.to_string())
    }
}

impl From<tonic::transport::Error> for BenchError {
    fn from(e: tonic::transport::Error) -> Self {
        let mut s = e.to_string();
        let mut cur = std::error::Error::source(&e);
        while let Some(c) = cur {
            s.push_str(&format!(": {c}"));
            cur = c.source();
        }
        BenchError(s)
    }
}

impl From<npu_artifacts::ArtifactError> for BenchError {
    fn from(e: npu_artifacts::ArtifactError) -> Self {
        BenchError(e.to_string())
    }
}

impl From<npu_fd::FdError> for BenchError {
    fn from(e: npu_fd::FdError) -> Self {
        BenchError(e.to_string())
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, BenchError>;
