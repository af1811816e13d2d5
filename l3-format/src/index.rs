//! Reading only the bytes a region needs: parse the header and the offset table from the start of a file
//! ([`L3Index`]), ask which byte ranges hold the patches under a region, read just those ([`Fragments`]),
//! and decode the region from them. From a disk, a network file system or object storage that is the
//! difference between moving a whole 4K image and moving the 2 to 4 % of it a 224×224 crop covers.

use crate::error::{Error, Limits, PatchId};
use crate::format::{HEADER_LEN, Profile};
use crate::geometry::{Geometry, check_magic, u32_at};
use crate::pixel_layout::PixelLayout;
use crate::region;
use crate::v1;
use crate::v2::{self, AnsTables, container::Layout};
use std::ops::Range;
use vocab::Rect;

/// The prefix of an L3 file — header, (v2-ANS) frequency tables, offset table and, where the file has them,
/// the entry CRCs and the prefix CRC — without its patch data: validated exactly as [`crate::L3File::parse`]
/// validates them, given the file's length. The whole-file CRC-32C cannot be checked from a part of the
/// file; a version-2 file with entry CRCs (what the encoder writes by default, SPEC.md §2.11) has its
/// prefix CRC checked here and every entry's CRC checked by [`decode_region`](Self::decode_region) before
/// the entry is decoded, so a region read verifies every byte it uses. Older v2 files have only the
/// decoders' structural checks (ANS catches most damage, BP little; SPEC.md §2.10), and v1 none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct L3Index {
    geometry: Geometry,
    kind: IndexKind,
    file_len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum IndexKind {
    /// Start of each (channel, patch) entry relative to the patch data, then the data's length.
    V1 { bounds: Box<[u32]> },
    /// Start of each entry from the start of the file, then where the data ends (the CRC).
    V2 {
        layout: Layout,
        bounds: Box<[u32]>,
        tables: Option<AnsTables>,
        /// Each entry's CRC-32C, in files that have them.
        crcs: Option<Box<[u32]>>,
    },
}

impl L3Index {
    /// How many bytes at the start of a file its prefix (header, tables, offset table) takes, as far as
    /// `bytes` — the first bytes of the file, as many as were read — tell. Read with a loop:
    ///
    /// ```text
    /// have = read(0 .. min(HEADER_LEN, file_len))
    /// loop { n = prefix_len(have)?; if n <= have.len() || have.len() == file_len { break }
    ///        have = read(0 .. min(n, file_len)) }
    /// index = L3Index::parse(have, file_len)?
    /// ```
    ///
    /// Fewer than [`HEADER_LEN`] bytes give `HEADER_LEN` (after checking the magic on what there is). For
    /// v1 and v2-BP the header alone gives the exact answer. A v2-ANS prefix holds variable-length
    /// frequency tables before the offset table, so until `bytes` holds all of them the answer is a
    /// read-ahead larger than `bytes.len()` (at least 4 KiB of tables, then doubling what was read, plus
    /// the offset table); once they are in, it is exact. An answer no larger than `bytes.len()` means the
    /// prefix is complete.
    pub fn prefix_len(bytes: &[u8]) -> Result<usize, Error> {
        Self::prefix_len_with_limits(bytes, &Limits::default())
    }

    pub fn prefix_len_with_limits(bytes: &[u8], limits: &Limits) -> Result<usize, Error> {
        if bytes.len() < HEADER_LEN {
            check_magic(bytes)?;
            return Ok(HEADER_LEN);
        }
        let g = Geometry::parse(bytes, limits)?;
        let Some(profile) = g.profile else {
            return Ok(v1::container::data_offset(&g));
        };
        let n = v2::container::entries(&g, profile);
        let offsets = 4 * n
            + if g.entry_crcs {
                v2::container::crc_table_len(n)
            } else {
                0
            };
        match profile {
            Profile::Bp => Ok(HEADER_LEN + offsets),
            Profile::Ans => match v2::container::tables_end(&g, &bytes[HEADER_LEN..]) {
                Ok((_, end)) => Ok(end + offsets),
                Err(Error::Truncated { .. }) => {
                    Ok(bytes.len().max(HEADER_LEN + 4096).max(2 * bytes.len()) + offsets)
                }
                Err(e) => Err(e),
            },
        }
    }

