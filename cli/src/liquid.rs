//! `l3 liquid profile` (issue: liquid-sampler). A thin shell over the `liquid-sampler` crate; this file only
//! supplies the image decoders (PNG and JPEG through `image`, L3 through `l3-format`) and the console output.
//! `l3 stream DIR --sampler liquid` runs through the loader (`stream.rs`, `loader::Order::Liquid`).

use anyhow::{Context, bail};
use liquid_sampler::profile::{self, Decoder, ProfileConfig, SourceItem};
use liquid_sampler::{Dataset, Dims};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum LiquidCommand {
    /// Profile IN_DIR's images (PNG, JPEG or L3), print each probe and the chosen ratio, and write the
    /// multi-format dataset (compressed + raw RGB) to OUT_DIR.
    Profile(ProfileArgs),
}

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// Folder of images; images in sub-folders get one label per sub-folder (sorted by name).
    pub input: PathBuf,
    /// New dataset folder (must not already hold a Liquid dataset).
    pub output: PathBuf,
    /// Bytes the probe sample may hold in memory (both formats); default 256 MiB.
    #[arg(long)]
    pub budget: Option<u64>,
    /// Decode threads the training job grants the pipeline (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed for the probe sample and for which items are converted to raw.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Items in the probe sample (fewer if --budget says so).
    #[arg(long, default_value_t = 32)]
    pub probe_items: usize,
    /// Write the dataset at the fitted crossing (hundredths) rather than the paper's tenths.
    #[arg(long)]
    pub fitted: bool,
    /// Each probe measurement runs at least this many milliseconds.
    #[arg(long, default_value_t = 300)]
    pub probe_ms: u64,
}

pub fn run(c: LiquidCommand) -> anyhow::Result<()> {
    match c {
        LiquidCommand::Profile(a) => run_profile(a),
    }
}

/// The decoded pixels are RGB for PNG and JPEG (as the raw copies are) and the file's channels for L3.
fn decode_image(bytes: &[u8], out: &mut Vec<u8>) -> Result<Dims, String> {
    let img = image::load_from_memory(bytes).map_err(|e| e.to_string())?;
    let rgb = img.into_rgb8();
    let dims = Dims {
        width: rgb.width(),
        height: rgb.height(),
        channels: 3,
    };
    out.clear();
    out.extend_from_slice(rgb.as_raw());
    Ok(dims)
}

fn image_dims(bytes: &[u8]) -> Result<Dims, String> {
    let (width, height) = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| e.to_string())?
        .into_dimensions()
        .map_err(|e| e.to_string())?;
    Ok(Dims {
        width,
        height,
        channels: 3,
    })
}

fn decode_l3(bytes: &[u8], out: &mut Vec<u8>) -> Result<Dims, String> {
    let f = l3_format::L3File::parse(bytes).map_err(|e| e.to_string())?;
    out.resize(f.decoded_len(), 0);
    f.decode_hwc(out).map_err(|e| e.to_string())?;
    Ok(Dims {
        width: f.width(),
        height: f.height(),
        channels: f.channels(),
    })
}

struct ImageDecoder;
impl Decoder for ImageDecoder {
    fn decode(&self, bytes: &[u8], out: &mut Vec<u8>) -> Result<Dims, String> {
        decode_image(bytes, out)
    }
    fn dims(&self, bytes: &[u8]) -> Result<Dims, String> {
        image_dims(bytes)
    }
}

struct L3Decoder;
impl Decoder for L3Decoder {
    fn decode(&self, bytes: &[u8], out: &mut Vec<u8>) -> Result<Dims, String> {
        decode_l3(bytes, out)
    }
    fn dims(&self, bytes: &[u8]) -> Result<Dims, String> {
        let f = l3_format::L3File::parse(bytes).map_err(|e| e.to_string())?;
        Ok(Dims {
            width: f.width(),
            height: f.height(),
            channels: f.channels(),
        })
    }
}

static IMAGE: ImageDecoder = ImageDecoder;
static L3: L3Decoder = L3Decoder;

/// The compressed formats this tool decodes, by manifest tag.
fn decoders() -> [(&'static str, &'static dyn Decoder); 3] {
    [("png", &IMAGE), ("jpeg", &IMAGE), ("l3", &L3)]
}

fn tag_of(path: &Path) -> Option<&'static str> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "png" => Some("png"),
        "jpg" | "jpeg" => Some("jpeg"),
        "l3" => Some("l3"),
        _ => None,
    }
}

