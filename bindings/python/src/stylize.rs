//! `l3toolkit.stylize`: bsp-tiling's tiled style transfer on a NumPy image, on the CPU or a CUDA device
//! (`bsp_tiling::stylize_on`, which never falls back to the CPU), with a [`Model`] holding a
//! TransformerNet (`StyleModel`, its deprecated name, is defined in Python).

use crate::errors::{Failure, Kind, detached, raise};
use crate::infer::model_of;
use bsp_tiling::{Image, Options, Output};
use infer_io::InferSettings;
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use std::path::PathBuf;

/// Runs a style-transfer network over an image of any size with BSP tiling.
///
/// ``image``: ``uint8`` array ``(H, W, 3)``. ``model``: a :class:`Model` holding a TransformerNet, or a
/// path to its safetensors (loaded with ``padding``). ``mode``: ``"exact"`` (halo exchange and
/// synchronised normalisation statistics: equal to running the whole image at once), ``"sampled"`` /
/// ``"sampled:N"``, ``"recompute"``, ``"naive"`` (independent tiles, visible seams) or ``"whole"``.
/// ``tile``: tile side in pixels (a multiple of 4; default 512 on the CPU, 2048 on a GPU).
/// ``ram_budget_mib``: activations kept in RAM by ``exact`` before layers spill to files in
/// ``spill_dir``. Returns ``uint8`` ``(H, W, 3)`` — or PyTorch's output size (each side rounded up to a
/// multiple of 4) with ``full=True``.
///
/// ``device``: ``"cpu"`` (the reference backend), ``"cuda"`` or ``"cuda:N"`` (bsp-tiling's CUDA backend;
/// ``GpuError`` naming the reason when there is no usable GPU — never a silent CPU run).
/// ``precision``: ``"f32"``, ``"tf32"`` or ``"f16"`` (on the GPU: convolution operands rounded to TF32 on
/// the tensor cores, as PyTorch's default ``allow_tf32``, or to half precision; f32 accumulation).
/// ``gpu_memory``: bytes of device memory the run may use (default: what is free, less a margin); layers
/// that do not fit stay in host memory and cross the bus tile by tile. The keywords are
/// :func:`infer`'s, with the same values and errors.
#[pyfunction]
#[pyo3(
    text_signature = "(image, model, *, tile=None, mode=\"exact\", threads=None, padding=None, \
    ram_budget_mib=2048, spill_dir=None, full=False, device=None, precision=\"f32\", gpu_memory=None)"
)]
#[pyo3(signature = (
    image, model, *, tile=None, mode=None, threads=None, padding=None, ram_budget_mib=None,
    spill_dir=None, full=None, device=None, precision=None, gpu_memory=None
))]
#[allow(clippy::too_many_arguments)]
pub fn stylize<'py>(
    py: Python<'py>,
    image: &Bound<'py, PyAny>,
    model: &Bound<'py, PyAny>,
    tile: Option<Bound<'py, PyAny>>,
    mode: Option<Bound<'py, PyAny>>,
    threads: Option<Bound<'py, PyAny>>,
    padding: Option<Bound<'py, PyAny>>,
    ram_budget_mib: Option<Bound<'py, PyAny>>,
    spill_dir: Option<Bound<'py, PyAny>>,
    full: Option<Bound<'py, PyAny>>,
    device: Option<Bound<'py, PyAny>>,
    precision: Option<Bound<'py, PyAny>>,
    gpu_memory: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    let mut settings = InferSettings::default();
    for (name, v) in [
        ("tile", tile),
        ("mode", mode),
        ("threads", threads),
        ("padding", padding),
        ("ram_budget_mib", ram_budget_mib),
        ("spill_dir", spill_dir),
        ("full", full),
        ("device", device),
        ("precision", precision),
        ("gpu_memory", gpu_memory),
    ] {
        if let Some(v) = v {
            crate::infer_options::set(&mut settings, name, &v)?;
        }
    }
    let settings = settings.cropped_by_default();
    let req = settings
        .request(PathBuf::new(), PathBuf::new())
        .map_err(|e| Failure::from(e).into_pyerr(py))?;
    let (_, net) = model_of(py, model, settings.padding)?;
    let Some(net) = net else {
        return Err(raise(
            py,
            Kind::Options,
            "model: expected a TransformerNet in safetensors (stylize runs style-transfer networks; \
             infer runs ONNX models)",
        ));
    };
    let bad = || {
        raise(
            py,
            Kind::Options,
            "stylize expects a uint8 array of shape (H, W, 3)",
        )
    };
    let arr = image.cast::<PyArrayDyn<u8>>().map_err(|_| bad())?;
    let (h, w) = match arr.shape() {
        &[h, w, 3] => (h, w),
        _ => return Err(bad()),
    };
    let ro = arr.readonly();
    let pixels: Vec<u8> = match ro.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => ro.as_array().iter().copied().collect(),
    };
    let full = req.full;
    let dev = req.device.clone();
    let opts = Options {
        mode: req.mode,
        tile: req.tile,
        threads: req.threads,
        budget: req.budget,
        ranks: None,
    };
    let out = detached(py, move || {
        let input = Image::rgb8(w as u32, h as u32, pixels);
        let (out, _info) = bsp_tiling::stylize_on(&dev, &net, &input, &opts, true)?;
        let Output::Rgb8(o) = out else {
            return Err(Failure::new(
                Kind::Base,
                "internal: bsp_tiling returned a float output for an 8-bit request",
            ));
        };
        let (oh, ow) = (o.height as usize, o.width as usize);
        if full || (ow, oh) == (w, h) {
            return Ok((o.pixels, oh, ow));
        }
        let mut px = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            px.extend_from_slice(&o.pixels[y * ow * 3..(y * ow + w) * 3]);
        }
        Ok((px, h, w))
    })?;
    let (px, oh, ow) = out;
    PyArray1::from_vec(py, px).reshape(vec![oh, ow, 3])
}
