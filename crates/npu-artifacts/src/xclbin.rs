//! xclbin (`struct axlf` in XRT's `xclbin.h`): recognized, summarized, and its embedded PDIs found.
//!
//! The XRT path loads `final.xclbin`; the HSA path loads `main.pdi` instead, so npud refuses an
//! xclbin offered as a PDI and says to build `main.pdi` (aiecc `--get-pdi`).
//!
//! Layout read: the magic `xclbin2\0` at 0; `axlf_header` (152 bytes) at byte 304, with
//! `m_length` (u64) at +0, the version patch/major/minor at +24/+26/+27 and `m_numSections` at
//! +144; then `m_numSections` section headers of 40 bytes at byte 456: kind (u32) at +0, name
//! (16 bytes) at +4, offset (u64) at +24, size (u64) at +32.
//!
//! The `AIE_PARTITION` section (kind 32) is a 184-byte `aie_partition`: `info.column_width` (u16)
//! at +32, `info.start_columns` (count u32, offset u32) at +40, and `aie_pdi` (count u32, offset
//! u32) at +120, offsets relative to the section start. Each `aie_pdi` is 96 bytes: a 16-byte UUID,
//! then `pdi_image` (size in bytes u32, offset u32) at +16. [`extract_pdi`] cuts each image out
//! and accepts it only if it is itself a valid partial PDI: the SMAP words, the "PPDI"
//! identification word and a verifying image header table checksum (see [`crate::pdi`]). That
//! checksum over the 32 IHT words is what makes the extraction trustworthy: an offset or size that
//! is off by anything lands on bytes whose checksum does not verify.

use crate::ArtifactError;
use crate::budget::Budget;
use crate::le::{u16_at, u32_at, u64_at};
use crate::pdi::{self, PdiKind, PdiSummary};

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

/// Size of `struct aie_partition`.
pub const AIE_PARTITION_BYTES: usize = 184;
/// Size of `struct aie_pdi`.
pub const AIE_PDI_BYTES: usize = 96;

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
    /// The first `AIE_PARTITION` section, read, if there is one.
    pub aie_partition: Option<AiePartition>,
}

/// The `AIE_PARTITION` section: partition shape and embedded PDIs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AiePartition {
    /// Columns the partition spans.
    pub column_width: u16,
    /// Columns it may start at.
    pub start_columns: Vec<u16>,
    /// The embedded PDIs.
    pub pdis: Vec<EmbeddedPdi>,
}

/// One PDI embedded in the `AIE_PARTITION` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedPdi {
    /// PDI container UUID.
    pub uuid: [u8; 16],
    /// Byte offset of the image in the xclbin file.
    pub file_offset: u64,
    /// Size of the image in bytes.
    pub size: u64,
    /// The image's summary when it verified as a partial PDI; `None` otherwise.
    pub verified: Option<PdiSummary>,
    /// Why it did not verify, when it did not.
    pub problem: Option<String>,
}

impl XclbinSummary {
    /// Whether the xclbin has an `AIE_PARTITION` section, as NPU xclbins do.
    #[must_use]
    pub fn has_aie_partition(&self) -> bool {
        self.sections.iter().any(|s| s.kind == AIE_PARTITION)
    }

