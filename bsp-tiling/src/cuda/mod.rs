//! The CUDA backend: activations in device memory ([`CudaTensor`]), convolution as an im2col kernel +
//! cuBLAS GEMM (f32, or f16 operands with f32 accumulation), and the rest — gather/padding, nearest
//! upsampling, per-channel statistics (f64 reductions), normalisation + ReLU, residual add — as small
//! kernels from [`KERNEL_SOURCE`] (`kernels.cu`), compiled by NVRTC once per process and architecture.
//!
//! libcuda, libnvrtc and libcublas are loaded at run time (`cudarc`'s `dynamic-loading`): the crate builds
//! and its tests run on machines without CUDA, and [`CudaBackend::new`] says which library is missing
//! ([`Error::NoDriver`], [`Error::NoCudaLibrary`]) instead of panicking — cudarc panics on the first call
//! into a library it cannot load, so every entry point checks first.
//!
//! All work goes to one stream, in order: the engine gives a device backend one tile at a time
//! ([`Backend::concurrency`] is 1) and the GPU's parallelism is inside each call. Every device
//! allocation takes a lease on the backend's [`Meter`] first, so device memory stays within the budget
//! (the planner in [`crate::place`] arranges that it does; the meter refuses if it would not).

use crate::backend::{Backend, Conv2d, Norm, Pad};
use crate::device::{self, DEVICE_BAND_BYTES, HEADROOM, Precision, STATS_THREADS};
use crate::error::{Error, Result};
use crate::meter::{Lease, Meter};
use crate::padding::PaddingMode;
use crate::stats::ChannelStats;
use crate::tensor::Tensor;
use cuda_setup::{Library, Program};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError,
    LaunchConfig, PushKernelArg,
};
use std::sync::{Arc, Mutex};

mod graph;

/// The CUDA C source of the kernels, embedded in the crate.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

/// The kernels as NVRTC compiles them: `--fmad=false` keeps `x·a + b` two roundings, as in the CPU backend.
static PROGRAM: Program = Program::new("bsp_kernels.cu", KERNEL_SOURCE).without_fmad();

/// The kernels' entry points, in `kernels.cu` order.
pub const KERNEL_NAMES: [&str; 25] = [
    "bsp_gather",
    "bsp_paste",
    "bsp_pad",
    "bsp_upsample2x",
    "bsp_im2col",
    "bsp_im2col_f16",
    "bsp_to_f16",
    "bsp_fill_bias",
    "bsp_channel_partials",
    "bsp_sum_partials",
    "bsp_scale_shift",
    "bsp_relu",
    "bsp_add",
    "bsp_im2col_g",
    "bsp_im2col_g_f16",
    "bsp_col2im",
    "bsp_unary",
    "bsp_binary",
    "bsp_binary_const",
    "bsp_copy",
    "bsp_pool",
    "bsp_resize_linear",
    "bsp_fill_outside",
    "bsp_depth_to_space",
    "bsp_space_to_depth",
];

/// Bytes of the workspace handed to cuBLAS (its recommendation for Hopper), counted on the meter.
const CUBLAS_WORKSPACE: usize = 32 << 20;

/// A failed driver call, in the driver's own words.
fn drv(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Cuda {
        call,
        message: cuda_setup::describe(&e),
    }
}

/// A cuBLAS status as `CUBLAS_STATUS_NAME: description`, from cuBLAS's own tables.
fn blas_text(e: cudarc::cublas::result::CublasError) -> String {
    let text = |p: *const std::ffi::c_char| {
        // SAFETY: cuBLAS returns static NUL-terminated strings (or null).
        (!p.is_null()).then(|| {
            // SAFETY: `p` is not null here, and cuBLAS's status strings are static and NUL-terminated.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        })
    };
    // SAFETY: plain lookups in cuBLAS's tables; libcublas is loaded (checked when the backend opened).
    let name = text(unsafe { cudarc::cublas::sys::cublasGetStatusName(e.0) })
        .unwrap_or_else(|| format!("cublasStatus {}", e.0 as u32));
    // SAFETY: as for the name: a lookup in the loaded libcublas's tables, defined for any status value.
    match text(unsafe { cudarc::cublas::sys::cublasGetStatusString(e.0) }) {
        Some(t) => format!("{name}: {t}"),
        None => name,
    }
}

fn blas_err(call: &'static str) -> impl Fn(cudarc::cublas::result::CublasError) -> Error {
    move |e| Error::Cuda {
        call,
        message: blas_text(e),
    }
}

struct Kernels {
    gather: CudaFunction,
    paste: CudaFunction,
    pad: CudaFunction,
    upsample: CudaFunction,
    im2col: CudaFunction,
    im2col_f16: CudaFunction,
    to_f16: CudaFunction,
    fill_bias: CudaFunction,
    partials: CudaFunction,
    sum_partials: CudaFunction,
    scale_shift: CudaFunction,
    relu: CudaFunction,
    add: CudaFunction,
}

/// A `C×H×W` f32 activation in device memory.
pub struct CudaTensor {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    data: CudaSlice<f32>,
    _lease: Lease,
}

impl CudaTensor {
    fn len(&self) -> usize {
        self.c * self.h * self.w
    }
}

/// A convolution's weights in device memory (and their f16 copy for [`Precision::F16`]).
pub struct CudaWeights {
    w: CudaSlice<f32>,
    w16: Option<CudaSlice<u16>>,
    bias: CudaSlice<f32>,
    _lease: Lease,
}

/// Launch geometry of a grid-stride kernel over `n` elements.
fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 20);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::Device(format!("{what} ({v}) is beyond the kernels' 32-bit range")))
}

