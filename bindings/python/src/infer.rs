//! `l3toolkit.infer` and `l3toolkit.Model`: any supported network (an ONNX model of the tileable CNN
//! subset, or a TransformerNet in safetensors) over an image of any size with bsp-tiling's exact BSP
//! tiling, on arrays and on paths (`infer_io`, the same code as `l3 infer`).

use crate::errors::{Failure, Kind, detached, raise};
use crate::infer_options::infer_settings;
use bsp_tiling::{Collective, Graph, Image, Net, Ranks, Tensor};
use infer_io::{
    InputData, check_page, infer_path_to_tensor, infer_paths, infer_to_path, infer_to_tensor,
    load_network,
};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::path::PathBuf;
use std::sync::Arc;
use vocab::Invalid;

/// A network loaded once: an ONNX model (``.onnx``: the tileable CNN subset — convolutions, norms,
/// activations, pooling, resizes, pixel shuffle, skips; see the README) or a TransformerNet in
/// safetensors (``padding`` applies to it only: ``"reflect"`` as trained, the default, ``"circular"``,
/// ``"zero"``, ``"replicate"``). Errors name the node and why it cannot be tiled. ``infer`` runs either;
/// ``stylize`` runs a TransformerNet.
#[pyclass(frozen, subclass, module = "l3toolkit")]
pub struct Model {
    pub(crate) graph: Arc<Graph>,
    /// The TransformerNet itself, when the file holds one (what `stylize` runs).
    pub(crate) net: Option<Arc<Net>>,
    path: PathBuf,
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (path, *, padding=None))]
    pub(crate) fn new(
        py: Python<'_>,
        path: PathBuf,
        padding: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Model> {
        let mut s = infer_io::InferSettings::default();
        if let Some(p) = padding {
            crate::infer_options::set(&mut s, "padding", p)?;
        }
        let p = path.clone();
        let (graph, net) = detached(py, move || Ok(load_network(&p, s.padding)?))?;
        Ok(Model {
            graph: Arc::new(graph),
            net: net.map(Arc::new),
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

/// `model=`: a [`Model`] (its padding chosen when it was loaded), or a path loaded with `padding`.
pub(crate) fn model_of(
    py: Python<'_>,
    model: &Bound<'_, PyAny>,
    padding: Option<bsp_tiling::PaddingMode>,
) -> PyResult<(Arc<Graph>, Option<Arc<Net>>)> {
    let opt = |m: String| raise(py, Kind::Options, m);
    if let Ok(m) = model.cast::<Model>() {
        if let Some(p) = padding {
            let why =
                "none with a loaded Model (its padding is chosen by Model(path, padding=...))";
            return Err(opt(Invalid::new("padding", p, why).to_string()));
        }
        let m = m.get();
        return Ok((m.graph.clone(), m.net.clone()));
    }
    let path: PathBuf = model
        .extract()
        .map_err(|_| opt("model: expected a Model or a path".into()))?;
    let (graph, net) = detached(py, move || Ok(load_network(&path, padding)?))?;
    Ok((Arc::new(graph), net.map(Arc::new)))
}

/// Runs a CNN over an image of any size with BSP tiling.
///
/// ``image``: a ``float32`` array ``(C, H, W)`` (taken as is), a ``uint8`` array ``(H, W)`` or
/// ``(H, W, C)`` (0..255, times ``in_scale``), or a path: read by region from ``.l3`` and ``.tif``/``.tiff``
/// (TIFF or BigTIFF, tiled or striped; integer samples times ``in_scale``, float32 as they are) and
/// float32 ``.npy``, or any other image the toolkit reads (PNG, JPEG, ...: decoded whole, with a
/// ``UserWarning`` saying so). ``model``: a :class:`Model` or a path (``.onnx``, or TransformerNet
/// safetensors, loaded with ``padding``). With ``output`` (a path: ``.npy`` float32 C×H×W written tile by
/// tile, ``.tif``/``.tiff`` a tiled BigTIFF written tile by tile — uint8, or the raw output with
/// ``out_dtype="float32"`` —, ``.png`` with rows streamed, ``.l3``, ``.ppm``, ``.jpg``; 8-bit outputs are
/// ``out_scale`` times the output, clamped) the result is written there and ``None`` returned; without, a
/// ``float32`` array ``(C, H', W')`` is returned: the network's whole output, as onnxruntime gives it
/// (``full=False`` or ``crop_to_input=True``: cropped to the input's size times the network's scale).
///
/// The other keywords are ``l3 infer``'s flags (``infer_options()`` lists them with their defaults):
/// ``tile`` (default 512 on the CPU, 2048 on a CUDA device), ``mode`` (``"exact"``, ``"sampled"`` /
/// ``"sampled:N"``, ``"recompute"``, ``"naive"``, ``"whole"``), ``device`` (``"cpu"``, ``"cuda"``,
/// ``"cuda:N"``: every node on the CUDA backend; a GPU that cannot be used raises ``GpuError`` with the
/// reason, never runs on the CPU), ``precision`` (``"f32"``, or on a GPU ``"tf32"``: convolution
/// operands rounded to TF32 on the tensor cores, PyTorch's default ``allow_tf32``; or ``"f16"``: binary16
/// convolution operands; f32 accumulation either way),
/// ``gpu_memory``, ``threads``, ``padding``, ``ram_budget_mib``, ``spill_dir``, ``full``, ``in_scale``,
/// ``out_scale``, ``out_dtype``, ``page`` (of a TIFF path; a page the file lacks raises ``OptionsError``
/// with its page count) and ``level`` (of that page: N its N-th SubIFD). A bad value raises
/// ``OptionsError`` naming the keyword; ``crop_to_input=True`` is ``full=False`` spelt the other way.
#[pyfunction]
#[pyo3(
    text_signature = "(image, model, *, output=None, tile=None, mode=\"exact\", device=\"cpu\", \
    precision=\"f32\", gpu_memory=None, threads=None, padding=None, ram_budget_mib=2048, spill_dir=None, \
    full=None, in_scale=1.0, out_scale=1.0, out_dtype=None, page=None, level=None, group=None)"
)]
#[pyo3(signature = (image, model, *, output=None, **kwargs))]
pub fn infer<'py>(
    py: Python<'py>,
    image: &Bound<'py, PyAny>,
    model: &Bound<'py, PyAny>,
    output: Option<PathBuf>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Bound<'py, PyArrayDyn<f32>>>> {
    // `group=` is not a setting of the run but who shares it.
    let kwargs = kwargs.map(|k| k.copy()).transpose()?;
    let group = match &kwargs {
        Some(k) => {
            let g = k.get_item("group")?;
            k.del_item("group").ok();
            g
        }
        None => None,
    };
    let ranks = match group.filter(|g| !g.is_none()) {
        Some(g) => Some(ranks_of(py, &g)?),
        None => None,
    };
    let result = infer_shared(py, image, model, output, kwargs.as_ref(), ranks.clone());
    match (result, ranks) {
        // Whatever failed here (a bad option, a missing model or input), the other ranks are told
        // wherever they wait, and none waits for ever.
        (Err(e), Some(ranks)) => {
            let told = bsp_tiling::Error::External(e.to_string().into());
            py.detach(|| ranks.tell("infer", told));
            Err(e)
        }
        (r, _) => r,
    }
}

/// [`infer`] once its ranks are known.
fn infer_shared<'py>(
    py: Python<'py>,
    image: &Bound<'py, PyAny>,
    model: &Bound<'py, PyAny>,
    output: Option<PathBuf>,
    kwargs: Option<&Bound<'py, PyDict>>,
    ranks: Option<Ranks>,
) -> PyResult<Option<Bound<'py, PyArrayDyn<f32>>>> {
    let opt = |m: String| raise(py, Kind::Options, m);
    let settings = infer_settings(py, "infer", kwargs)?;
    // Checked before anything is loaded: the paths are set once the input is known.
    let mut req = settings
        .request(PathBuf::new(), output.clone().unwrap_or_default())
        .map_err(|e| Failure::from(e).into_pyerr(py))?;
    let (page, level) = (settings.page, settings.level);
    let (graph, _) = model_of(py, model, settings.padding)?;
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
    req.input = in_path.unwrap_or_default();
    let writes = ranks.as_ref().is_none_or(|r| r.is_root());
    req.ranks = ranks;
    let g = graph.clone();
    // A path is read as `l3 infer` reads it (by region where the format allows); an array is in memory.
    let (result, notes) = detached(py, move || match (data, output.is_some()) {
        (Some(data), true) => {
            let r = infer_to_path(&g, &data, &req)?;
            Ok((None, r.notes))
        }
        (Some(data), false) => {
            let (t, info) = infer_to_tensor(&g, &data, &req)?;
            Ok((Some(t), info.notes))
        }
        (None, true) => {
            let r = infer_paths(&g, &req)?;
            Ok((None, r.notes))
        }
        (None, false) => {
            let (t, _, notes) = infer_path_to_tensor(&g, &req)?;
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
        // Only rank 0 holds the output: the others return `None`.
        Some(_) if !writes => Ok(None),
        Some(t) => Ok(Some(
            PyArray1::from_vec(py, t.data).reshape(vec![t.c, t.h, t.w])?,
        )),
    }
}

/// The elements of `a` in C order, copied out of Python (a strided view element by element).
/// The ranks `group=` names: a `torch.distributed` process group, `"jax"` (JAX's multi-process
/// runtime), or any object with `rank`, `size` and `all_gather(bytes) -> list[bytes]`
/// (`l3toolkit._distributed.collective` says which).
fn ranks_of(py: Python<'_>, group: &Bound<'_, PyAny>) -> PyResult<Ranks> {
    let c = py
        .import("l3toolkit._distributed")?
        .call_method1("collective", (group,))?;
    let rank: usize = c.getattr("rank")?.extract()?;
    let size: usize = c.getattr("size")?.extract()?;
    let exchanges = c.hasattr("exchange")?;
    Ranks::new(Arc::new(PyCollective {
        obj: c.unbind(),
        rank,
        size,
        exchanges,
    }))
    .map_err(|e| Failure::from(e).into_pyerr(py))
}

/// A collective implemented in Python (see [`ranks_of`]), called from the run's driving thread with the
/// GIL taken for the call.
struct PyCollective {
    obj: Py<PyAny>,
    rank: usize,
    size: usize,
    /// The object has `exchange(list[bytes]) -> list[bytes]` (point to point), else all-gather does.
    exchanges: bool,
}

/// A Python list of `bytes` (what `name` returned) as byte vectors.
fn byte_list(got: &Bound<'_, PyAny>, name: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = vec![];
    for item in got.try_iter().map_err(|e| e.to_string())? {
        let item = item.map_err(|e| e.to_string())?;
        let b = item
            .cast::<PyBytes>()
            .map_err(|_| format!("{name} must return a list of bytes"))?;
        out.push(b.as_bytes().to_vec());
    }
    Ok(out)
}

impl Collective for PyCollective {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_gather(&self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, String> {
        Python::attach(|py| {
            let got = self
                .obj
                .bind(py)
                .call_method1("all_gather", (PyBytes::new(py, &mine),))
                .map_err(|e| e.to_string())?;
            byte_list(&got, "all_gather")
        })
    }
    fn exchange(&self, parts: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, String> {
        if !self.exchanges {
            return bsp_tiling::exchange_by_all_gather(self, parts);
        }
        Python::attach(|py| {
            let list = pyo3::types::PyList::new(py, parts.iter().map(|p| PyBytes::new(py, p)))
                .map_err(|e| e.to_string())?;
            let got = self
                .obj
                .bind(py)
                .call_method1("exchange", (list,))
                .map_err(|e| e.to_string())?;
            byte_list(&got, "exchange")
        })
    }
}

fn copied<T: numpy::Element + Copy>(a: &Bound<'_, PyArrayDyn<T>>) -> Vec<T> {
    let ro = a.readonly();
    match ro.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => ro.as_array().iter().copied().collect(),
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
        let v = copied(a);
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
        let pixels = copied(a);
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
