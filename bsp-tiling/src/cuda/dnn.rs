//! Convolutions through cuDNN (9, loaded at run time as PyTorch ships it): the implicit-GEMM kernels
//! PyTorch's own convolutions run, without building im2col columns in device memory.
//!
//! A graph convolution here is *valid* over its gathered window (padding is the window's), with groups,
//! per-axis stride and dilation: cuDNN's cross-correlation with no padding. The arithmetic follows the
//! backend's [`Precision`], as PyTorch sets it for the same choice:
//! - f32: cuDNN's FMA math (no TF32, no tensor-op down-conversion), so that the numbers are f32 products
//!   and sums as the im2col path's are, in another order; `y = conv(x, w) + y` onto the bias.
//! - TF32: f32 tensors, cuDNN's default math (TF32 tensor cores on Ampere and later), as PyTorch's
//!   `allow_tf32 = True`; `y = conv + y` likewise.
//! - f16: binary16 window, weights and result, f32 arithmetic inside (cuDNN's "pseudo-half"
//!   configuration; no cuDNN configuration writes binary16 products to an f32 output), tensor-op math.
//!   The caller adds the binary16 result onto the f32 bias, so this path rounds each convolution's sum to
//!   binary16 once more than the im2col path does (as PyTorch in half does at every layer).
//!
//! The algorithm is cuDNN's first by its heuristics among the deterministic ones of the precision's math
//! (never a down-conversion) whose workspace the device budget leaves room for; where none is, or a
//! tensor is past cuDNN's 32-bit sizes, the caller runs im2col.

use super::CudaBackend;
use crate::device::Precision;
use crate::error::{Error, Result};
use crate::graph::ops::ConvOp;
use crate::meter::Lease;
use cudarc::cudnn::{result, sys};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
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

/// How a precision runs in cuDNN: the tensors' data type, the math type asked for, and whether an
/// algorithm of math type `m` computes in that precision. The convolution's compute type is f32 in all.
struct Arithmetic {
    data: sys::cudnnDataType_t,
    math: sys::cudnnMathType_t,
}

impl Arithmetic {
    fn of(p: Precision) -> Arithmetic {
        use sys::cudnnDataType_t::{CUDNN_DATA_FLOAT, CUDNN_DATA_HALF};
        use sys::cudnnMathType_t::{CUDNN_DEFAULT_MATH, CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH};
        let (data, math) = match p {
            Precision::F32 => (CUDNN_DATA_FLOAT, CUDNN_FMA_MATH),
            Precision::Tf32 => (CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH),
            Precision::F16 => (CUDNN_DATA_HALF, CUDNN_TENSOR_OP_MATH),
        };
        Arithmetic { data, math }
    }

    /// Whether an algorithm reported with math type `m` computes in this arithmetic: f32 takes FMA
    /// algorithms only; TF32 and f16 take any but those that convert f32 operands down to binary16.
    fn admits(&self, m: sys::cudnnMathType_t) -> bool {
        use sys::cudnnMathType_t::{CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION};
        if self.math == CUDNN_FMA_MATH {
            m == CUDNN_FMA_MATH
        } else {
            m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
        }
    }
}

/// A convolution's descriptors for window `x` (`cin × h × w`) and output `cout × ho × wo` in arithmetic
/// `a`, or `None` when cuDNN cannot take it as given (sizes past its `int`s, or a window that is not
/// exactly the output's receptive field).
fn describe(
    c: &ConvOp,
    (h, w): (usize, usize),
    (ho, wo): (usize, usize),
    a: &Arithmetic,
) -> Result<Option<Descs>> {
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
        result::set_tensor4d_descriptor(d.x, nchw, a.data, xd)
            .map_err(dnn_err("cudnnSetTensor4dDescriptor"))?;
        result::set_tensor4d_descriptor(d.y, nchw, a.data, yd)
            .map_err(dnn_err("cudnnSetTensor4dDescriptor"))?;
        result::set_filter4d_descriptor(d.w, a.data, nchw, wd)
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
            sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        )
        .map_err(dnn_err("cudnnSetConvolution2dDescriptor"))?;
        result::set_convolution_group_count(d.conv, groups)
            .map_err(dnn_err("cudnnSetConvolutionGroupCount"))?;
        result::set_convolution_math_type(d.conv, a.math)
            .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
    }
    Ok(Some(d))
}

