//! Hosts as network namespaces for the fleet tests: one namespace holds a bridge (the
//! switch), every other one a veth into it with an address of `10.250.0.0/24`; a namespace can
//! run dnsmasq and another can resolve through it (`/etc/netns/NAME/resolv.conf`, which
//! `ip netns exec` mounts over `/etc/resolv.conf`). Links go down and up, get slow (a `tc`
//! token bucket on the switch's side and the host's, so both ways) and lossy (iptables drops a
//! share of the host's packets).
//!
//! Names are unique per run (`npf<pid>x<n>-<role>`). [`Net`]'s drop kills every process left
//! in its namespaces and deletes them and their `/etc/netns` directories, also when a test
//! panics; [`Net::create`] first removes what a run that was killed left behind (namespaces of
//! a process that no longer exists). Every command is bounded.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The prefix of every namespace these tests make.
const PREFIX: &str = "npf";
/// The network every host is on.
pub const SUBNET: [u8; 3] = [10, 250, 0];
const SWITCH: &str = "br0";

/// Whether this machine can run the namespace tests: `Err` says what is missing.
///
/// # Errors
/// Not root, or no `ip`, `tc`, `iptables` or `dnsmasq`.
pub fn available() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("needs root".into());
    }
    for tool in ["ip", "tc", "iptables", "dnsmasq"] {
        if which(tool).is_none() {
            return Err(format!("needs {tool} on PATH"));
        }
    }
    Ok(())
}

/// The path of `tool` on `PATH` (or in /usr/sbin, /sbin).
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// An address on the test network.
pub fn ip(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], host)
}

/// Runs `cmd` to completion within 20 s, with its output, whether or not it succeeds.
///
/// # Panics
/// When it cannot start or takes longer.
pub fn run_status(cmd: &mut Command) -> Output {
    crate::container::run_within(cmd, Duration::from_secs(20))
}

