//! The GPU side: NVRTC compilation (once per process and architecture), streams, pinned staging with
//! double buffering, and the single launch that decodes a whole batch.

use crate::error::Error;
use crate::plan::{BatchPlan, DecodeOptions, ImageSlot};
use crate::sample::{SampleOptions, SamplePlan, SampleSource, TensorInfo};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchConfig, PinnedHostSlice, PushKernelArg, result, sys,
};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use vocab::{DType, Window};

/// The CUDA C source of the decoder, embedded in the crate.
pub(crate) const KERNEL_SRC: &str = include_str!("kernel.cu");

/// Fails with [`Error::NoDriver`] when libcuda cannot be loaded. cudarc panics on first use of a missing
/// library, so every entry point asks first.
pub(crate) fn ensure_driver() -> Result<(), Error> {
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::NoDriver)
    }
}

fn ensure_nvrtc() -> Result<(), Error> {
    // SAFETY: only tries to dlopen libnvrtc.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::NoNvrtc)
    }
}

/// Number of CUDA devices; [`Error::NoDriver`] without a driver.
pub fn device_count() -> Result<usize, Error> {
    ensure_driver()?;
    let n = CudaContext::device_count().map_err(|e| Error::driver("cuDeviceGetCount", e))?;
    Ok(n.max(0) as usize)
}

/// PTX for `compute_XY`, compiled by NVRTC at most once per process per architecture.
fn ptx_for(major: i32, minor: i32) -> Result<Ptx, Error> {
    type Cache = Mutex<HashMap<(i32, i32), Ptx>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ptx) = map.get(&(major, minor)) {
        return Ok(ptx.clone());
    }
    let ptx = compile_for_arch(&format!("compute_{major}{minor}"))?;
    map.insert((major, minor), ptx.clone());
    Ok(ptx)
}

/// Compiles the embedded kernels with NVRTC for one virtual architecture (`compute_XY`): PTX the driver
/// JIT-compiles for the exact device once, and caches. Needs libnvrtc, not a GPU.
pub(crate) fn compile_for_arch(arch: &str) -> Result<Ptx, Error> {
    ensure_nvrtc()?;
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some("l3_kernel.cu".into()),
        ..Default::default()
    };
    compile_ptx_with_opts(KERNEL_SRC, opts).map_err(|e| Error::Compile {
        arch: arch.to_string(),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        },
    })
}

/// The decode kernels of one element type: whole images and samples.
struct KernelPair {
    images: CudaFunction,
    samples: CudaFunction,
}

struct Kernels {
    u8: KernelPair,
    f32: KernelPair,
    f16: KernelPair,
}

impl Kernels {
    fn for_dtype(&self, dtype: DType) -> &KernelPair {
        match dtype {
            DType::U8 => &self.u8,
            DType::F32 => &self.f32,
            DType::F16 => &self.f16,
        }
    }
}

/// The entry points of kernel.cu, as the NVRTC test checks them.
#[cfg(test)]
pub(crate) const KERNEL_NAMES: [&str; 6] = [
    "l3_decode_u8",
    "l3_decode_f32",
    "l3_decode_f16",
    "l3_samples_u8",
    "l3_samples_f32",
    "l3_samples_f16",
];

/// One half of the double buffer: pinned host staging and the device input it is copied to.
struct Slot {
    staging: Option<PinnedHostSlice<u8>>,
    input: Option<CudaSlice<u8>>,
    /// Recorded on the copy stream after the H2D copy out of `staging`: the host may refill it after this.
    copied: CudaEvent,
}

/// Decoded images in device memory, one buffer for the whole batch.
#[derive(Debug)]
pub enum DeviceOutput {
    U8(CudaSlice<u8>),
    F32(CudaSlice<f32>),
    /// IEEE binary16 bit patterns.
    F16(CudaSlice<u16>),
}

impl DeviceOutput {
    /// The allocation's address (no synchronisation: the caller orders its use after `ready`).
    fn ptr(&self) -> sys::CUdeviceptr {
        fn ptr<T>(s: &CudaSlice<T>) -> sys::CUdeviceptr {
            let (ptr, _record) = s.device_ptr(s.stream());
            ptr
        }
        match self {
            DeviceOutput::U8(s) => ptr(s),
            DeviceOutput::F32(s) => ptr(s),
            DeviceOutput::F16(s) => ptr(s),
        }
    }

    fn num_bytes(&self) -> usize {
        match self {
            DeviceOutput::U8(s) => s.num_bytes(),
            DeviceOutput::F32(s) => s.num_bytes(),
            DeviceOutput::F16(s) => s.num_bytes(),
        }
    }

    fn context(&self) -> &Arc<CudaContext> {
        match self {
            DeviceOutput::U8(s) => s.context(),
            DeviceOutput::F32(s) => s.context(),
            DeviceOutput::F16(s) => s.context(),
        }
    }

    /// Gives up ownership of the allocation (the caller frees it).
    fn leak(self) -> sys::CUdeviceptr {
        match self {
            DeviceOutput::U8(s) => s.leak(),
            DeviceOutput::F32(s) => s.leak(),
            DeviceOutput::F16(s) => s.leak(),
        }
    }
}

/// The plan a batch was launched from: what maps the kernel's error word back to a batch index.
#[derive(Debug, Clone)]
enum Origin {
    Images(Arc<BatchPlan>),
    Samples(Arc<SamplePlan>),
}

impl Origin {
    fn kernel_error(&self, err: u32) -> Result<(), Error> {
        match self {
            Origin::Images(p) => p.kernel_error(err),
            Origin::Samples(p) => p.kernel_error(err),
        }
    }
}

