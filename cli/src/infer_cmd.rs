//! `l3 infer`: any supported network (ONNX, or a TransformerNet in safetensors) over an image of any size
//! with BSP tiling; the library side is the `infer-io` crate.
use anyhow::bail;
use bsp_tiling::{Budget, Device, DeviceOptions, Mode, PaddingMode, Precision};
use infer_io::{InferRequest, infer_paths, load_model};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct InferArgs {
    /// The network: an ONNX model (.onnx: the tileable CNN subset, see bsp_tiling::onnx) or a
    /// TransformerNet in safetensors.
    #[arg(long, required_unless_present = "list_pages")]
    pub model: Option<PathBuf>,
    /// Tile side in input pixels (a multiple of the network's total stride).
    #[arg(long, default_value_t = 512)]
    pub tile: usize,
    /// exact | sampled | naive | whole (also `sampled:N` and `recompute`: exact statistics recomputed
    /// per normalisation, nothing stored but the output)
    #[arg(long, default_value = "exact")]
    pub mode: String,
    /// Where the graph runs: cpu, cuda (GPU 0) or cuda:N (every node on the CUDA backend's kernels). A
    /// GPU that cannot be used is an error, never a CPU run.
    #[arg(long, default_value = "cpu", value_parser = loader::clap_values::Text::<Device>::new("device"))]
    pub device: Device,
    /// Bytes of GPU memory the run may use (with --device cuda; default: what is free, less a margin).
    #[arg(long)]
    pub gpu_memory: Option<u64>,
    /// f32. Graph convolutions have f32 kernels only: f16 is refused naming the first convolution.
    #[arg(long, default_value = "f32")]
    pub precision: String,
    #[arg(long)]
    pub threads: Option<usize>,
    /// TransformerNet safetensors only: padding at the image border (reflect as trained, circular, zero,
    /// replicate). An ONNX model pads as exported.
    #[arg(long)]
    pub padding: Option<String>,
    /// MiB of RAM a run's activations may take: each tile's working set first (a tile too large is
    /// shrunk to fit, with a note, or the run refused), stored values in the rest, spilled to files
    /// (--spill-dir) beyond it. L3_MEMORY_LIMIT, where smaller, bounds it too.
    #[arg(long, default_value_t = 2048)]
    pub ram_budget_mib: u64,
    /// Where spill files go (default: the system temporary directory).
    #[arg(long)]
    pub spill_dir: Option<PathBuf>,
    /// Crop the output to the input's size times the network's scale (by default it is the network's
    /// whole output, as onnxruntime gives it).
    #[arg(long)]
    pub crop_to_input: bool,
    /// Factor applied to 8-bit input pixels (0..255): 0.00392156862 (1/255) for networks trained on 0..1.
    /// `.npy` inputs are taken as they are.
    #[arg(long, default_value_t = 1.0)]
    pub in_scale: f32,
    /// Factor applied to the output before 8-bit clamping (255 for a 0..1 output); float32 outputs are raw.
    #[arg(long, default_value_t = 1.0)]
    pub out_scale: f32,
    /// The output's samples where the format offers a choice: a .tif is uint8 (clamped, like PNG) by
    /// default or float32 (the raw output); .npy is float32, the image formats uint8.
    #[arg(long)]
    pub out_dtype: Option<String>,
    /// The page of a TIFF input to read (default 0, the first: a slide's full resolution; later pages are
    /// reduced levels, overviews, thumbnails, label images; see --list-pages). Refused for other inputs.
    #[arg(long)]
    pub page: Option<usize>,
    /// The level of that page to read: 0 (default) the page itself, N its N-th SubIFD — where pyramidal
    /// slides (OME-TIFF and most whole-slide writers) keep their reduced resolutions; see --list-pages.
    /// Refused for other inputs.
    #[arg(long)]
    pub level: Option<usize>,
    /// Prints the pages of a TIFF file, one line each (index, and level for a page's SubIFDs, WxH,
    /// channels, sample type, tiled or striped with the chunk size, reduced resolution or not), and runs
    /// nothing.
    #[arg(long, value_name = "TIFF", conflicts_with_all = ["model", "page", "level", "input", "output"])]
    pub list_pages: Option<PathBuf>,
    /// Read by region: .l3, .tif/.tiff (TIFF or BigTIFF, tiled or striped; 8/16-bit or float32 samples;
    /// the page --page says), .npy (float32 C×H×W, taken as is). Decoded whole (said on stderr): any other
    /// image the toolkit reads (PNG, JPEG, ...).
    #[arg(required_unless_present = "list_pages")]
    pub input: Option<PathBuf>,
    /// Written tile by tile: .npy (float32 C×H×W), .tif/.tiff (tiled BigTIFF, uint8 or --out-dtype
    /// float32). Rows streamed (uint8): .png, .ppm/.pgm, .l3 (the default format; what it writes last
    /// waits in a spill file beside the output), .jpg (quality 95).
    #[arg(required_unless_present = "list_pages")]
    pub output: Option<PathBuf>,
}

