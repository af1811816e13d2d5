//! Opening whatever a path holds: a Liquid dataset, a PCR dataset or a folder of image files.

use super::{Dataset, ImageFolder, LiquidShards, PcrRecords};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to open a dataset path (see [`open_dataset`]).
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// PCR scan group to read (1-based); `None` reads every group.
    pub group: Option<usize>,
    /// Labels for an image folder from a `path,label` CSV instead of sub-folder names.
    pub labels: Option<PathBuf>,
}

/// Opens `path` as the kind of dataset it holds: `manifest.cbor` → [`LiquidShards`], `index.cbor` →
/// [`PcrRecords`], otherwise an [`ImageFolder`].
pub fn open_dataset(path: &Path, options: &OpenOptions) -> Result<Arc<dyn Dataset>> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(Error::dataset(path, "not a folder")),
        Err(e) => return Err(Error::io(path, e)),
    }
    if LiquidShards::is_dataset(path) {
        return Ok(Arc::new(LiquidShards::open(path)?));
    }
    if PcrRecords::is_dataset(path) {
        return Ok(Arc::new(PcrRecords::open(path, options.group)?));
    }
    if options.group.is_some() {
        return Err(Error::dataset(
            path,
            "a scan group was given but this is not a PCR dataset",
        ));
    }
    Ok(Arc::new(match &options.labels {
        Some(csv) => ImageFolder::with_labels(path, csv)?,
        None => ImageFolder::open(path)?,
    }))
}
