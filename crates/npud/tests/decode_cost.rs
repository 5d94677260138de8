//! Cost is part of the intake's contract (see `intake`): whatever a request's bytes say, what
//! the daemon does with them before a handler runs (inflate, scan, and prost's decode of what
//! the scan passes) allocates at most a small multiple of the bytes, and work linear in them.
//!
//! The oracle is the counting global allocator of `cost-meter`. Every
//! request message of every served method (enumerated from the descriptor sets: a method added
//! without a decoder below fails the test) is fed hostile shapes generated from its schema:
//! every repeated field full to its limit with the densest elements the limits allow, one
//! element past the limit, megabytes of unknown fields, groups nested 100,000 deep, and a gzip
//! bomb of 16.7 M empty elements (32 MiB inflated from 32 KiB). Each must peak within
//! [`PEAK_PER_INPUT_BYTE`] × its (inflated) length + [`PEAK_SLACK`], and the scan's estimate
//! must bound what prost then allocates. Work is bounded by construction: inputs are
//! megabytes, so a quadratic pass would not finish; each shape's time per byte is printed.
//!
//! The allocator refuses allocations past `cost_meter::CEILING` live bytes (the process then
//! aborts), so a regression fails fast instead of swapping the machine. Tests take one lock:
//! the counters are global.

// Sizes are u64 on the wire and usize in memory; this test runs on 64-bit hosts only.
#![allow(clippy::cast_possible_truncation)]

use std::io::Write;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use npu_proto::v1 as pb;
use npud::config::Limits;
use npud::intake::inflate::{Encoding, Inflate};
use npud::intake::scan::{Bounds, scan};
use npud::intake::schema::{Kind, MessageId, Schema};
use npud::intake::{
    DECODED_PER_WIRE_BYTE, DECODED_SLACK, INFLATE_RATIO, INFLATE_SLACK, MAX_FIELDS,
};
use prost::Message as _;

/// Allowed peak bytes per input byte (the intake's own bound on decoded size).
const PEAK_PER_INPUT_BYTE: usize = DECODED_PER_WIRE_BYTE as usize;
/// Allowed peak bytes on top of that.
const PEAK_SLACK: usize = DECODED_SLACK as usize;

#[global_allocator]
static METER: cost_meter::Meter = cost_meter::Meter;

use cost_meter::{peak_of, serial};

/// Prost's decode of a served method's request message, by its full name; `None` for a type
/// this table lacks (the test then fails, naming it). It decodes from a `BytesMut`, as tonic
/// does (a `bytes` field is then one copy, out of the shared buffer).
fn decoder(name: &str) -> Option<fn(BytesMut) -> bool> {
    macro_rules! table {
        ($($n:literal => $t:ty),* $(,)?) => {
            match name {
                $($n => Some(|b: BytesMut| <$t>::decode(b).is_ok()),)*
                _ => None,
            }
        };
    }
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::{v1, v1alpha};
    table!(
        "npud.v1.GetDeviceInfoRequest" => pb::GetDeviceInfoRequest,
        "npud.v1.OpenSessionRequest" => pb::OpenSessionRequest,
        "npud.v1.ResumeSessionRequest" => pb::ResumeSessionRequest,
        "npud.v1.CloseSessionRequest" => pb::CloseSessionRequest,
        "npud.v1.RegisterProgramRequest" => pb::RegisterProgramRequest,
        "npud.v1.UnregisterProgramRequest" => pb::UnregisterProgramRequest,
        "npud.v1.ListProgramsRequest" => pb::ListProgramsRequest,
        "npud.v1.AllocateTensorRequest" => pb::AllocateTensorRequest,
        "npud.v1.ImportTensorRequest" => pb::ImportTensorRequest,
        "npud.v1.FreeTensorRequest" => pb::FreeTensorRequest,
        "npud.v1.GetTensorInfoRequest" => pb::GetTensorInfoRequest,
        "npud.v1.WriteTensorChunk" => pb::WriteTensorChunk,
        "npud.v1.ReadTensorRequest" => pb::ReadTensorRequest,
        "npud.v1.DispatchRequest" => pb::DispatchRequest,
        "npud.v1.ChainRequest" => pb::ChainRequest,
        "npud.v1.SubmitRequest" => pb::SubmitRequest,
        "npud.v1.AttachRingRequest" => pb::AttachRingRequest,
        "npud.v1.GetStatisticsRequest" => pb::GetStatisticsRequest,
        "npud.v1.ClearQuarantineRequest" => pb::ClearQuarantineRequest,
        "grpc.health.v1.HealthCheckRequest" => HealthCheckRequest,
        "grpc.reflection.v1.ServerReflectionRequest" => v1::ServerReflectionRequest,
        "grpc.reflection.v1alpha.ServerReflectionRequest" => v1alpha::ServerReflectionRequest,
    )
}

