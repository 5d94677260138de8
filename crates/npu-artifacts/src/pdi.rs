//! `main.pdi`: what a design's PDI is.
//!
//! [`identify`] tells three kinds apart by their first bytes:
//!
//! - an **emulated design** (`NPUD-EMU`, see [`crate::emu`]), which names a reference kernel for
//!   the software NPU;
//! - a **partial PDI**, as aiecc's bootgen step writes it: the SMAP bus-width words
//!   `0x000000DD 0x11223344 0x55667788 0x99AABBCC`, then the 128-byte image header table (IHT) at
//!   byte 16 with the identification word `0x50504449` ("PPDI") at IHT + 40. The IHT's 32 words
//!   must sum to `0xFFFFFFFF` (the checksum word is the complement of the others' sum); a PDI
//!   whose IHT checksum fails is refused. Image headers (64 bytes) and partition headers
//!   (128 bytes) are contiguous arrays at the word offsets the IHT gives; they are summarized and
//!   their checksums (same rule) reported, not enforced, since whether every aiecc PDI has exactly
//!   this shape is not confirmed. A full boot PDI ("FPDI") is refused;
//! - an **xclbin** (`xclbin2\0`, see [`crate::xclbin`]), which the XRT path loads. The HSA path
//!   takes `main.pdi`, so [`crate::design::check_pair`] refuses an xclbin with that advice.

use crate::emu::EmuDesign;
use crate::le::u32_at as word;
use crate::xclbin::{self, XclbinSummary};
use crate::{ArtifactError, emu};

/// The SMAP bus-width detection words a PDI starts with.
pub const SMAP_WORDS: [u32; 4] = [0x0000_00DD, 0x1122_3344, 0x5566_7788, 0x99AA_BBCC];
/// Byte offset of the image header table.
pub const IHT_OFFSET: usize = 16;
/// IHT length in bytes.
pub const IHT_BYTES: usize = 128;
/// Identification word of a partial PDI ("PPDI").
pub const PPDI: u32 = 0x5050_4449;
/// Identification word of a full PDI ("FPDI").
pub const FPDI: u32 = 0x4650_4449;
/// Image header length in bytes.
pub const IMAGE_HEADER_BYTES: usize = 64;
/// Partition header length in bytes.
pub const PARTITION_HEADER_BYTES: usize = 128;
/// The "CDO\0" word that starts a CDO partition's data (after a word holding 4).
pub const CDO_MAGIC: u32 = 0x004F_4443;

/// What a `main.pdi` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PdiKind {
    /// An emulated design for the software NPU.
    Emulated(EmuDesign),
    /// A real partial PDI; it needs the NPU.
    Partial(PdiSummary),
    /// An xclbin, which the XRT path loads; the HSA path needs the PDI instead.
    Xclbin(XclbinSummary),
}

impl PdiKind {
    /// A short name for logs: "emulated", "partial PDI" or "xclbin".
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Emulated(_) => "emulated",
            Self::Partial(_) => "partial PDI",
            Self::Xclbin(_) => "xclbin",
        }
    }
}

/// A partial PDI, summarized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdiSummary {
    /// Size of the file in bytes.
    pub size_bytes: usize,
    /// IHT version (0x00040000 for the PDIs aiecc writes).
    pub iht_version: u32,
    /// IDCODE from the IHT.
    pub idcode: u32,
    /// Whether the IHT checksum verified (always true: a failing one is refused).
    pub iht_checksum_ok: bool,
    /// Image headers.
    pub images: Vec<PdiImage>,
    /// Partition headers.
    pub partitions: Vec<PdiPartition>,
}

impl PdiSummary {
    /// Whether every image and partition header checksum verified as well.
    #[must_use]
    pub fn all_checksums_ok(&self) -> bool {
        self.iht_checksum_ok
            && self.images.iter().all(|i| i.checksum_ok)
            && self.partitions.iter().all(|p| p.checksum_ok)
    }
}

