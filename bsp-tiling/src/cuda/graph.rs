//! The graph engine's ops on the CUDA backend ([`GraphOps`]): each node's output range computed from its
//! uploaded windows by the graph kernels of `kernels.cu` — general im2col + the cuBLAS band GEMM per
//! group, transposed convolution as a GEMM `Wᵀ·x` (binary16 operands under f16, as a convolution's) and
//! a col2im scatter in a fixed order, pooling, linear resize, padding values, pixel shuffles, the
//! per-channel affine map, the unary and binary functions and channel concatenation — with the tables and
//! GEMM parameters of [`crate::graph::launch`], which the CPU simulation of the kernels checks against
//! ops.rs. Every buffer takes a lease on the backend's meter.

use super::{CudaBackend, CudaTensor, blas_err, drv, grid};
use crate::device::Precision;
use crate::error::Result;
use crate::field::Part;
use crate::graph::Node;
use crate::graph::exec::{self, GraphOps};
use crate::graph::launch::{self, Gemm, i32_of};
use crate::graph::ops::{self, BinOp, ConvOp, Ctx, Op, Operand, PadOp, PoolOp, ResizeOp, Unary};
use crate::meter::{Lease, Meter};
use crate::stats::ChannelStats;
use crate::tensor::Tensor;
use cudarc::cublas::{Gemm as _, GemmConfig};
use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;

/// The graph kernels, loaded with the backend's module.
pub(super) struct GraphKernels {
    im2col: CudaFunction,
    im2col_f16: CudaFunction,
    col2im: CudaFunction,
    unary: CudaFunction,
    binary: CudaFunction,
    binary_const: CudaFunction,
    copy: CudaFunction,
    pool: CudaFunction,
    resize_linear: CudaFunction,
    fill_outside: CudaFunction,
    depth_to_space: CudaFunction,
    space_to_depth: CudaFunction,
    gather_part: CudaFunction,
    channel_stats: CudaFunction,
}

impl GraphKernels {
    pub(super) fn load(module: &Arc<CudaModule>) -> Result<GraphKernels> {
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(drv("cuModuleGetFunction"))
        };
        Ok(GraphKernels {
            im2col: f("bsp_im2col_g")?,
            im2col_f16: f("bsp_im2col_g_f16")?,
            col2im: f("bsp_col2im")?,
            unary: f("bsp_unary")?,
            binary: f("bsp_binary")?,
            binary_const: f("bsp_binary_const")?,
            copy: f("bsp_copy")?,
            pool: f("bsp_pool")?,
            resize_linear: f("bsp_resize_linear")?,
            fill_outside: f("bsp_fill_outside")?,
            depth_to_space: f("bsp_depth_to_space")?,
            space_to_depth: f("bsp_space_to_depth")?,
            gather_part: f("bsp_gather_part")?,
            channel_stats: f("bsp_channel_stats")?,
        })
    }
}

/// A (transposed) convolution's weights and bias on the device, and under [`Precision::F16`] its weights
/// as binary16.
struct NodeWeights {
    w: CudaSlice<f32>,
    w16: Option<CudaSlice<u16>>,
    bias: CudaSlice<f32>,
}

/// The weights of a run's convolutions (by node), with their leases.
pub struct GraphWeights {
    nodes: Vec<Option<NodeWeights>>,
    _leases: Vec<Lease>,
}

/// Launches `$f` with the arguments (bound to locals by the caller) over `$n` outputs.
macro_rules! launch {
    ($self:expr, $f:expr, $name:literal, $n:expr, [$($a:expr),* $(,)?]) => {{
        let n: usize = $n;
        let mut b = $self.stream.launch_builder(&$f);
        $( b.arg($a); )*
        // SAFETY: the arguments match the kernel's signature in kernels.cu (in order and type), every
        // buffer holds the elements the kernel indexes (the caller sized them from the same dimensions).
        unsafe { b.launch(grid(n)) }.map_err(drv(concat!("cuLaunchKernel ", $name)))?;
    }};
}

impl CudaBackend {
    fn htod<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> Result<CudaSlice<T>> {
        if v.is_empty() {
            // SAFETY: an empty table is never read.
            return unsafe { self.stream.alloc::<T>(1) }.map_err(drv("cuMemAllocAsync"));
        }
        self.stream.clone_htod(v).map_err(drv("cuMemcpyHtoDAsync"))
    }

    /// The first `n` values of `w` as binary16 (`bsp_to_f16`: nearest even), counted in the weights'
    /// lease ([`exec::weight_bytes`]).
    fn to_f16(&self, w: &CudaSlice<f32>, n: usize) -> Result<CudaSlice<u16>> {
        // SAFETY: bsp_to_f16 writes all n elements.
        let mut out =
            unsafe { self.stream.alloc::<u16>(n.max(1)) }.map_err(drv("cuMemAllocAsync"))?;
        self.write_f16(w, n, &mut out)?;
        Ok(out)
    }

