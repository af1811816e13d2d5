//! An item's mask, found and read: which mask file belongs to which image ([`MaskIndex`], paired by path
//! and stem under a [`MaskNaming`]), and what the read stage fetches of it for one sample — an L3 mask
//! by region, as its image, any other mask whole. Decoding and resampling it is
//! [`crate::targets::masks`]'s part.

use crate::dataset::regions::{IndexCache, read_rect, read_rect_framed};
use crate::dataset::shards::{Carried, Member, ShardSet, in_member};
use crate::error::{Error, Result};
use crate::item::{SampleRequest, Stored};
use crate::sample::DecodeScope;
use crate::storage::Storage;
use std::collections::HashMap;
use std::path::PathBuf;
use vocab::Geometry;

/// The extensions a mask file may have, in the order a missing mask's message lists them.
pub const MASK_EXTENSIONS: [&str; 4] = ["png", "pgm", "ppm", "l3"];

/// How image names become mask names: `image_suffix` at the end of an image's stem is replaced by
/// `mask_suffix` (Cityscapes: `_leftImg8bit` → `_gtFine_labelIds`); with no `image_suffix`, `mask_suffix`
/// is appended to the stem.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaskNaming {
    pub image_suffix: String,
    pub mask_suffix: String,
}

impl MaskNaming {
    /// The mask's key without its extension for an image named `image` (a relative path, extension
    /// included), or why there is none.
    pub fn stem_for(&self, image: &str) -> std::result::Result<String, String> {
        let stem = strip_extension(image);
        let base = match stem.strip_suffix(self.image_suffix.as_str()) {
            Some(b) if !self.image_suffix.is_empty() => b,
            _ if self.image_suffix.is_empty() => stem,
            _ => {
                return Err(format!(
                    "its name does not end with image_suffix {:?} (before the extension)",
                    self.image_suffix
                ));
            }
        };
        Ok(format!("{base}{}", self.mask_suffix))
    }
}

/// A relative name without its file extension: what pairs an image with its targets whatever format a
/// conversion gave either of them.
pub fn strip_extension(name: &str) -> &str {
    let file_start = name.rfind('/').map_or(0, |i| i + 1);
    match name[file_start..].rfind('.') {
        Some(dot) if dot > 0 => &name[..file_start + dot],
        _ => name,
    }
}

/// Where each item's mask is, found once when the loader starts.
#[derive(Debug)]
pub struct MaskIndex {
    storage: Storage,
    /// Per dataset item: the mask's key, or why it has none (an error naming both files).
    keys: Vec<std::result::Result<String, String>>,
    /// Masks carried in shards (`KEY.seg.*` members), by key (`SHARD#MEMBER`); empty for a folder of
    /// masks.
    members: HashMap<String, Member>,
}

impl MaskIndex {
    /// Lists `storage` and pairs each item name (`names[i]`: relative path of item `i`, `None` when the
    /// dataset records none; `sources[i]` names it in messages) with its mask.
    pub fn pair(
        storage: Storage,
        names: &[Option<String>],
        sources: &[PathBuf],
        naming: &MaskNaming,
    ) -> Result<MaskIndex> {
        let listing = storage.list()?;
        let mut by_stem: HashMap<&str, &str> = HashMap::new();
        for (key, _) in &listing.files {
            let ext = key.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
            if !ext.is_some_and(|e| MASK_EXTENSIONS.contains(&e.as_str())) {
                continue;
            }
            if let Some(other) = by_stem.insert(strip_extension(key), key) {
                return Err(Error::dataset(
                    storage.name(key),
                    format!(
                        "{} is the same mask in another format; a mask folder holds each mask once",
                        storage.name(other).display()
                    ),
                ));
            }
        }
        let keys = names
            .iter()
            .zip(sources)
            .map(|(name, source)| {
                let Some(name) = name else {
                    return Err(format!(
                        "{}: the dataset records no name for this item, so it has no mask",
                        source.display()
                    ));
                };
                let stem = naming
                    .stem_for(name)
                    .map_err(|why| format!("{}: no mask: {why}", source.display()))?;
                by_stem
                    .get(stem.as_str())
                    .map(|k| k.to_string())
                    .ok_or_else(|| match not_a_file(&storage, &stem) {
                        Some(why) => format!("{}: its mask {why}", source.display()),
                        None => format!(
                            "{}: its mask {} is missing",
                            source.display(),
                            stdx::Quoted(&format!(
                                "{}.{{{}}}",
                                storage.name(&stem).display(),
                                MASK_EXTENSIONS.join(",")
                            ))
                        ),
                    })
            })
            .collect();
        Ok(MaskIndex {
            storage,
            keys,
            members: HashMap::new(),
        })
    }

