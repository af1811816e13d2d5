//! Where decoded pixels go in the caller's buffer ([`PixelLayout`]): interleaved (HWC) or planar (CHW), at
//! any row and plane strides (straight into a batch slot, for instance). Every decoder writes through it.

/// Where decoded pixels go in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelLayout {
    /// Interleaved channels (HWC): pixel (x, y), channel c at `y * row_stride + x * channels + c`.
    Interleaved { row_stride: usize },
    /// One plane per channel (CHW): at `c * plane_stride + y * row_stride + x`.
    Planar {
        row_stride: usize,
        plane_stride: usize,
    },
}

impl PixelLayout {
    /// The packed layout of a `w`-wide, `h`-high region: interleaved (`planar = false`) or planar.
    pub fn packed(w: u32, h: u32, channels: u8, planar: bool) -> PixelLayout {
        let (w, h, c) = (w as usize, h as usize, channels as usize);
        if planar {
            PixelLayout::Planar {
                row_stride: w,
                plane_stride: w * h,
            }
        } else {
            PixelLayout::Interleaved { row_stride: w * c }
        }
    }

    /// Bytes a buffer needs to hold a `w`×`h` region with `channels` channels in this layout; `None` when
    /// the strides cannot hold it.
    pub fn required_len(&self, w: u32, h: u32, channels: u8) -> Option<usize> {
        let (w, h, c) = (w as usize, h as usize, channels as usize);
        match *self {
            PixelLayout::Interleaved { row_stride } => (row_stride >= w * c)
                .then(|| (h - 1).checked_mul(row_stride)?.checked_add(w * c))
                .flatten(),
            PixelLayout::Planar {
                row_stride,
                plane_stride,
            } => {
                let plane = (h - 1).checked_mul(row_stride)?.checked_add(w)?;
                (row_stride >= w && plane_stride >= plane)
                    .then(|| (c - 1).checked_mul(plane_stride)?.checked_add(plane))
                    .flatten()
            }
        }
    }
}

impl std::fmt::Display for PixelLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PixelLayout::Interleaved { row_stride } => {
                write!(f, "interleaved, row stride {row_stride}")
            }
            PixelLayout::Planar {
                row_stride,
                plane_stride,
            } => write!(
                f,
                "planar, row stride {row_stride}, plane stride {plane_stride}"
            ),
        }
    }
}
