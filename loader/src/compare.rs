//! The same images in every format, streamed one epoch each through the same pipeline: the engine of
//! `l3 demo` and `cargo xtask bench loader`.

use crate::convert::{Target, convert_folder};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::folder::{ImageFolder, image_files};
use crate::image::Format;
use crate::loader::{Loader, LoaderOptions};
use crate::pcr_records::PcrRecords;
use crate::shards::LiquidShards;
use crate::stats::Stats;
use crate::synth;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// CPU time (user + system) this process has used so far, all threads together.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage writes a plain C struct we own; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Wall and CPU time since it started; displays as `1.2 s, 2.3 CPU s`.
pub struct Timer {
    wall: Instant,
    cpu: Duration,
}

impl Timer {
    pub fn start() -> Self {
        Timer {
            wall: Instant::now(),
            cpu: cpu_time(),
        }
    }
}

impl std::fmt::Display for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} s, {:.1} CPU s",
            self.wall.elapsed().as_secs_f64(),
            cpu_time().saturating_sub(self.cpu).as_secs_f64()
        )
    }
}

/// What streaming one epoch cost.
#[derive(Clone, Debug)]
pub struct Measured {
    pub images: u64,
    pub wall: Duration,
    /// Process CPU time spent during the epoch (every pipeline thread).
    pub cpu: Duration,
    pub stats: Stats,
}

impl Measured {
    pub fn images_per_sec(&self) -> f64 {
        self.images as f64 / self.wall.as_secs_f64().max(1e-9)
    }
    pub fn cpu_per_image(&self) -> Duration {
        self.cpu / self.images.max(1) as u32
    }
}

/// Streams exactly one epoch of `dataset` with `options` (its `epochs` is overridden) and measures it.
pub fn stream_epoch(dataset: Arc<dyn Dataset>, options: LoaderOptions) -> Result<Measured> {
    stream_epochs(dataset, options, 1)
}

/// Streams `epochs` epochs with one loader and measures them together (for datasets whose epoch is too
/// short to time on its own).
pub fn stream_epochs(
    dataset: Arc<dyn Dataset>,
    mut options: LoaderOptions,
    epochs: usize,
) -> Result<Measured> {
    options.epochs = Some(epochs.max(1));
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut loader = Loader::new(dataset, options)?;
    let mut images = 0u64;
    for b in loader.by_ref() {
        images += b?.len() as u64;
    }
    let stats = loader.stats();
    drop(loader);
    Ok(Measured {
        images,
        wall: t0.elapsed(),
        cpu: cpu_time().saturating_sub(cpu0),
        stats,
    })
}

/// One format of the comparison: a dataset to stream, or the reason there is none.
pub struct FormatEntry {
    pub name: String,
    pub dataset: std::result::Result<Arc<dyn Dataset>, String>,
    /// Stream with [`LoaderOptions::l3_window_decode`] (only the L3 patches under the crop).
    pub window: bool,
}

/// Writes `count` generated images (first half 1280×720, second half 1920×1080) as PNG files under
/// `dir/<scene kind>/`, so the sub-folder is the label. Skips files already there.
pub fn generate_default(
    dir: &Path,
    count: usize,
    seed: u64,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<()> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let err = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    let (w, h) = if i < count / 2 {
                        (1280, 720)
                    } else {
                        (1920, 1080)
                    };
                    let path = dir.join(synth::kind_name(i)).join(format!("img{i:04}.png"));
                    if !path.exists() {
                        let img = synth::generate(seed, i, w, h);
                        let r = crate::convert::encode(&img, Target::Png)
                            .map_err(|e| Error::decode(&path, "png", e))
                            .and_then(|bytes| crate::convert::write_atomic(&path, &bytes));
                        if let Err(e) = r {
                            err.lock().expect("error lock").get_or_insert(e);
                            return;
                        }
                    }
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, count);
                }
            });
        }
    });
    match err.into_inner().expect("error lock") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// How the comparison datasets are built.
#[derive(Clone, Debug)]
pub struct BuildPlan {
    pub threads: usize,
    pub seed: u64,
    /// JPEG quality of the JPEG copy the PCR dataset is built from.
    pub jpeg_quality: u8,
    /// Scan groups to read the PCR dataset at (`None` = full fidelity).
    pub pcr_groups: Vec<Option<usize>>,
    /// Include a Liquid L3+raw mix at the ratio the profiler picks.
    pub liquid: bool,
}