    /// The next bytes to read to complete the prefix of a `file_len`-byte file, given the first `have`
    /// bytes already read: `Some(have.len() .. end)`, or `None` once [`parse`](Self::parse) has what it
    /// needs (or the whole file is in, and `parse` will say what is missing). Every caller that reads a
    /// prefix runs the same loop, so a v2-ANS file, whose variable-length tables need more than one read,
    /// is read the same way everywhere:
    ///
    /// ```
    /// # let file = l3_format::encode_with(&[7u8; 48], 4, 4, 3, &Default::default())?;
    /// let mut prefix = Vec::new();
    /// while let Some(r) = l3_format::L3Index::next_read(&prefix, file.len() as u64)? {
    ///     let at = prefix.len();
    ///     prefix.resize(r.end as usize, 0);
    ///     prefix[at..].copy_from_slice(&file[at..r.end as usize]); // a pread, or a ranged GET
    /// }
    /// let index = l3_format::L3Index::parse(&prefix, file.len() as u64)?;
    /// assert_eq!(index.width(), 4);
    /// # Ok::<(), l3_format::Error>(())
    /// ```
    pub fn next_read(have: &[u8], file_len: u64) -> Result<Option<Range<u64>>, Error> {
        Self::next_read_with_limits(have, file_len, &Limits::default())
    }

    pub fn next_read_with_limits(
        have: &[u8],
        file_len: u64,
        limits: &Limits,
    ) -> Result<Option<Range<u64>>, Error> {
        let need = (Self::prefix_len_with_limits(have, limits)? as u64).min(file_len);
        let at = have.len() as u64;
        Ok((need > at).then_some(at..need))
    }

    /// Parses the prefix from `prefix` (at least [`prefix_len`](Self::prefix_len) bytes; more is fine) of a
    /// file that is `file_len` bytes long.
    pub fn parse(prefix: &[u8], file_len: u64) -> Result<Self, Error> {
        Self::parse_with_limits(prefix, file_len, &Limits::default())
    }

