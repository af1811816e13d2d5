//! The same images in every format, streamed one epoch each through the same loader: the engine of
//! `l3 demo` and `cargo xtask bench loader`.

use loader::convert::{ConvertOptions, LiquidBuild, PcrBuild, Target, convert_folder};
use loader::{
    Dataset, DecodeScope, Error, ImageFolder, LiquidShards, Loader, LoaderOptions, PcrRecords,
    Result, Stats,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// CPU time (user + system) this process has used so far, all threads together.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage writes a plain C struct we own; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is our own writable `rusage`; RUSAGE_SELF is always a valid target.
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
#[derive(Clone)]
pub struct FormatEntry {
    pub name: String,
    pub dataset: std::result::Result<Arc<dyn Dataset>, String>,
    /// How much of each item to decode (L3: only the patches under the crop, or whole images).
    pub decode: DecodeScope,
    /// Where the dataset is and, for PCR, the scan group: to open it again with other storage options.
    pub path: PathBuf,
    pub group: Option<usize>,
}

impl FormatEntry {
    /// The same dataset read through `storage` (a bandwidth cap, say).
    pub fn reopen(&self, storage: &loader::StorageOptions) -> Result<Arc<dyn Dataset>> {
        self.reopen_with(loader::OpenOptions {
            storage: storage.clone(),
            ..loader::OpenOptions::default()
        })
    }

    /// The same dataset opened with `options` (its own scan group in place of theirs).
    pub fn reopen_with(&self, options: loader::OpenOptions) -> Result<Arc<dyn Dataset>> {
        let options = loader::OpenOptions {
            group: self.group,
            ..options
        };
        loader::open_dataset(&self.path, &options)
    }
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
    let done = AtomicUsize::new(0);
    stdx::parallel::for_each(0..count, threads, |i| {
        let (w, h) = if i < count / 2 {
            (1280, 720)
        } else {
            (1920, 1080)
        };
        let path = dir
            .join(crate::synth::kind_name(i))
            .join(format!("img{i:04}.png"));
        if !path.exists() {
            let img = crate::synth::generate(seed, i, w, h);
            let bytes = loader::convert::encode(&img, Target::Png).map_err(|e| Error::Decode {
                path: path.clone(),
                format: "png",
                reason: e,
            })?;
            stdx::fs::write_atomic(&path, &bytes).map_err(|e| Error::Io {
                path: path.clone(),
                source: e,
            })?;
        }
        progress(done.fetch_add(1, Ordering::Relaxed) + 1, count);
        Ok(())
    })
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
    /// Images per PCR record.
    pub pcr_images_per_record: usize,
    /// Include a Liquid L3+raw mix at the ratio the profiler picks.
    pub liquid: bool,
}

impl Default for BuildPlan {
    fn default() -> Self {
        BuildPlan {
            threads: stdx::parallel::threads(0),
            seed: 0,
            jpeg_quality: 90,
            pcr_groups: vec![Some(5), None],
            pcr_images_per_record: PcrBuild::default().images_per_record,
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
    let whole = DecodeScope::Whole;
    let folder = |name: &str, dir: &Path, decode| FormatEntry {
        name: name.into(),
        dataset: ImageFolder::open(dir)
            .map(|d| Arc::new(d) as Arc<dyn Dataset>)
            .map_err(|e| e.to_string()),
        decode,
        path: dir.to_path_buf(),
        group: None,
    };
    out.push(folder("PNG", png_dir, whole));
    let opts = ConvertOptions {
        threads: plan.threads,
        to_8bit: false,
    };
    let converted = |name: &str, sub: &str, target: Target| -> (PathBuf, FormatEntry) {
        let dir = work.join(sub);
        let t0 = Timer::start();
        let entry = match convert_folder(png_dir, &dir, target, &opts, &|_, _| {}) {
            Ok(s) => {
                log(&format!(
                    "  {name}: {} converted, {} already there ({})",
                    s.converted, s.skipped, t0
                ));
                folder(name, &dir, whole)
            }
            Err(e) => FormatEntry {
                name: name.into(),
                dataset: Err(format!("conversion failed: {e}")),
                decode: whole,
                path: dir.clone(),
                group: None,
            },
        };
        (dir, entry)
    };
    let (l3_dir, l3) = converted("L3", "l3", Target::L3_DEFAULT);
    // The same L3 files, reading and decoding only the patches under each crop (the loader's default).
    let l3_region = FormatEntry {
        name: "L3, crop patches only".into(),
        dataset: l3.dataset.clone(),
        decode: DecodeScope::Region,
        path: l3.path.clone(),
        group: None,
    };
    out.extend([l3, l3_region]);
    let (_, raw) = converted("raw (PPM)", "raw", Target::Raw);
    out.push(raw);
    let (jpeg_dir, jpeg) = converted("JPEG q90", "jpeg", Target::Jpeg(plan.jpeg_quality));
    out.push(jpeg);

    if plan.liquid {
        out.push(build_liquid(&l3_dir, &work.join("liquid"), plan, None, log));
    }

    if !plan.pcr_groups.is_empty() {
        let t0 = Timer::start();
        let pcr_dir = work.join("pcr");
        let build = PcrBuild {
            threads: plan.threads,
            images_per_record: plan.pcr_images_per_record,
            ..PcrBuild::default()
        };
        match loader::convert::to_pcr(&jpeg_dir, &pcr_dir, &build) {
            Ok(_) => {
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
                        decode: whole,
                        path: pcr_dir.clone(),
                        group: *g,
                    });
                }
            }
            Err(e) => out.push(FormatEntry {
                name: "PCR".into(),
                dataset: Err(e.to_string()),
                decode: whole,
                path: pcr_dir.clone(),
                group: None,
            }),
        }
    }
    out
}

