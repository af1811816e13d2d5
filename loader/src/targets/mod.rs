//! Training targets that follow each sample's geometry: segmentation masks ([`masks`]) and detection boxes
//! ([`boxes`]), found once when the loader starts ([`Targets::open`]) and made per item by the decode
//! stage with exactly the geometry its image got ([`vocab::Geometry`]).

pub mod boxes;
mod mask_png;
pub mod masks;

use crate::dataset::Dataset;
use crate::dataset::masks::{MaskIndex, MaskNaming};
use crate::dataset::regions::IndexCache;
use crate::dataset::shards::{Carried, Member, ShardSet};
use crate::error::{Error, Result};
use crate::item::{SampleRequest, Stored};
use crate::storage::{Storage, StorageOptions};
use boxes::{CocoBoxes, ItemBoxes, SampleBoxes};
use masks::MaskImage;
use std::path::{Path, PathBuf};
use vocab::{Geometry, Invalid};

/// The `masks` and `boxes` location that names the targets a shard set carries: each sample's
/// `KEY.seg.*` member as its mask, its `KEY.json` member as its boxes.
pub const IN_SHARDS: &str = "@shards";

/// What targets a loader delivers beside the images (all off by default).
#[derive(Clone, Debug)]
pub struct TargetOptions {
    /// A folder (or `s3://` prefix) of label maps, one per image, paired by relative path and stem.
    pub masks: Option<PathBuf>,
    pub naming: MaskNaming,
    /// The mask value where a sample reaches past its image (padding).
    pub ignore_index: u16,
    /// A COCO instances file whose boxes follow each sample.
    pub boxes: Option<PathBuf>,
    /// Boxes narrower or shorter than this (output pixels, after clipping) are dropped.
    pub min_box_size: f64,
    /// How the masks are read (the dataset's read policy; the bandwidth cap is the dataset's own).
    pub storage: StorageOptions,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            masks: None,
            naming: MaskNaming::default(),
            ignore_index: 255,
            boxes: None,
            min_box_size: 1.0,
            storage: StorageOptions::default(),
        }
    }
}

impl TargetOptions {
    pub fn is_empty(&self) -> bool {
        self.masks.is_none() && self.boxes.is_none()
    }

    /// Checks the options on their own.
    pub fn validate(&self) -> std::result::Result<(), Invalid> {
        if !(self.min_box_size.is_finite() && self.min_box_size >= 0.0) {
            return Err(Invalid::new(
                "min_box_size",
                self.min_box_size,
                "a finite number of pixels, 0 or more",
            ));
        }
        if let Some(boxes) = &self.boxes
            && boxes.to_str().is_some_and(|b| b.contains("://"))
        {
            return Err(Invalid::new(
                "boxes",
                boxes.display(),
                "a local COCO instances file: boxes are read from the local file system only (copy \
                 the file from the store first; masks= may be an s3:// prefix)",
            ));
        }
        if self.masks.is_none()
            && (self.naming != MaskNaming::default() || self.ignore_index != 255)
        {
            let (option, value) = if !self.naming.image_suffix.is_empty() {
                ("image_suffix", self.naming.image_suffix.clone())
            } else if !self.naming.mask_suffix.is_empty() {
                ("mask_suffix", self.naming.mask_suffix.clone())
            } else {
                ("ignore_index", self.ignore_index.to_string())
            };
            return Err(Invalid::new(
                option,
                value,
                "masks too (it applies to masks)",
            ));
        }
        Ok(())
    }

    /// What decides a batch's targets, for the resume check (empty without targets).
    pub fn contents(&self) -> String {
        if self.is_empty() {
            return String::new();
        }
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or("none".into(), |p| p.display().to_string())
        };
        format!(
            ";masks:{},{},{},{};boxes:{},{}",
            path(&self.masks),
            self.naming.image_suffix,
            self.naming.mask_suffix,
            self.ignore_index,
            path(&self.boxes),
            self.min_box_size
        )
        .replace(char::is_whitespace, "%20")
    }
}

/// The targets of a running loader: the paired masks and each item's boxes.
#[derive(Debug)]
pub struct Targets {
    masks: Option<MaskIndex>,
    /// Masks are 16-bit (the batch's masks are `u16`).
    wide: bool,
    ignore_index: u16,
    boxes: Option<BoxSource>,
    min_box_size: f64,
    /// The offset tables of the L3 masks read by region so far.
    indexes: IndexCache,
}

/// Where the items' boxes come from.
#[derive(Debug)]
enum BoxSource {
    /// A COCO file, matched to the items when the targets open.
    Matched(Vec<ItemBoxes>),
    /// Each sample's `KEY.json` member of a shard set, read with its item in the read stage: a GET
    /// per item as it is read, not one per item of the whole set before the first batch.
    Carried {
        storage: Storage,
        members: Vec<Option<Member>>,
    },
}

