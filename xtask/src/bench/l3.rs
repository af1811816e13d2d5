//! `cargo xtask bench l3`: the L3 codec against PNG (`png`, `zune-png`) and QOI on the real corpus, plus the
//! paper's Random and Black synthetic images, and the patch-size sweep N = 32, 64, 128.
//!
//! Speeds are MB/s of raw (decoded) pixels, 1 MB = 10⁶ bytes, best of several repetitions (the machine is
//! shared), summed over the corpus (total raw bytes / total best time). `L3_BENCH_QUICK=1` runs four images
//! with fewer repetitions.

use crate::report::{Report, Series, Table, bar_plot, corpus_dir, line_plot};
use anyhow::{Context, bail};
use l3_format::{L3File, default_patch_size, encode_parallel};
use std::path::Path;
use std::time::{Duration, Instant};

struct Image {
    name: String,
    w: u32,
    h: u32,
    c: u8,
    px: Vec<u8>,
    /// PNG bytes: the corpus file itself for PNGs, a `png`-crate re-encode (default settings) otherwise.
    png: Vec<u8>,
    png_is_source: bool,
    qoi: Vec<u8>,
}

impl Image {
    fn raw(&self) -> usize {
        self.px.len()
    }
}

fn load(path: &Path) -> anyhow::Result<Image> {
    use image::DynamicImage as D;
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let img =
        image::load_from_memory(&bytes).with_context(|| format!("decoding {}", path.display()))?;
    let (w, h) = (img.width(), img.height());
    let (px, c) = match img {
        D::ImageLuma8(b) => (b.into_raw(), 1),
        D::ImageRgb8(b) => (b.into_raw(), 3),
        D::ImageRgba8(b) => (b.into_raw(), 4),
        other => (other.to_rgb8().into_raw(), 3),
    };
    let is_png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    let png = if is_png {
        bytes
    } else {
        png_encode(&px, w, h, c)?
    };
    Ok(Image {
        name: path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into(),
        w,
        h,
        c,
        qoi: qoi_encode(&px, w, h, c)?,
        px,
        png,
        png_is_source: is_png,
    })
}

fn png_encode(px: &[u8], w: u32, h: u32, c: u8) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w, h);
    e.set_color(match c {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    });
    e.set_depth(png::BitDepth::Eight);
    let mut wr = e.write_header()?;
    wr.write_image_data(px)?;
    wr.finish()?;
    Ok(out)
}

/// QOI has no gray mode: gray images are expanded to RGB for it (none in the corpus).
fn qoi_pixels(px: &[u8], c: u8) -> std::borrow::Cow<'_, [u8]> {
    if c == 1 {
        px.iter()
            .flat_map(|&v| [v, v, v])
            .collect::<Vec<u8>>()
            .into()
    } else {
        px.into()
    }
}

fn qoi_encode(px: &[u8], w: u32, h: u32, c: u8) -> anyhow::Result<Vec<u8>> {
    Ok(qoi::encode_to_vec(qoi_pixels(px, c), w, h)?)
}

fn png_decode(bytes: &[u8], out: &mut [u8]) -> anyhow::Result<()> {
    let mut d = png::Decoder::new(std::io::Cursor::new(bytes));
    d.set_transformations(png::Transformations::EXPAND);
    let mut r = d.read_info()?;
    r.next_frame(out)?;
    Ok(())
}

fn zune_decode(bytes: &[u8], out: &mut [u8]) -> anyhow::Result<()> {
    let mut d = zune_png::PngDecoder::new(zune_core::bytestream::ZCursor::new(bytes));
    d.decode_into(out)
        .map_err(|e| anyhow::anyhow!("zune-png: {e:?}"))?;
    Ok(())
}

/// CPU time of the calling thread in seconds (`CLOCK_THREAD_CPUTIME_ID`, which the kernel brings up to date
/// on every read, unlike `/proc/.../schedstat`).
fn thread_cpu() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// `/proc/loadavg`'s first three fields, to tell the reader how busy the shared machine was.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Best time of `f` over repetitions: at least `min_reps`, continuing until `budget` has been spent.
/// Single-threaded runs (`cpu` = true) are timed by the thread's CPU time, so that other processes on a
/// shared machine do not count; multi-threaded runs by wall clock.
fn best_of(
    min_reps: usize,
    budget: Duration,
    cpu: bool,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut best = f64::MAX;
    let mut reps = 0;
    while reps < min_reps || start.elapsed() < budget {
        let (t, c) = (Instant::now(), if cpu { thread_cpu() } else { None });
        f()?;
        let dt = match (c, thread_cpu()) {
            (Some(a), Some(b)) if cpu && b > a => b - a,
            _ => t.elapsed().as_secs_f64(),
        };
        best = best.min(dt);
        reps += 1;
        if reps >= 50 {
            break;
        }
    }
    Ok(best)
}

