//! `l3toolkit.Tensor`: a batch tensor exported through DLPack without a copy.
//!
//! Every `__dlpack__` call hands out a fresh managed tensor whose data pointer is the batch memory itself
//! (the host buffer, or the device output of the GPU's launch) and whose manager context is one more
//! reference to it: the memory stays valid while the Python `Tensor` or any consumer (NumPy, PyTorch,
//! JAX) holds it, and returns to the loader's pool (host) or is freed (device) once the last of them lets
//! go. A device batch makes the consumer's stream wait for its decode (DLPack's `stream` argument), and
//! is freed only after the work queued on every such stream.
//!
//! One exporter does this for both arrays a batch hands out, the images ([`Tensor`]) and the label maps
//! ([`Masks`]): [`Exporter`], over anything that says its dense shape, element type, device and first
//! element ([`DlpackSource`]).

use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
};
use dlpark::metadata::Fixed;
use dlpark::python::{CudaStreamRequest, DlpackExporter, ExportRequest, export_dlpack};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use l3_cuda::cudarc::driver::sys::CUstream;
use loader::{DType, Device};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use std::ffi::c_void;
use std::sync::Arc;

/// What the DLPack exporter needs from a batch's buffer: a dense row-major array of `N` dimensions in
/// host memory or in the memory of the CUDA device whose decode filled it.
trait DlpackSource<const N: usize>: Send + Sync + 'static {
    fn dims(&self) -> [usize; N];
    fn dl_dtype(&self) -> DLDataType;
    fn device(&self) -> Device;
    /// The first element in host memory, `None` for a device buffer.
    fn host_ptr(&self) -> Option<*const u8>;
    /// The device batch, `None` for a host buffer.
    fn cuda(&self) -> Option<&l3_cuda::DecodedBatch>;
}

impl DlpackSource<4> for loader::Tensor {
    fn dims(&self) -> [usize; 4] {
        self.shape()
    }
    fn dl_dtype(&self) -> DLDataType {
        match self.dtype() {
            DType::U8 => DLDataType::U8,
            DType::F16 => DLDataType::scalar(DLDataTypeCode::FLOAT, 16),
            DType::F32 => DLDataType::F32,
        }
    }
    fn device(&self) -> Device {
        loader::Tensor::device(self)
    }
    fn host_ptr(&self) -> Option<*const u8> {
        self.as_ptr()
    }
    fn cuda(&self) -> Option<&l3_cuda::DecodedBatch> {
        loader::Tensor::cuda(self)
    }
}

impl DlpackSource<3> for loader::Masks {
    fn dims(&self) -> [usize; 3] {
        self.shape()
    }
    fn dl_dtype(&self) -> DLDataType {
        if self.is_wide() {
            DLDataType::scalar(DLDataTypeCode::UINT, 16)
        } else {
            DLDataType::U8
        }
    }
    fn device(&self) -> Device {
        loader::Masks::device(self)
    }
    fn host_ptr(&self) -> Option<*const u8> {
        self.as_ptr()
    }
    fn cuda(&self) -> Option<&l3_cuda::DecodedBatch> {
        loader::Masks::cuda(self)
    }
}

/// The one DLPack exporter: a managed tensor per `__dlpack__` call over the buffer itself, owning one
/// more reference to it.
struct Exporter<'a, B, const N: usize>(&'a Arc<B>);

impl<B: DlpackSource<N>, const N: usize> Exporter<'_, B, N> {
    /// Address of the first element: in host memory, or on the device.
    fn address(&self) -> usize {
        match (self.0.host_ptr(), self.0.cuda()) {
            (Some(p), _) => p as usize,
            (None, Some(b)) => b.device_ptr() as usize,
            (None, None) => 0,
        }
    }

    /// ``"cpu"`` or ``"cuda:N"``.
    fn device_name(&self) -> String {
        match self.0.device() {
            Device::Cpu => "cpu".into(),
            Device::Cuda(n) => format!("cuda:{n}"),
        }
    }

    /// Strides in elements of the dense row-major array.
    fn strides(&self) -> [usize; N] {
        let dims = self.0.dims();
        let mut strides = [1; N];
        for k in (0..N.saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * dims[k + 1];
        }
        strides
    }

    /// A fresh managed tensor over the buffer, owning one more reference to it.
    fn managed<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let mut t = Fixed::new(self.0.dims(), self.strides())
            .initialize_as::<M>(self.0.clone())
            .map_err(|e| PyBufferError::new_err(format!("DLPack export: {e}")))?;
        t.set_data(self.address() as *mut c_void)
            .set_dtype(self.0.dl_dtype())
            .set_device(DlpackExporter::device(self));
        // SAFETY: the data pointer is the start of the host buffer or device allocation of `dims` ×
        // `dtype` bytes held by the context installed above (an `Arc` of the tensor or masks that own
        // it, which free device memory only after the consumers' queued work), so it stays valid until
        // the consumer calls the deleter; shape and strides were copied into the managed allocation by
        // `Fixed::new` (explicit, dense row-major strides); no flag is set: the memory is writable and
        // this is not a copy.
        Ok(unsafe { t.finish() })
    }

    /// The capsule `__dlpack__` returns.
    fn export<'py>(&self, py: Python<'py>, request: ExportRequest<'py>) -> PyResult<Py<PyAny>> {
        export_dlpack(self, py, request)
    }

    /// ``(device_type, device_id)`` as DLPack numbers them.
    fn device_pair(&self) -> (u32, i32) {
        let d = DlpackExporter::device(self);
        (d.device_type.0, d.device_id)
    }
}

