//! From a decoded image (or region) of any size to one fixed-size sample of a batch: where the window
//! falls (crop or pad, flip), and writing it into the sample's slot of the batch buffer in the batch's
//! layout and element type.
//!
//! The vocabulary and the arithmetic are the toolkit's own (`vocab`: [`Window`],
//! [`Layout`], [`DType`], [`Normalize::apply`]), so CPU and GPU batches are bit-identical.

use l3_format::PixelLayout;
pub use vocab::{DType, ItemKey, Layout, Normalize, SampleSpec, Window};

/// How much of an item the decode stage decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum DecodeScope {
    /// Only what the sample's window covers, where the format allows it: L3 decodes (and, from files,
    /// reads) only the patches under the window. Samples are identical to whole-image decoding.
    #[default]
    Region,
    /// The whole image, then the window is cut from it.
    Whole,
}

/// Writing samples into their slots: the loader's half of [`SampleSpec`] (the spec itself, and where a
/// window falls, are the toolkit's vocabulary).
pub(crate) trait SampleWrite {
    fn at(&self, x: usize, y: usize, c: usize) -> usize;
    fn fill_padding(&self, win: &Window, slot: &mut [u8]);
    fn encode(&self, v: u8, c: usize) -> [u8; 4];
    fn write_window(
        &self,
        win: &Window,
        px: &[u8],
        channels: u8,
        row_stride: usize,
        slot: &mut [u8],
    );
    fn direct_layout(&self, win: &Window, channels: u8) -> Option<(usize, PixelLayout)>;
    fn mirror_window(&self, win: &Window, slot: &mut [u8]);
    fn place_sample(&self, sample: &[u8], size: (u32, u32), slot: &mut [u8]);
}

impl SampleWrite for SampleSpec {
    /// Index (in elements) of (x, y, channel c) within a sample.
    #[inline(always)]
    fn at(&self, x: usize, y: usize, c: usize) -> usize {
        let (w, h) = (self.width as usize, self.height as usize);
        match self.layout {
            Layout::Nhwc => (y * w + x) * usize::from(self.channels) + c,
            Layout::Nchw => c * w * h + y * w + x,
        }
    }

    /// Writes the padding of a sample: everything outside `win` (the window itself is left alone).
    fn fill_padding(&self, win: &Window, slot: &mut [u8]) {
        let (w, h) = (self.width as usize, self.height as usize);
        let (x0, y0) = (win.dx as usize, win.dy as usize);
        let (x1, y1) = (x0 + win.src.w as usize, y0 + win.src.h as usize);
        if (x0, y0, x1, y1) == (0, 0, w, h) {
            return;
        }
        let pad: [[u8; 4]; 4] = std::array::from_fn(|c| self.encode(self.fill, c));
        let pad = &pad[..usize::from(self.channels)];
        let size = self.dtype.size();
        for y in 0..h {
            let inside_row = (y0..y1).contains(&y);
            for x in 0..w {
                if inside_row && (x0..x1).contains(&x) {
                    continue;
                }
                for (c, p) in pad.iter().enumerate() {
                    let i = self.at(x, y, c) * size;
                    slot[i..i + size].copy_from_slice(&p[..size]);
                }
            }
        }
    }

    /// Pixel value `v` of channel `c` as this sample's element bytes (little-endian). A one-channel
    /// sample is normalised with channel 0's statistics, a fourth (alpha) channel scaled to [0, 1].
    #[inline(always)]
    fn encode(&self, v: u8, c: usize) -> [u8; 4] {
        match self.dtype {
            DType::U8 => [v, 0, 0, 0],
            DType::F32 => self
                .normalize
                .unwrap_or(Normalize::UNIT)
                .apply(v, c)
                .to_le_bytes(),
            DType::F16 => {
                let h = half::f16::from_f32(self.normalize.unwrap_or(Normalize::UNIT).apply(v, c));
                let b = h.to_bits().to_le_bytes();
                [b[0], b[1], 0, 0]
            }
        }
    }