/// Index maps as the kernels read them: `-1` for a zero.
fn map_i32(m: &[Option<usize>]) -> Result<Vec<i32>> {
    m.iter()
        .map(|v| match v {
            Some(v) => to_i32(*v, "an index"),
            None => Ok(-1),
        })
        .collect()
}

/// The cuBLAS GEMM of one im2col band, in cuBLAS's column-major terms: `C[m × n] += A[m × k] · B[k × n]`
/// with A the band's columns (`[cin·k·k, pixels]` row-major = `[pixels × cin·k·k]` column-major, lda =
/// pixels), B the weights (`[cout, cin·k·k]` row-major = `[cin·k·k × cout]` column-major, ldb = cin·k·k)
/// and C the output planes from the band's first pixel on (`[cout, ho·wo]` row-major, ldc = ho·wo): the
/// CPU backend's row-major `out = W · col` for the same rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandGemm {
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
    /// Where C's first element lies in the output buffer.
    pub c_offset: usize,
}

/// The GEMM for output rows `y0..y1` of a `ho × wo` convolution output.
pub fn band_gemm(conv: &Conv2d, ho: usize, wo: usize, y0: usize, y1: usize) -> Result<BandGemm> {
    let kk = conv.cin * conv.k * conv.k;
    let pixels = (y1 - y0) * wo;
    to_i32(pixels * kk, "an im2col band's elements")?;
    Ok(BandGemm {
        m: to_i32(pixels, "a band's pixels")?,
        n: to_i32(conv.cout, "channels")?,
        k: to_i32(kk, "columns")?,
        lda: to_i32(pixels, "a band's pixels")?,
        ldb: to_i32(kk, "columns")?,
        ldc: to_i32(ho * wo, "an output plane")?,
        c_offset: y0 * wo,
    })
}

/// The CUDA backend on one GPU.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: Mutex<CudaBlas>,
    k: Kernels,
    g: graph::GraphKernels,
    meter: Arc<Meter>,
    precision: Precision,
    band_bytes: usize,
    device_name: String,
    /// Device memory in use (all processes) when the backend opened, from the driver.
    pub baseline_used: u64,
    _workspace: (CudaSlice<u8>, Lease),
}

