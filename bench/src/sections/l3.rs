//! `cargo xtask bench l3`: L3 version 1 and version 2 (profiles BP and ANS) against PNG (`png`,
//! `zune-png`), QOI, WebP lossless and JPEG XL lossless (effort 1) on the real corpus, plus the paper's
//! Random and Black synthetic images and the patch-size sweeps.
//!
//! Ratios are compressed / raw bytes, summarised as the geometric mean over the images (every image counts
//! the same, whatever its size). Speeds are MB/s of raw (decoded) pixels, 1 MB = 10⁶ bytes, best of several
//! repetitions (the machine is shared), summed over the corpus (total raw bytes / total best time). L3
//! decode times start from the file's bytes: parsing (with version 2's CRC-32C check) is included. WebP and
//! JPEG XL come from their reference encoders' command-line tools (`cwebp`, `cjxl`), run in the same
//! benchmark on the same pixels, and their outputs are decoded back and checked to be lossless; a missing
//! tool is reported as missing. `L3_BENCH_QUICK=1` runs four images with fewer repetitions.

use crate::report::{Report, Series, Table, bar_plot, corpus_dir, line_plot};
use anyhow::{Context, bail};
use l3_format::{Choices, EncodeOptions, Format, L3File, Profile, encode_with};
use std::path::Path;
use std::process::Command;
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

/// An external lossless encoder run through its command-line tool.
struct Tool {
    /// Row label.
    label: &'static str,
    /// The encoder binary and the package that has it.
    bin: &'static str,
    package: &'static str,
    /// Output extension.
    ext: &'static str,
    /// Version line, or why the tool cannot be run (then it is reported, not measured).
    version: Result<String, String>,
}

