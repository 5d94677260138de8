//! The request messages the daemon decodes, read from the served services' own descriptor
//! sets (`npud.v1`, `grpc.health.v1`, server reflection v1 and v1alpha): for each method path,
//! its input message and whether requests and responses stream; for each message, its fields
//! by number (wire kind, repeated or not, the limit of a repeated field) and an upper bound of
//! the bytes prost's struct for it takes inline.
//!
//! Every repeated field reachable from a request message has a count limit
//! ([`repeated_limits`]); the unit tests check that none is missing, so a field added to the
//! API without one fails the build's tests rather than reaching a handler unbounded.

use std::collections::HashMap;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

use crate::config::Limits;

/// A message's index in [`Schema::messages`].
pub type MessageId = u32;

/// How one field's values are encoded, and what prost holds for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A varint scalar (ints, bool, enum) of `size` bytes in memory.
    Varint { size: u64 },
    /// A 4-byte scalar (fixed32, sfixed32, float).
    Fixed32,
    /// An 8-byte scalar (fixed64, sfixed64, double).
    Fixed64,
    /// `string` or `bytes`: a `String` or `Vec<u8>`.
    Bytes,
    /// A nested message.
    Message(MessageId),
}

/// The code a repeated field past its limit is refused with, as the handler refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitCode {
    InvalidArgument,
    ResourceExhausted,
}

/// How many elements one repeated field may hold in one decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub max: u64,
    pub code: LimitCode,
    /// What the elements are, plural ("links").
    pub noun: &'static str,
    /// The configuration key that sets `max`, when one does.
    pub key: Option<&'static str>,
}

/// One field of a message.
#[derive(Debug, Clone)]
pub struct Field {
    pub number: u32,
    pub name: String,
    pub kind: Kind,
    pub repeated: bool,
    /// For a repeated field: its limit (every repeated field of a request has one; see the
    /// module docs).
    pub limit: Option<Limit>,
}

/// One message type.
#[derive(Debug, Clone)]
pub struct Message {
    /// The full name, `npud.v1.ChainRequest`.
    pub name: String,
    /// By field number.
    pub fields: Vec<Field>,
    /// At least the bytes prost's struct takes inline (see [`Schema::inline`]).
    pub inline: u64,
}

impl Message {
    /// The field with `number`, and its index in [`Message::fields`].
    pub fn field(&self, number: u32) -> Option<(usize, &Field)> {
        self.fields
            .binary_search_by_key(&number, |f| f.number)
            .ok()
            .map(|i| (i, &self.fields[i]))
    }
}

/// How a method's requests and responses flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// One request message (unary and server-streaming methods).
    OneRequest,
    /// A stream of requests, one answer at the end (`WriteTensor`).
    ClientStream,
    /// A stream of requests, each answered by one response message in order (`Submit`,
    /// reflection).
    Bidi,
}

/// One method the daemon serves.
#[derive(Debug, Clone, Copy)]
pub struct Method {
    pub input: MessageId,
    pub flow: Flow,
    /// How the intake decodes a long request of this method itself, when it does
    /// ([`crate::decoded`]).
    pub decoder: Option<crate::decoded::DecodeFn>,
}

/// The served methods and their request messages (see the module docs).
#[derive(Debug, Clone)]
pub struct Schema {
    methods: HashMap<String, Method>,
    messages: Vec<Message>,
}

/// The descriptor sets of every service the daemon serves.
pub fn served_sets() -> [&'static [u8]; 4] {
    [
        npu_proto::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ]
}

/// The count limit of each repeated field of a request message, by the field's full name.
/// The values are the handlers' own: `service::work` refuses the same counts after decoding.
pub fn repeated_limits(l: &Limits) -> Vec<(&'static str, Limit)> {
    vec![
        (
            "npud.v1.ChainRequest.links",
            Limit {
                max: u64::from(l.max_chain_links),
                code: LimitCode::ResourceExhausted,
                noun: "links",
                key: Some("limits.max_chain_links"),
            },
        ),
        (
            "npud.v1.DispatchRequest.args",
            Limit {
                max: crate::service::MAX_ARGS as u64,
                code: LimitCode::InvalidArgument,
                noun: "arguments",
                key: None,
            },
        ),
    ]
}

