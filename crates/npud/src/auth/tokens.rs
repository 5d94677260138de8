//! Token identities: each regular file in `auth.token_dir` whose name matches
//! `[A-Za-z0-9._-]+` (no leading dot) holds a secret, one line of 32 to 128 characters from
//! `[A-Za-z0-9_-]`. A caller presents the secret in the `x-npud-token` metadata and is then
//! `token:<file name>@<allocation>`, where the allocation is the first 8 hexadecimal digits of
//! the secret's BLAKE3 hash: a file rewritten with a fresh secret (the device plugin's next
//! Allocate of the same share) is a new identity, with its own sessions, quotas and fault
//! budget, and the previous holder's identity ends. Rules and admins name a file's identities
//! as `token:<file name>@*`.
//!
//! The directory is read by one thread, never by the threads that serve calls: every
//! `auth.token_poll_ms` it checks the directory (see [`token_dir`](super::token_dir): owned
//! by the daemon's uid, no access for others, no symbolic links followed), lists it, reads the
//! files whose stamps changed, and publishes the result as a view. A call's secret is looked up
//! in the view in memory. A secret the view does not hold waits for the next scan that starts
//! after the call arrived (see [`Tokens::fresh`]), so a file written just before a call works
//! and a caller presenting unknown secrets costs nothing but that wait: the directory is
//! scanned once per interval however many calls arrive. A removed or rewritten file stops
//! working within one interval: its identity's calls are refused and its open calls end (see
//! [`Tokens::revoked`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Identity;
use super::Kind;
use crate::config::TokenTransport;
use crate::error::NpudError;
use crate::token_dir::{self, Cached, DirError, valid_secret};

/// The listener a transport identity came from (`None` for a token identity).
fn listener_of(transport: &Identity) -> Option<TokenTransport> {
    match transport.kind() {
        Kind::Uid(_) => Some(TokenTransport::Unix),
        Kind::Cert | Kind::Anonymous => Some(TokenTransport::Tcp),
        Kind::Token => None,
    }
}

/// Refuses a caller without a token on a listener `required` names.
///
/// # Errors
/// UNAUTHENTICATED naming `auth.require_token` and what a caller without a token may do.
pub fn require_token(
    required: &[TokenTransport],
    transport: &Identity,
    has_token: bool,
) -> Result<(), NpudError> {
    let Some(t) = listener_of(transport) else {
        return Ok(());
    };
    if has_token || !required.contains(&t) {
        return Ok(());
    }
    let listed: Vec<String> = required.iter().map(|r| format!("{:?}", r.word())).collect();
    Err(NpudError::Unauthenticated(format!(
        "{transport} presented no identity token (the {} metadata: npuctl --token-file, \
         NPUD_TOKEN_FILE), which auth.require_token = [{}] requires on the {} listener; without \
         one a caller may call only GetDeviceInfo and the health service",
        npu_proto::IDENTITY_TOKEN_HEADER,
        listed.join(", "),
        t.word()
    )))
}

/// What one scan of the directory found.
#[derive(Debug)]
struct View {
    /// File name to what it held, to reuse unchanged files at the next scan.
    files: HashMap<String, Cached>,
    /// Secret to identity (`<file name>@<allocation>`, without `token:`).
    by_secret: HashMap<String, Arc<str>>,
    /// The identities' full names (`token:...`).
    live: HashSet<String>,
    /// When the scan started; `None` before the first.
    started: Option<Instant>,
    /// Why the directory was refused, when it was.
    refused: Option<String>,
    /// Why the last scan could not read the directory, when it could not: the view before it
    /// was kept.
    failed: Option<String>,
    /// Files that define no identity, with why (warned once each).
    skipped: HashMap<String, String>,
    /// Files kept as an earlier scan read them because reading them failed, with the error.
    kept: HashMap<String, String>,
}

impl View {
    fn empty() -> Self {
        Self {
            files: HashMap::new(),
            by_secret: HashMap::new(),
            live: HashSet::new(),
            started: None,
            refused: None,
            failed: None,
            skipped: HashMap::new(),
            kept: HashMap::new(),
        }
    }

