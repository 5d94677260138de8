//! xclbin (`struct axlf` in XRT's `xclbin.h`): recognized and summarized, not loaded.
//!
//! The XRT path loads `final.xclbin`; the HSA path loads `main.pdi` instead, so npud refuses an
//! xclbin offered as a PDI and says to build `main.pdi` (aiecc `--get-pdi`). The PDI embedded in
//! the `AIE_PARTITION` section is **not** extracted: that section's internal layout is not
//! established well enough here to cut a PDI out of it that the device will trust.
//!
//! Layout read: the magic `xclbin2\0` at 0; `axlf_header` (152 bytes) at byte 304, with
//! `m_length` (u64) at +0, the version patch/major/minor at +24/+26/+27 and `m_numSections` at
//! +144; then `m_numSections` section headers of 40 bytes at byte 456: kind (u32) at +0, name
//! (16 bytes) at +4, offset (u64) at +24, size (u64) at +32.

use crate::ArtifactError;
use crate::le::{u16_at, u32_at, u64_at};

/// The magic an xclbin starts with.
pub const MAGIC: &[u8; 8] = b"xclbin2\0";
/// Byte offset of `axlf_header`.
pub const HEADER_OFFSET: usize = 304;
/// Byte offset of the first section header.
pub const SECTIONS_OFFSET: usize = HEADER_OFFSET + 152;
/// Size of one section header.
pub const SECTION_HEADER_BYTES: usize = 40;
/// Section kind of the AIE partition (which embeds the PDIs).
pub const AIE_PARTITION: u32 = 32;

/// An xclbin, summarized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XclbinSummary {
    /// Size of the file in bytes.
    pub size_bytes: usize,
    /// `m_length` from the header.
    pub declared_length: u64,
    /// Version (major, minor, patch).
    pub version: (u8, u8, u16),
    /// Number of sections.
    pub num_sections: u32,
    /// Section headers.
    pub sections: Vec<XclbinSection>,
}

impl XclbinSummary {
    /// Whether the xclbin has an `AIE_PARTITION` section, as NPU xclbins do.
    #[must_use]
    pub fn has_aie_partition(&self) -> bool {
        self.sections.iter().any(|s| s.kind == AIE_PARTITION)
    }
}

/// One section header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XclbinSection {
    /// Section kind.
    pub kind: u32,
    /// Section name (NUL-trimmed, lossy UTF-8).
    pub name: String,
    /// Byte offset of the section data.
    pub offset: u64,
    /// Size of the section data.
    pub size: u64,
}

impl XclbinSection {
    /// The kind's name for the kinds NPU xclbins use, `None` for others.
    #[must_use]
    pub fn kind_name(&self) -> Option<&'static str> {
        Some(match self.kind {
            2 => "EMBEDDED_METADATA",
            6 => "MEM_TOPOLOGY",
            7 => "CONNECTIVITY",
            8 => "IP_LAYOUT",
            26 => "GROUP_TOPOLOGY",
            27 => "GROUP_CONNECTIVITY",
            AIE_PARTITION => "AIE_PARTITION",
            _ => return None,
        })
    }
}

fn malformed(detail: String) -> ArtifactError {
    ArtifactError::XclbinMalformed { detail }
}

