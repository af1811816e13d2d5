//! `l3 infer` (and `l3toolkit.infer` on paths): any supported network — an ONNX model
//! ([`bsp_tiling::onnx`]) or a TransformerNet in safetensors — over an image of any size with BSP tiling,
//! the output written tile by tile.
//!
//! Inputs, by extension: `.npy` (float32 `C×H×W` or `1×C×H×W`, taken as is), `.l3` (read by region: a
//! tile's window decodes the patches under it), `.tif`/`.tiff` (TIFF or BigTIFF, tiled or striped, read
//! by region through [`bsp_tiling::tiffio`]: integer samples as their values times `in_scale`, float
//! samples as they are; one page of the file, [`InferRequest::page`], page 0 by default), or any other image the loader reads (decoded whole, as 0..255 floats times
//! `in_scale`: PNG, JPEG and the rest cannot be read by region; the run's notes say so).
//!
//! Outputs by extension: `.npy` (float32 `C×H×W`, the raw network output, written tile by tile at its
//! offsets), `.tif`/`.tiff` (a tiled BigTIFF, tiles written as they complete: 8-bit after `out_scale` and
//! clamping, or the raw float32 output with [`OutDType::F32`]), or 8-bit images whose rows are streamed as
//! soon as a band of tiles is complete: `.png`, `.ppm`/`.pgm` (raw, header first), `.l3` (the default
//! format through [`l3_format::L3Writer`], whose spill file beside the output holds what the format writes
//! last: for ANS the pixels, counted for its frequency tables, and the encoded chunks — memory stays bounded
//! by a band, never the image), `.jpg` (quality 95, encoded on its own thread as rows come).
//! Every output is written under a temporary name and renamed when complete ([`stdx::fs::AtomicFile`]).
//!
//! [`stylize_paths`] (`l3 stylize`) reads and writes the same way around the TransformerNet stage engine
//! ([`bsp_tiling::stylize_into`]); [`OutputFile`] is the writing both share.

use anyhow::{Context, bail};
use bsp_tiling::tiffio::{OutDType, TiffRegions, TiffWriter};
use bsp_tiling::{
    Budget, DeviceOptions, Field, Graph, Input, Mode, Net, PaddingMode, RunInfo, Scaled,
    ScaledSink, Sink, Tensor, npy,
};
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::infer_rows;

/// Loads a network: `.onnx` through the ONNX importer, anything else as a TransformerNet in safetensors
/// (with `padding` at its borders; ONNX models carry their own padding).
pub fn load_model(path: &Path, padding: Option<PaddingMode>) -> anyhow::Result<Graph> {
    let is_onnx = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
    if is_onnx {
        if padding.is_some() {
            bail!(
                "--padding applies to TransformerNet safetensors only: an ONNX model pads as it was exported"
            );
        }
        return bsp_tiling::load_onnx(path).with_context(|| format!("loading {}", path.display()));
    }
    let net = Net::load_transformer(path, padding.unwrap_or(PaddingMode::Reflect))
        .with_context(|| format!("loading {}", path.display()))?;
    Ok(Graph::from_net(&net))
}

