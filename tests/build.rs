//! Tells the tests whether `systemd-analyze` is installed, so the unit-file check is reported
//! as ignored, with the reason, rather than passed where it is not; and whether the build runs
//! as root (the tests run as the same user), so the tests that run a client under another uid
//! are reported as ignored elsewhere.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_systemd_analyze)");
    println!("cargo::rustc-check-cfg=cfg(as_root)");
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
    println!("cargo::rerun-if-changed=/usr/bin/systemd-analyze");
    if ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
    {
        println!("cargo::rustc-cfg=has_systemd_analyze");
    }
}
