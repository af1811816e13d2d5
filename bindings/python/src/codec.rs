//! The L3 codec on NumPy arrays: `encode`, `decode`, `decode_region`, `info`, and `read_image` (any
//! image file through the toolkit's one import path).

use crate::errors::{Failure, Kind, detached, raise};
use l3_format::{EncodeOptions, Format, L3File, PixelLayout, Profile, Rect};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use std::path::PathBuf;

/// L3 data given as bytes (read in place), any other bytes-like object (copied into bytes) or a path
/// (read with the GIL released).
pub(crate) enum Data<'py> {
    Bytes(Bound<'py, PyBytes>),
    Path(PathBuf),
}

impl<'py> Data<'py> {
    fn extract(obj: &Bound<'py, PyAny>) -> PyResult<Data<'py>> {
        Data::extract_named(obj, "")
    }

    /// [`Data::extract`] with `what` (e.g. `"buffers[3]: "`) before the message of an unusable object.
    pub(crate) fn extract_named(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Data<'py>> {
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Data::Bytes(b.clone()));
        }
        if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
            return Ok(Data::Path(obj.extract()?));
        }
        // bytearray, memoryview, a NumPy uint8 array, ...: anything with the buffer protocol (copied).
        let py = obj.py();
        let view = py
            .get_type::<pyo3::types::PyMemoryView>()
            .call1((obj,))
            .map_err(|_| {
                raise(
                    py,
                    Kind::Options,
                    format!(
                        "{what}expected L3 data as bytes, a bytes-like object or a path, not {}",
                        obj.get_type().name().map_or("?".into(), |n| n.to_string())
                    ),
                )
            })?;
        Ok(Data::Bytes(
            py.get_type::<PyBytes>().call1((view,))?.cast_into()?,
        ))
    }

    /// Runs `f` on the bytes and a name for messages, with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&[u8], &str) -> Result<T, Failure> + Send,
    ) -> PyResult<T> {
        match self {
            Data::Bytes(b) => {
                let bytes = b.as_bytes();
                detached(py, || f(bytes, "L3 data"))
            }
            Data::Path(p) => detached(py, || {
                let bytes = stdx::fs::read_regular(p, loader::max_image_bytes())
                    .map_err(|e| Failure::io(p, &e))?;
                f(&bytes, &p.display().to_string())
            }),
        }
    }
}

/// `threads` keyword: `None` = every core.
fn threads(t: Option<usize>) -> usize {
    stdx::parallel::threads(t.unwrap_or(0))
}

/// A `(h, w)` array for one channel, `(h, w, c)` otherwise, owning `pixels` without a copy.
fn image_array(
    py: Python<'_>,
    pixels: Vec<u8>,
    h: u32,
    w: u32,
    c: u8,
) -> PyResult<Bound<'_, PyArrayDyn<u8>>> {
    let flat = PyArray1::from_vec(py, pixels);
    let (h, w, c) = (h as usize, w as usize, c as usize);
    if c == 1 {
        flat.reshape(vec![h, w])
    } else {
        flat.reshape(vec![h, w, c])
    }
}

/// The L3 format a `format=` / `profile=` pair of keywords names (see [`Format::resolve`]).
pub(crate) fn l3_format(
    py: Python<'_>,
    format: Option<&Bound<'_, PyAny>>,
    profile: Option<&str>,
) -> PyResult<Format> {
    let options = |msg: String| raise(py, Kind::Options, msg);
    let version = match format {
        None => None,
        Some(f) if f.is_none() => None,
        Some(f) => {
            let v = if let Ok(v) = f.extract::<i64>() {
                Some(v)
            } else if let Ok(s) = f.extract::<String>() {
                let s = s.to_ascii_lowercase();
                match s.strip_prefix('v').unwrap_or(&s) {
                    "1" => Some(1),
                    "2" => Some(2),
                    _ => None,
                }
            } else {
                None
            };
            match v {
                Some(v @ (1 | 2)) => Some(v as u16),
                _ => {
                    return Err(options(format!(
                        "format={f}: expected \"v1\" or \"v2\" (or 1 or 2)"
                    )));
                }
            }
        }
    };
    let profile = profile
        .map(|p| p.parse::<Profile>())
        .transpose()
        .map_err(|e| options(format!("profile: {e}")))?;
    Format::resolve(version, profile).map_err(|reason| options(format!("format/profile: {reason}")))
}