impl Default for BuildPlan {
    fn default() -> Self {
        BuildPlan {
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            seed: 0,
            jpeg_quality: 90,
            pcr_groups: vec![Some(5), None],
            liquid: true,
        }
    }
}

/// Converts the images of `png_dir` (PNG files, labelled by sub-folder) into every format under `work`,
/// and opens each as a dataset. A format that cannot be built gets its reason instead of a dataset.
/// `log` receives one line per step.
pub fn build_formats(
    png_dir: &Path,
    work: &Path,
    plan: &BuildPlan,
    log: &(dyn Fn(&str) + Sync),
) -> Vec<FormatEntry> {
    let mut out = Vec::new();
    let quiet = |_: usize, _: usize| {};
    let folder = |name: &str, dir: &Path| FormatEntry {
        name: name.into(),
        dataset: ImageFolder::open(dir)
            .map(|d| Arc::new(d) as Arc<dyn Dataset>)
            .map_err(|e| e.to_string()),
        window: false,
    };
    out.push(folder("PNG", png_dir));
    let converted = |name: &str, sub: &str, target: Target| -> (PathBuf, FormatEntry) {
        let dir = work.join(sub);
        let t0 = Timer::start();
        let entry = match convert_folder(png_dir, &dir, target, plan.threads, &quiet) {
            Ok(s) => {
                log(&format!(
                    "  {name}: {} converted, {} already there ({})",
                    s.converted, s.skipped, t0
                ));
                folder(name, &dir)
            }
            Err(e) => FormatEntry {
                name: name.into(),
                dataset: Err(format!("conversion failed: {e}")),
                window: false,
            },
        };
        (dir, entry)
    };
    let (l3_dir, l3) = converted("L3", "l3", Target::L3);
    // The same L3 files, decoding only the patches under each crop (what the loader does by default).
    let l3_window = FormatEntry {
        name: "L3, crop patches only".into(),
        dataset: l3.dataset.clone(),
        window: true,
    };
    out.extend([l3, l3_window]);
    let (_, raw) = converted("raw (PPM)", "raw", Target::Raw);
    out.push(raw);
    let (jpeg_dir, jpeg) = converted("JPEG q90", "jpeg", Target::Jpeg(plan.jpeg_quality));
    out.push(jpeg);

    if plan.liquid {
        let t0 = Timer::start();
        let entry = match build_liquid(&l3_dir, &work.join("liquid"), plan) {
            Ok((ds, ratio, probes)) => {
                log(&format!(
                    "  Liquid: profiler probed {probes} ratios, chose {ratio} L3:raw ({t0})"
                ));
                FormatEntry {
                    name: format!("Liquid L3+raw {ratio}"),
                    dataset: Ok(ds),
                    window: false,
                }
            }
            Err(e) => FormatEntry {
                name: "Liquid L3+raw".into(),
                dataset: Err(e.to_string()),
                window: false,
            },
        };
        out.push(entry);
    }

    if !plan.pcr_groups.is_empty() {
        let t0 = Timer::start();
        let pcr_dir = work.join("pcr");
        match build_pcr(&jpeg_dir, &pcr_dir, plan.threads) {
            Ok(()) => {
                log(&format!("  PCR: built from the JPEG copy ({t0})"));
                for g in &plan.pcr_groups {
                    let opened = PcrRecords::open(&pcr_dir, *g);
                    let name = match (&opened, g) {
                        (Ok(p), _) if p.group() == p.groups() => {
                            format!("PCR k={} (full)", p.group())
                        }
                        (Ok(p), _) => format!("PCR k={}", p.group()),
                        (Err(_), Some(k)) => format!("PCR k={k}"),
                        (Err(_), None) => "PCR (full)".into(),
                    };
                    out.push(FormatEntry {
                        name,
                        dataset: opened
                            .map(|d| Arc::new(d) as Arc<dyn Dataset>)
                            .map_err(|e| e.to_string()),
                        window: false,
                    });
                }
            }
            Err(e) => out.push(FormatEntry {
                name: "PCR".into(),
                dataset: Err(e.to_string()),
                window: false,
            }),
        }
    }
    out
}

