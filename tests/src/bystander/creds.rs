//! Connections made as another local user or from another network namespace, without another
//! process: a thread of this process takes the uid (and the network namespace) before it
//! creates the sockets. Linux keeps credentials and namespaces per thread, and a socket keeps
//! the ones of the thread that created it (`SO_PEERCRED` and `/proc/net/tcp`'s uid are read
//! from them; a socket belongs to the namespace it was made in), so the daemon sees what
//! `setpriv --reuid=N --regid=N --clear-groups` or `ip netns exec` would have given it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::Path;

use rustix::process::{Gid, Uid};

/// Who a thread connects as: a uid (its gid the same, no supplementary groups) and a network
/// namespace (`ip netns` name); `None` keeps this process's.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub uid: Option<u32>,
    pub netns: Option<String>,
}

impl Caller {
    /// User `uid` in this process's namespace.
    pub fn user(uid: u32) -> Caller {
        Caller {
            uid: Some(uid),
            netns: None,
        }
    }

    /// This process's user in namespace `ns`.
    pub fn in_netns(ns: &str) -> Caller {
        Caller {
            uid: None,
            netns: Some(ns.to_owned()),
        }
    }

    /// Runs `f` on a thread of its own that has become this caller, and returns what it
    /// returned.
    ///
    /// # Panics
    /// When the thread cannot become it (not root, no such namespace), or `f` panics.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let me = self.clone();
        std::thread::spawn(move || {
            if let Some(ns) = &me.netns {
                let f = std::fs::File::open(Path::new("/run/netns").join(ns))
                    .unwrap_or_else(|e| panic!("/run/netns/{ns}: {e}"));
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&f),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap_or_else(|e| panic!("setns into {ns}: {e}"));
            }
            if let Some(uid) = me.uid {
                let (u, g) = (Uid::from_raw(uid), Gid::from_raw(uid));
                rustix::thread::set_thread_groups(&[])
                    .unwrap_or_else(|e| panic!("setgroups for uid {uid}: {e}"));
                rustix::thread::set_thread_res_gid(g, g, g)
                    .unwrap_or_else(|e| panic!("setresgid {uid}: {e}"));
                rustix::thread::set_thread_res_uid(u, u, u)
                    .unwrap_or_else(|e| panic!("setresuid {uid}: {e}"));
            }
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// `n` TCP connections to `to` from `from` (any address when `None`), made as this
    /// caller. Blocking.
    pub fn tcp(
        &self,
        from: Option<IpAddr>,
        to: SocketAddr,
        n: usize,
    ) -> Vec<io::Result<std::net::TcpStream>> {
        self.run(move || {
            (0..n)
                .map(|_| tcp_from(from.map(|a| SocketAddr::new(a, 0)), to))
                .collect()
        })
    }

    /// `n` connections to the Unix socket at `path`, made as this caller. Blocking.
    pub fn unix(&self, path: &Path, n: usize) -> Vec<io::Result<UnixStream>> {
        let path = path.to_path_buf();
        self.run(move || (0..n).map(|_| UnixStream::connect(&path)).collect())
    }
}

/// A TCP connection to `to`, bound to `from` first when given (port 0: any).
pub fn tcp_from(from: Option<SocketAddr>, to: SocketAddr) -> io::Result<std::net::TcpStream> {
    let Some(from) = from else {
        return std::net::TcpStream::connect(to);
    };
    let family = if to.is_ipv4() {
        rustix::net::AddressFamily::INET
    } else {
        rustix::net::AddressFamily::INET6
    };
    let fd = rustix::net::socket(family, rustix::net::SocketType::STREAM, None)?;
    rustix::net::bind(&fd, &from)?;
    rustix::net::connect(&fd, &to)?;
    Ok(std::net::TcpStream::from(fd))
}

/// A blocking std stream as a tokio one (call within a runtime).
///
/// # Panics
/// When the stream cannot be made non-blocking or registered.
pub fn tokio_tcp(s: std::net::TcpStream) -> tokio::net::TcpStream {
    s.set_nonblocking(true).expect("a non-blocking socket");
    tokio::net::TcpStream::from_std(s).expect("a tokio stream")
}

/// A blocking std Unix stream as a tokio one (call within a runtime).
///
/// # Panics
/// As [`tokio_tcp`].
pub fn tokio_unix(s: UnixStream) -> tokio::net::UnixStream {
    s.set_nonblocking(true).expect("a non-blocking socket");
    tokio::net::UnixStream::from_std(s).expect("a tokio stream")
}

/// Raises this process's `RLIMIT_NOFILE` towards `want` (the hard limit too, as root), so that
/// it and the daemons it starts may hold that many descriptors. Best effort.
pub fn raise_nofile(want: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current.is_none_or(|c| c >= want) {
        return;
    }
    let max = now.maximum;
    let raised = Rlimit {
        current: Some(want),
        maximum: Some(max.map_or(want, |m| m.max(want))),
    };
    if setrlimit(Resource::Nofile, raised).is_err() {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: max.map(|m| m.min(want)),
                maximum: max,
            },
        );
    }
}

/// Whether this process runs as root (which the tests that connect as other users need).
pub fn root() -> bool {
    rustix::process::geteuid().is_root()
}