/// Runs `cmd` to completion within 20 s.
///
/// # Panics
/// When it cannot start, fails, or takes longer.
pub fn run(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    let out = run_status(cmd);
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ip_cmd(args: &[&str]) -> Output {
    run(Command::new("ip").args(args))
}

/// A switch namespace and the hosts plugged into it.
#[derive(Debug)]
pub struct Net {
    tag: String,
    namespaces: Vec<String>,
    children: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Net {
    /// A switch (a bridge in a namespace of its own) with nothing plugged in.
    ///
    /// # Panics
    /// When a namespace or the bridge cannot be made.
    pub fn create() -> Net {
        static RUNS: AtomicU32 = AtomicU32::new(0);
        sweep();
        let tag = format!(
            "{PREFIX}{}x{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::Builder::new()
            .prefix("npud-net")
            .tempdir_in("/tmp")
            .expect("a temporary directory");
        let mut net = Net {
            tag,
            namespaces: Vec::new(),
            children: Vec::new(),
            dir,
        };
        let sw = net.namespace("sw");
        ip_cmd(&["-n", &sw, "link", "add", SWITCH, "type", "bridge"]);
        ip_cmd(&["-n", &sw, "link", "set", SWITCH, "up"]);
        net
    }

    /// The namespace name of `role`.
    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.tag)
    }

    /// A scratch directory that lives as long as the network.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn namespace(&mut self, role: &str) -> String {
        let ns = self.ns(role);
        ip_cmd(&["netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        ip_cmd(&["-n", &ns, "link", "set", "lo", "up"]);
        ns
    }

    /// A host `role` at `10.250.0.<host>`, plugged into the switch (its port is named `role`).
    ///
    /// # Panics
    /// When a command fails.
    pub fn host(&mut self, role: &str, host: u8) -> String {
        let ns = self.namespace(role);
        let sw = self.ns("sw");
        ip_cmd(&[
            "-n", &sw, "link", "add", role, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        ip_cmd(&["-n", &sw, "link", "set", role, "master", SWITCH, "up"]);
        let addr = format!("{}/24", ip(host));
        ip_cmd(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
        ip_cmd(&["-n", &ns, "link", "set", "eth0", "up"]);
        ns
    }

    /// Runs dnsmasq in host `role`'s namespace, answering each name with its addresses (one A
    /// record each) and nothing else; `resolvers` get it as their only name server.
    ///
    /// # Panics
    /// When it does not start or a resolver's namespace does not see the names within 20 s.
    pub fn dns(&mut self, role: &str, host: u8, names: &[(&str, &[Ipv4Addr])], resolvers: &[&str]) {
        let hosts = self.dir.path().join("hosts");
        let mut text = String::new();
        for (name, ips) in names {
            for a in *ips {
                text.push_str(&format!("{a} {name}\n"));
            }
        }
        std::fs::write(&hosts, text).expect("the hosts file");
        let log = std::fs::File::create(self.dir.path().join("dnsmasq.log")).expect("a log file");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(role)])
            .arg(which("dnsmasq").expect("dnsmasq"))
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-hosts",
                "--no-resolv",
                "--bind-interfaces",
                "--user=root",
                "--pid-file=",
                "--log-queries",
                "--log-facility=-",
                "--local-ttl=0",
            ])
            .arg(format!("--listen-address={}", ip(host)))
            .arg(format!("--addn-hosts={}", hosts.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .expect("dnsmasq starts");
        self.children.push(child);
        for r in resolvers {
            let etc = PathBuf::from("/etc/netns").join(self.ns(r));
            std::fs::create_dir_all(&etc).expect("/etc/netns/NAME");
            std::fs::write(
                etc.join("resolv.conf"),
                format!("nameserver {}\noptions timeout:1 attempts:2\n", ip(host)),
            )
            .expect("resolv.conf");
            for (name, ips) in names {
                self.wait_resolves(r, name, ips.len());
            }
        }
    }

    /// Waits until `name` resolves to `count` addresses in `role`'s namespace (getent, the
    /// system resolver's path).
    fn wait_resolves(&self, role: &str, name: &str, count: usize) {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let out = run(Command::new("ip")
                .args(["netns", "exec", &self.ns(role), "sh", "-c"])
                .arg(format!("getent ahostsv4 {name} || true")));
            let text = String::from_utf8_lossy(&out.stdout);
            let mut seen: Vec<&str> = text
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() == count {
                return;
            }
            assert!(
                Instant::now() < until,
                "{name} does not resolve to {count} addresses in {role}: {text}\ndnsmasq: {}",
                self.dns_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What dnsmasq logged.
    pub fn dns_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dnsmasq.log")).unwrap_or_default()
    }

    /// A command run in `role`'s namespace (its resolv.conf in place).
    pub fn exec(&self, role: &str, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(role)]).arg(program);
        c
    }

    /// Takes `role`'s switch port down (a partition) or up again.
    pub fn link(&self, role: &str, up: bool) {
        let state = if up { "up" } else { "down" };
        ip_cmd(&["-n", &self.ns("sw"), "link", "set", role, state]);
    }

    /// Limits `role`'s link to `rate` (`tc` units, `4mbit`) both ways with a token bucket
    /// whose queue holds up to 10 s of it, so a link slower than its traffic delays every
    /// packet more and more (what a congested or slow link does); `None` removes the limit.
    /// (A token bucket rather than netem: kernels without `sch_netem` have it.)
    pub fn rate(&self, role: &str, rate: Option<&str>) {
        for (ns, dev) in [(self.ns(role), "eth0"), (self.ns("sw"), role)] {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns, "tc", "qdisc"]);
            match rate {
                Some(r) => {
                    c.args(["replace", "dev", dev, "root", "tbf", "rate", r])
                        .args(["burst", "16kbit", "latency", "10s"]);
                }
                None => {
                    c.args(["del", "dev", dev, "root"]);
                }
            }
            run(&mut c);
        }
    }

    /// Drops each packet into and out of `role` with probability `p` (iptables' statistic
    /// match); `None` drops none again.
    pub fn loss(&self, role: &str, p: Option<f64>) {
        let ns = self.ns(role);
        match p {
            Some(p) => {
                for chain in ["INPUT", "OUTPUT"] {
                    run(Command::new("ip")
                        .args(["netns", "exec", &ns, "iptables", "-A", chain])
                        .args(["-m", "statistic", "--mode", "random", "--probability"])
                        .arg(p.to_string())
                        .args(["-j", "DROP"]));
                }
            }
            None => {
                run(Command::new("ip").args(["netns", "exec", &ns, "iptables", "-F"]));
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.namespaces.iter().rev() {
            remove(ns);
        }
    }
}

/// Kills what runs in `ns` and deletes it with its `/etc/netns` directory.
fn remove(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(p) = pid.parse::<i32>()
                && let Some(p) = rustix::process::Pid::from_raw(p)
            {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(ns));
}

/// Removes the namespaces of earlier runs whose process is gone.
fn sweep() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|r| r.split_once('x'))
            .and_then(|(p, _)| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove(name);
        }
    }
}