    /// Writes the window's pixels from `px` — the window's region, interleaved with `channels` channels,
    /// rows `row_stride` bytes apart — into `slot`, converting channels (as [`vocab::Channels`]), type
    /// and layout, mirroring when `win.flip`. u8 rows of the sample's own channel count are plain
    /// copies in NHWC (unmirrored) and split into their planes in NCHW; everything else takes the
    /// general path ([`write_lanes`]).
    fn write_window(
        &self,
        win: &Window,
        px: &[u8],
        channels: u8,
        row_stride: usize,
        slot: &mut [u8],
    ) {
        let c_n = channels as usize;
        let (ww, wh) = (win.src.w as usize, win.src.h as usize);
        let (w, h) = (self.width as usize, self.height as usize);
        let (dx, dy) = (win.dx as usize, win.dy as usize);
        let out_n = usize::from(self.channels);
        if self.dtype == DType::U8 && c_n == out_n && self.layout == Layout::Nhwc && !win.flip {
            for row in 0..wh {
                let at = ((dy + row) * w + dx) * out_n;
                slot[at..at + ww * out_n].copy_from_slice(&px[row * row_stride..][..ww * out_n]);
            }
            return;
        }
        if self.dtype == DType::U8
            && c_n == out_n
            && self.layout == Layout::Nchw
            && matches!(c_n, 1 | 3 | 4)
        {
            // u8 NCHW of the image's own channels (what PyTorch training takes): each row split into
            // its planes, with no table and no per-element index.
            for row in 0..wh {
                let src = &px[row * row_stride..][..ww * c_n];
                let at = (dy + row) * w + dx;
                match c_n {
                    1 => split_row::<1>(src, at, w * h, win.flip, slot),
                    3 => split_row::<3>(src, at, w * h, win.flip, slot),
                    _ => split_row::<4>(src, at, w * h, win.flip, slot),
                }
            }
            return;
        }
        write_lanes(self, win, px, channels, row_stride, slot);
    }

    /// Where a region decoder can write the window straight into the slot: u8 samples with the image's
    /// own channel count (the layouts match element for element). `None` means decode into scratch and
    /// convert.
    fn direct_layout(&self, win: &Window, channels: u8) -> Option<(usize, PixelLayout)> {
        if self.dtype != DType::U8 || channels != self.channels {
            return None;
        }
        let c = usize::from(channels);
        let (w, h) = (self.width as usize, self.height as usize);
        let (dx, dy) = (win.dx as usize, win.dy as usize);
        Some(match self.layout {
            Layout::Nhwc => (
                (dy * w + dx) * c,
                PixelLayout::Interleaved { row_stride: w * c },
            ),
            Layout::Nchw => (
                dy * w + dx,
                PixelLayout::Planar {
                    row_stride: w,
                    plane_stride: w * h,
                },
            ),
        })
    }

    /// Copies a sample of `size` (width, height; this spec's layout, type and channels) into the top-left
    /// of this spec's larger slot, and pads the rest (bottom and right) with `fill`: a whole image in its
    /// padded batch.
    fn place_sample(&self, sample: &[u8], (sw, sh): (u32, u32), slot: &mut [u8]) {
        let win = Window::new(vocab::Rect::new(0, 0, sw, sh), 0, 0, false);
        self.fill_padding(&win, slot);
        let (w, h) = (self.width as usize, self.height as usize);
        let (sw, sh) = (sw as usize, sh as usize);
        let (size, c) = (self.dtype.size(), usize::from(self.channels));
        match self.layout {
            Layout::Nhwc => {
                let row = sw * c * size;
                for y in 0..sh {
                    let at = y * w * c * size;
                    slot[at..at + row].copy_from_slice(&sample[y * row..(y + 1) * row]);
                }
            }
            Layout::Nchw => {
                let row = sw * size;
                for ch in 0..c {
                    for y in 0..sh {
                        let at = (ch * w * h + y * w) * size;
                        let from = (ch * sw * sh + y * sw) * size;
                        slot[at..at + row].copy_from_slice(&sample[from..from + row]);
                    }
                }
            }
        }
    }

    /// Mirrors the window's rows in place (after a direct write of an unflipped window).
    fn mirror_window(&self, win: &Window, slot: &mut [u8]) {
        debug_assert_eq!(self.dtype, DType::U8);
        let (ww, wh) = (win.src.w as usize, win.src.h as usize);
        for row in 0..wh {
            let y = win.dy as usize + row;
            for col in 0..ww / 2 {
                let (a, b) = (win.dx as usize + col, win.dx as usize + ww - 1 - col);
                for c in 0..usize::from(self.channels) {
                    slot.swap(self.at(a, y, c), self.at(b, y, c));
                }
            }
        }
    }
}

