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
//!
//! Its parts: `source` (what the bytes come from, the patch grid), `patches` (one source's descriptors),
//! `desc` ([`SamplePlan`] itself and the tables its launch reads: it imports no other part), `parts` (a
//! batch planned on several threads, a part per source joined at prefix sums).

mod desc;
mod parts;
mod patches;
mod source;

pub use desc::SamplePlan;
pub(crate) use desc::{FILL_DESC_BYTES, FillDesc, SAMPLE_DESC_BYTES};
pub use source::SampleSource;

use crate::error::Error;
use crate::layout::{STAGE_CAP, SampleOptions, TensorInfo, block_dim, scale_bias_for};
use crate::resample::{ResampleStage, Sources};
use crate::v2::V2Batch;
use desc::FILL_ELEMS_PER_BLOCK;
use l3_format::Rect;
use parts::SampleGeometry;
use patches::V2Layout;
use source::Grid;
use vocab::{DType, Geometry, Interpolation, Layout, Window};

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
        Self::new_parallel(sources, windows, opts, 1)
    }

    /// [`new`](Self::new) on `threads` threads (0: every core): the sources are parsed and planned in
    /// parallel, each on its own, and joined at offsets from prefix sums. The plan is the one
    /// [`new`](Self::new) builds, byte for byte; of several bad sources, the error names the first.
    pub fn new_parallel(
        sources: &[SampleSource<'_>],
        windows: &[Window],
        opts: &SampleOptions,
        threads: usize,
    ) -> Result<Self, Error> {
        check_batch(sources.len(), windows.len(), opts)?;
        if opts.channels == 3 {
            return Self::plan_windows(sources, windows, opts, Intermediate::Rgb, threads)
                .map(|(p, _)| p);
        }
        // Luma and RGBA batches are made by the resampling kernels, which convert channels as the CPU
        // does; a window is a resampling that copies. Windows are checked here, so that an error names
        // the window asked for.
        for (index, (src, win)) in sources.iter().zip(windows).enumerate() {
            let grid = Grid::open(src).map_err(|e| e.at(index))?;
            check_window(index, win, (grid.width, grid.height), opts)?;
        }
        let geometries: Vec<Geometry> = windows.iter().map(Geometry::from_window).collect();
        Self::resampled_parallel(sources, &geometries, Interpolation::Nearest, opts, threads)
    }

    /// [`new`](Self::new) for `opts.channels` = 3 (the batch itself), or the decode of a resampled
    /// batch into its intermediate (`into`), on `threads` threads (0: every core). Also returns whether
    /// each image has alpha.
    fn plan_windows(
        sources: &[SampleSource<'_>],
        windows: &[Window],
        opts: &SampleOptions,
        into: Intermediate,
        threads: usize,
    ) -> Result<(Self, Vec<bool>), Error> {
        let (sw, sh) = (opts.width, opts.height);
        let scale_bias = scale_bias_for(opts.dtype, opts.normalize)?;
        let too_large = |what| Error::TooLarge { what };
        let n = sources.len();
        let threads = stdx::parallel::threads(threads).min(n);
        let grids = parts::in_order(sources, threads, |index, src| {
            Grid::open(src).map_err(|e| e.at(index))
        })?;
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
        let geo = SampleGeometry {
            layout: opts.layout,
            width: sw,
            plane,
            channels: ci,
            sample_len,
            strides: (row_stride, col_step, copy_stride),
            rows_per_fill: (FILL_ELEMS_PER_BLOCK / (sw as usize * ci as usize))
                .clamp(1, sh as usize) as u32,
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
        let (mut max_w, mut max_len) = (1u32, 0u32);
        if threads <= 1 {
            for (index, ((src, win), grid)) in sources.iter().zip(windows).zip(&grids).enumerate() {
                plan.plan_source(index, src, win, grid, &geo, opts, &mut max_w, &mut max_len)?;
            }
        } else {
            // Every source planned on its own (offsets from 0), then joined at prefix sums.
            let planned = parts::in_order(&grids, threads, |index, grid| {
                let mut part = plan.part();
                let (mut w, mut l) = (1u32, 0u32);
                let (src, win) = (&sources[index], &windows[index]);
                part.plan_source(index, src, win, grid, &geo, opts, &mut w, &mut l)?;
                Ok((part, w, l))
            })?;
            for (part, w, l) in planned {
                plan.append_part(part)?;
                (max_w, max_len) = (max_w.max(w), max_len.max(l));
            }
        }
        if plan.descs.len() + plan.v2.descs.len() + plan.fills.len() > i32::MAX as usize {
            return Err(too_large("more than 2^31 - 1 thread blocks in one launch"));
        }
        plan.block_dim = block_dim(max_w);
        plan.stage_cap = max_len.min(STAGE_CAP);
        Ok((plan, alpha))
    }

    /// Sample `index`: window `win` of `src` (whose grid is `grid`), its descriptors and padding.
    #[allow(clippy::too_many_arguments)]
    fn plan_source(
        &mut self,
        index: usize,
        src: &SampleSource<'_>,
        win: &Window,
        grid: &Grid<'_>,
        geo: &SampleGeometry,
        opts: &SampleOptions,
        max_w: &mut u32,
        max_len: &mut u32,
    ) -> Result<(), Error> {
        let r = win.src;
        check_window(index, win, (grid.width, grid.height), opts)?;
        let base = index as u64 * geo.sample_len;
        let elem = |x: u32, y: u32, c: u32| geo.elem(x, y, c);
        let (row_stride, col_step, copy_stride) = geo.strides;
        if let Some((profile, tables)) = &grid.v2 {
            let layout = V2Layout {
                row_stride,
                col_step,
                chan_stride: copy_stride,
                base,
                elem: &elem,
            };
            self.plan_v2(
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
            self.plan_v1(
                src,
                grid,
                index,
                win,
                base,
                &elem,
                geo.strides,
                opts,
                max_w,
                max_len,
            )?;
        }
        let (sw, sh) = (opts.width, opts.height);
        if r.w != sw || r.h != sh {
            let mut y = 0;
            while y < sh {
                let y1 = (y + geo.rows_per_fill).min(sh);
                self.fills.push(FillDesc {
                    out_offset: base,
                    y0: y,
                    y1,
                    dx: win.dx,
                    dy: win.dy,
                    w: r.w,
                    h: r.h,
                    fill: u32::from(opts.fill),
                    pad: 0,
                });
                y = y1;
            }
        }
        Ok(())
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
        Self::resampled_parallel(sources, geometries, interpolation, opts, 1)
    }

    /// [`resampled`](Self::resampled) on `threads` threads (0: every core), as
    /// [`new_parallel`](Self::new_parallel) plans.
    pub fn resampled_parallel(
        sources: &[SampleSource<'_>],
        geometries: &[Geometry],
        interpolation: Interpolation,
        opts: &SampleOptions,
        threads: usize,
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
        let (mut plan, alpha) =
            SamplePlan::plan_windows(sources, &src.windows, &decode, into, threads)?;
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
    /// hold bytes the plan needs (other sources than it was built from). One thread, in order: what the
    /// tests hold [`stage_into`](Self::stage_into) to.
    #[cfg(test)]
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

    /// Dynamic shared memory per block: none. The v1 kernel keeps a patch's rows in registers and reads
    /// its bytes through L1, so `stage_cap` is passed but no longer staged.
    pub(crate) fn shared_bytes(&self) -> u32 {
        0
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
