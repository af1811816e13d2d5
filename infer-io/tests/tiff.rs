//! TIFF by region and tiled BigTIFF out (`infer_io::tiff`): region reads equal the pixels the file
//! holds, for striped (the `tiff` crate's encoder: classic and BigTIFF, every compression it writes) and
//! tiled files (our writer), odd sizes, 8/16-bit and float samples; the writer's files read back through
//! the `tiff` crate's own whole-image decoder; any page of a multi-page file reads as that page decoded
//! whole, and a page the file lacks is a typed error; damaged files are typed errors naming the file.

use bsp_tiling::{Field, Input, Sink, Tensor};
use infer_io::tiff::{OutDType, PageInfo, SampleType, TiffRegions, TiffWriter};
use std::path::{Path, PathBuf};
use stdx::SplitMix64;
use tiff::encoder::{
    Compression, DeflateLevel, DirectoryEncoder, TiffEncoder, TiffKind, colortype,
};
use tiff::tags::Tag;

fn gather(f: &dyn Field, ys: &[Option<usize>], xs: &[Option<usize>]) -> bsp_tiling::Result<Tensor> {
    let mut t = Tensor::zeros(f.channels(), ys.len(), xs.len()).unwrap();
    f.gather(ys, xs, &mut t.data)?;
    Ok(t)
}

fn rng_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| (r.next_u64() >> 56) as u8).collect()
}

fn rng_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n)
        .map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0)
        .collect()
}

/// Every pixel of `src` as a `C×H×W` tensor, through one window with padding (`None`) around it and
/// one reflected window, checked against `expect(c, y, x)`.
fn check_windows(src: &dyn Input, expect: impl Fn(usize, usize, usize) -> f32) {
    let (h, w, c) = (src.height(), src.width(), src.channels());
    // The whole image with a border of `None`, then windows of 5×3 stepping over it, reflected at the edge.
    let ys: Vec<Option<usize>> = std::iter::once(None)
        .chain((0..h).map(Some))
        .chain(std::iter::once(None))
        .collect();
    let xs: Vec<Option<usize>> = std::iter::once(None)
        .chain((0..w).map(Some))
        .chain(std::iter::once(None))
        .collect();
    let t = gather(src, &ys, &xs).unwrap();
    for ch in 0..c {
        for (iy, y) in ys.iter().enumerate() {
            for (ix, x) in xs.iter().enumerate() {
                let want = match (y, x) {
                    (Some(y), Some(x)) => expect(ch, *y, *x),
                    _ => 0.0,
                };
                assert_eq!(
                    t.at(ch, iy, ix).to_bits(),
                    want.to_bits(),
                    "({ch}, {y:?}, {x:?})"
                );
            }
        }
    }
    for y0 in (0..h).step_by(3) {
        for x0 in (0..w).step_by(5) {
            let ys: Vec<Option<usize>> = (y0..y0 + 3).map(|y| Some(y.min(h - 1))).collect();
            let xs: Vec<Option<usize>> = (x0..x0 + 5).rev().map(|x| Some(x.min(w - 1))).collect();
            let t = gather(src, &ys, &xs).unwrap();
            for ch in 0..c {
                for (iy, y) in ys.iter().enumerate() {
                    for (ix, x) in xs.iter().enumerate() {
                        let want = expect(ch, y.unwrap(), x.unwrap());
                        assert_eq!(t.at(ch, iy, ix).to_bits(), want.to_bits());
                    }
                }
            }
        }
    }
}

fn striped<C: colortype::ColorType>(
    path: &Path,
    big: bool,
    compression: Compression,
    (w, h, rows): (u32, u32, u32),
    data: &[C::Inner],
) where
    [C::Inner]: tiff::encoder::TiffValue,
{
    let f = std::fs::File::create(path).unwrap();
    macro_rules! write {
        ($enc:expr) => {{
            let mut enc = $enc.unwrap().with_compression(compression);
            let mut img = enc.new_image::<C>(w, h).unwrap();
            img.rows_per_strip(rows).unwrap();
            img.write_data(data).unwrap();
        }};
    }
    if big {
        write!(TiffEncoder::new_big(f))
    } else {
        write!(TiffEncoder::new(f))
    }
}

