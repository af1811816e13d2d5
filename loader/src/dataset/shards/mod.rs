//! A set of WebDataset tar shards read with random access: each shard's index (`NAME.tar.idx`, see
//! `loader/SHARDS.md`) says where every member's data lies, so an item is one byte-range read of its
//! shard — its tar header and its data together, the header checked against the index — and an L3
//! member under a crop is read by region inside the shard (its header, offset table and the patches
//! under the window only). Where the index carries the member's head (its L3 header and offset table)
//! and describes this very version of the shard ([`version`]), that region read is a single request
//! from the first epoch on. Shards written by other tools open too: their index is built on first open
//! by reading the tar's headers, and kept (see [`cache`]).
//!
//! Items are the samples of the shards in order (shards as the pattern or the sorted listing gives
//! them, samples in tar order), so shards written from a folder list its items in the folder's order,
//! with the folder's names, sizes and labels: the same seeded order, and the same resume fingerprint.

mod cache;
pub(crate) mod index;
pub(crate) mod pattern;
pub(crate) mod tar;
pub(crate) mod version;

use super::Dataset;
use super::regions::{Frame, IndexCache, read_region_framed};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{SampleRequest, Stored};
use crate::sample::DecodeScope;
use crate::storage::{Storage, StorageOptions};
use index::{ShardIndex, split_key};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use version::Seen;

pub use index::SUFFIX as INDEX_SUFFIX;

/// Bytes of an L3 member read with its header: its offset table too, for images up to a few megapixels
/// (a 384² image's table is a few hundred bytes, a 4K image's about 20 KiB), so that the first region
/// read of a member is usually two requests (prefix, patches) and every later one a single request.
/// More would move bytes that a crop does not need for the small images training sets hold.
const PREFIX_READ_AHEAD: u64 = 8 << 10;

/// Offset tables of L3 members kept for region reads, per shard set.
const INDEX_CACHE_BYTES: usize = 64 << 20;

/// Heads of L3 members (from the indexes) a shard set holds at most: past it, members' heads are read
/// from the shards as without them, so that a huge set does not hold gigabytes of heads.
const HEADS_BYTES: usize = 512 << 20;

/// The items of a set of tar shards (see the module documentation).
#[derive(Debug)]
pub struct ShardSet {
    storage: Storage,
    /// What the set was opened as (a pattern, a folder), for messages.
    location: String,
    shards: Vec<Shard>,
    items: Vec<ShardItem>,
    bytes: u64,
    /// Indexes built by scanning tars when the set was opened (none found beside them or kept).
    built: usize,
    /// Shards whose index carries heads but describes another version of the shard: their heads are
    /// read from the shard.
    stale: usize,
    indexes: IndexCache,
}

#[derive(Debug)]
struct Shard {
    key: String,
}

#[derive(Debug)]
struct ShardItem {
    shard: u32,
    /// The item's name in its dataset (`photo/a.l3`).
    name: String,
    /// The image member's name in the tar.
    member: String,
    label: u32,
    format: Format,
    offset: u64,
    size: u64,
    /// The image member's head, when its index carries it and describes this shard.
    head: Option<Arc<[u8]>>,
    /// The sample's mask member (`KEY.seg.*`) and boxes member (`KEY.json`), if it has them.
    mask: Option<MemberSpan>,
    boxes: Option<MemberSpan>,
}

/// Where a member's data lies in its shard.
#[derive(Clone, Debug)]
struct MemberSpan {
    name: String,
    offset: u64,
    size: u64,
    head: Option<Arc<[u8]>>,
}

/// A target a sample carries as a member of its own (`masks=@shards`, `boxes=@shards`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carried {
    /// `KEY.seg.EXT`: its label map.
    Mask,
    /// `KEY.json`: its boxes.
    Boxes,
}

/// A member of a shard, located: what a target carried in a shard set is read from.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    /// The shard's key under the set's storage.
    pub shard: String,
    /// The member's name in the tar (`c/img_0.seg.l3`).
    pub name: String,
    pub offset: u64,
    pub size: u64,
    /// An L3 member's head from the index (used only when the index describes this shard).
    pub head: Option<Arc<[u8]>>,
}

