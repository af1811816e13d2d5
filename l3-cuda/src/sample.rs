//! Host side of a batch of fixed-size samples, with no GPU involved: each image contributes one window (a
//! rectangle of the image, placed in the sample, optionally mirrored), and the batch is ONE tensor of `n`
//! samples, `height`×`width`×3, in the requested layout and element type, normalisation fused. Only the
//! patches under each window get descriptors (and only their bytes are copied to the device); everything
//! outside a window is padding. Every window, image and size is validated here, with the batch index,
//! before anything is copied or launched.
//!
//! The window semantics are the CPU loader's, so a batch from the GPU equals one assembled on the CPU bit
//! for bit: source column `src.x + col` of row `src.y + row` goes to sample column `dx + col` (mirrored:
//! `dx + src.w - 1 - col`) of row `dy + row`; gray is copied to R, G and B, alpha is dropped; padding is
//! the value of a pixel of value `fill` (`fill`, or [`Normalize::apply`]`(fill, c)` for floats).
//!
//! A resampled batch ([`SamplePlan::resampled`]) decodes each sample's source rectangle this way into an
//! intermediate, then resamples it (`resample`).

use crate::error::Error;
use crate::plan::{STAGE_CAP, scale_bias_for};
use crate::resample::{ResampleStage, Sources};
use crate::v2::{V2Batch, V2Desc};
use l3_format::{AnsTables, Fragments, L3File, L3Index, PatchId, PixelLayout, Profile, Rect};
use std::ops::Range;
use vocab::{DType, Geometry, Interpolation, Layout, Normalize, Window};

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
    fn file_len(&self) -> u64 {
        match self {
            SampleSource::File(b) => b.len() as u64,
            SampleSource::Fragments { index, .. } => index.file_len(),
        }
    }

    /// The bytes at file offsets `r`, if this source holds all of them.
    fn bytes(&self, r: Range<u64>) -> Option<&[u8]> {
        match self {
            SampleSource::File(b) => {
                b.get(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?)
            }
            SampleSource::Fragments { data, .. } => data.get(r),
        }
    }
}

/// How a batch of samples is shaped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOptions {
    /// Sample width and height in pixels.
    pub width: u32,
    pub height: u32,
    /// Channels per pixel, the CPU loader's `channels`: 3 (RGB: gray copied, alpha dropped), 1 (luma,
    /// Pillow's `L` of an RGB or RGBA image, taken before any resampling; a gray image as is — also
    /// what a one-channel label map needs) or 4 (RGBA: alpha 255 for an image without it). Batches of
    /// 1 or 4 channels are always made by the resampling kernels (a window is a resampling that copies).
    pub channels: u8,
    pub layout: Layout,
    pub dtype: DType,
    /// Only for the float types; float samples without it hold pixel / 255.
    pub normalize: Option<Normalize>,
    /// The pixel value of the padding (every channel), normalised like any pixel in float batches: the
    /// CPU loader's `fill`.
    pub fill: u8,
    /// Walk the row headers the decode will read on the host, for every channel of every patch under each
    /// window (alpha included), so corrupt rows are rejected with their batch index before any GPU work:
    /// exactly what [`L3File::decode_region`] / [`L3Index::decode_region`] reject for the window. A
    /// version-2 file with entry CRCs is checked by its CRCs instead (always, this option or not); one
    /// without is decoded on the host. Off by
    /// default: the kernel bounds every read anyway and reports a corrupt patch after the decode
    /// ([`Error::CorruptRows`]); it never reads alpha, so without this a corrupt alpha plane goes unnoticed.
    pub check_rows_on_host: bool,
}

impl SampleOptions {
    /// `width`×`height` samples, NCHW `u8`.
    pub fn new(width: u32, height: u32) -> Self {
        SampleOptions {
            width,
            height,
            channels: 3,
            layout: Layout::Nchw,
            dtype: DType::U8,
            normalize: None,
            fill: 0,
            check_rows_on_host: false,
        }
    }
}

