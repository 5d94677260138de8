//! Events to systemd's journal as fields, over its native protocol.
//!
//! Under systemd with `StandardError=journal` (the default for services) npud's stderr is a
//! stream the journal reads line by line: a plain line there lands as one `MESSAGE` with npud's
//! own timestamp and level spelt into it, and colour escapes would land as bytes. systemd sets
//! `JOURNAL_STREAM=<device>:<inode>` to that stream, so a process can tell ([`stderr_is_journal`])
//! and send its entries to the journal's socket instead, each a datagram of fields
//! (systemd's "Native Journal Protocol"): `MESSAGE` (the event's message and its fields as
//! `key=value`, as the plain format writes them), `PRIORITY` (syslog's, from the level),
//! `SYSLOG_IDENTIFIER=npud`, `TARGET`, `CODE_FILE`, `CODE_LINE`, and each field of the event as
//! `NPUD_<NAME>` (`abi=g2` is `NPUD_ABI=g2`), which `journalctl -o verbose` shows and
//! `journalctl NPUD_ABI=g2` matches.
//!
//! An entry the socket refuses (too large for one datagram: `MESSAGE` is cut to
//! [`MAX_MESSAGE`] and sent again; the journal gone) is written to stderr instead, so nothing
//! is lost silently. Cost: one datagram per event, linear in the event's text.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The journal's native socket.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// How much of `MESSAGE` is sent again when a whole entry does not fit one datagram.
pub const MAX_MESSAGE: usize = 48 * 1024;

/// Whether stderr is the journal stream systemd connected (`JOURNAL_STREAM` names its device
/// and inode; a child that inherited the variable but not the stream is not fooled).
pub fn stderr_is_journal() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The layer: sends each event to the journal.
#[derive(Debug)]
pub struct Journald {
    socket: UnixDatagram,
}

impl Journald {
    /// A layer sending to the journal's socket at `path`.
    ///
    /// # Errors
    /// The socket cannot be created or the journal's cannot be connected.
    pub fn connect(path: &Path) -> std::io::Result<Journald> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(path)?;
        Ok(Journald { socket })
    }

    fn send(&self, entry: &[u8]) -> std::io::Result<()> {
        self.socket.send(entry).map(|_| ())
    }
}

/// syslog's priority for a level: ERROR 3 (err), WARN 4 (warning), INFO 6 (info), DEBUG and
/// TRACE 7 (debug).
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// A field name as the journal takes it: upper-case ASCII letters, digits and `_`, not
/// starting with `_` or a digit, prefixed `NPUD_` (so no event can set a trusted `_` field or
/// one of the journal's own names).
fn journal_name(name: &str) -> String {
    let mut out = String::from("NPUD_");
    for c in name.chars() {
        out.push(if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        });
    }
    out
}

/// Appends one field in the native protocol: `NAME=value\n`, or, when the value holds a
/// newline, `NAME\n`, its length as a little-endian u64, the value and `\n`.
fn field(entry: &mut Vec<u8>, name: &str, value: &str) {
    entry.extend_from_slice(name.as_bytes());
    if value.contains('\n') {
        entry.push(b'\n');
        entry.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        entry.push(b'=');
    }
    entry.extend_from_slice(value.as_bytes());
    entry.push(b'\n');
}

/// An event's fields: the message, the plain format's `key=value` text, and each value alone.
#[derive(Default)]
struct Fields {
    message: String,
    text: String,
    values: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, f: &Field, value: &str) {
        if f.name() == "message" {
            value.clone_into(&mut self.message);
        } else {
            let _ = write!(self.text, " {}={value:?}", f.name());
            self.values.push((journal_name(f.name()), value.to_owned()));
        }
    }

    fn record_debug(&mut self, f: &Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        if f.name() == "message" {
            self.message = v;
        } else {
            let _ = write!(self.text, " {}={v}", f.name());
            self.values.push((journal_name(f.name()), v));
        }
    }
}

/// The entry for an event whose `MESSAGE` is `message`.
fn entry(event: &Event<'_>, message: &str, values: &[(String, String)]) -> Vec<u8> {
    let meta = event.metadata();
    let mut e = Vec::with_capacity(message.len() + 256);
    field(&mut e, "MESSAGE", message);
    field(&mut e, "PRIORITY", &priority(*meta.level()).to_string());
    field(&mut e, "SYSLOG_IDENTIFIER", "npud");
    field(&mut e, "TARGET", meta.target());
    if let Some(file) = meta.file() {
        field(&mut e, "CODE_FILE", file);
    }
    if let Some(line) = meta.line() {
        field(&mut e, "CODE_LINE", &line.to_string());
    }
    for (k, v) in values {
        field(&mut e, k, v);
    }
    e
}

impl<S: Subscriber> Layer<S> for Journald {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let message = format!("{}{}", f.message, f.text);
        if self.send(&entry(event, &message, &f.values)).is_ok() {
            return;
        }
        // Too large for one datagram: the message cut, no separate fields.
        let mut cut = message.clone();
        if cut.len() > MAX_MESSAGE {
            let mut at = MAX_MESSAGE;
            while !cut.is_char_boundary(at) {
                at -= 1;
            }
            cut.truncate(at);
            cut.push_str(" [cut]");
        }
        if self.send(&entry(event, &cut, &[])).is_ok() {
            return;
        }
        // The journal is gone: stderr, which systemd also sends to it.
        let _ = writeln!(
            std::io::stderr(),
            "{} {}: {message}",
            event.metadata().level(),
            event.metadata().target()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// Fields of one native-protocol datagram.
    fn parse(mut d: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while !d.is_empty() {
            let nl = d.iter().position(|&b| b == b'\n').expect("a newline");
            let line = &d[..nl];
            if let Some(eq) = line.iter().position(|&b| b == b'=') {
                out.push((
                    String::from_utf8_lossy(&line[..eq]).into_owned(),
                    String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
                ));
                d = &d[nl + 1..];
            } else {
                let name = String::from_utf8_lossy(line).into_owned();
                let len =
                    usize::try_from(u64::from_le_bytes(d[nl + 1..nl + 9].try_into().unwrap()))
                        .unwrap();
                let value = String::from_utf8_lossy(&d[nl + 9..nl + 9 + len]).into_owned();
                out.push((name, value));
                d = &d[nl + 9 + len + 1..];
            }
        }
        out
    }

    #[test]
    fn an_event_is_one_datagram_of_fields_without_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let journal = UnixDatagram::bind(&path).unwrap();
        let layer = Journald::connect(&path).unwrap();
        let sub = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(abi = "g2", count = 3, "chose the packet ABI\nsecond line");
        });
        let mut buf = vec![0u8; 65536];
        let n = journal.recv(&mut buf).unwrap();
        let fields = parse(&buf[..n]);
        let get = |k: &str| {
            fields
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or_default()
        };
        assert_eq!(
            get("MESSAGE"),
            "chose the packet ABI\nsecond line abi=\"g2\" count=3"
        );
        assert_eq!(get("PRIORITY"), "4");
        assert_eq!(get("SYSLOG_IDENTIFIER"), "npud");
        assert_eq!(get("NPUD_ABI"), "g2");
        assert_eq!(get("NPUD_COUNT"), "3");
        assert!(!buf[..n].contains(&0x1b), "no escape");
    }

    #[test]
    fn names_are_what_the_journal_takes() {
        assert_eq!(journal_name("client_auth"), "NPUD_CLIENT_AUTH");
        assert_eq!(journal_name("a.b-c"), "NPUD_A_B_C");
    }
}
