//! Packing a folder of images into WebDataset tar shards with an index beside each (`loader/SHARDS.md`):
//! the objects an object store wants (a few hundred MB each instead of one per image), still readable
//! item by item ([`crate::ShardSet`]).
//!
//! Each image becomes a sample of members `KEY.EXT` (its bytes as they are: convert to L3 first for
//! region reads), `KEY.cls` (its label, decimal), and with targets `KEY.seg.EXT` (its mask, paired as the
//! loader pairs masks) and `KEY.json` (its COCO boxes as `{"boxes": [[x1, y1, x2, y2], ...], "labels":
//! [...]}`, source pixels). `KEY` is the image's relative path without its extension, with any other
//! `.` of the file name written `_` (WebDataset splits member names at the first dot of the file name);
//! the index keeps the image's name as it was. Samples are in the folder's order, so the shards list the
//! same items in the same order as the folder does.

use crate::Dataset;
use crate::dataset::ImageFolder;
use crate::dataset::masks::{MaskIndex, MaskNaming};
use crate::dataset::shards::index::{Member, Sample, ShardIndex, is_l3, l3_head, split_key};
use crate::dataset::shards::version::{Seen, ShardVersion};
use crate::dataset::shards::{INDEX_SUFFIX, tar};
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::targets::boxes::CocoBoxes;
use md5::{Digest, Md5};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// How [`to_shards`] packs.
#[derive(Clone, Debug)]
pub struct ShardBuild {
    /// Bytes per shard at most (a sample larger than this gets a shard of its own).
    pub shard_size: u64,
    /// Shard file names: `PREFIX-000000.tar`, ...
    pub prefix: String,
    /// A folder of masks, paired with the images by path and stem (written as `KEY.seg.EXT`).
    pub masks: Option<PathBuf>,
    pub mask_naming: MaskNaming,
    /// A COCO instances file whose boxes are written per image (`KEY.json`).
    pub boxes: Option<PathBuf>,
}

impl Default for ShardBuild {
    fn default() -> Self {
        ShardBuild {
            shard_size: 512_000_000,
            prefix: "shard".into(),
            masks: None,
            mask_naming: MaskNaming::default(),
            boxes: None,
        }
    }
}

/// What [`to_shards`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardSummary {
    pub shards: usize,
    pub samples: usize,
    /// Bytes of the shards and their indexes.
    pub bytes_written: u64,
    /// Shards (and indexes) of an earlier run past this run's last, removed.
    pub removed: usize,
    /// The shard set as a WebDataset pattern (`OUT/shard-{000000..000009}.tar`): what a loader opens.
    pub pattern: String,
}

/// One member to write: its name and where its bytes come from.
struct Pending {
    name: String,
    bytes: Vec<u8>,
}

