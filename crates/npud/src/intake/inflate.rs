//! Bounded decompression of one gRPC message: a streaming inflate (gzip or zlib "deflate", as
//! gRPC names them) that stops as soon as its output would pass the bound it was given, and
//! that can run in steps (a first one on the I/O thread, the rest off it).
//!
//! Cost: the decoder's state (its window, tens of KiB) and an output buffer that grows by
//! doubling but never past the bound (plus the room asked for in front), so at most the bound;
//! work linear in the output.

use std::io::Read;

use bytes::Buf;
use bytes::Bytes;
use flate2::read::{GzDecoder, ZlibDecoder};

/// A request's `grpc-encoding` that the daemon inflates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Gzip,
    Deflate,
}

/// What a call's `grpc-encoding` header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// None, or `identity`.
    Identity,
    Known(Encoding),
    /// Another encoding (tonic refuses it, UNIMPLEMENTED, before reading the body).
    Other,
}

impl Header {
    pub fn of(v: Option<&http::HeaderValue>) -> Self {
        match v.map(http::HeaderValue::as_bytes) {
            None | Some(b"identity") => Self::Identity,
            Some(b"gzip") => Self::Known(Encoding::Gzip),
            Some(b"deflate") => Self::Known(Encoding::Deflate),
            Some(_) => Self::Other,
        }
    }
}

impl Encoding {
    pub fn name(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Deflate => "deflate",
        }
    }
}

/// Why an inflate stopped short.
#[derive(Debug)]
pub enum InflateError {
    /// The output would pass the bound.
    TooLarge,
    /// The data is no valid stream of its encoding.
    Corrupt(std::io::Error),
}

enum Decoder {
    Gzip(GzDecoder<bytes::buf::Reader<Bytes>>),
    Deflate(ZlibDecoder<bytes::buf::Reader<Bytes>>),
}

impl Read for Decoder {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Gzip(d) => d.read(buf),
            Self::Deflate(d) => d.read(buf),
        }
    }
}

/// One message's inflate, in progress.
pub struct Inflate {
    decoder: Decoder,
    out: Vec<u8>,
    /// Most bytes of output, `front` not included.
    max: usize,
    front: usize,
}

impl std::fmt::Debug for Inflate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflate")
            .field("out", &(self.out.len() - self.front))
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

/// Bytes read from the decoder at a time.
const STEP: usize = 16 << 10;

impl Inflate {
    /// An inflate of `compressed` that produces at most `max` bytes, after `front` zero bytes
    /// it leaves for the caller (a gRPC message header).
    pub fn new(encoding: Encoding, compressed: Bytes, max: usize, front: usize) -> Self {
        let reader = compressed.reader();
        let decoder = match encoding {
            Encoding::Gzip => Decoder::Gzip(GzDecoder::new(reader)),
            Encoding::Deflate => Decoder::Deflate(ZlibDecoder::new(reader)),
        };
        Self {
            decoder,
            out: vec![0; front],
            max,
            front,
        }
    }

    /// Inflates until about `budget` more bytes are out or the stream ends: `Ok(true)` once it
    /// has ended.
    ///
    /// # Errors
    /// [`InflateError::TooLarge`] once the output would pass the bound,
    /// [`InflateError::Corrupt`] for data that is no valid stream.
    pub fn step(&mut self, budget: usize) -> Result<bool, InflateError> {
        let mut buf = [0u8; STEP];
        let mut produced = 0usize;
        while produced < budget {
            let n = self.decoder.read(&mut buf).map_err(InflateError::Corrupt)?;
            if n == 0 {
                return Ok(true);
            }
            let len = self.out.len() - self.front;
            if len + n > self.max {
                return Err(InflateError::TooLarge);
            }
            let limit = self.front + self.max;
            if self.out.len() + n > self.out.capacity() {
                let want = (self.out.capacity() * 2).max(self.out.len() + n).min(limit);
                self.out.reserve_exact(want - self.out.len());
            }
            self.out.extend_from_slice(&buf[..n]);
            produced += n;
            crate::bulk::pause();
        }
        Ok(false)
    }

    /// The output, after the `front` bytes.
    pub fn finish(self) -> Vec<u8> {
        self.out
    }

    /// Bytes of output so far.
    pub fn produced(&self) -> usize {
        self.out.len() - self.front
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap().into()
    }

    fn zlib(data: &[u8]) -> Bytes {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap().into()
    }

    #[test]
    fn both_encodings_round_trip_within_the_bound() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for (enc, c) in [
            (Encoding::Gzip, gzip(&data)),
            (Encoding::Deflate, zlib(&data)),
        ] {
            let mut i = Inflate::new(enc, c, data.len(), 5);
            while !i.step(10_000).unwrap() {}
            let out = i.finish();
            assert_eq!(&out[5..], &data[..], "{enc:?}");
            assert!(out.capacity() <= data.len() + 5, "{}", out.capacity());
        }
    }

    #[test]
    fn a_bomb_stops_at_the_bound_and_corrupt_data_is_an_error() {
        // 32 MiB of zeros: 32 KiB of gzip.
        let c = gzip(&vec![0; 32 << 20]);
        assert!(c.len() < 40 << 10, "{}", c.len());
        let mut i = Inflate::new(Encoding::Gzip, c, 1 << 20, 0);
        let r = loop {
            match i.step(usize::MAX) {
                Ok(false) => {}
                other => break other,
            }
        };
        assert!(matches!(r, Err(InflateError::TooLarge)), "{r:?}");
        assert!(i.produced() <= 1 << 20);
        assert!(i.out.capacity() <= 1 << 20);
        let mut i = Inflate::new(Encoding::Gzip, Bytes::from_static(b"not gzip"), 100, 0);
        assert!(matches!(i.step(100), Err(InflateError::Corrupt(_))));
    }
}
