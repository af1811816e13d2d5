//! The packed multi-format dataset of `liquid-sampler` (compressed items beside raw ones in aligned data
//! files, a CBOR manifest), read item by item through the loader's own pipeline.

use super::Dataset;
use super::regions::{IndexCache, read_region};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{Decoded, SampleRequest, Scratch, Stored, decode_sample, write_pixels};
use crate::sample::DecodeScope;
use crate::storage::Storage;
use liquid_sampler::manifest::{FormatKind, MANIFEST_NAME, Manifest};
use std::path::{Path, PathBuf};

/// Manifests larger than this are refused before being read.
const MAX_MANIFEST_BYTES: u64 = 1 << 32;

/// Offset tables of L3 items kept for region reads.
const INDEX_CACHE_BYTES: usize = 64 << 20;

/// The file beside the manifest that names each item (a JSON array of relative paths, indexed by item
/// id), written by [`to_liquid`](crate::convert::to_liquid): how masks and boxes kept beside the dataset
/// find its items. Datasets without it have no item names.
pub const ITEM_NAMES: &str = "item-names.json";

/// A Liquid multi-format dataset folder (`manifest.cbor` + packed data files).
///
/// Items keep the manifest's storage order; the format tag of each (`png`, `jpeg`, `l3`, `raw`) picks its
/// decoder. Under the loader's default order reads are plain `pread`s through the page cache (L3 items:
/// only the patches under the window); with [`Order::Liquid`](crate::Order::Liquid) the loader takes its
/// order and bytes from `liquid-sampler`'s page-cache-bypassing two-region sampler instead (local
/// datasets only: it reads the packs itself with direct I/O).
pub struct LiquidShards {
    inner: liquid_sampler::Dataset,
    storage: Storage,
    formats: Vec<Format>,
    indexes: IndexCache,
    /// Item names by id ([`ITEM_NAMES`]), when the dataset has them.
    names: Option<Vec<String>>,
}

impl LiquidShards {
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_in(Storage::local(dir.as_ref()))
    }

    /// The dataset at the root of `storage` (a local folder or an object-store prefix). The manifest is
    /// checked, and every data file against its recorded length, before anything else is read.
    pub fn open_in(storage: Storage) -> Result<Self> {
        let dir = PathBuf::from(storage.root());
        let dir = dir.as_path();
        let inner = match storage.local_root() {
            Some(local) => {
                liquid_sampler::Dataset::open(local).map_err(|e| Error::dataset(local, e))?
            }
            None => {
                let name = storage.name(MANIFEST_NAME);
                let bytes = storage.read(MANIFEST_NAME, MAX_MANIFEST_BYTES)?;
                let manifest =
                    Manifest::from_bytes(&bytes, &name).map_err(|e| Error::dataset(&name, e))?;
                manifest
                    .check(&name)
                    .map_err(|e| Error::dataset(&name, e))?;
                let sizes: std::collections::HashMap<String, u64> =
                    storage.list()?.files.into_iter().collect();
                for f in &manifest.files {
                    match sizes.get(&f.name) {
                        Some(&len) if len == f.len => {}
                        Some(&len) => {
                            return Err(Error::dataset(
                                storage.name(&f.name),
                                format!("the manifest says {} bytes, the object has {len}", f.len),
                            ));
                        }
                        None => {
                            return Err(Error::dataset(
                                storage.name(&f.name),
                                "data file missing from the dataset",
                            ));
                        }
                    }
                }
                liquid_sampler::Dataset {
                    dir: dir.to_path_buf(),
                    manifest,
                }
            }
        };
        let formats = inner
            .manifest
            .formats
            .iter()
            .map(|f| match f.kind {
                FormatKind::Raw => Ok(Format::Raw),
                FormatKind::Compressed => match f.tag.as_str() {
                    "png" => Ok(Format::Png),
                    "jpeg" | "jpg" => Ok(Format::Jpeg),
                    "l3" => Ok(Format::L3),
                    t => Err(Error::dataset(
                        dir,
                        format!("format tag {t:?}: no decoder (png, jpeg, l3 or raw)"),
                    )),
                },
            })
            .collect::<Result<Vec<_>>>()?;
        let names = if storage.exists(ITEM_NAMES)? {
            let bytes = storage.read(ITEM_NAMES, MAX_MANIFEST_BYTES)?;
            let names: Vec<String> = serde_json::from_slice(&bytes).map_err(|e| {
                Error::dataset(
                    storage.name(ITEM_NAMES),
                    format!("not a list of names: {e}"),
                )
            })?;
            if let Some(it) = inner
                .manifest
                .items
                .iter()
                .find(|it| it.id >= names.len() as u64)
            {
                return Err(Error::dataset(
                    storage.name(ITEM_NAMES),
                    format!("{} names, and item id {} has none", names.len(), it.id),
                ));
            }
            check_unique(&names, &inner.manifest, &storage.name(ITEM_NAMES))?;
            Some(names)
        } else {
            None
        };
        Ok(LiquidShards {
            inner,
            storage,
            formats,
            indexes: IndexCache::new(INDEX_CACHE_BYTES),
            names,
        })
    }

    /// The manifest (ratio, formats, items).
    pub fn manifest(&self) -> &liquid_sampler::Manifest {
        &self.inner.manifest
    }

    /// Whether `dir` holds a Liquid dataset.
    pub fn is_dataset(dir: &Path) -> bool {
        dir.join(liquid_sampler::manifest::MANIFEST_NAME).is_file()
    }
}

