//! Tells the tests whether Debian's ROCR 5.2.3 (`libhsa-runtime64-1`) is installed, so the test
//! that opens it is reported as ignored, with the reason, rather than passed, where it is not.

use std::path::Path;

const CANDIDATES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libhsa-runtime64.so.1",
    "/usr/lib/aarch64-linux-gnu/libhsa-runtime64.so.1",
    "/usr/lib64/libhsa-runtime64.so.1",
];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(system_rocr)");
    // dpkg's status file changes whenever a package is installed or removed.
    println!("cargo::rerun-if-changed=/var/lib/dpkg/status");
    if CANDIDATES.iter().any(|p| Path::new(p).exists()) {
        println!("cargo::rustc-cfg=system_rocr");
    }
}
