//! Test images shared by the GPU tests (tests/gpu.rs) and the CPU simulation of the kernel
//! (src/sim_tests.rs, which includes this file by path): the same batches are checked on both.
#![allow(dead_code)]

use l3_cuda::{DType, Layout};

/// Deterministic xorshift, so failures reproduce.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Content {
    Random,
    Constant(u8),
    Smooth,
}

pub fn pixels(w: u32, h: u32, c: u8, content: Content, rng: &mut Rng) -> Vec<u8> {
    let n = w as usize * h as usize * c as usize;
    match content {
        Content::Random => (0..n).map(|_| rng.next() as u8).collect(),
        Content::Constant(v) => vec![v; n],
        Content::Smooth => (0..n)
            .map(|i| {
                let p = i / c as usize;
                let (x, y) = ((p % w as usize) as u64, (p / w as usize) as u64);
                ((x * 3 + y * 2 + (i % c as usize) as u64 * 40 + rng.below(5)) % 256) as u8
            })
            .collect(),
    }
}

/// An encoded test image and a label for failure messages.
pub struct TestImage {
    pub file: Vec<u8>,
    pub label: String,
}

pub fn image(w: u32, h: u32, c: u8, n: u8, content: Content, rng: &mut Rng) -> TestImage {
    let px = pixels(w, h, c, content, rng);
    let file = l3_format::encode(&px, w, h, c, n).expect("encode");
    TestImage {
        file,
        label: format!("{w}x{h}x{c} N={n} {content:?}"),
    }
}

/// The CPU decoder's bytes for `file` in `layout`.
pub fn cpu_decode(file: &[u8], layout: Layout) -> Vec<u8> {
    let f = l3_format::L3File::parse(file).unwrap();
    let mut out = vec![0u8; f.decoded_len()];
    match layout {
        Layout::Nhwc => f.decode_hwc(&mut out).unwrap(),
        Layout::Nchw => f.decode_chw(&mut out).unwrap(),
    }
    out
}

/// Every patch size 1..=255 on small images (partial and 1-pixel-wide edge patches), all channel counts,
/// random, constant and smooth content: four mixed batches grouped by block size.
pub fn every_patch_size_batches() -> Vec<Vec<TestImage>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let groups: [(u8, u8); 4] = [(1, 32), (33, 64), (65, 128), (129, 255)];
    groups
        .iter()
        .map(|&(lo, hi)| {
            (lo..=hi)
                .map(|n| {
                    let c = [1u8, 3, 4][n as usize % 3];
                    // Width N+1 leaves a 1-pixel-wide edge patch; the others vary the partial sizes.
                    let w = match n % 3 {
                        0 => n as u32 + 1,
                        1 => n as u32 * 2 - 1,
                        _ => n as u32 / 2 + 1,
                    };
                    let h = 1 + (n as u32 * 7) % 13 + if n < 8 { n as u32 * 2 } else { 0 };
                    let content = match n % 4 {
                        0 => Content::Constant(n),
                        1 => Content::Random,
                        _ => Content::Smooth,
                    };
                    image(w, h, c, n, content, &mut rng)
                })
                .collect()
        })
        .collect()
}

/// 1×1 images, single rows and columns, and larger images of each channel count, in one batch.
pub fn tiny_mixed_batch() -> Vec<TestImage> {
    let mut rng = Rng(42);
    let mut imgs = Vec::new();
    for c in [1u8, 3, 4] {
        imgs.push(image(1, 1, c, 1, Content::Random, &mut rng));
        imgs.push(image(1, 1, c, 32, Content::Constant(200), &mut rng));
        imgs.push(image(1, 37, c, 8, Content::Random, &mut rng));
        imgs.push(image(41, 1, c, 16, Content::Smooth, &mut rng));
        imgs.push(image(97, 61, c, 32, Content::Smooth, &mut rng));
        imgs.push(image(64, 64, c, 64, Content::Random, &mut rng));
        imgs.push(image(33, 65, c, 32, Content::Constant(0), &mut rng));
    }
    imgs
}