/// What the read stage fetched of an item's boxes, and the bytes that took ([`Targets::read_boxes`]).
pub type ReadBoxes = Result<(ItemBoxes, u64)>;

/// Largest boxes member read (a sample's boxes are a few hundred bytes).
const BOXES_MEMBER_LIMIT: u64 = 64 << 20;

/// Why `option` = [`IN_SHARDS`] cannot work over `ds`.
fn not_shards(ds: &dyn Dataset, option: &str) -> Error {
    Error::dataset(
        ds.describe(),
        format!(
            "{option}={IN_SHARDS} takes the targets a shard set carries, and this is no shard set"
        ),
    )
}

/// Each item's boxes from its sample's `KEY.json` member (none without one): one read per member,
/// when the loader starts, as a COCO file is read then.
fn carried_boxes(shards: &ShardSet) -> BoxSource {
    BoxSource::Carried {
        storage: shards.storage().clone(),
        members: (0..shards.len())
            .map(|i| shards.carried(i, Carried::Boxes))
            .collect(),
    }
}

/// The byte budget of the masks' cached offset tables (a one-channel table is a third of its image's).
const MASK_INDEX_CACHE_BYTES: usize = 16 << 20;

impl Targets {
    /// Pairs `ds`'s items with their masks and boxes. The masks are read through a storage opened with
    /// the dataset's read policy and sharing its bandwidth cap, so that images and masks together stay
    /// under it. With `skip_errors`, items without a mask are left for the run to skip (and count);
    /// otherwise the first is an error here.
    pub fn open(ds: &dyn Dataset, o: &TargetOptions, skip_errors: bool) -> Result<Option<Targets>> {
        let storage = &o.storage;
        if o.is_empty() {
            return Ok(None);
        }
        o.validate()?;
        let names: Vec<Option<String>> = (0..ds.len()).map(|i| ds.name(i)).collect();
        if names.iter().all(Option::is_none) {
            return Err(Error::dataset(
                ds.describe(),
                "this kind of dataset records no item names, so its items cannot be paired with \
                 masks or boxes",
            ));
        }
        let masks = match &o.masks {
            None => None,
            Some(dir) if dir.as_os_str() == IN_SHARDS => Some(MaskIndex::carried(
                ds.shard_set().ok_or_else(|| not_shards(ds, "masks"))?,
            )),
            Some(dir) => {
                let text = dir
                    .to_str()
                    .ok_or_else(|| Error::dataset(dir, "the location is not valid UTF-8"))?;
                let store = match ds.storage() {
                    Some(s) => s.open_beside(text, storage)?,
                    None => Storage::open(text, storage)?,
                };
                let sources: Vec<PathBuf> = (0..ds.len()).map(|i| ds.source(i)).collect();
                let index = MaskIndex::pair(store, &names, &sources, &o.naming)?;
                if !skip_errors && let Some(first) = index.missing().next() {
                    let more = index.missing().count() - 1;
                    let tail = if more > 0 {
                        format!(" (and {more} more; skip_errors skips such items)")
                    } else {
                        String::new()
                    };
                    return Err(Error::dataset(dir, format!("{first}{tail}")));
                }
                Some(index)
            }
        };
        let wide = match &masks {
            Some(m) => masks::probe_wide(m, skip_errors)?,
            None => false,
        };
        if !wide && o.ignore_index > 255 {
            return Err(
                Invalid::new("ignore_index", o.ignore_index, "0 to 255 for 8-bit masks").into(),
            );
        }
        let boxes = match &o.boxes {
            None => None,
            Some(path) if path.as_os_str() == IN_SHARDS => Some(carried_boxes(
                ds.shard_set().ok_or_else(|| not_shards(ds, "boxes"))?,
            )),
            Some(path) => {
                let coco = CocoBoxes::open(path)?;
                Some(BoxSource::Matched(coco.match_items(
                    &names,
                    path,
                    &ds.describe(),
                )?))
            }
        };
        Ok(Some(Targets {
            masks,
            wide,
            ignore_index: o.ignore_index,
            boxes,
            min_box_size: o.min_box_size,
            indexes: IndexCache::new(MASK_INDEX_CACHE_BYTES),
        }))
    }

    /// Whether batches carry masks.
    pub fn has_masks(&self) -> bool {
        self.masks.is_some()
    }

    /// Whether batches carry boxes.
    pub fn has_boxes(&self) -> bool {
        self.boxes.is_some()
    }

    /// The mask value where a sample shows no image.
    pub fn ignore_index(&self) -> u16 {
        self.ignore_index
    }

