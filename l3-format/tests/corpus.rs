//! Every image of the real corpus (`$L3_CORPUS` or `../shared/corpus`) survives an L3 round trip, at the
//! default patch size, through every decode path.

use l3_format::{L3File, decode_patch, default_patch_size, encode_parallel};
use std::path::PathBuf;

fn corpus() -> Vec<PathBuf> {
    let dir = std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e} (set L3_CORPUS)", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "png" || e == "jpg"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no images in {}", dir.display());
    files
}

#[test]
fn every_corpus_image_round_trips() {
    for path in corpus() {
        let img = image::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (w, h) = (img.width(), img.height());
        let (px, c) = match img {
            image::DynamicImage::ImageRgba8(b) => (b.into_raw(), 4u8),
            image::DynamicImage::ImageLuma8(b) => (b.into_raw(), 1),
            other => (other.to_rgb8().into_raw(), 3),
        };
        let n = default_patch_size(w, h);
        let file = encode_parallel(&px, w, h, c, n, 0).unwrap();
        let f = L3File::parse(&file).unwrap();
        assert_eq!(
            (f.width(), f.height(), f.channels(), f.patch_size()),
            (w, h, c, n)
        );
        let mut out = vec![0u8; px.len()];
        f.decode_hwc_parallel(&mut out, 0).unwrap();
        assert!(out == px, "{}: HWC round trip differs", path.display());
        f.decode_chw_parallel(&mut out, 0).unwrap();
        let plane = (w * h) as usize;
        assert!(
            (0..plane)
                .step_by(997)
                .all(|i| (0..c as usize).all(|ch| out[ch * plane + i] == px[i * c as usize + ch])),
            "{}: CHW round trip differs",
            path.display()
        );
        // The last (partial) patch of the last channel through the single-patch entry.
        let (ch, p) = (c as usize - 1, f.patches_per_channel() - 1);
        let r = f.patch_rect(p);
        let mut one = vec![0u8; (r.w * r.h) as usize];
        decode_patch(
            f.patch_bytes(ch, p),
            r.w as usize,
            r.h as usize,
            &mut one,
            r.w as usize,
        )
        .unwrap();
        for y in 0..r.h as usize {
            for x in 0..r.w as usize {
                let i = ((r.y as usize + y) * w as usize + r.x as usize + x) * c as usize + ch;
                assert_eq!(one[y * r.w as usize + x], px[i]);
            }
        }
    }
}
