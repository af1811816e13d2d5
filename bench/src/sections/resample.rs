//! `cargo xtask bench resample`: what resampling costs per sample — the loader's integer resampler
//! (`Resampling`'s tables on the host, then `loader::transform`'s two passes: the AVX2 kernels where the
//! CPU has them, and the portable passes beside them) beside Pillow's `Image.resize` and torchvision's
//! `transforms.v2.functional` resize (uint8 tensor, antialiased) of the same sizes, measured in the same run on the
//! same machine, one thread each.
//!
//! Three shapes of the recipes users train with: a random-resized crop of a large photo to 224×224
//! (ImageNet), the DeepLab scale jitter (a 2048×1024 frame rescaled by 0.75, a 512×1024 crop of it), and
//! the evaluation resize (shorter side 256) of a 640×480 image with its 224 centre crop. Pillow resizes
//! the window (ImageNet) or the whole image and then crops (the others), as the torchvision recipes do
//! with PIL images; the loader computes only the kept outputs, from the window plus the filter's margin.

use crate::report::{Report, Table};
use loader::transform::resample::{Buffers, Source, bilinear_portable};
use loader::{Axis, Geometry, Interpolation, Rect, Resampling};
use std::process::Command;
use std::time::Instant;

struct Case {
    name: &'static str,
    image: (u32, u32),
    geometry: Geometry,
    /// The Pillow statement timed, over `img` (a PIL image of `image`'s size).
    pillow: &'static str,
    /// The torchvision statement timed, over `t` (a 3×H×W uint8 tensor of `image`'s size), with `F`
    /// = `torchvision.transforms.v2.functional`.
    torchvision: &'static str,
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
            torchvision: "F.resized_crop(t, 300, 1000, 1500, 2000, [224, 224], antialias=True)",
        },
        Case {
            name: "DeepLab: 2048×1024 × 0.75, crop 512×1024",
            image: (2048, 1024),
            geometry: g(
                resize_then_crop(2048, 1536, 256, 1024),
                resize_then_crop(1024, 768, 128, 512),
            ),
            pillow: "img.resize((1536, 768), Image.BILINEAR, reducing_gap=None).crop((256, 128, 1280, 640))",
            torchvision: "F.crop(F.resize(t, [768, 1536], antialias=True), 128, 256, 512, 1024)",
        },
        Case {
            name: "Evaluation: 640×480 → shorter side 256, centre 224",
            image: (640, 480),
            geometry: g(
                resize_then_crop(640, 341, 58, 224),
                resize_then_crop(480, 256, 16, 224),
            ),
            pillow: "img.resize((341, 256), Image.BILINEAR, reducing_gap=None).crop((58, 16, 282, 240))",
            torchvision: "F.crop(F.resize(t, [256, 341], antialias=True), 16, 58, 224, 224)",
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

/// Times a statement over `img` (PIL) or `t` (torch), whichever it names; prints microseconds, or one
/// line saying why it could not run.
const PEER: &str = r#"
import sys, time
import numpy as np
w, h, seconds, runs, stmt = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = np.random.default_rng(1)
px = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
try:
    if stmt.startswith("img."):
        from PIL import Image
        img = Image.fromarray(px, "RGB")
    else:
        import torch
        import torchvision.transforms.v2.functional as F
        torch.set_num_threads(1)
        t = torch.from_numpy(px).permute(2, 0, 1).contiguous()
except ImportError as e:
    print(f"not installed ({e.name})")
    sys.exit(0)
f = eval("lambda: " + stmt)
t0 = time.perf_counter(); f(); once = max(time.perf_counter() - t0, 1e-6)
n = max(1, int(seconds / once))
best = float("inf")
for _ in range(runs):
    start = time.perf_counter()
    for _ in range(n):
        f()
    best = min(best, (time.perf_counter() - start) / n)
print(best * 1e6)
"#;

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
    let (seconds, runs) = if quick { (0.5, 1) } else { (2.0, 3) };
    let python = xtask::python::venv_python(&xtask::python::venv_dir())?;
    #[cfg(target_arch = "x86_64")]
    let has_avx2 = std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let has_avx2 = false;
    let avx2 = if has_avx2 {
        "AVX2"
    } else {
        "portable: no AVX2 here"
    };
    let mut table = Table::new(
        "Resampling one sample (bilinear, antialiased; RGB u8; one thread)",
        &[
            "recipe",
            &format!("loader µs ({avx2})"),
            "loader portable µs",
            "of which tables µs",
            "Pillow µs",
            "torchvision µs",
            "Pillow ÷ loader",
            "torchvision ÷ loader",
        ],
    );
    // One peer statement timed in the benchmark's Python: its microseconds, or why it has none.
    let peer = |stmt: &str, (w, h): (u32, u32)| -> Result<f64, String> {
        let out = Command::new(&python)
            .args(["-c", PEER])
            .args([
                w.to_string(),
                h.to_string(),
                seconds.to_string(),
                runs.to_string(),
            ])
            .arg(stmt)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        text.parse::<f64>().map_err(|_| {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.trim().lines().last().unwrap_or("").to_string();
            if text.is_empty() { last } else { text }
        })
    };
    let cell = |r: &Result<f64, String>, ours: f64| match r {
        Ok(p) => (format!("{p:.0}"), format!("{:.2}×", p / ours)),
        Err(why) => (why.clone(), "n/a".into()),
    };
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
        let portable = best_us(seconds, runs, || {
            let Resampling::Bilinear { x, y } = Resampling::new(&g, Interpolation::Bilinear) else {
                unreachable!("bilinear tables")
            };
            assert!(bilinear_portable(&src, &x, &y, &mut buf, &mut out));
        });
        let tables = best_us(seconds / 4.0, runs, || {
            std::hint::black_box(Resampling::new(&g, Interpolation::Bilinear));
        });
        let (pcell, pratio) = cell(&peer(case.pillow, (w, h)), ours);
        let (tcell, tratio) = cell(&peer(case.torchvision, (w, h)), ours);
        eprintln!(
            "  {}: loader {ours:.0} µs (portable {portable:.0}), Pillow {pcell} µs, torchvision {tcell} µs",
            case.name
        );
        table.row(vec![
            case.name.into(),
            format!("{ours:.0}"),
            format!("{portable:.0}"),
            format!("{tables:.0}"),
            pcell,
            tcell,
            pratio,
            tratio,
        ]);
    }
    r.para(&format!(
        "Each cell the best of {runs} timings of about {seconds} s, one thread, in this run on this \
         machine. Loader = `loader::Resampling::new` (the integer tables, computed on the host) and \
         `loader::transform::apply` (horizontal then vertical pass, Pillow's arithmetic; the AVX2 kernels where the \
         CPU has them, the portable passes — the same bytes — in their own column) from a decoded source; Pillow = \
         `Image.resize(..., Image.BILINEAR, reducing_gap=None)` of the same sizes in the benchmark's \
         Python environment, the window resized (ImageNet) or the whole image resized and then cropped \
         (the others, as torchvision does with PIL images); torchvision = `transforms.v2.functional` \
         `resize`/`resized_crop` of a uint8 tensor with `antialias=True` and `crop`, one torch thread \
         (where torch is not installed its cells say so). The loader's samples equal Pillow's within \
         ±1 per value (`bindings/python/tests/test_geometry.py`)."
    ));
    r.table(&table);
    Ok(())
}