impl CudaBackend {
    /// Opens GPU `ordinal` with a budget of `gpu_memory` bytes (`None`: the free memory less
    /// [`HEADROOM`]). Fails with the reason when there is no driver, device, NVRTC or cuBLAS.
    pub fn new(ordinal: usize, gpu_memory: Option<u64>, precision: Precision) -> Result<Self> {
        // Driver, device and NVRTC first, then cuBLAS: every missing piece is named before a context exists.
        cuda_setup::probe(ordinal)?;
        Library::Cublas.require()?;
        let ctx = cuda_setup::open(ordinal)?;
        // One stream, in order: the slices' cross-stream events are not needed.
        // SAFETY: nothing has been allocated in this context by us yet, and we use one stream only.
        unsafe { ctx.disable_event_tracking() };
        let module = PROGRAM.load(&ctx)?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(drv("cuModuleGetFunction"))
        };
        let k = Kernels {
            gather: load("bsp_gather")?,
            paste: load("bsp_paste")?,
            pad: load("bsp_pad")?,
            upsample: load("bsp_upsample2x")?,
            im2col: load("bsp_im2col")?,
            im2col_f16: load("bsp_im2col_f16")?,
            to_f16: load("bsp_to_f16")?,
            fill_bias: load("bsp_fill_bias")?,
            partials: load("bsp_channel_partials")?,
            sum_partials: load("bsp_sum_partials")?,
            scale_shift: load("bsp_scale_shift")?,
            relu: load("bsp_relu")?,
            add: load("bsp_add")?,
        };
        let g = graph::GraphKernels::load(&module)?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let (free, total) = ctx.mem_get_info().map_err(drv("cuMemGetInfo"))?;
        let budget = gpu_memory.unwrap_or((free as u64).saturating_sub(HEADROOM));
        let meter = Meter::new(budget);
        let blas = CudaBlas::new(stream.clone()).map_err(blas_err("cublasCreate"))?;
        let ws_lease = meter.lease(CUBLAS_WORKSPACE as u64, "the cuBLAS workspace")?;
        // SAFETY: cuBLAS overwrites its workspace before reading it.
        let ws = unsafe { stream.alloc::<u8>(CUBLAS_WORKSPACE) }.map_err(drv("cuMemAllocAsync"))?;
        {
            let (ptr, _rec) = ws.device_ptr(&stream);
            // SAFETY: the workspace lives as long as the handle (both are fields of the backend; the
            // handle is dropped first, being declared first).
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut std::ffi::c_void,
                    CUBLAS_WORKSPACE,
                )
            }
            .result()
            .map_err(blas_err("cublasSetWorkspace"))?;
        }
        let device_name = ctx.name().unwrap_or_else(|_| format!("GPU {ordinal}"));
        Ok(CudaBackend {
            ctx,
            stream,
            blas: Mutex::new(blas),
            k,
            g,
            meter,
            precision,
            band_bytes: DEVICE_BAND_BYTES,
            device_name,
            baseline_used: (total - free) as u64,
            _workspace: (ws, ws_lease),
        })
    }

    /// Sets the im2col band size (bytes of columns per GEMM; smaller means more, narrower GEMMs).
    pub fn set_band_bytes(&mut self, bytes: usize) {
        self.band_bytes = bytes.max(1);
    }

    /// The budget's meter (bytes in use, peak).
    pub fn memory(&self) -> &Arc<Meter> {
        &self.meter
    }

    /// Device memory in use on the whole GPU now, from the driver (all processes, the context included).
    pub fn driver_used(&self) -> Result<u64> {
        let (free, total) = self.ctx.mem_get_info().map_err(drv("cuMemGetInfo"))?;
        Ok((total - free) as u64)
    }

    /// Waits for all queued work (for timing).
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }

    fn alloc<T: cudarc::driver::DeviceRepr>(
        &self,
        n: usize,
        what: &str,
    ) -> Result<(CudaSlice<T>, Lease)> {
        let lease = self
            .meter
            .lease((n * std::mem::size_of::<T>()) as u64, what)?;
        // SAFETY: every caller writes the elements it later reads (a kernel fills the whole buffer).
        let s = unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(drv("cuMemAllocAsync"))?;
        Ok((s, lease))
    }

    fn tensor(&self, c: usize, h: usize, w: usize, what: &str) -> Result<CudaTensor> {
        let (data, lease) = self.alloc::<f32>(c * h * w, what)?;
        Ok(CudaTensor {
            c,
            h,
            w,
            data,
            _lease: lease,
        })
    }

    fn upload_maps(
        &self,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<(CudaSlice<i32>, CudaSlice<i32>, Lease)> {
        let lease = self.meter.lease(
            device::gather_scratch_bytes(ys.len(), xs.len()),
            "index maps",
        )?;
        let h2d = drv("cuMemcpyHtoDAsync");
        let ys = self.stream.clone_htod(&map_i32(ys)?).map_err(&h2d)?;
        let xs = self.stream.clone_htod(&map_i32(xs)?).map_err(&h2d)?;
        Ok((ys, xs, lease))
    }
}

impl Backend for CudaBackend {
    type Buf = CudaTensor;
    type Weights = CudaWeights;

    fn name(&self) -> String {
        format!(
            "cuda ({}, im2col + cuBLAS {}, budget {} bytes)",
            self.device_name,
            match self.precision {
                Precision::F32 => "sgemm",
                Precision::F16 => "f16 gemm, f32 accumulation",
            },
            self.meter.budget()
        )
    }

    fn concurrency(&self, _threads: usize) -> usize {
        1
    }

    fn meter(&self) -> Option<&Meter> {
        Some(&self.meter)
    }

