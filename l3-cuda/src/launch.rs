//! The launches of a batch: output, error word and scratch allocated in the decode stream's order, the
//! kernels' arguments in `kernel.cu`'s order, and the [`DecodedBatch`] that tracks them. A batch takes
//! one launch for its version-1 patches (and a sample batch's padding) and two for its version-2 patches
//! (the bucket words of its ANS tables, then the decode),
//! queued one after the other on the decode stream; they write disjoint parts of one output and share
//! one error word.
#![allow(unsafe_code)]

use crate::batch::{DecodedBatch, DeviceOutput, Origin};
use crate::error::Error;
use crate::input::InputOffsets;
use crate::kernels::Kernels;
use crate::layout::{V2_BLOCK, v1_blocks, v2_blocks};
use crate::plan::{BatchPlan, ImageSlot};
use crate::resample::ResampleStage;
use crate::sample::SamplePlan;
use crate::v2::{BUCKETS, V2Batch};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg, result,
};
use std::sync::{Arc, Mutex};
use vocab::DType;

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

/// `len` bytes (at least one) of the version-2 launch's own device memory, allocated in `stream`'s order:
/// the ANS scratch or the bucket words (`what`, for the error).
fn alloc_scratch(
    stream: &Arc<CudaStream>,
    len: u64,
    what: &'static str,
) -> Result<CudaSlice<u8>, Error> {
    let len = usize::try_from(len).map_err(|_| Error::TooLarge { what })?;
    // SAFETY: the kernels read a byte of it only after writing it: an ANS warp writes every code and
    // selector of its chunk before anything reads them (contexts read only rows already written), and
    // l3v2_buckets writes every bucket word of a used context before the decode launch, which reads no
    // other.
    unsafe { stream.alloc::<u8>(len.max(1)) }.map_err(|e| Error::driver("cuMemAllocAsync", e))
}