impl Member {
    /// Where the member lives, for messages: `SHARD#MEMBER`, as items are named.
    pub fn source(&self, storage: &Storage) -> PathBuf {
        let mut s = storage.name(&self.shard).into_os_string();
        s.push(format!("#{}", self.name));
        s.into()
    }

    /// Checks `block`, the 512 bytes before the member's data, against where the index puts it: a tar
    /// header (checksum) naming this member with its size.
    pub fn check_header(&self, storage: &Storage, block: &[u8]) -> Result<()> {
        let shard = storage.name(&self.shard);
        let bad = |why: String| Error::shard(&shard, Some(&self.name), why);
        let h = tar::parse(block).map_err(|e| {
            bad(format!(
                "no tar header at byte {} where the index puts it: {e} (the index disagrees with \
                 the shard)",
                self.offset - tar::BLOCK
            ))
        })?;
        if !h.is_file() || !tar::names(&h, &self.name) || h.size != self.size {
            return Err(bad(format!(
                "the tar header before byte {} names {:?} of {} bytes, not this member of {} bytes \
                 (the index disagrees with the shard)",
                self.offset, h.name, h.size, self.size
            )));
        }
        Ok(())
    }

    /// The member's data, over at most `limit` bytes refused: one read of its header and data
    /// together, the header checked.
    pub fn read(&self, storage: &Storage, limit: u64) -> Result<Vec<u8>> {
        let shard = storage.name(&self.shard);
        if self.size > limit {
            return Err(Error::shard(
                &shard,
                Some(&self.name),
                format!("{} bytes, over the limit of {limit} bytes", self.size),
            ));
        }
        let file = storage.open_key(&self.shard)?;
        let mut bytes = file
            .read_range(self.offset - tar::BLOCK..self.offset + self.size)
            .map_err(|e| in_member(e, &shard, &self.name))?;
        self.check_header(storage, &bytes[..tar::BLOCK as usize])?;
        bytes.drain(..tar::BLOCK as usize);
        Ok(bytes)
    }

    /// The frame an L3 member's region reads check: its tar header, read with its L3 header — or,
    /// where the index gave its head, nothing read before the patches.
    pub fn frame<'a>(&'a self, check: &'a dyn Fn(&[u8]) -> Result<()>) -> Frame<'a> {
        Frame {
            len: tar::BLOCK,
            check,
            read_ahead: PREFIX_READ_AHEAD,
            head: self.head.as_deref(),
        }
    }
}

/// `e`, an error reading member `member` of `shard`, as an error naming both.
pub(crate) fn in_member(e: Error, shard: &Path, member: &str) -> Error {
    match e {
        e @ Error::Shard { .. } => e,
        e => {
            let text = e.to_string();
            let head = format!("{}: ", shard.display());
            let reason = text.strip_prefix(&head).unwrap_or(&text);
            Error::shard(shard, Some(member), reason)
        }
    }
}

impl ShardSet {
    /// Opens `location`: `DIR/NAME-{000000..000099}.tar`, one `x.tar`, or a folder holding `*.tar`
    /// files — local or `s3://bucket/prefix/...` — read through `options`.
    pub fn open(location: &str, options: &StorageOptions) -> Result<Self> {
        if pattern::names_shards(location) {
            let (dir, names) = pattern::split(location).map_err(|e| Error::dataset(location, e))?;
            let storage = Storage::open(&dir, options)?;
            Self::open_in(storage, Some(names), location)
        } else {
            Self::open_in(Storage::open(location, options)?, None, location)
        }
    }

