//! `cargo xtask bench python`: images/s from Python — `l3toolkit.Loader` on PNG, JPEG and L3 folders
//! beside what users run today on the same files in the same run: a `multiprocessing.Pool` of Pillow
//! decoders feeding NumPy batches (what torch's DataLoader does with worker processes) and SPDL (where
//! `pip install spdl` works) — and the cost of the Python boundary: the same loader options streamed
//! from Rust (what `l3 stream` runs), in the same run.
//!
//! Every row: 224×224 centre crops, batch 16, shuffled, NHWC uint8, all cores (decode threads, pool
//! processes, SPDL concurrency). The corpus is re-encoded as PNG, JPEG q90 and L3; the files were just
//! written, so they come from the page cache. The package is installed into `target/python/venv`
//! with pip, the release wheel users get (`cargo xtask test` installs its test build in the same
//! environment). `L3_BENCH_QUICK=1`: shorter timings.

use crate::report::{Report, Table, corpus_dir};
use anyhow::Context;
use l3_cli::compare::{stream_epoch, stream_epochs};
use loader::convert::{ConvertOptions, Target, convert_folder};
use loader::{Crop, Layout, LoaderOptions, OpenOptions, SampleSpec, open_dataset};
use std::path::Path;
use std::process::Command;

const SCRIPT: &str = include_str!("python_bench.py");
const BATCH: usize = 16;
const CROP: u32 = 224;

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
    let (seconds, runs) = if quick { (1.0, 1) } else { (3.0, 2) };
    let all = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let python = xtask::python::venv_python(&xtask::python::venv_dir())?;
    xtask::python::install_package(&python, xtask::python::Build::Release)?;
    let spdl = install_spdl(&python);
    if let Err(why) = &spdl {
        eprintln!("python bench: SPDL did not install ({why}); its column stays empty");
    }

    let load_before = load_average();
    let work = tempfile::Builder::new()
        .prefix("l3-bench-python-")
        .tempdir()?;
    let script = work.path().join("python_bench.py");
    std::fs::write(&script, SCRIPT)?;
    let opts = ConvertOptions {
        threads: all,
        to_8bit: false,
    };
    let png = work.path().join("png");
    eprintln!("python bench: converting {} ...", corpus_dir().display());
    convert_folder(&corpus_dir(), &png, Target::Png, &opts, &|_, _| {})
        .context("re-encoding the corpus as PNG")?;
    let jpeg = work.path().join("jpeg");
    convert_folder(&png, &jpeg, Target::Jpeg(90), &opts, &|_, _| {}).context("JPEG q90")?;
    let l3 = work.path().join("l3");
    convert_folder(&png, &l3, Target::L3_DEFAULT, &opts, &|_, _| {}).context("L3")?;

    let mut table = Table::new(
        &format!("Images/s from Python: {CROP}×{CROP} centre crops, batch {BATCH}, {all} cores"),
        &[
            "data",
            "`l3 stream` (Rust)",
            "l3toolkit.Loader",
            "Python boundary (Loader ÷ Rust)",
            "process pool",
            "Loader ÷ pool",
            "SPDL",
            "Loader ÷ SPDL",
        ],
    );
    let mut notes = Vec::new();
    let mut pool_png = None;
    let mut loader_l3 = None;
    for (name, fmt, dir) in [
        ("PNG", "png", &png),
        ("JPEG", "jpeg", &jpeg),
        ("L3", "l3", &l3),
    ] {
        // Rust before and after the Python rows (which time the Python loader first and last): both sides
        // sample the same stretch of a shared machine's time; each keeps its best.
        let rust_stream = || {
            rust_images_per_sec(dir, all, seconds, runs)
                .with_context(|| format!("streaming {name} from Rust"))
        };
        let before = rust_stream()?;
        let py = python_rows(&python, &script, dir, fmt, all, seconds, runs)?;
        let rust = before.max(rust_stream()?);
        eprintln!("  {name}: l3 stream {rust:.1} images/s");
        let get = |row: &str| py.iter().find(|(n, _)| n.starts_with(row)).cloned();
        let loader = match get("l3toolkit.Loader") {
            Some((_, Ok(v))) => v,
            Some((_, Err(e))) => anyhow::bail!("l3toolkit.Loader on {name}: {e}"),
            None => anyhow::bail!("l3toolkit.Loader on {name}: no result"),
        };
        let pool = get("Pool");
        let spdl_row = get("SPDL");
        let mut cell = |row: &Option<(String, Result<f64, String>)>| match row {
            Some((_, Ok(v))) => (format!("{v:.1}"), format!("{:.2}×", loader / v)),
            Some((n, Err(e))) => {
                notes.push(format!("{n} on {name}: {e}"));
                ("failed".into(), "n/a".into())
            }
            None => ("n/a".into(), "n/a".into()),
        };
        let (pool_cell, pool_ratio) = cell(&pool);
        let (spdl_cell, spdl_ratio) = cell(&spdl_row);
        if fmt == "png" {
            pool_png = pool.and_then(|(_, v)| v.ok());
        }
        if fmt == "l3" {
            loader_l3 = Some(loader);
        }
        table.row(vec![
            name.into(),
            format!("{rust:.1}"),
            format!("{loader:.1}"),
            format!("{:.2}", loader / rust),
            pool_cell,
            pool_ratio,
            spdl_cell,
            spdl_ratio,
        ]);
    }
    r.para(&format!(
        "Source: {} re-encoded as PNG, JPEG q90 and L3 (files just written: page cache). Every row: shuffled, \
         NHWC uint8 batches consumed through `numpy.from_dlpack` (or stacked by the parent for the pool); each \
         cell the best of {runs} timings of whole epochs filling about {seconds} s, after a warm-up epoch. \
         `l3 stream` = the same loader options streamed from Rust in this run, timed before and after the \
         Python rows, and the Python loader timed first and last among them (the best of each side); the \
         Python boundary column is Python images/s ÷ Rust images/s on the same data. Process pool = `multiprocessing.Pool({all})` of \
         Pillow decoders (crop after decode), batches stacked with NumPy — what torch's DataLoader does with \
         workers; for L3 the same pool calling `l3toolkit.decode_region`. SPDL {}: FFmpeg decode with a \
         crop filter, `PipelineBuilder` concurrency {all} (SPDL loads FFmpeg's shared libraries at run time: \
         Debian `apt-get install libavfilter8 libavdevice59`; it reads no L3).",
        corpus_dir().display(),
        match &spdl {
            Ok(version) => format!("{version} (installed with pip)"),
            Err(why) => format!("did not install here ({why})"),
        },
    ));
    r.table(&table);
    r.para(&format!(
        "Machine load (1-minute average, runnable tasks) at the start and end of this run: {} and {}, on \
         {all} cores: other jobs on the machine take their share of every column alike.",
        load_before,
        load_average()
    ));
    if let (Some(l), Some(p)) = (loader_l3, pool_png) {
        r.para(&format!(
            "Switching from PNG through a Pillow process pool to L3 through `l3toolkit.Loader`: {:.1}× the images/s.",
            l / p
        ));
    }
    for n in notes {
        r.para(&format!("Note: {n}"));
    }
    Ok(())
}

