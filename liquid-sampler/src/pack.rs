//! Writing a multi-format dataset: items appended to packed data files (one or more per format, each item
//! padded to [`ALIGN`]), the manifest written last.
//!
//! One writer per folder: [`DatasetWriter::create`] locks it ([`stdx::fs::DirLock`]) until the writer is
//! finished or dropped, so a second writer fails at once instead of interleaving files with the first.
//! Nothing a reader looks at changes until [`DatasetWriter::finish`]: data files are written under
//! temporary names ([`stdx::fs::AtomicFile`]). Finishing removes the old manifest first (so no reader pairs
//! it with new data files), renames the data files into place and writes the new manifest last. A kill at
//! any point therefore leaves the previous dataset readable, or no manifest at all (a clear error), never a
//! mixture; the next writer removes the temporaries a killed one left. A writer dropped unfinished (an
//! error) removes what it wrote, and the folder too if it created it.

use crate::error::{Error, Result, io};
use crate::manifest::{
    ALIGN, DataFile, Dims, FormatSpec, Item, Location, MANIFEST_NAME, Manifest, Ratio,
};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use stdx::fs::{AtomicFile, DirLock};

/// Data files roll over to a new file past this size by default.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

struct OpenFile {
    index: u32,
    out: BufWriter<AtomicFile>,
    len: u64,
}

/// Appends items to a new dataset folder.
pub struct DatasetWriter {
    dir: PathBuf,
    manifest: Manifest,
    open: Vec<Option<OpenFile>>,
    /// Data files complete on disk under their temporary names, renamed into place by `finish`.
    closed: Vec<AtomicFile>,
    max_file_bytes: u64,
    lock: Option<DirLock>,
    /// The folder did not exist before this writer: an unfinished writer removes it again.
    created: bool,
    finished: bool,
}

impl DatasetWriter {
    /// Starts a dataset in `dir` (created if needed) with the given formats. Fails at once, naming the
    /// folder, if another writer holds it.
    pub fn create(dir: &Path, seed: u64, ratio: Ratio, formats: Vec<FormatSpec>) -> Result<Self> {
        if formats.is_empty() {
            return Err(Error::BadSetting(
                "a dataset needs at least one format".into(),
            ));
        }
        let created = !dir.try_exists().map_err(io(dir))?;
        let lock = DirLock::acquire(dir).map_err(io(dir))?;
        stdx::fs::remove_stale_temps(dir).map_err(io(dir))?;
        let n = formats.len();
        Ok(DatasetWriter {
            dir: dir.to_path_buf(),
            manifest: Manifest::new(seed, ratio, formats),
            open: (0..n).map(|_| None).collect(),
            closed: Vec::new(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            lock: Some(lock),
            created,
            finished: false,
        })
    }

    /// Rolls data files over past `bytes` (at least one item per file).
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes.max(1);
        self
    }

    /// Appends one item of format `format` (an index into the formats given to `create`).
    pub fn add(
        &mut self,
        id: u64,
        label: u32,
        format: u16,
        bytes: &[u8],
        dims: Dims,
    ) -> Result<()> {
        let f = format as usize;
        if f >= self.open.len() {
            return Err(Error::BadSetting(format!(
                "format index {format} out of range"
            )));
        }
        if bytes.is_empty() {
            return Err(Error::BadSetting(format!("item {id} has no bytes")));
        }
        let roll = match &self.open[f] {
            Some(o) => o.len > 0 && o.len + bytes.len() as u64 > self.max_file_bytes,
            None => true,
        };
        if roll {
            self.close(f)?;
            let index = self.manifest.files.len() as u32;
            let nth = self
                .manifest
                .files
                .iter()
                .filter(|d| d.format == format)
                .count();
            let name = format!("{}-{nth:03}.pack", self.manifest.formats[f].tag);
            let path = self.dir.join(&name);
            let file = AtomicFile::create(&path).map_err(io(&path))?;
            self.manifest.files.push(DataFile {
                name,
                format,
                len: 0,
            });
            self.open[f] = Some(OpenFile {
                index,
                out: BufWriter::with_capacity(1 << 20, file),
                len: 0,
            });
        }
        let Some(o) = self.open[f].as_mut() else {
            return Err(Error::BadSetting(format!(
                "format {format} has no open file"
            )));
        };
        let offset = o.len;
        let pad = (ALIGN - bytes.len() as u64 % ALIGN) % ALIGN;
        let written = o
            .out
            .write_all(bytes)
            .and_then(|()| o.out.write_all(&vec![0u8; pad as usize]));
        written.map_err(io(o.out.get_ref().path()))?;
        o.len += bytes.len() as u64 + pad;
        self.manifest.files[o.index as usize].len = o.len;
        self.manifest.items.push(Item {
            id,
            label,
            format,
            location: Location {
                file: o.index,
                offset,
                length: bytes.len() as u64,
            },
            dims,
        });
        Ok(())
    }

    /// Flushes format `f`'s open data file; it waits under its temporary name for `finish`.
    fn close(&mut self, f: usize) -> Result<()> {
        if let Some(o) = self.open[f].take() {
            let path = o.out.get_ref().path().to_path_buf();
            let file = o.out.into_inner().map_err(|e| io(&path)(e.into_error()))?;
            self.closed.push(file);
        }
        Ok(())
    }

    /// Everything `finish` does; the writer stays responsible for the lock.
    fn commit(&mut self) -> Result<Manifest> {
        for f in 0..self.open.len() {
            self.close(f)?;
        }
        let manifest_path = self.dir.join(MANIFEST_NAME);
        self.manifest.check(&manifest_path)?;
        match std::fs::remove_file(&manifest_path) {
            Ok(()) => sync_dir(&self.dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&manifest_path)(e)),
        }
        for file in self.closed.drain(..) {
            let path = file.path().to_path_buf();
            file.commit().map_err(io(path))?;
        }
        self.manifest.write(&self.dir)?;
        self.finished = true;
        remove_stale_data_files(&self.dir, &self.manifest);
        Ok(self.manifest.clone())
    }

    /// Flushes every data file, renames them into place and writes the manifest last; releases the lock.
    pub fn finish(mut self) -> Result<Manifest> {
        self.commit()
    }

    /// [`finish`](Self::finish), keeping the folder locked for the caller (the profiler's probe sample).
    pub(crate) fn finish_locked(mut self) -> Result<(Manifest, Option<DirLock>)> {
        let m = self.commit()?;
        Ok((m, self.lock.take()))
    }
}

/// Makes removals and renames in `dir` durable before the next step relies on them.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Removes data files (`*.pack`) of an earlier dataset in the folder that the new manifest does not list.
/// Best effort: the new dataset is complete whether or not they go.
fn remove_stale_data_files(dir: &Path, manifest: &Manifest) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let stale = name.ends_with(".pack")
            && !name.starts_with('.')
            && !manifest.files.iter().any(|f| f.name == name);
        if stale && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

impl Drop for DatasetWriter {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // Dropping the files removes their temporaries.
        self.open.clear();
        self.closed.clear();
        if self.created
            && let Some(lock) = &self.lock
        {
            let _ = std::fs::remove_file(lock.path());
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}
