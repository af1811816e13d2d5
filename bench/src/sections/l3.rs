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
use std::path::{Path, PathBuf};
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
    let su = setup()?;
    describe_method(r, &su);
    let mut tot = Totals::default();
    let mut per_image = per_image_table();
    let mut buf = Vec::new();
    for path in &su.paths {
        let (name, row) = measure_image(&su, &mut tot, &mut buf, path)?;
        per_image.row(row);
        eprintln!("bench l3: {name} done");
    }
    report_sizes(r, &su, &tot);
    report_speeds(r, su.cores, &tot);
    report_sweep(r, &tot.sweep);
    r.table(&per_image);
    synthetic(r, su.reps, &mut buf)?;
    r.para(&format!(
        "Load average when the run started: {}; when it ended: {}. The {}-thread columns are wall-clock \
         and only mean something when the machine is otherwise idle.",
        su.load0,
        loadavg(),
        su.cores,
    ));
    r.para(
        "Black costs v1 2 bytes per patch row per channel (nbit 0 still needs the 12-bit row header), hence its \
         ratio ≈ 2/N; v2-BP still spends a few bits per row on nbit codes, v2-ANS almost nothing. Random is \
         slightly above 1 for every L3 variant (row headers or lane states on top of 8-bit residuals).",
    );
    Ok(())
}

/// What every measurement of the run shares: the corpus, the repetitions, the external tools and a scratch
/// folder for their files.
struct Setup {
    quick: bool,
    reps: Reps,
    cores: usize,
    /// `/proc/loadavg` when the run started.
    load0: String,
    dir: PathBuf,
    paths: Vec<PathBuf>,
    tools: [Tool; 2],
    scratch: tempfile::TempDir,
}

fn setup() -> anyhow::Result<Setup> {
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
    let paths = corpus_paths(&dir, quick)?;
    let tools = probe_tools();
    let scratch = tempfile::tempdir().context("creating a scratch folder for cwebp/cjxl")?;
    Ok(Setup {
        quick,
        reps,
        cores,
        load0,
        dir,
        paths,
        tools,
        scratch,
    })
}

/// The corpus's PNG and JPEG files, sorted; in quick mode four of them.
fn corpus_paths(dir: &Path, quick: bool) -> anyhow::Result<Vec<PathBuf>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
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
    Ok(paths)
}

/// WebP and JPEG XL through their reference encoders, each said to be measured or why not.
fn probe_tools() -> [Tool; 2] {
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
    tools
}

fn describe_method(r: &mut Report, su: &Setup) {
    let cores = su.cores;
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
        su.paths.len(),
        su.dir.display(),
        if su.quick { " (quick mode: L3_BENCH_QUICK)" } else { "" },
        su.reps.min,
        if su.quick { "" } else { " within 0.4 s" },
    ));
}

/// The `png` crate's, `zune-png`'s and QOI's totals over the corpus.
#[derive(Default)]
struct Peers {
    png_r: Geo,
    qoi_r: Geo,
    pngd: Acc,
    pngdn: Acc,
    zuned: Acc,
    zunedn: Acc,
    qoid: Acc,
    qoidn: Acc,
    qoie: Acc,
    pnge: Acc,
}

/// The external tools' ratios over the corpus, and why a tool stopped being measured.
#[derive(Default)]
struct ToolTotals {
    ratio: [Geo; 2],
    err: [Option<String>; 2],
}

/// v1's patch-size sweep over the corpus, one entry per N of [`NS`].
#[derive(Default)]
struct Sweep {
    ratio: [Geo; 3],
    dec: [Acc; 3],
    enc: [Acc; 3],
}

/// Everything the corpus pass adds up, for the tables after it.
#[derive(Default)]
struct Totals {
    l3: [Measured; CFGS.len()],
    peers: Peers,
    tools: ToolTotals,
    sweep: Sweep,
    raw: usize,
}

fn per_image_table() -> Table {
    Table::new(
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
    )
}

