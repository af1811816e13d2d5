//! How every item becomes a fixed-size sample: size, crop, flip, layout, element type, normalisation —
//! and where the window falls for one item.

use crate::geometry::MAX_SAMPLE_SIDE;
use crate::{DType, Geometry, Interpolation, Invalid, Layout, Normalize, Recipe, Rect, Window};
use stdx::SplitMix64;

/// Where the fixed-size window is cut from an image larger than the sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Crop {
    /// The centre of the image (evaluation).
    #[default]
    Center,
    /// A uniformly random window, seeded per (seed, epoch, item) so that runs and resumes repeat exactly.
    Random,
}

/// How every sample of a batch is shaped. Samples have [`channels`](SampleSpec::channels) channels
/// whatever the image has (see [`Channels`]). Images smaller than the sample are centred and padded with
/// `fill`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleSpec {
    pub height: u32,
    pub width: u32,
    pub crop: Crop,
    /// Mirror each sample left-right with probability 1/2.
    pub hflip: bool,
    pub layout: Layout,
    pub dtype: DType,
    /// For float types only; float samples without it hold `pixel / 255`.
    pub normalize: Option<Normalize>,
    /// How the image becomes the sample: a plain crop, or a resampling recipe.
    pub recipe: Recipe,
    /// How resampling recipes resample the image.
    pub interpolation: Interpolation,
    /// The value of every channel where the sample shows no image (padding).
    pub fill: u8,
    /// Channels per sample: 3 (RGB, the default), 1 (luma, as Pillow's `L`) or 4 (RGBA).
    pub channels: u8,
}

/// How a pixel of `from` channels becomes one of a sample's `to` channels, as Pillow's `Image.convert`
/// does: gray is replicated to RGB; RGB (alpha ignored) becomes luma by ITU-R 601-2,
/// `(19595 R + 38470 G + 7471 B + 2^15) >> 16` (Pillow's `L24`); a missing alpha is 255 (opaque).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Channels {
    pub from: u8,
    pub to: u8,
}

impl Channels {
    /// The sample's `to` channel values of one pixel (`px` holds `from` values; the first `to` of the
    /// result are meaningful).
    #[inline(always)]
    pub fn convert(self, px: &[u8]) -> [u8; 4] {
        let gray = |v: u8| [v, v, v, 255];
        match (self.from, self.to) {
            (1, 1) | (2, 1) => [px[0], 0, 0, 0],
            (_, 1) => [luma(px[0], px[1], px[2]), 0, 0, 0],
            (1, _) => gray(px[0]),
            (2, _) => [px[0], px[0], px[0], px[1]],
            (3, _) => [px[0], px[1], px[2], 255],
            _ => [px[0], px[1], px[2], px[3]],
        }
    }
}

/// Pillow's RGB → `L` conversion (`L24` in `Convert.c`).
#[inline(always)]
fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((u32::from(r) * 19595 + u32::from(g) * 38470 + u32::from(b) * 7471 + 0x8000) >> 16) as u8
}

impl Default for SampleSpec {
    /// 224×224 centre crops, not mirrored, NCHW `uint8`.
    fn default() -> SampleSpec {
        SampleSpec {
            height: 224,
            width: 224,
            crop: Crop::Center,
            hflip: false,
            layout: Layout::default(),
            dtype: DType::default(),
            normalize: None,
            recipe: Recipe::Crop,
            interpolation: Interpolation::Bilinear,
            fill: 0,
            channels: 3,
        }
    }
}

/// The randomness of one item in one epoch: a function of (seed, epoch, item) alone, so a sample never
/// depends on thread timing and a resumed run repeats it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemKey {
    pub seed: u64,
    pub epoch: usize,
    pub index: usize,
}

impl ItemKey {
    pub fn rng(&self) -> SplitMix64 {
        SplitMix64::keyed(self.seed, self.epoch as u64, self.index as u64)
    }
}

impl SampleSpec {
    /// Checks the spec on its own: a size of 1 to [`MAX_SAMPLE_SIDE`] on each side, and a usable
    /// normalisation of a float type only. The error names the option as the surfaces spell it.
    pub fn validate(&self) -> Result<(), Invalid> {
        for side in [self.height, self.width] {
            if side == 0 || side > MAX_SAMPLE_SIDE {
                return Err(Invalid::new(
                    "crop",
                    format!("{}x{}", self.height, self.width),
                    format!("a height and width of 1 to {MAX_SAMPLE_SIDE}"),
                ));
            }
        }
        if let Some(n) = self.normalize {
            if !self.dtype.is_float() {
                return Err(Invalid::new(
                    "dtype",
                    self.dtype,
                    "float16 or float32 with mean and std (normalisation makes floats)",
                ));
            }
            if let Some((c, mean, std)) = n.invalid_channel() {
                return Err(Invalid::new(
                    "std",
                    format!("channel {c}: mean {mean}, std {std}"),
                    "a finite mean and a finite, non-zero std per channel",
                ));
            }
        }
        if ![1, 3, 4].contains(&self.channels) {
            return Err(Invalid::new(
                "channels",
                self.channels,
                "1 (luma), 3 (RGB) or 4 (RGBA)",
            ));
        }
        self.recipe.validate()
    }

    /// For whole images (no crop), the largest sample side when one is set (`max_size`): the spec's
    /// height and width are then that bound.
    pub fn whole_bound(&self) -> Option<u32> {
        match self.recipe {
            crate::Recipe::Whole(w) => w.max_size,
            _ => None,
        }
    }

    /// Values per sample: height × width × channels.
    pub fn sample_len(&self) -> usize {
        self.height as usize * self.width as usize * usize::from(self.channels)
    }

    /// Bytes per sample.
    pub fn sample_bytes(&self) -> usize {
        self.sample_len() * self.dtype.size()
    }

