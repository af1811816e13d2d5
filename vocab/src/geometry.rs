//! Where a sample's pixels come from: the recipe that turns an image into a sample (crop, random-resized
//! crop, resize, scale jitter), the interpolation, and the [`Geometry`] of one item — the one description
//! that the image resampler, the mask and box transforms and the GPU kernel all follow.

use crate::{Invalid, Rect};
use stdx::SplitMix64;

/// The largest sample side accepted (in pixels): far beyond any network input, small enough that a batch's
/// byte count cannot overflow before it is checked against the memory limit.
pub const MAX_SAMPLE_SIDE: u32 = 1 << 16;

/// How an image becomes a sample of the spec's size. Every draw comes from the item's own generator
/// ([`ItemKey::rng`](crate::ItemKey::rng)), so a sample is a pure function of (seed, epoch, item).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Recipe {
    /// Cut the sample from the image at its size (centre or random), padding an image smaller than the
    /// sample around it; no resampling.
    #[default]
    Crop,
    /// torchvision's `RandomResizedCrop`: a window of area share in `scale` and aspect ratio log-uniform
    /// in `ratio` (10 tries, then the centre-crop fallback), resized to the sample.
    ResizedCrop { scale: [f64; 2], ratio: [f64; 2] },
    /// Resize so that the shorter side is `shorter` (aspect kept, torchvision's rounding), then crop.
    Resize { shorter: u32 },
    /// Rescale the whole image by a factor uniform in `range`, then crop; the crop may reach past the
    /// rescaled image, where the sample holds the fill value.
    Jitter { range: [f64; 2] },
    /// The whole image, no crop (`crop=None`): each sample has its own size, and a batch is padded
    /// (bottom and right) to its largest. See [`Whole`].
    Whole(Whole),
}

/// How a whole image is sized when there is no crop: at its own size, resized so that its shorter side
/// is `shorter` (torchvision's `Resize(shorter)`) or rescaled by a factor uniform in `jitter`; then, when
/// the longer side exceeds `max_size`, shrunk so that it is `max_size` (aspect kept, torchvision's
/// `max_size` rule). An image never grows because of `max_size`.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Whole {
    pub shorter: Option<u32>,
    pub jitter: Option<[f64; 2]>,
    pub max_size: Option<u32>,
}

impl Whole {
    /// The size of a `width`×`height` image's sample, drawing the jitter factor (if any) from `rng`.
    pub fn size(&self, (width, height): (u32, u32), rng: &mut SplitMix64) -> (u32, u32) {
        let (w, h) = if let Some(s) = self.shorter {
            resize_shorter(width, height, s)
        } else if let Some(range) = self.jitter {
            let f = range[0] + (range[1] - range[0]) * rng.unit_f64();
            let side = |v: u32| ((f64::from(v) * f) as u32).max(1);
            (side(width), side(height))
        } else {
            (width, height)
        };
        match self.max_size {
            Some(m) if w.max(h) > m => {
                // torchvision: new_short = int(max_size * short / long), new_long = max_size.
                let short =
                    ((u64::from(m) * u64::from(w.min(h))) / u64::from(w.max(h))).max(1) as u32;
                if w <= h { (short, m) } else { (m, short) }
            }
            _ => (w, h),
        }
    }

    /// The largest sample side, when bounded: `max_size`.
    pub fn bound(&self) -> Option<u32> {
        self.max_size
    }
}

/// The default `ratio` of [`Recipe::ResizedCrop`]: torchvision's.
pub const DEFAULT_RATIO: [f64; 2] = [3.0 / 4.0, 4.0 / 3.0];

/// How a window is resampled to its output size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Interpolation {
    /// The triangle filter, its support widened by the shrink factor when shrinking (antialiased), in
    /// Pillow's fixed-point arithmetic.
    #[default]
    Bilinear,
    /// The nearest source pixel by torchvision's index rule ([`Axis::nearest`]).
    Nearest,
}

