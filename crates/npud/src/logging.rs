//! Logging: the configured filter and format to stderr, and hints for what a dependency refuses
//! below the level an operator sees.
//!
//! Where the plain format goes: colour escapes only when stderr is a terminal and `NO_COLOR`
//! is unset or empty (<https://no-color.org>), so a file, a pipe or a container log holds plain
//! text; under systemd (stderr is the journal's stream, [`journald::stderr_is_journal`]) each
//! event goes to the journal as fields instead ([`journald`]). `json` is always JSON on stderr.
//!
//! gRPC C-core clients (grpcio for Python, and Ruby, C++, C#) send a Unix socket's
//! percent-encoded path as the HTTP/2 `:authority` (`%2Frun%2Fnpud%2Fnpud.sock`). h2, under
//! tonic, refuses such a request with `RST_STREAM(PROTOCOL_ERROR)` before any of npud's code
//! sees it, and says why only in a debug event; no server option relaxes it. [`AuthorityHint`]
//! watches for that event whatever the log level and logs, once, a warning that names the fix
//! on the client's side: the channel option `grpc.default_authority`.

use std::fmt;

use tokio::sync::watch;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{Config, LogFormat};

pub mod journald;

/// Where h2 reports a request it refuses as malformed, and what it says about the authority.
const H2_SERVER: &str = "h2::server";
const MALFORMED_AUTHORITY: &str = "malformed authority";

/// The hint logged at the first request refused for its `:authority`.
pub const AUTHORITY_HINT: &str = "a request was refused because its HTTP/2 :authority is not a host name; \
gRPC C-core clients (grpcio, Ruby, C++, C#) send the Unix socket's path there: set the channel \
option grpc.default_authority to \"localhost\" (grpcurl: -authority localhost, before the \
address; grpc-go: grpc.WithAuthority(\"localhost\"))";

/// Installs the global subscriber: `RUST_LOG`, else `log.level`, in `log.format`, to stderr
/// (plain: to the journal when stderr is its stream), with [`AuthorityHint`] beside it. Run
/// [`Hints::log`] on the runtime to log its hint.
pub fn init(cfg: &Config) -> Hints {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cfg.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let journal = match cfg.log.format {
        LogFormat::Plain if journald::stderr_is_journal() => {
            journald::Journald::connect(std::path::Path::new(journald::SOCKET)).ok()
        }
        _ => None,
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ));
    let fmt = match (cfg.log.format, journal) {
        (LogFormat::Plain, Some(j)) => j.boxed(),
        (LogFormat::Plain, None) => fmt.boxed(),
        (LogFormat::Json, _) => fmt.json().boxed(),
    };
    let (hint, hints) = AuthorityHint::new();
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(hint.with_filter(Targets::new().with_target(H2_SERVER, LevelFilter::DEBUG)))
        .init();
    hints
}

/// Whether the plain format colours its output: only on a terminal, and not when `NO_COLOR`
/// holds anything.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// Notes the first request h2 refuses for its `:authority`. A layer cannot log (tracing drops
/// events raised while one is being dispatched), so [`Hints::log`] does.
#[derive(Debug)]
pub struct AuthorityHint {
    refused: watch::Sender<Option<String>>,
}

/// The receiving side of [`AuthorityHint`].
#[derive(Debug)]
pub struct Hints {
    refused: watch::Receiver<Option<String>>,
}

impl AuthorityHint {
    pub fn new() -> (AuthorityHint, Hints) {
        let (tx, rx) = watch::channel(None);
        (AuthorityHint { refused: tx }, Hints { refused: rx })
    }
}

impl Hints {
    /// Waits for the first refused authority and logs [`AUTHORITY_HINT`] with it, once.
    pub async fn log(mut self) {
        let Ok(r) = self.refused.wait_for(Option::is_some).await else {
            return;
        };
        let authority = r.clone().unwrap_or_default();
        drop(r);
        tracing::warn!(authority, "{AUTHORITY_HINT} (logged once)");
    }
}

impl<S: Subscriber> Layer<S> for AuthorityHint {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != H2_SERVER || self.refused.borrow().is_some() {
            return;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let Some(at) = message.0.find(MALFORMED_AUTHORITY) else {
            return;
        };
        // h2's text goes on: ` (b"tmp%2Fnpud.sock"): invalid authority`.
        let refused = message.0[at + MALFORMED_AUTHORITY.len()..]
            .trim_start()
            .split("): ")
            .next()
            .unwrap_or_default()
            .trim_start_matches('(')
            .trim_start_matches("b\"")
            .trim_end_matches('"')
            .to_owned();
        self.refused.send_if_modified(|r| {
            let first = r.is_none();
            if first {
                *r = Some(refused);
            }
            first
        });
    }
}

/// An event's `message` field as text.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How h2 prints the authority: as a `Bytes` (`b"..."`).
    struct B(&'static str);

    impl fmt::Debug for B {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "b\"{}\"", self.0)
        }
    }

    fn refuse(authority: &'static str) {
        tracing::debug!(
            target: "h2::server",
            "malformed headers: malformed authority ({:?}): invalid authority",
            B(authority)
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }

    #[test]
    fn the_first_refused_authority_is_noted_with_its_value_and_other_refusals_are_not() {
        let (hint, hints) = AuthorityHint::new();
        let sub = tracing_subscriber::registry()
            .with(hint.with_filter(Targets::new().with_target(H2_SERVER, LevelFilter::DEBUG)));
        tracing::subscriber::with_default(sub, || {
            tracing::debug!(target: "h2::server", "malformed headers: missing method");
            tracing::debug!(target: "h2::client", "malformed authority (b\"x\"): no");
            assert_eq!(*hints.refused.borrow(), None);
            refuse("tmp%2Fnpud.sock");
            refuse("other");
        });
        assert_eq!(hints.refused.borrow().as_deref(), Some("tmp%2Fnpud.sock"));
    }
}
