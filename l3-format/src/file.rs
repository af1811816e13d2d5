//! The file layout: header, offset table, patch data; [`L3File`] is a validated zero-copy view of it.

use crate::error::{Error, Limits, PatchId};
use crate::{HEADER_LEN, MAGIC, VERSION};
use std::ops::Range;

/// A rectangle of pixels, `(x, y)` its top-left corner: a patch's place in the image (edge patches are
/// partial, `w`, `h` < N) or a region to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

impl Rect {
    pub fn new(x: u32, y: u32, w: u32, h: u32) -> Rect {
        Rect { x, y, w, h }
    }

    /// Whether the rectangle is non-empty and lies inside a `width`×`height` image.
    pub fn fits(&self, width: u32, height: u32) -> bool {
        self.w > 0
            && self.h > 0
            && u64::from(self.x) + u64::from(self.w) <= u64::from(width)
            && u64::from(self.y) + u64::from(self.h) <= u64::from(height)
    }
}

impl std::fmt::Display for Rect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{} at ({}, {})", self.w, self.h, self.x, self.y)
    }
}

/// The shape of an image's patch grid: everything the header says, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub patch_size: u8,
    pub patches_x: u32,
    pub patches_y: u32,
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
        let n = self.patch_size as u32;
        let (gx0, gx1) = (region.x / n, (region.x + region.w - 1) / n);
        let (gy0, gy1) = (region.y / n, (region.y + region.h - 1) / n);
        let px = self.patches_x as usize;
        (gy0..=gy1).map(move |gy| (gy as usize * px + gx0 as usize, (gx1 - gx0 + 1) as usize))
    }

    /// Parses the fixed header (the caller has checked that `bytes` holds it) against `limits`.
    pub fn parse_header(bytes: &[u8], limits: &Limits) -> Result<Geometry, Error> {
        let found = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if found != MAGIC {
            return Err(Error::BadMagic { found });
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
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
        if patch_size == 0 {
            return Err(Error::ZeroPatchSize);
        }
        if bytes[17..20] != [0, 0, 0] {
            return Err(Error::ReservedNotZero);
        }
        let n = patch_size as u32;
        let g = Geometry {
            width,
            height,
            channels,
            patch_size,
            patches_x: width.div_ceil(n),
            patches_y: height.div_ceil(n),
        };
        // entries ≤ samples ≤ limit, so the table's size fits a usize; check anyway on narrow targets.
        g.entries().checked_mul(4).ok_or(too_large)?;
        Ok(g)
    }

    /// Bytes of header and offset table.
    pub fn data_offset(&self) -> usize {
        HEADER_LEN + 4 * self.entries()
    }

    /// Checks the offset table (`offset(i)` for every entry) against `data_len` bytes of patch data: first
    /// is 0, non-decreasing, inside the data, and room for each row's 2-byte minimum — before any patch
    /// byte is read.
    pub fn validate_offsets(
        &self,
        offset: impl Fn(usize) -> u32,
        data_len: u64,
    ) -> Result<(), Error> {
        let first = offset(0);
        if first != 0 {
            return Err(Error::FirstOffsetNotZero { offset: first });
        }
        let per = self.patches_per_channel();
        let entries = self.entries();
        let id = |i: usize| PatchId {
            channel: i / per,
            patch: i % per,
        };
        let mut previous = 0u32;
        for i in 0..entries {
            let o = offset(i);
            if u64::from(o) > data_len {
                return Err(Error::OffsetOutOfRange {
                    patch: id(i),
                    offset: o,
                    data_len: usize::try_from(data_len).unwrap_or(usize::MAX),
                });
            }
            if o < previous {
                return Err(Error::OffsetOutOfOrder {
                    patch: id(i),
                    offset: o,
                    previous,
                });
            }
            previous = o;
        }
        // Every row takes at least its 2-byte header: reject impossible sizes (and decompression bombs) now.
        for i in 0..entries {
            let end = if i + 1 < entries {
                u64::from(offset(i + 1))
            } else {
                data_len
            };
            let len = (end - u64::from(offset(i))) as usize;
            let rows = self.patch_rect(i % per).h as usize;
            if len < 2 * rows {
                return Err(Error::PatchTooShort {
                    patch: id(i),
                    len,
                    rows,
                    min: 2 * rows,
                });
            }
        }
        Ok(())
    }
}

