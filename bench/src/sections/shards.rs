//! `cargo xtask bench shards`: one object per image against tar shards, on the S3 server the tests start
//! (s3-loopback, on loopback), same run: objects stored, requests and bytes per epoch (counted by the
//! server), and images/s — for whole images and for L3 region reads (224×224 crops), a first epoch and
//! a second one (offset tables cached).

use crate::report::{Report, Table, corpus_dir};
use anyhow::Context;
use l3_cli::compare::stream_epochs;
use loader::convert::{ConvertOptions, ShardBuild, Target, convert_folder, to_shards};
use loader::{Crop, DecodeScope, LoaderOptions, OpenOptions, SampleSpec, open_dataset};
use std::path::Path;

/// Tiles cut from each corpus image: the dataset is many small images, as training sets are.
const TILE: u32 = 384;
/// Images per shard (about): shards of a few MB here stand for the 100 MB to 1 GB ones of real sets.
const PER_SHARD: u64 = 32;

fn options(scope: DecodeScope, threads: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size: 8,
        decode_threads: threads,
        io_threads: 4,
        decode: scope,
        seed: 3,
        sample: SampleSpec {
            height: 224,
            width: 224,
            crop: Crop::Random,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

/// The corpus cut into `TILE`-sided tiles (PNG), in class folders by source image, then converted to L3.
fn build(work: &Path, threads: usize) -> anyhow::Result<std::path::PathBuf> {
    let tiles = work.join("tiles");
    for (rel, _) in loader::image_files(&corpus_dir())?.files {
        let img = image::open(corpus_dir().join(&rel))
            .with_context(|| format!("reading {}", rel.display()))?
            .to_rgb8();
        let stem = rel
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let class = if rel.extension().is_some_and(|e| e == "png") {
            "png"
        } else {
            "jpeg"
        };
        std::fs::create_dir_all(tiles.join(class))?;
        for ty in 0..img.height() / TILE {
            for tx in 0..img.width() / TILE {
                let tile =
                    image::imageops::crop_imm(&img, tx * TILE, ty * TILE, TILE, TILE).to_image();
                tile.save(tiles.join(class).join(format!("{stem}-{ty}-{tx}.png")))?;
            }
        }
    }
    let l3 = work.join("s3/data/folder");
    let convert = ConvertOptions {
        threads,
        to_8bit: false,
    };
    convert_folder(&tiles, &l3, Target::L3_DEFAULT, &convert, &|_, _| {})?;
    Ok(l3)
}

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let work = tempfile::Builder::new()
        .prefix("l3-bench-shards-")
        .tempdir()?;
    eprintln!("shards bench: cutting the corpus into {TILE}x{TILE} tiles, L3 ...");
    let folder = build(work.path(), threads)?;
    let files = loader::image_files(&folder)?.files;
    let largest = files
        .iter()
        .map(|(rel, _)| std::fs::metadata(folder.join(rel)).map_or(0, |m| m.len()))
        .max()
        .unwrap_or(0);
    let shard_dir = work.path().join("s3/data/shards");
    let build = ShardBuild {
        shard_size: PER_SHARD * (largest + 2048),
        prefix: "train".into(),
        ..ShardBuild::default()
    };
    let s = to_shards(&folder, &shard_dir, &build)?;
    // As objects PUT through the API have: without it s3s-fs hashes a whole shard on each ranged GET.
    s3_loopback::record_etags(&work.path().join("s3"))?;
    let server = s3_loopback::Server::start(&work.path().join("s3"), "127.0.0.1:0".parse()?)?;
    // SAFETY: set before any loader thread starts.
    unsafe {
        for (k, v) in s3_loopback::client_env(&server.endpoint()) {
            std::env::set_var(k, v);
        }
    }
    let shards = format!("s3://data/shards/train-{{000000..{:06}}}.tar", s.shards - 1);
    let mut table = Table::new(
        &format!(
            "One object per image vs shards on S3 (s3-loopback), {} L3 images of {TILE}×{TILE}, 224×224 \
             random crops, batch 8, {threads} decode threads",
            files.len()
        ),
        &[
            "dataset",
            "objects",
            "decode",
            "epoch",
            "GETs (open)",
            "bytes (open)",
            "GETs / epoch",
            "GETs / image",
            "bytes / epoch",
            "images/s",
        ],
    );
    for scope in [DecodeScope::Whole, DecodeScope::Region] {
        for (name, location, objects) in [
            ("folder", "s3://data/folder".to_string(), files.len()),
            ("shards", shards.clone(), 2 * s.shards),
        ] {
            server.reset();
            let ds = open_dataset(Path::new(&location), &OpenOptions::default())
                .with_context(|| format!("opening {location}"))?;
            let (open_gets, open_bytes) = server.served();
            for epoch in 0..2 {
                server.reset();
                let m = stream_epochs(ds.clone(), options(scope, threads), 1)
                    .with_context(|| format!("streaming {location}"))?;
                let (gets, bytes) = server.served();
                eprintln!(
                    "  {name:<7} {scope:?} epoch {epoch}: {gets} GETs, {bytes} bytes, {:.1} images/s",
                    m.images_per_sec()
                );
                table.row(vec![
                    name.into(),
                    objects.to_string(),
                    format!("{scope:?}").to_lowercase(),
                    (epoch + 1).to_string(),
                    if epoch == 0 {
                        open_gets.to_string()
                    } else {
                        String::new()
                    },
                    if epoch == 0 {
                        open_bytes.to_string()
                    } else {
                        String::new()
                    },
                    gets.to_string(),
                    format!("{:.2}", gets as f64 / m.images.max(1) as f64),
                    bytes.to_string(),
                    format!("{:.1}", m.images_per_sec()),
                ]);
            }
        }
    }
    r.para(&format!(
        "{} shards of about {PER_SHARD} images ({} objects with their indexes) hold what the folder \
         holds in {} objects. GETs are object reads the server counted (listings are not GETs); opening \
         a shard set reads each shard's index once (its bytes: bytes (open)).",
        s.shards,
        2 * s.shards,
        files.len()
    ));
    r.table(&table);
    Ok(())
}
