//! The decode stage: CPU threads that turn each item's stored bytes into its sample, written straight
//! into the item's slot of the batch buffer ([`Dataset::decode`]).

use super::{Ctx, ItemDone, Job, OwnSample, ToAssembler};
use crate::error::{Error, Result};
use crate::item::{Decoded, Scratch};
use crate::stats::Counters;
use crate::targets::Targets;
use crate::targets::boxes::SampleBoxes;
use crate::targets::masks::MaskImage;
use crossbeam_channel::{Receiver, Sender};
use std::time::Instant;

/// A decode thread's reusable memory: its samples' and their masks'.
#[derive(Default)]
pub(crate) struct Buffers {
    sample: Scratch,
    mask: MaskImage,
}

/// Decodes one job (already read) into its slot.
pub(crate) fn decode(ctx: &Ctx, buffers: &mut Buffers, mut job: Job) -> ItemDone {
    let t0 = Instant::now();
    let mut boxes = None;
    let whole = ctx.spec.recipe.is_whole();
    let mut own = None;
    let (read, result) = match job.stored.take() {
        Some(Ok((stored, n))) => {
            let req = ctx.request(job.key);
            let r = super::guarded("decoding", || {
                let slot = job.slot.bytes();
                let Buffers {
                    sample: scratch,
                    mask: mask_scratch,
                } = &mut *buffers;
                let d = ctx.ds.decode(job.index, &stored, &req, scratch, slot)?;
                let mut mask = None;
                if let Some(t) = &ctx.targets {
                    boxes = targets(
                        ctx,
                        t,
                        &mut job,
                        (&d, mask_scratch),
                        whole.then_some(&mut mask),
                    )?;
                }
                if whole {
                    own = Some(OwnSample {
                        pixels: std::mem::take(&mut scratch.sample),
                        mask,
                    });
                }
                Ok(d)
            });
            if r.is_err() {
                // A panic may have left the scratch buffers half-resized: start them afresh.
                *buffers = Buffers::default();
            }
            (Some(n), r)
        }
        Some(Err(e)) => (None, Err(e)),
        None => (
            None,
            Err(Error::Pipeline("an item reached decoding unread".into())),
        ),
    };
    if let Ok(d) = &result {
        Counters::add(&ctx.counters.items_decoded, 1);
        Counters::add(&ctx.counters.pixels_decoded, d.pixels);
        Counters::add(&ctx.counters.items_partial, u64::from(d.partial));
    }
    Counters::add_time(&ctx.counters.decode_ns, t0);
    ItemDone {
        boxes,
        own,
        ..ItemDone::of(&job, read, result)
    }
}

/// An item's targets, after its image: its mask (read now when the read stage did not, as under the
/// Liquid order) written into its mask slot with the image's geometry — or, for a whole image, into
/// `own` at the sample's own size —, and its boxes.
fn targets(
    ctx: &Ctx,
    t: &Targets,
    job: &mut Job,
    (d, scratch): (&Decoded, &mut MaskImage),
    own: Option<&mut Option<Vec<u8>>>,
) -> Result<Option<SampleBoxes>> {
    let g = d
        .geometry
        .ok_or_else(|| Error::Pipeline("a decoded item without its geometry".into()))?;
    let out = match own {
        Some(_) => g.size(),
        None => (ctx.spec.width, ctx.spec.height),
    };
    if t.has_masks() && job.mask.is_none() {
        let read = t.read_mask(job.index, &ctx.request(job.key));
        if let Some(Ok((_, n))) = &read {
            Counters::add(&ctx.counters.bytes_read, *n);
        }
        job.mask = read;
    }
    let mask = job.mask.take().transpose()?.map(|(stored, _)| stored);
    let empty: &mut [u8] = &mut [];
    let slot = match (own, &mut job.mask_slot) {
        (Some(own), _) if t.has_masks() => own.insert(vec![0; t.mask_bytes(out)]).as_mut_slice(),
        (_, Some(s)) => s.bytes(),
        _ => empty,
    };
    let path = ctx.ds.source(job.index);
    t.make(
        job.index,
        (mask.as_ref(), job.boxes.take()),
        (&path, d.image),
        (&g, out),
        scratch,
        slot,
    )
}

/// A decode thread. The job (and its slot) is dropped before the assembler hears of it, so the batch
/// buffer is free to deliver once its last item is reported.
pub(crate) fn run(ctx: Ctx, jobs: Receiver<Job>, out: Sender<ToAssembler>) {
    let mut buffers = Buffers::default();
    while let Ok(job) = jobs.recv() {
        if ctx.stopped() {
            return;
        }
        let done = decode(&ctx, &mut buffers, job);
        if out.send(ToAssembler::Item(done)).is_err() {
            return;
        }
    }
}
