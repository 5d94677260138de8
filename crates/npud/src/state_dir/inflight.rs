//! The in-flight record: which programs are on the device right now, so that a daemon killed by
//! its runtime in the middle of a dispatch (some ROCR releases `abort()` from the queue's error
//! path) knows at its next start which programs to quarantine.
//!
//! The executor writes the record before it rings a doorbell (a dispatch, or one batch of a
//! chain: every distinct program of the batch; other sessions' work may run between two
//! batches of a chain), and clears it after the doorbell returns. Once the file is reset at
//! start (preallocated and synced), it is mapped `MAP_SHARED` and both writes are stores into
//! the mapping, which is the file's page cache: two `pwrite`s cost more than the emulator's
//! whole dispatch. There is no `fsync`: the page cache outlives the process, so a process that
//! aborts leaves the record for its successor; only a crash of the whole machine loses it (and
//! the next start then finds an older or an empty record). The mapping relies on nothing
//! truncating the file under the daemon: it lives in the daemon's own state directory (0700),
//! so only the daemon's user or root could, and either can kill the daemon anyway.
//!
//! `state/inflight` is a preallocated file of [`FILE_BYTES`] bytes, little-endian:
//!
//! | offset | bytes | |
//! |---|---|---|
//! | 0 | 8 | magic `NPUDINF1` |
//! | 8 | 4 | count of programs in flight; 0 when nothing runs |
//! | 12 | 4 | the first 4 bytes of blake3 over the entries (a torn write does not match) |
//! | 16 | … | `count` entries: the content hash (64 hex bytes), a name length (1 byte), the name |

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::StateError;
use super::suspects::Suspects;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "inflight";

/// The file's size: room for 32 programs (the most a work item can have loaded at once) with
/// 128-byte names.
pub const FILE_BYTES: usize = 8192;

const MAGIC: &[u8; 8] = b"NPUDINF1";
const HEADER: usize = 16;
const HASH_BYTES: usize = 64;

/// A program in flight: its content hash and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightProgram {
    pub content_hash: String,
    pub name: String,
}

/// The open record, owned by the executor.
#[derive(Debug)]
pub struct InFlight {
    file: File,
    path: PathBuf,
    /// Reused for every write, so recording allocates nothing.
    buf: Vec<u8>,
    /// Whether a write failed (logged once, not per dispatch).
    failed: bool,
    /// The file, mapped once [`InFlight::reset`] has preallocated it.
    map: Option<npu_fd::mapping::Mapping>,
    /// The checksum and the entries (from offset 16) last written: a batch of the same
    /// programs as the last writes its 8-byte header only.
    written: Vec<u8>,
    /// Programs on the device when a daemon died once ([`super::suspects`]); a batch of theirs
    /// that completes clears them.
    suspects: Option<Suspects>,
    /// The suspects in the batch recorded last (empty when there are none: the common case
    /// costs one check of an empty list per batch).
    running_suspects: Vec<String>,
}

