//! A network run from files to files: the model loaded by its extension, the input opened as
//! [`InputFile`] says, the output written as [`OutputFile`] says. `l3 infer`, `l3 stylize` and Python's
//! `infer` on paths all come here, so a file is read and written the same way on every surface.

use crate::error::{Error, Result};
use crate::input::{InputData, InputFile, InputOptions, ext};
use crate::output::OutputFile;
use crate::tiff::{OutDType, SampleType};
use bsp_tiling::field::{Input, Scaled, Sink};
use bsp_tiling::{Budget, DeviceOptions, Graph, Mode, Net, PaddingMode, RunInfo, Tensor};
use std::path::{Path, PathBuf};

/// Loads a network: `.onnx` through the ONNX importer, anything else as a TransformerNet in
/// safetensors (with `padding` at its borders, reflect by default; ONNX models carry their own padding,
/// and a padding asked of one is refused).
pub fn load_model(path: &Path, padding: Option<PaddingMode>) -> Result<Graph> {
    Ok(load_network(path, padding)?.0)
}

/// [`load_model`], with the TransformerNet itself where the file holds one (what `stylize` runs).
pub fn load_network(path: &Path, padding: Option<PaddingMode>) -> Result<(Graph, Option<Net>)> {
    if ext(path) == "onnx" {
        if padding.is_some() {
            return Err(Error::refused(
                "padding",
                "applies to TransformerNet safetensors only: an ONNX model pads as it was exported",
            ));
        }
        return Ok((bsp_tiling::load_onnx(path)?, None));
    }
    let net = Net::load_transformer(path, padding.unwrap_or(PaddingMode::Reflect))?;
    Ok((Graph::from_net(&net), Some(net)))
}

/// One run.
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
    /// Factor applied to integer input samples (8-bit: 0..255); `.npy` inputs are taken as they are.
    pub in_scale: f32,
    /// Factor applied to the output before 8-bit clamping (image outputs; `.npy` gets the raw output).
    pub out_scale: f32,
    /// The output's sample type, where the format offers a choice (`.tif`: uint8 by default, or float32);
    /// `None` is the format's own. A type the format cannot hold is refused.
    pub out_dtype: Option<OutDType>,
    /// Where the graph runs: the CPU, or a CUDA device with its memory budget and precision (no fallback
    /// to the CPU: a device that cannot be used is an error).
    pub device: DeviceOptions,
    /// The page of a TIFF input and the level of that page (see [`InputOptions`]).
    pub page: Option<usize>,
    pub level: Option<usize>,
    /// The ranks sharing this run's tiles (processes joined by a collective: `torch.distributed`, JAX),
    /// or `None`, this process alone. Every rank reads the input; rank 0 alone writes the output, which
    /// has exactly the bytes of a single process's run, and a failure on any rank stops them all.
    pub ranks: Option<bsp_tiling::Ranks>,
}

impl InferRequest {
    fn input_options(&self, channels: usize) -> InputOptions {
        InputOptions {
            channels,
            in_scale: self.in_scale,
            page: self.page,
            level: self.level,
            // A quarter of the RAM budget, within 16 MiB .. 256 MiB (a row of strips or tiles across a
            // wide image fits; more only saves re-decoding).
            tiff_cache_bytes: (self.budget.ram / 4).clamp(16 << 20, 256 << 20) as usize,
        }
    }

