//! `l3 encode`, `l3 decode`, `l3 info` (issue 2): a thin shell over `l3-format`.
//!
//! Input images are read with the `image` crate (PNG, JPEG, PPM/PGM, BMP, GIF, TIFF, WebP). Gray → 1 channel,
//! RGB → 3, RGBA → 4; gray+alpha → 4 (RGBA with the gray repeated, so alpha survives losslessly). 16-bit and
//! float images are refused (L3 v1 is 8-bit and lossless) unless `--to-8bit` asks for the lossy conversion.
//! Outputs: `.png` → PNG; `.ppm`/`.pgm`/`.pnm` → binary netpbm, P5 for gray and P6 for RGB (RGBA is refused:
//! PPM has no alpha; use `.png` or `.pam`); `.pam` → P7 with the matching TUPLTYPE. Outputs are written to a
//! temporary name beside the target and renamed into place, so a failure never leaves a half-written file.
use anyhow::{Context, bail};
use l3_format::{L3File, default_patch_size, encode_parallel};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct EncodeArgs {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Patch size N (1..=255); default by resolution.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=255))]
    pub patch: Option<u8>,
    /// Accept 16-bit / float inputs by converting them to 8 bits (lossy).
    #[arg(long)]
    pub to_8bit: bool,
    /// Encoder threads (0 = every core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