/// Packs the images under `input` (labelled by sub-folder, as [`ImageFolder`] lists them) into shards in
/// `output`. Each shard is written under a temporary name and renamed, then its index beside it, so a
/// shard without its index (a killed run) is never a finished one; a re-run writes every shard again.
pub fn to_shards(input: &Path, output: &Path, build: &ShardBuild) -> Result<ShardSummary> {
    if build.shard_size < 10 * tar::BLOCK {
        return Err(Error::dataset(
            output,
            format!(
                "a shard size of {} bytes: give at least 5120",
                build.shard_size
            ),
        ));
    }
    if build.prefix.is_empty() || build.prefix.contains(['/', '{', '}', '.']) {
        return Err(Error::dataset(
            output,
            format!(
                "shard name prefix {:?}: a plain file name part",
                build.prefix
            ),
        ));
    }
    let folder = ImageFolder::open(input)?;
    std::fs::create_dir_all(output).map_err(|e| Error::io(output, e))?;
    let _lock = stdx::fs::DirLock::acquire(output).map_err(|e| Error::io(output, e))?;
    stdx::fs::remove_stale_temps(output).map_err(|e| Error::io(output, e))?;
    let names: Vec<Option<String>> = (0..folder.len()).map(|i| folder.name(i)).collect();
    let masks = match &build.masks {
        Some(dir) => {
            let sources: Vec<PathBuf> = (0..folder.len()).map(|i| folder.source(i)).collect();
            Some(MaskIndex::pair(
                Storage::local(dir),
                &names,
                &sources,
                &build.mask_naming,
            )?)
        }
        None => None,
    };
    let boxes = match &build.boxes {
        Some(path) => {
            let coco = CocoBoxes::open(path)?;
            Some(coco.match_items(&names, path, &folder.describe())?)
        }
        None => None,
    };
    let mut writer = Writer::new(output, build);
    let mut keys = HashSet::new();
    for i in 0..folder.len() {
        let name = names[i].clone().unwrap_or_default();
        let (key, ext) = key_of(&name);
        if !keys.insert(key.clone()) {
            return Err(Error::dataset(
                folder.source(i),
                format!(
                    "its shard key {key:?} is another image's too (names differing in . and _)"
                ),
            ));
        }
        let limit = crate::image::max_image_bytes().saturating_add(1 << 20);
        let path = folder.path(i);
        let image = stdx::fs::read_regular(path, limit).map_err(|e| Error::io(path, e))?;
        let mut members = vec![
            Pending {
                name: format!("{key}.{ext}"),
                bytes: image,
            },
            Pending {
                name: format!("{key}.cls"),
                bytes: folder.label(i).to_string().into_bytes(),
            },
        ];
        if let Some(m) = &masks {
            let mask_key = m.key(i)?;
            let mask_ext = mask_key.rsplit_once('.').map_or("png", |(_, e)| e);
            members.push(Pending {
                name: format!("{key}.seg.{mask_ext}"),
                bytes: m.read(mask_key)?,
            });
        }
        if let Some(b) = &boxes {
            let json = serde_json::json!({"boxes": b[i].boxes, "labels": b[i].labels});
            members.push(Pending {
                name: format!("{key}.json"),
                bytes: json.to_string().into_bytes(),
            });
        }
        let own_name = (format!("{key}.{ext}") != name).then_some(name);
        writer.add(key, own_name, folder.label(i), members)?;
    }
    writer.finish()
}

/// A shard's writer that hashes what goes through it (the shard's MD5, for its index).
struct Hashing<W> {
    out: W,
    md5: Md5,
}

impl<W> Hashing<W> {
    /// The MD5 of what was written, hex; the writer dropped.
    fn finish(self) -> String {
        drop(self.out);
        self.md5
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.md5.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Item name `a/b.c.png` → key `a/b_c` and extension `png`.
fn key_of(name: &str) -> (String, String) {
    let file_start = name.rfind('/').map_or(0, |i| i + 1);
    let (stem, ext) = match name[file_start..].rfind('.') {
        Some(dot) if dot > 0 => (&name[..file_start + dot], &name[file_start + dot + 1..]),
        _ => (name, "bin"),
    };
    let (dir, file) = stem.split_at(file_start);
    (format!("{dir}{}", file.replace('.', "_")), ext.to_string())
}

/// Shards being written: the current one's samples, sized as they will be in the tar.
struct Writer<'a> {
    output: &'a Path,
    build: &'a ShardBuild,
    samples: Vec<(String, Option<String>, u32, Vec<Pending>)>,
    bytes: u64,
    summary: ShardSummary,
}

impl<'a> Writer<'a> {
    fn new(output: &'a Path, build: &'a ShardBuild) -> Self {
        Writer {
            output,
            build,
            samples: Vec::new(),
            bytes: 0,
            summary: ShardSummary::default(),
        }
    }

    /// Adds a sample, first finishing the shard it would take past the shard size.
    fn add(
        &mut self,
        key: String,
        name: Option<String>,
        label: u32,
        members: Vec<Pending>,
    ) -> Result<()> {
        let mut size = 0;
        for m in &members {
            let header = tar::file_header(&m.name, m.bytes.len() as u64)
                .map_err(|e| Error::dataset(self.output, e))?;
            size += header.len() as u64 + tar::padded(m.bytes.len() as u64);
        }
        if !self.samples.is_empty() && self.bytes + size + tar::END as u64 > self.build.shard_size {
            self.write_shard()?;
        }
        self.samples.push((key, name, label, members));
        self.bytes += size;
        Ok(())
    }

