//! Writing a multi-format dataset: items appended to packed data files (one or more per format, each item
//! padded to [`ALIGN`]), the manifest written last. Files are written under temporary names and renamed into
//! place by [`DatasetWriter::finish`]; a writer dropped before that removes what it wrote.

use crate::error::{Error, Result, io};
use crate::manifest::{ALIGN, DataFile, Dims, FormatSpec, Item, Location, Manifest, Ratio};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Data files roll over to a new file past this size by default.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

struct OpenFile {
    index: u32,
    tmp: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    len: u64,
}

/// Appends items to a new dataset folder.
pub struct DatasetWriter {
    dir: PathBuf,
    manifest: Manifest,
    open: Vec<Option<OpenFile>>,
    written: Vec<(PathBuf, PathBuf)>,
    max_file_bytes: u64,
    finished: bool,
}

impl DatasetWriter {
    /// Starts a dataset in `dir` (created if needed) with the given formats.
    pub fn create(dir: &Path, seed: u64, ratio: Ratio, formats: Vec<FormatSpec>) -> Result<Self> {
        if formats.is_empty() {
            return Err(Error::BadSetting(
                "a dataset needs at least one format".into(),
            ));
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let n = formats.len();
        Ok(DatasetWriter {
            dir: dir.to_path_buf(),
            manifest: Manifest::new(seed, ratio, formats),
            open: (0..n).map(|_| None).collect(),
            written: Vec::new(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
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
            let tmp = self.dir.join(format!("{name}.tmp"));
            let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            self.manifest.files.push(DataFile {
                name,
                format,
                len: 0,
            });
            self.open[f] = Some(OpenFile {
                index,
                tmp,
                out: std::io::BufWriter::with_capacity(1 << 20, file),
                len: 0,
            });
        }
        let o = self.open[f].as_mut().expect("opened above");
        let offset = o.len;
        o.out.write_all(bytes).map_err(io(&o.tmp))?;
        let pad = (ALIGN - bytes.len() as u64 % ALIGN) % ALIGN;
        o.out
            .write_all(&vec![0u8; pad as usize])
            .map_err(io(&o.tmp))?;
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

    fn close(&mut self, f: usize) -> Result<()> {
        if let Some(o) = self.open[f].take() {
            let file = o.out.into_inner().map_err(|e| Error::Io {
                path: o.tmp.clone(),
                source: e.into_error(),
            })?;
            file.sync_all().map_err(io(&o.tmp))?;
            let name = &self.manifest.files[o.index as usize].name;
            self.written.push((o.tmp, self.dir.join(name)));
        }
        Ok(())
    }

    /// Flushes every data file, renames them into place and writes the manifest last.
    pub fn finish(mut self) -> Result<Manifest> {
        for f in 0..self.open.len() {
            self.close(f)?;
        }
        self.manifest
            .check(&self.dir.join(crate::manifest::MANIFEST_NAME))?;
        for (tmp, dst) in &self.written {
            std::fs::rename(tmp, dst).map_err(io(dst))?;
        }
        self.manifest.write(&self.dir)?;
        self.finished = true;
        Ok(self.manifest.clone())
    }
}

impl Drop for DatasetWriter {
    fn drop(&mut self) {
        if !self.finished {
            for o in self.open.iter().flatten() {
                let _ = std::fs::remove_file(&o.tmp);
            }
            for (tmp, _) in &self.written {
                let _ = std::fs::remove_file(tmp);
            }
        }
    }
}