impl InFlight {
    /// Opens (creating, mode 0600) `state/inflight` and returns what it holds: the programs
    /// that were on the device when the previous daemon stopped, if it died during a dispatch.
    /// The record is left as it is until [`InFlight::reset`], so that the caller can quarantine
    /// them durably first.
    ///
    /// # Errors
    /// [`StateError::Io`] when the file cannot be opened or read. A record that does not parse
    /// (a torn write after a machine crash, another program's file) is logged and treated as
    /// empty: it cannot say which programs ran.
    pub fn open(state: &Path) -> Result<(Self, Vec<InFlightProgram>), StateError> {
        let path = state.join(FILE_NAME);
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| StateError::io("opening", &path, e))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| StateError::io("reading", &path, e))?;
        let left = match parse(&bytes) {
            Ok(v) => v,
            Err(why) => {
                tracing::warn!(
                    file = %path.display(),
                    "the in-flight record is unreadable ({why}); treating it as empty"
                );
                Vec::new()
            }
        };
        Ok((
            Self {
                file,
                path,
                buf: Vec::with_capacity(FILE_BYTES - 8),
                failed: false,
                map: None,
                written: Vec::new(),
                suspects: None,
                running_suspects: Vec::new(),
            },
            left,
        ))
    }

    /// What the record in `state` holds now, without opening it for writing: for tools and
    /// tests that watch a running daemon.
    ///
    /// # Errors
    /// [`StateError::Io`] when the file cannot be read; a record that does not parse is an
    /// `InvalidData` error with the reason.
    pub fn peek(state: &Path) -> Result<Vec<InFlightProgram>, StateError> {
        let path = state.join(FILE_NAME);
        let bytes = std::fs::read(&path).map_err(|e| StateError::io("reading", &path, e))?;
        parse(&bytes).map_err(|why| {
            StateError::io(
                "parsing",
                &path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, why),
            )
        })
    }

    /// Writes an empty record over the whole file (preallocating it) and syncs it: done once
    /// at start, after the programs it held were quarantined.
    ///
    /// # Errors
    /// [`StateError::Io`] when the write or the sync fails.
    pub fn reset(&mut self) -> Result<(), StateError> {
        let mut empty = vec![0u8; FILE_BYTES];
        empty[..MAGIC.len()].copy_from_slice(MAGIC);
        self.map = None;
        self.written.clear();
        self.file
            .write_all_at(&empty, 0)
            .and_then(|()| self.file.set_len(FILE_BYTES as u64))
            .and_then(|()| self.file.sync_all())
            .map_err(|e| StateError::io("writing", &self.path, e))?;
        match npu_fd::mapping::Mapping::new(self.file.as_fd(), 0, FILE_BYTES) {
            Ok(m) => self.map = Some(m),
            Err(e) => tracing::warn!(
                file = %self.path.display(),
                error = %e,
                "mapping the in-flight record failed; it is written with pwrite"
            ),
        }
        Ok(())
    }

    /// Hands the record the suspects the start found, so that a completed batch of one of
    /// them clears it ([`InFlight::completed`]).
    pub fn set_suspects(&mut self, suspects: Suspects) {
        self.suspects = Some(suspects);
    }

    /// Whether `hash` is a suspect.
    pub fn is_suspect(&self, hash: &str) -> bool {
        self.suspects.as_ref().is_some_and(|s| s.contains(hash))
    }

    /// Records `programs` as on the device: stores into the mapping (or one `pwrite`), no sync.
    pub fn begin<'a>(&mut self, programs: impl IntoIterator<Item = (&'a str, &'a str)>) {
        self.running_suspects.clear();
        match self.suspects.as_ref().filter(|s| !s.is_empty()) {
            None => encode_entries(&mut self.buf, programs),
            Some(suspects) => {
                let running = &mut self.running_suspects;
                encode_entries(
                    &mut self.buf,
                    programs.into_iter().inspect(|(hash, _)| {
                        if suspects.contains(hash) {
                            running.push((*hash).to_owned());
                        }
                    }),
                );
            }
        }
        // A batch of the programs of the last one (the common case: a client dispatching one
        // program again and again) reuses its checksum and leaves its entries in place.
        let same = self.written.get(4..) == Some(&self.buf[8..]);
        if same {
            self.buf[4..8].copy_from_slice(&self.written[..4]);
        } else {
            let sum = checksum(&self.buf[8..]);
            self.buf[4..8].copy_from_slice(&sum);
        }
        let r = match self.map.as_mut() {
            Some(m) => {
                // Entries first, then the count and checksum that make them the record: a
                // process that dies between the two leaves a record whose checksum fails.
                let r = if same {
                    Ok(())
                } else {
                    m.copy_from_slice(16, &self.buf[8..])
                };
                r.and_then(|()| m.copy_from_slice(8, &self.buf[..8]))
                    .map_err(std::io::Error::other)
            }
            None => self.file.write_all_at(&self.buf, 8),
        };
        if !same {
            self.written.clear();
            self.written.extend_from_slice(&self.buf[4..8]);
            self.written.extend_from_slice(&self.buf[8..]);
        }
        self.check(r);
    }

    /// The batch recorded last completed: its programs are no longer suspects (the suspects
    /// file is rewritten, durably, only when one of them was).
    pub fn completed(&mut self) {
        if self.running_suspects.is_empty() {
            return;
        }
        let running = std::mem::take(&mut self.running_suspects);
        if let Some(s) = self.suspects.as_mut() {
            s.cleared(running.iter().map(String::as_str));
        }
    }

    /// Records that nothing is on the device: a zero count (4 bytes).
    pub fn end(&mut self) {
        let r = match self.map.as_mut() {
            Some(m) => m.copy_from_slice(8, &[0; 4]).map_err(std::io::Error::other),
            None => self.file.write_all_at(&[0; 4], 8),
        };
        self.check(r);
    }

    fn check(&mut self, r: std::io::Result<()>) {
        match r {
            Ok(()) => self.failed = false,
            Err(e) if !self.failed => {
                self.failed = true;
                tracing::error!(
                    file = %self.path.display(),
                    error = %e,
                    "writing the in-flight record failed; if the runtime kills the daemon during \
                     a dispatch now, the next start cannot tell which program to quarantine"
                );
            }
            Err(_) => {}
        }
    }
}

