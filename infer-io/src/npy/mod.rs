//! NumPy `.npy` files of little-endian float32 in C order: inputs read by region ([`NpyRegions`]), the
//! raw network output (`C×H×W`) written tile by tile ([`NpyWriter`]: the header first, the data in any
//! order at its offsets, so an output is written without holding it), and test fixtures ([`read`],
//! [`write`]).

pub mod header;

use crate::error::{Error, Result};
use bsp_tiling::Tensor;
use bsp_tiling::field::{Field, Input, Sink, runs};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Npy {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads a float32 C-order `.npy` of rank 3 (`C×H×W`) or 4 with N = 1, whole.
pub fn read(path: &Path) -> Result<Tensor> {
    let f = NpyRegions::open(path)?;
    let ys: Vec<Option<usize>> = (0..f.h).map(Some).collect();
    let xs: Vec<Option<usize>> = (0..f.w).map(Some).collect();
    let mut data = vec![0f32; f.c * f.h * f.w];
    f.gather(&ys, &xs, &mut data)?;
    Ok(Tensor::from_vec(f.c, f.h, f.w, data)?)
}

/// A float32 C-order `.npy` (`C×H×W`, or `1×C×H×W`) read by region with positioned reads: a tiled run
/// holds only the windows it gathers, never the whole array (a 30,000² RGB input is 10 GiB of float32),
/// and its tiles read in parallel.
pub struct NpyRegions {
    path: std::path::PathBuf,
    file: File,
    c: usize,
    h: usize,
    w: usize,
    /// Where the values start.
    offset: u64,
}

impl NpyRegions {
    /// Opens `path` and checks its header and its length against the shape (an absurd shape is an error
    /// here, before anything is allocated).
    pub fn open(path: &Path) -> Result<NpyRegions> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = stdx::fs::open_regular(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let mut pre = [0u8; 12];
        let got = (len as usize).min(pre.len());
        f.read_exact(&mut pre[..got]).map_err(io)?;
        let (start, hlen) = header::preamble(&pre[..got]).map_err(|r| bad(path, r))?;
        if (start + hlen) as u64 > len {
            return Err(bad(
                path,
                format!("a header of {hlen} bytes in a file of {len}"),
            ));
        }
        let mut dict = vec![0u8; hlen];
        f.read_exact_at(&mut dict, start as u64).map_err(io)?;
        let head = header::parse(&dict, start).map_err(|r| bad(path, r))?;
        if head.descr != "<f4" || head.fortran_order {
            return Err(bad(
                path,
                format!(
                    "dtype {:?}{}: expected '<f4' in C order",
                    head.descr,
                    if head.fortran_order {
                        " in Fortran order"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let shape = head.shape;
        let (c, h, w) = match shape[..] {
            [c, h, w] | [1, c, h, w] => (c, h, w),
            _ => {
                return Err(bad(
                    path,
                    format!("shape {shape:?}: expected C×H×W or 1×C×H×W"),
                ));
            }
        };
        let offset = head.data_offset as u64;
        let len = len - offset;
        let want = (c as u64)
            .checked_mul(h as u64)
            .and_then(|n| n.checked_mul(w as u64))
            .and_then(|n| n.checked_mul(4));
        if want != Some(len) {
            return Err(bad(path, format!("{len} data bytes for shape {shape:?}")));
        }
        Ok(NpyRegions {
            path: path.to_path_buf(),
            file: f,
            c,
            h,
            w,
            offset,
        })
    }

    /// `(channels, height, width)`.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.c, self.h, self.w)
    }
}

impl Field for NpyRegions {
    fn channels(&self) -> usize {
        self.c
    }

    /// One positioned read per channel, row and run of consecutive columns, straight into `out` (one per
    /// band of consecutive rows where the window spans whole rows).
    fn gather(
        &self,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
        out: &mut [f32],
    ) -> bsp_tiling::Result<()> {
        let n = ys.len() * xs.len();
        let cols = runs(xs.iter().copied().enumerate());
        let whole_rows = matches!(cols[..], [(0, 0, len)] if len == self.w && len == xs.len());
        let covered = cols.iter().map(|r| r.2).sum::<usize>() == xs.len();
        let read = |dst: &mut [f32], at: usize| -> Result<()> {
            self.file
                .read_exact_at(bytemuck::cast_slice_mut(dst), self.offset + (at * 4) as u64)
                .map_err(Error::io(&self.path))?;
            if cfg!(target_endian = "big") {
                for v in dst.iter_mut() {
                    *v = f32::from_bits(u32::from_le(v.to_bits()));
                }
            }
            Ok(())
        };
        for c in 0..self.c {
            let o = &mut out[c * n..(c + 1) * n];
            let mut iy = 0;
            while iy < ys.len() {
                let Some(y) = ys[iy] else {
                    o[iy * xs.len()..(iy + 1) * xs.len()].fill(0.0);
                    iy += 1;
                    continue;
                };
                // A band of consecutive source rows, read at once when rows are whole.
                let mut band = 1;
                while whole_rows && iy + band < ys.len() && ys[iy + band] == Some(y + band) {
                    band += 1;
                }
                let rows = &mut o[iy * xs.len()..(iy + band) * xs.len()];
                if whole_rows {
                    read(rows, (c * self.h + y) * self.w)?;
                } else {
                    if !covered {
                        rows.fill(0.0);
                    }
                    for &(d, x, len) in &cols {
                        read(&mut rows[d..d + len], (c * self.h + y) * self.w + x)?;
                    }
                }
                iy += band;
            }
        }
        Ok(())
    }
}

impl Input for NpyRegions {
    fn height(&self) -> usize {
        self.h
    }
    fn width(&self) -> usize {
        self.w
    }
}

/// Writes a tensor as a `C×H×W` float32 `.npy`.
pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::create(path).map_err(io)?;
    f.write_all(&header::write(&[t.c, t.h, t.w])).map_err(io)?;
    f.write_all(bytemuck::cast_slice(&t.data)).map_err(io)?;
    Ok(())
}

/// A `C×H×W` float32 `.npy` written region by region (positioned writes: regions in any order, from any
/// thread).
///
/// A tile's rows are short runs in the file, one write each; a band of tiles side by side spans whole
/// rows, one write per channel. So tiles are assembled into their band when the band is small
/// ([`BAND_BYTES`]) and written when its every column is there; larger bands are written row by row as
/// their tiles come, without holding them.
pub struct NpyWriter {
    path: std::path::PathBuf,
    file: File,
    shape: (usize, usize, usize),
    offset: u64,
    /// Bands being assembled, by `(first row, rows)`.
    bands: std::sync::Mutex<Vec<Band>>,
    band_bytes: usize,
}

/// Bytes of one band assembled at most.
pub const BAND_BYTES: usize = 16 << 20;

struct Band {
    y0: usize,
    rows: usize,
    /// `C × rows × W`.
    data: Vec<f32>,
    /// Columns written so far.
    have: Vec<bool>,
    left: usize,
}

impl NpyWriter {
    /// Creates `path` with its header, sized for the whole array (a sparse file until written).
    pub fn create(path: &Path, c: usize, h: usize, w: usize) -> std::io::Result<NpyWriter> {
        NpyWriter::from_file(File::create(path)?, path, c, h, w)
    }

    /// Assembles bands of at most `bytes` (instead of [`BAND_BYTES`]): what a run under a small memory
    /// budget can hold for its writer.
    pub fn with_band_bytes(mut self, bytes: usize) -> NpyWriter {
        self.band_bytes = bytes;
        self
    }

    /// As [`create`](Self::create), into `file` (empty, opened for writing; `path` names it in errors):
    /// e.g. the temporary of a `stdx::fs::AtomicFile`.
    pub fn from_file(
        mut file: File,
        path: &Path,
        c: usize,
        h: usize,
        w: usize,
    ) -> std::io::Result<NpyWriter> {
        let head = header::write(&[c, h, w]);
        file.write_all(&head)?;
        file.set_len(head.len() as u64 + (c * h * w * 4) as u64)?;
        Ok(NpyWriter {
            path: path.to_path_buf(),
            file,
            shape: (c, h, w),
            offset: head.len() as u64,
            bands: std::sync::Mutex::new(Vec::new()),
            band_bytes: BAND_BYTES,
        })
    }

    /// Writes `t` with its top-left corner at `(y0, x0)`, clipped to the array.
    pub fn put(&self, y0: usize, x0: usize, t: &Tensor) -> std::io::Result<()> {
        let (c, h, w) = self.shape;
        let rows = t.h.min(h.saturating_sub(y0));
        let cols = t.w.min(w.saturating_sub(x0));
        let c = c.min(t.c);
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        if cols == w || self.shape.0 * rows * w * 4 > self.band_bytes {
            // Whole rows already, or a band too large to hold.
            for ch in 0..c {
                if cols == w && t.w == w {
                    let src = &t.data[ch * t.h * t.w..][..rows * w];
                    self.write_at(src, (ch * h + y0) * w)?;
                    continue;
                }
                for y in 0..rows {
                    let src = &t.data[(ch * t.h + y) * t.w..][..cols];
                    self.write_at(src, (ch * h + y0 + y) * w + x0)?;
                }
            }
            return Ok(());
        }
        let done = {
            let mut bands = self.bands.lock().unwrap_or_else(|p| p.into_inner());
            let i = match bands.iter().position(|b| b.y0 == y0 && b.rows == rows) {
                Some(i) => i,
                None => {
                    bands.push(Band {
                        y0,
                        rows,
                        data: vec![0.0; self.shape.0 * rows * w],
                        have: vec![false; w],
                        left: w,
                    });
                    bands.len() - 1
                }
            };
            let b = &mut bands[i];
            for ch in 0..c {
                for y in 0..rows {
                    let src = &t.data[(ch * t.h + y) * t.w..][..cols];
                    b.data[(ch * rows + y) * w + x0..][..cols].copy_from_slice(src);
                }
            }
            for seen in &mut b.have[x0..x0 + cols] {
                if !*seen {
                    *seen = true;
                    b.left -= 1;
                }
            }
            (b.left == 0).then(|| bands.swap_remove(i))
        };
        match done {
            Some(b) => self.write_band(&b),
            None => Ok(()),
        }
    }

    fn write_at(&self, src: &[f32], at: usize) -> std::io::Result<()> {
        self.file
            .write_all_at(bytemuck::cast_slice(src), self.offset + (at * 4) as u64)
    }

    fn write_band(&self, b: &Band) -> std::io::Result<()> {
        let (c, h, w) = self.shape;
        for ch in 0..c {
            self.write_at(
                &b.data[ch * b.rows * w..][..b.rows * w],
                (ch * h + b.y0) * w,
            )?;
        }
        Ok(())
    }

    /// Writes what is still assembled (bands some of whose columns never came hold zeros there, as the
    /// file does) and makes the file durable.
    pub fn finish(self) -> std::io::Result<()> {
        let bands = std::mem::take(&mut *self.bands.lock().unwrap_or_else(|p| p.into_inner()));
        for b in &bands {
            self.write_band(b)?;
        }
        self.file.sync_all()
    }
}

impl Sink for NpyWriter {
    fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> bsp_tiling::Result<()> {
        Ok(self.put(y0, x0, t).map_err(Error::io(&self.path))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy_bytes(shape: &str, values: usize) -> Vec<u8> {
        npy_header(
            &format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({shape}), }}"),
            values,
        )
    }

    fn npy_header(dict: &str, values: usize) -> Vec<u8> {
        let mut dict = dict.to_string();
        while !(10 + dict.len() + 1).is_multiple_of(64) {
            dict.push(' ');
        }
        dict.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((dict.len() as u16).to_le_bytes());
        b.extend(dict.as_bytes());
        b.extend((0..values).flat_map(|i| (i as f32 * 0.5).to_le_bytes()));
        b
    }

    /// Tiles in any order, from two threads, clipped at the edges, assembled into bands or written row by
    /// row, give the array; so do windows read back by region.
    #[test]
    fn tiles_written_in_any_order_read_back_as_the_array() {
        let dir = tempfile::tempdir().unwrap();
        let (c, h, w) = (3, 37, 53);
        let t = Tensor::from_vec(
            c,
            h,
            w,
            (0..c * h * w).map(|i| i as f32 * 0.25 - 9.0).collect(),
        )
        .unwrap();
        for (name, band_bytes, th, tw) in [
            ("bands.npy", BAND_BYTES, 10, 12),
            ("rows.npy", 0, 10, 12),
            ("whole_rows.npy", BAND_BYTES, 7, 60),
        ] {
            let p = dir.path().join(name);
            let mut wr = NpyWriter::create(&p, c, h, w).unwrap();
            wr.band_bytes = band_bytes;
            let mut tiles = vec![];
            for y0 in (0..h).step_by(th) {
                for x0 in (0..w).step_by(tw) {
                    // Tiles reach past the array's edges, as a network's padded output does.
                    let mut tile = Tensor::zeros(c, th, tw).unwrap();
                    for ch in 0..c {
                        for y in 0..th {
                            for x in 0..tw {
                                if y0 + y < h && x0 + x < w {
                                    tile.data[(ch * th + y) * tw + x] = t.at(ch, y0 + y, x0 + x);
                                }
                            }
                        }
                    }
                    tiles.push((y0, x0, tile));
                }
            }
            // A fixed shuffle: every other tile reversed, split between two threads.
            tiles.reverse();
            let (a, b): (Vec<_>, Vec<_>) = tiles.iter().enumerate().partition(|(i, _)| i % 2 == 0);
            std::thread::scope(|s| {
                for half in [a, b] {
                    let wr = &wr;
                    s.spawn(move || {
                        for (_, (y0, x0, tile)) in half {
                            wr.put(*y0, *x0, tile).unwrap();
                        }
                    });
                }
            });
            wr.finish().unwrap();
            assert_eq!(read(&p).unwrap().data, t.data, "{name}");
            let f = NpyRegions::open(&p).unwrap();
            let ys = [Some(3), None, Some(4), Some(36)];
            let xs = [None, Some(0), Some(1), Some(2), Some(52), Some(10)];
            let mut got = vec![f32::NAN; c * ys.len() * xs.len()];
            f.gather(&ys, &xs, &mut got).unwrap();
            let mut want = vec![];
            for ch in 0..c {
                for y in ys {
                    for x in xs {
                        want.push(match (y, x) {
                            (Some(y), Some(x)) => t.at(ch, y, x),
                            _ => 0.0,
                        });
                    }
                }
            }
            assert_eq!(got, want, "{name}: a window");
        }
    }

    #[test]
    fn reads_what_it_writes_and_names_the_file_of_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        // More than one read chunk.
        let t =
            Tensor::from_vec(3, 300, 500, (0..450_000).map(|i| i as f32 - 7.25).collect()).unwrap();
        write(&p, &t).unwrap();
        let back = read(&p).unwrap();
        assert_eq!((back.c, back.h, back.w), (3, 300, 500));
        assert_eq!(back.data, t.data);

        for (name, bytes, says) in [
            ("short.npy", npy_bytes("2, 3, 4", 23), "92 data bytes"),
            ("long.npy", npy_bytes("2, 3, 4", 25), "100 data bytes"),
            // 4·10¹⁵ bytes: refused before anything is allocated.
            (
                "absurd.npy",
                npy_bytes("100000, 100000, 100000", 4),
                "16 data bytes",
            ),
            ("magic.npy", b"NUMPY\x93\x01\x00".to_vec(), "magic"),
            // What numpy refuses: a header without its closing brace, a key it does not know.
            (
                "brace.npy",
                npy_header(
                    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), ",
                    24,
                ),
                "ends",
            ),
            (
                "extra.npy",
                npy_header(
                    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), 'x': 0}",
                    24,
                ),
                "expected descr, fortran_order and shape only",
            ),
            (
                "fortran.npy",
                npy_header(
                    "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 4)}",
                    24,
                ),
                "Fortran order",
            ),
            // Version 2: a 4-byte header length, here 4 GiB.
            (
                "huge_header.npy",
                b"\x93NUMPY\x02\x00\xff\xff\xff\xff".to_vec(),
                "a header of 4294967295 bytes",
            ),
            (
                "cut.npy",
                npy_bytes("2, 3, 4", 24)[..30].to_vec(),
                "a header of 118 bytes in a file of 30",
            ),
        ] {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            let e = read(&p).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(says), "{name}: {e}");
        }
    }
}