/// Images of `dir` in name order; images in sub-folders are labelled by sub-folder (ImageFolder style).
pub fn list_sources(dir: &Path) -> anyhow::Result<Vec<SourceItem>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    entries.sort();
    let mut out = Vec::new();
    let push = |path: PathBuf, label: u32, out: &mut Vec<SourceItem>| {
        if let Some(tag) = tag_of(&path) {
            out.push(SourceItem {
                id: out.len() as u64,
                label,
                path,
                tag: tag.into(),
            });
        }
    };
    let mut label = 0u32;
    for p in entries {
        if p.is_dir() {
            let mut inner: Vec<PathBuf> = std::fs::read_dir(&p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            inner.sort();
            for f in inner {
                push(f, label, &mut out);
            }
            label += 1;
        } else {
            push(p, 0, &mut out);
        }
    }
    if out.is_empty() {
        bail!("{}: no PNG, JPEG or L3 images", dir.display());
    }
    Ok(out)
}

fn threads_or_all(t: Option<usize>) -> usize {
    t.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
    .max(1)
}

fn run_profile(a: ProfileArgs) -> anyhow::Result<()> {
    let sources = list_sources(&a.input)?;
    if a.output
        .join(liquid_sampler::manifest::MANIFEST_NAME)
        .exists()
    {
        bail!(
            "{}: already holds a Liquid dataset; remove it first",
            a.output.display()
        );
    }
    std::fs::create_dir_all(&a.output)
        .with_context(|| format!("creating {}", a.output.display()))?;
    let threads = threads_or_all(a.threads);
    // Size the probe sample to the budget: each probe item is held compressed and raw.
    let budget = a.budget.unwrap_or(256 << 20);
    let first = &sources[0];
    let bytes =
        std::fs::read(&first.path).with_context(|| format!("reading {}", first.path.display()))?;
    let dec = decoders()
        .into_iter()
        .find(|d| d.0 == first.tag)
        .expect("tag is listed")
        .1;
    let dims = dec
        .dims(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", first.path.display()))?;
    let per_item = dims.decoded_len() + bytes.len() as u64;
    let probe_items = a
        .probe_items
        .min((budget / per_item.max(1)) as usize)
        .max(2);
    let cfg = ProfileConfig {
        threads,
        io_threads: 2,
        seed: a.seed,
        probe_items,
        min_time: Duration::from_millis(a.probe_ms),
        scratch: a.output.clone(),
    };
    let tags: Vec<&str> = {
        let mut t: Vec<&str> = sources.iter().map(|s| s.tag.as_str()).collect();
        t.dedup();
        t
    };
    let name = format!("{}:raw", tags.join("+"));
    println!(
        "profiling {} images from {} on {threads} decode threads ({} probe items, page cache bypassed)",
        sources.len(),
        a.input.display(),
        probe_items.min(sources.len())
    );
    let decs = decoders();
    let mut n = 0;
    let prof = profile::profile(&sources, &decs, &cfg, |p| {
        n += 1;
        println!(
            "probe {n}: ratio {} ({name})  load {:.1} images/s ({:.1} MB/s)  decode {:.1} images/s  -> {}",
            p.ratio,
            p.load_ips,
            p.load_mbps,
            p.decode_ips,
            if p.load_bound() { "loading is slower" } else { "decoding is slower" }
        );
    })
    .with_context(|| format!("profiling {}", a.input.display()))?;
    let chosen_ips = prof
        .probes
        .iter()
        .find(|p| p.ratio == prof.chosen)
        .map_or(0.0, |p| p.pipeline_ips());
    println!(
        "chosen ratio {} ({name}), {chosen_ips:.1} images/s at its probe",
        prof.chosen
    );
    if let Some(f) = prof.fitted {
        println!(
            "fitted crossing {f} ({name}) from {} probes",
            prof.probes.len()
        );
    }
    let ratio = if a.fitted {
        prof.fitted.unwrap_or(prof.chosen)
    } else {
        prof.chosen
    };
    let m = profile::write_dataset(&sources, &decs, ratio, a.seed, &a.output)
        .with_context(|| format!("writing {}", a.output.display()))?;
    let ds = Dataset {
        dir: a.output.clone(),
        manifest: m,
    };
    let counts = ds.counts();
    let parts: Vec<String> = ds
        .manifest
        .formats
        .iter()
        .zip(&counts)
        .map(|(f, c)| format!("{c} {}", f.tag))
        .collect();
    println!(
        "wrote {}: {} items ({}) at ratio {ratio}, {:.1} MB, seed {}",
        a.output.display(),
        ds.manifest.items.len(),
        parts.join(", "),
        ds.item_bytes() as f64 / 1e6,
        a.seed
    );
    Ok(())
}