    /// This view again, as a scan that could not read the directory publishes it.
    fn kept_after(&self, started: Instant, why: String) -> Self {
        Self {
            files: self.files.clone(),
            by_secret: self.by_secret.clone(),
            live: self.live.clone(),
            started: Some(started),
            refused: self.refused.clone(),
            failed: Some(why),
            skipped: self.skipped.clone(),
            kept: self.kept.clone(),
        }
    }
}

/// The allocation part of a secret's identity.
fn allocation(secret: &str) -> String {
    let h = blake3::hash(secret.as_bytes());
    h.as_bytes()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    uid: u32,
    poll: Duration,
    view: watch::Sender<Arc<View>>,
    scans: AtomicU64,
}

impl Shared {
    /// Scans the directory now and publishes what it found.
    fn scan(&self) {
        let started = Instant::now();
        let old = self.view.borrow().clone();
        let mut view = View {
            started: Some(started),
            ..View::empty()
        };
        let dir = self.dir.display();
        match token_dir::open_dir(&self.dir, self.uid)
            .and_then(|fd| token_dir::scan(&fd, &old.files))
        {
            Ok(found) => {
                view.files = found.files;
                view.skipped = found.skipped;
                view.kept = found.kept;
            }
            Err(DirError::Refused(why)) => view.refused = Some(why),
            Err(DirError::Failed(why)) => {
                // Nothing is known about the files: revoking their identities (and ending
                // their calls) for a shortage of descriptors would hand a caller who can cause
                // one a way to cut everyone off. The view stays until a scan reads the directory.
                if old.failed.as_ref() != Some(&why) {
                    tracing::warn!(
                        dir = %dir,
                        "auth.token_dir could not be read ({why}); the token identities of the \
                         last scan stay until it can"
                    );
                }
                self.scans.fetch_add(1, Ordering::Relaxed);
                self.view
                    .send_replace(Arc::new(old.kept_after(started, why)));
                return;
            }
        }
        if old.failed.is_some() {
            tracing::info!(dir = %dir, "auth.token_dir could be read again");
        }
        for (name, c) in &view.files {
            if let Some(s) = &c.secret {
                let id: Arc<str> = format!("{name}@{}", allocation(s)).into();
                view.live.insert(format!("token:{id}"));
                view.by_secret.insert(s.clone(), id);
            }
        }
        for (name, why) in &view.skipped {
            if old.skipped.get(name) != Some(why) {
                tracing::warn!(dir = %dir, file = %name, "token file skipped: {why}");
            }
        }
        for (name, why) in &view.kept {
            if old.kept.get(name) != Some(why) {
                tracing::warn!(
                    dir = %dir,
                    file = %name,
                    "token file could not be read ({why}); what an earlier scan read of it stays"
                );
            }
        }
        let n = self.scans.fetch_add(1, Ordering::Relaxed) + 1;
        if view.refused != old.refused {
            match &view.refused {
                Some(why) => tracing::error!("{why}; no token identity works until it is fixed"),
                None if old.started.is_some() => {
                    tracing::info!(dir = %dir, "auth.token_dir is usable again");
                }
                None => {}
            }
        }
        for gone in old.live.difference(&view.live) {
            tracing::info!(identity = %gone, "token revoked: its file was removed or rewritten");
        }
        tracing::debug!(
            scan = n,
            files = view.files.len(),
            identities = view.live.len(),
            "token directory scanned"
        );
        self.view.send_replace(Arc::new(view));
    }
}

/// The token directory, as the refresh thread last read it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Tokens {
    shared: Arc<Shared>,
}

impl Tokens {
    /// Token identities from `dir`, which must be owned by `uid` (the daemon's); a thread
    /// scans it at once and then every `poll`, until the last clone is dropped.
    pub fn start(dir: PathBuf, uid: u32, poll: Duration) -> Self {
        let t = Self::new(dir, uid, poll);
        let weak = Arc::downgrade(&t.shared);
        let spawned = std::thread::Builder::new()
            .name("npud-tokens".into())
            .spawn(move || refresh(&weak));
        if let Err(e) = spawned {
            tracing::error!("no thread to read auth.token_dir: {e}; no token identity works");
        }
        t
    }

