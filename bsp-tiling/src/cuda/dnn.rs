//! Convolutions through cuDNN (9, loaded at run time as PyTorch ships it): the implicit-GEMM kernels
//! PyTorch's own convolutions run, without building im2col columns in device memory.
//!
//! A graph convolution here is *valid* over its gathered window (padding is the window's), with groups,
//! per-axis stride and dilation: cuDNN's cross-correlation with no padding, `y = conv(x, w) + y` onto the
//! bias the output starts from. f32 only, in cuDNN's FMA math (no TF32, no tensor-op down-conversion), so
//! that the numbers are f32 products and sums as the im2col path's are, in another order. The algorithm is
//! cuDNN's first by its heuristics among the deterministic FMA ones whose workspace the device budget
//! leaves room for; where none is, or a tensor is past cuDNN's 32-bit sizes, the caller runs im2col.

use super::{CudaBackend, CudaTensor};
use crate::error::{Error, Result};
use crate::graph::ops::ConvOp;
use cudarc::cudnn::{result, sys};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use std::ffi::c_int;

/// A failed cuDNN call, in cuDNN's words.
fn dnn_err(call: &'static str) -> impl Fn(result::CudnnError) -> Error {
    move |e| Error::Cuda {
        call,
        message: format!("{e:?}"),
    }
}

/// The cuDNN handle of a backend, bound to its stream.
pub(super) struct Dnn(sys::cudnnHandle_t);

// SAFETY: the handle is used under the backend's lock only (`CudaBackend::dnn`), on its one stream.
unsafe impl Send for Dnn {}

impl Dnn {
    /// A handle on `stream`, or why there is none (library missing, or its version does not match).
    pub(super) fn open(stream: &cudarc::driver::CudaStream) -> Result<Dnn> {
        cuda_setup::Library::Cudnn.require()?;
        result::version_check().map_err(dnn_err("cudnnVersionCheck"))?;
        let h = result::create_handle().map_err(dnn_err("cudnnCreate"))?;
        let dnn = Dnn(h);
        // SAFETY: the handle was just created; the stream outlives the backend's use of the handle.
        unsafe { result::set_stream(h, stream.cu_stream() as sys::cudaStream_t) }
            .map_err(dnn_err("cudnnSetStream"))?;
        Ok(dnn)
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        // SAFETY: created by `open`, destroyed once; a failure here has nothing left to tell.
        let _ = unsafe { result::destroy_handle(self.0) };
    }
}

/// The descriptors of one convolution, destroyed with it.
struct Descs {
    x: sys::cudnnTensorDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each was created once below (null where creation stopped early) and is destroyed once.
        unsafe {
            if !self.x.is_null() {
                let _ = result::destroy_tensor_descriptor(self.x);
            }
            if !self.y.is_null() {
                let _ = result::destroy_tensor_descriptor(self.y);
            }
            if !self.w.is_null() {
                let _ = result::destroy_filter_descriptor(self.w);
            }
            if !self.conv.is_null() {
                let _ = result::destroy_convolution_descriptor(self.conv);
            }
        }
    }
}

/// `v` as cuDNN's `int`, or `None` past it.
fn int(v: usize) -> Option<c_int> {
    c_int::try_from(v).ok()
}

/// A convolution's descriptors for window `x` (`cin × h × w`) and output `cout × ho × wo`, or `None` when
/// cuDNN cannot take it as given (sizes past its `int`s, or a window that is not exactly the output's
/// receptive field).
fn describe(c: &ConvOp, (h, w): (usize, usize), (ho, wo): (usize, usize)) -> Result<Option<Descs>> {
    let field = |n: usize, axis: usize| {
        let win = &c.win[axis];
        let span = (win.k - 1) * win.dilation + 1;
        n >= span && (n - span) / win.stride + 1 == if axis == 0 { ho } else { wo }
    };
    let elems = |a: usize, b: usize, d: usize| a.checked_mul(b)?.checked_mul(d).and_then(int);
    let dims = (|| {
        Some((
            [1, int(c.cin)?, int(h)?, int(w)?],
            [1, int(c.cout)?, int(ho)?, int(wo)?],
            [
                int(c.cout)?,
                int(c.cin / c.groups.max(1))?,
                int(c.win[0].k)?,
                int(c.win[1].k)?,
            ],
            [int(c.win[0].stride)?, int(c.win[1].stride)?],
            [int(c.win[0].dilation)?, int(c.win[1].dilation)?],
            int(c.groups)?,
            elems(c.cin, h, w)?,
            elems(c.cout, ho, wo)?,
        ))
    })();
    let Some((xd, yd, wd, stride, dilation, groups, _, _)) = dims else {
        return Ok(None);
    };
    if !field(h, 0) || !field(w, 1) {
        return Ok(None);
    }
    let f32t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
    let mut d = Descs {
        x: std::ptr::null_mut(),
        y: std::ptr::null_mut(),
        w: std::ptr::null_mut(),
        conv: std::ptr::null_mut(),
    };
    d.x = result::create_tensor_descriptor().map_err(dnn_err("cudnnCreateTensorDescriptor"))?;
    d.y = result::create_tensor_descriptor().map_err(dnn_err("cudnnCreateTensorDescriptor"))?;
    d.w = result::create_filter_descriptor().map_err(dnn_err("cudnnCreateFilterDescriptor"))?;
    d.conv = result::create_convolution_descriptor()
        .map_err(dnn_err("cudnnCreateConvolutionDescriptor"))?;
    // SAFETY: the descriptors were just created; the dimensions fit cuDNN's ints (checked above).
    unsafe {
        result::set_tensor4d_descriptor(d.x, nchw, f32t, xd)
            .map_err(dnn_err("cudnnSetTensor4dDescriptor"))?;
        result::set_tensor4d_descriptor(d.y, nchw, f32t, yd)
            .map_err(dnn_err("cudnnSetTensor4dDescriptor"))?;
        result::set_filter4d_descriptor(d.w, f32t, nchw, wd)
            .map_err(dnn_err("cudnnSetFilter4dDescriptor"))?;
        result::set_convolution2d_descriptor(
            d.conv,
            0,
            0,
            stride[0],
            stride[1],
            dilation[0],
            dilation[1],
            sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            f32t,
        )
        .map_err(dnn_err("cudnnSetConvolution2dDescriptor"))?;
        result::set_convolution_group_count(d.conv, groups)
            .map_err(dnn_err("cudnnSetConvolutionGroupCount"))?;
        result::set_convolution_math_type(d.conv, sys::cudnnMathType_t::CUDNN_FMA_MATH)
            .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
    }
    Ok(Some(d))
}