impl Tool {
    fn probe(
        label: &'static str,
        bin: &'static str,
        package: &'static str,
        ext: &'static str,
        version_arg: &str,
    ) -> Tool {
        let version = match Command::new(bin).arg(version_arg).output() {
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stdout).to_string()
                    + &String::from_utf8_lossy(&o.stderr);
                Ok(text.lines().next().unwrap_or("").trim().to_string())
            }
            Err(e) => Err(format!(
                "`{bin}` could not be run ({e}); install it with `apt-get install {package}`"
            )),
        };
        Tool {
            label,
            bin,
            package,
            ext,
            version,
        }
    }

    /// Encodes the PNG at `input` losslessly into a file in `dir`; returns its bytes.
    fn encode(&self, input: &Path, dir: &Path) -> anyhow::Result<Vec<u8>> {
        let out = dir.join(format!("out.{}", self.ext));
        let mut cmd = Command::new(self.bin);
        match self.ext {
            // WebP lossless at cwebp's default effort (-q 75 -m 4 in lossless mode), alpha kept exactly.
            "webp" => cmd
                .args(["-lossless", "-exact", "-quiet", "-o"])
                .arg(&out)
                .arg(input),
            // JPEG XL, mathematically lossless (distance 0), effort 1: libjxl's fastest lossless mode.
            _ => cmd
                .arg(input)
                .arg(&out)
                .args(["-d", "0", "-e", "1", "--quiet"]),
        };
        let o = cmd
            .output()
            .with_context(|| format!("running {} ({})", self.bin, self.package))?;
        if !o.status.success() {
            bail!(
                "{} failed: {}",
                self.bin,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        std::fs::read(&out).with_context(|| format!("reading {}", out.display()))
    }

    /// Decodes `bytes` back (the `image` crate for WebP, `djxl` for JPEG XL) and checks the pixels.
    fn check_lossless(&self, bytes: &[u8], img: &Image, dir: &Path) -> anyhow::Result<()> {
        let back = match self.ext {
            "webp" => image::load_from_memory_with_format(bytes, image::ImageFormat::WebP)
                .context("decoding the WebP output")?,
            _ => {
                let (jxl, png) = (dir.join("back.jxl"), dir.join("back.png"));
                std::fs::write(&jxl, bytes)?;
                let o = Command::new("djxl")
                    .arg(&jxl)
                    .arg(&png)
                    .arg("--quiet")
                    .output()
                    .context("running djxl (libjxl-tools)")?;
                if !o.status.success() {
                    bail!("djxl failed: {}", String::from_utf8_lossy(&o.stderr).trim());
                }
                image::open(&png).context("reading djxl's PNG")?
            }
        };
        let px = match img.c {
            1 => back.to_luma8().into_raw(),
            3 => back.to_rgb8().into_raw(),
            _ => back.to_rgba8().into_raw(),
        };
        if px != img.px {
            bail!("{}: {} output is not lossless", img.name, self.label);
        }
        Ok(())
    }
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

/// How long and how often each measurement runs.
#[derive(Clone, Copy)]
struct Reps {
    min: usize,
    budget: Duration,
}

/// Best time of `f` over repetitions: at least `reps.min`, continuing until `reps.budget` has been spent.
/// Single-threaded runs (`cpu` = true) are timed by the thread's CPU time, so that other processes on a
/// shared machine do not count; multi-threaded runs by wall clock.
fn best_of(
    reps: Reps,
    cpu: bool,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut best = f64::MAX;
    let mut n = 0;
    while n < reps.min || start.elapsed() < reps.budget {
        let (t, c) = (Instant::now(), if cpu { thread_cpu() } else { None });
        f()?;
        let dt = match (c, thread_cpu()) {
            (Some(a), Some(b)) if cpu && b > a => b - a,
            _ => t.elapsed().as_secs_f64(),
        };
        best = best.min(dt);
        n += 1;
        if n >= 50 {
            break;
        }
    }
    Ok(best)
}

fn best(reps: Reps, f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    best_of(reps, true, f)
}

fn best_wall(reps: Reps, f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    best_of(reps, false, f)
}

/// Wall time of `cores` threads each running `f` once on its own buffer of `len` bytes at the same time:
/// the all-core throughput of a codec that decodes one image per thread (PNG, QOI).
fn best_images_parallel(
    reps: Reps,
    cores: usize,
    len: usize,
    f: impl Fn(&mut [u8]) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<f64> {
    let mut bufs: Vec<Vec<u8>> = (0..cores).map(|_| vec![0u8; len]).collect();
    best_wall(reps, || {
        std::thread::scope(|s| {
            let hs: Vec<_> = bufs
                .iter_mut()
                .map(|b| {
                    let f = &f;
                    s.spawn(move || f(b))
                })
                .collect();
            hs.into_iter().try_for_each(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("decoder thread panicked"))?
            })
        })
    })
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
    fn cell(&self) -> String {
        if self.secs > 0.0 {
            format!("{:.0}", self.mbs())
        } else {
            "—".into()
        }
    }
}

/// Geometric mean of per-image ratios, accumulated as a sum of logs.
#[derive(Default, Clone, Copy)]
struct Geo {
    log_sum: f64,
    n: usize,
}
impl Geo {
    fn add(&mut self, compressed: usize, raw: usize) {
        self.log_sum += (compressed as f64 / raw as f64).ln();
        self.n += 1;
    }
    fn mean(&self) -> f64 {
        (self.log_sum / self.n as f64).exp()
    }
}

/// One L3 configuration: its label, format, patch size (`None` = the format's default) and encoder choices.
#[derive(Clone, Copy)]
struct L3Cfg {
    label: &'static str,
    format: Format,
    n: Option<u8>,
    choices: Choices,
    /// Measured for speed (decode on one and on all cores, encode on one and on all cores); otherwise
    /// only its size and single-threaded encode.
    timed: bool,
}

const V1: L3Cfg = L3Cfg {
    label: "L3 v1 (default N: 32 / 64)",
    format: Format::V1,
    n: None,
    choices: Choices::Reference,
    timed: true,
};
const BP: L3Cfg = L3Cfg {
    label: "L3 v2-BP, N = 128",
    format: Format::V2(Profile::Bp),
    n: None,
    choices: Choices::Reference,
    timed: true,
};
/// What `l3 encode` writes when no format is asked for (`l3_format::DEFAULT_FORMAT`), and `--format v2`:
/// the default choices (`Choices::FastDecode`).
const ANS: L3Cfg = L3Cfg {
    label: "L3 v2-ANS, N = 128",
    format: Format::V2(Profile::Ans),
    n: None,
    choices: Choices::FastDecode,
    timed: true,
};
const ANS64: L3Cfg = L3Cfg {
    label: "L3 v2-ANS, N = 64",
    format: Format::V2(Profile::Ans),
    n: Some(64),
    choices: Choices::FastDecode,
    timed: true,
};
const ANS_REF: L3Cfg = L3Cfg {
    label: "L3 v2-ANS, N = 128, `Choices::Reference` (the vectors' choices)",
    format: Format::V2(Profile::Ans),
    n: None,
    choices: Choices::Reference,
    timed: true,
};
const ANS_SMALL: L3Cfg = L3Cfg {
    label: "L3 v2-ANS, N = 128, `Choices::Smallest`",
    format: Format::V2(Profile::Ans),
    n: None,
    choices: Choices::Smallest,
    timed: false,
};
const CFGS: [L3Cfg; 6] = [V1, BP, ANS, ANS64, ANS_REF, ANS_SMALL];

/// What one configuration measured over the corpus.
#[derive(Default, Clone, Copy)]
struct Measured {
    ratio: Geo,
    bytes: usize,
    dec1: Acc,
    decn: Acc,
    enc1: Acc,
    encn: Acc,
}

fn encode(img: &Image, cfg: &L3Cfg, threads: usize) -> anyhow::Result<Vec<u8>> {
    let opts = EncodeOptions {
        format: cfg.format,
        patch_size: cfg.n,
        threads,
        choices: cfg.choices,
        entry_crcs: true,
    };
    Ok(encode_with(&img.px, img.w, img.h, img.c, &opts)?)
}

/// v1's patch-size sweep.
const NS: [u8; 3] = [32, 64, 128];

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some_and(|v| v != "0");
    let reps = if quick {
        Reps {
            min: 1,
            budget: Duration::from_millis(50),
        }
    } else {
        Reps {
            min: 2,
            budget: Duration::from_millis(400),
        }
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
    let tools = [
        Tool::probe(
            "WebP lossless (`cwebp -lossless -exact`)",
            "cwebp",
            "webp",
            "webp",
            "-version",
        ),
        Tool::probe(
            "JPEG XL lossless, effort 1 (`cjxl -d 0 -e 1`)",
            "cjxl",
            "libjxl-tools",
            "jxl",
            "--version",
        ),
    ];
    for t in &tools {
        match &t.version {
            Ok(v) => eprintln!("bench l3: {} from `{}` ({v})", t.label, t.bin),
            Err(why) => eprintln!("bench l3: {} NOT MEASURED: {why}", t.label),
        }
    }
    let scratch = tempfile::tempdir().context("creating a scratch folder for cwebp/cjxl")?;

    r.para(&format!(
        "Corpus: {} images from `{}`{}. Raw = decoded 8-bit pixels (W×H×C); ratio = compressed / raw bytes, \
         **geometric mean over the images**; MB = 10⁶ raw bytes; speeds are the best of ≥{} runs{}, summed over \
         the corpus. Single-threaded runs are timed by the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) because \
         the machine is shared, multi-threaded runs by wall clock; \"all cores\" = {cores} threads: L3 decodes \
         and encodes one image patch-parallel, PNG and QOI decode {cores} images at once (one per thread). L3 \
         decode starts from the file's bytes (parse included: version 2 checks its CRC-32C there). PNG sizes: \
         the corpus PNGs as they are; the JPEGs re-encoded with the `png` crate (default compression and filter). \
         QOI: `qoi` crate. WebP and JPEG XL: their reference tools in this run, each output decoded back and \
         checked lossless.",
        paths.len(),
        dir.display(),
        if quick { " (quick mode: L3_BENCH_QUICK)" } else { "" },
        reps.min,
        if quick { "" } else { " within 0.4 s" },
    ));

    let mut m = [Measured::default(); CFGS.len()];
    let (mut png_r, mut qoi_r) = (Geo::default(), Geo::default());
    let mut tool_r = [Geo::default(); 2];
    let mut tool_err: [Option<String>; 2] = [None, None];
    let (mut pngd, mut pngdn, mut zuned, mut zunedn): (Acc, Acc, Acc, Acc) = Default::default();
    let (mut qoid, mut qoidn, mut qoie, mut pnge): (Acc, Acc, Acc, Acc) = Default::default();
    let mut total_raw = 0usize;
    let mut sweep_r = [Geo::default(); 3];
    let mut sweep_d = [Acc::default(); 3];
    let mut sweep_e = [Acc::default(); 3];

    let mut per_image = Table::new(
        "Per image: ratio (compressed / raw) and single-threaded decode MB/s",
        &[
            "image",
            "W×H×C",
            "v1",
            "v2-BP",
            "v2-ANS",
            "PNG",
            "QOI",
            "WebP",
            "JXL e1",
            "ANS / PNG",
            "v1 dec",
            "BP dec",
            "ANS dec",
            "png dec",
            "QOI dec",
        ],
    );
    let mut buf = Vec::new();
    for path in &paths {
        let img = load(path)?;
        let (w, h, c) = (img.w, img.h, img.c);
        let raw = img.raw();
        buf.resize(raw, 0);
        let mut sizes = [0usize; CFGS.len()];
        let mut dec1 = [0f64; CFGS.len()];
        for (i, cfg) in CFGS.iter().enumerate() {
            let file = encode(&img, cfg, 1)?;
            let f = L3File::parse(&file)?;
            f.decode_hwc(&mut buf)?;
            if buf != img.px {
                bail!("{}: {} round trip differs", img.name, cfg.label);
            }
            sizes[i] = file.len();
            m[i].ratio.add(file.len(), raw);
            m[i].bytes += file.len();
            m[i].enc1
                .add(raw, best(reps, || encode(&img, cfg, 1).map(drop))?);
            if !cfg.timed {
                continue;
            }
            let t = best(reps, || Ok(L3File::parse(&file)?.decode_hwc(&mut buf)?))?;
            dec1[i] = raw as f64 / t / 1e6;
            m[i].dec1.add(raw, t);
            m[i].decn.add(
                raw,
                best_wall(reps, || {
                    Ok(L3File::parse(&file)?.decode_hwc_parallel(&mut buf, cores)?)
                })?,
            );
            m[i].encn
                .add(raw, best_wall(reps, || encode(&img, cfg, cores).map(drop))?);
        }
        let tp = best(reps, || png_decode(&img.png, &mut buf))?;
        pngd.add(raw, tp);
        pngdn.add(
            cores * raw,
            best_images_parallel(reps, cores, raw, |b| png_decode(&img.png, b))?,
        );
        let tz = best(reps, || zune_decode(&img.png, &mut buf))?;
        zuned.add(raw, tz);
        if buf != img.px {
            bail!(
                "{}: zune-png output differs from the reference pixels",
                img.name
            );
        }
        zunedn.add(
            cores * raw,
            best_images_parallel(reps, cores, raw, |b| zune_decode(&img.png, b))?,
        );
        pnge.add(raw, best(reps, || png_encode(&img.px, w, h, c).map(drop))?);
        let qpx = qoi_pixels(&img.px, c);
        let mut qbuf = vec![0u8; qpx.len()];
        let tq = best(reps, || {
            qoi::decode_to_buf(&mut qbuf, &img.qoi)?;
            Ok(())
        })?;
        qoid.add(raw, tq);
        qoidn.add(
            cores * raw,
            best_images_parallel(reps, cores, qpx.len(), |b| {
                qoi::decode_to_buf(b, &img.qoi)?;
                Ok(())
            })?,
        );
        qoie.add(
            raw,
            best(reps, || {
                qoi::encode_to_vec(&qpx, w, h)?;
                Ok(())
            })?,
        );
        png_r.add(img.png.len(), raw);
        qoi_r.add(img.qoi.len(), raw);
        total_raw += raw;

        // WebP and JPEG XL from the PNG bytes (lossless input for both tools).
        let png_path = scratch.path().join("in.png");
        std::fs::write(&png_path, &img.png)?;
        let mut tool_cells = Vec::new();
        for (k, t) in tools.iter().enumerate() {
            if t.version.is_err() || tool_err[k].is_some() {
                tool_cells.push("—".to_string());
                continue;
            }
            match t
                .encode(&png_path, scratch.path())
                .and_then(|b| t.check_lossless(&b, &img, scratch.path()).map(|()| b))
            {
                Ok(b) => {
                    tool_r[k].add(b.len(), raw);
                    tool_cells.push(format!("{:.3}", b.len() as f64 / raw as f64));
                }
                Err(e) => {
                    eprintln!("bench l3: {} failed on {}: {e:#}", t.label, img.name);
                    tool_err[k] = Some(format!("failed on {}: {e:#}", img.name));
                    tool_cells.push("failed".into());
                }
            }
        }

        // v1's patch-size sweep.
        for (i, &nn) in NS.iter().enumerate() {
            let cfg = L3Cfg { n: Some(nn), ..V1 };
            let fi = encode(&img, &cfg, 1)?;
            sweep_r[i].add(fi.len(), raw);
            if !quick || nn == 64 {
                sweep_d[i].add(
                    raw,
                    best(reps, || Ok(L3File::parse(&fi)?.decode_hwc(&mut buf)?))?,
                );
                sweep_e[i].add(raw, best(reps, || encode(&img, &cfg, 1).map(drop))?);
            }
        }

        let ratio = |b: usize| format!("{:.3}", b as f64 / raw as f64);
        per_image.row(vec![
            format!("{}{}", img.name, if img.png_is_source { "" } else { " †" }),
            format!("{w}×{h}×{c}"),
            ratio(sizes[0]),
            ratio(sizes[1]),
            ratio(sizes[2]),
            ratio(img.png.len()),
            ratio(img.qoi.len()),
            tool_cells[0].clone(),
            tool_cells[1].clone(),
            format!("{:.2}", sizes[2] as f64 / img.png.len() as f64),
            format!("{:.0}", dec1[0]),
            format!("{:.0}", dec1[1]),
            format!("{:.0}", dec1[2]),
            format!("{:.0}", raw as f64 / tp / 1e6),
            format!("{:.0}", raw as f64 / tq / 1e6),
        ]);
        eprintln!("bench l3: {} done", img.name);
    }

    // Sizes.
    let png_geo = png_r.mean();
    let mut ratio = Table::new(
        "Compression over the corpus: ratio = geometric mean of compressed / raw",
        &["format", "ratio", "× PNG", "total bytes / total raw"],
    );
    let size_row = |ratio: &mut Table, name: &str, g: &Geo, total: Option<usize>| {
        ratio.row(vec![
            name.to_string(),
            format!("{:.4}", g.mean()),
            format!("{:.2}", g.mean() / png_geo),
            total.map_or("—".into(), |t| {
                format!("{:.4}", t as f64 / total_raw as f64)
            }),
        ]);
    };
    for (i, cfg) in CFGS.iter().enumerate() {
        size_row(&mut ratio, cfg.label, &m[i].ratio, Some(m[i].bytes));
    }
    size_row(
        &mut ratio,
        "PNG (corpus files; JPEG sources re-encoded)",
        &png_r,
        None,
    );
    size_row(&mut ratio, "QOI", &qoi_r, None);
    let mut missing = Vec::new();
    for (k, t) in tools.iter().enumerate() {
        match (&t.version, &tool_err[k]) {
            (Ok(v), None) => size_row(&mut ratio, &format!("{} — {v}", t.label), &tool_r[k], None),
            (Err(why), _) | (_, Some(why)) => {
                ratio.row(vec![
                    t.label.to_string(),
                    "not measured".into(),
                    "—".into(),
                    "—".into(),
                ]);
                missing.push(format!("{}: {why}", t.label));
            }
        }
    }
    r.table(&ratio);
    let (ans, bp) = (m[2].ratio.mean() / png_geo, m[1].ratio.mean() / png_geo);
    let (ans_speed, bp_speed) = (m[2].dec1.mbs() / pngd.mbs(), m[1].dec1.mbs() / pngd.mbs());
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    eprintln!(
        "bench l3: v2-ANS {ans:.2}x PNG size, {ans_speed:.2}x png decode; v2-BP {bp:.2}x, {bp_speed:.2}x"
    );
    r.para(&format!(
        "Targets: v2-ANS ≤ 0.80× PNG's size {}, decode ≥ 2× `png` on one thread {}; v2-BP ≤ 1.10× {}, ≥ 4× {}. \
         The format `l3 encode` writes by default (`l3_format::DEFAULT_FORMAT`) is {}.",
        verdict(ans <= 0.80),
        verdict(ans_speed >= 2.0),
        verdict(bp <= 1.10),
        verdict(bp_speed >= 4.0),
        l3_format::DEFAULT_FORMAT,
    ));
    r.para(&format!(
        "v2-ANS stores the corpus at **{ans:.2}× PNG's size** (target ≤ 0.80×), v2-BP at **{bp:.2}×** (target ≤ \
         1.10×), v1 at {:.2}×. The default choices (`Choices::FastDecode`: selectors re-chosen under a first \
         pass's tables, frequencies normalised for the smallest code, each colour plane's in the units that keep \
         its decode tables in 192 KiB) store {:.1} % less than the reference choices of the conformance vectors \
         and decode {:.2}× as fast on one thread; `Choices::Smallest` (the same without the units) stores {:.1} % \
         less than the default.{}",
        m[0].ratio.mean() / png_geo,
        100.0 * (1.0 - m[2].ratio.mean() / m[4].ratio.mean()),
        m[2].dec1.mbs() / m[4].dec1.mbs(),
        100.0 * (1.0 - m[5].ratio.mean() / m[2].ratio.mean()),
        if missing.is_empty() {
            String::new()
        } else {
            format!(" **Not measured:** {}.", missing.join("; "))
        }
    ));

    // Speeds.
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
    for (i, cfg) in CFGS.iter().enumerate() {
        speed.row(vec![
            cfg.label.into(),
            m[i].dec1.cell(),
            m[i].decn.cell(),
            m[i].enc1.cell(),
            m[i].encn.cell(),
        ]);
    }
    speed.row(vec![
        "PNG (`png` crate)".into(),
        pngd.cell(),
        pngdn.cell(),
        pnge.cell(),
        "—".into(),
    ]);
    speed.row(vec![
        "PNG (`zune-png`)".into(),
        zuned.cell(),
        zunedn.cell(),
        "—".into(),
        "—".into(),
    ]);
    speed.row(vec![
        "QOI (`qoi` crate)".into(),
        qoid.cell(),
        qoidn.cell(),
        qoie.cell(),
        "—".into(),
    ]);
    r.table(&speed);
    r.para(&format!(
        "Single-threaded decode against the `png` crate: v2-ANS **{:.1}×** (target ≥ 2×), v2-BP **{:.1}×** (target \
         ≥ 4×), v1 {:.1}×; against `zune-png`: ANS {:.1}×, BP {:.1}×; against QOI: ANS {:.1}×, BP {:.1}×.",
        m[2].dec1.mbs() / pngd.mbs(),
        m[1].dec1.mbs() / pngd.mbs(),
        m[0].dec1.mbs() / pngd.mbs(),
        m[2].dec1.mbs() / zuned.mbs(),
        m[1].dec1.mbs() / zuned.mbs(),
        m[2].dec1.mbs() / qoid.mbs(),
        m[1].dec1.mbs() / qoid.mbs(),
    ));
    r.svg(
        "decode",
        bar_plot(
            "Single-threaded decode throughput over the corpus",
            "MB/s",
            &[
                ("L3 v1".into(), m[0].dec1.mbs()),
                ("L3 v2-BP".into(), m[1].dec1.mbs()),
                ("L3 v2-ANS".into(), m[2].dec1.mbs()),
                ("QOI".into(), qoid.mbs()),
                ("PNG (zune-png)".into(), zuned.mbs()),
                ("PNG (png)".into(), pngd.mbs()),
            ],
        ),
    );

    let mut sweep = Table::new(
        "Version 1 patch size sweep over the corpus",
        &[
            "N",
            "ratio (geomean)",
            "decode 1 thread MB/s",
            "encode 1 thread MB/s",
        ],
    );
    for (i, nn) in NS.iter().enumerate() {
        sweep.row(vec![
            nn.to_string(),
            format!("{:.4}", sweep_r[i].mean()),
            sweep_d[i].cell(),
            sweep_e[i].cell(),
        ]);
    }
    r.table(&sweep);
    r.svg(
        "patch-size",
        line_plot(
            "L3 v1 ratio vs patch size N (corpus)",
            "N",
            "compressed / raw (geomean)",
            &[Series {
                name: "L3 v1 ratio".into(),
                points: NS
                    .iter()
                    .enumerate()
                    .map(|(i, &nn)| (nn as f64, sweep_r[i].mean()))
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
            "image", "v1 N=64", "v2-BP", "v2-ANS", "PNG", "QOI", "v1 dec", "BP dec", "ANS dec",
            "png dec", "QOI dec",
        ],
    );
    for (name, px) in [("Random", &random), ("Black", &black)] {
        let img = Image {
            name: name.into(),
            w: sw,
            h: sh,
            c: 3,
            px: px.clone(),
            png: png_encode(px, sw, sh, 3)?,
            png_is_source: false,
            qoi: qoi_encode(px, sw, sh, 3)?,
        };
        let files = [
            encode(&img, &L3Cfg { n: Some(64), ..V1 }, 0)?,
            encode(&img, &BP, 0)?,
            encode(&img, &ANS, 0)?,
        ];
        let mut cells = vec![name.to_string()];
        for f in &files {
            cells.push(format!("{:.4}", f.len() as f64 / raw as f64));
        }
        cells.push(format!("{:.4}", img.png.len() as f64 / raw as f64));
        cells.push(format!("{:.4}", img.qoi.len() as f64 / raw as f64));
        buf.resize(raw, 0);
        let mbs = |t: f64| format!("{:.0}", raw as f64 / t / 1e6);
        for f in &files {
            cells.push(mbs(best(reps, || {
                Ok(L3File::parse(f)?.decode_hwc(&mut buf)?)
            })?));
            if buf != *px {
                bail!("{name}: L3 round trip differs");
            }
        }
        cells.push(mbs(best(reps, || png_decode(&img.png, &mut buf))?));
        cells.push(mbs(best(reps, || {
            qoi::decode_to_buf(&mut buf, &img.qoi)?;
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
        "Black costs v1 2 bytes per patch row per channel (nbit 0 still needs the 12-bit row header), hence its \
         ratio ≈ 2/N; v2-BP still spends a few bits per row on nbit codes, v2-ANS almost nothing. Random is \
         slightly above 1 for every L3 variant (row headers or lane states on top of 8-bit residuals).",
    );
    Ok(())
}
