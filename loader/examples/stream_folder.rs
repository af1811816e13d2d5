//! Streams a folder of images (PNG, JPEG, PPM, L3; labels from sub-folder names) in 32-image batches of
//! 224×224 random crops, and prints what the loader measured.
//!
//! `cargo run --release -p loader --example stream_folder -- ../shared/corpus`

use loader::{Crop, DType, ImageFolder, Layout, Loader, LoaderOptions, Normalize, SampleSpec};
use std::sync::Arc;

fn main() -> Result<(), loader::Error> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "../shared/corpus".into());
    let dataset = Arc::new(ImageFolder::open(&dir)?);
    let options = LoaderOptions {
        batch_size: 32,
        epochs: Some(2),
        sample: SampleSpec {
            height: 224,
            width: 224,
            crop: Crop::Random,
            hflip: true,
            layout: Layout::Nchw,
            dtype: DType::F32,
            normalize: Some(Normalize::IMAGENET),
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    };
    let mut loader = Loader::new(dataset, options)?;
    while let Some(batch) = loader.next() {
        let batch = batch?;
        println!(
            "epoch {} batch {}: shape {:?}, labels {:?}, waited {:.1} ms",
            batch.epoch,
            batch.index,
            batch.shape(),
            batch.labels,
            batch.wait.as_secs_f64() * 1e3
        );
        // A checkpoint would store this line; `Loader::resume` continues exactly there.
        println!("  resume state: {}", loader.state());
    }
    let s = loader.stats();
    println!(
        "{:.1} images/s, {:.1} MB/s read, decode threads {:.0}% busy, consumer waited {:.2} s",
        s.images_per_sec(),
        s.mb_per_sec(),
        s.decode_utilisation() * 100.0,
        s.consumer_wait.as_secs_f64()
    );
    Ok(())
}
