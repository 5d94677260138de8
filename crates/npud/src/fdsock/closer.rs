//! Closing what clients send, off the threads that serve everyone.
//!
//! The last close of an fd can block for as long as whoever made it wants: a TCP socket with
//! `SO_LINGER` and unsent data waits for the data to drain or the linger to pass, a file on a
//! FUSE mount waits for the mount's server (the client itself) to answer its FLUSH. So every fd
//! a client sends that the daemon does not keep, and every fd-socket connection that may still
//! hold some in its receive queue, is closed by a [`Closer`] on a blocking thread, never on an
//! I/O thread.
//!
//! Closes are bounded so that a client's blocked closes cost that client: at most
//! [`PER_PEER`] at once for one uid and [`MOST`] in all (far below tokio's 512 blocking
//! threads, which imports and other blocking work share). A connection waits for its own close
//! to finish before it reads another frame ([`Closer::close`]), so it has one close at a time,
//! and a uid whose closes are stuck stops being read on its other connections once it has
//! [`PER_PEER`] of them; other uids' closes go on.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Semaphore;

/// Closes one uid may have in progress at once.
pub const PER_PEER: usize = 4;
/// Closes in progress at once, all uids together.
pub const MOST: usize = 64;

/// Closes fds a client sent on blocking threads, bounded per uid and in all. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Closer(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    all: Arc<Semaphore>,
    peers: Mutex<HashMap<u32, Arc<Semaphore>>>,
    /// Closes started and not finished.
    closing: AtomicUsize,
}

impl Default for Closer {
    fn default() -> Self {
        Closer(Arc::new(Inner {
            all: Arc::new(Semaphore::new(MOST)),
            peers: Mutex::new(HashMap::new()),
            closing: AtomicUsize::new(0),
        }))
    }
}

impl Closer {
    /// Closes `fds` (sent by, or belonging to a connection of, `uid`) on a blocking thread,
    /// and waits until they are closed. Dropping the future before then still closes them
    /// off the async threads ([`Closing`]).
    pub async fn close(&self, uid: u32, fds: Vec<OwnedFd>) {
        if fds.is_empty() {
            return;
        }
        let fds = Closing(fds);
        let peer = self.peer(uid);
        let Ok(mine) = peer.clone().acquire_owned().await else {
            return;
        };
        let Ok(all) = self.0.all.clone().acquire_owned().await else {
            return;
        };
        let inner = self.0.clone();
        let mut fds = fds;
        let fds = std::mem::take(&mut fds.0);
        inner.closing.fetch_add(1, Ordering::SeqCst);
        let task = tokio::task::spawn_blocking(move || {
            drop(fds);
            inner.closing.fetch_sub(1, Ordering::SeqCst);
            // The places are given back once the close has finished, however long the waiter
            // waited.
            drop((mine, all));
        });
        let _ = task.await;
        self.forget_idle(uid, &peer);
    }

    /// Closes in progress.
    pub fn in_progress(&self) -> usize {
        self.0.closing.load(Ordering::SeqCst)
    }

    fn peer(&self, uid: u32) -> Arc<Semaphore> {
        self.0
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(uid)
            .or_insert_with(|| Arc::new(Semaphore::new(PER_PEER)))
            .clone()
    }

    /// Drops `uid`'s entry once nobody holds or waits for its places (the map holds one uid per
    /// client with closes in progress, not every uid ever seen).
    fn forget_idle(&self, uid: u32, peer: &Arc<Semaphore>) {
        let mut g = self.0.peers.lock().unwrap_or_else(PoisonError::into_inner);
        // Two references: the map's and `peer`.
        if Arc::strong_count(peer) == 2 && peer.available_permits() == PER_PEER {
            g.remove(&uid);
        }
    }
}

/// Fds on their way to be closed: dropped, they are handed to a blocking thread (without
/// waiting, and outside the bounds, which only a future dropped mid-wait reaches), or closed on
/// the spot once the runtime is gone.
#[derive(Debug, Default)]
pub struct Closing(pub Vec<OwnedFd>);

impl Drop for Closing {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let fds = std::mem::take(&mut self.0);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || drop(fds));
            }
            Err(_) => drop(fds),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A pipe's read end and its write end.
    fn pipe() -> (OwnedFd, OwnedFd) {
        let (r, w) = std::io::pipe().expect("pipe");
        (OwnedFd::from(r), OwnedFd::from(w))
    }

    fn closed(r: &OwnedFd) -> bool {
        rustix::io::ioctl_fionbio(r, true).expect("non-blocking");
        let mut b = [0_u8; 1];
        matches!(rustix::io::read(r, &mut b), Ok(0))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn fds_are_closed_before_close_returns_and_idle_uids_are_forgotten() {
        let c = Closer::default();
        let (r, w) = pipe();
        c.close(1000, vec![w]).await;
        assert!(closed(&r));
        assert_eq!(c.in_progress(), 0);
        assert!(c.0.peers.lock().unwrap().is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_future_dropped_before_its_turn_still_closes_its_fds() {
        let c = Closer::default();
        // Every place of uid 7 taken: the next close waits.
        let held: Vec<_> = (0..PER_PEER)
            .map(|_| c.peer(7).try_acquire_owned().expect("a place"))
            .collect();
        let (r, w) = pipe();
        let waiting = tokio::time::timeout(Duration::from_millis(20), c.close(7, vec![w])).await;
        assert!(waiting.is_err(), "uid 7 had no place left");
        // The dropped future handed the fd to a blocking thread.
        for _ in 0..500 {
            if closed(&r) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(closed(&r));
        // Another uid was not held up.
        let (r2, w2) = pipe();
        c.close(8, vec![w2]).await;
        assert!(closed(&r2));
        drop(held);
    }
}
