//! Helpers shared by the integration tests: scratch folders and a small run-length codec standing in for
//! a compressed image format.
#![allow(dead_code)]

use liquid_sampler::Dims;
use std::path::{Path, PathBuf};

pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("liquid-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Pixels of test image `id`: smooth runs, so run-length coding compresses them.
pub fn pixels(id: u64, w: u32, h: u32) -> Vec<u8> {
    (0..w * h * 3)
        .map(|i| ((i / 37) as u64 * 7 + id * 13) as u8)
        .collect()
}

pub fn rle_encode(p: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.len() {
        let mut run = 1;
        while i + run < p.len() && run < 255 && p[i + run] == p[i] {
            run += 1;
        }
        out.extend_from_slice(&[run as u8, p[i]]);
        i += run;
    }
    out
}

/// "rle" files: width and height (u32 LE) then (count, value) pairs.
pub fn rle_file(id: u64, w: u32, h: u32) -> Vec<u8> {
    let mut v = w.to_le_bytes().to_vec();
    v.extend_from_slice(&h.to_le_bytes());
    v.extend(rle_encode(&pixels(id, w, h)));
    v
}

pub fn rle_decode(bytes: &[u8], out: &mut Vec<u8>) -> Result<Dims, String> {
    if bytes.len() < 8 {
        return Err("short header".into());
    }
    let w = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let h = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
    out.clear();
    for pair in bytes[8..].chunks(2) {
        let [n, v] = pair else {
            return Err("odd length".into());
        };
        out.extend(std::iter::repeat_n(*v, *n as usize));
    }
    if out.len() as u64 != w as u64 * h as u64 * 3 {
        return Err("size does not match header".into());
    }
    Ok(Dims {
        width: w,
        height: h,
        channels: 3,
    })
}
