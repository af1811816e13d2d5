//! Decode/encode an image repeatedly, for profiling (`perf stat`, `perf record`):
//! `cargo run --release -p l3-format --example throughput -- IMAGE [N] [ITERS] [decode|chw|encode]`.
use l3_format::{L3File, encode};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: throughput IMAGE [N] [ITERS] [decode|chw|encode]");
    let n: u8 = args.get(2).map_or(64, |s| s.parse().expect("N"));
    let iters: usize = args.get(3).map_or(20, |s| s.parse().expect("ITERS"));
    let mode = args.get(4).map_or("decode", |s| s.as_str());
    let img = image::open(path).expect("open").to_rgb8();
    let (w, h) = img.dimensions();
    let px = img.into_raw();
    let file = encode(&px, w, h, 3, n).expect("encode");
    let f = L3File::parse(&file).expect("parse");
    let mut out = vec![0u8; f.decoded_len()];
    let t = std::time::Instant::now();
    let c0 = thread_cpu_ns();
    for _ in 0..iters {
        match mode {
            "encode" => drop(std::hint::black_box(
                encode(&px, w, h, 3, n).expect("encode"),
            )),
            "chw" => f.decode_chw(&mut out).expect("decode"),
            _ => f.decode_hwc(&mut out).expect("decode"),
        }
    }
    let s = t.elapsed().as_secs_f64();
    let cpu = (thread_cpu_ns() - c0) as f64 / 1e9;
    eprintln!(
        "{mode} N={n}: thread CPU {cpu:.3} s = {:.0} MB/s (CPU time)",
        (iters * px.len()) as f64 / cpu / 1e6
    );
    eprintln!(
        "{mode} N={n}: {iters} x {} bytes in {s:.3} s wall = {:.0} MB/s wall; ratio {:.4}",
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
