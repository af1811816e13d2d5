//! An inference input opened by its extension: `.l3` and `.tif`/`.tiff` read by region, `.npy` (float32)
//! read by region and taken as it is, any other image the loader reads decoded whole — with a note
//! saying so, since such a file cannot be read by region.
//!
//! An [`InputFile`] is the network's input as the engine reads it: values scaled (8-bit and 16-bit
//! samples times `in_scale`; floats as they are) and channels fitted to the network's as 8-bit images
//! are (gray, with or without alpha, replicated to RGB for a 3-channel network; alpha dropped from RGBA;
//! any other mismatch refused).

use crate::error::{Error, Result};
use crate::l3::L3Regions;
use crate::npy::NpyRegions;
use crate::tiff::{SampleType, TiffRegions};
use bsp_tiling::Tensor;
use bsp_tiling::field::{Field, Input};
use std::path::Path;

/// How an input file is read.
#[derive(Clone, Debug)]
pub struct InputOptions {
    /// The network's input channels.
    pub channels: usize,
    /// Factor applied to integer samples (8-bit images: 0..255; 16-bit TIFF: 0..65535); `.npy` and
    /// float TIFF samples are taken as they are.
    pub in_scale: f32,
    /// The page of a TIFF input (`None`: page 0) and the level of that page (`None`: 0, the page
    /// itself). Asked of any other input, they are refused.
    pub page: Option<usize>,
    pub level: Option<usize>,
    /// Bytes of decoded TIFF chunks kept between windows.
    pub tiff_cache_bytes: usize,
}

/// An input held in memory: a float tensor (taken as is) or an 8-bit image (0..255 times `in_scale`).
pub enum InputData {
    Tensor(Tensor),
    Image(bsp_tiling::Image),
}

impl InputData {
    pub(crate) fn field(&self) -> &dyn Input {
        match self {
            InputData::Tensor(t) => t,
            InputData::Image(i) => i,
        }
    }

    /// The factor its values get: `in_scale` for 8-bit images, none for float tensors.
    pub(crate) fn scale(&self, in_scale: f32) -> f32 {
        match self {
            InputData::Tensor(_) => 1.0,
            InputData::Image(_) => in_scale,
        }
    }
}

enum Source {
    L3(L3Regions),
    Tiff(TiffRegions),
    Npy(NpyRegions),
    Whole(InputData),
}

impl Source {
    fn field(&self) -> &dyn Input {
        match self {
            Source::L3(f) => f,
            Source::Tiff(f) => f,
            Source::Npy(f) => f,
            Source::Whole(d) => d.field(),
        }
    }
}

/// An input file opened for a network (see the module documentation).
pub struct InputFile {
    source: Source,
    scale: f32,
    /// Source channel of each network channel; `None`: taken as they are.
    map: Option<[usize; 3]>,
    notes: Vec<String>,
}

pub(crate) fn ext(p: &Path) -> String {
    p.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// Refuses `page` or `level` for an input that is not a TIFF: only TIFF inputs have pages and levels.
pub fn check_page(path: &Path, page: Option<usize>, level: Option<usize>) -> Result<()> {
    let asked = match (page, level) {
        (None, None) => return Ok(()),
        (Some(p), None) => format!("page {p}"),
        (None, Some(l)) => format!("level {l}"),
        (Some(p), Some(l)) => format!("page {p} level {l}"),
    };
    if matches!(ext(path).as_str(), "tif" | "tiff") {
        return Ok(());
    }
    Err(Error::refused(
        path.display().to_string(),
        format!("{asked} asked for, but only TIFF inputs (.tif, .tiff) have pages and levels"),
    ))
}

/// Reads an image file whole through the loader, as 8-bit (gray widened to RGB for a 3-channel network).
pub fn read_image(path: &Path, channels: usize) -> Result<bsp_tiling::Image> {
    let img =
        loader::import(path, &loader::ImportOptions::default()).map_err(|source| Error::Image {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(match (channels, img.channels) {
        (3, c) if c != 3 => img.to_rgb(),
        _ => img,
    })
}

impl InputFile {
    /// Opens `path` for a network taking `opts.channels` channels.
    pub fn open(path: &Path, opts: &InputOptions) -> Result<InputFile> {
        check_page(path, opts.page, opts.level)?;
        let mut notes = Vec::new();
        let (source, scale) = match ext(path).as_str() {
            "l3" => (Source::L3(L3Regions::open(path)?), opts.in_scale),
            "tif" | "tiff" => {
                let tiff = TiffRegions::open_level(
                    path,
                    opts.page.unwrap_or(0),
                    opts.level.unwrap_or(0),
                    opts.tiff_cache_bytes,
                )?;
                notes.extend(tiff.note().map(str::to_owned));
                let scale = match tiff.sample_type() {
                    SampleType::F32 => 1.0,
                    _ => opts.in_scale,
                };
                (Source::Tiff(tiff), scale)
            }
            "npy" => (Source::Npy(NpyRegions::open(path)?), 1.0),
            e => {
                let img = read_image(path, opts.channels)?;
                notes.push(format!(
                    "{}: decoded whole ({} files cannot be read by region: L3 and TIFF can)",
                    path.display(),
                    if e.is_empty() { "such" } else { e }
                ));
                (Source::Whole(InputData::Image(img)), opts.in_scale)
            }
        };
        let have = source.field().channels();
        let map = match (&source, opts.channels, have) {
            (Source::Npy(_), _, _) => None,
            (_, a, b) if a == b => None,
            (_, 3, 1 | 2) => Some([0, 0, 0]),
            (_, 3, 4) => Some([0, 1, 2]),
            (_, a, b) => {
                return Err(Error::refused(
                    path.display().to_string(),
                    format!("{b} channels, the model takes {a}"),
                ));
            }
        };
        Ok(InputFile {
            source,
            scale,
            map,
            notes,
        })
    }

    /// What the user should know about how the file is read (decoded whole, a strip read whole).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The sample type of a TIFF input (`None` for other files).
    pub fn tiff_sample_type(&self) -> Option<SampleType> {
        match &self.source {
            Source::Tiff(t) => Some(t.sample_type()),
            _ => None,
        }
    }
}

impl Field for InputFile {
    fn channels(&self) -> usize {
        if self.map.is_some() {
            3
        } else {
            self.source.field().channels()
        }
    }

    fn gather(
        &self,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
        out: &mut [f32],
    ) -> bsp_tiling::Result<()> {
        let inner = self.source.field();
        match self.map {
            None => inner.gather(ys, xs, out)?,
            Some(map) => {
                let n = ys.len() * xs.len();
                let mut src = vec![0f32; inner.channels() * n];
                inner.gather(ys, xs, &mut src)?;
                for (c, &s) in map.iter().enumerate() {
                    out[c * n..(c + 1) * n].copy_from_slice(&src[s * n..(s + 1) * n]);
                }
            }
        }
        if self.scale != 1.0 {
            out.iter_mut().for_each(|v| *v *= self.scale);
        }
        Ok(())
    }
}

impl Input for InputFile {
    fn height(&self) -> usize {
        self.source.field().height()
    }
    fn width(&self) -> usize {
        self.source.field().width()
    }
}