/// Builds (or reuses) a PCR dataset in `out` from the JPEG files under `jpeg_dir`, labelled by sub-folder.
pub fn build_pcr(jpeg_dir: &Path, out: &Path, threads: usize) -> Result<()> {
    let files = image_files(jpeg_dir)?;
    let jpegs: Vec<&PathBuf> = files
        .iter()
        .filter(|(_, f)| *f == Format::Jpeg)
        .map(|(p, _)| p)
        .collect();
    if jpegs.is_empty() {
        return Err(Error::dataset(jpeg_dir, "no JPEG files to build PCRs from"));
    }
    if let Ok(existing) = pcr::Dataset::open(out)
        && existing.images() == jpegs.len()
    {
        return Ok(());
    }
    let inputs: Vec<pcr::Input> = jpegs
        .iter()
        .map(|rel| {
            let mut input = pcr::Input::new(jpeg_dir.join(rel));
            // Named by its path under the folder: class folders may hold files of the same name.
            input.name = rel.to_string_lossy().into_owned();
            let class = rel
                .parent()
                .and_then(|p| p.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned());
            input.label = Some(class.unwrap_or_default());
            input
        })
        .collect();
    let options = pcr::BuildOptions {
        threads: threads.max(1),
        ..pcr::BuildOptions::default()
    };
    pcr::build(out, &inputs, &options, &|_| {}).map_err(|e| Error::dataset(out, e))?;
    Ok(())
}

/// Profiles L3 against raw with `liquid-sampler`'s profiler and writes the mix at the chosen ratio into
/// `out` (reused when already there). Returns the dataset, the ratio and the number of probes.
pub fn build_liquid(
    l3_dir: &Path,
    out: &Path,
    plan: &BuildPlan,
) -> Result<(Arc<dyn Dataset>, String, usize)> {
    use liquid_sampler::profile::{ProfileConfig, SourceItem, profile, write_dataset};
    if LiquidShards::is_dataset(out)
        && let Ok(ds) = LiquidShards::open(out)
    {
        let ratio = ds.manifest().ratio.to_string();
        return Ok((Arc::new(ds), ratio, 0));
    }
    let folder = ImageFolder::open(l3_dir)?;
    let sources: Vec<SourceItem> = (0..folder.len())
        .map(|i| SourceItem {
            id: i as u64,
            label: folder.label(i),
            path: folder.path(i).to_path_buf(),
            tag: folder.format(i).name().into(),
        })
        .collect();
    let l3 =
        |bytes: &[u8], out: &mut Vec<u8>| -> std::result::Result<liquid_sampler::Dims, String> {
            let mut img = crate::image::Image {
                pixels: std::mem::take(out),
                ..Default::default()
            };
            let r = crate::image::decode(Format::L3, bytes, Path::new("l3"), &mut img)
                .map_err(|e| e.to_string());
            *out = img.pixels;
            r?;
            Ok(liquid_sampler::Dims {
                width: img.width,
                height: img.height,
                channels: img.channels,
            })
        };
    let decoders: [(&str, &dyn liquid_sampler::Decoder); 1] = [("l3", &l3)];
    let scratch = out.with_extension("profile-scratch");
    let cfg = ProfileConfig {
        threads: plan.threads,
        io_threads: 2,
        seed: plan.seed,
        probe_items: sources.len().min(16),
        min_time: Duration::from_millis(100),
        scratch: scratch.clone(),
    };
    let prof = profile(&sources, &decoders, &cfg, |_| {})
        .map_err(|e| Error::dataset(l3_dir, format!("Liquid profiler: {e}")));
    let _ = std::fs::remove_dir_all(&scratch);
    let prof = prof?;
    let ratio = prof.fitted.unwrap_or(prof.chosen);
    write_dataset(&sources, &decoders, ratio, plan.seed, out)
        .map_err(|e| Error::dataset(out, format!("Liquid writer: {e}")))?;
    let ds = LiquidShards::open(out)?;
    Ok((Arc::new(ds), ratio.to_string(), prof.probes.len()))
}
