//! The file layout: header, offset table, patch data; [`L3File`] is a validated zero-copy view of it.

use crate::error::{Error, Limits, ParseOptions, PatchId};
use crate::v2::{self, Format, Layout, Profile};
use crate::{HEADER_LEN, MAGIC};
use std::ops::Range;
pub use vocab::Rect;

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

    /// Parses the fixed header (the caller has checked that `bytes` holds it) against `limits`.
    pub fn parse_header(bytes: &[u8], limits: &Limits) -> Result<Geometry, Error> {
        let found = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if found != MAGIC {
            return Err(Error::BadMagic { found });
        }
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
        let profile = if version == 1 {
            if patch_size == 0 {
                return Err(Error::ZeroPatchSize);
            }
            if bytes[17..20] != [0, 0, 0] {
                return Err(Error::ReservedNotZero);
            }
            None
        } else {
            if !v2::valid_v2_patch_size(patch_size) {
                return Err(Error::BadPatchSize { found: patch_size });
            }
            let profile =
                Profile::from_byte(bytes[17]).ok_or(Error::BadProfile { found: bytes[17] })?;
            if bytes[18..20] != [0, 0] {
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
        };
        // entries ≤ samples ≤ limit, so the table's size fits a usize; check anyway on narrow targets.
        g.entries().checked_mul(4).ok_or(too_large)?;
        Ok(g)
    }

    /// Bytes of header and offset table (version 1).
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

/// A parsed L3 file (version 1 or 2) borrowing its bytes. Construction validates everything the decoder
/// relies on (and, for version 2, the CRC-32C unless told otherwise), so the accessors below cannot fail and
/// decoding only has to check the inside of each patch.
#[derive(Debug, Clone, Copy)]
pub struct L3File<'a> {
    pub(crate) geometry: Geometry,
    pub(crate) bytes: &'a [u8],
    pub(crate) kind: Kind,
}

/// Where the parts of the file are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// Version 1: the offset table ends (and the patch data starts) at `data_start`.
    V1 {
        data_start: usize,
    },
    V2(Layout),
}

