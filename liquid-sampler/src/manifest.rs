//! The multi-format dataset on disk: a CBOR manifest beside packed data files (layout in SPEC.md).

use crate::error::{Error, Result, cbor_message, io};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The manifest's file name inside a dataset folder.
pub const MANIFEST_NAME: &str = "manifest.cbor";
/// Every item starts on this boundary in its data file, so `O_DIRECT` can read it into an aligned buffer.
pub const ALIGN: u64 = 4096;
const MAGIC: &str = "liquid-dataset";
/// Manifests larger than this are refused before being read (about 20 million items).
const MAX_MANIFEST_BYTES: u64 = 4 << 30;
const VERSION: u32 = 1;

/// Whether a format costs CPU to decode (compressed) or disk bandwidth to load (raw pixels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FormatKind {
    Compressed,
    Raw,
}

/// One storage format of the dataset: a tag (`png`, `jpeg`, `l3`, `raw`, ...) and its kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormatSpec {
    pub tag: String,
    pub kind: FormatKind,
}

/// Decoded size of an item; raw items hold exactly `width * height * channels` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dims {
    pub width: u32,
    pub height: u32,
    pub channels: u8,
}

impl Dims {
    pub fn decoded_len(&self) -> u64 {
        (self.width as u64)
            .saturating_mul(self.height as u64)
            .saturating_mul(self.channels as u64)
    }
}

/// Where an item's bytes are: `length` bytes at `offset` of data file number `file`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub file: u32,
    pub offset: u64,
    pub length: u64,
}

/// One dataset item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub id: u64,
    pub label: u32,
    /// Index into [`Manifest::formats`].
    pub format: u16,
    pub location: Location,
    pub dims: Dims,
}

/// A packed data file holding items of one format, and its length when it was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFile {
    /// File name relative to the dataset folder.
    pub name: String,
    pub format: u16,
    pub len: u64,
}

/// The mixing ratio as parts, `compressed:raw` (the paper writes PNG:BMP 8:2); 7:3 or, refined, 68:32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ratio {
    pub compressed: u32,
    pub raw: u32,
}

impl Ratio {
    /// The share of items stored raw, in `0..=1`.
    pub fn raw_share(&self) -> f64 {
        let total = self.compressed + self.raw;
        if total == 0 {
            0.0
        } else {
            self.raw as f64 / total as f64
        }
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.compressed, self.raw)
    }
}

/// The whole manifest: formats, data files, items in storage order, and how it was made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub magic: String,
    pub version: u32,
    /// The seed that picked which items were converted to raw.
    pub seed: u64,
    /// The chosen mixing ratio.
    pub ratio: Ratio,
    pub formats: Vec<FormatSpec>,
    pub files: Vec<DataFile>,
    pub items: Vec<Item>,
}

impl Manifest {
    pub fn new(seed: u64, ratio: Ratio, formats: Vec<FormatSpec>) -> Self {
        Manifest {
            magic: MAGIC.into(),
            version: VERSION,
            seed,
            ratio,
            formats,
            files: Vec::new(),
            items: Vec::new(),
        }
    }

