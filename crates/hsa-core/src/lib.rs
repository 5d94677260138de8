//! hsa-core: the Rust binding to ROCm's HSA runtime (ROCR) for AMD XDNA NPUs.
//!
//! Layers, from the bottom: [`sys`] (raw C types, constants, the function table), `api`
//! (the loaded table and checked calls), and `device` (a safe `Device` that owns one AIE agent,
//! its pools, its queue and its programs). The same code drives ROCR on an NPU and `hsa-sim`
//! on a machine without one: they differ only in how the function table is filled.

pub mod api;
pub mod device;
pub mod discovery;
pub mod error;
pub mod sys;

pub use api::{ApiSource, HsaApi};
pub use device::{
    Arg, ChainError, ChainReport, Device, DeviceInfo, DeviceOptions, Dispatch, Generation,
    PacketAbi, ProgramId, TensorBacking, TensorId, TensorInfo, TensorSharing, generation,
};
pub use error::HsaError;