    /// Whether masks are 16-bit.
    pub fn wide(&self) -> bool {
        self.wide
    }

    /// Bytes of one mask sample of `out` (width, height).
    pub fn mask_bytes(&self, out: (u32, u32)) -> usize {
        if self.masks.is_none() {
            return 0;
        }
        out.0 as usize * out.1 as usize * if self.wide { 2 } else { 1 }
    }

    /// Where item `index`'s mask lives (or the error naming the image without one), if masks are on.
    pub fn mask_path(&self, index: usize) -> Option<Result<PathBuf>> {
        let m = self.masks.as_ref()?;
        Some(m.key(index).map(|k| m.name(k)))
    }

    /// The read stage's part: what item `index`'s mask contributes to the sample `req` asks for (only
    /// the patches its pick reads, for an L3 mask under region reads), with the bytes read, if masks
    /// are on.
    pub fn read_mask(&self, index: usize, req: &SampleRequest) -> Option<Result<(Stored, u64)>> {
        let m = self.masks.as_ref()?;
        Some(
            m.key(index)
                .and_then(|k| m.read_for(index, k, req, &self.indexes)),
        )
    }

    /// The decode stage's part for item `index`, whose image (`image`: its path and its width and height)
    /// was given geometry `g` in a sample of `out` (width, height): its mask written into `slot`, its
    /// boxes returned.
    pub fn make(
        &self,
        index: usize,
        (mask, boxes): (Option<&Stored>, Option<ReadBoxes>),
        (image_path, image): (&Path, (u32, u32)),
        (g, out): (&Geometry, (u32, u32)),
        scratch: &mut MaskImage,
        slot: &mut [u8],
    ) -> Result<Option<SampleBoxes>> {
        if let Some(m) = &self.masks {
            let key = m.key(index)?;
            let path = m.name(key);
            let stored = mask.ok_or_else(|| {
                Error::Pipeline(format!(
                    "{}: a mask reached decoding unread",
                    path.display()
                ))
            })?;
            let other_size = |(w, h): (u32, u32)| {
                Error::dataset(
                    &path,
                    format!(
                        "the mask is {w}x{h} but its image {} is {}x{}",
                        image_path.display(),
                        image.0,
                        image.1
                    ),
                )
            };
            // From the header, before anything is allocated or decoded (a region read fetched the
            // patches of the mask's own size's geometry: a mask of another size is this error too).
            let check = |h: &masks::MaskHeader| {
                if (h.width, h.height) != image {
                    return Err(other_size((h.width, h.height)));
                }
                if h.wide && !self.wide {
                    return Err(Error::dataset(
                        &path,
                        "a 16-bit mask in a set of 8-bit masks (the first mask decides the batch type)",
                    ));
                }
                Ok(())
            };
            masks::decode_stored_mask(stored, &path, Some(masks::picked(g)), check, scratch)?;
            masks::write_mask(scratch, g, out, self.ignore_index, self.wide, slot);
        }
        self.boxes_for(index, boxes, g)
    }

    /// The read stage's part of item `index`'s boxes: its shard's boxes member, read and parsed, with
    /// the bytes read — for boxes a shard set carries; `None` where there is nothing to read (boxes off,
    /// or matched from a COCO file at open).
    pub fn read_boxes(&self, index: usize) -> Option<ReadBoxes> {
        let Some(BoxSource::Carried { storage, members }) = &self.boxes else {
            return None;
        };
        Some(match members.get(index).cloned().flatten() {
            None => Ok((ItemBoxes::default(), 0)),
            Some(m) => m.read(storage, BOXES_MEMBER_LIMIT).and_then(|bytes| {
                let b = boxes::parse_carried(&bytes, &m.source(storage))?;
                Ok((b, m.size))
            }),
        })
    }

    /// Item `index`'s boxes through geometry `g`, if boxes are on: `read` is what the read stage
    /// fetched of them ([`read_boxes`](Self::read_boxes)), read here where it is `None`.
    pub fn boxes_for(
        &self,
        index: usize,
        read: Option<ReadBoxes>,
        g: &Geometry,
    ) -> Result<Option<SampleBoxes>> {
        let place = |b: &ItemBoxes| boxes::place_boxes(b, g, self.min_box_size);
        match &self.boxes {
            None => Ok(None),
            Some(BoxSource::Matched(b)) => Ok(Some(place(&b[index]))),
            Some(BoxSource::Carried { .. }) => {
                let (b, _) = match read.or_else(|| self.read_boxes(index)) {
                    Some(r) => r?,
                    None => (ItemBoxes::default(), 0),
                };
                Ok(Some(place(&b)))
            }
        }
    }
}
