//! A shard's index: where each member's data lies in the tar, grouped into samples by WebDataset's key
//! rule — what makes a shard randomly accessible. The format is specified in `loader/SHARDS.md`: a JSON
//! file `NAME.tar.idx` beside `NAME.tar`, written by the shard writer after its shard, or built here by
//! scanning the tar's headers (shards other tools wrote) and kept where [`super::cache`] says.

use super::tar;
use super::version::ShardVersion;
use crate::error::{Error, Result};
use crate::storage::Opened;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The `format` field of every index.
pub const FORMAT: &str = "l3-shard-index";
/// The version this build writes. Version 2 added the shard's version and the L3 members' heads;
/// version-1 indexes (without them) are read too.
pub const VERSION: u32 = 2;
/// The index versions this build reads.
const READS: [u32; 2] = [1, 2];
/// Largest head (an L3 member's header and offset table) an index carries; a member with a larger one
/// has its head read from the shard, as without an index of version 2.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// What an index's file name adds to its shard's.
pub const SUFFIX: &str = ".idx";
/// Index files larger than this are refused before being read.
pub const MAX_INDEX_BYTES: u64 = 1 << 30;

/// Bytes read per request while scanning a tar for its headers: members smaller than this are read
/// through (their headers lie in the same chunk), larger ones are skipped over.
const SCAN_CHUNK: u64 = 4 << 20;

/// Largest `.cls` member whose text is read as a label while scanning.
const MAX_LABEL_BYTES: u64 = 64;

/// One shard's index.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShardIndex {
    pub format: String,
    pub version: u32,
    /// The shard's file name.
    pub shard: String,
    /// The shard's size in bytes: an index whose shard has another size is not its index.
    pub size: u64,
    /// The version of the shard this index describes: its heads are used only for that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_version: Option<ShardVersion>,
    pub samples: Vec<Sample>,
}

/// The members of one key, in tar order.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    pub key: String,
    /// The item's name in the dataset it was written from (`photo/a.b.l3`) where it differs from the
    /// image member's: what pairs it with targets and identifies it in a resume state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The class label (the `.cls` member's number); `None` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<u32>,
    pub members: Vec<Member>,
}

/// Where one member's data lies.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Member {
    pub name: String,
    /// Byte offset of the data (a multiple of 512; its header is the 512 bytes before it).
    pub offset: u64,
    pub size: u64,
    /// An L3 member's first bytes up to the end of its offset table (what a region read needs before
    /// the patches), base64 in the file.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "base64_bytes"
    )]
    pub head: Option<Vec<u8>>,
}

/// `head` as standard base64 text.
mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_str(&STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("not base64: {e}")))
    }
}

/// The head of the L3 file `data` (of `size` bytes; `data` its first bytes, as many as are at hand)
/// an index records: its prefix — header, tables, offset table — when `data` holds all of it, it is at
/// most [`MAX_HEAD_BYTES`] and it parses.
pub fn l3_head(data: &[u8], size: u64) -> Option<Vec<u8>> {
    let n = l3_format::L3Index::prefix_len(data).ok()?;
    if n > MAX_HEAD_BYTES || n > data.len() {
        return None;
    }
    l3_format::L3Index::parse(&data[..n], size).ok()?;
    Some(data[..n].to_vec())
}

/// Whether member `name` is an L3 file (its extension's last part `l3`: `KEY.l3`, `KEY.seg.l3`).
pub fn is_l3(name: &str) -> bool {
    name.rsplit_once('.')
        .is_some_and(|(_, e)| e.eq_ignore_ascii_case("l3"))
}

/// WebDataset's split of a member name into key and extension: the extension starts at the first `.`
/// of the file name (`a/b.seg.l3` → `a/b`, `seg.l3`). `None` for names with no such dot (`README`,
/// `.hidden`), which belong to no sample.
pub fn split_key(name: &str) -> Option<(&str, &str)> {
    let file_start = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[file_start..].find('.')?;
    (dot > 0).then(|| (&name[..file_start + dot], &name[file_start + dot + 1..]))
}

impl ShardIndex {
    /// An empty index of shard `shard` (its file name) of `size` bytes.
    pub fn new(shard: &str, size: u64) -> Self {
        ShardIndex {
            format: FORMAT.into(),
            version: VERSION,
            shard: shard.into(),
            size,
            shard_version: None,
            samples: Vec::new(),
        }
    }