/// One `l3 infer` run.
#[derive(Clone, Debug)]
pub struct InferRequest {
    pub input: PathBuf,
    pub output: PathBuf,
    pub mode: Mode,
    pub tile: usize,
    pub threads: usize,
    pub budget: Budget,
    /// Keep the network's whole output size instead of cropping to the input's size times the network's
    /// scale (TransformerNet rounds sides up to a multiple of 4).
    pub full: bool,
    /// Factor applied to 8-bit input pixels (0..255); `.npy` inputs are taken as they are.
    pub in_scale: f32,
    /// Factor applied to the output before 8-bit clamping (image outputs; `.npy` gets the raw output).
    pub out_scale: f32,
    /// The output's sample type, where the format offers a choice (`.tif`: uint8 by default, or float32);
    /// `None` is the format's own. A type the format cannot hold is refused.
    pub out_dtype: Option<OutDType>,
    /// Where the graph runs: the CPU, or a CUDA device with its memory budget and precision (no fallback
    /// to the CPU: a device that cannot be used is an error).
    pub device: DeviceOptions,
    /// The page of a TIFF input (0 is the file's first image: a slide's full resolution; later pages are
    /// reduced levels, overviews, thumbnails). `None` reads page 0; a page asked of any other input is
    /// refused.
    pub page: Option<usize>,
    /// The level of that page (0, the default: the page itself; n: its n-th SubIFD, where pyramidal
    /// slides keep their reduced resolutions); refused for inputs other than TIFF.
    pub level: Option<usize>,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct InferReport {
    /// What the user should know about how the input was read (a whole decode, and why).
    pub notes: Vec<String>,
    pub input: (usize, usize, usize),
    pub output: (usize, usize, usize),
    pub info: RunInfo,
    pub seconds: f64,
}

/// An input held for a run: a float tensor (taken as is) or an 8-bit image (0..255 times `in_scale`).
pub enum InputData {
    Tensor(Tensor),
    Image(bsp_tiling::Image),
}

impl InputData {
    fn base(&self) -> &dyn bsp_tiling::Input {
        match self {
            InputData::Tensor(t) => t,
            InputData::Image(i) => i,
        }
    }
}

fn ext(p: &Path) -> String {
    p.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// Reads an input file whole for a network taking `channels` channels: `.npy` as float32, anything else
/// through the loader as an 8-bit image (gray widened to RGB for a 3-channel network). Runs on paths read
/// L3 and TIFF by region instead ([`with_input`]).
pub fn read_input(path: &Path, channels: usize) -> anyhow::Result<InputData> {
    if ext(path) == "npy" {
        return Ok(InputData::Tensor(npy::read(path)?));
    }
    let img = loader::import(path, &loader::ImportOptions::default())
        .with_context(|| format!("reading {}", path.display()))?;
    let img = match (channels, img.channels) {
        (3, c) if c != 3 => img.to_rgb(),
        (1, 3 | 4) => bail!(
            "{}: the model takes 1 channel, the image has {}",
            path.display(),
            img.channels
        ),
        _ => img,
    };
    Ok(InputData::Image(img))
}

/// Why `page` or `level` cannot be asked of the input `path`, if they cannot: only TIFF inputs have
/// pages and levels.
pub fn page_refusal(path: &Path, page: Option<usize>, level: Option<usize>) -> Option<String> {
    let asked = match (page, level) {
        (None, None) => return None,
        (Some(p), None) => format!("page {p}"),
        (None, Some(l)) => format!("level {l}"),
        (Some(p), Some(l)) => format!("page {p} level {l}"),
    };
    (!matches!(ext(path).as_str(), "tif" | "tiff")).then(|| {
        format!(
            "{}: {asked} asked for, but only TIFF inputs (.tif, .tiff) have pages and levels",
            path.display()
        )
    })
}

/// Bytes of decoded TIFF chunks kept between tile windows: a quarter of the RAM budget, within 16 MiB ..
/// 256 MiB (a row of strips or tiles across a wide image fits; more only saves re-decoding).
fn tiff_cache_bytes(req: &InferRequest) -> usize {
    (req.budget.ram / 4).clamp(16 << 20, 256 << 20) as usize
}

/// Opens `req.input` for a network taking `channels` channels and calls `f` with it (scaled as the
/// request says) and the notes on how it is read: `.npy` (float32 already), L3 and TIFF by
/// region, other images decoded whole — with a note saying so.
pub fn with_input<T>(
    req: &InferRequest,
    channels: usize,
    f: impl FnOnce(&dyn Input, Vec<String>) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let path = &req.input;
    if let Some(refusal) = page_refusal(path, req.page, req.level) {
        bail!(refusal);
    }
    let npy;
    let whole;
    let tiff;
    let l3;
    // The source, the scale of its values, notes, and whether its channels may be fitted as an image's.
    let (source, scale, notes, widen): (&dyn Input, f32, Vec<String>, bool) =
        match ext(path).as_str() {
            "l3" => {
                l3 = L3Regions::open(path)?;
                (&l3, req.in_scale, Vec::new(), true)
            }
            "tif" | "tiff" => {
                tiff = TiffRegions::open_level(
                    path,
                    req.page.unwrap_or(0),
                    req.level.unwrap_or(0),
                    tiff_cache_bytes(req),
                )?;
                let notes = tiff.note().map(str::to_owned).into_iter().collect();
                let scale = match tiff.sample_type() {
                    bsp_tiling::tiffio::SampleType::F32 => 1.0,
                    _ => req.in_scale,
                };
                (&tiff, scale, notes, true)
            }
            "npy" => {
                npy = npy::NpyRegions::open(path)?;
                (&npy, 1.0, Vec::new(), false)
            }
            e => {
                whole = read_input(path, channels)?;
                let note = format!(
                    "{}: decoded whole ({} files cannot be read by region: L3 and TIFF can)",
                    path.display(),
                    if e.is_empty() { "such" } else { e }
                );
                (whole.base(), req.in_scale, vec![note], true)
            }
        };
    let fit = if widen {
        Channels::fit(source, channels, path)?
    } else {
        Channels {
            inner: source,
            map: None,
        }
    };
    f(&Scaled { inner: &fit, scale }, notes)
}

/// An input's channels fitted to the network's, as 8-bit images are: gray (with or without alpha)
/// replicated to RGB for a 3-channel network, alpha dropped from RGBA; any other mismatch is refused.
struct Channels<'a> {
    inner: &'a dyn Input,
    /// Source channel of each output channel; `None`: taken as they are.
    map: Option<[usize; 3]>,
}

impl<'a> Channels<'a> {
    fn fit(inner: &'a dyn Input, channels: usize, path: &Path) -> anyhow::Result<Channels<'a>> {
        let map = match (channels, inner.channels()) {
            (a, b) if a == b => None,
            (3, 1 | 2) => Some([0, 0, 0]),
            (3, 4) => Some([0, 1, 2]),
            (a, b) => bail!("{}: {b} channels, the model takes {a}", path.display()),
        };
        Ok(Channels { inner, map })
    }
}

impl Field for Channels<'_> {
    fn channels(&self) -> usize {
        if self.map.is_some() {
            3
        } else {
            self.inner.channels()
        }
    }
    fn gather(
        &self,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
        out: &mut [f32],
    ) -> bsp_tiling::Result<()> {
        let Some(map) = self.map else {
            return self.inner.gather(ys, xs, out);
        };
        let n = ys.len() * xs.len();
        let mut src = vec![0f32; self.inner.channels() * n];
        self.inner.gather(ys, xs, &mut src)?;
        for (c, &s) in map.iter().enumerate() {
            out[c * n..(c + 1) * n].copy_from_slice(&src[s * n..(s + 1) * n]);
        }
        Ok(())
    }
}

impl Input for Channels<'_> {
    fn height(&self) -> usize {
        self.inner.height()
    }
    fn width(&self) -> usize {
        self.inner.width()
    }
}

