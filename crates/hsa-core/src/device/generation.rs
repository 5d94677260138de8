//! Which NPU generation the device is, and how that was learnt.
//!
//! The agent name decides only where it is specific. `aie2p` is: only runtimes that read the
//! PCI id name an agent so. `aie2` is specific on every runtime newer than ROCm 7.0, which
//! names an agent `aie2` only for PCI id 0x1502 (and refuses unknown ids), but ROCm 7.0 (the
//! G1a packet ABI) names **every** NPU `aie2`, Strix included (`rocr-aie.md` §3). Where the
//! name is not specific, the generation comes from the PCI id of the first XDNA device in
//! sysfs (`<sysfs>/class/accel/accelN/device/{vendor,device}`), as ROCR's newer driver code
//! reads it: 0x1502 is npu1 (Phoenix, Hawk Point), 0x17f0 npu2 (Strix, Strix Halo, Krackan).
//! When neither tells, opening fails and says what to set: a design for the wrong generation
//! hangs the NPU until the driver's watchdog fires, so guessing is worse than refusing.

use std::path::Path;

use super::Generation;
use super::encode::PacketAbi;

/// AMD's PCI vendor id.
const AMD_VENDOR: u32 = 0x1022;

/// PCI device ids of XDNA NPUs and their generations (`rocr-aie.md` §3).
pub const PCI_IDS: [(u32, Generation); 2] =
    [(0x1502, Generation::Npu1), (0x17f0, Generation::Npu2)];

/// The generation from the agent name, when the name is specific for a runtime speaking `abi`.
pub(crate) fn from_specific_name(name: &str, abi: PacketAbi) -> Option<Generation> {
    match name.trim() {
        "aie2p" => Some(Generation::Npu2),
        "aie2" if abi != PacketAbi::G1a => Some(Generation::Npu1),
        _ => None,
    }
}

/// The generation from the PCI id of the first XDNA device under `sysfs`, with the file it
/// was read from.
///
/// # Errors
/// A sentence saying what was found instead: no accel devices, or devices with other ids.
pub fn from_sysfs(sysfs: &Path) -> Result<(Generation, String), String> {
    let class = sysfs.join("class/accel");
    let entries = std::fs::read_dir(&class)
        .map_err(|e| format!("{} cannot be read ({e})", class.display()))?;
    let mut accels: Vec<(u32, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix("accel")?.parse::<u32>().ok()?;
            Some((n, e.path()))
        })
        .collect();
    accels.sort();
    let mut seen = Vec::new();
    for (_, path) in &accels {
        let file = path.join("device/device");
        let (Some(vendor), Some(device)) = (read_hex(&path.join("device/vendor")), read_hex(&file))
        else {
            seen.push(format!("{} (unreadable)", path.display()));
            continue;
        };
        if vendor == AMD_VENDOR
            && let Some((_, g)) = PCI_IDS.iter().find(|(id, _)| *id == device)
        {
            return Ok((*g, format!("{} = {device:#06x}", file.display())));
        }
        seen.push(format!("{} = {vendor:#06x}:{device:#06x}", path.display()));
    }
    if seen.is_empty() {
        Err(format!("{} lists no accel device", class.display()))
    } else {
        Err(format!(
            "no XDNA NPU (AMD 0x1502 or 0x17f0) among the accel devices: {}",
            seen.join(", ")
        ))
    }
}

fn read_hex(path: &Path) -> Option<u32> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    u32::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accel(root: &Path, n: u32, vendor: &str, device: &str) {
        let dir = root.join(format!("class/accel/accel{n}/device"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(dir.join("device"), format!("{device}\n")).unwrap();
    }

    #[test]
    fn names_are_specific_except_rocm_7_0s_aie2() {
        assert_eq!(
            from_specific_name("aie2p", PacketAbi::G1a),
            Some(Generation::Npu2)
        );
        assert_eq!(
            from_specific_name("aie2", PacketAbi::G2),
            Some(Generation::Npu1)
        );
        assert_eq!(
            from_specific_name("aie2", PacketAbi::G1b),
            Some(Generation::Npu1)
        );
        assert_eq!(from_specific_name("aie2", PacketAbi::G1a), None);
        assert_eq!(from_specific_name("AIE-ML", PacketAbi::G2), None);
    }

    #[test]
    fn both_pci_ids_map_and_others_are_refused() {
        let d = tempfile::tempdir().unwrap();
        accel(d.path(), 0, "0x1022", "0x1502");
        let (g, from) = from_sysfs(d.path()).unwrap();
        assert_eq!(g, Generation::Npu1);
        assert!(from.ends_with("accel0/device/device = 0x1502"), "{from}");

        let d = tempfile::tempdir().unwrap();
        accel(d.path(), 3, "0x1022", "0x17f0");
        assert_eq!(from_sysfs(d.path()).unwrap().0, Generation::Npu2);

        let d = tempfile::tempdir().unwrap();
        accel(d.path(), 0, "0x8086", "0x7d1d");
        let e = from_sysfs(d.path()).unwrap_err();
        assert!(e.contains("0x8086:0x7d1d"), "{e}");

        let d = tempfile::tempdir().unwrap();
        let e = from_sysfs(d.path()).unwrap_err();
        assert!(e.contains("cannot be read"), "{e}");
    }

    #[test]
    fn the_first_npu_by_number_wins() {
        let d = tempfile::tempdir().unwrap();
        accel(d.path(), 10, "0x1022", "0x1502");
        accel(d.path(), 2, "0x1022", "0x17f0");
        assert_eq!(from_sysfs(d.path()).unwrap().0, Generation::Npu2);
    }
}
