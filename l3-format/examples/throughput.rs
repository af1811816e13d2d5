//! Decode/encode an image repeatedly, for profiling (`perf stat`, `perf record`):
//! `cargo run --release -p l3-format --example throughput -- IMAGE [N] [ITERS] [decode|chw|par|encode] [v1|bp|ans]`.
use l3_format::{EncodeOptions, Format, L3File, Profile, encode_with};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: throughput IMAGE [N] [ITERS] [decode|chw|par|encode] [v1|bp|ans]");
    let n: u8 = args.get(2).map_or(64, |s| s.parse().expect("N"));
    let iters: usize = args.get(3).map_or(20, |s| s.parse().expect("ITERS"));
    let mode = args.get(4).map_or("decode", |s| s.as_str());
    let format = match args.get(5).map_or("v1", |s| s.as_str()) {
        "bp" => Format::V2(Profile::Bp),
        "ans" => Format::V2(Profile::Ans),
        _ => Format::V1,
    };
    let img = image::open(path).expect("open");
    let (w, h) = (img.width(), img.height());
    let (px, c) = match img {
        image::DynamicImage::ImageRgba8(b) => (b.into_raw(), 4u8),
        other => (other.to_rgb8().into_raw(), 3),
    };
    let opts = EncodeOptions {
        format,
        patch_size: Some(n),
        ..EncodeOptions::default()
    };
    let file = encode_with(&px, w, h, c, &opts).expect("encode");
    let f = L3File::parse(&file).expect("parse");
    let mut out = vec![0u8; f.decoded_len()];
    f.decode_hwc(&mut out).expect("decode");
    assert!(out == px, "round trip");
    let mut pngbytes = Vec::new();
    if mode == "png" {
        let mut cur = std::io::Cursor::new(&mut pngbytes);
        image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, px.clone()).expect("rgb"))
            .write_to(&mut cur, image::ImageFormat::Png)
            .expect("png");
    }
    let t = std::time::Instant::now();
    let c0 = thread_cpu_ns();
    for _ in 0..iters {
        match mode {
            "encode" => drop(std::hint::black_box(
                encode_with(&px, w, h, c, &opts).expect("encode"),
            )),
            "chw" => f.decode_chw(&mut out).expect("decode"),
            "par" => f.decode_hwc_parallel(&mut out, 0).expect("decode"),
            "png" => drop(std::hint::black_box(
                image::load_from_memory(&pngbytes).expect("png"),
            )),
            _ => f.decode_hwc(&mut out).expect("decode"),
        }
    }
    let s = t.elapsed().as_secs_f64();
    let cpu = (thread_cpu_ns() - c0) as f64 / 1e9;
    eprintln!(
        "{format} {mode} N={n}: thread CPU {cpu:.3} s = {:.0} MB/s (CPU time)",
        (iters * px.len()) as f64 / cpu / 1e6
    );
    eprintln!(
        "{format} {mode} N={n}: {iters} x {} bytes in {s:.3} s wall = {:.0} MB/s wall; ratio {:.4}",
        px.len(),
        (iters * px.len()) as f64 / s / 1e6,
        file.len() as f64 / px.len() as f64
    );
}

/// CPU time of the calling thread in ns (first field of /proc/thread-self/schedstat; 0 where unavailable),
/// so that figures on a shared machine do not count time the thread spent waiting for a core.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
