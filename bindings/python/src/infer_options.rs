//! `infer(...)`'s, `Model(...)`'s and `stylize(...)`'s keywords into the inference options model
//! ([`InferSettings`]): the names, values and defaults of `l3 infer`'s and `l3 stylize`'s flags, and the
//! same error text for the same bad value (the model's [`vocab::Invalid`], raised as `OptionsError`).

use crate::options::{bytes, expect, optional, parsed, whole};
use infer_io::InferSettings;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use vocab::Invalid;

/// Sets the setting `name` from `v`; `false` when `name` is not a setting.
pub fn set(s: &mut InferSettings, name: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    let flag = |o: &'static str| expect::<bool>(o, v, "True or False");
    let number = |o: &'static str| expect::<f32>(o, v, "a number");
    match name {
        "tile" => s.tile = optional(v, |v| whole("tile", v))?,
        "mode" => s.mode = parsed("mode", v)?,
        // `None` is the CPU, as it always was for `infer` and `stylize`.
        "device" => s.device = optional(v, |v| parsed("device", v))?.unwrap_or_default(),
        "precision" => s.precision = parsed("precision", v)?,
        "gpu_memory" => s.gpu_memory = optional(v, |v| bytes("gpu_memory", v))?,
        "threads" => s.threads = optional(v, |v| whole("threads", v))?,
        "padding" => s.padding = optional(v, |v| parsed("padding", v))?,
        "ram_budget_mib" => {
            s.ram_budget_mib = expect("ram_budget_mib", v, "a whole number of MiB")?
        }
        "spill_dir" => s.spill_dir = optional(v, |v| expect::<PathBuf>("spill_dir", v, "a path"))?,
        "full" => s.full = optional(v, |_| flag("full"))?,
        "in_scale" => s.in_scale = number("in_scale")?,
        "out_scale" => s.out_scale = number("out_scale")?,
        "out_dtype" => s.out_dtype = optional(v, |v| parsed("out_dtype", v))?,
        "page" => s.page = optional(v, |v| whole("page", v))?,
        "level" => s.level = optional(v, |v| whole("level", v))?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// The settings `function(..., **keywords)` asks for. An unknown keyword is a `TypeError`, as Python
/// raises for any function. `crop_to_input=True` is `full=False` spelt the other way.
pub fn infer_settings(
    py: Python<'_>,
    function: &str,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<InferSettings> {
    let mut s = InferSettings::default();
    let Some(kwargs) = kwargs else {
        return Ok(s);
    };
    let mut crop_to_input = None;
    for (k, v) in kwargs.iter() {
        let name: String = k.extract()?;
        if name == "crop_to_input" {
            crop_to_input = Some(expect::<bool>("crop_to_input", &v, "True or False")?);
        } else if !set(&mut s, &name, &v)? {
            return Err(PyTypeError::new_err(format!(
                "{function}() got an unexpected keyword argument {name:?}"
            )));
        }
    }
    if let Some(crop) = crop_to_input {
        if let Some(full) = s.full.filter(|&f| f == crop) {
            let why = "the opposite of crop_to_input, or only one of them (crop_to_input=True is \
                       full=False)";
            return Err(crate::options::invalid(py, Invalid::new("full", full, why)));
        }
        s.full = Some(!crop);
    }
    Ok(s)
}

/// ``[(name, default), ...]``: every option of ``infer`` besides ``image``, ``model`` and ``output``,
/// with its default as ``l3 infer --help`` shows it (``"none"`` for an unset one) — the options model
/// the command line and Python share.
#[pyfunction]
pub fn infer_options() -> Vec<(&'static str, String)> {
    InferSettings::defaults()
}
