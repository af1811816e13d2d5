//! `cargo xtask bench tasks`: the recipes segmentation and classification users train with, through
//! `l3toolkit.Loader` beside what they write today — `torch.utils.data.DataLoader` with
//! `torchvision.transforms.v2` on `tv_tensors.Image` / `Mask` (PIL decode, as many workers as cores) —
//! in the same run on the same machine.
//!
//! The data: a Cityscapes-like set made from the corpus — every image resized to 2048×1024, its label
//! map by colour quantisation into 19 classes (8-bit PNG beside it, and one-channel L3 for the L3 rows),
//! the images stored as PNG, L3 and raw.
//! Two recipes: DeepLab (scale jitter 0.5–2.0, random 512×1024 crop padded where it reaches past the
//! image, flip, masks) and ImageNet (random-resized crop 224, scale (0.08, 1), flip). The loader rows
//! report the bytes they read per epoch (`stats()["bytes_read"]`); the peers read whole files.
//!
//! The peers, all on the PNG files with the same recipe and as many threads or workers as cores:
//! - DataLoader: the row above, torch and torchvision from pip (about 3 GB of wheels with their CUDA
//!   libraries).
//! - NVIDIA DALI's CPU pipeline (`nvidia-dali-cuda120` from pip, used with `device_id=None`: no GPU, no
//!   CUDA runtime): `fn.readers.file` over the same file list, `fn.decoders.image(device="cpu")` (masks
//!   as GRAY), DALI's own operators — `fn.resize` by a uniform factor (masks nearest) and
//!   `fn.crop(out_of_bounds_policy="pad")` with fill 0 / 255 for DeepLab, `fn.random_resized_crop` for
//!   ImageNet — and `fn.flip` driven by one `fn.random.coin_flip` shared by image and mask.
//! - SPDL (`spdl` from pip): `spdl.pipeline.PipelineBuilder` threads decoding with `spdl.io` (FFmpeg),
//!   the recipe as FFmpeg filters in the decode call (`scale`, `crop`, `hflip`; masks with
//!   `flags=neighbor`), as SPDL's documentation transforms while decoding. SPDL loads FFmpeg's shared
//!   libraries at run time; where they are missing the bench installs them with `apt-get`
//!   (`libavfilterN`, `libavdeviceN`: Debian's names, the newest the package index has).
//!
//! Before a peer row is timed the script checks one epoch of it against the recipe (every file once,
//! shapes and dtypes, mask values, padding, image and mask sharing window and flip), so a pipeline that
//! skips work cannot post a figure. Where a peer does not install, import or pass its check, its row
//! says why. `L3_BENCH_QUICK=1`: shorter timings.

use super::python::{load_average, pip_install};
use crate::report::{Report, Table, corpus_dir, machine};
use anyhow::Context;
use std::path::Path;
use std::process::Command;

const SCRIPT: &str = include_str!("tasks_bench.py");

/// (recipe, its description): the script's names.
const RECIPES: [(&str, &str); 2] = [
    (
        "deeplab",
        "DeepLab: jitter 0.5–2.0, random crop 512×1024, flip, masks; batch 8",
    ),
    (
        "imagenet",
        "ImageNet: random-resized crop 224 (scale 0.08–1), flip; batch 32",
    ),
];