/// Measures every codec on one corpus image and adds it to `tot`; returns the image's name and its row of
/// the per-image table.
fn measure_image(
    su: &Setup,
    tot: &mut Totals,
    buf: &mut Vec<u8>,
    path: &Path,
) -> anyhow::Result<(String, Vec<String>)> {
    let img = load(path)?;
    let raw = img.raw();
    buf.resize(raw, 0);
    let l3 = measure_l3(su, &img, &mut tot.l3, buf)?;
    let (tp, tq) = measure_peers(su, &img, &mut tot.peers, buf)?;
    tot.raw += raw;
    let tool_cells = measure_tools(su, &img, &mut tot.tools)?;
    measure_sweep(su, &img, &mut tot.sweep, buf)?;

    let (w, h, c) = (img.w, img.h, img.c);
    let ratio = |b: usize| format!("{:.3}", b as f64 / raw as f64);
    let row = vec![
        format!("{}{}", img.name, if img.png_is_source { "" } else { " †" }),
        format!("{w}×{h}×{c}"),
        ratio(l3.sizes[0]),
        ratio(l3.sizes[1]),
        ratio(l3.sizes[2]),
        ratio(img.png.len()),
        ratio(img.qoi.len()),
        tool_cells[0].clone(),
        tool_cells[1].clone(),
        format!("{:.2}", l3.sizes[2] as f64 / img.png.len() as f64),
        format!("{:.0}", l3.dec1[0]),
        format!("{:.0}", l3.dec1[1]),
        format!("{:.0}", l3.dec1[2]),
        format!("{:.0}", raw as f64 / tp / 1e6),
        format!("{:.0}", raw as f64 / tq / 1e6),
    ];
    Ok((img.name, row))
}

/// One image's L3 results: file size and single-threaded decode MB/s per configuration of [`CFGS`].
struct L3Image {
    sizes: [usize; CFGS.len()],
    dec1: [f64; CFGS.len()],
}

/// Every L3 configuration on one image: the round trip checked, then encode and (for the timed ones) decode
/// on one and on all cores.
fn measure_l3(
    su: &Setup,
    img: &Image,
    m: &mut [Measured; CFGS.len()],
    buf: &mut [u8],
) -> anyhow::Result<L3Image> {
    let (reps, cores, raw) = (su.reps, su.cores, img.raw());
    let mut out = L3Image {
        sizes: [0; CFGS.len()],
        dec1: [0.0; CFGS.len()],
    };
    for (i, cfg) in CFGS.iter().enumerate() {
        let file = encode(img, cfg, 1)?;
        let f = L3File::parse(&file)?;
        f.decode_hwc(buf)?;
        if *buf != img.px {
            bail!("{}: {} round trip differs", img.name, cfg.label);
        }
        out.sizes[i] = file.len();
        m[i].ratio.add(file.len(), raw);
        m[i].bytes += file.len();
        m[i].enc1
            .add(raw, best(reps, || encode(img, cfg, 1).map(drop))?);
        if !cfg.timed {
            continue;
        }
        let t = best(reps, || Ok(L3File::parse(&file)?.decode_hwc(buf)?))?;
        out.dec1[i] = raw as f64 / t / 1e6;
        m[i].dec1.add(raw, t);
        m[i].decn.add(
            raw,
            best_wall(reps, || {
                Ok(L3File::parse(&file)?.decode_hwc_parallel(buf, cores)?)
            })?,
        );
        m[i].encn
            .add(raw, best_wall(reps, || encode(img, cfg, cores).map(drop))?);
    }
    Ok(out)
}