/// Why the descriptor sets could not be read (they are compiled in: a build defect).
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("a served descriptor set does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("{0} names the message type {1}, which no served descriptor set defines")]
    Unknown(String, String),
}

impl Schema {
    /// The schema of every served service, with `limits`' repeated-field limits.
    ///
    /// # Errors
    /// [`SchemaError`] when a compiled-in descriptor set is broken.
    pub fn served(limits: &Limits) -> Result<Self, SchemaError> {
        let sets = served_sets()
            .iter()
            .map(|b| FileDescriptorSet::decode(*b))
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_sets(&sets, &repeated_limits(limits))
    }

    /// The schema of `sets`, with `limits` by repeated field's full name.
    ///
    /// # Errors
    /// [`SchemaError::Unknown`] for a field or method naming a type no set defines.
    pub fn from_sets(
        sets: &[FileDescriptorSet],
        limits: &[(&'static str, Limit)],
    ) -> Result<Self, SchemaError> {
        // Every message (nested ones too), by full name.
        let mut protos: Vec<(String, &DescriptorProto)> = Vec::new();
        fn walk<'a>(
            prefix: &str,
            d: &'a DescriptorProto,
            out: &mut Vec<(String, &'a DescriptorProto)>,
        ) {
            let name = format!("{prefix}.{}", d.name());
            for n in &d.nested_type {
                walk(&name, n, out);
            }
            out.push((name, d));
        }
        for set in sets {
            for file in &set.file {
                for d in &file.message_type {
                    walk(file.package(), d, &mut protos);
                }
            }
        }
        let index: HashMap<String, MessageId> = protos
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), MessageId::try_from(i).unwrap_or(MessageId::MAX)))
            .collect();
        let lookup = |owner: &str, type_name: &str| -> Result<MessageId, SchemaError> {
            let t = type_name.trim_start_matches('.');
            index
                .get(t)
                .copied()
                .ok_or_else(|| SchemaError::Unknown(owner.to_owned(), t.to_owned()))
        };
        let mut messages = Vec::with_capacity(protos.len());
        for (name, d) in &protos {
            let mut fields = Vec::with_capacity(d.field.len());
            for f in &d.field {
                let full = format!("{name}.{}", f.name());
                let kind = match f.r#type() {
                    Type::Int32 | Type::Uint32 | Type::Sint32 | Type::Enum => {
                        Kind::Varint { size: 4 }
                    }
                    Type::Int64 | Type::Uint64 | Type::Sint64 => Kind::Varint { size: 8 },
                    Type::Bool => Kind::Varint { size: 1 },
                    Type::Fixed32 | Type::Sfixed32 | Type::Float => Kind::Fixed32,
                    Type::Fixed64 | Type::Sfixed64 | Type::Double => Kind::Fixed64,
                    Type::String | Type::Bytes => Kind::Bytes,
                    // Groups are decoded as the message they hold by the descriptor; this API
                    // has none, and the scanner refuses the group wire type.
                    Type::Message | Type::Group => Kind::Message(lookup(&full, f.type_name())?),
                };
                let repeated = f.label() == Label::Repeated;
                let limit = limits
                    .iter()
                    .find(|(n, _)| *n == full)
                    .map(|(_, l)| l.clone());
                fields.push(Field {
                    number: u32::try_from(f.number()).unwrap_or(0),
                    name: f.name().to_owned(),
                    kind,
                    repeated,
                    limit,
                });
            }
            fields.sort_by_key(|f| f.number);
            messages.push(Message {
                name: name.clone(),
                fields,
                inline: 0,
            });
        }
        // Inline sizes, from each message's own descriptor (oneofs, maps) and its fields.
        let mut inline = vec![None; messages.len()];
        for id in 0..messages.len() {
            inline_size(id, &protos, &messages, &mut inline, &mut Vec::new());
        }
        for (m, size) in messages.iter_mut().zip(inline) {
            m.inline = size.unwrap_or(0);
        }
        let mut methods = HashMap::new();
        for set in sets {
            for file in &set.file {
                for s in &file.service {
                    for m in &s.method {
                        let path = format!("/{}.{}/{}", file.package(), s.name(), m.name());
                        let input = lookup(&path, m.input_type())?;
                        let flow = match (m.client_streaming(), m.server_streaming()) {
                            (false, _) => Flow::OneRequest,
                            (true, false) => Flow::ClientStream,
                            (true, true) => Flow::Bidi,
                        };
                        let decoder = crate::decoded::decoder(&messages[input as usize].name);
                        methods.insert(
                            path,
                            Method {
                                input,
                                flow,
                                decoder,
                            },
                        );
                    }
                }
            }
        }
        Ok(Self { methods, messages })
    }

    /// The method at `path` (`/npud.v1.Npud/Chain`), if served.
    pub fn method(&self, path: &str) -> Option<Method> {
        self.methods.get(path).copied()
    }

    /// Every served method's path.
    pub fn method_paths(&self) -> impl Iterator<Item = &str> {
        self.methods.keys().map(String::as_str)
    }

    pub fn message(&self, id: MessageId) -> &Message {
        &self.messages[id as usize]
    }

    /// The message named `name` (`npud.v1.ChainRequest`).
    pub fn message_named(&self, name: &str) -> Option<MessageId> {
        self.messages
            .iter()
            .position(|m| m.name == name)
            .and_then(|i| MessageId::try_from(i).ok())
    }

    /// The messages reachable from `root` through its fields (itself included).
    pub fn reachable(&self, root: MessageId) -> Vec<MessageId> {
        let mut seen = vec![root];
        let mut next = 0;
        while next < seen.len() {
            let m = self.message(seen[next]);
            next += 1;
            for f in &m.fields {
                if let Kind::Message(id) = f.kind
                    && !seen.contains(&id)
                {
                    seen.push(id);
                }
            }
        }
        seen
    }
}

