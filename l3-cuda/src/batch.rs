//! What a submit returns: the decoded batch in device memory ([`DecodedBatch`], its [`DeviceOutput`]),
//! and a batch whose input already lives on the device ([`ResidentBatch`]).
#![allow(unsafe_code)]

use crate::error::Error;
use crate::input::InputOffsets;
use crate::layout::TensorInfo;
use crate::plan::{BatchPlan, ImageSlot};
use crate::sample::SamplePlan;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, result, sys};
use std::sync::{Arc, Mutex};

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
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
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

    pub(crate) fn num_bytes(&self) -> usize {
        match self {
            DeviceOutput::U8(s) => s.num_bytes(),
            DeviceOutput::F32(s) => s.num_bytes(),
            DeviceOutput::F16(s) => s.num_bytes(),
        }
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        match self {
            DeviceOutput::U8(s) => s.context(),
            DeviceOutput::F32(s) => s.context(),
            DeviceOutput::F16(s) => s.context(),
        }
    }

    /// Gives up ownership of the allocation (the caller frees it).
    pub(crate) fn leak(self) -> sys::CUdeviceptr {
        match self {
            DeviceOutput::U8(s) => s.leak(),
            DeviceOutput::F32(s) => s.leak(),
            DeviceOutput::F16(s) => s.leak(),
        }
    }
}

/// The plan a batch was launched from: what maps the kernel's error word back to a batch index.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    Images(Arc<BatchPlan>),
    Samples(Arc<SamplePlan>),
}

impl Origin {
    fn samples(&self) -> Option<&SamplePlan> {
        match self {
            Origin::Samples(p) => Some(p),
            Origin::Images(_) => None,
        }
    }

    pub(crate) fn kernel_error(&self, err: u32) -> Result<(), Error> {
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
    pub(crate) output: Option<DeviceOutput>,
    pub(crate) images: Vec<ImageSlot>,
    pub(crate) tensor: Option<TensorInfo>,
    pub(crate) err: CudaSlice<u32>,
    pub(crate) ready: CudaEvent,
    pub(crate) origin: Origin,
    /// Reads the error word back: not the decode stream, where later batches may already be queued.
    pub(crate) readback: Arc<CudaStream>,
    /// The streams made to wait with [`wait_in`](Self::wait_in) (as addresses: `CUstream` is a pointer).
    pub(crate) consumers: Mutex<Vec<usize>>,
    /// Device memory the kernels use besides the output — the ANS blocks' residual codes; a resampled
    /// batch's intermediate and horizontal pass — kept until the batch is dropped (freed in stream
    /// order after the launches).
    pub(crate) _scratch: Vec<CudaSlice<u8>>,
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

    /// The plan of a sample batch (what each sample decoded: [`SamplePlan::source_rects`]); `None` for a
    /// whole-image batch.
    pub fn sample_plan(&self) -> Option<&SamplePlan> {
        self.origin.samples()
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
    pub(crate) origin: Origin,
    pub(crate) input: CudaSlice<u8>,
    pub(crate) offsets: InputOffsets,
}

impl ResidentBatch {
    /// The plan of a whole-image batch ([`BatchDecoder::upload`](crate::BatchDecoder::upload)); `None`
    /// for a sample batch.
    pub fn plan(&self) -> Option<&BatchPlan> {
        match &self.origin {
            Origin::Images(p) => Some(p),
            Origin::Samples(_) => None,
        }
    }

    /// The plan of a sample batch
    /// ([`BatchDecoder::upload_samples`](crate::BatchDecoder::upload_samples)); `None` for a whole-image
    /// batch.
    pub fn sample_plan(&self) -> Option<&SamplePlan> {
        self.origin.samples()
    }

    /// Bytes of device input (patch data and tables).
    pub fn input_len(&self) -> usize {
        self.offsets.total
    }
}