    /// The first `n` values of `x` as binary16 into `out` (`bsp_to_f16`).
    fn write_f16(&self, x: &CudaSlice<f32>, n: usize, out: &mut CudaSlice<u16>) -> Result<()> {
        let n64 = n as i64;
        launch!(self, self.k.to_f16, "bsp_to_f16", n, [x, &n64, out]);
        Ok(())
    }

    /// A leased copy of `x` (the in-place kernels work on the node's own output).
    fn copy_of(&self, x: &CudaTensor, what: &str) -> Result<CudaTensor> {
        let mut out = self.tensor(x.c, x.h, x.w, what)?;
        let (off, n) = (0i64, x.len() as i64);
        launch!(
            self,
            self.g.copy,
            "bsp_copy",
            x.len(),
            [&mut out.data, &off, &x.data, &n]
        );
        Ok(out)
    }

    fn gemm(
        &self,
        g: &Gemm,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> Result<()> {
        use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        // cuBLAS runs in the thread's current context, which nothing else here may have set.
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let cfg = GemmConfig {
            transa: CUBLAS_OP_N,
            transb: if g.trans_b { CUBLAS_OP_T } else { CUBLAS_OP_N },
            m: g.m,
            n: g.n,
            k: g.k,
            alpha: 1.0f32,
            lda: g.lda,
            ldb: g.ldb,
            beta: g.beta,
            ldc: g.ldc,
        };
        let a = a.slice(g.a_offset..);
        let b = b.slice(g.b_offset..);
        let mut c = c.slice_mut(g.c_offset..);
        // SAFETY: `launch::conv_gemm` / `convt_gemm` describe operands inside these buffers (their
        // callers sized the columns, weights and outputs from the same dimensions).
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }.map_err(blas_err("cublasGemm"))
    }

