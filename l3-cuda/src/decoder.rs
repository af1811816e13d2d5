//! The decoder: a context, a copy stream and a low-priority decode stream, two pinned staging slots that
//! alternate (batch i+1 is packed and copied while batch i decodes), and the bound on batches in flight.
#![allow(unsafe_code)]

use crate::batch::{DecodedBatch, Origin, ResidentBatch};
use crate::error::Error;
use crate::input::{InputOffsets, Tables, pack_tables};
use crate::kernels::Kernels;
use crate::launch::{launch, launch_samples};
use crate::layout::SampleOptions;
use crate::pinned::PinnedBatch;
use crate::plan::{BatchPlan, DecodeOptions};
use crate::sample::{SamplePlan, SampleSource};
use crate::self_check;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, PinnedHostSlice, result, sys,
};
use std::collections::VecDeque;
use std::sync::Arc;
use vocab::{Layout, Window};

/// One half of the double buffer: pinned host staging and the device input it is copied to.
pub(crate) struct Slot {
    staging: Option<PinnedHostSlice<u8>>,
    input: Option<CudaSlice<u8>>,
    /// Recorded on the copy stream after the H2D copy out of `staging`: the host may refill it after this.
    copied: CudaEvent,
}

/// Decodes batches of L3 images on one GPU: one launch per batch and image version, output in device
/// memory.
///
/// Copies run on their own stream from pinned staging buffers; decodes run on a stream whose priority is
/// the lowest the device offers (below the caller's compute stream when that was created with a higher
/// priority, e.g. by [`high_priority_stream`](Self::high_priority_stream)). Two pinned staging slots
/// alternate and are reused (grown, never shrunk) from batch to batch, so batch i+1 is packed and copied
/// while batch i decodes; at most [`max_in_flight`](Self::max_in_flight) submitted batches are queued
/// and not yet decoded (a submit beyond that waits for the oldest), which bounds device memory and queue
/// depth whatever pace the caller submits at.
pub struct BatchDecoder {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) copy_stream: Arc<CudaStream>,
    pub(crate) decode_stream: Arc<CudaStream>,
    kernels: Kernels,
    slots: [Slot; 2],
    next: usize,
    /// Completion events of submitted batches, oldest first.
    in_flight: VecDeque<CudaEvent>,
    max_in_flight: usize,
    /// Threads of a batch's host stage (0: every core).
    host_threads: usize,
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
        let ctx = cuda_setup::open(ordinal)?;
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
        let kernels = Kernels::load(&ctx)?;
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
        let mut dec = BatchDecoder {
            slots: [slot()?, slot()?],
            ctx,
            copy_stream,
            decode_stream,
            kernels,
            next: 0,
            in_flight: VecDeque::new(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            host_threads: 0,
        };
        dec.self_check()?;
        Ok(dec)
    }

    /// Decodes [`self_check::batches`] and compares them with the CPU decoder, unless this device passed
    /// before in this process: [`Error::SelfCheck`] at the first difference.
    fn self_check(&mut self) -> Result<(), Error> {
        let ordinal = self.ordinal();
        if self_check::passed(ordinal) {
            return Ok(());
        }
        let opts = DecodeOptions {
            layout: Layout::Nchw,
            ..DecodeOptions::default()
        };
        let batches = self_check::batches().map_err(|e| Error::SelfCheck {
            ordinal,
            detail: format!("encoding the test batch: {e}"),
        })?;
        for probes in batches {
            let files: Vec<&[u8]> = probes.iter().map(|p| p.file.as_slice()).collect();
            let out = self.submit(&files, &opts)?;
            let got = out.to_host_bytes()?;
            let offsets: Vec<usize> = out.images().iter().map(|s| s.offset).collect();
            if let Some(detail) = self_check::first_difference(&probes, &got, &offsets) {
                return Err(Error::SelfCheck { ordinal, detail });
            }
        }
        self_check::mark_passed(ordinal);
        Ok(())
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

    /// Threads a submit plans and stages a batch on ([`set_host_threads`](Self::set_host_threads)).
    pub fn host_threads(&self) -> usize {
        stdx::parallel::threads(self.host_threads)
    }

    /// Sets the threads of a batch's host stage — parsing and planning the sources, and writing their
    /// patch bytes and the tables into pinned staging — 0 (the default) for every core. The caller's
    /// thread is one of them; the others last for the call. One thread moves about 5 GB/s, less than a
    /// decode of FHD images consumes: the host stage on one thread is what bounds end-to-end decoding.
    pub fn set_host_threads(&mut self, threads: usize) {
        self.host_threads = threads;
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
        let (p, threads) = (plan.clone(), self.host_threads);
        let slot = self.stage(off, 0, |dst| p.stage_into(images, dst, threads), None)?;
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
        let plan = SamplePlan::new_parallel(sources, windows, opts, self.host_threads)?;
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
        let (p, threads) = (plan.clone(), self.host_threads);
        let slot = self.stage(off, 0, |dst| p.stage_into(sources, dst, threads), None)?;
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
        // Staged from the end of the files, so that the slack before the tables is zeros as well.
        let fill = |dst: &mut [u8]| {
            let (slack, tables) = dst.split_at_mut(off.descs - off.data_len);
            slack.fill(0);
            pack_tables(&Tables::of(&p), off, tables);
            Ok(())
        };
        let host = &batch.host()?[..batch.len];
        let slot = self.stage(off, off.data_len, fill, Some(host))?;
        let ev = self
            .copy_stream
            .record_event(None)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        batch.copied = Some(ev);
        let input = self.slots[slot].input.as_ref().expect("staged above");
        let decoded = self.launch(Origin::Images(plan), input, off)?;
        self.track(decoded)
    }

    /// Queues the launches of `origin`'s plan on the decode stream, reading `input`.
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
    fn throttle(in_flight: &mut VecDeque<CudaEvent>, max_in_flight: usize) -> Result<(), Error> {
        while in_flight.len() >= max_in_flight {
            if let Some(oldest) = in_flight.pop_front() {
                oldest
                    .synchronize()
                    .map_err(|e| Error::driver("cuEventSynchronize", e))?;
            }
        }
        Ok(())
    }

    /// Fills the next slot's pinned staging with input bytes `[staged_from, off.total)` (by `fill`: the
    /// host stage), waits for the in-flight bound, then copies them and `pinned_prefix` (already pinned,
    /// to input offset 0) on the copy stream, and makes the decode stream wait for the copy. Returns the
    /// slot, whose `input` the launch reads. The fill waits only for the last copy out of its slot, not
    /// for any decode: batch i+1's host stage runs while batches i−1 and i are still on the device.
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
        Self::throttle(&mut self.in_flight, self.max_in_flight)?;
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
        plan.stage_into(images, &mut host, self.host_threads)?;
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
        let plan = Arc::new(SamplePlan::new_parallel(
            sources,
            windows,
            opts,
            self.host_threads,
        )?);
        let off = InputOffsets::of_samples(&plan);
        let mut host = vec![0u8; off.total];
        plan.stage_into(sources, &mut host, self.host_threads)?;
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

    /// Decodes a batch already in device memory: its launches only, nothing copied from the host. Not counted
    /// against [`max_in_flight`](Self::max_in_flight): a benchmark queues as many as it times.
    pub fn decode_resident(&self, batch: &ResidentBatch) -> Result<DecodedBatch, Error> {
        self.launch(batch.origin.clone(), &batch.input, batch.offsets)
    }
}