/// The record from offset 8 on: count, checksum, entries. Names are cut to fit the file.
#[cfg(test)]
fn encode<'a>(buf: &mut Vec<u8>, programs: impl IntoIterator<Item = (&'a str, &'a str)>) {
    encode_entries(buf, programs);
    let sum = checksum(&buf[8..]);
    buf[4..8].copy_from_slice(&sum);
}

/// [`encode`] without the checksum (left zero).
fn encode_entries<'a>(buf: &mut Vec<u8>, programs: impl IntoIterator<Item = (&'a str, &'a str)>) {
    buf.clear();
    buf.extend_from_slice(&[0; 8]);
    let mut count: u32 = 0;
    for (hash, name) in programs {
        let room = FILE_BYTES - 8 - buf.len();
        if room < HASH_BYTES + 1 || hash.len() != HASH_BYTES {
            break;
        }
        let name = truncate(name, (room - HASH_BYTES - 1).min(usize::from(u8::MAX)));
        buf.extend_from_slice(hash.as_bytes());
        buf.push(u8::try_from(name.len()).unwrap_or(0));
        buf.extend_from_slice(name.as_bytes());
        count += 1;
    }
    buf[..4].copy_from_slice(&count.to_le_bytes());
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn checksum(entries: &[u8]) -> [u8; 4] {
    let h = blake3::hash(entries);
    let mut out = [0; 4];
    out.copy_from_slice(&h.as_bytes()[..4]);
    out
}