/// Queues the launches decoding every patch of `plan` from `input` (packed as [`InputOffsets`]) on
/// `stream`; the batch reads its error word back on `readback`.
pub(crate) fn launch(
    kernels: &Kernels,
    (stream, readback): (&Arc<CudaStream>, &Arc<CudaStream>),
    plan: Arc<BatchPlan>,
    input: &CudaSlice<u8>,
    off: InputOffsets,
) -> Result<DecodedBatch, Error> {
    let mut err = error_word(stream)?;
    let n = plan.descs.len() as u32;
    let cfg = LaunchConfig {
        grid_dim: (v1_blocks(plan.descs.len(), plan.block_dim), 1, 1),
        block_dim: (plan.block_dim, 1, 1),
        shared_mem_bytes: plan.shared_bytes(),
    };
    let data = input.slice(0..off.descs);
    let descs = input.slice(off.descs..off.v2.max(off.descs + 1));
    let v2 = input.slice(off.v2..off.fills.max(off.v2 + 1));
    let tables = input.slice(off.tables..off.scale_bias.max(off.tables + 1));
    let sb = input.slice(off.scale_bias..off.resample);
    let stage_cap = plan.stage_cap;
    let pair = kernels.for_dtype(plan.dtype);
    let mut kept = Vec::new();
    macro_rules! go {
        ($out:expr) => {{
            let mut out = $out;
            if cfg.grid_dim.0 > 0 {
                let mut b = stream.launch_builder(&pair.images);
                b.arg(&data)
                    .arg(&descs)
                    .arg(&n)
                    .arg(&mut out)
                    .arg(&sb)
                    .arg(&mut err)
                    .arg(&stage_cap);
                // SAFETY: argument order and types match kernel.cu's l3_decode_*; the descriptors were
                // built by BatchPlan from validated files, so every read stays inside `data` and every
                // write inside `out` (`BatchPlan::descriptors_in_bounds`).
                unsafe { b.launch(cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
            }
            let v2_args = V2Args { data: &data, descs: &v2, tables: &tables, sb: &sb, first_index: n };
            let fns = (&kernels.v2_buckets, &pair.v2);
            // SAFETY: the version-2 descriptors were built by BatchPlan from validated files
            // (`BatchPlan::descriptors_in_bounds` covers them, their tables, scratch and buckets).
            kept.extend(unsafe { launch_v2(stream, fns, &plan.v2, &v2_args, &mut out, &mut err) }?);
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
        _scratch: kept,
    })
}

/// Queues the launches decoding every window of a sample batch and padding around them — for a
/// resampled batch, into the intermediate, followed by the two passes.
pub(crate) fn launch_samples(
    kernels: &Kernels,
    (stream, readback): (&Arc<CudaStream>, &Arc<CudaStream>),
    plan: Arc<SamplePlan>,
    input: &CudaSlice<u8>,
    off: InputOffsets,
) -> Result<DecodedBatch, Error> {
    let mut err = error_word(stream)?;
    let n_descs = plan.descs.len() as u32;
    let n_fills = plan.fills.len() as u32;
    let cfg = LaunchConfig {
        grid_dim: (v1_blocks(plan.descs.len(), plan.block_dim) + n_fills, 1, 1),
        block_dim: (plan.block_dim, 1, 1),
        shared_mem_bytes: plan.shared_bytes(),
    };
    let data = input.slice(0..off.descs);
    let descs = input.slice(off.descs..off.v2.max(off.descs + 1));
    let v2 = input.slice(off.v2..off.fills.max(off.v2 + 1));
    let fills = input.slice(off.fills..off.tables.max(off.fills + 1));
    let tables = input.slice(off.tables..off.scale_bias.max(off.tables + 1));
    let sb = input.slice(off.scale_bias..off.resample);
    let stage_cap = plan.stage_cap;
    let (width, height) = plan.sample_size();
    let nchw = plan.nchw();
    let mut kept = Vec::new();
    macro_rules! decode {
        ($pair:expr, $out:expr) => {{
            let mut out = $out;
            if cfg.grid_dim.0 > 0 {
                let mut b = stream.launch_builder(&$pair.samples);
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
                    .arg(&nchw);
                // SAFETY: argument order and types match kernel.cu's l3_samples_*; SamplePlan built
                // every descriptor from validated sources and windows, so every read stays inside
                // `data` and every write inside its own sample of `out`
                // (`SamplePlan::descriptors_in_bounds`).
                unsafe { b.launch(cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
            }
            let v2_args = V2Args {
                data: &data,
                descs: &v2,
                tables: &tables,
                sb: &sb,
                first_index: n_descs,
            };
            let fns = (&kernels.v2_buckets, &$pair.v2);
            // SAFETY: SamplePlan built the version-2 descriptors from validated sources and windows
            // (`SamplePlan::descriptors_in_bounds` covers them, their tables, scratch and buckets).
            kept.extend(unsafe { launch_v2(stream, fns, &plan.v2, &v2_args, &mut out, &mut err) }?);
            out
        }};
    }
    let output = match &plan.resample {
        None => {
            let pair = kernels.for_dtype(plan.tensor.dtype);
            let len = plan.output_len();
            match plan.tensor.dtype {
                DType::U8 => DeviceOutput::U8(decode!(pair, alloc_output::<u8>(stream, len)?)),
                DType::F32 => DeviceOutput::F32(decode!(pair, alloc_output::<f32>(stream, len)?)),
                DType::F16 => DeviceOutput::F16(decode!(pair, alloc_output::<u16>(stream, len)?)),
            }
        }
        Some(stage) => {
            let pair = kernels.for_dtype(DType::U8);
            // SAFETY (allocation): the passes read only the rectangles the decode writes.
            let inter = decode!(pair, alloc_output::<u8>(stream, plan.tensor.len())?);
            let (out, tmp) = launch_passes(kernels, stream, stage, &inter, input, off)?;
            kept.push(inter);
            kept.push(tmp);
            out
        }
    };
    let ready = stream
        .record_event(None)
        .map_err(|e| Error::driver("cuEventRecord", e))?;
    let tensor = plan.tensor();
    let (w, h) = tensor.sample_size();
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
        tensor: Some(tensor),
        err,
        ready,
        origin: Origin::Samples(plan),
        readback: readback.clone(),
        consumers: Mutex::new(Vec::new()),
        _scratch: kept,
    })
}

/// The inputs of a version-2 launch that are views of the batch's device input.
struct V2Args<'a> {
    data: &'a CudaView<'a, u8>,
    descs: &'a CudaView<'a, u8>,
    tables: &'a CudaView<'a, u8>,
    sb: &'a CudaView<'a, u8>,
    /// The batch's version-1 descriptors: a failing version-2 patch i sets the error word to this + i.
    first_index: u32,
}

/// Queues the version-2 launches of a batch (nothing when it has no version-2 patch): the bucket words of
/// its ANS tables (`fns.0`), then a warp per patch of `v2` (`fns.1`), writing into `out` beside the
/// version-1 launch. Returns the device memory they use (the ANS scratch and bucket words), to be kept
/// until the batch is done.
///
/// # Safety
/// `v2`'s descriptors must read only inside `args`' buffers and the memory allocated here (its scratch
/// and bucket words) and write only inside `out` (what the plans' `descriptors_in_bounds` checks).
unsafe fn launch_v2<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    fns: (&CudaFunction, &CudaFunction),
    v2: &V2Batch,
    args: &V2Args<'_>,
    out: &mut CudaSlice<T>,
    err: &mut CudaSlice<u32>,
) -> Result<Vec<CudaSlice<u8>>, Error> {
    let n_v2 = v2.descs.len() as u32;
    if n_v2 == 0 {
        return Ok(Vec::new());
    }
    let mut scratch = alloc_scratch(
        stream,
        v2.scratch_len,
        "the ANS scratch memory exceeds the address space",
    )?;
    let mut buckets = alloc_scratch(
        stream,
        v2.bucket_words.saturating_mul(4),
        "the ANS bucket words exceed the address space",
    )?;
    if v2.bucket_words > 0 {
        let cfg = LaunchConfig {
            grid_dim: (n_v2, 1, 1),
            // A thread per bucket word of a context (`l3v2_buckets`).
            block_dim: (BUCKETS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(fns.0);
        b.arg(args.descs)
            .arg(&n_v2)
            .arg(args.tables)
            .arg(&mut buckets);
        // SAFETY: argument order and types match kernel.cu's l3v2_buckets; every ANS descriptor's table
        // and bucket words lie inside `tables` and `buckets` (`V2Batch::in_bounds`).
        unsafe { b.launch(cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
    }
    let cfg = LaunchConfig {
        grid_dim: (v2_blocks(v2.descs.len()), 1, 1),
        block_dim: (V2_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(fns.1);
    b.arg(args.data)
        .arg(args.descs)
        .arg(&n_v2)
        .arg(out)
        .arg(args.sb)
        .arg(err)
        .arg(&args.first_index)
        .arg(args.tables)
        .arg(&buckets)
        .arg(&mut scratch);
    // SAFETY: argument order and types match kernel.cu's l3v2_decode_*; the bounds are the caller's.
    unsafe { b.launch(cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
    Ok(vec![scratch, buckets])
}

/// Queues the two passes of a resampled batch over the intermediate `inter` its decode wrote: the
/// horizontal pass into a temporary (returned, to be kept until the batch is done), then the vertical pass
/// into the batch tensor.
fn launch_passes(
    kernels: &Kernels,
    stream: &Arc<CudaStream>,
    stage: &ResampleStage,
    inter: &CudaSlice<u8>,
    input: &CudaSlice<u8>,
    off: InputOffsets,
) -> Result<(DeviceOutput, CudaSlice<u8>), Error> {
    let mut tmp = alloc_output::<u8>(stream, stage.tmp_len)?;
    let (sb_at, tab_at) = stage.sections();
    let rd = input.slice(off.resample..off.resample + sb_at.max(1));
    let rsb = input.slice(off.resample + sb_at..off.resample + tab_at);
    let tab = input.slice(off.resample + tab_at..off.total.max(off.resample + tab_at + 1));
    let n = stage.descs.len() as u32;
    let rows = stage.rows;
    let block = (crate::resample::RESAMPLE_BLOCK, 1, 1);
    if stage.h_blocks() > 0 {
        let cfg = LaunchConfig {
            grid_dim: (stage.h_blocks(), 1, 1),
            block_dim: block,
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&kernels.resample_h);
        b.arg(inter)
            .arg(&mut tmp)
            .arg(&rd)
            .arg(&n)
            .arg(&rows)
            .arg(&tab);
        // SAFETY: argument order and types match kernel.cu's l3_resample_h; every table index
        // reads inside the sample's decoded rectangle and every write is inside its rows of
        // `tmp` (`ResampleStage::in_bounds`).
        unsafe { b.launch(cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
    }
    let (sw, sh) = stage.tensor.sample_size();
    let (nchw, fill) = (stage.nchw(), u32::from(stage.fill));
    let cfg = LaunchConfig {
        grid_dim: (stage.v_blocks(), 1, 1),
        block_dim: block,
        shared_mem_bytes: 0,
    };
    let kernel = &kernels.for_dtype(stage.tensor.dtype).resample;
    macro_rules! pass {
        ($out:expr) => {{
            let mut out = $out;
            let mut b = stream.launch_builder(kernel);
            b.arg(inter)
                .arg(&tmp)
                .arg(&rd)
                .arg(&n)
                .arg(&tab)
                .arg(&mut out)
                .arg(&rsb)
                .arg(&sw)
                .arg(&sh)
                .arg(&nchw)
                .arg(&fill);
            // SAFETY: argument order and types match kernel.cu's l3_resample_*; the blocks
            // write every element of their own sample row of `out`, and read inside the
            // intermediate, `tmp` and the tables (`ResampleStage::in_bounds`).
            unsafe { b.launch(cfg) }.map_err(|e| Error::driver("cuLaunchKernel", e))?;
            out
        }};
    }
    let len = stage.tensor.len();
    let out = match stage.tensor.dtype {
        DType::U8 => DeviceOutput::U8(pass!(alloc_output::<u8>(stream, len)?)),
        DType::F32 => DeviceOutput::F32(pass!(alloc_output::<f32>(stream, len)?)),
        DType::F16 => DeviceOutput::F16(pass!(alloc_output::<u16>(stream, len)?)),
    };
    Ok((out, tmp))
}