#[test]
fn striped_files_read_by_region_equal_their_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let compressions = [
        Compression::Uncompressed,
        Compression::Lzw,
        Compression::Deflate(DeflateLevel::Fast),
        Compression::Packbits,
    ];
    for (i, &(w, h, rows)) in [(37usize, 23usize, 4u32), (7, 3, 1), (1, 1, 1), (20, 9, 64)]
        .iter()
        .enumerate()
    {
        for (k, &comp) in compressions.iter().enumerate() {
            let big = k % 2 == 1;
            let seed = (i * 10 + k) as u64;
            let p = dir.path().join(format!("rgb8_{i}_{k}.tif"));
            let px = rng_bytes(w * h * 3, seed);
            striped::<colortype::RGB8>(&p, big, comp, (w as u32, h as u32, rows), &px);
            let r = TiffRegions::open(&p, 1 << 20).unwrap();
            assert_eq!((r.width(), r.height(), r.channels()), (w, h, 3));
            assert!(!r.is_tiled());
            check_windows(&r, |c, y, x| f32::from(px[(y * w + x) * 3 + c]));

            let p = dir.path().join(format!("gray16_{i}_{k}.tif"));
            let mut g = SplitMix64::new(seed);
            let px: Vec<u16> = (0..w * h).map(|_| (g.next_u64() >> 48) as u16).collect();
            striped::<colortype::Gray16>(&p, !big, comp, (w as u32, h as u32, rows), &px);
            let r = TiffRegions::open(&p, 1 << 20).unwrap();
            check_windows(&r, |_, y, x| f32::from(px[y * w + x]));
        }
        let p = dir.path().join(format!("rgbf_{i}.tif"));
        let px = rng_f32(w * h * 3, i as u64);
        striped::<colortype::RGB32Float>(
            &p,
            false,
            Compression::Lzw,
            (w as u32, h as u32, rows),
            &px,
        );
        let r = TiffRegions::open(&p, 1 << 20).unwrap();
        check_windows(&r, |c, y, x| px[(y * w + x) * 3 + c]);
        let p = dir.path().join(format!("rgba8_{i}.tif"));
        let px = rng_bytes(w * h * 4, 99 + i as u64);
        striped::<colortype::RGBA8>(
            &p,
            true,
            Compression::Uncompressed,
            (w as u32, h as u32, rows),
            &px,
        );
        let r = TiffRegions::open(&p, 1 << 20).unwrap();
        assert_eq!(r.channels(), 4);
        check_windows(&r, |c, y, x| f32::from(px[(y * w + x) * 4 + c]));
    }
}

/// A tensor written by the tiled writer in regions of `step` (shuffled order), as `dtype`.
fn write_tiled(path: &Path, t: &Tensor, dtype: OutDType, step: (usize, usize), seed: u64) {
    let f = std::fs::File::create(path).unwrap();
    let wr = TiffWriter::new(f, path, t.c, t.h, t.w, dtype).unwrap();
    let mut regions = Vec::new();
    for y0 in (0..t.h).step_by(step.0) {
        for x0 in (0..t.w).step_by(step.1) {
            regions.push((y0, x0));
        }
    }
    let mut r = SplitMix64::new(seed);
    for i in (1..regions.len()).rev() {
        regions.swap(i, (r.next_u64() % (i as u64 + 1)) as usize);
    }
    for (y0, x0) in regions {
        // Regions may run past the image (the last tiles of a run): the writer clips them.
        let mut part = Tensor::zeros(t.c, step.0, step.1).unwrap();
        for c in 0..t.c {
            for y in 0..step.0.min(t.h - y0) {
                for x in 0..step.1.min(t.w - x0) {
                    part.data[(c * step.0 + y) * step.1 + x] = t.at(c, y0 + y, x0 + x);
                }
            }
        }
        wr.put_tile(y0, x0, &part).unwrap();
    }
    wr.finish().unwrap();
}