    /// The masks `shards` carries (each sample's `KEY.seg.*` member), paired with their items.
    pub fn carried(shards: &ShardSet) -> MaskIndex {
        use crate::dataset::Dataset;
        let storage = shards.storage().clone();
        let mut members = HashMap::new();
        let keys = (0..shards.len())
            .map(|i| match shards.carried(i, Carried::Mask) {
                Some(m) => {
                    let key = format!("{}#{}", m.shard, m.name);
                    members.insert(key.clone(), m);
                    Ok(key)
                }
                None => Err(format!(
                    "{}: its sample has no mask member (KEY.seg.png, KEY.seg.l3, ...)",
                    shards.source(i).display()
                )),
            })
            .collect();
        MaskIndex {
            storage,
            keys,
            members,
        }
    }

    /// The read layer the masks come through.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Item `index`'s mask key, or the error naming the image and the mask it lacks.
    pub fn key(&self, index: usize) -> Result<&str> {
        match &self.keys[index] {
            Ok(k) => Ok(k),
            Err(why) => Err(Error::dataset(self.storage.root(), why)),
        }
    }

    /// The items without a mask, with why.
    pub fn missing(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter_map(|k| k.as_ref().err().map(String::as_str))
    }

    /// The first paired mask's key, if any item has one.
    pub fn first_key(&self) -> Option<&str> {
        self.keys().next()
    }

    /// The paired masks' keys, in item order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter_map(|k| k.as_ref().ok().map(String::as_str))
    }

    /// The whole of mask `key`.
    pub fn read(&self, key: &str) -> Result<Vec<u8>> {
        let limit = crate::image::max_image_bytes().saturating_add(1 << 20);
        match self.members.get(key) {
            Some(m) => m.read(&self.storage, limit),
            None => self.storage.read(key, limit),
        }
    }

    /// What item `item`'s mask `key` contributes to the sample `req` asks for, with the bytes read: an
    /// L3 mask under a region-scoped request as L3 images are read (header, offset table — kept in
    /// `indexes` — and only the patches under the source rectangle the sample's nearest pick reads),
    /// any other mask whole.
    pub(crate) fn read_for(
        &self,
        item: usize,
        key: &str,
        req: &SampleRequest,
        indexes: &IndexCache,
    ) -> Result<(Stored, u64)> {
        let l3 = key
            .rsplit_once('.')
            .is_some_and(|(_, e)| e.eq_ignore_ascii_case("l3"));
        if l3 && req.scope == DecodeScope::Region {
            let pick = |w, h| picked(&req.geometry(w, h));
            if let Some(m) = self.members.get(key) {
                let file = self.storage.open_key(&m.shard)?;
                let check = |b: &[u8]| m.check_header(&self.storage, b);
                return read_rect_framed(
                    indexes,
                    item,
                    &file,
                    (m.offset, m.size),
                    pick,
                    &m.frame(&check),
                )
                .map_err(|e| in_member(e, &self.storage.name(&m.shard), &m.name));
            }
            let file = self.storage.open_key(key)?;
            let len = file.size()?;
            return read_rect(indexes, item, &file, (0, len), pick);
        }
        let bytes = self.read(key)?;
        // A carried mask's read took its tar header along.
        let header = if self.members.contains_key(key) {
            512
        } else {
            0
        };
        let n = bytes.len() as u64 + header;
        Ok((Stored::Whole(bytes), n))
    }

    /// Where mask `key` lives, for messages.
    pub fn name(&self, key: &str) -> PathBuf {
        self.storage.name(key)
    }
}

