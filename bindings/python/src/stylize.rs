//! `l3toolkit.stylize`: bsp-tiling's tiled style transfer on a NumPy image, on the CPU or a CUDA device
//! (`bsp_tiling::stylize_on`, which never falls back to the CPU), and `StyleModel` (loaded weights,
//! reusable across calls).

use crate::errors::{Failure, Kind, detached, raise};
use bsp_tiling::{
    Budget, Device, DeviceOptions, Image, Mode, Net, Options, Output, PaddingMode, Precision,
};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;

fn padding_mode(py: Python<'_>, padding: &str) -> PyResult<PaddingMode> {
    PaddingMode::parse(padding).ok_or_else(|| {
        raise(
            py,
            Kind::Options,
            format!(
                "padding={padding:?}: expected \"reflect\", \"circular\", \"zero\" or \"replicate\""
            ),
        )
    })
}

/// A fast style-transfer network (Johnson et al.'s TransformerNet) loaded from safetensors with the
/// PyTorch example's key names. ``padding``: how convolutions pad the image border (``"reflect"`` as
/// trained, ``"circular"``, ``"zero"``, ``"replicate"``).
#[pyclass(frozen, module = "l3toolkit")]
pub struct StyleModel {
    net: Arc<Net>,
    path: PathBuf,
}

#[pymethods]
impl StyleModel {
    #[new]
    #[pyo3(signature = (path, *, padding="reflect"))]
    fn new(py: Python<'_>, path: PathBuf, padding: &str) -> PyResult<StyleModel> {
        let padding = padding_mode(py, padding)?;
        let net = detached(py, || Ok(Net::load_transformer(&path, padding)?))?;
        Ok(StyleModel {
            net: Arc::new(net),
            path,
        })
    }

    fn __repr__(&self) -> String {
        format!("StyleModel({:?})", self.path.display().to_string())
    }
}