/// A batch whose decode has been queued, in device memory. Its output is valid once
/// [`ready`](Self::ready) has completed: make a compute stream wait on it (`stream.wait(batch.ready())`,
/// or [`wait_in`](Self::wait_in) for a stream of another library), or call [`wait`](Self::wait), which
/// also reports a patch the kernel found corrupt.
///
/// For a DLPack export: [`device_ptr`](Self::device_ptr), [`tensor`](Self::tensor) (shape, strides,
/// element type), [`device_ordinal`](Self::device_ordinal); the consumer's stream waits with
/// [`wait_in`](Self::wait_in). Every stream passed to `wait_in` is remembered, and dropping the batch
/// frees its output only after the work queued on those streams so far: a consumer's last kernels may
/// still be reading it when the consumer lets go (what a DLPack deleter does).
#[derive(Debug)]
pub struct DecodedBatch {
    /// `Some` until the batch is dropped or freed with [`free_after`](Self::free_after).
    output: Option<DeviceOutput>,
    images: Vec<ImageSlot>,
    tensor: Option<TensorInfo>,
    err: CudaSlice<u32>,
    ready: CudaEvent,
    origin: Origin,
    /// Reads the error word back: not the decode stream, where later batches may already be queued.
    readback: Arc<CudaStream>,
    /// The streams made to wait with [`wait_in`](Self::wait_in) (as addresses: `CUstream` is a pointer).
    consumers: Mutex<Vec<usize>>,
    /// Where the launch's ANS blocks left their residual codes: kept until the batch is dropped (freed
    /// in stream order after the launch).
    _scratch: CudaSlice<u8>,
}

impl DecodedBatch {
    /// Where each image (or sample) lies in [`output`](Self::output), in batch order. A sample batch's
    /// slots are its samples: `width`×`height`×3 each, back to back.
    pub fn images(&self) -> &[ImageSlot] {
        &self.images
    }

    pub fn output(&self) -> &DeviceOutput {
        self.output
            .as_ref()
            .expect("present until the batch is dropped")
    }

    /// Recorded on the decode stream right after the launch.
    pub fn ready(&self) -> &CudaEvent {
        &self.ready
    }

    /// The batch as one dense tensor: always for a sample batch, for a whole-image batch only when every
    /// image has the same size and channel count (else `None`: use [`images`](Self::images)).
    pub fn tensor(&self) -> Option<TensorInfo> {
        self.tensor
    }

    /// The output's device address (`CUdeviceptr`), valid while this batch (or, after
    /// [`free_after`](Self::free_after), until the stream passed there frees it) lives. Reading it before
    /// [`ready`](Self::ready) completed reads unfinished output.
    pub fn device_ptr(&self) -> u64 {
        self.output().ptr()
    }

    /// Bytes of output.
    pub fn byte_len(&self) -> usize {
        self.output().num_bytes()
    }

    /// The CUDA device the output lives on (DLPack's `device_id`).
    pub fn device_ordinal(&self) -> usize {
        self.output().context().ordinal()
    }

    /// Makes `stream` (any stream of this device's primary context or of the decoder's context, e.g. a
    /// PyTorch stream's `cuda_stream` handle) wait for the decode, without blocking the host: what DLPack's
    /// `__dlpack__(stream=...)` asks of a producer. The stream is remembered: dropping the batch frees the
    /// output after the work queued on it by then.
    ///
    /// # Safety
    /// `stream` must be a live stream handle (or `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD`) of the
    /// context this batch was decoded in, and must stay alive until the batch is dropped.
    pub unsafe fn wait_in(&self, stream: sys::CUstream) -> Result<(), Error> {
        self.output()
            .context()
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        // SAFETY: the event is alive (owned by self); the caller vouches for the stream.
        unsafe {
            result::stream::wait_event(
                stream,
                self.ready.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| Error::driver("cuStreamWaitEvent", e))?;
        let mut consumers = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        if !consumers.contains(&(stream as usize)) {
            consumers.push(stream as usize);
        }
        Ok(())
    }

    /// Frees the output in `stream`'s order, after the work queued there so far (and after the decode,
    /// and after the work queued so far on every stream passed to [`wait_in`](Self::wait_in)): an
    /// explicit DLPack deleter. The rest of the batch (error word, event) is released at once.
    ///
    /// # Safety
    /// `stream` must be a live stream handle of the context this batch was decoded in, and nothing may
    /// use [`device_ptr`](Self::device_ptr) after work queued on `stream` from now on.
    pub unsafe fn free_after(mut self, stream: sys::CUstream) -> Result<(), Error> {
        // SAFETY: forwarded from the caller; earlier consumers were vouched for by `wait_in`'s callers.
        unsafe {
            self.wait_in(stream)?;
            self.free_in_consumer_order()
        }
    }

    /// Frees the output after the work queued so far on every consumer stream: the first consumer waits
    /// for the others, and the memory is freed in its order.
    ///
    /// # Safety
    /// Every remembered consumer stream is alive (the contract of [`wait_in`](Self::wait_in)).
    unsafe fn free_in_consumer_order(&mut self) -> Result<(), Error> {
        let consumers = std::mem::take(self.consumers.get_mut().unwrap_or_else(|p| p.into_inner()));
        let Some((&first, rest)) = consumers.split_first() else {
            return Ok(());
        };
        let Some(output) = self.output.take() else {
            return Ok(());
        };
        let ctx = output.context().clone();
        ctx.bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let first = first as sys::CUstream;
        for &other in rest {
            let joined = ctx
                .new_event(None)
                .map_err(|e| Error::driver("cuEventCreate", e))?;
            // SAFETY: live streams (the caller's contract), a live event.
            unsafe {
                result::event::record(joined.cu_event(), other as sys::CUstream)
                    .map_err(|e| Error::driver("cuEventRecord", e))?;
                result::stream::wait_event(
                    first,
                    joined.cu_event(),
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
                .map_err(|e| Error::driver("cuStreamWaitEvent", e))?;
            }
        }
        let ptr = output.leak();
        if ctx.has_async_alloc() {
            // SAFETY: `ptr` is a live allocation nobody else frees (leaked above); freed in stream order,
            // after every consumer's queued work (joined above) and the decode (each consumer waited).
            unsafe { result::free_async(ptr, first) }
                .map_err(|e| Error::driver("cuMemFreeAsync", e))
        } else {
            // SAFETY: as above; the stream has finished every use when it is synchronised.
            unsafe {
                result::stream::synchronize(first)
                    .map_err(|e| Error::driver("cuStreamSynchronize", e))?;
                result::free_sync(ptr).map_err(|e| Error::driver("cuMemFree", e))
            }
        }
    }

    /// Blocks until the decode finished and reports a patch the kernel found corrupt
    /// ([`Error::CorruptRows`], naming the image's batch index). Later batches queued on the decode
    /// stream are not waited for.
    pub fn wait(&self) -> Result<(), Error> {
        self.ready
            .synchronize()
            .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        let err = self
            .readback
            .clone_dtoh(&self.err)
            .map_err(|e| Error::driver("cuMemcpyDtoH", e))?;
        self.origin.kernel_error(err[0])
    }

    /// Waits, then copies the output to the host as raw bytes (native-endian elements): for tests, tools
    /// and consumers that want host memory.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>, Error> {
        self.wait()?;
        let copy = |e| Error::driver("cuMemcpyDtoH", e);
        let rb = &self.readback;
        Ok(match self.output() {
            DeviceOutput::U8(s) => rb.clone_dtoh(s).map_err(copy)?,
            DeviceOutput::F32(s) => rb
                .clone_dtoh(s)
                .map_err(copy)?
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
            DeviceOutput::F16(s) => rb
                .clone_dtoh(s)
                .map_err(copy)?
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
        })
    }
}

impl Drop for DecodedBatch {
    fn drop(&mut self) {
        // SAFETY: every remembered consumer stream was vouched alive until now by `wait_in`'s caller.
        if let Err(e) = unsafe { self.free_in_consumer_order() } {
            // The memory cannot be freed in the consumers' order: wait for the whole device instead, so
            // that the plain free below cannot race a consumer's kernel.
            eprintln!("l3-cuda: {e}; synchronising the device before freeing a batch");
            if let Some(out) = &self.output {
                let _ = out.context().synchronize();
            }
        }
    }
}

/// A batch whose compressed bytes (and patch table) already live in device memory: decoding it measures
/// the kernel alone, and a dataset small enough to stay resident can be decoded epoch after epoch.
pub struct ResidentBatch {
    origin: Origin,
    input: CudaSlice<u8>,
    offsets: InputOffsets,
}

impl ResidentBatch {
    /// The plan of a whole-image batch ([`BatchDecoder::upload`]); `None` for a sample batch.
    pub fn plan(&self) -> Option<&BatchPlan> {
        match &self.origin {
            Origin::Images(p) => Some(p),
            Origin::Samples(_) => None,
        }
    }

