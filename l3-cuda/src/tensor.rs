//! The batch-tensor vocabulary of the whole toolkit: memory layout, element type and per-channel
//! normalisation. The GPU decoder and the CPU loader (which re-exports these) fill tensors described the
//! same way, with the same arithmetic, so a batch is bit-identical whichever produced it.

/// Memory order of a batch of images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// `[batch][height][width][channel]` (TensorFlow, JAX, DALI's default).
    #[default]
    Nhwc,
    /// `[batch][channel][height][width]` (PyTorch).
    Nchw,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nhwc => "NHWC",
            Layout::Nchw => "NCHW",
        }
    }

    /// `nhwc` or `nchw`, any case.
    pub fn parse(s: &str) -> Option<Layout> {
        match s.to_ascii_lowercase().as_str() {
            "nhwc" => Some(Layout::Nhwc),
            "nchw" => Some(Layout::Nchw),
            _ => None,
        }
    }
}

/// Element type of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DType {
    /// Pixels as stored, 0..=255.
    #[default]
    U8,
    /// IEEE binary16 (stored as its bit pattern), rounded to nearest even from the f32 value.
    F16,
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

    /// NumPy's names and the short ones (`u8`, `f16`, `half`, `f32`, `float`).
    pub fn parse(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "uint8" | "u8" => Some(DType::U8),
            "float16" | "f16" | "half" => Some(DType::F16),
            "float32" | "f32" | "float" => Some(DType::F32),
            _ => None,
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
            assert_eq!(Layout::parse(l.name()), Some(l));
        }
        for d in [DType::U8, DType::F16, DType::F32] {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::parse("int8"), None);
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
