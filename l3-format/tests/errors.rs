//! Every malformed-input case gets its own error variant, never a panic.

use l3_format::{Error, HEADER_LEN, L3File, Limits, decode_patch, encode};
use proptest::prelude::*;

/// A 70×45 RGB image with N = 32: 3×2 patches per channel, non-constant content.
fn valid() -> Vec<u8> {
    let (w, h) = (70usize, 45usize);
    let px: Vec<u8> = (0..w * h * 3)
        .map(|i| ((i * 7) % 251) as u8 ^ (i / 97) as u8)
        .collect();
    encode(&px, w as u32, h as u32, 3, 32).unwrap()
}

fn parse_err(bytes: &[u8]) -> Error {
    L3File::parse(bytes).unwrap_err()
}

fn decode_err(bytes: &[u8]) -> Error {
    let f = L3File::parse(bytes).expect("header and offsets are valid");
    let mut out = vec![0u8; f.decoded_len()];
    let e = f.decode_hwc(&mut out).unwrap_err();
    assert_eq!(f.decode_chw(&mut out).unwrap_err(), e);
    assert_eq!(f.decode_hwc_parallel(&mut out, 2).unwrap_err(), e);
    e
}

fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

const TABLE: usize = HEADER_LEN;

#[test]
fn valid_file_decodes() {
    let b = valid();
    let f = L3File::parse(&b).unwrap();
    assert_eq!((f.patches_x(), f.patches_y(), f.channels()), (3, 2, 3));
    let mut out = vec![0u8; f.decoded_len()];
    f.decode_hwc(&mut out).unwrap();
}

#[test]
fn truncated() {
    let b = valid();
    assert!(matches!(
        parse_err(&b[..10]),
        Error::Truncated { what: "header", .. }
    ));
    assert!(matches!(
        parse_err(&b[..HEADER_LEN + 7]),
        Error::Truncated {
            what: "offset table",
            ..
        }
    ));
    assert!(matches!(parse_err(&[]), Error::Truncated { .. }));
}

#[test]
fn bad_magic() {
    let mut b = valid();
    b[0] = b'X';
    assert!(matches!(parse_err(&b), Error::BadMagic { .. }));
    assert!(matches!(parse_err(b"PNG"), Error::BadMagic { .. }));
}

#[test]
fn wrong_version() {
    let mut b = valid();
    b[4] = 3;
    assert_eq!(parse_err(&b), Error::UnsupportedVersion { found: 3 });
}

#[test]
fn zero_dimensions() {
    let mut b = valid();
    set_u32(&mut b, 6, 0);
    assert!(matches!(
        parse_err(&b),
        Error::ZeroDimension { width: 0, .. }
    ));
    let mut b = valid();
    set_u32(&mut b, 10, 0);
    assert!(matches!(
        parse_err(&b),
        Error::ZeroDimension { height: 0, .. }
    ));
}

#[test]
fn absurd_dimensions_overflow_and_limit() {
    let mut b = valid();
    set_u32(&mut b, 6, u32::MAX);
    set_u32(&mut b, 10, u32::MAX);
    b[14] = 4; // W·H·C overflows u64
    assert!(matches!(parse_err(&b), Error::TooLarge { .. }));
    let b = valid();
    let small = Limits {
        max_pixels: 70 * 45 * 3 - 1,
    };
    assert!(matches!(
        L3File::parse_with_limits(&b, &small),
        Err(Error::TooLarge { .. })
    ));
    let exact = Limits {
        max_pixels: 70 * 45 * 3,
    };
    assert!(L3File::parse_with_limits(&b, &exact).is_ok());
    // Large but within limits: the offset table cannot be there, so it is reported truncated, cheaply.
    let mut b = valid();
    set_u32(&mut b, 6, 30_000);
    set_u32(&mut b, 10, 30_000);
    b[16] = 1;
    assert!(matches!(
        parse_err(&b),
        Error::Truncated {
            what: "offset table",
            ..
        }
    ));
}

#[test]
fn bad_channels_and_depth() {
    let mut b = valid();
    b[14] = 2;
    assert_eq!(parse_err(&b), Error::BadChannels { found: 2 });
    let mut b = valid();
    b[15] = 16;
    assert_eq!(parse_err(&b), Error::BadBitDepth { found: 16 });
}

#[test]
fn patch_size_zero() {
    let mut b = valid();
    b[16] = 0;
    assert_eq!(parse_err(&b), Error::ZeroPatchSize);
}

#[test]
fn reserved_bytes() {
    let mut b = valid();
    b[18] = 1;
    assert_eq!(parse_err(&b), Error::ReservedNotZero);
}

#[test]
fn first_offset_not_zero() {
    let mut b = valid();
    set_u32(&mut b, TABLE, 1);
    assert_eq!(parse_err(&b), Error::FirstOffsetNotZero { offset: 1 });
}

#[test]
fn offsets_out_of_order() {
    let mut b = valid();
    let second = u32::from_le_bytes(b[TABLE + 4..TABLE + 8].try_into().unwrap());
    let third = u32::from_le_bytes(b[TABLE + 8..TABLE + 12].try_into().unwrap());
    set_u32(&mut b, TABLE + 4, third);
    set_u32(&mut b, TABLE + 8, second);
    assert!(matches!(parse_err(&b), Error::OffsetOutOfOrder { patch, .. } if patch.patch == 2));
}

#[test]
fn offset_out_of_range() {
    let mut b = valid();
    let data_len = L3File::parse(&b).unwrap().patch_data().len();
    set_u32(&mut b, TABLE + 4 * 17, data_len as u32 + 1); // the last entry (3 channels × 6 patches)
    assert!(matches!(parse_err(&b), Error::OffsetOutOfRange { .. }));
    let mut b = valid();
    set_u32(&mut b, TABLE + 4, u32::MAX);
    assert!(matches!(parse_err(&b), Error::OffsetOutOfRange { .. }));
}