pub fn run(a: InferArgs) -> anyhow::Result<()> {
    if let Some(path) = &a.list_pages {
        for page in infer_io::tiff::pages(path)? {
            println!("{page}");
        }
        return Ok(());
    }
    let (Some(model), Some(input), Some(output)) = (a.model, a.input, a.output) else {
        bail!("--model, an input and an output are required unless --list-pages is given");
    };
    let Some(mode) = Mode::parse(&a.mode) else {
        bail!(
            "unknown --mode {:?}: use exact, sampled, sampled:N, recompute, naive or whole",
            a.mode
        );
    };
    let padding = match &a.padding {
        None => None,
        Some(p) => Some(PaddingMode::parse(p).ok_or_else(|| {
            anyhow::anyhow!("unknown --padding {p:?}: use reflect, circular, zero or replicate")
        })?),
    };
    let Some(precision) = Precision::parse(&a.precision) else {
        bail!("unknown --precision {:?}: use f32 or f16", a.precision);
    };
    let device = DeviceOptions {
        device: a.device,
        gpu_memory: a.gpu_memory,
        precision,
    };
    device.validate()?;
    let out_dtype =
        match &a.out_dtype {
            None => None,
            Some(d) => Some(infer_io::tiff::OutDType::parse(d).ok_or_else(|| {
                anyhow::anyhow!("unknown --out-dtype {d:?}: use uint8 or float32")
            })?),
        };
    let g = load_model(&model, padding)?;
    let defaults = bsp_tiling::Options::default();
    let req = InferRequest {
        input,
        output,
        mode,
        tile: a.tile,
        threads: a.threads.unwrap_or(defaults.threads).max(1),
        budget: Budget {
            ram: a.ram_budget_mib << 20,
            disk: None,
            spill_dir: a.spill_dir.clone().unwrap_or_else(std::env::temp_dir),
        },
        full: !a.crop_to_input,
        in_scale: a.in_scale,
        out_scale: a.out_scale,
        out_dtype,
        device,
        page: a.page,
        level: a.level,
    };
    let r = infer_paths(&g, &req)?;
    for note in &r.notes {
        eprintln!("infer: {note}");
    }
    let rss = bsp_tiling::metrics::rss().map_or("?".into(), |(p, _)| {
        format!("{:.1} MiB", p as f64 / 1048576.0)
    });
    eprintln!(
        "infer: {} {}x{}x{} -> {}x{}x{} mode {} ({} tiles, {} spilled layers) in {:.2} s, peak RSS {rss}",
        g.name,
        r.input.0,
        r.input.1,
        r.input.2,
        r.output.0,
        r.output.1,
        r.output.2,
        a.mode,
        r.info.tiles,
        r.info.spilled_layers,
        r.seconds
    );
    Ok(())
}