    /// The plan of a sample batch ([`BatchDecoder::upload_samples`]); `None` for a whole-image batch.
    pub fn sample_plan(&self) -> Option<&SamplePlan> {
        match &self.origin {
            Origin::Samples(p) => Some(p),
            Origin::Images(_) => None,
        }
    }

    /// Bytes of device input (patch data and tables).
    pub fn input_len(&self) -> usize {
        self.offsets.total
    }
}

/// Where the descriptor table, the padding table, the scale/bias table and the end lie in the packed
/// device input (patch data first, from offset 0).
#[derive(Debug, Clone, Copy)]
struct InputOffsets {
    data_len: usize,
    descs: usize,
    /// Version-2 descriptors.
    v2: usize,
    fills: usize,
    /// Version-2 ANS context tables (4-byte aligned).
    tables: usize,
    scale_bias: usize,
    total: usize,
}

impl InputOffsets {
    fn new(
        data_len: usize,
        desc_bytes: usize,
        v2_bytes: usize,
        fill_bytes: usize,
        table_bytes: usize,
    ) -> Self {
        // Every section is a whole number of 8-byte descriptors, so each starts 8-aligned.
        let descs = data_len.next_multiple_of(16);
        let v2 = descs + desc_bytes;
        let fills = v2 + v2_bytes;
        let tables = fills + fill_bytes;
        let scale_bias = (tables + table_bytes).next_multiple_of(4);
        InputOffsets {
            data_len,
            descs,
            v2,
            fills,
            tables,
            scale_bias,
            total: scale_bias + 8 * 4,
        }
    }

    fn of(plan: &BatchPlan) -> Self {
        Self::new(
            plan.data_len,
            plan.descs.len() * crate::plan::DESC_BYTES,
            plan.v2.descs.len() * crate::v2::V2_DESC_BYTES,
            0,
            plan.v2.tables.len(),
        )
    }

    fn of_samples(plan: &SamplePlan) -> Self {
        Self::new(
            plan.data_len,
            plan.descs.len() * crate::sample::SAMPLE_DESC_BYTES,
            plan.v2.descs.len() * crate::v2::V2_DESC_BYTES,
            plan.fills.len() * crate::sample::FILL_DESC_BYTES,
            plan.v2.tables.len(),
        )
    }
}

/// Everything after the patch data, serialised: the descriptor tables, the ANS context tables and the
/// scale/bias pairs.
struct Tables<'a> {
    descs: Vec<u8>,
    v2: Vec<u8>,
    fills: Vec<u8>,
    ans: &'a [u8],
    scale_bias: &'a [f32; 8],
}

impl<'a> Tables<'a> {
    fn of(plan: &'a BatchPlan) -> Self {
        Tables {
            descs: plan.descriptor_bytes(),
            v2: plan.v2.descriptor_bytes(),
            fills: Vec::new(),
            ans: &plan.v2.tables,
            scale_bias: &plan.scale_bias,
        }
    }

    fn of_samples(plan: &'a SamplePlan) -> Self {
        Tables {
            descs: plan.descriptor_bytes(),
            v2: plan.v2.descriptor_bytes(),
            fills: plan.fill_bytes(),
            ans: &plan.v2.tables,
            scale_bias: &plan.scale_bias,
        }
    }
}

/// The whole device input, `[0, off.total)`: packed patch data, then the tables.
fn pack_input(plan: &BatchPlan, images: &[&[u8]], off: InputOffsets, dst: &mut [u8]) {
    plan.pack_into(images, &mut dst[..plan.data_len]);
    dst[plan.data_len..off.descs].fill(0);
    pack_tables(&Tables::of(plan), off, &mut dst[off.descs..]);
}

