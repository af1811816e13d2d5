//! An output file written from a run's tiles, its type by extension: `.npy` (float32 `C×H×W`, the raw
//! network output, tile by tile at its offsets), `.tif`/`.tiff` (a tiled BigTIFF, tiles written as they
//! complete: 8-bit after `out_scale` and clamping, or the raw float32 output), or 8-bit images whose rows
//! are streamed as soon as a band of tiles is complete: `.png`, `.ppm`/`.pgm` (raw, header first), `.l3`
//! (the default format through [`l3_format::L3Writer`], whose spill file beside the output holds what
//! the format writes last — memory stays bounded by a band, never the image), `.jpg` (quality 95,
//! encoded on its own thread as rows come).
//!
//! Every output is written under a temporary name and renamed when complete ([`stdx::fs::AtomicFile`]):
//! a failed run leaves nothing behind, and the temporaries a killed run left are removed by the next
//! writer of the same output.

use crate::error::{Error, Result};
use crate::input::ext;
use crate::npy::NpyWriter;
use crate::rows::{self, Rows8};
use crate::tiff::{OutDType, TiffWriter};
use bsp_tiling::RunInfo;
use bsp_tiling::field::{ScaledSink, Sink};
use std::fs::File;
use std::path::Path;

/// An output file (see the module documentation): its size (larger tiles are clipped to it), its sample
/// type where the format offers a choice, the factor applied before 8-bit clamping, and the threads an
/// L3 encoder may use.
pub struct OutputFile<'a> {
    pub path: &'a Path,
    pub shape: (usize, usize, usize),
    pub dtype: Option<OutDType>,
    pub out_scale: f32,
    pub threads: usize,
    /// Bytes of one band of tiles a `.npy` output assembles before writing it at most.
    pub band_bytes: usize,
}

/// Rows an 8-bit image's encoder holds beyond the bands it is given: L3's row of patches (at most 256
/// rows), PNG's and JPEG's few rows of state.
const ENCODER_ROWS: u64 = 256;

/// The output sample types each format can hold; the first is its default.
fn output_dtypes(out_ext: &str) -> Option<&'static [OutDType]> {
    Some(match out_ext {
        "npy" => &[OutDType::F32],
        "tif" | "tiff" => &[OutDType::U8, OutDType::F32],
        "png" | "l3" | "ppm" | "pgm" | "jpg" | "jpeg" => &[OutDType::U8],
        _ => return None,
    })
}

/// Refuses an output path whose type is unknown, or that cannot hold `dtype`, before anything runs.
pub fn check_output(path: &Path, dtype: Option<OutDType>) -> Result<OutDType> {
    let out_ext = ext(path);
    let Some(dtypes) = output_dtypes(&out_ext) else {
        return Err(Error::refused(
            path.display().to_string(),
            format!(
                "unknown output type {out_ext:?}: use .npy (float32 C×H×W), .tif/.tiff (tiled BigTIFF, uint8 or float32), .png, .l3, .ppm/.pgm or .jpg"
            ),
        ));
    };
    let dtype = dtype.unwrap_or(dtypes[0]);
    if !dtypes.contains(&dtype) {
        return Err(Error::refused(
            path.display().to_string(),
            format!(
                "a .{out_ext} output holds {}, not {}",
                dtypes[0].name(),
                dtype.name()
            ),
        ));
    }
    Ok(dtype)
}

fn check_8bit_channels(c: usize) -> Result<()> {
    if c != 1 && c != 3 {
        return Err(Error::refused(
            "output",
            format!(
                "the network's output has {c} channels: an 8-bit image holds 1 or 3; write .npy for the raw output"
            ),
        ));
    }
    Ok(())
}