impl std::fmt::Display for Interpolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Interpolation::Bilinear => "bilinear",
            Interpolation::Nearest => "nearest",
        })
    }
}

impl std::str::FromStr for Interpolation {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Interpolation, Invalid> {
        match s {
            "bilinear" => Ok(Interpolation::Bilinear),
            "nearest" => Ok(Interpolation::Nearest),
            _ => Err(Invalid::new("interpolation", s, "bilinear or nearest")),
        }
    }
}

/// One axis of a sample's geometry: the source span `src .. src + src_len` is resized to `dst_len`
/// pixels, of which outputs `offset .. offset + len` are kept. The resampling filter never reads outside
/// the span (a random-resized crop resizes its window alone, as torchvision crops first; a whole-image
/// resize reads the whole axis). `src_len == dst_len` is a plain copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Axis {
    pub src: u32,
    pub src_len: u32,
    pub dst_len: u32,
    pub offset: u32,
    pub len: u32,
}

impl Axis {
    /// A copy of `len` source pixels from `src`.
    pub fn copy(src: u32, len: u32) -> Axis {
        Axis {
            src,
            src_len: len,
            dst_len: len,
            offset: 0,
            len,
        }
    }

    /// Source pixels per output pixel (above 1 when shrinking).
    pub fn scale(&self) -> f64 {
        f64::from(self.src_len) / f64::from(self.dst_len)
    }

    /// The source pixel nearest output `j` (`0..len`): torchvision's `interpolate(mode="nearest")` rule,
    /// `min(floor(i * (in / out)), in - 1)` in `f32` exactly as PyTorch computes it, `i` the index in the
    /// resized span. Masks always use this.
    pub fn nearest(&self, j: u32) -> u32 {
        let scale = self.src_len as f32 / self.dst_len as f32;
        let i = (self.offset + j) as f32 * scale;
        self.src + (i.floor() as u32).min(self.src_len - 1)
    }

    /// Maps a source coordinate (pixel edges, so `src` is the span's left edge) to the output coordinate
    /// (`0` the first kept output's left edge): what a box follows.
    pub fn map(&self, x: f64) -> f64 {
        (x - f64::from(self.src)) * f64::from(self.dst_len) / f64::from(self.src_len)
            - f64::from(self.offset)
    }

    /// The source span the kept outputs cover, rounded to whole pixels and at least one: exact for a
    /// copy and for a resized window (`offset == 0`, `len == dst_len`).
    pub fn window(&self) -> (u32, u32) {
        let s = self.scale();
        let at = |o: u32| ((f64::from(o) * s).round() as u32).min(self.src_len);
        let a = at(self.offset).min(self.src_len - 1);
        let b = at(self.offset + self.len).max(a + 1);
        (self.src + a, b - a)
    }
}

/// How one item's sample is made from its image: per axis the resampling ([`Axis`]), where the kept
/// outputs land in the sample (`dx`, `dy`; the rest is fill), and whether they are mirrored left-right
/// (within the kept outputs, as [`Window`](crate::Window) mirrors). A pure function of the spec, the
/// image size and the item key; images, masks (nearest, [`Axis::nearest`]) and boxes ([`Axis::map`]) all
/// follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    pub x: Axis,
    pub y: Axis,
    pub dx: u32,
    pub dy: u32,
    pub flip: bool,
}

impl Geometry {
    /// A plain window copy.
    pub fn from_window(w: &crate::Window) -> Geometry {
        Geometry {
            x: Axis::copy(w.src.x, w.src.w),
            y: Axis::copy(w.src.y, w.src.h),
            dx: w.dx,
            dy: w.dy,
            flip: w.flip,
        }
    }

    /// Whether no resampling happens (both axes copy).
    pub fn is_copy(&self) -> bool {
        self.x.src_len == self.x.dst_len && self.y.src_len == self.y.dst_len
    }

