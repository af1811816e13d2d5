//! The GPU decode stage: one thread in place of the CPU decode pool. It gathers every item of a batch
//! from the read stage, gives each item its geometry (the CPU path's: same crop, resize, padding and flip
//! for the same (seed, epoch, item)), and decodes the batch in ONE `l3-cuda` submission straight into a
//! device tensor: only the patches under each sample's source rectangle are copied and decoded, and
//! resampling (the CPU's integer tables), padding with `fill`, mirroring, layout, element type and
//! normalisation happen in the kernels. Whole images (no crop) make a batch as large as its largest
//! sample, each at the top left and the rest `fill`, as the CPU assembler pads them. The batch stays on
//! the device; the assembler delivers it as a CUDA [`Tensor`](crate::Tensor) with its ready event.
//!
//! With `masks`, the label maps are a second submission of the same machinery: the same geometries over
//! the mask files, nearest (torchvision's index rule, as on the CPU), one channel, `u8`, padded with
//! `ignore_index`, into a second device tensor `(n, h, w)` ([`Masks`](crate::Masks) on the device).
//! The GPU decodes L3 only, so masks must be one-channel L3 files (what `l3 convert --to l3` writes
//! for an 8-bit mask folder): any other mask is refused when the loader opens, naming it.
//!
//! While one batch decodes, the stage gathers, plans and queues the next (the decoder's pinned staging
//! alternates and bounds the batches in flight); the batch in flight is checked — the kernel's error
//! word — and delivered as soon as nothing else is ready to queue.
//!
//! Nothing falls back silently. A corrupt item is reported as that item's error (and the rest of the
//! batch decoded again without it); any other GPU failure fails the run naming the batch and the cause —
//! unless the caller asked for `gpu_fallback`, in which case that batch is decoded on the CPU into host
//! memory (its tensor's [`device`](crate::Tensor::device) says so), counted in
//! [`Stats::gpu_fallback_batches`](crate::Stats::gpu_fallback_batches), and the first fallback is logged.

use super::{Ctx, ItemDone, Job, ToAssembler};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{Decoded, Stored};
use crate::sample::{SampleSpec, Window};
use crate::stats::Counters;
use crate::targets::Targets;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use l3_cuda::{DecodedBatch, SampleOptions, SamplePlan, SampleSource};
use l3_format::L3Index;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use vocab::{Geometry, Interpolation};

/// Why a mask cannot go to the device, after its name.
const DEVICE_MASKS: &str = "masks decoded on a CUDA device must be one-channel L3 files, decoded by the \
    GPU beside their images: convert the mask folder with `l3 convert --to l3` (16-bit masks stay PNG \
    there, and need device cpu)";

/// Refuses, before anything runs, masks the GPU cannot decode: every paired mask must be an L3 file.
/// (Each one's header is checked again when it is read: one channel, its image's size.)
pub(crate) fn check_masks(targets: &Targets, items: usize) -> Result<()> {
    if !targets.has_masks() {
        return Ok(());
    }
    if targets.wide() {
        return Err(Error::Options(format!(
            "masks: 16-bit masks cannot be decoded on a CUDA device ({DEVICE_MASKS})"
        )));
    }
    for i in 0..items {
        if let Some(Ok(path)) = targets.mask_path(i) {
            let ext = path.extension().and_then(|e| e.to_str());
            if !ext.is_some_and(|e| e.eq_ignore_ascii_case("l3")) {
                return Err(Error::dataset(path, DEVICE_MASKS));
            }
        }
    }
    Ok(())
}

/// Proves that the GPU can decode `dataset` (every item L3; driver, device, context and NVRTC-compiled
/// kernels all working) by opening the decoder the stage will use.
pub(crate) fn open(dataset: &dyn Dataset, ordinal: usize) -> Result<l3_cuda::BatchDecoder> {
    if let Some(i) = (0..dataset.len()).find(|&i| dataset.format(i) != Format::L3) {
        return Err(Error::gpu(
            Some(format!("item {i}, {}", dataset.source(i).display())),
            format!(
                "the GPU decoder reads L3 files only, and this item is {}",
                dataset.format(i)
            ),
        ));
    }
    l3_cuda::BatchDecoder::new(ordinal)
        .map_err(|e| Error::gpu(Some(format!("device {ordinal}")), e))
}

/// One item of a batch on its way to the device: what was read, and its geometry.
struct Entry {
    job: Job,
    stored: Stored,
    read: u64,
    geometry: Geometry,
    /// The image's width and height.
    image: (u32, u32),
    /// Its mask (a one-channel L3 file of the image's size: what was read of it, the bytes that took)
    /// and where it lives, when the batch has masks.
    mask: Option<(Stored, u64, PathBuf)>,
}

