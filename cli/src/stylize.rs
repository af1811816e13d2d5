//! `l3 stylize`: fast style transfer on an image of any size with BSP tiling.
use anyhow::{Context, bail};
use bsp_tiling::{
    Budget, Device, DeviceOptions, Image, Mode, Net, Options, Output, PaddingMode, Precision,
    stylize_on,
};
use std::path::PathBuf;
use std::time::Instant;

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
    pub input: PathBuf,
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
    crate::codec::refuse_overwriting_input(&a.input, &a.output)?;
    let img = loader::import(&a.input, &loader::ImportOptions::default())?.to_rgb();
    let (w, h) = (img.width as usize, img.height as usize);
    let input = img;
    let defaults = Options::default();
    let opts = Options {
        mode,
        tile: a.tile.unwrap_or(bsp_tiling::default_tile(device)),
        threads: a.threads.unwrap_or(defaults.threads).max(1),
        budget: Budget {
            ram: a.ram_budget_mib << 20,
            disk: None,
            spill_dir: a.spill_dir.clone().unwrap_or_else(std::env::temp_dir),
        },
    };
    let t0 = Instant::now();
    let (out, info) = stylize_on(&dev, &net, &input, &opts, true)
        .with_context(|| format!("stylising {}", a.input.display()))?;
    let secs = t0.elapsed().as_secs_f64();
    drop(input);
    let Output::Rgb8(mut o) = out else {
        bail!("internal: expected an 8-bit output")
    };
    if !a.full && (o.width as usize, o.height as usize) != (w, h) {
        o = crop(&o, w, h);
    }
    write_png(&o, &a.output)?;
    let rss = bsp_tiling::metrics::rss().map_or("?".into(), |(p, _)| {
        format!("{:.1} MiB", p as f64 / 1048576.0)
    });
    eprintln!(
        "stylize: {}x{} -> {}x{} mode {} on {} ({} tiles, {} spilled layers) in {secs:.2} s, peak RSS {rss}",
        w, h, o.width, o.height, a.mode, a.device, info.tiles, info.spilled_layers
    );
    Ok(())
}

fn crop(o: &Image, w: usize, h: usize) -> Image {
    let mut pixels = Vec::with_capacity(w * h * 3);
    let ow = o.width as usize;
    for y in 0..h {
        pixels.extend_from_slice(&o.pixels[y * ow * 3..(y * ow + w) * 3]);
    }
    Image::rgb8(w as u32, h as u32, pixels)
}

/// PNG, written under a temporary name beside OUT and renamed: no half-written output on failure.
fn write_png(o: &Image, path: &std::path::Path) -> anyhow::Result<()> {
    let bytes = loader::convert::encode(o, loader::convert::Target::Png)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    stdx::fs::write_atomic(path, &bytes).with_context(|| format!("writing {}", path.display()))
}
