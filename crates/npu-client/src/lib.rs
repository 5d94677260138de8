//! The client library for npud, the daemon that owns an AMD XDNA NPU.
//!
//! ```no_run
//! # async fn run() -> Result<(), npu_client::ClientError> {
//! use npu_client::{Client, Program};
//!
//! let client = Client::connect(None).await?; // NPUD_ADDR, else the daemon's default socket
//! let program = Program::from_dir("build/vector_scalar_add")?; // main.pdi + insts.bin
//! let mut input = client.alloc::<i32>(1024).await?;
//! let mut output = client.alloc::<i32>(1024).await?;
//! for (i, x) in input.as_mut_slice().iter_mut().enumerate() {
//!     *x = i as i32 + 1;
//! }
//! // What the design only reads, then what it writes (lent to the daemon until it answers).
//! let timing = client.dispatch(&program, &[&input], &mut [&mut output]).await?;
//! assert_eq!(output.as_slice()[0], 2);
//! println!("queued {:?}, ran {:?}", timing.queue, timing.device);
//! # Ok(()) }
//! ```
//!
//! - [`Client`]: a connection with a session ([`connect`] for addresses and options; the
//!   session resumes by itself after a dropped connection, see [Sessions](crate#sessions)),
//!   batch or interactive ([`SessionClass`], see [`class`]).
//! - [`Program`]: `main.pdi` + `insts.bin`, registered once per session and reused.
//! - [`Tensor<T>`]: typed memory shared with the device by fd on a local connection, staged
//!   through the API on a remote one, with the same results (see [`tensor`]). Its views borrow
//!   it and every call that writes it takes `&mut`, so safe code never holds a view of bytes
//!   the daemon or the device is writing ([What a view guarantees](tensor#what-a-view-guarantees)).
//! - [`Client::dispatch`] and [`Client::chain`] run work; [`DispatchResult`] and [`ChainResult`]
//!   carry the daemon's queue and device times. [`Client::pipeline`] keeps several dispatches
//!   in flight on one stream ([`Pipeline`], for tensors shared in place).
//! - [`blocking::Client`]: the same without async.
//! - [`Operator`]: device information, statistics and every stored program, without a session.
//! - [`health::check`]: the daemon's `grpc.health.v1` status, for probes.
//! - [`Fleet`]: sessions spread over several hosts (a list of addresses or a DNS name), each
//!   on the healthy host with the least pending work, pinned there.
//!
//! # Sessions
//!
//! Every call has a timeout. After a transport error the client reconnects and resumes its
//! session (`ResumeSession`) within [`ConnectOptions::reconnect_timeout`], then retries the call
//! once, with the same request id, so the daemon answers a retried dispatch, chain, allocation or
//! free from its first attempt instead of running it again; if the daemon no longer knows the session (it restarted), calls fail with
//! [`ClientError::SessionLost`]. Programs and tensors are not recreated behind the caller's back.
//!
//! Linux only (memfd, `SCM_RIGHTS`).

#![forbid(unsafe_code)]

pub mod binaries;
pub mod blocking;
pub mod class;
mod client;
pub mod connect;
mod diagnose;
mod dispatch;
mod error;
pub mod fastpath;
pub mod fleet;
pub mod health;
pub mod json;
pub mod local;
mod pipeline;
mod program;
mod queued;
mod session;
pub mod tensor;
mod view;

pub use class::{SessionClass, UnknownSessionClass};
pub use client::{Client, Operator};
pub use connect::{Address, ConnectOptions};
pub use dispatch::{ChainArg, ChainBuilder, ChainResult, DispatchResult, LinkFailure};
pub use error::{ClientError, code_name};
pub use fleet::{Fleet, FleetOptions, FleetSpec, HostHealth, HostStatus};
pub use pipeline::{Completion, Pipeline};
pub use program::{HsacoSource, Program, ProgramInfo};
pub use queued::{HeldArgs, Queued};
pub use tensor::{Element, Tensor, TensorArg};
pub use view::DispatchArg;

/// The generated API types (`DeviceInfo`, `Statistics`, ...), as the daemon sends them.
pub use npu_proto::v1 as proto;

/// bfloat16, an element type of tensors.
pub use half::bf16;
/// The design artifacts crate, for writing emulated designs.
pub use npu_artifacts as artifacts;
pub use npu_artifacts::NpuGen;

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: T) {}

    #[test]
    fn handles_cross_threads() {
        send_sync::<Client>();
        send_sync::<Operator>();
        send_sync::<blocking::Client>();
        send_sync::<Program>();
        send_sync::<Tensor<i32>>();
        send_sync::<Tensor<bf16>>();
    }

    /// Compiles only if the futures can be spawned on a multi-threaded runtime.
    #[allow(dead_code)]
    fn futures_are_send(c: &Client, p: &Program, a: &Tensor<i32>, b: &mut Tensor<i16>) {
        send(c.dispatch(p, &[a], &mut [&mut *b]));
        let mut chain = c.chain();
        let (x, y) = (chain.read(a), chain.write(&mut *b));
        chain.then(p, &[x, y]);
        send(chain.run());
        send(c.alloc::<f32>(4));
        send(c.register(p));
        send(b.download());
    }
}
