//! `cargo xtask bench onnx`, also the last part of `cargo xtask bench bsp`: bsp-tiling on ONNX CNNs —
//! bsp-tiling's test models (a U-Net with GroupNorm and skips, an ESRGAN-style 4× upscaler, a ResNet FCN
//! with BatchNorm and strides) and the candy TransformerNet exported to ONNX — in the exact, sampled and
//! naive modes, beside onnxruntime (CPU) on the whole image, in the same run: time, peak RSS, and each
//! output's largest difference from onnxruntime's over onnxruntime's largest magnitude.
//!
//! Every run is its own process, so its peak RSS is its own: ours is this binary re-executed with
//! `L3_ONNX_CHILD` set (`infer_io::infer_paths`, what `l3 infer` runs: `.npy` in, `.npy` out written
//! tile by tile), onnxruntime's a Python process (`onnx_bench.py`). Environment: `L3_BENCH_QUICK=1` (512²
//! only), `L3_ONNX_SIZES` (comma-separated sides; default 2048,8192), `L3_ONNX_MODES` (default
//! exact,sampled,naive), `L3_ONNX_MODELS` (default all four), `L3_ONNX_TILE` (default 512, `l3 infer`'s),
//! `L3_ONNX_UPSCALER_MAX` (largest side the 4× upscaler runs at, default 2048: its 8192² output alone is
//! 12 GiB of float32), `L3_ONNX_RUNS` (processes per pipeline and side, each side alternating; default 3
//! up to 2048², 1 above: one run of a small model varies by up to 2× on a shared VM, so the table gives
//! the median, the range beside it, and the ratio of medians).
//!
//! Then the streamed runs, at sides where no whole-image run fits (default 30,000²; 1024² with
//! `L3_BENCH_QUICK`; `L3_ONNX_STREAMED`, empty to skip): the photo mirrored out to the side as an L3 file
//! (made band by band through `L3Writer`), read by region, the output a PNG with rows streamed (a
//! float32 tiled BigTIFF for outputs that are not 1 or 3 channels), a 1 GiB activation budget; `L3_ONNX_STREAMED_MODELS` (default unet_gn) in `L3_ONNX_STREAMED_MODES` (default
//! recompute, sampled, naive: `exact` stores every activation, 100s of GB at 30,000², and is refused
//! before it starts when the spill disk cannot hold them — asked for, the table shows the refusal),
//! `L3_ONNX_STREAMED_TILE` (default 1024).

use super::child::{line_of, num, run_if_child};
use super::python::pip_install;
use crate::report::{Report, Table, corpus_dir, machine, workspace_root};
use anyhow::{Context, bail};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

const SCRIPT: &str = include_str!("onnx_bench.py");
const TRANSFORMER: &str = "candy_nc8.safetensors";
/// The input: this corpus photo's centre, mirrored out to the side (as `bench bsp` makes its input).
const PHOTO: &str = "Wood.jpg";

/// (model, what it is, input scale: 0..1 or 0..255).
const MODELS: &[(&str, &str, f32)] = &[
    (
        "unet_gn",
        "U-Net: GroupNorm, SiLU, skips, 2 resolutions",
        1.0,
    ),
    (
        "resnet_fcn",
        "ResNet FCN: BatchNorm, stride 8, ConvTranspose",
        1.0,
    ),
    (
        "esrgan_x4",
        "ESRGAN-style 4× upscaler: dense blocks, pixel shuffle",
        1.0,
    ),
    (
        "transformer",
        "candy TransformerNet (InstanceNorm), exported",
        255.0,
    ),
];