    fn weight_bytes(&self, conv: &Conv2d) -> u64 {
        device::weight_bytes(conv, self.precision)
    }
    fn conv_scratch_bytes(&self, conv: &Conv2d, ho: usize, wo: usize) -> u64 {
        device::band(conv, ho, wo, self.band_bytes, self.precision).1
    }
    fn stats_scratch_bytes(&self, c: usize, plane: usize) -> u64 {
        device::stats_scratch_bytes(c, plane)
    }
    fn gather_scratch_bytes(&self, ny: usize, nx: usize) -> u64 {
        device::gather_scratch_bytes(ny, nx)
    }
    fn norm_scratch_bytes(&self, c: usize) -> u64 {
        device::norm_scratch_bytes(c)
    }

    fn weights(&self, conv: &Conv2d) -> Result<CudaWeights> {
        let lease = self
            .meter
            .lease(self.weight_bytes(conv), "convolution weights")?;
        let h2d = drv("cuMemcpyHtoDAsync");
        let w = self.stream.clone_htod(&conv.weight).map_err(&h2d)?;
        let bias = self.stream.clone_htod(&conv.bias).map_err(&h2d)?;
        let w16 = match self.precision {
            Precision::F32 => None,
            Precision::F16 => {
                let n = conv.weight.len();
                // SAFETY: bsp_to_f16 writes all n elements.
                let mut out = unsafe { self.stream.alloc::<u16>(n.max(1)) }
                    .map_err(drv("cuMemAllocAsync"))?;
                let n64 = n as i64;
                let mut b = self.stream.launch_builder(&self.k.to_f16);
                b.arg(&w).arg(&n64).arg(&mut out);
                // SAFETY: matches bsp_to_f16(const float*, i64, u16*); n elements each.
                unsafe { b.launch(grid(n)) }.map_err(drv("cuLaunchKernel bsp_to_f16"))?;
                Some(out)
            }
        };
        Ok(CudaWeights {
            w,
            w16,
            bias,
            _lease: lease,
        })
    }

    fn dims(&self, x: &CudaTensor) -> (usize, usize, usize) {
        (x.c, x.h, x.w)
    }

    fn upload(&self, t: Tensor) -> Result<CudaTensor> {
        let lease = self
            .meter
            .lease(Tensor::bytes(t.c, t.h, t.w), "an uploaded tile")?;
        let data = if t.data.is_empty() {
            // SAFETY: an empty tensor is never read.
            unsafe { self.stream.alloc::<f32>(1) }.map_err(drv("cuMemAllocAsync"))?
        } else {
            self.stream
                .clone_htod(&t.data)
                .map_err(drv("cuMemcpyHtoDAsync"))?
        };
        Ok(CudaTensor {
            c: t.c,
            h: t.h,
            w: t.w,
            data,
            _lease: lease,
        })
    }

    fn download_into(&self, x: &CudaTensor, out: &mut [f32]) -> Result<()> {
        if out.len() != x.len() {
            return Err(Error::Device(format!(
                "download of {} values into a buffer of {}",
                x.len(),
                out.len()
            )));
        }
        if out.is_empty() {
            return Ok(());
        }
        let src = x.data.slice(0..out.len());
        // A copy to pageable host memory returns once it has completed.
        self.stream
            .memcpy_dtoh(&src, out)
            .map_err(drv("cuMemcpyDtoHAsync"))
    }

    fn zeros(&self, c: usize, h: usize, w: usize) -> Result<CudaTensor> {
        let mut t = self.tensor(c, h, w, "a resident layer")?;
        self.stream
            .memset_zeros(&mut t.data)
            .map_err(drv("cuMemsetD8Async"))?;
        Ok(t)
    }

