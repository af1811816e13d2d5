//! The packed multi-format dataset of `liquid-sampler` (compressed items beside raw ones in aligned data
//! files, a CBOR manifest), read item by item through the loader's own pipeline.

use super::Dataset;
use super::regions::{IndexCache, read_region};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{Decoded, SampleRequest, Scratch, Stored, decode_sample, write_pixels};
use crate::sample::DecodeScope;
use liquid_sampler::manifest::FormatKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Offset tables of L3 items kept for region reads.
const INDEX_CACHE_BYTES: usize = 64 << 20;

/// A Liquid multi-format dataset folder (`manifest.cbor` + packed data files).
///
/// Items keep the manifest's storage order; the format tag of each (`png`, `jpeg`, `l3`, `raw`) picks its
/// decoder. Under the loader's default order reads are plain `pread`s through the page cache (L3 items:
/// only the patches under the window); with [`Order::Liquid`](crate::Order::Liquid) the loader takes its
/// order and bytes from `liquid-sampler`'s page-cache-bypassing two-region sampler instead.
pub struct LiquidShards {
    inner: liquid_sampler::Dataset,
    files: Vec<std::fs::File>,
    formats: Vec<Format>,
    indexes: IndexCache,
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
                stdx::fs::open_regular(&p).map_err(|e| Error::io(p, e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(LiquidShards {
            inner,
            files,
            formats,
            indexes: IndexCache::new(INDEX_CACHE_BYTES),
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
    fn read(&self, index: usize, req: &SampleRequest) -> Result<(Stored, u64)> {
        let loc = self.inner.manifest.items[index].location;
        let file = &self.files[loc.file as usize];
        if self.format(index) == Format::L3 && req.scope == DecodeScope::Region {
            let path = self.source(index);
            return read_region(
                &self.indexes,
                index,
                file,
                loc.offset,
                loc.length,
                req,
                &path,
            );
        }
        let mut buf = vec![0u8; loc.length as usize];
        file.read_exact_at(&mut buf, loc.offset)
            .map_err(|e| Error::io(self.source(index), e))?;
        Ok((Stored::Whole(buf), loc.length))
    }
    fn decode(
        &self,
        index: usize,
        stored: &Stored,
        req: &SampleRequest,
        scratch: &mut Scratch,
        slot: &mut [u8],
    ) -> Result<Decoded> {
        let path = self.source(index);
        match (self.format(index), stored) {
            // Raw items are bare pixels; their dimensions are in the manifest.
            (Format::Raw, Stored::Whole(bytes)) => {
                let d = self.inner.manifest.items[index].dims;
                if bytes.len() as u64 != d.decoded_len() {
                    return Err(Error::decode(
                        path,
                        "raw",
                        format!(
                            "{} bytes, {}x{}x{} needs {}",
                            bytes.len(),
                            d.width,
                            d.height,
                            d.channels,
                            d.decoded_len()
                        ),
                    ));
                }
                write_pixels(
                    bytes,
                    (d.width, d.height, d.channels),
                    &path,
                    Format::Raw,
                    req,
                    slot,
                )
            }
            (f, s) => decode_sample(f, s, &path, req, scratch, slot),
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
