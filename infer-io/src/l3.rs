//! An L3 file read by region: its index (header and offset table) is read once; a window reads, with
//! positioned reads, only the bytes of the patches under it and decodes them. Nothing of the file is
//! mapped, so a 30,000² input's 1.9 GB never counts in the resident set: its pages stay in the page
//! cache, which the kernel gives back when memory is short.

use crate::error::{Error, Result};
use bsp_tiling::field::{Field, Input, span};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub struct L3Regions {
    index: l3_format::L3Index,
    file: File,
    path: PathBuf,
}

impl L3Regions {
    /// Reads the index of the L3 file at `path` and, for a version-2 file, checks its whole-file CRC-32C
    /// before any tile runs (streamed through one buffer): damage anywhere is found before hours of
    /// inference, not by the window that reads it. Its entry CRCs, where it has them, are checked again
    /// as each window decodes.
    pub fn open(path: &Path) -> Result<L3Regions> {
        let failed = |e: l3_format::ReadError| match e {
            l3_format::ReadError::Read { source, .. } => Error::Io {
                path: path.to_path_buf(),
                source,
            },
            l3_format::ReadError::Format(source) => Error::L3 {
                path: path.to_path_buf(),
                source,
            },
        };
        let file = stdx::fs::open_regular(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        let index = l3_format::L3Index::read_at(&file, len).map_err(failed)?;
        index.verify_crc_at(&file).map_err(failed)?;
        Ok(L3Regions {
            index,
            file,
            path: path.to_owned(),
        })
    }

    /// The window's pixels, 8-bit interleaved, rows `y0..y1` × columns `x0..x1`.
    fn pixels(&self, (y0, y1): (usize, usize), (x0, x1): (usize, usize)) -> Result<Vec<u8>> {
        let l3 = |source| Error::L3 {
            path: self.path.clone(),
            source,
        };
        let c = self.channels();
        let (w, h) = (x1 - x0, y1 - y0);
        let rect = vocab::Rect::new(x0 as u32, y0 as u32, w as u32, h as u32);
        let ranges = self.index.region_ranges(rect, 0).map_err(l3)?;
        let mut data = l3_format::Fragments::new();
        data.reset(&ranges);
        for (r, buf) in data.slices_mut() {
            self.file
                .read_exact_at(buf, r.start)
                .map_err(Error::io(&self.path))?;
        }
        let mut px = vec![0u8; w * h * c];
        self.index
            .decode_region(
                &data,
                rect,
                &mut px,
                l3_format::PixelLayout::packed(w as u32, h as u32, c as u8, false),
            )
            .map_err(l3)?;
        Ok(px)
    }
}

impl Field for L3Regions {
    fn channels(&self) -> usize {
        self.index.channels() as usize
    }

    fn gather(
        &self,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
        out: &mut [f32],
    ) -> bsp_tiling::Result<()> {
        out.fill(0.0);
        let (Some((y0, y1)), Some((x0, x1))) = (span(ys), span(xs)) else {
            return Ok(());
        };
        let px = self.pixels((y0, y1), (x0, x1))?;
        let (c, w) = (self.channels(), x1 - x0);
        let n = ys.len() * xs.len();
        for (iy, y) in ys.iter().enumerate() {
            let Some(y) = y else { continue };
            let row = &px[(y - y0) * w * c..(y - y0 + 1) * w * c];
            for (ix, x) in xs.iter().enumerate() {
                let Some(x) = x else { continue };
                for ch in 0..c {
                    out[ch * n + iy * xs.len() + ix] = f32::from(row[(x - x0) * c + ch]);
                }
            }
        }
        Ok(())
    }
}

impl Input for L3Regions {
    fn height(&self) -> usize {
        self.index.height() as usize
    }
    fn width(&self) -> usize {
        self.index.width() as usize
    }
}
