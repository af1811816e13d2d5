//! A folder of image files (PNG, JPEG, raw PPM/PGM/PAM, L3), labelled by sub-folder name or by a CSV.

use super::Dataset;
use super::regions::{IndexCache, read_region};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{SampleRequest, Stored};
use crate::sample::DecodeScope;
use crate::storage::{Storage, key_of};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Offset tables of L3 items kept for region reads, per folder.
const INDEX_CACHE_BYTES: usize = 64 << 20;

/// One image file per item, like torchvision's `ImageFolder`.
///
/// Items are sorted by relative path, so indices are stable across runs and machines.
#[derive(Debug)]
pub struct ImageFolder {
    root: PathBuf,
    storage: Storage,
    items: Vec<FolderItem>,
    classes: Vec<String>,
    bytes: u64,
    warnings: Vec<String>,
    indexes: IndexCache,
}

#[derive(Debug, Clone)]
struct FolderItem {
    /// Relative to the root, `/`-separated.
    key: String,
    path: PathBuf,
    label: u32,
    format: Format,
    /// Size when the folder was listed (`None`: not listed, a CSV row; found when read).
    len: Option<u64>,
}

/// The image files under a folder, listed the way every part of the toolkit lists them.
#[derive(Debug, Clone, Default)]
pub struct ImageFiles {
    /// (path relative to the folder, format), sorted.
    pub files: Vec<(PathBuf, Format)>,
    /// What was left out, one line each: special files named like images, folders reached twice
    /// (symlink loops), dangling links.
    pub skipped: Vec<String>,
}

/// Every image file under `root` (recursively, symlinks followed), sorted; hidden and temporary files are
/// ignored, and entries that cannot be read as images are listed in [`ImageFiles::skipped`].
pub fn image_files(root: &Path) -> Result<ImageFiles> {
    let walk = stdx::fs::walk(root).map_err(|e| Error::io(root, e))?;
    let mut out = ImageFiles::default();
    for rel in walk.files {
        if let Some(f) = Format::from_path(&rel) {
            out.files.push((rel, f));
        }
    }
    for (rel, why) in walk.skipped {
        let looks_like_image = Format::from_path(&rel).is_some();
        if looks_like_image || why == stdx::fs::Skipped::Revisit {
            out.skipped
                .push(format!("{}: skipped, {why}", root.join(rel).display()));
        }
    }
    Ok(out)
}

impl ImageFolder {
    /// Every image file under `root` (recursively); the label is the index of the item's top-level
    /// sub-folder among the sorted sub-folder names (files directly in `root` form a class named "").
    ///
    /// A folder holding one image in two formats (`a.l3` beside `a.ppm`, e.g. two conversions into one
    /// folder) is refused: every image would be counted twice.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        Self::open_in(Storage::local(root.as_ref()))
    }

    /// [`open`](Self::open) on any storage: a local folder or an object-store prefix.
    pub fn open_in(storage: Storage) -> Result<Self> {
        let root = PathBuf::from(storage.root());
        let listed = match storage.local_root() {
            Some(dir) => image_files(dir)?,
            None => {
                let listing = storage.list()?;
                ImageFiles {
                    files: listing
                        .files
                        .iter()
                        .filter_map(|(k, _)| Format::from_path(Path::new(k)).map(|f| (k.into(), f)))
                        .collect(),
                    skipped: listing.skipped,
                }
            }
        };
        let mut stems: HashMap<PathBuf, &Path> = HashMap::new();
        for (rel, _) in &listed.files {
            if let Some(other) = stems.insert(rel.with_extension(""), rel) {
                return Err(Error::dataset(
                    &root,
                    format!(
                        "{} and {} look like one image in two formats; a dataset folder holds each \
                         image once (convert into an empty folder)",
                        other.display(),
                        rel.display()
                    ),
                ));
            }
        }
        let mut classes: Vec<String> = listed.files.iter().map(|(rel, _)| class_of(rel)).collect();
        classes.sort();
        classes.dedup();
        let items = listed
            .files
            .into_iter()
            .map(|(rel, format)| FolderItem {
                label: classes.binary_search(&class_of(&rel)).unwrap_or(0) as u32,
                key: key_of(&rel),
                path: storage.name(&key_of(&rel)),
                format,
                len: None,
            })
            .collect();
        Self::finish(storage, items, classes, listed.skipped)
    }

    /// The items listed in `csv`, one `path,label` line each (path relative to `root`; label an integer or a
    /// class name; an optional header line whose label column reads `label`). Listed files are not checked
    /// here: a missing one fails when it is read, with its path and index.
    pub fn with_labels(root: impl AsRef<Path>, csv: impl AsRef<Path>) -> Result<Self> {
        Self::with_labels_in(Storage::local(root.as_ref()), csv)
    }

    /// [`with_labels`](Self::with_labels) on any storage (the CSV is a local file).
    pub fn with_labels_in(storage: Storage, csv: impl AsRef<Path>) -> Result<Self> {
        let csv = csv.as_ref();
        let bytes = stdx::fs::read_regular(csv, 1 << 30).map_err(|e| Error::io(csv, e))?;
        let mut reader = ::csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(::csv::Trim::All)
            .comment(Some(b'#'))
            .from_reader(&bytes[..]);
        let mut rows = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|e| Error::dataset(csv, e))?;
            let n = record.position().map_or(0, |p| p.line() as usize - 1);
            if record.iter().all(str::is_empty) {
                continue;
            }
            // The label is the last field; an unquoted path may hold commas of its own.
            let fields: Vec<&str> = record.iter().collect();
            let Some((label, path)) = fields.split_last().filter(|(_, p)| !p.is_empty()) else {
                return Err(Error::dataset(
                    csv,
                    format!("line {}: expected `path,label`", n + 1),
                ));
            };
            let (path, label) = (path.join(","), *label);
            let path = path.as_str();
            if rows.is_empty() && label.eq_ignore_ascii_case("label") {
                continue;
            }
            let format = Format::from_path(Path::new(path)).ok_or_else(|| {
                Error::dataset(
                    csv,
                    format!("line {}: {path}: not an image file name", n + 1),
                )
            })?;
            rows.push((PathBuf::from(path), label.to_string(), format));
        }
        let numeric = rows.iter().all(|(_, l, _)| l.parse::<u32>().is_ok());
        let mut classes: Vec<String> = if numeric {
            Vec::new()
        } else {
            rows.iter().map(|(_, l, _)| l.clone()).collect()
        };
        classes.sort();
        classes.dedup();
        let items = rows
            .into_iter()
            .map(|(rel, l, format)| FolderItem {
                label: if numeric {
                    l.parse().unwrap_or(0)
                } else {
                    classes.binary_search(&l).unwrap_or(0) as u32
                },
                key: key_of(&rel),
                path: storage.name(&key_of(&rel)),
                format,
                len: None,
            })
            .collect();
        Self::finish(storage, items, classes, Vec::new())
    }

    fn finish(
        storage: Storage,
        mut items: Vec<FolderItem>,
        classes: Vec<String>,
        warnings: Vec<String>,
    ) -> Result<Self> {
        let root = PathBuf::from(storage.root());
        if items.is_empty() {
            return Err(Error::dataset(
                &root,
                "no images (PNG, JPEG, PPM/PGM/PAM, L3, WebP, TIFF, BMP or GIF) found",
            ));
        }
        if storage.is_remote() {
            let sizes: HashMap<String, u64> = storage.list()?.files.into_iter().collect();
            for i in &mut items {
                i.len = sizes.get(&i.key).copied();
            }
        } else {
            for i in &mut items {
                i.len = std::fs::metadata(&i.path).ok().map(|m| m.len());
            }
        }
        let bytes = items.iter().map(|i| i.len.unwrap_or(0)).sum();
        Ok(ImageFolder {
            root,
            storage,
            items,
            classes,
            bytes,
            warnings,
            indexes: IndexCache::new(INDEX_CACHE_BYTES),
        })
    }

    /// Class names by label (sub-folder names, or the CSV's names; empty for numeric CSV labels).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The file (or object URL) of item `index`.
    pub fn path(&self, index: usize) -> &Path {
        &self.items[index].path
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The read layer the items come through (its request and byte counts).
    pub fn storage(&self) -> &Storage {
        &self.storage
    }
}

