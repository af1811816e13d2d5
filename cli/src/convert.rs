//! `l3 convert --to l3|raw|pcr IN_DIR OUT_DIR` (issue: loader).
use anyhow::{Context, bail};
use loader::convert::{Target, convert_folder};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Output format: l3, raw (PPM/PGM/PAM), pcr (records built from JPEGs), png or jpeg.
    #[arg(long)]
    pub to: String,
    pub input: PathBuf,
    pub output: PathBuf,
    /// Threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// JPEG quality for `--to jpeg`, and for the JPEG copies `--to pcr` makes of non-JPEG inputs.
    #[arg(long, default_value_t = 90)]
    pub quality: u8,
}

pub fn run(a: ConvertArgs) -> anyhow::Result<()> {
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let target = match a.to.as_str() {
        "l3" => Target::L3,
        "raw" => Target::Raw,
        "png" => Target::Png,
        "jpeg" | "jpg" => Target::Jpeg(a.quality),
        "pcr" => return to_pcr(&a, threads),
        t => bail!("--to {t:?}: expected l3, raw, pcr, png or jpeg"),
    };
    let total = loader::image_files(&a.input)
        .with_context(|| format!("reading {}", a.input.display()))?
        .len();
    let bar = progress_bar(total as u64, &format!("-> {}", a.to));
    let t0 = std::time::Instant::now();
    let s = convert_folder(&a.input, &a.output, target, threads, &|done, _| {
        bar.set_position(done as u64)
    })
    .with_context(|| format!("converting {} to {}", a.input.display(), a.output.display()))?;
    bar.finish_and_clear();
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

/// PCRs are built from JPEGs: JPEG inputs are transcoded losslessly; any other input is first encoded as
/// JPEG at `--quality` into `OUT_DIR/.jpeg-src/` (kept, so re-runs skip it).
fn to_pcr(a: &ConvertArgs, threads: usize) -> anyhow::Result<()> {
    let files =
        loader::image_files(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    let all_jpeg = files.iter().all(|(_, f)| *f == loader::Format::Jpeg);
    let jpeg_dir = if all_jpeg {
        a.input.clone()
    } else {
        let dir = a.output.join(".jpeg-src");
        let bar = progress_bar(files.len() as u64, "-> jpeg");
        convert_folder(&a.input, &dir, Target::Jpeg(a.quality), threads, &|d, _| {
            bar.set_position(d as u64)
        })
        .with_context(|| {
            format!(
                "encoding JPEG copies of {} in {}",
                a.input.display(),
                dir.display()
            )
        })?;
        bar.finish_and_clear();
        println!(
            "non-JPEG inputs encoded as JPEG (quality {}) in {}",
            a.quality,
            dir.display()
        );
        dir
    };
    let t0 = std::time::Instant::now();
    println!(
        "building PCRs from {} JPEG files on {threads} threads ...",
        files.len()
    );
    loader::compare::build_pcr(&jpeg_dir, &a.output, threads)
        .with_context(|| format!("building PCRs in {}", a.output.display()))?;
    let ds =
        pcr::Dataset::open(&a.output).with_context(|| format!("opening {}", a.output.display()))?;
    println!(
        "PCR dataset {}: {} records, {} images, {} scan groups, {} bytes ({:.1} s)",
        a.output.display(),
        ds.records(),
        ds.images(),
        ds.groups(),
        ds.total_bytes(),
        t0.elapsed().as_secs_f64()
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
