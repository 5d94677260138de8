//! gRPC on the wire for the attacks: messages of millions of empty repeated fields, their gzip
//! (built from a compressed 1 MiB chunk repeated, so a 32 MiB message costs the test one small
//! compression), calls over any stream with a bare HTTP/2 client (no tonic limits, any
//! `grpc-encoding`), and a whole request as raw bytes for a client that writes it and closes.

use std::time::Duration;

use bytes::Bytes;
use flate2::{Compress, Compression, Crc, FlushCompress, Status};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};

/// Protobuf wire type 2 (length-delimited).
const LEN: u32 = 2;

/// A varint.
pub fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v.to_le_bytes()[0] | 0x80);
        v >>= 7;
    }
    out.push(v.to_le_bytes()[0]);
}

/// The two bytes of an empty length-delimited field `field` (< 16): its key and length 0.
pub fn empty_field(field: u32) -> [u8; 2] {
    assert!(field < 16, "a one-byte key");
    [((field << 3) | LEN).to_le_bytes()[0], 0]
}

/// How many empty repeated fields fit a message of at most `max` bytes after `overhead` bytes.
pub fn fitting(max: u64, overhead: u64) -> usize {
    usize::try_from((max - overhead) / 2).expect("a count that fits memory")
}

/// A gzip stream built piece by piece.
#[derive(Debug)]
pub struct Gzip {
    deflate: Vec<u8>,
    crc: Crc,
}

impl Default for Gzip {
    fn default() -> Self {
        Self::new()
    }
}

impl Gzip {
    pub fn new() -> Gzip {
        Gzip {
            deflate: Vec::new(),
            crc: Crc::new(),
        }
    }

    /// Appends `bytes`.
    pub fn push(&mut self, bytes: &[u8]) {
        self.deflate.extend(deflate_flushed(bytes));
        self.crc.update(bytes);
    }

    /// Appends `unit` `times` times: a chunk of about 1 MiB of it is compressed once and its
    /// blocks repeated (each chunk ends with a full flush, so no block refers to another).
    pub fn push_repeated(&mut self, unit: &[u8], times: usize) {
        let per_chunk = ((1 << 20) / unit.len()).max(1);
        let chunk = unit.repeat(per_chunk.min(times));
        let blocks = deflate_flushed(&chunk);
        let mut chunk_crc = Crc::new();
        chunk_crc.update(&chunk);
        let (whole, rest) = (times / per_chunk, times % per_chunk);
        for _ in 0..whole {
            self.deflate.extend_from_slice(&blocks);
            self.crc.combine(&chunk_crc);
        }
        if rest > 0 {
            self.push(&unit.repeat(rest));
        }
    }

    /// The uncompressed length so far.
    pub fn len(&self) -> u64 {
        u64::from(self.crc.amount())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The gzip file: header, the blocks and a final empty block, CRC-32 and length.
    pub fn finish(mut self) -> Vec<u8> {
        let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
        // A final fixed-Huffman block with only its end-of-block code.
        self.deflate.extend_from_slice(&[0x03, 0x00]);
        out.append(&mut self.deflate);
        out.extend_from_slice(&self.crc.sum().to_le_bytes());
        out.extend_from_slice(&self.crc.amount().to_le_bytes());
        out
    }
}

/// Raw deflate blocks of `data`, none final, ending with a full flush (byte-aligned, no
/// reference to anything before).
fn deflate_flushed(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::best(), false);
    let mut out = Vec::with_capacity(data.len() / 64 + 4096);
    loop {
        let consumed = usize::try_from(c.total_in()).expect("fits");
        let status = c
            .compress_vec(&data[consumed..], &mut out, FlushCompress::Full)
            .expect("deflate");
        let consumed = usize::try_from(c.total_in()).expect("fits");
        // Done when every byte went in and the flush fit in the room left.
        if consumed == data.len() && out.len() < out.capacity() && status == Status::Ok {
            return out;
        }
        out.reserve(out.capacity().max(4096));
    }
}

/// A gRPC length-prefixed message: the compressed flag, the length, the bytes.
pub fn grpc_frame(message: &[u8], compressed: bool) -> Vec<u8> {
    let len = u32::try_from(message.len()).expect("a message under 4 GiB");
    let mut f = Vec::with_capacity(5 + message.len());
    f.push(u8::from(compressed));
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(message);
    f
}

/// A gzip `ChainRequest` of `links` empty links (`links` is field 1).
pub fn chain_of_empty_links(links: usize) -> Vec<u8> {
    let mut g = Gzip::new();
    g.push_repeated(&empty_field(1), links);
    g.finish()
}

/// A gzip `DispatchRequest` of `args` empty `TensorArg`s (`args` is field 2).
pub fn dispatch_of_empty_args(args: usize) -> Vec<u8> {
    let mut g = Gzip::new();
    g.push_repeated(&empty_field(2), args);
    g.finish()
}

/// A gzip `SubmitRequest` with request id `id` whose dispatch (field 2) has `args` empty
/// `TensorArg`s.
pub fn submit_of_empty_args(id: u64, args: usize) -> Vec<u8> {
    let mut head = vec![0x08];
    varint(id, &mut head);
    head.push(0x12);
    varint(2 * args as u64, &mut head);
    let mut g = Gzip::new();
    g.push(&head);
    g.push_repeated(&empty_field(2), args);
    g.finish()
}

