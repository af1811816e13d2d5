//! The default format detects corruption wherever a file is read. A whole-file read checks the file's
//! CRC-32C and every entry's; a region read fetches only the prefix (header, tables, offset table, entry
//! CRCs and the prefix CRC) and the entries under a crop, and checks the prefix's CRC and each entry's
//! before decoding it (SPEC.md §2.11). Each case flips bits of a real corpus photo's file and reads it the
//! way the loader does (`L3Index::read_from`, `region_ranges`, `Fragments`, `decode_region`): a damaged
//! file must give a typed error, never pixels — for both version-2 profiles, though BP's rows alone would
//! decode most flipped residual bits into other pixels.

use l3_format::{
    DEFAULT_FORMAT, EncodeOptions, Error, Format, Fragments, L3File, L3Index, PixelLayout, Profile,
    Rect, encode_with,
};
use std::convert::Infallible;
use std::ops::Range;
use std::path::PathBuf;
use stdx::SplitMix64;

const FLIPS: usize = 30;
const CROP: u32 = 224;

/// Storm.jpg (1920×1280 RGB) from `$L3_CORPUS` or `../shared/corpus`.
fn photo() -> (Vec<u8>, u32, u32, u8) {
    let dir = std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"));
    let path = dir.join("Storm.jpg");
    let img =
        image::open(&path).unwrap_or_else(|e| panic!("{}: {e} (set L3_CORPUS)", path.display()));
    let (w, h) = (img.width(), img.height());
    (img.to_rgb8().into_raw(), w, h, 3)
}

fn file_of(px: &[u8], w: u32, h: u32, c: u8, format: Format) -> Vec<u8> {
    let opts = EncodeOptions {
        format,
        threads: 0,
        ..EncodeOptions::default()
    };
    let file = encode_with(px, w, h, c, &opts).unwrap();
    let f = L3File::parse(&file).unwrap();
    assert_eq!(f.format(), format);
    assert!(
        f.has_entry_crcs(),
        "the encoder writes entry CRCs by default"
    );
    file
}

/// The default format and the other version-2 profile.
const PROFILES: [Format; 2] = [DEFAULT_FORMAT, Format::V2(Profile::Bp)];

/// A region read as the loader makes it from byte ranges of `file`: the prefix, then only the crop's
/// ranges. Returns the crop's interleaved pixels, and the ranges it read after the prefix.
fn region_read(file: &[u8], crop: Rect) -> Result<(Vec<u8>, Vec<Range<u64>>), Error> {
    let index = L3Index::read_from(file.len() as u64, |r| {
        Ok::<_, Infallible>(file[r.start as usize..r.end as usize].to_vec())
    })?;
    let ranges = index.region_ranges(crop, 0)?;
    let mut read = Fragments::new();
    read.reset(&ranges);
    for (r, buf) in read.slices_mut() {
        buf.copy_from_slice(&file[r.start as usize..r.end as usize]);
    }
    let layout = PixelLayout::packed(crop.w, crop.h, index.channels(), false);
    let mut out = vec![0u8; crop.w as usize * crop.h as usize * index.channels() as usize];
    index.decode_region(&read, crop, &mut out, layout)?;
    Ok((out, ranges))
}

fn random_crop(rng: &mut SplitMix64, w: u32, h: u32) -> Rect {
    let x = rng.below((w - CROP + 1) as u64) as u32;
    let y = rng.below((h - CROP + 1) as u64) as u32;
    Rect::new(x, y, CROP, CROP)
}

/// Byte `k` of the concatenation of `ranges`, as a position in the file.
fn nth_byte(ranges: &[Range<u64>], mut k: u64) -> usize {
    for r in ranges {
        let len = r.end - r.start;
        if k < len {
            return (r.start + k) as usize;
        }
        k -= len;
    }
    unreachable!("k is below the ranges' total length")
}

fn flipped(file: &[u8], pos: usize, bit: u64) -> Vec<u8> {
    let mut damaged = file.to_vec();
    damaged[pos] ^= 1 << bit;
    damaged
}

#[test]
fn bit_flips_in_the_patches_a_crop_reads_are_errors_not_pixels() {
    let (px, w, h, c) = photo();
    for format in PROFILES {
        flips_in_crops(&px, w, h, c, format);
    }
}