/// The whole device input of a sample batch.
fn pack_sample_input(
    plan: &SamplePlan,
    sources: &[SampleSource<'_>],
    off: InputOffsets,
    dst: &mut [u8],
) -> Result<(), Error> {
    plan.pack_into(sources, &mut dst[..plan.data_len])?;
    dst[plan.data_len..off.descs].fill(0);
    pack_tables(&Tables::of_samples(plan), off, &mut dst[off.descs..]);
    Ok(())
}

/// The tables alone, `[off.descs, off.total)`, into `dst` (which starts at off.descs).
fn pack_tables(t: &Tables<'_>, off: InputOffsets, dst: &mut [u8]) {
    let at = |o: usize| o - off.descs;
    dst[..at(off.v2)].copy_from_slice(&t.descs);
    dst[at(off.v2)..at(off.fills)].copy_from_slice(&t.v2);
    dst[at(off.fills)..at(off.tables)].copy_from_slice(&t.fills);
    dst[at(off.tables)..at(off.tables) + t.ans.len()].copy_from_slice(t.ans);
    dst[at(off.tables) + t.ans.len()..at(off.scale_bias)].fill(0);
    let s = at(off.scale_bias);
    for (i, v) in t.scale_bias.iter().enumerate() {
        dst[s + 4 * i..s + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// Whole L3 files back to back in pinned host memory: what a loader reads files into so that they reach
/// the GPU by DMA with no host copy ([`BatchDecoder::submit_pinned`]). Section 4.4's pinned staging.
pub struct PinnedBatch {
    ctx: Arc<CudaContext>,
    buf: PinnedHostSlice<u8>,
    len: usize,
    starts: Vec<usize>,
    /// The last copy out of `buf`: writing waits for it.
    copied: Option<CudaEvent>,
}

impl PinnedBatch {
    fn new(ctx: Arc<CudaContext>, capacity: usize) -> Result<Self, Error> {
        ensure_driver()?;
        // Cached (not write-combined) pinned memory: the host parses the headers it holds.
        // SAFETY: bytes are only read after `push` wrote them.
        let buf = unsafe { ctx.alloc_pinned_with_flags::<u8>(capacity.max(1), 0) }
            .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
        Ok(PinnedBatch {
            ctx,
            buf,
            len: 0,
            starts: Vec::new(),
            copied: None,
        })
    }

    fn wait_copied(&mut self) -> Result<(), Error> {
        if let Some(ev) = self.copied.take() {
            ev.synchronize()
                .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        }
        Ok(())
    }

    fn host(&self) -> Result<&[u8], Error> {
        self.buf
            .as_slice()
            .map_err(|e| Error::driver("cuEventSynchronize", e))
    }

    /// Appends one file's `len` bytes, written by `fill` straight into pinned memory (e.g. `read_exact`).
    pub fn push_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<(), Error> {
        self.wait_copied()?;
        let start = self.len;
        let end = start + len;
        if end > self.buf.len() {
            let cap = end.max(self.buf.len() * 2);
            // SAFETY: the first `start` bytes are copied in right below; the rest only after `fill`.
            let mut bigger = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(cap, 0) }
                .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
            let old = self.host()?;
            bigger
                .as_mut_slice()
                .map_err(|e| Error::driver("cuEventSynchronize", e))?[..start]
                .copy_from_slice(&old[..start]);
            self.buf = bigger;
        }
        let dst = self
            .buf
            .as_mut_slice()
            .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        fill(&mut dst[start..end]).map_err(Error::Io)?;
        self.len = end;
        self.starts.push(start);
        Ok(())
    }

    /// Appends a copy of one file.
    pub fn push(&mut self, file: &[u8]) -> Result<(), Error> {
        self.push_with(file.len(), |d| {
            d.copy_from_slice(file);
            Ok(())
        })
    }

    /// Empties the batch (keeping its memory) once the last copy out of it has finished.
    pub fn clear(&mut self) -> Result<(), Error> {
        self.wait_copied()?;
        self.len = 0;
        self.starts.clear();
        Ok(())
    }

    /// Files in the batch.
    pub fn image_count(&self) -> usize {
        self.starts.len()
    }

    /// Bytes of files in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The files as slices of the pinned buffer.
    pub fn files(&self) -> Result<Vec<&[u8]>, Error> {
        let host = self.host()?;
        let ends = self
            .starts
            .iter()
            .skip(1)
            .copied()
            .chain(std::iter::once(self.len));
        Ok(self
            .starts
            .iter()
            .zip(ends)
            .map(|(&s, e)| &host[s..e])
            .collect())
    }
}

/// Decodes batches of L3 images on one GPU: one launch per batch, output in device memory.
///
/// Copies run on their own stream from pinned staging buffers; decodes run on a stream whose priority is
/// the lowest the device offers (below the caller's compute stream when that was created with a higher
/// priority, e.g. by [`high_priority_stream`](Self::high_priority_stream)). Two pinned staging slots
/// alternate and are reused (grown, never shrunk) from batch to batch, so batch i+1 is packed and copied
/// while batch i decodes; at most [`max_in_flight`](Self::max_in_flight) submitted batches are queued
/// and not yet decoded (a submit beyond that waits for the oldest), which bounds device memory and queue
/// depth whatever pace the caller submits at.
pub struct BatchDecoder {
    ctx: Arc<CudaContext>,
    copy_stream: Arc<CudaStream>,
    decode_stream: Arc<CudaStream>,
    kernels: Kernels,
    slots: [Slot; 2],
    next: usize,
    /// Completion events of submitted batches, oldest first.
    in_flight: VecDeque<CudaEvent>,
    max_in_flight: usize,
}

/// Default bound on batches submitted and not yet decoded: one decoding while the next is copied.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 2;

impl BatchDecoder {
    /// A decoder on device `ordinal` (its primary context, the one PyTorch, JAX and CuPy use), with the
    /// kernels compiled and loaded. This is the availability check: without a usable GPU it fails with
    /// the reason, never a panic: [`Error::NoDriver`] (no libcuda), [`Error::NoDevice`] (no such ordinal),
    /// [`Error::NoNvrtc`] (no libnvrtc), [`Error::Compile`] (NVRTC rejected the kernels for this
    /// device), [`Error::Driver`] (a driver call failed: context creation, module load, streams).
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::driver("cuCtxCreate", e))?;
        Self::with_context(ctx)
    }

    /// A decoder in the caller's context (e.g. the one a training framework already uses).
    pub fn with_context(ctx: Arc<CudaContext>) -> Result<Self, Error> {
        Self::build(ctx, None)
    }

    /// A decoder that queues its decodes on the caller's `stream` (and uses its context): decoded batches
    /// are then ordered with the caller's later work on that stream without any event. Copies still run
    /// on the decoder's own stream.
    pub fn with_stream(stream: &Arc<CudaStream>) -> Result<Self, Error> {
        Self::build(stream.context().clone(), Some(stream.clone()))
    }

    fn build(ctx: Arc<CudaContext>, decode_stream: Option<Arc<CudaStream>>) -> Result<Self, Error> {
        ensure_driver()?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| Error::driver("cuDeviceGetAttribute", e))?;
        let ptx = ptx_for(major, minor)?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| Error::driver("cuModuleLoadData", e))?;
        let load = |name| {
            module
                .load_function(name)
                .map_err(|e| Error::driver("cuModuleGetFunction", e))
        };
        let pair = |images, samples| -> Result<KernelPair, Error> {
            Ok(KernelPair {
                images: load(images)?,
                samples: load(samples)?,
            })
        };
        let kernels = Kernels {
            u8: pair("l3_decode_u8", "l3_samples_u8")?,
            f32: pair("l3_decode_f32", "l3_samples_f32")?,
            f16: pair("l3_decode_f16", "l3_samples_f16")?,
        };
        ctx.bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let (least, _greatest) = result::stream::get_priority_range()
            .map_err(|e| Error::driver("cuCtxGetStreamPriorityRange", e))?;
        let copy_stream = ctx
            .new_stream()
            .map_err(|e| Error::driver("cuStreamCreate", e))?;
        let decode_stream = match decode_stream {
            Some(s) => s,
            None => ctx
                .new_stream_with_priority(least)
                .map_err(|e| Error::driver("cuStreamCreateWithPriority", e))?,
        };
        let slot = || -> Result<Slot, Error> {
            Ok(Slot {
                staging: None,
                input: None,
                copied: ctx
                    .new_event(None)
                    .map_err(|e| Error::driver("cuEventCreate", e))?,
            })
        };
        Ok(BatchDecoder {
            slots: [slot()?, slot()?],
            ctx,
            copy_stream,
            decode_stream,
            kernels,
            next: 0,
            in_flight: VecDeque::new(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The stream decodes run on (the lowest priority unless the caller handed in its own).
    pub fn decode_stream(&self) -> &Arc<CudaStream> {
        &self.decode_stream
    }

    /// The most batches submitted and not yet decoded before a submit waits
    /// ([`DEFAULT_MAX_IN_FLIGHT`] unless changed).
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Sets [`max_in_flight`](Self::max_in_flight) (at least 1).
    pub fn set_max_in_flight(&mut self, n: usize) {
        self.max_in_flight = n.max(1);
    }

    /// A new stream at the device's highest priority, for the caller's compute work, so decoding the next
    /// batch never delays it (section 4.4).
    pub fn high_priority_stream(&self) -> Result<Arc<CudaStream>, Error> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let (_least, greatest) = result::stream::get_priority_range()
            .map_err(|e| Error::driver("cuCtxGetStreamPriorityRange", e))?;
        self.ctx
            .new_stream_with_priority(greatest)
            .map_err(|e| Error::driver("cuStreamCreateWithPriority", e))
    }

    /// Validates and plans `images` on the host, then queues copy and decode; returns at once.
    pub fn submit(
        &mut self,
        images: &[&[u8]],
        opts: &DecodeOptions,
    ) -> Result<DecodedBatch, Error> {
        let plan = BatchPlan::new(images, opts)?;
        self.submit_plan(Arc::new(plan), images)
    }

    /// Like [`submit`](Self::submit) with a plan built beforehand (e.g. on a loader thread) from `images`.
    pub fn submit_plan(
        &mut self,
        plan: Arc<BatchPlan>,
        images: &[&[u8]],
    ) -> Result<DecodedBatch, Error> {
        if !plan.built_from(images) {
            return Err(Error::PlanMismatch);
        }
        let off = InputOffsets::of(&plan);
        let p = plan.clone();
        let slot = self.stage(
            off,
            0,
            |dst| {
                pack_input(&p, images, off, dst);
                Ok(())
            },
            None,
        )?;
        let input = self.slots[slot].input.as_ref().expect("staged above");
        let batch = self.launch(Origin::Images(plan), input, off)?;
        self.track(batch)
    }

    /// Decodes one fixed-size sample per image into ONE device tensor, `[n, height, width, 3]` (NHWC)
    /// or `[n, 3, height, width]` (NCHW) of `u8`, `f16` or `f32`, normalisation fused: sample `i` is
    /// window `windows[i]` of `sources[i]`, padding around it (see [`Window`] and [`SampleOptions`]).
    /// Only the patches under each window are copied and decoded. Validates and plans on the host first
    /// (see [`SamplePlan::new`] for the errors, all before any GPU work), then queues copy and decode and
    /// returns at once; [`DecodedBatch::wait`] reports a patch the kernel found corrupt.
    pub fn submit_samples(
        &mut self,
        sources: &[SampleSource<'_>],
        windows: &[Window],
        opts: &SampleOptions,
    ) -> Result<DecodedBatch, Error> {
        let plan = SamplePlan::new(sources, windows, opts)?;
        self.submit_sample_plan(Arc::new(plan), sources)
    }

    /// Like [`submit_samples`](Self::submit_samples) with a plan built beforehand (e.g. on a loader
    /// thread) from `sources`; [`Error::PlanMismatch`] if `sources` are not the ones it was built from.
    pub fn submit_sample_plan(
        &mut self,
        plan: Arc<SamplePlan>,
        sources: &[SampleSource<'_>],
    ) -> Result<DecodedBatch, Error> {
        if !plan.built_from(sources) {
            return Err(Error::PlanMismatch);
        }
        let off = InputOffsets::of_samples(&plan);
        let p = plan.clone();
        let slot = self.stage(off, 0, |dst| pack_sample_input(&p, sources, off, dst), None)?;
        let input = self.slots[slot].input.as_ref().expect("staged above");
        let batch = self.launch(Origin::Samples(plan), input, off)?;
        self.track(batch)
    }

    /// Decodes the files of a [`PinnedBatch`] straight from its pinned memory: no host copy at all, the
    /// files are DMA'd as they are (headers included) and the descriptors point inside them. The batch
    /// can be refilled once this returns (refilling waits for the copy, not the decode).
    pub fn submit_pinned(
        &mut self,
        batch: &mut PinnedBatch,
        opts: &DecodeOptions,
    ) -> Result<DecodedBatch, Error> {
        let files = batch.files()?;
        let plan = Arc::new(BatchPlan::new_in_place(
            &files,
            &batch.starts,
            batch.len,
            opts,
        )?);
        let off = InputOffsets::of(&plan);
        let p = plan.clone();
        let fill = |dst: &mut [u8]| {
            pack_tables(&Tables::of(&p), off, dst);
            Ok(())
        };
        let host = &batch.host()?[..batch.len];
        let slot = self.stage(off, off.descs, fill, Some(host))?;
        let ev = self
            .copy_stream
            .record_event(None)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        batch.copied = Some(ev);
        let input = self.slots[slot].input.as_ref().expect("staged above");
        let decoded = self.launch(Origin::Images(plan), input, off)?;
        self.track(decoded)
    }

    /// Queues the one launch of `origin`'s plan on the decode stream, reading `input`.
    fn launch(
        &self,
        origin: Origin,
        input: &CudaSlice<u8>,
        off: InputOffsets,
    ) -> Result<DecodedBatch, Error> {
        let streams = (&self.decode_stream, &self.copy_stream);
        match origin {
            Origin::Images(plan) => launch(&self.kernels, streams, plan, input, off),
            Origin::Samples(plan) => launch_samples(&self.kernels, streams, plan, input, off),
        }
    }

    /// Records the batch's completion for the in-flight bound.
    fn track(&mut self, batch: DecodedBatch) -> Result<DecodedBatch, Error> {
        let done = self
            .decode_stream
            .record_event(None)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        self.in_flight.push_back(done);
        Ok(batch)
    }

    /// Waits until fewer than `max_in_flight` submitted batches are still queued or decoding.
    fn throttle(&mut self) -> Result<(), Error> {
        while self.in_flight.len() >= self.max_in_flight {
            if let Some(oldest) = self.in_flight.pop_front() {
                oldest
                    .synchronize()
                    .map_err(|e| Error::driver("cuEventSynchronize", e))?;
            }
        }
        Ok(())
    }

    /// Waits for the in-flight bound, then fills the next slot's pinned staging with input bytes
    /// `[staged_from, off.total)` (by `fill`), copies them and `pinned_prefix` (already pinned, to input
    /// offset 0) on the copy stream, and makes the decode stream wait for the copy. Returns the slot,
    /// whose `input` the launch reads.
    fn stage(
        &mut self,
        off: InputOffsets,
        staged_from: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), Error>,
        pinned_prefix: Option<&[u8]>,
    ) -> Result<usize, Error> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        self.throttle()?;
        let staged_len = off.total - staged_from;
        let slot_index = self.next;
        let ctx = self.ctx.clone();
        let slot = &mut self.slots[slot_index];
        // The host may refill the staging buffer only once the previous copy out of it has finished.
        slot.copied
            .synchronize()
            .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        if slot.staging.as_ref().is_none_or(|s| s.len() < staged_len) {
            slot.staging = None;
            let cap = staged_len + staged_len / 2;
            // SAFETY: only bytes written by `fill` are ever copied out.
            let pinned = unsafe {
                ctx.alloc_pinned_with_flags::<u8>(cap, sys::CU_MEMHOSTALLOC_WRITECOMBINED)
            }
            .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
            slot.staging = Some(pinned);
        }
        if slot.input.as_ref().is_none_or(|s| s.len() < off.total) {
            slot.input = None;
            let cap = off.total + off.total / 2;
            // SAFETY: the kernel reads only bytes the copies below write.
            let buf = unsafe { self.copy_stream.alloc::<u8>(cap) }
                .map_err(|e| Error::driver("cuMemAlloc", e))?;
            slot.input = Some(buf);
        }
        let (Some(staging), Some(input)) = (slot.staging.as_mut(), slot.input.as_mut()) else {
            unreachable!("both buffers were just ensured");
        };
        let host = staging
            .as_mut_slice()
            .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        // Nothing is queued for this slot until `fill` succeeded, so a failure leaves it reusable.
        fill(&mut host[..staged_len])?;
        self.next ^= 1;
        {
            // Waits (through cudarc's event tracking) for the previous decode that read this input.
            let (dst, _record) = input.device_ptr_mut(&self.copy_stream);
            let cu = self.copy_stream.cu_stream();
            // SAFETY: both sources are pinned and are not modified until the copy stream passes the
            // events recorded below (the slot's `copied`, and the PinnedBatch's); `dst` holds off.total bytes.
            unsafe {
                if let Some(prefix) = pinned_prefix {
                    result::memcpy_htod_async(dst, prefix, cu)
                        .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e))?;
                }
                result::memcpy_htod_async(dst + staged_from as u64, &host[..staged_len], cu)
                    .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e))?;
            }
        }
        slot.copied
            .record(&self.copy_stream)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        self.decode_stream
            .wait(&slot.copied)
            .map_err(|e| Error::driver("cuStreamWaitEvent", e))?;
        Ok(slot_index)
    }

    /// An empty [`PinnedBatch`] with room for `capacity` bytes of files (it grows as needed).
    pub fn pinned_batch(&self, capacity: usize) -> Result<PinnedBatch, Error> {
        PinnedBatch::new(self.ctx.clone(), capacity)
    }

    /// Copies a validated batch to device memory once (synchronously), for repeated [`decode_resident`](Self::decode_resident).
    pub fn upload(
        &mut self,
        images: &[&[u8]],
        opts: &DecodeOptions,
    ) -> Result<ResidentBatch, Error> {
        let plan = Arc::new(BatchPlan::new(images, opts)?);
        let off = InputOffsets::of(&plan);
        let mut host = vec![0u8; off.total];
        pack_input(&plan, images, off, &mut host);
        self.upload_input(Origin::Images(plan), &host, off)
    }

    /// Copies a validated sample batch to device memory once (synchronously), for repeated
    /// [`decode_resident`](Self::decode_resident) (the kernel-speed measurement).
    pub fn upload_samples(
        &mut self,
        sources: &[SampleSource<'_>],
        windows: &[Window],
        opts: &SampleOptions,
    ) -> Result<ResidentBatch, Error> {
        let plan = Arc::new(SamplePlan::new(sources, windows, opts)?);
        let off = InputOffsets::of_samples(&plan);
        let mut host = vec![0u8; off.total];
        pack_sample_input(&plan, sources, off, &mut host)?;
        self.upload_input(Origin::Samples(plan), &host, off)
    }

    fn upload_input(
        &mut self,
        origin: Origin,
        host: &[u8],
        offsets: InputOffsets,
    ) -> Result<ResidentBatch, Error> {
        let input = self
            .copy_stream
            .clone_htod(host)
            .map_err(|e| Error::driver("cuMemcpyHtoD", e))?;
        self.copy_stream
            .synchronize()
            .map_err(|e| Error::driver("cuStreamSynchronize", e))?;
        Ok(ResidentBatch {
            origin,
            input,
            offsets,
        })
    }

    /// Decodes a batch already in device memory: one launch, nothing copied from the host. Not counted
    /// against [`max_in_flight`](Self::max_in_flight): a benchmark queues as many as it times.
    pub fn decode_resident(&self, batch: &ResidentBatch) -> Result<DecodedBatch, Error> {
        self.launch(batch.origin.clone(), &batch.input, batch.offsets)
    }

    /// Device-to-device memcpy bandwidth in bytes/s (read + written bytes per second, as a roofline for the
    /// decode's own bytes read + written), measured with `bytes`-sized copies.
    pub fn measure_d2d_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64, Error> {
        let s = &self.decode_stream;
        let err = |e| Error::driver("cuMemcpyDtoDAsync", e);
        let src = s.alloc_zeros::<u8>(bytes).map_err(err)?;
        let mut dst = s.alloc_zeros::<u8>(bytes).map_err(err)?;
        s.memcpy_dtod(&src, &mut dst).map_err(err)?; // warm-up
        let secs = self.time_on(s, || {
            for _ in 0..iters {
                s.memcpy_dtod(&src, &mut dst).map_err(err)?;
            }
            Ok(())
        })?;
        Ok(2.0 * bytes as f64 * iters as f64 / secs)
    }

    /// Host-to-device bandwidth from pinned memory in bytes/s.
    pub fn measure_h2d_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64, Error> {
        let s = &self.copy_stream;
        let err = |e| Error::driver("cuMemcpyHtoDAsync", e);
        // SAFETY: zero-filled below before use.
        let mut pinned = unsafe { self.ctx.alloc_pinned::<u8>(bytes) }.map_err(err)?;
        pinned.as_mut_slice().map_err(err)?.fill(0);
        let mut dst = s.alloc_zeros::<u8>(bytes).map_err(err)?;
        s.memcpy_htod(&pinned, &mut dst).map_err(err)?;
        let secs = self.time_on(s, || {
            for _ in 0..iters {
                s.memcpy_htod(&pinned, &mut dst).map_err(err)?;
            }
            Ok(())
        })?;
        Ok(bytes as f64 * iters as f64 / secs)
    }

    /// Seconds the work `f` queues on `s` takes on the device (timing events around it).
    pub fn time_on(
        &self,
        s: &Arc<CudaStream>,
        f: impl FnOnce() -> Result<(), Error>,
    ) -> Result<f64, Error> {
        let err = |e| Error::driver("cuEvent", e);
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).map_err(err)?;
        let end = self.ctx.new_event(flags).map_err(err)?;
        start.record(s).map_err(err)?;
        f()?;
        end.record(s).map_err(err)?;
        end.synchronize().map_err(err)?;
        Ok(start.elapsed_ms(&end).map_err(err)? as f64 / 1e3)
    }
}