/// The `tiff` crate's whole-image decode, as floats in `C×H×W` order.
fn decode_whole(path: &Path) -> (usize, usize, usize, Vec<f32>) {
    let mut d = tiff::decoder::Decoder::new(std::fs::File::open(path).unwrap()).unwrap();
    let (w, h) = d.dimensions().unwrap();
    let (w, h) = (w as usize, h as usize);
    let v: Vec<f32> = match d.read_image().unwrap() {
        tiff::decoder::DecodingResult::U8(v) => v.into_iter().map(f32::from).collect(),
        tiff::decoder::DecodingResult::F32(v) => v,
        _ => panic!("unexpected sample type"),
    };
    let c = v.len() / (w * h);
    let mut out = vec![0.0; v.len()];
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                out[(ch * h + y) * w + x] = v[(y * w + x) * c + ch];
            }
        }
    }
    (c, h, w, out)
}

#[test]
fn tiled_bigtiff_output_reads_back_through_the_tiff_crate() {
    let dir = tempfile::tempdir().unwrap();
    for &(c, h, w, step) in &[
        (3usize, 300usize, 261usize, (64usize, 50usize)),
        (1, 7, 3, (2, 2)),
        (3, 1, 1, (1, 1)),
        (4, 257, 256, (100, 256)),
        (5, 20, 30, (7, 11)),
    ] {
        let vals = rng_f32(c * h * w, (c * h * w) as u64);
        let f =
            Tensor::from_vec(c, h, w, vals.iter().map(|v| v * 100.0 + 100.0).collect()).unwrap();
        for dtype in [OutDType::F32, OutDType::U8] {
            let p: PathBuf = dir.path().join(format!("out_{c}_{h}_{w}_{dtype:?}.tif"));
            write_tiled(&p, &f, dtype, step, 7);
            let expect = |ch: usize, y: usize, x: usize| {
                let v = f.at(ch, y, x);
                match dtype {
                    OutDType::F32 => v,
                    OutDType::U8 => v.clamp(0.0, 255.0).round(),
                }
            };
            let (dc, dh, dw, whole) = decode_whole(&p);
            assert_eq!((dc, dh, dw), (c, h, w));
            for ch in 0..c {
                for y in 0..h {
                    for x in 0..w {
                        assert_eq!(
                            whole[(ch * h + y) * w + x].to_bits(),
                            expect(ch, y, x).to_bits()
                        );
                    }
                }
            }
            // And by region: a tiled BigTIFF input.
            let r = TiffRegions::open(&p, 1 << 20).unwrap();
            assert!(r.is_tiled());
            check_windows(&r, expect);
        }
    }
}

#[test]
fn an_unfinished_output_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("part.tif");
    let wr = TiffWriter::new(
        std::fs::File::create(&p).unwrap(),
        &p,
        1,
        300,
        300,
        OutDType::U8,
    )
    .unwrap();
    wr.put_tile(0, 0, &Tensor::zeros(1, 256, 256).unwrap())
        .unwrap();
    let e = wr.finish().unwrap_err().to_string();
    assert!(e.contains("part.tif") && e.contains("1 of 4 tiles"), "{e}");
}

