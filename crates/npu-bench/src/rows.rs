//! Rows 3, 4, 5, 6 and 9: npud on one client connection.
//!
//! Every dispatch runs the emulated noop design (two arguments, a kernel that does no work)
//! over two tensors of the session, so what is measured is the daemon's path and not a kernel.

use npu_artifacts::emu::EmuDesign;
use npu_proto::v1 as pb;
use prost::Message;

use crate::client::{Iters, Pipelined, Session, dispatch_request, pipelined, time_loop, timed};
use crate::inproc::ARG_BYTES;
use crate::stats::{Acc, Summary, per, summarize};
use crate::{BenchError, Result};

/// Warm-up operations before each round of rows measured in turn, at least: after another
/// row's round the caches and the scheduler's placement belong to that row.
pub const MIN_ROUND_WARMUP: usize = 20;

/// Largest WriteTensor chunk sent (as npu-client sends them).
const CHUNK_BYTES: usize = 1 << 20;

/// A session with the noop program and two tensors, ready to dispatch.
#[derive(Debug)]
pub struct Ready {
    pub session: Session,
    pub program: u64,
    pub request: pb::DispatchRequest,
    /// Kept mapped for the session's life (fd-shared tensors, on a Unix socket).
    _mapped: Vec<crate::client::Mapped>,
    /// What the daemon reported for the measured dispatches of [`Ready::dispatches`].
    pub reported: std::sync::Mutex<Reported>,
}

/// The daemon's own queue and device times, summed over dispatches.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reported {
    pub dispatches: u64,
    pub queue_ns: u64,
    pub device_ns: u64,
}

impl Reported {
    /// Mean (queue, device) in µs.
    #[must_use]
    pub fn means_us(&self) -> (f64, f64) {
        let n = crate::stats::f64_of(self.dispatches.max(1)) * 1000.0;
        (
            crate::stats::f64_of(self.queue_ns) / n,
            crate::stats::f64_of(self.device_ns) / n,
        )
    }
}

impl Ready {
    /// Registers the noop design and allocates its two 4 KiB tensors: mapped through the fd
    /// socket when `local`, device tensors otherwise (TCP).
    ///
    /// # Errors
    /// The daemon's refusal.
    pub async fn new(session: Session, local: bool) -> Result<Ready> {
        Self::with_form(session, local, false).await
    }

    /// As [`Ready::new`], registering the noop design as an hsaco when `hsaco`.
    ///
    /// # Errors
    /// The daemon's refusal.
    pub async fn with_form(mut session: Session, local: bool, hsaco: bool) -> Result<Ready> {
        let design = EmuDesign::noop(2, ARG_BYTES);
        let program = if hsaco {
            session.register_hsaco(&design).await?
        } else {
            session.register(&design).await?
        };
        let mut mapped = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..2 {
            if local {
                let m = session.alloc_mapped(u64::from(ARG_BYTES)).await?;
                ids.push(m.id);
                mapped.push(m);
            } else {
                ids.push(session.alloc(u64::from(ARG_BYTES)).await?);
            }
        }
        Ok(Ready {
            session,
            program,
            request: dispatch_request(program, &ids),
            _mapped: mapped,
            reported: std::sync::Mutex::default(),
        })
    }

    /// Encoded size of one dispatch request: the message size of the floors.
    #[must_use]
    pub fn message_bytes(&self) -> usize {
        self.request.encoded_len()
    }

    /// Rows 3 and 4: single dispatches.
    ///
    /// # Errors
    /// The daemon's refusal.
    pub async fn dispatches(&self, it: Iters) -> Result<(Vec<u64>, std::time::Duration)> {
        let s = &self.session;
        let d = &self.request;
        let sum = &std::sync::Mutex::new(Reported::default());
        let r = time_loop(it, || {
            let mut s = s.clone();
            async move {
                let r = s.dispatch(d).await?;
                if let Ok(mut g) = sum.lock() {
                    g.dispatches += 1;
                    g.queue_ns += r.queue_ns;
                    g.device_ns += r.device_ns;
                }
                Ok(())
            }
        })
        .await?;
        let sum = sum.lock().map(|g| *g).unwrap_or_default();
        if let Ok(mut g) = self.reported.lock() {
            g.dispatches += sum.dispatches;
            g.queue_ns += sum.queue_ns;
            g.device_ns += sum.device_ns;
        }
        Ok(r)
    }

    /// Row 5: chains of `links` links; (per chain, per link).
    ///
    /// # Errors
    /// The daemon's refusal, or a chain that did not complete.
    pub async fn chains(&self, links: usize, it: Iters) -> Result<(Summary, Summary)> {
        let (ns, wall) = self.chain_samples(links, it).await?;
        let n = ns.len() as u64;
        let k = links as u64;
        Ok((
            summarize(ns.clone(), n, wall),
            summarize(per(&ns, k), n * k, wall),
        ))
    }

    /// Chains of `links` links: each chain's time in ns divided by `links`, and the wall time.
    ///
    /// # Errors
    /// The daemon's refusal, or a chain that did not complete.
    pub async fn chain_link_samples(
        &self,
        links: usize,
        it: Iters,
    ) -> Result<(Vec<u64>, std::time::Duration)> {
        let (ns, wall) = self.chain_samples(links, it).await?;
        Ok((per(&ns, links as u64), wall))
    }

