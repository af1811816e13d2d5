//! The batch-tensor vocabulary: memory layout, element type and per-channel normalisation. The GPU decoder
//! and the CPU loader fill tensors described the same way, with the same arithmetic, so a batch is
//! bit-identical whichever produced it.

use crate::Invalid;

/// Memory order of a batch of images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Layout {
    /// `[batch][channel][height][width]`: what PyTorch models take, and the toolkit's default on every
    /// surface (Rust, the command line, Python).
    #[default]
    Nchw,
    /// `[batch][height][width][channel]` (TensorFlow, JAX).
    Nhwc,
}

impl Layout {
    /// `NCHW` or `NHWC`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nhwc => "NHWC",
            Layout::Nchw => "NCHW",
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Layout {
    type Err = Invalid;
    /// `nchw` or `nhwc`, any case.
    fn from_str(s: &str) -> Result<Layout, Invalid> {
        match s.to_ascii_lowercase().as_str() {
            "nhwc" => Ok(Layout::Nhwc),
            "nchw" => Ok(Layout::Nchw),
            _ => Err(Invalid::new("layout", s, "nchw or nhwc")),
        }
    }
}

/// Element type of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum DType {
    /// Pixels as stored, 0..=255.
    #[default]
    #[cfg_attr(feature = "clap", value(name = "uint8", alias = "u8"))]
    U8,
    /// IEEE binary16 (stored as its bit pattern), rounded to nearest even from the f32 value.
    #[cfg_attr(
        feature = "clap",
        value(name = "float16", alias = "f16", alias = "half")
    )]
    F16,
    #[cfg_attr(
        feature = "clap",
        value(name = "float32", alias = "f32", alias = "float")
    )]
    F32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    pub fn is_float(self) -> bool {
        self != DType::U8
    }

    /// `uint8`, `float16`, `float32` (NumPy's names).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::F16 => "float16",
            DType::F32 => "float32",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = Invalid;
    /// NumPy's names and the short ones (`u8`, `f16`, `half`, `f32`, `float`), any case.
    fn from_str(s: &str) -> Result<DType, Invalid> {
        match s.to_ascii_lowercase().as_str() {
            "uint8" | "u8" => Ok(DType::U8),
            "float16" | "f16" | "half" => Ok(DType::F16),
            "float32" | "f32" | "float" => Ok(DType::F32),
            _ => Err(Invalid::new("dtype", s, "uint8, float16 or float32")),
        }
    }
}

/// Per-channel normalisation of float batches on torchvision's [0, 1] scale:
/// `out = (pixel / 255 - mean[c]) / std[c]`, computed as `fma(pixel, scale[c], bias[c])` everywhere.
/// Gray images use channel 0's values; a fourth (alpha) channel is scaled to [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
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

    /// Plain scaling to [0, 1] (what float batches get without normalisation).
    pub const UNIT: Normalize = Normalize {
        mean: [0.0; 3],
        std: [1.0; 3],
    };

    /// The first channel whose mean or std is unusable (non-finite, or a zero std), with its values.
    pub fn invalid_channel(&self) -> Option<(usize, f32, f32)> {
        (0..3)
            .map(|c| (c, self.mean[c], self.std[c]))
            .find(|&(_, m, s)| !(m.is_finite() && s.is_finite() && s != 0.0))
    }

    /// `(scale, bias)` of channel `c` (0..4): the one place this arithmetic is defined.
    pub fn scale_bias(&self, c: usize) -> (f32, f32) {
        if c < 3 {
            (1.0 / (255.0 * self.std[c]), -self.mean[c] / self.std[c])
        } else {
            (1.0 / 255.0, 0.0)
        }
    }

    /// The float value of pixel `v` in channel `c`.
    #[inline(always)]
    pub fn apply(&self, v: u8, c: usize) -> f32 {
        let (s, b) = self.scale_bias(c);
        f32::from(v).mul_add(s, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_arithmetic_is_torchvisions() {
        for l in [Layout::Nhwc, Layout::Nchw] {
            assert_eq!(l.name().parse::<Layout>(), Ok(l));
            assert_eq!(l.to_string().to_lowercase().parse::<Layout>(), Ok(l));
        }
        for d in [DType::U8, DType::F16, DType::F32] {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert_eq!(
            "int8".parse::<DType>().unwrap_err().to_string(),
            "dtype \"int8\": expected uint8, float16 or float32"
        );
        assert_eq!(
            "hwc".parse::<Layout>().unwrap_err().to_string(),
            "layout \"hwc\": expected nchw or nhwc"
        );
        assert_eq!(Layout::default(), Layout::Nchw);
        let n = Normalize::IMAGENET;
        let want = (200.0 / 255.0 - 0.456) / 0.224;
        assert!((n.apply(200, 1) - want).abs() < 1e-6);
        assert_eq!(Normalize::UNIT.apply(255, 0), 1.0);
        assert_eq!(Normalize::UNIT.apply(0, 2), 0.0);
        let bad = Normalize {
            mean: [0.0, f32::NAN, 0.0],
            std: [1.0; 3],
        };
        assert_eq!(bad.invalid_channel().map(|c| c.0), Some(1));
        assert_eq!(n.invalid_channel(), None);
    }
}