/// Encodes an image into the bytes of an L3 file (lossless).
///
/// ``array``: a ``uint8`` NumPy array of shape ``(H, W)`` (gray) or ``(H, W, C)`` with C = 1, 3 (RGB)
/// or 4 (RGBA). ``patch``: the patch side N (version 1: 1 to 255, default 32 below 1080×720 pixels, 64
/// above; version 2: a multiple of 32, default 128). ``format``: ``"v1"`` or ``"v2"`` (default: version 2
/// with profile ``"ans"``, the toolkit's default format, checksummed); ``profile``: version 2's coding,
/// ``"ans"`` (smallest files, and a region read checks every patch it decodes; the default) or ``"bp"``
/// (bit-packed, faster); a profile alone means version 2.
/// ``threads``: encoder threads (default: every core). The output is the same for any thread count.
#[pyfunction]
#[pyo3(signature = (array, patch=None, *, format=None, profile=None, threads=None))]
pub fn encode<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
    patch: Option<i64>,
    format: Option<&Bound<'py, PyAny>>,
    profile: Option<&str>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let format = l3_format(py, format, profile)?;
    let describe = || {
        let dtype = array.getattr("dtype").map_or("?".into(), |d| d.to_string());
        let shape = array.getattr("shape").map_or("?".into(), |s| s.to_string());
        format!("dtype {dtype}, shape {shape}")
    };
    let bad = || {
        raise(
            py,
            Kind::Options,
            format!(
                "encode expects a uint8 array of shape (H, W) or (H, W, C) with C = 1, 3 or 4, got {}",
                describe()
            ),
        )
    };
    let arr = array.cast::<PyArrayDyn<u8>>().map_err(|_| bad())?;
    let shape = arr.shape().to_vec();
    let (h, w, c) = match shape[..] {
        [h, w] => (h, w, 1),
        [h, w, c] if matches!(c, 1 | 3 | 4) => (h, w, c),
        _ => return Err(bad()),
    };
    let (Ok(w32), Ok(h32)) = (u32::try_from(w), u32::try_from(h)) else {
        return Err(bad());
    };
    let patch = match patch {
        None => None,
        Some(n) => Some(u8::try_from(n).ok().filter(|&n| n > 0).ok_or_else(|| {
            raise(
                py,
                Kind::Options,
                format!("patch size {n}: must be 1 to 255"),
            )
        })?),
    };
    let ro = arr.readonly();
    // A private copy, so the encoder runs without the GIL while Python threads may touch the array.
    let pixels: Vec<u8> = match ro.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => ro.as_array().iter().copied().collect(),
    };
    let threads = self::threads(threads);
    let file = detached(py, move || {
        let opts = EncodeOptions {
            format,
            patch_size: patch,
            threads,
            ..EncodeOptions::default()
        };
        l3_format::encode_with(&pixels, w32, h32, c as u8, &opts)
            .map_err(|e| Failure::l3("encode", e))
    })?;
    Ok(PyBytes::new(py, &file))
}

/// Decodes a whole L3 image into a ``uint8`` array: ``(H, W)`` for gray, ``(H, W, C)`` otherwise.
///
/// ``data``: the file's bytes (or any bytes-like object), or a path to read it from. The file is fully
/// validated; a corrupt one raises ``FormatError``.
#[pyfunction]
#[pyo3(signature = (data, *, threads=None))]
pub fn decode<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    let threads = self::threads(threads);
    let (px, h, w, c) = Data::extract(data)?.with(py, |bytes, what| {
        let f = L3File::parse(bytes).map_err(|e| Failure::l3(what, e))?;
        let mut px = vec![0u8; f.decoded_len()];
        f.decode_hwc_parallel(&mut px, threads)
            .map_err(|e| Failure::l3(what, e))?;
        Ok((px, f.height(), f.width(), f.channels()))
    })?;
    image_array(py, px, h, w, c)
}

/// Decodes only the ``w``×``h`` rectangle at (``x``, ``y``): only the patches under it are decoded. The
/// pixels equal the same rectangle of ``decode(data)``.
#[pyfunction]
pub fn decode_region<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    x: u32,
    y: u32,
    w: u32,
    h: u32,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    let (px, c) = Data::extract(data)?.with(py, |bytes, what| {
        let f = L3File::parse(bytes).map_err(|e| Failure::l3(what, e))?;
        let rect = Rect::new(x, y, w, h);
        if !rect.fits(f.width(), f.height()) || w == 0 || h == 0 {
            return Err(Failure::options(format!(
                "{what}: region {w}x{h} at ({x}, {y}) is empty or outside the {}x{} image",
                f.width(),
                f.height()
            )));
        }
        let c = f.channels();
        let mut px = vec![0u8; w as usize * h as usize * c as usize];
        f.decode_region(rect, &mut px, PixelLayout::packed(w, h, c, false))
            .map_err(|e| Failure::l3(what, e))?;
        Ok((px, c))
    })?;
    image_array(py, px, h, w, c)
}

