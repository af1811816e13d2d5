//! Padding modes as index maps: where a coordinate outside `0..n` reads from.
//!
//! Expressing padding as "which source index" rather than "copy these pixels" is what lets the tiler treat
//! a tile's halo and the image border alike: a halo coordinate inside the image is read from the tile that
//! stores it (dictionary padding), one outside is first mapped by the model's own padding.

/// The four paddings of the paper (Figure 7), with PyTorch's semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaddingMode {
    /// Zeros outside (Conv2d's `padding_mode="zeros"`).
    Zero,
    /// The edge pixel repeated (`ReplicationPad2d`).
    Replicate,
    /// Mirror without repeating the edge (`ReflectionPad2d`): index -1 reads 1.
    Reflect,
    /// Wrap around (`padding_mode="circular"`): the paper's choice on the external border.
    Circular,
}

impl PaddingMode {
    /// The index in `0..n` that coordinate `i` reads, or `None` for a zero.
    pub fn map(self, i: isize, n: usize) -> Option<usize> {
        let n = n as isize;
        if (0..n).contains(&i) {
            return Some(i as usize);
        }
        match self {
            PaddingMode::Zero => None,
            PaddingMode::Replicate => Some(i.clamp(0, n - 1) as usize),
            PaddingMode::Circular => Some(i.rem_euclid(n) as usize),
            PaddingMode::Reflect => {
                if n == 1 {
                    return Some(0);
                }
                // Repeated mirroring has period 2(n-1); PyTorch only allows one reflection (pad < n),
                // which the network plan checks, so this is the same map there.
                let p = 2 * (n - 1);
                let r = i.rem_euclid(p);
                Some(if r < n { r } else { p - r } as usize)
            }
        }
    }

    pub fn parse(s: &str) -> Option<PaddingMode> {
        match s {
            "zero" | "zeros" => Some(PaddingMode::Zero),
            "replicate" => Some(PaddingMode::Replicate),
            "reflect" | "reflection" => Some(PaddingMode::Reflect),
            "circular" => Some(PaddingMode::Circular),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PaddingMode::Zero => "zero",
            PaddingMode::Replicate => "replicate",
            PaddingMode::Reflect => "reflect",
            PaddingMode::Circular => "circular",
        }
    }
}

impl std::fmt::Display for PaddingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PaddingMode {
    type Err = vocab::Invalid;
    fn from_str(s: &str) -> Result<PaddingMode, vocab::Invalid> {
        PaddingMode::parse(s).ok_or_else(|| {
            vocab::Invalid::new("padding", s, "reflect, circular, zero or replicate")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::PaddingMode::*;

    #[test]
    fn maps_like_pytorch() {
        // n = 4, coordinates -2..6
        let got = |m: super::PaddingMode| (-2..6).map(|i| m.map(i, 4)).collect::<Vec<_>>();
        let s = |v: &[usize]| v.iter().map(|&x| Some(x)).collect::<Vec<_>>();
        assert_eq!(got(Reflect), s(&[2, 1, 0, 1, 2, 3, 2, 1]));
        assert_eq!(got(Replicate), s(&[0, 0, 0, 1, 2, 3, 3, 3]));
        assert_eq!(got(Circular), s(&[2, 3, 0, 1, 2, 3, 0, 1]));
        assert_eq!(got(Zero)[0], None);
        assert_eq!(got(Zero)[2], Some(0));
    }
}