/// One image header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdiImage {
    /// Byte offset of the header.
    pub offset: usize,
    /// Image name (bytes 16..32, NUL-trimmed, lossy UTF-8).
    pub name: String,
    /// Number of partitions in the image.
    pub partition_count: u32,
    /// Byte offset of its first partition header.
    pub first_partition_offset: u64,
    /// Image id (byte 32).
    pub image_id: u32,
    /// Function id (byte 44).
    pub func_id: u32,
    /// Whether the header's 16 words sum to 0xFFFFFFFF.
    pub checksum_ok: bool,
}

/// One partition header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdiPartition {
    /// Byte offset of the header.
    pub offset: usize,
    /// Byte offset of the partition data.
    pub data_offset: u64,
    /// Data length in bytes (byte 0 of the header holds it in words).
    pub data_len_bytes: u64,
    /// Total length in bytes (byte 8, in words).
    pub total_len_bytes: u64,
    /// Attribute word (byte 36); 0x02000006 for the CDO partitions aiecc writes.
    pub attributes: u32,
    /// Whether the data starts with a CDO header (`4`, `"CDO\0"`).
    pub is_cdo: bool,
    /// Whether the header's 32 words sum to 0xFFFFFFFF.
    pub checksum_ok: bool,
}

/// Says what a `main.pdi` is, checking it as far as its kind allows.
///
/// # Cost
///
/// Linear in `bytes`: a partial PDI's image and partition tables must lie inside the file
/// before anything is allocated for them, and each header becomes one summary of about 80 bytes
/// (per 64-byte image or 128-byte partition header; the tables may overlap): about 1.2 bytes
/// per input byte at most. An xclbin costs [`xclbin::summarize`]'s.
///
/// # Errors
///
/// [`ArtifactError::PdiUnrecognized`] (with the first bytes) for content of no known kind, and
/// the kind's own errors for a broken emulated design, PDI or xclbin.
pub fn identify(bytes: &[u8]) -> Result<PdiKind, ArtifactError> {
    if bytes.starts_with(emu::MAGIC) {
        return EmuDesign::from_pdi(bytes).map(PdiKind::Emulated);
    }
    if bytes.starts_with(xclbin::MAGIC) {
        return xclbin::summarize(bytes).map(PdiKind::Xclbin);
    }
    if (0..4).all(|i| word(bytes, i * 4) == Some(SMAP_WORDS[i])) {
        return partial(bytes).map(PdiKind::Partial);
    }
    let first: Vec<String> = bytes.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let first = if first.is_empty() {
        "(empty file)".to_string()
    } else {
        first.join(" ")
    };
    Err(ArtifactError::PdiUnrecognized { first })
}

/// The wrapping sum of `n` words from `at` (the caller has bounds-checked them).
fn sum_words(bytes: &[u8], at: usize, n: usize) -> u32 {
    (0..n).fold(0u32, |s, i| {
        s.wrapping_add(word(bytes, at + i * 4).unwrap_or(0))
    })
}

fn malformed(detail: String) -> ArtifactError {
    ArtifactError::PdiMalformed { detail }
}

/// Converts a word offset/count from a header to a byte offset, checking that `len` bytes from
/// it fit in the file.
fn span(
    bytes: &[u8],
    words: u32,
    len: u64,
    what: &str,
    field_at: usize,
) -> Result<usize, ArtifactError> {
    let start = u64::from(words) * 4;
    match start.checked_add(len) {
        Some(end) if end <= bytes.len() as u64 => Ok(usize::try_from(start).unwrap_or(usize::MAX)),
        _ => Err(malformed(format!(
            "{what} (word offset {words:#x} at byte offset {field_at}) ends at byte {}, past the end \
             of the {}-byte file",
            start.saturating_add(len),
            bytes.len()
        ))),
    }
}

