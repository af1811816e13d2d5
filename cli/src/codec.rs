//! `l3 encode`, `l3 decode`, `l3 info`: a thin shell over `l3-format` and the loader's one image-import
//! path (`loader::import`: upright pixels, gray+alpha kept as RGBA, 16-bit only with `--to-8bit`).
//!
//! Outputs: `.png` → PNG; `.ppm`/`.pgm`/`.pnm` → binary netpbm, P5 for gray and P6 for RGB (RGBA is refused:
//! PPM has no alpha; use `.png` or `.pam`); `.pam` → P7. Every output is written under a temporary name
//! and renamed into place, so a failure never leaves a half-written file, and an output that is the input
//! is refused.
use anyhow::{Context, bail};
use l3_format::{EncodeOptions, Format, L3Index, PixelLayout, Profile, Rect};
use loader::convert::Target;
use loader::{Image, ImportOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// `--format v1|v2` and `--profile ans|bp`: which L3 format to write (`l3 encode`, `l3 convert --to l3`).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct L3FormatArgs {
    /// L3 format version: v2 (the default, with profile ans: checksummed, smaller than PNG) or v1 (the
    /// paper's format: no checksum, about 2.6 times larger, fastest to decode on the CPU).
    #[arg(long, value_enum)]
    pub format: Option<VersionArg>,
    /// Version-2 profile (implies --format v2): ans (the default: smallest files, and a crop's read checks
    /// every patch it decodes) or bp (bit-packed, no tables: faster to encode and decode, but a crop's read
    /// misses most flipped bits; whole-file reads check the CRC of either).
    #[arg(long, value_enum)]
    pub profile: Option<ProfileArg>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionArg {
    V1,
    V2,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileArg {
    Ans,
    Bp,
}

impl L3FormatArgs {
    /// The format asked for; nothing asked is [`l3_format::DEFAULT_FORMAT`], a profile alone means v2.
    pub fn resolve(self) -> anyhow::Result<Format> {
        let profile = self.profile.map(|p| match p {
            ProfileArg::Ans => Profile::Ans,
            ProfileArg::Bp => Profile::Bp,
        });
        let version = self.format.map(|v| match v {
            VersionArg::V1 => 1,
            VersionArg::V2 => 2,
        });
        Format::resolve(version, profile)
            .map_err(|reason| anyhow::anyhow!("--format/--profile: {reason}"))
    }
}

#[derive(clap::Args)]
pub struct EncodeArgs {
    pub input: PathBuf,
    pub output: PathBuf,
    #[command(flatten)]
    pub format: L3FormatArgs,
    /// Patch size N. Version 1: 1..=255, default 32 or 64 by resolution; version 2: a multiple of 32 up to
    /// 224, default 128.
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
    /// Also decode every patch (one row of patches at a time, in bounded memory), proving the whole file
    /// is valid.
    #[arg(long)]
    pub verify: bool,
}

/// Refuses an output that is the input file (through any path or link).
pub fn refuse_overwriting_input(input: &Path, output: &Path) -> anyhow::Result<()> {
    if let (Ok(a), Ok(b)) = (std::fs::canonicalize(input), std::fs::canonicalize(output))
        && a == b
    {
        bail!(
            "{}: the output is the input file; write to another path",
            output.display()
        );
    }
    Ok(())
}

fn write_output(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    stdx::fs::write_atomic(path, bytes).with_context(|| format!("writing {}", path.display()))
}

pub fn encode(a: EncodeArgs) -> anyhow::Result<()> {
    let format = a.format.resolve()?;
    refuse_overwriting_input(&a.input, &a.output)?;
    let img = loader::import(
        &a.input,
        &ImportOptions {
            to_8bit: a.to_8bit,
            ..Default::default()
        },
    )?;
    let (w, h, c) = (img.width, img.height, img.channels);
    let opts = EncodeOptions {
        format,
        patch_size: a.patch,
        threads: a.threads,
        ..EncodeOptions::default()
    };
    let file = l3_format::encode_with(&img.pixels, w, h, c, &opts)
        .with_context(|| format!("encoding {} as L3 {format}", a.input.display()))?;
    write_output(&a.output, &file)
}

pub fn decode(a: DecodeArgs) -> anyhow::Result<()> {
    let ext = a
        .output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let target = match ext.as_deref() {
        Some("png") => Target::Png,
        Some("ppm" | "pgm" | "pnm" | "pam") => Target::Raw,
        _ => bail!(
            "{}: unknown output extension (use .png, .ppm, .pgm, .pnm or .pam)",
            a.output.display()
        ),
    };
    refuse_overwriting_input(&a.input, &a.output)?;
    let bytes = stdx::fs::read_regular(&a.input, loader::max_image_bytes())
        .with_context(|| format!("reading {}", a.input.display()))?;
    let file = l3_format::L3File::parse(&bytes)
        .with_context(|| format!("parsing {}", a.input.display()))?;
    let (w, h, c) = (file.width(), file.height(), file.channels());
    if ext.as_deref() != Some("pam") && target == Target::Raw && c == 4 {
        bail!(
            "{}: RGBA image cannot be written as PPM/PGM (no alpha); use .png or .pam",
            a.output.display()
        );
    }
    let mut pixels = vec![0u8; file.decoded_len()];
    file.decode_hwc_parallel(&mut pixels, a.threads)
        .with_context(|| format!("decoding {}", a.input.display()))?;
    let img = Image {
        width: w,
        height: h,
        channels: c,
        pixels,
    };
    let out = loader::convert::encode(&img, target)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.output.display()))?;
    write_output(&a.output, &out)
}

