//! The CUDA backend: values in device memory ([`CudaTensor`]), convolution as an im2col kernel + cuBLAS
//! GEMM (f32, or f16 operands with f32 accumulation), and the graph's other ops as small kernels from
//! [`KERNEL_SOURCE`] (`kernels.cu`), compiled by NVRTC once per process and architecture; `graph` runs
//! the graph engine's nodes on them ([`crate::GraphOps`]).
//!
//! libcuda, libnvrtc and libcublas are loaded at run time (`cudarc`'s `dynamic-loading`): the crate builds
//! and its tests run on machines without CUDA, and [`CudaBackend::new`] says which library is missing
//! ([`Error::NoDriver`], [`Error::NoCudaLibrary`]) instead of panicking — cudarc panics on the first call
//! into a library it cannot load, so every entry point checks first.
//!
//! All work goes to one stream, in order: the engine gives a device backend one tile at a time
//! ([`crate::GraphOps::tiles_at_once`] is 1) and the GPU's parallelism is inside each call. Every device
//! allocation takes a lease on the backend's [`Meter`] first, so device memory stays within the budget
//! (the meter refuses if it would not).

use crate::device::{DEVICE_BAND_BYTES, HEADROOM, Precision};
use crate::error::{Error, Result};
use crate::meter::{Lease, Meter};
use crate::tensor::Tensor;
use cuda_setup::{Library, Program};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
};
use std::sync::{Arc, Mutex};

mod dnn;
mod graph;

/// The CUDA C source of the kernels, embedded in the crate.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

/// The kernels as NVRTC compiles them: `--fmad=false` keeps `x·a + b` two roundings, as in the CPU backend.
static PROGRAM: Program = Program::new("bsp_kernels.cu", KERNEL_SOURCE).without_fmad();

/// The kernels' entry points, in `kernels.cu` order.
pub const KERNEL_NAMES: [&str; 18] = [
    "bsp_to_f16",
    "bsp_add_f16",
    "bsp_fill_bias",
    "bsp_scale_shift",
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
    "bsp_gather_part",
    "bsp_channel_stats",
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

/// The kernels the graph ops share with weight preparation.
struct Kernels {
    to_f16: CudaFunction,
    add_f16: CudaFunction,
    fill_bias: CudaFunction,
    scale_shift: CudaFunction,
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

/// Launch geometry of a grid-stride kernel over `n` elements.
fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 20);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
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
    keeps: bool,
    inlines: bool,
    /// cuDNN for the convolutions, or why not.
    dnn: std::result::Result<Mutex<dnn::Dnn>, String>,
    use_dnn: bool,
    /// Convolutions run through cuDNN, and through im2col + cuBLAS.
    convs: [std::sync::atomic::AtomicU64; 2],
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
            to_f16: load("bsp_to_f16")?,
            add_f16: load("bsp_add_f16")?,
            fill_bias: load("bsp_fill_bias")?,
            scale_shift: load("bsp_scale_shift")?,
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
        // TF32 as PyTorch's `allow_tf32` turns it on: the f32 GEMMs on the tensor cores. cuBLAS's
        // default math is FMA, which f32 keeps.
        if precision == Precision::Tf32 {
            // SAFETY: a live handle and a math mode of cuBLAS's enumeration.
            unsafe {
                cudarc::cublas::sys::cublasSetMathMode(
                    *blas.handle(),
                    cudarc::cublas::sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
                )
            }
            .result()
            .map_err(blas_err("cublasSetMathMode"))?;
        }
        let device_name = ctx.name().unwrap_or_else(|_| format!("GPU {ordinal}"));
        let dnn = dnn::Dnn::open(&stream)
            .map(Mutex::new)
            .map_err(|e| e.to_string());
        Ok(CudaBackend {
            ctx,
            stream,
            blas: Mutex::new(blas),
            k,
            g,
            meter,
            precision,
            band_bytes: DEVICE_BAND_BYTES,
            keeps: true,
            inlines: true,
            use_dnn: dnn.is_ok(),
            dnn,
            convs: Default::default(),
            device_name,
            baseline_used: (total - free) as u64,
            _workspace: (ws, ws_lease),
        })
    }

    /// Sets the im2col band size (bytes of columns per GEMM; smaller means more, narrower GEMMs).
    pub fn set_band_bytes(&mut self, bytes: usize) {
        self.band_bytes = bytes.max(1);
    }

    /// Whether a run's stored values stay in device memory while the budget holds them (the default), or
    /// every one is stored on the host (each crossing the bus both ways): what the benchmark compares.
    pub fn set_keep_values(&mut self, keep: bool) {
        self.keeps = keep;
    }

    /// Whether small-halo units are computed inside their reader's superstep (the default, as on the
    /// CPU: fewer values kept or moved to the host, for a recomputed halo of at most a tenth of the
    /// unit) or stored like every other value: what the benchmark compares.
    pub fn set_inline_units(&mut self, inline: bool) {
        self.inlines = inline;
    }

    /// Whether convolutions run through cuDNN (the default where it loads) or im2col + cuBLAS: what the
    /// benchmark compares. Asking for cuDNN where it did not load
    /// fails with the reason.
    pub fn set_cudnn(&mut self, on: bool) -> Result<()> {
        if on && let Err(why) = &self.dnn {
            return Err(Error::Device(format!("cuDNN is not available: {why}")));
        }
        self.use_dnn = on;
        Ok(())
    }

    /// Convolutions run so far through cuDNN and through im2col + cuBLAS.
    pub fn conv_counts(&self) -> (u64, u64) {
        let [a, b] = &self.convs;
        (
            a.load(std::sync::atomic::Ordering::Relaxed),
            b.load(std::sync::atomic::Ordering::Relaxed),
        )
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
        Ok((self.alloc_leased(n)?, lease))
    }

    /// [`Self::alloc`] for a buffer the caller can do without: `None` when the budget has no room for
    /// it (cuDNN's scratch: im2col, whose band narrows to fit, then takes the convolution).
    fn try_alloc<T: cudarc::driver::DeviceRepr>(
        &self,
        n: usize,
        what: &str,
    ) -> Result<Option<(CudaSlice<T>, Lease)>> {
        let Ok(lease) = self
            .meter
            .lease((n * std::mem::size_of::<T>()) as u64, what)
        else {
            return Ok(None);
        };
        Ok(Some((self.alloc_leased(n)?, lease)))
    }

    /// `n` elements of device memory, leased by the caller.
    fn alloc_leased<T: cudarc::driver::DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every caller writes the elements it later reads (a kernel fills the whole buffer).
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(drv("cuMemAllocAsync"))
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
}

