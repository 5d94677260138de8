//! Tells the tests whether `systemd-analyze` is installed, so the unit-file check is reported
//! as ignored, with the reason, rather than passed where it is not.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_systemd_analyze)");
    println!("cargo::rerun-if-changed=/usr/bin/systemd-analyze");
    if ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
    {
        println!("cargo::rustc-cfg=has_systemd_analyze");
    }
}