impl Entry {
    fn source(&self) -> SampleSource<'_> {
        source(&self.stored)
    }

    fn mask_source(&self) -> Option<SampleSource<'_>> {
        self.mask.as_ref().map(|(m, _, _)| source(m))
    }

    /// The item's result, and the job dropped first: a batch is finished only once every slot of its
    /// buffer is gone.
    fn done(self, result: Result<Decoded>) -> ItemDone {
        let d = ItemDone::of(&self.job, Some(self.read), result);
        drop(self.job);
        d
    }
}

/// A batch whose copy and launch are queued: its images, and its masks when it has masks.
struct InFlight {
    entries: Vec<Entry>,
    batch: DecodedBatch,
    masks: Option<DecodedBatch>,
}

pub(crate) struct GpuStage {
    pub ctx: Ctx,
    pub decoder: l3_cuda::BatchDecoder,
    /// Decode a batch the GPU fails on with the CPU instead of failing the run.
    pub fallback: bool,
}

impl GpuStage {
    pub fn run(mut self, jobs: Receiver<Job>, out: Sender<ToAssembler>) {
        let mut gathering: BTreeMap<u64, Vec<Job>> = BTreeMap::new();
        let mut in_flight: Option<InFlight> = None;
        let mut warned = false;
        let send = |msgs: Vec<ToAssembler>| msgs.into_iter().all(|m| out.send(m).is_ok());
        loop {
            let next = if in_flight.is_some() {
                match jobs.try_recv() {
                    Ok(j) => Some(j),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => break,
                }
            } else {
                match jobs.recv() {
                    Ok(j) => Some(j),
                    Err(_) => break,
                }
            };
            if self.ctx.stopped() {
                return;
            }
            let Some(job) = next else {
                // Nothing more to queue right now: deliver the batch in flight.
                if let Some(f) = in_flight.take()
                    && !send(self.finish(f, &mut warned))
                {
                    return;
                }
                continue;
            };
            let (seq, want) = (job.seq, job.batch_len);
            let batch = gathering.entry(seq).or_default();
            batch.push(job);
            if batch.len() < want {
                continue;
            }
            let batch = gathering.remove(&seq).expect("present");
            let (msgs, queued) = self.start(batch, &mut warned);
            if !send(msgs) {
                return;
            }
            if let Some(f) = in_flight.take()
                && !send(self.finish(f, &mut warned))
            {
                return;
            }
            in_flight = queued;
        }
        if let Some(f) = in_flight.take() {
            send(self.finish(f, &mut warned));
        }
    }

    /// Plans and queues one gathered batch. Returns what is already known (items whose read failed or
    /// that the host plan rejects; a whole batch the device failed on) and the queued launch, if any.
    fn start(
        &mut self,
        mut batch: Vec<Job>,
        warned: &mut bool,
    ) -> (Vec<ToAssembler>, Option<InFlight>) {
        let t0 = Instant::now();
        batch.sort_by_key(|j| j.slot_index);
        let mut msgs = Vec::new();
        let mut entries = Vec::with_capacity(batch.len());
        for mut job in batch {
            let (stored, read) = match job.stored.take() {
                Some(Ok(s)) => s,
                Some(Err(e)) => {
                    msgs.push(item(job, None, Err(e)));
                    continue;
                }
                None => {
                    let e = Error::Pipeline("an item reached decoding unread".into());
                    msgs.push(item(job, None, Err(e)));
                    continue;
                }
            };
            match dims(&stored) {
                Ok((w, h)) => {
                    let mask = match self.mask_of(&mut job, (w, h)) {
                        Ok(m) => m,
                        Err(e) => {
                            msgs.push(item(job, Some(read), Err(e)));
                            continue;
                        }
                    };
                    let geometry = self.ctx.request(job.key).geometry(w, h);
                    entries.push(Entry {
                        job,
                        stored,
                        read,
                        geometry,
                        image: (w, h),
                        mask,
                    });
                }
                Err(e) => {
                    let e = Error::decode(self.ctx.ds.source(job.index), "l3", e);
                    msgs.push(item(job, Some(read), Err(e)));
                }
            }
        }
        let queued = match self.launch(&mut entries, &mut msgs) {
            Ok(None) => None,
            Ok(Some((batch, masks))) => Some(InFlight {
                entries,
                batch,
                masks,
            }),
            Err(failure) => {
                msgs.extend(self.device_failed(failure, entries, warned));
                None
            }
        };
        Counters::add_time(&self.ctx.counters.decode_ns, t0);
        (msgs, queued)
    }

