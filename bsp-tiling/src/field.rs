//! Sources that a tile's input window is gathered from, and the images going in and out.
//!
//! A [`Field`] is an activation addressed by *global* coordinates; it may be a whole tensor, a region of
//! one, the tiled store of the BSP engine, or an 8-bit image. The window a tile reads (its rows plus the
//! halo, padding already resolved by [`crate::model::Axis::index_map`]) comes from [`gather`].

use crate::error::Result;
use crate::tensor::Tensor;
use std::sync::Mutex;
use vocab::Image;

/// An activation (or image) read by global coordinates.
pub trait Field: Sync {
    fn channels(&self) -> usize;
    /// Fills `out` (`[channels, ys.len(), xs.len()]`) with the values at rows `ys` × columns `xs`;
    /// `None` is a zero. `out` may hold anything on entry: every element is written. Every `Some` index is inside the field. Fails only where the data lives on disk.
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()>;
    /// The window at rows `ys` × columns `xs` moved out instead of copied, for its last reader: `Some`
    /// only where the field holds exactly that window as one buffer in memory (a stored tile), which it
    /// gives up (reading it again is a logic error).
    fn take(&self, _ys: &[Option<usize>], _xs: &[Option<usize>]) -> Option<Vec<f32>> {
        None
    }
}

/// Gathers a window into a new tensor.
pub fn gather(f: &dyn Field, ys: &[Option<usize>], xs: &[Option<usize>]) -> Result<Tensor> {
    let mut t = Tensor::scratch(f.channels(), ys.len(), xs.len())?;
    f.gather(ys, xs, &mut t.data)?;
    Ok(t)
}

/// The rows (or columns) an index map reads: `lo..hi` over its `Some` entries, `None` when it reads none.
pub fn span(m: &[Option<usize>]) -> Option<(usize, usize)> {
    let lo = m.iter().flatten().min().copied()?;
    Some((lo, m.iter().flatten().max().copied().unwrap_or(lo) + 1))
}

/// Contiguous runs `(dst, src, len)` of an index map given as `(dst, Some(src))` pairs in `dst` order:
/// windows are mostly plain ranges, so a gather copies slices instead of single values.
pub fn runs(map: impl Iterator<Item = (usize, Option<usize>)>) -> Vec<(usize, usize, usize)> {
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for (d, s) in map {
        let Some(s) = s else { continue };
        match out.last_mut() {
            Some((d0, s0, len)) if *d0 + *len == d && *s0 + *len == s => *len += 1,
            _ => out.push((d, s, 1)),
        }
    }
    out
}

/// Copies `src[s..s + len]` to `dst[d..d + len]` for every run.
pub(crate) fn copy_runs(runs: &[(usize, usize, usize)], src: &[f32], dst: &mut [f32]) {
    for &(d, s, len) in runs {
        dst[d..d + len].copy_from_slice(&src[s..s + len]);
    }
}

/// A tensor holding the region of a larger activation whose top-left corner is `(y0, x0)`.
pub struct Region<'a> {
    pub t: &'a Tensor,
    pub y0: usize,
    pub x0: usize,
}

impl Field for Region<'_> {
    fn channels(&self) -> usize {
        self.t.c
    }
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()> {
        let n = ys.len() * xs.len();
        let cols = runs(
            xs.iter()
                .enumerate()
                .map(|(i, x)| (i, x.map(|x| x - self.x0))),
        );
        for c in 0..self.t.c {
            let p = self.t.plane(c);
            let o = &mut out[c * n..(c + 1) * n];
            for (iy, y) in ys.iter().enumerate() {
                let row = &mut o[iy * xs.len()..(iy + 1) * xs.len()];
                row.fill(0.0);
                let Some(y) = y else { continue };
                let src = &p[(y - self.y0) * self.t.w..(y - self.y0 + 1) * self.t.w];
                copy_runs(&cols, src, row);
            }
        }
        Ok(())
    }
}