    fn conv2d_valid(
        &self,
        x: &CudaTensor,
        conv: &Conv2d,
        wts: &CudaWeights,
        _threads: usize,
    ) -> Result<CudaTensor> {
        let (k, s) = (conv.k, conv.stride);
        if x.c != conv.cin || x.h < k || x.w < k {
            return Err(Error::Device(format!(
                "convolution of {} input channels, {k}x{k}, given a {}x{}x{} activation",
                conv.cin, x.c, x.h, x.w
            )));
        }
        let (ho, wo) = ((x.h - k) / s + 1, (x.w - k) / s + 1);
        let plane = ho * wo;
        let kk = conv.cin * k * k;
        let mut out = self.tensor(conv.cout, ho, wo, "a convolution's output")?;
        {
            let (c, p) = (to_i32(conv.cout, "channels")?, plane as i64);
            let mut b = self.stream.launch_builder(&self.k.fill_bias);
            b.arg(&mut out.data).arg(&c).arg(&p).arg(&wts.bias);
            // SAFETY: bsp_fill_bias(float*, int, i64, const float*): cout·plane outputs, cout biases.
            unsafe { b.launch(grid(conv.cout * plane)) }
                .map_err(drv("cuLaunchKernel bsp_fill_bias"))?;
        }
        let (rows, band_bytes) = device::band(conv, ho, wo, self.band_bytes, self.precision);
        let _band_lease = self.meter.lease(band_bytes, "im2col columns")?;
        let elems = rows * wo * kk;
        let (cin, h, w) = (
            to_i32(x.c, "channels")?,
            to_i32(x.h, "height")?,
            to_i32(x.w, "width")?,
        );
        let (ki, si, woi) = (
            to_i32(k, "kernel")?,
            to_i32(s, "stride")?,
            to_i32(wo, "width")?,
        );
        let blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        // cuBLAS runs in the thread's current context, which nothing else here may have set.
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let gemm_err = blas_err("cublasGemm");
        let op = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
        match (self.precision, &wts.w16) {
            (Precision::F16, Some(w16)) => {
                // SAFETY: bsp_im2col_f16 writes the first (y1-y0)·wo·kk elements before the GEMM reads them.
                let mut col = unsafe { self.stream.alloc::<u16>(elems.max(1)) }
                    .map_err(drv("cuMemAllocAsync"))?;
                for y0 in (0..ho).step_by(rows) {
                    let y1 = (y0 + rows).min(ho);
                    let n = (y1 - y0) * wo;
                    let g = band_gemm(conv, ho, wo, y0, y1)?;
                    let (a, b1) = (y0 as i32, y1 as i32);
                    let mut b = self.stream.launch_builder(&self.k.im2col_f16);
                    b.arg(&x.data)
                        .arg(&cin)
                        .arg(&h)
                        .arg(&w)
                        .arg(&ki)
                        .arg(&si)
                        .arg(&a)
                        .arg(&b1)
                        .arg(&woi)
                        .arg(&mut col);
                    // SAFETY: matches bsp_im2col_f16's signature; reads stay inside x (rows y0..y1 of a
                    // valid convolution), writes inside col (n·kk ≤ elems).
                    unsafe { b.launch(grid(n * kk)) }
                        .map_err(drv("cuLaunchKernel bsp_im2col_f16"))?;
                    let (alpha, beta) = (1.0f32, 1.0f32);
                    let (pa, _ra) = col.device_ptr(&self.stream);
                    let (pb, _rb) = w16.device_ptr(&self.stream);
                    let mut dst = out.data.slice_mut(g.c_offset..);
                    let (pc, _rc) = dst.device_ptr_mut(&self.stream);
                    // SAFETY: column-major C[n × cout] (ldc = plane, from this band's first pixel) =
                    // A[n × kk] (the columns, lda = n) · B[kk × cout] (the weights, ldb = kk), all in bounds.
                    unsafe {
                        cudarc::cublas::result::gemm_ex(
                            *blas.handle(),
                            op,
                            op,
                            g.m,
                            g.n,
                            g.k,
                            (&alpha) as *const f32 as *const _,
                            pa as *const _,
                            cudarc::cublas::sys::cudaDataType_t::CUDA_R_16F,
                            g.lda,
                            pb as *const _,
                            cudarc::cublas::sys::cudaDataType_t::CUDA_R_16F,
                            g.ldb,
                            (&beta) as *const f32 as *const _,
                            pc as *mut _,
                            cudarc::cublas::sys::cudaDataType_t::CUDA_R_32F,
                            g.ldc,
                            cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                            cudarc::cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                        )
                    }
                    .map_err(&gemm_err)?;
                }
            }
            _ => {
                // SAFETY: bsp_im2col writes the first (y1-y0)·wo·kk elements before the GEMM reads them.
                let mut col = unsafe { self.stream.alloc::<f32>(elems.max(1)) }
                    .map_err(drv("cuMemAllocAsync"))?;
                for y0 in (0..ho).step_by(rows) {
                    let y1 = (y0 + rows).min(ho);
                    let n = (y1 - y0) * wo;
                    let g = band_gemm(conv, ho, wo, y0, y1)?;
                    let (a, b1) = (y0 as i32, y1 as i32);
                    let mut b = self.stream.launch_builder(&self.k.im2col);
                    b.arg(&x.data)
                        .arg(&cin)
                        .arg(&h)
                        .arg(&w)
                        .arg(&ki)
                        .arg(&si)
                        .arg(&a)
                        .arg(&b1)
                        .arg(&woi)
                        .arg(&mut col);
                    // SAFETY: as for the f16 variant.
                    unsafe { b.launch(grid(n * kk)) }.map_err(drv("cuLaunchKernel bsp_im2col"))?;
                    let cfg = GemmConfig {
                        transa: op,
                        transb: op,
                        m: g.m,
                        n: g.n,
                        k: g.k,
                        alpha: 1.0f32,
                        lda: g.lda,
                        ldb: g.ldb,
                        beta: 1.0f32,
                        ldc: g.ldc,
                    };
                    let a_view = col.slice(0..n * kk);
                    let mut c_view = out.data.slice_mut(g.c_offset..);
                    // SAFETY: as above, in f32.
                    unsafe { blas.gemm(cfg, &a_view, &wts.w, &mut c_view) }.map_err(&gemm_err)?;
                }
            }
        }
        Ok(out)
    }