    /// An item's mask, when the batch has masks: the bytes the read stage read (or read now, as under
    /// the Liquid order), refused unless the GPU can decode it as its image's label map.
    fn mask_of(&self, job: &mut Job, image: (u32, u32)) -> Result<Option<(Stored, u64, PathBuf)>> {
        let Some(t) = self.ctx.targets.as_ref().filter(|t| t.has_masks()) else {
            return Ok(None);
        };
        let path = match t.mask_path(job.index) {
            Some(p) => p?,
            None => return Ok(None),
        };
        let (mask, n) = match job.mask.take() {
            Some(read) => read?,
            None => {
                let Some(read) = t.read_mask(job.index, &self.ctx.request(job.key)) else {
                    return Ok(None);
                };
                let (mask, n) = read?;
                Counters::add(&self.ctx.counters.bytes_read, n);
                (mask, n)
            }
        };
        let image_path = self.ctx.ds.source(job.index);
        device_mask(&mask, &path, (&image_path, image))?;
        Ok(Some((mask, n, path)))
    }

    /// Plans `entries` and queues their launch (and their masks', when the batch has masks); an item
    /// the plans reject is reported into `msgs` and left out. `Ok(None)` when no item is left; `Err` is
    /// a failure of the device, not of an item.
    #[allow(clippy::type_complexity)]
    fn launch(
        &mut self,
        entries: &mut Vec<Entry>,
        msgs: &mut Vec<ToAssembler>,
    ) -> std::result::Result<Option<(DecodedBatch, Option<DecodedBatch>)>, l3_cuda::Error> {
        let spec = &self.ctx.spec;
        while !entries.is_empty() {
            let sources: Vec<SampleSource> = entries.iter().map(Entry::source).collect();
            let geometries: Vec<Geometry> = entries.iter().map(|e| e.geometry).collect();
            let opts = sample_options(spec, &geometries);
            let mask_opts = self.ctx.targets.as_deref().map(|t| mask_options(&opts, t));
            let submitted = plan(&sources, &geometries, spec, &opts)
                .and_then(|plan| self.decoder.submit_sample_plan(Arc::new(plan), &sources));
            drop(sources);
            let batch = match submitted {
                Ok(batch) => batch,
                Err(e) => match e.image_index() {
                    Some(i) if i < entries.len() => {
                        msgs.push(self.item_failed(entries.remove(i), e, false));
                        continue;
                    }
                    _ => return Err(e),
                },
            };
            let masks: Option<Vec<SampleSource>> = entries.iter().map(Entry::mask_source).collect();
            let (Some(masks), Some(mask_opts)) = (masks, mask_opts) else {
                Counters::add(&self.ctx.counters.gpu_batches, 1);
                return Ok(Some((batch, None)));
            };
            let submitted =
                SamplePlan::resampled(&masks, &geometries, Interpolation::Nearest, &mask_opts)
                    .and_then(|plan| self.decoder.submit_sample_plan(Arc::new(plan), &masks));
            drop(masks);
            match submitted {
                Ok(m) => {
                    Counters::add(&self.ctx.counters.gpu_batches, 1);
                    return Ok(Some((batch, Some(m))));
                }
                Err(e) => {
                    drop(batch);
                    match e.image_index() {
                        Some(i) if i < entries.len() => {
                            msgs.push(self.item_failed(entries.remove(i), e, true))
                        }
                        _ => return Err(e),
                    }
                }
            }
        }
        Ok(None)
    }