    /// The index in `bytes`, read from `path` (named in errors).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let index: ShardIndex = serde_path_to_error::deserialize(de).map_err(|e| {
            Error::dataset(
                path,
                format!("not a shard index: at {}: {}", e.path(), e.inner()),
            )
        })?;
        if index.format != FORMAT || !READS.contains(&index.version) {
            return Err(Error::dataset(
                path,
                format!(
                    "a shard index of format {:?} version {} (this build reads {FORMAT:?} versions \
                     1 and {VERSION})",
                    index.format, index.version
                ),
            ));
        }
        Ok(index)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Checks the index against its shard `shard` (named in errors) as listed, `size` bytes: the same
    /// size, every member inside it at a block boundary after its header, members in ascending order
    /// without overlaps, and each member under its sample's key.
    pub fn check(&self, shard: &Path, size: u64) -> Result<()> {
        let bad = |member: Option<&str>, reason: String| Error::shard(shard, member, reason);
        if self.size != size {
            return Err(bad(
                None,
                format!(
                    "its index says {} bytes but the shard has {size}: the index belongs to another \
                     version of the shard (delete the index to rebuild it)",
                    self.size
                ),
            ));
        }
        let mut end = 0;
        for s in &self.samples {
            if s.members.is_empty() {
                return Err(bad(
                    None,
                    format!("the index lists key {:?} without members", s.key),
                ));
            }
            for m in &s.members {
                let within = m.offset.checked_add(m.size).is_some_and(|e| e <= size);
                if m.offset % tar::BLOCK != 0 || m.offset < end + tar::BLOCK || !within {
                    return Err(bad(
                        Some(&m.name),
                        format!(
                            "the index places it at bytes {}..{} (the data must start at a block \
                             boundary after the previous member and end within the shard's {size} \
                             bytes)",
                            m.offset,
                            m.offset.saturating_add(m.size)
                        ),
                    ));
                }
                if let Some(h) = &m.head
                    && (h.len() > MAX_HEAD_BYTES || h.len() as u64 > m.size)
                {
                    return Err(bad(
                        Some(&m.name),
                        format!(
                            "the index holds a head of {} bytes for a member of {} (at most the \
                             member and {MAX_HEAD_BYTES} bytes)",
                            h.len(),
                            m.size
                        ),
                    ));
                }
                if split_key(&m.name).map(|(k, _)| k) != Some(s.key.as_str()) {
                    return Err(bad(
                        Some(&m.name),
                        format!("listed under key {:?}, which is not its key", s.key),
                    ));
                }
                end = m.offset + tar::padded(m.size);
            }
        }
        Ok(())
    }

    /// Builds the index of the tar `file` (`size` bytes, named `shard`) by reading its headers in
    /// order: PAX and GNU long names are followed, members that are not regular files and names without
    /// a key are left out, `.cls` members are read for labels. Members of one key must be consecutive
    /// (as WebDataset reads them); a key that comes back later, a damaged header or a member running
    /// past the end is an error naming the shard and the member. An L3 member's head is recorded when
    /// the chunk that held its header holds it too (no read of its own).
    pub fn build(file: &Opened, size: u64, shard: &str) -> Result<ShardIndex> {
        let name = file.name();
        let bad = |member: Option<&str>, reason: String| Error::shard(&name, member, reason);
        let mut scan = Scan {
            file,
            size,
            buf: Vec::new(),
            start: 0,
        };
        let mut index = ShardIndex::new(shard, size);
        let mut seen = std::collections::HashSet::new();
        let (mut long_name, mut long_size): (Option<String>, Option<u64>) = (None, None);
        let mut at = 0u64;
        loop {
            if at + tar::BLOCK > size {
                return Err(bad(
                    None,
                    format!("ends at byte {size} without tar's end-of-archive blocks (truncated?)"),
                ));
            }
            let block = scan.bytes(at, tar::BLOCK)?;
            if tar::is_zero(block) {
                break;
            }
            let header = tar::parse(block).map_err(|e| bad(None, format!("at byte {at}: {e}")))?;
            let data = at + tar::BLOCK;
            let member_size = if header.is_file() {
                long_size.take().unwrap_or(header.size)
            } else {
                header.size
            };
            let member = match (header.is_file(), &long_name) {
                (true, Some(n)) => n.clone(),
                _ => header.name.clone(),
            };
            let next = data
                .checked_add(tar::padded(member_size))
                .filter(|&n| n <= size)
                .ok_or_else(|| {
                    bad(
                        Some(&member),
                        format!(
                            "{member_size} bytes at byte {data} run past the shard's end ({size} \
                             bytes): truncated"
                        ),
                    )
                })?;
            match header.kind {
                b'x' => {
                    let records = scan.bytes(data, member_size)?;
                    let (path, psize) = tar::pax_fields(records)
                        .map_err(|e| bad(None, format!("at byte {at}: {e}")))?;
                    long_name = path.or(long_name);
                    long_size = psize.or(long_size);
                }
                b'L' => {
                    let text = scan.bytes(data, member_size)?;
                    let end = text.iter().position(|&c| c == 0).unwrap_or(text.len());
                    long_name = Some(String::from_utf8_lossy(&text[..end]).into_owned());
                }
                _ if header.is_file() => {
                    long_name = None;
                    if let Some((key, ext)) = split_key(&member) {
                        let head = is_l3(&member)
                            .then(|| l3_head(scan.held(data, member_size), member_size))
                            .flatten();
                        let entry = Member {
                            name: member.clone(),
                            offset: data,
                            size: member_size,
                            head,
                        };
                        let label = if ext == "cls" && member_size <= MAX_LABEL_BYTES {
                            Some(parse_label(scan.bytes(data, member_size)?, &name, &member)?)
                        } else {
                            None
                        };
                        match index.samples.last_mut() {
                            Some(s) if s.key == key => s.members.push(entry),
                            _ => {
                                if !seen.insert(key.to_string()) {
                                    return Err(bad(
                                        Some(&member),
                                        format!(
                                            "key {key:?} comes back after other keys (a sample's \
                                             members are consecutive in a shard)"
                                        ),
                                    ));
                                }
                                index.samples.push(Sample {
                                    key: key.to_string(),
                                    name: None,
                                    label: None,
                                    members: vec![entry],
                                });
                            }
                        }
                        if let (Some(l), Some(s)) = (label, index.samples.last_mut()) {
                            s.label = Some(l);
                        }
                    }
                }
                _ => {
                    long_name = None;
                    long_size = None;
                }
            }
            at = next;
        }
        Ok(index)
    }
}

