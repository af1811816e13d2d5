//! `l3 stylize`: fast style transfer on an image of any size with BSP tiling — `l3 infer`'s input
//! reading and output writers around the TransformerNet stage engine (which also runs on a GPU in f16),
//! so that memory is bounded by the tiles, the halo, the RAM budget and the spill, not by the image.
use anyhow::{Context, bail};
use bsp_tiling::{Budget, Device, DeviceOptions, Mode, Net, Options, PaddingMode, Precision};
use infer_io::{InferRequest, stylize_paths};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct StylizeArgs {
    /// TransformerNet weights in safetensors with the PyTorch example's key names.
    #[arg(long)]
    pub model: PathBuf,
    /// Tile side in input pixels (a multiple of 4; default 512 on the CPU, 2048 on a GPU).
    #[arg(long)]
    pub tile: Option<usize>,
    /// Where the network runs: cpu, cuda (GPU 0) or cuda:N. A GPU that cannot be used is an error.
    #[arg(long, default_value = "cpu", value_parser = loader::clap_values::Text::<Device>::new("device"))]
    pub device: Device,
    /// Bytes of GPU memory the run may use (default: what is free, less headroom).
    #[arg(long)]
    pub gpu_memory: Option<u64>,
    /// f32, or f16 (binary16 operands, f32 accumulation) on a GPU.
    #[arg(long, default_value = "f32")]
    pub precision: String,
    /// exact | sampled | naive | whole (also `sampled:N` for an N-times downsampled sample, and
    /// `recompute`: exact statistics recomputed per layer, no stored activations)
    #[arg(long, default_value = "exact")]
    pub mode: String,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Padding on the image border: reflect (as trained) or circular (the paper's choice), zero, replicate.
    #[arg(long, default_value = "reflect")]
    pub padding: String,
    /// MiB of activations kept in RAM by `exact`; beyond it layers spill to memory-mapped files.
    #[arg(long, default_value_t = 2048)]
    pub ram_budget_mib: u64,
    /// Where spill files go (default: the system temporary directory).
    #[arg(long)]
    pub spill_dir: Option<PathBuf>,
    /// Keep PyTorch's output size (each side rounded up to a multiple of 4) instead of cropping to the input's.
    #[arg(long)]
    pub full: bool,
    /// The page of a TIFF input (default 0; see `l3 infer --list-pages`). Refused for other inputs.
    #[arg(long)]
    pub page: Option<usize>,
    /// The level of that page: 0 (default) the page itself, N its N-th SubIFD (a pyramid's reduced
    /// resolution). Refused for other inputs.
    #[arg(long)]
    pub level: Option<usize>,
    /// Read by region: .l3, .tif/.tiff (8-bit samples, the first page). Decoded whole (said on stderr):
    /// any other image the toolkit reads (PNG, JPEG, ...). Gray is replicated to RGB, alpha dropped.
    pub input: PathBuf,
    /// Written as tiles complete, by extension: rows streamed: .png, .ppm, .l3 (the default format; what
    /// it writes last waits in a spill file beside the output); tile by tile: .tif/.tiff (tiled BigTIFF,
    /// uint8), .npy (float32 C×H×W, the raw output, unclamped); rows streamed to the encoder: .jpg.
    pub output: PathBuf,
}

pub fn run(a: StylizeArgs) -> anyhow::Result<()> {
    let Some(mode) = Mode::parse(&a.mode) else {
        bail!(
            "unknown --mode {:?}: use exact, sampled, sampled:N, recompute, naive or whole",
            a.mode
        );
    };
    let Some(padding) = PaddingMode::parse(&a.padding) else {
        bail!(
            "unknown --padding {:?}: use reflect, circular, zero or replicate",
            a.padding
        );
    };
    let device = a.device;
    let Some(precision) = Precision::parse(&a.precision) else {
        bail!("unknown --precision {:?}: use f32 or f16", a.precision);
    };
    let dev = DeviceOptions {
        device,
        gpu_memory: a.gpu_memory,
        precision,
    };
    let net = Net::load_transformer(&a.model, padding)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let defaults = Options::default();
    let req = InferRequest {
        input: a.input,
        output: a.output,
        mode,
        tile: a.tile.unwrap_or(bsp_tiling::default_tile(device)),
        threads: a.threads.unwrap_or(defaults.threads).max(1),
        budget: Budget {
            ram: a.ram_budget_mib << 20,
            disk: None,
            spill_dir: a.spill_dir.unwrap_or_else(std::env::temp_dir),
        },
        full: a.full,
        in_scale: 1.0,
        out_scale: 1.0,
        out_dtype: None,
        device: dev,
        page: a.page,
        level: a.level,
    };
    let r = stylize_paths(&net, &req)?;
    for note in &r.notes {
        eprintln!("stylize: {note}");
    }
    let rss = bsp_tiling::metrics::rss().map_or("?".into(), |(p, _)| {
        format!("{:.1} MiB", p as f64 / 1048576.0)
    });
    eprintln!(
        "stylize: {}x{} -> {}x{} mode {} on {} ({} tiles, {} spilled layers) in {:.2} s, peak RSS {rss}",
        r.input.2,
        r.input.1,
        r.output.2,
        r.output.1,
        a.mode,
        device,
        r.info.tiles,
        r.info.spilled_layers,
        r.seconds
    );
    Ok(())
}
