//! The assemble stage: collects each batch's items as they finish (in any order), and delivers batches
//! strictly in sequence — a batch is a pure function of the options and the dataset, however the threads
//! interleave. Items that failed are left out when skipping is on (the batch is compacted), otherwise the
//! batch's first failure is delivered in its turn and ends the run.

use super::{BatchStart, DeviceBatch, ItemDone, ToAssembler, device_tensor};
use crate::batch::{Batch, Masks, Tensor};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::memory::Filling;
use crate::sample::{Layout, SampleSpec};
use crate::stats::Counters;
use crate::targets::Targets;
use crate::targets::boxes::SampleBoxes;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use vocab::Geometry;

/// A batch whose items are still arriving.
struct Partial {
    start: BatchStart,
    filled: Vec<bool>,
    geometry: Vec<Option<Geometry>>,
    remaining: usize,
    disk_items: usize,
    disk_bytes: u64,
    skipped: Vec<(usize, String)>,
    /// The batch's first failure, reported in its turn (never before earlier batches).
    error: Option<Error>,
    /// The samples the GPU decoded into device memory, one per filled slot.
    device: Option<DeviceBatch>,
    /// Each slot's boxes, when the batch has boxes.
    boxes: Vec<Option<SampleBoxes>>,
}

/// The assembler's state: testable without threads (feed it starts and items, take batches).
pub(crate) struct Assembler {
    pending: BTreeMap<u64, Partial>,
    next_seq: u64,
    spec: SampleSpec,
    skip: bool,
    ds: Arc<dyn Dataset>,
    counters: Arc<Counters>,
    targets: Option<Arc<Targets>>,
}

impl Assembler {
    pub fn new(
        spec: SampleSpec,
        skip: bool,
        ds: Arc<dyn Dataset>,
        counters: Arc<Counters>,
        targets: Option<Arc<Targets>>,
    ) -> Self {
        Assembler {
            pending: BTreeMap::new(),
            next_seq: 0,
            spec,
            skip,
            ds,
            counters,
            targets,
        }
    }

    pub fn accept(&mut self, msg: ToAssembler) {
        match msg {
            ToAssembler::Start(mut s) => {
                let n = s.ids.len();
                let (disk_items, disk_bytes) = s.liquid.as_ref().map_or((0, 0), |l| (l.1, l.2));
                let error = s.failure.take();
                let seq = s.seq;
                let p = Partial {
                    filled: vec![false; n],
                    geometry: vec![None; n],
                    remaining: n,
                    disk_items,
                    disk_bytes,
                    skipped: Vec::new(),
                    error,
                    device: None,
                    boxes: (0..n).map(|_| None).collect(),
                    start: s,
                };
                self.pending.insert(seq, p);
            }
            ToAssembler::Item(d) => self.item(d),
            ToAssembler::Device { seq, batch } => {
                if let Some(p) = self.pending.get_mut(&seq) {
                    p.device = Some(batch);
                }
            }
        }
    }

    fn item(&mut self, d: ItemDone) {
        let t0 = Instant::now();
        let Some(p) = self.pending.get_mut(&d.seq) else {
            return;
        };
        if p.start.liquid.is_none()
            && let Some(n) = d.read
        {
            p.disk_items += 1;
            p.disk_bytes += n;
        }
        p.remaining -= 1;
        match d.result {
            Ok(done) => {
                p.filled[d.slot_index] = true;
                p.geometry[d.slot_index] = done.geometry;
                p.boxes[d.slot_index] = d.boxes;
            }
            Err(e) if self.skip && !d.fatal => {
                Counters::add(&self.counters.items_skipped, 1);
                p.skipped.push((p.start.ids[d.slot_index], e.to_string()));
            }
            Err(e) => {
                p.error.get_or_insert(e);
            }
        }
        Counters::add_time(&self.counters.assemble_ns, t0);
    }

    /// The next batch in sequence, if all its items are in.
    pub fn pop_ready(&mut self) -> Option<Result<Batch>> {
        let ready = self
            .pending
            .get(&self.next_seq)
            .is_some_and(|p| p.remaining == 0);
        if !ready {
            return None;
        }
        let p = self.pending.remove(&self.next_seq).expect("checked above");
        self.next_seq += 1;
        Some(self.finish(p))
    }

