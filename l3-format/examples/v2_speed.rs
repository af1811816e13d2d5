//! Single-thread decode speed of L3 v2 (ANS and BP, N = 128), v1 and the `png` crate over the corpus, timed
//! by the thread's CPU time (best of `L3_REPS` runs per image, default 5), a quicker loop than
//! `cargo xtask bench l3`. Encoded files are cached in `$L3_SPEED_CACHE` (default `target/v2_speed`).
//!
//! `cargo run --release -p l3-format --example v2_speed [codec…] [-- image-substring…]`, codecs among
//! `ans bp v1 png` (default all).

use l3_format::{EncodeOptions, Format, L3File, Profile, encode_with};
use std::path::PathBuf;

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}
unsafe extern "C" {
    fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
}

fn thread_cpu() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: CLOCK_THREAD_CPUTIME_ID (3 on Linux) into a valid timespec.
    unsafe { clock_gettime(3, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut b = f64::MAX;
    for _ in 0..reps {
        let t = thread_cpu();
        f();
        b = b.min(thread_cpu() - t);
    }
    b
}

fn png_decode(bytes: &[u8], out: &mut [u8]) {
    let mut d = png::Decoder::new(std::io::Cursor::new(bytes));
    d.set_transformations(png::Transformations::EXPAND);
    let mut r = d.read_info().expect("png header");
    r.next_frame(out).expect("png decode");
}

fn png_encode(px: &[u8], w: u32, h: u32, c: u8) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w, h);
    e.set_color(match c {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    });
    e.set_depth(png::BitDepth::Eight);
    let mut wr = e.write_header().expect("png");
    wr.write_image_data(px).expect("png");
    wr.finish().expect("png");
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut codecs: Vec<&str> = args[..split].iter().map(String::as_str).collect();
    if codecs.is_empty() {
        codecs = vec!["png", "v1", "bp", "ans"];
    }
    let filters = args.get(split + 1..).unwrap_or(&[]);
    let reps: usize = std::env::var("L3_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    // For experiments that decode wrong pixels on purpose (timing a stage alone).
    let nocheck = std::env::var_os("L3_NOCHECK").is_some();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let corpus = std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../shared/corpus"));
    let cache = std::env::var_os("L3_SPEED_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/v2_speed"));
    std::fs::create_dir_all(&cache).expect("cache dir");
    let mut names: Vec<_> = std::fs::read_dir(&corpus)
        .expect("corpus")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("png") || e.eq_ignore_ascii_case("jpg"))
        })
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str()))
        })
        .collect();
    names.sort();
    let mut tot = vec![(0f64, 0f64); codecs.len()];
    for path in &names {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let raw_path = cache.join(format!("{name}.raw"));
        let (px, w, h, c) = match std::fs::read(&raw_path) {
            Ok(b) => {
                let w = u32::from_le_bytes(b[0..4].try_into().unwrap());
                let h = u32::from_le_bytes(b[4..8].try_into().unwrap());
                (b[9..].to_vec(), w, h, b[8])
            }
            Err(_) => {
                use image::DynamicImage as D;
                let img = image::open(path).expect("image");
                let (w, h) = (img.width(), img.height());
                let (px, c) = match img {
                    D::ImageLuma8(b) => (b.into_raw(), 1),
                    D::ImageRgb8(b) => (b.into_raw(), 3),
                    D::ImageRgba8(b) => (b.into_raw(), 4),
                    o => (o.to_rgb8().into_raw(), 3),
                };
                let mut b = Vec::new();
                b.extend_from_slice(&w.to_le_bytes());
                b.extend_from_slice(&h.to_le_bytes());
                b.push(c);
                b.extend_from_slice(&px);
                std::fs::write(&raw_path, b).expect("cache");
                (px, w, h, c)
            }
        };
        let mut line = format!("{name:<22}");
        for (i, codec) in codecs.iter().enumerate() {
            let file_path = cache.join(format!("{name}.{codec}"));
            let bytes = std::fs::read(&file_path).unwrap_or_else(|_| {
                let b = match *codec {
                    "png" if name.ends_with(".png") => std::fs::read(path).expect("png"),
                    "png" => png_encode(&px, w, h, c),
                    _ => {
                        let format = match *codec {
                            "v1" => Format::V1,
                            "bp" => Format::V2(Profile::Bp),
                            _ => Format::V2(Profile::Ans),
                        };
                        let opts = EncodeOptions {
                            format,
                            patch_size: Some(if *codec == "v1" { 64 } else { 128 }),
                            ..EncodeOptions::default()
                        };
                        encode_with(&px, w, h, c, &opts).expect("encode")
                    }
                };
                std::fs::write(&file_path, &b).expect("cache");
                b
            });
            let mut out = vec![0u8; px.len()];
            let run = |out: &mut [u8]| {
                if *codec == "png" {
                    png_decode(&bytes, out)
                } else {
                    let r = L3File::parse(&bytes).expect("parse").decode_hwc(out);
                    if !nocheck {
                        r.expect("decode")
                    }
                }
            };
            run(&mut out);
            assert!(nocheck || out == px, "{codec} {name}: wrong pixels");
            let t = best(reps, || run(std::hint::black_box(&mut out)));
            tot[i].0 += px.len() as f64;
            tot[i].1 += t;
            line += &format!(" {codec}:{:>6.0}", px.len() as f64 / t / 1e6);
        }
        eprintln!("{line}");
    }
    let mut line = format!("{:<22}", "TOTAL MB/s");
    for (i, codec) in codecs.iter().enumerate() {
        line += &format!(" {codec}:{:>6.0}", tot[i].0 / tot[i].1 / 1e6);
    }
    println!("{line}");
}
