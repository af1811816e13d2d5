//! The version-1 container (SPEC.md §1, §4): after the 20-byte header, one `u32` offset per (channel, patch),
//! channel-major and relative to the patch data, then the patch data up to the end of the file. Both readers
//! validate the offset table with [`validate_offsets`]; [`V1`] is a validated file as the v1 decoders see it.

use crate::error::{Error, PatchId};
use crate::format::HEADER_LEN;
use crate::geometry::{Geometry, u32_at};
use std::ops::Range;

/// Bytes of header and offset table: where the patch data starts.
pub(crate) fn data_offset(g: &Geometry) -> usize {
    HEADER_LEN + 4 * g.entries()
}

/// Checks the offset table (`offset(i)` for every entry) against `data_len` bytes of patch data: first
/// is 0, non-decreasing, inside the data, and room for each row's 2-byte minimum — before any patch
/// byte is read.
pub(crate) fn validate_offsets(
    g: &Geometry,
    offset: impl Fn(usize) -> u32,
    data_len: u64,
) -> Result<(), Error> {
    let first = offset(0);
    if first != 0 {
        return Err(Error::FirstOffsetNotZero { offset: first });
    }
    let per = g.patches_per_channel();
    let entries = g.entries();
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
        let rows = g.patch_rect(i % per).h as usize;
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

/// A validated version-1 file: its geometry, offset table and patch data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct V1<'a> {
    pub g: Geometry,
    pub table: &'a [u8],
    pub data: &'a [u8],
}

impl<'a> V1<'a> {
    /// The view of `bytes`, a whole file whose patch data starts at `data_start` (both validated).
    pub(crate) fn new(g: Geometry, bytes: &'a [u8], data_start: usize) -> Self {
        V1 {
            g,
            table: &bytes[HEADER_LEN..data_start],
            data: &bytes[data_start..],
        }
    }

    /// Byte range of offset-table entry `i` (channel-major) within the patch data.
    #[inline]
    pub(crate) fn entry_range(&self, i: usize) -> Range<usize> {
        let start = u32_at(self.table, 4 * i) as usize;
        let end = if 4 * (i + 1) < self.table.len() {
            u32_at(self.table, 4 * (i + 1)) as usize
        } else {
            self.data.len()
        };
        start..end
    }

    /// The bytes of offset-table entry `i`.
    #[inline]
    pub(crate) fn entry(&self, i: usize) -> &'a [u8] {
        &self.data[self.entry_range(i)]
    }

    /// The bytes of patch `patch` of channel `channel`.
    #[inline]
    pub(crate) fn patch(&self, channel: usize, patch: usize) -> &'a [u8] {
        self.entry(channel * self.g.patches_per_channel() + patch)
    }
}
