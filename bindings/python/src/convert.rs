//! `l3toolkit.convert`: a dataset folder into another format, through `loader::convert`.

use crate::errors::{Kind, detached, raise};
use loader::convert::{
    Conversion, ConvertOptions, LiquidBuild, PcrBuild, convert_folder, to_liquid, to_pcr,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Progress on stderr: `done/total` at most ten times a second, and the last one.
struct Progress {
    what: String,
    last: Mutex<Option<Instant>>,
}

impl Progress {
    fn update(&self, done: usize, total: usize) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if done < total && last.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
            return;
        }
        *last = Some(Instant::now());
        let end = if done == total { "\n" } else { "" };
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{}: {done}/{total}{end}", self.what);
        let _ = err.flush();
    }
}

/// Converts every image under ``src`` into ``dst`` in the format ``to``:
///
/// - ``"l3"``, ``"raw"`` (PPM/PGM/PAM), ``"png"``, ``"jpeg"`` (``quality``, default 90): one file per
///   image, sub-folders (labels) kept;
/// - ``"pcr"``: Progressive Compressed Records; JPEG inputs are transcoded losslessly, other inputs are
///   refused unless ``quality`` allows encoding them as JPEG first (lossy);
/// - ``"liquid"``: a Liquid multi-format dataset at the ratio its profiler picks for this machine.
///
/// For ``"l3"``, ``format`` (``"v1"`` or ``"v2"``) and ``profile`` (``"ans"`` or ``"bp"``) choose the L3
/// format as in ``encode`` (default: version 2 with profile ``"ans"``); they apply to ``to="l3"`` only.
///
/// Re-running resumes: outputs already complete are kept. ``progress`` prints ``done/total`` to stderr.
/// Returns a summary dict.
#[pyfunction]
#[pyo3(signature = (src, dst, to="l3", progress=true, *, quality=None, threads=None, to_8bit=false, format=None, profile=None))]
#[allow(clippy::too_many_arguments)]
pub fn convert<'py>(
    py: Python<'py>,
    src: PathBuf,
    dst: PathBuf,
    to: &str,
    progress: bool,
    quality: Option<u32>,
    threads: Option<usize>,
    to_8bit: bool,
    format: Option<&Bound<'py, PyAny>>,
    profile: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let chose = format.is_some_and(|f| !f.is_none()) || profile.is_some();
    let l3 = if to == "l3" {
        crate::codec::l3_format(py, format, profile)?
    } else {
        l3_format::DEFAULT_FORMAT
    };
    let conversion = Conversion::resolve(to, quality, l3, chose)
        .map_err(|e| raise(py, Kind::Options, e.to_string()))?;
    let threads = stdx::parallel::threads(threads.unwrap_or(0));
    let (target, quality) = match conversion {
        Conversion::Files(t) => (Some(t), None),
        Conversion::Pcr { lossy_quality } => (None, lossy_quality),
        Conversion::Liquid => (None, None),
    };
    let d = PyDict::new(py);
    d.set_item("to", to)?;
    d.set_item("output", &dst)?;
    let say = |line: String| {
        if progress {
            eprintln!("{line}");
        }
    };
    match (target, to) {
        (Some(target), _) => {
            let opts = ConvertOptions { threads, to_8bit };
            let bar = Progress {
                what: format!("convert to {to}"),
                last: Mutex::new(None),
            };
            let s = detached(py, || {
                Ok(convert_folder(
                    &src,
                    &dst,
                    target,
                    &opts,
                    &|done, total| {
                        if progress {
                            bar.update(done, total)
                        }
                    },
                )?)
            })?;
            d.set_item("converted", s.converted)?;
            d.set_item("skipped", s.skipped)?;
            d.set_item("bytes_written", s.bytes_written)?;
            d.set_item("stale_removed", s.stale_removed)?;
            d.set_item("warnings", s.warnings)?;
        }
        (None, "pcr") => {
            say(format!(
                "convert to pcr: building records from {} on {threads} threads ...",
                src.display()
            ));
            let build = PcrBuild {
                threads,
                lossy_quality: quality,
                ..PcrBuild::default()
            };
            let s = detached(py, || Ok(to_pcr(&src, &dst, &build)?))?;
            say(format!("convert to pcr: done ({})", dst.display()));
            d.set_item("reencoded", s.reencoded)?;
            d.set_item("reused", s.reused)?;
            d.set_item("warnings", s.warnings)?;
        }
        _ => {
            let build = LiquidBuild {
                threads,
                reuse: true,
                ..LiquidBuild::default()
            };
            let r = detached(py, || {
                Ok(to_liquid(&src, &dst, &build, |e| {
                    if let loader::convert::LiquidEvent::Start { images, .. } = e {
                        say(format!(
                            "convert to liquid: profiling {images} images on {threads} threads ..."
                        ))
                    }
                })?)
            })?;
            say(format!(
                "convert to liquid: {} items at ratio {} ({})",
                r.items,
                r.ratio,
                dst.display()
            ));
            d.set_item("items", r.items)?;
            d.set_item("ratio", r.ratio.to_string())?;
        }
    }
    Ok(d)
}