    /// The shards `names` (keys under `storage`'s root; `None`: every `*.tar` the root holds, sorted).
    pub(crate) fn open_in(
        storage: Storage,
        names: Option<Vec<String>>,
        location: &str,
    ) -> Result<Self> {
        let listed: HashMap<String, u64> = storage.list()?.files.into_iter().collect();
        let names = match names {
            Some(n) => n,
            None => {
                let mut n: Vec<String> = listed
                    .keys()
                    .filter(|k| k.ends_with(".tar"))
                    .cloned()
                    .collect();
                n.sort();
                n
            }
        };
        if names.is_empty() {
            return Err(Error::dataset(location, "no .tar shards found"));
        }
        let mut set = ShardSet {
            storage,
            location: location.to_string(),
            shards: Vec::with_capacity(names.len()),
            items: Vec::new(),
            bytes: 0,
            built: 0,
            stale: 0,
            indexes: IndexCache::new(INDEX_CACHE_BYTES),
        };
        let mut heads_left = HEADS_BYTES;
        let mut owners: HashMap<String, String> = HashMap::new();
        for key in names {
            let name = set.storage.name(&key);
            let size = *listed
                .get(&key)
                .ok_or_else(|| Error::shard(&name, None, "no such shard"))?;
            let beside = format!("{key}{INDEX_SUFFIX}");
            let index = if listed.contains_key(&beside) {
                let bytes = set.storage.read(&beside, index::MAX_INDEX_BYTES)?;
                ShardIndex::parse(&bytes, &set.storage.name(&beside))?
            } else {
                let (index, built) = cache::built_index(&set.storage, &key, size)?;
                set.built += usize::from(built);
                index
            };
            index.check(&name, size)?;
            let has_heads = index
                .samples
                .iter()
                .any(|s| s.members.iter().any(|m| m.head.is_some()));
            let fresh = index
                .shard_version
                .as_ref()
                .is_some_and(|v| v.describes(&Seen::of(&set.storage, &key)));
            set.stale += usize::from(has_heads && !fresh);
            let heads = (has_heads && fresh).then_some(&mut heads_left);
            let s = set.shards.len() as u32;
            set.add_samples(s, &key, &index, &mut owners, heads)?;
            set.shards.push(Shard { key });
        }
        if set.stale > 0 {
            // Once per open, as the loader's other fallbacks say so: reads stay correct, one request
            // more on each L3 member's first region read.
            eprintln!(
                "l3 loader: note: {} of {} shards of {location} changed since their index was written \
                 (modification time or ETag): their L3 members' heads are read from the shards, not \
                 taken from the index (delete such an index to rebuild it)",
                set.stale,
                set.shards.len()
            );
        }
        if set.items.is_empty() {
            return Err(Error::dataset(location, "the shards hold no images"));
        }
        Ok(set)
    }

    /// Adds the samples of shard `s` (`key`) as items: each needs an image member (`KEY.l3`, `KEY.png`,
    /// ...; masks `KEY.seg.*` are not images), and a key may be in one shard only (`owners`: the shard
    /// of each key so far). Members' heads are kept while `heads` (the bytes of heads the set may still
    /// hold; `None`: the index's are not to be used) lasts.
    fn add_samples(
        &mut self,
        s: u32,
        key: &str,
        index: &ShardIndex,
        owners: &mut HashMap<String, String>,
        mut heads: Option<&mut usize>,
    ) -> Result<()> {
        let here = self.storage.name(key);
        for sample in &index.samples {
            if let Some(other) = owners.insert(sample.key.clone(), key.to_string()) {
                return Err(Error::shard(
                    &here,
                    None,
                    format!(
                        "key {:?} is in {} too: a key names one sample of a shard set",
                        sample.key,
                        self.storage.name(&other).display()
                    ),
                ));
            }
            let image = sample.members.iter().find_map(|m| {
                let (_, ext) = split_key(&m.name)?;
                if ext.starts_with("seg.") {
                    return None;
                }
                Format::from_path(Path::new(&m.name)).map(|f| (m, f))
            });
            let Some((m, format)) = image else {
                return Err(Error::shard(
                    &here,
                    None,
                    format!("key {:?} has no image member", sample.key),
                ));
            };
            let mut head = |m: &index::Member| {
                let h = m.head.as_deref()?;
                let left = heads.as_deref_mut()?;
                *left = left.checked_sub(h.len())?;
                Some(Arc::<[u8]>::from(h))
            };
            let mut span = |m: &index::Member| MemberSpan {
                name: m.name.clone(),
                offset: m.offset,
                size: m.size,
                head: head(m),
            };
            let carried = |want: Carried| {
                sample.members.iter().find(|m| {
                    split_key(&m.name).is_some_and(|(_, ext)| match want {
                        Carried::Mask => ext.starts_with("seg."),
                        Carried::Boxes => ext == "json",
                    })
                })
            };
            self.bytes += m.size;
            let image = span(m);
            self.items.push(ShardItem {
                mask: carried(Carried::Mask).map(&mut span),
                boxes: carried(Carried::Boxes).map(&mut span),
                shard: s,
                name: sample.name.clone().unwrap_or_else(|| m.name.clone()),
                member: m.name.clone(),
                label: sample.label.unwrap_or(0),
                format,
                offset: m.offset,
                size: m.size,
                head: image.head,
            });
        }
        Ok(())
    }