    /// Without a thread: [`Tokens::scan`] reads the directory.
    fn new(dir: PathBuf, uid: u32, poll: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                dir,
                uid,
                poll,
                view: watch::Sender::new(Arc::new(View::empty())),
                scans: AtomicU64::new(0),
            }),
        }
    }

    /// Scans the directory now, on the calling thread.
    #[cfg(test)]
    fn scan(&self) {
        self.shared.scan();
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// How many scans have run.
    pub fn scans(&self) -> u64 {
        self.shared.scans.load(Ordering::Relaxed)
    }

    /// The full identity name (`token:<file>@<allocation>`) whose file holds `secret` in the
    /// current view.
    pub fn lookup(&self, secret: &str) -> Option<String> {
        self.shared
            .view
            .borrow()
            .by_secret
            .get(secret)
            .map(|id| format!("token:{id}"))
    }

    /// Waits until a scan that started at or after `since` has been published. A secret that
    /// view does not hold was in no file when the call arrived.
    /// (Bounded: a scan that never comes, the refresh thread gone, ends the wait after a few
    /// intervals, and the secret is then looked up in the view there is.)
    pub async fn fresh(&self, since: Instant) {
        let mut rx = self.shared.view.subscribe();
        let wait = async {
            loop {
                if rx.borrow_and_update().started.is_some_and(|s| s >= since) {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        let bound = self.shared.poll * 4 + Duration::from_secs(1);
        let _ = tokio::time::timeout(bound, wait).await;
    }

    /// Resolves once the identity named `name` (`token:...`) is no longer in the view: its
    /// file was removed or rewritten. Never resolves for other identities.
    pub fn revoked(&self, name: &str) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shared.view.subscribe();
        let name = name.to_owned();
        async move {
            loop {
                {
                    let v = rx.borrow_and_update();
                    if v.started.is_some() && !v.live.contains(&name) {
                        return;
                    }
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// The revocations from now on: each scan that no longer holds identities the scan before
    /// it held (their files were removed or rewritten) yields their full names.
    pub fn revocations(&self) -> Revocations {
        let mut rx = self.shared.view.subscribe();
        let live = rx.borrow_and_update().live.clone();
        Revocations { rx, live }
    }

    /// The identity whose file holds `secret`, in the current view.
    ///
    /// # Errors
    /// UNAUTHENTICATED for a malformed secret or one no file holds (saying why the directory
    /// was refused, when it was).
    pub fn resolve(&self, secret: &str) -> Result<Identity, NpudError> {
        let key = npu_proto::IDENTITY_TOKEN_HEADER;
        if !valid_secret(secret) {
            return Err(NpudError::Unauthenticated(format!(
                "{key}: not a token secret (32 to 128 characters from A-Z a-z 0-9 _ -)"
            )));
        }
        let view = self.shared.view.borrow();
        if let Some(id) = view.by_secret.get(secret) {
            return Ok(Identity::token(id));
        }
        Err(NpudError::Unauthenticated(match &view.refused {
            Some(why) => format!("{key}: no token identity works: {why}"),
            None => format!(
                "{key}: unknown secret (no file in auth.token_dir holds it; a token file that \
                 was removed or rewritten no longer works)"
            ),
        }))
    }
}

/// Identities revoked by the token directory's scans (see [`Tokens::revocations`]).
#[derive(Debug)]
pub struct Revocations {
    rx: watch::Receiver<Arc<View>>,
    live: HashSet<String>,
}

impl Revocations {
    /// The full names (`token:...`) the next scan that revokes any no longer holds; `None`
    /// once the refresh thread is gone.
    pub async fn next(&mut self) -> Option<Vec<String>> {
        loop {
            self.rx.changed().await.ok()?;
            let now = self.rx.borrow_and_update().live.clone();
            let gone: Vec<String> = self.live.difference(&now).cloned().collect();
            self.live = now;
            if !gone.is_empty() {
                return Some(gone);
            }
        }
    }
}

/// The refresh thread: a scan, then one every `poll`, while a [`Tokens`] is left.
fn refresh(weak: &Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        shared.scan();
        let poll = shared.poll;
        drop(shared);
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::SystemTime;

    use super::*;

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    /// A temporary directory as the daemon expects one: mode 0700.
    fn tempdir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn tokens(d: &Path) -> Tokens {
        Tokens::new(d.to_path_buf(), me(), Duration::from_secs(3600))
    }

    #[test]
    fn files_define_identities_per_secret_and_stop_working_when_removed_or_rewritten() {
        let d = tempdir();
        let t = tokens(d.path());
        t.scan();
        let secret = "a".repeat(40);
        let e = t.resolve(&secret).unwrap_err();
        assert_eq!(e.code_name(), "UNAUTHENTICATED");
        assert!(e.message().contains("unknown secret"), "{e}");
        std::fs::write(d.path().join("pod-a"), format!("{secret}\n")).unwrap();
        std::fs::write(d.path().join(".hidden"), "b".repeat(40)).unwrap();
        std::fs::write(d.path().join("short"), "c".repeat(31)).unwrap();
        t.scan();
        let a = t.resolve(&secret).unwrap();
        assert_eq!(a.name(), format!("token:pod-a@{}", allocation(&secret)));
        assert_eq!(allocation(&secret).len(), 8);
        assert!(t.resolve(&"b".repeat(40)).is_err());
        assert!(t.resolve(&"c".repeat(31)).is_err());
        // Rewritten with a fresh secret: another identity, and the old one is gone.
        std::fs::write(d.path().join("pod-a"), "d".repeat(40)).unwrap();
        t.scan();
        assert!(t.resolve(&secret).is_err());
        let d2 = t.resolve(&"d".repeat(40)).unwrap();
        assert_ne!(d2, a);
        assert!(d2.name().starts_with("token:pod-a@"), "{d2}");
        std::fs::remove_file(d.path().join("pod-a")).unwrap();
        t.scan();
        assert!(t.resolve(&"d".repeat(40)).is_err());
        assert!(t.resolve("x y").is_err());
    }

    #[test]
    fn a_settled_file_is_trusted_by_its_stamp_and_a_rewrite_of_the_same_size_is_seen() {
        let d = tempdir();
        let path = d.path().join("pod-b");
        std::fs::write(&path, "e".repeat(40)).unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let t = tokens(d.path());
        t.scan();
        assert!(t.resolve(&"e".repeat(40)).is_ok());
        // Rewritten in place with a secret of the same length: the old one stops at the next
        // scan.
        std::fs::write(&path, "f".repeat(40)).unwrap();
        t.scan();
        assert!(t.resolve(&"e".repeat(40)).is_err());
        assert!(t.resolve(&"f".repeat(40)).is_ok());
    }

    #[test]
    fn a_directory_open_to_others_is_refused_at_each_scan_with_the_reason_in_refusals() {
        let d = tempdir();
        std::fs::write(d.path().join("pod-c"), "g".repeat(40)).unwrap();
        let t = tokens(d.path());
        t.scan();
        assert!(t.resolve(&"g".repeat(40)).is_ok());
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        t.scan();
        let e = t.resolve(&"g".repeat(40)).unwrap_err();
        assert!(
            e.message().starts_with(&format!(
                "x-npud-token: no token identity works: auth.token_dir {} is owned by uid {} \
                 with mode 0711; it must be",
                d.path().display(),
                me()
            )),
            "{e}"
        );
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        t.scan();
        assert!(t.resolve(&"g".repeat(40)).is_ok());
    }

    #[tokio::test]
    async fn unknown_secrets_wait_for_one_scan_per_interval_however_many_arrive() {
        let d = tempdir();
        for i in 0..64 {
            std::fs::write(d.path().join(format!("pod-{i}")), "h".repeat(40 + i)).unwrap();
        }
        let t = Tokens::start(d.path().to_path_buf(), me(), Duration::from_millis(200));
        t.fresh(Instant::now()).await;
        let before = t.scans();
        let mut waits = Vec::new();
        for _ in 0..1000 {
            let t = t.clone();
            waits.push(tokio::spawn(async move {
                let since = Instant::now();
                if t.lookup(&"u".repeat(40)).is_none() {
                    t.fresh(since).await;
                }
                t.resolve(&"u".repeat(40)).is_err()
            }));
        }
        for w in waits {
            assert!(w.await.unwrap());
        }
        // 1000 unknown secrets, all waiting for the scan after their arrival: one or two
        // scans (one more if the burst spans a poll), not one per call.
        let scans = t.scans() - before;
        assert!(
            (1..=3).contains(&scans),
            "{scans} scans for 1000 unknown secrets"
        );
    }

    #[tokio::test]
    async fn revocation_resolves_when_the_file_goes_and_not_before() {
        let d = tempdir();
        std::fs::write(d.path().join("pod-r"), "r".repeat(40)).unwrap();
        let t = tokens(d.path());
        t.scan();
        let name = t.lookup(&"r".repeat(40)).unwrap();
        let mut revoked = Box::pin(t.revoked(&name));
        t.scan();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut revoked)
                .await
                .is_err()
        );
        std::fs::write(d.path().join("pod-r"), "s".repeat(40)).unwrap();
        t.scan();
        tokio::time::timeout(Duration::from_secs(5), revoked)
            .await
            .expect("revoked once rewritten");
    }

    #[tokio::test]
    async fn a_scan_that_cannot_read_the_directory_revokes_nothing() {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let d = tempdir();
        std::fs::write(d.path().join("pod-m"), "m".repeat(40)).unwrap();
        let t = tokens(d.path());
        t.scan();
        let name = t.lookup(&"m".repeat(40)).unwrap();
        let mut revoked = Box::pin(t.revoked(&name));
        // Out of descriptors (a caller holding every connection it may can cause this): the
        // scan fails, and the view it had stays.
        let limit = getrlimit(Resource::Nofile);
        let mut low = limit;
        low.current = Some(512);
        setrlimit(Resource::Nofile, low).unwrap();
        let mut held = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            held.push(f);
        }
        t.scan();
        drop(held);
        setrlimit(Resource::Nofile, limit).unwrap();
        assert_eq!(t.lookup(&"m".repeat(40)).as_deref(), Some(name.as_str()));
        assert!(
            t.shared
                .view
                .borrow()
                .failed
                .as_deref()
                .is_some_and(|w| w.contains("Too many")),
            "{:?}",
            t.shared.view.borrow().failed
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut revoked)
                .await
                .is_err(),
            "revoked by a scan that read nothing"
        );
        t.scan();
        assert!(t.shared.view.borrow().failed.is_none());
        assert!(t.resolve(&"m".repeat(40)).is_ok());
    }

    #[test]
    fn without_a_token_a_listener_that_requires_one_is_refused_naming_the_key() {
        let unix = Identity::uid(0, [0]);
        let tcp = Identity::anonymous("127.0.0.1".parse().ok());
        let req = [TokenTransport::Unix];
        let e = require_token(&req, &unix, false).unwrap_err();
        assert_eq!(e.code_name(), "UNAUTHENTICATED");
        assert_eq!(
            e.message(),
            "uid:0 presented no identity token (the x-npud-token metadata: npuctl \
             --token-file, NPUD_TOKEN_FILE), which auth.require_token = [\"unix\"] requires on \
             the unix listener; without one a caller may call only GetDeviceInfo and the health \
             service"
        );
        require_token(&req, &unix, true).unwrap();
        require_token(&req, &tcp, false).unwrap();
        require_token(&[], &unix, false).unwrap();
        assert!(require_token(&[TokenTransport::Tcp], &tcp, false).is_err());
    }
}