    pub fn parse_with_limits(prefix: &[u8], file_len: u64, limits: &Limits) -> Result<Self, Error> {
        let geometry = Geometry::parse(prefix, limits)?;
        if let Some(profile) = geometry.profile {
            let layout = v2::container::layout(&geometry, prefix, file_len, true)?;
            let bounds = (0..layout.entries)
                .map(|i| u32_at(prefix, layout.offsets_at + 4 * i))
                .chain(std::iter::once(layout.data_end as u32))
                .collect();
            let crcs = layout.crcs_at.map(|_| {
                (0..layout.entries)
                    .filter_map(|i| v2::container::entry_crc(&layout, prefix, i))
                    .collect()
            });
            let tables = match profile {
                Profile::Bp => None,
                Profile::Ans => Some(
                    v2::container::tables_end(&geometry, &prefix[HEADER_LEN..layout.offsets_at])?.0,
                ),
            };
            return Ok(L3Index {
                geometry,
                kind: IndexKind::V2 {
                    layout,
                    bounds,
                    tables,
                    crcs,
                },
                file_len,
            });
        }
        let data_offset = v1::container::data_offset(&geometry);
        if prefix.len() < data_offset || file_len < data_offset as u64 {
            return Err(Error::Truncated {
                what: "offset table",
                needed: data_offset,
                len: usize::try_from(file_len).map_or(prefix.len(), |f| f.min(prefix.len())),
            });
        }
        let data_len = file_len - data_offset as u64;
        if u32::try_from(data_len).is_err() {
            return Err(Error::EncodedTooLarge {
                bytes: usize::try_from(data_len).unwrap_or(usize::MAX),
            });
        }
        let table = &prefix[HEADER_LEN..data_offset];
        v1::container::validate_offsets(&geometry, |i| u32_at(table, 4 * i), data_len)?;
        let bounds = (0..geometry.entries())
            .map(|i| u32_at(table, 4 * i))
            .chain(std::iter::once(data_len as u32))
            .collect();
        Ok(L3Index {
            geometry,
            kind: IndexKind::V1 { bounds },
            file_len,
        })
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
    /// The format version: 1 or 2.
    pub fn version(&self) -> u16 {
        self.geometry.version
    }
    /// The v2 profile, `None` for version 1.
    pub fn profile(&self) -> Option<Profile> {
        self.geometry.profile
    }
    pub fn file_len(&self) -> u64 {
        self.file_len
    }
    /// Bytes of header, tables and offset table: where the patch data starts.
    pub fn data_offset(&self) -> u64 {
        match &self.kind {
            IndexKind::V1 { .. } => v1::container::data_offset(&self.geometry) as u64,
            IndexKind::V2 { layout, .. } => layout.data_start as u64,
        }
    }
    /// Bytes of patch data: from [`data_offset`](Self::data_offset) to the end of the file (v1) or to
    /// the CRC-32C that ends a v2 file — what `l3 info` reports as "patch data bytes".
    pub fn patch_data_len(&self) -> u64 {
        match &self.kind {
            IndexKind::V1 { .. } => self.file_len - self.data_offset(),
            IndexKind::V2 { layout, .. } => (layout.data_end - layout.data_start) as u64,
        }
    }
    /// The v2-ANS frequency tables (`None` for v1 and v2-BP).
    pub fn ans_tables(&self) -> Option<&AnsTables> {
        match &self.kind {
            IndexKind::V2 { tables, .. } => tables.as_ref(),
            IndexKind::V1 { .. } => None,
        }
    }
    /// Memory this index holds, for cache accounting.
    pub fn heap_bytes(&self) -> usize {
        match &self.kind {
            IndexKind::V1 { bounds } => bounds.len() * 4,
            IndexKind::V2 {
                bounds,
                tables,
                crcs,
                ..
            } => {
                bounds.len() * 4
                    + tables.as_ref().map_or(0, AnsTables::heap_bytes)
                    + crcs.as_ref().map_or(0, |c| c.len() * 4)
            }
        }
    }

    /// Whether this is a version-2 file with a CRC-32C per offset-table entry (SPEC.md §2.11): its prefix
    /// CRC was verified by [`parse`](Self::parse), and every entry is verified before it is decoded.
    pub fn has_entry_crcs(&self) -> bool {
        self.geometry.entry_crcs
    }

    /// Checks `bytes`, read from [`patch_range`](Self::patch_range)`(channel, patch)`, against the entry's
    /// CRC-32C: for a reader that hands the bytes to another decoder (a GPU's) rather than to
    /// [`decode_region`](Self::decode_region), which checks them itself. `Ok` for a file without entry
    /// CRCs (nothing to check: see [`has_entry_crcs`](Self::has_entry_crcs)). A patch or channel out of
    /// range is [`Error::MissingBytes`] naming it (the file has no such bytes).
    pub fn check_patch(&self, channel: usize, patch: usize, bytes: &[u8]) -> Result<(), Error> {
        let per = self.geometry.patches_per_channel();
        let IndexKind::V2 {
            layout,
            crcs: Some(crcs),
            ..
        } = &self.kind
        else {
            return Ok(());
        };
        let i = match layout.profile {
            Profile::Ans => patch,
            Profile::Bp => channel * per + patch,
        };
        let id = v2::container::entry_id(&self.geometry, layout.profile, i);
        match crcs.get(i) {
            Some(&stored) if channel < self.geometry.channels as usize && patch < per => {
                v2::container::check_entry(stored, id, bytes)
            }
            _ => Err(Error::MissingBytes {
                patch: PatchId { channel, patch },
                start: 0,
                end: 0,
            }),
        }
    }

    /// File byte range of the bytes that hold `patch` of `channel`: v1 and v2-BP store each (channel or
    /// plane, patch) apart; a v2-ANS chunk holds every channel of its patch (the same range for each).
    /// `None` for an index out of range. (v2-BP planes are G, R−G, B−G, A.)
    pub fn patch_range(&self, channel: usize, patch: usize) -> Option<Range<u64>> {
        let g = &self.geometry;
        let per = g.patches_per_channel();
        if channel >= g.channels as usize || patch >= per {
            return None;
        }
        Some(match g.profile {
            Some(Profile::Ans) => self.entry(patch),
            _ => self.entry(channel * per + patch),
        })
    }

    /// File byte range of offset-table entry `i` (v1: (channel, patch); v2-BP: (plane, patch); v2-ANS:
    /// the chunk of patch i).
    fn entry(&self, i: usize) -> Range<u64> {
        match &self.kind {
            IndexKind::V1 { bounds } => {
                let base = self.data_offset();
                base + u64::from(bounds[i])..base + u64::from(bounds[i + 1])
            }
            IndexKind::V2 { bounds, .. } => u64::from(bounds[i])..u64::from(bounds[i + 1]),
        }
    }

    /// The byte ranges of the file that hold every patch under `region`, in file order; neighbours closer
    /// than `max_gap` bytes are merged (one read of a small gap is cheaper than two requests).
    pub fn region_ranges(&self, region: Rect, max_gap: u64) -> Result<Vec<Range<u64>>, Error> {
        let g = &self.geometry;
        if !region.fits(g.width, g.height) {
            return Err(Error::BadRegion {
                region,
                width: g.width,
                height: g.height,
            });
        }
        let per = g.patches_per_channel();
        // Entries of one grid row are contiguous in the file; v2-ANS has one entry per patch for all planes.
        let planes = match g.profile {
            Some(Profile::Ans) => 1,
            _ => g.channels as usize,
        };
        let mut out: Vec<Range<u64>> = Vec::new();
        for ch in 0..planes {
            for (first, count) in g.rows_under(region) {
                let (a, b) = (ch * per + first, ch * per + first + count - 1);
                let r = self.entry(a).start..self.entry(b).end;
                match out.last_mut() {
                    Some(last) if r.start <= last.end.saturating_add(max_gap) => {
                        last.end = last.end.max(r.end)
                    }
                    _ => out.push(r),
                }
            }
        }
        Ok(out)
    }

    /// Decodes `region` from `data`, which must hold (at least) the ranges
    /// [`region_ranges`](Self::region_ranges) named for it. Pixels equal a whole-file decode's. In a file
    /// with entry CRCs each entry is checked against its CRC-32C before it is decoded
    /// ([`Error::EntryCrcMismatch`]).
    pub fn decode_region(
        &self,
        data: &Fragments,
        region: Rect,
        out: &mut [u8],
        layout: PixelLayout,
    ) -> Result<(), Error> {
        let per = self.geometry.patches_per_channel();
        let missing = |i: usize, range: Range<u64>| {
            let patch = match &self.kind {
                IndexKind::V2 { layout, .. } => {
                    v2::container::entry_id(&self.geometry, layout.profile, i)
                }
                IndexKind::V1 { .. } => PatchId {
                    channel: i / per,
                    patch: i % per,
                },
            };
            Error::MissingBytes {
                patch,
                start: range.start,
                end: range.end,
            }
        };
        region::decode(
            &self.geometry,
            self.ans_tables(),
            region,
            out,
            layout,
            |i| {
                let range = self.entry(i);
                let bytes = data.get(range.clone()).ok_or_else(|| missing(i, range))?;
                if let IndexKind::V2 {
                    layout,
                    crcs: Some(crcs),
                    ..
                } = &self.kind
                {
                    let id = v2::container::entry_id(&self.geometry, layout.profile, i);
                    v2::container::check_entry(crcs[i], id, bytes)?;
                }
                Ok(bytes)
            },
        )
    }
}

/// Byte ranges of one file, read into one reusable buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragments {
    /// (file range, start in `buf`), sorted by file offset, disjoint.
    spans: Vec<(Range<u64>, usize)>,
    buf: Vec<u8>,
}