    /// The window in source pixels the sample shows ([`Axis::window`] per axis): `batch.windows`.
    pub fn window(&self) -> Rect {
        let (x, w) = self.x.window();
        let (y, h) = self.y.window();
        Rect::new(x, y, w, h)
    }

    /// The kept outputs, width and height: the valid part of the sample (`batch.sizes`).
    pub fn size(&self) -> (u32, u32) {
        (self.x.len, self.y.len)
    }

    /// The plain copy this geometry is, as a [`Window`](crate::Window); `None` when it resamples.
    pub fn as_window(&self) -> Option<crate::Window> {
        self.is_copy().then(|| {
            let src = Rect::new(
                self.x.src + self.x.offset,
                self.y.src + self.y.offset,
                self.x.len,
                self.y.len,
            );
            crate::Window::new(src, self.dx, self.dy, self.flip)
        })
    }

    /// The one form of a geometry: a copy as the plain window it is (`src` at the window, no offset),
    /// anything that resamples as it is.
    pub fn canonical(self) -> Geometry {
        self.as_window().map_or(self, |w| Geometry::from_window(&w))
    }

    /// A source box `(x1, y1, x2, y2)` as output pixels of the sample (mirrored with the flip), unclipped.
    pub fn map_box(&self, b: [f64; 4]) -> [f64; 4] {
        let (mut x1, mut x2) = (self.x.map(b[0]), self.x.map(b[2]));
        if self.flip {
            let w = f64::from(self.x.len);
            (x1, x2) = (w - x2, w - x1);
        }
        let (dx, dy) = (f64::from(self.dx), f64::from(self.dy));
        [
            x1 + dx,
            self.y.map(b[1]) + dy,
            x2 + dx,
            self.y.map(b[3]) + dy,
        ]
    }
}

/// Checks a `jitter` range: two factors `0 < a <= b <= 64`.
fn jitter(range: [f64; 2]) -> Result<(), Invalid> {
    let ok = range.iter().all(|x| x.is_finite() && *x > 0.0) && range[0] <= range[1];
    let shown = format!("({}, {})", range[0], range[1]);
    if !ok {
        return Err(Invalid::new("jitter", shown, "two factors 0 < a <= b"));
    }
    if range[1] > 64.0 {
        return Err(Invalid::new("jitter", shown, "factors of at most 64"));
    }
    Ok(())
}

/// Python's `round`: halves to even, as torchvision's arithmetic rounds.
fn round_even(v: f64) -> f64 {
    v.round_ties_even()
}

/// A window of `len` source pixels resized to `out`, read within the window.
fn resized(src: u32, len: u32, out: u32) -> Axis {
    Axis {
        src,
        src_len: len,
        dst_len: out,
        offset: 0,
        len: out,
    }
}

/// Where a crop of `crop` outputs falls on a resized axis of `len`: torchvision's `CenterCrop` (offset
/// `round((len - crop) / 2)`, or padding `(crop - len) // 2` before a shorter axis), or uniformly random
/// among the positions that keep the image inside the crop or the crop inside the image. Returns the
/// offset into the resized axis, the kept length and where it lands in the sample.
fn place(len: u32, crop: u32, random: bool, rng: &mut SplitMix64) -> (u32, u32, u32) {
    if len >= crop {
        let off = if random {
            rng.below(u64::from(len - crop) + 1) as u32
        } else {
            round_even(f64::from(len - crop) / 2.0) as u32
        };
        (off, crop, 0)
    } else {
        let pad = if random {
            rng.below(u64::from(crop - len) + 1) as u32
        } else {
            (crop - len) / 2
        };
        (0, len, pad)
    }
}