    fn finish(&self, mut p: Partial) -> Result<Batch> {
        if let Some(e) = p.error.take() {
            return Err(e);
        }
        let t0 = Instant::now();
        let filling = p
            .start
            .filling
            .take()
            .ok_or_else(|| Error::Pipeline("a batch without a buffer".into()))?;
        let mut buf = Filling::finish(filling)
            .map_err(|_| Error::Pipeline("a batch slot outlived its item".into()))?;
        let n = p.start.ids.len();
        let sample = self.spec.sample_bytes();
        let (h, w) = (self.spec.height as usize, self.spec.width as usize);
        let mut masks = match p.start.mask_filling.take() {
            Some(f) => Some(
                Filling::finish(f)
                    .map_err(|_| Error::Pipeline("a mask slot outlived its item".into()))?,
            ),
            None => None,
        };
        let wide = self.targets.as_ref().is_some_and(|t| t.wide());
        let mask_bytes = h * w * if wide { 2 } else { 1 };
        let mut ids = std::mem::take(&mut p.start.ids);
        let mut cached = p
            .start
            .liquid
            .take()
            .map_or_else(|| vec![false; n], |l| l.0);
        if p.filled.iter().any(|f| !f) {
            // Compact: keep the samples that decoded, in order (a device batch holds only those).
            let keep: Vec<usize> = (0..n).filter(|&i| p.filled[i]).collect();
            if p.device.is_none() && buf.len() >= n * sample {
                let bytes = buf.as_mut_slice();
                for (to, &from) in keep.iter().enumerate() {
                    bytes.copy_within(from * sample..(from + 1) * sample, to * sample);
                }
            }
            if let Some(m) = &mut masks {
                let bytes = m.as_mut_slice();
                for (to, &from) in keep.iter().enumerate() {
                    bytes.copy_within(from * mask_bytes..(from + 1) * mask_bytes, to * mask_bytes);
                }
            }
            p.boxes = keep.iter().map(|&i| p.boxes[i].take()).collect();
            ids = keep.iter().map(|&i| ids[i]).collect();
            cached = keep.iter().map(|&i| cached[i]).collect();
            p.geometry = keep.iter().map(|&i| p.geometry[i]).collect();
        }
        let geometry: Vec<Geometry> = p.geometry.iter().flatten().copied().collect();
        if geometry.len() != ids.len() {
            return Err(Error::Pipeline("a sample without its geometry".into()));
        }
        let k = ids.len();
        let pixels = match p.device.take() {
            Some(dev) => {
                drop(buf);
                device_tensor(dev, self.spec.layout, self.spec.dtype)
                    .filter(|t| t.shape()[0] == k)
                    .ok_or_else(|| {
                        Error::Pipeline("the GPU's batch does not match its items".into())
                    })?
            }
            None if buf.len() < k * sample => {
                return Err(Error::Pipeline(
                    "a batch of the GPU without its device tensor".into(),
                ));
            }
            None => {
                buf.truncate(k * sample);
                let c = usize::from(self.spec.channels);
                let shape = match self.spec.layout {
                    Layout::Nhwc => [k, h, w, c],
                    Layout::Nchw => [k, c, h, w],
                };
                Tensor::new(buf, shape, self.spec.layout, self.spec.dtype)
            }
        };
        let masks = masks.map(|mut m| {
            m.truncate(k * mask_bytes);
            Masks::new(m, [k, h, w], wide)
        });
        let (boxes, box_labels) = if self.targets.as_ref().is_some_and(|t| t.has_boxes()) {
            let (b, l) = p
                .boxes
                .into_iter()
                .map(|b| {
                    let b = b.unwrap_or_default();
                    (b.boxes, b.labels)
                })
                .unzip();
            (Some(b), Some(l))
        } else {
            (None, None)
        };
        let batch = Batch {
            epoch: p.start.epoch,
            index: p.start.batch,
            pixels,
            labels: ids.iter().map(|&i| self.ds.label(i)).collect(),
            formats: ids.iter().map(|&i| self.ds.format(i)).collect(),
            ids,
            cached,
            geometry,
            disk_items: p.disk_items,
            disk_bytes: p.disk_bytes,
            skipped: p.skipped,
            wait: Duration::ZERO,
            masks,
            boxes,
            box_labels,
        };
        Counters::add_time(&self.counters.assemble_ns, t0);
        Ok(batch)
    }
}