fn env_list(k: &str, default: &str) -> Vec<String> {
    std::env::var(k)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The child: one `l3 infer` run, one line of results on stdout.
pub(super) fn child(spec: &str) -> anyhow::Result<()> {
    let kv: HashMap<&str, &str> = spec.split(';').filter_map(|p| p.split_once('=')).collect();
    let get = |k: &str| {
        kv.get(k)
            .copied()
            .with_context(|| format!("child spec lacks {k}"))
    };
    let graph = infer_io::load_model(Path::new(get("model")?), None)?;
    let req = infer_io::InferRequest {
        input: get("in")?.into(),
        output: get("out")?.into(),
        mode: bsp_tiling::Mode::parse(get("mode")?).context("mode")?,
        tile: get("tile")?.parse()?,
        threads: get("threads")?.parse()?,
        budget: bsp_tiling::Budget {
            ram: kv.get("ram_mib").map_or(Ok(2048), |v| v.parse::<u64>())? << 20,
            disk: None,
            spill_dir: get("spill")?.into(),
        },
        full: true,
        in_scale: kv.get("in_scale").map_or(Ok(1.0), |v| v.parse())?,
        out_scale: kv.get("out_scale").map_or(Ok(1.0), |v| v.parse())?,
        out_dtype: kv
            .get("out_dtype")
            .map(|d| infer_io::tiff::OutDType::parse(d).context("out_dtype"))
            .transpose()?,
        device: bsp_tiling::DeviceOptions {
            device: kv
                .get("device")
                .map_or(Ok(Default::default()), |d| d.parse())?,
            gpu_memory: kv.get("gpu_memory").map(|v| v.parse()).transpose()?,
            ..Default::default()
        },
        page: None,
        level: None,
        ranks: None,
    };
    if let bsp_tiling::Device::Cuda(n) = req.device.device {
        // The context, NVRTC's compilation of the kernels (once per process) and cuDNN's loading happen
        // here, outside the timed run, as onnxruntime's session is made before its timed run.
        drop(bsp_tiling::CudaBackend::new(
            n,
            None,
            bsp_tiling::Precision::F32,
        )?);
    }
    let report = infer_io::infer_paths(&graph, &req)?;
    let (peak, _) = bsp_tiling::metrics::rss().unwrap_or((0, 0));
    let i = &report.info;
    println!(
        "ONNXCHILD secs={:.3} peak={peak} tiles={} devpeak={} copied={} kept={}",
        report.seconds, i.tiles, i.device_peak_bytes, i.device_copied_bytes, i.kept_values
    );
    Ok(())
}

struct Timed {
    secs: f64,
    peak: f64,
    tiles: Option<usize>,
}

/// Several runs of one pipeline: the median time (what the ratio compares), the fastest and slowest, and
/// the largest peak RSS.
struct Runs {
    median: f64,
    min: f64,
    max: f64,
    peak: f64,
    tiles: Option<usize>,
}

impl Runs {
    fn of(runs: &[Timed]) -> Option<Runs> {
        let mut secs: Vec<f64> = runs.iter().map(|t| t.secs).collect();
        secs.sort_by(f64::total_cmp);
        let n = secs.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => secs[n / 2],
            _ => (secs[n / 2 - 1] + secs[n / 2]) / 2.0,
        };
        Some(Runs {
            median,
            min: secs[0],
            max: secs[n - 1],
            peak: runs.iter().map(|t| t.peak).fold(0.0, f64::max),
            tiles: runs.first().and_then(|t| t.tiles),
        })
    }

    /// `0.52`, or `0.52 (0.49–0.61)` when there was more than one run.
    fn seconds(&self) -> String {
        if self.min == self.max {
            format!("{:.2}", self.median)
        } else {
            format!("{:.2} ({:.2}–{:.2})", self.median, self.min, self.max)
        }
    }
}

fn python(py: &Path, script: &Path, args: &[&str]) -> anyhow::Result<std::process::Output> {
    Command::new(py)
        .arg(script)
        .args(args)
        .output()
        .with_context(|| format!("running {} {}", script.display(), args.join(" ")))
}

/// The section's settings, from the environment (see the module documentation).
struct Settings {
    quick: bool,
    sizes: Vec<usize>,
    modes: Vec<String>,
    models: Vec<String>,
    tile: usize,
    upscaler_max: usize,
    threads: usize,
}