/// Reads an xclbin's header and section table.
///
/// # Errors
///
/// [`ArtifactError::XclbinMalformed`] when the magic is wrong, the file is shorter than its
/// header, section table or declared length, or a section lies outside the file.
pub fn summarize(bytes: &[u8]) -> Result<XclbinSummary, ArtifactError> {
    if !bytes.starts_with(MAGIC) {
        return Err(malformed(
            "expected the magic \"xclbin2\\0\" at byte 0".into(),
        ));
    }
    if bytes.len() < SECTIONS_OFFSET {
        return Err(malformed(format!(
            "file is {} bytes; expected at least {SECTIONS_OFFSET} (the axlf header)",
            bytes.len()
        )));
    }
    let h = HEADER_OFFSET;
    let declared_length = u64_at(bytes, h).unwrap_or(0);
    if declared_length > bytes.len() as u64 {
        return Err(malformed(format!(
            "header (byte offset {h}) declares {declared_length} bytes but the file is {} bytes; it is truncated",
            bytes.len()
        )));
    }
    let num_sections = u32_at(bytes, h + 144).unwrap_or(0);
    let table_end = (num_sections as u64)
        .checked_mul(SECTION_HEADER_BYTES as u64)
        .and_then(|t| t.checked_add(SECTIONS_OFFSET as u64));
    if table_end.is_none_or(|end| end > bytes.len() as u64) {
        return Err(malformed(format!(
            "header (byte offset {}) declares {num_sections} sections, whose table does not fit in \
             the {}-byte file",
            h + 144,
            bytes.len()
        )));
    }
    let mut sections = Vec::with_capacity(num_sections as usize);
    for i in 0..num_sections as usize {
        let at = SECTIONS_OFFSET + i * SECTION_HEADER_BYTES;
        let name = bytes.get(at + 4..at + 20).unwrap_or_default();
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let section = XclbinSection {
            kind: u32_at(bytes, at).unwrap_or(0),
            name: String::from_utf8_lossy(&name[..end]).into_owned(),
            offset: u64_at(bytes, at + 24).unwrap_or(0),
            size: u64_at(bytes, at + 32).unwrap_or(0),
        };
        if section
            .offset
            .checked_add(section.size)
            .is_none_or(|e| e > bytes.len() as u64)
        {
            return Err(malformed(format!(
                "section {i} ({}, header at byte offset {at}) spans bytes {}..+{} outside the {}-byte file",
                section.kind_name().unwrap_or("kind ?"),
                section.offset,
                section.size,
                bytes.len()
            )));
        }
        sections.push(section);
    }
    Ok(XclbinSummary {
        size_bytes: bytes.len(),
        declared_length,
        version: (
            bytes[h + 26],
            bytes[h + 27],
            u16_at(bytes, h + 24).unwrap_or(0),
        ),
        num_sections,
        sections,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An xclbin with one AIE_PARTITION section of 8 bytes, built from the layout above.
    pub(crate) fn sample_xclbin() -> Vec<u8> {
        let mut b = vec![0u8; SECTIONS_OFFSET + SECTION_HEADER_BYTES + 8];
        b[..8].copy_from_slice(MAGIC);
        let len = b.len() as u64;
        b[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&len.to_le_bytes());
        b[HEADER_OFFSET + 26] = 2;
        b[HEADER_OFFSET + 144] = 1;
        let s = SECTIONS_OFFSET;
        b[s..s + 4].copy_from_slice(&AIE_PARTITION.to_le_bytes());
        b[s + 4..s + 17].copy_from_slice(b"aie_partition");
        let data = (SECTIONS_OFFSET + SECTION_HEADER_BYTES) as u64;
        b[s + 24..s + 32].copy_from_slice(&data.to_le_bytes());
        b[s + 32] = 8;
        b
    }

    #[test]
    fn sections_are_listed() {
        let x = summarize(&sample_xclbin()).unwrap();
        assert_eq!(x.num_sections, 1);
        assert_eq!(x.version, (2, 0, 0));
        assert!(x.has_aie_partition());
        assert_eq!(x.sections[0].name, "aie_partition");
        assert_eq!(x.sections[0].kind_name(), Some("AIE_PARTITION"));
    }

    #[test]
    fn truncated_and_inconsistent_tables_are_refused() {
        let b = sample_xclbin();
        let e = summarize(&b[..400]).unwrap_err().to_string();
        assert_eq!(
            e,
            "xclbin: file is 400 bytes; expected at least 456 (the axlf header)"
        );
        let mut c = b.clone();
        c[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&1000u64.to_le_bytes());
        let e = summarize(&c).unwrap_err().to_string();
        assert!(
            e.contains("declares 1000 bytes but the file is 504 bytes"),
            "{e}"
        );
        let mut c = b.clone();
        c[HEADER_OFFSET + 144] = 9;
        let e = summarize(&c).unwrap_err().to_string();
        assert!(e.contains("declares 9 sections"), "{e}");
        let mut c = b;
        c[SECTIONS_OFFSET + 32] = 9;
        let e = summarize(&c).unwrap_err().to_string();
        assert!(
            e.contains("section 0 (AIE_PARTITION, header at byte offset 456) spans bytes 496..+9"),
            "{e}"
        );
    }
}