#[test]
fn damaged_files_are_typed_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("good.tif");
    let (w, h) = (40usize, 30usize);
    let px = rng_bytes(w * h * 3, 5);
    striped::<colortype::RGB8>(&p, false, Compression::Lzw, (w as u32, h as u32, 4), &px);
    let good = std::fs::read(&p).unwrap();
    let all_y: Vec<Option<usize>> = (0..h).map(Some).collect();
    let all_x: Vec<Option<usize>> = (0..w).map(Some).collect();
    let read_all = |path: &Path| -> bsp_tiling::Result<Tensor> {
        let r = TiffRegions::open(path, 1 << 20)?;
        gather(&r, &all_y, &all_x)
    };
    // Truncated anywhere: an error that names the file (or, cut past the pixel data, the same pixels).
    let cut = dir.path().join("cut.tif");
    for len in (0..good.len()).step_by(37) {
        std::fs::write(&cut, &good[..len]).unwrap();
        match read_all(&cut) {
            Err(e) => assert!(e.to_string().contains("cut.tif"), "{e}"),
            Ok(t) => {
                for y in 0..h {
                    for x in 0..w {
                        for c in 0..3 {
                            assert_eq!(t.at(c, y, x), f32::from(px[(y * w + x) * 3 + c]));
                        }
                    }
                }
            }
        }
    }
    // Bytes flipped: no panic; an error names the file.
    let bad = dir.path().join("bad.tif");
    let mut r = SplitMix64::new(11);
    for _ in 0..300 {
        let mut b = good.clone();
        for _ in 0..1 + r.next_u64() % 4 {
            let i = (r.next_u64() % b.len() as u64) as usize;
            b[i] ^= 1 << (r.next_u64() % 8);
        }
        std::fs::write(&bad, &b).unwrap();
        if let Err(e) = read_all(&bad) {
            assert!(e.to_string().contains("bad.tif"), "{e}");
        }
    }
    // Not a TIFF at all, and a palette image.
    std::fs::write(&bad, b"not a tiff file").unwrap();
    let e = TiffRegions::open(&bad, 1 << 20).err().unwrap().to_string();
    assert!(e.contains("bad.tif") && e.contains("TIFF"), "{e}");
}

#[test]
fn one_strip_of_the_whole_image_is_read_once_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("one_strip.tif");
    let (w, h) = (300usize, 200usize);
    let px = rng_bytes(w * h, 3);
    striped::<colortype::Gray8>(
        &p,
        false,
        Compression::Deflate(DeflateLevel::Fast),
        (w as u32, h as u32, h as u32),
        &px,
    );
    // A 1 KiB cache: the strip (60 KB) is kept anyway, and the reader says why.
    let r = TiffRegions::open(&p, 1024).unwrap();
    let note = r.note().expect("a note");
    assert!(
        note.contains("one_strip.tif") && note.contains("whole decode"),
        "{note}"
    );
    check_windows(&r, |_, y, x| f32::from(px[y * w + x]));
    // Under a memory limit smaller than the strip: refused by name before decoding.
    // (L3_MEMORY_LIMIT is read per check; this test binary runs the check in a child to keep it
    // from affecting the other tests.)
    if std::env::var("TIFF_CHILD").is_ok() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "strip_over_the_memory_limit_child",
            "--nocapture",
        ])
        .env("TIFF_CHILD", p.as_os_str())
        .env(stdx::mem::LIMIT_VAR, "16K")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("refused:"));
}

#[test]
fn strip_over_the_memory_limit_child() {
    let Some(p) = std::env::var_os("TIFF_CHILD") else {
        return;
    };
    let e = TiffRegions::open(Path::new(&p), 1024)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("one_strip.tif") && e.contains("memory limit"),
        "{e}"
    );
    println!("refused: {e}");
}

/// An uncompressed 8-bit RGB page in `tile`×`tile` tiles (the `tiff` crate's encoder writes strips only,
/// so the tags and tiles are written by hand), marked full resolution (NewSubfileType = 0).
fn tiled_rgb_page<W: std::io::Write + std::io::Seek, K: TiffKind>(
    enc: &mut TiffEncoder<W, K>,
    (w, h, tile): (u32, u32, u32),
    px: &[u8],
) {
    let mut dir = enc.image_directory().unwrap();
    tiled_rgb_tags(&mut dir, (w, h, tile), px, 0);
    dir.finish().unwrap();
}

