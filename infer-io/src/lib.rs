//! The files of an inference run: inputs of any size read by region, outputs written tile by tile, and
//! the run between them — what `l3 infer`, `l3 stylize` and Python's `l3toolkit.infer` share.
//!
//! * [`input`] — an input opened by its extension ([`InputFile`]): values scaled, channels fitted to the
//!   network's; arrays held in memory ([`InputData`]).
//! * [`l3`] — an L3 file read by region with positioned reads, its whole-file checksum checked first
//!   ([`L3Regions`]).
//! * [`tiff`] — TIFF and BigTIFF pages and SubIFD levels read by region ([`tiff::TiffRegions`],
//!   [`tiff::pages`]), and tiled BigTIFF written tile by tile ([`tiff::TiffWriter`]).
//! * [`npy`] — float32 `.npy` read by region and written tile by tile; its header parsed as the literal
//!   numpy writes ([`npy::header`]).
//! * `rows` — 8-bit outputs whose rows stream to their encoder as bands of tiles complete: PNG, PPM/PGM,
//!   L3, JPEG.
//! * [`output`] — an output chosen by its extension, written under a temporary name ([`OutputFile`]).
//! * [`run`] — the model loaded ([`load_model`]) and run from files to files or tensors
//!   ([`InferRequest`], [`infer_paths`], [`stylize_paths`], ...).
//! * [`settings`] — the options of a run as every surface spells them ([`InferSettings`]): one model
//!   for `l3 infer`, `l3 stylize` and Python's `infer` and `Model`.
//! * [`error`] — the one error type ([`Error`]): damage found when a file is opened and damage found by
//!   the window that reads it are the same error.
//!
//! The engine ([`bsp_tiling`]) knows no file format; the loader ([`loader`]) lends its one image-import
//! path for files that cannot be read by region, and its JPEG row encoder.
#![deny(unsafe_code)]

pub mod error;
pub mod input;
pub mod l3;
pub mod npy;
pub mod output;
mod rows;
pub mod run;
pub mod settings;
pub mod tiff;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;

pub use error::{Error, Result};
pub use input::{InputData, InputFile, InputOptions, check_page};
pub use l3::L3Regions;
pub use output::OutputFile;
pub use run::{
    InferReport, InferRequest, infer_path_to_tensor, infer_paths, infer_to_path, infer_to_tensor,
    load_model, load_network, output_shape, stylize_paths,
};
pub use settings::{INFER_SETTING_NAMES, InferSettings};