    async fn chain_samples(
        &self,
        links: usize,
        it: Iters,
    ) -> Result<(Vec<u64>, std::time::Duration)> {
        let chain = pb::ChainRequest {
            links: vec![self.request.clone(); links],
        };
        let s = &self.session;
        let chain = &chain;
        let (ns, wall) = time_loop(it, || {
            let mut s = s.clone();
            async move {
                let r = s.client.chain(s.req(chain.clone())).await?.into_inner();
                if r.completed as usize != links {
                    return Err(BenchError(format!(
                        "a chain of {links} completed {} links",
                        r.completed
                    )));
                }
                Ok(())
            }
        })
        .await?;
        Ok((ns, wall))
    }

    /// Row 9: dispatches on one Submit stream with `depth` in flight.
    ///
    /// # Errors
    /// The daemon's refusal of any dispatch.
    pub async fn pipelined(&self, depth: usize, it: Iters) -> Result<Pipelined> {
        let mut c = self.session.client.clone();
        let d = self.request.clone();
        let session = self.session.clone();
        pipelined(
            depth,
            it,
            |i| pb::SubmitRequest {
                request_id: i,
                work: Some(pb::submit_request::Work::Dispatch(d.clone())),
                timeout_ms: 0,
            },
            |r: &pb::SubmitResponse| {
                if r.code == 0 {
                    Ok(r.request_id)
                } else {
                    Err(BenchError(format!(
                        "Submit: request {} failed with code {}: {}",
                        r.request_id, r.code, r.message
                    )))
                }
            },
            move |s| async move { c.submit(session.req(s)).await },
        )
        .await
    }

    /// Row 6, fd: dispatches of the noop program over two fd-shared tensors of each size, the
    /// sizes measured in turn over `rounds` rounds (so that a change in load falls on all
    /// alike). One summary per size.
    ///
    /// # Errors
    /// The daemon's refusal.
    pub async fn fd_sized(&self, sizes: &[u64], rounds: usize, it: Iters) -> Result<Vec<Summary>> {
        let mut s = self.session.clone();
        let mut held = Vec::new();
        let mut requests = Vec::new();
        for &bytes in sizes {
            let a = s.alloc_mapped(bytes).await?;
            let b = s.alloc_mapped(bytes).await?;
            requests.push(dispatch_request(self.program, &[a.id, b.id]));
            held.extend([a, b]);
        }
        let round = Iters {
            warmup: (it.warmup / rounds.max(1)).max(MIN_ROUND_WARMUP),
            measured: (it.measured / rounds.max(1)).max(1),
        };
        let mut acc: Vec<Acc> = sizes.iter().map(|_| Acc::default()).collect();
        let mut failed = None;
        'rounds: for _ in 0..rounds.max(1) {
            for (d, acc) in requests.iter().zip(&mut acc) {
                let r = time_loop(round, || {
                    let mut s = s.clone();
                    async move { s.dispatch(d).await.map(drop) }
                })
                .await;
                match r {
                    Ok(x) => acc.add(x),
                    Err(e) => {
                        failed = Some(e);
                        break 'rounds;
                    }
                }
            }
        }
        let ids: Vec<u64> = held.iter().map(|m| m.id).collect();
        drop(held);
        free(&mut s, &ids).await;
        match failed {
            Some(e) => Err(e),
            None => Ok(acc.into_iter().map(Acc::summary).collect()),
        }
    }

    /// Row 6, inline: write `bytes` into the input through WriteTensor (1 MiB chunks), dispatch,
    /// and read the output back through ReadTensor, as a remote client does.
    ///
    /// # Errors
    /// The daemon's refusal, or a short read.
    pub async fn inline_sized(&self, bytes: u64, it: Iters) -> Result<Summary> {
        let mut s = self.session.clone();
        let a = s.alloc(bytes).await?;
        let b = s.alloc(bytes).await?;
        let d = dispatch_request(self.program, &[a, b]);
        let len = usize::try_from(bytes).map_err(|e| BenchError(e.to_string()))?;
        let data = vec![0x5Au8; len];
        let r = timed(it, || {
            let mut s = s.clone();
            let (d, data) = (&d, &data);
            async move {
                let chunks: Vec<pb::WriteTensorChunk> = data
                    .chunks(CHUNK_BYTES)
                    .enumerate()
                    .map(|(i, c)| pb::WriteTensorChunk {
                        tensor_id: a,
                        offset: (i * CHUNK_BYTES) as u64,
                        data: c.to_vec(),
                    })
                    .collect();
                let req = s.req(tokio_stream::iter(chunks));
                s.client.write_tensor(req).await?;
                s.dispatch(d).await?;
                let req = s.req(pb::ReadTensorRequest {
                    tensor_id: b,
                    offset: 0,
                    length: 0,
                    chunk_bytes: 0,
                });
                let mut stream = s.client.read_tensor(req).await?.into_inner();
                let mut got = 0usize;
                while let Some(c) = stream.message().await? {
                    got += c.data.len();
                }
                if got != len {
                    return Err(BenchError(format!(
                        "ReadTensor returned {got} of {len} bytes"
                    )));
                }
                Ok(())
            }
        })
        .await;
        free(&mut s, &[a, b]).await;
        r
    }
}

async fn free(s: &mut Session, ids: &[u64]) {
    for &tensor_id in ids {
        let req = s.req(pb::FreeTensorRequest { tensor_id });
        let _ = s.client.free_tensor(req).await;
    }
}