/// The tiles and tags of an uncompressed 8-bit RGB image in `tile`×`tile` tiles, into `dir`.
fn tiled_rgb_tags<W: std::io::Write + std::io::Seek, K: TiffKind>(
    dir: &mut DirectoryEncoder<'_, W, K>,
    (w, h, tile): (u32, u32, u32),
    px: &[u8],
    new_subfile_type: u32,
) {
    let (mut offsets, mut counts) = (Vec::new(), Vec::new());
    for ty in 0..h.div_ceil(tile) {
        for tx in 0..w.div_ceil(tile) {
            let mut buf = vec![0u8; (tile * tile * 3) as usize];
            for y in 0..tile {
                for x in 0..tile {
                    let (iy, ix) = (ty * tile + y, tx * tile + x);
                    if iy < h && ix < w {
                        let (d, s) = (((y * tile + x) * 3) as usize, ((iy * w + ix) * 3) as usize);
                        buf[d..d + 3].copy_from_slice(&px[s..s + 3]);
                    }
                }
            }
            offsets.push(u32::try_from(dir.write_data(&buf[..]).unwrap()).unwrap());
            counts.push(buf.len() as u32);
        }
    }
    dir.write_tag(Tag::NewSubfileType, new_subfile_type)
        .unwrap();
    dir.write_tag(Tag::ImageWidth, w).unwrap();
    dir.write_tag(Tag::ImageLength, h).unwrap();
    dir.write_tag(Tag::BitsPerSample, &[8u16, 8, 8][..])
        .unwrap();
    dir.write_tag(Tag::Compression, 1u16).unwrap();
    dir.write_tag(Tag::PhotometricInterpretation, 2u16).unwrap();
    dir.write_tag(Tag::SamplesPerPixel, 3u16).unwrap();
    dir.write_tag(Tag::PlanarConfiguration, 1u16).unwrap();
    dir.write_tag(Tag::TileWidth, tile).unwrap();
    dir.write_tag(Tag::TileLength, tile).unwrap();
    dir.write_tag(Tag::TileOffsets, &offsets[..]).unwrap();
    dir.write_tag(Tag::TileByteCounts, &counts[..]).unwrap();
}

/// A pyramidal slide laid out as OME-TIFF and whole-slide writers do: page 0 the full resolution, its
/// reduced levels in its SubIFDs tag (directories outside the main chain), then page 1 a small 1-channel
/// label image. `levels`: (width, height, tile, pixels), the first the page itself.
fn pyramid<W: std::io::Write + std::io::Seek, K: TiffKind>(
    mut enc: TiffEncoder<W, K>,
    levels: &[(u32, u32, u32, Vec<u8>)],
) {
    let mut subs = Vec::new();
    for (w, h, tile, px) in &levels[1..] {
        let mut dir = enc.extra_directory().unwrap();
        tiled_rgb_tags(&mut dir, (*w, *h, *tile), px, 1);
        subs.push(u32::try_from(dir.finish_with_offsets().unwrap().pointer.0).unwrap());
    }
    let (w, h, tile, px) = &levels[0];
    let mut dir = enc.image_directory().unwrap();
    tiled_rgb_tags(&mut dir, (*w, *h, *tile), px, 0);
    dir.write_tag(Tag::SubIfd, &subs[..]).unwrap();
    dir.finish().unwrap();
    enc.write_image::<colortype::Gray8>(9, 8, &[7u8; 72])
        .unwrap();
}