pub fn info(a: InfoArgs) -> anyhow::Result<()> {
    // Header first: the file's length and its first bytes say everything `info` prints, so a huge file (or
    // a device such as /dev/zero) is never read whole.
    let path = &a.input;
    let file =
        stdx::fs::open_regular(path).with_context(|| format!("reading {}", path.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let f = L3Index::read_at(&file, len).map_err(|e| in_file(e, "parsing", path))?;
    // Version 2 ends with a CRC-32C of everything before it: checked on every read, here by streaming the
    // file through a bounded buffer (any size in bounded memory).
    let crc = f
        .verify_crc_at(&file)
        .map_err(|e| in_file(e, "checking", path))?;
    let entry_crcs = if f.has_entry_crcs() {
        Some(check_entries(&f, &file, path)?)
    } else {
        None
    };
    if a.verify {
        verify(&f, &file, path)?;
    }
    let (w, h, c, n) = (f.width(), f.height(), f.channels(), f.patch_size() as u32);
    let kind = match c {
        1 => "gray",
        3 => "RGB",
        _ => "RGBA",
    };
    let (px, py) = (w.div_ceil(n) as usize, h.div_ceil(n) as usize);
    let per = px * py;
    let raw = w as u64 * h as u64 * c as u64;
    println!("file: {}", path.display());
    println!("format version: {}", f.version());
    match f.profile() {
        Some(p @ Profile::Ans) => {
            println!("profile: {p} (static context rANS, 32 lanes per patch)")
        }
        Some(p @ Profile::Bp) => println!("profile: {p} (bit-packed groups, no tables)"),
        None => println!("profile: none (version 1: row-wise base-delta)"),
    }
    println!("dimensions: {w}x{h}");
    println!("channels: {c} ({kind})");
    println!("bit depth: 8");
    println!("patch size: {n}");
    println!(
        "patches: {px}x{py} = {per} per channel, {} in total",
        per * c as usize
    );
    println!("file bytes: {len}");
    println!("patch data bytes: {}", f.patch_data_len());
    println!("raw bytes: {raw}");
    println!(
        "compressed ratio: {:.4} (file bytes / raw bytes)",
        len as f64 / raw as f64
    );
    match crc {
        Some(c) => println!("crc32c: {c:08x} (verified)"),
        None => println!("crc32c: none (version 1 has no checksum)"),
    }
    match (entry_crcs, f.version()) {
        (Some(k), _) => println!("entry crc32c: {k} entries and the prefix (verified)"),
        (None, 2) => println!("entry crc32c: none (region reads rely on the decoders' checks)"),
        (None, _) => {}
    }
    if a.verify {
        println!("verified: every patch decodes");
    }
    Ok(())
}

/// A container read's error with the file's name: `doing` it for a bad file, `reading` it for a failed read.
fn in_file(e: l3_format::ReadError, doing: &str, path: &Path) -> anyhow::Error {
    match e {
        l3_format::ReadError::Read { source, .. } => {
            anyhow::Error::new(source).context(format!("reading {}", path.display()))
        }
        l3_format::ReadError::Format(e) => {
            anyhow::Error::new(e).context(format!("{doing} {}", path.display()))
        }
    }
}

/// Checks every offset-table entry of a version-2 file with entry CRCs against its CRC-32C (the index's
/// parse checked the prefix's), reading one entry at a time. Returns how many were checked.
fn check_entries(f: &L3Index, file: &std::fs::File, path: &Path) -> anyhow::Result<usize> {
    let per = f.width().div_ceil(f.patch_size().into()) as usize
        * f.height().div_ceil(f.patch_size().into()) as usize;
    let planes = match f.profile() {
        Some(Profile::Ans) => 1,
        _ => f.channels() as usize,
    };
    let mut buf = Vec::new();
    for ch in 0..planes {
        for p in 0..per {
            let r = f
                .patch_range(ch, p)
                .with_context(|| format!("{}: patch {p} of channel {ch}", path.display()))?;
            buf.resize((r.end - r.start) as usize, 0);
            file.read_exact_at(&mut buf, r.start)
                .with_context(|| format!("reading {}", path.display()))?;
            f.check_patch(ch, p, &buf)
                .with_context(|| format!("checking {}", path.display()))?;
        }
    }
    Ok(planes * per)
}

/// Decodes the whole image one row of patches at a time: memory for one band, whatever the image size.
fn verify(f: &L3Index, file: &std::fs::File, path: &Path) -> anyhow::Result<()> {
    let (w, h, c, n) = (f.width(), f.height(), f.channels(), f.patch_size() as u32);
    let mut frags = l3_format::Fragments::new();
    let mut band = Vec::new();
    for y in (0..h).step_by(n as usize) {
        let rect = Rect::new(0, y, w, n.min(h - y));
        let ranges = f.region_ranges(rect, 0)?;
        frags.reset(&ranges);
        for (r, buf) in frags.slices_mut() {
            file.read_exact_at(buf, r.start)
                .with_context(|| format!("reading {}", path.display()))?;
        }
        let layout = PixelLayout::packed(rect.w, rect.h, c, false);
        band.resize(rect.w as usize * rect.h as usize * c as usize, 0);
        f.decode_region(&frags, rect, &mut band, layout)
            .with_context(|| format!("decoding {}", path.display()))?;
    }
    Ok(())
}