/// torchvision's `RandomResizedCrop.get_params` on a `width`×`height` image: `(x, y, w, h)`.
fn resized_crop_window(
    width: u32,
    height: u32,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut SplitMix64,
) -> (u32, u32, u32, u32) {
    let area = f64::from(width) * f64::from(height);
    let (lr0, lr1) = (ratio[0].ln(), ratio[1].ln());
    let uniform = |rng: &mut SplitMix64, a: f64, b: f64| a + (b - a) * rng.unit_f64();
    for _ in 0..10 {
        let target = area * uniform(rng, scale[0], scale[1]);
        let aspect = uniform(rng, lr0, lr1).exp();
        let w = round_even((target * aspect).sqrt());
        let h = round_even((target / aspect).sqrt());
        if w > 0.0 && w <= f64::from(width) && h > 0.0 && h <= f64::from(height) {
            let (w, h) = (w as u32, h as u32);
            let y = rng.below(u64::from(height - h) + 1) as u32;
            let x = rng.below(u64::from(width - w) + 1) as u32;
            return (x, y, w, h);
        }
    }
    let in_ratio = f64::from(width) / f64::from(height);
    let (lo, hi) = (ratio[0].min(ratio[1]), ratio[0].max(ratio[1]));
    let (w, h) = if in_ratio < lo {
        (
            width,
            (round_even(f64::from(width) / lo) as u32).clamp(1, height),
        )
    } else if in_ratio > hi {
        (
            (round_even(f64::from(height) * hi) as u32).clamp(1, width),
            height,
        )
    } else {
        (width, height)
    };
    ((width - w) / 2, (height - h) / 2, w, h)
}

/// The size torchvision's `Resize(shorter)` gives a `width`×`height` image: the shorter side `shorter`,
/// the longer `int(shorter * long / short)`.
pub fn resize_shorter(width: u32, height: u32, shorter: u32) -> (u32, u32) {
    let (short, long) = (width.min(height), width.max(height));
    let new_long = ((u64::from(shorter) * u64::from(long)) / u64::from(short)).max(1) as u32;
    if width <= height {
        (shorter, new_long)
    } else {
        (new_long, shorter)
    }
}

impl Recipe {
    /// The option that names this recipe on the surfaces and its value as text (`None` for the plain
    /// crop): what an error or a saved state names.
    pub fn option(&self) -> Option<(&'static str, String)> {
        match *self {
            Recipe::Crop => None,
            Recipe::ResizedCrop { scale, ratio } => Some((
                "scale",
                format!("{},{}/{},{}", scale[0], scale[1], ratio[0], ratio[1]),
            )),
            Recipe::Resize { shorter } => Some(("resize", shorter.to_string())),
            Recipe::Jitter { range } => Some(("jitter", format!("{},{}", range[0], range[1]))),
            Recipe::Whole(w) => {
                let mut v = "none".to_string();
                if let Some(s) = w.shorter {
                    v += &format!("/resize {s}");
                }
                if let Some(r) = w.jitter {
                    v += &format!("/jitter {},{}", r[0], r[1]);
                }
                if let Some(m) = w.max_size {
                    v += &format!("/max_size {m}");
                }
                Some(("crop", v))
            }
        }
    }

