//! `decode_batch`: a list of L3 buffers from someone else's pipeline (WebDataset, DALI, a custom
//! `Dataset`) decoded into one DLPack [`Tensor`] — or a list of them, for mixed sizes — by the loader's
//! [`loader::decode_buffers`] (its CPU decode path on `stdx::parallel` threads, or `l3-cuda`).

use crate::codec::Data;
use crate::errors::{Failure, Kind, detached, raise};
use crate::options::{device, invalid};
use crate::tensor::Tensor;
use loader::{BufferBatch, BufferOptions, L3Buffer, parse_setting};
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::path::PathBuf;
use vocab::{DType, Layout, Rect};

/// `windows[i]`: `None` (the whole image) or `(top, left, height, width)`, as `Batch.windows` rows.
fn window(i: usize, w: &Bound<'_, PyAny>) -> PyResult<Option<Rect>> {
    if w.is_none() {
        return Ok(None);
    }
    let (top, left, height, width): (u32, u32, u32, u32) = w.extract().map_err(|_| {
        raise(
            w.py(),
            Kind::Options,
            format!(
                "windows[{i}] = {}: expected None or (top, left, height, width), non-negative ints",
                w.repr().map_or_else(|_| "?".into(), |r| r.to_string())
            ),
        )
    })?;
    Ok(Some(Rect::new(left, top, width, height)))
}

/// Decodes a list of L3 files into one tensor: ``(N, C, H, W)`` (``layout="NCHW"``) or
/// ``(N, H, W, C)`` (``"NHWC"``) when every sample has the same shape, else a list of such tensors of
/// one sample each, in order (like torchvision's ``decode_jpeg(list)``).
///
/// ``buffers``: a list of the files' bytes (read in place), other bytes-like objects (memoryview,
/// bytearray, a ``uint8`` NumPy array: copied once) or paths. ``windows``: ``None`` (whole images) or
/// one entry per buffer, ``None`` or ``(top, left, height, width)`` in image pixels (the rows of
/// ``Batch.windows``); only the patches under a window are decoded. ``dtype``: ``"uint8"``,
/// ``"float16"`` or ``"float32"`` (floats hold pixel / 255). ``channels``: ``None`` keeps each file's
/// (1, 3 or 4), or 1 / 3 / 4 converts as the :class:`Loader` does. ``device``: ``None`` or ``"cpu"`` (``threads``
/// decode threads, default every core, the loader's CPU decode path) or ``"cuda"`` / ``"cuda:N"``
/// (one ``l3-cuda`` launch per batch of one shape, the loader's GPU kernels; the tensor stays in device
/// memory). With no usable GPU, ``device="cuda"`` raises ``GpuError`` saying why; it never decodes on
/// the CPU instead. A corrupt file raises ``FormatError`` naming it; a window outside its image,
/// ``OptionsError``.
#[pyfunction]
#[pyo3(signature = (buffers, *, device=None, windows=None, layout="NCHW", dtype="uint8", channels=None, threads=None))]
#[allow(clippy::too_many_arguments)]
pub fn decode_batch<'py>(
    py: Python<'py>,
    buffers: &Bound<'py, PyAny>,
    device: Option<&Bound<'py, PyAny>>,
    windows: Option<&Bound<'py, PyAny>>,
    layout: &str,
    dtype: &str,
    channels: Option<u8>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = BufferOptions {
        layout: parse_setting::<Layout>("layout", layout).map_err(|e| invalid(py, e))?,
        dtype: parse_setting::<DType>("dtype", dtype).map_err(|e| invalid(py, e))?,
        normalize: None,
        channels,
        device: device.map_or(Ok(vocab::Device::Cpu), self::device)?,
        threads: threads.unwrap_or(0),
    };
    let given: Vec<Data> = buffers
        .try_iter()
        .map_err(|_| {
            raise(
                py,
                Kind::Options,
                "buffers: expected a list of L3 buffers (bytes, bytes-like objects or paths)",
            )
        })?
        .enumerate()
        .map(|(i, b)| Data::extract_named(&b?, &format!("buffers[{i}]: ")))
        .collect::<PyResult<_>>()?;
    let rects: Vec<Option<Rect>> = match windows {
        None => vec![None; given.len()],
        Some(w) if w.is_none() => vec![None; given.len()],
        Some(w) => {
            let list: Vec<Bound<PyAny>> = w.try_iter()?.collect::<PyResult<_>>()?;
            if list.len() != given.len() {
                return Err(raise(
                    py,
                    Kind::Options,
                    format!(
                        "windows: {} windows for {} buffers (give one per buffer, None for a whole image)",
                        list.len(),
                        given.len()
                    ),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, w)| window(i, w))
                .collect::<PyResult<_>>()?
        }
    };
    let names: Vec<PathBuf> = given
        .iter()
        .enumerate()
        .map(|(i, g)| match g {
            Data::Path(p) => p.clone(),
            _ => PathBuf::from(format!("buffers[{i}]")),
        })
        .collect();
    let borrowed: Vec<Option<&[u8]>> = given
        .iter()
        .map(|g| match g {
            Data::Bytes(b) => Some(b.as_bytes()),
            Data::Path(_) => None,
        })
        .collect();
    let out = detached(py, || {
        let read: Vec<Option<Vec<u8>>> = names
            .iter()
            .zip(&borrowed)
            .map(|(p, b)| match b {
                Some(_) => Ok(None),
                None => stdx::fs::read_regular(p, loader::max_image_bytes())
                    .map(Some)
                    .map_err(|e| Failure::io(p, &e)),
            })
            .collect::<Result<_, Failure>>()?;
        let items: Vec<L3Buffer> = (0..names.len())
            .map(|i| L3Buffer {
                bytes: borrowed[i].unwrap_or_else(|| read[i].as_deref().unwrap_or_default()),
                name: &names[i],
                window: rects[i],
            })
            .collect();
        Ok(loader::decode_buffers(&items, &opts)?)
    })?;
    match out {
        BufferBatch::Stacked(t) => Ok(Bound::new(py, Tensor::new(t))?.into_any()),
        BufferBatch::Each(ts) => {
            let list = ts
                .into_iter()
                .map(|t| Bound::new(py, Tensor::new(t)))
                .collect::<PyResult<Vec<_>>>()?;
            Ok(PyList::new(py, list)?.into_any())
        }
    }
}