    fn upsample_nearest2x(&self, x: &CudaTensor) -> Result<CudaTensor> {
        let mut out = self.tensor(x.c, 2 * x.h, 2 * x.w, "an upsampled activation")?;
        let n = out.len();
        let (c, h, w) = (
            to_i32(x.c, "channels")?,
            to_i32(x.h, "height")?,
            to_i32(x.w, "width")?,
        );
        let mut b = self.stream.launch_builder(&self.k.upsample);
        b.arg(&x.data).arg(&c).arg(&h).arg(&w).arg(&mut out.data);
        // SAFETY: bsp_upsample2x(const float*, int, int, int, float*): 4·c·h·w outputs.
        unsafe { b.launch(grid(n)) }.map_err(drv("cuLaunchKernel bsp_upsample2x"))?;
        Ok(out)
    }

    fn pad(&self, x: &CudaTensor, pad: Pad, mode: PaddingMode) -> Result<CudaTensor> {
        let (oh, ow) = (x.h + pad.top + pad.bottom, x.w + pad.left + pad.right);
        let mut out = self.tensor(x.c, oh, ow, "a padded activation")?;
        let n = out.len();
        let m: i32 = match mode {
            PaddingMode::Zero => 0,
            PaddingMode::Replicate => 1,
            PaddingMode::Reflect => 2,
            PaddingMode::Circular => 3,
        };
        let v = [
            to_i32(x.c, "channels")?,
            to_i32(x.h, "height")?,
            to_i32(x.w, "width")?,
            to_i32(pad.top, "padding")?,
            to_i32(pad.left, "padding")?,
            to_i32(oh, "height")?,
            to_i32(ow, "width")?,
        ];
        let mut b = self.stream.launch_builder(&self.k.pad);
        b.arg(&x.data);
        for a in &v {
            b.arg(a);
        }
        b.arg(&m).arg(&mut out.data);
        // SAFETY: bsp_pad(const float*, int c, h, w, top, left, oh, ow, mode, float*): every read index
        // is mapped into 0..h × 0..w (or is a zero), c·oh·ow outputs.
        unsafe { b.launch(grid(n)) }.map_err(drv("cuLaunchKernel bsp_pad"))?;
        Ok(out)
    }