impl<B: DlpackSource<N>, const N: usize> DlpackExporter for Exporter<'_, B, N> {
    fn device(&self) -> DLDevice {
        match self.0.device() {
            Device::Cpu => DLDevice::CPU,
            Device::Cuda(n) => DLDevice {
                device_type: DLDeviceType::CUDA,
                device_id: n as i32,
            },
        }
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    /// Host buffers are complete when delivered: there is nothing for a consumer stream to wait for. A
    /// device buffer makes the consumer's stream wait for its decode: the stream passed (a handle, or 1
    /// and 2 for the legacy and per-thread default streams), the legacy default stream when none was
    /// passed, nothing for -1 (the consumer synchronises itself).
    fn prepare_export(&self, _py: Python<'_>, request: &ExportRequest<'_>) -> PyResult<()> {
        let Some(batch) = self.0.cuda() else {
            return Ok(());
        };
        let stream: usize = match request.cuda_stream()? {
            CudaStreamRequest::NoSync => return Ok(()),
            CudaStreamRequest::Omitted | CudaStreamRequest::LegacyDefault => 1,
            CudaStreamRequest::PerThreadDefault => 2,
            CudaStreamRequest::Pointer(p) => p,
        };
        // SAFETY: DLPack's contract: the consumer passes a live stream of the device the buffer is on
        // (or one of CUDA's default-stream sentinels, which are the driver's own CU_STREAM_LEGACY = 1
        // and CU_STREAM_PER_THREAD = 2), and uses the buffer on it.
        unsafe { batch.wait_in(stream as CUstream) }.map_err(|e| {
            PyBufferError::new_err(format!(
                "DLPack export: cannot order the consumer's stream after the decode: {e}"
            ))
        })
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.managed()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.managed()
    }
}

/// A dense batch of images: ``(N, 3, H, W)`` (NCHW) or ``(N, H, W, 3)`` (NHWC), ``uint8``, ``float16``
/// or ``float32``, in 64-byte-aligned host memory owned by the loader (``device == "cpu"``) or in the
/// memory of the GPU that decoded it (``device == "cuda:N"``, from a ``Loader(device="cuda")``).
///
/// It exports ``__dlpack__`` / ``__dlpack_device__``, so ``torch.from_dlpack(t)``,
/// ``numpy.from_dlpack(t)`` (host tensors) and ``jax.dlpack.from_dlpack(t)`` view the same memory
/// without a copy (``np.asarray(t)`` too, on the host). A device tensor makes the consumer's stream wait
/// for its decode, as the DLPack protocol asks, so ``torch.from_dlpack(t)`` is ready to use on the
/// current stream without a host synchronisation. The memory is recycled (host) or freed (device) once
/// this object and every array made from it are gone; writing into such an array writes into the batch.
#[pyclass(frozen, module = "l3toolkit")]
pub struct Tensor {
    inner: Arc<loader::Tensor>,
}

impl Tensor {
    pub fn new(t: loader::Tensor) -> Tensor {
        Tensor { inner: Arc::new(t) }
    }