impl CudaBackend {
    /// The device, the GEMM and the budget, as a run's report names the backend.
    pub fn name(&self) -> String {
        let (dnn, gemm) = match self.precision {
            Precision::F32 => ("f32 FMA math (no TF32)", "sgemm"),
            Precision::Tf32 => ("TF32 tensor-op math", "sgemm, TF32 tensor-op math"),
            Precision::F16 => (
                "binary16 tensors, f32 arithmetic, tensor-op math",
                "f16 gemm, f32 accumulation",
            ),
        };
        let convs = match (&self.dnn, self.use_dnn) {
            (Ok(_), true) => format!("cuDNN, {dnn}"),
            (Ok(_), false) => format!("im2col + cuBLAS {gemm} (cuDNN off)"),
            (Err(why), _) => format!("im2col + cuBLAS {gemm} (no cuDNN: {why})"),
        };
        format!(
            "cuda ({}, convolutions: {convs}, budget {} bytes)",
            self.device_name,
            self.meter.budget()
        )
    }

    /// `t` copied to the device, leased.
    pub fn upload(&self, t: Tensor) -> Result<CudaTensor> {
        let lease = self
            .meter
            .lease(Tensor::bytes(t.c, t.h, t.w), "an uploaded tile")?;
        let data = if t.data.is_empty() {
            // SAFETY: an empty tensor is never read.
            unsafe { self.stream.alloc::<f32>(1) }.map_err(drv("cuMemAllocAsync"))?
        } else {
            self.meter.copied(Tensor::bytes(t.c, t.h, t.w));
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

    /// `x` copied back to the host.
    pub fn download(&self, x: CudaTensor) -> Result<Tensor> {
        let mut out = crate::buffers::scratch(x.len())?;
        if !out.is_empty() {
            self.meter.copied(Tensor::bytes(x.c, x.h, x.w));
            let src = x.data.slice(0..out.len());
            // A copy to pageable host memory returns once it has completed.
            self.stream
                .memcpy_dtoh(&src, &mut out)
                .map_err(drv("cuMemcpyDtoHAsync"))?;
        }
        Tensor::from_vec(x.c, x.h, x.w, out)
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
        use cuda_setup::testing::{LibraryTest, nvrtc_for_test};
        match nvrtc_for_test("cuda::tests::nvrtc_compiles_kernels_for_every_arch") {
            LibraryTest::Here => {}
            LibraryTest::PassedInChild => return,
            LibraryTest::Missing(reason) => return stdx::testing::skip(reason),
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