/// A Liquid L3+raw dataset of the L3 folder `l3_dir`, written to `dir` at the ratio the profiler picks
/// — reading its probes through `bandwidth` (bytes per second) when given, so the ratio follows the
/// storage. An existing dataset in `dir` is kept. `log` receives the profiler's answer.
pub fn build_liquid(
    l3_dir: &Path,
    dir: &Path,
    plan: &BuildPlan,
    bandwidth: Option<u64>,
    log: &(dyn Fn(&str) + Sync),
) -> FormatEntry {
    let t0 = Timer::start();
    let build = LiquidBuild {
        threads: plan.threads,
        seed: plan.seed,
        probe_items: 16,
        probe_time: Duration::from_millis(100),
        reuse: true,
        bandwidth,
        ..LiquidBuild::default()
    };
    let storage = match bandwidth {
        Some(b) => format!("at {} MB/s", b as f64 / 1e6),
        None => "from the disk".into(),
    };
    let mut probes = 0;
    match loader::convert::to_liquid(l3_dir, dir, &build, |_| probes += 1)
        .and_then(|r| Ok((LiquidShards::open(dir)?, r)))
    {
        Ok((ds, r)) => {
            if probes > 0 {
                log(&format!(
                    "  Liquid: profiler {storage} probed {probes} ratios, chose {} L3:raw ({t0})",
                    r.ratio
                ));
            } else {
                log(&format!(
                    "  Liquid: kept the dataset profiled {storage} earlier, {} L3:raw",
                    r.ratio
                ));
            }
            FormatEntry {
                name: format!("Liquid L3+raw {}", r.ratio),
                dataset: Ok(Arc::new(ds)),
                decode: DecodeScope::Whole,
                path: dir.to_path_buf(),
                group: None,
            }
        }
        Err(e) => FormatEntry {
            name: "Liquid L3+raw".into(),
            dataset: Err(e.to_string()),
            decode: DecodeScope::Whole,
            path: dir.to_path_buf(),
            group: None,
        },
    }
}