#[derive(clap::Args)]
pub struct DecodeArgs {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Decoder threads (0 = every core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

#[derive(clap::Args)]
pub struct InfoArgs {
    pub input: PathBuf,
    /// Also decode every patch, proving the whole file is valid.
    #[arg(long)]
    pub verify: bool,
}

/// Pixels as L3 wants them: interleaved 8-bit, 1, 3 or 4 channels.
fn load_image(path: &Path, to_8bit: bool) -> anyhow::Result<(Vec<u8>, u32, u32, u8)> {
    use image::DynamicImage as D;
    let img = image::ImageReader::open(path)
        .with_context(|| format!("opening {}", path.display()))?
        .with_guessed_format()
        .with_context(|| format!("reading {}", path.display()))?
        .decode()
        .with_context(|| format!("decoding {}", path.display()))?;
    let (w, h) = (img.width(), img.height());
    Ok(match img {
        D::ImageLuma8(b) => (b.into_raw(), w, h, 1),
        D::ImageRgb8(b) => (b.into_raw(), w, h, 3),
        D::ImageRgba8(b) => (b.into_raw(), w, h, 4),
        D::ImageLumaA8(_) => (img.to_rgba8().into_raw(), w, h, 4),
        other => {
            if !to_8bit {
                bail!(
                    "{}: {:?} samples are not 8-bit; L3 v1 stores 8-bit samples only (pass --to-8bit to convert, lossily)",
                    path.display(),
                    other.color()
                );
            }
            eprintln!(
                "l3: note: {}: converting {:?} to 8 bits per sample (lossy)",
                path.display(),
                other.color()
            );
            match other.color().channel_count() {
                1 => (other.to_luma8().into_raw(), w, h, 1),
                3 => (other.to_rgb8().into_raw(), w, h, 3),
                _ => (other.to_rgba8().into_raw(), w, h, 4),
            }
        }
    })
}

/// Writes `bytes` via a temporary file in the same directory, then renames it over `path`.
fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut std::fs::File) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{}: not a file name", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        write(&mut f)?;
        f.flush()?;
        f.sync_all()
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

pub fn encode(a: EncodeArgs) -> anyhow::Result<()> {
    let (px, w, h, c) = load_image(&a.input, a.to_8bit)?;
    let n = a.patch.unwrap_or_else(|| default_patch_size(w, h));
    let file = encode_parallel(&px, w, h, c, n, a.threads)
        .with_context(|| format!("encoding {}", a.input.display()))?;
    write_atomic(&a.output, |f| {
        f.write_all(&file)
            .with_context(|| format!("writing {}", a.output.display()))
    })?;
    Ok(())
}

fn read_l3(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

enum OutKind {
    Png,
    Pnm,
    Pam,
}

pub fn decode(a: DecodeArgs) -> anyhow::Result<()> {
    let ext = a
        .output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let kind = match ext.as_deref() {
        Some("png") => OutKind::Png,
        Some("ppm" | "pgm" | "pnm") => OutKind::Pnm,
        Some("pam") => OutKind::Pam,
        _ => bail!(
            "{}: unknown output extension (use .png, .ppm, .pgm, .pnm or .pam)",
            a.output.display()
        ),
    };
    let bytes = read_l3(&a.input)?;
    let file = L3File::parse(&bytes).with_context(|| format!("parsing {}", a.input.display()))?;
    let (w, h, c) = (file.width(), file.height(), file.channels());
    if matches!(kind, OutKind::Pnm) && c == 4 {
        bail!(
            "{}: RGBA image cannot be written as PPM/PGM (no alpha); use .png or .pam",
            a.output.display()
        );
    }
    let mut px = vec![0u8; file.decoded_len()];
    file.decode_hwc_parallel(&mut px, a.threads)
        .with_context(|| format!("decoding {}", a.input.display()))?;
    let out = &a.output;
    write_atomic(out, |f| {
        let mut wr = std::io::BufWriter::new(f);
        match kind {
            OutKind::Png => {
                let color = match c {
                    1 => image::ExtendedColorType::L8,
                    3 => image::ExtendedColorType::Rgb8,
                    _ => image::ExtendedColorType::Rgba8,
                };
                image::ImageEncoder::write_image(
                    image::codecs::png::PngEncoder::new(&mut wr),
                    &px,
                    w,
                    h,
                    color,
                )
                .with_context(|| format!("writing {}", out.display()))?;
            }
            OutKind::Pnm => {
                let magic = if c == 1 { "P5" } else { "P6" };
                write!(wr, "{magic}\n{w} {h}\n255\n")?;
                wr.write_all(&px)?;
            }
            OutKind::Pam => {
                let tuple = match c {
                    1 => "GRAYSCALE",
                    3 => "RGB",
                    _ => "RGB_ALPHA",
                };
                write!(
                    wr,
                    "P7\nWIDTH {w}\nHEIGHT {h}\nDEPTH {c}\nMAXVAL 255\nTUPLTYPE {tuple}\nENDHDR\n"
                )?;
                wr.write_all(&px)?;
            }
        }
        wr.flush()
            .with_context(|| format!("writing {}", out.display()))?;
        Ok(())
    })
}

pub fn info(a: InfoArgs) -> anyhow::Result<()> {
    let bytes = read_l3(&a.input)?;
    let f = L3File::parse(&bytes).with_context(|| format!("parsing {}", a.input.display()))?;
    if a.verify {
        let mut px = vec![0u8; f.decoded_len()];
        f.decode_hwc_parallel(&mut px, 0)
            .with_context(|| format!("decoding {}", a.input.display()))?;
    }
    let kind = match f.channels() {
        1 => "gray",
        3 => "RGB",
        _ => "RGBA",
    };
    let per = f.patches_per_channel();
    let raw = f.decoded_len();
    println!("file: {}", a.input.display());
    println!("format version: {}", l3_format::VERSION);
    println!("dimensions: {}x{}", f.width(), f.height());
    println!("channels: {} ({kind})", f.channels());
    println!("bit depth: 8");
    println!("patch size: {}", f.patch_size());
    println!(
        "patches: {}x{} = {per} per channel, {} in total",
        f.patches_x(),
        f.patches_y(),
        per * f.channels() as usize
    );
    println!("file bytes: {}", bytes.len());
    println!("patch data bytes: {}", f.patch_data().len());
    println!("raw bytes: {raw}");
    println!(
        "compressed ratio: {:.4} (file bytes / raw bytes)",
        bytes.len() as f64 / raw as f64
    );
    if a.verify {
        println!("verified: every patch decodes");
    }
    Ok(())
}
