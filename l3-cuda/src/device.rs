//! The GPU side: NVRTC compilation (once per process and architecture), streams, pinned staging with
//! double buffering, and the single launch that decodes a whole batch.

use crate::error::Error;
use crate::plan::{BatchPlan, DecodeOptions, ImageSlot};
use crate::tensor::DType;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtrMut,
    LaunchConfig, PinnedHostSlice, PushKernelArg, result, sys,
};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

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

struct Kernels {
    u8: CudaFunction,
    f32: CudaFunction,
    f16: CudaFunction,
}

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

/// A batch whose decode has been queued. Its output is valid once [`ready`](Self::ready) has completed:
/// make a compute stream wait on it (`stream.wait(batch.ready())`), or call [`wait`](Self::wait).
#[derive(Debug)]
pub struct DecodedBatch {
    output: DeviceOutput,
    images: Vec<ImageSlot>,
    err: CudaSlice<u32>,
    ready: CudaEvent,
    plan: Arc<BatchPlan>,
}

impl DecodedBatch {
    /// Where each image lies in [`output`](Self::output), in batch order.
    pub fn images(&self) -> &[ImageSlot] {
        &self.images
    }
    pub fn output(&self) -> &DeviceOutput {
        &self.output
    }
    pub fn into_output(self) -> DeviceOutput {
        self.output
    }
    /// Recorded on the decode stream right after the launch.
    pub fn ready(&self) -> &CudaEvent {
        &self.ready
    }

    /// Blocks until the decode finished and reports a patch the kernel found corrupt
    /// ([`Error::CorruptRows`], naming the image's batch index).
    pub fn wait(&self) -> Result<(), Error> {
        self.ready
            .synchronize()
            .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        let stream = self.err.stream().clone();
        let err = stream
            .clone_dtoh(&self.err)
            .map_err(|e| Error::driver("cuMemcpyDtoH", e))?;
        self.plan.kernel_error(err[0])
    }

    /// Waits, then copies the output to the host as raw bytes (native-endian elements): for tests and tools.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>, Error> {
        self.wait()?;
        let copy = |e| Error::driver("cuMemcpyDtoH", e);
        Ok(match &self.output {
            DeviceOutput::U8(s) => s.stream().clone_dtoh(s).map_err(copy)?,
            DeviceOutput::F32(s) => s
                .stream()
                .clone_dtoh(s)
                .map_err(copy)?
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
            DeviceOutput::F16(s) => s
                .stream()
                .clone_dtoh(s)
                .map_err(copy)?
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
        })
    }
}

/// A batch whose compressed bytes (and patch table) already live in device memory: decoding it measures
/// the kernel alone, and a dataset small enough to stay resident can be decoded epoch after epoch.
pub struct ResidentBatch {
    plan: Arc<BatchPlan>,
    input: CudaSlice<u8>,
    offsets: InputOffsets,
}

impl ResidentBatch {
    pub fn plan(&self) -> &BatchPlan {
        &self.plan
    }
}

/// Where the descriptor table, the scale/bias table and the end lie in the packed device input.
#[derive(Debug, Clone, Copy)]
struct InputOffsets {
    descs: usize,
    scale_bias: usize,
    total: usize,
}

impl InputOffsets {
    fn of(plan: &BatchPlan) -> Self {
        let descs = plan.data_len.next_multiple_of(16);
        let scale_bias = descs + plan.descs.len() * crate::plan::DESC_BYTES;
        InputOffsets {
            descs,
            scale_bias,
            total: scale_bias + 8 * 4,
        }
    }
}

/// The whole device input, `[0, off.total)`: packed patch data, then the tables.
fn pack_input(plan: &BatchPlan, images: &[&[u8]], off: InputOffsets, dst: &mut [u8]) {
    plan.pack_into(images, &mut dst[..plan.data_len]);
    dst[plan.data_len..off.descs].fill(0);
    pack_tables(plan, off, &mut dst[off.descs..]);
}