fn key(out: &mut Vec<u8>, number: u32, wire: u32) {
    prost::encoding::encode_varint(u64::from(number << 3 | wire), out);
}

fn delimited(out: &mut Vec<u8>, number: u32, value: &[u8]) {
    key(out, number, 2);
    prost::encoding::encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

/// Message `id` with every repeated field full to its limit (`over`: one past it, with empty
/// elements), each element itself full; singular messages that hold repeated fields filled.
fn full(schema: &Schema, id: MessageId, over: bool, depth: usize) -> Vec<u8> {
    let mut out = Vec::new();
    if depth > 8 {
        return out;
    }
    let msg = schema.message(id);
    for f in &msg.fields {
        match (f.kind, f.repeated, &f.limit) {
            (kind, true, Some(l)) => {
                let n = if over { l.max + 1 } else { l.max };
                match kind {
                    Kind::Message(e) => {
                        let elem = if over {
                            Vec::new()
                        } else {
                            full(schema, e, false, depth + 1)
                        };
                        for _ in 0..n {
                            delimited(&mut out, f.number, &elem);
                        }
                    }
                    Kind::Bytes => {
                        for _ in 0..n {
                            delimited(&mut out, f.number, &[]);
                        }
                    }
                    Kind::Varint { .. } => {
                        delimited(&mut out, f.number, &vec![0; n as usize]);
                    }
                    Kind::Fixed32 => delimited(&mut out, f.number, &vec![0; 4 * n as usize]),
                    Kind::Fixed64 => delimited(&mut out, f.number, &vec![0; 8 * n as usize]),
                }
            }
            (Kind::Message(e), false, _) => {
                let inner = full(schema, e, over, depth + 1);
                if !inner.is_empty() {
                    delimited(&mut out, f.number, &inner);
                }
            }
            _ => {}
        }
    }
    out
}

/// The first repeated field of message `id`, or of a singular message inside it, as the path
/// of field numbers to it.
fn repeated_path(schema: &Schema, id: MessageId, depth: usize) -> Option<Vec<u32>> {
    if depth > 8 {
        return None;
    }
    for f in &schema.message(id).fields {
        if f.repeated {
            return Some(vec![f.number]);
        }
        if let Kind::Message(e) = f.kind
            && let Some(mut rest) = repeated_path(schema, e, depth + 1)
        {
            rest.insert(0, f.number);
            return Some(rest);
        }
    }
    None
}

/// An unknown field number in every served message.
const UNKNOWN: u32 = 2047;

/// `count` empty elements of the repeated field at `path`; or, for a message without one,
/// `count` unknown empty varint fields.
fn empties(path: Option<&[u32]>, count: usize) -> Vec<u8> {
    match path {
        Some([last]) => {
            let mut one = Vec::new();
            delimited(&mut one, *last, &[]);
            one.repeat(count)
        }
        Some([first, rest @ ..]) => {
            let mut out = Vec::new();
            delimited(&mut out, *first, &empties(Some(rest), count));
            out
        }
        _ => {
            let mut one = Vec::new();
            key(&mut one, UNKNOWN, 0);
            one.push(0);
            one.repeat(count)
        }
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// What happened to one input (its fields are read in failure messages, through `Debug`).
#[derive(Debug)]
#[allow(dead_code)]
enum Outcome {
    /// Refused by inflate or scan.
    Refused(String),
    /// Scanned and decoded by prost (`decoded`: whether prost took it).
    Decoded {
        estimate: u64,
        peak: usize,
        ok: bool,
    },
}

/// The intake's work on one message, as the daemon does it: inflate (when `compressed`), scan,
/// then prost's decode of what the scan passed.
fn intake(schema: &Schema, id: MessageId, input: &[u8], compressed: bool, max: usize) -> Outcome {
    let bounds = Bounds {
        per_wire_byte: DECODED_PER_WIRE_BYTE,
        slack: DECODED_SLACK,
        max_fields: MAX_FIELDS,
    };
    let inflated;
    let bytes: &[u8] = if compressed {
        let bound = usize::try_from(INFLATE_RATIO * input.len() as u64 + INFLATE_SLACK)
            .unwrap()
            .min(max);
        let mut i = Inflate::new(Encoding::Gzip, Bytes::copy_from_slice(input), bound, 5);
        loop {
            match i.step(usize::MAX) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => return Outcome::Refused(format!("inflate: {e:?}")),
            }
        }
        inflated = i.finish();
        &inflated[5..]
    } else {
        input
    };
    let name = &schema.message(id).name;
    let decode = decoder(name).unwrap_or_else(|| panic!("no decoder for {name}"));
    match scan(schema, id, bytes, bounds) {
        Err(e) => Outcome::Refused(e.to_string()),
        Ok(s) => {
            // tonic's own buffer, which it decodes from.
            let buf = BytesMut::from(bytes);
            let (ok, peak) = peak_of(|| decode(buf));
            Outcome::Decoded {
                estimate: s.decoded,
                peak,
                ok,
            }
        }
    }
}

#[test]
fn every_request_message_costs_memory_linear_in_its_bytes_whatever_its_shape() {
    let _serial = serial();
    let limits = Limits::default();
    let max = usize::try_from(2 * limits.max_message_bytes).unwrap();
    let schema = Schema::served(&limits).unwrap();
    let mut paths: Vec<&str> = schema.method_paths().collect();
    paths.sort_unstable();
    let mut inputs: Vec<MessageId> = paths
        .iter()
        .map(|p| schema.method(p).unwrap().input)
        .collect();
    inputs.sort_unstable();
    inputs.dedup();
    let missing: Vec<&str> = inputs
        .iter()
        .map(|id| schema.message(*id).name.as_str())
        .filter(|n| decoder(n).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "request messages without a decoder here: {missing:?}"
    );
    for id in inputs {
        let name = schema.message(id).name.clone();
        let path = repeated_path(&schema, id, 0);
        let mut deep = Vec::new();
        for _ in 0..100_000 {
            key(&mut deep, UNKNOWN, 3);
        }
        let mut unknown = Vec::new();
        while unknown.len() < 4 << 20 {
            key(&mut unknown, UNKNOWN, 0);
            unknown.push(0x7f);
            delimited(&mut unknown, UNKNOWN + 1, &[0x80; 16]);
        }
        let shapes: Vec<(&str, Vec<u8>, bool)> = vec![
            ("full to every limit", full(&schema, id, false, 0), false),
            ("one past every limit", full(&schema, id, true, 0), false),
            ("4 MiB of unknown fields", unknown, false),
            ("100,000 nested groups", deep, false),
            (
                "a gzip bomb of 16.7 M empty elements",
                gzip(&empties(path.as_deref(), 1 << 24)),
                true,
            ),
            (
                "1 M empty elements",
                empties(path.as_deref(), 1 << 20),
                false,
            ),
        ];
        for (what, input, compressed) in shapes {
            let started = Instant::now();
            let (outcome, peak) = peak_of(|| intake(&schema, id, &input, compressed, max));
            let took = started.elapsed();
            // A compressed input may inflate to its bound, in a buffer that doubles as it grows.
            let allowed = if compressed {
                let bound =
                    (INFLATE_RATIO as usize * input.len() + INFLATE_SLACK as usize).min(max);
                3 * bound + PEAK_PER_INPUT_BYTE * bound + PEAK_SLACK
            } else {
                PEAK_PER_INPUT_BYTE * input.len() + PEAK_SLACK
            };
            println!(
                "{name}, {what}: {} input bytes{}, peak {peak} bytes, {:.1} ns per byte: \
                 {outcome:?}",
                input.len(),
                if compressed { " (gzip)" } else { "" },
                took.as_nanos() as f64 / input.len().max(1) as f64
            );
            assert!(
                peak <= allowed,
                "{name}, {what}: peak {peak} bytes for {} input bytes; at most {allowed}",
                input.len()
            );
            if let Outcome::Decoded { estimate, peak, .. } = outcome {
                assert!(
                    peak as u64 <= estimate,
                    "{name}, {what}: prost allocated {peak} bytes; the scan estimated {estimate}"
                );
            }
        }
    }
}

#[test]
fn the_estimate_bounds_prost_for_messages_that_carry_data() {
    let _serial = serial();
    let schema = Schema::served(&Limits::default()).unwrap();
    let bounds = Bounds {
        per_wire_byte: DECODED_PER_WIRE_BYTE,
        slack: DECODED_SLACK,
        max_fields: MAX_FIELDS,
    };
    let arg = |t| pb::TensorArg {
        tensor_id: t,
        offset: 3,
        length: 4,
        read_only: true,
    };
    let link = |n: u64| pb::DispatchRequest {
        program_id: 1,
        args: (1..=n).map(arg).collect(),
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "npud.v1.ChainRequest",
            pb::ChainRequest {
                links: (0..1024).map(|k| link(k % 65)).collect(),
            }
            .encode_to_vec(),
        ),
        (
            "npud.v1.SubmitRequest",
            pb::SubmitRequest {
                request_id: 9,
                work: Some(pb::submit_request::Work::Chain(pb::ChainRequest {
                    links: vec![link(64); 1000],
                })),
                timeout_ms: 5,
            }
            .encode_to_vec(),
        ),
        (
            "npud.v1.RegisterProgramRequest",
            pb::RegisterProgramRequest {
                pdi: vec![1; 3 << 20],
                insts: vec![2; 1 << 20],
                name: "x".repeat(100),
                hsaco: vec![3; 100],
                kernel: "k".into(),
            }
            .encode_to_vec(),
        ),
        (
            "npud.v1.WriteTensorChunk",
            pb::WriteTensorChunk {
                tensor_id: 1,
                offset: 2,
                data: vec![9; 8 << 20],
            }
            .encode_to_vec(),
        ),
    ];
    for (name, bytes) in cases {
        let id = schema.message_named(name).unwrap();
        let s = scan(&schema, id, &bytes, bounds).unwrap();
        let decode = decoder(name).unwrap();
        let buf = BytesMut::from(&bytes[..]);
        let (ok, peak) = peak_of(|| decode(buf));
        assert!(ok, "{name}");
        println!(
            "{name}: {} bytes, estimate {}, prost's peak {peak}",
            bytes.len(),
            s.decoded
        );
        assert!(peak as u64 <= s.decoded, "{name}: {peak} > {}", s.decoded);
        assert!(
            s.decoded <= DECODED_PER_WIRE_BYTE * bytes.len() as u64 + DECODED_SLACK,
            "{name}"
        );
    }
}