    /// Shards in the set.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Indexes built by reading tar headers when the set was opened (0 when every shard had one).
    pub fn indexes_built(&self) -> usize {
        self.built
    }

    /// Shards whose index carries L3 heads but was written for another version of the shard (the file
    /// touched or rewritten, the object replaced): their members' heads are read from the shard.
    pub fn stale_indexes(&self) -> usize {
        self.stale
    }

    /// The read layer the shards come through (its request and byte counts).
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The image member of item `index`, located.
    fn image(&self, index: usize) -> Member {
        let item = &self.items[index];
        Member {
            shard: self.shards[item.shard as usize].key.clone(),
            name: item.member.clone(),
            offset: item.offset,
            size: item.size,
            head: item.head.clone(),
        }
    }

    /// Item `index`'s member carrying `what`, if its sample has one.
    pub(crate) fn carried(&self, index: usize, what: Carried) -> Option<Member> {
        let item = &self.items[index];
        let span = match what {
            Carried::Mask => item.mask.as_ref(),
            Carried::Boxes => item.boxes.as_ref(),
        }?;
        Some(Member {
            shard: self.shards[item.shard as usize].key.clone(),
            name: span.name.clone(),
            offset: span.offset,
            size: span.size,
            head: span.head.clone(),
        })
    }
}

impl Dataset for ShardSet {
    fn len(&self) -> usize {
        self.items.len()
    }
    fn label(&self, index: usize) -> u32 {
        self.items[index].label
    }
    fn format(&self, index: usize) -> Format {
        self.items[index].format
    }
    fn name(&self, index: usize) -> Option<String> {
        Some(self.items[index].name.clone())
    }
    fn source(&self, index: usize) -> PathBuf {
        let item = &self.items[index];
        let mut s = self
            .storage
            .name(&self.shards[item.shard as usize].key)
            .into_os_string();
        s.push(format!("#{}", item.member));
        s.into()
    }
    fn stored_len(&self, index: usize) -> Option<u64> {
        Some(self.items[index].size)
    }
    fn stored_bytes(&self) -> u64 {
        self.bytes
    }
    /// One request: the member's tar header and data together (the header checked), or — an L3 member
    /// under a crop — the patches under the window, after its header and offset table (from the index
    /// where it carries them for this shard, else read with the tar header on the member's first read).
    fn read(&self, index: usize, req: &SampleRequest) -> Result<(Stored, u64)> {
        let item = &self.items[index];
        let image = self.image(index);
        let limit = crate::image::max_image_bytes().saturating_add(1 << 20);
        if item.format == Format::L3 && req.scope == DecodeScope::Region {
            let file = self.storage.open_key(&image.shard)?;
            let check = |b: &[u8]| image.check_header(&self.storage, b);
            return read_region_framed(
                &self.indexes,
                index,
                &file,
                (item.offset, item.size),
                req,
                &image.frame(&check),
            )
            .map_err(|e| in_member(e, &self.storage.name(&image.shard), &item.member));
        }
        let bytes = image.read(&self.storage, limit)?;
        let n = bytes.len() as u64 + tar::BLOCK;
        Ok((Stored::Whole(bytes), n))
    }
    fn describe(&self) -> String {
        format!(
            "shard set {} ({} images in {} shards)",
            self.location,
            self.items.len(),
            self.shards.len()
        )
    }
    fn storage(&self) -> Option<&Storage> {
        Some(&self.storage)
    }
    fn shard_set(&self) -> Option<&ShardSet> {
        Some(self)
    }
}
