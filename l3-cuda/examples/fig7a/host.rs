//! `--what host`: the host stage of the GPU path alone, measured on any machine. Per batch, on `t`
//! threads of stdx's pool: the files read from the page cache into buffers kept from batch to batch,
//! then `SamplePlan::new_parallel` (parse and plan) and `stage_into` (the patch bytes and tables) into
//! ordinary memory — everything a submit does before the copy to the device, into pinned staging there.

use super::{Res, Row};
use l3_cuda::{SampleOptions, SamplePlan, SampleSource};
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vocab::{DType, Layout, Normalize, Window};

/// FHD images/s one core must carry, twice its share of the end-to-end target on a 16-core machine
/// (README.md, "The host stage"): the larger of 2 × 2,816 / 16 (nvJPEG q90 on an H100) and
/// 2 × 20 × 171.6 / 16 (20× PNG on 16 cores).
pub const FHD_PER_CORE_TARGET: f64 = 429.0;

/// 1, 2, 4, … up to every core, and every core.
pub fn default_threads() -> Vec<usize> {
    let cores = stdx::parallel::threads(0);
    let mut v: Vec<usize> = std::iter::successors(Some(1), |t| Some(t * 2))
        .take_while(|&t| t < cores)
        .collect();
    v.push(cores);
    v
}

/// One row per thread count, then the scaling of 2 threads over 1 and the per-core rate at FHD.
pub fn host_stage(
    res: &'static str,
    batch: &[PathBuf],
    w: u32,
    h: u32,
    threads: &[usize],
    min: Duration,
) -> Res<Vec<Row>> {
    let opts = SampleOptions {
        layout: Layout::Nchw,
        dtype: DType::F16,
        normalize: Some(Normalize::IMAGENET),
        ..SampleOptions::new(w, h)
    };
    let windows = vec![Window::whole(w, h); batch.len()];
    let mut rows: Vec<Row> = Vec::new();
    for &t in threads {
        let m = measure(batch, &windows, &opts, t, min)?;
        let per_thread = m.images_per_s / t as f64;
        let mut extra = vec![
            ("threads", t as f64),
            ("staged_gb_s", m.staged_gb_s),
            ("images_per_s_per_thread", per_thread),
            ("images_per_cpu_s", m.images_per_cpu_s),
            ("read_share", m.shares[0]),
            ("plan_share", m.shares[1]),
            ("stage_share", m.shares[2]),
        ];
        if let Some(one) = rows.first().filter(|_| t == 2) {
            extra.push(("speedup_over_1", m.images_per_s / one.images_per_s));
        }
        if res == "fhd" {
            extra.push(("per_core_target", FHD_PER_CORE_TARGET));
        }
        rows.push(Row {
            res,
            method: format!("l3 host stage NCHW f16 t={t}"),
            images_per_s: m.images_per_s,
            extra,
        });
    }
    if let (Some(one), Some(two)) = (
        rows.iter().find(|r| r.method.ends_with("t=1")),
        rows.iter().find(|r| r.method.ends_with("t=2")),
    ) {
        println!(
            "host stage {res}: 2 threads = {:.2}x 1 thread (target >= 1.8x); 1 thread {:.0} images/s, \
             {:.0} images per CPU second{}",
            two.images_per_s / one.images_per_s,
            one.images_per_s,
            one.extra
                .iter()
                .find(|e| e.0 == "images_per_cpu_s")
                .map_or(f64::NAN, |e| e.1),
            if res == "fhd" {
                format!(" (per-core target >= {FHD_PER_CORE_TARGET:.0})")
            } else {
                String::new()
            }
        );
    }
    Ok(rows)
}

struct Measured {
    images_per_s: f64,
    /// Images per second of CPU time the process used (user + system): a core's rate, whatever else
    /// shares the machine; the wall-clock rates need the cores to themselves.
    images_per_cpu_s: f64,
    staged_gb_s: f64,
    /// Shares of the time in reading, planning and staging.
    shares: [f64; 3],
}

/// Batches on `t` threads until `min` has passed (after one warm-up batch, which sizes the buffers).
fn measure(
    batch: &[PathBuf],
    windows: &[Window],
    opts: &SampleOptions,
    t: usize,
    min: Duration,
) -> Res<Measured> {
    let mut files: Vec<Vec<u8>> = vec![Vec::new(); batch.len()];
    let mut staging: Vec<u8> = Vec::new();
    let (mut images, mut staged, mut spent) = (0usize, 0usize, [Duration::ZERO; 3]);
    let start = Instant::now();
    let mut cpu_start = cpu_seconds();
    for round in 0.. {
        let t0 = Instant::now();
        stdx::parallel::for_each(files.iter_mut().zip(batch), t, |(buf, path)| {
            buf.clear();
            std::fs::File::open(path)?.read_to_end(buf).map(|_| ())
        })?;
        let t1 = Instant::now();
        let sources: Vec<SampleSource<'_>> = files.iter().map(|f| SampleSource::File(f)).collect();
        let plan = SamplePlan::new_parallel(&sources, windows, opts, t)?;
        if staging.len() < plan.staged_len() {
            // Touched once here, as pinned staging is once allocated.
            staging.resize(plan.staged_len(), 0);
        }
        let t2 = Instant::now();
        plan.stage_into(&sources, &mut staging, t)?;
        let t3 = Instant::now();
        if round == 0 {
            cpu_start = cpu_seconds();
            continue;
        }
        images += batch.len();
        staged += plan.staged_len();
        for (s, d) in spent.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2]) {
            *s += d;
        }
        if start.elapsed() >= min && round >= 2 {
            break;
        }
    }
    let secs: f64 = spent.iter().map(Duration::as_secs_f64).sum();
    let cpu = cpu_seconds() - cpu_start;
    Ok(Measured {
        images_per_s: images as f64 / secs,
        images_per_cpu_s: images as f64 / cpu,
        staged_gb_s: staged as f64 / secs / 1e9,
        shares: spent.map(|d| d.as_secs_f64() / secs),
    })
}

/// User + system CPU seconds of this process so far (Linux: /proc/self/stat, in clock ticks of 1/100 s);
/// NaN elsewhere.
fn cpu_seconds() -> f64 {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The fields after the command name (which may hold spaces) start after its closing parenthesis.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split(' ').collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        });
    ticks.map_or(f64::NAN, |t| t / 100.0)
}