#[inline(always)]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<'a> L3File<'a> {
    /// Parses and validates with the default [`ParseOptions`] (default [`Limits`], CRC verified).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        Self::parse_with(bytes, &ParseOptions::default())
    }

    /// [`parse`](Self::parse) with other limits (the CRC of a version-2 file is verified).
    pub fn parse_with_limits(bytes: &'a [u8], limits: &Limits) -> Result<Self, Error> {
        Self::parse_with(
            bytes,
            &ParseOptions {
                limits: *limits,
                verify_crc: true,
            },
        )
    }

    /// Parses and validates a file of either version: magic, version, dimensions against the limits,
    /// channels, bit depth, patch size, reserved bytes; then
    /// - version 1: every offset (first is 0, non-decreasing, within the data, room for each row's 2-byte
    ///   minimum);
    /// - version 2: the CRC-32C of the whole file (unless `opts.verify_crc` is false), the profile, the ANS
    ///   frequency tables (each used one sums to 4096), and every offset (the first right after the table,
    ///   non-decreasing, before the CRC, room for each entry's minimum),
    ///
    /// all before any patch data is read.
    pub fn parse_with(bytes: &'a [u8], opts: &ParseOptions) -> Result<Self, Error> {
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
        let geometry = Geometry::parse_header(bytes, &opts.limits)?;
        if geometry.version == 2 {
            if opts.verify_crc {
                verify_crc(bytes)?;
            }
            let layout = v2::layout(&geometry, bytes, bytes.len() as u64)?;
            return Ok(L3File {
                geometry,
                bytes,
                kind: Kind::V2(layout),
            });
        }
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
            bytes,
            kind: Kind::V1 { data_start },
        };
        let table = &bytes[HEADER_LEN..data_start];
        geometry.validate_offsets(|i| u32_at(table, 4 * i), (bytes.len() - data_start) as u64)?;
        Ok(file)
    }

    /// The v1 offset table and patch data (empty for v2).
    #[inline]
    fn v1_parts(&self) -> (&'a [u8], &'a [u8]) {
        match self.kind {
            Kind::V1 { data_start } => (
                &self.bytes[HEADER_LEN..data_start],
                &self.bytes[data_start..],
            ),
            Kind::V2(_) => (&[], &[]),
        }
    }

    #[inline]
    fn entry_range(&self, i: usize) -> Range<usize> {
        let (table, data) = self.v1_parts();
        let start = u32_at(table, 4 * i) as usize;
        let end = if 4 * (i + 1) < table.len() {
            u32_at(table, 4 * (i + 1)) as usize
        } else {
            data.len()
        };
        start..end
    }

    /// The v2 view of this file, `None` for version 1.
    pub(crate) fn v2(&self) -> Option<v2::decode::V2<'a>> {
        match self.kind {
            Kind::V1 { .. } => None,
            Kind::V2(l) => Some(v2::decode::V2 {
                g: self.geometry,
                l,
                bytes: self.bytes,
            }),
        }
    }

    /// The host-side plan of a version-2 file for a device decoder (`None` for version 1).
    pub fn v2_plan(&self) -> Option<v2::V2Plan> {
        match self.kind {
            Kind::V1 { .. } => None,
            // Everything was validated by parse, so building the plan cannot fail.
            Kind::V2(l) => v2::V2Plan::new(&self.geometry, &l, self.bytes).ok(),
        }
    }

    /// The frequency tables of a v2-ANS file (`None` for v1 and v2-BP), parsed again from the bytes that
    /// [`parse`](Self::parse) validated.
    pub fn ans_tables(&self) -> Option<v2::AnsTables> {
        match self.kind {
            Kind::V2(l) if l.profile == Profile::Ans => {
                v2::tables_end(&self.geometry, &self.bytes[HEADER_LEN..l.offsets_at])
                    .ok()
                    .map(|(t, _)| t)
            }
            _ => None,
        }
    }

    /// The format version in the header: 1 or 2.
    pub fn version(&self) -> u16 {
        self.geometry.version
    }

    /// The v2 profile, `None` for version 1.
    pub fn profile(&self) -> Option<Profile> {
        self.geometry.profile
    }

    /// Version and profile together.
    pub fn format(&self) -> Format {
        match self.geometry.profile {
            None => Format::V1,
            Some(p) => Format::V2(p),
        }
    }

    /// The whole file.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
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

    /// The patch data: every byte after the header, the tables and the offset table, up to the end of the
    /// file (v1) or to the CRC (v2). Its length is what `l3 info` reports as "patch data bytes".
    pub fn patch_data(&self) -> &'a [u8] {
        match self.kind {
            Kind::V1 { data_start } => &self.bytes[data_start..],
            Kind::V2(l) => &self.bytes[l.data_start..l.data_end],
        }
    }

    /// Byte range of one patch within [`patch_data`](Self::patch_data): the patch of one channel (v1, and
    /// v2-BP where it is one plane of the colour-transformed image: G, R−G, B−G, A), or for v2-ANS the
    /// chunk of patch `patch`, which holds every channel (so the same range for every `channel`). Panics on
    /// an out-of-range index.
    pub fn patch_range(&self, channel: usize, patch: usize) -> Range<usize> {
        assert!(
            channel < self.channels() as usize && patch < self.patches_per_channel(),
            "patch index out of range"
        );
        match self.kind {
            Kind::V1 { .. } => self.entry_range(channel * self.patches_per_channel() + patch),
            Kind::V2(l) => {
                let i = match l.profile {
                    Profile::Bp => channel * self.patches_per_channel() + patch,
                    Profile::Ans => patch,
                };
                let r = v2::entry_range(&l, self.bytes, i);
                r.start - l.data_start..r.end - l.data_start
            }
        }
    }

    /// The bytes of one patch (validated to lie inside the file); see [`patch_range`](Self::patch_range).
    pub fn patch_bytes(&self, channel: usize, patch: usize) -> &'a [u8] {
        &self.patch_data()[self.patch_range(channel, patch)]
    }

    /// Bytes of the decoded image: width × height × channels.
    pub fn decoded_len(&self) -> usize {
        self.width() as usize * self.height() as usize * self.channels() as usize
    }

    /// Offset of the patch data from the start of the file (header, tables and offset table).
    pub fn data_offset(&self) -> usize {
        match self.kind {
            Kind::V1 { data_start } => data_start,
            Kind::V2(l) => l.data_start,
        }
    }
}

/// Checks a v2 file's trailing CRC-32C against its bytes (`bytes` holds at least the header).
pub(crate) fn verify_crc(bytes: &[u8]) -> Result<(), Error> {
    if bytes.len() < HEADER_LEN + v2::CRC_LEN {
        return Err(Error::Truncated {
            what: "CRC",
            needed: HEADER_LEN + v2::CRC_LEN,
            len: bytes.len(),
        });
    }
    let end = bytes.len() - v2::CRC_LEN;
    let stored = u32_at(bytes, end);
    let computed = crate::crc32c::crc32c(&bytes[..end]);
    if stored != computed {
        return Err(Error::CrcMismatch { stored, computed });
    }
    Ok(())
}