    /// Waits for a queued batch and reports it: the device tensor, then every item. An item the kernel
    /// found corrupt is reported alone and the rest decoded again.
    fn finish(&mut self, f: InFlight, warned: &mut bool) -> Vec<ToAssembler> {
        let t0 = Instant::now();
        let InFlight {
            mut entries,
            mut batch,
            mut masks,
        } = f;
        let mut msgs = Vec::new();
        loop {
            let waited = batch.wait().map_err(|e| (e, false)).and_then(|()| {
                masks
                    .as_mut()
                    .map_or(Ok(()), |m| m.wait().map_err(|e| (e, true)))
            });
            match waited {
                Ok(()) => break,
                Err((e, in_mask)) => {
                    let failure = match e.image_index() {
                        Some(i) if i < entries.len() => {
                            msgs.push(self.item_failed(entries.remove(i), e, in_mask));
                            drop((batch, masks));
                            self.launch(&mut entries, &mut msgs)
                        }
                        _ => Err(e),
                    };
                    match failure {
                        Ok(Some(again)) => (batch, masks) = again,
                        Ok(None) => {
                            Counters::add_time(&self.ctx.counters.decode_ns, t0);
                            return msgs;
                        }
                        Err(e) => {
                            msgs.extend(self.device_failed(e, entries, warned));
                            Counters::add_time(&self.ctx.counters.decode_ns, t0);
                            return msgs;
                        }
                    }
                }
            }
        }
        let seq = entries.first().map_or(0, |e| e.job.seq);
        let rects = batch
            .sample_plan()
            .map_or(Vec::new(), |p| p.source_rects().to_vec());
        msgs.push(ToAssembler::Device {
            seq,
            batch: Box::new(batch),
            masks: masks.map(Box::new),
        });
        for (i, mut e) in entries.into_iter().enumerate() {
            let pixels = rects.get(i).map_or(0, |r| u64::from(r.w) * u64::from(r.h));
            Counters::add(&self.ctx.counters.items_decoded, 1);
            Counters::add(&self.ctx.counters.pixels_decoded, pixels);
            let geometry = e.geometry;
            let image = e.image;
            // Boxes are the host's part of a device batch (a box member that fails to read or parse
            // fails its item, as on the CPU path).
            let read = e.job.boxes.take();
            let boxes = match &self.ctx.targets {
                Some(t) => t.boxes_for(e.job.index, read, &geometry),
                None => Ok(None),
            };
            let (decoded, boxes) = match boxes {
                Ok(b) => (
                    Ok(Decoded {
                        pixels,
                        partial: false,
                        geometry: Some(geometry),
                        image,
                    }),
                    b,
                ),
                Err(err) => (Err(err), None),
            };
            let mut done = e.done(decoded);
            done.boxes = boxes;
            msgs.push(ToAssembler::Item(done));
        }
        Counters::add_time(&self.ctx.counters.decode_ns, t0);
        msgs
    }

    /// An item the GPU decoder rejected (corrupt file, rows or patch — of its image, or `in_mask` of
    /// its mask), as that item's decode error naming the file. A file the host plan rejects gets the
    /// CPU decoder's words: the batch index means nothing here.
    fn item_failed(&self, e: Entry, why: l3_cuda::Error, in_mask: bool) -> ToAssembler {
        let path = match (&e.mask, in_mask) {
            (Some((_, _, mask)), true) => mask.clone(),
            _ => self.ctx.ds.source(e.job.index),
        };
        let error = match why {
            l3_cuda::Error::Image { source, .. } => Error::decode(path, "l3", source),
            other => Error::decode(path, "l3", other),
        };
        ToAssembler::Item(e.done(Err(error)))
    }

    /// The device failed on a batch: decode it on the CPU when the caller allowed it, else fail the run
    /// naming the batch.
    fn device_failed(
        &self,
        failure: l3_cuda::Error,
        entries: Vec<Entry>,
        warned: &mut bool,
    ) -> Vec<ToAssembler> {
        let at = entries.first().map(|e| {
            format!(
                "a batch of epoch {} with item {}, {}",
                e.job.key.epoch,
                e.job.index,
                self.ctx.ds.source(e.job.index).display()
            )
        });
        let failure = Error::gpu(at, failure);
        if !self.fallback {
            let reason = failure.to_string();
            return entries
                .into_iter()
                .map(|e| {
                    let mut d = e.done(Err(Error::gpu(None, reason.clone())));
                    d.fatal = true;
                    ToAssembler::Item(d)
                })
                .collect();
        }
        Counters::add(&self.ctx.counters.gpu_fallback_batches, 1);
        if !*warned {
            *warned = true;
            eprintln!(
                "l3 loader: warning: {failure}; decoding such batches on the CPU (gpu_fallback is on)"
            );
        }
        let mut buffers = super::decode::Buffers::default();
        entries
            .into_iter()
            .map(|mut e| {
                e.job.stored = Some(Ok((e.stored, e.read)));
                e.job.mask = e.mask.map(|(m, n, _)| Ok((m, n)));
                ToAssembler::Item(super::decode::decode(&self.ctx, &mut buffers, e.job))
            })
            .collect()
    }
}

/// An item's result, its job (and slot) dropped first.
fn item(job: Job, read: Option<u64>, result: Result<Decoded>) -> ToAssembler {
    let d = ItemDone::of(&job, read, result);
    drop(job);
    ToAssembler::Item(d)
}