/// Runs `g` over `req.input`, writing `req.output`: the input read as [`with_input`] says, the output
/// written tile by tile where its format allows.
pub fn infer_paths(g: &Graph, req: &InferRequest) -> anyhow::Result<InferReport> {
    crate_refuse_overwrite(&req.input, &req.output)?;
    with_input(req, g.channels, |input, notes| {
        let mut r = infer_input(g, input, req)?;
        r.notes.splice(0..0, notes);
        Ok(r)
    })
}

/// Runs `g` over `req.input` (read as [`with_input`] says) into a float32 tensor.
pub fn infer_path_to_tensor(
    g: &Graph,
    req: &InferRequest,
) -> anyhow::Result<(Tensor, RunInfo, Vec<String>)> {
    with_input(req, g.channels, |input, notes| {
        let (t, info) = run_to_tensor(g, input, req)?;
        let notes = notes
            .into_iter()
            .chain(info.notes.iter().cloned())
            .collect();
        Ok((t, info, notes))
    })
}

/// An L3 file read by region: its index (header and offset table) is read once; a window reads, with
/// positioned reads, only the bytes of the patches under it and decodes them. Nothing of the file is
/// mapped, so a 30,000² input's 1.9 GB never counts in the resident set: its pages stay in the page cache,
/// which the kernel gives back when memory is short.
struct L3Regions {
    index: l3_format::L3Index,
    file: File,
    path: PathBuf,
}

