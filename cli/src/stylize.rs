//! `l3 stylize`: fast style transfer on an image of any size with BSP tiling — `l3 infer`'s input
//! reading and output writers around the TransformerNet stage engine (which also runs on a GPU in f16),
//! so that memory is bounded by the tiles, the halo, the RAM budget and the spill, not by the image.
use anyhow::Context;
use bsp_tiling::{Net, PaddingMode};
use infer_io::{InferSettings, stylize_paths};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct StylizeArgs {
    /// TransformerNet weights in safetensors with the PyTorch example's key names.
    #[arg(long)]
    pub model: PathBuf,
    #[command(flatten)]
    pub settings: InferSettings,
    /// Read by region: .l3, .tif/.tiff (8-bit samples, the page --page says). Decoded whole (said on
    /// stderr): any other image the toolkit reads (PNG, JPEG, ...). Gray is replicated to RGB, alpha
    /// dropped.
    pub input: PathBuf,
    /// Written as tiles complete, by extension: rows streamed: .png, .ppm, .l3 (the default format; what
    /// it writes last waits in a spill file beside the output); tile by tile: .tif/.tiff (tiled BigTIFF,
    /// uint8 or --out-dtype float32), .npy (float32 C×H×W, the raw output, unclamped); rows streamed to
    /// the encoder: .jpg.
    pub output: PathBuf,
}

pub fn run(a: StylizeArgs) -> anyhow::Result<()> {
    let req = a
        .settings
        .clone()
        .cropped_by_default()
        .request(a.input, a.output)?;
    let padding = a.settings.padding.unwrap_or(PaddingMode::Reflect);
    let net = Net::load_transformer(&a.model, padding)
        .with_context(|| format!("loading {}", a.model.display()))?;
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
        req.mode,
        req.device.device,
        r.info.tiles,
        r.info.spilled_layers,
        r.seconds
    );
    Ok(())
}