/// (source, row, label) in table order; the DataLoader on PNG is every ratio's denominator.
const ROWS: [(&str, &str, &str); 7] = [
    ("png", "dataloader", "DataLoader + transforms.v2, PNG"),
    ("png", "dali", "NVIDIA DALI (CPU pipeline), PNG"),
    ("png", "spdl", "SPDL (FFmpeg filters), PNG"),
    ("png", "loader", "l3toolkit.Loader, PNG"),
    ("raw", "loader", "l3toolkit.Loader, raw"),
    ("l3", "loader", "l3toolkit.Loader, L3 (region reads)"),
    ("l3", "loader-whole", "l3toolkit.Loader, L3 (whole reads)"),
];

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
    let (seconds, runs) = if quick { (1.0, 1) } else { (4.0, 2) };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let python = xtask::python::venv_python(&xtask::python::venv_dir())?;
    xtask::python::install_package(&python, xtask::python::Build::Release)?;
    eprintln!("tasks bench: pip install torch torchvision (cached after the first time) ...");
    let torch = pip_install(&python, &["torch", "torchvision"]);
    if let Err(why) = &torch {
        eprintln!("tasks bench: torch did not install ({why}); its rows stay empty");
    }
    eprintln!(
        "tasks bench: pip install nvidia-dali-cuda120 (about 0.5 GB, cached after the first time) ..."
    );
    let dali = pip_install(&python, &["nvidia-dali-cuda120"]);
    eprintln!("tasks bench: pip install spdl, and FFmpeg's libraries where they are missing ...");
    let spdl = pip_install(&python, &["spdl"])
        .and_then(|v| ffmpeg_libraries().map(|libs| [v, libs].concat()));
    for (name, result) in [("DALI", &dali), ("SPDL", &spdl)] {
        if let Err(why) = result {
            eprintln!("tasks bench: {name} did not install ({why}); its rows stay empty");
        }
    }
    let work = tempfile::Builder::new()
        .prefix("l3-bench-tasks-")
        .tempdir()?;
    let script = work.path().join("tasks_bench.py");
    std::fs::write(&script, SCRIPT)?;
    let data = work.path().join("data");
    eprintln!(
        "tasks bench: a 2048×1024 segmentation set from {} ...",
        corpus_dir().display()
    );
    let status = Command::new(&python)
        .arg(&script)
        .arg("prepare")
        .arg(corpus_dir())
        .arg(&data)
        .status()
        .context("running the data preparation")?;
    anyhow::ensure!(status.success(), "preparing the data failed: {status}");
    let load_before = load_average();
    let ours = Ok(Vec::new());
    let mut notes = Vec::new();
    for (recipe, about) in RECIPES {
        let mut table = Table::new(
            &format!("{about}; {cores} cores"),
            &[
                "pipeline",
                "images/s",
                "÷ DataLoader (PNG)",
                "MB read per epoch",
            ],
        );
        let mut base = None;
        let mut whole_read = None;
        for (source, row, label) in ROWS {
            let installed = match row {
                "dataloader" => &torch,
                "dali" => &dali,
                "spdl" => &spdl,
                _ => &ours,
            };
            let result = if let Err(why) = installed {
                Err(format!("not installed: {why}"))
            } else {
                one_row(
                    &python, &script, &data, recipe, source, row, cores, seconds, runs,
                )?
            };
            eprintln!("  {recipe} {label}: {result:?}");
            let (ips, bytes) = match result {
                Ok(v) => v,
                Err(why) => {
                    notes.push(format!("{label} ({recipe}): {why}"));
                    table.row(vec![
                        label.into(),
                        "failed".into(),
                        "n/a".into(),
                        "n/a".into(),
                    ]);
                    continue;
                }
            };
            if row == "dataloader" {
                base = Some(ips);
            }
            if row == "loader-whole" {
                whole_read = Some(bytes);
            }
            let ratio = base.map_or("n/a".into(), |b| format!("{:.2}×", ips / b));
            table.row(vec![
                label.into(),
                format!("{ips:.1}"),
                ratio,
                format!("{:.1}", bytes / 1e6),
            ]);
        }
        r.table(&table);
        if let Some(w) = whole_read {
            notes.push(format!(
                "{recipe}: L3 whole reads take {:.1} MB per epoch; region reads read only the patches \
                 under each window plus the filter's margin.",
                w / 1e6
            ));
        }
    }
    r.para(&format!(
        "Source: {} resized to 2048×1024, label maps by colour quantisation into 19 classes (8-bit PNG for \
         the PNG and raw rows of the DeepLab recipe, one-channel L3 for its L3 rows); every file listed 8 \
         times (symbolic links), so an epoch holds many batches for the workers to share. Each cell: the best of {runs} timings of whole \
         epochs filling about {seconds} s, after a warm-up epoch, each row in its own process; files \
         just written (page cache). The DataLoader row: `torch.utils.data.DataLoader(num_workers={cores}, \
         persistent_workers=True, shuffle=True)` over a Dataset that opens each file with Pillow, wraps it \
         as `tv_tensors.Image` (and `tv_tensors.Mask`) and applies `transforms.v2` — `RandomResize(512, \
         2048)` of the shorter side, `RandomCrop((512, 1024), pad_if_needed=True)` with fill 0 / 255 and \
         `RandomHorizontalFlip()` for DeepLab, `RandomResizedCrop(224)` and the flip for ImageNet — and \
         the default collate (pip: {}). The DALI row (pip: {}): a CPU-only pipeline (`device_id=None`, \
         `num_threads={cores}`, batches as ours) — `fn.readers.file` (image and mask readers shuffled alike), \
         `fn.decoders.image(device=\"cpu\")` (masks as GRAY), for DeepLab `fn.resize` of the whole image by \
         `fn.random.uniform(0.5, 2.0)` (linear, antialiased; masks nearest) and `fn.crop` 512×1024 at a \
         uniform position with `out_of_bounds_policy=\"pad\"` (fill 0 / 255), for ImageNet \
         `fn.random_resized_crop(224, random_area=[0.08, 1])`, then `fn.flip` with one `fn.random.coin_flip` \
         for image and mask and `fn.transpose` to CHW; batches as NumPy (`as_array`). The SPDL row (pip: {}): \
         `PipelineBuilder` with decode concurrency {cores} on {cores} threads, `spdl.io` FFmpeg decoding \
         with the recipe as filters (`scale` bilinear, masks `flags=neighbor`; `crop`; `hflip`), parameters \
         drawn as torchvision draws them, NumPy pasting padded windows, CHW and batches. Each peer row is \
         checked first: one epoch must hold every file once, with its own mask, in the recipe's shapes and \
         dtypes, mask values in the 19 classes or 255, zero pixels under padding, and each mask agreeing \
         with its image's classes better than with the mirror image's (same window, same flip). The loader \
         rows: `l3toolkit.Loader` with the same recipe (`jitter=(0.5, 2.0), random_crop=True, crop=(512, \
         1024), masks=...` or `scale=(0.08, 1), crop=224`), `flip=True`, NCHW uint8, {cores} decode \
         threads, batches taken through `numpy.from_dlpack`. Machine: {}; load (1-minute average) {} at \
         the start and {} at the end.",
        corpus_dir().display(),
        installed_as(&torch),
        installed_as(&dali),
        installed_as(&spdl),
        machine(),
        load_before,
        load_average()
    ));
    for n in notes {
        r.para(&format!("Note: {n}"));
    }
    Ok(())
}