    /// Reads `dir/manifest.cbor` without touching the data files (see [`Dataset::open`] for that).
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_NAME);
        let bytes = stdx::fs::read_regular(&path, MAX_MANIFEST_BYTES).map_err(|e| {
            let reason = match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "no manifest.cbor: not a Liquid dataset, or one whose writing did not finish"
                        .to_string()
                }
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => e.to_string(),
                _ => return io(&path)(e),
            };
            Error::BadManifest {
                path: path.clone(),
                reason,
            }
        })?;
        Self::parse(&bytes, &path)
    }

    fn parse(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let m: Manifest = ciborium::from_reader(bytes).map_err(|e| Error::BadManifest {
            path: path.to_path_buf(),
            reason: cbor_message(e),
        })?;
        if m.magic != MAGIC || m.version != VERSION {
            return Err(Error::BadManifest {
                path: path.to_path_buf(),
                reason: format!(
                    "magic {:?} version {} (want {MAGIC:?} {VERSION})",
                    m.magic, m.version
                ),
            });
        }
        Ok(m)
    }

    /// Parses and checks manifest bytes (untrusted input: errors, never panics); `path` names them in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let m = Self::parse(bytes, path)?;
        m.check(path)?;
        Ok(m)
    }

    /// Writes `dir/manifest.cbor` durably ([`stdx::fs::write_atomic`]): a reader sees the old manifest or
    /// the new one, never part of one.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_NAME);
        let mut bytes = Vec::new();
        ciborium::into_writer(self, &mut bytes).map_err(|e| Error::BadManifest {
            path: path.clone(),
            reason: format!("cannot encode: {e}"),
        })?;
        stdx::fs::write_atomic(&path, &bytes).map_err(io(&path))
    }

    /// Checks the manifest against itself: indices in range, items inside their files, aligned, not
    /// overlapping, raw items exactly `width * height * channels` bytes.
    pub fn check(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| Error::ManifestMismatch {
            path: path.to_path_buf(),
            reason,
        };
        if self.items.is_empty() {
            return Err(Error::EmptyDataset);
        }
        for f in &self.files {
            if f.format as usize >= self.formats.len() {
                return Err(bad(format!(
                    "data file {} has unknown format {}",
                    f.name, f.format
                )));
            }
            if f.name.contains('/') || f.name.contains('\\') || f.name.starts_with('.') {
                return Err(bad(format!(
                    "data file name {:?} leaves the folder",
                    f.name
                )));
            }
        }
        let mut spans: Vec<(u32, u64, u64, u64)> = Vec::with_capacity(self.items.len());
        for it in &self.items {
            let Some(fmt) = self.formats.get(it.format as usize) else {
                return Err(bad(format!(
                    "item {} has unknown format {}",
                    it.id, it.format
                )));
            };
            let Some(file) = self.files.get(it.location.file as usize) else {
                return Err(bad(format!(
                    "item {} names data file {}",
                    it.id, it.location.file
                )));
            };
            if file.format != it.format {
                return Err(bad(format!(
                    "item {} is {} but sits in {}",
                    it.id, fmt.tag, file.name
                )));
            }
            let end = it.location.offset.checked_add(it.location.length);
            if end.is_none_or(|e| e > file.len) {
                return Err(bad(format!(
                    "item {} ({} bytes at {}) runs past the end of {} ({} bytes)",
                    it.id, it.location.length, it.location.offset, file.name, file.len
                )));
            }
            if it.location.offset % ALIGN != 0 {
                return Err(bad(format!("item {} is not {ALIGN}-byte aligned", it.id)));
            }
            if it.location.length == 0 {
                return Err(bad(format!("item {} is empty", it.id)));
            }
            if fmt.kind == FormatKind::Raw && it.location.length != it.dims.decoded_len() {
                return Err(bad(format!(
                    "raw item {} holds {} bytes but its dims {}x{}x{} need {}",
                    it.id,
                    it.location.length,
                    it.dims.width,
                    it.dims.height,
                    it.dims.channels,
                    it.dims.decoded_len()
                )));
            }
            spans.push((
                it.location.file,
                it.location.offset,
                it.location.length,
                it.id,
            ));
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[0].0 == w[1].0 && w[0].1 + w[0].2 > w[1].1 {
                return Err(bad(format!("items {} and {} overlap", w[0].3, w[1].3)));
            }
        }
        Ok(())
    }
}

/// An opened, validated multi-format dataset: the manifest plus the folder holding its data files.
#[derive(Clone, Debug)]
pub struct Dataset {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl Dataset {
    /// Reads and validates the manifest and checks every data file is a regular file of the recorded
    /// length.
    pub fn open(dir: &Path) -> Result<Dataset> {
        let manifest = Manifest::read(dir)?;
        manifest.check(&dir.join(MANIFEST_NAME))?;
        for f in &manifest.files {
            let path = dir.join(&f.name);
            let len = match stdx::fs::open_regular(&path).and_then(|file| file.metadata()) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::MissingDataFile { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                    return Err(Error::NotAFile {
                        path,
                        reason: e.to_string(),
                    });
                }
                Err(e) => return Err(io(path)(e)),
            };
            if len < f.len {
                return Err(Error::TruncatedDataFile {
                    path,
                    needed: f.len,
                    actual: len,
                });
            }
            if len != f.len {
                return Err(Error::ManifestMismatch {
                    path,
                    reason: format!("the manifest says {} bytes, the file has {len}", f.len),
                });
            }
        }
        Ok(Dataset {
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    pub fn path_of(&self, file: u32) -> PathBuf {
        self.dir.join(&self.manifest.files[file as usize].name)
    }

    /// Bytes the dataset occupies on disk (item bytes, without alignment padding).
    pub fn item_bytes(&self) -> u64 {
        self.manifest.items.iter().map(|i| i.location.length).sum()
    }

    /// Number of items of each format.
    pub fn counts(&self) -> Vec<usize> {
        let mut c = vec![0; self.manifest.formats.len()];
        for it in &self.manifest.items {
            c[it.format as usize] += 1;
        }
        c
    }
}
