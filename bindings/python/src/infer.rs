//! `l3toolkit.infer` and `l3toolkit.Model`: any supported network (an ONNX model of the tileable CNN
//! subset, or a TransformerNet in safetensors) over an image of any size with bsp-tiling's exact BSP
//! tiling, on arrays and on paths (`infer_io`, the same code as `l3 infer`).

use crate::errors::{Failure, Kind, detached, raise};
use crate::stylize::gpu_words_of;
use bsp_tiling::{Budget, Graph, Image, Mode, PaddingMode, Tensor};
use infer_io::{
    InferRequest, InputData, check_page, infer_path_to_tensor, infer_paths, infer_to_path,
    infer_to_tensor, load_model,
};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;

/// A network loaded once: an ONNX model (``.onnx``: the tileable CNN subset — convolutions, norms,
/// activations, pooling, resizes, pixel shuffle, skips; see the README) or a TransformerNet in
/// safetensors (``padding`` applies to it only). Errors name the node and why it cannot be tiled.
#[pyclass(frozen, module = "l3toolkit")]
pub struct Model {
    graph: Arc<Graph>,
    path: PathBuf,
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (path, *, padding=None))]
    fn new(py: Python<'_>, path: PathBuf, padding: Option<&str>) -> PyResult<Model> {
        let padding = match padding {
            None => None,
            Some(p) => Some(PaddingMode::parse(p).ok_or_else(|| {
                raise(py, Kind::Options, format!("padding={p:?}: expected \"reflect\", \"circular\", \"zero\" or \"replicate\""))
            })?),
        };
        let p = path.clone();
        let graph = detached(py, move || Ok(load_model(&p, padding)?))?;
        Ok(Model {
            graph: Arc::new(graph),
            path,
        })
    }

    /// Input channels.
    #[getter]
    fn channels(&self) -> usize {
        self.graph.channels
    }

    /// Number of nodes after import (BatchNorm folded, identities removed).
    #[getter]
    fn nodes(&self) -> usize {
        self.graph.nodes.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Model({:?}, {} nodes)",
            self.path.display().to_string(),
            self.graph.nodes.len()
        )
    }
}

