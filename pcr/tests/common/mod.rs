//! Helpers shared by the integration tests: the real corpus and small synthetic JPEGs.
#![allow(dead_code)]

use jpeg_encoder::{ColorType, Encoder};
use std::path::{Path, PathBuf};

/// `../shared/corpus` beside the workspace (or `$L3_CORPUS`).
pub fn corpus_dir() -> PathBuf {
    std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"))
}

/// Every `.jpg` of the corpus, sorted by name.
pub fn corpus_jpegs() -> Vec<PathBuf> {
    let dir = corpus_dir();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("jpg")))
        .collect();
    v.sort();
    assert!(
        v.len() >= 10,
        "expected the corpus JPEGs in {}",
        dir.display()
    );
    v
}

/// An APP1 Exif payload holding only an Orientation tag.
pub fn exif_orientation(o: u16) -> Vec<u8> {
    let mut v = b"Exif\0\0II*\0".to_vec();
    v.extend(8u32.to_le_bytes());
    v.extend(1u16.to_le_bytes());
    v.extend(0x0112u16.to_le_bytes());
    v.extend(3u16.to_le_bytes());
    v.extend(1u32.to_le_bytes());
    v.extend(o.to_le_bytes());
    v.extend([0, 0]);
    v.extend(0u32.to_le_bytes());
    v
}

/// A small baseline JPEG with a smooth pattern plus texture, so every scan carries data.
pub fn small_jpeg(w: u16, h: u16, color: ColorType, orientation: Option<u16>) -> Vec<u8> {
    let channels = match color {
        ColorType::Luma => 1,
        ColorType::Cmyk => 4,
        _ => 3,
    };
    let mut px = Vec::with_capacity(w as usize * h as usize * channels);
    for y in 0..h as u32 {
        for x in 0..w as u32 {
            for c in 0..channels as u32 {
                let v = (x * 3 + y * 5 + c * 40 + ((x * y + c) % 23) * 4) % 256;
                px.push(v as u8);
            }
        }
    }
    let mut out = Vec::new();
    let mut enc = Encoder::new(&mut out, 85);
    if let Some(o) = orientation {
        enc.add_app_segment(1, &exif_orientation(o)).unwrap();
    }
    enc.encode(&px, w, h, color).unwrap();
    out
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}
