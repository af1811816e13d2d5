//! `Loader(...)`'s keywords into the loader's one options model ([`loader::Settings`]): the same names,
//! values and defaults as `l3 stream`'s flags, and the same error text for the same bad value (the
//! model's [`vocab::Invalid`], raised as `OptionsError`).

use crate::errors::{Kind, raise};
use loader::{Bytes, Pair, PerChannel, SampleSize, Settings, Size, parse_setting};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::path::PathBuf;
use vocab::Invalid;

pub(crate) fn invalid(py: Python<'_>, e: Invalid) -> PyErr {
    raise(py, Kind::Options, e.to_string())
}

/// A value's text: a `str` as it is, anything else through `str()` (so a `torch.device` or a `Path` reads
/// as the command line would spell it).
pub(crate) fn text(v: &Bound<'_, PyAny>) -> PyResult<String> {
    match v.cast::<PyString>() {
        Ok(s) => Ok(s.to_string()),
        Err(_) => Ok(v.str()?.to_string()),
    }
}

/// A value parsed from its text by the model's own parser.
pub(crate) fn parsed<T: std::str::FromStr<Err = Invalid>>(
    option: &'static str,
    v: &Bound<'_, PyAny>,
) -> PyResult<T> {
    parse_setting(option, &text(v)?).map_err(|e| invalid(v.py(), e))
}

pub(crate) fn expect<'py, T: FromPyObjectOwned<'py>>(
    option: &'static str,
    v: &Bound<'py, PyAny>,
    expected: &str,
) -> PyResult<T> {
    v.extract::<T>().map_err(|_| {
        let shown = v.repr().map_or_else(|_| "?".into(), |r| r.to_string());
        invalid(v.py(), Invalid::new(option, shown, expected))
    })
}

pub(crate) fn whole(option: &'static str, v: &Bound<'_, PyAny>) -> PyResult<usize> {
    expect(option, v, "a whole number")
}

pub(crate) fn optional<'py, T>(
    v: &Bound<'py, PyAny>,
    f: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Option<T>> {
    if v.is_none() {
        Ok(None)
    } else {
        f(v).map(Some)
    }
}

/// `device=`: `"cpu"`, `"cuda"`, `"cuda:N"`, or anything whose `str()` is one of those (a `torch.device`).
/// The one parser of the package's `device=` arguments (`Loader`, `stylize`).
pub fn device(v: &Bound<'_, PyAny>) -> PyResult<vocab::Device> {
    parsed("device", v)
}

/// `crop=`: an int (square), `(height, width)`, text `N` / `HxW` / `none`, or `None`: whole images.
fn size(v: &Bound<'_, PyAny>) -> PyResult<SampleSize> {
    if v.is_none() {
        return Ok(SampleSize::Whole);
    }
    if v.is_instance_of::<PyString>() {
        return parsed("crop", v);
    }
    let (height, width) = match v.extract::<u32>() {
        Ok(n) => (n, n),
        Err(_) => expect("crop", v, "an int or (height, width)")?,
    };
    if height == 0 || width == 0 {
        return Err(invalid(
            v.py(),
            Invalid::new(
                "crop",
                format!("{height}x{width}"),
                "N or HxW (positive integers)",
            ),
        ));
    }
    Ok(SampleSize::Fixed(Size { height, width }))
}

/// `mean=` / `std=`: three numbers, one (a luma sample's, or the same for every channel), or text.
fn per_channel(option: &'static str, v: &Bound<'_, PyAny>) -> PyResult<PerChannel> {
    if v.is_instance_of::<PyString>() {
        return parsed(option, v);
    }
    let why = "3 numbers, one per channel (a,b,c), or 1";
    let values: Vec<f32> = match v.extract::<f32>() {
        Ok(one) => vec![one],
        Err(_) => expect(option, v, why)?,
    };
    PerChannel::from_values(&values)
        .ok_or_else(|| invalid(v.py(), Invalid::new(option, format!("{values:?}"), why)))
}

/// `scale=` / `ratio=` / `jitter=`: two numbers `(a, b)`, or text `a,b`.
fn pair(option: &'static str, v: &Bound<'_, PyAny>) -> PyResult<Pair> {
    if v.is_instance_of::<PyString>() {
        return parsed(option, v);
    }
    let values: Vec<f64> = expect(option, v, "2 numbers (a, b)")?;
    <[f64; 2]>::try_from(values.as_slice())
        .map(Pair)
        .map_err(|_| {
            invalid(
                v.py(),
                Invalid::new(option, format!("{values:?}"), "2 numbers (a, b)"),
            )
        })
}

/// `budget=` / `cache_limit=`: an int, or text such as `2G`.
pub(crate) fn bytes(option: &'static str, v: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if v.is_instance_of::<PyString>() {
        return parsed(option, v);
    }
    expect::<u64>(option, v, "bytes, such as 2000000000 or 2G").map(Bytes)
}

