//! The packed multi-format dataset of `liquid-sampler` (compressed items beside raw ones in aligned data
//! files, a CBOR manifest), read item by item through the loader's own pipeline.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::image::{Format, Image};
use liquid_sampler::manifest::FormatKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A Liquid multi-format dataset folder (`manifest.cbor` + packed data files).
///
/// Items keep the manifest's storage order; the format tag of each (`png`, `jpeg`, `l3`, `raw`) picks its
/// decoder. Under the loader's default order reads are plain `pread`s through the page cache; with
/// [`Order::Liquid`](crate::Order::Liquid) the loader takes its order and bytes from `liquid-sampler`'s
/// page-cache-bypassing two-region sampler instead.
pub struct LiquidShards {
    inner: liquid_sampler::Dataset,
    files: Vec<std::fs::File>,
    formats: Vec<Format>,
}

impl LiquidShards {
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let inner = liquid_sampler::Dataset::open(dir).map_err(|e| Error::dataset(dir, e))?;
        let formats = inner
            .manifest
            .formats
            .iter()
            .map(|f| match f.kind {
                FormatKind::Raw => Ok(Format::Raw),
                FormatKind::Compressed => match f.tag.as_str() {
                    "png" => Ok(Format::Png),
                    "jpeg" | "jpg" => Ok(Format::Jpeg),
                    "l3" => Ok(Format::L3),
                    t => Err(Error::dataset(
                        dir,
                        format!("format tag {t:?}: no decoder (png, jpeg, l3 or raw)"),
                    )),
                },
            })
            .collect::<Result<Vec<_>>>()?;
        let files = (0..inner.manifest.files.len())
            .map(|i| {
                let p = inner.path_of(i as u32);
                std::fs::File::open(&p).map_err(|e| Error::io(p, e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(LiquidShards {
            inner,
            files,
            formats,
        })
    }

    /// The manifest (ratio, formats, items).
    pub fn manifest(&self) -> &liquid_sampler::Manifest {
        &self.inner.manifest
    }

    /// Whether `dir` holds a Liquid dataset.
    pub fn is_dataset(dir: &Path) -> bool {
        dir.join(liquid_sampler::manifest::MANIFEST_NAME).is_file()
    }
}

impl Dataset for LiquidShards {
    fn len(&self) -> usize {
        self.inner.manifest.items.len()
    }
    fn label(&self, index: usize) -> u32 {
        self.inner.manifest.items[index].label
    }
    fn id(&self, index: usize) -> u64 {
        self.inner.manifest.items[index].id
    }
    fn format(&self, index: usize) -> Format {
        self.formats[self.inner.manifest.items[index].format as usize]
    }
    fn source(&self, index: usize) -> PathBuf {
        let it = &self.inner.manifest.items[index];
        let p = self.inner.path_of(it.location.file);
        PathBuf::from(format!(
            "{}@{}+{} (item id {})",
            p.display(),
            it.location.offset,
            it.location.length,
            it.id
        ))
    }
    fn stored_bytes(&self) -> u64 {
        self.inner.item_bytes()
    }
    fn read(&self, index: usize) -> Result<Vec<u8>> {
        let loc = self.inner.manifest.items[index].location;
        let mut buf = vec![0u8; loc.length as usize];
        self.files[loc.file as usize]
            .read_exact_at(&mut buf, loc.offset)
            .map_err(|e| Error::io(self.source(index), e))?;
        Ok(buf)
    }
    fn decode(&self, index: usize, bytes: &[u8], out: &mut Image) -> Result<()> {
        let it = &self.inner.manifest.items[index];
        match self.format(index) {
            Format::Raw => {
                let d = it.dims;
                liquid_sampler::profile::decode_raw(bytes, d, &mut out.pixels)
                    .map_err(|e| Error::decode(self.source(index), "raw", e))?;
                out.width = d.width;
                out.height = d.height;
                out.channels = d.channels;
                Ok(())
            }
            f => crate::image::decode(f, bytes, &self.source(index), out),
        }
    }
    fn liquid(&self) -> Option<&liquid_sampler::Dataset> {
        Some(&self.inner)
    }
    fn describe(&self) -> String {
        let m = &self.inner.manifest;
        format!(
            "Liquid dataset {} ({} items, ratio {} compressed:raw)",
            self.inner.dir.display(),
            m.items.len(),
            m.ratio
        )
    }
}
