//! Building a PCR dataset from a folder of images. JPEG inputs are transcoded losslessly (coefficient
//! domain); other inputs would have to be encoded as JPEG first, which is lossy, so that needs an explicit
//! quality.

use super::Target;
use crate::dataset::image_files;
use crate::error::{Error, Result};
use crate::format::Format;
use std::path::{Path, PathBuf};

/// How [`to_pcr`] builds.
#[derive(Clone, Debug)]
pub struct PcrBuild {
    /// Threads (0 = every core).
    pub threads: usize,
    /// Encode non-JPEG inputs as JPEG at this quality first (lossy); `None` refuses them.
    pub lossy_quality: Option<u8>,
    /// Images per record (the paper uses 1024).
    pub images_per_record: usize,
    /// Accept JPEGs libjpeg reports corrupt data in (truncated, bad Huffman codes), as they decode.
    pub allow_corrupt: bool,
}

impl Default for PcrBuild {
    fn default() -> Self {
        PcrBuild {
            threads: 0,
            lossy_quality: None,
            images_per_record: 1024,
            allow_corrupt: false,
        }
    }
}

/// What [`to_pcr`] did.
#[derive(Clone, Debug)]
pub struct PcrSummary {
    /// Inputs encoded as JPEG first (lossy; only with `lossy_quality`).
    pub reencoded: usize,
    /// The dataset was already complete: nothing was written.
    pub reused: bool,
    pub warnings: Vec<String>,
}

/// Builds (or finds complete) a PCR dataset in `out` from the images under `input`, labelled by
/// sub-folder. Non-JPEG inputs are encoded as JPEG in `out/.jpeg-src/` only when
/// [`PcrBuild::lossy_quality`] allows it.
pub fn to_pcr(input: &Path, out: &Path, build: &PcrBuild) -> Result<PcrSummary> {
    let listed = image_files(input)?;
    if listed.files.is_empty() {
        return Err(Error::dataset(input, "no images to build PCRs from"));
    }
    let others: Vec<&PathBuf> = listed
        .files
        .iter()
        .filter(|(_, f)| *f != Format::Jpeg)
        .map(|(p, _)| p)
        .collect();
    if let Some(first) = others.first()
        && build.lossy_quality.is_none()
    {
        return Err(Error::dataset(
            input,
            format!(
                "{} of {} inputs are not JPEG (e.g. {}): PCR records hold JPEG scans, so they would be \
                 re-encoded lossily; give a JPEG quality to accept that (l3 convert --quality Q), or \
                 convert only JPEG files",
                others.len(),
                listed.files.len(),
                first.display()
            ),
        ));
    }
    // JPEG inputs are transcoded as they are; only the others are encoded, into `.jpeg-src/`.
    let src_dir = out.join(".jpeg-src");
    let sources: Vec<(PathBuf, PathBuf)> = listed
        .files
        .iter()
        .map(|(rel, f)| match f {
            Format::Jpeg => (rel.clone(), input.join(rel)),
            _ => (rel.clone(), src_dir.join(rel).with_extension("jpg")),
        })
        .collect();
    if let Ok(existing) = pcr::Dataset::open(out)
        && existing.images() == sources.len()
    {
        return Ok(PcrSummary {
            reencoded: 0,
            reused: true,
            warnings: listed.skipped,
        });
    }
    if let Some(q) = build.lossy_quality {
        let import = crate::image::ImportOptions::default();
        stdx::parallel::for_each(&others, build.threads, |rel| {
            let dst = src_dir.join(rel).with_extension("jpg");
            if !super::is_complete(&dst, Format::Jpeg) {
                super::convert_one(&input.join(rel), &dst, Target::Jpeg(q), &import)?;
            }
            Ok::<(), Error>(())
        })?;
    }
    let inputs: Vec<pcr::Input> = sources
        .into_iter()
        .map(|(rel, src)| {
            let mut item = pcr::Input::new(src);
            // Named by its path in the folder: class folders may hold files of the same name.
            item.name = crate::storage::key_of(&rel);
            let class = rel
                .parent()
                .and_then(|p| p.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned());
            item.label = Some(class.unwrap_or_default());
            item
        })
        .collect();
    let options = pcr::BuildOptions {
        images_per_record: build.images_per_record,
        threads: build.threads,
        allow_corrupt: build.allow_corrupt,
    };
    pcr::build(out, &inputs, &options, &|_| {}).map_err(|e| Error::dataset(out, e))?;
    Ok(PcrSummary {
        reencoded: others.len(),
        reused: false,
        warnings: listed.skipped,
    })
}