/// The settings `Loader(source, batch_size, **keywords)` asks for. An unknown keyword is a `TypeError`, as
/// Python raises for any function.
pub fn settings(
    py: Python<'_>,
    batch_size: Option<usize>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Settings> {
    let mut s = Settings::default();
    if let Some(b) = batch_size {
        s.batch_size = b;
    }
    let Some(kwargs) = kwargs else {
        return Ok(s);
    };
    for (k, v) in kwargs.iter() {
        let name: String = k.extract()?;
        let v = &v;
        let flag = |o: &'static str| expect::<bool>(o, v, "True or False");
        match name.as_str() {
            "crop" => {
                s.crop = size(v)?;
            }
            "random_crop" => s.random_crop = flag("random_crop")?,
            "flip" => s.flip = flag("flip")?,
            "shuffle" => s.shuffle = flag("shuffle")?,
            "seed" => s.seed = expect("seed", v, "a whole number")?,
            "epochs" => s.epochs = optional(v, |v| whole("epochs", v))?,
            "drop_last" => s.drop_last = flag("drop_last")?,
            "rank" => s.rank = optional(v, |v| whole("rank", v))?,
            "world_size" => s.world_size = optional(v, |v| whole("world_size", v))?,
            "threads" => s.threads = optional(v, |v| whole("threads", v))?,
            "layout" => s.layout = parsed("layout", v)?,
            "dtype" => s.dtype = parsed("dtype", v)?,
            "mean" => s.mean = optional(v, |v| per_channel("mean", v))?,
            "std" => s.std = optional(v, |v| per_channel("std", v))?,
            "device" => {
                if !v.is_none() {
                    s.device = device(v)?;
                }
            }
            "sampler" => s.sampler = parsed("sampler", v)?,
            "budget" => s.budget = optional(v, |v| bytes("budget", v))?,
            "group" => s.group = optional(v, |v| whole("group", v))?,
            "labels" => s.labels = optional(v, |v| expect::<PathBuf>("labels", v, "a path"))?,
            "io_threads" => s.io_threads = whole("io_threads", v)?,
            "prefetch" => s.prefetch = whole("prefetch", v)?,
            "skip_errors" => s.skip_errors = flag("skip_errors")?,
            "partial_images" => s.partial_images = flag("partial_images")?,
            "storage_mbps" => {
                s.storage_mbps = optional(v, |v| expect("storage_mbps", v, "a number of MB/s"))?
            }
            "retry_secs" => s.retry_secs = expect("retry_secs", v, "a number of seconds")?,
            "cache_dir" => {
                s.cache_dir = optional(v, |v| expect::<PathBuf>("cache_dir", v, "a path"))?
            }
            "cache_limit" => s.cache_limit = optional(v, |v| bytes("cache_limit", v))?,
            "pcr_window" => s.pcr_window = whole("pcr_window", v)?,
            "pcr_partial" => s.pcr_partial = flag("pcr_partial")?,
            "decode" => s.decode = parsed("decode", v)?,
            "gpu_fallback" => s.gpu_fallback = flag("gpu_fallback")?,
            "pin_memory" => s.pin_memory = flag("pin_memory")?,
            "shard_tail" => s.shard_tail = parsed("shard_tail", v)?,
            "scale" => s.scale = optional(v, |v| pair("scale", v))?,
            "ratio" => s.ratio = optional(v, |v| pair("ratio", v))?,
            "jitter" => s.jitter = optional(v, |v| pair("jitter", v))?,
            "max_size" => {
                s.max_size = optional(v, |v| expect("max_size", v, "a longer side in pixels"))?
            }
            "resize" => {
                s.resize = optional(v, |v| expect("resize", v, "a shorter side in pixels"))?
            }
            "interpolation" => s.interpolation = parsed("interpolation", v)?,
            "fill" => s.fill = expect("fill", v, "a pixel value of 0 to 255")?,
            "channels" => s.channels = expect("channels", v, "1 (luma), 3 (RGB) or 4 (RGBA)")?,
            "masks" => s.masks = optional(v, |v| expect::<PathBuf>("masks", v, "a path"))?,
            "image_suffix" => {
                s.image_suffix = optional(v, |v| expect("image_suffix", v, "a string"))?
            }
            "mask_suffix" => s.mask_suffix = optional(v, |v| expect("mask_suffix", v, "a string"))?,
            "ignore_index" => {
                s.ignore_index = expect("ignore_index", v, "an integer from 0 to 65535")?
            }
            "boxes" => s.boxes = optional(v, |v| expect::<PathBuf>("boxes", v, "a path"))?,
            "min_box_size" => s.min_box_size = expect("min_box_size", v, "a number of pixels")?,
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "Loader() got an unexpected keyword argument {name:?}"
                )));
            }
        }
    }
    let _ = py;
    Ok(s)
}

/// ``[(name, default), ...]``: every option ``Loader`` takes besides ``source``, with its default as
/// ``l3 stream --help`` shows it (``"none"`` for an unset one) — the options model both surfaces share.
#[pyfunction]
pub fn loader_options() -> Vec<(&'static str, String)> {
    Settings::defaults()
}
