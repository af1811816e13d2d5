//! The descriptors of one source's window: the patch runs it copies to the device, and one descriptor per
//! (decoded channel, patch) for version 1, per patch for version 2.

use super::desc::{CopyRun, SampleDesc, SamplePlan};
use super::source::{Grid, PatchRanges, SampleSource, missing};
use crate::error::Error;
use crate::layout::SampleOptions;
use crate::v2::V2Desc;
use l3_format::{AnsTables, PatchId, PixelLayout, Profile};
use std::ops::Range;
use vocab::Window;

/// Output strides of a version-2 descriptor in a sample batch.
pub(super) struct V2Layout<'e> {
    pub(super) row_stride: i32,
    pub(super) col_step: i32,
    pub(super) chan_stride: u32,
    /// First element of the sample.
    pub(super) base: u64,
    /// Element of sample pixel (x, y), output channel c, within the sample.
    pub(super) elem: &'e dyn Fn(u32, u32, u32) -> u64,
}

impl SamplePlan {
    /// Queues the copy of entry `ch` of every patch in `ranges` (one grid row's run, patches `first..`)
    /// into the device input; returns where each patch's entry lands.
    pub(super) fn stage_runs(
        &mut self,
        src: &SampleSource<'_>,
        index: usize,
        ranges: &[[Range<u64>; 4]],
        ch: usize,
        first: usize,
    ) -> Result<Vec<usize>, Error> {
        let count = ranges.len();
        // The run of this grid row's patches is contiguous in the file: one copy, unless
        // the fragments hold it in pieces.
        let run = ranges[0][ch].start..ranges[count - 1][ch].end;
        let mut at_of = Vec::with_capacity(count);
        if src.bytes(run.clone()).is_some() {
            self.copies.push(CopyRun {
                sample: index,
                file: run.clone(),
                at: self.data_len,
            });
            for pr in ranges {
                at_of.push(self.data_len + (pr[ch].start - run.start) as usize);
            }
            self.data_len += (run.end - run.start) as usize;
        } else {
            for (k, pr) in ranges.iter().enumerate() {
                let range = pr[ch].clone();
                let id = Some(PatchId {
                    channel: ch,
                    patch: first + k,
                });
                if src.bytes(range.clone()).is_none() {
                    return Err(missing(index, id, &range));
                }
                self.copies.push(CopyRun {
                    sample: index,
                    file: range.clone(),
                    at: self.data_len,
                });
                at_of.push(self.data_len);
                self.data_len += (range.end - range.start) as usize;
            }
        }
        Ok(at_of)
    }