    /// Checks the recipe's numbers, naming the option as the surfaces spell it.
    pub fn validate(&self) -> Result<(), Invalid> {
        let pair = |option: &'static str, v: [f64; 2], lo: f64, what: &str| {
            if v.iter().all(|x| x.is_finite() && *x > lo) && v[0] <= v[1] {
                Ok(())
            } else {
                Err(Invalid::new(option, format!("({}, {})", v[0], v[1]), what))
            }
        };
        match *self {
            Recipe::Crop => Ok(()),
            Recipe::ResizedCrop { scale, ratio } => {
                pair("scale", scale, 0.0, "two area shares 0 < a <= b <= 1")?;
                if scale[1] > 1.0 {
                    return Err(Invalid::new(
                        "scale",
                        format!("({}, {})", scale[0], scale[1]),
                        "two area shares 0 < a <= b <= 1",
                    ));
                }
                pair("ratio", ratio, 0.0, "two aspect ratios 0 < r1 <= r2")
            }
            Recipe::Resize { shorter } => {
                if (1..=MAX_SAMPLE_SIDE).contains(&shorter) {
                    Ok(())
                } else {
                    Err(Invalid::new(
                        "resize",
                        shorter,
                        format!("a shorter side of 1 to {}", MAX_SAMPLE_SIDE),
                    ))
                }
            }
            Recipe::Jitter { range } => jitter(range),
            Recipe::Whole(w) => {
                let side = |option: &'static str, v: Option<u32>, what: &str| match v {
                    Some(v) if !(1..=MAX_SAMPLE_SIDE).contains(&v) => Err(Invalid::new(
                        option,
                        v,
                        format!("{what} of 1 to {}", MAX_SAMPLE_SIDE),
                    )),
                    _ => Ok(()),
                };
                side("resize", w.shorter, "a shorter side")?;
                side("max_size", w.max_size, "a longer side")?;
                if let Some(r) = w.jitter {
                    jitter(r)?;
                    if let Some(s) = w.shorter {
                        return Err(Invalid::new(
                            "jitter",
                            format!("({}, {})", r[0], r[1]),
                            format!("none with resize ({s}): one resize at a time"),
                        ));
                    }
                }
                if let (Some(s), Some(m)) = (w.shorter, w.max_size)
                    && m <= s
                {
                    // torchvision refuses it too: the longer side could never reach `resize`.
                    return Err(Invalid::new(
                        "max_size",
                        m,
                        format!("a longer side above resize ({s})"),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The geometry of a `width`×`height` image (both positive) for a `crop` (width, height) sample, with
    /// `random` crop positions and `hflip`, drawing from `rng` (crop first, then the flip). A geometry
    /// that resamples nothing (a jitter or resize that drew scale 1) comes back as the plain window it is
    /// ([`Geometry::canonical`]), so that every decode path — region or whole, CPU or GPU — reports the
    /// same one.
    pub fn geometry(
        &self,
        size: (u32, u32),
        crop: (u32, u32),
        random: bool,
        hflip: bool,
        rng: &mut SplitMix64,
    ) -> Geometry {
        self.drawn_geometry(size, crop, random, hflip, rng)
            .canonical()
    }

    fn drawn_geometry(
        &self,
        (width, height): (u32, u32),
        (crop_w, crop_h): (u32, u32),
        random: bool,
        hflip: bool,
        rng: &mut SplitMix64,
    ) -> Geometry {
        let flip = |rng: &mut SplitMix64| hflip && rng.next_u64() & 1 == 1;
        match *self {
            Recipe::Crop => {
                // The original windows: floor-centred, exactly as before any resampling existed.
                let mut axis = |src: u32, dst: u32| -> (Axis, u32) {
                    if src >= dst {
                        let off = if random {
                            rng.below(u64::from(src - dst) + 1) as u32
                        } else {
                            (src - dst) / 2
                        };
                        (Axis::copy(off, dst), 0)
                    } else {
                        (Axis::copy(0, src), (dst - src) / 2)
                    }
                };
                let (x, dx) = axis(width, crop_w);
                let (y, dy) = axis(height, crop_h);
                Geometry {
                    x,
                    y,
                    dx,
                    dy,
                    flip: flip(rng),
                }
            }
            Recipe::ResizedCrop { scale, ratio } => {
                let (x, y, w, h) = resized_crop_window(width, height, scale, ratio, rng);
                Geometry {
                    x: resized(x, w, crop_w),
                    y: resized(y, h, crop_h),
                    dx: 0,
                    dy: 0,
                    flip: flip(rng),
                }
            }
            Recipe::Resize { shorter } => {
                let size = resize_shorter(width, height, shorter);
                Self::resize_then_crop((width, height), size, (crop_w, crop_h), random, flip, rng)
            }
            Recipe::Jitter { range } => {
                let f = range[0] + (range[1] - range[0]) * rng.unit_f64();
                let side = |v: u32| ((f64::from(v) * f) as u32).max(1);
                let size = (side(width), side(height));
                Self::resize_then_crop((width, height), size, (crop_w, crop_h), random, flip, rng)
            }
            Recipe::Whole(w) => {
                let (ow, oh) = w.size((width, height), rng);
                Geometry {
                    x: resized(0, width, ow),
                    y: resized(0, height, oh),
                    dx: 0,
                    dy: 0,
                    flip: flip(rng),
                }
            }
        }
    }

    /// Whether samples keep each image's own size (no crop): batches are then padded to their largest.
    pub fn is_whole(&self) -> bool {
        matches!(self, Recipe::Whole(_))
    }

    fn resize_then_crop(
        (width, height): (u32, u32),
        (rw, rh): (u32, u32),
        (crop_w, crop_h): (u32, u32),
        random: bool,
        mut flip: impl FnMut(&mut SplitMix64) -> bool,
        rng: &mut SplitMix64,
    ) -> Geometry {
        // torchvision draws the crop's top before its left.
        let (oy, ly, dy) = place(rh, crop_h, random, rng);
        let (ox, lx, mut dx) = place(rw, crop_w, random, rng);
        let flip = flip(rng);
        if flip {
            // The whole crop is mirrored (flip after crop): the kept outputs move to the other side.
            dx = crop_w - dx - lx;
        }
        let axis = |len: u32, dst_len: u32, offset: u32, kept: u32| Axis {
            src: 0,
            src_len: len,
            dst_len,
            offset,
            len: kept,
        };
        Geometry {
            x: axis(width, rw, ox, lx),
            y: axis(height, rh, oy, ly),
            dx,
            dy,
            flip,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_follows_torchvision() {
        // 5 -> 3: scale 5/3 in f32; outputs 0, 1, 2 take floor(0), floor(1.666), floor(3.333).
        let a = resized(10, 5, 3);
        assert_eq!(
            (0..3).map(|j| a.nearest(j)).collect::<Vec<_>>(),
            [10, 11, 13]
        );
        // Enlarging 2 -> 5: 0, 0, 0, 1, 1 (floor(j * 0.4)).
        let a = resized(0, 2, 5);
        assert_eq!(
            (0..5).map(|j| a.nearest(j)).collect::<Vec<_>>(),
            [0, 0, 0, 1, 1]
        );
    }

    #[test]
    fn resized_crops_stay_inside_and_fall_back() {
        let mut rng = SplitMix64::new(3);
        for _ in 0..200 {
            let (x, y, w, h) = resized_crop_window(640, 480, [0.08, 1.0], DEFAULT_RATIO, &mut rng);
            assert!(Rect::new(x, y, w, h).fits(640, 480));
        }
        // A 1x1 image: every try fits 1x1 or fails; the fallback is the whole image.
        let (x, y, w, h) = resized_crop_window(1, 1, [0.08, 1.0], DEFAULT_RATIO, &mut rng);
        assert_eq!((x, y, w, h), (0, 0, 1, 1));
        // A very wide image with an impossible area: the fallback's centre crop at the widest ratio.
        let w = resized_crop_window(1000, 10, [1.0, 1.0], [1.0, 1.0], &mut rng);
        assert_eq!(w, (495, 0, 10, 10));
    }

    #[test]
    fn a_jitter_of_scale_one_is_the_plain_window() {
        // 240 * f floors to 240 for f in [1, 1 + 1/240): a jitter range inside it always draws scale 1.
        let mut rng = SplitMix64::new(5);
        let g = Recipe::Jitter {
            range: [1.0, 1.001],
        }
        .geometry((240, 150), (64, 48), true, false, &mut rng);
        assert!(g.is_copy());
        assert_eq!((g.x.offset, g.y.offset, g.size()), (0, 0, (64, 48)));
        assert_eq!(g, g.canonical());
        assert_eq!(g, Geometry::from_window(&g.as_window().unwrap()));
        assert_eq!(g.window(), Rect::new(g.x.src, g.y.src, 64, 48));
    }

    #[test]
    fn resize_and_jitter_cover_the_sample() {
        assert_eq!(resize_shorter(640, 480, 256), (341, 256));
        assert_eq!(resize_shorter(7, 3, 2), (4, 2));
        let mut rng = SplitMix64::new(9);
        let g = Recipe::Resize { shorter: 256 }.geometry(
            (640, 480),
            (224, 224),
            false,
            false,
            &mut rng,
        );
        // torchvision's CenterCrop: round((341 - 224) / 2) = round(58.5) = 58, round(16) = 16.
        assert_eq!((g.x.offset, g.y.offset, g.size()), (58, 16, (224, 224)));
        assert_eq!(g.window(), Rect::new(109, 30, 420, 420));
        for _ in 0..100 {
            let r = Recipe::Jitter { range: [0.5, 2.0] };
            let g = r.geometry((300, 200), (256, 128), true, true, &mut rng);
            assert!(g.dx + g.x.len <= 256 && g.dy + g.y.len <= 128);
            assert!(g.x.offset + g.x.len <= g.x.dst_len && g.y.offset + g.y.len <= g.y.dst_len);
            assert!(g.window().fits(300, 200), "{:?}", g.window());
        }
    }

    #[test]
    fn whole_images_follow_torchvisions_max_size_rule_and_never_grow_for_it() {
        let mut rng = SplitMix64::new(1);
        let size = |w: Whole, dims| w.size(dims, &mut SplitMix64::new(1));
        let bounded = Whole {
            max_size: Some(500),
            ..Whole::default()
        };
        assert_eq!(size(bounded, (640, 480)), (500, 375));
        assert_eq!(size(bounded, (480, 640)), (375, 500));
        assert_eq!(
            size(bounded, (100, 50)),
            (100, 50),
            "max_size never enlarges"
        );
        assert_eq!(size(bounded, (5000, 1)), (500, 1), "a side never reaches 0");
        // The detection recipe, Resize(800, max_size=1333), on a Cityscapes frame.
        let detection = Whole {
            shorter: Some(800),
            max_size: Some(1333),
            ..Whole::default()
        };
        assert_eq!(size(detection, (2048, 1024)), (1333, 666));
        assert_eq!(size(detection, (1024, 768)), (1066, 800));
        let g = Recipe::Whole(Whole::default()).geometry((7, 3), (1, 1), false, false, &mut rng);
        assert!(g.is_copy());
        assert_eq!((g.size(), g.window()), ((7, 3), Rect::new(0, 0, 7, 3)));
        let g = Recipe::Whole(detection).geometry((2048, 1024), (1, 1), false, true, &mut rng);
        assert_eq!(
            (g.size(), g.window()),
            ((1333, 666), Rect::new(0, 0, 2048, 1024))
        );
        let e = Recipe::Whole(Whole {
            shorter: Some(800),
            max_size: Some(800),
            ..Whole::default()
        })
        .validate()
        .unwrap_err();
        assert_eq!(e.option, "max_size");
    }

    #[test]
    fn boxes_follow_the_geometry() {
        let g = Geometry {
            x: resized(10, 20, 10),
            y: Axis::copy(0, 8),
            dx: 1,
            dy: 0,
            flip: true,
        };
        // x 10..30 of the source shrinks to 0..10; flipped within the 10 kept columns, then moved by dx.
        assert_eq!(g.map_box([10.0, 2.0, 14.0, 4.0]), [9.0, 2.0, 11.0, 4.0]);
    }

    #[test]
    fn validation_names_the_option() {
        let e = Recipe::ResizedCrop {
            scale: [0.5, 0.1],
            ratio: DEFAULT_RATIO,
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.option, "scale");
        let e = Recipe::Jitter { range: [0.0, 1.0] }.validate().unwrap_err();
        assert_eq!(e.option, "jitter");
        assert_eq!(
            Recipe::Resize { shorter: 0 }.validate().unwrap_err().option,
            "resize"
        );
        assert_eq!(
            "x".parse::<Interpolation>().unwrap_err().option,
            "interpolation"
        );
    }
}