/// Shape of a dense batch tensor, as a DLPack exporter needs it: dimensions and strides (in elements) in
/// memory order of `layout` (`[n, h, w, c]` for NHWC, `[n, c, h, w]` for NCHW), C-contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorInfo {
    pub layout: Layout,
    pub dtype: DType,
    pub shape: [usize; 4],
    pub strides: [usize; 4],
}

impl TensorInfo {
    /// A contiguous `n`×`h`×`w`×`c` tensor in `layout`.
    pub fn dense(layout: Layout, dtype: DType, n: usize, h: usize, w: usize, c: usize) -> Self {
        let shape = match layout {
            Layout::Nhwc => [n, h, w, c],
            Layout::Nchw => [n, c, h, w],
        };
        let mut strides = [1usize; 4];
        for i in (0..3).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        TensorInfo {
            layout,
            dtype,
            shape,
            strides,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Channels per pixel.
    pub fn channels(&self) -> usize {
        match self.layout {
            Layout::Nhwc => self.shape[3],
            Layout::Nchw => self.shape[1],
        }
    }

    /// Width and height of one sample (or image) of the tensor.
    pub fn sample_size(&self) -> (u32, u32) {
        match self.layout {
            Layout::Nhwc => (self.shape[2] as u32, self.shape[1] as u32),
            Layout::Nchw => (self.shape[3] as u32, self.shape[2] as u32),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size()
    }
}

/// One patch of one channel under a window: the kernel's unit of work (one thread block). Serialised by
/// [`SamplePlan::descriptor_bytes`] exactly as `struct SampleDesc` in kernel.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SampleDesc {
    pub data_offset: u64,
    /// Output element of patch pixel (col0, skip) in output channel `channel`.
    pub out_offset: u64,
    pub data_len: u32,
    pub row_stride: i32,
    /// Negative when the sample is mirrored.
    pub col_stride: i32,
    pub copy_stride: u32,
    pub w: u16,
    pub rows: u16,
    pub skip: u16,
    pub col0: u16,
    pub col1: u16,
    pub channel: u8,
    pub copies: u8,
    /// 1 when `rows` reaches the patch's last row: then the rows must use the patch's bytes exactly, as
    /// `l3-format`'s region decoder checks for a window that reaches a patch's bottom.
    pub exact: u8,
}

pub(crate) const SAMPLE_DESC_BYTES: usize = 48;

/// The padding of sample rows `[y0, y1)` around the window `(dx, dy, w, h)`: one thread block.
/// Serialised exactly as `struct FillDesc` in kernel.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct FillDesc {
    pub out_offset: u64,
    pub y0: u32,
    pub y1: u32,
    pub dx: u32,
    pub dy: u32,
    pub w: u32,
    pub h: u32,
    pub fill: u32,
}

pub(crate) const FILL_DESC_BYTES: usize = 40;

/// Output elements one padding block writes at most (whole rows; at least one row).
const FILL_ELEMS_PER_BLOCK: usize = 16 * 1024;

/// Bytes `file` of source `sample` are copied to byte `at` of the device input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CopyRun {
    pub sample: usize,
    pub file: Range<u64>,
    pub at: usize,
}

/// A validated batch of samples, ready to copy and launch.
#[derive(Debug, Clone)]
pub struct SamplePlan {
    pub(crate) tensor: TensorInfo,
    pub(crate) descs: Vec<SampleDesc>,
    /// Per descriptor: (sample, channel, patch), to name a patch the kernel rejects.
    pub(crate) ids: Vec<(u32, u8, u32)>,
    pub(crate) fills: Vec<FillDesc>,
    pub(crate) copies: Vec<CopyRun>,
    /// Per sample: the file length of its source.
    pub(crate) file_lens: Vec<u64>,
    /// Per sample: the image rectangle it decodes.
    pub(crate) rects: Vec<Rect>,
    pub(crate) data_len: usize,
    pub(crate) block_dim: u32,
    pub(crate) stage_cap: u32,
    /// (scale, bias) for output channels 0..3 (and an unused fourth pair).
    pub(crate) scale_bias: [f32; 8],
    /// Version-2 sources' patches (one descriptor per patch under a window), decoded by the blocks after
    /// the version-1 ones.
    pub(crate) v2: V2Batch,
    /// A resampled batch: the passes after the decode, which then writes the intermediate `tensor`.
    pub(crate) resample: Option<Box<ResampleStage>>,
}