    /// The descriptors of a version-1 source's window: one per (decoded channel, patch under it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_v1(
        &mut self,
        src: &SampleSource<'_>,
        grid: &Grid<'_>,
        index: usize,
        win: &Window,
        base: u64,
        elem: &dyn Fn(u32, u32, u32) -> u64,
        (row_stride, col_step, copy_stride): (i32, i32, u32),
        opts: &SampleOptions,
        max_w: &mut u32,
        max_len: &mut u32,
    ) -> Result<(), Error> {
        let too_large = |what| Error::TooLarge { what };
        let r = win.src;
        // Gray is decoded once and copied to R, G, B (kept as is in a one-channel batch); alpha is
        // decoded only into a four-channel intermediate.
        let (decoded, copies) = match (grid.channels, self.tensor.channels()) {
            (1, 1) => (1, 1u8),
            (1, _) => (1, 3),
            (4, 4) => (4, 1),
            _ => (3, 1),
        };
        for (first, count) in r.patch_rows(grid.n, grid.patches_x) {
            let mut ranges = Vec::with_capacity(count);
            for p in first..first + count {
                ranges.push(grid.patch_ranges(p).map_err(|e| e.at(index))?);
            }
            if opts.check_rows_on_host {
                for (k, p) in (first..first + count).enumerate() {
                    let pr = grid.patch_rect(p);
                    let rows = ((r.y + r.h).min(pr.y + pr.h) - pr.y) as usize;
                    for (ch, range) in ranges[k].iter().enumerate().take(grid.channels as usize) {
                        let id = Some(PatchId {
                            channel: ch,
                            patch: p,
                        });
                        let bytes = src
                            .bytes(range.clone())
                            .ok_or_else(|| missing(index, id, range))?;
                        let used = l3_format::patch_rows_len(bytes, pr.w as usize, rows, id)
                            .map_err(|source| Error::Image { index, source })?;
                        // A window down to the patch's last row also checks for trailing bytes.
                        if rows == pr.h as usize && used != bytes.len() {
                            return Err(Error::Image {
                                index,
                                source: l3_format::Error::TrailingPatchBytes {
                                    patch: id,
                                    unused: bytes.len() - used,
                                },
                            });
                        }
                    }
                }
            }
            for ch in 0..decoded {
                let at_of = self.stage_runs(src, index, &ranges, ch, first)?;
                for (k, p) in (first..first + count).enumerate() {
                    let pr = grid.patch_rect(p);
                    let len = (ranges[k][ch].end - ranges[k][ch].start) as usize;
                    let data_len =
                        u32::try_from(len).map_err(|_| too_large("a patch exceeds 4 GiB"))?;
                    // The overlap of the patch with the window, in image coordinates.
                    let (ox0, ox1) = (pr.x.max(r.x), (pr.x + pr.w).min(r.x + r.w));
                    let (oy0, oy1) = (pr.y.max(r.y), (pr.y + pr.h).min(r.y + r.h));
                    let col = ox0 - r.x;
                    let dst_x = if win.flip {
                        win.dx + r.w - 1 - col
                    } else {
                        win.dx + col
                    };
                    let dst_y = win.dy + (oy0 - r.y);
                    self.descs.push(SampleDesc {
                        data_offset: at_of[k] as u64,
                        out_offset: base + elem(dst_x, dst_y, ch as u32),
                        data_len,
                        row_stride,
                        col_stride: if win.flip { -col_step } else { col_step },
                        copy_stride,
                        w: pr.w as u16,
                        rows: (oy1 - pr.y) as u16,
                        skip: (oy0 - pr.y) as u16,
                        col0: (ox0 - pr.x) as u16,
                        col1: (ox1 - pr.x) as u16,
                        channel: ch as u8,
                        copies,
                        exact: u8::from(oy1 == pr.y + pr.h),
                        pad: [0; 3],
                    });
                    self.ids.push((index as u32, ch as u8, p as u32));
                    *max_len = (*max_len).max(data_len);
                    *max_w = (*max_w).max(pr.w);
                }
            }
        }
        Ok(())
    }

    /// The descriptors of a version-2 source's window: one per patch under it, every plane (BP: without
    /// alpha, which a sample never holds; ANS: the whole chunk, whose symbols come in one stream).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_v2(
        &mut self,
        src: &SampleSource<'_>,
        grid: &Grid<'_>,
        index: usize,
        win: &Window,
        profile: Profile,
        tables: Option<&AnsTables>,
        lay: &V2Layout<'_>,
        opts: &SampleOptions,
    ) -> Result<(), Error> {
        let r = win.src;
        let image = |source| Error::Image { index, source };
        // Entry CRCs stand for the walk: every entry uploaded is checked against its CRC-32C below (a
        // whole file's were by its parse), so its bytes are the encoder's. Decoding each window on the
        // host as well cost a single-threaded CPU decode per sample: slower than the CPU loader.
        let crcs = match &grid.ranges {
            PatchRanges::File(f) => f.has_entry_crcs(),
            PatchRanges::Index(idx) => idx.has_entry_crcs(),
            PatchRanges::Single(_) => false,
        };
        if opts.check_rows_on_host && !crcs {
            // An entropy-coded chunk has no cheap walk: decode the window on the host, exactly as the
            // CPU's region decoder accepts it.
            let layout = PixelLayout::packed(r.w, r.h, grid.channels, false);
            let mut px = vec![0u8; r.w as usize * r.h as usize * grid.channels as usize];
            match (&grid.ranges, src) {
                (PatchRanges::File(f), _) => f.decode_region(r, &mut px, layout),
                (_, SampleSource::Fragments { index: idx, data }) => {
                    idx.decode_region(data, r, &mut px, layout)
                }
                (_, SampleSource::File(_)) => unreachable!("a file source has file ranges"),
            }
            .map_err(image)?;
        }
        let (table_offset, buckets) = match (profile, tables) {
            (Profile::Ans, Some(t)) => self.v2.add_tables(t)?,
            (Profile::Ans, None) => {
                return Err(image(l3_format::Error::BadOptions {
                    reason: "ANS tables missing",
                }));
            }
            (Profile::Bp, _) => (0, 0),
        };
        let ci = self.tensor.channels() as u8;
        let planes = grid.channels;
        let decoded = if ci == 4 { planes } else { planes.min(3) };
        // Gray copied to R, G, B unless the batch is one channel; alpha only into four.
        let out_channels = match (ci, decoded) {
            (1, _) => 1,
            (4, 4) => 4,
            _ => 3,
        };
        let entries = match profile {
            Profile::Ans => 1,
            Profile::Bp => decoded as usize,
        };
        for (first, count) in r.patch_rows(grid.n, grid.patches_x) {
            let mut ranges = Vec::with_capacity(count);
            for p in first..first + count {
                ranges.push(grid.patch_ranges(p).map_err(|e| e.at(index))?);
            }
            // Fragments were never checked as a whole file: every entry uploaded is checked against its
            // CRC-32C here (a file without entry CRCs has nothing to check; a whole file's were by its parse).
            if let SampleSource::Fragments { index: idx, .. } = src {
                for (k, p) in (first..first + count).enumerate() {
                    for (e, range) in ranges[k].iter().enumerate().take(entries) {
                        let id = PatchId {
                            channel: e,
                            patch: p,
                        };
                        let bytes = src
                            .bytes(range.clone())
                            .ok_or_else(|| missing(index, Some(id), range))?;
                        idx.check_patch(e, p, bytes).map_err(image)?;
                    }
                }
            }
            let mut at_of = Vec::with_capacity(entries);
            for e in 0..entries {
                at_of.push(self.stage_runs(src, index, &ranges, e, first)?);
            }
            for (k, p) in (first..first + count).enumerate() {
                let pr = grid.patch_rect(p);
                let (ox0, ox1) = (pr.x.max(r.x), (pr.x + pr.w).min(r.x + r.w));
                let (oy0, oy1) = (pr.y.max(r.y), (pr.y + pr.h).min(r.y + r.h));
                let col = ox0 - r.x;
                let dst_x = if win.flip {
                    win.dx + r.w - 1 - col
                } else {
                    win.dx + col
                };
                let dst_y = win.dy + (oy0 - r.y);
                let (pw, ph) = (pr.w as u16, pr.h as u16);
                let mut d = V2Desc {
                    out_offset: lay.base + (lay.elem)(dst_x, dst_y, 0),
                    table_offset,
                    buckets,
                    row_stride: lay.row_stride,
                    col_stride: if win.flip {
                        -lay.col_step
                    } else {
                        lay.col_step
                    },
                    chan_stride: lay.chan_stride,
                    pw,
                    ph,
                    rows: (oy1 - pr.y) as u16,
                    skip: (oy0 - pr.y) as u16,
                    col0: (ox0 - pr.x) as u16,
                    col1: (ox1 - pr.x) as u16,
                    planes,
                    decoded,
                    profile: profile.byte(),
                    out_channels,
                    exact: u8::from(profile == Profile::Bp && oy1 == pr.y + pr.h),
                    ..V2Desc::default()
                };
                for e in 0..entries {
                    let len = ranges[k][e].end - ranges[k][e].start;
                    d.off[e] = at_of[e][k] as u64;
                    d.len[e] = u32::try_from(len).map_err(|_| Error::TooLarge {
                        what: "a patch exceeds 4 GiB",
                    })?;
                }
                if profile == Profile::Ans {
                    d.scratch_offset = self.v2.reserve_scratch(planes, pw, ph);
                }
                self.v2.descs.push(d);
                self.v2.ids.push((index as u32, p as u32));
            }
        }
        Ok(())
    }
}