impl OutputFile<'_> {
    /// Bytes this file's writer holds at once when the run's tiles are at most `tile` pixels tall: a
    /// `.npy` two bands of [`band_bytes`](Self::band_bytes); a TIFF the tiles of its own grid that two
    /// bands of run tiles leave partly filled; an 8-bit image two bands of rows (tiles finish roughly in
    /// row order) and the encoder's row of patches or strips. What the run itself may then use is the
    /// RAM budget less this.
    pub fn held_bytes(&self, tile: usize) -> u64 {
        let (c, h, w) = self.shape;
        let (c, h, w, tile) = (c as u64, h as u64, w as u64, tile.max(1) as u64);
        let rows = |r: u64| r.min(h);
        match ext(self.path).as_str() {
            "npy" => 2 * self.band_bytes as u64,
            "tif" | "tiff" => {
                let t = crate::tiff::TILE as u64;
                let bps = self.dtype.unwrap_or(OutDType::U8).bytes() as u64;
                rows(2 * tile + t).div_ceil(t) * t * w.div_ceil(t) * t * c * bps
            }
            _ => rows(2 * tile + ENCODER_ROWS) * w * c,
        }
    }

    /// Refuses a run whose writer alone would hold more than `ram` bytes (see
    /// [`held_bytes`](Self::held_bytes)), naming the figures and what to change; else the bytes to reserve.
    pub fn reserve(&self, tile: usize, ram: u64) -> Result<u64> {
        let held = self.held_bytes(tile);
        if held >= ram {
            let (c, _, w) = self.shape;
            return Err(Error::refused(
                self.path.display().to_string(),
                format!(
                    "its writer would hold {} at once (bands of {tile} rows of {w} × {c} values), as \
                     much as the RAM budget ({}) or more: use a smaller --tile or a larger \
                     --ram-budget-mib",
                    stdx::mem::human(held),
                    stdx::mem::human(ram)
                ),
            ));
        }
        Ok(held)
    }

    /// Runs `run` into a sink writing this file under a temporary name, renamed once complete.
    pub fn write(&self, run: impl Fn(&dyn Sink) -> bsp_tiling::Result<RunInfo>) -> Result<RunInfo> {
        let path = self.path;
        let dtype = check_output(path, self.dtype)?;
        let out_ext = ext(path);
        // 8-bit outputs get `out_scale` before clamping; float32 ones the raw output.
        let run_scaled = |sink: &dyn Sink| {
            run(&ScaledSink {
                inner: sink,
                scale: self.out_scale,
            })
        };
        // A failed run leaves nothing behind: the temporary goes with the `AtomicFile`. A killed run's
        // cannot go with it, so a new writer of the same output removes those of writers no longer running.
        stdx::fs::remove_stale_temps_of(path).map_err(Error::io(path))?;
        let mut out = stdx::fs::AtomicFile::create(path).map_err(Error::io(path))?;
        let file = out.file().try_clone().map_err(Error::io(path))?;
        let info = self.write_to(&out_ext, file, dtype, &run, run_scaled)?;
        out.commit().map_err(Error::io(path))?;
        Ok(info)
    }

    /// Runs the network into `file` (the temporary of the output) of type `out_ext`.
    fn write_to(
        &self,
        out_ext: &str,
        file: File,
        dtype: OutDType,
        run: impl Fn(&dyn Sink) -> bsp_tiling::Result<RunInfo>,
        run_scaled: impl Fn(&dyn Sink) -> bsp_tiling::Result<RunInfo>,
    ) -> Result<RunInfo> {
        let path = self.path;
        let (c, oh, ow) = self.shape;
        Ok(match out_ext {
            "npy" => {
                let wr = NpyWriter::from_file(file, path, c, oh, ow)
                    .map_err(Error::io(path))?
                    .with_band_bytes(self.band_bytes);
                let info = run(&wr)?;
                wr.finish().map_err(Error::io(path))?;
                info
            }
            "tif" | "tiff" => {
                let wr = TiffWriter::new(file, path, c, oh, ow, dtype)?;
                let info = match dtype {
                    OutDType::U8 => run_scaled(&wr)?,
                    OutDType::F32 => run(&wr)?,
                };
                wr.finish()?;
                info
            }
            "png" => {
                check_8bit_channels(c)?;
                let out = rows::Png::create(file, path, c, oh, ow)?;
                Rows8::new(out, path, c, oh, ow).run(run_scaled)?
            }
            "ppm" | "pgm" => {
                check_8bit_channels(c)?;
                let out = rows::Raw::create(file, path, c, oh, ow)?;
                Rows8::new(out, path, c, oh, ow).run(run_scaled)?
            }
            "l3" => {
                check_8bit_channels(c)?;
                let out = rows::L3::create(file, path, (c, oh, ow), self.threads)?;
                Rows8::new(out, path, c, oh, ow).run(run_scaled)?
            }
            _ => {
                check_8bit_channels(c)?;
                let out = rows::Jpeg::create(file, path, c, oh, ow)?;
                Rows8::new(out, path, c, oh, ow).run(run_scaled)?
            }
        })
    }
}