fn flips_in_crops(px: &[u8], w: u32, h: u32, c: u8, format: Format) {
    let file = file_of(px, w, h, c, format);
    let mut rng = SplitMix64::new(24);
    for k in 0..FLIPS {
        let crop = random_crop(&mut rng, w, h);
        let (clean, ranges) = region_read(&file, crop).unwrap();
        let stride = w as usize * c as usize;
        for (row, got) in clean.chunks_exact(CROP as usize * c as usize).enumerate() {
            let at = (crop.y as usize + row) * stride + crop.x as usize * c as usize;
            assert_eq!(
                got,
                &px[at..at + got.len()],
                "clean crop {crop:?}, row {row}"
            );
        }
        let total: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        let pos = nth_byte(&ranges, rng.below(total));
        let bit = rng.below(8);
        let damaged = flipped(&file, pos, bit);
        match region_read(&damaged, crop) {
            Err(Error::EntryCrcMismatch { .. }) => {}
            Err(e) => {
                panic!("{format} flip {k}: bit {bit} of byte {pos}: {e}, not the entry's CRC")
            }
            Ok((got, _)) => panic!(
                "{format} flip {k}: bit {bit} of byte {pos} (a patch under {crop:?}) read as pixels, {}",
                if got == clean {
                    "the clean ones"
                } else {
                    "wrong ones"
                }
            ),
        }
        // A whole-file read of the same bytes fails on the checksums before any decoding, naming the entry.
        assert!(
            matches!(L3File::parse(&damaged), Err(Error::EntryCrcMismatch { .. })),
            "{format} flip {k}: whole-file parse of byte {pos} bit {bit}"
        );
    }
}

/// Every single bit of every byte a crop reads, flipped one at a time: each is an error. (A small image
/// and crop, so that the tens of thousands of region reads stay quick in a debug build.)
#[test]
fn every_bit_flip_in_a_small_crops_bytes_is_an_error() {
    let (px, w, _, c) = photo();
    // The photo's top-left 64×64 pixels, patches of 32: the crop meets two patches of each plane.
    let (sw, sh) = (64u32, 64u32);
    let row = w as usize * c as usize;
    let small: Vec<u8> = (0..sh as usize)
        .flat_map(|y| px[y * row..y * row + sw as usize * c as usize].to_vec())
        .collect();
    let crop = Rect::new(20, 40, 30, 20);
    for format in PROFILES {
        let opts = EncodeOptions {
            format,
            patch_size: Some(32),
            ..EncodeOptions::default()
        };
        let mut file = encode_with(&small, sw, sh, c, &opts).unwrap();
        let (_, ranges) = region_read(&file, crop).unwrap();
        let mut flips = 0;
        for r in &ranges {
            for pos in r.start as usize..r.end as usize {
                for bit in 0..8 {
                    file[pos] ^= 1 << bit;
                    let got = region_read(&file, crop);
                    file[pos] ^= 1 << bit;
                    assert!(
                        matches!(got, Err(Error::EntryCrcMismatch { .. })),
                        "{format}: bit {bit} of byte {pos}: {:?}",
                        got.map(|_| "pixels")
                    );
                    flips += 1;
                }
            }
        }
        eprintln!("{format}: {flips} single-bit flips, every one an error");
        assert!(flips >= 8 * 1000, "{format}: only {flips} flips");
    }
}

/// A file written without entry CRCs (every version-2 file before them, the conformance vectors) still
/// reads through an index, and has its structural checks only.
#[test]
fn files_without_entry_crcs_still_read_by_region() {
    let (px, w, h, c) = photo();
    for format in PROFILES {
        let opts = EncodeOptions {
            format,
            entry_crcs: false,
            threads: 0,
            ..EncodeOptions::default()
        };
        let file = encode_with(&px, w, h, c, &opts).unwrap();
        let with = file_of(&px, w, h, c, format);
        assert!(!L3File::parse(&file).unwrap().has_entry_crcs());
        assert!(file.len() < with.len());
        let crop = Rect::new(300, 200, CROP, CROP);
        let (a, _) = region_read(&file, crop).unwrap();
        let (b, _) = region_read(&with, crop).unwrap();
        assert!(
            a == b,
            "{format}: the same pixels with and without entry CRCs"
        );
    }
}

#[test]
fn bit_flips_in_the_prefix_a_region_read_uses_are_errors() {
    let (px, w, h, c) = photo();
    let file = file_of(&px, w, h, c, DEFAULT_FORMAT);
    let data_offset = L3Index::read_from(file.len() as u64, |r| {
        Ok::<_, Infallible>(file[r.start as usize..r.end as usize].to_vec())
    })
    .unwrap()
    .data_offset();
    let mut rng = SplitMix64::new(7);
    let mut refused = 0;
    for k in 0..FLIPS {
        let crop = random_crop(&mut rng, w, h);
        let (clean, _) = region_read(&file, crop).unwrap();
        let pos = rng.below(data_offset) as usize;
        let bit = rng.below(8);
        // A flip in the header, the tables, the offset table or the entry CRCs is refused: by the header's
        // own checks, or by the prefix CRC.
        match region_read(&flipped(&file, pos, bit), crop) {
            Err(_) => refused += 1,
            Ok((got, _)) => panic!(
                "flip {k}: bit {bit} of prefix byte {pos} read as {} pixels for {crop:?}",
                if got == clean { "the clean" } else { "other" }
            ),
        }
    }
    assert_eq!(refused, FLIPS);
}
