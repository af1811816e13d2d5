//! The GPU decode stage: one thread in place of the CPU decode pool. It gathers every item of a batch
//! from the read stage and decodes the batch in ONE `l3-cuda` launch, then writes each sample into its
//! slot.
//!
//! Nothing falls back silently. A corrupt file is reported as that item's error (and the rest of the batch
//! decoded again without it); any other GPU failure fails the run naming the batch and the cause — unless
//! the caller asked for `gpu_fallback`, in which case that batch is decoded on the CPU, counted in
//! [`Stats::gpu_fallback_batches`](crate::Stats::gpu_fallback_batches), and the first fallback is logged.

use super::{Ctx, ItemDone, Job, ToAssembler};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{Scratch, Stored, write_pixels};
use crate::stats::Counters;
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::time::Instant;

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

pub(crate) struct GpuStage {
    pub ctx: Ctx,
    pub decoder: l3_cuda::BatchDecoder,
    /// Decode a batch the GPU fails on with the CPU instead of failing the run.
    pub fallback: bool,
}

impl GpuStage {
    pub fn run(mut self, jobs: Receiver<Job>, out: Sender<ToAssembler>) {
        let mut gathering: BTreeMap<u64, Vec<Job>> = BTreeMap::new();
        let mut scratch = Scratch::default();
        let mut warned = false;
        while let Ok(job) = jobs.recv() {
            if self.ctx.stopped() {
                return;
            }
            let (seq, want) = (job.seq, job.batch_len);
            let batch = gathering.entry(seq).or_default();
            batch.push(job);
            if batch.len() < want {
                continue;
            }
            let batch = gathering.remove(&seq).expect("present");
            let t0 = Instant::now();
            let (mut done, failed) = self.decode_batch(batch);
            match failed {
                None => {}
                Some((failure, jobs)) if self.fallback => {
                    Counters::add(&self.ctx.counters.gpu_fallback_batches, 1);
                    if !warned {
                        warned = true;
                        eprintln!(
                            "l3 loader: warning: {failure}; decoding such batches on the CPU (gpu_fallback is on)"
                        );
                    }
                    done.extend(
                        jobs.into_iter()
                            .map(|j| super::decode::decode(&self.ctx, &mut scratch, j)),
                    );
                }
                Some((failure, jobs)) => {
                    let reason = failure.to_string();
                    done.extend(jobs.iter().map(|j| ItemDone {
                        fatal: true,
                        ..ItemDone::of(j, None, Err(Error::gpu(None, reason.clone())))
                    }));
                }
            }
            Counters::add_time(&self.ctx.counters.decode_ns, t0);
            for d in done {
                if out.send(ToAssembler::Item(d)).is_err() {
                    return;
                }
            }
        }
    }

    /// Decodes one batch. Returns what is done and, if the device failed, the failure and the jobs it did
    /// not decode (their bytes intact, for a CPU fallback).
    fn decode_batch(&mut self, mut batch: Vec<Job>) -> (Vec<ItemDone>, Option<(Error, Vec<Job>)>) {
        batch.sort_by_key(|j| j.slot_index);
        let mut done = Vec::with_capacity(batch.len());
        // Items whose read failed, or which the host plan rejects, are reported alone; the rest decode.
        let mut ok: Vec<(Job, Vec<u8>, u64)> = Vec::new();
        for mut job in batch {
            match job.stored.take() {
                Some(Ok((Stored::Whole(bytes), n))) => ok.push((job, bytes, n)),
                Some(Ok((Stored::L3Region { .. }, _))) => done.push(ItemDone::of(
                    &job,
                    None,
                    Err(Error::Pipeline("the GPU stage needs whole files".into())),
                )),
                Some(Err(e)) => done.push(ItemDone::of(&job, None, Err(e))),
                None => done.push(ItemDone::of(
                    &job,
                    None,
                    Err(Error::Pipeline("an item reached decoding unread".into())),
                )),
            }
        }
        let opts = l3_cuda::DecodeOptions {
            layout: l3_cuda::Layout::Nhwc,
            ..Default::default()
        };
        while !ok.is_empty() {
            let files: Vec<&[u8]> = ok.iter().map(|(_, b, _)| b.as_slice()).collect();
            let decoded = self
                .decoder
                .submit(&files, &opts)
                .and_then(|b| Ok((b.to_host_bytes()?, b.images().to_vec())));
            let (host, images) = match decoded {
                Ok(d) => d,
                Err(l3_cuda::Error::Image { index, source }) => {
                    let (job, _, _) = ok.remove(index);
                    let path = self.ctx.ds.source(job.index);
                    done.push(ItemDone::of(
                        &job,
                        None,
                        Err(Error::decode(path, "l3", source)),
                    ));
                    continue;
                }
                Err(e) => {
                    let at = ok.first().map(|(j, _, _)| {
                        format!(
                            "a batch of epoch {} with item {}, {}",
                            j.key.epoch,
                            j.index,
                            self.ctx.ds.source(j.index).display()
                        )
                    });
                    return (done, Some((Error::gpu(at, e), unread(ok))));
                }
            };
            Counters::add(&self.ctx.counters.gpu_batches, 1);
            for ((mut job, _, n), slot) in ok.drain(..).zip(images) {
                let px = &host[slot.offset..slot.offset + slot.len()];
                let req = self.ctx.request(job.key);
                let path = self.ctx.ds.source(job.index);
                let dims = (slot.width, slot.height, slot.channels);
                let r = write_pixels(px, dims, &path, Format::L3, &req, job.slot.bytes());
                if let Ok(d) = &r {
                    Counters::add(&self.ctx.counters.items_decoded, 1);
                    Counters::add(&self.ctx.counters.pixels_decoded, d.pixels);
                }
                done.push(ItemDone::of(&job, Some(n), r));
            }
        }
        (done, None)
    }
}

/// The jobs of a batch the device failed on, their bytes put back so a CPU decode can use them.
fn unread(ok: Vec<(Job, Vec<u8>, u64)>) -> Vec<Job> {
    ok.into_iter()
        .map(|(mut j, bytes, n)| {
            j.stored = Some(Ok((Stored::Whole(bytes), n)));
            j
        })
        .collect()
}
