//! Building a Liquid multi-format dataset from a folder of images: profile the load/decode balance with
//! `liquid-sampler`'s profiler (page cache bypassed), then write the mix at the chosen ratio. The image
//! decoders it needs are the loader's own.

use crate::dataset::{Dataset, ImageFolder};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::image::{self, Image};
use liquid_sampler::profile::{Decoder, Profile, ProfileConfig, SourceItem};
use liquid_sampler::{Dims, Probe, Ratio};
use std::path::Path;
use std::time::Duration;

/// How [`to_liquid`] profiles and writes.
#[derive(Clone, Debug)]
pub struct LiquidBuild {
    /// Decode threads the training job grants the pipeline (0 = every core).
    pub threads: usize,
    pub io_threads: usize,
    /// Seed for the probe sample and for which items are stored raw.
    pub seed: u64,
    /// Items in the probe sample (at most).
    pub probe_items: usize,
    /// Bytes the probe sample may hold (compressed and raw copies together).
    pub probe_budget: u64,
    /// Each probe measurement runs at least this long.
    pub probe_time: Duration,
    /// Write at the fitted crossing (hundredths) instead of the paper's best probed tenth.
    pub fitted: bool,
    /// A complete Liquid dataset already in the output is kept (else refused).
    pub reuse: bool,
    /// Profile as if reading through this bandwidth cap (bytes per second): the ratio then fits a job
    /// that reads the dataset from network storage of that bandwidth.
    pub bandwidth: Option<u64>,
}

impl Default for LiquidBuild {
    fn default() -> Self {
        LiquidBuild {
            threads: 0,
            io_threads: 2,
            seed: 0,
            probe_items: 32,
            probe_budget: 256 << 20,
            probe_time: Duration::from_millis(300),
            fitted: false,
            reuse: false,
            bandwidth: None,
        }
    }
}

/// What [`to_liquid`] reports as it goes.
#[derive(Debug)]
pub enum LiquidEvent<'a> {
    /// Profiling starts: images found, probe sample size, decode threads.
    Start {
        images: usize,
        probe_items: usize,
        threads: usize,
        /// The formats found, in order (`png+jpeg`).
        formats: String,
    },
    /// One probe of the search, as it is made.
    Probe(&'a Probe),
}

/// What [`to_liquid`] did.
#[derive(Clone, Debug)]
pub struct LiquidReport {
    /// The profile (`None` when an existing dataset was kept).
    pub profile: Option<Profile>,
    /// The ratio the dataset was written at.
    pub ratio: Ratio,
    pub items: usize,
}

struct ImageDecoder(Format);

impl Decoder for ImageDecoder {
    fn decode(&self, bytes: &[u8], out: &mut Vec<u8>) -> std::result::Result<Dims, String> {
        let mut img = Image {
            pixels: std::mem::take(out),
            ..Default::default()
        };
        let r = image::decode(self.0, bytes, Path::new(self.0.name()), &mut img);
        *out = img.pixels;
        r.map_err(|e| e.to_string())?;
        Ok(Dims {
            width: img.width,
            height: img.height,
            channels: img.channels,
        })
    }

    fn dims(&self, bytes: &[u8]) -> std::result::Result<Dims, String> {
        if self.0 == Format::L3 {
            // The whole file is at hand: the index takes the prefix it needs (a v2-ANS file's tables
            // included) from it.
            let idx =
                l3_format::L3Index::parse(bytes, bytes.len() as u64).map_err(|e| e.to_string())?;
            return Ok(Dims {
                width: idx.width(),
                height: idx.height(),
                channels: idx.channels(),
            });
        }
        let mut out = Vec::new();
        self.decode(bytes, &mut out)
    }
}

static PNG: ImageDecoder = ImageDecoder(Format::Png);
static JPEG: ImageDecoder = ImageDecoder(Format::Jpeg);
static L3: ImageDecoder = ImageDecoder(Format::L3);

/// The loader's decoders for the compressed formats a Liquid dataset may hold, by manifest tag.
pub fn decoders() -> [(&'static str, &'static dyn Decoder); 3] {
    [("png", &PNG), ("jpeg", &JPEG), ("l3", &L3)]
}

