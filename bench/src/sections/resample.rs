//! `cargo xtask bench resample`: what resampling costs per sample — the loader's integer resampler
//! (`Resampling`'s tables on the host, then `loader::transform`'s two passes) beside Pillow's `Image.resize` of the
//! same sizes, measured in the same run on the same machine, one thread each.
//!
//! Three shapes of the recipes users train with: a random-resized crop of a large photo to 224×224
//! (ImageNet), the DeepLab scale jitter (a 2048×1024 frame rescaled by 0.75, a 512×1024 crop of it), and
//! the evaluation resize (shorter side 256) of a 640×480 image with its 224 centre crop. Pillow resizes
//! the window (ImageNet) or the whole image and then crops (the others), as the torchvision recipes do
//! with PIL images; the loader computes only the kept outputs, from the window plus the filter's margin.

use crate::report::{Report, Table};
use loader::transform::resample::{Buffers, Source};
use loader::{Axis, Geometry, Interpolation, Rect, Resampling};
use std::process::Command;
use std::time::Instant;

struct Case {
    name: &'static str,
    image: (u32, u32),
    geometry: Geometry,
    /// The Pillow statement timed, over `img` (a PIL image of `image`'s size).
    pillow: &'static str,
}

fn resize_then_crop(len: u32, resized: u32, offset: u32, kept: u32) -> Axis {
    Axis {
        src: 0,
        src_len: len,
        dst_len: resized,
        offset,
        len: kept,
    }
}

fn cases() -> Vec<Case> {
    let window = |src, src_len, out| Axis {
        src,
        src_len,
        dst_len: out,
        offset: 0,
        len: out,
    };
    let g = |x, y| Geometry {
        x,
        y,
        dx: 0,
        dy: 0,
        flip: false,
    };
    vec![
        Case {
            name: "ImageNet: 2000×1500 window of 4097×2161 → 224×224",
            image: (4097, 2161),
            geometry: g(window(1000, 2000, 224), window(300, 1500, 224)),
            pillow: "img.resize((224, 224), Image.BILINEAR, box=(1000, 300, 3000, 1800), reducing_gap=None)",
        },
        Case {
            name: "DeepLab: 2048×1024 × 0.75, crop 512×1024",
            image: (2048, 1024),
            geometry: g(
                resize_then_crop(2048, 1536, 256, 1024),
                resize_then_crop(1024, 768, 128, 512),
            ),
            pillow: "img.resize((1536, 768), Image.BILINEAR, reducing_gap=None).crop((256, 128, 1280, 640))",
        },
        Case {
            name: "Evaluation: 640×480 → shorter side 256, centre 224",
            image: (640, 480),
            geometry: g(
                resize_then_crop(640, 341, 58, 224),
                resize_then_crop(480, 256, 16, 224),
            ),
            pillow: "img.resize((341, 256), Image.BILINEAR, reducing_gap=None).crop((58, 16, 282, 240))",
        },
    ]
}

fn pixels(w: u32, h: u32) -> Vec<u8> {
    let mut rng = stdx::SplitMix64::new(1);
    (0..w as usize * h as usize * 3)
        .map(|i| (i as u64 / 7 + (rng.next_u64() & 31)) as u8)
        .collect()
}

/// Best microseconds per call of `f` over `runs` timings of about `seconds` each.
fn best_us(seconds: f64, runs: usize, mut f: impl FnMut()) -> f64 {
    let t0 = Instant::now();
    f();
    let once = t0.elapsed().as_secs_f64().max(1e-6);
    let n = ((seconds / once) as usize).max(1);
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / n as f64);
    }
    best * 1e6
}

const PILLOW: &str = r#"
import sys, time
import numpy as np
from PIL import Image
w, h, seconds, runs, stmt = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = np.random.default_rng(1)
img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
f = eval("lambda: " + stmt)
t0 = time.perf_counter(); f(); once = max(time.perf_counter() - t0, 1e-6)
n = max(1, int(seconds / once))
best = float("inf")
for _ in range(runs):
    t = time.perf_counter()
    for _ in range(n):
        f()
    best = min(best, (time.perf_counter() - t) / n)
print(best * 1e6)
"#;

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
    let (seconds, runs) = if quick { (0.5, 1) } else { (2.0, 3) };
    let python = xtask::python::venv_python(&xtask::python::venv_dir())?;
    let mut table = Table::new(
        "Resampling one sample (bilinear, antialiased; RGB u8; one thread)",
        &[
            "recipe",
            "loader µs",
            "of which tables µs",
            "Pillow µs",
            "Pillow ÷ loader",
        ],
    );
    for case in cases() {
        let (w, h) = case.image;
        let px = pixels(w, h);
        let g = case.geometry;
        let plan = Resampling::new(&g, Interpolation::Bilinear);
        let need = plan.source();
        let stride = w as usize * 3;
        let src = Source {
            px: &px[need.y as usize * stride + need.x as usize * 3..],
            rect: Rect::new(need.x, need.y, need.w, need.h),
            channels: 3,
            stride,
        };
        let (mut buf, mut out) = (Buffers::default(), Vec::new());
        let ours = best_us(seconds, runs, || {
            let plan = Resampling::new(&g, Interpolation::Bilinear);
            assert!(loader::transform::apply(&plan, &src, &mut buf, &mut out));
        });
        let tables = best_us(seconds / 4.0, runs, || {
            std::hint::black_box(Resampling::new(&g, Interpolation::Bilinear));
        });
        let out = Command::new(&python)
            .args(["-c", PILLOW])
            .args([
                w.to_string(),
                h.to_string(),
                seconds.to_string(),
                runs.to_string(),
            ])
            .arg(case.pillow)
            .output()?;
        let pillow = String::from_utf8_lossy(&out.stdout).trim().parse::<f64>();
        let (pcell, ratio) = match pillow {
            Ok(p) => (format!("{p:.0}"), format!("{:.2}×", p / ours)),
            Err(_) => (
                format!("failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
                "n/a".into(),
            ),
        };
        eprintln!("  {}: loader {ours:.0} µs, Pillow {pcell} µs", case.name);
        table.row(vec![
            case.name.into(),
            format!("{ours:.0}"),
            format!("{tables:.0}"),
            pcell,
            ratio,
        ]);
    }
    r.para(&format!(
        "Each cell the best of {runs} timings of about {seconds} s, one thread, in this run on this \
         machine. Loader = `loader::Resampling::new` (the integer tables, computed on the host) and \
         `loader::transform::apply` (horizontal then vertical pass, Pillow's arithmetic) from a decoded source; Pillow = \
         `Image.resize(..., Image.BILINEAR, reducing_gap=None)` of the same sizes in the benchmark's \
         Python environment, the window resized (ImageNet) or the whole image resized and then cropped \
         (the others, as torchvision does with PIL images). The loader's samples equal Pillow's within \
         ±1 per value (`bindings/python/tests/test_geometry.py`)."
    ));
    r.table(&table);
    Ok(())
}