/// The general path of [`SampleWrite::write_window`]: any layout, type and channel count. Row by row,
/// each output channel is one lane of the slot (contiguous in NCHW, every `channels`-th element in NHWC)
/// written from a 256-entry table of encoded values.
fn write_lanes(
    spec: &SampleSpec,
    win: &Window,
    px: &[u8],
    channels: u8,
    row_stride: usize,
    slot: &mut [u8],
) {
    let c_n = channels as usize;
    let (ww, wh) = (win.src.w as usize, win.src.h as usize);
    let (w, h) = (spec.width as usize, spec.height as usize);
    let (dx, dy) = (win.dx as usize, win.dy as usize);
    let size = spec.dtype.size();
    let out_n = usize::from(spec.channels);
    let convert = vocab::Channels {
        from: channels,
        to: spec.channels,
    };
    // One lookup table per channel: 256 encoded values, so the inner loop is a copy.
    let mut table = [[[0u8; 4]; 256]; 4];
    for (c, t) in table.iter_mut().enumerate().take(out_n) {
        for (v, e) in t.iter_mut().enumerate() {
            *e = spec.encode(v as u8, c);
        }
    }
    let mut converted = Vec::new();
    for row in 0..wh {
        let src = &px[row * row_stride..][..ww * c_n];
        // The row in the sample's channels (as it is when the counts agree).
        let values = if c_n == out_n {
            src
        } else {
            converted.clear();
            converted.extend(
                src.chunks_exact(c_n)
                    .flat_map(|p| convert.convert(p).into_iter().take(out_n)),
            );
            &converted[..]
        };
        let y = dy + row;
        for (c, t) in table.iter().enumerate().take(out_n) {
            // Element index of (dx, y, c) and the step between neighbouring x.
            let (start, step) = match spec.layout {
                Layout::Nhwc => ((y * w + dx) * out_n + c, out_n),
                Layout::Nchw => (c * w * h + y * w + dx, 1),
            };
            let lane = Lane {
                start,
                step,
                len: ww,
                flip: win.flip,
            };
            match size {
                1 => lane.write::<1>(values, out_n, c, t, slot),
                2 => lane.write::<2>(values, out_n, c, t, slot),
                _ => lane.write::<4>(values, out_n, c, t, slot),
            }
        }
    }
}

/// One interleaved row of `C` channels (`src`) into its `C` planes of a u8 NCHW slot: element `at` of
/// each plane on, planes `plane` elements apart, right to left when `flip`.
#[inline(always)]
fn split_row<const C: usize>(src: &[u8], at: usize, plane: usize, flip: bool, slot: &mut [u8]) {
    let n = src.len() / C;
    for c in 0..C {
        let dst = &mut slot[c * plane + at..][..n];
        let values = src.chunks_exact(C).map(|p| p[c]);
        if flip {
            dst.iter_mut().rev().zip(values).for_each(|(d, v)| *d = v);
        } else {
            dst.iter_mut().zip(values).for_each(|(d, v)| *d = v);
        }
    }
}

/// One channel of one sample row in the slot: `len` elements from element `start`, `step` apart,
/// filled right to left when mirrored.
struct Lane {
    start: usize,
    step: usize,
    len: usize,
    flip: bool,
}