    fn output(&self, shape: (usize, usize, usize)) -> OutputFile<'_> {
        OutputFile {
            path: &self.output,
            shape,
            dtype: self.out_dtype,
            out_scale: self.out_scale,
            threads: self.threads,
            band_bytes: self.writer_band_bytes(),
        }
    }

    /// The output rows one tile of an input `h` rows tall gives at most, its output `oh` rows tall: the
    /// tile scaled as the network scales (an upsampling network's bands are taller), the whole output
    /// in [`Mode::Whole`] (one tile).
    fn output_rows(&self, h: usize, oh: usize) -> usize {
        match self.mode {
            Mode::Whole => oh,
            _ => self
                .tile
                .saturating_mul(oh.div_ceil(h.max(1)).max(1))
                .min(oh),
        }
    }

    /// The RAM budget, or the memory limit ([`stdx::mem`]) where that is smaller.
    fn ram(&self) -> u64 {
        self.budget.ram.min(stdx::mem::limit().0)
    }

    /// A band an output writer assembles at most: an eighth of the RAM budget, within the writer's own
    /// bound. The writer holds a band or two at once, so a quarter of the budget is left to it.
    fn writer_band_bytes(&self) -> usize {
        (self.ram() / 8).min(crate::npy::BAND_BYTES as u64) as usize
    }

    /// Runs `g` into `sink` under the RAM budget (or the memory limit) less `reserved` bytes (what the
    /// output's writer holds).
    fn run_graph(
        &self,
        g: &Graph,
        input: &dyn Input,
        sink: &dyn Sink,
        reserved: u64,
    ) -> bsp_tiling::Result<RunInfo> {
        let budget = Budget {
            ram: if reserved == 0 {
                self.budget.ram
            } else {
                self.ram().saturating_sub(reserved)
            },
            ..self.budget.clone()
        };
        let opts = bsp_tiling::Options {
            mode: self.mode,
            tile: self.tile,
            threads: self.threads,
            budget,
            ranks: self.ranks.clone(),
        };
        bsp_tiling::run_device(&self.device, g, input, &opts, sink)
    }

    /// Whether this process writes the output: alone, or rank 0 of the ranks.
    pub fn writes_output(&self) -> bool {
        self.ranks.as_ref().is_none_or(|r| r.is_root())
    }
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

/// Refuses an output that is the input itself (the same file by any spelling).
fn refuse_overwrite(input: &Path, output: &Path) -> Result<()> {
    if let (Ok(a), Ok(b)) = (input.canonicalize(), output.canonicalize())
        && a == b
    {
        return Err(Error::refused(
            output.display().to_string(),
            "the output would overwrite the input",
        ));
    }
    Ok(())
}

