//! `l3toolkit.stylize`: bsp-tiling's tiled style transfer on a NumPy image, and `StyleModel` (loaded
//! weights, reusable across calls). A thin layer over `bsp_tiling::stylize` on its CPU backend.

use crate::errors::{Failure, Kind, detached, raise};
use bsp_tiling::{Budget, CpuBackend, Mode, Net, Options, Output, PaddingMode, Rgb8};
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
/// ``tile``: tile side in pixels (a multiple of 4, default 512). ``ram_budget_mib``: activations kept in
/// RAM by ``exact`` before layers spill to memory-mapped files in ``spill_dir``. Returns ``uint8``
/// ``(H, W, 3)`` — or PyTorch's output size (each side rounded up to a multiple of 4) with ``full=True``.
#[pyfunction]
#[pyo3(signature = (
    image, model, *, tile=None, mode="exact", threads=None, padding=None, ram_budget_mib=2048,
    spill_dir=None, full=false
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
    let defaults = Options::default();
    let opts = Options {
        mode,
        tile: tile.unwrap_or(defaults.tile),
        threads: threads.unwrap_or(defaults.threads).max(1),
        budget: Budget {
            ram: ram_budget_mib << 20,
            disk: None,
            spill_dir: spill_dir.unwrap_or_else(std::env::temp_dir),
        },
    };
    let out = detached(py, move || {
        let input = Rgb8 {
            width: w,
            height: h,
            pixels,
        };
        let (out, _info) = bsp_tiling::stylize(&net, &CpuBackend, &input, &opts, true)?;
        let Output::Rgb8(o) = out else {
            return Err(Failure::new(
                Kind::Base,
                "internal: bsp_tiling returned a float output for an 8-bit request",
            ));
        };
        if full || (o.width, o.height) == (w, h) {
            return Ok((o.pixels, o.height, o.width));
        }
        let mut px = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            px.extend_from_slice(&o.pixels[y * o.width * 3..(y * o.width + w) * 3]);
        }
        Ok((px, h, w))
    })?;
    let (px, oh, ow) = out;
    PyArray1::from_vec(py, px).reshape(vec![oh, ow, 3])
}