impl Lane {
    /// Writes channel `c` of `values` (interleaved, `n` per pixel) as `S`-byte elements from `table`.
    #[inline(always)]
    fn write<const S: usize>(
        &self,
        values: &[u8],
        n: usize,
        c: usize,
        table: &[[u8; 4]; 256],
        slot: &mut [u8],
    ) {
        for col in 0..self.len {
            let v = values[col * n + c];
            let x = if self.flip { self.len - 1 - col } else { col };
            let i = (self.start + x * self.step) * S;
            slot[i..i + S].copy_from_slice(&table[usize::from(v)][..S]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::image::Image;
    use vocab::{Crop, Rect};

    trait WriteImage {
        fn write_image(&self, img: &Image, win: &Window, slot: &mut [u8]);
    }

    impl WriteImage for SampleSpec {
        fn write_image(&self, img: &Image, win: &Window, slot: &mut [u8]) {
            self.fill_padding(win, slot);
            let c = img.channels as usize;
            let stride = img.width as usize * c;
            let start = win.src.y as usize * stride + win.src.x as usize * c;
            self.write_window(win, &img.pixels[start..], img.channels, stride, slot);
        }
    }

    fn spec(h: u32, w: u32, layout: Layout, dtype: DType) -> SampleSpec {
        SampleSpec {
            height: h,
            width: w,
            crop: Crop::Center,
            hflip: false,
            layout,
            dtype,
            normalize: None,
            ..SampleSpec::default()
        }
    }

    fn img(w: u32, h: u32) -> Image {
        let mut pixels = Vec::new();
        for y in 0..h {
            for x in 0..w {
                pixels.extend_from_slice(&[x as u8, y as u8, 7]);
            }
        }
        Image {
            width: w,
            height: h,
            channels: 3,
            pixels,
        }
    }

    const KEY: ItemKey = ItemKey {
        seed: 1,
        epoch: 0,
        index: 0,
    };

    #[test]
    fn center_crop_and_pad() {
        let s = spec(2, 2, Layout::Nhwc, DType::U8);
        let i = img(4, 4);
        let win = s.window(4, 4, &KEY);
        assert_eq!(win.src, Rect::new(1, 1, 2, 2));
        let mut out = vec![0u8; s.sample_bytes()];
        s.write_image(&i, &win, &mut out);
        assert_eq!(out, [1, 1, 7, 2, 1, 7, 1, 2, 7, 2, 2, 7]);

        let s = spec(3, 3, Layout::Nchw, DType::U8);
        let i = img(1, 1);
        let win = s.window(1, 1, &KEY);
        assert_eq!((win.dx, win.dy), (1, 1));
        let mut out = vec![9u8; s.sample_bytes()];
        s.write_image(&i, &win, &mut out);
        // Centre pixel of each plane holds the image, the rest is padding.
        let mut want = vec![0u8; 27];
        want[9 + 4] = 0;
        want[18 + 4] = 7;
        assert_eq!(out, want);
    }

    #[test]
    fn flip_mirrors_the_row_and_mirror_window_agrees() {
        let mut s = spec(1, 3, Layout::Nhwc, DType::U8);
        s.hflip = true;
        let i = img(3, 1);
        let win = Window {
            src: Rect::new(0, 0, 3, 1),
            dx: 0,
            dy: 0,
            flip: true,
        };
        let mut out = vec![0u8; 9];
        s.write_image(&i, &win, &mut out);
        assert_eq!(out, [2, 0, 7, 1, 0, 7, 0, 0, 7]);
        let mut direct = vec![0u8; 9];
        s.write_image(&i, &Window { flip: false, ..win }, &mut direct);
        s.mirror_window(&win, &mut direct);
        assert_eq!(direct, out);
    }

    #[test]
    fn floats_pad_with_the_normalised_zero_and_use_the_shared_arithmetic() {
        let mut s = spec(2, 3, Layout::Nchw, DType::F32);
        s.normalize = Some(Normalize::IMAGENET);
        let i = img(1, 2);
        let win = s.window(1, 2, &KEY);
        let mut out = vec![0u8; s.sample_bytes()];
        s.write_image(&i, &win, &mut out);
        let f: Vec<f32> = out
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let n = Normalize::IMAGENET;
        assert_eq!(f[0], n.apply(0, 0));
        assert_eq!(f[1], n.apply(0, 0)); // x = 1 in the image is x 0: red channel = 0
        assert_eq!(f[6 + 4], n.apply(1, 1)); // green plane, row 1, col 1: y = 1
        assert_eq!(f[12 + 1], n.apply(7, 2));
        let mut h = s;
        h.dtype = DType::F16;
        let mut out16 = vec![0u8; h.sample_bytes()];
        h.write_image(&i, &win, &mut out16);
        let g = u16::from_le_bytes([out16[26], out16[27]]);
        assert_eq!(g, half::f16::from_f32(n.apply(7, 2)).to_bits());
    }

    /// A 2x2 RGBA image whose pixel (x, y) is (10x, 20y, 30, 40 + x + y).
    fn rgba() -> Image {
        let mut pixels = Vec::new();
        for y in 0..2u8 {
            for x in 0..2u8 {
                pixels.extend_from_slice(&[10 * x, 20 * y, 30, 40 + x + y]);
            }
        }
        Image {
            width: 2,
            height: 2,
            channels: 4,
            pixels,
        }
    }

    /// `img`'s window `src`, placed at `dx` (mirrored when `flip`), as a `h`×`w` u8 sample of
    /// `channels` channels padded with 9.
    #[allow(clippy::too_many_arguments)]
    fn written(
        img: &Image,
        src: Rect,
        dx: u32,
        flip: bool,
        h: u32,
        w: u32,
        layout: Layout,
        channels: u8,
    ) -> Vec<u8> {
        let mut s = spec(h, w, layout, DType::U8);
        s.channels = channels;
        s.fill = 9;
        let win = Window {
            src,
            dx,
            dy: 0,
            flip,
        };
        let mut out = vec![0u8; s.sample_bytes()];
        s.write_image(img, &win, &mut out);
        out
    }

    #[test]
    fn luma_and_rgba_samples_in_both_layouts_with_flip_and_padding() {
        let luma = |p: &[u8]| vocab::Channels { from: 4, to: 1 }.convert(p)[0];
        let i = rgba();
        let px = |x: usize, y: usize| &i.pixels[(y * 2 + x) * 4..][..4];
        for layout in [Layout::Nhwc, Layout::Nchw] {
            // One channel: a 2x4 sample (one padding column on each side), mirrored.
            let out = written(&i, Rect::new(0, 0, 2, 2), 1, true, 2, 4, layout, 1);
            let want = [
                [9, luma(px(1, 0)), luma(px(0, 0)), 9],
                [9, luma(px(1, 1)), luma(px(0, 1)), 9],
            ];
            assert_eq!(out, want.concat(), "{layout:?}");
            // Four channels: alpha kept, padding `fill` in every channel.
            let out = written(&i, Rect::new(0, 1, 2, 1), 0, false, 1, 3, layout, 4);
            let nhwc: Vec<u8> = [px(0, 1), px(1, 1), &[9, 9, 9, 9]].concat();
            let want: Vec<u8> = match layout {
                Layout::Nhwc => nhwc,
                Layout::Nchw => (0..4)
                    .flat_map(|c| (0..3).map(move |x| (c, x)))
                    .map(|(c, x)| nhwc[x * 4 + c])
                    .collect(),
            };
            assert_eq!(out, want, "{layout:?}");
        }
    }

    #[test]
    fn u8_nchw_rows_split_into_planes_equal_the_general_path() {
        let mut rng = stdx::SplitMix64::new(3);
        for (c_n, flip, (iw, ih)) in [
            (3u8, true, (37, 5)),
            (3, false, (37, 5)),
            (1, true, (9, 4)),
            (4, true, (16, 3)),
            (4, false, (1, 1)),
        ] {
            let mut s = spec(7, 41, Layout::Nchw, DType::U8);
            s.channels = c_n;
            let stride = iw * usize::from(c_n) + 5;
            let px: Vec<u8> = (0..stride * ih).map(|_| rng.next_u64() as u8).collect();
            let win = Window {
                src: Rect::new(0, 0, iw as u32, ih as u32),
                dx: 2,
                dy: 1,
                flip,
            };
            let (mut fast, mut general) =
                (vec![0u8; s.sample_bytes()], vec![0u8; s.sample_bytes()]);
            s.write_window(&win, &px, c_n, stride, &mut fast);
            write_lanes(&s, &win, &px, c_n, stride, &mut general);
            assert_eq!(fast, general, "{c_n} channels, flip {flip}");
            assert!(fast.iter().any(|&v| v != 0));
        }
    }

    #[test]
    fn a_direct_write_of_a_one_or_four_channel_image_equals_the_general_path() {
        for (channels, layout) in [
            (1u8, Layout::Nhwc),
            (1, Layout::Nchw),
            (4, Layout::Nhwc),
            (4, Layout::Nchw),
        ] {
            let mut s = spec(3, 4, layout, DType::U8);
            s.channels = channels;
            s.hflip = true;
            let img = Image {
                width: 2,
                height: 2,
                channels,
                pixels: (0..4 * channels).map(|v| v * 7 + 1).collect(),
            };
            let win = s.window(2, 2, &KEY);
            let mut general = vec![0u8; s.sample_bytes()];
            s.write_image(&img, &win, &mut general);
            let (at, pl) = s
                .direct_layout(&win, channels)
                .expect("same channel count, u8");
            let mut direct = vec![0u8; s.sample_bytes()];
            s.fill_padding(&win, &mut direct);
            // What a region decoder writes at `at` in `pl`: the window, unflipped.
            let c = usize::from(channels);
            for y in 0..2 {
                for x in 0..2 {
                    for k in 0..c {
                        let i = match pl {
                            PixelLayout::Interleaved { row_stride } => {
                                at + y * row_stride + x * c + k
                            }
                            PixelLayout::Planar {
                                row_stride,
                                plane_stride,
                            } => at + k * plane_stride + y * row_stride + x,
                        };
                        direct[i] = img.pixels[(y * 2 + x) * c + k];
                    }
                }
            }
            if win.flip {
                s.mirror_window(&win, &mut direct);
            }
            assert_eq!(direct, general, "{channels} channels {layout:?}");
        }
    }
}