    /// [`Self::gemm`] on binary16 operands, accumulated and written in f32 (cuBLAS's `gemmEx`).
    fn gemm_f16(
        &self,
        g: &Gemm,
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<f32>,
    ) -> Result<()> {
        use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType_t};
        let blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let (alpha, beta) = (1.0f32, g.beta);
        let a = a.slice(g.a_offset..);
        let b = b.slice(g.b_offset..);
        let mut c = c.slice_mut(g.c_offset..);
        let (pa, _ra) = a.device_ptr(&self.stream);
        let (pb, _rb) = b.device_ptr(&self.stream);
        let (pc, _rc) = c.device_ptr_mut(&self.stream);
        // SAFETY: as in `gemm`: `launch::conv_gemm` describes operands inside these buffers (the caller
        // sized the columns, weights and outputs from the same dimensions); alpha and beta are f32, as
        // CUBLAS_COMPUTE_32F reads them.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                CUBLAS_OP_N,
                if g.trans_b { CUBLAS_OP_T } else { CUBLAS_OP_N },
                g.m,
                g.n,
                g.k,
                (&alpha) as *const f32 as *const _,
                pa as *const _,
                cudaDataType_t::CUDA_R_16F,
                g.lda,
                pb as *const _,
                cudaDataType_t::CUDA_R_16F,
                g.ldb,
                (&beta) as *const f32 as *const _,
                pc as *mut _,
                cudaDataType_t::CUDA_R_32F,
                g.ldc,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cublasGemmEx"))
    }

    /// `out += conv(x)` through cuDNN (`out` holds the bias): `Ok(false)` where cuDNN cannot take it
    /// (the caller runs im2col). Under f16 the window is converted to binary16 (`bsp_to_f16`), cuDNN
    /// writes a binary16 result, and `bsp_add_f16` adds it onto the bias; when the budget has no room
    /// for those two buffers, im2col's bands (which narrow to fit) take the convolution.
    fn dnn_conv(
        &self,
        name: &str,
        x: &CudaTensor,
        c: &ConvOp,
        wts: &NodeWeights,
        out: &mut CudaTensor,
    ) -> Result<bool> {
        let (hw, ohw) = ((x.h, x.w), (out.h, out.w));
        let Some(w16) = (match self.precision {
            Precision::F32 | Precision::Tf32 => None,
            Precision::F16 => wts.w16.as_ref(),
        }) else {
            let Some(plan) = self.cudnn_plan(name, c, hw, ohw)? else {
                return Ok(false);
            };
            self.cudnn_run(plan, &x.data, &wts.w, 1.0, &mut out.data)?;
            return Ok(true);
        };
        // Both written whole (by bsp_to_f16, by cuDNN with beta 0) before they are read.
        let Some((mut x16, _lx)) =
            self.try_alloc::<u16>(x.len(), "a convolution's binary16 window")?
        else {
            return Ok(false);
        };
        let Some((mut y16, _ly)) =
            self.try_alloc::<u16>(out.len(), "a convolution's binary16 result")?
        else {
            return Ok(false);
        };
        let Some(plan) = self.cudnn_plan(name, c, hw, ohw)? else {
            return Ok(false);
        };
        self.write_f16(&x.data, x.len(), &mut x16)?;
        self.cudnn_run(plan, &x16, w16, 0.0, &mut y16)?;
        let n64 = out.len() as i64;
        launch!(
            self,
            self.k.add_f16,
            "bsp_add_f16",
            out.len(),
            [&mut out.data, &y16, &n64]
        );
        Ok(true)
    }

    /// A convolution in bands of output rows: each band's im2col columns, then its GEMM per group. The
    /// band is as wide as [`exec::lease_conv_band`] finds room for.
    fn graph_conv(
        &self,
        name: &str,
        x: &CudaTensor,
        c: &ConvOp,
        wts: &NodeWeights,
        ho: usize,
        wo: usize,
    ) -> Result<CudaTensor> {
        let mut out = self.tensor(c.cout, ho, wo, "a convolution's output")?;
        let plane = ho * wo;
        {
            let (co, p) = (i32_of(c.cout, "channels")?, plane as i64);
            launch!(
                self,
                self.k.fill_bias,
                "bsp_fill_bias",
                c.cout * plane,
                [&mut out.data, &co, &p, &wts.bias]
            );
        }
        if plane == 0 {
            return Ok(out);
        }
        let counted = |k: usize| self.convs[k].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.use_dnn && self.dnn_conv(name, x, c, wts, &mut out)? {
            counted(0);
            return Ok(out);
        }
        counted(1);
        let what = format!("the im2col columns of `{name}`");
        let (rows, _lease) = exec::lease_conv_band(
            &self.meter,
            (c, ho, wo),
            self.band_bytes,
            self.precision,
            &what,
        )?;
        let cg = c.cin / c.groups;
        let kk = cg * c.win[0].k * c.win[1].k;
        let f16 = match (self.precision, &wts.w16) {
            (Precision::F16, Some(w16)) => Some(w16),
            _ => None,
        };
        let elems = if f16.is_some() { 0 } else { rows * wo * kk };
        // SAFETY: bsp_im2col_g writes the first (y1-y0)·wo·kk elements before the GEMM reads them.
        let mut col =
            unsafe { self.stream.alloc::<f32>(elems.max(1)) }.map_err(drv("cuMemAllocAsync"))?;
        let elems16 = if f16.is_some() { rows * wo * kk } else { 0 };
        // SAFETY: as for `col`, by bsp_im2col_g_f16.
        let mut col16 =
            unsafe { self.stream.alloc::<u16>(elems16.max(1)) }.map_err(drv("cuMemAllocAsync"))?;
        let geometry = [
            x.h,
            x.w,
            c.win[0].k,
            c.win[1].k,
            c.win[0].stride,
            c.win[1].stride,
            c.win[0].dilation,
            c.win[1].dilation,
        ];
        let t: Vec<i32> = geometry
            .iter()
            .map(|&d| i32_of(d, "a convolution's geometry"))
            .collect::<Result<_>>()?;
        let [h, w, kh, kw, sy, sx, dy, dx] = [t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]];
        let (cgi, woi) = (i32_of(cg, "channels")?, i32_of(wo, "width")?);
        for g in 0..c.groups {
            let c0 = i32_of(g * cg, "channels")?;
            for y0 in (0..ho).step_by(rows) {
                let y1 = (y0 + rows).min(ho);
                let gm = launch::conv_gemm(c, g, ho, wo, y0, y1)?;
                let (a, b) = (y0 as i32, y1 as i32);
                let n = (y1 - y0) * wo * kk;
                match f16 {
                    Some(w16) => {
                        launch!(
                            self,
                            self.g.im2col_f16,
                            "bsp_im2col_g_f16",
                            n,
                            [
                                &x.data, &c0, &cgi, &h, &w, &kh, &kw, &sy, &sx, &dy, &dx, &a, &b,
                                &woi, &mut col16
                            ]
                        );
                        self.gemm_f16(&gm, &col16, w16, &mut out.data)?;
                    }
                    None => {
                        launch!(
                            self,
                            self.g.im2col,
                            "bsp_im2col_g",
                            n,
                            [
                                &x.data, &c0, &cgi, &h, &w, &kh, &kw, &sy, &sx, &dy, &dx, &a, &b,
                                &woi, &mut col
                            ]
                        );
                        self.gemm(&gm, &col, &wts.w, &mut out.data)?;
                    }
                }
            }
        }
        Ok(out)
    }

    fn graph_conv_transpose(
        &self,
        x: &CudaTensor,
        c: &ConvOp,
        wts: &NodeWeights,
        ctx: &Ctx,
        ho: usize,
        wo: usize,
    ) -> Result<CudaTensor> {
        let (kh, kw) = (c.win[0].k, c.win[1].k);
        let n = x.h * x.w;
        let mut out = self.tensor(c.cout, ho, wo, "a transposed convolution's output")?;
        let (mut cols, _lease) =
            self.alloc::<f32>(c.cout * kh * kw * n, "a transposed convolution's columns")?;
        if n > 0 {
            // Under f16 the GEMM's operands are the input and the weights as binary16, as a
            // convolution's are; the columns and the col2im sums stay f32.
            let x16 = match (self.precision, &wts.w16) {
                (Precision::F16, Some(w16)) => {
                    let (mut x16, lease) =
                        self.alloc::<u16>(x.len(), "a transposed convolution's f16 input")?;
                    self.write_f16(&x.data, x.len(), &mut x16)?;
                    Some((x16, w16, lease))
                }
                _ => None,
            };
            for g in 0..c.groups {
                let gm = launch::convt_gemm(c, g, x.h, x.w)?;
                match &x16 {
                    Some((x16, w16, _)) => self.gemm_f16(&gm, x16, w16, &mut cols)?,
                    None => self.gemm(&gm, &x.data, &wts.w, &mut cols)?,
                }
            }
        } else {
            self.stream
                .memset_zeros(&mut cols)
                .map_err(drv("cuMemsetD8Async"))?;
        }
        let off = ops::convt_offsets(c, ctx);
        let v = [
            c.cout,
            x.h,
            x.w,
            kh,
            kw,
            c.win[0].stride,
            c.win[1].stride,
            c.win[0].dilation,
            c.win[1].dilation,
            ho,
            wo,
        ];
        let t: Vec<i32> = v
            .iter()
            .map(|&d| i32_of(d, "a transposed convolution's geometry"))
            .collect::<Result<_>>()?;
        let (oy, ox) = (off[0] as i64, off[1] as i64);
        launch!(
            self,
            self.g.col2im,
            "bsp_col2im",
            c.cout * ho * wo,
            [
                &cols,
                &wts.bias,
                &t[0],
                &t[1],
                &t[2],
                &t[3],
                &t[4],
                &t[5],
                &t[6],
                &t[7],
                &t[8],
                &oy,
                &ox,
                &t[9],
                &t[10],
                &mut out.data
            ]
        );
        Ok(out)
    }

    fn scale_shift(&self, x: &CudaTensor, scale: &[f32], shift: &[f32]) -> Result<CudaTensor> {
        let mut out = self.copy_of(x, "a normalised tile")?;
        self.scale_shift_in_place(&mut out, scale, shift)?;
        Ok(out)
    }

    /// `x · scale + shift` per channel, in place (`bsp_scale_shift`).
    fn scale_shift_in_place(&self, x: &mut CudaTensor, scale: &[f32], shift: &[f32]) -> Result<()> {
        let _lease = self
            .meter
            .lease(crate::device::norm_scratch_bytes(x.c), "scale and shift")?;
        let s = self.htod(&launch::per_channel(scale, x.c))?;
        let h = self.htod(&launch::per_channel(shift, x.c))?;
        let (c, p, r) = (i32_of(x.c, "channels")?, (x.h * x.w) as i64, 0i32);
        launch!(
            self,
            self.k.scale_shift,
            "bsp_scale_shift",
            x.len(),
            [&mut x.data, &c, &p, &s, &h, &r]
        );
        Ok(())
    }

    fn graph_node(
        &self,
        prep: &GraphWeights,
        i: usize,
        node: &Node,
        ins: &[CudaTensor],
        ctx: &Ctx,
    ) -> Result<CudaTensor> {
        let (ho, wo) = (
            ctx.range[0].1 - ctx.range[0].0,
            ctx.range[1].1 - ctx.range[1].0,
        );
        let weights = || {
            prep.nodes
                .get(i)
                .and_then(Option::as_ref)
                .ok_or_else(|| exec::refuse(node, "cuda", "its weights were not prepared"))
        };
        let x = &ins[0];
        let out = (ho, wo);
        match &node.op {
            Op::Conv(c) => self.graph_conv(&node.name, x, c, weights()?, ho, wo),
            Op::ConvTranspose(c) => self.graph_conv_transpose(x, c, weights()?, ctx, ho, wo),
            Op::Pool(p) => self.graph_pool(node, x, p, ctx, out),
            Op::Resize(r) if r.linear => self.graph_resize_linear(node, x, r, ctx, out),
            // Nearest resize and every padding mode are index maps: the gathered window is the output.
            Op::Resize(_) | Op::Identity => self.copy_of(x, "a copied tile"),
            Op::Pad(p) => self.graph_pad(node, x, p, ctx, out),
            Op::DepthToSpace { block, crd } => {
                self.graph_depth_to_space(node, x, (*block, *crd), ctx, out)
            }
            Op::SpaceToDepth { block } => self.graph_space_to_depth(x, *block, out),
            Op::Norm(_) => {
                let (scale, shift) = ctx
                    .norm
                    .ok_or_else(|| exec::refuse(node, "cuda", "its statistics are missing"))?;
                self.scale_shift(x, scale, shift)
            }
            Op::Affine { scale, shift } => self.scale_shift(x, scale, shift),
            Op::Unary(u) => self.graph_unary(x, u),
            Op::Binary { op, lhs, rhs } => self.graph_binary(node, ins, *op, lhs, rhs),
            Op::Concat => self.graph_concat(ins, out),
        }
    }

    /// Max or average pooling from ops.rs's per-axis tables.
    fn graph_pool(
        &self,
        node: &Node,
        x: &CudaTensor,
        p: &PoolOp,
        ctx: &Ctx,
        (ho, wo): (usize, usize),
    ) -> Result<CudaTensor> {
        let tables = |v: &[i32]| self.htod(v);
        let tb = ops::pool_tables(p, ctx);
        let _lease = self.meter.lease(
            exec::scratch_bytes(
                &node.op,
                &[(x.c, x.h, x.w)],
                (x.c, ho, wo),
                self.band_bytes,
                self.precision,
            ),
            "pooling tables",
        )?;
        let (yin, xin) = (
            tables(&launch::flags(&tb.inside[0]))?,
            tables(&launch::flags(&tb.inside[1]))?,
        );
        let cy = tables(&launch::ints(tb.count[0].iter().copied())?)?;
        let cx = tables(&launch::ints(tb.count[1].iter().copied())?)?;
        let mut out = self.tensor(x.c, ho, wo, "a pooled tile")?;
        let v = [
            x.c,
            x.h,
            x.w,
            ho,
            wo,
            p.win[0].k,
            p.win[1].k,
            p.win[0].stride,
            p.win[1].stride,
            p.win[0].dilation,
            p.win[1].dilation,
            p.max as usize,
        ];
        let t: Vec<i32> = v
            .iter()
            .map(|&d| i32_of(d, "a pooling's geometry"))
            .collect::<Result<_>>()?;
        launch!(
            self,
            self.g.pool,
            "bsp_pool",
            x.c * ho * wo,
            [
                &x.data,
                &t[0],
                &t[1],
                &t[2],
                &t[3],
                &t[4],
                &t[5],
                &t[6],
                &t[7],
                &t[8],
                &t[9],
                &t[10],
                &t[11],
                &yin,
                &xin,
                &cy,
                &cx,
                &mut out.data
            ]
        );
        Ok(out)
    }

    /// Linear resize from ops.rs's per-axis tables.
    fn graph_resize_linear(
        &self,
        node: &Node,
        x: &CudaTensor,
        r: &ResizeOp,
        ctx: &Ctx,
        (ho, wo): (usize, usize),
    ) -> Result<CudaTensor> {
        let tables = |v: &[i32]| self.htod(v);
        let [ty, tx] = ops::linear_tables(r, ctx);
        let _lease = self.meter.lease(
            exec::scratch_bytes(
                &node.op,
                &[(x.c, x.h, x.w)],
                (x.c, ho, wo),
                self.band_bytes,
                self.precision,
            ),
            "resize tables",
        )?;
        let ya = tables(&launch::ints(ty.iter().map(|t| t.0))?)?;
        let yb = tables(&launch::ints(ty.iter().map(|t| t.1))?)?;
        let fy = self.htod(&ty.iter().map(|t| t.2).collect::<Vec<f32>>())?;
        let xa = tables(&launch::ints(tx.iter().map(|t| t.0))?)?;
        let xb = tables(&launch::ints(tx.iter().map(|t| t.1))?)?;
        let fx = self.htod(&tx.iter().map(|t| t.2).collect::<Vec<f32>>())?;
        let mut out = self.tensor(x.c, ho, wo, "a resized tile")?;
        let v = [x.c, x.h, x.w, ho, wo];
        let t: Vec<i32> = v
            .iter()
            .map(|&d| i32_of(d, "a resize's geometry"))
            .collect::<Result<_>>()?;
        launch!(
            self,
            self.g.resize_linear,
            "bsp_resize_linear",
            x.c * ho * wo,
            [
                &x.data,
                &t[0],
                &t[1],
                &t[2],
                &t[3],
                &t[4],
                &ya,
                &yb,
                &fy,
                &xa,
                &xb,
                &fx,
                &mut out.data
            ]
        );
        Ok(out)
    }

    /// Padding: the gathered window is the output but for a constant pad's value outside the input.
    fn graph_pad(
        &self,
        node: &Node,
        x: &CudaTensor,
        p: &PadOp,
        ctx: &Ctx,
        (ho, wo): (usize, usize),
    ) -> Result<CudaTensor> {
        let tables = |v: &[i32]| self.htod(v);
        let mut out = self.copy_of(x, "a padded tile")?;
        if p.mode.is_none() && p.value != 0.0 {
            let _lease = self.meter.lease(
                exec::scratch_bytes(
                    &node.op,
                    &[(x.c, x.h, x.w)],
                    (x.c, ho, wo),
                    self.band_bytes,
                    self.precision,
                ),
                "padding tables",
            )?;
            let inside = |a: usize| {
                launch::flags(
                    &ctx.maps[0][a]
                        .iter()
                        .map(Option::is_some)
                        .collect::<Vec<_>>(),
                )
            };
            let (yin, xin) = (tables(&inside(0))?, tables(&inside(1))?);
            let t: Vec<i32> = [x.c, x.h, x.w]
                .iter()
                .map(|&d| i32_of(d, "a padding's geometry"))
                .collect::<Result<_>>()?;
            launch!(
                self,
                self.g.fill_outside,
                "bsp_fill_outside",
                x.len(),
                [&mut out.data, &t[0], &t[1], &t[2], &yin, &xin, &p.value]
            );
        }
        Ok(out)
    }

    /// DepthToSpace (DCR or CRD) of an output range starting at any pixel.
    fn graph_depth_to_space(
        &self,
        node: &Node,
        x: &CudaTensor,
        (block, crd): (usize, bool),
        ctx: &Ctx,
        (ho, wo): (usize, usize),
    ) -> Result<CudaTensor> {
        let c = node.channels;
        let mut out = self.tensor(c, ho, wo, "a pixel-shuffled tile")?;
        let v = [
            c,
            ho,
            wo,
            block,
            crd as usize,
            ctx.range[0].0 % block,
            ctx.range[1].0 % block,
        ];
        let t: Vec<i32> = v
            .iter()
            .map(|&d| i32_of(d, "a pixel shuffle's geometry"))
            .collect::<Result<_>>()?;
        launch!(
            self,
            self.g.depth_to_space,
            "bsp_depth_to_space",
            c * ho * wo,
            [
                &x.data,
                &t[0],
                &t[1],
                &t[2],
                &t[3],
                &t[4],
                &t[5],
                &t[6],
                &mut out.data
            ]
        );
        Ok(out)
    }

    /// SpaceToDepth.
    fn graph_space_to_depth(
        &self,
        x: &CudaTensor,
        block: usize,
        (ho, wo): (usize, usize),
    ) -> Result<CudaTensor> {
        let mut out = self.tensor(x.c * block * block, ho, wo, "a space-to-depth tile")?;
        let t: Vec<i32> = [x.c, ho, wo, block]
            .iter()
            .map(|&d| i32_of(d, "a space-to-depth geometry"))
            .collect::<Result<_>>()?;
        launch!(
            self,
            self.g.space_to_depth,
            "bsp_space_to_depth",
            out.len(),
            [&x.data, &t[0], &t[1], &t[2], &t[3], &mut out.data]
        );
        Ok(out)
    }

    /// An element-wise function, in place on a copy (PRelu with its slopes).
    fn graph_unary(&self, x: &CudaTensor, u: &Unary) -> Result<CudaTensor> {
        let mut out = self.copy_of(x, "a tile")?;
        self.unary_in_place(&mut out, u)?;
        Ok(out)
    }

    /// `u` on every value of `x`, in place (`bsp_unary`).
    fn unary_in_place(&self, x: &mut CudaTensor, u: &Unary) -> Result<()> {
        let (kind, a, b) = launch::unary_code(u);
        let (n, p) = (x.len() as i64, (x.h * x.w) as i64);
        // PRelu's slopes; for the others the kernel never reads the pointer (one value stands in).
        let (slopes, _lease) = match u {
            Unary::PRelu(slope) => (
                self.htod(slope)?,
                Some(self.meter.lease((slope.len() * 4) as u64, "slopes")?),
            ),
            _ => (self.htod(&[0f32])?, None),
        };
        let ns = match u {
            Unary::PRelu(slope) => i32_of(slope.len(), "slopes")?,
            _ => 0i32,
        };
        launch!(
            self,
            self.g.unary,
            "bsp_unary",
            x.len(),
            [&mut x.data, &n, &p, &kind, &a, &b, &slopes, &ns]
        );
        Ok(())
    }

    /// `x op k` (or `k op x` with `const_first`) with a per-channel or scalar constant, in place
    /// (`bsp_binary_const`).
    fn binary_const_in_place(
        &self,
        x: &mut CudaTensor,
        op: BinOp,
        k: &[f32],
        const_first: bool,
    ) -> Result<()> {
        let _lease = self.meter.lease((k.len() * 4) as u64, "a constant")?;
        let kb = self.htod(k)?;
        let (c, p, nk) = (
            i32_of(x.c, "channels")?,
            (x.h * x.w) as i64,
            i32_of(k.len(), "constants")?,
        );
        let (first, code) = (const_first as i32, launch::binop_code(op));
        launch!(
            self,
            self.g.binary_const,
            "bsp_binary_const",
            x.len(),
            [&mut x.data, &c, &p, &kb, &nk, &first, &code]
        );
        Ok(())
    }

    /// A binary op between two images (either may have one channel) or an image and a constant.
    fn graph_binary(
        &self,
        node: &Node,
        ins: &[CudaTensor],
        op: BinOp,
        lhs: &Operand,
        rhs: &Operand,
    ) -> Result<CudaTensor> {
        let code = launch::binop_code(op);
        match (lhs, rhs) {
            (Operand::Input(a), Operand::Input(b)) => {
                let (a, b) = (&ins[*a], &ins[*b]);
                let c = a.c.max(b.c);
                let mut out = self.tensor(c, a.h, a.w, "a tile")?;
                let (ac, bc, ci, p) = (
                    i32_of(a.c, "channels")?,
                    i32_of(b.c, "channels")?,
                    i32_of(c, "channels")?,
                    (a.h * a.w) as i64,
                );
                launch!(
                    self,
                    self.g.binary,
                    "bsp_binary",
                    out.len(),
                    [&a.data, &ac, &b.data, &bc, &ci, &p, &code, &mut out.data]
                );
                Ok(out)
            }
            (Operand::Input(a), Operand::Const(k)) | (Operand::Const(k), Operand::Input(a)) => {
                let mut out = self.copy_of(&ins[*a], "a tile")?;
                self.binary_const_in_place(&mut out, op, k, matches!(lhs, Operand::Const(_)))?;
                Ok(out)
            }
            (Operand::Const(_), Operand::Const(_)) => {
                Err(exec::refuse(node, "cuda", "both operands are constants"))
            }
        }
    }

    /// Channel concatenation: copies at channel offsets.
    fn graph_concat(&self, ins: &[CudaTensor], (ho, wo): (usize, usize)) -> Result<CudaTensor> {
        let c = ins.iter().map(|t| t.c).sum();
        let mut out = self.tensor(c, ho, wo, "a concatenated tile")?;
        let mut off = 0i64;
        for t in ins {
            let n = t.len() as i64;
            launch!(
                self,
                self.g.copy,
                "bsp_copy",
                t.len(),
                [&mut out.data, &off, &t.data, &n]
            );
            off += n;
        }
        Ok(out)
    }
}