/// The assembler thread: delivers batches in sequence into the prefetch queue, and returns one credit
/// per delivered batch so the order stage may start another.
pub(crate) fn run(
    mut asm: Assembler,
    inbox: Receiver<ToAssembler>,
    out: Sender<Result<Batch>>,
    credits: Receiver<()>,
    stop: Arc<AtomicBool>,
) {
    loop {
        let msg = match inbox.recv_timeout(Duration::from_millis(50)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        asm.accept(msg);
        while let Some(batch) = asm.pop_ready() {
            let failed = batch.is_err();
            if failed {
                stop.store(true, Ordering::SeqCst);
            }
            if out.send(batch).is_err() || failed {
                return;
            }
            if credits.recv().is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Format;
    use crate::item::{Decoded, SampleRequest, Stored};
    use crate::memory::Pool;
    use crate::sample::DType;
    use std::path::PathBuf;
    use vocab::Crop;

    struct Labels;
    impl Dataset for Labels {
        fn len(&self) -> usize {
            10
        }
        fn label(&self, index: usize) -> u32 {
            100 + index as u32
        }
        fn format(&self, _: usize) -> Format {
            Format::Raw
        }
        fn source(&self, index: usize) -> PathBuf {
            PathBuf::from(format!("item{index}"))
        }
        fn stored_bytes(&self) -> u64 {
            0
        }
        fn read(&self, _: usize, _: &SampleRequest) -> Result<(Stored, u64)> {
            unreachable!("the assembler reads nothing")
        }
        fn describe(&self) -> String {
            "labels".into()
        }
    }

    const SPEC: SampleSpec = SampleSpec {
        height: 1,
        width: 2,
        crop: Crop::Center,
        hflip: false,
        layout: Layout::Nhwc,
        dtype: DType::U8,
        normalize: None,
        recipe: vocab::Recipe::Crop,
        interpolation: vocab::Interpolation::Bilinear,
        fill: 0,
        channels: 3,
    };

    /// A batch announcement whose slots are filled with each item's index, as decode threads would.
    fn start(pool: &Arc<Pool>, seq: u64, ids: &[usize]) -> ToAssembler {
        let n = ids.len();
        let (filling, slots) = Filling::split(pool.take(n * 6).unwrap(), n, 6);
        for (mut s, &id) in slots.into_iter().zip(ids) {
            s.bytes().fill(id as u8);
        }
        ToAssembler::Start(BatchStart {
            seq,
            epoch: 0,
            batch: seq as usize,
            ids: ids.to_vec(),
            filling: Some(filling),
            mask_filling: None,
            liquid: None,
            failure: None,
        })
    }

    /// Item `slot` of batch `seq` done; a decoded one carries a geometry that names its slot.
    fn item(seq: u64, slot: usize, result: Result<Decoded>) -> ToAssembler {
        let whole = vocab::Window::whole(slot as u32 + 1, 1);
        let result = result.map(|d| Decoded {
            geometry: Some(Geometry::from_window(&whole)),
            ..d
        });
        ToAssembler::Item(ItemDone {
            seq,
            slot_index: slot,
            read: Some(10),
            result,
            fatal: false,
            boxes: None,
        })
    }

    #[test]
    fn batches_leave_in_sequence_whatever_order_items_finish() {
        let pool = Pool::new(18, 4, crate::memory::HostMemory::Pageable);
        let mut asm = Assembler::new(SPEC, false, Arc::new(Labels), Arc::default(), None);
        asm.accept(start(&pool, 0, &[3, 4, 5]));
        asm.accept(start(&pool, 1, &[6, 7]));
        asm.accept(item(1, 1, Ok(Decoded::default())));
        asm.accept(item(1, 0, Ok(Decoded::default())));
        assert!(
            asm.pop_ready().is_none(),
            "batch 1 is done but batch 0 is not"
        );
        for k in [2, 0, 1] {
            asm.accept(item(0, k, Ok(Decoded::default())));
        }
        let b0 = asm.pop_ready().unwrap().unwrap();
        let b1 = asm.pop_ready().unwrap().unwrap();
        assert!(asm.pop_ready().is_none());
        assert_eq!(
            (b0.index, b0.ids.clone(), b0.labels.clone()),
            (0, vec![3, 4, 5], vec![103, 104, 105])
        );
        assert_eq!(b0.shape(), [3, 1, 2, 3]);
        assert_eq!(b0.sample_bytes(2), Some(&[5; 6][..]));
        assert_eq!((b1.index, b1.disk_items, b1.disk_bytes), (1, 2, 20));
    }

    #[test]
    fn failed_items_are_compacted_away_when_skipping_else_fail_in_turn() {
        let pool = Pool::new(18, 4, crate::memory::HostMemory::Pageable);
        let counters = Arc::new(Counters::default());
        let mut asm = Assembler::new(SPEC, true, Arc::new(Labels), counters.clone(), None);
        asm.accept(start(&pool, 0, &[1, 2, 3]));
        asm.accept(item(0, 1, Err(Error::decode("item2", "png", "bad"))));
        asm.accept(item(0, 0, Ok(Decoded::default())));
        asm.accept(item(0, 2, Ok(Decoded::default())));
        let b = asm.pop_ready().unwrap().unwrap();
        assert_eq!(b.ids, vec![1, 3]);
        let widths: Vec<u32> = b.geometry.iter().map(|g| g.x.len).collect();
        assert_eq!(widths, [1, 3], "each geometry stays with its sample");
        assert_eq!(
            b.pixels.bytes(),
            Some(&[1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3][..])
        );
        assert_eq!(b.skipped.len(), 1);
        assert!(b.skipped[0].1.contains("item2"));
        assert_eq!(counters.items_skipped.load(Ordering::Relaxed), 1);

        // Without skipping, batch 1's failure waits for batch 0 to leave first.
        let mut asm = Assembler::new(SPEC, false, Arc::new(Labels), Arc::default(), None);
        asm.accept(start(&pool, 0, &[1]));
        asm.accept(start(&pool, 1, &[2]));
        asm.accept(item(1, 0, Err(Error::decode("item2", "png", "bad"))));
        assert!(asm.pop_ready().is_none());
        asm.accept(item(0, 0, Ok(Decoded::default())));
        assert!(asm.pop_ready().unwrap().is_ok());
        let e = asm.pop_ready().unwrap().unwrap_err();
        assert!(e.to_string().contains("item2"), "{e}");
    }
}
