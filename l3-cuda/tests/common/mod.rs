//! Test images shared by the GPU tests (tests/gpu.rs) and the CPU simulation of the kernel
//! (src/sim_tests.rs, which includes this file by path): the same batches are checked on both.
#![allow(dead_code)]

use vocab::{DType, Layout};

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

/// An image encoded as L3 version 2 in `profile` with patch size `n` (a multiple of 32), with entry CRCs
/// (the encoder's default).
pub fn image_v2(
    w: u32,
    h: u32,
    c: u8,
    n: u8,
    profile: l3_format::Profile,
    content: Content,
    rng: &mut Rng,
) -> TestImage {
    image_v2_with(w, h, c, n, profile, content, rng, true)
}

/// [`image_v2`] with or without entry CRCs: damage to a file without them reaches the decoders (and the
/// kernel) once its file CRC is made right again.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn image_v2_with(
    w: u32,
    h: u32,
    c: u8,
    n: u8,
    profile: l3_format::Profile,
    content: Content,
    rng: &mut Rng,
    entry_crcs: bool,
) -> TestImage {
    let px = pixels(w, h, c, content, rng);
    let opts = l3_format::EncodeOptions {
        format: l3_format::Format::V2(profile),
        patch_size: Some(n),
        entry_crcs,
        ..l3_format::EncodeOptions::default()
    };
    TestImage {
        file: l3_format::encode_with(&px, w, h, c, &opts).expect("encode v2"),
        label: format!("{w}x{h}x{c} N={n} v2-{profile} {content:?}"),
    }
}

/// Version-2 images of both profiles, every channel count, edge shapes (1×1, a single row or column,
/// partial edge patches) and patch sizes 32 to 224, with a version-1 image between them: one batch.
pub fn v2_mixed_batch() -> Vec<TestImage> {
    use l3_format::Profile::{Ans, Bp};
    let mut rng = Rng(0x5eed_0002);
    let mut v = Vec::new();
    let shapes: [(u32, u32, u8, u8); 8] = [
        (1, 1, 3, 32),
        (70, 1, 1, 32),
        (1, 45, 4, 64),
        (65, 40, 3, 32),
        (100, 37, 4, 64),
        (33, 70, 1, 32),
        (130, 20, 3, 128),
        (230, 9, 3, 224),
    ];
    for (i, &(w, h, c, n)) in shapes.iter().enumerate() {
        for profile in [Bp, Ans] {
            let content = [Content::Smooth, Content::Random, Content::Constant(77)][i % 3];
            v.push(image_v2(w, h, c, n, profile, content, &mut rng));
        }
        if i == 3 {
            v.push(image(31, 17, 3, 8, Content::Smooth, &mut rng));
        }
    }
    v
}

