//! The fixed header and the patch grid it defines, shared by both versions: [`Geometry::parse`] is the one
//! header validation every reader runs ([`crate::L3File`] on a whole file, [`crate::L3Index`] on the first
//! bytes of one), and [`Geometry`] answers where each patch lies.

use crate::error::{Error, Limits};
use crate::format::{FLAG_ENTRY_CRCS, HEADER_LEN, MAGIC, Profile, valid_v2_patch_size};
use vocab::Rect;

/// The shape of an image's patch grid: everything the header says, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub version: u16,
    /// The v2 profile (`None` for v1).
    pub profile: Option<Profile>,
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub patch_size: u8,
    pub patches_x: u32,
    pub patches_y: u32,
    /// Version 2 with [`FLAG_ENTRY_CRCS`]: a CRC-32C per offset-table entry and one over the prefix
    /// (SPEC.md §2.11). Always false for version 1.
    pub entry_crcs: bool,
}

impl Geometry {
    pub fn patches_per_channel(&self) -> usize {
        self.patches_x as usize * self.patches_y as usize
    }

    pub fn entries(&self) -> usize {
        self.patches_per_channel() * self.channels as usize
    }

    /// Rectangle of patch `patch` (row-major over the grid); `patch` must be in range.
    pub fn patch_rect(&self, patch: usize) -> Rect {
        let n = self.patch_size as u32;
        let (gx, gy) = (
            (patch % self.patches_x as usize) as u32,
            (patch / self.patches_x as usize) as u32,
        );
        let (x, y) = (gx * n, gy * n);
        Rect {
            x,
            y,
            w: n.min(self.width - x),
            h: n.min(self.height - y),
        }
    }

    /// The patches whose rectangles meet `region` (which must fit the image), one row of the grid at a time:
    /// `(first patch of the row, patches in the row)`.
    pub fn rows_under(&self, region: Rect) -> impl Iterator<Item = (usize, usize)> + use<> {
        region.patch_rows(u32::from(self.patch_size), self.patches_x)
    }

    /// Parses and validates the fixed header at the start of `bytes` (the first bytes of a file, as many as
    /// were read) against `limits`: magic, version, dimensions (W×H×C overflow-checked against the limits),
    /// channels, bit depth, patch size, profile, flags and reserved bytes. Fewer than [`HEADER_LEN`] bytes are
    /// [`Error::Truncated`], or [`Error::BadMagic`] when what there is does not start like an L3 file.
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Geometry, Error> {
        if bytes.len() < HEADER_LEN {
            // Check the magic on what there is, so a short non-L3 file says "not L3" rather than "truncated".
            check_magic(bytes)?;
            return Err(Error::Truncated {
                what: "header",
                needed: HEADER_LEN,
                len: bytes.len(),
            });
        }
        check_magic(&bytes[..MAGIC.len()])?;
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != 1 && version != 2 {
            return Err(Error::UnsupportedVersion { found: version });
        }
        let width = u32_at(bytes, 6);
        let height = u32_at(bytes, 10);
        let channels = bytes[14];
        let depth = bytes[15];
        let patch_size = bytes[16];
        if width == 0 || height == 0 {
            return Err(Error::ZeroDimension { width, height });
        }
        if !matches!(channels, 1 | 3 | 4) {
            return Err(Error::BadChannels { found: channels });
        }
        let too_large = Error::TooLarge {
            width,
            height,
            channels,
            limit: limits.max_pixels,
        };
        let samples = (width as u64)
            .checked_mul(height as u64)
            .and_then(|p| p.checked_mul(channels as u64));
        match samples {
            Some(s) if s <= limits.max_pixels && usize::try_from(s).is_ok() => {}
            _ => return Err(too_large),
        }
        if depth != 8 {
            return Err(Error::BadBitDepth { found: depth });
        }
        let mut entry_crcs = false;
        let profile = if version == 1 {
            if patch_size == 0 {
                return Err(Error::ZeroPatchSize);
            }
            if bytes[17..20] != [0, 0, 0] {
                return Err(Error::ReservedNotZero);
            }
            None
        } else {
            if !valid_v2_patch_size(patch_size) {
                return Err(Error::BadPatchSize { found: patch_size });
            }
            let profile =
                Profile::from_byte(bytes[17]).ok_or(Error::BadProfile { found: bytes[17] })?;
            let flags = bytes[18];
            if flags & !FLAG_ENTRY_CRCS != 0 {
                return Err(Error::UnknownFlags { found: flags });
            }
            entry_crcs = flags & FLAG_ENTRY_CRCS != 0;
            if bytes[19] != 0 {
                return Err(Error::ReservedNotZero);
            }
            Some(profile)
        };
        let n = patch_size as u32;
        let g = Geometry {
            version,
            profile,
            width,
            height,
            channels,
            patch_size,
            patches_x: width.div_ceil(n),
            patches_y: height.div_ceil(n),
            entry_crcs,
        };
        // entries ≤ samples ≤ limit, so the table's size fits a usize; check anyway on narrow targets.
        g.entries().checked_mul(4).ok_or(too_large)?;
        Ok(g)
    }
}

/// [`Error::BadMagic`] unless `bytes` (the first bytes of a file: the whole magic, or fewer when that is all
/// there is) match the magic.
pub(crate) fn check_magic(bytes: &[u8]) -> Result<(), Error> {
    let n = bytes.len().min(MAGIC.len());
    if bytes[..n] != MAGIC[..n] {
        let mut found = [0u8; 4];
        found[..n].copy_from_slice(&bytes[..n]);
        return Err(Error::BadMagic { found });
    }
    Ok(())
}

/// The little-endian `u32` at `at` (header fields, offset tables).
#[inline(always)]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