#[test]
fn subifd_levels_read_as_their_pixels_and_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let levels: Vec<(u32, u32, u32, Vec<u8>)> = [(300, 200, 64), (150, 100, 32), (75, 50, 16)]
        .into_iter()
        .enumerate()
        .map(|(i, (w, h, t))| (w, h, t, rng_bytes((w * h * 3) as usize, 40 + i as u64)))
        .collect();
    for big in [false, true] {
        let p = dir.path().join(format!("pyramid-{big}.tif"));
        let f = std::fs::File::create(&p).unwrap();
        if big {
            pyramid(TiffEncoder::new_big(f).unwrap(), &levels);
        } else {
            pyramid(TiffEncoder::new(f).unwrap(), &levels);
        }
        let listed: Vec<String> = infer_io::tiff::pages(&p)
            .unwrap()
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(
            listed,
            [
                "page 0: 300x200, 3 channels, u8, tiled 64x64, full resolution",
                "page 0 level 1: 150x100, 3 channels, u8, tiled 32x32, reduced",
                "page 0 level 2: 75x50, 3 channels, u8, tiled 16x16, reduced",
                "page 1: 9x8, 1 channel, u8, striped 9x8, no NewSubfileType",
            ],
            "BigTIFF: {big}"
        );
        for (level, (w, _, _, px)) in levels.iter().enumerate() {
            let r = TiffRegions::open_level(&p, 0, level, 1 << 20).unwrap();
            assert_eq!((r.page(), r.level(), r.width()), (0, level, *w as usize));
            check_windows(&r, |c, y, x| f32::from(px[(y * *w as usize + x) * 3 + c]));
        }
        // The page after the pyramid is still page 1 of the main chain.
        let label = TiffRegions::open_page(&p, 1, 1 << 20).unwrap();
        check_windows(&label, |_, _, _| 7.0);
        for (page, level, subifds) in [(0, 3, 2), (1, 1, 0)] {
            match TiffRegions::open_level(&p, page, level, 1 << 20) {
                Err(e @ infer_io::Error::NoSuchLevel { .. }) => {
                    let text = e.to_string();
                    let infer_io::Error::NoSuchLevel {
                        path,
                        page: pg,
                        level: lv,
                        subifds: n,
                    } = e
                    else {
                        unreachable!()
                    };
                    assert_eq!((path, pg, lv, n), (p.clone(), page, level, subifds));
                    assert!(
                        text.contains("pyramid-") && text.contains(&format!("no level {level}")),
                        "{text}"
                    );
                }
                Err(e) => panic!("page {page} level {level}: {e}"),
                Ok(_) => panic!("page {page} level {level} opened"),
            }
        }
    }
}

/// A page naming 10,000 SubIFDs (all one directory) is refused by one rule whether its levels are
/// listed or one of them is opened, past the cap or within it; the page itself still reads.
#[test]
fn too_many_subifds_are_refused_by_listing_and_opening_alike() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("many.tif");
    let mut enc = TiffEncoder::new(std::fs::File::create(&p).unwrap()).unwrap();
    let px = rng_bytes(16 * 16 * 3, 3);
    let mut sub = enc.extra_directory().unwrap();
    tiled_rgb_tags(&mut sub, (16, 16, 16), &px, 1);
    let at = u32::try_from(sub.finish_with_offsets().unwrap().pointer.0).unwrap();
    let mut page = enc.image_directory().unwrap();
    tiled_rgb_tags(&mut page, (16, 16, 16), &px, 0);
    page.write_tag(Tag::SubIfd, &vec![at; 10_000][..]).unwrap();
    page.finish().unwrap();
    let says = "page 0 names 10000 SubIFDs, more than the 256 a pyramid has";
    let listed = infer_io::tiff::pages(&p).unwrap_err().to_string();
    assert!(
        listed.contains(says) && listed.contains("many.tif"),
        "{listed}"
    );
    for level in [1, 256, 9999] {
        let e = TiffRegions::open_level(&p, 0, level, 1 << 20)
            .err()
            .unwrap();
        assert_eq!(e.to_string(), listed, "level {level}");
    }
    let page0 = TiffRegions::open_level(&p, 0, 0, 1 << 20).unwrap();
    check_windows(&page0, |c, y, x| f32::from(px[(y * 16 + x) * 3 + c]));
}