impl Dataset for ImageFolder {
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
        Some(self.items[index].key.clone())
    }
    fn source(&self, index: usize) -> PathBuf {
        self.items[index].path.clone()
    }
    fn stored_len(&self, index: usize) -> Option<u64> {
        self.items[index].len
    }
    fn stored_bytes(&self) -> u64 {
        self.bytes
    }
    fn read(&self, index: usize, req: &SampleRequest) -> Result<(Stored, u64)> {
        let item = &self.items[index];
        if item.format == Format::L3 && req.scope == DecodeScope::Region {
            // Locally the size is taken now (the file may have been replaced since the listing); an
            // object's comes from the listing, saving a request per item.
            let file = self.storage.open_key(&item.key)?;
            let len = match (self.storage.is_remote(), item.len) {
                (true, Some(len)) => len,
                _ => file.size()?,
            };
            return read_region(&self.indexes, index, &file, (0, len), req);
        }
        let limit = crate::image::max_image_bytes().saturating_add(1 << 20);
        let bytes = self.storage.read(&item.key, limit)?;
        let n = bytes.len() as u64;
        Ok((Stored::Whole(bytes), n))
    }
    fn describe(&self) -> String {
        format!(
            "image folder {} ({} images, {} classes)",
            self.storage.root(),
            self.items.len(),
            self.classes.len()
        )
    }
    fn storage(&self) -> Option<&Storage> {
        Some(&self.storage)
    }
    fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

fn class_of(rel: &Path) -> String {
    let mut comps = rel.components();
    let first = comps.next();
    match (first, comps.next()) {
        (Some(c), Some(_)) => key_of(Path::new(c.as_os_str())),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_csv_quotes_comments_and_commas_in_names() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("labels.csv");
        std::fs::write(
            &csv,
            "path,label\n# a comment\n\"a,b.png\",3\nplain, name.png ,4\nx/with,comma.jpg,5\n\n",
        )
        .unwrap();
        let ds = ImageFolder::with_labels(dir.path(), &csv).unwrap();
        let mut got: Vec<(String, u32)> = (0..ds.len())
            .map(|i| (ds.source(i).display().to_string(), ds.label(i)))
            .collect();
        got.sort();
        let root = dir.path().display();
        // Quoted names keep their commas; unquoted fields before the label are one name (trimmed fields
        // joined by commas); the header, the comment and the blank line are skipped.
        let want = [
            (format!("{root}/a,b.png"), 3),
            (format!("{root}/plain,name.png"), 4),
            (format!("{root}/x/with,comma.jpg"), 5),
        ];
        assert_eq!(got, want);
        std::fs::write(&csv, "only-a-path.png\n").unwrap();
        let e = ImageFolder::with_labels(dir.path(), &csv)
            .unwrap_err()
            .to_string();
        assert!(e.contains("labels.csv") && e.contains("line 1"), "{e}");
    }
}
