//! A folder of image files (PNG, JPEG, raw PPM/PGM/PAM, L3), labelled by sub-folder name or by a CSV.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::image::Format;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One image file per item, like torchvision's `ImageFolder`.
///
/// Items are sorted by relative path, so indices are stable across runs and machines.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    root: PathBuf,
    items: Vec<FolderItem>,
    classes: Vec<String>,
    bytes: u64,
}

#[derive(Debug, Clone)]
struct FolderItem {
    path: PathBuf,
    label: u32,
    format: Format,
}

impl ImageFolder {
    /// Every image file under `root` (recursively); the label is the index of the item's top-level
    /// sub-folder among the sorted sub-folder names (files directly in `root` form a class named "").
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let files = image_files(&root)?;
        let mut classes: Vec<String> = files.iter().map(|(rel, _)| class_of(rel)).collect();
        classes.sort();
        classes.dedup();
        let items = files
            .into_iter()
            .map(|(rel, format)| FolderItem {
                label: classes.binary_search(&class_of(&rel)).unwrap_or(0) as u32,
                path: root.join(rel),
                format,
            })
            .collect();
        Self::finish(root, items, classes)
    }

    /// The items listed in `csv`, one `path,label` line each (path relative to `root`; label an integer or a
    /// class name; an optional header line whose label column reads `label`). Listed files are not checked
    /// here: a missing one fails when it is read, with its path and index.
    pub fn with_labels(root: impl AsRef<Path>, csv: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let csv = csv.as_ref();
        let text = std::fs::read_to_string(csv).map_err(|e| Error::io(csv, e))?;
        let mut rows = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (path, label) = line.rsplit_once(',').ok_or_else(|| {
                Error::dataset(csv, format!("line {}: expected `path,label`", n + 1))
            })?;
            let (path, label) = (path.trim(), label.trim());
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
                path: root.join(rel),
                format,
            })
            .collect();
        Self::finish(root, items, classes)
    }

    fn finish(root: PathBuf, items: Vec<FolderItem>, classes: Vec<String>) -> Result<Self> {
        if items.is_empty() {
            return Err(Error::dataset(
                &root,
                "no images (PNG, JPEG, PPM/PGM/PAM or L3) found",
            ));
        }
        let bytes = items
            .iter()
            .map(|i| std::fs::metadata(&i.path).map(|m| m.len()).unwrap_or(0))
            .sum();
        Ok(ImageFolder {
            root,
            items,
            classes,
            bytes,
        })
    }

    /// Class names by label (sub-folder names, or the CSV's names; empty for numeric CSV labels).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The file of item `index`.
    pub fn path(&self, index: usize) -> &Path {
        &self.items[index].path
    }

    pub fn root(&self) -> &Path {
        &self.root
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
    fn source(&self, index: usize) -> PathBuf {
        self.items[index].path.clone()
    }
    fn stored_bytes(&self) -> u64 {
        self.bytes
    }
    fn read(&self, index: usize) -> Result<Vec<u8>> {
        let p = &self.items[index].path;
        std::fs::read(p).map_err(|e| Error::io(p, e))
    }
    fn describe(&self) -> String {
        format!(
            "image folder {} ({} images, {} classes)",
            self.root.display(),
            self.items.len(),
            self.classes.len()
        )
    }
}

fn class_of(rel: &Path) -> String {
    let mut comps = rel.components();
    let first = comps.next();
    match (first, comps.next()) {
        (Some(c), Some(_)) => c.as_os_str().to_string_lossy().into_owned(),
        _ => String::new(),
    }
}

/// Every image file under `root`, as (relative path, format), sorted; hidden and temporary files skipped.
pub fn image_files(root: &Path) -> Result<Vec<(PathBuf, Format)>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let child = rel.join(&name);
            let ty = entry.file_type().map_err(|e| Error::io(entry.path(), e))?;
            let ty_is_dir = if ty.is_symlink() {
                entry.path().is_dir()
            } else {
                ty.is_dir()
            };
            if ty_is_dir {
                stack.push(child);
            } else if let Some(f) = Format::from_path(&child) {
                out.insert(child, f);
            }
        }
    }
    Ok(out.into_iter().collect())
}