    /// The geometry of a `img_w`×`img_h` image for item `key`: where its sample's pixels come from.
    pub fn geometry(&self, img_w: u32, img_h: u32, key: &ItemKey) -> Geometry {
        self.recipe.geometry(
            (img_w, img_h),
            (self.width, self.height),
            self.crop == Crop::Random,
            self.hflip,
            &mut key.rng(),
        )
    }

    /// The window of a `img_w`×`img_h` image for item `key`.
    pub fn window(&self, img_w: u32, img_h: u32, key: &ItemKey) -> Window {
        let mut rng = key.rng();
        let mut axis = |src: u32, dst: u32| -> (u32, u32, u32) {
            if src >= dst {
                let off = match self.crop {
                    Crop::Center => (src - dst) / 2,
                    Crop::Random => rng.below(u64::from(src - dst) + 1) as u32,
                };
                (off, 0, dst)
            } else {
                // Smaller than the sample: centred, padded around.
                (0, (dst - src) / 2, src)
            }
        };
        let (sx, dx, w) = axis(img_w, self.width);
        let (sy, dy, h) = axis(img_h, self.height);
        let flip = self.hflip && rng.next_u64() & 1 == 1;
        Window {
            src: Rect::new(sx, sy, w, h),
            dx,
            dy,
            flip,
        }
    }
}

impl std::fmt::Display for Crop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Crop::Center => "center",
            Crop::Random => "random",
        })
    }
}

impl std::str::FromStr for Crop {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Crop, Invalid> {
        match s {
            "center" => Ok(Crop::Center),
            "random" => Ok(Crop::Random),
            _ => Err(Invalid::new("crop", s, "center or random")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: ItemKey = ItemKey {
        seed: 1,
        epoch: 0,
        index: 0,
    };

    #[test]
    fn windows_crop_pad_and_repeat() {
        let s = SampleSpec {
            height: 2,
            width: 2,
            ..SampleSpec::default()
        };
        assert_eq!(s.window(4, 4, &KEY).src, Rect::new(1, 1, 2, 2));
        let s = SampleSpec {
            height: 3,
            width: 3,
            ..SampleSpec::default()
        };
        let w = s.window(1, 1, &KEY);
        assert_eq!((w.src, w.dx, w.dy), (Rect::new(0, 0, 1, 1), 1, 1));
        let r = SampleSpec {
            crop: Crop::Random,
            hflip: true,
            ..SampleSpec::default()
        };
        let mut seen = std::collections::HashSet::new();
        for index in 0..64 {
            let key = ItemKey { index, ..KEY };
            let w = r.window(1000, 500, &key);
            assert_eq!(w, r.window(1000, 500, &key), "a pure function of the key");
            assert_eq!(
                r.geometry(1000, 500, &key).as_window(),
                Some(w),
                "the crop recipe is the window"
            );
            assert!(w.src.fits(1000, 500));
            seen.insert((w.src.x, w.flip));
        }
        assert!(seen.len() > 32, "random windows and flips vary: {seen:?}");
    }

    #[test]
    fn validation_names_the_option() {
        assert_eq!(SampleSpec::default().validate(), Ok(()));
        let e = SampleSpec {
            width: 0,
            ..SampleSpec::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.option, "crop");
        assert_eq!(
            SampleSpec {
                normalize: Some(Normalize::IMAGENET),
                ..SampleSpec::default()
            }
            .validate()
            .unwrap_err()
            .option,
            "dtype"
        );
        let bad = Normalize {
            mean: [0.0; 3],
            std: [1.0, 0.0, 1.0],
        };
        let e = SampleSpec {
            normalize: Some(bad),
            dtype: DType::F32,
            ..SampleSpec::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("channel 1"), "{e}");
    }

    #[test]
    fn channels_convert_as_pillow_does() {
        let to = |from, to, px: &[u8]| Channels { from, to }.convert(px);
        // Pillow's `convert("L")` of pure red, green, blue, white (its L24 rounding), alpha ignored.
        assert_eq!(to(3, 1, &[255, 0, 0])[0], 76);
        assert_eq!(to(3, 1, &[0, 255, 0])[0], 150);
        assert_eq!(to(3, 1, &[0, 0, 255])[0], 29);
        assert_eq!(to(4, 1, &[255, 255, 255, 0])[0], 255);
        assert_eq!(to(4, 1, &[10, 200, 30, 7])[0], luma(10, 200, 30));
        assert_eq!(to(1, 1, &[9])[0], 9);
        assert_eq!(to(2, 1, &[9, 100])[0], 9);
        // `convert("RGB")` / `convert("RGBA")`: gray replicated, a missing alpha opaque.
        assert_eq!(to(1, 3, &[9]), [9, 9, 9, 255]);
        assert_eq!(to(2, 4, &[9, 100]), [9, 9, 9, 100]);
        assert_eq!(to(3, 4, &[1, 2, 3]), [1, 2, 3, 255]);
        assert_eq!(to(4, 4, &[1, 2, 3, 4]), [1, 2, 3, 4]);
        assert_eq!(&to(4, 3, &[1, 2, 3, 4])[..3], &[1, 2, 3]);
    }

    #[test]
    fn channels_are_one_three_or_four() {
        for c in [1, 3, 4] {
            let spec = SampleSpec {
                channels: c,
                ..SampleSpec::default()
            };
            spec.validate().unwrap();
            assert_eq!(spec.sample_len(), 224 * 224 * usize::from(c));
        }
        for c in [0, 2, 5] {
            let e = SampleSpec {
                channels: c,
                ..SampleSpec::default()
            }
            .validate()
            .unwrap_err();
            assert!(e.to_string().contains("channels"), "{e}");
        }
    }
}