/// `pip install spdl` into the benchmark's environment: its version, or why it did not install (pip's
/// last lines), which the report quotes.
fn install_spdl(python: &Path) -> Result<String, String> {
    pip_install(python, &["spdl"]).map(|v| v.join(", "))
}

/// `pip install PACKAGES` into the benchmark's environment (a peer some machines cannot have): each
/// package as `name version`, or why they did not install (pip's last lines), which reports quote.
pub(super) fn pip_install(python: &Path, packages: &[&str]) -> Result<Vec<String>, String> {
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(packages)
        .output()
        .map_err(|e| format!("running pip: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = tail[tail.len().saturating_sub(3)..].join(" ");
        return Err(format!(
            "pip install {} exited with {}: {tail}",
            packages.join(" "),
            out.status
        ));
    }
    let v = Command::new(python)
        .args(["-m", "pip", "show", "--disable-pip-version-check"])
        .args(packages)
        .output()
        .map_err(|e| format!("running pip show: {e}"))?;
    let text = String::from_utf8_lossy(&v.stdout);
    let versions = text
        .lines()
        .filter_map(|l| l.strip_prefix("Version: "))
        .zip(packages)
        .map(|(v, p)| format!("{p} {v}"))
        .collect();
    Ok(versions)
}

/// The 1-minute load average (`/proc/loadavg`), which the report quotes: on a shared machine it says how
/// much of the cores the run had.
pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown (no /proc/loadavg)".into())
}

/// The loader's images/s from Rust with the options the Python rows use.
fn rust_images_per_sec(
    dir: &Path,
    threads: usize,
    seconds: f64,
    runs: usize,
) -> anyhow::Result<f64> {
    let ds = open_dataset(dir, &OpenOptions::default())?;
    let opts = LoaderOptions {
        batch_size: BATCH,
        decode_threads: threads,
        io_threads: 2,
        sample: SampleSpec {
            height: CROP,
            width: CROP,
            crop: Crop::Center,
            layout: Layout::Nhwc,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    };
    let probe = stream_epoch(ds.clone(), opts.clone())?;
    let epochs = ((seconds / probe.wall.as_secs_f64().max(1e-3)).round() as usize).max(1);
    let mut best = 0f64;
    for _ in 0..runs {
        best = best.max(stream_epochs(ds.clone(), opts.clone(), epochs)?.images_per_sec());
    }
    Ok(best)
}

/// The Python script's rows: (name, images/s or the reason it failed).
fn python_rows(
    python: &Path,
    script: &Path,
    dir: &Path,
    fmt: &str,
    threads: usize,
    seconds: f64,
    runs: usize,
) -> anyhow::Result<Vec<(String, Result<f64, String>)>> {
    let out = Command::new(python)
        .arg(script)
        .arg(dir)
        .args([
            fmt.to_string(),
            BATCH.to_string(),
            CROP.to_string(),
            threads.to_string(),
            seconds.to_string(),
            runs.to_string(),
        ])
        .output()
        .context("running the Python benchmark")?;
    if !out.status.success() {
        anyhow::bail!(
            "the Python benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut rows = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut cells = line.split('\t');
        let (Some(row), Some(value)) = (cells.next(), cells.next()) else {
            continue;
        };
        let value = match value.parse::<f64>() {
            Ok(v) => Ok(v),
            Err(_) => Err(cells.next().unwrap_or(value).to_string()),
        };
        eprintln!("  {fmt}: {row}: {value:?}");
        rows.push((row.to_string(), value));
    }
    Ok(rows)
}