/// A file laid out as a slide or a GeoTIFF with overviews: page 0 a 300×200 RGB image in 64×64 tiles,
/// page 1 a 150×100 RGB reduced page (NewSubfileType = 1) in LZW strips of 7 rows, page 2 a 1-channel
/// 16-bit page (no NewSubfileType) in Deflate strips of 16 rows.
fn multi_page<W: std::io::Write + std::io::Seek, K: TiffKind>(
    mut enc: TiffEncoder<W, K>,
    seed: u64,
) {
    tiled_rgb_page(&mut enc, (300, 200, 64), &rng_bytes(300 * 200 * 3, seed));
    let mut enc = enc.with_compression(Compression::Lzw);
    let mut img = enc.new_image::<colortype::RGB8>(150, 100).unwrap();
    img.encoder().write_tag(Tag::NewSubfileType, 1u32).unwrap();
    img.rows_per_strip(7).unwrap();
    img.write_data(&rng_bytes(150 * 100 * 3, seed + 1)).unwrap();
    let mut enc = enc.with_compression(Compression::Deflate(DeflateLevel::Fast));
    let mut g = SplitMix64::new(seed + 2);
    let px: Vec<u16> = (0..77 * 45).map(|_| (g.next_u64() >> 48) as u16).collect();
    let mut img = enc.new_image::<colortype::Gray16>(77, 45).unwrap();
    img.rows_per_strip(16).unwrap();
    img.write_data(&px).unwrap();
}

/// Page `page` decoded whole by the `tiff` crate, as floats in `C×H×W` order.
fn decode_page(path: &Path, page: usize) -> (usize, usize, usize, Vec<f32>) {
    let mut d = tiff::decoder::Decoder::new(std::fs::File::open(path).unwrap()).unwrap();
    d.seek_to_image(page).unwrap();
    let (w, h) = d.dimensions().unwrap();
    let (w, h) = (w as usize, h as usize);
    let v: Vec<f32> = match d.read_image().unwrap() {
        tiff::decoder::DecodingResult::U8(v) => v.into_iter().map(f32::from).collect(),
        tiff::decoder::DecodingResult::U16(v) => v.into_iter().map(f32::from).collect(),
        _ => panic!("unexpected sample type"),
    };
    let c = v.len() / (w * h);
    let mut out = vec![0.0; v.len()];
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                out[(ch * h + y) * w + x] = v[(y * w + x) * c + ch];
            }
        }
    }
    (c, h, w, out)
}

#[test]
fn every_page_of_a_multi_page_file_reads_as_that_page_decoded_whole() {
    let dir = tempfile::tempdir().unwrap();
    for big in [false, true] {
        let p = dir.path().join(format!("slide_{big}.tif"));
        let f = std::fs::File::create(&p).unwrap();
        if big {
            multi_page(TiffEncoder::new_big(f).unwrap(), 7);
        } else {
            multi_page(TiffEncoder::new(f).unwrap(), 7);
        }
        // Page 0 holds the pixels it was written with (the hand-written tiles are right).
        let (_, _, _, whole0) = decode_page(&p, 0);
        let px0 = rng_bytes(300 * 200 * 3, 7);
        for (i, v) in whole0.iter().enumerate() {
            let (c, y, x) = (i / (200 * 300), i / 300 % 200, i % 300);
            assert_eq!(*v, f32::from(px0[(y * 300 + x) * 3 + c]));
        }
        let expect = [
            (3, 200, 300, true),
            (3, 100, 150, false),
            (1, 45, 77, false),
        ];
        for (page, &(c, h, w, tiled)) in expect.iter().enumerate() {
            let (dc, dh, dw, whole) = decode_page(&p, page);
            assert_eq!((dc, dh, dw), (c, h, w));
            // A small cache: chunks are decoded again as the windows move.
            let r = TiffRegions::open_page(&p, page, 1 << 12).unwrap();
            assert_eq!(r.page(), page);
            assert_eq!((r.channels(), r.height(), r.width()), (c, h, w));
            assert_eq!(r.is_tiled(), tiled);
            check_windows(&r, |ch, y, x| whole[(ch * h + y) * w + x]);
            // Windows read from four threads at once: decoders opened for them land on the same page.
            std::thread::scope(|s| {
                for t in 0..4usize {
                    let (r, whole) = (&r, &whole);
                    s.spawn(move || {
                        for y0 in (t..h).step_by(4 * 7) {
                            let ys: Vec<Option<usize>> = (y0..(y0 + 7).min(h)).map(Some).collect();
                            let xs: Vec<Option<usize>> = (0..w).step_by(3).map(Some).collect();
                            let got = gather(r, &ys, &xs).unwrap();
                            for ch in 0..c {
                                for (iy, y) in ys.iter().enumerate() {
                                    for (ix, x) in xs.iter().enumerate() {
                                        let want = whole[(ch * h + y.unwrap()) * w + x.unwrap()];
                                        assert_eq!(got.at(ch, iy, ix), want);
                                    }
                                }
                            }
                        }
                    });
                }
            });
        }
        // `open` is page 0.
        let r = TiffRegions::open(&p, 1 << 20).unwrap();
        assert_eq!((r.page(), r.width(), r.height()), (0, 300, 200));
    }
}

