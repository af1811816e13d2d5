//! Opening whatever a location holds — a local folder or an object-store prefix (`s3://bucket/prefix`): a
//! Liquid dataset, a PCR dataset, a folder of image files or a set of tar shards (also named by a
//! pattern, `DIR/train-{000000..000099}.tar`).

use super::{Dataset, ImageFolder, LiquidShards, PcrRecords, ShardSet, shards};
use crate::error::{Error, Result};
use crate::storage::{Storage, StorageOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to open a dataset location (see [`open_dataset`]).
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// PCR scan group to read (1-based); `None` reads every group.
    pub group: Option<usize>,
    /// Labels for an image folder from a `path,label` CSV instead of sub-folder names.
    pub labels: Option<PathBuf>,
    /// How the bytes are read: a bandwidth cap, a local cache of remote objects.
    pub storage: StorageOptions,
    /// PCR records whose items are shuffled together (0: the default, 4).
    pub pcr_window: usize,
    /// PCR: deliver an image with a corrupt scan at the largest group below it
    /// ([`PcrRecords::with_partial`]).
    pub pcr_partial: bool,
}

/// Opens `location` — a folder, or `s3://bucket/prefix` (configured from the `AWS_*` environment) — as the
/// kind of dataset it holds: `manifest.cbor` → [`LiquidShards`], `index.cbor` → [`PcrRecords`], image
/// files → an [`ImageFolder`], `*.tar` files and no images → a [`ShardSet`]. A location that names
/// shards itself (`x.tar`, or a brace pattern of them) is a [`ShardSet`].
pub fn open_dataset(location: &Path, options: &OpenOptions) -> Result<Arc<dyn Dataset>> {
    let text = location
        .to_str()
        .ok_or_else(|| Error::dataset(location, "the location is not valid UTF-8"))?;
    if shards::pattern::names_shards(text) {
        no_group(location, options)?;
        return Ok(Arc::new(ShardSet::open(text, &options.storage)?));
    }
    let storage = Storage::open(text, &options.storage)?;
    let has = |key: &str| storage.exists(key);
    if has(liquid_sampler::manifest::MANIFEST_NAME)? {
        return Ok(Arc::new(LiquidShards::open_in(storage)?));
    }
    if has(pcr::INDEX_FILE)? {
        let window = match options.pcr_window {
            0 => super::pcr::DEFAULT_WINDOW,
            w => w,
        };
        return Ok(Arc::new(
            PcrRecords::open_in(storage, options.group, window)?.with_partial(options.pcr_partial),
        ));
    }
    no_group(location, options)?;
    let folder = match &options.labels {
        Some(csv) => ImageFolder::with_labels_in(storage.clone(), csv),
        None => ImageFolder::open_in(storage.clone()),
    };
    match folder {
        Ok(f) => Ok(Arc::new(f)),
        // No images, but shards: a folder (or prefix) of shards.
        Err(e) if options.labels.is_none() => {
            let listing = storage.list()?;
            if listing.files.iter().any(|(k, _)| k.ends_with(".tar")) {
                return Ok(Arc::new(ShardSet::open_in(storage, None, text)?));
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

fn no_group(location: &Path, options: &OpenOptions) -> Result<()> {
    if options.group.is_some() {
        return Err(Error::dataset(
            location,
            "a scan group was given but this is not a PCR dataset",
        ));
    }
    Ok(())
}