/// Profiles the images under `input` (PNG, JPEG or L3, labelled by sub-folder) and writes the Liquid
/// dataset at the chosen ratio into `output`. `on_event` hears of the start and of every probe.
pub fn to_liquid(
    input: &Path,
    output: &Path,
    build: &LiquidBuild,
    mut on_event: impl FnMut(LiquidEvent),
) -> Result<LiquidReport> {
    if crate::LiquidShards::is_dataset(output) {
        if !build.reuse {
            return Err(Error::dataset(
                output,
                "already holds a Liquid dataset; remove it first",
            ));
        }
        let ds = crate::LiquidShards::open(output)?;
        return Ok(LiquidReport {
            profile: None,
            ratio: ds.manifest().ratio,
            items: ds.len(),
        });
    }
    let folder = ImageFolder::open(input)?;
    let mut sources = Vec::with_capacity(folder.len());
    for i in 0..folder.len() {
        let f = folder.format(i);
        if !matches!(f, Format::Png | Format::Jpeg | Format::L3) {
            return Err(Error::dataset(
                folder.path(i),
                format!("a Liquid dataset stores PNG, JPEG or L3 items beside raw copies, not {f}"),
            ));
        }
        sources.push(SourceItem {
            id: i as u64,
            label: folder.label(i),
            path: folder.path(i).to_path_buf(),
            tag: f.name().into(),
        });
    }
    // Size the probe sample to the budget: each probe item is held compressed and raw.
    let first = &sources[0];
    let bytes = stdx::fs::read_regular(&first.path, image::max_image_bytes())
        .map_err(|e| Error::io(&first.path, e))?;
    let dims = ImageDecoder(folder.format(0))
        .dims(&bytes)
        .map_err(|e| Error::decode(&first.path, folder.format(0).name(), e))?;
    let per_item = dims.decoded_len() + bytes.len() as u64;
    let probe_items = build
        .probe_items
        .min((build.probe_budget / per_item.max(1)) as usize)
        .max(2);
    let threads = stdx::parallel::threads(build.threads);
    let mut formats: Vec<&str> = sources.iter().map(|s| s.tag.as_str()).collect();
    formats.dedup();
    on_event(LiquidEvent::Start {
        images: sources.len(),
        probe_items: probe_items.min(sources.len()),
        threads,
        formats: formats.join("+"),
    });
    let cfg = ProfileConfig {
        threads,
        io_threads: build.io_threads,
        seed: build.seed,
        probe_items,
        min_time: build.probe_time,
        scratch: output.to_path_buf(),
        bandwidth: build.bandwidth,
    };
    let created = !output.exists();
    std::fs::create_dir_all(output).map_err(|e| Error::io(output, e))?;
    let decs = decoders();
    let prof = liquid_sampler::profile::profile(&sources, &decs, &cfg, |p| {
        on_event(LiquidEvent::Probe(p))
    })
    .map_err(|e| Error::dataset(input, format!("Liquid profiler: {e}")));
    let prof = match prof {
        Ok(p) => p,
        Err(e) => {
            if created {
                // Nothing of this run may stay behind: the folder it made goes if it is still empty.
                let _ = std::fs::remove_dir(output);
            }
            return Err(e);
        }
    };
    let ratio = if build.fitted {
        prof.fitted.unwrap_or(prof.chosen)
    } else {
        prof.chosen
    };
    // The items' names first (by id, the folder's order), so that a dataset whose manifest exists has
    // them: masks and boxes kept beside it pair with its items by name.
    let names: Vec<String> = (0..folder.len())
        .map(|i| folder.name(i).unwrap_or_default())
        .collect();
    let names_path = output.join(crate::dataset::liquid::ITEM_NAMES);
    let json = serde_json::to_vec(&names).map_err(|e| Error::dataset(&names_path, e))?;
    stdx::fs::write_atomic(&names_path, &json).map_err(|e| Error::io(&names_path, e))?;
    let m = liquid_sampler::profile::write_dataset(&sources, &decs, ratio, build.seed, output)
        .map_err(|e| Error::dataset(output, format!("Liquid writer: {e}")))?;
    Ok(LiquidReport {
        profile: Some(prof),
        ratio,
        items: m.items.len(),
    })
}