#[test]
fn patch_too_short_for_its_rows() {
    let mut b = valid();
    set_u32(&mut b, TABLE + 4, 3); // patch 0 would have 3 bytes for 32 rows
    assert!(matches!(
        parse_err(&b),
        Error::PatchTooShort {
            rows: 32,
            len: 3,
            ..
        }
    ));
}

#[test]
fn nbit_above_eight() {
    let mut b = valid();
    let start = L3File::parse(&b).unwrap().data_offset();
    b[start] = (b[start] & 0xf0) | 9;
    assert!(matches!(
        decode_err(&b),
        Error::NbitTooLarge {
            nbit: 9,
            row: 0,
            ..
        }
    ));
}

#[test]
fn row_runs_past_patch() {
    // Black image: every row is 2 bytes (nbit 0); claiming nbit 8 makes row 0 need 2 + w bytes, more than
    // the patch has.
    let mut b = encode(&[0u8; 40 * 3], 40, 3, 1, 40).unwrap();
    let start = L3File::parse(&b).unwrap().data_offset();
    b[start] = (b[start] & 0xf0) | 8;
    assert!(matches!(
        decode_err(&b),
        Error::RowPastPatchEnd { row: 0, .. }
    ));
}

#[test]
fn trailing_bytes_in_patch() {
    let mut b = encode(&[0u8; 40 * 3], 40, 3, 1, 40).unwrap();
    b.push(0); // the last patch runs to the end of the file
    assert!(matches!(
        decode_err(&b),
        Error::TrailingPatchBytes { unused: 1, .. }
    ));
}

#[test]
fn output_buffer_size_and_patch_geometry() {
    let b = valid();
    let f = L3File::parse(&b).unwrap();
    let mut short = vec![0u8; f.decoded_len() - 1];
    assert!(matches!(
        f.decode_hwc(&mut short),
        Err(Error::BufferSize { .. })
    ));
    assert!(matches!(
        f.decode_chw_parallel(&mut short, 2),
        Err(Error::BufferSize { .. })
    ));
    let mut out = [0u8; 16];
    assert!(matches!(
        decode_patch(&[0, 0], 0, 1, &mut out, 1),
        Err(Error::BadPatchGeometry { .. })
    ));
    assert!(matches!(
        decode_patch(&[0, 0], 4, 1, &mut out, 3),
        Err(Error::BadPatchGeometry { .. })
    ));
    assert!(matches!(
        decode_patch(&[0, 0], 256, 1, &mut out, 256),
        Err(Error::BadPatchGeometry { .. })
    ));
    assert!(matches!(
        decode_patch(&[0, 0, 0, 0], 4, 2, &mut out[..5], 4),
        Err(Error::BufferSize { .. })
    ));
    assert!(decode_patch(&[0, 0, 0, 0], 4, 2, &mut out, 4).is_ok());
}

#[test]
fn encoder_rejects_bad_arguments() {
    assert!(matches!(
        encode(&[0; 3], 1, 1, 2, 8),
        Err(Error::BadChannels { .. })
    ));
    assert!(matches!(
        encode(&[0; 3], 1, 1, 3, 0),
        Err(Error::ZeroPatchSize)
    ));
    assert!(matches!(
        encode(&[0; 2], 1, 1, 3, 8),
        Err(Error::BufferSize { .. })
    ));
    assert!(matches!(
        encode(&[], 0, 1, 3, 8),
        Err(Error::ZeroDimension { .. })
    ));
}

/// Parses and, when the header is valid, decodes every way: must return, never panic.
fn exercise(bytes: &[u8]) {
    if let Ok(f) = L3File::parse(bytes) {
        let mut out = vec![0u8; f.decoded_len()];
        let a = f.decode_hwc(&mut out);
        let b = f.decode_chw(&mut out);
        let c = f.decode_hwc_parallel(&mut out, 2);
        assert_eq!(a.is_ok(), b.is_ok());
        assert_eq!(a.is_ok(), c.is_ok());
        for ch in 0..f.channels() as usize {
            for p in 0..f.patches_per_channel() {
                let r = f.patch_rect(p);
                let mut o = vec![0u8; (r.w * r.h) as usize];
                let _ = decode_patch(
                    f.patch_bytes(ch, p),
                    r.w as usize,
                    r.h as usize,
                    &mut o,
                    r.w as usize,
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    /// Random byte flips, truncations and extensions of a valid file (the no-nightly stand-in for fuzzing;
    /// `fuzz/` has the libFuzzer target).
    #[test]
    fn mutated_files_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                 cut in any::<prop::sample::Index>(), truncate in any::<bool>(),
                                 extra in prop::collection::vec(any::<u8>(), 0..4)) {
        let mut b = valid();
        for (i, v) in flips {
            let i = i.index(b.len());
            b[i] = v;
        }
        if truncate {
            b.truncate(cut.index(b.len() + 1));
        }
        b.extend(extra);
        exercise(&b);
    }

    #[test]
    fn random_bytes_after_a_plausible_header_never_panic(w in 1u32..80, h in 1u32..80, c in prop::sample::select(vec![1u8, 3, 4]),
                                                         n in 1u8..=255, body in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut b = b"L3IM".to_vec();
        b.extend(1u16.to_le_bytes());
        b.extend(w.to_le_bytes());
        b.extend(h.to_le_bytes());
        b.extend([c, 8, n, 0, 0, 0]);
        b.extend(body);
        exercise(&b);
    }
}