fn partial(bytes: &[u8]) -> Result<PdiSummary, ArtifactError> {
    let iht = IHT_OFFSET;
    if bytes.len() < iht + IHT_BYTES {
        return Err(malformed(format!(
            "file is {} bytes; expected at least {} (SMAP words and the 128-byte image header table)",
            bytes.len(),
            iht + IHT_BYTES
        )));
    }
    let at = |off: usize| word(bytes, iht + off).unwrap_or(0);
    let id = at(40);
    if id != PPDI {
        let ascii = id.to_be_bytes().iter().map(|&b| printable(b)).collect();
        return Err(ArtifactError::PdiNotPartial { found: id, ascii });
    }
    let sum = sum_words(bytes, iht, IHT_BYTES / 4);
    if sum != u32::MAX {
        return Err(ArtifactError::PdiChecksum {
            table: "image header table",
            offset: iht,
            words: IHT_BYTES / 4,
            sum,
        });
    }
    let (num_images, image_at) = (at(4), at(8));
    let (num_partitions, partition_at) = (at(12), at(16));
    let images_start = span(
        bytes,
        image_at,
        u64::from(num_images) * IMAGE_HEADER_BYTES as u64,
        &format!("{num_images} image header(s)"),
        iht + 8,
    )?;
    let partitions_start = span(
        bytes,
        partition_at,
        u64::from(num_partitions) * PARTITION_HEADER_BYTES as u64,
        &format!("{num_partitions} partition header(s)"),
        iht + 16,
    )?;
    // The spans above bound both counts by the file length, so these loops are bounded too.
    let images = (0..num_images as usize)
        .map(|i| image(bytes, images_start + i * IMAGE_HEADER_BYTES))
        .collect();
    let partitions = (0..num_partitions as usize)
        .map(|i| partition(bytes, partitions_start + i * PARTITION_HEADER_BYTES))
        .collect::<Result<_, _>>()?;
    Ok(PdiSummary {
        size_bytes: bytes.len(),
        iht_version: at(0),
        idcode: at(24),
        iht_checksum_ok: true,
        images,
        partitions,
    })
}

fn image(bytes: &[u8], offset: usize) -> PdiImage {
    let at = |off: usize| word(bytes, offset + off).unwrap_or(0);
    let name_bytes = bytes.get(offset + 16..offset + 32).unwrap_or_default();
    let name_end = name_bytes
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(name_bytes.len());
    PdiImage {
        offset,
        name: String::from_utf8_lossy(&name_bytes[..name_end]).into_owned(),
        partition_count: at(4),
        first_partition_offset: u64::from(at(0)) * 4,
        image_id: at(32),
        func_id: at(44),
        checksum_ok: sum_words(bytes, offset, IMAGE_HEADER_BYTES / 4) == u32::MAX,
    }
}

fn partition(bytes: &[u8], offset: usize) -> Result<PdiPartition, ArtifactError> {
    let at = |off: usize| word(bytes, offset + off).unwrap_or(0);
    let data_words = at(0);
    let data_at = at(32);
    let data_start = span(
        bytes,
        data_at,
        u64::from(data_words) * 4,
        &format!("partition data of {data_words} words"),
        offset + 32,
    )?;
    let is_cdo = data_words >= 2
        && word(bytes, data_start) == Some(4)
        && word(bytes, data_start + 4) == Some(CDO_MAGIC);
    Ok(PdiPartition {
        offset,
        data_offset: u64::from(data_at) * 4,
        data_len_bytes: u64::from(data_words) * 4,
        total_len_bytes: u64::from(at(8)) * 4,
        attributes: at(36),
        is_cdo,
        checksum_ok: sum_words(bytes, offset, PARTITION_HEADER_BYTES / 4) == u32::MAX,
    })
}

