//! `l3 infer`: any supported network (ONNX, or a TransformerNet in safetensors) over an image of any size
//! with BSP tiling; the library side is the `infer-io` crate.
use anyhow::bail;
use infer_io::{InferSettings, infer_paths, load_model};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct InferArgs {
    /// The network: an ONNX model (.onnx: the tileable CNN subset, see bsp_tiling::onnx) or a
    /// TransformerNet in safetensors.
    #[arg(long, required_unless_present = "list_pages")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub settings: InferSettings,
    /// The output cropped to the input's size times the network's scale (`--full=false`), instead of the
    /// network's whole output as onnxruntime gives it.
    #[arg(long, conflicts_with = "full")]
    pub crop_to_input: bool,
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
    let mut settings = a.settings.clone();
    if a.crop_to_input {
        settings.full = Some(false);
    }
    let req = settings.request(input, output)?;
    let g = load_model(&model, a.settings.padding)?;
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
        req.mode,
        r.info.tiles,
        r.info.spilled_layers,
        r.seconds
    );
    Ok(())
}