    fn gather(
        &self,
        x: &CudaTensor,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<CudaTensor> {
        if ys.iter().flatten().any(|&y| y >= x.h) || xs.iter().flatten().any(|&v| v >= x.w) {
            return Err(Error::Device(format!(
                "gather outside a {}x{} activation",
                x.w, x.h
            )));
        }
        let (ym, xm, _maps) = self.upload_maps(ys, xs)?;
        let mut out = self.tensor(x.c, ys.len(), xs.len(), "a gathered window")?;
        let n = out.len();
        let (sh, sw) = (x.h as i64, x.w as i64);
        let (c, ny, nx) = (
            to_i32(x.c, "channels")?,
            to_i32(ys.len(), "rows")?,
            to_i32(xs.len(), "columns")?,
        );
        let mut b = self.stream.launch_builder(&self.k.gather);
        b.arg(&x.data)
            .arg(&sh)
            .arg(&sw)
            .arg(&c)
            .arg(&ym)
            .arg(&ny)
            .arg(&xm)
            .arg(&nx)
            .arg(&mut out.data);
        // SAFETY: bsp_gather's signature; every index was checked inside x above.
        unsafe { b.launch(grid(n)) }.map_err(drv("cuLaunchKernel bsp_gather"))?;
        Ok(out)
    }

    fn paste(&self, dst: &mut CudaTensor, y0: usize, x0: usize, src: &CudaTensor) -> Result<()> {
        if src.c != dst.c || y0 + src.h > dst.h || x0 + src.w > dst.w {
            return Err(Error::Device(format!(
                "a {}x{}x{} tile at ({y0}, {x0}) does not fit a {}x{}x{} layer",
                src.c, src.h, src.w, dst.c, dst.h, dst.w
            )));
        }
        let (dh, dw, py, px) = (dst.h as i64, dst.w as i64, y0 as i64, x0 as i64);
        let (c, sh, sw) = (
            to_i32(src.c, "channels")?,
            to_i32(src.h, "height")?,
            to_i32(src.w, "width")?,
        );
        let mut b = self.stream.launch_builder(&self.k.paste);
        b.arg(&mut dst.data)
            .arg(&dh)
            .arg(&dw)
            .arg(&src.data)
            .arg(&c)
            .arg(&sh)
            .arg(&sw)
            .arg(&py)
            .arg(&px);
        // SAFETY: bsp_paste's signature; the tile lies inside dst (checked above).
        unsafe { b.launch(grid(src.len())) }.map_err(drv("cuLaunchKernel bsp_paste"))?;
        Ok(())
    }

    fn channel_stats(&self, x: &CudaTensor) -> Result<Vec<ChannelStats>> {
        let plane = x.h * x.w;
        let nb = device::stats_blocks(plane);
        let _lease = self.meter.lease(
            device::stats_scratch_bytes(x.c, plane),
            "statistics partials",
        )?;
        let alloc = drv("cuMemAllocAsync");
        // SAFETY: each buffer is fully written by the kernel before it is read.
        let (mut partials, mut sums, mut m2) = unsafe {
            (
                self.stream
                    .alloc::<f64>((x.c * nb).max(1))
                    .map_err(&alloc)?,
                self.stream.alloc::<f64>(x.c.max(1)).map_err(&alloc)?,
                self.stream.alloc::<f64>(x.c.max(1)).map_err(&alloc)?,
            )
        };
        let p64 = plane as i64;
        let (nbi, c) = (nb as i32, to_i32(x.c, "channels")?);
        let reduce_cfg = LaunchConfig {
            grid_dim: (nb as u32, x.c as u32, 1),
            block_dim: (STATS_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        for squares in [0i32, 1] {
            let mut b = self.stream.launch_builder(&self.k.partials);
            b.arg(&x.data)
                .arg(&p64)
                .arg(&sums)
                .arg(&squares)
                .arg(&mut partials);
            // SAFETY: bsp_channel_partials' signature; blockDim 256 (its shared array's size), grid
            // (nb, c) writes partials[c·nb]; sums is read only in the squares pass, after it was written.
            unsafe { b.launch(reduce_cfg) }.map_err(drv("cuLaunchKernel bsp_channel_partials"))?;
            let target = if squares == 0 { &mut sums } else { &mut m2 };
            let mut b = self.stream.launch_builder(&self.k.sum_partials);
            b.arg(&partials).arg(&nbi).arg(&c).arg(target);
            // SAFETY: bsp_sum_partials(const double*, int nb, int c, double*): c outputs.
            unsafe { b.launch(grid(x.c)) }.map_err(drv("cuLaunchKernel bsp_sum_partials"))?;
        }
        let d2h = drv("cuMemcpyDtoHAsync");
        let sums = self.stream.clone_dtoh(&sums).map_err(&d2h)?;
        let m2 = self.stream.clone_dtoh(&m2).map_err(&d2h)?;
        Ok((0..x.c)
            .map(|ch| ChannelStats {
                count: plane as u64,
                mean: if plane == 0 {
                    0.0
                } else {
                    sums[ch] / plane as f64
                },
                m2: m2[ch],
            })
            .collect())
    }

    fn normalize(
        &self,
        x: &mut CudaTensor,
        stats: &[ChannelStats],
        norm: &Norm,
        relu: bool,
    ) -> Result<()> {
        let _lease = self
            .meter
            .lease(device::norm_scratch_bytes(x.c), "scale and shift")?;
        let (scale, shift) = norm.scale_shift(stats);
        let h2d = drv("cuMemcpyHtoDAsync");
        let scale = self.stream.clone_htod(&scale).map_err(&h2d)?;
        let shift = self.stream.clone_htod(&shift).map_err(&h2d)?;
        let (c, p, r) = (to_i32(x.c, "channels")?, (x.h * x.w) as i64, relu as i32);
        let n = x.len();
        let mut b = self.stream.launch_builder(&self.k.scale_shift);
        b.arg(&mut x.data)
            .arg(&c)
            .arg(&p)
            .arg(&scale)
            .arg(&shift)
            .arg(&r);
        // SAFETY: bsp_scale_shift(float*, int, i64, const float*, const float*, int): c channels.
        unsafe { b.launch(grid(n)) }
            .map_err(drv("cuLaunchKernel bsp_scale_shift"))
            .map(|_| ())
    }

    fn relu(&self, x: &mut CudaTensor) -> Result<()> {
        let n = x.len();
        let n64 = n as i64;
        let mut b = self.stream.launch_builder(&self.k.relu);
        b.arg(&mut x.data).arg(&n64);
        // SAFETY: bsp_relu(float*, i64): n elements.
        unsafe { b.launch(grid(n)) }
            .map_err(drv("cuLaunchKernel bsp_relu"))
            .map(|_| ())
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        if (x.c, x.h, x.w) != (y.c, y.h, y.w) {
            return Err(Error::Device(format!(
                "residual add of a {}x{}x{} activation to a {}x{}x{} one",
                y.c, y.h, y.w, x.c, x.h, x.w
            )));
        }
        let n = x.len();
        let n64 = n as i64;
        let mut b = self.stream.launch_builder(&self.k.add);
        b.arg(&mut x.data).arg(&y.data).arg(&n64);
        // SAFETY: bsp_add(float*, const float*, i64): n elements each.
        unsafe { b.launch(grid(n)) }
            .map_err(drv("cuLaunchKernel bsp_add"))
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_setup::Arch;

    fn compile(major: u32, minor: u32) -> Result<cudarc::nvrtc::Ptx> {
        Ok(PROGRAM.compile(Arch::new(major, minor))?)
    }

    /// Entry points that call CUDA's math library (`expf`, `tanhf`, `log1pf`, `powf`, `exp`, `tanh`), whose
    /// implementations use fused multiply-adds of their own, explicitly, whatever `--fmad` says.
    const MATH_LIBRARY_ENTRIES: [&str; 3] = ["bsp_unary", "bsp_binary", "bsp_binary_const"];

    /// The real NVRTC compiles kernels.cu for every architecture from Turing to Blackwell, with every
    /// entry point and no fused multiply-add outside CUDA's math library (runs wherever libnvrtc loads, GPU
    /// or not: e.g. with the nvidia-cuda-nvrtc wheel's lib folder on LD_LIBRARY_PATH). `BSP_PTX_DIR=dir`
    /// writes the PTX there, for `ptxas -arch=sm_90 -v`.
    #[test]
    fn nvrtc_compiles_kernels_for_every_arch() {
        if let Err(e) = Library::Nvrtc.require() {
            eprintln!("skipping: {}", Error::from(e));
            return;
        }
        let dir = std::env::var_os("BSP_PTX_DIR").map(std::path::PathBuf::from);
        let every = PROGRAM.compile_every(&cuda_setup::EVERY_ARCH, &KERNEL_NAMES, dir.as_deref());
        for (arch, src) in every.unwrap_or_else(|e| panic!("{e}")) {
            // --fmad=false: no contraction of x·a + b (the CPU backend rounds x·a and + b apart). Each
            // entry's PTX runs from its `.entry` line to the next one.
            let mut entries = src.split(".visible .entry ").skip(1).peekable();
            assert!(entries.peek().is_some(), "{arch}: no entry points");
            for body in entries {
                let name = body.split('(').next().unwrap_or("").trim();
                if MATH_LIBRARY_ENTRIES.contains(&name) {
                    continue;
                }
                assert!(
                    !body.contains("fma.rn.f32") && !body.contains("fma.rn.f64"),
                    "{arch}: fused multiply-add in {name}"
                );
            }
        }
    }

    /// Without the libraries every entry point is a typed error naming what is missing, never a panic.
    #[test]
    fn missing_libraries_are_typed_errors() {
        match CudaBackend::new(0, None, Precision::F32) {
            Ok(b) => eprintln!("skipping: a GPU is present ({})", b.name()),
            Err(e @ (Error::NoDriver | Error::NoDevice { .. } | Error::NoCudaLibrary { .. })) => {
                let msg = e.to_string();
                assert!(msg.starts_with("device cuda"), "{msg}");
                assert!(!msg.contains('\n'), "{msg}");
            }
            Err(e) => panic!("unexpected error without a GPU: {e}"),
        }
        match compile(9, 0) {
            Ok(_) => eprintln!("skipping: NVRTC present here"),
            Err(Error::NoCudaLibrary { lib, .. }) => assert_eq!(lib, "libnvrtc"),
            Err(e) => panic!("{e}"),
        }
    }
}
