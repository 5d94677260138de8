//! Cost is part of the decoders' contract: whatever a peer writes into an fd-socket frame or a
//! ring slot, decoding it allocates at most a small multiple of the frame or slot (both are
//! fixed-size, so every decode is bounded by construction; this checks the constant).
//!
//! The oracle is the counting global allocator of `cost-meter`: each test decodes hostile
//! frames and slots (every byte 0xFF, maximal counts and lengths, counts far past the maximum,
//! bytes that are no UTF-8) and asserts the peak bytes allocated during the
//! decode stay within [`PEAK_PER_INPUT_BYTE`] × the frame's size + [`PEAK_SLACK`].

use npu_fd::ring::{
    COMPLETION_BYTES, Completion, MAX_ARGS, RawCompletion, RawSubmission, SUBMISSION_BYTES,
    Submission,
};
use npu_fd::wire::{REQUEST_LEN, RESPONSE_LEN, Request, Response};

/// Allowed peak bytes per input byte.
const PEAK_PER_INPUT_BYTE: usize = 8;
/// Allowed peak bytes on top of that (an error message).
const PEAK_SLACK: usize = 4096;

#[global_allocator]
static METER: cost_meter::Meter = cost_meter::Meter;

/// Runs `f` and returns the peak bytes it had live above what was live before it, holding
/// every other test off (the counters see the whole process).
fn peak_of<T>(f: impl FnOnce() -> T) -> usize {
    let _serial = cost_meter::serial();
    let (r, peak) = cost_meter::peak_of(f);
    drop(r);
    peak
}

fn assert_linear(what: &str, input: usize, peak: usize) {
    let limit = PEAK_PER_INPUT_BYTE * input + PEAK_SLACK;
    println!("{what}: {input} input bytes, peak {peak} bytes");
    assert!(
        peak <= limit,
        "{what}: peak {peak} bytes for a {input}-byte input; expected at most {limit}"
    );
}

/// A frame whose header is valid (magic, version) and the rest `fill`.
fn frame<const N: usize>(fill: u8) -> [u8; N] {
    let mut f = [fill; N];
    f[..4].copy_from_slice(b"NPFD");
    f[4..6].copy_from_slice(&1u16.to_le_bytes());
    f
}

#[test]
fn fd_socket_frames_cost_at_most_a_small_multiple_of_their_size() {
    let mut requests: Vec<(&str, [u8; REQUEST_LEN])> = vec![
        ("request of 0xFF", [0xff; REQUEST_LEN]),
        ("request with a valid header, 0xFF after", frame(0xff)),
        ("request with a valid header, zeros after", frame(0)),
    ];
    let mut op = frame::<REQUEST_LEN>(0);
    op[6..8].copy_from_slice(&3u16.to_le_bytes());
    requests.push(("an ATTACH_RING request", op));
    for (what, f) in &requests {
        let peak = peak_of(|| Request::decode(f));
        assert_linear(what, REQUEST_LEN, peak);
    }
    // Responses: the longest message, a length past the frame, bytes that are no UTF-8.
    let mut longest = frame::<RESPONSE_LEN>(0);
    longest[24..26].copy_from_slice(&u16::MAX.to_le_bytes());
    let mut full = frame::<RESPONSE_LEN>(0);
    let max = RESPONSE_LEN - 32;
    full[24..26].copy_from_slice(&u16::try_from(max).unwrap().to_le_bytes());
    full[32..].fill(b'x');
    let mut not_utf8 = full;
    not_utf8[40] = 0xff;
    for (what, f) in [
        ("response of 0xFF", [0xff; RESPONSE_LEN]),
        ("response declaring a 65535-byte message", longest),
        ("response with the longest message", full),
        ("response whose message is no UTF-8", not_utf8),
    ] {
        let peak = peak_of(|| Response::decode(&f));
        assert_linear(what, RESPONSE_LEN, peak);
    }
}

#[test]
fn ring_slots_cost_at_most_a_small_multiple_of_their_size() {
    let words = SUBMISSION_BYTES / 8;
    let mut most = [0u64; SUBMISSION_BYTES / 8];
    most[3] = MAX_ARGS as u64;
    let mut past = most;
    past[3] = u64::from(u32::MAX);
    let mut flags = most;
    flags[3] |= u64::from(u32::MAX) << 32;
    for (what, w) in [
        ("submission of 0xFF words", [u64::MAX; SUBMISSION_BYTES / 8]),
        ("submission with the most arguments", most),
        ("submission declaring 2^32 arguments", past),
        ("submission with every flag", flags),
    ] {
        let w: RawSubmission = w;
        assert_eq!(w.len(), words);
        let peak = peak_of(|| Submission::decode(&w));
        assert_linear(what, SUBMISSION_BYTES, peak);
    }
    let mut longest = [0u64; COMPLETION_BYTES / 8];
    longest[1] = u64::from(u32::MAX) << 32;
    let mut not_utf8 = [u64::MAX; COMPLETION_BYTES / 8];
    not_utf8[1] = 500 << 32;
    for (what, w) in [
        ("completion of 0xFF words", [u64::MAX; COMPLETION_BYTES / 8]),
        ("completion declaring a 4 GiB message", longest),
        ("completion whose message is no UTF-8", not_utf8),
    ] {
        let w: RawCompletion = w;
        let peak = peak_of(|| Completion::decode(&w));
        assert_linear(what, COMPLETION_BYTES, peak);
    }
}