impl Fragments {
    pub fn new() -> Self {
        Self::default()
    }

    /// A whole file, as one fragment starting at byte 0.
    pub fn whole(bytes: Vec<u8>) -> Self {
        Fragments {
            spans: vec![(0..bytes.len() as u64, 0)],
            buf: bytes,
        }
    }

    /// Makes room for `ranges` (sorted and disjoint, as [`L3Index::region_ranges`] returns them), reusing
    /// the buffer; fill them through [`slices_mut`](Self::slices_mut).
    pub fn reset(&mut self, ranges: &[Range<u64>]) {
        self.spans.clear();
        let mut at = 0usize;
        for r in ranges {
            self.spans.push((r.clone(), at));
            at += (r.end - r.start) as usize;
        }
        self.buf.clear();
        self.buf.resize(at, 0);
    }

    /// Each range with the part of the buffer its bytes go to.
    pub fn slices_mut(&mut self) -> impl Iterator<Item = (Range<u64>, &mut [u8])> {
        let mut rest = self.buf.as_mut_slice();
        self.spans.iter().map(move |(r, _)| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut((r.end - r.start) as usize);
            rest = tail;
            (r.clone(), head)
        })
    }

    /// The bytes of `range`, if one fragment holds all of it.
    pub fn get(&self, range: Range<u64>) -> Option<&[u8]> {
        let i = self.spans.partition_point(|(r, _)| r.start <= range.start);
        let (r, at) = self.spans.get(i.checked_sub(1)?)?;
        if range.end > r.end || range.start > range.end {
            return None;
        }
        let from = at + (range.start - r.start) as usize;
        self.buf
            .get(from..from + (range.end - range.start) as usize)
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The file ranges held.
    pub fn ranges(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.spans.iter().map(|(r, _)| r.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{L3File, encode};

    fn image(w: u32, h: u32, c: u8) -> Vec<u8> {
        let mut s = 0x9E37_79B9u32;
        (0..w * h * c as u32)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                ((i % (w * c as u32)) / 5 + i / (w * c as u32)) as u8 ^ (s as u8 & 15)
            })
            .collect()
    }

    #[test]
    fn fragments_hold_exactly_what_was_read() {
        let mut f = Fragments::new();
        f.reset(&[10..20, 30..35]);
        for (r, s) in f.slices_mut() {
            for (k, b) in s.iter_mut().enumerate() {
                *b = (r.start as usize + k) as u8;
            }
        }
        assert_eq!(f.get(12..15), Some(&[12u8, 13, 14][..]));
        assert_eq!(f.get(30..35).map(<[u8]>::len), Some(5));
        assert_eq!(f.get(19..21), None);
        assert_eq!(f.get(5..6), None);
        assert_eq!(f.get(35..36), None);
        assert_eq!(f.len(), 15);
    }

    #[test]
    fn region_from_fragments_equals_whole_decode() {
        for (w, h, c, n) in [
            (301u32, 177u32, 3u8, 32u8),
            (130, 65, 4, 64),
            (67, 40, 1, 17),
        ] {
            let px = image(w, h, c);
            let file = encode(&px, w, h, c, n).unwrap();
            let header = &file[..HEADER_LEN];
            let prefix = L3Index::prefix_len(header).unwrap();
            let idx = L3Index::parse(&file[..prefix], file.len() as u64).unwrap();
            let whole = L3File::parse(&file).unwrap();
            for region in [
                Rect::new(0, 0, w, h),
                Rect::new(w / 3, h / 4, w / 2, h / 3),
                Rect::new(w - 1, h - 1, 1, 1),
                Rect::new(5, 3, 1, h - 3),
            ] {
                let ranges = idx.region_ranges(region, 0).unwrap();
                let mut frags = Fragments::new();
                frags.reset(&ranges);
                for (r, s) in frags.slices_mut() {
                    s.copy_from_slice(&file[r.start as usize..r.end as usize]);
                }
                let read: u64 = ranges.iter().map(|r| r.end - r.start).sum();
                if region.w < w / 2 {
                    assert!(read < (file.len() - prefix) as u64, "{region}: read {read}");
                }
                for planar in [false, true] {
                    let layout = PixelLayout::packed(region.w, region.h, c, planar);
                    let len = layout.required_len(region.w, region.h, c).unwrap();
                    let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                    idx.decode_region(&frags, region, &mut a, layout).unwrap();
                    whole.decode_region(region, &mut b, layout).unwrap();
                    assert_eq!(a, b, "{w}x{h}x{c} {region} planar={planar}");
                    for y in 0..region.h {
                        for x in 0..region.w {
                            for ch in 0..c as u32 {
                                let want = px[(((region.y + y) * w + region.x + x) * c as u32 + ch)
                                    as usize];
                                let at = if planar {
                                    (ch * region.w * region.h + y * region.w + x) as usize
                                } else {
                                    ((y * region.w + x) * c as u32 + ch) as usize
                                };
                                assert_eq!(a[at], want);
                            }
                        }
                    }
                }
            }
            // A fragment set that lacks a patch is an error naming it, not a panic.
            let region = Rect::new(0, 0, w, h);
            let mut frags = Fragments::new();
            let header_only = std::iter::once(0..prefix as u64).collect::<Vec<_>>();
            frags.reset(&header_only);
            let mut out = vec![0u8; (w * h * c as u32) as usize];
            let e = idx
                .decode_region(
                    &frags,
                    region,
                    &mut out,
                    PixelLayout::packed(w, h, c, false),
                )
                .unwrap_err();
            assert!(matches!(e, Error::MissingBytes { .. }), "{e}");
        }
    }

    #[test]
    fn index_rejects_what_parse_rejects() {
        let px = image(70, 45, 3);
        let file = encode(&px, 70, 45, 3, 32).unwrap();
        let prefix = L3Index::prefix_len(&file).unwrap();
        // A file shorter than its table says is caught from its length alone.
        assert!(L3Index::parse(&file[..prefix], (prefix + 3) as u64).is_err());
        assert!(L3Index::parse(&file[..prefix - 1], file.len() as u64).is_err());
        assert!(matches!(
            L3Index::prefix_len(b"PNG\x0d"),
            Err(Error::BadMagic { .. })
        ));
        let mut bad = file.clone();
        bad[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            L3Index::parse(&bad[..prefix], bad.len() as u64).unwrap_err(),
            L3File::parse(&bad).unwrap_err()
        );
    }
}