/// The output size a run writes: the network's, or cropped to the input's size times the network's scale.
pub fn output_shape(g: &Graph, h: usize, w: usize, full: bool) -> Result<(usize, usize, usize)> {
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

/// Runs `g` over `req.input`, writing `req.output`: the input read as [`InputFile`] says, the output
/// written tile by tile where its format allows.
pub fn infer_paths(g: &Graph, req: &InferRequest) -> Result<InferReport> {
    shared(req, || {
        refuse_overwrite(&req.input, &req.output)?;
        crate::output::check_output(&req.output, req.out_dtype)?;
        let input = InputFile::open(&req.input, &req.input_options(g.channels))?;
        let mut r = infer_input(g, &input, req)?;
        r.notes.splice(0..0, input.notes().iter().cloned());
        Ok(r)
    })
}

/// Runs `g` over `req.input` (read as [`InputFile`] says) into a float32 tensor; the notes say how the
/// input was read and how the run went.
pub fn infer_path_to_tensor(
    g: &Graph,
    req: &InferRequest,
) -> Result<(Tensor, RunInfo, Vec<String>)> {
    shared(req, || {
        let input = InputFile::open(&req.input, &req.input_options(g.channels))?;
        let (t, info) = run_to_tensor(g, &input, req)?;
        let notes = input
            .notes()
            .iter()
            .chain(info.notes.iter())
            .cloned()
            .collect();
        Ok((t, info, notes))
    })
}

/// Runs `g` over `data` into a float32 tensor (`in_scale` applies to 8-bit images).
pub fn infer_to_tensor(
    g: &Graph,
    data: &InputData,
    req: &InferRequest,
) -> Result<(Tensor, RunInfo)> {
    shared(req, || {
        let scaled = Scaled {
            inner: data.field(),
            scale: data.scale(req.in_scale),
        };
        run_to_tensor(g, &scaled, req)
    })
}

/// Runs `g` over `data`, writing `req.output` (its type by extension) tile by tile.
pub fn infer_to_path(g: &Graph, data: &InputData, req: &InferRequest) -> Result<InferReport> {
    shared(req, || {
        crate::output::check_output(&req.output, req.out_dtype)?;
        let scaled = Scaled {
            inner: data.field(),
            scale: data.scale(req.in_scale),
        };
        infer_input(g, &scaled, req)
    })
}

fn run_to_tensor(g: &Graph, input: &dyn Input, req: &InferRequest) -> Result<(Tensor, RunInfo)> {
    let (c, oh, ow) = output_shape(g, input.height(), input.width(), req.full)?;
    let sink = bsp_tiling::OutputSink::try_f32(c, oh, ow)?;
    let info = req.run_graph(g, input, &sink, 0)?;
    Ok((sink.finish().into_tensor()?, info))
}

fn infer_input(g: &Graph, input: &dyn Input, req: &InferRequest) -> Result<InferReport> {
    let (h, w) = (input.height(), input.width());
    let output = output_shape(g, h, w, req.full)?;
    let reserved = req
        .output(output)
        .reserve(req.output_rows(h, output.1), req.ram())?;
    run_to_output(req, (g.channels, h, w), output, |sink| {
        req.run_graph(g, input, sink, reserved)
    })
}

/// Runs `run` into `req.output` (of shape `output`) and reports it: a run over an input of shape
/// `input`, timed from the output's creation to its rename.
fn run_to_output(
    req: &InferRequest,
    input: (usize, usize, usize),
    output: (usize, usize, usize),
    run: impl Fn(&dyn Sink) -> bsp_tiling::Result<RunInfo>,
) -> Result<InferReport> {
    let t0 = std::time::Instant::now();
    let info = match &req.ranks {
        None => req.output(output).write(run)?,
        // Rank 0 writes the file (and commits it); the others send it their tiles. The file is
        // committed only if every rank's run succeeded, and every rank learns whether it was.
        Some(ranks) => {
            let written = if ranks.is_root() {
                req.output(output).write(run)
            } else {
                run(&Nowhere).map_err(Error::from_run)
            };
            let outcome = written.map_err(bsp_tiling::Error::from);
            ranks.finish("output", outcome).map_err(Error::from_run)?
        }
    };
    Ok(InferReport {
        notes: info.notes.clone(),
        input,
        output,
        info,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// `f()` on the ranks of `req`: an error this rank meets outside the run itself (opening the input,
/// checking the output) is told to the others, wherever they wait, so that none waits for ever.
fn shared<T>(req: &InferRequest, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match (&req.ranks, f()) {
        (Some(ranks), Err(e)) => Err(Error::from_run(
            ranks.tell("infer", bsp_tiling::Error::from(e)),
        )),
        (_, r) => r,
    }
}

/// The sink of a rank that does not write the output: the engine sends that rank's tiles to rank 0.
struct Nowhere;

impl Sink for Nowhere {
    fn put_tile(&self, _: usize, _: usize, _: &Tensor) -> bsp_tiling::Result<()> {
        Ok(())
    }
}

/// Runs `net`, a TransformerNet, over `req.input` on the stage engine (the CPU, or the CUDA backend in
/// f32 or f16), writing `req.output` as [`infer_paths`] does, cropped to the input's size unless
/// `req.full`. The network takes 8-bit values (0..255): a TIFF of 16-bit or float samples is refused
/// rather than run on values out of that range.
pub fn stylize_paths(net: &Net, req: &InferRequest) -> Result<InferReport> {
    shared(req, || {
        refuse_overwrite(&req.input, &req.output)?;
        crate::output::check_output(&req.output, req.out_dtype)?;
        let input = InputFile::open(&req.input, &req.input_options(3))?;
        if let Some(t) = input.tiff_sample_type().filter(|&t| t != SampleType::U8) {
            return Err(Error::refused(
                req.input.display().to_string(),
                format!(
                    "{t:?} samples: style transfer takes 8-bit images (`l3 infer --in-scale` scales others)"
                ),
            ));
        }
        let (h, w) = (input.height(), input.width());
        let (c, fh, fw) = bsp_tiling::stylize_shape(net, h, w)?;
        let (oh, ow) = if req.full { (fh, fw) } else { (h, w) };
        // The writer's bands come off the budget, as for `l3 infer`: a writer that would hold the whole
        // budget is refused before the run.
        let reserved = req
            .output((c, oh, ow))
            .reserve(req.output_rows(h, oh), req.ram())?;
        let opts = bsp_tiling::Options {
            mode: req.mode,
            tile: req.tile,
            threads: req.threads,
            budget: Budget {
                ram: req.ram() - reserved,
                ..req.budget.clone()
            },
            ranks: req.ranks.clone(),
        };
        let graph = Graph::from_net(net);
        let mut report = run_to_output(req, (3, h, w), (c, oh, ow), |sink| {
            bsp_tiling::run_device(&req.device, &graph, &input, &opts, sink)
        })?;
        report.notes.splice(0..0, input.notes().iter().cloned());
        Ok(report)
    })
}
