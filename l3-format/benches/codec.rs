//! Criterion benches: L3 encode and decode (HWC, CHW, single patch) on a real corpus photo, and the
//! single-threaded whole-image decode of version 2 (ANS and BP, N = 128) beside the `png` crate's decode of
//! the same pixels, so that their ratio comes from one run.
//!
//! Uses `$L3_CORPUS` or `../shared/corpus` (Storm.jpg, 1920×1280 RGB); falls back to a synthetic smooth image
//! when the corpus is absent. `cargo xtask bench l3` has the full comparison against PNG and QOI.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use l3_format::{
    EncodeOptions, Format, L3File, Profile, decode_patch, default_patch_size, encode, encode_with,
};
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

    let mut g = c.benchmark_group(format!("v2/{name}"));
    g.sample_size(20);
    g.throughput(Throughput::Bytes(raw));
    let mut out = vec![0u8; px.len()];
    let png = png_encode(&px, w, h);
    g.bench_function("png_crate_decode", |b| {
        b.iter(|| png_decode(black_box(&png), black_box(&mut out)))
    });
    for profile in [Profile::Ans, Profile::Bp] {
        let opts = EncodeOptions {
            format: Format::V2(profile),
            patch_size: Some(128),
            ..EncodeOptions::default()
        };
        let file = encode_with(&px, w, h, 3, &opts).expect("encode");
        g.bench_function(format!("decode_hwc/{profile}/N=128"), |b| {
            b.iter(|| {
                L3File::parse(black_box(&file))
                    .and_then(|f| f.decode_hwc(black_box(&mut out)))
                    .expect("decode")
            })
        });
        assert!(out == px, "{profile} decodes back to the pixels");
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

/// The `png` crate's encoding of RGB pixels (default settings, as `cargo xtask bench l3` makes).
fn png_encode(px: &[u8], w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w, h);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    let mut wr = e.write_header().expect("png header");
    wr.write_image_data(px).expect("png data");
    wr.finish().expect("png end");
    out
}

fn png_decode(bytes: &[u8], out: &mut [u8]) {
    let mut d = png::Decoder::new(std::io::Cursor::new(bytes));
    d.set_transformations(png::Transformations::EXPAND);
    let mut r = d.read_info().expect("png header");
    r.next_frame(out).expect("png decode");
}

criterion_group!(codec, benches);
criterion_main!(codec);