fn printable(b: u8) -> char {
    if b.is_ascii_graphic() {
        char::from(b)
    } else {
        '.'
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn put(buf: &mut [u8], at: usize, w: u32) {
        buf[at..at + 4].copy_from_slice(&w.to_le_bytes());
    }

    /// Sets the last word of the `words`-long header at `at` so the header sums to 0xFFFFFFFF.
    fn seal(buf: &mut [u8], at: usize, words: usize) {
        let last = at + (words - 1) * 4;
        put(buf, last, 0);
        let sum = sum_words(buf, at, words);
        put(buf, last, !sum);
    }

    /// A minimal partial PDI built from the layout table: SMAP, IHT, one image, one CDO partition.
    pub(crate) fn sample_pdi() -> Vec<u8> {
        let (img, prt, data) = (0x90usize, 0xD0usize, 0x150usize);
        let mut b = vec![0u8; data + 8 * 4];
        for (i, w) in SMAP_WORDS.iter().enumerate() {
            put(&mut b, i * 4, *w);
        }
        put(&mut b, IHT_OFFSET, 0x0004_0000);
        put(&mut b, IHT_OFFSET + 4, 1);
        put(&mut b, IHT_OFFSET + 8, u32::try_from(img / 4).unwrap());
        put(&mut b, IHT_OFFSET + 12, 1);
        put(&mut b, IHT_OFFSET + 16, u32::try_from(prt / 4).unwrap());
        put(&mut b, IHT_OFFSET + 24, 0x14CA_8093);
        put(&mut b, IHT_OFFSET + 40, PPDI);
        seal(&mut b, IHT_OFFSET, 32);
        put(&mut b, img, u32::try_from(prt / 4).unwrap());
        put(&mut b, img + 4, 1);
        b[img + 16..img + 25].copy_from_slice(b"aie_image");
        seal(&mut b, img, 16);
        put(&mut b, prt, 8);
        put(&mut b, prt + 8, 8);
        put(&mut b, prt + 32, u32::try_from(data / 4).unwrap());
        put(&mut b, prt + 36, 0x0200_0006);
        seal(&mut b, prt, 32);
        put(&mut b, data, 4);
        put(&mut b, data + 4, CDO_MAGIC);
        put(&mut b, data + 8, 0x200);
        b
    }

    #[test]
    fn partial_pdi_is_summarized() {
        let PdiKind::Partial(s) = identify(&sample_pdi()).unwrap() else {
            panic!("not a partial PDI")
        };
        assert_eq!(s.iht_version, 0x0004_0000);
        assert_eq!(s.idcode, 0x14CA_8093);
        assert!(s.all_checksums_ok());
        assert_eq!(s.images.len(), 1);
        assert_eq!(s.images[0].name, "aie_image");
        assert_eq!(s.images[0].first_partition_offset, 0xD0);
        assert_eq!(s.partitions.len(), 1);
        assert_eq!(s.partitions[0].data_offset, 0x150);
        assert_eq!(s.partitions[0].data_len_bytes, 32);
        assert!(s.partitions[0].is_cdo);
    }

    #[test]
    fn iht_checksum_failure_is_refused() {
        let mut b = sample_pdi();
        b[IHT_OFFSET + 28] ^= 1;
        assert_eq!(
            identify(&b).unwrap_err().to_string(),
            "PDI: image header table at byte offset 16: checksum does not verify (the 32 words \
             sum to 0x00000000; expected 0xffffffff)"
        );
    }

    #[test]
    fn image_checksum_failure_is_reported() {
        let mut b = sample_pdi();
        b[0x90 + 40] ^= 1;
        let PdiKind::Partial(s) = identify(&b).unwrap() else {
            panic!()
        };
        assert!(!s.images[0].checksum_ok);
        assert!(!s.all_checksums_ok());
    }

    #[test]
    fn full_pdi_is_refused() {
        let mut b = sample_pdi();
        put(&mut b, IHT_OFFSET + 40, FPDI);
        seal(&mut b, IHT_OFFSET, 32);
        assert_eq!(
            identify(&b).unwrap_err().to_string(),
            "PDI: identification word (byte offset 56) is 0x46504449 (FPDI); expected 0x50504449 \
             (\"PPDI\", a partial PDI)"
        );
    }

    #[test]
    fn partition_past_the_end_is_refused() {
        let mut b = sample_pdi();
        put(&mut b, 0xD0, 1000);
        seal(&mut b, 0xD0, 32);
        let e = identify(&b).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "PDI: partition data of 1000 words (word offset 0x54 at byte offset 240)"
            ),
            "{e}"
        );
    }

    #[test]
    fn truncated_pdi_is_refused() {
        let b = &sample_pdi()[..100];
        assert_eq!(
            identify(b).unwrap_err().to_string(),
            "PDI: file is 100 bytes; expected at least 144 (SMAP words and the 128-byte image header table)"
        );
    }

    #[test]
    fn unknown_content_names_its_first_bytes() {
        let e = identify(b"hello").unwrap_err().to_string();
        assert!(
            e.starts_with("unrecognized PDI content: first bytes are 68 65 6c 6c 6f; expected"),
            "{e}"
        );
        let e = identify(b"").unwrap_err().to_string();
        assert!(e.contains("(empty file)"), "{e}");
    }
}
