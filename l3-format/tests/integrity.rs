//! The default format detects corruption wherever a file is read. A whole-file read checks the CRC-32C; a
//! region read fetches only the prefix (header, tables, offset table) and the chunks under a crop, which no
//! whole-file checksum can cover, so what it decodes must check itself. Each case flips one seeded bit of a
//! real corpus photo's file and reads it the way the loader does (`L3Index::next_read`, `region_ranges`,
//! `Fragments`, `decode_region`): a damaged file must give a typed error, never other pixels. (Version 1,
//! the default before, returned pixels for the first flip; the ANS chunk checks are structural, not a
//! checksum, and let a fraction of a percent of flips through — README.md, "Choosing the default" — which
//! these seeded cases do not hit.)

use l3_format::{
    DEFAULT_FORMAT, EncodeOptions, Error, Fragments, L3File, L3Index, PixelLayout, Rect,
    encode_with,
};
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

fn default_file(px: &[u8], w: u32, h: u32, c: u8) -> Vec<u8> {
    let opts = EncodeOptions {
        threads: 0,
        ..EncodeOptions::default()
    };
    let file = encode_with(px, w, h, c, &opts).unwrap();
    assert_eq!(L3File::parse(&file).unwrap().format(), DEFAULT_FORMAT);
    file
}

/// A region read as the loader makes it from byte ranges of `file`: the prefix, then only the crop's
/// ranges. Returns the crop's interleaved pixels, and the ranges it read after the prefix.
fn region_read(file: &[u8], crop: Rect) -> Result<(Vec<u8>, Vec<Range<u64>>), Error> {
    let mut prefix = Vec::new();
    while let Some(r) = L3Index::next_read(&prefix, file.len() as u64)? {
        prefix.extend_from_slice(&file[r.start as usize..r.end as usize]);
    }
    let index = L3Index::parse(&prefix, file.len() as u64)?;
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
    let file = default_file(&px, w, h, c);
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
            Err(_) => {}
            Ok((got, _)) => panic!(
                "flip {k}: bit {bit} of byte {pos} (a patch under {crop:?}) read as pixels, {}",
                if got == clean {
                    "the clean ones"
                } else {
                    "wrong ones"
                }
            ),
        }
        // A whole-file read of the same bytes fails on the checksum before any decoding.
        assert!(
            matches!(L3File::parse(&damaged), Err(Error::CrcMismatch { .. })),
            "flip {k}: whole-file parse of byte {pos} bit {bit}"
        );
    }
}

#[test]
fn bit_flips_in_the_prefix_a_region_read_uses_never_give_other_pixels() {
    let (px, w, h, c) = photo();
    let file = default_file(&px, w, h, c);
    let mut prefix = Vec::new();
    while let Some(r) = L3Index::next_read(&prefix, file.len() as u64).unwrap() {
        prefix.extend_from_slice(&file[r.start as usize..r.end as usize]);
    }
    let data_offset = L3Index::parse(&prefix, file.len() as u64)
        .unwrap()
        .data_offset();
    let mut rng = SplitMix64::new(7);
    let mut refused = 0;
    for k in 0..FLIPS {
        let crop = random_crop(&mut rng, w, h);
        let (clean, _) = region_read(&file, crop).unwrap();
        let pos = rng.below(data_offset) as usize;
        let bit = rng.below(8);
        // A flip in the header, the tables or an entry of the offset table either makes the read fail or
        // leaves every byte the crop decodes from as it was (an offset of a patch the crop does not read).
        match region_read(&flipped(&file, pos, bit), crop) {
            Err(_) => refused += 1,
            Ok((got, _)) => assert!(
                got == clean,
                "flip {k}: bit {bit} of prefix byte {pos} gave other pixels for {crop:?}"
            ),
        }
    }
    // Most of the prefix is the header and tables every read depends on, so most flips are refused.
    assert!(
        refused > FLIPS / 2,
        "only {refused} of {FLIPS} prefix flips refused"
    );
}