    /// The embedded PDI, when exactly one verified as a partial PDI.
    #[must_use]
    pub fn verified_pdi(&self) -> Option<&EmbeddedPdi> {
        let part = self.aie_partition.as_ref()?;
        let mut good = part.pdis.iter().filter(|p| p.verified.is_some());
        match (good.next(), good.next()) {
            (Some(one), None) => Some(one),
            _ => None,
        }
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
/// # Cost
///
/// Linear in `bytes`: about 60 bytes per 40-byte section header, 2 bytes per start column, and
/// per `aie_pdi` entry its summary ([`pdi::identify`]'s cost, about 1.2 bytes per image byte).
/// Entries may name one image many times; the images summarized are charged to a budget of
/// 4 units per input byte (2 per image byte), past which the file is refused.
///
/// # Errors
///
/// [`ArtifactError::XclbinMalformed`] when the magic is wrong, the file is shorter than its
/// header, section table or declared length, or a section lies outside the file;
/// [`ArtifactError::OverLimit`] when `aie_pdi` entries summarize more image bytes than the
/// budget allows.
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
    let mut budget = Budget::new("xclbin", bytes.len());
    let aie_partition = sections
        .iter()
        .find(|s| s.kind == AIE_PARTITION)
        .map(|s| aie_partition(bytes, s, &mut budget))
        .transpose()?;
    Ok(XclbinSummary {
        aie_partition,
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

/// Reads the `AIE_PARTITION` section (already known to lie inside the file).
fn aie_partition(
    bytes: &[u8],
    section: &XclbinSection,
    budget: &mut Budget,
) -> Result<AiePartition, ArtifactError> {
    // In bounds: summarize checked offset + size against the file length.
    let start = usize::try_from(section.offset).unwrap_or(usize::MAX);
    let len = usize::try_from(section.size).unwrap_or(0);
    let sec = bytes
        .get(start..start.saturating_add(len))
        .unwrap_or_default();
    if sec.len() < AIE_PARTITION_BYTES {
        return Err(malformed(format!(
            "AIE_PARTITION section at byte offset {start} is {} bytes; expected at least {AIE_PARTITION_BYTES}",
            sec.len()
        )));
    }
    let at = |off: usize| u32_at(sec, off).unwrap_or(0);
    // An array of `count` elements of `elem` bytes at section offset `offset`, or an error.
    let array = |what: &str, field: usize, elem: usize| -> Result<(usize, usize), ArtifactError> {
        let (count, offset) = (at(field), at(field + 4));
        let end = u64::from(count)
            .checked_mul(elem as u64)
            .and_then(|n| n.checked_add(u64::from(offset)));
        match end {
            Some(end) if end <= sec.len() as u64 => Ok((count as usize, offset as usize)),
            _ => Err(malformed(format!(
                "AIE_PARTITION {what} (at section offset {field}): {count} entries at section \
                 offset {offset} do not fit in the {}-byte section",
                sec.len()
            ))),
        }
    };
    let (n_cols, cols_at) = array("start_columns", 40, 2)?;
    let start_columns = (0..n_cols)
        .map(|i| u16_at(sec, cols_at + i * 2).unwrap_or(0))
        .collect();
    let (n_pdis, pdis_at) = array("aie_pdi", 120, AIE_PDI_BYTES)?;
    let mut pdis = Vec::with_capacity(n_pdis);
    for i in 0..n_pdis {
        let entry = pdis_at + i * AIE_PDI_BYTES;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&sec[entry..entry + 16]);
        let (size, offset) = (at(entry + 16), at(entry + 20));
        let image = sec.get(offset as usize..(offset as usize).saturating_add(size as usize));
        if let Some(img) = image {
            // Entries may share one image: each summary (about 1.2 bytes per image byte) is
            // charged.
            budget.charge_bytes(
                "aie_pdi image bytes summarized",
                img.len().saturating_mul(2),
            )?;
        }
        let (verified, problem) = match image {
            None => (
                None,
                Some(format!(
                    "pdi_image ({size} bytes at section offset {offset}) lies outside the {}-byte section",
                    sec.len()
                )),
            ),
            Some(img) => match pdi::identify(img) {
                Ok(PdiKind::Partial(summary)) => (Some(summary), None),
                Ok(other) => (
                    None,
                    Some(format!(
                        "pdi_image is an {}, not a partial PDI",
                        other.label()
                    )),
                ),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        pdis.push(EmbeddedPdi {
            uuid,
            file_offset: section.offset + u64::from(offset),
            size: u64::from(size),
            verified,
            problem,
        });
    }
    Ok(AiePartition {
        column_width: u16_at(sec, 32).unwrap_or(0),
        start_columns,
        pdis,
    })
}

/// The PDI embedded in an xclbin's `AIE_PARTITION` section, for the HSA path (which takes
/// `main.pdi`). The image must verify as a partial PDI (SMAP words, "PPDI", IHT checksum).
///
/// # Cost
///
/// [`summarize`]'s, a copy of the image, and a short message per failed entry.
///
/// # Errors
///
/// [`ArtifactError::XclbinMalformed`] when the xclbin is broken, has no `AIE_PARTITION`
/// section, or does not hold exactly one embedded PDI that verifies (the message says why each
/// failed).
pub fn extract_pdi(bytes: &[u8]) -> Result<Vec<u8>, ArtifactError> {
    let summary = summarize(bytes)?;
    let Some(part) = summary.aie_partition else {
        return Err(malformed(
            "no AIE_PARTITION section (kind 32); expected one holding the PDI".into(),
        ));
    };
    let good: Vec<&EmbeddedPdi> = part.pdis.iter().filter(|p| p.verified.is_some()).collect();
    match good.as_slice() {
        [one] => {
            let start = usize::try_from(one.file_offset).unwrap_or(usize::MAX);
            let end = start.saturating_add(usize::try_from(one.size).unwrap_or(usize::MAX));
            bytes
                .get(start..end)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| malformed("embedded PDI outside the file".into()))
        }
        [] => {
            let why: Vec<String> = part
                .pdis
                .iter()
                .enumerate()
                .map(|(i, p)| format!("PDI {i}: {}", p.problem.as_deref().unwrap_or("?")))
                .collect();
            Err(malformed(format!(
                "AIE_PARTITION holds {} PDI(s), none a valid partial PDI{}{}",
                part.pdis.len(),
                if why.is_empty() { "" } else { ": " },
                why.join("; ")
            )))
        }
        many => Err(malformed(format!(
            "AIE_PARTITION holds {} valid PDIs; expected one (use main.pdi from aiecc --get-pdi)",
            many.len()
        ))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An xclbin with one EMBEDDED_METADATA section of 8 bytes, built from the layout above.
    pub(crate) fn sample_xclbin() -> Vec<u8> {
        let mut b = vec![0u8; SECTIONS_OFFSET + SECTION_HEADER_BYTES + 8];
        b[..8].copy_from_slice(MAGIC);
        let len = b.len() as u64;
        b[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&len.to_le_bytes());
        b[HEADER_OFFSET + 26] = 2;
        b[HEADER_OFFSET + 144] = 1;
        let s = SECTIONS_OFFSET;
        b[s..s + 4].copy_from_slice(&2u32.to_le_bytes());
        b[s + 4..s + 12].copy_from_slice(b"metadata");
        let data = (SECTIONS_OFFSET + SECTION_HEADER_BYTES) as u64;
        b[s + 24..s + 32].copy_from_slice(&data.to_le_bytes());
        b[s + 32] = 8;
        b
    }

    /// An xclbin whose AIE_PARTITION section embeds `pdi` (one aie_pdi, start column 1).
    pub(crate) fn xclbin_with_pdi(pdi: &[u8]) -> Vec<u8> {
        let sec_at = SECTIONS_OFFSET + SECTION_HEADER_BYTES;
        let cols_at = AIE_PARTITION_BYTES;
        let pdis_at = cols_at + 8;
        let img_at = pdis_at + AIE_PDI_BYTES;
        let mut sec = vec![0u8; img_at];
        sec[32..34].copy_from_slice(&4u16.to_le_bytes());
        sec[40..44].copy_from_slice(&1u32.to_le_bytes());
        sec[44..48].copy_from_slice(&u32::try_from(cols_at).unwrap().to_le_bytes());
        sec[cols_at..cols_at + 2].copy_from_slice(&1u16.to_le_bytes());
        sec[120..124].copy_from_slice(&1u32.to_le_bytes());
        sec[124..128].copy_from_slice(&u32::try_from(pdis_at).unwrap().to_le_bytes());
        sec[pdis_at..pdis_at + 16].copy_from_slice(&[0xAB; 16]);
        let size = u32::try_from(pdi.len()).unwrap();
        sec[pdis_at + 16..pdis_at + 20].copy_from_slice(&size.to_le_bytes());
        sec[pdis_at + 20..pdis_at + 24]
            .copy_from_slice(&u32::try_from(img_at).unwrap().to_le_bytes());
        sec.extend_from_slice(pdi);

        let mut b = vec![0u8; sec_at];
        b[..8].copy_from_slice(MAGIC);
        b[HEADER_OFFSET + 144] = 1;
        let s = SECTIONS_OFFSET;
        b[s..s + 4].copy_from_slice(&AIE_PARTITION.to_le_bytes());
        b[s + 24..s + 32].copy_from_slice(&(sec_at as u64).to_le_bytes());
        b[s + 32..s + 40].copy_from_slice(&(sec.len() as u64).to_le_bytes());
        b.extend_from_slice(&sec);
        let len = b.len() as u64;
        b[HEADER_OFFSET..HEADER_OFFSET + 8].copy_from_slice(&len.to_le_bytes());
        b
    }

    #[test]
    fn embedded_pdi_is_extracted_and_verified() {
        let pdi = crate::pdi::tests::sample_pdi();
        let x = xclbin_with_pdi(&pdi);
        let s = summarize(&x).unwrap();
        let part = s.aie_partition.unwrap();
        assert_eq!(part.column_width, 4);
        assert_eq!(part.start_columns, vec![1]);
        assert_eq!(part.pdis.len(), 1);
        assert_eq!(part.pdis[0].uuid, [0xAB; 16]);
        assert!(part.pdis[0].verified.is_some());
        assert_eq!(extract_pdi(&x).unwrap(), pdi);
    }

    #[test]
    fn embedded_pdi_that_does_not_verify_is_not_extracted() {
        let mut pdi = crate::pdi::tests::sample_pdi();
        pdi[crate::pdi::IHT_OFFSET + 28] ^= 1;
        let x = xclbin_with_pdi(&pdi);
        let e = extract_pdi(&x).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "xclbin: AIE_PARTITION holds 1 PDI(s), none a valid partial PDI: PDI 0: PDI: image \
                 header table at byte offset 16: checksum does not verify"
            ),
            "{e}"
        );
        let e = extract_pdi(&sample_xclbin()).unwrap_err().to_string();
        assert_eq!(
            e,
            "xclbin: no AIE_PARTITION section (kind 32); expected one holding the PDI"
        );
        let mut short = sample_xclbin();
        short[SECTIONS_OFFSET..SECTIONS_OFFSET + 4].copy_from_slice(&AIE_PARTITION.to_le_bytes());
        assert_eq!(
            summarize(&short).unwrap_err().to_string(),
            "xclbin: AIE_PARTITION section at byte offset 496 is 8 bytes; expected at least 184"
        );
    }

    #[test]
    fn sections_are_listed() {
        let x = summarize(&sample_xclbin()).unwrap();
        assert_eq!(x.num_sections, 1);
        assert_eq!(x.version, (2, 0, 0));
        assert!(!x.has_aie_partition());
        assert_eq!(x.aie_partition, None);
        assert_eq!(x.sections[0].name, "metadata");
        assert_eq!(x.sections[0].kind_name(), Some("EMBEDDED_METADATA"));
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
            e.contains(
                "section 0 (EMBEDDED_METADATA, header at byte offset 456) spans bytes 496..+9"
            ),
            "{e}"
        );
    }
}