/// Bytes of one field inline in prost's struct, at most: scalars 8 (alignment included),
/// `String`/`Vec` 24, a map 48, a nested message its own size plus 8 for the `Option`.
fn field_inline(
    field: &Field,
    protos: &[(String, &DescriptorProto)],
    messages: &[Message],
    memo: &mut Vec<Option<u64>>,
    path: &mut Vec<usize>,
) -> u64 {
    if field.repeated {
        let map = match field.kind {
            Kind::Message(id) => protos[id as usize]
                .1
                .options
                .as_ref()
                .is_some_and(|o| o.map_entry()),
            _ => false,
        };
        return if map { 48 } else { 24 };
    }
    match field.kind {
        Kind::Varint { .. } | Kind::Fixed32 | Kind::Fixed64 => 8,
        Kind::Bytes => 24,
        // A message on the path being sized is boxed by prost (recursion).
        Kind::Message(id) if path.contains(&(id as usize)) => 8,
        Kind::Message(id) => inline_size(id as usize, protos, messages, memo, path) + 8,
    }
}

fn inline_size(
    id: usize,
    protos: &[(String, &DescriptorProto)],
    messages: &[Message],
    memo: &mut Vec<Option<u64>>,
    path: &mut Vec<usize>,
) -> u64 {
    if let Some(s) = memo[id] {
        return s;
    }
    path.push(id);
    let d = protos[id].1;
    let m = &messages[id];
    let mut total = 0u64;
    // A oneof (a proto3 `optional` too) is one `Option<enum>`: its largest member plus 8.
    let mut oneofs = vec![0u64; d.oneof_decl.len()];
    for f in &d.field {
        let Some((_, field)) = m.field(u32::try_from(f.number()).unwrap_or(0)) else {
            continue;
        };
        let size = field_inline(field, protos, messages, memo, path);
        match f.oneof_index.and_then(|i| usize::try_from(i).ok()) {
            Some(i) if i < oneofs.len() => oneofs[i] = oneofs[i].max(size),
            _ => total += size,
        }
    }
    total += oneofs.iter().map(|s| s + 8).sum::<u64>();
    path.pop();
    memo[id] = Some(total);
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use npu_proto::v1 as pb;

    fn schema() -> Schema {
        Schema::served(&Limits::default()).unwrap()
    }

    #[test]
    fn every_served_method_has_its_input_and_every_repeated_field_of_a_request_a_limit() {
        let s = schema();
        let mut paths: Vec<&str> = s.method_paths().collect();
        paths.sort_unstable();
        // The npud API, health and both reflection versions.
        assert!(paths.contains(&"/npud.v1.Npud/Chain"), "{paths:?}");
        assert!(paths.contains(&"/grpc.health.v1.Health/Check"), "{paths:?}");
        assert!(
            paths.contains(&"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
            "{paths:?}"
        );
        assert_eq!(paths.len(), crate::metrics::rpc::api_methods().len());
        let mut unbounded = Vec::new();
        for p in &paths {
            let m = s.method(p).unwrap();
            for id in s.reachable(m.input) {
                let msg = s.message(id);
                for f in msg
                    .fields
                    .iter()
                    .filter(|f| f.repeated && f.limit.is_none())
                {
                    unbounded.push(format!("{p}: {}.{}", msg.name, f.name));
                }
            }
        }
        assert!(
            unbounded.is_empty(),
            "repeated fields of requests without a count limit (add them to repeated_limits): \
             {unbounded:#?}"
        );
    }

    #[test]
    fn flows_follow_the_descriptors() {
        let s = schema();
        assert_eq!(
            s.method("/npud.v1.Npud/Dispatch").unwrap().flow,
            Flow::OneRequest
        );
        assert_eq!(
            s.method("/npud.v1.Npud/ReadTensor").unwrap().flow,
            Flow::OneRequest
        );
        assert_eq!(
            s.method("/npud.v1.Npud/WriteTensor").unwrap().flow,
            Flow::ClientStream
        );
        assert_eq!(s.method("/npud.v1.Npud/Submit").unwrap().flow, Flow::Bidi);
        assert!(s.method("/npud.v1.Npud/Nothing").is_none());
    }

    /// The inline bound is at least what the struct takes, for every npud request message and
    /// the messages inside them.
    #[test]
    fn inline_sizes_bound_prosts_structs() {
        let s = schema();
        let actual = [
            ("npud.v1.TensorArg", size_of::<pb::TensorArg>()),
            ("npud.v1.DispatchRequest", size_of::<pb::DispatchRequest>()),
            ("npud.v1.ChainRequest", size_of::<pb::ChainRequest>()),
            ("npud.v1.SubmitRequest", size_of::<pb::SubmitRequest>()),
            (
                "npud.v1.RegisterProgramRequest",
                size_of::<pb::RegisterProgramRequest>(),
            ),
            (
                "npud.v1.WriteTensorChunk",
                size_of::<pb::WriteTensorChunk>(),
            ),
            (
                "npud.v1.ReadTensorRequest",
                size_of::<pb::ReadTensorRequest>(),
            ),
            (
                "npud.v1.OpenSessionRequest",
                size_of::<pb::OpenSessionRequest>(),
            ),
            (
                "npud.v1.ClearQuarantineRequest",
                size_of::<pb::ClearQuarantineRequest>(),
            ),
            (
                "grpc.reflection.v1.ServerReflectionRequest",
                size_of::<tonic_reflection::pb::v1::ServerReflectionRequest>(),
            ),
            (
                "grpc.health.v1.HealthCheckRequest",
                size_of::<tonic_health::pb::HealthCheckRequest>(),
            ),
        ];
        for (name, size) in actual {
            let id = s.message_named(name).unwrap_or_else(|| panic!("{name}"));
            let bound = s.message(id).inline;
            assert!(bound >= size as u64, "{name}: bound {bound}, struct {size}");
        }
    }
}
