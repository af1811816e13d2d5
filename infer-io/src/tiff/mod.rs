//! TIFF and BigTIFF, streamed: an input read by region ([`TiffRegions`]: one page of the file or one of
//! its SubIFD levels, which [`pages`] lists; only the tiles or strips under a window are decoded, through the `tiff` crate, with a
//! byte-bounded cache of decoded chunks) and an output written tile by tile ([`TiffWriter`]: a tiled
//! BigTIFF whose tiles go to the file as soon as their pixels are complete, the directory and the tile
//! tables at the end).

mod cache;
mod open;
mod pages;
mod read;
mod write;

pub use pages::{PageInfo, pages};
pub use read::{SampleType, TiffRegions};
pub use write::{OutDType, TILE, TiffWriter};
