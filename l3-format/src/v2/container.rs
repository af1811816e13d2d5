//! The version-2 container (SPEC.md §2.1, §2.10, §2.11): after the header, the ANS frequency tables
//! (profile ANS only), an offset table of absolute file offsets (one entry per plane and patch for BP, one
//! chunk per patch for ANS), in files with entry CRCs a CRC-32C per entry and one of the prefix, the
//! entries, and a CRC-32C of everything before it. [`layout`] validates it from a whole file or from a
//! prefix and the file's length, so [`crate::L3File`] and [`crate::L3Index`] check the same rules;
//! [`verify_file`] checks every checksum of a whole file in one pass, [`check_entry`] one entry's.

use super::ans::{self, AnsTables};
use super::bp;
use crate::crc32c::{Crc32c, crc32c};
use crate::error::{Error, PatchId};
use crate::format::{HEADER_LEN, Profile};
use crate::geometry::{Geometry, u32_at};
use std::ops::Range;

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
    /// Where the entry CRC table starts (right after the offset table; the prefix CRC follows it), in
    /// files with entry CRCs.
    pub crcs_at: Option<usize>,
    /// Where the data starts (right after the offset table, or after the prefix CRC).
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
pub(crate) fn tables_end(g: &Geometry, rest: &[u8]) -> Result<(AnsTables, usize), Error> {
    let (t, len) = AnsTables::parse(rest, ans::contexts(g.channels))?;
    Ok((t, HEADER_LEN + len))
}

/// Bytes of the entry CRC table and the prefix CRC after an offset table of `entries` entries.
pub(crate) fn crc_table_len(entries: usize) -> usize {
    4 * entries + CRC_LEN
}

/// Validates the container of a v2 file of `file_len` bytes from `prefix` (a prefix of the file holding at
/// least the header, the tables, the offset table and, where the file has them, the entry CRCs and the
/// prefix CRC). With `check_prefix`, a file with entry CRCs has its prefix CRC verified before its offsets
/// are read.
pub(crate) fn layout(
    g: &Geometry,
    prefix: &[u8],
    file_len: u64,
    check_prefix: bool,
) -> Result<Layout, Error> {
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
    let too_long = Error::Truncated {
        what: "offset table",
        needed: usize::MAX,
        len: avail.len(),
    };
    let table_end = n
        .checked_mul(4)
        .and_then(|t| t.checked_add(offsets_at))
        .ok_or(too_long.clone())?;
    let (crcs_at, data_start) = if g.entry_crcs {
        let end = table_end.checked_add(crc_table_len(n)).ok_or(too_long)?;
        (Some(table_end), end)
    } else {
        (None, table_end)
    };
    if avail.len() < data_start {
        return Err(Error::Truncated {
            what: if g.entry_crcs && avail.len() >= table_end {
                "entry CRC table"
            } else {
                "offset table"
            },
            needed: data_start,
            len: avail.len(),
        });
    }
    if check_prefix && g.entry_crcs {
        let at = data_start - CRC_LEN;
        let (stored, computed) = (u32_at(avail, at), crc32c(&avail[..at]));
        if stored != computed {
            return Err(Error::PrefixCrcMismatch { stored, computed });
        }
    }
    let table = &avail[offsets_at..table_end];
    let off = |i: usize| u32_at(table, 4 * i) as usize;
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
        crcs_at,
        data_start,
        data_end,
    })
}

/// The stored CRC-32C of entry `i` of a validated layout (`None` in a file without entry CRCs), read from
/// `bytes` (the file or its prefix).
#[inline]
pub(crate) fn entry_crc(l: &Layout, bytes: &[u8], i: usize) -> Option<u32> {
    l.crcs_at.map(|at| u32_at(bytes, at + 4 * i))
}

/// Checks `data`, the bytes of one entry (of patch `id`), against its stored CRC-32C.
#[inline]
pub(crate) fn check_entry(stored: u32, id: PatchId, data: &[u8]) -> Result<(), Error> {
    let computed = crc32c(data);
    if stored != computed {
        return Err(Error::EntryCrcMismatch {
            patch: id,
            stored,
            computed,
        });
    }
    Ok(())
}

/// Verifies every checksum of a whole v2 file of geometry `g` whose layout `l` validated: the file's CRC
/// and, in a file with entry CRCs, the prefix's and every entry's, all in one pass over the bytes (each
/// entry's register runs beside the file's). The first mismatch in file order is the error, so a damaged
/// entry is named.
pub(crate) fn verify_file(g: &Geometry, l: &Layout, bytes: &[u8]) -> Result<(), Error> {
    let Some(crcs_at) = l.crcs_at else {
        return verify_crc(bytes);
    };
    let mut file = Crc32c::new();
    let prefix_at = l.data_start - CRC_LEN;
    file.update(&bytes[..prefix_at]);
    let (stored, computed) = (u32_at(bytes, prefix_at), file.finish());
    if stored != computed {
        return Err(Error::PrefixCrcMismatch { stored, computed });
    }
    file.update(&bytes[prefix_at..l.data_start]);
    for i in 0..l.entries {
        let mut entry = Crc32c::new();
        file.update_pair(&mut entry, &bytes[entry_range(l, bytes, i)]);
        let (stored, computed) = (u32_at(bytes, crcs_at + 4 * i), entry.finish());
        if stored != computed {
            return Err(Error::EntryCrcMismatch {
                patch: entry_id(g, l.profile, i),
                stored,
                computed,
            });
        }
    }
    let (stored, computed) = (u32_at(bytes, l.data_end), file.finish());
    if stored != computed {
        return Err(Error::CrcMismatch { stored, computed });
    }
    Ok(())
}

/// File byte range of entry `i` of a validated layout, read from the offset table in `bytes`.
#[inline]
pub(crate) fn entry_range(l: &Layout, bytes: &[u8], i: usize) -> Range<usize> {
    let start = u32_at(bytes, l.offsets_at + 4 * i) as usize;
    let end = if i + 1 < l.entries {
        u32_at(bytes, l.offsets_at + 4 * (i + 1)) as usize
    } else {
        l.data_end
    };
    start..end
}

/// Checks a v2 file's trailing CRC-32C against its bytes (`bytes` holds at least the header).
pub(crate) fn verify_crc(bytes: &[u8]) -> Result<(), Error> {
    if bytes.len() < HEADER_LEN + CRC_LEN {
        return Err(Error::Truncated {
            what: "CRC",
            needed: HEADER_LEN + CRC_LEN,
            len: bytes.len(),
        });
    }
    let end = bytes.len() - CRC_LEN;
    let stored = u32_at(bytes, end);
    let computed = crc32c(&bytes[..end]);
    if stored != computed {
        return Err(Error::CrcMismatch { stored, computed });
    }
    Ok(())
}