/// An image's patch grid and where its patch bytes are, whichever kind of source holds them.
struct Grid<'a> {
    width: u32,
    height: u32,
    channels: u8,
    n: u32,
    patches_x: u32,
    ranges: PatchRanges<'a>,
    /// Version 2: the profile, and the ANS tables.
    v2: Option<(Profile, Option<AnsTables>)>,
}

enum PatchRanges<'a> {
    /// From the file's own offset table.
    File(L3File<'a>),
    /// From the index, one patch at a time.
    Index(&'a L3Index),
    /// A fragment source whose image is one patch per channel: each channel's file range.
    Single(Vec<Range<u64>>),
}

/// Why a source cannot be planned (the caller adds the batch index).
enum SourceError {
    Format(l3_format::Error),
    TableMismatch,
}

impl SourceError {
    fn at(self, index: usize) -> Error {
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
    fn open(src: &SampleSource<'a>) -> Result<Self, SourceError> {
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

    fn patch_rect(&self, p: usize) -> Rect {
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
    fn patch_ranges(&self, p: usize) -> Result<[Range<u64>; 4], SourceError> {
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

/// Output strides of a version-2 descriptor in a sample batch.
struct V2Layout<'e> {
    row_stride: i32,
    col_step: i32,
    chan_stride: u32,
    /// First element of the sample.
    base: u64,
    /// Element of sample pixel (x, y), output channel c, within the sample.
    elem: &'e dyn Fn(u32, u32, u32) -> u64,
}

impl SamplePlan {
    /// Queues the copy of entry `ch` of every patch in `ranges` (one grid row's run, patches `first..`)
    /// into the device input; returns where each patch's entry lands.
    fn stage_runs(
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
    fn plan_v1(
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
                        let used = walk_rows(bytes, pr.w as usize, rows, id)
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
    fn plan_v2(
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
        let table_offset = match (profile, tables) {
            (Profile::Ans, Some(t)) => self.v2.add_tables(t)?,
            (Profile::Ans, None) => {
                return Err(image(l3_format::Error::BadOptions {
                    reason: "ANS tables missing",
                }));
            }
            (Profile::Bp, _) => 0,
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
                    profile,
                    out_channels,
                    exact: profile == Profile::Bp && oy1 == pr.y + pr.h,
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

/// The channels' ranges of a one-patch image read as fragments. Its patches are back to back, so
/// [`L3Index::region_ranges`] names them as one range; the boundaries are found by walking each channel's
/// row headers and proved by rebuilding the offset table from them: the index parsed from that table
/// must equal `index`. (A patch whose rows do not fill its table entry is rejected here, a stricter check
/// than a region decode makes.)
fn split_single_patch(index: &L3Index, data: &Fragments) -> Result<Vec<Range<u64>>, SourceError> {
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
    let mut bounds = vec![0u64];
    let mut pos = 0usize;
    for ch in 0..c - 1 {
        pos += walk_rows(&bytes[pos..], w as usize, h as usize, Some(patch(ch)))?;
        bounds.push(pos as u64);
    }
    bounds.push(bytes.len() as u64);
    let mut prefix = Vec::with_capacity(l3_format::HEADER_LEN + 4 * c);
    prefix.extend_from_slice(&l3_format::MAGIC);
    prefix.extend_from_slice(&l3_format::VERSION.to_le_bytes());
    prefix.extend_from_slice(&w.to_le_bytes());
    prefix.extend_from_slice(&h.to_le_bytes());
    prefix.extend_from_slice(&[c as u8, 8, index.patch_size(), 0, 0, 0]);
    for b in &bounds[..c] {
        prefix.extend_from_slice(&(*b as u32).to_le_bytes());
    }
    match L3Index::parse(&prefix, index.file_len()) {
        Ok(rebuilt) if rebuilt == *index => {}
        _ => return Err(SourceError::TableMismatch),
    }
    Ok(bounds
        .windows(2)
        .map(|b| all.start + b[0]..all.start + b[1])
        .collect())
}

/// Walks the headers of the first `rows` rows of a `w`-wide patch at the start of `bytes` exactly as the
/// kernel (and `l3-format`'s row decoder) reads them; returns the bytes they take.
pub(crate) fn walk_rows(
    bytes: &[u8],
    w: usize,
    rows: usize,
    patch: Option<PatchId>,
) -> Result<usize, l3_format::Error> {
    let mut pos = 0usize;
    for row in 0..rows {
        let past_end = |needed| l3_format::Error::RowPastPatchEnd {
            patch,
            row,
            offset: pos,
            needed,
            len: bytes.len(),
        };
        if bytes.len() - pos < 2 {
            return Err(past_end(2));
        }
        let nbit = bytes[pos] & 0x0f;
        if nbit > 8 {
            return Err(l3_format::Error::NbitTooLarge { patch, row, nbit });
        }
        let len = (12 + w * nbit as usize).div_ceil(8);
        if bytes.len() - pos < len {
            return Err(past_end(len));
        }
        pos += len;
    }
    Ok(pos)
}

impl SamplePlan {
    /// Validates every source, window and size and plans the batch: sample `i` is window `windows[i]` of
    /// `sources[i]`. Errors name the batch index: [`Error::Image`] (a corrupt file, bytes missing from the
    /// fragments, or with `check_rows_on_host` corrupt rows), [`Error::BadWindow`]; and for the batch:
    /// [`Error::EmptyBatch`], [`Error::WindowCount`], [`Error::BadSampleSize`], [`Error::TooLarge`],
    /// [`Error::NormalizeNeedsFloat`], [`Error::BadNormalize`].
    pub fn new(
        sources: &[SampleSource<'_>],
        windows: &[Window],
        opts: &SampleOptions,
    ) -> Result<Self, Error> {
        check_batch(sources.len(), windows.len(), opts)?;
        if opts.channels == 3 {
            return Self::plan_windows(sources, windows, opts, Intermediate::Rgb).map(|(p, _)| p);
        }
        // Luma and RGBA batches are made by the resampling kernels, which convert channels as the CPU
        // does; a window is a resampling that copies. Windows are checked here, so that an error names
        // the window asked for.
        for (index, (src, win)) in sources.iter().zip(windows).enumerate() {
            let grid = Grid::open(src).map_err(|e| e.at(index))?;
            check_window(index, win, (grid.width, grid.height), opts)?;
        }
        let geometries: Vec<Geometry> = windows.iter().map(Geometry::from_window).collect();
        Self::resampled(sources, &geometries, Interpolation::Nearest, opts)
    }

    /// [`new`](Self::new) for `opts.channels` = 3 (the batch itself), or the decode of a resampled
    /// batch into its intermediate (`into`). Also returns whether each image has alpha.
    fn plan_windows(
        sources: &[SampleSource<'_>],
        windows: &[Window],
        opts: &SampleOptions,
        into: Intermediate,
    ) -> Result<(Self, Vec<bool>), Error> {
        let (sw, sh) = (opts.width, opts.height);
        let scale_bias = scale_bias_for(opts.dtype, opts.normalize)?;
        let too_large = |what| Error::TooLarge { what };
        let n = sources.len();
        let grids = sources
            .iter()
            .enumerate()
            .map(|(index, src)| Grid::open(src).map_err(|e| e.at(index)))
            .collect::<Result<Vec<_>, _>>()?;
        let alpha: Vec<bool> = grids.iter().map(|g| g.channels == 4).collect();
        let ci: u32 = match into {
            Intermediate::Rgb => 3,
            Intermediate::For(1) if grids.iter().all(|g| g.channels == 1) => 1,
            Intermediate::For(4) if alpha.iter().any(|&a| a) => 4,
            Intermediate::For(_) => 3,
        };
        let plane = u64::from(sw) * u64::from(sh);
        let sample_len = plane * u64::from(ci);
        sample_len
            .checked_mul(n as u64)
            .filter(|&l| {
                l.checked_mul(opts.dtype.size() as u64)
                    .is_some_and(|b| b <= isize::MAX as u64)
            })
            .ok_or(too_large("output size overflows"))?;
        if i32::try_from(u64::from(sw) * u64::from(ci)).is_err() || u32::try_from(plane).is_err() {
            return Err(too_large(
                "a sample row or plane exceeds the kernel's strides",
            ));
        }
        let (row_stride, col_step, copy_stride) = match opts.layout {
            Layout::Nhwc => (sw as i32 * ci as i32, ci as i32, 1u32),
            Layout::Nchw => (sw as i32, 1i32, plane as u32),
        };
        let elem = |x: u32, y: u32, c: u32| -> u64 {
            match opts.layout {
                Layout::Nhwc => {
                    (u64::from(y) * u64::from(sw) + u64::from(x)) * u64::from(ci) + u64::from(c)
                }
                Layout::Nchw => u64::from(c) * plane + u64::from(y) * u64::from(sw) + u64::from(x),
            }
        };
        let mut plan = SamplePlan {
            tensor: TensorInfo::dense(
                opts.layout,
                opts.dtype,
                n,
                sh as usize,
                sw as usize,
                ci as usize,
            ),
            descs: Vec::new(),
            ids: Vec::new(),
            fills: Vec::new(),
            copies: Vec::new(),
            file_lens: sources.iter().map(SampleSource::file_len).collect(),
            rects: windows.iter().map(|w| w.src).collect(),
            data_len: 0,
            block_dim: 32,
            stage_cap: 0,
            scale_bias,
            v2: V2Batch::default(),
            resample: None,
        };
        let rows_per_fill =
            (FILL_ELEMS_PER_BLOCK / (sw as usize * ci as usize)).clamp(1, sh as usize) as u32;
        let (mut max_w, mut max_len) = (1u32, 0u32);
        for (index, ((src, win), grid)) in sources.iter().zip(windows).zip(&grids).enumerate() {
            let r = win.src;
            check_window(index, win, (grid.width, grid.height), opts)?;
            let base = index as u64 * sample_len;
            if let Some((profile, tables)) = &grid.v2 {
                let layout = V2Layout {
                    row_stride,
                    col_step,
                    chan_stride: copy_stride,
                    base,
                    elem: &elem,
                };
                plan.plan_v2(
                    src,
                    grid,
                    index,
                    win,
                    *profile,
                    tables.as_ref(),
                    &layout,
                    opts,
                )?;
            } else {
                plan.plan_v1(
                    src,
                    grid,
                    index,
                    win,
                    base,
                    &elem,
                    (row_stride, col_step, copy_stride),
                    opts,
                    &mut max_w,
                    &mut max_len,
                )?;
            }
            if r.w != sw || r.h != sh {
                let mut y = 0;
                while y < sh {
                    let y1 = (y + rows_per_fill).min(sh);
                    plan.fills.push(FillDesc {
                        out_offset: base,
                        y0: y,
                        y1,
                        dx: win.dx,
                        dy: win.dy,
                        w: r.w,
                        h: r.h,
                        fill: u32::from(opts.fill),
                    });
                    y = y1;
                }
            }
        }
        if plan.descs.len() + plan.v2.descs.len() + plan.fills.len() > i32::MAX as usize {
            return Err(too_large("more than 2^31 - 1 thread blocks in one launch"));
        }
        plan.block_dim = crate::plan::block_dim(max_w, !plan.v2.descs.is_empty());
        plan.stage_cap = max_len.min(STAGE_CAP);
        Ok((plan, alpha))
    }

    /// Validates and plans a resampled batch: sample `i` is `geometries[i]` of `sources[i]` (a
    /// random-resized crop, a resize or a scale jitter, then the crop; vocab's [`Geometry`]), resampled
    /// with `interpolation` — the CPU loader's samples, bit for bit, padded with `opts.fill`. Only the
    /// patches under each sample's source rectangle (its window plus the filter's margin) are copied and
    /// decoded. The errors of [`new`](Self::new), and [`Error::BadWindow`] for kept outputs that do not
    /// fit the sample.
    pub fn resampled(
        sources: &[SampleSource<'_>],
        geometries: &[Geometry],
        interpolation: Interpolation,
        opts: &SampleOptions,
    ) -> Result<Self, Error> {
        check_batch(sources.len(), geometries.len(), opts)?;
        let src = Sources::new(geometries, interpolation);
        let decode = SampleOptions {
            width: src.size.0,
            height: src.size.1,
            channels: 3,
            layout: Layout::Nhwc,
            dtype: DType::U8,
            normalize: None,
            fill: 0,
            check_rows_on_host: opts.check_rows_on_host,
        };
        let into = Intermediate::For(opts.channels);
        let (mut plan, alpha) = SamplePlan::plan_windows(sources, &src.windows, &decode, into)?;
        // The passes read each rectangle only: the intermediate's padding is never written nor read.
        plan.fills.clear();
        let ci = plan.tensor.channels() as u8;
        let stage = ResampleStage::new(geometries, &src, opts, ci, &alpha)?;
        plan.resample = Some(Box::new(stage));
        Ok(plan)
    }

    /// The batch tensor: `[n, h, w, 3]` (NHWC) or `[n, 3, h, w]` (NCHW), contiguous.
    pub fn tensor(&self) -> TensorInfo {
        self.resample.as_ref().map_or(self.tensor, |r| r.tensor)
    }

    /// The image rectangle each sample decodes: its window, or for a resampled batch its window plus the
    /// filter's margin.
    pub fn source_rects(&self) -> &[Rect] {
        &self.rects
    }

    /// Whether the batch is resampled ([`resampled`](Self::resampled)).
    pub fn is_resampled(&self) -> bool {
        self.resample.is_some()
    }

    /// Samples in the batch.
    pub fn sample_count(&self) -> usize {
        self.file_lens.len()
    }

    /// Output elements of one sample.
    pub fn sample_len(&self) -> usize {
        self.tensor().strides[0]
    }

    /// Output elements of the whole batch.
    pub fn output_len(&self) -> usize {
        self.tensor().len()
    }

    /// Bytes of compressed patch data copied to the device: only the patches under the windows.
    pub fn input_len(&self) -> usize {
        self.data_len
    }

    /// Patch descriptors (decoding thread blocks) of the launch.
    pub fn patch_count(&self) -> usize {
        self.descs.len() + self.v2.descs.len()
    }

    /// Padding thread blocks of the launch (none when every window fills its sample).
    pub fn fill_count(&self) -> usize {
        self.fills.len()
    }

    /// True when every descriptor reads inside the device input and writes inside its own sample, and
    /// every padding block writes inside its own sample: the property that makes the launch memory-safe
    /// (and samples independent) whatever the patch bytes hold. Checked by the tests and the fuzz target
    /// on every plan they build.
    #[doc(hidden)]
    pub fn descriptors_in_bounds(&self) -> bool {
        let sample_len = self.tensor.strides[0] as i128;
        let n = self.sample_count();
        let (sh, sw) = match self.tensor.layout {
            Layout::Nhwc => (self.tensor.shape[1] as i128, self.tensor.shape[2] as i128),
            Layout::Nchw => (self.tensor.shape[2] as i128, self.tensor.shape[3] as i128),
        };
        let v2_ok = self.v2.in_bounds(self.data_len, |i, (lo, hi)| {
            let start = i128::from(self.v2.ids[i].0) * sample_len;
            (self.v2.ids[i].0 as usize) < n && lo >= start && hi < start + sample_len
        });
        let descs_ok = v2_ok
            && self.descs.len() == self.ids.len()
            && self.descs.iter().zip(&self.ids).all(|(d, &(s, _, _))| {
                let (w, rows, skip) = (i128::from(d.w), i128::from(d.rows), i128::from(d.skip));
                let (c0, c1) = (i128::from(d.col0), i128::from(d.col1));
                let shape_ok = (1..=255).contains(&w)
                    && (1..=255).contains(&rows)
                    && skip < rows
                    && c0 < c1
                    && c1 <= w
                    && matches!(d.copies, 1 | 3)
                    && usize::from(d.channel) + usize::from(d.copies) <= self.tensor.channels()
                    && d.row_stride > 0
                    && (s as usize) < n;
                if !shape_ok {
                    return false;
                }
                let span_rows = (rows - skip - 1) * i128::from(d.row_stride);
                let span_cols = (c1 - c0 - 1) * i128::from(d.col_stride);
                let span_copies = (i128::from(d.copies) - 1) * i128::from(d.copy_stride);
                let lo = i128::from(d.out_offset) + span_cols.min(0);
                let hi = i128::from(d.out_offset) + span_rows + span_cols.max(0) + span_copies;
                let start = i128::from(s) * sample_len;
                lo >= start
                    && hi < start + sample_len
                    && d.data_offset + u64::from(d.data_len) <= self.data_len as u64
            });
        let fills_ok = self.fills.iter().all(|f| {
            let off = i128::from(f.out_offset);
            off % sample_len == 0
                && off / sample_len < n as i128
                && f.y0 < f.y1
                && i128::from(f.y1) <= sh
                && i128::from(f.dx) + i128::from(f.w) <= sw
                && i128::from(f.dy) + i128::from(f.h) <= sh
        });
        let copies_ok = self.copies.iter().all(|c| {
            c.sample < n
                && c.file.start <= c.file.end
                && c.file.end <= self.file_lens[c.sample]
                && c.at as u64 + (c.file.end - c.file.start) <= self.data_len as u64
        });
        let passes_ok = self
            .resample
            .as_ref()
            .is_none_or(|r| r.in_bounds(self.tensor.len()));
        descs_ok && fills_ok && copies_ok && passes_ok
    }

    /// Whether `sources` are (by count and file length) the sources this plan was built from.
    pub(crate) fn built_from(&self, sources: &[SampleSource<'_>]) -> bool {
        sources.len() == self.file_lens.len()
            && sources
                .iter()
                .zip(&self.file_lens)
                .all(|(s, &l)| s.file_len() == l)
    }

    /// Copies the patch bytes under every window into `dst` (at least [`input_len`](Self::input_len)
    /// bytes): the device input the descriptors point into. [`Error::PlanMismatch`] when a source does not
    /// hold bytes the plan needs (other sources than it was built from).
    pub(crate) fn pack_into(
        &self,
        sources: &[SampleSource<'_>],
        dst: &mut [u8],
    ) -> Result<(), Error> {
        if !self.built_from(sources) {
            return Err(Error::PlanMismatch);
        }
        for c in &self.copies {
            let bytes = sources[c.sample]
                .bytes(c.file.clone())
                .ok_or(Error::PlanMismatch)?;
            dst[c.at..c.at + bytes.len()].copy_from_slice(bytes);
        }
        Ok(())
    }

    /// The descriptor table as the kernel reads it (little-endian, `struct SampleDesc`).
    pub(crate) fn descriptor_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.descs.len() * SAMPLE_DESC_BYTES);
        for d in &self.descs {
            out.extend_from_slice(&d.data_offset.to_le_bytes());
            out.extend_from_slice(&d.out_offset.to_le_bytes());
            out.extend_from_slice(&d.data_len.to_le_bytes());
            out.extend_from_slice(&d.row_stride.to_le_bytes());
            out.extend_from_slice(&d.col_stride.to_le_bytes());
            out.extend_from_slice(&d.copy_stride.to_le_bytes());
            for v in [d.w, d.rows, d.skip, d.col0, d.col1] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&[d.channel, d.copies, d.exact, 0, 0, 0]);
        }
        out
    }

    /// The padding table as the kernel reads it (`struct FillDesc`).
    pub(crate) fn fill_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.fills.len() * FILL_DESC_BYTES);
        for f in &self.fills {
            out.extend_from_slice(&f.out_offset.to_le_bytes());
            for v in [f.y0, f.y1, f.dx, f.dy, f.w, f.h, f.fill, 0] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// The kernel's error word (the lowest failing descriptor, or u32::MAX) as an error naming the sample.
    pub(crate) fn kernel_error(&self, err: u32) -> Result<(), Error> {
        if err == u32::MAX {
            return Ok(());
        }
        let v2 = (err as usize)
            .checked_sub(self.descs.len())
            .and_then(|i| self.v2.kernel_error(i));
        match (self.ids.get(err as usize), v2) {
            (Some(&(index, channel, patch)), _) => Err(Error::CorruptRows {
                index: index as usize,
                channel: channel as usize,
                patch: patch as usize,
            }),
            (None, Some(e)) => Err(e),
            (None, None) => Err(Error::Driver {
                call: "l3_samples",
                message: format!("the kernel reported descriptor {err} of {}", self.ids.len()),
            }),
        }
    }

    /// Dynamic shared memory per block.
    pub(crate) fn shared_bytes(&self) -> u32 {
        self.stage_cap
    }

    /// Kernel argument of the decode launch: 1 for NCHW output, 0 for NHWC.
    pub(crate) fn nchw(&self) -> u32 {
        u32::from(self.tensor.layout == Layout::Nchw)
    }

    /// Sample width and height of the decode launch (the intermediate's, for a resampled batch).
    pub(crate) fn sample_size(&self) -> (u32, u32) {
        self.tensor.sample_size()
    }
}

/// What a window plan decodes into.
#[derive(Clone, Copy)]
enum Intermediate {
    /// RGB: the batch of a plain 3-channel window batch, or a resampled one's intermediate.
    Rgb,
    /// The intermediate of a resampled batch of these channels: 1 when every image is gray (a batch of
    /// label maps), 4 when an image has alpha, else 3 (gray copied to R, G, B).
    For(u8),
}

/// The checks every batch starts with: sources, one window or geometry each, a sample size, channels.
fn check_batch(sources: usize, windows: usize, opts: &SampleOptions) -> Result<(), Error> {
    if sources == 0 {
        return Err(Error::EmptyBatch);
    }
    if windows != sources {
        return Err(Error::WindowCount { sources, windows });
    }
    if opts.width == 0 || opts.height == 0 {
        return Err(Error::BadSampleSize {
            width: opts.width,
            height: opts.height,
        });
    }
    if !matches!(opts.channels, 1 | 3 | 4) {
        return Err(Error::Unsupported {
            what: "channels other than 1 (luma), 3 (RGB) or 4 (RGBA)",
        });
    }
    Ok(())
}

/// `win` lies inside its image (`width`, `height`) and its sample.
fn check_window(
    index: usize,
    win: &Window,
    (width, height): (u32, u32),
    opts: &SampleOptions,
) -> Result<(), Error> {
    let r = win.src;
    if !r.fits(width, height) {
        return Err(Error::BadWindow {
            index,
            window: *win,
            what: "image",
            width,
            height,
        });
    }
    if u64::from(win.dx) + u64::from(r.w) > u64::from(opts.width)
        || u64::from(win.dy) + u64::from(r.h) > u64::from(opts.height)
    {
        return Err(Error::BadWindow {
            index,
            window: *win,
            what: "sample",
            width: opts.width,
            height: opts.height,
        });
    }
    Ok(())
}

fn missing(index: usize, patch: Option<PatchId>, r: &Range<u64>) -> Error {
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
