//! The one `Dataset` trait every source implements — what an item is, how its bytes are read (the I/O
//! stage) and how they become a sample (the decode stage) — its implementations, and [`open_dataset`].

pub(crate) mod folder;
pub(crate) mod liquid;
pub(crate) mod masks;
mod open;
mod pcr;
pub(crate) mod regions;
pub(crate) mod shards;

pub use folder::{ImageFolder, image_files};
pub use liquid::LiquidShards;
pub use open::{OpenOptions, open_dataset};
pub use pcr::PcrRecords;
pub use shards::ShardSet;

use crate::error::Result;
use crate::format::Format;
use crate::item::{Decoded, SampleRequest, Scratch, Stored, decode_sample};
use std::path::PathBuf;

/// A random-access collection of labelled images.
///
/// The loader calls [`read`](Dataset::read) on its I/O threads and [`decode`](Dataset::decode) on its
/// decode threads, so the split between the two is where a format's cost shows up: raw is all read, L3
/// and PNG mostly decode. Both receive the [`SampleRequest`] — the sample the item becomes — so a format
/// that can read or decode less for a crop (L3's independent patches) does. Implementations are shared
/// between threads (`Sync`) and deterministic.
pub trait Dataset: Send + Sync {
    /// Number of items.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The class label of item `index`.
    fn label(&self, index: usize) -> u32;

    /// A stable identifier of item `index` (its index unless the dataset records ids of its own),
    /// written in traces.
    fn id(&self, index: usize) -> u64 {
        index as u64
    }

    /// How item `index` is stored.
    fn format(&self, index: usize) -> Format;

    /// Item `index`'s path relative to the image tree it came from (`a/x.png`), if the dataset records
    /// one: what pairs it with targets kept beside the dataset (masks, boxes), by path and stem.
    fn name(&self, _index: usize) -> Option<String> {
        None
    }

    /// Where item `index` lives (a file, or a file and a position in it): named in every error about it.
    fn source(&self, index: usize) -> PathBuf;

    /// Item `index`'s stored size in bytes as the dataset's listing gives it (`None`: not listed): with
    /// [`name`](Dataset::name), what a resume state's dataset fingerprint is made of.
    fn stored_len(&self, _index: usize) -> Option<u64> {
        None
    }

    /// Total bytes the dataset occupies on disk (at the chosen fidelity, for PCR).
    fn stored_bytes(&self) -> u64;

    /// The I/O stage: reads what decoding item `index` for `req` needs. Returns it with the bytes read.
    fn read(&self, index: usize, req: &SampleRequest) -> Result<(Stored, u64)>;

    /// The decode stage: turns what [`read`](Dataset::read) returned into the item's sample, written into
    /// `slot` (`req.spec.sample_bytes()` bytes of the batch buffer).
    fn decode(
        &self,
        index: usize,
        stored: &Stored,
        req: &SampleRequest,
        scratch: &mut Scratch,
        slot: &mut [u8],
    ) -> Result<Decoded> {
        decode_sample(
            self.format(index),
            stored,
            &self.source(index),
            req,
            scratch,
            slot,
        )
    }

    /// A one-line description (kind and location) for logs and tables.
    fn describe(&self) -> String;

    /// What opening the dataset left out, one line each (special files, folders reached twice).
    fn warnings(&self) -> &[String] {
        &[]
    }

    /// The read layer the dataset's bytes come through, for its request and byte counts.
    fn storage(&self) -> Option<&crate::storage::Storage> {
        None
    }

    /// Items stored together in read units (PCR records), if they are: the seeded order then visits the
    /// units in a shuffled order and shuffles items only within a window of units, so each unit is read
    /// once per epoch.
    fn blocks(&self) -> Option<Blocks<'_>> {
        None
    }

    /// The Liquid multi-format dataset behind this one, if it is one: what the Liquid order
    /// ([`Order::Liquid`](crate::Order::Liquid)) samples from.
    fn liquid(&self) -> Option<&liquid_sampler::Dataset> {
        None
    }

    /// The shard set behind this one, if it is one: what carries targets as members of its samples
    /// (`masks=@shards`, `boxes=@shards`).
    fn shard_set(&self) -> Option<&ShardSet> {
        None
    }
}

impl<D: Dataset + ?Sized> Dataset for std::sync::Arc<D> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn label(&self, index: usize) -> u32 {
        (**self).label(index)
    }
    fn id(&self, index: usize) -> u64 {
        (**self).id(index)
    }
    fn format(&self, index: usize) -> Format {
        (**self).format(index)
    }
    fn name(&self, index: usize) -> Option<String> {
        (**self).name(index)
    }
    fn source(&self, index: usize) -> PathBuf {
        (**self).source(index)
    }
    fn stored_len(&self, index: usize) -> Option<u64> {
        (**self).stored_len(index)
    }
    fn stored_bytes(&self) -> u64 {
        (**self).stored_bytes()
    }
    fn read(&self, index: usize, req: &SampleRequest) -> Result<(Stored, u64)> {
        (**self).read(index, req)
    }
    fn decode(
        &self,
        index: usize,
        stored: &Stored,
        req: &SampleRequest,
        scratch: &mut Scratch,
        slot: &mut [u8],
    ) -> Result<Decoded> {
        (**self).decode(index, stored, req, scratch, slot)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn warnings(&self) -> &[String] {
        (**self).warnings()
    }
    fn blocks(&self) -> Option<Blocks<'_>> {
        (**self).blocks()
    }
    fn storage(&self) -> Option<&crate::storage::Storage> {
        (**self).storage()
    }
    fn liquid(&self) -> Option<&liquid_sampler::Dataset> {
        (**self).liquid()
    }
    fn shard_set(&self) -> Option<&ShardSet> {
        (**self).shard_set()
    }
}

/// Read units of a dataset (see [`Dataset::blocks`]).
#[derive(Clone, Copy, Debug)]
pub struct Blocks<'a> {
    /// The first item of each unit, ascending, starting at 0.
    pub starts: &'a [usize],
    /// Units whose items are shuffled together.
    pub window: usize,
}