/// A fresh error word (u32::MAX: no corrupt patch) on `stream`.
fn error_word(stream: &Arc<CudaStream>) -> Result<CudaSlice<u32>, Error> {
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
    let alloc = |e| Error::driver("cuMemAllocAsync", e);
    // SAFETY: the one element is set to 0xffff_ffff right below, on the same stream, before the launch.
    let mut err = unsafe { stream.alloc::<u32>(1) }.map_err(alloc)?;
    {
        let (ptr, _record) = err.device_ptr_mut(stream);
        // SAFETY: 4 bytes of a live allocation, on its stream.
        unsafe { result::memset_d8_async(ptr, 0xff, 4, stream.cu_stream()) }.map_err(alloc)?;
    }
    Ok(err)
}

/// `len` output elements of `T`, allocated in `stream`'s order.
fn alloc_output<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>, Error> {
    // SAFETY: the launch that follows writes every element before anything reads it (whole images:
    // every patch of every image; samples: every window and all padding around it).
    unsafe { stream.alloc::<T>(len.max(1)) }.map_err(|e| Error::driver("cuMemAllocAsync", e))
}

/// The launch's scratch memory for ANS chunks (at least one byte), allocated in `stream`'s order.
fn alloc_scratch(stream: &Arc<CudaStream>, len: u64) -> Result<CudaSlice<u8>, Error> {
    let len = usize::try_from(len).map_err(|_| Error::TooLarge {
        what: "the ANS scratch memory exceeds the address space",
    })?;
    // SAFETY: the kernel reads a scratch byte only after its block wrote it (an ANS warp writes every code
    // and selector of its chunk before anything reads them, and contexts read only rows already written).
    unsafe { stream.alloc::<u8>(len.max(1)) }.map_err(|e| Error::driver("cuMemAllocAsync", e))
}

