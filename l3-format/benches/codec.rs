//! Criterion benches: L3 encode and decode (HWC, CHW, single patch) on a real corpus photo.
//!
//! Uses `$L3_CORPUS` or `../shared/corpus` (Storm.jpg, 1920×1280 RGB); falls back to a synthetic smooth image
//! when the corpus is absent. `cargo xtask bench l3` has the full comparison against PNG and QOI.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use l3_format::{L3File, decode_patch, default_patch_size, encode};
use std::hint::black_box;
use std::path::PathBuf;

fn sample() -> (String, Vec<u8>, u32, u32) {
    let dir = std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"));
    if let Ok(img) = image::open(dir.join("Storm.jpg")) {
        let img = img.to_rgb8();
        let (w, h) = img.dimensions();
        return ("Storm.jpg".into(), img.into_raw(), w, h);
    }
    let (w, h) = (1920u32, 1280u32);
    let px = (0..w * h * 3)
        .map(|i| ((i % (w * 3)) / 7 + (i / (w * 3)) / 5) as u8)
        .collect();
    ("synthetic".into(), px, w, h)
}

fn benches(c: &mut Criterion) {
    let (name, px, w, h) = sample();
    let raw = px.len() as u64;
    let mut g = c.benchmark_group(format!("l3/{name}"));
    g.sample_size(20);
    g.throughput(Throughput::Bytes(raw));
    for n in [32u8, 64, 128] {
        let file = encode(&px, w, h, 3, n).expect("encode");
        let f = L3File::parse(&file).expect("parse");
        let mut out = vec![0u8; f.decoded_len()];
        g.bench_function(format!("decode_hwc/N={n}"), |b| {
            b.iter(|| f.decode_hwc(black_box(&mut out)).expect("decode"))
        });
        g.bench_function(format!("decode_chw/N={n}"), |b| {
            b.iter(|| f.decode_chw(black_box(&mut out)).expect("decode"))
        });
        g.bench_function(format!("decode_hwc_parallel/N={n}"), |b| {
            b.iter(|| {
                f.decode_hwc_parallel(black_box(&mut out), 0)
                    .expect("decode")
            })
        });
        g.bench_function(format!("encode/N={n}"), |b| {
            b.iter(|| encode(black_box(&px), w, h, 3, n).expect("encode"))
        });
    }
    g.finish();

    let n = default_patch_size(w, h);
    let file = encode(&px, w, h, 3, n).expect("encode");
    let f = L3File::parse(&file).expect("parse");
    let r = f.patch_rect(0);
    let mut out = vec![0u8; (r.w * r.h) as usize];
    let mut g = c.benchmark_group("l3/patch");
    g.throughput(Throughput::Bytes(out.len() as u64));
    g.bench_function(format!("decode_patch/N={n}"), |b| {
        b.iter(|| {
            decode_patch(
                f.patch_bytes(0, 0),
                r.w as usize,
                r.h as usize,
                &mut out,
                r.w as usize,
            )
        })
    });
    g.finish();
}

criterion_group!(codec, benches);
criterion_main!(codec);
