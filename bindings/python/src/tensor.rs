//! `l3toolkit.Tensor`: a batch tensor exported through DLPack without a copy.
//!
//! Every `__dlpack__` call hands out a fresh managed tensor whose data pointer is the batch buffer itself
//! (`loader::Tensor::as_ptr`) and whose manager context is one more reference to that buffer: the
//! memory stays valid while the Python `Tensor` or any consumer (NumPy, PyTorch, JAX) holds it, and
//! returns to the loader's pool once the last of them lets go.

use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLManagedTensor, DLManagedTensorVersioned,
};
use dlpark::metadata::Fixed;
use dlpark::python::{DlpackExporter, ExportRequest, export_dlpack};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use loader::DType;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use std::ffi::c_void;
use std::sync::Arc;

/// A dense batch of images: ``(N, 3, H, W)`` (NCHW) or ``(N, H, W, 3)`` (NHWC), ``uint8``, ``float16``
/// or ``float32``, in 64-byte-aligned memory owned by the loader.
///
/// It exports ``__dlpack__`` / ``__dlpack_device__``, so ``torch.from_dlpack(t)``,
/// ``numpy.from_dlpack(t)`` and ``jax.dlpack.from_dlpack(t)`` view the same memory without a copy
/// (``np.asarray(t)`` too). The memory is recycled by the loader once this object and every array made
/// from it are gone; writing into such an array writes into the batch.
#[pyclass(frozen, module = "l3toolkit")]
pub struct Tensor {
    inner: Arc<loader::Tensor>,
}

impl Tensor {
    pub fn new(t: loader::Tensor) -> Tensor {
        Tensor { inner: Arc::new(t) }
    }

    /// Strides in elements of the dense row-major tensor.
    fn strides(&self) -> [usize; 4] {
        let s = self.inner.shape();
        [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1]
    }

    fn dl_dtype(&self) -> DLDataType {
        match self.inner.dtype() {
            DType::U8 => DLDataType::U8,
            DType::F16 => DLDataType::scalar(DLDataTypeCode::FLOAT, 16),
            DType::F32 => DLDataType::F32,
        }
    }

    /// A fresh managed tensor over the batch buffer, owning one more reference to it.
    fn managed<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let mut t = Fixed::new(self.inner.shape(), self.strides())
            .initialize_as::<M>(self.inner.clone())
            .map_err(|e| PyBufferError::new_err(format!("DLPack export: {e}")))?;
        t.set_data(self.inner.as_ptr() as *mut c_void)
            .set_dtype(self.dl_dtype())
            .set_device(DlpackExporter::device(self));
        // SAFETY: the data pointer is the start of the buffer of `shape` × `dtype` bytes held by the
        // context installed above (an `Arc` of the tensor that owns it), so it stays valid until the
        // consumer calls the deleter; shape and strides were copied into the managed allocation by
        // `Fixed::new` (explicit, dense row-major strides); no flag is set: the memory is writable and
        // this is not a copy.
        Ok(unsafe { t.finish() })
    }
}

impl DlpackExporter for Tensor {
    fn device(&self) -> DLDevice {
        DLDevice::CPU
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    /// Host batches are complete when delivered: there is nothing for a consumer stream to wait for.
    fn prepare_export(&self, _py: Python<'_>, _request: &ExportRequest<'_>) -> PyResult<()> {
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.managed()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.managed()
    }
}

#[pymethods]
impl Tensor {
    /// The DLPack capsule of this tensor (the Python array API's ``__dlpack__``): a zero-copy view.
    /// ``copy=True`` and cross-device requests are refused with ``BufferError``.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        export_dlpack(self, py, request)
    }

    /// ``(device_type, device_id)`` as DLPack numbers them: ``(1, 0)`` for host memory.
    fn __dlpack_device__(&self) -> (u32, i32) {
        let d = DlpackExporter::device(self);
        (d.device_type.0, d.device_id)
    }

    /// ``numpy.from_dlpack(self)``: a NumPy view of the batch (no copy).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let np = slf.py().import("numpy")?;
        np.call_method1("from_dlpack", (slf,))
    }

    /// ``numpy.asarray(tensor)``: the same view as :meth:`numpy`; converted when ``dtype`` differs
    /// (refused with ``ValueError`` under ``copy=False``), copied with ``copy=True``.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = Self::numpy(slf)?;
        let mut a = view.clone();
        if let Some(d) = dtype {
            let kwargs = pyo3::types::PyDict::new(slf.py());
            kwargs.set_item("copy", false)?;
            a = a.call_method("astype", (&d,), Some(&kwargs))?;
            if copy == Some(false) && !a.is(&view) {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "converting the batch to {d} needs a copy, and copy=False was asked for"
                )));
            }
        }
        if copy == Some(true) && a.is(&view) {
            a = a.call_method0("copy")?;
        }
        Ok(a)
    }

    /// ``(N, 3, H, W)`` for NCHW, ``(N, H, W, 3)`` for NHWC.
    #[getter]
    fn shape(&self) -> (usize, usize, usize, usize) {
        let s = self.inner.shape();
        (s[0], s[1], s[2], s[3])
    }

    /// ``"uint8"``, ``"float16"`` or ``"float32"``.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    /// ``"NCHW"`` or ``"NHWC"``.
    #[getter]
    fn layout(&self) -> &'static str {
        self.inner.layout().name()
    }

    /// Where the elements are: ``"cpu"``.
    #[getter]
    fn device(&self) -> &'static str {
        "cpu"
    }

    /// Address of the first element: the pointer every DLPack export of this tensor carries.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.as_ptr() as usize
    }

    /// Bytes of the tensor.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.len() * self.inner.dtype().size()
    }

    fn __len__(&self) -> usize {
        self.inner.shape()[0]
    }

    fn __repr__(&self) -> String {
        let s = self.inner.shape();
        format!(
            "Tensor(shape=({}, {}, {}, {}), dtype={}, layout={}, device=cpu)",
            s[0],
            s[1],
            s[2],
            s[3],
            self.inner.dtype().name(),
            self.inner.layout().name()
        )
    }
}
