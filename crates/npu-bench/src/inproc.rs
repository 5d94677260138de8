//! Row 2: dispatch through hsa-core on the statically linked emulator, in this process, with no
//! daemon: the same kernel that does no work, the same two 4 KiB tensors, the same packet ABI
//! (G2) npud uses by default.

use std::time::Instant;

use hsa_core::{Device, DeviceOptions, Dispatch, Generation, PacketAbi};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::EmuDesign;

use crate::client::Iters;
use crate::stats::{Summary, nanos, per, summarize};
use crate::{BenchError, Result};

/// Bytes of each of the noop design's two arguments, in every dispatch row.
pub const ARG_BYTES: u32 = 4096;

/// The device, the loaded noop program and its two tensors.
#[derive(Debug)]
pub struct InProcess {
    pub dev: Device,
    pub one: Dispatch,
}

impl InProcess {
    /// Opens the emulator in this process and loads the noop design.
    ///
    /// # Errors
    /// The emulator's refusal, as text.
    pub fn open() -> Result<InProcess> {
        let err = BenchError::ctx("in-process emulator");
        hsa_sim::set_config(hsa_sim::SimConfig::default());
        let api = hsa_sim::api("hsa-sim");
        let mut dev = Device::open(
            api,
            DeviceOptions {
                packet_abi: PacketAbi::G2,
                probe_code_objects: false,
                ..Default::default()
            },
        )
        .map_err(|e| err(&e))?;
        let generation = match dev.info().generation {
            Generation::Npu1 => NpuGen::Npu1,
            Generation::Npu2 => NpuGen::Npu2,
        };
        let d = EmuDesign::noop(2, ARG_BYTES);
        let prog = dev
            .load_program(&d.to_pdi(), &d.insts(generation))
            .map_err(|e| err(&e))?;
        let bytes = ARG_BYTES as usize;
        let a = dev.alloc_tensor(bytes).map_err(|e| err(&e))?;
        let b = dev.alloc_tensor(bytes).map_err(|e| err(&e))?;
        Ok(InProcess {
            dev,
            one: Dispatch::new(prog, [a, b]),
        })
    }

    /// Row 2: single dispatches.
    ///
    /// # Errors
    /// A dispatch the emulator refuses.
    pub fn dispatch(&mut self, it: Iters) -> Result<Summary> {
        let links = std::slice::from_ref(&self.one).to_vec();
        let (ns, wall) = self.time(&links, it)?;
        let n = ns.len() as u64;
        Ok(summarize(ns, n, wall))
    }

    /// Chains of `links` links: per chain and per link.
    ///
    /// # Errors
    /// A chain the emulator refuses.
    pub fn chain(&mut self, links: usize, it: Iters) -> Result<(Summary, Summary)> {
        let chain = vec![self.one.clone(); links];
        let (ns, wall) = self.time(&chain, it)?;
        let n = ns.len() as u64;
        let k = links as u64;
        Ok((
            summarize(ns.clone(), n, wall),
            summarize(per(&ns, k), n * k, wall),
        ))
    }

    /// Single dispatches: (samples ns, wall) of the measured ones.
    ///
    /// # Errors
    /// A dispatch the emulator refuses.
    pub fn samples(&mut self, it: Iters) -> Result<(Vec<u64>, std::time::Duration)> {
        let links = std::slice::from_ref(&self.one).to_vec();
        self.time(&links, it)
    }

    fn time(&mut self, links: &[Dispatch], it: Iters) -> Result<(Vec<u64>, std::time::Duration)> {
        let err = BenchError::ctx("in-process dispatch");
        for _ in 0..it.warmup {
            self.dev.run_chain(links).map_err(|e| err(&e))?;
        }
        let mut ns = Vec::with_capacity(it.measured);
        let start = Instant::now();
        for _ in 0..it.measured {
            let t = Instant::now();
            self.dev.run_chain(links).map_err(|e| err(&e))?;
            ns.push(nanos(t.elapsed()));
        }
        Ok((ns, start.elapsed()))
    }
}