/// The tables alone, `[off.descs, off.total)`, into `dst` (which starts at off.descs).
fn pack_tables(plan: &BatchPlan, off: InputOffsets, dst: &mut [u8]) {
    let sb = off.scale_bias - off.descs;
    dst[..sb].copy_from_slice(&plan.descriptor_bytes());
    for (i, v) in plan.scale_bias.iter().enumerate() {
        dst[sb + 4 * i..sb + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
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
/// priority, e.g. by [`high_priority_stream`](Self::high_priority_stream)). Two staging slots alternate,
/// so batch i+1 is packed and copied while batch i decodes.
pub struct BatchDecoder {
    ctx: Arc<CudaContext>,
    copy_stream: Arc<CudaStream>,
    decode_stream: Arc<CudaStream>,
    kernels: Kernels,
    slots: [Slot; 2],
    next: usize,
}

impl BatchDecoder {
    /// A decoder on device `ordinal` (its primary context).
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
        let kernels = Kernels {
            u8: load("l3_decode_u8")?,
            f32: load("l3_decode_f32")?,
            f16: load("l3_decode_f16")?,
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
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream decodes run on (the lowest priority unless the caller handed in its own).
    pub fn decode_stream(&self) -> &Arc<CudaStream> {
        &self.decode_stream
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
        self.copy_and_launch(plan, off, 0, |dst| pack_input(&p, images, off, dst), None)
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
        let fill = |dst: &mut [u8]| pack_tables(&p, off, dst);
        let host = &batch.host()?[..batch.len];
        let decoded = self.copy_and_launch(plan, off, off.descs, fill, Some(host))?;
        let ev = self
            .copy_stream
            .record_event(None)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        batch.copied = Some(ev);
        Ok(decoded)
    }

    /// Fills the next slot's pinned staging with input bytes `[staged_from, off.total)` (by `fill`), copies
    /// them and `pinned_prefix` (already pinned, to input offset 0) on the copy stream, and launches on the
    /// decode stream after the copy.
    fn copy_and_launch(
        &mut self,
        plan: Arc<BatchPlan>,
        off: InputOffsets,
        staged_from: usize,
        fill: impl FnOnce(&mut [u8]),
        pinned_prefix: Option<&[u8]>,
    ) -> Result<DecodedBatch, Error> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let staged_len = off.total - staged_from;
        let slot_index = self.next;
        self.next ^= 1;
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
        fill(&mut host[..staged_len]);
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
        let slot = &self.slots[slot_index];
        let input = slot.input.as_ref().expect("ensured above");
        launch(&self.kernels, &self.decode_stream, plan, input, off)
    }

    /// An empty [`PinnedBatch`] with room for `capacity` bytes of files (it grows as needed).
    pub fn pinned_batch(&self, capacity: usize) -> Result<PinnedBatch, Error> {
        PinnedBatch::new(self.ctx.clone(), capacity)
    }

    /// Copies a validated batch to device memory once (synchronously), for repeated [`decode_resident`].
    pub fn upload(
        &mut self,
        images: &[&[u8]],
        opts: &DecodeOptions,
    ) -> Result<ResidentBatch, Error> {
        let plan = Arc::new(BatchPlan::new(images, opts)?);
        let off = InputOffsets::of(&plan);
        let mut host = vec![0u8; off.total];
        pack_input(&plan, images, off, &mut host);
        let input = self
            .copy_stream
            .clone_htod(&host)
            .map_err(|e| Error::driver("cuMemcpyHtoD", e))?;
        self.copy_stream
            .synchronize()
            .map_err(|e| Error::driver("cuStreamSynchronize", e))?;
        Ok(ResidentBatch {
            plan,
            input,
            offsets: off,
        })
    }

    /// Decodes a batch already in device memory: one launch, nothing copied from the host.
    pub fn decode_resident(&self, batch: &ResidentBatch) -> Result<DecodedBatch, Error> {
        launch(
            &self.kernels,
            &self.decode_stream,
            batch.plan.clone(),
            &batch.input,
            batch.offsets,
        )
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

/// Queues the one launch decoding every patch of `plan` from `input` (packed as [`InputOffsets`]).
fn launch(
    kernels: &Kernels,
    stream: &Arc<CudaStream>,
    plan: Arc<BatchPlan>,
    input: &CudaSlice<u8>,
    off: InputOffsets,
) -> Result<DecodedBatch, Error> {
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
    let n = plan.descs.len() as u32;
    let cfg = LaunchConfig {
        grid_dim: (n, 1, 1),
        block_dim: (plan.block_dim, 1, 1),
        shared_mem_bytes: plan.shared_bytes(),
    };
    let data = input.slice(0..plan.data_len.max(1));
    let descs = input.slice(off.descs..off.scale_bias);
    let sb = input.slice(off.scale_bias..off.total);
    let stage_cap = plan.stage_cap;
    let args = KernelArgs {
        data: &data,
        descs: &descs,
        n,
        scale_bias: &sb,
        stage_cap,
        cfg,
    };
    let output = match plan.dtype {
        DType::U8 => DeviceOutput::U8(launch_into(
            stream,
            &kernels.u8,
            plan.out_len,
            &args,
            &mut err,
        )?),
        DType::F32 => DeviceOutput::F32(launch_into(
            stream,
            &kernels.f32,
            plan.out_len,
            &args,
            &mut err,
        )?),
        DType::F16 => DeviceOutput::F16(launch_into(
            stream,
            &kernels.f16,
            plan.out_len,
            &args,
            &mut err,
        )?),
    };
    let ready = stream
        .record_event(None)
        .map_err(|e| Error::driver("cuEventRecord", e))?;
    Ok(DecodedBatch {
        output,
        images: plan.images.clone(),
        err,
        ready,
        plan,
    })
}

/// The arguments every decode kernel takes besides its output (see `kernel.cu`).
struct KernelArgs<'a, 'b> {
    data: &'a CudaView<'b, u8>,
    descs: &'a CudaView<'b, u8>,
    n: u32,
    scale_bias: &'a CudaView<'b, u8>,
    stage_cap: u32,
    cfg: LaunchConfig,
}

/// Allocates `len` output elements of `T` and queues `kernel` (the u8, f32 or f16 variant) to fill them.
fn launch_into<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    kernel: &CudaFunction,
    len: usize,
    args: &KernelArgs,
    err: &mut CudaSlice<u32>,
) -> Result<CudaSlice<T>, Error> {
    // SAFETY: the kernel writes every element of the fresh allocation before anything reads it.
    let mut out =
        unsafe { stream.alloc::<T>(len) }.map_err(|e| Error::driver("cuMemAllocAsync", e))?;
    let mut b = stream.launch_builder(kernel);
    b.arg(args.data)
        .arg(args.descs)
        .arg(&args.n)
        .arg(&mut out)
        .arg(args.scale_bias)
        .arg(err)
        .arg(&args.stage_cap);
    // SAFETY: argument order and types match kernel.cu's signatures; the descriptors were built by
    // BatchPlan from validated files, so every read stays inside `data` and every write inside `out`.
    unsafe { b.launch(args.cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
    Ok(out)
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
            for entry in ["l3_decode_u8", "l3_decode_f32", "l3_decode_f16"] {
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
