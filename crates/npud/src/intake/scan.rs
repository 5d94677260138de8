//! A linear scan of a request message's protobuf wire bytes, before prost decodes them: it
//! counts each repeated field's elements against its limit, estimates the bytes the decoded
//! message will hold, and checks the wire format as far as prost would, so that a message
//! prost would decode into far more memory than it is long is refused first.
//!
//! Cost: one pass over the bytes, no allocation but two small stacks that grow with the
//! nesting depth (at most [`MAX_DEPTH`]); a refusal stops the pass where it is found (a chain
//! of 16 million empty links is refused at link `limits.max_chain_links + 1`, a message of
//! 16 million unknown fields at field [`Bounds::max_fields`] + 1).
//!
//! Counting follows prost's merge rules: every occurrence of a singular message field merges
//! into one value, so the repeated fields inside all its occurrences count together; each
//! element of a repeated message field is a value of its own. (Two singular fields of one
//! message holding the same repeated field's type count together: conservative, never less.)
//!
//! The estimate: the message's inline size, plus for each repeated field its elements' inline
//! size times the capacity prost's `Vec` grows to (the next power of two, at least 8), plus the
//! length of every `string` and `bytes` value, plus half the largest `Vec`'s capacity (its old
//! buffer, live beside the new one while it last grew). It bounds what prost allocates (the tests of
//! `tests/decode_cost.rs` check it against a counting allocator).

use crate::error::NpudError;

use super::schema::{Kind, LimitCode, MessageId, Schema};

/// How many fields the scan reads between two [`crate::bulk::pause`] points (a few µs).
const PAUSE_EVERY: u64 = 256;

/// Deepest nesting of messages accepted (prost's own limit is 100; this API nests 4 deep).
pub const MAX_DEPTH: usize = 32;

/// The bounds of one message: its decoded size at most `per_wire_byte` × its length +
/// `slack`, and at most `max_fields` fields (each one a step of prost's decode, which runs on
/// the thread that serves the call).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub per_wire_byte: u64,
    pub slack: u64,
    pub max_fields: u64,
}

/// What a scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Bytes the decoded message will hold, at most (see the module docs).
    pub decoded: u64,
}

/// Scans `bytes` as message `root` of `schema`.
///
/// # Errors
/// INVALID_ARGUMENT for bytes that are no valid `root` (the message says "not a valid message"
/// and names the field), the limit's code for a repeated field past its limit (naming the
/// field, its limit and the key that sets it), RESOURCE_EXHAUSTED for a decoded size past
/// `bounds`.
pub fn scan(
    schema: &Schema,
    root: MessageId,
    bytes: &[u8],
    bounds: Bounds,
) -> Result<Scanned, NpudError> {
    let bound = bounds
        .per_wire_byte
        .saturating_mul(bytes.len() as u64)
        .saturating_add(bounds.slack);
    let mut s = Scanner {
        schema,
        counts: Vec::new(),
        scope: 0,
        path: Vec::new(),
        decoded: schema.message(root).inline,
        bound,
        wire: bytes.len() as u64,
        bounds,
        root,
        growing: 0,
        fields: 0,
    };
    s.check_bound()?;
    s.message(root, bytes)?;
    s.close_scope(0)?;
    // While the largest `Vec` grew to its capacity, its old buffer was live beside the new.
    s.add(s.growing)?;
    Ok(Scanned { decoded: s.decoded })
}

/// One repeated field's count in the current scope.
#[derive(Debug)]
struct Count {
    msg: MessageId,
    field: usize,
    n: u64,
    /// Bytes one element takes in the `Vec`.
    elem: u64,
}

/// A step of the path to the field being scanned, for messages.
#[derive(Debug, Clone, Copy)]
struct Step {
    msg: MessageId,
    field: usize,
    element: Option<u64>,
}

struct Scanner<'a> {
    schema: &'a Schema,
    counts: Vec<Count>,
    /// Where the current scope's counts start in `counts`.
    scope: usize,
    path: Vec<Step>,
    decoded: u64,
    bound: u64,
    wire: u64,
    bounds: Bounds,
    root: MessageId,
    /// The largest `Vec`'s last growth: half its capacity, in bytes.
    growing: u64,
    /// Fields read so far, at every depth.
    fields: u64,
}