fn best(
    min_reps: usize,
    budget: Duration,
    f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    best_of(min_reps, budget, true, f)
}

fn best_wall(
    min_reps: usize,
    budget: Duration,
    f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    best_of(min_reps, budget, false, f)
}

#[derive(Default, Clone, Copy)]
struct Acc {
    bytes: f64,
    secs: f64,
}
impl Acc {
    fn add(&mut self, bytes: usize, secs: f64) {
        self.bytes += bytes as f64;
        self.secs += secs;
    }
    fn mbs(&self) -> f64 {
        self.bytes / self.secs / 1e6
    }
}

const NS: [u8; 3] = [32, 64, 128];

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some_and(|v| v != "0");
    let (min_reps, budget) = if quick {
        (1, Duration::from_millis(50))
    } else {
        (2, Duration::from_millis(400))
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let load0 = loadavg();
    let dir = corpus_dir();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"))
        })
        .collect();
    paths.sort();
    if paths.is_empty() {
        bail!("no images in {}", dir.display());
    }
    if quick {
        let keep = [
            "Dune.jpg",
            "Storm.jpg",
            "UbuntuMateCold.png",
            "Gulp-rgba.png",
        ];
        paths.retain(|p| p.file_name().is_some_and(|n| keep.iter().any(|k| n == *k)));
    }

    r.para(&format!(
        "Corpus: {} images from `{}`{}. Raw = decoded 8-bit pixels (W×H×C); MB = 10⁶ raw bytes; speeds are the \
         best of ≥{min_reps} runs{}, summed over the corpus; single-threaded runs are timed by the thread's CPU \
         time (`CLOCK_THREAD_CPUTIME_ID`) because the machine is shared, multi-threaded runs by wall clock. Single-threaded unless marked; \"all cores\" = {cores} \
         threads (L3's patch-parallel decode/encode of one image). PNG and QOI decoders are single-threaded per \
         image, so they have no all-cores column. PNG sizes: the corpus PNGs as they are; the JPEGs re-encoded \
         with the `png` crate (default compression and filter). QOI: `qoi` crate. L3 at the default patch size \
         (`default_patch_size`) unless N is given. Ratio = compressed bytes / raw bytes (lower is better).",
        paths.len(),
        dir.display(),
        if quick { " (quick mode: L3_BENCH_QUICK)" } else { "" },
        if quick { "" } else { " within 0.4 s" },
    ));

    // Accumulators over the corpus.
    let (mut l3d1, mut l3dn, mut l3e1, mut l3en) = (
        Acc::default(),
        Acc::default(),
        Acc::default(),
        Acc::default(),
    );
    let (mut pngd, mut zuned, mut qoid, mut qoie) = (
        Acc::default(),
        Acc::default(),
        Acc::default(),
        Acc::default(),
    );
    let mut n_dec = [Acc::default(); 3];
    let mut n_decn = [Acc::default(); 3];
    let mut n_enc = [Acc::default(); 3];
    let mut n_bytes = [0usize; 3];
    let (mut raw_total, mut l3_total, mut png_total, mut qoi_total) =
        (0usize, 0usize, 0usize, 0usize);

    let mut per_image = Table::new(
        "Per image: ratio (compressed / raw) and single-threaded decode MB/s",
        &[
            "image",
            "W×H×C",
            "N",
            "L3 ratio",
            "PNG ratio",
            "QOI ratio",
            "L3 N=32",
            "L3 N=64",
            "L3 N=128",
            "L3 dec",
            "png dec",
            "zune-png dec",
            "QOI dec",
        ],
    );
    let mut buf = Vec::new();
    for path in &paths {
        let img = load(path)?;
        let (w, h, c) = (img.w, img.h, img.c);
        let raw = img.raw();
        buf.resize(raw, 0);
        let n = default_patch_size(w, h);
        let file = encode_parallel(&img.px, w, h, c, n, 1)?;
        let f = L3File::parse(&file)?;
        f.decode_hwc(&mut buf)?;
        if buf != img.px {
            bail!("{}: L3 round trip differs", img.name);
        }
        let t = best(min_reps, budget, || Ok(f.decode_hwc(&mut buf)?))?;
        l3d1.add(raw, t);
        let l3_single = raw as f64 / t / 1e6;
        l3dn.add(
            raw,
            best_wall(min_reps, budget, || {
                Ok(f.decode_hwc_parallel(&mut buf, cores)?)
            })?,
        );
        l3e1.add(
            raw,
            best(min_reps, budget, || {
                encode_parallel(&img.px, w, h, c, n, 1)?;
                Ok(())
            })?,
        );
        l3en.add(
            raw,
            best_wall(min_reps, budget, || {
                encode_parallel(&img.px, w, h, c, n, cores)?;
                Ok(())
            })?,
        );
        let tp = best(min_reps, budget, || png_decode(&img.png, &mut buf))?;
        pngd.add(raw, tp);
        let tz = best(min_reps, budget, || zune_decode(&img.png, &mut buf))?;
        zuned.add(raw, tz);
        if buf != img.px {
            bail!(
                "{}: zune-png output differs from the reference pixels",
                img.name
            );
        }
        let qpx = qoi_pixels(&img.px, c);
        let mut qbuf = vec![0u8; qpx.len()];
        let tq = best(min_reps, budget, || {
            qoi::decode_to_buf(&mut qbuf, &img.qoi)?;
            Ok(())
        })?;
        qoid.add(raw, tq);
        qoie.add(
            raw,
            best(min_reps, budget, || {
                qoi::encode_to_vec(&qpx, w, h)?;
                Ok(())
            })?,
        );
        let mut ratios = Vec::new();
        for (i, &nn) in NS.iter().enumerate() {
            let fi = encode_parallel(&img.px, w, h, c, nn, 1)?;
            let pf = L3File::parse(&fi)?;
            n_bytes[i] += fi.len();
            ratios.push(fi.len() as f64 / raw as f64);
            if !quick || i == 0 || nn == n {
                n_dec[i].add(
                    raw,
                    best(min_reps, budget, || Ok(pf.decode_hwc(&mut buf)?))?,
                );
                n_decn[i].add(
                    raw,
                    best_wall(min_reps, budget, || {
                        Ok(pf.decode_hwc_parallel(&mut buf, cores)?)
                    })?,
                );
                n_enc[i].add(
                    raw,
                    best(min_reps, budget, || {
                        encode_parallel(&img.px, w, h, c, nn, 1)?;
                        Ok(())
                    })?,
                );
            }
        }
        raw_total += raw;
        l3_total += file.len();
        png_total += img.png.len();
        qoi_total += img.qoi.len();
        let mbs = |t: f64| format!("{:.0}", raw as f64 / t / 1e6);
        per_image.row(vec![
            format!("{}{}", img.name, if img.png_is_source { "" } else { " †" }),
            format!("{w}×{h}×{c}"),
            n.to_string(),
            format!("{:.3}", file.len() as f64 / raw as f64),
            format!("{:.3}", img.png.len() as f64 / raw as f64),
            format!("{:.3}", img.qoi.len() as f64 / raw as f64),
            format!("{:.3}", ratios[0]),
            format!("{:.3}", ratios[1]),
            format!("{:.3}", ratios[2]),
            format!("{l3_single:.0}"),
            mbs(tp),
            mbs(tz),
            mbs(tq),
        ]);
        eprintln!("bench l3: {} done", img.name);
    }

    let mut speed = Table::new(
        "Throughput over the corpus (MB/s of raw pixels)",
        &[
            "codec",
            "decode, 1 thread",
            &format!("decode, {cores} threads"),
            "encode, 1 thread",
            &format!("encode, {cores} threads"),
        ],
    );
    let f0 = |a: &Acc| format!("{:.0}", a.mbs());
    speed.row(vec![
        "L3 (default N)".into(),
        f0(&l3d1),
        f0(&l3dn),
        f0(&l3e1),
        f0(&l3en),
    ]);
    speed.row(vec![
        "PNG (`png` crate)".into(),
        f0(&pngd),
        "—".into(),
        "—".into(),
        "—".into(),
    ]);
    speed.row(vec![
        "PNG (`zune-png`)".into(),
        f0(&zuned),
        "—".into(),
        "—".into(),
        "—".into(),
    ]);
    speed.row(vec![
        "QOI (`qoi` crate)".into(),
        f0(&qoid),
        "—".into(),
        f0(&qoie),
        "—".into(),
    ]);
    r.table(&speed);
    r.para(&format!(
        "Single-threaded L3 decode is **{:.1}×** the `png` crate, **{:.1}×** `zune-png` and **{:.1}×** QOI on this \
         corpus (target: ≥ 5× PNG, faster than QOI). L3 encode is {:.1}× QOI encode.",
        l3d1.mbs() / pngd.mbs(),
        l3d1.mbs() / zuned.mbs(),
        l3d1.mbs() / qoid.mbs(),
        l3e1.mbs() / qoie.mbs(),
    ));
    r.svg(
        "decode",
        bar_plot(
            "Single-threaded decode throughput over the corpus",
            "MB/s",
            &[
                ("L3".into(), l3d1.mbs()),
                ("QOI".into(), qoid.mbs()),
                ("PNG (zune-png)".into(), zuned.mbs()),
                ("PNG (png)".into(), pngd.mbs()),
            ],
        ),
    );

    let mut ratio = Table::new(
        "Compression ratio over the corpus (total compressed / total raw)",
        &["format", "ratio"],
    );
    ratio.row(vec![
        "L3 (default N)".into(),
        format!("{:.3}", l3_total as f64 / raw_total as f64),
    ]);
    for (i, nn) in NS.iter().enumerate() {
        ratio.row(vec![
            format!("L3, N = {nn}"),
            format!("{:.3}", n_bytes[i] as f64 / raw_total as f64),
        ]);
    }
    ratio.row(vec![
        "PNG (corpus files; † = JPEG re-encoded)".into(),
        format!("{:.3}", png_total as f64 / raw_total as f64),
    ]);
    ratio.row(vec![
        "QOI".into(),
        format!("{:.3}", qoi_total as f64 / raw_total as f64),
    ]);
    r.table(&ratio);

    let mut sweep = Table::new(
        "Patch size sweep over the corpus",
        &[
            "N",
            "ratio",
            "decode 1 thread MB/s",
            &format!("decode {cores} threads MB/s"),
            "encode 1 thread MB/s",
        ],
    );
    for (i, nn) in NS.iter().enumerate() {
        let s = |a: &Acc| {
            if a.secs > 0.0 {
                format!("{:.0}", a.mbs())
            } else {
                "—".into()
            }
        };
        sweep.row(vec![
            nn.to_string(),
            format!("{:.4}", n_bytes[i] as f64 / raw_total as f64),
            s(&n_dec[i]),
            s(&n_decn[i]),
            s(&n_enc[i]),
        ]);
    }
    r.table(&sweep);
    r.svg(
        "patch-size",
        line_plot(
            "L3 ratio vs patch size N (corpus)",
            "N",
            "compressed / raw",
            &[Series {
                name: "L3 ratio".into(),
                points: NS
                    .iter()
                    .enumerate()
                    .map(|(i, &nn)| (nn as f64, n_bytes[i] as f64 / raw_total as f64))
                    .collect(),
            }],
        ),
    );
    r.table(&per_image);

    // The paper's synthetic images.
    let (sw, sh) = (1920u32, 1080u32);
    let raw = (sw * sh * 3) as usize;
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let random: Vec<u8> = (0..raw)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u8
        })
        .collect();
    let black = vec![0u8; raw];
    let mut synth = Table::new(
        &format!(
            "Synthetic {sw}×{sh} RGB images (paper's Table 4): ratio, and single-threaded decode MB/s"
        ),
        &[
            "image",
            "L3 N=32",
            "L3 N=64",
            "L3 N=128",
            "PNG",
            "QOI",
            "L3 dec (N=64)",
            "png dec",
            "QOI dec",
        ],
    );
    for (name, px) in [("Random", &random), ("Black", &black)] {
        let mut cells = vec![name.to_string()];
        let mut f64s = Vec::new();
        for nn in NS {
            let f = encode_parallel(px, sw, sh, 3, nn, 0)?;
            cells.push(format!("{:.4}", f.len() as f64 / raw as f64));
            f64s.push(f);
        }
        let png = png_encode(px, sw, sh, 3)?;
        let q = qoi_encode(px, sw, sh, 3)?;
        cells.push(format!("{:.4}", png.len() as f64 / raw as f64));
        cells.push(format!("{:.4}", q.len() as f64 / raw as f64));
        buf.resize(raw, 0);
        let f = L3File::parse(&f64s[1])?;
        let mbs = |t: f64| format!("{:.0}", raw as f64 / t / 1e6);
        cells.push(mbs(best(min_reps, budget, || Ok(f.decode_hwc(&mut buf)?))?));
        cells.push(mbs(best(min_reps, budget, || png_decode(&png, &mut buf))?));
        cells.push(mbs(best(min_reps, budget, || {
            qoi::decode_to_buf(&mut buf, &q)?;
            Ok(())
        })?));
        synth.row(cells);
    }
    r.table(&synth);
    r.para(&format!(
        "Load average when the run started: {load0}; when it ended: {}. The {cores}-thread columns are wall-clock \
         and only mean something when the machine is otherwise idle.",
        loadavg()
    ));
    r.para(
        "Black costs L3 2 bytes per patch row per channel (nbit 0 still needs the 12-bit row header), hence its \
         ratio ≈ 2/N; Random is slightly above 1 because row headers come on top of 8-bit deltas. Both match the \
         paper's observation that L3 has no run-length or entropy stage.",
    );
    Ok(())
}
