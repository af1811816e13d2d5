//! The assemble stage: collects each batch's items as they finish (in any order), and delivers batches
//! strictly in sequence — a batch is a pure function of the options and the dataset, however the threads
//! interleave. Items that failed are left out when skipping is on (the batch is compacted), otherwise the
//! batch's first failure is delivered in its turn and ends the run.

use super::{
    BatchStart, DeviceBatch, ItemDone, OwnSample, ToAssembler, device_masks, device_tensor,
};
use crate::batch::{Batch, Masks, Tensor};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::memory::{Filling, Pool};
use crate::sample::{Layout, SampleSpec, SampleWrite};
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
    /// Their label maps, decoded beside them, when the batch has masks.
    device_masks: Option<DeviceBatch>,
    /// Each slot's boxes, when the batch has boxes.
    boxes: Vec<Option<SampleBoxes>>,
    /// Each slot's whole-image sample, for batches without a crop.
    own: Vec<Option<OwnSample>>,
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
    /// For whole images: where each batch's padded tensors are allocated.
    whole: Option<WholePools>,
}

impl Assembler {
    pub fn new(
        spec: SampleSpec,
        skip: bool,
        ds: Arc<dyn Dataset>,
        counters: Arc<Counters>,
        targets: Option<Arc<Targets>>,
        whole: Option<WholePools>,
    ) -> Self {
        Assembler {
            pending: BTreeMap::new(),
            next_seq: 0,
            spec,
            skip,
            ds,
            counters,
            targets,
            whole,
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
                    device_masks: None,
                    boxes: (0..n).map(|_| None).collect(),
                    own: (0..n).map(|_| None).collect(),
                    start: s,
                };
                self.pending.insert(seq, p);
            }
            ToAssembler::Item(d) => self.item(d),
            ToAssembler::Device { seq, batch, masks } => {
                if let Some(p) = self.pending.get_mut(&seq) {
                    p.device = Some(batch);
                    p.device_masks = masks;
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
                p.own[d.slot_index] = d.own;
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
        let n = p.start.ids.len();
        // The samples that decoded, in order (a device batch holds only those).
        let keep: Vec<usize> = (0..n).filter(|&i| p.filled[i]).collect();
        let (pixels, masks) = match &self.whole {
            Some(pools) if p.device.is_none() => self.padded(&mut p, &keep, pools)?,
            _ => self.in_slots(&mut p, &keep)?,
        };
        let ids: Vec<usize> = keep.iter().map(|&i| p.start.ids[i]).collect();
        let cached = p
            .start
            .liquid
            .take()
            .map_or_else(|| vec![false; n], |l| l.0);
        let cached = keep.iter().map(|&i| cached[i]).collect();
        let geometry: Vec<Geometry> = keep.iter().filter_map(|&i| p.geometry[i]).collect();
        if geometry.len() != ids.len() {
            return Err(Error::Pipeline("a sample without its geometry".into()));
        }
        let (boxes, box_labels) = if self.targets.as_ref().is_some_and(|t| t.has_boxes()) {
            let (b, l) = keep
                .iter()
                .map(|&i| {
                    let b = p.boxes[i].take().unwrap_or_default();
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

    /// The tensors of a batch whose samples were written into the slots of its buffer (or by the GPU
    /// into device memory): compacted to the `keep` slots.
    fn in_slots(&self, p: &mut Partial, keep: &[usize]) -> Result<(Tensor, Option<Masks>)> {
        let filling = p
            .start
            .filling
            .take()
            .ok_or_else(|| Error::Pipeline("a batch without a buffer".into()))?;
        let mut buf = Filling::finish(filling)
            .map_err(|_| Error::Pipeline("a batch slot outlived its item".into()))?;
        let n = p.start.ids.len();
        let sample = self.spec.sample_bytes();
        let (mut h, mut w) = (self.spec.height as usize, self.spec.width as usize);
        if self.spec.recipe.is_whole() && p.device.is_some() {
            // The GPU padded these whole images to the largest of the batch, as `padded` does.
            let size = |i: &usize| p.geometry[*i].map_or((0, 0), |g| g.size());
            w = keep.iter().map(|i| size(i).0 as usize).max().unwrap_or(0);
            h = keep.iter().map(|i| size(i).1 as usize).max().unwrap_or(0);
        }
        let mut masks = match p.start.mask_filling.take() {
            Some(f) => Some(
                Filling::finish(f)
                    .map_err(|_| Error::Pipeline("a mask slot outlived its item".into()))?,
            ),
            None => None,
        };
        let wide = self.targets.as_ref().is_some_and(|t| t.wide());
        let mask_bytes = h * w * if wide { 2 } else { 1 };
        if keep.len() < n {
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
        }
        let k = keep.len();
        let pixels = match p.device.take() {
            Some(dev) => {
                drop(buf);
                device_tensor(dev, self.spec.layout, self.spec.dtype)
                    .filter(|t| t.shape() == self.shape(k, h, w))
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
                Tensor::new(buf, self.shape(k, h, w), self.spec.layout, self.spec.dtype)
            }
        };
        let masks = match (pixels.device(), p.device_masks.take()) {
            (_, Some(dev)) => {
                drop(masks);
                let m = device_masks(dev)
                    .filter(|m| m.shape() == [k, h, w])
                    .ok_or_else(|| {
                        Error::Pipeline("the GPU's masks do not match their items".into())
                    })?;
                Some(m)
            }
            (vocab::Device::Cuda(_), None) if masks.is_some() => {
                return Err(Error::Pipeline(
                    "a batch of the GPU without its masks".into(),
                ));
            }
            _ => masks.map(|mut m| {
                m.truncate(k * mask_bytes);
                Masks::new(m, [k, h, w], wide)
            }),
        };
        Ok((pixels, masks))
    }

    /// The tensors of a batch of whole images, each decoded at its own size: the `keep` samples padded
    /// (bottom and right) to the largest height and width among them — images with `fill`, masks with
    /// `ignore_index` — in a buffer of `pools`.
    fn padded(
        &self,
        p: &mut Partial,
        keep: &[usize],
        pools: &WholePools,
    ) -> Result<(Tensor, Option<Masks>)> {
        drop(p.start.filling.take());
        let lost = || Error::Pipeline("a whole-image sample without its pixels or size".into());
        let mut sizes = Vec::with_capacity(keep.len());
        for &i in keep {
            sizes.push(p.geometry[i].ok_or_else(lost)?.size());
        }
        let w = sizes.iter().map(|s| s.0).max().unwrap_or(0);
        let h = sizes.iter().map(|s| s.1).max().unwrap_or(0);
        let batch = SampleSpec {
            width: w,
            height: h,
            ..self.spec
        };
        let k = keep.len();
        let what = |kind: &str| format!("a batch of {k} whole {kind} padded to {h}x{w}");
        let sample = batch.sample_bytes();
        stdx::mem::check((k * sample) as u64, what("images"))?;
        let mut buf = pools
            .pixels
            .take(k * sample)
            .map_err(|why| Error::Pipeline(format!("cannot allocate {}: {why}", what("images"))))?;
        for (j, &i) in keep.iter().enumerate() {
            let own = p.own[i].as_ref().ok_or_else(lost)?;
            let slot = &mut buf.as_mut_slice()[j * sample..(j + 1) * sample];
            batch.place_sample(&own.pixels, sizes[j], slot);
        }
        let pixels = Tensor::new(
            buf,
            self.shape(k, h as usize, w as usize),
            batch.layout,
            batch.dtype,
        );
        let masks = match (&pools.masks, &self.targets) {
            (Some(pool), Some(t)) => {
                let (wide, ignore) = (t.wide(), t.ignore_index());
                let per = t.mask_bytes((w, h));
                stdx::mem::check((k * per) as u64, what("masks"))?;
                let mut m = pool.take(k * per).map_err(|why| {
                    Error::Pipeline(format!("cannot allocate {}: {why}", what("masks")))
                })?;
                for (j, &i) in keep.iter().enumerate() {
                    let own = p.own[i].as_ref().and_then(|o| o.mask.as_deref());
                    let slot = &mut m.as_mut_slice()[j * per..(j + 1) * per];
                    place_mask(own.ok_or_else(lost)?, sizes[j], (w, h), wide, ignore, slot);
                }
                Some(Masks::new(m, [k, h as usize, w as usize], wide))
            }
            _ => None,
        };
        Ok((pixels, masks))
    }

    /// A batch tensor's shape in the spec's layout.
    fn shape(&self, k: usize, h: usize, w: usize) -> [usize; 4] {
        let c = usize::from(self.spec.channels);
        match self.spec.layout {
            Layout::Nhwc => [k, h, w, c],
            Layout::Nchw => [k, c, h, w],
        }
    }
}

/// Copies a `size` (width, height) mask into the top-left of a `batch` (width, height) mask slot, the
/// rest `ignore` (one byte per value, or two little-endian ones when `wide`).
fn place_mask(
    mask: &[u8],
    (w, h): (u32, u32),
    (bw, bh): (u32, u32),
    wide: bool,
    ignore: u16,
    slot: &mut [u8],
) {
    let v = if wide { 2 } else { 1 };
    let pad = ignore.to_le_bytes();
    for px in slot.chunks_exact_mut(v) {
        px.copy_from_slice(&pad[..v]);
    }
    let row = w as usize * v;
    for y in 0..(h.min(bh) as usize) {
        let at = y * bw as usize * v;
        slot[at..at + row].copy_from_slice(&mask[y * row..(y + 1) * row]);
    }
}

/// Where whole-image batches get their memory: their sizes are known only when their last item is.
pub(crate) struct WholePools {
    pub pixels: Arc<Pool>,
    pub masks: Option<Arc<Pool>>,
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
            own: None,
        })
    }

    #[test]
    fn batches_leave_in_sequence_whatever_order_items_finish() {
        let pool = Pool::new(18, 4, crate::memory::HostMemory::Pageable);
        let mut asm = Assembler::new(SPEC, false, Arc::new(Labels), Arc::default(), None, None);
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
    fn whole_images_are_padded_to_the_largest_of_their_batch() {
        let spec = SampleSpec {
            recipe: vocab::Recipe::Whole(vocab::Whole::default()),
            fill: 9,
            layout: Layout::Nchw,
            ..SPEC
        };
        let pools = WholePools {
            pixels: Pool::new(0, 2, crate::memory::HostMemory::Pageable),
            masks: None,
        };
        let mut asm = Assembler::new(
            spec,
            true,
            Arc::new(Labels),
            Arc::default(),
            None,
            Some(pools),
        );
        let empty = Pool::new(0, 0, crate::memory::HostMemory::Pageable);
        let (filling, _) = Filling::split(empty.take(0).unwrap(), 3, 0);
        asm.accept(ToAssembler::Start(BatchStart {
            seq: 0,
            epoch: 0,
            batch: 0,
            ids: vec![4, 5, 6],
            filling: Some(filling),
            mask_filling: None,
            liquid: None,
            failure: None,
        }));
        // Item 4 is 2 wide and 1 high, item 6 is 1 wide and 2 high (NCHW planes of value 10 + id),
        // item 5 failed: the batch is 2x2, each sample padded with 9 below and to the right.
        for (slot, (w, h)) in [(0, (2u32, 1u32)), (2, (1, 2))] {
            let g = Geometry::from_window(&vocab::Window::whole(w, h));
            let pixels = vec![10 + slot as u8; (w * h * 3) as usize];
            asm.accept(ToAssembler::Item(ItemDone {
                seq: 0,
                slot_index: slot,
                read: Some(1),
                result: Ok(Decoded {
                    geometry: Some(g),
                    ..Decoded::default()
                }),
                fatal: false,
                boxes: None,
                own: Some(OwnSample { pixels, mask: None }),
            }));
        }
        asm.accept(item(0, 1, Err(Error::decode("item5", "png", "bad"))));
        let b = asm.pop_ready().unwrap().unwrap();
        assert_eq!(b.ids, [4, 6]);
        assert_eq!(b.shape(), [2, 3, 2, 2]);
        assert_eq!(b.sizes(), [(1, 2), (2, 1)]);
        let plane = |s: usize| &b.pixels.bytes().unwrap()[s * 12..s * 12 + 4];
        assert_eq!(plane(0), [10, 10, 9, 9]);
        assert_eq!(plane(1), [12, 9, 12, 9]);
    }

    #[test]
    fn failed_items_are_compacted_away_when_skipping_else_fail_in_turn() {
        let pool = Pool::new(18, 4, crate::memory::HostMemory::Pageable);
        let counters = Arc::new(Counters::default());
        let mut asm = Assembler::new(SPEC, true, Arc::new(Labels), counters.clone(), None, None);
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
        let mut asm = Assembler::new(SPEC, false, Arc::new(Labels), Arc::default(), None, None);
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