/// A buffer holding rows `y0..y0 + h` × columns `x0..x0 + w` of a value (every channel): a stored tile
/// kept where a backend computes, or the region a unit computed where it is read. A window gathered from
/// parts takes each pixel from the part that holds it, and zero where none does (padding).
pub struct Part<'a, T> {
    pub y0: usize,
    pub x0: usize,
    pub h: usize,
    pub w: usize,
    pub buf: &'a T,
}

impl<T> Part<'_, T> {
    /// A window's index map as this part's own rows (`axis` 0) or columns (1): `None` outside it.
    pub fn local(&self, axis: usize, m: &[Option<usize>]) -> Vec<Option<usize>> {
        let (o, n) = if axis == 0 {
            (self.y0, self.h)
        } else {
            (self.x0, self.w)
        };
        m.iter()
            .map(|v| v.and_then(|v| v.checked_sub(o).filter(|&l| l < n)))
            .collect()
    }
}

/// Host tensors as the parts of one value: what a window of kept tiles is gathered from on the CPU.
pub struct Parts<'a> {
    pub c: usize,
    pub parts: &'a [Part<'a, Tensor>],
}

impl Field for Parts<'_> {
    fn channels(&self) -> usize {
        self.c
    }
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()> {
        out.fill(0.0);
        let n = ys.len() * xs.len();
        for p in self.parts {
            let ly = p.local(0, ys);
            let cols = runs(p.local(1, xs).into_iter().enumerate());
            if cols.is_empty() || ly.iter().all(Option::is_none) {
                continue;
            }
            for c in 0..self.c {
                let plane = p.buf.plane(c);
                let o = &mut out[c * n..(c + 1) * n];
                for (iy, y) in ly.iter().enumerate() {
                    let Some(y) = y else { continue };
                    copy_runs(
                        &cols,
                        &plane[y * p.w..(y + 1) * p.w],
                        &mut o[iy * xs.len()..(iy + 1) * xs.len()],
                    );
                }
            }
        }
        Ok(())
    }
}

impl Field for Tensor {
    fn channels(&self) -> usize {
        self.c
    }
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()> {
        Region {
            t: self,
            y0: 0,
            x0: 0,
        }
        .gather(ys, xs, out)
    }
}