/// PNG (`png`, `zune-png`) and QOI on one image; returns the single-threaded `png` and QOI decode seconds.
fn measure_peers(
    su: &Setup,
    img: &Image,
    p: &mut Peers,
    buf: &mut [u8],
) -> anyhow::Result<(f64, f64)> {
    let (reps, cores, raw) = (su.reps, su.cores, img.raw());
    let (w, h, c) = (img.w, img.h, img.c);
    let tp = best(reps, || png_decode(&img.png, buf))?;
    p.pngd.add(raw, tp);
    p.pngdn.add(
        cores * raw,
        best_images_parallel(reps, cores, raw, |b| png_decode(&img.png, b))?,
    );
    let tz = best(reps, || zune_decode(&img.png, buf))?;
    p.zuned.add(raw, tz);
    if *buf != img.px {
        bail!(
            "{}: zune-png output differs from the reference pixels",
            img.name
        );
    }
    p.zunedn.add(
        cores * raw,
        best_images_parallel(reps, cores, raw, |b| zune_decode(&img.png, b))?,
    );
    p.pnge
        .add(raw, best(reps, || png_encode(&img.px, w, h, c).map(drop))?);
    let qpx = qoi_pixels(&img.px, c);
    let mut qbuf = vec![0u8; qpx.len()];
    let tq = best(reps, || {
        qoi::decode_to_buf(&mut qbuf, &img.qoi)?;
        Ok(())
    })?;
    p.qoid.add(raw, tq);
    p.qoidn.add(
        cores * raw,
        best_images_parallel(reps, cores, qpx.len(), |b| {
            qoi::decode_to_buf(b, &img.qoi)?;
            Ok(())
        })?,
    );
    p.qoie.add(
        raw,
        best(reps, || {
            qoi::encode_to_vec(&qpx, w, h)?;
            Ok(())
        })?,
    );
    p.png_r.add(img.png.len(), raw);
    p.qoi_r.add(img.qoi.len(), raw);
    Ok((tp, tq))
}

/// WebP and JPEG XL from the image's PNG bytes (lossless input for both tools); returns their ratio cells.
/// A tool that fails is reported and not run again.
fn measure_tools(su: &Setup, img: &Image, tt: &mut ToolTotals) -> anyhow::Result<Vec<String>> {
    let raw = img.raw();
    let scratch = su.scratch.path();
    let png_path = scratch.join("in.png");
    std::fs::write(&png_path, &img.png)?;
    let mut cells = Vec::new();
    for (k, t) in su.tools.iter().enumerate() {
        if t.version.is_err() || tt.err[k].is_some() {
            cells.push("—".to_string());
            continue;
        }
        match t
            .encode(&png_path, scratch)
            .and_then(|b| t.check_lossless(&b, img, scratch).map(|()| b))
        {
            Ok(b) => {
                tt.ratio[k].add(b.len(), raw);
                cells.push(format!("{:.3}", b.len() as f64 / raw as f64));
            }
            Err(e) => {
                eprintln!("bench l3: {} failed on {}: {e:#}", t.label, img.name);
                tt.err[k] = Some(format!("failed on {}: {e:#}", img.name));
                cells.push("failed".into());
            }
        }
    }
    Ok(cells)
}

/// v1 at each patch size of [`NS`] on one image (quick mode times N = 64 only).
fn measure_sweep(su: &Setup, img: &Image, sw: &mut Sweep, buf: &mut [u8]) -> anyhow::Result<()> {
    let (reps, raw) = (su.reps, img.raw());
    for (i, &nn) in NS.iter().enumerate() {
        let cfg = L3Cfg { n: Some(nn), ..V1 };
        let fi = encode(img, &cfg, 1)?;
        sw.ratio[i].add(fi.len(), raw);
        if !su.quick || nn == 64 {
            sw.dec[i].add(
                raw,
                best(reps, || Ok(L3File::parse(&fi)?.decode_hwc(buf)?))?,
            );
            sw.enc[i].add(raw, best(reps, || encode(img, &cfg, 1).map(drop))?);
        }
    }
    Ok(())
}

/// The compression table over the corpus, then the size and speed targets and the choices' trade-off.
fn report_sizes(r: &mut Report, su: &Setup, tot: &Totals) {
    let (m, p) = (&tot.l3, &tot.peers);
    let png_geo = p.png_r.mean();
    let (ratio, missing) = ratio_table(su, tot, png_geo);
    r.table(&ratio);
    let (ans, bp) = (m[2].ratio.mean() / png_geo, m[1].ratio.mean() / png_geo);
    let (ans_speed, bp_speed) = (
        m[2].dec1.mbs() / p.pngd.mbs(),
        m[1].dec1.mbs() / p.pngd.mbs(),
    );
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
}

