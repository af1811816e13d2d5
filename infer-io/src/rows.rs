//! [`Rows8`]: an 8-bit image output written row by row. Tiles of a band of rows are
//! collected until the band is complete and is the next one in the file, then its rows go to the encoder
//! ([`RowsOut`]: PNG, raw PPM/PGM, L3, JPEG). Memory: the bands in flight (tiles finish roughly in row order)
//! and the encoder's own state, not the image.

use crate::error::{Error, Result};
use bsp_tiling::Tensor;
use bsp_tiling::field::Sink;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where an 8-bit image's rows go, in order: interleaved `width × channels` bytes each.
pub(crate) trait RowsOut: Send {
    fn rows(&mut self, px: &[u8]) -> Result<()>;
    /// Completes the file once every row was given.
    fn finish(self) -> Result<()>;
}

fn encode(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> Error + '_ {
    move |e| Error::Encode {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// A PNG's encoding error: an I/O failure is the file's, anything else the encoder's.
fn png_error(path: &Path, e: png::EncodingError) -> Error {
    match e {
        png::EncodingError::IoError(source) => Error::Io {
            path: path.to_path_buf(),
            source,
        },
        e => encode(path)(&e),
    }
}

/// A PNG, rows compressed as they come.
pub(crate) struct Png(png::StreamWriter<'static, BufWriter<File>>, PathBuf);

impl Png {
    pub(crate) fn create(f: File, path: &Path, c: usize, h: usize, w: usize) -> Result<Png> {
        let mut enc = png::Encoder::new(BufWriter::new(f), w as u32, h as u32);
        enc.set_color(if c == 3 {
            png::ColorType::Rgb
        } else {
            png::ColorType::Grayscale
        });
        enc.set_depth(png::BitDepth::Eight);
        let writer = enc
            .write_header()
            .and_then(|w| w.into_stream_writer())
            .map_err(|e| png_error(path, e))?;
        Ok(Png(writer, path.to_path_buf()))
    }
}

impl RowsOut for Png {
    fn rows(&mut self, px: &[u8]) -> Result<()> {
        self.0.write_all(px).map_err(Error::io(&self.1))
    }
    fn finish(self) -> Result<()> {
        let path = self.1;
        self.0.finish().map_err(|e| png_error(&path, e))
    }
}

/// A raw PPM (3 channels) or PGM (1): the loader's header, then the rows as they are.
pub(crate) struct Raw(BufWriter<File>, PathBuf);

impl Raw {
    pub(crate) fn create(f: File, path: &Path, c: usize, h: usize, w: usize) -> Result<Raw> {
        let mut out = BufWriter::new(f);
        out.write_all(&loader::convert::raw_header(w as u32, h as u32, c as u8))
            .map_err(Error::io(path))?;
        Ok(Raw(out, path.to_path_buf()))
    }
}

impl RowsOut for Raw {
    fn rows(&mut self, px: &[u8]) -> Result<()> {
        self.0.write_all(px).map_err(Error::io(&self.1))
    }
    fn finish(mut self) -> Result<()> {
        self.0.flush().map_err(Error::io(&self.1))
    }
}

/// An L3 file in the toolkit's default format, through the streaming encoder (its spill file beside the
/// output); the file is written at the end.
pub(crate) struct L3 {
    writer: l3_format::L3Writer,
    file: File,
    path: PathBuf,
}

impl L3 {
    /// `threads` (0 = every core) encode each row of patches: the tile workers wait for it (the sink is
    /// one), and the bytes do not depend on it.
    pub(crate) fn create(
        file: File,
        path: &Path,
        (c, h, w): (usize, usize, usize),
        threads: usize,
    ) -> Result<L3> {
        let side = |n: usize, what: &str| {
            u32::try_from(n).map_err(|_| encode(path)(&format!("{n} pixels are too {what} for L3")))
        };
        let (w, h) = (side(w, "wide")?, side(h, "tall")?);
        let opts = l3_format::EncodeOptions {
            threads,
            ..l3_format::EncodeOptions::default()
        };
        let writer =
            l3_format::L3Writer::new(path, w, h, c as u8, &opts).map_err(|e| l3_error(path, e))?;
        Ok(L3 {
            writer,
            file,
            path: path.to_path_buf(),
        })
    }
}

/// An L3 encoder's error: an I/O failure (its spill file, the output) is the file's.
fn l3_error(path: &Path, e: l3_format::Error) -> Error {
    match e {
        l3_format::Error::File { source, .. } => l3_error(path, *source),
        l3_format::Error::Io {
            path,
            what,
            kind,
            message,
        } => Error::Io {
            path,
            source: std::io::Error::new(kind, format!("{what}: {message}")),
        },
        e => encode(path)(&e),
    }
}

impl RowsOut for L3 {
    fn rows(&mut self, px: &[u8]) -> Result<()> {
        self.writer
            .push_rows(px)
            .map_err(|e| l3_error(&self.path, e))
    }
    fn finish(self) -> Result<()> {
        let path = self.path;
        let mut out = self
            .writer
            .finish(BufWriter::new(self.file))
            .map_err(|e| l3_error(&path, e))?;
        out.flush().map_err(Error::io(&path))
    }
}

/// A JPEG at quality 95, its rows encoded on the encoder's own thread as they come
/// ([`loader::convert::JpegRows`]).
pub(crate) struct Jpeg(loader::convert::JpegRows<BufWriter<File>>, PathBuf);

impl Jpeg {
    pub(crate) fn create(f: File, path: &Path, c: usize, h: usize, w: usize) -> Result<Jpeg> {
        loader::convert::JpegRows::new(BufWriter::new(f), w, h, c, 95)
            .map(|rows| Jpeg(rows, path.to_path_buf()))
            .map_err(|e| encode(path)(&e))
    }
}

impl RowsOut for Jpeg {
    fn rows(&mut self, px: &[u8]) -> Result<()> {
        self.0.rows(px).map_err(|e| encode(&self.1)(&e))
    }
    fn finish(self) -> Result<()> {
        let path = self.1;
        let out = self.0.finish().map_err(|e| encode(&path)(&e))?;
        out.into_inner()
            .map_err(|e| Error::io(&path)(e.into_error()))?;
        Ok(())
    }
}

/// The [`Sink`] that gathers tiles into bands of rows, in file order, for a [`RowsOut`].
pub(crate) struct Rows8<O> {
    c: usize,
    h: usize,
    w: usize,
    path: PathBuf,
    state: Mutex<State<O>>,
}

struct State<O> {
    out: O,
    /// Band start row -> (band pixels, columns filled, rows).
    bands: BTreeMap<usize, (Vec<u8>, usize, usize)>,
    next_row: usize,
    /// The encoder's first error: the run stops on it and it is what the caller reports.
    failed: Option<Error>,
}

impl<O: RowsOut> Rows8<O> {
    pub(crate) fn new(out: O, path: &Path, c: usize, h: usize, w: usize) -> Rows8<O> {
        Rows8 {
            c,
            h,
            w,
            path: path.to_path_buf(),
            state: Mutex::new(State {
                out,
                bands: BTreeMap::new(),
                next_row: 0,
                failed: None,
            }),
        }
    }

    /// Runs `run` into this sink and completes the file: the encoder's own error first if it failed
    /// (the run only stopped because of it), else the run's.
    pub(crate) fn run(
        self,
        run: impl Fn(&dyn Sink) -> bsp_tiling::Result<bsp_tiling::RunInfo>,
    ) -> Result<bsp_tiling::RunInfo> {
        let result = run(&self);
        let st = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = st.failed {
            return Err(e);
        }
        let info = result?;
        if st.next_row != self.h {
            return Err(encode(&self.path)(&format!(
                "internal: {} of {} rows were written",
                st.next_row, self.h
            )));
        }
        st.out.finish()?;
        Ok(info)
    }
}

fn to_u8(v: f32) -> u8 {
    v.clamp(0.0, 255.0).round() as u8
}

impl<O: RowsOut> Sink for Rows8<O> {
    fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> bsp_tiling::Result<()> {
        let rows = t.h.min(self.h.saturating_sub(y0));
        let cols = t.w.min(self.w.saturating_sub(x0));
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *guard;
        let stopped =
            || bsp_tiling::Error::from(encode(&self.path)(&"the output's encoder failed"));
        if st.failed.is_some() {
            return Err(stopped());
        }
        let (c, w) = (self.c, self.w);
        let band = match st.bands.entry(y0) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let mut px = Vec::new();
                if px.try_reserve_exact(rows * w * c).is_err() {
                    return Err(encode(&self.path)(&format!(
                        "no memory for a band of {rows} rows of {w} × {c} bytes"
                    ))
                    .into());
                }
                px.resize(rows * w * c, 0);
                e.insert((px, 0, rows))
            }
        };
        for y in 0..rows {
            for x in 0..cols {
                for ch in 0..c {
                    band.0[(y * w + x0 + x) * c + ch] = to_u8(t.at(ch.min(t.c - 1), y, x));
                }
            }
        }
        band.1 += cols;
        // Write every complete band that is next in the file.
        loop {
            let next = st.next_row;
            match st.bands.get(&next) {
                Some((_, filled, _)) if *filled >= w => {}
                _ => break,
            }
            let (px, _, n) = st.bands.remove(&next).expect("present");
            if let Err(e) = st.out.rows(&px) {
                st.failed = Some(e);
                return Err(stopped());
            }
            st.next_row += n;
        }
        Ok(())
    }
}