/// The programs a record holds.
///
/// # Errors
/// What is wrong with it.
fn parse(bytes: &[u8]) -> Result<Vec<InFlightProgram>, String> {
    if bytes.iter().all(|b| *b == 0) {
        return Ok(Vec::new()); // a new file
    }
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err("no NPUDINF1 header".into());
    }
    let count = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut at = HEADER;
    let mut out = Vec::new();
    for k in 0..count {
        let short = || format!("entry {k} of {count} runs past the end");
        let hash = bytes.get(at..at + HASH_BYTES).ok_or_else(short)?;
        let len = usize::from(*bytes.get(at + HASH_BYTES).ok_or_else(short)?);
        let name_at = at + HASH_BYTES + 1;
        let name = bytes.get(name_at..name_at + len).ok_or_else(short)?;
        let hash = std::str::from_utf8(hash)
            .ok()
            .filter(|h| super::quarantine::is_hash(h))
            .ok_or_else(|| format!("entry {k}: not a content hash"))?;
        out.push(InFlightProgram {
            content_hash: hash.to_owned(),
            name: String::from_utf8_lossy(name).into_owned(),
        });
        at = name_at + len;
    }
    if bytes[12..16] != checksum(&bytes[HEADER..at]) {
        return Err("the checksum does not match (a torn write)".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn open(dir: &Path) -> (InFlight, Vec<InFlightProgram>) {
        InFlight::open(dir).unwrap()
    }

    #[test]
    fn a_record_left_by_a_dead_daemon_is_read_back_and_reset_clears_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, left) = open(dir.path());
        assert!(left.is_empty());
        r.reset().unwrap();
        r.begin([(A, "vsa"), (B, "")]);
        drop(r); // the process dies with the doorbell ringing
        let (mut r, left) = open(dir.path());
        assert_eq!(
            left,
            vec![
                InFlightProgram {
                    content_hash: A.into(),
                    name: "vsa".into()
                },
                InFlightProgram {
                    content_hash: B.into(),
                    name: String::new()
                },
            ]
        );
        r.reset().unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len(),
            FILE_BYTES as u64
        );
        assert!(open(dir.path()).1.is_empty());
    }

    #[test]
    fn end_clears_what_begin_wrote_and_a_shorter_record_ignores_a_longer_ones_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, _) = open(dir.path());
        r.reset().unwrap();
        r.begin([(A, "a long name for the first record"), (B, "b")]);
        r.end();
        assert!(open(dir.path()).1.is_empty());
        r.begin([(B, "b")]);
        let left = open(dir.path()).1;
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].content_hash, B);
    }

    #[test]
    fn a_batch_of_the_last_batchs_programs_is_recorded_again_after_end() {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, _) = open(dir.path());
        r.reset().unwrap();
        for _ in 0..3 {
            r.begin([(A, "a")]);
            let left = open(dir.path()).1;
            assert_eq!(left.len(), 1);
            assert_eq!(left[0].content_hash, A);
            r.end();
            assert!(open(dir.path()).1.is_empty());
        }
        r.begin([(B, "b")]);
        assert_eq!(open(dir.path()).1[0].content_hash, B);
        r.begin([(A, "a")]);
        assert_eq!(open(dir.path()).1[0].content_hash, A);
    }

    #[test]
    fn a_torn_or_foreign_record_is_empty_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let (mut r, _) = open(dir.path());
        r.reset().unwrap();
        r.begin([(A, "vsa")]);
        // Flip one byte of the entry: the checksum no longer matches.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER + 3] = b'b';
        std::fs::write(&path, &bytes).unwrap();
        assert!(open(dir.path()).1.is_empty());
        assert!(parse(&bytes).unwrap_err().contains("checksum"));
        std::fs::write(&path, b"something else entirely").unwrap();
        assert!(open(dir.path()).1.is_empty());
        // A count that runs past the end.
        let mut bytes = vec![0u8; 32];
        bytes[..8].copy_from_slice(MAGIC);
        bytes[8] = 9;
        assert!(parse(&bytes).unwrap_err().contains("past the end"));
    }

    #[test]
    fn thirty_two_programs_with_long_names_fit() {
        let mut buf = Vec::new();
        let name = "n".repeat(128);
        let hashes: Vec<String> = (0..32).map(|i| format!("{i:064x}")).collect();
        encode(&mut buf, hashes.iter().map(|h| (h.as_str(), name.as_str())));
        assert!(8 + buf.len() <= FILE_BYTES);
        let mut file = vec![0u8; FILE_BYTES];
        file[..8].copy_from_slice(MAGIC);
        file[8..8 + buf.len()].copy_from_slice(&buf);
        let back = parse(&file).unwrap();
        assert_eq!(back.len(), 32);
        assert_eq!(back[31].content_hash, hashes[31]);
        assert_eq!(back[31].name, name);
    }
}
