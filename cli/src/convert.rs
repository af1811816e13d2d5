//! `l3 convert --to l3|raw|pcr|png|jpeg|shards IN_DIR OUT_DIR`: a thin shell over `loader::convert`.
use anyhow::{Context, bail};
use loader::convert::{
    Conversion, ConvertOptions, PcrBuild, ShardBuild, convert_folder, convert_masks, to_pcr,
    to_shards,
};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Output format: l3, raw (PPM/PGM/PAM), pcr (records transcoded from JPEGs), png, jpeg, or shards
    /// (WebDataset tar shards of the files as they are, with an index of member offsets beside each).
    #[arg(long)]
    pub to: String,
    pub input: PathBuf,
    pub output: PathBuf,
    /// Threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// JPEG quality: for `--to jpeg` (default 90), and for `--to pcr` the quality at which non-JPEG inputs
    /// are encoded first — lossy, so they are refused unless it is given.
    #[arg(long)]
    pub quality: Option<u32>,
    /// Accept 16-bit / float inputs by converting them to 8 bits (lossy).
    #[arg(long)]
    pub to_8bit: bool,
    /// The input is a folder of label maps (segmentation masks): each is converted losslessly with one
    /// channel; 16-bit masks stay PNG (L3 and raw hold 8 bits), and the tool says how many.
    #[arg(long)]
    pub masks: bool,
    /// With `--to shards`: bytes per shard at most (512MB, 1G, or plain bytes; K, M, G are powers of 1024).
    #[arg(long, default_value = "512MB")]
    pub shard_size: String,
    /// With `--to shards`: shard file names are PREFIX-000000.tar, PREFIX-000001.tar, ...
    #[arg(long, default_value = "shard")]
    pub shard_prefix: String,
    /// With `--to shards`: a folder of masks paired with the images by path and stem, written as
    /// KEY.seg.EXT members.
    #[arg(long, value_name = "DIR")]
    pub shard_masks: Option<PathBuf>,
    /// With `--to shards`: a COCO instances file whose boxes are written per image as KEY.json members.
    #[arg(long, value_name = "FILE")]
    pub boxes: Option<PathBuf>,
    /// With `--to l3`: the L3 format (as `l3 encode`: default v2, profile ans).
    #[command(flatten)]
    pub l3: crate::codec::L3FormatArgs,
}

pub fn run(a: ConvertArgs) -> anyhow::Result<()> {
    if a.to == "shards" {
        return shards(&a);
    }
    if a.shard_masks.is_some() || a.boxes.is_some() {
        bail!("--shard-masks and --boxes go with --to shards");
    }
    let threads = stdx::parallel::threads(a.threads.unwrap_or(0));
    let chose = a.l3.format.is_some() || a.l3.profile.is_some();
    let l3 = if a.to == "l3" {
        a.l3.resolve()?
    } else {
        l3_format::DEFAULT_FORMAT
    };
    let target = match Conversion::resolve(&a.to, a.quality, l3, chose)? {
        Conversion::Files(t) => t,
        Conversion::Pcr { .. } if a.masks => {
            bail!("masks are converted losslessly, one file each: --to l3, png or raw, not pcr")
        }
        Conversion::Pcr { lossy_quality } => return pcr(&a, lossy_quality, threads),
        Conversion::Liquid => {
            bail!("a Liquid dataset is built with its profiler: l3 liquid profile IN_DIR OUT_DIR")
        }
    };
    let total = loader::image_files(&a.input)?.files.len();
    let bar = progress_bar(total as u64, &format!("-> {}", a.to));
    let t0 = std::time::Instant::now();
    let opts = ConvertOptions {
        threads,
        to_8bit: a.to_8bit,
    };
    let on_progress = |done: usize, _: usize| bar.set_position(done as u64);
    let s = if a.masks {
        convert_masks(&a.input, &a.output, target, &opts, &on_progress)
    } else {
        convert_folder(&a.input, &a.output, target, &opts, &on_progress)
    };
    bar.finish_and_clear();
    let s =
        s.with_context(|| format!("converting {} to {}", a.input.display(), a.output.display()))?;
    for w in &s.warnings {
        eprintln!("l3: warning: {w}");
    }
    if s.stale_removed > 0 {
        eprintln!(
            "l3: note: removed {} temporary files an interrupted run left",
            s.stale_removed
        );
    }
    if s.kept_png > 0 {
        eprintln!(
            "l3: note: {} 16-bit masks stay PNG (copied unchanged): {} holds 8-bit values",
            s.kept_png, a.to
        );
    }
    println!(
        "converted {} files ({} already done) into {}: {} bytes written in {:.1} s on {threads} threads",
        s.converted,
        s.skipped,
        a.output.display(),
        s.bytes_written,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Shards hold the files as they are; masks and boxes join them as members of each image's sample.
fn shards(a: &ConvertArgs) -> anyhow::Result<()> {
    if a.quality.is_some() || a.masks || a.to_8bit {
        bail!(
            "--to shards packs the files as they are: no --quality, --masks or --to-8bit (convert first)"
        );
    }
    let shard_size = parse_shard_size(&a.shard_size)?;
    let t0 = std::time::Instant::now();
    let build = ShardBuild {
        shard_size,
        prefix: a.shard_prefix.clone(),
        masks: a.shard_masks.clone(),
        boxes: a.boxes.clone(),
        ..ShardBuild::default()
    };
    let s = to_shards(&a.input, &a.output, &build)
        .with_context(|| format!("packing {} into shards", a.input.display()))?;
    if s.removed > 0 {
        eprintln!(
            "l3: note: removed {} shard files an earlier run wrote past the last one",
            s.removed
        );
    }
    println!(
        "wrote {} samples in {} shards ({} bytes) in {:.1} s: open them as {}",
        s.samples,
        s.shards,
        s.bytes_written,
        t0.elapsed().as_secs_f64(),
        s.pattern
    );
    Ok(())
}

/// `512MB`, `512MiB`, `512M`, `1G` or plain bytes (K, M, G, T are powers of 1024).
fn parse_shard_size(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    match stdx::mem::parse_size(t) {
        Some(n) if n > 0 => Ok(n),
        _ => bail!("--shard-size {text:?}: a size such as 512MB, 1G or 100000000"),
    }
}

/// PCRs are built from JPEGs: JPEG inputs are transcoded losslessly; other inputs only with `--quality`.
fn pcr(a: &ConvertArgs, lossy_quality: Option<u8>, threads: usize) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let build = PcrBuild {
        threads,
        lossy_quality,
        ..PcrBuild::default()
    };
    println!(
        "building PCRs from {} on {threads} threads ...",
        a.input.display()
    );
    let s = to_pcr(&a.input, &a.output, &build)?;
    for w in &s.warnings {
        eprintln!("l3: warning: {w}");
    }
    if s.reencoded > 0 {
        println!(
            "{} non-JPEG inputs encoded as JPEG (quality {}, lossy) in {}",
            s.reencoded,
            lossy_quality.unwrap_or(0),
            a.output.join(".jpeg-src").display()
        );
    }
    let ds =
        pcr::Dataset::open(&a.output).with_context(|| format!("opening {}", a.output.display()))?;
    println!(
        "PCR dataset {}: {} records, {} images, {} scan groups, {} bytes ({:.1} s{})",
        a.output.display(),
        ds.records(),
        ds.images(),
        ds.groups(),
        ds.total_bytes(),
        t0.elapsed().as_secs_f64(),
        if s.reused { ", already complete" } else { "" }
    );
    Ok(())
}

pub fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