/// Runs a style-transfer network over an image of any size with BSP tiling.
///
/// ``image``: ``uint8`` array ``(H, W, 3)``. ``model``: a :class:`StyleModel` or a path to its
/// safetensors (loaded with ``padding``). ``mode``: ``"exact"`` (halo exchange and synchronised
/// normalisation statistics: equal to running the whole image at once), ``"sampled"`` /
/// ``"sampled:N"``, ``"recompute"``, ``"naive"`` (independent tiles, visible seams) or ``"whole"``.
/// ``tile``: tile side in pixels (a multiple of 4; default 512 on the CPU, 2048 on a GPU).
/// ``ram_budget_mib``: activations kept in RAM by ``exact`` before layers spill to memory-mapped files in
/// ``spill_dir``. Returns ``uint8`` ``(H, W, 3)`` — or PyTorch's output size (each side rounded up to a
/// multiple of 4) with ``full=True``.
///
/// ``device``: ``"cpu"`` (the reference backend), ``"cuda"`` or ``"cuda:N"`` (bsp-tiling's CUDA backend;
/// ``GpuError`` naming the reason when there is no usable GPU — never a silent CPU run).
/// ``precision``: ``"f32"`` or ``"f16"`` (GEMM operands in half precision on the GPU, f32 accumulation).
/// ``gpu_memory``: bytes of device memory the run may use (default: what is free, less a margin); layers
/// that do not fit stay in host memory and cross the bus tile by tile.
#[pyfunction]
#[pyo3(
    text_signature = "(image, model, *, tile=None, mode=\"exact\", threads=None, padding=None, \
    ram_budget_mib=2048, spill_dir=None, full=False, device=None, precision=\"f32\", gpu_memory=None)"
)]
#[pyo3(signature = (
    image, model, *, tile=None, mode="exact", threads=None, padding=None, ram_budget_mib=2048,
    spill_dir=None, full=false, device=None, precision="f32", gpu_memory=None
))]
#[allow(clippy::too_many_arguments)]
pub fn stylize<'py>(
    py: Python<'py>,
    image: &Bound<'py, PyAny>,
    model: &Bound<'py, PyAny>,
    tile: Option<usize>,
    mode: &str,
    threads: Option<usize>,
    padding: Option<&str>,
    ram_budget_mib: u64,
    spill_dir: Option<PathBuf>,
    full: bool,
    device: Option<Bound<'py, PyAny>>,
    precision: &str,
    gpu_memory: Option<u64>,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    let Some(mode) = Mode::parse(mode) else {
        return Err(raise(
            py,
            Kind::Options,
            format!(
                "mode={mode:?}: expected \"exact\", \"sampled\", \"sampled:N\", \"recompute\", \"naive\" or \"whole\""
            ),
        ));
    };
    let net = match model.cast::<StyleModel>() {
        Ok(m) => {
            if padding.is_some() {
                return Err(raise(
                    py,
                    Kind::Options,
                    "padding is chosen when a StyleModel is loaded: StyleModel(path, padding=...)",
                ));
            }
            m.get().net.clone()
        }
        Err(_) => {
            let path: PathBuf = model.extract().map_err(|_| {
                raise(
                    py,
                    Kind::Options,
                    "model: expected a StyleModel or a path to safetensors weights",
                )
            })?;
            StyleModel::new(py, path, padding.unwrap_or("reflect"))?.net
        }
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
    let dev = device_options(py, device.as_ref(), precision, gpu_memory)?;
    let defaults = Options::default();
    let opts = Options {
        mode,
        tile: tile.unwrap_or(bsp_tiling::default_tile(dev.device)),
        threads: threads.unwrap_or(defaults.threads).max(1),
        budget: Budget {
            ram: ram_budget_mib << 20,
            disk: None,
            spill_dir: spill_dir.unwrap_or_else(std::env::temp_dir),
        },
    };
    let out = detached(py, move || {
        let input = Image::rgb8(w as u32, h as u32, pixels);
        let (out, _info) = bsp_tiling::stylize_on(&dev, &net, &input, &opts, true)
            .map_err(|e| gpu_words(&dev, e))?;
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

/// `device=`, `precision=`, `gpu_memory=` as bsp-tiling's [`DeviceOptions`], checked here so that a
/// refusal names the keyword arguments (bsp-tiling words its own checks for the command line).
pub(crate) fn device_options(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
    precision: &str,
    gpu_memory: Option<u64>,
) -> PyResult<DeviceOptions> {
    let device = match device {
        Some(d) => crate::options::device(d)?,
        None => Device::Cpu,
    };
    let opt_err = |m: String| raise(py, Kind::Options, m);
    let precision = match precision {
        "f32" => Precision::F32,
        "f16" => Precision::F16,
        p => {
            return Err(opt_err(format!(
                "precision={p:?}: expected \"f32\" or \"f16\""
            )));
        }
    };
    if device == Device::Cpu {
        if precision != Precision::F32 {
            return Err(opt_err(
                "precision=\"f16\" needs device=\"cuda\": the CPU backend computes in f32".into(),
            ));
        }
        if gpu_memory.is_some() {
            return Err(opt_err(
                "gpu_memory= budgets a GPU: use it with device=\"cuda\" (the CPU's is ram_budget_mib=)"
                    .into(),
            ));
        }
    }
    Ok(DeviceOptions {
        device,
        gpu_memory,
        precision,
    })
}

/// A bsp-tiling error as a [`Failure`], with the command-line flags its device errors mention
/// (`--device cuda`, `--gpu-memory`) replaced by the keyword arguments of this call.
fn gpu_words(dev: &DeviceOptions, e: bsp_tiling::Error) -> Failure {
    gpu_words_of(dev, Failure::from(e))
}

/// [`gpu_words`] on a failure already made.
pub(crate) fn gpu_words_of(dev: &DeviceOptions, mut f: Failure) -> Failure {
    if f.kind == Kind::Gpu || f.message.contains("--gpu-memory") {
        f.message = f
            .message
            .replacen("--device cuda", &format!("device=\"{}\"", dev.device), 1)
            .replace("--gpu-memory", "gpu_memory=");
    }
    f
}