/// A `.cls` member's text as a label: a decimal number, surrounding whitespace allowed.
pub fn parse_label(bytes: &[u8], shard: &Path, member: &str) -> Result<u32> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| {
            Error::shard(
                shard,
                Some(member),
                format!(
                    "a class label must be a decimal number, not {:?}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(32)])
                ),
            )
        })
}

/// A tar read front to back in chunks of [`SCAN_CHUNK`] (one request each).
struct Scan<'a, 'b> {
    file: &'a Opened<'b>,
    size: u64,
    buf: Vec<u8>,
    /// Offset of `buf[0]` in the file.
    start: u64,
}

impl Scan<'_, '_> {
    /// The bytes from `at` up to `at + len` that the chunk held has (none when it does not start there).
    fn held(&self, at: u64, len: u64) -> &[u8] {
        let end = self.start + self.buf.len() as u64;
        if at < self.start || at >= end {
            return &[];
        }
        let from = (at - self.start) as usize;
        let to = (at.saturating_add(len)).min(end);
        &self.buf[from..(to - self.start) as usize]
    }

    /// Bytes `at .. at + len` (within the file), reading the chunk that starts at `at` when they are not
    /// in the one held.
    fn bytes(&mut self, at: u64, len: u64) -> Result<&[u8]> {
        let held = self.start..self.start + self.buf.len() as u64;
        if at < held.start || at + len > held.end {
            let end = (at + len.max(SCAN_CHUNK)).min(self.size);
            self.buf = self.file.read_range(at..end)?;
            self.start = at;
        }
        let from = (at - self.start) as usize;
        Ok(&self.buf[from..from + len as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_at_the_first_dot_of_the_file_name() {
        assert_eq!(split_key("a.b/c.seg.l3"), Some(("a.b/c", "seg.l3")));
        assert_eq!(split_key("x.cls"), Some(("x", "cls")));
        assert_eq!(split_key("dir/README"), None);
        assert_eq!(split_key("dir/.hidden"), None);
    }
}