/// The header of an L3 file as a dict: ``width``, ``height``, ``channels``, ``patch_size``,
/// ``patches_x``, ``patches_y``, ``version`` (the file's: 1 or 2), ``profile`` (``"ans"`` or ``"bp"`` for
/// version 2, ``None`` for version 1), ``file_bytes``, ``patch_data_bytes`` (the coded patches, without
/// header, offsets and tables), ``raw_bytes`` and ``ratio`` (file bytes / raw bytes). The whole file is
/// validated.
#[pyfunction]
pub fn info<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let (w, h, c, n, px, py_, len, version, profile, data_len) =
        Data::extract(data)?.with(py, |bytes, what| {
            let f = L3File::parse(bytes).map_err(|e| Failure::l3(what, e))?;
            Ok((
                f.width(),
                f.height(),
                f.channels(),
                f.patch_size(),
                f.patches_x(),
                f.patches_y(),
                bytes.len(),
                f.version(),
                f.profile().map(|p| p.name()),
                f.patch_data().len(),
            ))
        })?;
    let raw = u64::from(w) * u64::from(h) * u64::from(c);
    let d = PyDict::new(py);
    d.set_item("width", w)?;
    d.set_item("height", h)?;
    d.set_item("channels", c)?;
    d.set_item("patch_size", n)?;
    d.set_item("patches_x", px)?;
    d.set_item("patches_y", py_)?;
    d.set_item("version", version)?;
    d.set_item("profile", profile)?;
    d.set_item("file_bytes", len)?;
    d.set_item("patch_data_bytes", data_len)?;
    d.set_item("raw_bytes", raw)?;
    d.set_item("ratio", len as f64 / raw as f64)?;
    Ok(d)
}

/// Reads any image file the toolkit reads (PNG, JPEG, PPM/PGM/PAM, L3, ...) as a ``uint8`` array, with
/// the toolkit's rules: EXIF orientation applied, gray+alpha kept as RGBA, 16-bit images refused unless
/// ``to_8bit``. ``(H, W)`` for gray, ``(H, W, C)`` otherwise.
#[pyfunction]
#[pyo3(signature = (path, *, to_8bit=false))]
pub fn read_image(
    py: Python<'_>,
    path: PathBuf,
    to_8bit: bool,
) -> PyResult<Bound<'_, PyArrayDyn<u8>>> {
    let img = detached(py, || {
        Ok(loader::import(
            &path,
            &loader::ImportOptions {
                to_8bit,
                ..Default::default()
            },
        )?)
    })?;
    image_array(py, img.pixels, img.height, img.width, img.channels)
}

/// For the Pillow plugin's lazy open: what the first bytes of an L3 file of `file_len` bytes say.
/// Returns ``(needed, header)``: ``header`` is ``None`` until ``prefix`` holds the file's whole prefix
/// (header, tables, offset table: ``needed`` bytes, read by calling again with more), then a dict of
/// ``width``, ``height``, ``channels``, ``patch_size``, ``version``, ``profile``. Errors name ``name``.
#[pyfunction]
#[pyo3(name = "_read_header")]
pub fn read_header<'py>(
    py: Python<'py>,
    prefix: &[u8],
    file_len: u64,
    name: &str,
) -> PyResult<(usize, Option<Bound<'py, PyDict>>)> {
    let bad = |e: l3_format::Error| Failure::l3(name, e).into_pyerr(py);
    let needed = l3_format::L3Index::prefix_len(prefix).map_err(bad)?;
    let have = prefix.len() as u64;
    if needed > prefix.len() && have < file_len {
        return Ok((needed, None));
    }
    let index =
        l3_format::L3Index::parse(&prefix[..needed.min(prefix.len())], file_len).map_err(bad)?;
    let d = PyDict::new(py);
    d.set_item("width", index.width())?;
    d.set_item("height", index.height())?;
    d.set_item("channels", index.channels())?;
    d.set_item("patch_size", index.patch_size())?;
    d.set_item("version", index.version())?;
    d.set_item("profile", index.profile().map(|p| p.name()))?;
    Ok((needed, Some(d)))
}