/// Bytes read at a time by the whole-file CRC check: large enough for the disk, small beside a tile.
const CRC_CHUNK: usize = 8 << 20;

impl L3Regions {
    /// Reads the index of the L3 file at `path` and, for a version-2 file, checks its whole-file CRC-32C
    /// before any tile runs (streamed through one buffer): damage anywhere is found before hours of
    /// inference, not by the window that reads it. Its entry CRCs, where it has them, are checked again
    /// as each window decodes.
    fn open(path: &Path) -> anyhow::Result<L3Regions> {
        use std::os::unix::fs::FileExt;
        let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", path.display());
        let file = File::open(path).with_context(|| format!("reading {}", path.display()))?;
        let meta = file
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?;
        if !meta.is_file() {
            bail!("{}: not a regular file", path.display());
        }
        let len = meta.len();
        let mut prefix = Vec::new();
        while let Some(r) = l3_format::L3Index::next_read(&prefix, len).map_err(|e| fail(&e))? {
            let at = prefix.len();
            prefix.resize(r.end as usize, 0);
            file.read_exact_at(&mut prefix[at..], r.start)
                .with_context(|| format!("reading {}", path.display()))?;
        }
        let index = l3_format::L3Index::parse(&prefix, len).map_err(|e| fail(&e))?;
        if index.version() >= 2 {
            // Version 2 ends with the CRC-32C of every byte before it (l3-format/SPEC.md).
            let end = len - 4;
            let mut crc = l3_format::Crc32c::new();
            let mut buf = vec![0u8; CRC_CHUNK.min(end as usize)];
            let mut at = 0u64;
            while at < end {
                let n = (end - at).min(buf.len() as u64) as usize;
                file.read_exact_at(&mut buf[..n], at)
                    .with_context(|| format!("reading {}", path.display()))?;
                crc.update(&buf[..n]);
                at += n as u64;
            }
            let mut stored = [0u8; 4];
            file.read_exact_at(&mut stored, end)
                .with_context(|| format!("reading {}", path.display()))?;
            let (stored, computed) = (u32::from_le_bytes(stored), crc.finish());
            if stored != computed {
                return Err(fail(&l3_format::Error::CrcMismatch { stored, computed }));
            }
        }
        Ok(L3Regions {
            index,
            file,
            path: path.to_owned(),
        })
    }
}