impl CudaBackend {
    /// `out += conv(x, w)` through cuDNN (`out` holds the bias): `Ok(false)` when cuDNN is not open here
    /// or cannot take this convolution (the caller runs im2col), `Ok(true)` once it ran.
    pub(super) fn cudnn_conv(
        &self,
        name: &str,
        x: &CudaTensor,
        c: &ConvOp,
        w: &cudarc::driver::CudaSlice<f32>,
        out: &mut CudaTensor,
    ) -> Result<bool> {
        let Ok(dnn) = &self.dnn else {
            return Ok(false);
        };
        let Some(d) = describe(c, (x.h, x.w), (out.h, out.w))? else {
            return Ok(false);
        };
        let dnn = dnn.lock().unwrap_or_else(|e| e.into_inner());
        let mut perf = [sys::cudnnConvolutionFwdAlgoPerf_t {
            algo: sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            status: sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED,
            time: 0.0,
            memory: 0,
            determinism: sys::cudnnDeterminism_t::CUDNN_NON_DETERMINISTIC,
            mathType: sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            reserved: [0; 3],
        }; 8];
        let mut n: c_int = 0;
        // SAFETY: the descriptors are valid and `perf` holds the 8 results asked for.
        unsafe {
            result::get_convolution_forward_algorithm(
                dnn.0,
                d.x,
                d.w,
                d.conv,
                d.y,
                perf.len() as c_int,
                &mut n,
                perf.as_mut_ptr(),
            )
        }
        .map_err(dnn_err("cudnnGetConvolutionForwardAlgorithm_v7"))?;
        let room = self.meter.available();
        let Some(p) = perf[..usize::try_from(n).unwrap_or(0).min(perf.len())]
            .iter()
            .find(|p| {
                p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                    && p.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC
                    && p.mathType == sys::cudnnMathType_t::CUDNN_FMA_MATH
                    && (p.memory as u64) < room
            })
        else {
            return Ok(false);
        };
        // SAFETY: the descriptors are valid for this algorithm.
        let bytes = unsafe {
            result::get_convolution_forward_workspace_size(dnn.0, d.x, d.w, d.conv, d.y, p.algo)
        }
        .map_err(dnn_err("cudnnGetConvolutionForwardWorkspaceSize"))?;
        let (mut ws, _lease) =
            self.alloc::<u8>(bytes, &format!("the cuDNN workspace of `{name}`"))?;
        let (one, also): (f32, f32) = (1.0, 1.0);
        {
            let (xp, _rx) = x.data.device_ptr(&self.stream);
            let (wp, _rw) = w.device_ptr(&self.stream);
            let (wsp, _rws) = ws.device_ptr_mut(&self.stream);
            let (yp, _ry) = out.data.device_ptr_mut(&self.stream);
            // SAFETY: x, w and y hold the elements their descriptors give (sized from the same
            // dimensions), the workspace `bytes`; alpha and beta are f32 for f32 data.
            unsafe {
                result::convolution_forward(
                    dnn.0,
                    (&one as *const f32).cast(),
                    d.x,
                    xp as *const std::ffi::c_void,
                    d.w,
                    wp as *const std::ffi::c_void,
                    d.conv,
                    p.algo,
                    wsp as *mut std::ffi::c_void,
                    bytes,
                    (&also as *const f32).cast(),
                    d.y,
                    yp as *mut std::ffi::c_void,
                )
            }
            .map_err(dnn_err("cudnnConvolutionForward"))?;
        }
        // The workspace is freed in stream order after the convolution.
        drop(ws);
        Ok(true)
    }
}