/// A random sample batch of version-2 images (both profiles, patch sizes 32 and 64, gray, RGB and RGBA)
/// with a version-1 image among them, random windows, about half given as fragments.
pub fn random_v2_sample_case(
    seed: u64,
    n: usize,
    layout: Layout,
    dtype: DType,
    normalize: Option<vocab::Normalize>,
) -> SampleCase {
    let mut case = random_sample_case(seed, n, layout, dtype, normalize);
    let mut rng = Rng(seed.rotate_left(17) | 1);
    let (sw, sh) = (case.opts.width, case.opts.height);
    for i in 0..n {
        if i == n / 2 {
            continue; // the version-1 image random_sample_case made
        }
        let c = [1u8, 3, 4][i % 3];
        let (iw, ih) = (1 + rng.below(90) as u32, 1 + rng.below(80) as u32);
        let patch = [32u8, 64][rng.below(2) as usize];
        let profile = [l3_format::Profile::Bp, l3_format::Profile::Ans][rng.below(2) as usize];
        let content = match rng.below(3) {
            0 => Content::Random,
            1 => Content::Smooth,
            _ => Content::Constant(rng.next() as u8),
        };
        case.imgs[i] = image_v2(iw, ih, c, patch, profile, content, &mut rng);
        case.windows[i] = random_window(iw, ih, sw, sh, &mut rng);
    }
    case
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

/// Patches as wide as their lanes' columns (32, 64 and 128 in blocks of their width: the kernel's full
/// modes, whose NCHW rows take one vector store a lane), 1, 3 and 4 channels, heights with partial
/// bottom patches, one batch per patch size. Halfway through each batch an odd-sized image (one patch
/// column a pixel wide) leaves the images after it unaligned for those stores, so they take the stage.
pub fn full_width_batches() -> Vec<Vec<TestImage>> {
    let mut rng = Rng(0xf011_3a7e);
    [32u8, 64, 128]
        .into_iter()
        .map(|n| {
            let n32 = n as u32;
            let shapes = [(2, 9, 1), (1, 5, 3), (3, n32 / 4 + 3, 4), (1, n32 + 5, 3)];
            let mut imgs = Vec::new();
            for round in 0..2u32 {
                for (i, &(k, h, c)) in shapes.iter().enumerate() {
                    let content = [
                        Content::Random,
                        Content::Smooth,
                        Content::Constant(9),
                        Content::Random,
                    ][(i + round as usize) % 4];
                    imgs.push(image(k * n32, h + round, c, n, content, &mut rng));
                }
                if round == 0 {
                    imgs.push(image(n32 + 1, 7, 1, n, Content::Random, &mut rng));
                }
            }
            imgs
        })
        .collect()
}

/// Samples of 256×80 from images of patches as wide as their teams (64, in blocks of 64), each window
/// chosen for how its patches' rows can be stored: whole images and crops whose left edge falls on a
/// patch edge or on a multiple of 8 (whole patch rows, aligned: one vector store a lane in NCHW), crops
/// whose left edge does not (the stage), mirrored and gray windows (the stage), top rows skipped.
pub fn whole_patch_row_samples(
    layout: vocab::Layout,
    dtype: vocab::DType,
    normalize: Option<vocab::Normalize>,
) -> SampleCase {
    use l3_format::Rect;
    use vocab::Window;
    let mut rng = Rng(0x3a3b_0c1d);
    let mut case = SampleCase::new(l3_cuda::SampleOptions {
        layout,
        dtype,
        normalize,
        ..l3_cuda::SampleOptions::new(256, 80)
    });
    let windows = [
        (3, Window::whole(256, 80)),
        (3, Window::new(Rect::new(64, 8, 128, 40), 0, 0, false)),
        (4, Window::new(Rect::new(72, 3, 176, 70), 8, 2, false)),
        (3, Window::new(Rect::new(68, 0, 150, 80), 0, 0, false)),
        (3, Window::new(Rect::new(0, 5, 256, 70), 0, 0, true)),
        (1, Window::whole(256, 80)),
        (3, Window::new(Rect::new(128, 17, 128, 63), 64, 17, false)),
    ];
    for (i, (c, w)) in windows.into_iter().enumerate() {
        let content = [Content::Random, Content::Smooth][i % 2];
        case.imgs.push(image(256, 80, c, 64, content, &mut rng));
        case.windows.push(w);
        case.fragments.push(None);
    }
    case
}

/// Whole-image outputs in both layouts: u8, and f32 and f16 normalised.
pub fn every_layout_and_dtype() -> Vec<l3_cuda::DecodeOptions> {
    let mut all = Vec::new();
    for layout in [vocab::Layout::Nchw, vocab::Layout::Nhwc] {
        for (dtype, normalize) in [
            (vocab::DType::U8, None),
            (vocab::DType::F32, Some(vocab::Normalize::IMAGENET)),
            (vocab::DType::F16, Some(vocab::Normalize::IMAGENET)),
        ] {
            all.push(l3_cuda::DecodeOptions {
                layout,
                dtype,
                normalize,
                ..Default::default()
            });
        }
    }
    all
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
    let norm = opts.normalize.unwrap_or(vocab::Normalize::UNIT);
    let eb = dtype.size();
    for (slot, img) in slots.iter().zip(imgs) {
        let got = &out[slot.offset * eb..(slot.offset + slot.len()) * eb];
        let want = cpu_decode(&img.file, layout);
        match dtype {
            DType::U8 => {
                if let Some(report) = u8_mismatches(got, &want, slot, layout) {
                    panic!("{tag}: {} {report}", img.label);
                }
            }
            DType::F32 | DType::F16 => {
                let plane = slot.width as usize * slot.height as usize;
                let channels = slot.channels as usize;
                for (i, &v) in want.iter().enumerate() {
                    let c = match layout {
                        Layout::Nchw => i / plane,
                        Layout::Nhwc => i % channels,
                    };
                    let f = norm.apply(v, c);
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

/// Where u8 output `got` differs from `want` (both `slot`'s image in `layout`): how many elements, and the
/// first few as (channel, row, column): got vs CPU, so that a failure on a device shows its pattern
/// (one lane, one row, a whole patch) from the log alone. None when they are equal.
pub fn u8_mismatches(
    got: &[u8],
    want: &[u8],
    slot: &l3_cuda::ImageSlot,
    layout: Layout,
) -> Option<String> {
    let (w, h, c) = (
        slot.width as usize,
        slot.height as usize,
        slot.channels as usize,
    );
    let bad: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
    let first = *bad.first()?;
    let at = |i: usize| match layout {
        Layout::Nchw => (i / (w * h), i / w % h, i % w),
        Layout::Nhwc => (i % c, i / c / w, i / c % w),
    };
    let list: Vec<String> = bad
        .iter()
        .take(24)
        .map(|&i| {
            let (ch, y, x) = at(i);
            format!("({ch},{y},{x}) {} vs {}", got[i], want[i])
        })
        .collect();
    Some(format!(
        "differs at byte {first}: {} vs CPU {}; {} of {} bytes differ: {}",
        got[first],
        want[first],
        bad.len(),
        want.len(),
        list.join(", ")
    ))
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

/// Where the corpus may be: `$L3_CORPUS` (set by gpu-bin/run.sh on a machine where the binaries were
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

// ---- Sample batches: windows of images into fixed-size 3-channel samples ----

/// A test sample batch: images, one window each, whether each is given as fragments (only the header,
/// offset table and the window's patch ranges, read with `gap`), and the options.
pub struct SampleCase {
    pub imgs: Vec<TestImage>,
    pub windows: Vec<vocab::Window>,
    /// `Some(gap)`: the source is `SampleSource::Fragments` with ranges merged across gaps of `gap` bytes.
    pub fragments: Vec<Option<u64>>,
    pub opts: l3_cuda::SampleOptions,
}

/// The parts of a fragment source: what a loader holds after reading a window's byte ranges.
pub struct FragmentSource {
    pub index: l3_format::L3Index,
    pub data: l3_format::Fragments,
}

/// Reads (from the in-memory `file`) exactly what a loader would for `region`: the header and offset
/// table, parsed into an index, then the patch ranges under the region, merged across gaps of `gap`.
pub fn read_fragments(file: &[u8], region: l3_format::Rect, gap: u64) -> FragmentSource {
    let index = l3_format::L3Index::read_from(file.len() as u64, |r| {
        Ok::<_, std::convert::Infallible>(file[r.start as usize..r.end as usize].to_vec())
    })
    .unwrap();
    let ranges = index.region_ranges(region, gap).unwrap();
    let mut data = l3_format::Fragments::new();
    data.reset(&ranges);
    for (r, dst) in data.slices_mut() {
        dst.copy_from_slice(&file[r.start as usize..r.end as usize]);
    }
    FragmentSource { index, data }
}

impl SampleCase {
    /// A case with no windows yet, of samples `opts` describes.
    pub fn new(opts: l3_cuda::SampleOptions) -> SampleCase {
        SampleCase {
            imgs: Vec::new(),
            windows: Vec::new(),
            fragments: Vec::new(),
            opts,
        }
    }

    /// The fragment sources' parts (None for whole files), to borrow sources from.
    pub fn fragment_parts(&self) -> Vec<Option<FragmentSource>> {
        self.imgs
            .iter()
            .zip(&self.windows)
            .zip(&self.fragments)
            .map(|((img, w), f)| f.map(|gap| read_fragments(&img.file, w.src, gap)))
            .collect()
    }

    pub fn files(&self) -> Vec<&[u8]> {
        self.imgs.iter().map(|i| i.file.as_slice()).collect()
    }
}

/// The batch's sources: whole files, or the fragments in `parts`.
pub fn sample_sources<'a>(
    case: &'a SampleCase,
    parts: &'a [Option<FragmentSource>],
) -> Vec<l3_cuda::SampleSource<'a>> {
    case.imgs
        .iter()
        .zip(parts)
        .map(|(img, p)| match p {
            Some(p) => l3_cuda::SampleSource::Fragments {
                index: &p.index,
                data: &p.data,
            },
            None => l3_cuda::SampleSource::File(&img.file),
        })
        .collect()
}

/// A random window of a `iw`×`ih` image into a `sw`×`sh` sample: crops, pads on one or both axes, 1×1,
/// whole image, at any position, flipped or not.
pub fn random_window(iw: u32, ih: u32, sw: u32, sh: u32, rng: &mut Rng) -> vocab::Window {
    let axis = |i: u32, s: u32, rng: &mut Rng| -> (u32, u32, u32) {
        let max = i.min(s);
        let len = match rng.below(5) {
            0 => 1,
            1 | 2 => max,
            _ => 1 + rng.below(u64::from(max)) as u32,
        };
        let src = rng.below(u64::from(i - len) + 1) as u32;
        let dst = rng.below(u64::from(s - len) + 1) as u32;
        (src, dst, len)
    };
    let (x, dx, w) = axis(iw, sw, rng);
    let (y, dy, h) = axis(ih, sh, rng);
    vocab::Window::new(l3_format::Rect::new(x, y, w, h), dx, dy, rng.below(2) == 1)
}

/// A random sample batch: gray, RGB and RGBA images of mixed sizes and patch sizes 2 to 255 (edge
/// patches of every width, one-patch images), random windows, about half given as fragments.
pub fn random_sample_case(
    seed: u64,
    n: usize,
    layout: Layout,
    dtype: DType,
    normalize: Option<vocab::Normalize>,
) -> SampleCase {
    let mut rng = Rng(seed | 1);
    let (sw, sh) = (24 + rng.below(24) as u32, 16 + rng.below(24) as u32);
    let mut case = SampleCase::new(l3_cuda::SampleOptions {
        layout,
        dtype,
        normalize,
        fill: [0u8, 255, 114][rng.below(3) as usize],
        ..l3_cuda::SampleOptions::new(sw, sh)
    });
    for i in 0..n {
        let c = [1u8, 3, 4][i % 3];
        let (iw, ih) = (1 + rng.below(70) as u32, 1 + rng.below(60) as u32);
        let patch = [2u8, 3, 8, 16, 17, 32, 64, 255][rng.below(8) as usize];
        let content = match rng.below(3) {
            0 => Content::Random,
            1 => Content::Smooth,
            _ => Content::Constant(rng.next() as u8),
        };
        case.imgs.push(image(iw, ih, c, patch, content, &mut rng));
        case.windows.push(random_window(iw, ih, sw, sh, &mut rng));
        case.fragments
            .push((rng.below(2) == 1).then(|| [0u64, 64, 1 << 20][rng.below(3) as usize]));
    }
    case
}

/// The CPU reference of a sample batch, as raw little-endian element bytes: each window decoded by
/// `l3-format`'s region decoder, converted to the batch's channels ([`convert`]) and placed by
/// [`place_samples`].
pub fn reference_samples(
    files: &[&[u8]],
    windows: &[vocab::Window],
    opts: &l3_cuda::SampleOptions,
) -> Vec<u8> {
    let samples = files.iter().zip(windows).map(|(file, win)| {
        let f = l3_format::L3File::parse(file).unwrap();
        let ic = f.channels() as usize;
        let r = win.src;
        let (w, h) = (r.w as usize, r.h as usize);
        let mut px = vec![0u8; w * h * ic];
        f.decode_region(
            r,
            &mut px,
            l3_format::PixelLayout::Interleaved { row_stride: w * ic },
        )
        .unwrap();
        let px = convert(&px, ic, opts.channels);
        (px, (r.w, r.h), (win.dx, win.dy, win.flip))
    });
    place_samples(samples, opts)
}

/// Interleaved pixels of `from` channels as `to` channels, written out plainly: 3 = RGB (gray copied to
/// R, G and B, alpha dropped); 4 = RGBA (gray copied, alpha 255 where there is none); 1 = luma, Pillow's
/// `L` (`(19595 R + 38470 G + 7471 B + 2^15) >> 16`), a gray image as is.
pub fn convert(px: &[u8], from: usize, to: u8) -> Vec<u8> {
    px.chunks_exact(from)
        .flat_map(|p| {
            let rgba = match from {
                1 => [p[0], p[0], p[0], 255],
                3 => [p[0], p[1], p[2], 255],
                _ => [p[0], p[1], p[2], p[3]],
            };
            let luma = if from == 1 {
                p[0]
            } else {
                ((u32::from(p[0]) * 19595
                    + u32::from(p[1]) * 38470
                    + u32::from(p[2]) * 7471
                    + 32768)
                    >> 16) as u8
            };
            match to {
                1 => vec![luma],
                3 => rgba[..3].to_vec(),
                _ => rgba.to_vec(),
            }
        })
        .collect()
}

/// A batch of samples as raw little-endian element bytes, by plain loops: each sample's interleaved
/// pixels of `opts.channels` (`w`×`h`) land at (dx, dy), mirrored when flipped; everything else is a
/// pixel of value `opts.fill` (every channel); floats are `Normalize::apply`, f16 through the `half`
/// crate.
#[allow(clippy::type_complexity)]
fn place_samples(
    samples: impl Iterator<Item = (Vec<u8>, (u32, u32), (u32, u32, bool))>,
    opts: &l3_cuda::SampleOptions,
) -> Vec<u8> {
    let (sw, sh) = (opts.width as usize, opts.height as usize);
    let norm = opts.normalize.unwrap_or(vocab::Normalize::UNIT);
    let value = |v: u8, c: usize| -> Vec<u8> {
        match opts.dtype {
            DType::U8 => vec![v],
            DType::F32 => norm.apply(v, c).to_le_bytes().to_vec(),
            DType::F16 => half::f16::from_f32(norm.apply(v, c))
                .to_bits()
                .to_le_bytes()
                .to_vec(),
        }
    };
    let eb = opts.dtype.size();
    let cn = usize::from(opts.channels);
    let sample = sw * sh * cn * eb;
    let idx = |x: usize, y: usize, c: usize| match opts.layout {
        Layout::Nhwc => (y * sw + x) * cn + c,
        Layout::Nchw => c * sw * sh + y * sw + x,
    };
    let mut out = Vec::new();
    for (px, (w, h), (dx, dy, flip)) in samples {
        let (w, h, dx, dy) = (w as usize, h as usize, dx as usize, dy as usize);
        let mut s = vec![0u8; sample];
        for y in 0..sh {
            for x in 0..sw {
                for c in 0..cn {
                    let v = if (dy..dy + h).contains(&y) && (dx..dx + w).contains(&x) {
                        let col = if flip { dx + w - 1 - x } else { x - dx };
                        px[((y - dy) * w + col) * cn + c]
                    } else {
                        opts.fill
                    };
                    let at = idx(x, y, c) * eb;
                    s[at..at + eb].copy_from_slice(&value(v, c));
                }
            }
        }
        out.extend_from_slice(&s);
    }
    out
}

/// Compares a decoded sample batch with the reference, naming the first differing element.
pub fn check_samples(
    got: &[u8],
    want: &[u8],
    opts: &l3_cuda::SampleOptions,
    labels: &[String],
    tag: &str,
) {
    assert_eq!(got.len(), want.len(), "{tag}: output size");
    if got == want {
        return;
    }
    let eb = opts.dtype.size();
    let i = got
        .chunks(eb)
        .zip(want.chunks(eb))
        .position(|(a, b)| a != b)
        .unwrap();
    let (sw, sh) = (opts.width as usize, opts.height as usize);
    let cn = usize::from(opts.channels);
    let sample = sw * sh * cn;
    let (n, e) = (i / sample, i % sample);
    let (x, y, c) = match opts.layout {
        Layout::Nhwc => ((e / cn) % sw, e / cn / sw, e % cn),
        Layout::Nchw => (e % sw, (e / sw) % sh, e / (sw * sh)),
    };
    panic!(
        "{tag}: sample {n} ({}) differs at x {x}, y {y}, channel {c}: got {:?}, want {:?}",
        labels.get(n).map_or("?", String::as_str),
        &got[i * eb..(i + 1) * eb],
        &want[i * eb..(i + 1) * eb],
    );
}

// ---- Resampled sample batches: vocab's recipes (random-resized crop, resize, scale jitter) ----

/// A resampled test batch: images, each sample's `Geometry` (from a `vocab::SampleSpec` recipe, as the
/// loader draws it), and the options.
pub struct ResampledCase {
    pub imgs: Vec<TestImage>,
    pub geometries: Vec<vocab::Geometry>,
    pub interpolation: vocab::Interpolation,
    pub opts: l3_cuda::SampleOptions,
}

/// Gray, RGB and RGBA images of mixed (and odd: 1×1, 7×3) sizes and patch sizes, each with a geometry of
/// one of the recipes — random-resized crop, shorter-side resize then crop, scale jitter then crop
/// (padding where the crop reaches past the rescaled image) — random or centre crops, flipped or not,
/// as `vocab::SampleSpec::geometry` draws them for (seed, epoch, item).
#[allow(clippy::too_many_arguments)]
pub fn resampled_case(
    seed: u64,
    n: usize,
    channels: u8,
    layout: Layout,
    dtype: DType,
    normalize: Option<vocab::Normalize>,
    interpolation: vocab::Interpolation,
) -> ResampledCase {
    let mut rng = Rng(seed | 1);
    let (sw, sh) = (16 + rng.below(24) as u32, 12 + rng.below(24) as u32);
    let fill = [0u8, 255, 114][rng.below(3) as usize];
    let mut case = ResampledCase {
        imgs: Vec::new(),
        geometries: Vec::new(),
        interpolation,
        opts: l3_cuda::SampleOptions {
            channels,
            layout,
            dtype,
            normalize,
            fill,
            ..l3_cuda::SampleOptions::new(sw, sh)
        },
    };
    for i in 0..n {
        let c = [1u8, 3, 4][i % 3];
        let (iw, ih) = match i % 7 {
            0 => (1, 1),
            1 => (7, 3),
            _ => (1 + rng.below(90) as u32, 1 + rng.below(70) as u32),
        };
        let patch = [3u8, 8, 16, 17, 32, 64, 255][rng.below(7) as usize];
        let content = match rng.below(3) {
            0 => Content::Random,
            1 => Content::Smooth,
            _ => Content::Constant(rng.next() as u8),
        };
        case.imgs.push(match i % 4 {
            3 => {
                let profile =
                    [l3_format::Profile::Bp, l3_format::Profile::Ans][rng.below(2) as usize];
                image_v2(iw, ih, c, [32, 64][i % 2], profile, content, &mut rng)
            }
            _ => image(iw, ih, c, patch, content, &mut rng),
        });
        let recipe = match rng.below(3) {
            0 => vocab::Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: vocab::DEFAULT_RATIO,
            },
            // Every seventh a resize to the size the image has: a sample that resamples nothing.
            1 if i % 7 == 2 => vocab::Recipe::Resize {
                shorter: iw.min(ih),
            },
            1 => vocab::Recipe::Resize {
                shorter: 1 + rng.below(48) as u32,
            },
            _ => vocab::Recipe::Jitter { range: [0.5, 2.0] },
        };
        let spec = vocab::SampleSpec {
            width: sw,
            height: sh,
            crop: if rng.below(2) == 0 {
                vocab::Crop::Random
            } else {
                vocab::Crop::Center
            },
            hflip: true,
            layout,
            dtype,
            normalize,
            recipe,
            interpolation,
            fill,
            ..vocab::SampleSpec::default()
        };
        let key = vocab::ItemKey {
            seed,
            epoch: 1,
            index: i,
        };
        case.geometries.push(spec.geometry(iw, ih, &key));
    }
    case
}

/// A batch of whole images (`crop=None`), as the loader's GPU stage shapes it: each image sized by one of
/// the whole-image sizings — its own size, a `max_size` bound, a shorter-side resize or a scale jitter,
/// bounded — flipped or not, at the top left of a sample as large as the batch's largest, the rest
/// `fill`.
pub fn whole_case(
    seed: u64,
    n: usize,
    channels: u8,
    layout: Layout,
    dtype: DType,
    normalize: Option<vocab::Normalize>,
    interpolation: vocab::Interpolation,
) -> ResampledCase {
    let mut rng = Rng(seed | 1);
    let fill = [0u8, 255, 114][rng.below(3) as usize];
    let (mut imgs, mut geometries) = (Vec::new(), Vec::new());
    for i in 0..n {
        let c = [1u8, 3, 4][i % 3];
        let (iw, ih) = match i % 5 {
            0 => (1, 1),
            1 => (7, 3),
            _ => (1 + rng.below(80) as u32, 1 + rng.below(60) as u32),
        };
        let patch = [3u8, 8, 16, 17, 32, 64][rng.below(6) as usize];
        let content = [Content::Random, Content::Smooth][rng.below(2) as usize];
        imgs.push(match i % 4 {
            3 => image_v2(iw, ih, c, 32, l3_format::Profile::Ans, content, &mut rng),
            _ => image(iw, ih, c, patch, content, &mut rng),
        });
        let whole = match rng.below(4) {
            0 => vocab::Whole::default(),
            1 => vocab::Whole {
                max_size: Some(8 + rng.below(40) as u32),
                ..vocab::Whole::default()
            },
            2 => vocab::Whole {
                shorter: Some(1 + rng.below(30) as u32),
                max_size: Some(64),
                ..vocab::Whole::default()
            },
            _ => vocab::Whole {
                jitter: Some([0.5, 2.0]),
                max_size: Some(72),
                ..vocab::Whole::default()
            },
        };
        let spec = vocab::SampleSpec {
            width: 72,
            height: 72,
            crop: vocab::Crop::Center,
            hflip: true,
            layout,
            dtype,
            normalize,
            recipe: vocab::Recipe::Whole(whole),
            interpolation,
            fill,
            ..vocab::SampleSpec::default()
        };
        let key = vocab::ItemKey {
            seed,
            epoch: 1,
            index: i,
        };
        geometries.push(spec.geometry(iw, ih, &key));
    }
    let bound = |f: fn(&vocab::Geometry) -> u32| geometries.iter().map(f).max().unwrap_or(1);
    let (w, h) = (bound(|g| g.x.len), bound(|g| g.y.len));
    ResampledCase {
        imgs,
        geometries,
        interpolation,
        opts: l3_cuda::SampleOptions {
            channels,
            layout,
            dtype,
            normalize,
            fill,
            ..l3_cuda::SampleOptions::new(w, h)
        },
    }
}

/// The resampled batches every device test runs: both interpolations × both layouts × u8, f16
/// (normalised) and f32, `n` images each, for each of `channels` (3 = RGB, 1 = luma, 4 = RGBA), with
/// their tags.
pub fn resampled_cases(n: usize, channels: &[u8]) -> Vec<(String, ResampledCase)> {
    let mut out = Vec::new();
    let mut seed = 0x7e5a;
    for &c in channels {
        for interpolation in [
            vocab::Interpolation::Bilinear,
            vocab::Interpolation::Nearest,
        ] {
            for layout in [Layout::Nhwc, Layout::Nchw] {
                for (dtype, normalize) in [
                    (DType::U8, None),
                    (DType::F16, Some(vocab::Normalize::IMAGENET)),
                    (DType::F32, None),
                ] {
                    seed += 1;
                    // A luma batch is normalised by one mean and std (the loader's rule).
                    let normalize = normalize.map(|n| {
                        if c == 1 {
                            vocab::Normalize {
                                mean: [n.mean[1]; 3],
                                std: [n.std[1]; 3],
                            }
                        } else {
                            n
                        }
                    });
                    let tag = format!("channels {c} {interpolation:?} {layout:?} {dtype:?}");
                    let case = resampled_case(seed, n, c, layout, dtype, normalize, interpolation);
                    out.push((tag, case));
                }
            }
        }
    }
    out
}

/// The CPU reference of a resampled batch, in the CPU loader's order: each image decoded whole by
/// `l3-format`; for a luma batch converted to luma first (Pillow's `convert("L").resize(...)`), else
/// resampled in the image's own channels and converted after ([`convert`]); resampled by
/// `vocab::Resampling`'s tables with Pillow's integer arithmetic written out plainly (horizontal pass
/// over every row, then vertical, `(2^21 + Σ v·w) >> 22` clamped; or the nearest pick), then placed by
/// the geometry as [`reference_samples`] places windows.
pub fn reference_resampled(case: &ResampledCase) -> Vec<u8> {
    let clip = |acc: i32| (acc >> 22).clamp(0, 255) as u8;
    let co = case.opts.channels;
    let samples = case.imgs.iter().zip(&case.geometries).map(|(img, g)| {
        let f = l3_format::L3File::parse(&img.file).unwrap();
        let (iw, ic) = (f.width() as usize, f.channels() as usize);
        let decoded = cpu_decode(&img.file, Layout::Nhwc);
        let (src, wc) = if co == 1 {
            (convert(&decoded, ic, 1), 1)
        } else {
            (decoded, ic)
        };
        let px = |x: usize, y: usize, c: usize| src[(y * iw + x) * wc + c];
        let t = vocab::Resampling::new(g, case.interpolation);
        let (kw, kh) = t.size();
        let (w, h) = (kw as usize, kh as usize);
        let mut kept = vec![0u8; w * h * wc];
        for oy in 0..h {
            for ox in 0..w {
                for c in 0..wc {
                    kept[(oy * w + ox) * wc + c] = match &t {
                        vocab::Resampling::Bilinear { x, y } => {
                            let mut acc = 1i32 << 21;
                            for ty in 0..y.taps[oy] as usize {
                                let sy = y.first[oy] as usize + ty;
                                let mut hacc = 1i32 << 21;
                                for tx in 0..x.taps[ox] as usize {
                                    let sx = x.first[ox] as usize + tx;
                                    hacc += i32::from(px(sx, sy, c)) * x.weights[ox * x.ksize + tx];
                                }
                                acc += i32::from(clip(hacc)) * y.weights[oy * y.ksize + ty];
                            }
                            clip(acc)
                        }
                        vocab::Resampling::Nearest { x, y } => {
                            px(x[ox] as usize, y[oy] as usize, c)
                        }
                    };
                }
            }
        }
        let kept = convert(&kept, wc, co);
        (kept, (kw, kh), (g.dx, g.dy, g.flip))
    });
    place_samples(samples, &case.opts)
}
