//! Where a sample batch's compressed bytes come from: a whole file or an index and the fragments read
//! for the windows ([`SampleSource`]), and an image's patch grid with the file range of every patch
//! (`Grid`), whichever source holds them.

use crate::error::Error;
use l3_format::{AnsTables, Fragments, L3File, L3Index, PatchId, Profile, Rect};
use std::ops::Range;

/// The compressed bytes of one image of a sample batch.
#[derive(Debug, Clone, Copy)]
pub enum SampleSource<'a> {
    /// A whole L3 file in memory.
    File(&'a [u8]),
    /// A file of which only the header and offset table (parsed into `index`) and the byte ranges of the
    /// patches under the window (`data`, e.g. as [`L3Index::region_ranges`] names them) were read.
    Fragments {
        index: &'a L3Index,
        data: &'a Fragments,
    },
}

impl SampleSource<'_> {
    /// Length of the whole file (what a plan remembers to recognise its sources).
    pub(super) fn file_len(&self) -> u64 {
        match self {
            SampleSource::File(b) => b.len() as u64,
            SampleSource::Fragments { index, .. } => index.file_len(),
        }
    }

    /// The bytes at file offsets `r`, if this source holds all of them.
    pub(crate) fn bytes(&self, r: Range<u64>) -> Option<&[u8]> {
        match self {
            SampleSource::File(b) => {
                b.get(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?)
            }
            SampleSource::Fragments { data, .. } => data.get(r),
        }
    }
}

/// An image's patch grid and where its patch bytes are, whichever kind of source holds them.
pub(super) struct Grid<'a> {
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) channels: u8,
    pub(super) n: u32,
    pub(super) patches_x: u32,
    pub(super) ranges: PatchRanges<'a>,
    /// Version 2: the profile, and the ANS tables.
    pub(super) v2: Option<(Profile, Option<AnsTables>)>,
}