/// One convolution as cuDNN will run it: descriptors, algorithm and leased workspace.
pub(super) struct Plan {
    d: Descs,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    workspace: CudaSlice<u8>,
    bytes: usize,
    _lease: Lease,
}

impl CudaBackend {
    /// How cuDNN runs convolution `c` from window `h × w` to `ho × wo` in the backend's precision, its
    /// workspace leased: `None` when cuDNN is not open here, cannot take this convolution, or has no
    /// algorithm of that arithmetic whose workspace fits what the budget leaves (the caller runs im2col).
    pub(super) fn cudnn_plan(
        &self,
        name: &str,
        c: &ConvOp,
        hw: (usize, usize),
        out: (usize, usize),
    ) -> Result<Option<Plan>> {
        let Ok(dnn) = &self.dnn else {
            return Ok(None);
        };
        let a = Arithmetic::of(self.precision);
        let Some(d) = describe(c, hw, out, &a)? else {
            return Ok(None);
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
                    && a.admits(p.mathType)
                    && (p.memory as u64) < room
            })
        else {
            return Ok(None);
        };
        // The algorithm runs in the math type it was reported with, as PyTorch sets it.
        // SAFETY: the descriptor is valid; the math type is one cuDNN reported for it.
        unsafe { result::set_convolution_math_type(d.conv, p.mathType) }
            .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
        // SAFETY: the descriptors are valid for this algorithm.
        let bytes = unsafe {
            result::get_convolution_forward_workspace_size(dnn.0, d.x, d.w, d.conv, d.y, p.algo)
        }
        .map_err(dnn_err("cudnnGetConvolutionForwardWorkspaceSize"))?;
        // Other leases may have taken the room since: then im2col, whose band narrows to fit.
        let what = format!("the cuDNN workspace of `{name}`");
        let Some((workspace, lease)) = self.try_alloc::<u8>(bytes, &what)? else {
            return Ok(None);
        };
        Ok(Some(Plan {
            d,
            algo: p.algo,
            workspace,
            bytes,
            _lease: lease,
        }))
    }

    /// `y = conv(x, w) + beta · y` as planned. `T` is the plan's data type (f32, or binary16 as `u16`);
    /// the workspace is freed in stream order after the convolution.
    pub(super) fn cudnn_run<T: DeviceRepr>(
        &self,
        plan: Plan,
        x: &CudaSlice<T>,
        w: &CudaSlice<T>,
        beta: f32,
        y: &mut CudaSlice<T>,
    ) -> Result<()> {
        let Ok(dnn) = &self.dnn else {
            return Err(Error::Device("cuDNN is not open".into()));
        };
        let dnn = dnn.lock().unwrap_or_else(|e| e.into_inner());
        let Plan {
            d,
            algo,
            mut workspace,
            bytes,
            _lease,
        } = plan;
        let one = 1.0f32;
        let (xp, _rx) = x.device_ptr(&self.stream);
        let (wp, _rw) = w.device_ptr(&self.stream);
        let (wsp, _rws) = workspace.device_ptr_mut(&self.stream);
        let (yp, _ry) = y.device_ptr_mut(&self.stream);
        // SAFETY: x, w and y hold the elements their descriptors give (the caller sized them from the
        // same dimensions, of the plan's data type), the workspace `bytes`; alpha and beta are f32, as
        // cuDNN reads them for f32 and binary16 data alike.
        unsafe {
            result::convolution_forward(
                dnn.0,
                (&one as *const f32).cast(),
                d.x,
                xp as *const std::ffi::c_void,
                d.w,
                wp as *const std::ffi::c_void,
                d.conv,
                algo,
                wsp as *mut std::ffi::c_void,
                bytes,
                (&beta as *const f32).cast(),
                d.y,
                yp as *mut std::ffi::c_void,
            )
        }
        .map_err(dnn_err("cudnnConvolutionForward"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::ops::AxisPad;
    use crate::win::Win;

    fn conv(cin: usize, cout: usize, groups: usize, win: [(usize, usize, usize); 2]) -> ConvOp {
        let w = |(k, stride, dilation)| Win {
            k,
            stride,
            dilation,
        };
        ConvOp {
            cin,
            cout,
            groups,
            win: [w(win[0]), w(win[1])],
            pad: [AxisPad::Explicit(0, 0); 2],
            output_padding: [0, 0],
            weight: vec![0.0; cout * cin / groups * win[0].0 * win[1].0],
            bias: vec![0.0; cout],
        }
    }

    fn ok(s: sys::cudnnStatus_t, call: &str) {
        assert_eq!(s, sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS, "{call}");
    }

    /// The descriptors `describe` makes are the convolution the graph means, as cuDNN itself reads them
    /// back (its descriptors are host objects: the real libcudnn, no GPU): in each precision the tensors'
    /// and filter's data type and dimensions (the filter's channels those of one group), no padding, the
    /// per-axis stride and dilation in cuDNN's order, cross-correlation, the compute type, the group count
    /// and the math type; cuDNN's own output size is the graph's. A window that is not exactly the
    /// output's receptive field, and sizes past cuDNN's `int`, are not described (im2col takes them).
    #[test]
    fn cudnn_reads_the_descriptors_as_the_graph_means_them() {
        use cuda_setup::testing::{LibraryTest, library_for_test};
        match library_for_test(
            cuda_setup::Library::Cudnn,
            "cuda::dnn::tests::cudnn_reads_the_descriptors_as_the_graph_means_them",
        ) {
            LibraryTest::Here => {}
            LibraryTest::PassedInChild => return,
            LibraryTest::Missing(reason) => return stdx::testing::skip(reason),
        }
        use sys::cudnnDataType_t::{CUDNN_DATA_FLOAT, CUDNN_DATA_HALF};
        use sys::cudnnMathType_t::{CUDNN_DEFAULT_MATH, CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH};
        let cases = [
            // (op, window h × w, output h × w)
            (conv(3, 8, 1, [(9, 1, 1), (9, 1, 1)]), (40, 33), (32, 25)),
            (conv(8, 16, 2, [(3, 2, 1), (5, 1, 2)]), (21, 30), (10, 22)),
            (conv(6, 6, 6, [(3, 1, 3), (1, 3, 1)]), (17, 10), (11, 4)),
            (conv(16, 4, 4, [(2, 3, 2), (4, 2, 3)]), (14, 19), (4, 5)),
        ];
        for p in [Precision::F32, Precision::Tf32, Precision::F16] {
            let a = Arithmetic::of(p);
            let (data, math) = match p {
                Precision::F32 => (CUDNN_DATA_FLOAT, CUDNN_FMA_MATH),
                Precision::Tf32 => (CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH),
                Precision::F16 => (CUDNN_DATA_HALF, CUDNN_TENSOR_OP_MATH),
            };
            for (c, (h, w), (ho, wo)) in &cases {
                let what = format!("{p} {}→{} groups {} {:?}", c.cin, c.cout, c.groups, c.win);
                let d = describe(c, (*h, *w), (*ho, *wo), &a)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{what}: not described"));
                let mut t = [0 as c_int; 8];
                let mut dt = sys::cudnnDataType_t::CUDNN_DATA_DOUBLE;
                // SAFETY: valid descriptors; every out-pointer is to a local of the right type.
                unsafe {
                    let [n, ch, th, tw, ns, cs, hs, ws] = &mut t;
                    ok(
                        sys::cudnnGetTensor4dDescriptor(
                            d.x, &mut dt, n, ch, th, tw, ns, cs, hs, ws,
                        ),
                        "cudnnGetTensor4dDescriptor",
                    );
                }
                let (hw, cin) = ((h * w) as c_int, c.cin as c_int);
                assert_eq!(dt, data, "{what}: x");
                assert_eq!(
                    t,
                    [
                        1,
                        cin,
                        *h as c_int,
                        *w as c_int,
                        cin * hw,
                        hw,
                        *w as c_int,
                        1
                    ],
                    "{what}: x"
                );
                let mut f = [0 as c_int; 4];
                let mut fmt = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC;
                // SAFETY: as above.
                unsafe {
                    let [k, ch, fh, fw] = &mut f;
                    ok(
                        sys::cudnnGetFilter4dDescriptor(d.w, &mut dt, &mut fmt, k, ch, fh, fw),
                        "cudnnGetFilter4dDescriptor",
                    );
                }
                assert_eq!(dt, data, "{what}: w");
                assert_eq!(fmt, sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, "{what}");
                let want_f = [c.cout, c.cin / c.groups, c.win[0].k, c.win[1].k].map(|v| v as c_int);
                assert_eq!(f, want_f, "{what}: w");
                let mut g = [0 as c_int; 6];
                let mut mode = sys::cudnnConvolutionMode_t::CUDNN_CONVOLUTION;
                let (mut groups, mut m) = (0 as c_int, CUDNN_TENSOR_OP_MATH);
                // SAFETY: as above.
                unsafe {
                    let [ph, pw, u, v, dh, dw] = &mut g;
                    ok(
                        sys::cudnnGetConvolution2dDescriptor(
                            d.conv, ph, pw, u, v, dh, dw, &mut mode, &mut dt,
                        ),
                        "cudnnGetConvolution2dDescriptor",
                    );
                    ok(
                        sys::cudnnGetConvolutionGroupCount(d.conv, &mut groups),
                        "cudnnGetConvolutionGroupCount",
                    );
                    ok(
                        sys::cudnnGetConvolutionMathType(d.conv, &mut m),
                        "cudnnGetConvolutionMathType",
                    );
                }
                let [wy, wx] = &c.win;
                let want_g = [0, 0, wy.stride, wx.stride, wy.dilation, wx.dilation];
                assert_eq!(
                    g,
                    want_g.map(|v| v as c_int),
                    "{what}: padding, stride, dilation"
                );
                assert_eq!(
                    mode,
                    sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    "{what}"
                );
                assert_eq!(dt, CUDNN_DATA_FLOAT, "{what}: compute type");
                assert_eq!((groups, m), (c.groups as c_int, math), "{what}");
                let mut o = [0 as c_int; 4];
                // SAFETY: as above.
                unsafe {
                    let [n, ch, oh, ow] = &mut o;
                    ok(
                        sys::cudnnGetConvolution2dForwardOutputDim(d.conv, d.x, d.w, n, ch, oh, ow),
                        "cudnnGetConvolution2dForwardOutputDim",
                    );
                    let (mut n2, mut c2, mut h2, mut w2, mut s) = (0, 0, 0, 0, [0 as c_int; 4]);
                    let [s0, s1, s2, s3] = &mut s;
                    ok(
                        sys::cudnnGetTensor4dDescriptor(
                            d.y, &mut dt, &mut n2, &mut c2, &mut h2, &mut w2, s0, s1, s2, s3,
                        ),
                        "cudnnGetTensor4dDescriptor",
                    );
                    assert_eq!((dt, [n2, c2, h2, w2]), (data, o), "{what}: y");
                }
                assert_eq!(
                    o,
                    [1, c.cout as c_int, *ho as c_int, *wo as c_int],
                    "{what}: output"
                );
            }
            // A window a row or a column off the output's field, or sizes past `int`: not cuDNN's.
            let c0 = &cases[0].0;
            assert!(describe(c0, (41, 33), (32, 25), &a).unwrap().is_none());
            assert!(describe(c0, (40, 33), (32, 26), &a).unwrap().is_none());
            assert!(
                describe(c0, (40, 1 << 31), (32, (1 << 31) - 8), &a)
                    .unwrap()
                    .is_none()
            );
        }
    }
}