/// Why a local mask `stem` with one of the mask extensions is there but was not listed: it is a FIFO,
/// a device or a folder (the listing holds regular files only), named with what it is rather than
/// reported missing. `None` when there is no such entry (or the masks are not local).
fn not_a_file(storage: &Storage, stem: &str) -> Option<String> {
    let root = storage.local_root()?;
    MASK_EXTENSIONS.iter().find_map(|ext| {
        let path = root.join(format!("{stem}.{ext}"));
        std::fs::symlink_metadata(&path).ok()?;
        let why = stdx::fs::open_regular(&path).err()?;
        Some(format!("{} cannot be read: {why}", path.display()))
    })
}

/// The source rectangle a mask sample of geometry `g` picks from ([`Axis::nearest`](vocab::Axis::nearest)
/// is monotonic: its first and last kept outputs bound it).
pub fn picked(g: &Geometry) -> vocab::Rect {
    let span = |a: &vocab::Axis| {
        let lo = a.nearest(0);
        let hi = a.nearest(a.len.saturating_sub(1));
        (lo, hi - lo + 1)
    };
    let ((x, w), (y, h)) = (span(&g.x), span(&g.y));
    vocab::Rect::new(x, y, w, h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pair_by_path_and_stem_with_suffixes() {
        let cityscapes = MaskNaming {
            image_suffix: "_leftImg8bit".into(),
            mask_suffix: "_gtFine_labelIds".into(),
        };
        assert_eq!(
            cityscapes.stem_for("train/aachen/aachen_000000_000019_leftImg8bit.png"),
            Ok("train/aachen/aachen_000000_000019_gtFine_labelIds".into())
        );
        assert!(cityscapes.stem_for("train/a/b.png").is_err());
        let plain = MaskNaming::default();
        assert_eq!(plain.stem_for("a.b/c.d.l3"), Ok("a.b/c.d".into()));
        assert_eq!(strip_extension("dir.x/noext"), "dir.x/noext");
        assert_eq!(strip_extension(".hidden"), ".hidden");
    }

    #[test]
    fn pairing_finds_masks_in_any_format_and_names_both_files_when_one_lacks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/x_m.png"), b"").unwrap();
        std::fs::write(dir.path().join("a/y_m.l3"), b"").unwrap();
        let names = [
            Some("a/x.jpg".into()),
            Some("a/y.png".into()),
            Some("z.png".into()),
        ];
        let sources: Vec<PathBuf> = ["img/a/x.jpg", "img/a/y.png", "img/z.png"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let naming = MaskNaming {
            image_suffix: String::new(),
            mask_suffix: "_m".into(),
        };
        let idx = MaskIndex::pair(Storage::local(dir.path()), &names, &sources, &naming).unwrap();
        assert_eq!(idx.key(0).unwrap(), "a/x_m.png");
        assert_eq!(idx.key(1).unwrap(), "a/y_m.l3");
        let e = idx.key(2).unwrap_err().to_string();
        assert!(
            e.contains("img/z.png") && e.contains("z_m.{png,pgm,ppm,l3}"),
            "{e}"
        );
        std::fs::write(dir.path().join("a/x_m.pgm"), b"").unwrap();
        let e = MaskIndex::pair(Storage::local(dir.path()), &names, &sources, &naming)
            .unwrap_err()
            .to_string();
        assert!(e.contains("x_m.p") && e.contains("same mask"), "{e}");
    }

    /// An item name is the dataset's text (a Liquid dataset's `item-names.json`): however long, the
    /// message about its missing mask stays one bounded line.
    #[test]
    fn a_huge_item_name_gives_a_bounded_message() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("{}.png", "n".repeat(50_000));
        let names = [Some(long)];
        let sources = [PathBuf::from("shard-0@0+10 (item id 0)")];
        let idx = MaskIndex::pair(
            Storage::local(dir.path()),
            &names,
            &sources,
            &MaskNaming::default(),
        )
        .unwrap();
        let e = idx.key(0).unwrap_err().to_string();
        assert!(e.len() < 1_000, "{} bytes: {}", e.len(), &e[..300]);
        assert!(
            e.contains("more characters") && e.contains("is missing"),
            "{e}"
        );
    }
}