pub(super) enum PatchRanges<'a> {
    /// From the file's own offset table.
    File(L3File<'a>),
    /// From the index, one patch at a time.
    Index(&'a L3Index),
    /// A fragment source whose image is one patch per channel: each channel's file range.
    Single(Vec<Range<u64>>),
}

/// Why a source cannot be planned (the caller adds the batch index).
pub(super) enum SourceError {
    Format(l3_format::Error),
    TableMismatch,
}

impl SourceError {
    pub(super) fn at(self, index: usize) -> Error {
        match self {
            SourceError::Format(source) => Error::Image { index, source },
            SourceError::TableMismatch => Error::OffsetTableMismatch { index },
        }
    }
}

impl From<l3_format::Error> for SourceError {
    fn from(e: l3_format::Error) -> Self {
        SourceError::Format(e)
    }
}

impl<'a> Grid<'a> {
    pub(super) fn open(src: &SampleSource<'a>) -> Result<Self, SourceError> {
        let (width, height, channels, n, ranges, v2) = match *src {
            SampleSource::File(bytes) => {
                let f = L3File::parse(bytes)?;
                let n = f.patch_size();
                let v2 = f.profile().map(|p| (p, f.ans_tables()));
                (
                    f.width(),
                    f.height(),
                    f.channels(),
                    n,
                    PatchRanges::File(f),
                    v2,
                )
            }
            SampleSource::Fragments { index, data } => {
                let n = index.patch_size();
                let v2 = index.profile().map(|p| (p, index.ans_tables().cloned()));
                // Version 2's index names every entry (a one-patch image's planes included).
                let ranges = if v2.is_none()
                    && index.width() <= u32::from(n)
                    && index.height() <= u32::from(n)
                {
                    PatchRanges::Single(split_single_patch(index, data)?)
                } else {
                    PatchRanges::Index(index)
                };
                (
                    index.width(),
                    index.height(),
                    index.channels(),
                    n,
                    ranges,
                    v2,
                )
            }
        };
        let n = u32::from(n);
        Ok(Grid {
            width,
            height,
            channels,
            n,
            patches_x: width.div_ceil(n),
            ranges,
            v2,
        })
    }

    pub(super) fn patch_rect(&self, p: usize) -> Rect {
        let (gx, gy) = (
            (p % self.patches_x as usize) as u32,
            (p / self.patches_x as usize) as u32,
        );
        let (x, y) = (gx * self.n, gy * self.n);
        Rect::new(
            x,
            y,
            self.n.min(self.width - x),
            self.n.min(self.height - y),
        )
    }

    /// File byte range of patch `p` of every channel (entries past `channels` are empty).
    pub(super) fn patch_ranges(&self, p: usize) -> Result<[Range<u64>; 4], SourceError> {
        let mut out: [Range<u64>; 4] = Default::default();
        match &self.ranges {
            PatchRanges::File(f) => {
                let base = f.data_offset() as u64;
                for (ch, o) in out.iter_mut().enumerate().take(self.channels as usize) {
                    let r = f.patch_range(ch, p);
                    *o = base + r.start as u64..base + r.end as u64;
                }
            }
            PatchRanges::Single(single) => out[..single.len()].clone_from_slice(single),
            PatchRanges::Index(index) if self.v2.is_some() => {
                for (ch, o) in out.iter_mut().enumerate().take(self.channels as usize) {
                    *o = index.patch_range(ch, p).ok_or(SourceError::TableMismatch)?;
                }
            }
            PatchRanges::Index(index) => {
                // With two or more patches per channel, a patch is never adjacent to the same patch of the
                // next channel, so the ranges come back one per channel.
                let ranges = index.region_ranges(self.patch_rect(p), 0)?;
                if ranges.len() != self.channels as usize {
                    return Err(SourceError::TableMismatch);
                }
                out[..ranges.len()].clone_from_slice(&ranges);
            }
        }
        Ok(out)
    }
}

/// The channels' ranges of a one-patch image read as fragments. Its patches are back to back, so
/// [`L3Index::region_ranges`] names them as one range; each channel's rows are walked
/// ([`l3_format::patch_rows_len`]) and must end exactly where the offset table says the next channel
/// starts. (A patch whose rows do not fill its table entry is rejected here, a stricter check than a
/// region decode makes.)
pub(super) fn split_single_patch(
    index: &L3Index,
    data: &Fragments,
) -> Result<Vec<Range<u64>>, SourceError> {
    let (w, h, c) = (index.width(), index.height(), index.channels() as usize);
    let ranges = index.region_ranges(Rect::new(0, 0, w, h), 0)?;
    let [all] = ranges.as_slice() else {
        return Err(SourceError::TableMismatch);
    };
    let patch = |channel| PatchId { channel, patch: 0 };
    let bytes = data
        .get(all.clone())
        .ok_or(l3_format::Error::MissingBytes {
            patch: patch(0),
            start: all.start,
            end: all.end,
        })?;
    let mut out = Vec::with_capacity(c);
    let mut pos = 0usize;
    for ch in 0..c {
        let end = if ch + 1 < c {
            let rows =
                l3_format::patch_rows_len(&bytes[pos..], w as usize, h as usize, Some(patch(ch)))?;
            pos + rows
        } else {
            bytes.len()
        };
        let walked = all.start + pos as u64..all.start + end as u64;
        if index.patch_range(ch, 0) != Some(walked.clone()) {
            return Err(SourceError::TableMismatch);
        }
        out.push(walked);
        pos = end;
    }
    Ok(out)
}

pub(super) fn missing(index: usize, patch: Option<PatchId>, r: &Range<u64>) -> Error {
    Error::Image {
        index,
        source: l3_format::Error::MissingBytes {
            patch: patch.unwrap_or(PatchId {
                channel: 0,
                patch: 0,
            }),
            start: r.start,
            end: r.end,
        },
    }
}
