//! The pipeline's stages, each a module with its own thread body, and the messages between them:
//!
//! ```text
//! order ──Job──► read ──Job──► decode (CPU threads, or gpu) ──ItemDone──► assemble ──Batch──► prefetch
//!   └───────────────────────── BatchStart ──────────────────────────────────┘
//! ```
//!
//! The order stage plans each batch, takes a buffer from the pool and splits it into one slot per sample;
//! each item's job carries its slot through read and decode, so a sample is written once, in place — or,
//! on the GPU, the whole batch is written by one launch into device memory (`ToAssembler::Device`). The
//! assembler delivers batches strictly in sequence and hands back a credit per batch, which bounds the
//! batches in flight (and so the memory) however slow one item is.

pub(crate) mod assemble;
pub(crate) mod decode;
#[cfg(feature = "gpu")]
pub(crate) mod gpu;
pub(crate) mod order;
pub(crate) mod read;
pub(crate) mod schedule;

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::item::{Decoded, SampleRequest, Stored};
use crate::memory::{Filling, Slot};
use crate::sample::{DecodeScope, ItemKey, SampleSpec};
use crate::stats::Counters;
use crate::targets::Targets;
use crate::targets::boxes::SampleBoxes;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What every stage shares.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub ds: Arc<dyn Dataset>,
    pub spec: SampleSpec,
    pub scope: DecodeScope,
    /// Decode images cut short ([`LoaderOptions::partial_images`](crate::LoaderOptions::partial_images)).
    pub partial_images: bool,
    /// The run's seed: with (epoch, item) it keys each item's randomness.
    pub seed: u64,
    /// Samples are written into host slots of a batch buffer. False when the GPU stage writes every
    /// batch straight into device memory: then the order stage hands out empty slots.
    pub host_slots: bool,
    pub counters: Arc<Counters>,
    pub stop: Arc<AtomicBool>,
    /// Masks and boxes that follow each sample, when asked for.
    pub targets: Option<Arc<Targets>>,
}

impl Ctx {
    pub fn request(&self, key: ItemKey) -> SampleRequest<'_> {
        SampleRequest {
            spec: &self.spec,
            key,
            scope: self.scope,
            partial_images: self.partial_images,
        }
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Runs dataset code for one item: a panic in it becomes that item's error, named like any other, instead
/// of a dead stage that would leave the stages after it waiting for an item that never comes.
pub(crate) fn guarded<T>(stage: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::Pipeline(format!(
            "{stage} panicked: {} (a bug in the toolkit: please report it)",
            panic_text(&*p)
        )))
    })
}

/// A panic's message, when it has one.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// One item on its way through read and decode.
pub(crate) struct Job {
    pub seq: u64,
    /// Position in its batch.
    pub slot_index: usize,
    /// Items in its batch (the GPU stage gathers them all).
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub batch_len: usize,
    pub index: usize,
    pub key: ItemKey,
    /// Where its sample goes.
    pub slot: Slot,
    /// What was read and how many bytes that took: filled by the read stage, or by the order stage for
    /// Liquid batches, whose bytes the sampler already holds (those bytes count as the sampler's reads).
    pub stored: Option<Result<(Stored, u64)>>,
    /// Where its mask sample goes, when the batch has masks.
    pub mask_slot: Option<Slot>,
    /// What was read of its mask and how many bytes that took, read with the item (`None` until
    /// read, or without masks).
    pub mask: Option<Result<(Stored, u64)>>,
    /// Its boxes as its shard carries them, read with the item (`None` until read, or for boxes not
    /// carried in shards).
    pub boxes: Option<crate::targets::ReadBoxes>,
}

/// The assembler's inbox.
pub(crate) enum ToAssembler {
    Start(BatchStart),
    Item(ItemDone),
    /// Batch `seq`'s samples, decoded by the GPU into device memory, one per item that decoded, in slot
    /// order, and their label maps when the batch has masks; sent before those items.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    Device {
        seq: u64,
        batch: DeviceBatch,
        masks: Option<DeviceBatch>,
    },
}

