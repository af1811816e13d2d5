//! The read stage: I/O threads that fetch what each item's decode needs ([`Dataset::read`]).

use super::{Ctx, Job};
use crate::stats::Counters;
use crossbeam_channel::{Receiver, Sender};
use std::time::Instant;

/// Reads one item into its job.
pub(crate) fn read(ctx: &Ctx, job: &mut Job) {
    let t0 = Instant::now();
    let req = ctx.request(job.key);
    let mut r = super::guarded("reading", || ctx.ds.read(job.index, &req));
    if let (Ok((_, n)), Some(t)) = (&mut r, &ctx.targets) {
        if let Some(mask) = t.read_mask(job.index, &req) {
            *n += mask.as_ref().map_or(0, |m| m.1);
            job.mask = Some(mask);
        }
        if let Some(boxes) = t.read_boxes(job.index) {
            *n += boxes.as_ref().map_or(0, |b| b.1);
            job.boxes = Some(boxes);
        }
    }
    Counters::add_time(&ctx.counters.read_ns, t0);
    if let Ok((_, n)) = &r {
        Counters::add(&ctx.counters.items_read, 1);
        Counters::add(&ctx.counters.bytes_read, *n);
    }
    job.stored = Some(r);
}

/// An I/O thread: jobs in, jobs with their bytes out, until either side closes or the loader stops.
pub(crate) fn run(ctx: Ctx, jobs: Receiver<Job>, out: Sender<Job>) {
    while let Ok(mut job) = jobs.recv() {
        if ctx.stopped() {
            return;
        }
        read(&ctx, &mut job);
        if out.send(job).is_err() {
            return;
        }
    }
}
