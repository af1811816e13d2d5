//! From a decoded image of any size to one fixed-size sample of a batch: crop or pad, flip, layout, dtype.

use crate::image::Image;
use crate::order::SplitMix64;

/// Where the fixed-size window is cut from an image larger than the batch's height or width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crop {
    /// The centre of the image (evaluation).
    Center,
    /// A uniformly random window, seeded per (seed, epoch, item) so that runs and resumes repeat exactly.
    Random,
}

/// Memory order of a batch buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[batch][height][width][channel]` (TensorFlow, JAX, DALI's default).
    Nhwc,
    /// `[batch][channel][height][width]` (PyTorch).
    Nchw,
}

/// Per-channel normalisation to f32: `(pixel / 255 - mean) / std`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalize {
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Normalize {
    /// The ImageNet statistics every torchvision model expects.
    pub const IMAGENET: Normalize = Normalize {
        mean: [0.485, 0.456, 0.406],
        std: [0.229, 0.224, 0.225],
    };
    /// Plain scaling to [0, 1].
    pub const UNIT: Normalize = Normalize {
        mean: [0.0; 3],
        std: [1.0; 3],
    };
}

/// A batch buffer: u8 pixels, or f32 when normalisation is on.
#[derive(Clone, Debug, PartialEq)]
pub enum Pixels {
    U8(Vec<u8>),
    F32(Vec<f32>),
}

impl Pixels {
    pub fn len(&self) -> usize {
        match self {
            Pixels::U8(v) => v.len(),
            Pixels::F32(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The u8 buffer, if this batch is not normalised.
    pub fn as_u8(&self) -> Option<&[u8]> {
        match self {
            Pixels::U8(v) => Some(v),
            Pixels::F32(_) => None,
        }
    }
    /// The f32 buffer, if this batch is normalised.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Pixels::F32(v) => Some(v),
            Pixels::U8(_) => None,
        }
    }
}

/// How every sample of a batch is shaped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleSpec {
    pub height: u32,
    pub width: u32,
    pub crop: Crop,
    pub hflip: bool,
    pub layout: Layout,
    pub normalize: Option<Normalize>,
}

impl SampleSpec {
    /// Values per sample (always 3 channels: gray is replicated, alpha dropped).
    pub fn sample_len(&self) -> usize {
        self.height as usize * self.width as usize * 3
    }

    /// Where the window falls in the image and whether it is mirrored, for item randomness `rng`.
    ///
    /// Returns (source x, source y, destination x, destination y, copy width, copy height, flip).
    pub fn placement(&self, img_w: u32, img_h: u32, rng: &mut SplitMix64) -> Placement {
        let axis = |src: u32, dst: u32, rng: &mut SplitMix64| -> (u32, u32, u32) {
            if src >= dst {
                let off = match self.crop {
                    Crop::Center => (src - dst) / 2,
                    Crop::Random => rng.below(u64::from(src - dst) + 1) as u32,
                };
                (off, 0, dst)
            } else {
                // Smaller than the window: centred, padded with zeros around.
                (0, (dst - src) / 2, src)
            }
        };
        let (sx, dx, w) = axis(img_w, self.width, rng);
        let (sy, dy, h) = axis(img_h, self.height, rng);
        let flip = self.hflip && rng.next_u64() & 1 == 1;
        Placement {
            sx,
            sy,
            dx,
            dy,
            w,
            h,
            flip,
        }
    }

    /// Writes one sample of `img` into `out` (`sample_len()` values), zero padding included.
    pub fn write_u8(&self, img: &Image, p: &Placement, out: &mut [u8]) {
        self.write(img, p, out, |v, _| v);
    }