impl bsp_tiling::Field for L3Regions {
    fn channels(&self) -> usize {
        self.index.channels() as usize
    }
    fn gather(
        &self,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
        out: &mut [f32],
    ) -> bsp_tiling::Result<()> {
        use std::os::unix::fs::FileExt;
        let span = |m: &[Option<usize>]| {
            let lo = m.iter().flatten().min().copied();
            lo.map(|lo| (lo, m.iter().flatten().max().copied().unwrap_or(lo) + 1))
        };
        out.fill(0.0);
        let (Some((y0, y1)), Some((x0, x1))) = (span(ys), span(xs)) else {
            return Ok(());
        };
        let io = |source: std::io::Error| bsp_tiling::Error::Io {
            path: self.path.clone(),
            source,
        };
        let bad = |e: l3_format::Error| {
            io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e.to_string(),
            ))
        };
        let c = self.channels();
        let (w, h) = (x1 - x0, y1 - y0);
        let rect = vocab::Rect::new(x0 as u32, y0 as u32, w as u32, h as u32);
        let ranges = self.index.region_ranges(rect, 0).map_err(bad)?;
        let mut data = l3_format::Fragments::new();
        data.reset(&ranges);
        for (r, buf) in data.slices_mut() {
            self.file.read_exact_at(buf, r.start).map_err(io)?;
        }
        let mut px = vec![0u8; w * h * c];
        self.index
            .decode_region(
                &data,
                rect,
                &mut px,
                l3_format::PixelLayout::packed(w as u32, h as u32, c as u8, false),
            )
            .map_err(bad)?;
        drop(data);
        let n = ys.len() * xs.len();
        for (iy, y) in ys.iter().enumerate() {
            let Some(y) = y else { continue };
            let row = &px[(y - y0) * w * c..(y - y0 + 1) * w * c];
            for (ix, x) in xs.iter().enumerate() {
                let Some(x) = x else { continue };
                for ch in 0..c {
                    out[ch * n + iy * xs.len() + ix] = f32::from(row[(x - x0) * c + ch]);
                }
            }
        }
        Ok(())
    }
}

impl Input for L3Regions {
    fn height(&self) -> usize {
        self.index.height() as usize
    }
    fn width(&self) -> usize {
        self.index.width() as usize
    }
}

/// The output size a run writes: the network's, or cropped to the input's size times the network's scale.
pub fn output_shape(
    g: &Graph,
    h: usize,
    w: usize,
    full: bool,
) -> anyhow::Result<(usize, usize, usize)> {
    let plan = g.plan(h, w)?;
    let (c, fh, fw) = plan.shape[g.output];
    let (num, den) = plan.scale[g.output];
    Ok(if full {
        (c, fh, fw)
    } else {
        (
            c,
            (h * num).div_ceil(den).min(fh),
            (w * num).div_ceil(den).min(fw),
        )
    })
}

/// Runs `g` over `data` into a float32 tensor (`in_scale` applies to 8-bit images).
pub fn infer_to_tensor(
    g: &Graph,
    data: &InputData,
    req: &InferRequest,
) -> anyhow::Result<(Tensor, RunInfo)> {
    let scaled = Scaled {
        inner: data.base(),
        scale: if matches!(data, InputData::Tensor(_)) {
            1.0
        } else {
            req.in_scale
        },
    };
    run_to_tensor(g, &scaled, req)
}

fn run_to_tensor(
    g: &Graph,
    input: &dyn Input,
    req: &InferRequest,
) -> anyhow::Result<(Tensor, RunInfo)> {
    let (c, oh, ow) = output_shape(g, input.height(), input.width(), req.full)?;
    let sink = bsp_tiling::OutputSink::f32(c, oh, ow);
    let info = bsp_tiling::run_graph_device(
        &req.device,
        g,
        input,
        req.mode,
        req.tile,
        req.threads,
        &req.budget,
        &sink,
    )?;
    Ok((sink.finish().into_tensor(), info))
}

/// Runs `g` over `data`, writing `req.output` (its type by extension) tile by tile.
pub fn infer_to_path(
    g: &Graph,
    data: &InputData,
    req: &InferRequest,
) -> anyhow::Result<InferReport> {
    let scaled = Scaled {
        inner: data.base(),
        scale: if matches!(data, InputData::Tensor(_)) {
            1.0
        } else {
            req.in_scale
        },
    };
    infer_input(g, &scaled, req)
}

/// The output sample types each format can hold; the first is its default.
fn output_dtypes(out_ext: &str) -> Option<&'static [OutDType]> {
    Some(match out_ext {
        "npy" => &[OutDType::F32],
        "tif" | "tiff" => &[OutDType::U8, OutDType::F32],
        "png" | "l3" | "ppm" | "pgm" | "jpg" | "jpeg" => &[OutDType::U8],
        _ => return None,
    })
}