    fn exporter(&self) -> Exporter<'_, loader::Tensor, 4> {
        Exporter(&self.inner)
    }

    /// The error for asking a device tensor for host memory.
    fn not_on_host(&self, what: &str) -> PyErr {
        PyTypeError::new_err(format!(
            "{what} needs host memory, and this batch is on {}: use torch.from_dlpack(t) (or \
             jax.dlpack.from_dlpack), or a Loader on the CPU",
            self.exporter().device_name()
        ))
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
        self.exporter().export(py, request)
    }

    /// ``(device_type, device_id)`` as DLPack numbers them: ``(1, 0)`` for host memory, ``(2, N)`` for
    /// CUDA device N.
    fn __dlpack_device__(&self) -> (u32, i32) {
        self.exporter().device_pair()
    }

    /// ``numpy.from_dlpack(self)``: a NumPy view of a host batch (no copy); ``TypeError`` for a batch
    /// on a GPU.
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        if slf.get().inner.cuda().is_some() {
            return Err(slf.get().not_on_host("numpy()"));
        }
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

    /// Where the elements are: ``"cpu"`` or ``"cuda:N"``.
    #[getter]
    fn device(&self) -> String {
        self.exporter().device_name()
    }

    /// Whether a host batch is in page-locked memory (``Loader(pin_memory=True)``): ``.cuda(non_blocking=True)``
    /// on it is an asynchronous copy. ``False`` on a GPU.
    #[getter]
    fn pinned(&self) -> bool {
        self.inner.is_pinned()
    }

    /// Address of the first element (host or device): the pointer every DLPack export of this tensor
    /// carries.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.exporter().address()
    }

    /// Bytes of the tensor.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.byte_len()
    }

    /// The elements' raw little-endian bytes in host memory: a copy (for a device batch, after waiting
    /// for its decode).
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let inner = self.inner.clone();
        let bytes = crate::errors::detached(py, move || Ok(inner.to_host()?))?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    fn __len__(&self) -> usize {
        self.inner.shape()[0]
    }

    fn __repr__(&self) -> String {
        let s = self.inner.shape();
        format!(
            "Tensor(shape=({}, {}, {}, {}), dtype={}, layout={}, device={})",
            s[0],
            s[1],
            s[2],
            s[3],
            self.inner.dtype().name(),
            self.inner.layout().name(),
            self.exporter().device_name()
        )
    }
}

/// A batch's label maps: ``(N, H, W)``, ``uint8`` (``uint16`` for 16-bit masks), in 64-byte-aligned host
/// memory owned by the loader, or — from a ``Loader(device="cuda")`` — ``uint8`` in the memory of the GPU
/// that decoded them beside their images (``device == "cuda:N"``); each follows its image's geometry
/// exactly (nearest interpolation, ``ignore_index`` where the sample lies outside the image). Exported
/// like :class:`Tensor`: ``torch.from_dlpack(m)`` views it without a copy (and waits for the decode on
/// the consumer's stream), ``numpy.from_dlpack(m)`` too for host masks.
#[pyclass(frozen, module = "l3toolkit")]
pub struct Masks {
    inner: Arc<loader::Masks>,
}

impl Masks {
    pub fn new(m: loader::Masks) -> Masks {
        Masks { inner: Arc::new(m) }
    }

    fn exporter(&self) -> Exporter<'_, loader::Masks, 3> {
        Exporter(&self.inner)
    }
}

#[pymethods]
impl Masks {
    /// The DLPack capsule of the masks: a zero-copy view.
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
        self.exporter().export(py, request)
    }

    /// ``(device_type, device_id)`` as DLPack numbers them: ``(1, 0)`` for host memory, ``(2, N)`` for
    /// CUDA device N.
    fn __dlpack_device__(&self) -> (u32, i32) {
        self.exporter().device_pair()
    }

    /// ``numpy.from_dlpack(self)``: a NumPy view of host masks (no copy); ``TypeError`` for masks on a
    /// GPU.
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        if slf.get().inner.cuda().is_some() {
            return Err(PyTypeError::new_err(format!(
                "numpy() needs host memory, and these masks are on {}: use torch.from_dlpack(m) (or \
                 jax.dlpack.from_dlpack), or a Loader on the CPU",
                slf.get().exporter().device_name()
            )));
        }
        slf.py()
            .import("numpy")?
            .call_method1("from_dlpack", (slf,))
    }

    /// ``numpy.asarray(masks)``: the view of :meth:`numpy`, converted to ``dtype`` when given.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut a = Self::numpy(slf)?;
        if let Some(d) = dtype {
            a = a.call_method1("astype", (&d,))?;
        }
        if copy == Some(true) {
            a = a.call_method0("copy")?;
        }
        Ok(a)
    }

    /// ``(N, H, W)``.
    #[getter]
    fn shape(&self) -> (usize, usize, usize) {
        let [n, h, w] = self.inner.shape();
        (n, h, w)
    }

    /// ``"uint8"`` or ``"uint16"``.
    #[getter]
    fn dtype(&self) -> &'static str {
        if self.inner.is_wide() {
            "uint16"
        } else {
            "uint8"
        }
    }

    /// Where the values are: ``"cpu"`` or ``"cuda:N"``.
    #[getter]
    fn device(&self) -> String {
        self.exporter().device_name()
    }

    /// The values' raw little-endian bytes in host memory: a copy (for masks on a device, after
    /// waiting for their decode).
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let inner = self.inner.clone();
        let bytes = crate::errors::detached(py, move || Ok(inner.to_host()?))?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    fn __len__(&self) -> usize {
        self.inner.shape()[0]
    }

    fn __repr__(&self) -> String {
        let [n, h, w] = self.inner.shape();
        format!("Masks(shape=({n}, {h}, {w}), dtype={})", self.dtype())
    }
}