/// A batch the GPU stage decoded into device memory. Without the `gpu` feature no such batch can exist:
/// the type has no values, and the code that handles one compiles to nothing.
#[cfg(feature = "gpu")]
pub(crate) type DeviceBatch = Box<l3_cuda::DecodedBatch>;
#[cfg(not(feature = "gpu"))]
pub(crate) enum DeviceBatch {}

/// The GPU stage's decoder (none can exist without the `gpu` feature).
#[cfg(feature = "gpu")]
pub(crate) type GpuDecoder = l3_cuda::BatchDecoder;
#[cfg(not(feature = "gpu"))]
pub(crate) enum GpuDecoder {}

/// Opens the GPU stage's decoder for `dataset` on CUDA device `ordinal`, or says why it cannot.
#[cfg(feature = "gpu")]
pub(crate) fn open_gpu(dataset: &dyn Dataset, ordinal: usize) -> Result<GpuDecoder> {
    gpu::open(dataset, ordinal)
}

#[cfg(not(feature = "gpu"))]
pub(crate) fn open_gpu(_: &dyn Dataset, ordinal: usize) -> Result<GpuDecoder> {
    Err(Error::gpu(
        Some(format!("device {ordinal}")),
        crate::NO_GPU_FEATURE,
    ))
}

/// The batch tensor of a device batch, if its shape and type are what the batch asked for.
#[cfg(feature = "gpu")]
pub(crate) fn device_tensor(
    batch: DeviceBatch,
    layout: vocab::Layout,
    dtype: vocab::DType,
) -> Option<crate::batch::Tensor> {
    crate::batch::Tensor::on_device(batch, layout, dtype)
}

#[cfg(not(feature = "gpu"))]
pub(crate) fn device_tensor(
    batch: DeviceBatch,
    _: vocab::Layout,
    _: vocab::DType,
) -> Option<crate::batch::Tensor> {
    match batch {}
}

/// The label maps of a device batch, if they are the one-channel `u8` batch masks are.
#[cfg(feature = "gpu")]
pub(crate) fn device_masks(batch: DeviceBatch) -> Option<crate::batch::Masks> {
    crate::batch::Masks::on_device(batch)
}

#[cfg(not(feature = "gpu"))]
pub(crate) fn device_masks(batch: DeviceBatch) -> Option<crate::batch::Masks> {
    match batch {}
}

/// A batch announced by the order stage before its items.
pub(crate) struct BatchStart {
    pub seq: u64,
    pub epoch: usize,
    pub batch: usize,
    pub ids: Vec<usize>,
    pub filling: Option<Arc<Filling>>,
    /// The buffer of the batch's masks, when it has masks.
    pub mask_filling: Option<Arc<Filling>>,
    /// The Liquid sampler's account of the batch: cached flags, disk items and bytes.
    pub liquid: Option<(Vec<bool>, usize, u64)>,
    /// The order stage failed to produce the batch: delivered in its turn.
    pub failure: Option<Error>,
}

/// One item finished (or failed).
pub(crate) struct ItemDone {
    pub seq: u64,
    pub slot_index: usize,
    /// Bytes read from storage for it by this pipeline (0 for Liquid items), when the read succeeded.
    pub read: Option<u64>,
    pub result: Result<Decoded>,
    /// A failure of the machinery (the GPU), not of the item: never skipped.
    pub fatal: bool,
    /// Its boxes in output pixels, when the batch has boxes.
    pub boxes: Option<SampleBoxes>,
    /// Its sample (and mask sample) at its own size, for whole images: the assembler pads them into the
    /// batch.
    pub own: Option<OwnSample>,
}

/// A whole-image sample, written outside the batch buffer because its size is known only once its image
/// is decoded: pixels in the batch's layout and type at the geometry's size, and its mask.
pub(crate) struct OwnSample {
    pub pixels: Vec<u8>,
    pub mask: Option<Vec<u8>>,
}

impl ItemDone {
    pub fn of(job: &Job, read: Option<u64>, result: Result<Decoded>) -> Self {
        ItemDone {
            seq: job.seq,
            slot_index: job.slot_index,
            read,
            result: result.map_err(|e| Error::item(job.index, e)),
            fatal: false,
            boxes: None,
            own: None,
        }
    }
}
