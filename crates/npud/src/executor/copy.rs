//! WriteTensor and ReadTensor chunks as resumable jobs: each turn copies at most
//! `executor.slice_bytes`, so a 16 MiB chunk is many short turns between other sessions' work
//! rather than one long one. Every slice looks its tensor up again: a tensor freed between
//! slices ends the copy with NOT_FOUND, never a copy into freed memory.

use super::Reply;
use super::worker::Worker;

/// A copy between a request's bytes and a tensor, part done.
#[derive(Debug)]
pub enum CopyJob {
    Write {
        session: u64,
        tensor: u64,
        offset: u64,
        data: Vec<u8>,
        /// Bytes of `data` copied so far.
        done: usize,
        reply: Reply<()>,
    },
    Read {
        session: u64,
        tensor: u64,
        offset: u64,
        len: u64,
        out: Vec<u8>,
        reply: Reply<Vec<u8>>,
    },
}

impl CopyJob {
    pub fn session(&self) -> u64 {
        match self {
            Self::Write { session, .. } | Self::Read { session, .. } => *session,
        }
    }

    /// Answers the job without finishing it.
    pub fn refuse(self, e: crate::error::NpudError) {
        match self {
            Self::Write { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Self::Read { reply, .. } => {
                let _ = reply.send(Err(e));
            }
        }
    }
}

impl Worker {
    /// Copies one slice of `job`; gives it back when bytes are left.
    pub(super) fn copy_turn(&mut self, job: CopyJob) -> Option<CopyJob> {
        let slice = self.slice_bytes;
        match job {
            CopyJob::Write {
                session,
                tensor,
                offset,
                data,
                done,
                reply,
            } => {
                let n = (data.len() - done).min(slice);
                let r = self.tensors.write(
                    &mut self.dev,
                    session,
                    tensor,
                    offset + done as u64,
                    &data[done..done + n],
                );
                let done = done + n;
                match r {
                    Ok(()) if done < data.len() => Some(CopyJob::Write {
                        session,
                        tensor,
                        offset,
                        data,
                        done,
                        reply,
                    }),
                    r => {
                        let _ = reply.send(r);
                        None
                    }
                }
            }
            CopyJob::Read {
                session,
                tensor,
                offset,
                len,
                mut out,
                reply,
            } => {
                let done = out.len() as u64;
                let n = (len - done).min(slice as u64);
                match self
                    .tensors
                    .read(&self.dev, session, tensor, offset + done, n)
                {
                    Ok(bytes) => {
                        if out.is_empty() && bytes.len() as u64 == len {
                            out = bytes;
                        } else {
                            out.extend_from_slice(&bytes);
                        }
                        if (out.len() as u64) < len {
                            return Some(CopyJob::Read {
                                session,
                                tensor,
                                offset,
                                len,
                                out,
                                reply,
                            });
                        }
                        let _ = reply.send(Ok(out));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
                None
            }
        }
    }
}