/// Queues the one launch decoding every patch of `plan` from `input` (packed as [`InputOffsets`]) on
/// `stream`; the batch reads its error word back on `readback`.
fn launch(
    kernels: &Kernels,
    (stream, readback): (&Arc<CudaStream>, &Arc<CudaStream>),
    plan: Arc<BatchPlan>,
    input: &CudaSlice<u8>,
    off: InputOffsets,
) -> Result<DecodedBatch, Error> {
    let mut err = error_word(stream)?;
    let mut scratch = alloc_scratch(stream, plan.v2.scratch_len)?;
    let n = plan.descs.len() as u32;
    let n_v2 = plan.v2.descs.len() as u32;
    let cfg = LaunchConfig {
        grid_dim: (n + n_v2, 1, 1),
        block_dim: (plan.block_dim, 1, 1),
        shared_mem_bytes: plan.shared_bytes(),
    };
    let data = input.slice(0..off.data_len.max(1));
    let descs = input.slice(off.descs..off.v2.max(off.descs + 1));
    let v2 = input.slice(off.v2..off.fills.max(off.v2 + 1));
    let tables = input.slice(off.tables..off.scale_bias.max(off.tables + 1));
    let sb = input.slice(off.scale_bias..off.total);
    let stage_cap = plan.stage_cap;
    let kernel = &kernels.for_dtype(plan.dtype).images;
    macro_rules! go {
        ($out:expr) => {{
            let mut out = $out;
            let mut b = stream.launch_builder(kernel);
            b.arg(&data)
                .arg(&descs)
                .arg(&n)
                .arg(&mut out)
                .arg(&sb)
                .arg(&mut err)
                .arg(&stage_cap)
                .arg(&v2)
                .arg(&n_v2)
                .arg(&tables)
                .arg(&mut scratch);
            // SAFETY: argument order and types match kernel.cu's l3_decode_*; the descriptors were built
            // by BatchPlan from validated files, so every read stays inside `data` (and the tables and
            // scratch) and every write inside `out` (`BatchPlan::descriptors_in_bounds`).
            unsafe { b.launch(cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
            out
        }};
    }
    let output = match plan.dtype {
        DType::U8 => DeviceOutput::U8(go!(alloc_output::<u8>(stream, plan.out_len)?)),
        DType::F32 => DeviceOutput::F32(go!(alloc_output::<f32>(stream, plan.out_len)?)),
        DType::F16 => DeviceOutput::F16(go!(alloc_output::<u16>(stream, plan.out_len)?)),
    };
    let ready = stream
        .record_event(None)
        .map_err(|e| Error::driver("cuEventRecord", e))?;
    Ok(DecodedBatch {
        output: Some(output),
        images: plan.images.clone(),
        tensor: plan.tensor(),
        err,
        ready,
        origin: Origin::Images(plan),
        readback: readback.clone(),
        consumers: Mutex::new(Vec::new()),
        _scratch: scratch,
    })
}

/// Queues the one launch decoding every window of a sample batch and padding around them.
fn launch_samples(
    kernels: &Kernels,
    (stream, readback): (&Arc<CudaStream>, &Arc<CudaStream>),
    plan: Arc<SamplePlan>,
    input: &CudaSlice<u8>,
    off: InputOffsets,
) -> Result<DecodedBatch, Error> {
    let mut err = error_word(stream)?;
    let mut scratch = alloc_scratch(stream, plan.v2.scratch_len)?;
    let n_descs = plan.descs.len() as u32;
    let n_v2 = plan.v2.descs.len() as u32;
    let n_fills = plan.fills.len() as u32;
    let cfg = LaunchConfig {
        grid_dim: (n_descs + n_v2 + n_fills, 1, 1),
        block_dim: (plan.block_dim, 1, 1),
        shared_mem_bytes: plan.shared_bytes(),
    };
    let data = input.slice(0..off.data_len.max(1));
    let descs = input.slice(off.descs..off.v2.max(off.descs + 1));
    let v2 = input.slice(off.v2..off.fills.max(off.v2 + 1));
    let fills = input.slice(off.fills..off.tables.max(off.fills + 1));
    let tables = input.slice(off.tables..off.scale_bias.max(off.tables + 1));
    let sb = input.slice(off.scale_bias..off.total);
    let stage_cap = plan.stage_cap;
    let (width, height) = plan.sample_size();
    let nchw = plan.nchw();
    let kernel = &kernels.for_dtype(plan.tensor.dtype).samples;
    let len = plan.output_len();
    macro_rules! go {
        ($out:expr) => {{
            let mut out = $out;
            let mut b = stream.launch_builder(kernel);
            b.arg(&data)
                .arg(&descs)
                .arg(&n_descs)
                .arg(&fills)
                .arg(&n_fills)
                .arg(&mut out)
                .arg(&sb)
                .arg(&mut err)
                .arg(&stage_cap)
                .arg(&width)
                .arg(&height)
                .arg(&nchw)
                .arg(&v2)
                .arg(&n_v2)
                .arg(&tables)
                .arg(&mut scratch);
            // SAFETY: argument order and types match kernel.cu's l3_samples_*; SamplePlan built every
            // descriptor from validated sources and windows, so every read stays inside `data` and every
            // write inside its own sample of `out` (`SamplePlan::descriptors_in_bounds`).
            unsafe { b.launch(cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
            out
        }};
    }
    let output = match plan.tensor.dtype {
        DType::U8 => DeviceOutput::U8(go!(alloc_output::<u8>(stream, len)?)),
        DType::F32 => DeviceOutput::F32(go!(alloc_output::<f32>(stream, len)?)),
        DType::F16 => DeviceOutput::F16(go!(alloc_output::<u16>(stream, len)?)),
    };
    let ready = stream
        .record_event(None)
        .map_err(|e| Error::driver("cuEventRecord", e))?;
    let (w, h) = plan.sample_size();
    let images = (0..plan.sample_count())
        .map(|i| ImageSlot {
            offset: i * plan.sample_len(),
            width: w,
            height: h,
            channels: 3,
        })
        .collect();
    Ok(DecodedBatch {
        output: Some(output),
        images,
        tensor: Some(plan.tensor()),
        err,
        ready,
        origin: Origin::Samples(plan),
        readback: readback.clone(),
        consumers: Mutex::new(Vec::new()),
        _scratch: scratch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real NVRTC compiles kernel.cu for every architecture CUDA 13 supports (runs wherever libnvrtc
    /// loads, GPU or not; e.g. with the `nvidia-cuda-nvrtc` wheel's lib folder on LD_LIBRARY_PATH).
    #[test]
    fn nvrtc_compiles_kernels_for_every_arch() {
        if let Err(e) = ensure_nvrtc() {
            eprintln!("skipping: {e}");
            return;
        }
        for arch in [
            "compute_75",
            "compute_80",
            "compute_86",
            "compute_89",
            "compute_90",
            "compute_100",
            "compute_120",
        ] {
            let ptx = compile_for_arch(arch).unwrap_or_else(|e| panic!("{e}"));
            let src = ptx.to_src();
            for entry in KERNEL_NAMES {
                assert!(
                    src.contains(&format!(".entry {entry}(")),
                    "{arch}: no entry {entry}"
                );
            }
            eprintln!("{arch}: {} bytes of PTX", src.len());
            // For `ptxas -v` (registers, spills, shared memory) where a CUDA toolkit is at hand.
            if let Some(dir) = std::env::var_os("L3_PTX_DIR") {
                std::fs::write(
                    std::path::Path::new(&dir).join(format!("l3_{arch}.ptx")),
                    &src,
                )
                .unwrap();
            }
        }
    }

    #[test]
    fn no_nvrtc_is_a_typed_error() {
        match compile_for_arch("compute_90") {
            Ok(_) => eprintln!("skipping: NVRTC present here"),
            Err(Error::NoNvrtc) => {}
            Err(e) => panic!("{e}"),
        }
    }
}