    /// Like [`write_u8`](Self::write_u8), normalised to f32.
    pub fn write_f32(&self, img: &Image, p: &Placement, out: &mut [f32], norm: &Normalize) {
        let scale: [f32; 3] = std::array::from_fn(|c| 1.0 / (255.0 * norm.std[c]));
        let bias: [f32; 3] = std::array::from_fn(|c| -norm.mean[c] / norm.std[c]);
        // Padding is a zero pixel, normalised like any other.
        self.write(img, p, out, |v: u8, c| v as f32 * scale[c] + bias[c]);
    }

    fn write<T: Copy>(
        &self,
        img: &Image,
        p: &Placement,
        out: &mut [T],
        f: impl Fn(u8, usize) -> T,
    ) {
        let (w, h) = (self.width as usize, self.height as usize);
        let plane = w * h;
        let pad: [T; 3] = std::array::from_fn(|c| f(0, c));
        let idx = |x: usize, y: usize, c: usize| match self.layout {
            Layout::Nhwc => (y * w + x) * 3 + c,
            Layout::Nchw => c * plane + y * w + x,
        };
        let padded = p.w as usize != w || p.h as usize != h;
        if padded {
            for y in 0..h {
                for x in 0..w {
                    for (c, &v) in pad.iter().enumerate() {
                        out[idx(x, y, c)] = v;
                    }
                }
            }
        }
        let ic = img.channels as usize;
        let iw = img.width as usize;
        for row in 0..p.h as usize {
            let sy = p.sy as usize + row;
            let dy = p.dy as usize + row;
            let src_row = &img.pixels[(sy * iw + p.sx as usize) * ic..][..p.w as usize * ic];
            for col in 0..p.w as usize {
                let s = &src_row[col * ic..col * ic + ic];
                let rgb = if ic >= 3 {
                    [s[0], s[1], s[2]]
                } else {
                    [s[0]; 3]
                };
                let dx = if p.flip {
                    p.dx as usize + p.w as usize - 1 - col
                } else {
                    p.dx as usize + col
                };
                for c in 0..3 {
                    out[idx(dx, dy, c)] = f(rgb[c], c);
                }
            }
        }
    }
}

/// Where one sample's window lies (see [`SampleSpec::placement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub sx: u32,
    pub sy: u32,
    pub dx: u32,
    pub dy: u32,
    pub w: u32,
    pub h: u32,
    pub flip: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(h: u32, w: u32, layout: Layout) -> SampleSpec {
        SampleSpec {
            height: h,
            width: w,
            crop: Crop::Center,
            hflip: false,
            layout,
            normalize: None,
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

    #[test]
    fn center_crop_and_pad() {
        let s = spec(2, 2, Layout::Nhwc);
        let mut rng = SplitMix64::new(1);
        let i = img(4, 4);
        let p = s.placement(4, 4, &mut rng);
        let mut out = vec![0u8; s.sample_len()];
        s.write_u8(&i, &p, &mut out);
        assert_eq!(out, [1, 1, 7, 2, 1, 7, 1, 2, 7, 2, 2, 7]);

        let s = spec(3, 3, Layout::Nchw);
        let i = img(1, 1);
        let p = s.placement(1, 1, &mut rng);
        let mut out = vec![9u8; s.sample_len()];
        s.write_u8(&i, &p, &mut out);
        // Centre pixel of each plane holds the image, the rest is padding.
        let mut want = vec![0u8; 27];
        want[4] = 0;
        want[9 + 4] = 0;
        want[18 + 4] = 7;
        assert_eq!(out, want);
    }

    #[test]
    fn flip_mirrors_the_row() {
        let mut s = spec(1, 3, Layout::Nhwc);
        s.hflip = true;
        let i = img(3, 1);
        let p = Placement {
            sx: 0,
            sy: 0,
            dx: 0,
            dy: 0,
            w: 3,
            h: 1,
            flip: true,
        };
        let mut out = vec![0u8; 9];
        s.write_u8(&i, &p, &mut out);
        assert_eq!(out, [2, 0, 7, 1, 0, 7, 0, 0, 7]);
    }
}
