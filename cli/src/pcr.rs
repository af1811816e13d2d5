//! `l3 pcr build|read|info`: a thin shell over the `pcr` crate.
//!
//! - `build OUT_DIR IN... [--labels FILE.csv] [--per-record N]`: IN are JPEG files or directories (searched
//!   recursively for `.jpg`/`.jpeg`, sorted); conversion runs on every core with a progress bar.
//! - `read DIR --group K --out DIR2`: decodes every image at scan group K to `DIR2/<stem>.png` (`a/x.jpg`
//!   found under an input folder becomes `DIR2/a/x.png`)
//!   (EXIF orientation applied unless `--no-orient`; libjpeg-turbo unless `--decoder zune`).
//! - `info DIR`: records, images, and bytes per scan group (own bytes, prefix bytes, fraction).
use anyhow::{Context, bail};
use image::ImageEncoder;
use pcr::{BuildOptions, Dataset, Decoder, Input, Labels};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

#[derive(clap::Subcommand)]
pub enum PcrCommand {
    /// Convert JPEG files (or directories of them) into a PCR dataset directory.
    Build(BuildArgs),
    /// Decode every image of a dataset at scan group K into DIR2/<stem>.png.
    Read(ReadArgs),
    /// Print a dataset's records, images and bytes per scan group.
    Info(InfoArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// Output dataset directory (created; a dataset already there is replaced).
    pub out_dir: PathBuf,
    /// JPEG files, or directories searched recursively for .jpg/.jpeg files.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// CSV of labels: header `file,label[,boxes][,key...]` (or rows `file,label`); every input needs a row.
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// Images per record.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub per_record: u32,
    /// Accept JPEGs with corrupt data (truncated, bad Huffman codes) as libjpeg decodes them, with a warning
    /// each; without it they are an error naming the file.
    #[arg(long)]
    pub allow_corrupt: bool,
    /// Worker threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(clap::Args)]
pub struct ReadArgs {
    /// Dataset directory.
    pub dir: PathBuf,
    /// Scan group to read (1 = lowest fidelity; the dataset's group count = full fidelity).
    #[arg(long)]
    pub group: usize,
    /// Output directory for the PNG files.
    #[arg(long)]
    pub out: PathBuf,
    /// JPEG decoder: libjpeg (libjpeg-turbo, smooths missing AC data) or zune (zune-jpeg).
    #[arg(long, default_value = "libjpeg")]
    pub decoder: Decoder,
    /// Write pixels as stored, ignoring the EXIF orientation kept in the metadata.
    #[arg(long)]
    pub no_orient: bool,
}

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Dataset directory.
    pub dir: PathBuf,
}

pub fn run(c: PcrCommand) -> anyhow::Result<()> {
    match c {
        PcrCommand::Build(a) => build(a),
        PcrCommand::Read(a) => read(a),
        PcrCommand::Info(a) => info(a),
    }
}

fn build(a: BuildArgs) -> anyhow::Result<()> {
    let found = pcr::find_inputs(&a.inputs)?;
    let inputs: Vec<Input> = match &a.labels {
        Some(csv) => Labels::from_csv(csv)?.apply(found)?,
        None => found,
    };
    let bar = indicatif::ProgressBar::new(inputs.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} images ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let options = BuildOptions {
        images_per_record: a.per_record as usize,
        allow_corrupt: a.allow_corrupt,
        threads: a.threads.unwrap_or(0),
    };
    let started = std::time::Instant::now();
    let summary = pcr::build(&a.out_dir, &inputs, &options, &|_| bar.inc(1))
        .with_context(|| format!("building {}", a.out_dir.display()))?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    println!("dataset: {}", a.out_dir.display());
    println!("records: {}", summary.records);
    println!("images: {}", summary.images);
    println!("input bytes: {}", summary.input_bytes);
    println!(
        "record bytes: {} ({:.3} of the input)",
        summary.record_bytes,
        summary.record_bytes as f64 / summary.input_bytes.max(1) as f64
    );
    println!(
        "time: {secs:.2} s ({:.1} images/s)",
        summary.images as f64 / secs.max(1e-9)
    );
    for (path, w) in &summary.warnings {
        eprintln!("l3: warning: {}: {w}", path.display());
    }
    Ok(())
}

fn read(a: ReadArgs) -> anyhow::Result<()> {
    let ds = Dataset::open(&a.dir).with_context(|| format!("opening {}", a.dir.display()))?;
    let bytes = ds.prefix_bytes(a.group)?;
    // Output names are image names without their extension (`a/x.jpg` -> `a/x.png`): refuse before
    // writing anything if two would collide.
    let mut stems = HashSet::new();
    for e in ds.index().records.iter().flat_map(|r| &r.images) {
        let stem = Path::new(&e.name)
            .with_extension("")
            .to_string_lossy()
            .into_owned();
        if !stems.insert(stem.clone()) {
            bail!(
                "{}: two images would both be written as {stem}.png",
                a.dir.display()
            );
        }
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let bar = indicatif::ProgressBar::new(ds.images() as u64);
    let started = std::time::Instant::now();
    for r in 0..ds.records() {
        let rec = ds
            .read_record(r, a.group)
            .with_context(|| format!("reading {}", a.dir.display()))?;
        let images = rec.decode_all(a.decoder)?;
        stdx::parallel::for_each(images.into_iter().zip(rec.items()), 0, |(img, item)| {
            let img = if a.no_orient {
                img
            } else {
                img.oriented(item.orientation)
            };
            write_png(&a.out.join(format!("{}.png", item.stem())), &img)?;
            bar.inc(1);
            anyhow::Ok(())
        })?;
    }
    bar.finish_and_clear();
    println!(
        "wrote {} images to {} (group {} of {}, {bytes} of {} bytes read, {:.3}; {} in {:.2} s)",
        ds.images(),
        a.out.display(),
        a.group,
        ds.groups(),
        ds.total_bytes(),
        bytes as f64 / ds.total_bytes().max(1) as f64,
        a.decoder.name(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// PNG through a temporary name and a rename, so a failure leaves no partial file.
fn write_png(path: &Path, img: &pcr::Image) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // The durable-write helper: a hidden temporary in the same folder, fsync, rename; dropped on failure.
    let result = (|| -> anyhow::Result<()> {
        let mut out = stdx::fs::AtomicFile::create(path)?;
        let mut buffered = std::io::BufWriter::new(&mut out);
        let enc = image::codecs::png::PngEncoder::new_with_quality(
            &mut buffered,
            image::codecs::png::CompressionType::Fast,
            image::codecs::png::FilterType::Adaptive,
        );
        enc.write_image(
            &img.pixels,
            img.width,
            img.height,
            image::ExtendedColorType::Rgb8,
        )?;
        std::io::Write::flush(&mut buffered)?;
        drop(buffered);
        out.commit()?;
        Ok(())
    })();
    result.with_context(|| format!("writing {}", path.display()))
}

fn info(a: InfoArgs) -> anyhow::Result<()> {
    let ds = Dataset::open(&a.dir).with_context(|| format!("opening {}", a.dir.display()))?;
    let total = ds.total_bytes();
    // Where group 1 starts in each record: after the preamble, metadata and every image's JPEG header.
    let head: u64 = ds
        .index()
        .records
        .iter()
        .map(|r| {
            r.images
                .iter()
                .map(|i| i.header.offset + u64::from(i.header.len))
                .max()
                .unwrap_or(0)
        })
        .sum();
    println!("dataset: {}", a.dir.display());
    println!("records: {}", ds.records());
    println!("images: {}", ds.images());
    println!("groups: {}", ds.groups());
    println!("bytes: {total}");
    println!("metadata and JPEG headers: {head} bytes");
    println!("group\tbytes\tprefix_bytes\tfraction");
    let mut prev = head;
    for k in 1..=ds.groups() {
        let prefix = ds.prefix_bytes(k)?;
        println!(
            "{k}\t{}\t{prefix}\t{:.4}",
            prefix - prev,
            prefix as f64 / total.max(1) as f64
        );
        prev = prefix;
    }
    Ok(())
}
