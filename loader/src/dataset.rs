//! The one `Dataset` trait every source implements: what an item is, how its bytes are read (the I/O stage)
//! and how they become pixels (the decode stage).

use crate::error::Result;
use crate::image::{self, Format, Image};
use std::path::PathBuf;

/// A random-access collection of labelled images.
///
/// The loader calls [`read`](Dataset::read) on its I/O threads and [`decode`](Dataset::decode) on its decode
/// pool, so the split between the two is where a format's cost shows up: raw is all read, L3 and PNG mostly
/// decode. Implementations must be cheap to share between threads (`Sync`) and deterministic.
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

    /// Where item `index` lives (a file, or a file and a position in it): named in every error about it.
    fn source(&self, index: usize) -> PathBuf;

    /// Total bytes the dataset occupies on disk.
    fn stored_bytes(&self) -> u64;

    /// Reads the stored bytes of item `index` (the I/O stage).
    fn read(&self, index: usize) -> Result<Vec<u8>>;

    /// Turns the bytes [`read`](Dataset::read) returned into pixels (the decode stage), reusing `out`.
    fn decode(&self, index: usize, bytes: &[u8], out: &mut Image) -> Result<()> {
        image::decode(self.format(index), bytes, &self.source(index), out)
    }

    /// A one-line description (kind and location) for logs and tables.
    fn describe(&self) -> String;

    /// The Liquid multi-format dataset behind this one, if it is one: what the Liquid order
    /// ([`Order::Liquid`](crate::Order::Liquid)) samples from.
    fn liquid(&self) -> Option<&liquid_sampler::Dataset> {
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
    fn source(&self, index: usize) -> PathBuf {
        (**self).source(index)
    }
    fn stored_bytes(&self) -> u64 {
        (**self).stored_bytes()
    }
    fn read(&self, index: usize) -> Result<Vec<u8>> {
        (**self).read(index)
    }
    fn decode(&self, index: usize, bytes: &[u8], out: &mut Image) -> Result<()> {
        (**self).decode(index, bytes, out)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn liquid(&self) -> Option<&liquid_sampler::Dataset> {
        (**self).liquid()
    }
}
