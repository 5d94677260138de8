//! Which amdxdna driver the kernel runs, where that decides whether a runtime can work.
//!
//! ROCm 7.0's AIE path waits for every command with the `WAIT_CMD` ioctl, which only the
//! out-of-tree amdxdna driver (xdna-driver) has; with the driver in upstream Linux the runtime
//! cannot complete a command (`rocm70-observed.md`, item 10), and since it reports no failed
//! wait (item 8), every dispatch would look done. The kernel marks a module built outside its
//! tree with the taint flag `O` (`/sys/module/<name>/taint`, `TAINT_OOT_MODULE`), so the two
//! can be told apart without the device: a loaded amdxdna without `O` is the in-tree driver.
//! Where no amdxdna module is listed (built into the kernel, another sysfs root, or no NPU),
//! nothing is known.

use std::path::Path;

/// Where the loaded amdxdna driver was built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AmdxdnaOrigin {
    /// Out of the kernel's tree (xdna-driver, e.g. through DKMS): taint `O`.
    OutOfTree,
    /// In the kernel's tree (upstream Linux's drivers/accel/amdxdna): no taint `O`.
    InTree,
    /// No amdxdna module under this sysfs root.
    Unknown,
}

/// The origin of the amdxdna module listed under `sysfs` (normally `/sys`).
pub fn amdxdna_origin(sysfs: &Path) -> AmdxdnaOrigin {
    let module = sysfs.join("module/amdxdna");
    if !module.is_dir() {
        return AmdxdnaOrigin::Unknown;
    }
    match std::fs::read_to_string(module.join("taint")) {
        Ok(t) if t.contains('O') => AmdxdnaOrigin::OutOfTree,
        Ok(_) => AmdxdnaOrigin::InTree,
        // A module directory without a taint file is a built-in driver's (only its parameters
        // are listed): built with the kernel, so in its tree.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => AmdxdnaOrigin::InTree,
        Err(_) => AmdxdnaOrigin::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_taint_flag_tells_the_driver_apart() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(amdxdna_origin(d.path()), AmdxdnaOrigin::Unknown);
        let m = d.path().join("module/amdxdna");
        std::fs::create_dir_all(&m).unwrap();
        assert_eq!(amdxdna_origin(d.path()), AmdxdnaOrigin::InTree);
        std::fs::write(m.join("taint"), "\n").unwrap();
        assert_eq!(amdxdna_origin(d.path()), AmdxdnaOrigin::InTree);
        std::fs::write(m.join("taint"), "OE\n").unwrap();
        assert_eq!(amdxdna_origin(d.path()), AmdxdnaOrigin::OutOfTree);
    }
}