/// An 8-bit image (the toolkit's one image type) is read as 0..255 floats, one plane per channel: a
/// byte a value instead of four.
impl Field for Image {
    fn channels(&self) -> usize {
        self.channels as usize
    }
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()> {
        let n = ys.len() * xs.len();
        let (c_n, w) = (self.channels as usize, self.width as usize);
        for (iy, y) in ys.iter().enumerate() {
            for (ix, x) in xs.iter().enumerate() {
                let i = iy * xs.len() + ix;
                match (y, x) {
                    (Some(y), Some(x)) => {
                        let p = &self.pixels[(y * w + x) * c_n..][..c_n];
                        for (c, &v) in p.iter().enumerate() {
                            out[c * n + i] = f32::from(v);
                        }
                    }
                    _ => {
                        for c in 0..c_n {
                            out[c * n + i] = 0.0;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The input of a tiled run: an image of known size that windows are gathered from.
pub trait Input: Field {
    fn height(&self) -> usize;
    fn width(&self) -> usize;
}

impl Input for Image {
    fn height(&self) -> usize {
        self.height as usize
    }
    fn width(&self) -> usize {
        self.width as usize
    }
}

impl Input for Tensor {
    fn height(&self) -> usize {
        self.h
    }
    fn width(&self) -> usize {
        self.w
    }
}

/// An image as a `C×H×W` tensor of 0..255 floats.
pub fn image_to_tensor(img: &Image) -> Result<Tensor> {
    let ys: Vec<Option<usize>> = (0..img.height as usize).map(Some).collect();
    let xs: Vec<Option<usize>> = (0..img.width as usize).map(Some).collect();
    let mut t = Tensor::scratch(img.channels as usize, ys.len(), xs.len())?;
    Field::gather(img, &ys, &xs, &mut t.data)?;
    Ok(t)
}

/// A network output (0..255 floats) clamped to an RGB image, as the PyTorch example saves images.
pub fn image_from_tensor(t: &Tensor) -> Image {
    let sink = OutputSink::rgb8(t.h, t.w);
    sink.put(0, 0, t);
    match sink.finish() {
        Output::Rgb8(i) => i,
        Output::F32(_) => unreachable!(),
    }
}

/// A finished output image.
#[derive(Clone, Debug)]
pub enum Output {
    F32(Tensor),
    /// Clamped and rounded to bytes, RGB.
    Rgb8(Image),
}

impl Output {
    pub fn height(&self) -> usize {
        match self {
            Output::F32(t) => t.h,
            Output::Rgb8(i) => i.height as usize,
        }
    }
    pub fn width(&self) -> usize {
        match self {
            Output::F32(t) => t.w,
            Output::Rgb8(i) => i.width as usize,
        }
    }
    /// The output as floats (bytes widen exactly).
    pub fn into_tensor(self) -> Result<Tensor> {
        match self {
            Output::F32(t) => Ok(t),
            Output::Rgb8(i) => image_to_tensor(&i),
        }
    }
}

/// Where tiles write their part of the output; f32 for checking, bytes to keep big images small.
pub struct OutputSink {
    out: Mutex<Output>,
}

impl OutputSink {
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the allocator refuses the output.
    pub fn f32(c: usize, h: usize, w: usize) -> Result<OutputSink> {
        Ok(OutputSink {
            out: Mutex::new(Output::F32(Tensor::zeros(c, h, w)?)),
        })
    }
    /// [`OutputSink::f32`] checked against the memory limit first ([`stdx::mem`]): an output larger
    /// than the machine allows is a typed error before anything runs, not an abort from the allocator.
    pub fn try_f32(c: usize, h: usize, w: usize) -> crate::error::Result<OutputSink> {
        let bytes = (c as u64)
            .saturating_mul(h as u64)
            .saturating_mul(w as u64)
            .saturating_mul(4);
        stdx::mem::check(bytes, format!("the output ({c}×{h}×{w} float32)"))?;
        OutputSink::f32(c, h, w)
    }
    pub fn rgb8(h: usize, w: usize) -> OutputSink {
        OutputSink {
            out: Mutex::new(Output::Rgb8(Image::rgb8(
                w as u32,
                h as u32,
                vec![0; h * w * 3],
            ))),
        }
    }

    /// Writes `t` with its top-left at `(y0, x0)`, clipped to the image.
    pub fn put(&self, y0: usize, x0: usize, t: &Tensor) {
        let mut g = self.out.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *g {
            Output::F32(o) => o.paste(y0, x0, t),
            Output::Rgb8(img) => {
                let (ih, iw) = (img.height as usize, img.width as usize);
                let h = t.h.min(ih.saturating_sub(y0));
                let w = t.w.min(iw.saturating_sub(x0));
                for y in 0..h {
                    for x in 0..w {
                        let p = ((y0 + y) * iw + x0 + x) * 3;
                        for c in 0..3.min(t.c) {
                            img.pixels[p + c] = t.at(c, y, x).clamp(0.0, 255.0).round() as u8;
                        }
                    }
                }
            }
        }
    }

    pub fn finish(self) -> Output {
        self.out.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where a run writes its output tile by tile: in memory ([`OutputSink`]), or streamed to a file
/// (`infer-io`'s writers). `put` places `t` with its top-left corner at
/// `(y0, x0)` of the output, clipped to the sink's size.
pub trait Sink: Sync {
    fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> Result<()>;
}

impl Sink for OutputSink {
    fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> Result<()> {
        self.put(y0, x0, t);
        Ok(())
    }
}

/// An input whose values are multiplied by `scale` (an 8-bit image read as 0..1 for networks trained so).
pub struct Scaled<'a> {
    pub inner: &'a dyn Input,
    pub scale: f32,
}

impl Field for Scaled<'_> {
    fn channels(&self) -> usize {
        self.inner.channels()
    }
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()> {
        self.inner.gather(ys, xs, out)?;
        if self.scale != 1.0 {
            for v in out.iter_mut() {
                *v *= self.scale;
            }
        }
        Ok(())
    }
}

impl Input for Scaled<'_> {
    fn height(&self) -> usize {
        self.inner.height()
    }
    fn width(&self) -> usize {
        self.inner.width()
    }
}

/// A sink that multiplies values by `scale` before passing them on (a 0..1 output written as 8-bit).
pub struct ScaledSink<'a> {
    pub inner: &'a dyn Sink,
    pub scale: f32,
}

impl Sink for ScaledSink<'_> {
    fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> Result<()> {
        if self.scale == 1.0 {
            return self.inner.put_tile(y0, x0, t);
        }
        let mut t = t.clone();
        for v in &mut t.data {
            *v *= self.scale;
        }
        self.inner.put_tile(y0, x0, &t)
    }
}

/// The input box-downsampled `factor` times (a partial last block averages what it has: the "sample
/// image" of section 3.3.2), computed window by window as it is read: the sampled
/// statistics' image (a 30,000² input's 2× sample is 2.7 GB of float32) is never held whole, and its
/// windows read only their blocks of the input.
pub struct Downsampled<'a> {
    input: &'a dyn Input,
    factor: usize,
}

impl<'a> Downsampled<'a> {
    pub fn new(input: &'a dyn Input, factor: usize) -> Downsampled<'a> {
        Downsampled {
            input,
            factor: factor.max(1),
        }
    }
}

impl Field for Downsampled<'_> {
    fn channels(&self) -> usize {
        self.input.channels()
    }

    /// Each output is the mean (in f64, rows then columns) of its block of the input; a window reads
    /// the blocks under it with one gather of the input.
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()> {
        let (h, w, f) = (self.input.height(), self.input.width(), self.factor);
        let (c, n) = (self.channels(), ys.len() * xs.len());
        let (Some((y_lo, y_hi)), Some((x_lo, x_hi))) = (span(ys), span(xs)) else {
            out[..c * n].fill(0.0);
            return Ok(());
        };
        let (r0, c0) = (y_lo * f, x_lo * f);
        let rows: Vec<Option<usize>> = (r0..(y_hi * f).min(h)).map(Some).collect();
        let cols: Vec<Option<usize>> = (c0..(x_hi * f).min(w)).map(Some).collect();
        let block = gather(self.input, &rows, &cols)?;
        for ch in 0..c {
            for (iy, y) in ys.iter().enumerate() {
                for (ix, x) in xs.iter().enumerate() {
                    let v = match (*y, *x) {
                        (Some(oy), Some(ox)) => {
                            let (ya, yb) = (oy * f - r0, ((oy + 1) * f).min(h) - r0);
                            let (xa, xb) = (ox * f - c0, ((ox + 1) * f).min(w) - c0);
                            let mut acc = 0.0f64;
                            for y in ya..yb {
                                for x in xa..xb {
                                    acc += block.at(ch, y, x) as f64;
                                }
                            }
                            (acc / ((yb - ya) * (xb - xa)) as f64) as f32
                        }
                        _ => 0.0,
                    };
                    out[ch * n + iy * xs.len() + ix] = v;
                }
            }
        }
        crate::buffers::give(block.data);
        Ok(())
    }
}

impl Input for Downsampled<'_> {
    fn height(&self) -> usize {
        self.input.height().div_ceil(self.factor)
    }
    fn width(&self) -> usize {
        self.input.width().div_ceil(self.factor)
    }
}
