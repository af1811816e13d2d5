//! What a file is, in names and numbers: the magic, the versions, the header's size, the formats this
//! crate writes ([`Format`]: version 1, or version 2 with a [`Profile`]) and their default patch sizes.
//! Everything else in the crate builds on these.

/// The four bytes every L3 file starts with.
pub const MAGIC: [u8; 4] = *b"L3IM";
/// The format version [`encode`](fn@crate::encode) and [`encode_parallel`](crate::encode_parallel) write (1).
/// [`encode_with`](crate::encode_with) writes either version; [`L3File::version`](crate::L3File::version)
/// tells a file's.
pub const VERSION: u16 = 1;
/// The newest format version this crate reads and writes.
pub const VERSION_2: u16 = 2;
/// The format written when the caller does not choose one
/// ([`EncodeOptions::default`](crate::EncodeOptions::default), `l3 encode`, `l3 convert --to l3`, Python's
/// `encode` and `convert`): version 2, profile ANS.
///
/// A default has to detect corruption, because training on silently damaged pixels is worse than an error:
/// version 1 has no checksum and decodes almost every flipped bit into other pixels. Version 2 ends with a
/// CRC-32C, which every whole-file read checks, and the encoder writes a CRC-32C per entry and one of the
/// prefix ([`FLAG_ENTRY_CRCS`]), which a region read (a crop's patches, fetched alone) checks before it
/// decodes anything: every single-bit flip in the bytes of 224×224 crops of the corpus was an error, for
/// both profiles, at 0.03 % (ANS) to 0.08 % (BP) more bytes. ANS is the smallest: 0.213 of the raw pixels on
/// the corpus against 0.298 for BP and 0.548 for version 1. It is the slowest to decode on a CPU (about
/// 450 MB/s on one core of a busy AMD EPYC Zen 3, BP 950, version 1 1470; README.md, "Choosing the
/// default", has the figures and the machines), so `Format::V2(Profile::Bp)` (verified as well) or
/// `Format::V1` (not verified) stay an explicit choice where CPU decode speed matters more.
pub const DEFAULT_FORMAT: Format = Format::V2(Profile::Ans);
/// Bit 0 of a version-2 header's flags byte (offset 18): the file carries a CRC-32C of every offset-table
/// entry and one of its prefix (SPEC.md §2.11), so that a read of only some entries — a crop's patches —
/// verifies every byte it decodes. Files without it (written before the flag existed, or on request) stay
/// valid; the encoder sets it by default.
pub const FLAG_ENTRY_CRCS: u8 = 1;
/// Size in bytes of the fixed header that precedes the offset table.
pub const HEADER_LEN: usize = 20;
/// Largest patch side the format allows (the patch size is a `u8`).
pub const MAX_PATCH_SIZE: u8 = 255;

/// Default patch size N for an image of `width`×`height` pixels: 32 below 1080×720 pixels (the paper's
/// rule), 64 above. The paper uses 128 above 1920×1080; on the corpus 64 stores 5.4 % less than 128 for
/// about a fifth less decode speed, while 32 would save only 2.4 % more at another third less speed
/// (measurements in SPEC.md, "Default patch size").
pub fn default_patch_size(width: u32, height: u32) -> u8 {
    let pixels = width as u64 * height as u64;
    if pixels < 1080 * 720 { 32 } else { 64 }
}

/// The entropy back end of a version-2 file (header byte 17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// 0: bit-packed groups of eight residuals, no tables (the table-free fallback).
    Bp,
    /// 1: static context rANS with 32 interleaved lanes per patch (the smaller files).
    Ans,
}

impl Profile {
    /// The header byte.
    pub fn byte(self) -> u8 {
        match self {
            Profile::Bp => 0,
            Profile::Ans => 1,
        }
    }

    pub fn from_byte(b: u8) -> Option<Profile> {
        match b {
            0 => Some(Profile::Bp),
            1 => Some(Profile::Ans),
            _ => None,
        }
    }

    /// `"bp"` or `"ans"`, as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Bp => "bp",
            Profile::Ans => "ans",
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Profile::Bp => "BP",
            Profile::Ans => "ANS",
        })
    }
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "bp" => Ok(Profile::Bp),
            "ans" => Ok(Profile::Ans),
            _ => Err(format!("unknown profile {s:?} (bp or ans)")),
        }
    }
}

/// A file format this crate writes: version 1, or version 2 with a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    V1,
    V2(Profile),
}

impl Format {
    /// The format a user's request names: a version (1 or 2) and/or a v2 profile. Nothing asked is
    /// [`DEFAULT_FORMAT`]; a profile alone means version 2; version 2 alone means ANS (the smaller
    /// profile). A profile with version 1, or another version, is refused with the reason.
    pub fn resolve(version: Option<u16>, profile: Option<Profile>) -> Result<Format, String> {
        match (version, profile) {
            (None, None) => Ok(DEFAULT_FORMAT),
            (Some(1), Some(_)) => {
                Err("a profile applies to version 2 only; version 1 has one coding".to_string())
            }
            (Some(1), None) => Ok(Format::V1),
            (None | Some(2), Some(p)) => Ok(Format::V2(p)),
            (Some(2), None) => Ok(Format::V2(Profile::Ans)),
            (Some(v), _) => Err(format!("format version {v}: this crate writes 1 or 2")),
        }
    }

    /// The header's version field.
    pub fn version(self) -> u16 {
        match self {
            Format::V1 => 1,
            Format::V2(_) => 2,
        }
    }

    /// The v2 profile, `None` for v1.
    pub fn profile(self) -> Option<Profile> {
        match self {
            Format::V1 => None,
            Format::V2(p) => Some(p),
        }
    }

    /// The patch size used when none is given: [`default_patch_size`] for v1, 128 for v2 (the
    /// design's recommendation; SPEC.md §2.9 has the measurements).
    pub fn default_patch_size(self, width: u32, height: u32) -> u8 {
        match self {
            Format::V1 => default_patch_size(width, height),
            Format::V2(_) => V2_DEFAULT_PATCH_SIZE,
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Format::V1 => f.write_str("v1"),
            Format::V2(p) => write!(f, "v2-{p}"),
        }
    }
}

/// Default v2 patch size.
pub const V2_DEFAULT_PATCH_SIZE: u8 = 128;

/// Whether `n` is a valid v2 patch size: a non-zero multiple of 32 (so 32 ..= 224).
pub fn valid_v2_patch_size(n: u8) -> bool {
    n != 0 && n.is_multiple_of(32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_resolve_to_formats_and_contradictions_are_refused() {
        assert_eq!(Format::resolve(None, None), Ok(DEFAULT_FORMAT));
        assert_eq!(Format::resolve(Some(1), None), Ok(Format::V1));
        assert_eq!(Format::resolve(Some(2), None), Ok(Format::V2(Profile::Ans)));
        assert_eq!(
            Format::resolve(None, Some(Profile::Bp)),
            Ok(Format::V2(Profile::Bp))
        );
        assert_eq!(
            Format::resolve(Some(2), Some(Profile::Bp)),
            Ok(Format::V2(Profile::Bp))
        );
        assert!(
            Format::resolve(Some(1), Some(Profile::Ans))
                .unwrap_err()
                .contains("version 2 only")
        );
        assert!(
            Format::resolve(Some(3), None)
                .unwrap_err()
                .contains("version 3")
        );
    }
}