/// A parsed L3 file borrowing its bytes. Construction validates everything the decoder relies on, so the
/// accessors below cannot fail and decoding only has to check the inside of each patch.
#[derive(Debug, Clone, Copy)]
pub struct L3File<'a> {
    pub(crate) geometry: Geometry,
    table: &'a [u8],
    data: &'a [u8],
}

#[inline(always)]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<'a> L3File<'a> {
    /// Parses and validates with the default [`Limits`].
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        Self::parse_with_limits(bytes, &Limits::default())
    }

    /// Parses and validates: magic, version, dimensions against `limits`, channels, bit depth, patch size,
    /// reserved bytes, and every offset (first is 0, non-decreasing, within the data, room for each row's
    /// 2-byte minimum) before any patch data is read.
    pub fn parse_with_limits(bytes: &'a [u8], limits: &Limits) -> Result<Self, Error> {
        if bytes.len() < HEADER_LEN {
            // Check the magic on what there is, so a short non-L3 file says "not L3" rather than "truncated".
            let n = bytes.len().min(4);
            if bytes[..n] != MAGIC[..n] {
                let mut found = [0u8; 4];
                found[..n].copy_from_slice(&bytes[..n]);
                return Err(Error::BadMagic { found });
            }
            return Err(Error::Truncated {
                what: "header",
                needed: HEADER_LEN,
                len: bytes.len(),
            });
        }
        let geometry = Geometry::parse_header(bytes, limits)?;
        let data_start = geometry.data_offset();
        if bytes.len() < data_start {
            return Err(Error::Truncated {
                what: "offset table",
                needed: data_start,
                len: bytes.len(),
            });
        }
        let file = L3File {
            geometry,
            table: &bytes[HEADER_LEN..data_start],
            data: &bytes[data_start..],
        };
        geometry.validate_offsets(|i| u32_at(file.table, 4 * i), file.data.len() as u64)?;
        Ok(file)
    }

    #[inline]
    fn entry_range(&self, i: usize) -> Range<usize> {
        let start = u32_at(self.table, 4 * i) as usize;
        let end = if 4 * (i + 1) < self.table.len() {
            u32_at(self.table, 4 * (i + 1)) as usize
        } else {
            self.data.len()
        };
        start..end
    }

    pub fn width(&self) -> u32 {
        self.geometry.width
    }
    pub fn height(&self) -> u32 {
        self.geometry.height
    }
    pub fn channels(&self) -> u8 {
        self.geometry.channels
    }
    pub fn patch_size(&self) -> u8 {
        self.geometry.patch_size
    }
    /// Patches per row of the grid: ⌈W / N⌉.
    pub fn patches_x(&self) -> u32 {
        self.geometry.patches_x
    }
    /// Rows of patches: ⌈H / N⌉.
    pub fn patches_y(&self) -> u32 {
        self.geometry.patches_y
    }
    pub fn patches_per_channel(&self) -> usize {
        self.geometry.patches_per_channel()
    }

    /// Rectangle of patch `patch` (row-major over the grid). Panics if `patch >= patches_per_channel()`.
    pub fn patch_rect(&self, patch: usize) -> Rect {
        assert!(
            patch < self.patches_per_channel(),
            "patch index out of range"
        );
        self.geometry.patch_rect(patch)
    }

    /// The whole patch-data region: everything after the offset table, to the end of the file.
    pub fn patch_data(&self) -> &'a [u8] {
        self.data
    }

    /// Byte range of one patch within [`patch_data`](Self::patch_data). Panics on an out-of-range index.
    pub fn patch_range(&self, channel: usize, patch: usize) -> Range<usize> {
        assert!(
            channel < self.channels() as usize && patch < self.patches_per_channel(),
            "patch index out of range"
        );
        self.entry_range(channel * self.patches_per_channel() + patch)
    }

    /// The bytes of one patch (validated to lie inside the file).
    pub fn patch_bytes(&self, channel: usize, patch: usize) -> &'a [u8] {
        &self.data[self.patch_range(channel, patch)]
    }

    /// Bytes of the decoded image: width × height × channels.
    pub fn decoded_len(&self) -> usize {
        self.width() as usize * self.height() as usize * self.channels() as usize
    }

    /// Offset of the patch data from the start of the file (header + offset table).
    pub fn data_offset(&self) -> usize {
        HEADER_LEN + self.table.len()
    }
}