impl Settings {
    fn from_env() -> Settings {
        let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
        let number = |k: &str, default: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        Settings {
            quick,
            sizes: env_list("L3_ONNX_SIZES", if quick { "512" } else { "2048,8192" })
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect(),
            modes: env_list("L3_ONNX_MODES", "exact,sampled,naive"),
            models: env_list("L3_ONNX_MODELS", "unet_gn,resnet_fcn,esrgan_x4,transformer"),
            tile: number("L3_ONNX_TILE", 512),
            upscaler_max: number("L3_ONNX_UPSCALER_MAX", 2048),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// Processes per pipeline at `side`.
    fn runs(&self, side: usize) -> usize {
        std::env::var("L3_ONNX_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if side <= 2048 { 3 } else { 1 })
            .max(1)
    }
}

/// What every measurement runs with: the venv's Python and the helper script, the scratch folder, the
/// models built there, and this binary (re-executed as the child).
struct Bench {
    py: std::path::PathBuf,
    script: std::path::PathBuf,
    work: tempfile::TempDir,
    models_dir: std::path::PathBuf,
    exe: std::path::PathBuf,
    ort_version: Vec<String>,
}

impl Bench {
    /// Installs onnx and onnxruntime into the venv and builds the models.
    fn prepare() -> anyhow::Result<Bench> {
        let py = xtask::python::venv_python(&xtask::python::venv_dir())?;
        let ort_version = pip_install(&py, &["onnx", "onnxruntime"])
            .map_err(|e| anyhow::anyhow!("onnx and onnxruntime did not install: {e}"))?;
        let work = tempfile::Builder::new()
            .prefix("l3-bench-onnx-")
            .tempdir_in(workspace_root().join("target"))?;
        let script = work.path().join("onnx_bench.py");
        std::fs::write(&script, SCRIPT)?;
        let models_dir = work.path().join("models");
        let make = workspace_root().join("bsp-tiling/tests/onnx/make_models.py");
        let safetensors = corpus_dir().join("..").join("models").join(TRANSFORMER);
        let o = python(
            &py,
            &script,
            &[
                "models",
                &make.to_string_lossy(),
                &models_dir.to_string_lossy(),
                &safetensors.to_string_lossy(),
            ],
        )?;
        if !o.status.success() {
            bail!(
                "building the models failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(Bench {
            py,
            script,
            work,
            models_dir,
            exe: std::env::current_exe()?,
            ort_version,
        })
    }

    fn python(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        python(&self.py, &self.script, args)
    }

    /// The `side`² input at `scale` (made once, then reused).
    fn input(&self, side: usize, scale: f32) -> anyhow::Result<std::path::PathBuf> {
        let input = self.work.path().join(format!("in{side}-{scale}.npy"));
        if !input.exists() {
            let o = self.python(&[
                "input",
                &corpus_dir().join(PHOTO).to_string_lossy(),
                &side.to_string(),
                &scale.to_string(),
                &input.to_string_lossy(),
            ])?;
            if !o.status.success() {
                bail!(
                    "making the {side}² input failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        Ok(input)
    }
}

/// One pipeline's runs of one model at one side: the times, the first failure, and (ours) the output's
/// difference from onnxruntime's.
#[derive(Default)]
struct Pipeline {
    times: Vec<Timed>,
    err: Option<String>,
    diff: Option<String>,
}

/// onnxruntime's runs (the run alone, and from `np.load` to `np.save`) and each of our modes'.
struct Measured {
    ort: Pipeline,
    ort_e2e: Vec<Timed>,
    ours: Vec<Pipeline>,
}

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    run_if_child("L3_ONNX_CHILD", "onnx", child);
    let cfg = Settings::from_env();
    let bench = Bench::prepare()?;
    let mut table = Table::new(
        &format!(
            "ONNX CNNs: bsp-tiling (tile {}) vs onnxruntime on the whole image; {} threads",
            cfg.tile, cfg.threads
        ),
        &[
            "model",
            "side",
            "pipeline",
            "seconds: median (range)",
            "÷ onnxruntime (medians)",
            "peak RSS MiB",
            "max |diff| ÷ max |onnxruntime|",
        ],
    );
    let mut notes = Vec::new();
    for &(name, about, scale) in MODELS {
        if !cfg.models.iter().any(|w| w == name) {
            continue;
        }
        let model = bench.models_dir.join(format!("{name}.onnx"));
        for &side in &cfg.sizes {
            if name == "esrgan_x4" && side > cfg.upscaler_max {
                notes.push(format!(
                    "{name} is not run at {side}² (L3_ONNX_UPSCALER_MAX = {}): its \
                     output alone would be {:.0} GiB of float32.",
                    cfg.upscaler_max,
                    (side * 4) as f64 * (side * 4) as f64 * 12.0 / (1u64 << 30) as f64
                ));
                continue;
            }
            let input = bench.input(side, scale)?;
            let m = measure(&bench, &cfg, &model, &input, side, name)?;
            let label = format!("{name} ({about})");
            model_rows(&mut table, &mut notes, &cfg, &label, name, side, m);
        }
    }
    let norms = norms_table(&bench, &cfg, &mut notes)?;
    r.table(&table);
    r.table(&norms);
    r.para(&summary(&bench, &cfg));
    for n in notes {
        r.para(&format!("Note: {n}"));
    }
    streamed(
        r,
        bench.work.path(),
        &bench.models_dir,
        &bench.exe,
        cfg.threads,
        cfg.quick,
    )
}

/// Every pipeline on `model` at `side`, each several times; the runs alternate between the pipelines,
/// so that a busy spell of the machine falls on all.
fn measure(
    bench: &Bench,
    cfg: &Settings,
    model: &Path,
    input: &Path,
    side: usize,
    name: &str,
) -> anyhow::Result<Measured> {
    let n = cfg.runs(side);
    let ort_out = bench.work.path().join("ort.npy");
    let mut m = Measured {
        ort: Pipeline::default(),
        ort_e2e: Vec::new(),
        ours: cfg.modes.iter().map(|_| Pipeline::default()).collect(),
    };
    for run in 0..n {
        eprintln!("  {name} {side}²: onnxruntime (run {}/{n}) ...", run + 1);
        let o = bench.python(&[
            "ort",
            &model.to_string_lossy(),
            &input.to_string_lossy(),
            &ort_out.to_string_lossy(),
            &cfg.threads.to_string(),
        ])?;
        match line_of(&o, "ORT ") {
            Ok(kv) => {
                let timed = |secs: &str| Timed {
                    secs: num(&kv, secs),
                    peak: num(&kv, "peak"),
                    tiles: None,
                };
                m.ort.times.push(timed("secs"));
                m.ort_e2e.push(timed("e2e"));
            }
            Err(why) => {
                m.ort.err.get_or_insert(why);
            }
        }
        for (mode, ours) in cfg.modes.iter().zip(&mut m.ours) {
            eprintln!("  {name} {side}²: {mode} (run {}/{n}) ...", run + 1);
            our_run(bench, cfg, model, input, mode, &ort_out, ours)?;
        }
    }
    let _ = std::fs::remove_file(&ort_out);
    Ok(m)
}

/// One run of ours in `mode` (a child process: `l3 infer`'s code), compared with onnxruntime's output
/// the first time both exist (every run's output is the same bits).
fn our_run(
    bench: &Bench,
    cfg: &Settings,
    model: &Path,
    input: &Path,
    mode: &str,
    ort_out: &Path,
    p: &mut Pipeline,
) -> anyhow::Result<()> {
    let out = bench.work.path().join("ours.npy");
    let spill = bench.work.path().join("spill");
    std::fs::create_dir_all(&spill)?;
    let spec = format!(
        "model={};in={};out={};mode={mode};tile={};threads={};spill={}",
        model.display(),
        input.display(),
        out.display(),
        cfg.tile,
        cfg.threads,
        spill.display()
    );
    let o = Command::new(&bench.exe)
        .arg("onnx")
        .env("L3_ONNX_CHILD", &spec)
        .output()
        .context("starting the child")?;
    match line_of(&o, "ONNXCHILD ") {
        Ok(kv) => p.times.push(Timed {
            secs: num(&kv, "secs"),
            peak: num(&kv, "peak"),
            tiles: Some(num(&kv, "tiles") as usize),
        }),
        Err(why) => {
            p.err.get_or_insert(why);
        }
    }
    if p.diff.is_none() && ort_out.exists() && out.exists() {
        let o = bench.python(&[
            "compare",
            &out.to_string_lossy(),
            &ort_out.to_string_lossy(),
        ])?;
        p.diff = Some(match line_of(&o, "CMP ") {
            Ok(kv) => format!("{:.1e}", num(&kv, "rel")),
            Err(why) => why,
        });
    }
    let _ = std::fs::remove_file(&out);
    Ok(())
}

/// The table's rows for one model at one side: onnxruntime's two, then one per mode of ours.
fn model_rows(
    table: &mut Table,
    notes: &mut Vec<String>,
    cfg: &Settings,
    label: &str,
    name: &str,
    side: usize,
    m: Measured,
) {
    let ort = Runs::of(&m.ort.times);
    if let Some(why) = &m.ort.err {
        notes.push(format!("onnxruntime on {name} at {side}²: {why}"));
    }
    let row = |pipeline: String, secs: String, ratio: String, peak: String, diff: &str| {
        vec![
            label.to_string(),
            format!("{side}²"),
            pipeline,
            secs,
            ratio,
            peak,
            diff.to_string(),
        ]
    };
    let mib = |t: &Runs| format!("{:.0}", t.peak / 1048576.0);
    match &ort {
        Some(t) => {
            table.row(row(
                format!("onnxruntime, whole image ({} runs)", m.ort.times.len()),
                t.seconds(),
                "1.00×".into(),
                mib(t),
                "—",
            ));
            // Timed as ours are: from reading the input to the written output.
            if let Some(e) = Runs::of(&m.ort_e2e) {
                table.row(row(
                    "onnxruntime, with np.load and np.save".into(),
                    e.seconds(),
                    format!("{:.2}×", e.median / t.median),
                    mib(&e),
                    "—",
                ));
            }
        }
        None => table.row(row(
            "onnxruntime, whole image".into(),
            "failed".into(),
            "n/a".into(),
            "n/a".into(),
            "—",
        )),
    }
    for (mode, p) in cfg.modes.iter().zip(m.ours) {
        if let Some(why) = p.err {
            notes.push(format!("{mode} on {name} at {side}²: {why}"));
        }
        let Some(t) = Runs::of(&p.times) else {
            table.row(row(
                format!("bsp-tiling {mode}"),
                "failed".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a",
            ));
            continue;
        };
        table.row(row(
            format!(
                "bsp-tiling {mode} ({} tiles, {} runs)",
                t.tiles.map_or("?".into(), |n| n.to_string()),
                p.times.len()
            ),
            t.seconds(),
            ort.as_ref()
                .map_or("n/a".into(), |o| format!("{:.2}×", t.median / o.median)),
            mib(&t),
            p.diff.as_deref().unwrap_or("n/a"),
        ));
    }
}

/// The normalisation check: one node's statistics against float64, onnxruntime's and ours, at every side
/// whose 0..1 input was made.
fn norms_table(bench: &Bench, cfg: &Settings, notes: &mut Vec<String>) -> anyhow::Result<Table> {
    let mut norms = Table::new(
        "Normalisation statistics against float64: max |diff| ÷ max |float64 result| of one node on the \
         same input (0..1)",
        &["node", "side", "onnxruntime", "bsp-tiling exact"],
    );
    for &side in &cfg.sizes {
        let input = bench.work.path().join(format!("in{side}-1.npy"));
        if !input.exists() {
            continue;
        }
        eprintln!("  normalisations at {side}² ...");
        let o = bench.python(&[
            "norms",
            &input.to_string_lossy(),
            &bench.work.path().to_string_lossy(),
            &bench.exe.to_string_lossy(),
            &cfg.threads.to_string(),
        ])?;
        let stdout = String::from_utf8_lossy(&o.stdout);
        for line in stdout.lines().filter(|l| l.starts_with("NORM ")) {
            let kv: HashMap<&str, &str> = line[5..]
                .split(' ')
                .filter_map(|p| p.split_once('='))
                .collect();
            let get = |k: &str| kv.get(k).copied().unwrap_or("?").to_string();
            norms.row(vec![get("op"), format!("{side}²"), get("ort"), get("ours")]);
        }
        if !o.status.success() {
            notes.push(format!(
                "the normalisation check at {side}² failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
        }
    }
    Ok(norms)
}

/// The paragraph under the tables: what was run and how it was timed.
fn summary(bench: &Bench, cfg: &Settings) -> String {
    let threads = cfg.threads;
    format!(
        "Models: bsp-tiling/tests/onnx/make_models.py (the onnx helper API, seeded weights, opset 21), the \
         candy TransformerNet exported by the same script. Input: a float32 3×side×side array of {PHOTO}'s \
         centre, mirrored out to the side (0..1, or 0..255 for the TransformerNet). onnxruntime {} (CPU execution provider, \
         {threads} intra-op threads) runs the whole image in one `InferenceSession.run`, timed without \
         the session's creation (its second row: from `np.load` of the input to `np.save` of the output, \
         as ours are timed; the ratios compare with the first, the run alone); bsp-tiling is `l3 infer`'s code (`.npy` in, the `.npy` output written \
         tile by tile, a 2 GiB activation budget, the timed run includes reading the input and writing the \
         output). Each pipeline runs as several processes, alternating with the others; the table gives \
         the median time with the range, and the ratio of medians. exact = whole-image statistics by the BSP supersteps (the whole-image result up to float \
         summation order), sampled = statistics of the image downsampled 2× (the paper's BSP-sample: \
         approximate, its error depends on the content), naive = each tile with its own statistics and \
         no halo (seams; equal to exact when one tile covers the image). The differences from \
         onnxruntime in the models with image-wide normalisations grow with the image because \
         onnxruntime's float32 statistics drift from the float64 result (second table); bsp-tiling merges \
         its statistics in float64 (Chan/Welford), and its exact output equals its own whole-image \
         output. Peak RSS: each run's own process (VmHWM; ru_maxrss for Python). Machine: {}.",
        bench.ort_version.join(", "),
        machine()
    )
}

/// The photo mirrored out to `side`² as an 8-bit RGB L3 file at `path`, made a band of rows at a time
/// (the image is never whole in memory).
pub(super) fn mirrored_l3(path: &Path, side: usize) -> anyhow::Result<()> {
    let photo = image::open(corpus_dir().join(PHOTO))
        .with_context(|| format!("reading {PHOTO}"))?
        .to_rgb8();
    let (w, h) = (photo.width() as usize, photo.height() as usize);
    // The photo's centre, reflected at its edges as often as the side needs.
    let mirror = |i: usize, len: usize| {
        let i = (i + len.saturating_sub(side) / 2) % (2 * len);
        if i < len { i } else { 2 * len - 1 - i }
    };
    let xs: Vec<usize> = (0..side).map(|x| mirror(x, w)).collect();
    let side32 = u32::try_from(side).context("side")?;
    let mut writer = l3_format::L3Writer::new(path, side32, side32, 3, &Default::default())?;
    let band = 256;
    let mut rows = Vec::with_capacity(band * side * 3);
    for y0 in (0..side).step_by(band) {
        rows.clear();
        for y in y0..(y0 + band).min(side) {
            let src = photo.as_raw();
            let row = mirror(y, h) * w * 3;
            for &x in &xs {
                rows.extend_from_slice(&src[row + x * 3..row + x * 3 + 3]);
            }
        }
        writer.push_rows(&rows)?;
    }
    let out = writer.finish(std::io::BufWriter::new(stdx::fs::AtomicFile::create(path)?))?;
    out.into_inner().map_err(|e| e.into_error())?.commit()?;
    Ok(())
}

/// The streamed runs (see the module documentation): L3 in by region, PNG out with rows streamed.
fn streamed(
    r: &mut Report,
    work: &Path,
    models_dir: &Path,
    exe: &Path,
    threads: usize,
    quick: bool,
) -> anyhow::Result<()> {
    let mut notes = Vec::new();
    let sides: Vec<usize> = env_list("L3_ONNX_STREAMED", if quick { "1024" } else { "30000" })
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    if sides.is_empty() {
        return Ok(());
    }
    let models = env_list("L3_ONNX_STREAMED_MODELS", "unet_gn");
    let modes = env_list("L3_ONNX_STREAMED_MODES", "recompute,sampled,naive");
    // A tile's working set (every live value over the tile and its halo) comes on top of the activation
    // budget: 2048 took the U-Net just past 2 GiB at 30,000².
    let tile: usize = std::env::var("L3_ONNX_STREAMED_TILE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let ram_mib = 1024;
    let mut table = Table::new(
        &format!(
            "Streamed: an L3 input read by region, the output written as tiles complete (a PNG's rows, or \
             a float32 tiled BigTIFF); tile {tile}, a {ram_mib} MiB activation budget, {threads} threads"
        ),
        &[
            "model",
            "side",
            "pipeline",
            "seconds",
            "peak RSS MiB",
            "input (L3)",
            "output",
            "onnxruntime, whole image",
        ],
    );
    for &side in &sides {
        let input = work.join(format!("streamed{side}.l3"));
        eprintln!("  streamed {side}²: making the L3 input ...");
        mirrored_l3(&input, side).with_context(|| format!("making the {side}² L3 input"))?;
        let in_size = stdx::mem::human(std::fs::metadata(&input)?.len());
        for name in &models {
            let Some(&(_, about, scale)) = MODELS.iter().find(|m| m.0 == name) else {
                bail!("L3_ONNX_STREAMED_MODELS: unknown model {name:?}");
            };
            let model = models_dir.join(format!("{name}.onnx"));
            // An image's channels become a PNG; any other output (a segmentation's logits) is written raw,
            // as a float32 tiled BigTIFF.
            let graph = infer_io::load_model(&model, None)?;
            let (out_c, _, _) = infer_io::output_shape(&graph, side, side, true)?;
            let (out_name, out_dtype) = match out_c {
                1 | 3 => ("streamed.png", "uint8"),
                _ => ("streamed.tif", "float32"),
            };
            // What onnxruntime would hold before its first node: the float32 input alone.
            let ort = format!(
                "not run (its float32 input alone is {})",
                stdx::mem::human((3 * side * side * 4) as u64)
            );
            for mode in &modes {
                eprintln!("  streamed {name} {side}²: {mode} ...");
                let out = work.join(out_name);
                let spill = work.join("spill");
                std::fs::create_dir_all(&spill)?;
                // 8-bit pixels in, as the network was trained (0..1 or 0..255), and 8-bit out.
                let (in_scale, out_scale) = if scale == 1.0 {
                    (1.0 / 255.0, 255.0)
                } else {
                    (1.0, 1.0)
                };
                let spec = format!(
                    "model={};in={};out={};mode={mode};tile={tile};threads={threads};spill={};\
                     ram_mib={ram_mib};in_scale={in_scale};out_scale={out_scale};out_dtype={out_dtype}",
                    model.display(),
                    input.display(),
                    out.display(),
                    spill.display()
                );
                let o = Command::new(exe)
                    .arg("onnx")
                    .env("L3_ONNX_CHILD", &spec)
                    .output()
                    .context("starting the child")?;
                let label = format!("{name} ({about})");
                match line_of(&o, "ONNXCHILD ") {
                    Ok(kv) => table.row(vec![
                        label,
                        format!("{side}²"),
                        format!("bsp-tiling {mode} ({} tiles)", num(&kv, "tiles")),
                        format!("{:.1}", num(&kv, "secs")),
                        format!("{:.0}", num(&kv, "peak") / 1048576.0),
                        in_size.clone(),
                        std::fs::metadata(&out).map_or("?".into(), |m| {
                            format!("{} {}", stdx::mem::human(m.len()), out_name)
                        }),
                        ort.clone(),
                    ]),
                    Err(why) => {
                        notes.push(format!("streamed {mode} on {name} at {side}²: {why}"));
                        table.row(vec![
                            label,
                            format!("{side}²"),
                            format!("bsp-tiling {mode}"),
                            "refused or failed (note below)".into(),
                            "n/a".into(),
                            in_size.clone(),
                            "n/a".into(),
                            ort.clone(),
                        ]);
                    }
                }
                let _ = std::fs::remove_file(&out);
            }
        }
        let _ = std::fs::remove_file(&input);
    }
    r.table(&table);
    r.para(
        "Streamed runs: the input is the same photo's centre mirrored out to the side, stored as an \
         8-bit RGB L3 file (read by region: a tile's window reads and decodes only the patches under \
         it); a 1- or 3-channel output is 8-bit (clamped) in a PNG whose rows are written as each band \
         of tiles completes, any other (a segmentation's logits) the raw float32 output in a tiled \
         BigTIFF whose tiles are written as they complete. recompute = exact statistics (the BSP supersteps), recomputed per normalisation so \
         that no activation is stored: the exact result without the exact mode's disk. Peak RSS is the \
         run's own process (VmHWM).",
    );
    for n in notes {
        r.para(&format!("Note: {n}"));
    }
    Ok(())
}
