//! The order stage's thread: plans each batch (after taking a credit) from the [`Schedule`], takes its
//! buffer from the pool, announces it to the assembler with one slot per item, and sends the items to
//! the read stage — or straight to decoding when the Liquid sampler already holds their bytes.

use super::schedule::{Planned, Schedule};
use super::{BatchStart, Ctx, Job, ToAssembler};
use crate::error::Error;
use crate::item::Stored;
use crate::memory::{Filling, Pool};
use crate::sample::ItemKey;
use crate::stats::Counters;
use crossbeam_channel::Sender;
use std::sync::Arc;
use std::time::Instant;

/// The order stage: its schedule, the buffer pool, and the channels it feeds.
pub(crate) struct Dispatch {
    pub schedule: Schedule,
    pub pool: Arc<Pool>,
    /// Buffers of the batches' masks, when the batches have masks.
    pub mask_pool: Option<Arc<Pool>>,
    pub ctx: Ctx,
    pub credits: Sender<()>,
    pub to_asm: Sender<ToAssembler>,
    pub to_read: Sender<Job>,
    pub to_decode: Sender<Job>,
}

impl Dispatch {
    pub fn run(mut self) {
        // Whole images are written outside the batch (their size is not known yet): empty slots.
        let sample_bytes = if self.ctx.host_slots && !self.ctx.spec.recipe.is_whole() {
            self.ctx.spec.sample_bytes()
        } else {
            0
        };
        let mask_bytes = self.ctx.targets.as_ref().map_or(0, |t| {
            t.mask_bytes((self.ctx.spec.width, self.ctx.spec.height))
        });
        let mut seq = 0u64;
        loop {
            if self.credits.send(()).is_err() || self.ctx.stopped() {
                return;
            }
            let t0 = Instant::now();
            let planned = self.schedule.next_batch();
            let planned = match planned {
                None => return,
                Some(Ok(p)) => p,
                Some(Err(e)) => return self.fail(seq, e),
            };
            let Planned {
                epoch,
                batch,
                items,
                liquid,
            } = planned;
            let n = items.len();
            let buf = match self.pool.take(n * sample_bytes) {
                Ok(buf) => buf,
                Err(why) => {
                    let e = Error::Pipeline(format!(
                        "cannot allocate a batch buffer of {} bytes: {why}",
                        n * sample_bytes
                    ));
                    return self.fail(seq, e);
                }
            };
            let (filling, slots) = Filling::split(buf, n, sample_bytes);
            let (mask_filling, mask_slots) = match &self.mask_pool {
                Some(pool) => match pool.take(n * mask_bytes) {
                    Ok(buf) => {
                        let (f, s) = Filling::split(buf, n, mask_bytes);
                        (Some(f), s.into_iter().map(Some).collect())
                    }
                    Err(why) => {
                        let e = Error::Pipeline(format!(
                            "cannot allocate a mask buffer of {} bytes: {why}",
                            n * mask_bytes
                        ));
                        return self.fail(seq, e);
                    }
                },
                None => (None, Vec::new()),
            };
            let mut mask_slots = mask_slots.into_iter();
            let (info, mut bytes) = match liquid {
                Some(l) => {
                    Counters::add_time(&self.ctx.counters.read_ns, t0);
                    Counters::add(&self.ctx.counters.items_read, l.disk_items as u64);
                    Counters::add(&self.ctx.counters.bytes_read, l.disk_bytes);
                    (
                        Some((l.cached, l.disk_items, l.disk_bytes)),
                        Some(l.bytes.into_iter()),
                    )
                }
                None => (None, None),
            };
            let start = BatchStart {
                seq,
                epoch,
                batch,
                ids: items.clone(),
                filling: Some(filling),
                mask_filling,
                liquid: info,
                failure: None,
            };
            if self.to_asm.send(ToAssembler::Start(start)).is_err() {
                return;
            }
            for (slot_index, (index, slot)) in items.into_iter().zip(slots).enumerate() {
                let stored = bytes
                    .as_mut()
                    .and_then(Iterator::next)
                    .map(|b| Ok((Stored::Whole(b), 0)));
                let job = Job {
                    seq,
                    slot_index,
                    batch_len: n,
                    index,
                    key: ItemKey {
                        seed: self.ctx.seed,
                        epoch,
                        index,
                    },
                    slot,
                    stored,
                    mask_slot: mask_slots.next().flatten(),
                    mask: None,
                    boxes: None,
                };
                let to = if job.stored.is_some() {
                    &self.to_decode
                } else {
                    &self.to_read
                };
                if to.send(job).is_err() {
                    return;
                }
            }
            seq += 1;
        }
    }

    /// Reports a failure to produce batch `seq`, delivered in its turn.
    fn fail(&self, seq: u64, e: Error) {
        let _ = self.to_asm.send(ToAssembler::Start(BatchStart {
            seq,
            epoch: 0,
            batch: 0,
            ids: Vec::new(),
            filling: None,
            mask_filling: None,
            liquid: None,
            failure: Some(e),
        }));
    }
}