impl GraphOps for CudaBackend {
    type Buf = CudaTensor;
    type Prepared = GraphWeights;

    fn tiles_at_once(&self, _threads: usize) -> usize {
        1
    }
    fn device_meter(&self) -> Option<&Arc<Meter>> {
        Some(&self.meter)
    }
    fn prepare(&self, nodes: &[Node]) -> Result<GraphWeights> {
        let mut leases = vec![];
        let mut out = vec![];
        for n in nodes {
            out.push(match &n.op {
                Op::Conv(c) | Op::ConvTranspose(c) => {
                    leases.push(self.meter.lease(
                        exec::weight_bytes(&n.op, self.precision),
                        &format!("the weights of `{}`", n.name),
                    )?);
                    let w = self.htod(&c.weight)?;
                    let w16 = match self.precision {
                        Precision::F16 => Some(self.to_f16(&w, c.weight.len())?),
                        Precision::F32 | Precision::Tf32 => None,
                    };
                    Some(NodeWeights {
                        w,
                        w16,
                        bias: self.htod(&c.bias)?,
                    })
                }
                _ => None,
            });
        }
        Ok(GraphWeights {
            nodes: out,
            _leases: leases,
        })
    }
    fn load(&self, t: Tensor) -> Result<CudaTensor> {
        self.upload(t)
    }
    fn store(&self, x: CudaTensor) -> Result<Tensor> {
        self.download(x)
    }
    /// The fused node's kernel run in place on its producer's output: the same kernel as the node's own
    /// computation, on the same values, without the copy.
    fn pointwise(&self, op: &Op, mut x: CudaTensor) -> Result<CudaTensor> {
        match op {
            Op::Unary(u) => self.unary_in_place(&mut x, u)?,
            Op::Affine { scale, shift } => self.scale_shift_in_place(&mut x, scale, shift)?,
            Op::Binary {
                op,
                lhs: Operand::Input(_),
                rhs: Operand::Const(k),
            } => self.binary_const_in_place(&mut x, *op, k, false)?,
            Op::Binary {
                op,
                lhs: Operand::Const(k),
                rhs: Operand::Input(_),
            } => self.binary_const_in_place(&mut x, *op, k, true)?,
            Op::Identity => {}
            _ => {
                return Err(crate::Error::Device(
                    "internal: a fused node that is not element-wise on one input".into(),
                ));
            }
        }
        Ok(x)
    }
    fn keeps_values(&self) -> bool {
        self.keeps
    }
    fn inlines_units(&self) -> bool {
        self.inlines
    }
    fn gather(
        &self,
        c: usize,
        parts: &[Part<'_, CudaTensor>],
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<CudaTensor> {
        // Zeroed where the window has padding, then each part's pixels copied in by `bsp_gather_part`.
        let (wh, ww) = (ys.len(), xs.len());
        let mut out = self.tensor(c, wh, ww, "a gathered window")?;
        if parts.is_empty() || ys.contains(&None) || xs.contains(&None) {
            self.stream
                .memset_zeros(&mut out.data)
                .map_err(drv("cuMemsetD8Async"))?;
        }
        let wplane = (wh * ww) as i64;
        let (c32, ww32) = (i32_of(c, "channels")?, i32_of(ww, "a window's width")?);
        for p in parts {
            let Some((map, ny, nx)) = launch::gather_map(p, ys, xs)? else {
                continue;
            };
            let map = self.htod(&map)?;
            let (sw, splane) = (i32_of(p.w, "a tile's width")?, (p.h * p.w) as i64);
            let (ny32, nx32) = (i32_of(ny, "window rows")?, i32_of(nx, "window columns")?);
            launch!(
                self,
                self.g.gather_part,
                "bsp_gather_part",
                c * ny * nx,
                [
                    &p.buf.data,
                    &c32,
                    &sw,
                    &splane,
                    &map,
                    &ny32,
                    &nx32,
                    &ww32,
                    &wplane,
                    &mut out.data
                ]
            );
        }
        Ok(out)
    }
    /// `bsp_channel_stats`: block partials in f64, merged on the host in block order.
    fn stats(&self, x: &CudaTensor) -> Result<Vec<ChannelStats>> {
        let plane = x.h * x.w;
        if plane == 0 || x.c == 0 {
            return Ok(vec![ChannelStats::default(); x.c]);
        }
        let (nb, chunk) = launch::stats_blocks(plane);
        let (mut out, _lease) = self.alloc::<f64>(x.c * nb * 2, "a tile's statistics")?;
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(nb).map_err(|_| crate::Error::Device("statistics blocks".into()))?,
                u32::try_from(x.c)
                    .ok()
                    .filter(|&c| c < 65536)
                    .ok_or_else(|| crate::Error::Device(format!("{} channels", x.c)))?,
                1,
            ),
            block_dim: (launch::STATS_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (plane64, chunk64) = (plane as i64, chunk as i64);
        let mut b = self.stream.launch_builder(&self.g.channel_stats);
        b.arg(&x.data).arg(&plane64).arg(&chunk64).arg(&mut out);
        // SAFETY: the arguments match bsp_channel_stats's signature; `out` holds c·nb·2 values, the
        // grid is nb × c blocks of STATS_THREADS threads, and x holds c planes of `plane` values.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel bsp_channel_stats"))?;
        let host = self
            .stream
            .clone_dtoh(&out)
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        Ok(launch::merge_stat_blocks(&host, x.c, plane, nb, chunk))
    }
    fn compute(
        &self,
        prep: &GraphWeights,
        i: usize,
        node: &Node,
        ins: Vec<CudaTensor>,
        ctx: &Ctx,
    ) -> Result<CudaTensor> {
        // A size beyond the kernels' 32-bit indices is said of the node that has it.
        self.graph_node(prep, i, node, &ins, ctx)
            .map_err(|e| match e {
                crate::Error::Device(why) => exec::refuse(node, "cuda", &why),
                e => e,
            })
    }
}