/// Runs a CNN over an image of any size with BSP tiling.
///
/// ``image``: a ``float32`` array ``(C, H, W)`` (taken as is), a ``uint8`` array ``(H, W)`` or
/// ``(H, W, C)`` (0..255, times ``in_scale``), or a path: read by region from ``.l3`` and ``.tif``/``.tiff``
/// (TIFF or BigTIFF, tiled or striped; integer samples times ``in_scale``, float32 as they are) and
/// float32 ``.npy``, or any other image the toolkit reads (PNG, JPEG, ...: decoded whole, with a
/// ``UserWarning`` saying so). ``page``: the page of a TIFF path to read (default 0, the file's first
/// image: a slide's full resolution; later pages are reduced levels, overviews, thumbnails); a page the
/// file lacks raises ``OptionsError`` with the file's page count. ``level``: the level of that page
/// (default 0, the page itself; N its N-th SubIFD, where pyramidal slides such as OME-TIFF keep their
/// reduced resolutions); a level the page lacks raises ``OptionsError`` with its count. ``page`` or
/// ``level`` with an array or another kind of file raises ``OptionsError``. ``model``: a :class:`Model` or a path (``.onnx``, or TransformerNet safetensors).
/// ``mode``: ``"exact"`` (equal to the whole-image result), ``"sampled"`` / ``"sampled:N"``,
/// ``"recompute"``, ``"naive"`` or ``"whole"``. ``tile``: tile side in pixels (a multiple of the network's
/// total stride). With ``output`` (a path: ``.npy`` float32 C×H×W written tile by tile, ``.tif``/``.tiff`` a
/// tiled BigTIFF written tile by tile — uint8, or the raw output with ``out_dtype="float32"`` —, ``.png``
/// with rows streamed, ``.l3``, ``.ppm``, ``.jpg``; 8-bit outputs are ``out_scale`` times the output,
/// clamped) the result is written there and ``None`` returned; without, a ``float32`` array ``(C, H', W')`` is returned.
/// The output is the network's, as onnxruntime gives it; ``crop_to_input=True`` crops it to the input's size
/// times the network's scale (what ``stylize`` does for a TransformerNet, which pads sides to a multiple of 4).
/// ``device``: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (every node on bsp-tiling's CUDA backend; a GPU that
/// cannot be used raises with the reason, never runs on the CPU). ``precision``: ``"f32"`` (graph
/// convolutions have f32 kernels only: ``"f16"`` raises naming the first convolution). ``gpu_memory``:
/// bytes of device memory the run may use (default: what is free, less a margin).
#[pyfunction]
#[pyo3(signature = (
    image, model, *, output=None, tile=512, mode="exact", threads=None, ram_budget_mib=2048,
    spill_dir=None, crop_to_input=false, in_scale=1.0, out_scale=1.0, device=None, out_dtype=None,
    precision="f32", gpu_memory=None, page=None, level=None
))]
#[allow(clippy::too_many_arguments)]
pub fn infer<'py>(
    py: Python<'py>,
    image: &Bound<'py, PyAny>,
    model: &Bound<'py, PyAny>,
    output: Option<PathBuf>,
    tile: usize,
    mode: &str,
    threads: Option<usize>,
    ram_budget_mib: u64,
    spill_dir: Option<PathBuf>,
    crop_to_input: bool,
    in_scale: f32,
    out_scale: f32,
    device: Option<Bound<'py, PyAny>>,
    out_dtype: Option<&str>,
    precision: &str,
    gpu_memory: Option<u64>,
    page: Option<usize>,
    level: Option<usize>,
) -> PyResult<Option<Bound<'py, PyArrayDyn<f32>>>> {
    let opt = |m: String| raise(py, Kind::Options, m);
    let out_dtype = match out_dtype {
        None => None,
        Some(d) => Some(infer_io::tiff::OutDType::parse(d).ok_or_else(|| {
            opt(format!(
                "out_dtype={d:?}: expected \"uint8\" or \"float32\""
            ))
        })?),
    };
    let Some(mode) = Mode::parse(mode) else {
        return Err(opt(format!(
            "mode={mode:?}: expected \"exact\", \"sampled\", \"sampled:N\", \"recompute\", \"naive\" or \"whole\""
        )));
    };
    let dev = crate::stylize::device_options(py, device.as_ref(), precision, gpu_memory)?;
    let graph = match model.cast::<Model>() {
        Ok(m) => m.get().graph.clone(),
        Err(_) => {
            let path: PathBuf = model
                .extract()
                .map_err(|_| opt("model: expected a Model or a path".into()))?;
            Model::new(py, path, None)?.graph
        }
    };
    // The input: a path, or an array copied out of Python.
    let data = array_input(py, image, graph.channels)?;
    let in_path: Option<PathBuf> = if data.is_none() {
        Some(image.extract().map_err(|_| {
            opt("image: expected a float32 (C, H, W) or uint8 (H, W[, C]) array, or a path".into())
        })?)
    } else {
        None
    };
    match &in_path {
        None if page.is_some() || level.is_some() => {
            return Err(opt(format!(
                "{}: applies to a TIFF path (.tif, .tiff), not to an array",
                if page.is_some() { "page" } else { "level" }
            )));
        }
        Some(p) => check_page(p, page, level).map_err(|e| Failure::from(e).into_pyerr(py))?,
        None => {}
    }
    let defaults = bsp_tiling::Options::default();
    let req = InferRequest {
        input: in_path.clone().unwrap_or_default(),
        output: output.clone().unwrap_or_default(),
        mode,
        tile,
        threads: threads.unwrap_or(defaults.threads).max(1),
        budget: Budget {
            ram: ram_budget_mib << 20,
            disk: None,
            spill_dir: spill_dir.unwrap_or_else(std::env::temp_dir),
        },
        full: !crop_to_input,
        in_scale,
        out_scale,
        out_dtype,
        device: dev.clone(),
        page,
        level,
    };
    let g = graph.clone();
    let words = dev.clone();
    let failure = move |e: infer_io::Error| gpu_words_of(&words, Failure::from(e));
    // A path is read as `l3 infer` reads it (by region where the format allows); an array is in memory.
    let (result, notes) = detached(py, move || match (data, output.is_some()) {
        (Some(data), true) => {
            let r = infer_to_path(&g, &data, &req).map_err(failure)?;
            Ok((None, r.notes))
        }
        (Some(data), false) => {
            let (t, info) = infer_to_tensor(&g, &data, &req).map_err(failure)?;
            Ok((Some(t), info.notes))
        }
        (None, true) => {
            let r = infer_paths(&g, &req).map_err(failure)?;
            Ok((None, r.notes))
        }
        (None, false) => {
            let (t, _, notes) = infer_path_to_tensor(&g, &req).map_err(failure)?;
            Ok((Some(t), notes))
        }
    })?;
    for note in notes {
        let msg = std::ffi::CString::new(note).unwrap_or_default();
        PyErr::warn(
            py,
            &py.get_type::<pyo3::exceptions::PyUserWarning>(),
            &msg,
            1,
        )?;
    }
    match result {
        None => Ok(None),
        Some(t) => Ok(Some(
            PyArray1::from_vec(py, t.data).reshape(vec![t.c, t.h, t.w])?,
        )),
    }
}

/// `image` copied out of Python when it is an array (`None` when it is not): a float32 `(C, H, W)`
/// tensor, or a uint8 `(H, W)` / `(H, W, C)` image, widened to RGB for a network of `channels` 3.
fn array_input(
    py: Python<'_>,
    image: &Bound<'_, PyAny>,
    channels: usize,
) -> PyResult<Option<InputData>> {
    let opt = |m: String| raise(py, Kind::Options, m);
    Ok(if let Ok(a) = image.cast::<PyArrayDyn<f32>>() {
        let (c, h, w) = match a.shape() {
            &[c, h, w] => (c, h, w),
            s => {
                return Err(opt(format!(
                    "image: a float32 array must be (C, H, W), got shape {s:?}"
                )));
            }
        };
        let ro = a.readonly();
        let v: Vec<f32> = match ro.as_slice() {
            Ok(s) => s.to_vec(),
            Err(_) => ro.as_array().iter().copied().collect(),
        };
        Some(InputData::Tensor(
            Tensor::from_vec(c, h, w, v).map_err(|e| Failure::from(e).into_pyerr(py))?,
        ))
    } else if let Ok(a) = image.cast::<PyArrayDyn<u8>>() {
        let (h, w, c) = match a.shape() {
            &[h, w] => (h, w, 1),
            &[h, w, c] if (1..=4).contains(&c) => (h, w, c),
            s => {
                return Err(opt(format!(
                    "image: a uint8 array must be (H, W) or (H, W, C), got shape {s:?}"
                )));
            }
        };
        let ro = a.readonly();
        let pixels: Vec<u8> = match ro.as_slice() {
            Ok(s) => s.to_vec(),
            Err(_) => ro.as_array().iter().copied().collect(),
        };
        let img = Image {
            width: w as u32,
            height: h as u32,
            channels: c as u8,
            pixels,
        };
        Some(InputData::Image(if channels == 3 && c != 3 {
            img.to_rgb()
        } else {
            img
        }))
    } else {
        None
    })
}
