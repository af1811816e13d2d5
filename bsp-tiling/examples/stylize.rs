//! Stylise an image file with a TransformerNet, tiled, and print how far each mode is from the whole-image
//! result.
//!
//! ```text
//! cargo run --release -p bsp-tiling --example stylize -- MODEL.safetensors IN.jpg OUT.png [MAX_SIDE] [MODE] [DEVICE]
//! ```
//! MAX_SIDE (default: keep the size) downscales the input first; MODE is exact (default), sampled,
//! sampled:N, recompute, naive or whole; DEVICE is cpu (default), cuda or cuda:N.

use bsp_tiling::metrics::{compare, seams};
use bsp_tiling::{
    Device, DeviceOptions, Image, Mode, Net, Options, PaddingMode, image_from_tensor, stylize_on,
};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: stylize MODEL.safetensors IN OUT.png [MAX_SIDE] [MODE] [DEVICE]");
        std::process::exit(2);
    }
    let net = Net::load_transformer(args[0].as_ref(), PaddingMode::Reflect)?;
    let mut img = image::open(&args[1])?.to_rgb8();
    if let Some(max) = args.get(3).and_then(|s| s.parse::<u32>().ok()) {
        let s = max as f64 / img.width().max(img.height()) as f64;
        if s < 1.0 {
            let (w, h) = (
                (img.width() as f64 * s) as u32,
                (img.height() as f64 * s) as u32,
            );
            img = image::imageops::resize(&img, w, h, image::imageops::FilterType::Triangle);
        }
    }
    let mode = args
        .get(4)
        .map_or(Some(Mode::Exact), |m| Mode::parse(m))
        .ok_or("unknown mode")?;
    let dev = DeviceOptions {
        device: args
            .get(5)
            .map_or(Some(Device::Cpu), |d| d.parse().ok())
            .ok_or("unknown device (cpu, cuda or cuda:N)")?,
        ..DeviceOptions::default()
    };
    let (w, h) = (img.width() as usize, img.height() as usize);
    let input = Image::rgb8(w as u32, h as u32, img.into_raw());
    let opts = Options {
        mode,
        tile: 128,
        ..Options::default()
    };

    let t = Instant::now();
    let (out, info) = stylize_on(&dev, &net, &input, &opts, false)?;
    println!(
        "{mode:?}: {} tiles, {:.2} s",
        info.tiles,
        t.elapsed().as_secs_f64()
    );
    let out = out.into_tensor()?;

    let whole = stylize_on(
        &dev,
        &net,
        &input,
        &Options {
            mode: Mode::Whole,
            ..opts.clone()
        },
        false,
    )?
    .0;
    let e = compare(&out, &whole.into_tensor()?);
    let borders = |n: usize| (1..n.div_ceil(128)).map(|i| i * 128).collect::<Vec<_>>();
    let s = seams(&out, &borders(h), &borders(w));
    println!(
        "vs whole image: max abs {:.2e}, mean abs {:.3}, PSNR {:.1} dB; seam ratio {:.3}",
        e.max_abs,
        e.mean_abs,
        e.psnr_db,
        s.ratio()
    );
    let o = image_from_tensor(&out);
    image::RgbImage::from_raw(o.width as u32, o.height as u32, o.pixels)
        .ok_or("buffer")?
        .save(&args[2])?;
    Ok(())
}
