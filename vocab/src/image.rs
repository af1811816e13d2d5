//! The toolkit's one 8-bit image type.

/// An 8-bit image with interleaved channels (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA), rows top to bottom,
/// `width * height * channels` bytes. Decoders write into an existing `Image` so that a worker thread
/// reuses one allocation for every item.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub pixels: Vec<u8>,
}

impl Image {
    /// An interleaved RGB image.
    pub fn rgb8(width: u32, height: u32, pixels: Vec<u8>) -> Image {
        debug_assert_eq!(pixels.len(), width as usize * height as usize * 3);
        Image {
            width,
            height,
            channels: 3,
            pixels,
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.width as usize * self.channels as usize
    }

    /// The pixel at (x, y) as RGB (gray replicated, alpha dropped).
    pub fn rgb(&self, x: u32, y: u32) -> [u8; 3] {
        let c = self.channels as usize;
        let i = (y as usize * self.width as usize + x as usize) * c;
        let p = &self.pixels[i..i + c];
        match c {
            1 | 2 => [p[0]; 3],
            _ => [p[0], p[1], p[2]],
        }
    }

    /// This image as interleaved RGB (gray replicated, alpha dropped).
    pub fn to_rgb(&self) -> Image {
        if self.channels == 3 {
            return self.clone();
        }
        let mut pixels = Vec::with_capacity(self.width as usize * self.height as usize * 3);
        for y in 0..self.height {
            for x in 0..self.width {
                pixels.extend_from_slice(&self.rgb(x, y));
            }
        }
        Image::rgb8(self.width, self.height, pixels)
    }

    /// Applies an EXIF orientation (1..=8) so the image shows upright; other values leave it as is.
    pub fn oriented(self, orientation: u8) -> Image {
        if !(2..=8).contains(&orientation) {
            return self;
        }
        let (w, h, c) = (
            self.width as usize,
            self.height as usize,
            self.channels as usize,
        );
        // Orientations 5..=8 swap the axes.
        let (ow, oh) = if orientation >= 5 { (h, w) } else { (w, h) };
        let mut out = vec![0u8; w * h * c];
        for y in 0..oh {
            for x in 0..ow {
                // Source coordinates of output pixel (x, y), per the EXIF definitions.
                let (sx, sy) = match orientation {
                    2 => (w - 1 - x, y),
                    3 => (w - 1 - x, h - 1 - y),
                    4 => (x, h - 1 - y),
                    5 => (y, x),
                    6 => (y, h - 1 - x),
                    7 => (w - 1 - y, h - 1 - x),
                    _ => (w - 1 - y, x),
                };
                let s = (sy * w + sx) * c;
                let d = (y * ow + x) * c;
                out[d..d + c].copy_from_slice(&self.pixels[s..s + c]);
            }
        }
        Image {
            width: ow as u32,
            height: oh as u32,
            channels: self.channels,
            pixels: out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img() -> Image {
        // 3 wide, 2 high; pixel value = index.
        Image::rgb8(3, 2, (0..6u8).flat_map(|v| [v, v, v]).collect())
    }

    fn vals(i: &Image) -> Vec<u8> {
        i.pixels
            .iter()
            .step_by(i.channels as usize)
            .copied()
            .collect()
    }

    #[test]
    fn orientations() {
        // 0 1 2 / 3 4 5
        assert_eq!(vals(&img().oriented(1)), [0, 1, 2, 3, 4, 5]);
        assert_eq!(vals(&img().oriented(2)), [2, 1, 0, 5, 4, 3]);
        assert_eq!(vals(&img().oriented(3)), [5, 4, 3, 2, 1, 0]);
        assert_eq!(vals(&img().oriented(4)), [3, 4, 5, 0, 1, 2]);
        let r = img().oriented(6); // rotate 90° clockwise
        assert_eq!((r.width, r.height), (2, 3));
        assert_eq!(vals(&r), [3, 0, 4, 1, 5, 2]);
        assert_eq!(vals(&img().oriented(8)), [2, 5, 1, 4, 0, 3]);
        assert_eq!(vals(&img().oriented(5)), [0, 3, 1, 4, 2, 5]);
        assert_eq!(vals(&img().oriented(7)), [5, 2, 4, 1, 3, 0]);
        // Any channel count: a gray image turns the same way.
        let g = Image {
            width: 3,
            height: 2,
            channels: 1,
            pixels: (0..6).collect(),
        };
        assert_eq!(g.oriented(6).pixels, [3, 0, 4, 1, 5, 2]);
    }

    #[test]
    fn rgb_of_gray_and_alpha() {
        let la = Image {
            width: 1,
            height: 1,
            channels: 2,
            pixels: vec![9, 200],
        };
        assert_eq!(la.rgb(0, 0), [9, 9, 9]);
        assert_eq!(la.to_rgb().pixels, [9, 9, 9]);
        let rgba = Image {
            width: 1,
            height: 1,
            channels: 4,
            pixels: vec![1, 2, 3, 4],
        };
        assert_eq!(rgba.to_rgb(), Image::rgb8(1, 1, vec![1, 2, 3]));
    }
}