fn infer_input(g: &Graph, input: &dyn Input, req: &InferRequest) -> anyhow::Result<InferReport> {
    let (h, w) = (input.height(), input.width());
    let output = output_shape(g, h, w, req.full)?;
    run_to_output(req, (g.channels, h, w), output, |sink| {
        bsp_tiling::run_graph_device(
            &req.device,
            g,
            input,
            req.mode,
            req.tile,
            req.threads,
            &req.budget,
            sink,
        )
    })
}

/// Runs `run` into `req.output` (of shape `output`, as [`OutputFile`] writes it) and reports it: a run
/// over an input of shape `input`, timed from the output's creation to its rename.
fn run_to_output(
    req: &InferRequest,
    input: (usize, usize, usize),
    output: (usize, usize, usize),
    run: impl Fn(&dyn Sink) -> bsp_tiling::Result<RunInfo>,
) -> anyhow::Result<InferReport> {
    let t0 = std::time::Instant::now();
    let out = OutputFile {
        path: &req.output,
        shape: output,
        dtype: req.out_dtype,
        out_scale: req.out_scale,
        threads: req.threads,
    };
    let info = out.write(run)?;
    Ok(InferReport {
        notes: info.notes.clone(),
        input,
        output,
        info,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Runs `net`, a TransformerNet, over `req.input` on the stage engine (`l3 stylize`: the CPU, or the
/// CUDA backend in f32 or f16), writing `req.output` as [`infer_paths`] does: the input read as
/// [`with_input`] says (8-bit values 0..255 times `in_scale`), the output written tile by tile where its
/// format allows, cropped to the input's size unless `req.full`.
pub fn stylize_paths(net: &Net, req: &InferRequest) -> anyhow::Result<InferReport> {
    crate_refuse_overwrite(&req.input, &req.output)?;
    with_input(req, 3, |input, notes| {
        let (h, w) = (input.height(), input.width());
        let (c, fh, fw) = bsp_tiling::stylize_shape(net, h, w)?;
        let (oh, ow) = if req.full { (fh, fw) } else { (h, w) };
        let opts = bsp_tiling::Options {
            mode: req.mode,
            tile: req.tile,
            threads: req.threads,
            budget: req.budget.clone(),
        };
        let mut report = run_to_output(req, (3, h, w), (c, oh, ow), |sink| {
            bsp_tiling::stylize_on_into(&req.device, net, input, &opts, sink)
        })
        .with_context(|| format!("stylising {}", req.input.display()))?;
        report.notes.splice(0..0, notes);
        Ok(report)
    })
}

/// An output file written from a run's tiles: its type by extension, its size (larger tiles are clipped
/// to it), its sample type where the format offers a choice, the factor applied before 8-bit clamping,
/// and the threads an L3 encoder may use.
pub struct OutputFile<'a> {
    pub path: &'a Path,
    pub shape: (usize, usize, usize),
    pub dtype: Option<OutDType>,
    pub out_scale: f32,
    pub threads: usize,
}

impl OutputFile<'_> {
    /// Runs `run` into a sink writing this file under a temporary name, renamed once complete: a failed
    /// run leaves nothing behind.
    pub fn write(
        &self,
        run: impl Fn(&dyn Sink) -> bsp_tiling::Result<RunInfo>,
    ) -> anyhow::Result<RunInfo> {
        let path = self.path;
        let out_ext = ext(path);
        let Some(dtypes) = output_dtypes(&out_ext) else {
            bail!(
                "{}: unknown output type {out_ext:?}: use .npy (float32 C×H×W), .tif/.tiff (tiled BigTIFF, uint8 or float32), .png, .l3, .ppm/.pgm or .jpg",
                path.display()
            );
        };
        let dtype = self.dtype.unwrap_or(dtypes[0]);
        if !dtypes.contains(&dtype) {
            bail!(
                "{}: a .{out_ext} output holds {}, not {}",
                path.display(),
                if dtypes[0] == OutDType::F32 {
                    "float32"
                } else {
                    "uint8"
                },
                if dtype == OutDType::F32 {
                    "float32"
                } else {
                    "uint8"
                }
            );
        }
        // 8-bit outputs get `out_scale` before clamping; float32 ones the raw output.
        let run_scaled = |sink: &dyn Sink| {
            run(&ScaledSink {
                inner: sink,
                scale: self.out_scale,
            })
        };
        // A failed run leaves nothing behind: the temporary goes with the `AtomicFile`.
        let mut out = stdx::fs::AtomicFile::create(path)
            .with_context(|| format!("creating {}", path.display()))?;
        let file = out
            .file()
            .try_clone()
            .with_context(|| format!("creating {}", path.display()))?;
        let info = self.write_to(&out_ext, file, dtype, &run, run_scaled)?;
        out.commit()
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(info)
    }

    /// Runs the network into `file` (the temporary of the output) of type `out_ext`: `.npy`, `.tif`,
    /// `.png`, `.ppm`/`.pgm` and `.l3` written as tiles finish (an L3 file's entries wait in its spill
    /// file until the end) and `.jpg` written as tiles finish.
    fn write_to(
        &self,
        out_ext: &str,
        file: File,
        dtype: OutDType,
        run: impl Fn(&dyn Sink) -> bsp_tiling::Result<RunInfo>,
        run_scaled: impl Fn(&dyn Sink) -> bsp_tiling::Result<RunInfo>,
    ) -> anyhow::Result<RunInfo> {
        let path = self.path;
        let (c, oh, ow) = self.shape;
        Ok(match out_ext {
            "npy" => {
                let wr = npy::NpyWriter::from_file(file, path, c, oh, ow)
                    .with_context(|| format!("creating {}", path.display()))?;
                let info = run(&wr)?;
                wr.finish()
                    .with_context(|| format!("writing {}", path.display()))?;
                info
            }
            "tif" | "tiff" => {
                let wr = TiffWriter::new(file, path, c, oh, ow, dtype)?;
                let info = match dtype {
                    OutDType::U8 => run_scaled(&wr)?,
                    OutDType::F32 => run(&wr)?,
                };
                wr.finish()?;
                info
            }
            "png" => {
                check_8bit_channels(c)?;
                let out = infer_rows::Png::create(file, path, c, oh, ow)?;
                infer_rows::Rows8::new(out, path, c, oh, ow).run(run_scaled)?
            }
            "ppm" | "pgm" => {
                check_8bit_channels(c)?;
                let out = infer_rows::Raw::create(file, c, oh, ow)
                    .with_context(|| format!("writing {}", path.display()))?;
                infer_rows::Rows8::new(out, path, c, oh, ow).run(run_scaled)?
            }
            "l3" => {
                check_8bit_channels(c)?;
                let out = infer_rows::L3::create(file, path, (c, oh, ow), self.threads)?;
                infer_rows::Rows8::new(out, path, c, oh, ow).run(run_scaled)?
            }
            _ => {
                check_8bit_channels(c)?;
                let out = infer_rows::Jpeg::create(file, path, c, oh, ow)?;
                infer_rows::Rows8::new(out, path, c, oh, ow).run(run_scaled)?
            }
        })
    }
}

fn crate_refuse_overwrite(input: &Path, output: &Path) -> anyhow::Result<()> {
    if let (Ok(a), Ok(b)) = (input.canonicalize(), output.canonicalize())
        && a == b
    {
        bail!("{}: the output would overwrite the input", output.display());
    }
    Ok(())
}

fn check_8bit_channels(c: usize) -> anyhow::Result<()> {
    if c != 1 && c != 3 {
        bail!(
            "the network's output has {c} channels: an 8-bit image holds 1 or 3; write .npy for the raw output"
        );
    }
    Ok(())
}