/// What the bytes broke, for the INVALID_ARGUMENT message.
enum Malformed {
    Truncated,
    BadVarint,
    FieldZero,
    Group(u64),
    NoWireType(u64),
    WrongWireType { got: u64, want: &'static str },
    PackedLength { len: usize, size: usize },
    TooDeep,
}

/// A capacity prost's `Vec` may have grown to for `n` elements.
fn capacity(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        n.checked_next_power_of_two().unwrap_or(u64::MAX).max(8)
    }
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, Malformed> {
    let mut v = 0u64;
    for i in 0..10 {
        let Some(&b) = buf.get(*pos) else {
            return Err(Malformed::Truncated);
        };
        *pos += 1;
        if i == 9 && b > 1 {
            return Err(Malformed::BadVarint);
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err(Malformed::BadVarint)
}

/// The length-delimited value at `pos`: its bytes, `pos` moved past them.
fn delimited<'b>(buf: &'b [u8], pos: &mut usize) -> Result<&'b [u8], Malformed> {
    let len = varint(buf, pos)?;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| pos.checked_add(l))
        .filter(|e| *e <= buf.len())
        .ok_or(Malformed::Truncated)?;
    let v = &buf[*pos..end];
    *pos = end;
    Ok(v)
}

fn skip(buf: &[u8], pos: &mut usize, wire: u64, number: u64) -> Result<(), Malformed> {
    let n = match wire {
        0 => return varint(buf, pos).map(drop),
        1 => 8,
        2 => return delimited(buf, pos).map(drop),
        5 => 4,
        3 | 4 => return Err(Malformed::Group(number)),
        w => return Err(Malformed::NoWireType(w)),
    };
    if buf.len() - *pos < n {
        return Err(Malformed::Truncated);
    }
    *pos += n;
    Ok(())
}

const WIRE_NAMES: [&str; 6] = [
    "varint",
    "64-bit",
    "length-delimited",
    "group start",
    "group end",
    "32-bit",
];

