//! The decode stage: CPU threads that turn each item's stored bytes into its sample, written straight
//! into the item's slot of the batch buffer ([`Dataset::decode`]).

use super::{Ctx, ItemDone, Job, ToAssembler};
use crate::error::Error;
use crate::item::Scratch;
use crate::stats::Counters;
use crossbeam_channel::{Receiver, Sender};
use std::time::Instant;

/// Decodes one job (already read) into its slot.
pub(crate) fn decode(ctx: &Ctx, scratch: &mut Scratch, mut job: Job) -> ItemDone {
    let t0 = Instant::now();
    let (read, result) = match job.stored.take() {
        Some(Ok((stored, n))) => {
            let req = ctx.request(job.key);
            let slot = job.slot.bytes();
            let r = super::guarded("decoding", || {
                ctx.ds.decode(job.index, &stored, &req, scratch, slot)
            });
            if r.is_err() {
                // A panic may have left the scratch buffers half-resized: start them afresh.
                *scratch = Scratch::default();
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
    ItemDone::of(&job, read, result)
}

/// A decode thread. The job (and its slot) is dropped before the assembler hears of it, so the batch
/// buffer is free to deliver once its last item is reported.
pub(crate) fn run(ctx: Ctx, jobs: Receiver<Job>, out: Sender<ToAssembler>) {
    let mut scratch = Scratch::default();
    while let Ok(job) = jobs.recv() {
        if ctx.stopped() {
            return;
        }
        let done = decode(&ctx, &mut scratch, job);
        if out.send(ToAssembler::Item(done)).is_err() {
            return;
        }
    }
}
