//! The file layout: header, offset table, patch data; [`L3File`] is a validated zero-copy view of it.

use crate::error::{Error, Limits, PatchId};
use crate::{HEADER_LEN, MAGIC, VERSION};
use std::ops::Range;

/// A patch's place in the image, in pixels. Edge patches are partial (`w`, `h` < N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchRect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

/// A parsed L3 file borrowing its bytes. Construction validates everything the decoder relies on, so the
/// accessors below cannot fail and decoding only has to check the inside of each patch.
#[derive(Debug, Clone, Copy)]
pub struct L3File<'a> {
    width: u32,
    height: u32,
    channels: u8,
    patch_size: u8,
    patches_x: u32,
    patches_y: u32,
    table: &'a [u8],
    data: &'a [u8],
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
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
        let samples = (width as u64)
            .checked_mul(height as u64)
            .and_then(|p| p.checked_mul(channels as u64));
        match samples {
            Some(s) if s <= limits.max_pixels && usize::try_from(s).is_ok() => {}
            _ => {
                return Err(Error::TooLarge {
                    width,
                    height,
                    channels,
                    limit: limits.max_pixels,
                });
            }
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
        let (patches_x, patches_y) = (width.div_ceil(n), height.div_ceil(n));
        // ≤ samples ≤ limit, so no overflow.
        let entries = patches_x as usize * patches_y as usize * channels as usize;
        let table_len = entries.checked_mul(4).ok_or(Error::TooLarge {
            width,
            height,
            channels,
            limit: limits.max_pixels,
        })?;
        let data_start = HEADER_LEN + table_len;
        if bytes.len() < data_start {
            return Err(Error::Truncated {
                what: "offset table",
                needed: data_start,
                len: bytes.len(),
            });
        }
        let file = L3File {
            width,
            height,
            channels,
            patch_size,
            patches_x,
            patches_y,
            table: &bytes[HEADER_LEN..data_start],
            data: &bytes[data_start..],
        };
        file.validate_offsets()?;
        Ok(file)
    }

    fn validate_offsets(&self) -> Result<(), Error> {
        let first = u32_at(self.table, 0);
        if first != 0 {
            return Err(Error::FirstOffsetNotZero { offset: first });
        }
        let per = self.patches_per_channel();
        let entries = per * self.channels as usize;
        let data_len = self.data.len();
        let id = |i: usize| PatchId {
            channel: i / per,
            patch: i % per,
        };
        let mut previous = 0u32;
        for i in 0..entries {
            let offset = u32_at(self.table, 4 * i);
            if offset as usize > data_len {
                return Err(Error::OffsetOutOfRange {
                    patch: id(i),
                    offset,
                    data_len,
                });
            }
            if offset < previous {
                return Err(Error::OffsetOutOfOrder {
                    patch: id(i),
                    offset,
                    previous,
                });
            }
            previous = offset;
        }
        // Every row takes at least its 2-byte header: reject impossible sizes (and decompression bombs) now.
        for i in 0..entries {
            let r = self.entry_range(i);
            let rows = self.patch_rect(i % per).h as usize;
            if r.len() < 2 * rows {
                return Err(Error::PatchTooShort {
                    patch: id(i),
                    len: r.len(),
                    rows,
                    min: 2 * rows,
                });
            }
        }
        Ok(())
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
        self.width
    }
    pub fn height(&self) -> u32 {
        self.height
    }
    pub fn channels(&self) -> u8 {
        self.channels
    }
    pub fn patch_size(&self) -> u8 {
        self.patch_size
    }
    /// Patches per row of the grid: ⌈W / N⌉.
    pub fn patches_x(&self) -> u32 {
        self.patches_x
    }
    /// Rows of patches: ⌈H / N⌉.
    pub fn patches_y(&self) -> u32 {
        self.patches_y
    }
    pub fn patches_per_channel(&self) -> usize {
        self.patches_x as usize * self.patches_y as usize
    }

    /// Rectangle of patch `patch` (row-major over the grid). Panics if `patch >= patches_per_channel()`.
    pub fn patch_rect(&self, patch: usize) -> PatchRect {
        assert!(
            patch < self.patches_per_channel(),
            "patch index out of range"
        );
        let n = self.patch_size as u32;
        let (gx, gy) = (
            (patch % self.patches_x as usize) as u32,
            (patch / self.patches_x as usize) as u32,
        );
        let (x, y) = (gx * n, gy * n);
        PatchRect {
            x,
            y,
            w: n.min(self.width - x),
            h: n.min(self.height - y),
        }
    }

    /// The whole patch-data region: everything after the offset table, to the end of the file.
    pub fn patch_data(&self) -> &'a [u8] {
        self.data
    }

    /// Byte range of one patch within [`patch_data`](Self::patch_data). Panics on an out-of-range index.
    pub fn patch_range(&self, channel: usize, patch: usize) -> Range<usize> {
        assert!(
            channel < self.channels as usize && patch < self.patches_per_channel(),
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
        self.width as usize * self.height as usize * self.channels as usize
    }

    /// Offset of the patch data from the start of the file (header + offset table).
    pub fn data_offset(&self) -> usize {
        HEADER_LEN + self.table.len()
    }
}