#[test]
fn pages_are_listed_from_their_tags() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("slide.tif");
    multi_page(
        TiffEncoder::new(std::fs::File::create(&p).unwrap()).unwrap(),
        3,
    );
    let pages = infer_io::tiff::pages(&p).unwrap();
    let page = |index, (width, height), spp, bits, st, tiled, (cw, ch), reduced| PageInfo {
        index,
        level: 0,
        width,
        height,
        samples_per_pixel: spp,
        bits_per_sample: bits,
        sample_format: 1,
        sample_type: Some(st),
        tiled,
        chunk_width: cw,
        chunk_height: ch,
        reduced,
    };
    assert_eq!(
        pages,
        [
            page(
                0,
                (300, 200),
                3,
                8,
                SampleType::U8,
                true,
                (64, 64),
                Some(false)
            ),
            page(
                1,
                (150, 100),
                3,
                8,
                SampleType::U8,
                false,
                (150, 7),
                Some(true)
            ),
            page(2, (77, 45), 1, 16, SampleType::U16, false, (77, 16), None),
        ]
    );
    assert_eq!(
        pages[1].to_string(),
        "page 1: 150x100, 3 channels, u8, striped 150x7, reduced"
    );
    assert_eq!(
        pages[2].to_string(),
        "page 2: 77x45, 1 channel, u16, striped 77x16, no NewSubfileType"
    );
    // A single-page file: one page.
    let one = dir.path().join("one.tif");
    striped::<colortype::Gray8>(&one, false, Compression::Uncompressed, (5, 4, 2), &[0; 20]);
    assert_eq!(infer_io::tiff::pages(&one).unwrap().len(), 1);
}

#[test]
fn a_page_the_file_lacks_is_a_typed_error_with_the_page_count() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("three.tif");
    multi_page(
        TiffEncoder::new(std::fs::File::create(&p).unwrap()).unwrap(),
        5,
    );
    for asked in [3usize, 4, 1000] {
        match TiffRegions::open_page(&p, asked, 1 << 20) {
            Err(e @ infer_io::Error::NoSuchPage { .. }) => {
                let text = e.to_string();
                let infer_io::Error::NoSuchPage { path, page, pages } = e else {
                    unreachable!()
                };
                assert_eq!((path, page, pages), (p.clone(), asked, 3));
                assert!(
                    text.contains("three.tif")
                        && text.contains(&format!("no page {asked}"))
                        && text.contains("3 pages"),
                    "{text}"
                );
            }
            Err(e) => panic!("page {asked}: {e}"),
            Ok(_) => panic!("page {asked} opened"),
        }
    }
    // A single-page file: one page, said in the singular.
    let one = dir.path().join("one.tif");
    striped::<colortype::Gray8>(&one, true, Compression::Uncompressed, (5, 4, 2), &[0; 20]);
    let e = TiffRegions::open_page(&one, 1, 1 << 20)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("one.tif") && e.contains("1 page") && !e.contains("1 pages"),
        "{e}"
    );
}