/// Every format's ratio over the corpus, and the tools that were not measured (with why).
fn ratio_table(su: &Setup, tot: &Totals, png_geo: f64) -> (Table, Vec<String>) {
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
                format!("{:.4}", t as f64 / tot.raw as f64)
            }),
        ]);
    };
    for (i, cfg) in CFGS.iter().enumerate() {
        size_row(
            &mut ratio,
            cfg.label,
            &tot.l3[i].ratio,
            Some(tot.l3[i].bytes),
        );
    }
    size_row(
        &mut ratio,
        "PNG (corpus files; JPEG sources re-encoded)",
        &tot.peers.png_r,
        None,
    );
    size_row(&mut ratio, "QOI", &tot.peers.qoi_r, None);
    let mut missing = Vec::new();
    for (k, t) in su.tools.iter().enumerate() {
        match (&t.version, &tot.tools.err[k]) {
            (Ok(v), None) => size_row(
                &mut ratio,
                &format!("{} — {v}", t.label),
                &tot.tools.ratio[k],
                None,
            ),
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
    (ratio, missing)
}

/// The throughput table over the corpus, L3's single-threaded decode against each peer, and its bar plot.
fn report_speeds(r: &mut Report, cores: usize, tot: &Totals) {
    let (m, p) = (&tot.l3, &tot.peers);
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
    let none = || "—".to_string();
    speed.row(vec![
        "PNG (`png` crate)".into(),
        p.pngd.cell(),
        p.pngdn.cell(),
        p.pnge.cell(),
        none(),
    ]);
    speed.row(vec![
        "PNG (`zune-png`)".into(),
        p.zuned.cell(),
        p.zunedn.cell(),
        none(),
        none(),
    ]);
    speed.row(vec![
        "QOI (`qoi` crate)".into(),
        p.qoid.cell(),
        p.qoidn.cell(),
        p.qoie.cell(),
        none(),
    ]);
    r.table(&speed);
    r.para(&format!(
        "Single-threaded decode against the `png` crate: v2-ANS **{:.1}×** (target ≥ 2×), v2-BP **{:.1}×** (target \
         ≥ 4×), v1 {:.1}×; against `zune-png`: ANS {:.1}×, BP {:.1}×; against QOI: ANS {:.1}×, BP {:.1}×.",
        m[2].dec1.mbs() / p.pngd.mbs(),
        m[1].dec1.mbs() / p.pngd.mbs(),
        m[0].dec1.mbs() / p.pngd.mbs(),
        m[2].dec1.mbs() / p.zuned.mbs(),
        m[1].dec1.mbs() / p.zuned.mbs(),
        m[2].dec1.mbs() / p.qoid.mbs(),
        m[1].dec1.mbs() / p.qoid.mbs(),
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
                ("QOI".into(), p.qoid.mbs()),
                ("PNG (zune-png)".into(), p.zuned.mbs()),
                ("PNG (png)".into(), p.pngd.mbs()),
            ],
        ),
    );
}

fn report_sweep(r: &mut Report, sw: &Sweep) {
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
            format!("{:.4}", sw.ratio[i].mean()),
            sw.dec[i].cell(),
            sw.enc[i].cell(),
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
                    .map(|(i, &nn)| (nn as f64, sw.ratio[i].mean()))
                    .collect(),
            }],
        ),
    );
}

/// The paper's synthetic images (its Table 4).
const SYNTH_W: u32 = 1920;
const SYNTH_H: u32 = 1080;

/// The paper's Random and Black synthetic images: ratios and single-threaded decode MB/s.
fn synthetic(r: &mut Report, reps: Reps, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    let (sw, sh) = (SYNTH_W, SYNTH_H);
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
        synth.row(synthetic_row(name, px, reps, buf)?);
    }
    r.table(&synth);
    Ok(())
}

/// One synthetic image's row: v1 (N = 64), v2-BP and v2-ANS against PNG and QOI.
fn synthetic_row(
    name: &str,
    px: &[u8],
    reps: Reps,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Vec<String>> {
    let (sw, sh) = (SYNTH_W, SYNTH_H);
    let raw = px.len();
    let img = Image {
        name: name.into(),
        w: sw,
        h: sh,
        c: 3,
        px: px.to_vec(),
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
        cells.push(mbs(best(reps, || Ok(L3File::parse(f)?.decode_hwc(buf)?))?));
        if *buf != px {
            bail!("{name}: L3 round trip differs");
        }
    }
    cells.push(mbs(best(reps, || png_decode(&img.png, buf))?));
    cells.push(mbs(best(reps, || {
        qoi::decode_to_buf(&mut *buf, &img.qoi)?;
        Ok(())
    })?));
    Ok(cells)
}