impl Scanner<'_> {
    fn message(&mut self, id: MessageId, buf: &[u8]) -> Result<(), NpudError> {
        if self.path.len() >= MAX_DEPTH {
            return Err(self.malformed(Malformed::TooDeep, None));
        }
        let schema = self.schema;
        let msg = schema.message(id);
        let mut pos = 0;
        while pos < buf.len() {
            let key = varint(buf, &mut pos).map_err(|m| self.malformed(m, None))?;
            self.fields += 1;
            if self.fields.is_multiple_of(PAUSE_EVERY) {
                crate::bulk::pause();
            }
            if self.fields > self.bounds.max_fields {
                return Err(NpudError::ResourceExhausted(format!(
                    "the request has more than {} fields (known or not, at every depth): \
                     what one message may have, to bound the work of decoding it; refused \
                     before decoding",
                    self.bounds.max_fields
                )));
            }
            let (wire, number) = (key & 7, key >> 3);
            if number == 0 {
                return Err(self.malformed(Malformed::FieldZero, None));
            }
            match wire {
                3 | 4 => return Err(self.malformed(Malformed::Group(number), None)),
                6 | 7 => return Err(self.malformed(Malformed::NoWireType(wire), None)),
                _ => {}
            }
            let Some((fi, f)) = u32::try_from(number).ok().and_then(|n| msg.field(n)) else {
                skip(buf, &mut pos, wire, number).map_err(|m| self.malformed(m, None))?;
                continue;
            };
            let at = Step {
                msg: id,
                field: fi,
                element: None,
            };
            let wrong = |want| Malformed::WrongWireType { got: wire, want };
            match (f.kind, f.repeated) {
                (Kind::Message(m), repeated) => {
                    if wire != 2 {
                        return Err(self.malformed(wrong("length-delimited"), Some(at)));
                    }
                    let sub = delimited(buf, &mut pos).map_err(|e| self.malformed(e, Some(at)))?;
                    if repeated {
                        let inline = schema.message(m).inline;
                        let n = self.count(id, fi, 1, inline)?;
                        self.add(inline)?;
                        // Each element is a value of its own: its repeated fields count anew.
                        let outer = self.scope;
                        self.scope = self.counts.len();
                        self.path.push(Step {
                            element: Some(n - 1),
                            ..at
                        });
                        self.message(m, sub)?;
                        self.close_scope(self.scope)?;
                        self.path.pop();
                        self.scope = outer;
                    } else {
                        self.path.push(at);
                        self.message(m, sub)?;
                        self.path.pop();
                    }
                }
                (Kind::Bytes, repeated) => {
                    if wire != 2 {
                        return Err(self.malformed(wrong("length-delimited"), Some(at)));
                    }
                    let v = delimited(buf, &mut pos).map_err(|e| self.malformed(e, Some(at)))?;
                    if repeated {
                        self.count(id, fi, 1, 24)?;
                    }
                    self.add(v.len() as u64)?;
                }
                (scalar, repeated) => {
                    let (want_wire, want, size) = match scalar {
                        Kind::Varint { size } => (0, "varint", size),
                        Kind::Fixed32 => (5, "32-bit", 4),
                        _ => (1, "64-bit", 8),
                    };
                    if repeated && wire == 2 {
                        // Packed.
                        let v =
                            delimited(buf, &mut pos).map_err(|e| self.malformed(e, Some(at)))?;
                        let n = match want_wire {
                            0 => {
                                if v.last().is_some_and(|b| b & 0x80 != 0) {
                                    return Err(self.malformed(Malformed::Truncated, Some(at)));
                                }
                                v.iter().filter(|b| **b < 0x80).count()
                            }
                            _ => {
                                let w = if want_wire == 5 { 4 } else { 8 };
                                if v.len() % w != 0 {
                                    return Err(self.malformed(
                                        Malformed::PackedLength {
                                            len: v.len(),
                                            size: w,
                                        },
                                        Some(at),
                                    ));
                                }
                                v.len() / w
                            }
                        };
                        self.count(id, fi, n as u64, size)?;
                        self.add(size.saturating_mul(n as u64))?;
                        continue;
                    }
                    if wire != want_wire {
                        return Err(self.malformed(wrong(want), Some(at)));
                    }
                    skip(buf, &mut pos, wire, number).map_err(|m| self.malformed(m, Some(at)))?;
                    if repeated {
                        self.count(id, fi, 1, size)?;
                        self.add(size)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds `n` elements to field `field` of `msg` in the current scope; the count after it.
    fn count(&mut self, msg: MessageId, field: usize, n: u64, elem: u64) -> Result<u64, NpudError> {
        let found = self.counts[self.scope..]
            .iter()
            .position(|c| c.msg == msg && c.field == field);
        let i = match found {
            Some(i) => self.scope + i,
            None => {
                self.counts.push(Count {
                    msg,
                    field,
                    n: 0,
                    elem,
                });
                self.counts.len() - 1
            }
        };
        let c = &mut self.counts[i];
        c.n = c.n.saturating_add(n);
        let total = c.n;
        let f = &self.schema.message(msg).fields[field];
        if let Some(l) = &f.limit
            && total > l.max
        {
            let path = self.path_text(Some(Step {
                msg,
                field,
                element: None,
            }));
            let text = match l.key {
                Some(key) => format!(
                    "{path}: more than {max} {noun}; at most {max} ({key}); refused before \
                     decoding",
                    max = l.max,
                    noun = l.noun
                ),
                None => format!(
                    "{path}: more than {max} {noun}; at most {max}; refused before decoding",
                    max = l.max,
                    noun = l.noun
                ),
            };
            return Err(match l.code {
                LimitCode::InvalidArgument => NpudError::InvalidArgument(text),
                LimitCode::ResourceExhausted => NpudError::ResourceExhausted(text),
            });
        }
        Ok(total)
    }

    /// Ends the scope whose counts start at `start`: each `Vec`'s growth slack is added.
    fn close_scope(&mut self, start: usize) -> Result<(), NpudError> {
        let slack: u64 = self.counts[start..]
            .iter()
            .map(|c| c.elem.saturating_mul(capacity(c.n) - c.n))
            .fold(0, u64::saturating_add);
        for c in &self.counts[start..] {
            self.growing = self.growing.max(c.elem.saturating_mul(capacity(c.n) / 2));
        }
        self.counts.truncate(start);
        self.add(slack)
    }

    fn add(&mut self, bytes: u64) -> Result<(), NpudError> {
        self.decoded = self.decoded.saturating_add(bytes);
        self.check_bound()
    }

    fn check_bound(&self) -> Result<(), NpudError> {
        if self.decoded <= self.bound {
            return Ok(());
        }
        Err(NpudError::ResourceExhausted(format!(
            "the request would take more than {} bytes once decoded: more than {} per byte of \
             its {} + {} (what a message may decode to, to bound its memory before it is \
             decoded); refused before decoding",
            self.bound, self.bounds.per_wire_byte, self.wire, self.bounds.slack
        )))
    }

    fn path_text(&self, last: Option<Step>) -> String {
        let mut out = String::new();
        for s in self.path.iter().chain(last.as_ref()) {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&self.schema.message(s.msg).fields[s.field].name);
            if let Some(i) = s.element {
                out.push_str(&format!("[{i}]"));
            }
        }
        out
    }

    fn malformed(&self, m: Malformed, at: Option<Step>) -> NpudError {
        let what = match m {
            Malformed::Truncated => "a value runs past the end of its message".to_owned(),
            Malformed::BadVarint => "a varint longer than 10 bytes or past 64 bits".to_owned(),
            Malformed::FieldZero => "field number 0".to_owned(),
            Malformed::Group(n) => {
                format!("field {n} is a group (wire types 3 and 4), which this API never uses")
            }
            Malformed::NoWireType(w) => format!("wire type {w} does not exist"),
            Malformed::WrongWireType { got, want } => format!(
                "wire type {} ({}), but the field is {want}",
                got,
                usize::try_from(got)
                    .ok()
                    .and_then(|g| WIRE_NAMES.get(g))
                    .copied()
                    .unwrap_or("none")
            ),
            Malformed::PackedLength { len, size } => {
                format!("a packed field of {len} bytes, not a multiple of {size}")
            }
            Malformed::TooDeep => format!("messages nested more than {MAX_DEPTH} deep"),
        };
        let path = self.path_text(at);
        let root = &self.schema.message(self.root).name;
        if path.is_empty() {
            NpudError::InvalidArgument(format!(
                "the request is not a valid message for this method ({root}): {what}"
            ))
        } else {
            NpudError::InvalidArgument(format!(
                "the request is not a valid message for this method ({root}): {path}: {what}"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits;
    use npu_proto::v1 as pb;
    use prost::Message as _;

    const BOUNDS: Bounds = Bounds {
        per_wire_byte: 8,
        slack: 1 << 20,
        max_fields: 1 << 20,
    };

    fn schema() -> Schema {
        Schema::served(&Limits {
            max_chain_links: 8,
            ..Limits::default()
        })
        .unwrap()
    }

    fn scan_as(name: &str, bytes: &[u8]) -> Result<Scanned, NpudError> {
        let s = schema();
        scan(&s, s.message_named(name).unwrap(), bytes, BOUNDS)
    }

    fn arg(t: u64) -> pb::TensorArg {
        pb::TensorArg {
            tensor_id: t,
            ..Default::default()
        }
    }

    #[test]
    fn messages_within_their_limits_pass_with_an_estimate_above_their_structs() {
        let d = pb::DispatchRequest {
            program_id: 3,
            args: (1..=64).map(arg).collect(),
        };
        let c = pb::ChainRequest {
            links: vec![d.clone(); 8],
        };
        let got = scan_as("npud.v1.ChainRequest", &c.encode_to_vec()).unwrap();
        // 8 links (capacity 8) of 64 arguments each.
        let min = 8 * size_of::<pb::DispatchRequest>() + 8 * 64 * size_of::<pb::TensorArg>();
        assert!(got.decoded >= min as u64, "{got:?} < {min}");
        let p = pb::RegisterProgramRequest {
            pdi: vec![1; 5000],
            insts: vec![2; 400],
            name: "n".into(),
            ..Default::default()
        };
        let got = scan_as("npud.v1.RegisterProgramRequest", &p.encode_to_vec()).unwrap();
        assert!(got.decoded >= 5401, "{got:?}");
        // Unknown fields of every wire type prost skips.
        let mut b = p.encode_to_vec();
        b.extend_from_slice(&[0x78, 0x05, 0x81, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0]);
        b.extend_from_slice(&[0x8a, 0x01, 0x02, 0xaa, 0xbb, 0x8d, 0x01, 1, 2, 3, 4]);
        pb::RegisterProgramRequest::decode(&b[..]).unwrap();
        scan_as("npud.v1.RegisterProgramRequest", &b).unwrap();
    }

    #[test]
    fn repeated_fields_past_their_limits_are_refused_naming_the_field_and_its_key() {
        let link = |n| pb::DispatchRequest {
            program_id: 1,
            args: (1..=n).map(arg).collect(),
        };
        let e = scan_as(
            "npud.v1.ChainRequest",
            &pb::ChainRequest {
                links: vec![link(1); 9],
            }
            .encode_to_vec(),
        )
        .unwrap_err();
        assert_eq!(e.code_name(), "RESOURCE_EXHAUSTED");
        assert_eq!(
            e.message(),
            "links: more than 8 links; at most 8 (limits.max_chain_links); refused before \
             decoding"
        );
        let mut links = vec![link(1); 3];
        links.push(link(65));
        let e = scan_as(
            "npud.v1.ChainRequest",
            &pb::ChainRequest { links }.encode_to_vec(),
        )
        .unwrap_err();
        assert_eq!(e.code_name(), "INVALID_ARGUMENT");
        assert!(
            e.message()
                .starts_with("links[3].args: more than 64 arguments; at most 64"),
            "{e}"
        );
        // A Submit's dispatch, given twice: prost merges the two, so their arguments count
        // together.
        let one = pb::SubmitRequest {
            request_id: 1,
            work: Some(pb::submit_request::Work::Dispatch(link(40))),
            timeout_ms: 0,
        }
        .encode_to_vec();
        let twice = [one.clone(), one].concat();
        assert_eq!(
            pb::SubmitRequest::decode(&twice[..]).map(|r| match r.work {
                Some(pb::submit_request::Work::Dispatch(d)) => d.args.len(),
                _ => 0,
            }),
            Ok(80)
        );
        let e = scan_as("npud.v1.SubmitRequest", &twice).unwrap_err();
        assert!(
            e.message().starts_with("dispatch.args: more than 64"),
            "{e}"
        );
    }

    #[test]
    fn the_issues_bomb_is_refused_at_the_first_link_past_the_limit() {
        // 16.7 M empty links: 32 MiB on the wire, about 1 GiB decoded.
        let bomb = [0x0a_u8, 0x00].repeat(1 << 24);
        let e = scan_as("npud.v1.ChainRequest", &bomb).unwrap_err();
        assert!(e.message().starts_with("links: more than 8 links"), "{e}");
        // Empty arguments of a dispatch.
        let bomb = [0x12_u8, 0x00].repeat(1 << 20);
        let e = scan_as("npud.v1.DispatchRequest", &bomb).unwrap_err();
        assert!(
            e.message().starts_with("args: more than 64 arguments"),
            "{e}"
        );
    }

    #[test]
    fn a_decoded_size_past_the_bound_is_refused() {
        let s = schema();
        let id = s.message_named("npud.v1.ChainRequest").unwrap();
        let c = pb::ChainRequest {
            links: vec![
                pb::DispatchRequest {
                    program_id: 0,
                    args: vec![pb::TensorArg::default(); 64],
                };
                8
            ],
        };
        let tight = Bounds {
            per_wire_byte: 8,
            slack: 0,
            max_fields: 1 << 20,
        };
        let e = scan(&s, id, &c.encode_to_vec(), tight).unwrap_err();
        assert_eq!(e.code_name(), "RESOURCE_EXHAUSTED");
        assert!(e.message().contains("once decoded"), "{e}");
    }

    #[test]
    fn a_message_of_more_fields_than_the_bound_is_refused() {
        // 2 M unknown varint fields: prost would walk every one.
        let many = [0xf8_u8, 0x7f, 0x00].repeat(2 << 20);
        let e = scan_as("npud.v1.GetDeviceInfoRequest", &many).unwrap_err();
        assert_eq!(e.code_name(), "RESOURCE_EXHAUSTED");
        assert!(e.message().contains("more than 1048576 fields"), "{e}");
        scan_as("npud.v1.GetDeviceInfoRequest", &many[..3 << 20]).unwrap();
    }

    #[test]
    fn malformed_bytes_are_invalid_argument_naming_what_broke() {
        for (bytes, text) in [
            (
                &[0xff_u8, 0x7f, 0xff, 0xff, 0xff][..],
                "not a valid message",
            ),
            (&[0x0a, 0x40, 1, 2, 3], "runs past the end"),
            (&[0x08], "links: wire type 0 (varint)"),
            (&[0x0a], "runs past the end"),
            (&[0x00, 0x01], "field number 0"),
            (&[0x0b, 0x0c], "group"),
            (&[0x0f], "wire type 7 does not exist"),
            (
                &[0x09, 1, 2, 3, 4, 5, 6, 7, 8],
                "links: wire type 1 (64-bit)",
            ),
            (
                &[0x0a, 0x02, 0x10, 0x80],
                "links[0].args: wire type 0 (varint)",
            ),
            (
                &[0x0a, 0x02, 0x08, 0x80],
                "links[0].program_id: a value runs past",
            ),
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
                "10 bytes",
            ),
        ] {
            let e = scan_as("npud.v1.ChainRequest", bytes).unwrap_err();
            assert_eq!(e.code_name(), "INVALID_ARGUMENT", "{bytes:?}: {e}");
            assert!(
                e.message().contains("not a valid message"),
                "{bytes:?}: {e}"
            );
            assert!(e.message().contains(text), "{bytes:?}: {e}");
            assert!(
                pb::ChainRequest::decode(bytes).is_err(),
                "prost takes {bytes:?}"
            );
        }
    }
}