/// What a raw call got.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// `grpc-status`, when one came.
    pub code: Option<i32>,
    pub message: String,
    /// The response messages, in order.
    pub messages: Vec<Vec<u8>>,
    /// The transport's failure, or no answer within the limit.
    pub error: Option<String>,
    pub took: Duration,
}

impl Answer {
    /// The status as a tonic code.
    pub fn tonic_code(&self) -> Option<tonic::Code> {
        self.code.map(tonic::Code::from_i32)
    }

    /// The answer, for messages: "Code: message", or the transport's failure.
    pub fn describe(&self) -> String {
        match (&self.code, &self.error) {
            (Some(_), _) => format!(
                "{:?}: {}",
                self.tonic_code().unwrap_or(tonic::Code::Unknown),
                self.message.chars().take(300).collect::<String>()
            ),
            (None, Some(e)) => format!("no status ({e})"),
            (None, None) => "no status".into(),
        }
    }
}

/// One gRPC call of `path` on `io` with a bare HTTP/2 client: `body` is the request body as is
/// (one or more [`grpc_frame`]s), `headers` are added (`grpc-encoding`, session metadata). At
/// most `limit` for the whole exchange.
pub async fn h2_call<IO>(
    io: IO,
    path: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
    limit: Duration,
) -> Answer
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = std::time::Instant::now();
    let call = async {
        let io = hyper_util::rt::TokioIo::new(io);
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method("POST")
            .uri(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (k, v) in headers {
            req = req.header(*k, v.as_str());
        }
        let req = req
            .body(http_body_util::Full::new(Bytes::from(body)))
            .map_err(|e| format!("a request: {e}"))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("the response: {e}"))?;
        let (parts, body) = resp.into_parts();
        let mut answer = Answer::default();
        if let Some(code) = grpc_status(&parts.headers) {
            answer.code = Some(code);
            answer.message = grpc_message(&parts.headers);
            return Ok(answer);
        }
        let collected = body
            .collect()
            .await
            .map_err(|e| format!("the response body: {e}"))?;
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let bytes = collected.to_bytes();
        answer.messages = split_frames(&bytes);
        answer.code = grpc_status(&trailers);
        answer.message = grpc_message(&trailers);
        Ok::<_, String>(answer)
    };
    let mut answer = match tokio::time::timeout(limit, call).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => Answer {
            error: Some(e),
            ..Answer::default()
        },
        Err(_) => Answer {
            error: Some(format!("no answer within {limit:?}")),
            ..Answer::default()
        },
    };
    answer.took = started.elapsed();
    answer
}

fn grpc_status(h: &http::HeaderMap) -> Option<i32> {
    h.get("grpc-status")?.to_str().ok()?.parse().ok()
}

fn grpc_message(h: &http::HeaderMap) -> String {
    let raw = h
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    percent_decode(raw)
}

/// gRPC's percent-encoding of `grpc-message`, undone.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let hex = |c: u8| (c as char).to_digit(16);
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l).to_le_bytes()[0]);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The messages of a gRPC response body.
fn split_frames(mut b: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while b.len() >= 5 {
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        if b.len() < 5 + len {
            break;
        }
        out.push(b[5..5 + len].to_vec());
        b = &b[5 + len..];
    }
    out
}

/// A whole unary gRPC request as the bytes of an HTTP/2 connection: the client preface, an
/// empty SETTINGS frame, the HEADERS (HPACK literals, no Huffman) and one DATA frame with the
/// message, ending the stream. A client may write all of it at once and close without waiting
/// for anything.
pub fn raw_h2_request(path: &str, headers: &[(&str, &str)], message: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    let fixed = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    for (k, v) in fixed.iter().chain(headers) {
        // Literal header field without indexing, new name (RFC 7541, 6.2.2).
        block.push(0);
        hpack_string(k, &mut block);
        hpack_string(v, &mut block);
    }
    let data = grpc_frame(message, false);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut out, 4, 0, 0, &[]);
    // END_HEADERS.
    frame(&mut out, 1, 0x4, 1, &block);
    assert!(data.len() <= 16_384, "one DATA frame of the default size");
    // END_STREAM.
    frame(&mut out, 0, 0x1, 1, &data);
    out
}

fn hpack_string(s: &str, out: &mut Vec<u8>) {
    assert!(s.len() < 127, "a one-byte length");
    out.push(u8::try_from(s.len()).expect("a one-byte length"));
    out.extend_from_slice(s.as_bytes());
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a small frame");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn a_gzip_of_repeated_chunks_inflates_to_the_message() {
        let mut g = Gzip::new();
        g.push(b"head");
        g.push_repeated(&empty_field(2), 1_500_000);
        let len = g.len();
        let gz = g.finish();
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out.len() as u64, len);
        assert_eq!(out.len(), 4 + 3_000_000);
        assert_eq!(&out[..6], b"head\x12\x00");
        assert!(out[4..].chunks(2).all(|c| c == [0x12, 0]));
        assert!(gz.len() < 8_000, "{} bytes", gz.len());
    }

    #[test]
    fn a_submit_message_decodes_with_its_arguments() {
        let gz = submit_of_empty_args(7, 1000);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut out)
            .unwrap();
        let m: npu_proto::v1::SubmitRequest = prost::Message::decode(&out[..]).unwrap();
        assert_eq!(m.request_id, 7);
        match m.work {
            Some(npu_proto::v1::submit_request::Work::Dispatch(d)) => {
                assert_eq!(d.args.len(), 1000)
            }
            other => panic!("{other:?}"),
        }
    }
}