/// Refuses an [`ITEM_NAMES`] file (`path`) that gives two of the manifest's items the same name: both
/// would be paired with the same mask and the same boxes.
fn check_unique(names: &[String], manifest: &liquid_sampler::Manifest, path: &Path) -> Result<()> {
    let mut seen: std::collections::HashMap<&str, u64> =
        std::collections::HashMap::with_capacity(manifest.items.len());
    for it in &manifest.items {
        let name = names[it.id as usize].as_str();
        if let Some(first) = seen.insert(name, it.id) {
            return Err(Error::dataset(
                path,
                format!(
                    "item ids {first} and {} are both named {}: each item needs its own name (masks \
                     and boxes are paired by name)",
                    it.id,
                    stdx::Quoted(name)
                ),
            ));
        }
    }
    Ok(())
}

impl Dataset for LiquidShards {
    fn len(&self) -> usize {
        self.inner.manifest.items.len()
    }
    fn label(&self, index: usize) -> u32 {
        self.inner.manifest.items[index].label
    }
    fn id(&self, index: usize) -> u64 {
        self.inner.manifest.items[index].id
    }
    fn name(&self, index: usize) -> Option<String> {
        let id = self.inner.manifest.items[index].id as usize;
        self.names.as_ref().map(|n| n[id].clone())
    }
    fn format(&self, index: usize) -> Format {
        self.formats[self.inner.manifest.items[index].format as usize]
    }
    fn source(&self, index: usize) -> PathBuf {
        let it = &self.inner.manifest.items[index];
        let p = self.inner.path_of(it.location.file);
        PathBuf::from(format!(
            "{}@{}+{} (item id {})",
            p.display(),
            it.location.offset,
            it.location.length,
            it.id
        ))
    }
    fn stored_len(&self, index: usize) -> Option<u64> {
        Some(self.inner.manifest.items[index].location.length)
    }
    fn stored_bytes(&self) -> u64 {
        self.inner.item_bytes()
    }
    fn read(&self, index: usize, req: &SampleRequest) -> Result<(Stored, u64)> {
        let loc = self.inner.manifest.items[index].location;
        let key = &self.inner.manifest.files[loc.file as usize].name;
        if self.format(index) == Format::L3 && req.scope == DecodeScope::Region {
            let at = (loc.offset, loc.length);
            return read_region(&self.indexes, index, &self.storage.open_key(key)?, at, req);
        }
        let buf = self
            .storage
            .read_range(key, loc.offset..loc.offset + loc.length)?;
        Ok((Stored::Whole(buf), loc.length))
    }
    fn decode(
        &self,
        index: usize,
        stored: &Stored,
        req: &SampleRequest,
        scratch: &mut Scratch,
        slot: &mut [u8],
    ) -> Result<Decoded> {
        let path = self.source(index);
        match (self.format(index), stored) {
            // Raw items are bare pixels; their dimensions are in the manifest.
            (Format::Raw, Stored::Whole(bytes)) => {
                let d = self.inner.manifest.items[index].dims;
                if bytes.len() as u64 != d.decoded_len() {
                    return Err(Error::decode(
                        path,
                        "raw",
                        format!(
                            "{} bytes, {}x{}x{} needs {}",
                            bytes.len(),
                            d.width,
                            d.height,
                            d.channels,
                            d.decoded_len()
                        ),
                    ));
                }
                write_pixels(
                    bytes,
                    (d.width, d.height, d.channels),
                    &path,
                    Format::Raw,
                    req,
                    scratch,
                    slot,
                )
            }
            (f, s) => decode_sample(f, s, &path, req, scratch, slot),
        }
    }
    fn storage(&self) -> Option<&Storage> {
        Some(&self.storage)
    }
    fn liquid(&self) -> Option<&liquid_sampler::Dataset> {
        self.storage.local_root().map(|_| &self.inner)
    }
    fn describe(&self) -> String {
        let m = &self.inner.manifest;
        format!(
            "Liquid dataset {} ({} items, ratio {} compressed:raw)",
            self.storage.root(),
            m.items.len(),
            m.ratio
        )
    }
}