/// A fixed-size batch (the descriptor fast path).
pub fn uniform_batch() -> Vec<TestImage> {
    let mut rng = Rng(7);
    (0..6)
        .map(|i| {
            let content = if i % 2 == 0 {
                Content::Random
            } else {
                Content::Smooth
            };
            image(150, 90, 3, 64, content, &mut rng)
        })
        .collect()
}

/// Small batch for the float layouts.
pub fn float_batch() -> Vec<TestImage> {
    let mut rng = Rng(99);
    vec![
        image(70, 45, 3, 32, Content::Random, &mut rng),
        image(33, 20, 1, 16, Content::Smooth, &mut rng),
        image(20, 33, 4, 8, Content::Random, &mut rng),
    ]
}

/// Checks a decoded batch (raw output bytes, little-endian elements) against the CPU decoder, image by
/// image; floats must equal `Normalize::apply` (an fma) exactly, f16 rounded to nearest even like `half`.
pub fn check_output(
    out: &[u8],
    slots: &[l3_cuda::ImageSlot],
    imgs: &[TestImage],
    opts: &l3_cuda::DecodeOptions,
    tag: &str,
) {
    let (layout, dtype) = (opts.layout, opts.dtype);
    let norm = opts.normalize.unwrap_or(l3_cuda::Normalize::UNIT);
    let eb = dtype.size();
    for (slot, img) in slots.iter().zip(imgs) {
        let got = &out[slot.offset * eb..(slot.offset + slot.len()) * eb];
        let want = cpu_decode(&img.file, layout);
        match dtype {
            DType::U8 => {
                if got != want.as_slice() {
                    let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
                    panic!(
                        "{tag}: {} differs at byte {i}: {} vs CPU {}",
                        img.label, got[i], want[i]
                    );
                }
            }
            DType::F32 | DType::F16 => {
                assert_eq!(layout, Layout::Nchw, "{tag}: float output is planar");
                let plane = slot.width as usize * slot.height as usize;
                for (i, &v) in want.iter().enumerate() {
                    let f = norm.apply(v, i / plane);
                    if dtype == DType::F32 {
                        let g = f32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
                        assert_eq!(
                            g.to_bits(),
                            f.to_bits(),
                            "{tag}: {} f32 element {i}",
                            img.label
                        );
                    } else {
                        let g = u16::from_le_bytes(got[2 * i..2 * i + 2].try_into().unwrap());
                        let h = half::f16::from_f32(f).to_bits();
                        assert_eq!(g, h, "{tag}: {} f16 element {i} ({f})", img.label);
                    }
                }
            }
        }
    }
}

/// A `w`×`h` crop at (x0, y0) of a corpus PNG as interleaved pixels, or None if the corpus is missing.
pub fn corpus_png(name: &str) -> Option<(Vec<u8>, u32, u32, u8)> {
    let bytes = corpus_dirs()
        .iter()
        .find_map(|d| std::fs::read(d.join(name)).ok())?;
    let dec = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0u8; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    buf.truncate(info.buffer_size());
    Some((
        buf,
        info.width,
        info.height,
        info.color_type.samples() as u8,
    ))
}

pub fn crop(px: &[u8], w: u32, c: u8, x0: u32, y0: u32, cw: u32, ch: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity((cw * ch) as usize * c as usize);
    for y in y0..y0 + ch {
        let row = (y * w + x0) as usize * c as usize;
        out.extend_from_slice(&px[row..row + cw as usize * c as usize]);
    }
    out
}

/// Where the corpus may be: `$L3_CORPUS` (set by gpu-check.sh on a machine where the binaries were
/// carried), beside the source tree this was built from, or relative to the working directory.
pub fn corpus_dirs() -> Vec<std::path::PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(d) = std::env::var("L3_CORPUS") {
        dirs.push(d.into());
    }
    dirs.push(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"));
    dirs.push("../shared/corpus".into());
    dirs.push("shared/corpus".into());
    dirs
}
