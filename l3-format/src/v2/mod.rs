//! Version 2 (SPEC.md, part 2): the same patch grid as v1 with a colour transform, per-run predictor
//! selectors that may use the left neighbour (a row decodes as a prefix sum), and two entropy back ends —
//! BP (bit-packed groups, no tables) and ANS (static context rANS, 32 lanes per patch) — in a container
//! that ends with a CRC-32C.
//!
//! - `layout` (`Layout`): the container, validated from a whole file or from a prefix and a length.
//! - `front`: colour, prediction, zigzag, the row scan (shared by both profiles and both directions).
//! - `bp`, `ans`: the two bitstreams; `encode`, `decode`: whole images, regions, threads.

pub(crate) mod ans;
pub(crate) mod bits;
pub(crate) mod bp;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod front;

use crate::HEADER_LEN;
pub use ans::{
    AnsTables, FIRST_ROW_BUCKET, LANES, PROB_BITS, RANS_L, STATE_BYTES, bucket, contexts,
    residual_context, selector_context,
};

use crate::error::{Error, PatchId};
use crate::file::Geometry;

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
    /// [`crate::DEFAULT_FORMAT`]; a profile alone means version 2; version 2 alone means ANS (the smaller
    /// profile). A profile with version 1, or another version, is refused with the reason.
    pub fn resolve(version: Option<u16>, profile: Option<Profile>) -> Result<Format, String> {
        match (version, profile) {
            (None, None) => Ok(crate::DEFAULT_FORMAT),
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

    /// The patch size used when none is given: [`crate::default_patch_size`] for v1, 128 for v2 (the
    /// design's recommendation; SPEC.md §2.9 has the measurements).
    pub fn default_patch_size(self, width: u32, height: u32) -> u8 {
        match self {
            Format::V1 => crate::default_patch_size(width, height),
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

/// Bytes of the CRC-32C trailer.
pub(crate) const CRC_LEN: usize = 4;

/// Where the parts of a v2 container lie, validated: every offset is in order, inside the data, and leaves
/// each entry its minimum size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub profile: Profile,
    /// Start of the offset table (= end of the ANS table bitstream; 20 for BP).
    pub offsets_at: usize,
    /// Entries in the offset table: C·P (BP: one per plane and patch) or P (ANS: one chunk per patch).
    pub entries: usize,
    /// Where the data starts (right after the offset table).
    pub data_start: usize,
    /// Where the data ends (the CRC's position: file length − 4).
    pub data_end: usize,
}

/// The smallest byte length of entry `i` (see [`Layout::entries`]).
fn min_entry_len(g: &Geometry, profile: Profile, i: usize) -> usize {
    match profile {
        Profile::Ans => ans::STATE_BYTES,
        Profile::Bp => {
            let r = g.patch_rect(i % g.patches_per_channel());
            (0..r.h as usize)
                .map(|row| bp::min_row_len(r.w as usize, row))
                .sum()
        }
    }
}

/// The patch an entry belongs to (for errors).
pub(crate) fn entry_id(g: &Geometry, profile: Profile, i: usize) -> PatchId {
    match profile {
        Profile::Bp => PatchId {
            channel: i / g.patches_per_channel(),
            patch: i % g.patches_per_channel(),
        },
        Profile::Ans => PatchId {
            channel: 0,
            patch: i,
        },
    }
}

/// Entries of the offset table of a `profile` file of geometry `g`.
pub(crate) fn entries(g: &Geometry, profile: Profile) -> usize {
    match profile {
        Profile::Bp => g.entries(),
        Profile::Ans => g.patches_per_channel(),
    }
}

/// Where the table bitstream ends, from the bytes after the header (`rest`, which may be a prefix of it).
/// ANS only; `Err(Truncated)` when `rest` ends inside the tables.
pub(crate) fn tables_end(g: &Geometry, rest: &[u8]) -> Result<(ans::AnsTables, usize), Error> {
    let (t, len) = ans::AnsTables::parse(rest, ans::contexts(g.channels))?;
    Ok((t, HEADER_LEN + len))
}

/// Validates the container of a v2 file of `file_len` bytes from `prefix` (a prefix of the file holding at
/// least the header, the tables and the offset table).
pub(crate) fn layout(g: &Geometry, prefix: &[u8], file_len: u64) -> Result<Layout, Error> {
    let profile = g
        .profile
        .ok_or(Error::UnsupportedVersion { found: g.version })?;
    if file_len < (HEADER_LEN + CRC_LEN) as u64 {
        return Err(Error::Truncated {
            what: "CRC",
            needed: HEADER_LEN + CRC_LEN,
            len: file_len as usize,
        });
    }
    let data_end = file_len - CRC_LEN as u64;
    if data_end > u64::from(u32::MAX) {
        return Err(Error::EncodedTooLarge {
            bytes: usize::try_from(data_end).unwrap_or(usize::MAX),
        });
    }
    let data_end = data_end as usize;
    let avail = &prefix[..prefix.len().min(data_end)];
    let offsets_at = match profile {
        Profile::Bp => HEADER_LEN,
        Profile::Ans => tables_end(g, &avail[HEADER_LEN..])?.1,
    };
    let n = entries(g, profile);
    let data_start = n
        .checked_mul(4)
        .and_then(|t| t.checked_add(offsets_at))
        .ok_or(Error::Truncated {
            what: "offset table",
            needed: usize::MAX,
            len: avail.len(),
        })?;
    if avail.len() < data_start {
        return Err(Error::Truncated {
            what: "offset table",
            needed: data_start,
            len: avail.len(),
        });
    }
    let table = &avail[offsets_at..data_start];
    let off = |i: usize| crate::file::u32_at(table, 4 * i) as usize;
    let first = off(0);
    if first != data_start {
        return Err(Error::FirstOffsetMisplaced {
            offset: first as u32,
            expected: data_start as u64,
        });
    }
    let mut previous = first;
    for i in 0..n {
        let o = off(i);
        let id = entry_id(g, profile, i);
        if o > data_end {
            return Err(Error::OffsetOutOfRange {
                patch: id,
                offset: o as u32,
                data_len: data_end,
            });
        }
        if o < previous {
            return Err(Error::OffsetOutOfOrder {
                patch: id,
                offset: o as u32,
                previous: previous as u32,
            });
        }
        previous = o;
    }
    for i in 0..n {
        let end = if i + 1 < n { off(i + 1) } else { data_end };
        let len = end - off(i);
        let id = entry_id(g, profile, i);
        match profile {
            Profile::Ans => {
                if len < ans::STATE_BYTES || !(len - ans::STATE_BYTES).is_multiple_of(2) {
                    return Err(Error::ChunkLength { patch: id, len });
                }
            }
            Profile::Bp => {
                let min = min_entry_len(g, profile, i);
                if len < min {
                    return Err(Error::PatchTooShort {
                        patch: id,
                        len,
                        rows: g.patch_rect(id.patch).h as usize,
                        min,
                    });
                }
            }
        }
    }
    Ok(Layout {
        profile,
        offsets_at,
        entries: n,
        data_start,
        data_end,
    })
}

/// File byte range of entry `i` of a validated layout, read from the offset table in `bytes`.
#[inline]
pub(crate) fn entry_range(l: &Layout, bytes: &[u8], i: usize) -> std::ops::Range<usize> {
    let start = crate::file::u32_at(bytes, l.offsets_at + 4 * i) as usize;
    let end = if i + 1 < l.entries {
        crate::file::u32_at(bytes, l.offsets_at + 4 * (i + 1)) as usize
    } else {
        l.data_end
    };
    start..end
}

/// What a device (GPU) decoder needs from a version-2 file, validated on the host: the grid, each
/// offset-table entry's bytes, and for ANS the frequency tables (with [`AnsTables::cum`] to upload). See
/// SPEC.md §2.8 for the schedule a kernel follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2Plan {
    pub profile: Profile,
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub patch_size: u8,
    pub patches_x: u32,
    pub patches_y: u32,
    /// File byte range of every offset-table entry: BP has `channels · P` of them, plane-major
    /// ((plane p, patch i) at p·P + i, planes G, R−G, B−G, A); ANS has one chunk per patch.
    pub entries: Vec<std::ops::Range<u32>>,
    /// The ANS frequency tables (`None` for BP).
    pub tables: Option<AnsTables>,
}

impl V2Plan {
    pub(crate) fn new(g: &Geometry, l: &Layout, prefix: &[u8]) -> Result<V2Plan, Error> {
        let entries = (0..l.entries)
            .map(|i| {
                let r = entry_range(l, prefix, i);
                r.start as u32..r.end as u32
            })
            .collect();
        let tables = match l.profile {
            Profile::Bp => None,
            Profile::Ans => Some(tables_end(g, &prefix[HEADER_LEN..l.offsets_at])?.0),
        };
        Ok(V2Plan {
            profile: l.profile,
            width: g.width,
            height: g.height,
            channels: g.channels,
            patch_size: g.patch_size,
            patches_x: g.patches_x,
            patches_y: g.patches_y,
            entries,
            tables,
        })
    }

    /// Patches per plane (P).
    pub fn patches(&self) -> usize {
        self.patches_x as usize * self.patches_y as usize
    }

    /// Rectangle of patch `patch` (raster order); `None` past the last patch.
    pub fn patch_rect(&self, patch: usize) -> Option<crate::Rect> {
        if patch >= self.patches() {
            return None;
        }
        let n = u32::from(self.patch_size);
        let (x, y) = (
            (patch % self.patches_x as usize) as u32 * n,
            (patch / self.patches_x as usize) as u32 * n,
        );
        Some(crate::Rect::new(
            x,
            y,
            n.min(self.width - x),
            n.min(self.height - y),
        ))
    }

    /// The bytes of plane `plane` of patch `patch` (BP), or of patch `patch`'s chunk (ANS, any plane).
    pub fn entry(&self, plane: usize, patch: usize) -> Option<std::ops::Range<u32>> {
        let i = match self.profile {
            Profile::Bp => plane.checked_mul(self.patches())?.checked_add(patch)?,
            Profile::Ans => patch,
        };
        if plane >= self.channels as usize || patch >= self.patches() {
            return None;
        }
        self.entries.get(i).cloned()
    }

    /// rANS steps of a `pw`×`ph` patch chunk with `channels` planes: per plane, ⌈(ph−1)·⌈pw/32⌉ / 32⌉ for
    /// the selectors plus ph·⌈pw/32⌉ for the rows (1,584 at N = 128, RGB).
    pub fn ans_steps(pw: usize, ph: usize, channels: usize) -> usize {
        let runs = front::runs(pw);
        channels * (((ph - 1) * runs).div_ceil(ans::LANES) + ph * pw.div_ceil(ans::LANES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_resolve_to_formats_and_contradictions_are_refused() {
        assert_eq!(Format::resolve(None, None), Ok(crate::DEFAULT_FORMAT));
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
