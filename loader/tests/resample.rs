//! The resampling recipes through the whole loader: L3 region reads (the window plus the filter's
//! margin) give the same samples as whole-image decodes and read fewer bytes; every item comes once per
//! epoch with its geometry; a resume mid-epoch equals the uninterrupted run; a resume with another
//! recipe is refused by name.

use loader::{
    Crop, DecodeScope, ImageFolder, Interpolation, Loader, LoaderOptions, Recipe, SampleSpec,
};
use std::sync::Arc;

fn image(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let mut s = seed | 1;
    (0..w * h * 3)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((i % (w * 3)) / 5 + i / (w * 3) / 2) as u8 ^ (s as u8 & 15)
        })
        .collect()
}

fn folder() -> (tempfile::TempDir, Arc<ImageFolder>) {
    let tmp = tempfile::tempdir().unwrap();
    for (i, &(w, h)) in [(1031u32, 517u32), (7, 3), (1, 1), (640, 480), (300, 900)]
        .iter()
        .enumerate()
    {
        let opts = l3_format::EncodeOptions {
            patch_size: Some(64),
            threads: 1,
            ..Default::default()
        };
        let bytes = l3_format::encode_with(&image(w, h, i as u32 + 3), w, h, 3, &opts).unwrap();
        std::fs::write(tmp.path().join(format!("img{i}.l3")), bytes).unwrap();
    }
    let ds = Arc::new(ImageFolder::open(tmp.path()).unwrap());
    (tmp, ds)
}

fn options(recipe: Recipe, interpolation: Interpolation, decode: DecodeScope) -> LoaderOptions {
    LoaderOptions {
        batch_size: 2,
        decode,
        decode_threads: 2,
        seed: 9,
        epochs: Some(2),
        sample: SampleSpec {
            height: 96,
            width: 128,
            crop: Crop::Random,
            hflip: true,
            recipe,
            interpolation,
            fill: 17,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

const RECIPES: [Recipe; 3] = [
    Recipe::ResizedCrop {
        scale: [0.08, 1.0],
        ratio: vocab::DEFAULT_RATIO,
    },
    Recipe::Jitter { range: [0.5, 2.0] },
    Recipe::Resize { shorter: 100 },
];

#[test]
fn region_reads_equal_whole_decodes_and_read_less() {
    let (_tmp, ds) = folder();
    for recipe in RECIPES {
        for interpolation in [Interpolation::Bilinear, Interpolation::Nearest] {
            let run = |decode| {
                let mut l =
                    Loader::new(ds.clone(), options(recipe, interpolation, decode)).unwrap();
                let b: Vec<_> = l.by_ref().map(|b| b.unwrap()).collect();
                (b, l.stats().bytes_read)
            };
            let (region, region_bytes) = run(DecodeScope::Region);
            let (whole, whole_bytes) = run(DecodeScope::Whole);
            assert_eq!(region.len(), whole.len());
            for (a, b) in region.iter().zip(&whole) {
                assert_eq!(a.ids, b.ids);
                assert_eq!(a.geometry, b.geometry);
                assert!(
                    a.pixels == b.pixels,
                    "{recipe:?} {interpolation}: epoch {} batch {}",
                    a.epoch,
                    a.index
                );
            }
            assert!(
                region_bytes < whole_bytes,
                "{recipe:?}: region reads {region_bytes} bytes, whole {whole_bytes}"
            );
            // Every item once per epoch, each with a geometry whose window lies in its image.
            for epoch in 0..2 {
                let mut ids: Vec<usize> = region
                    .iter()
                    .filter(|b| b.epoch == epoch)
                    .flat_map(|b| b.ids.clone())
                    .collect();
                ids.sort();
                assert_eq!(ids, (0..5).collect::<Vec<_>>());
            }
            for b in &region {
                assert_eq!(b.windows().len(), b.len());
                for ((h, w), r) in b.sizes().iter().zip(b.windows()) {
                    assert!((1..=96).contains(h) && (1..=128).contains(w), "{r}");
                }
            }
        }
    }
}

#[test]
fn a_resume_mid_epoch_equals_the_uninterrupted_run_and_refuses_another_recipe() {
    let (_tmp, ds) = folder();
    let o = options(RECIPES[0], Interpolation::Bilinear, DecodeScope::Region);
    let full: Vec<_> = Loader::new(ds.clone(), o.clone())
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let mut first = Loader::new(ds.clone(), o.clone()).unwrap();
    first.next().unwrap().unwrap();
    first.next().unwrap().unwrap();
    let state = first.state();
    drop(first);
    let rest: Vec<_> = Loader::resume(ds.clone(), o.clone(), state.clone())
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(rest.len(), full.len() - 2);
    for (a, b) in rest.iter().zip(&full[2..]) {
        assert_eq!((a.epoch, a.index, &a.ids), (b.epoch, b.index, &b.ids));
        assert!(a.pixels == b.pixels && a.geometry == b.geometry);
    }
    let mut other = o.clone();
    other.sample.recipe = RECIPES[1];
    let e = Loader::resume(ds.clone(), other, state.clone())
        .err()
        .expect("another recipe is refused")
        .to_string();
    assert!(e.contains("jitter"), "{e}");
    let mut other = o;
    other.sample.interpolation = Interpolation::Nearest;
    let e = Loader::resume(ds, other, state)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("interpolation"), "{e}");
}
