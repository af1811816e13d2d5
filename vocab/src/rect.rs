//! Rectangles of pixels and the window of an image that fills a sample.

/// A rectangle of pixels, `(x, y)` its top-left corner: a patch's place in an image (edge patches are
/// partial), a crop, or a region to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

impl Rect {
    pub const fn new(x: u32, y: u32, w: u32, h: u32) -> Rect {
        Rect { x, y, w, h }
    }

    /// Whether the rectangle is non-empty and lies inside a `width`×`height` image.
    pub fn fits(&self, width: u32, height: u32) -> bool {
        self.w > 0
            && self.h > 0
            && u64::from(self.x) + u64::from(self.w) <= u64::from(width)
            && u64::from(self.y) + u64::from(self.h) <= u64::from(height)
    }

    /// The patches of an N×N grid (`patches_x` patches per row, raster order) whose rectangles meet this
    /// non-empty one, one row of the grid at a time: `(first patch of the row, patches in the row)`.
    pub fn patch_rows(
        &self,
        patch_size: u32,
        patches_x: u32,
    ) -> impl Iterator<Item = (usize, usize)> + use<> {
        let n = patch_size;
        let (gx0, gx1) = (self.x / n, (self.x + self.w - 1) / n);
        let (gy0, gy1) = (self.y / n, (self.y + self.h - 1) / n);
        let px = patches_x as usize;
        (gy0..=gy1).map(move |gy| (gy as usize * px + gx0 as usize, (gx1 - gx0 + 1) as usize))
    }
}

impl std::fmt::Display for Rect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{} at ({}, {})", self.w, self.h, self.x, self.y)
    }
}

/// Where one image's window lands in its sample. Source column `src.x + col` of row `src.y + row` goes to
/// sample column `dx + col` (mirrored: `dx + src.w - 1 - col`) of row `dy + row`; the rest of the sample
/// is padding. The CPU loader and the GPU kernel both follow exactly this rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// The rectangle of the image that is copied: not empty, inside the image.
    pub src: Rect,
    /// Where `src`'s top-left corner lands in the sample: `dx + src.w <= width`, `dy + src.h <= height`.
    pub dx: u32,
    pub dy: u32,
    /// Mirror horizontally within the window.
    pub flip: bool,
}

impl Window {
    pub fn new(src: Rect, dx: u32, dy: u32, flip: bool) -> Window {
        Window { src, dx, dy, flip }
    }

    /// All of a `width`×`height` image at the sample's top-left corner, not mirrored.
    pub fn whole(width: u32, height: u32) -> Window {
        Window::new(Rect::new(0, 0, width, height), 0, 0, false)
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} to ({}, {})", self.src, self.dx, self.dy)?;
        if self.flip {
            write!(f, " mirrored")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_and_patch_rows() {
        assert!(Rect::new(0, 0, 4, 4).fits(4, 4));
        assert!(!Rect::new(1, 0, 4, 4).fits(4, 4));
        assert!(!Rect::new(0, 0, 0, 4).fits(4, 4));
        assert!(!Rect::new(u32::MAX, 0, 2, 1).fits(u32::MAX, 1));
        // A 10x10 region at (30, 60) of a grid of 32-pixel patches, 5 per row: columns 0..=1, rows 1..=2.
        let rows: Vec<_> = Rect::new(30, 60, 10, 10).patch_rows(32, 5).collect();
        assert_eq!(rows, [(5, 2), (10, 2)]);
        assert_eq!(Rect::new(3, 4, 5, 6).to_string(), "5x6 at (3, 4)");
        let w = Window::new(Rect::new(1, 2, 3, 4), 5, 6, true);
        assert_eq!(w.to_string(), "3x4 at (1, 2) to (5, 6) mirrored");
        assert_eq!(Window::whole(7, 3).src, Rect::new(0, 0, 7, 3));
    }
}