/// A peer's packages and versions as the report names them, or why it did not install.
fn installed_as(peer: &Result<Vec<String>, String>) -> String {
    match peer {
        Ok(v) => v.join(", "),
        Err(why) => format!("did not install here: {why}"),
    }
}

/// FFmpeg's shared libraries, which SPDL's `spdl.io` loads at run time (any FFmpeg from 4 on): nothing
/// when the dynamic linker already knows `libavfilter` and `libavdevice`, else Debian's packages of
/// the newest versions the package index lists, installed with `apt-get` (root only; the index is
/// refreshed once if the first try fails). Returns the packages installed, as the report names them.
fn ffmpeg_libraries() -> Result<Vec<String>, String> {
    let stems = ["libavfilter", "libavdevice"];
    let known = Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if stems.iter().all(|s| known.contains(&format!("{s}.so."))) {
        return Ok(Vec::new());
    }
    let newest = |stem: &str| -> Option<String> {
        let out = Command::new("apt-cache")
            .args(["pkgnames", stem])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| Some((l.strip_prefix(stem)?.parse::<u32>().ok()?, l.to_string())))
            .max()
            .map(|(_, name)| name)
    };
    let install = || -> Result<Vec<String>, String> {
        let packages: Vec<String> = stems
            .iter()
            .map(|s| newest(s).ok_or_else(|| format!("apt-cache lists no {s}N package")))
            .collect::<Result<_, _>>()?;
        let out = Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .map_err(|e| format!("running apt-get: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(format!(
                "apt-get install {} exited with {}: {last}",
                packages.join(" "),
                out.status
            ));
        }
        Ok(packages
            .into_iter()
            .map(|p| format!("{p} (apt-get)"))
            .collect())
    };
    install().or_else(|first| {
        let updated = Command::new("apt-get")
            .args(["update", "-q"])
            .output()
            .is_ok_and(|o| o.status.success());
        if updated {
            install()
        } else {
            Err(format!(
                "FFmpeg's libraries are missing and could not be installed: {first}"
            ))
        }
    })
}

/// One row of the script: (images/s, bytes read per epoch), or why it failed.
#[allow(clippy::too_many_arguments)]
fn one_row(
    python: &Path,
    script: &Path,
    data: &Path,
    recipe: &str,
    source: &str,
    row: &str,
    threads: usize,
    seconds: f64,
    runs: usize,
) -> anyhow::Result<Result<(f64, f64), String>> {
    let out = Command::new(python)
        .arg(script)
        .arg("run")
        .arg(data)
        .args([
            recipe,
            source,
            row,
            &threads.to_string(),
            &seconds.to_string(),
            &runs.to_string(),
        ])
        .output()
        .context("running the tasks benchmark")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    let mut cells = line.split('\t');
    Ok(match (cells.next(), cells.next()) {
        (Some("error"), Some(why)) => Err(why.to_string()),
        (Some(a), Some(b)) => match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(ips), Ok(bytes)) => Ok((ips, bytes)),
            _ => Err(format!("unreadable output {line:?}")),
        },
        _ => Err(format!(
            "no result ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )),
    })
}