    /// Writes the current shard, then its index (with each L3 member's head, and the shard's
    /// modification time and MD5: the versions of it the heads are for).
    fn write_shard(&mut self) -> Result<()> {
        let file_name = format!("{}-{:06}.tar", self.build.prefix, self.summary.shards);
        let path = self.output.join(&file_name);
        let io = |e: std::io::Error| Error::io(&path, e);
        let mut file = stdx::fs::AtomicFile::create(&path).map_err(io)?;
        let mut out = Hashing {
            out: std::io::BufWriter::with_capacity(1 << 20, file.file()),
            md5: Md5::new(),
        };
        let mut index = ShardIndex::new(&file_name, 0);
        let mut at = 0u64;
        for (key, name, label, members) in self.samples.drain(..) {
            let mut sample = Sample {
                key,
                name,
                label: Some(label),
                members: Vec::with_capacity(members.len()),
            };
            for m in members {
                debug_assert_eq!(split_key(&m.name).map(|k| k.0), Some(sample.key.as_str()));
                let header = tar::file_header(&m.name, m.bytes.len() as u64)
                    .map_err(|e| Error::dataset(&path, e))?;
                out.write_all(&header).map_err(io)?;
                out.write_all(&m.bytes).map_err(io)?;
                let pad = tar::padded(m.bytes.len() as u64) - m.bytes.len() as u64;
                out.write_all(&vec![0u8; pad as usize]).map_err(io)?;
                at += header.len() as u64;
                let size = m.bytes.len() as u64;
                sample.members.push(Member {
                    head: is_l3(&m.name).then(|| l3_head(&m.bytes, size)).flatten(),
                    name: m.name,
                    offset: at,
                    size,
                });
                at += tar::padded(m.bytes.len() as u64);
            }
            self.summary.samples += 1;
            index.samples.push(sample);
        }
        out.write_all(&[0u8; tar::END]).map_err(io)?;
        out.flush().map_err(io)?;
        let md5 = out.finish();
        file.commit().map_err(io)?;
        index.size = at + tar::END as u64;
        // The renamed file keeps the time it was written at; a copy (or an upload) of it is another
        // version, whose heads are read from it unless it is byte for byte this one on an object
        // store that gives single-part uploads their MD5 as ETag.
        let modified_ns = match Seen::of(&Storage::local(self.output), &file_name) {
            Seen::Local { modified_ns } => Some(modified_ns),
            _ => None,
        };
        index.shard_version = Some(ShardVersion {
            modified_ns,
            etag: None,
            md5: Some(md5),
        });
        let bytes = index.to_bytes();
        let index_path = self.output.join(format!("{file_name}{INDEX_SUFFIX}"));
        stdx::fs::write_atomic(&index_path, &bytes).map_err(|e| Error::io(&index_path, e))?;
        self.summary.shards += 1;
        self.summary.bytes_written += index.size + bytes.len() as u64;
        self.bytes = 0;
        Ok(())
    }

    /// Writes the last shard and removes the shards an earlier run wrote past it.
    fn finish(mut self) -> Result<ShardSummary> {
        if !self.samples.is_empty() {
            self.write_shard()?;
        }
        let n = self.summary.shards;
        let prefix = format!("{}-", self.build.prefix);
        let entries = std::fs::read_dir(self.output).map_err(|e| Error::io(self.output, e))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let number = name
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix(INDEX_SUFFIX).or(Some(r)))
                .and_then(|r| r.strip_suffix(".tar"))
                .filter(|d| d.len() == 6)
                .and_then(|d| d.parse::<usize>().ok());
            if number.is_some_and(|k| k >= n) {
                std::fs::remove_file(e.path()).map_err(|err| Error::io(e.path(), err))?;
                self.summary.removed += 1;
            }
        }
        self.summary.pattern = format!(
            "{}/{}-{{{:06}..{:06}}}.tar",
            self.output.display(),
            self.build.prefix,
            0,
            n.saturating_sub(1)
        );
        Ok(self.summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_folders_and_lose_inner_dots() {
        assert_eq!(key_of("a.b/c.d.png"), ("a.b/c_d".into(), "png".into()));
        assert_eq!(key_of("x.l3"), ("x".into(), "l3".into()));
    }
}
