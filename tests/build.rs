//! Tells the tests whether `systemd-analyze` is installed, so the unit-file check is reported
//! as ignored, with the reason, rather than passed where it is not; and whether the build runs
//! as root (the tests run as the same user), so the tests that run a client under another uid
//! are reported as ignored elsewhere; and whether a Python 3.11 or newer is installed, so the
//! Python package's suite is reported as ignored, not passed, on a machine without one; and
//! whether Prometheus' `promtool` is installed, so the checks of the metrics text and the alert
//! rules are reported as ignored without it; and whether root, iproute2, iptables and dnsmasq
//! are there for the network-namespace fleet tests, and root, podman, runc, mmdebstrap and
//! objcopy for the container test.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_systemd_analyze)");
    println!("cargo::rustc-check-cfg=cfg(as_root)");
    println!("cargo::rustc-check-cfg=cfg(has_python)");
    println!("cargo::rustc-check-cfg=cfg(has_promtool)");
    println!("cargo::rustc-check-cfg=cfg(has_netns)");
    println!("cargo::rustc-check-cfg=cfg(has_podman)");
    println!("cargo::rerun-if-changed=/usr/bin/promtool");
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    println!("cargo::rerun-if-env-changed=PROMTOOL");
    if std::process::Command::new(&promtool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!("cargo::rustc-cfg=has_promtool");
    }
    println!("cargo::rerun-if-env-changed=PYTHON");
    println!("cargo::rerun-if-env-changed=PATH");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let new_enough = std::process::Command::new(&python)
        .args(["-c", "import sys; sys.exit(sys.version_info < (3, 11))"])
        .status()
        .is_ok_and(|s| s.success());
    if new_enough {
        println!("cargo::rustc-cfg=has_python");
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().map(str::to_owned))
        });
    if uid.as_deref() == Some("0") {
        println!("cargo::rustc-cfg=as_root");
    }
    // The network-namespace fleet tests: root, iproute2 (ip, tc), iptables and dnsmasq.
    let found = |tool: &str| {
        ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(tool).exists())
    };
    for tool in ["ip", "tc", "iptables", "dnsmasq"] {
        println!("cargo::rerun-if-changed=/usr/sbin/{tool}");
    }
    if uid.as_deref() == Some("0") && ["ip", "tc", "iptables", "dnsmasq"].into_iter().all(found) {
        println!("cargo::rustc-cfg=has_netns");
    }
    // The container test: root, podman with runc, mmdebstrap for the base image, objcopy.
    let container_tools = ["podman", "runc", "mmdebstrap", "objcopy"];
    // Where Debian installs them (a path that does not exist would rerun this every build).
    for path in [
        "/usr/bin/podman",
        "/usr/sbin/runc",
        "/usr/bin/mmdebstrap",
        "/usr/bin/objcopy",
    ] {
        println!("cargo::rerun-if-changed={path}");
    }
    if uid.as_deref() == Some("0") && container_tools.into_iter().all(found) {
        println!("cargo::rustc-cfg=has_podman");
    }
    println!("cargo::rerun-if-changed=/usr/bin/systemd-analyze");
    if ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
    {
        println!("cargo::rustc-cfg=has_systemd_analyze");
    }
}