/// The kernel's view of what was read: a whole file, or the header and the patches under the window.
fn source(stored: &Stored) -> SampleSource<'_> {
    match stored {
        Stored::Whole(bytes) => SampleSource::File(bytes),
        Stored::L3Region { index, fragments } => SampleSource::Fragments {
            index,
            data: fragments,
        },
    }
}

/// The `l3-cuda` plan of a batch: one launch of windows when no sample resamples (the plain crop
/// recipe, or images already at their resized size), else the resampled batch's launches.
fn plan(
    sources: &[SampleSource<'_>],
    geometries: &[Geometry],
    spec: &SampleSpec,
    opts: &SampleOptions,
) -> std::result::Result<SamplePlan, l3_cuda::Error> {
    match geometries
        .iter()
        .map(Geometry::as_window)
        .collect::<Option<Vec<Window>>>()
    {
        Some(windows) => SamplePlan::new(sources, &windows, opts),
        None => SamplePlan::resampled(sources, geometries, spec.interpolation, opts),
    }
}

/// The shape of a batch of `geometries` for `l3-cuda`: the spec's sample size, or for whole images (no
/// crop) the largest kept size among them, each sample at the top left and the rest `fill` — the CPU
/// assembler's padding of a batch of whole images.
fn sample_options(spec: &SampleSpec, geometries: &[Geometry]) -> SampleOptions {
    let (width, height) = if spec.recipe.is_whole() {
        geometries
            .iter()
            .map(Geometry::size)
            .fold((1, 1), |(w, h), (gw, gh)| (w.max(gw), h.max(gh)))
    } else {
        (spec.width, spec.height)
    };
    SampleOptions {
        width,
        height,
        channels: spec.channels,
        layout: spec.layout,
        dtype: spec.dtype,
        normalize: spec.normalize,
        fill: spec.fill,
        // Corrupt rows are the item's error before anything is launched, exactly as the CPU path's
        // region decode reports them.
        check_rows_on_host: true,
    }
}

/// The label maps beside a batch of `images` options for `l3-cuda`: the same size, one channel, `u8`,
/// padded with `ignore_index`.
fn mask_options(images: &SampleOptions, t: &Targets) -> SampleOptions {
    SampleOptions {
        channels: 1,
        layout: vocab::Layout::Nchw,
        dtype: vocab::DType::U8,
        normalize: None,
        // 16-bit masks are refused on a device (`check_masks`), so the ignore index fits a byte.
        fill: u8::try_from(t.ignore_index()).unwrap_or(u8::MAX),
        ..*images
    }
}

/// Checks, from its header alone, that a mask is what the GPU decodes as its image's label map: a
/// one-channel L3 file of the image's size. The errors are the CPU path's, naming the mask (and the
/// image).
fn device_mask(mask: &Stored, path: &Path, (image_path, image): (&Path, (u32, u32))) -> Result<()> {
    let parsed;
    let index = match mask {
        Stored::L3Region { index, .. } => index.as_ref(),
        Stored::Whole(bytes) => {
            match Format::sniff(bytes) {
                Some(Format::L3) => {}
                other => {
                    return Err(Error::decode(
                        path,
                        other.map_or("mask", Format::name),
                        DEVICE_MASKS,
                    ));
                }
            }
            let n = L3Index::prefix_len(bytes).map_err(|e| Error::decode(path, "l3", e))?;
            parsed = L3Index::parse(&bytes[..n.min(bytes.len())], bytes.len() as u64)
                .map_err(|e| Error::decode(path, "l3", e))?;
            &parsed
        }
    };
    if index.channels() != 1 {
        return Err(Error::decode(
            path,
            "l3",
            format!(
                "a mask is one channel of class indices; this L3 file has {}",
                index.channels()
            ),
        ));
    }
    let (w, h) = (index.width(), index.height());
    if (w, h) != image {
        return Err(Error::dataset(
            path,
            format!(
                "the mask is {w}x{h} but its image {} is {}x{}",
                image_path.display(),
                image.0,
                image.1
            ),
        ));
    }
    Ok(())
}

/// Width and height of a stored L3 item, from its header alone.
fn dims(stored: &Stored) -> std::result::Result<(u32, u32), l3_format::Error> {
    match stored {
        Stored::L3Region { index, .. } => Ok((index.width(), index.height())),
        Stored::Whole(bytes) => {
            let n = L3Index::prefix_len(bytes)?;
            let index = L3Index::parse(&bytes[..n.min(bytes.len())], bytes.len() as u64)?;
            Ok((index.width(), index.height()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::ImageFolder;
    use crate::item::SampleRequest;
    use crate::sample::{DType, DecodeScope, ItemKey, Layout, Normalize};
    use l3_format::{EncodeOptions, Profile};
    use vocab::Crop;
    use vocab::Interpolation;

    /// A gradient with a little noise: compressible, but not trivially.
    fn pixels(w: u32, h: u32, seed: u32) -> Vec<u8> {
        let mut rng = stdx::SplitMix64::new(u64::from(seed));
        let row = w as usize * 3;
        (0..row * h as usize)
            .map(|i| ((i % row) / 5 + i / row) as u8 ^ (rng.next_u64() as u8 & 15))
            .collect()
    }

    fn encode(w: u32, h: u32, seed: u32, format: l3_format::Format, patch: u8) -> Vec<u8> {
        let opts = EncodeOptions {
            format,
            patch_size: Some(patch),
            threads: 1,
            ..EncodeOptions::default()
        };
        l3_format::encode_with(&pixels(w, h, seed), w, h, 3, &opts).unwrap()
    }

    const SPEC: SampleSpec = SampleSpec {
        height: 96,
        width: 128,
        crop: Crop::Random,
        hflip: true,
        layout: Layout::Nchw,
        dtype: DType::F16,
        normalize: Some(Normalize::IMAGENET),
        recipe: vocab::Recipe::Crop,
        interpolation: vocab::Interpolation::Bilinear,
        fill: 0,
        channels: 3,
    };

    /// What the stage hands `l3-cuda` for a batch is a valid plan, from region reads as from whole
    /// files, for every recipe and interpolation: every patch under every sample's source rectangle was
    /// read (the read stage and the kernel's plan agree on the patches, filter margin included), each
    /// image gets the CPU path's geometry, and every kernel block stays inside its own sample. Versions
    /// 1 and 2 (both profiles), images smaller and larger than the sample.
    #[test]
    fn the_read_stages_items_plan_a_device_batch() {
        let tmp = tempfile::tempdir().unwrap();
        let formats = [
            l3_format::Format::V1,
            l3_format::Format::V2(Profile::Bp),
            l3_format::Format::V2(Profile::Ans),
        ];
        let sizes = [(1u32, 1u32), (7, 3), (300, 200), (1031, 517), (64, 64)];
        let mut k = 0;
        for (f, format) in formats.into_iter().enumerate() {
            for (s, &(w, h)) in sizes.iter().enumerate() {
                let patch = [32, 64][(f + s) % 2];
                let bytes = encode(w, h, k, format, patch);
                std::fs::write(tmp.path().join(format!("{k:02}.l3")), bytes).unwrap();
                k += 1;
            }
        }
        let ds = ImageFolder::open(tmp.path()).unwrap();
        assert_eq!(ds.len(), 15);
        let recipes = [
            vocab::Recipe::Crop,
            vocab::Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: vocab::DEFAULT_RATIO,
            },
            vocab::Recipe::Resize { shorter: 64 },
            vocab::Recipe::Jitter { range: [0.5, 2.0] },
            // Whole images: at their own size (every sample a copy), bounded, resized then bounded.
            vocab::Recipe::Whole(vocab::Whole::default()),
            vocab::Recipe::Whole(vocab::Whole {
                max_size: Some(100),
                ..vocab::Whole::default()
            }),
            vocab::Recipe::Whole(vocab::Whole {
                shorter: Some(40),
                max_size: Some(300),
                ..vocab::Whole::default()
            }),
        ];
        for (recipe, interpolation) in recipes
            .into_iter()
            .flat_map(|r| [(r, Interpolation::Bilinear), (r, Interpolation::Nearest)])
        {
            let spec = SampleSpec {
                recipe,
                interpolation,
                fill: 9,
                ..SPEC
            };
            for scope in [DecodeScope::Region, DecodeScope::Whole] {
                let tag = format!("{recipe:?} {interpolation:?} {scope:?}");
                let (mut stored, mut geometries, mut read) = (Vec::new(), Vec::new(), 0u64);
                let mut rects = Vec::new();
                for i in 0..ds.len() {
                    let key = ItemKey {
                        seed: 9,
                        epoch: 1,
                        index: i,
                    };
                    let req = SampleRequest {
                        spec: &spec,
                        key,
                        scope,
                        partial_images: false,
                    };
                    let (s, n) = ds.read(i, &req).unwrap();
                    assert_eq!(
                        matches!(s, Stored::L3Region { .. }),
                        scope == DecodeScope::Region
                    );
                    let (w, h) = dims(&s).unwrap();
                    geometries.push(req.geometry(w, h));
                    rects.push(req.source_rect(w, h));
                    stored.push(s);
                    read += n;
                }
                let sources: Vec<_> = stored.iter().map(source).collect();
                let plan = plan(
                    &sources,
                    &geometries,
                    &spec,
                    &sample_options(&spec, &geometries),
                )
                .unwrap_or_else(|e| panic!("{tag}: {e}"));
                let copies = geometries.iter().all(Geometry::is_copy);
                assert_eq!(plan.is_resampled(), !copies, "{tag}");
                let own_size = vocab::Recipe::Whole(vocab::Whole::default());
                assert_eq!(
                    copies,
                    matches!(recipe, vocab::Recipe::Crop) || recipe == own_size
                );
                assert_eq!(plan.sample_count(), 15);
                if recipe.is_whole() {
                    // Each whole image at the top left of a batch as large as its largest.
                    let bound = |f: fn(&Geometry) -> u32| geometries.iter().map(f).max().unwrap();
                    let (w, h) = (bound(|g| g.x.len), bound(|g| g.y.len));
                    assert_eq!(
                        plan.tensor().shape,
                        [15, 3, h as usize, w as usize],
                        "{tag}"
                    );
                    if recipe == own_size {
                        assert_eq!((w, h), (1031, 517), "{tag}");
                    }
                    assert!(geometries.iter().all(|g| (g.dx, g.dy) == (0, 0)), "{tag}");
                } else {
                    assert_eq!(plan.tensor().shape, [15, 3, 96, 128]);
                }
                assert!(plan.descriptors_in_bounds(), "{tag}");
                assert!(plan.input_len() as u64 <= read, "{tag}");
                assert_eq!(plan.source_rects(), &rects[..], "{tag}");
                if recipe == vocab::Recipe::Crop {
                    // Images smaller than the sample are padded around, larger ones cropped.
                    let w0 = geometries[0].as_window().unwrap();
                    assert_eq!((w0.src.w, w0.dx), (1, 63));
                    let w3 = geometries[3].as_window().unwrap();
                    assert_eq!((w3.src.w, w3.src.h), (128, 96));
                }
            }
        }
    }

    /// Luma and RGBA batches plan through the resampling kernels with the batch's channel count, and a
    /// batch's masks plan beside its images: the same geometries over one-channel L3 masks, nearest,
    /// `u8`, padded with the ignore index, `(n, 1, h, w)`, every block inside its own sample.
    #[test]
    fn luma_rgba_and_mask_batches_plan_beside_their_images() {
        let sizes = [(1u32, 1u32), (7, 3), (300, 200), (64, 64), (129, 77)];
        let recipes = [
            vocab::Recipe::Crop,
            vocab::Recipe::Jitter { range: [0.5, 2.0] },
            vocab::Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: vocab::DEFAULT_RATIO,
            },
            vocab::Recipe::Whole(vocab::Whole {
                jitter: Some([0.5, 2.0]),
                max_size: Some(256),
                ..vocab::Whole::default()
            }),
        ];
        let images: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &(w, h))| encode(w, h, k as u32, l3_format::Format::V1, 32))
            .collect();
        let masks: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&(w, h)| {
                let labels: Vec<u8> = (0..w * h).map(|i| (i % 19) as u8).collect();
                l3_format::encode(&labels, w, h, 1, 32).unwrap()
            })
            .collect();
        for (r, recipe) in recipes.into_iter().enumerate() {
            for channels in [1u8, 3, 4] {
                let spec = SampleSpec {
                    recipe,
                    channels,
                    normalize: None,
                    dtype: DType::U8,
                    ..SPEC
                };
                let geometries: Vec<Geometry> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &(w, h))| {
                        let key = ItemKey {
                            seed: 5,
                            epoch: r,
                            index: i,
                        };
                        spec.geometry(w, h, &key)
                    })
                    .collect();
                let tag = format!("{recipe:?} channels {channels}");
                let sources: Vec<_> = images.iter().map(|b| SampleSource::File(b)).collect();
                let p = plan(
                    &sources,
                    &geometries,
                    &spec,
                    &sample_options(&spec, &geometries),
                )
                .unwrap_or_else(|e| panic!("{tag}: {e}"));
                let (h, w) = if recipe.is_whole() {
                    let bound = |f: fn(&Geometry) -> u32| geometries.iter().map(f).max().unwrap();
                    (bound(|g| g.y.len) as usize, bound(|g| g.x.len) as usize)
                } else {
                    (96, 128)
                };
                assert_eq!(p.tensor().shape, [5, channels as usize, h, w], "{tag}");
                assert_eq!(p.is_resampled(), channels != 3 || r != 0, "{tag}");
                assert!(p.descriptors_in_bounds(), "{tag}");
                let opts = SampleOptions {
                    channels: 1,
                    layout: Layout::Nchw,
                    dtype: DType::U8,
                    normalize: None,
                    fill: 250,
                    ..sample_options(&spec, &geometries)
                };
                let mask_sources: Vec<_> = masks.iter().map(|b| SampleSource::File(b)).collect();
                let m = SamplePlan::resampled(
                    &mask_sources,
                    &geometries,
                    Interpolation::Nearest,
                    &opts,
                )
                .unwrap_or_else(|e| panic!("{tag} masks: {e}"));
                assert_eq!(m.tensor().shape, [5, 1, h, w], "{tag}");
                assert!(m.descriptors_in_bounds(), "{tag}");
            }
        }
    }

    /// A mask the GPU cannot decode as its image's label map is that item's error, naming the mask (and
    /// the image when the sizes differ), in the CPU path's words.
    #[test]
    fn masks_the_gpu_cannot_decode_are_named() {
        let (mask, image) = (Path::new("gt/a_labelIds.l3"), Path::new("img/a.l3"));
        let gray = Stored::Whole(l3_format::encode(&[3u8; 12], 4, 3, 1, 32).unwrap());
        assert!(device_mask(&gray, mask, (image, (4, 3))).is_ok());
        let e = device_mask(&gray, mask, (image, (5, 3)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a_labelIds.l3") && e.contains("img/a.l3") && e.contains("4x3"),
            "{e}"
        );
        let rgb = l3_format::encode(&[3u8; 36], 4, 3, 3, 32).unwrap();
        // Read by region, the header is what decides (the patches are not needed to refuse it).
        let n = L3Index::prefix_len(&rgb).unwrap();
        let region = Stored::L3Region {
            index: Arc::new(L3Index::parse(&rgb[..n], rgb.len() as u64).unwrap()),
            fragments: l3_format::Fragments::new(),
        };
        let e = device_mask(&region, mask, (image, (4, 3)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a_labelIds.l3") && e.contains("one channel"),
            "{e}"
        );
        let rgb = Stored::Whole(rgb);
        let e = device_mask(&rgb, mask, (image, (4, 3)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a_labelIds.l3") && e.contains("one channel"),
            "{e}"
        );
        let pgm = Stored::Whole(b"P5 4 3 255\n............".to_vec());
        let e = device_mask(&pgm, mask, (image, (4, 3)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a_labelIds.l3") && e.contains("l3 convert --to l3"),
            "{e}"
        );
        let Stored::Whole(bytes) = &gray else {
            unreachable!()
        };
        let e = device_mask(&Stored::Whole(bytes[..20].to_vec()), mask, (image, (4, 3)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a_labelIds.l3"), "{e}");
    }

    /// A corrupt item is named by its place in the batch (the stage drops it and decodes the rest), and
    /// a truncated one is refused from its header before any plan.
    #[test]
    fn corrupt_items_are_named_by_their_batch_index() {
        let good = encode(40, 30, 1, l3_format::Format::V1, 32);
        let mut bad = good.clone();
        let start = l3_format::L3File::parse(&bad).unwrap().data_offset();
        bad[start] |= 0x0f;
        let key = |index| ItemKey {
            seed: 0,
            epoch: 0,
            index,
        };
        let stored = [Stored::Whole(good.clone()), Stored::Whole(bad)];
        let windows: Vec<_> = stored
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (w, h) = dims(s).unwrap();
                SPEC.window(w, h, &key(i))
            })
            .collect();
        let sources: Vec<_> = stored.iter().map(source).collect();
        let e = SamplePlan::new(&sources, &windows, &sample_options(&SPEC, &[])).unwrap_err();
        assert_eq!(e.image_index(), Some(1), "{e}");
        assert!(dims(&Stored::Whole(b"not an L3 file".to_vec())).is_err());
        // A file cut short keeps a readable header; the plan refuses it, naming it.
        let cut = Stored::Whole(good[..good.len() - 1].to_vec());
        let (w, h) = dims(&cut).unwrap();
        let e = SamplePlan::new(
            &[source(&stored[0]), source(&cut)],
            &[windows[0], SPEC.window(w, h, &key(1))],
            &sample_options(&SPEC, &[]),
        )
        .unwrap_err();
        assert_eq!(e.image_index(), Some(1), "{e}");
    }
}
