//! Every malformed version-2 input gets its own typed error, never a panic. Files are built by hand from the
//! spec (header, tables, offsets, data, CRC) so that each case breaks exactly one rule; the CRC is made
//! right again after each change unless the case is about the CRC.

use l3_format::{
    Choices, EncodeOptions, Error, Format, Fragments, L3File, L3Index, Limits, ParseOptions,
    PixelLayout, Profile, Rect, crc32c, encode_with,
};
use proptest::prelude::*;

/// LSB-first bit writer with Exp-Golomb codes, as SPEC.md describes the table bitstream.
#[derive(Default)]
struct Bits {
    bytes: Vec<u8>,
    n: usize,
}

impl Bits {
    fn put(&mut self, v: u32, bits: usize) {
        for i in 0..bits {
            if self.n.is_multiple_of(8) {
                self.bytes.push(0);
            }
            if (v >> i) & 1 == 1 {
                *self.bytes.last_mut().unwrap() |= 1 << (self.n % 8);
            }
            self.n += 1;
        }
    }
    fn eg0(&mut self, v: u32) {
        let x = v + 1;
        let len = 32 - x.leading_zeros() as usize;
        self.put(0, len - 1);
        for i in (0..len).rev() {
            self.put((x >> i) & 1, 1);
        }
    }
}

/// Table bitstream: `used[ctx] = Some(freqs)`.
fn tables(contexts: usize, used: &[(usize, &[u32])]) -> Vec<u8> {
    let mut b = Bits::default();
    for ctx in 0..contexts {
        match used.iter().find(|(c, _)| *c == ctx) {
            None => b.put(0, 1),
            Some((_, f)) => {
                b.put(1, 1);
                b.put(f.len() as u32 - 1, 8);
                for &v in f.iter() {
                    b.eg0(v);
                }
            }
        }
    }
    b.bytes
}

fn header(w: u32, h: u32, c: u8, n: u8, profile: u8) -> Vec<u8> {
    let mut v = b"L3IM".to_vec();
    v.extend(2u16.to_le_bytes());
    v.extend(w.to_le_bytes());
    v.extend(h.to_le_bytes());
    v.extend([c, 8, n, profile, 0, 0]);
    v
}

/// Header, tables, offsets from the file start, entries, CRC.
fn assemble(head: Vec<u8>, tables: &[u8], entries: &[Vec<u8>]) -> Vec<u8> {
    let mut f = head;
    f.extend_from_slice(tables);
    let mut at = f.len() + 4 * entries.len();
    for e in entries {
        f.extend((at as u32).to_le_bytes());
        at += e.len();
    }
    for e in entries {
        f.extend_from_slice(e);
    }
    fix_crc_append(&mut f);
    f
}

fn fix_crc_append(f: &mut Vec<u8>) {
    let crc = crc32c(f);
    f.extend(crc.to_le_bytes());
}

/// Recomputes the trailing CRC after an edit.
fn fix_crc(f: &mut [u8]) {
    let n = f.len() - 4;
    let crc = crc32c(&f[..n]);
    f[n..].copy_from_slice(&crc.to_le_bytes());
}

fn states(v: u32) -> Vec<u8> {
    (0..32).flat_map(|_| v.to_le_bytes()).collect()
}

/// A black 1×1 RGB v2-ANS file: contexts 8 (plane 0, row 0), 49 and 94 (planes 1 and 2, row 0, z0 = 0),
/// each with the single symbol 0 at f = 4096, so the lanes never move and no word is needed.
fn ans_1x1(used: &[(usize, &[u32])], state: u32) -> Vec<u8> {
    assemble(header(1, 1, 3, 32, 1), &tables(102, used), &[states(state)])
}

const BLACK: [(usize, &[u32]); 3] = [(8, &[4096]), (49, &[4096]), (94, &[4096])];

fn parse_err(b: &[u8]) -> Error {
    L3File::parse(b).unwrap_err()
}

fn decode_err(b: &[u8]) -> Error {
    let f = L3File::parse(b).expect("the container is valid");
    let mut out = vec![0u8; f.decoded_len()];
    let e = f.decode_hwc(&mut out).unwrap_err();
    assert_eq!(f.decode_chw(&mut out).unwrap_err(), e);
    assert_eq!(f.decode_hwc_parallel(&mut out, 2).unwrap_err(), e);
    let r = Rect::new(0, 0, f.width(), f.height());
    let l = PixelLayout::packed(r.w, r.h, f.channels(), false);
    assert_eq!(f.decode_region(r, &mut out, l).unwrap_err(), e);
    e
}

fn encoded(profile: Profile, w: u32, h: u32, c: u8, n: u8) -> Vec<u8> {
    let px: Vec<u8> = (0..w * h * c as u32)
        .map(|i| ((i * 7) % 251) as u8 ^ (i / 97) as u8)
        .collect();
    let opts = EncodeOptions {
        format: Format::V2(profile),
        patch_size: Some(n),
        threads: 1,
        choices: Choices::Reference,
        entry_crcs: false,
    };
    encode_with(&px, w, h, c, &opts).unwrap()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn hand_built_file_is_valid() {
    let f = ans_1x1(&BLACK, 0x10000);
    let l = L3File::parse(&f).unwrap();
    let mut out = [9u8; 3];
    l.decode_hwc(&mut out).unwrap();
    assert_eq!(out, [0, 0, 0]);
}

#[test]
fn header_classes() {
    let good = ans_1x1(&BLACK, 0x10000);
    let edit = |i: usize, v: u8| {
        let mut b = good.clone();
        b[i] = v;
        fix_crc(&mut b);
        parse_err(&b)
    };
    assert_eq!(edit(17, 2), Error::BadProfile { found: 2 });
    assert_eq!(edit(16, 48), Error::BadPatchSize { found: 48 });
    assert_eq!(edit(16, 0), Error::BadPatchSize { found: 0 });
    assert_eq!(edit(18, 2), Error::UnknownFlags { found: 2 });
    assert_eq!(edit(19, 1), Error::ReservedNotZero);
    // The entry-CRC flag on a file without the tables: its first offset is no longer where it must be.
    assert!(matches!(edit(18, 1), Error::FirstOffsetMisplaced { .. }));
    assert_eq!(edit(14, 2), Error::BadChannels { found: 2 });
    assert_eq!(edit(15, 16), Error::BadBitDepth { found: 16 });
    assert_eq!(edit(4, 3), Error::UnsupportedVersion { found: 3 });
    assert!(matches!(edit(0, b'X'), Error::BadMagic { .. }));
    assert!(matches!(edit(6, 0), Error::ZeroDimension { .. }));
    let small = Limits { max_pixels: 2 };
    assert!(matches!(
        L3File::parse_with_limits(&good, &small),
        Err(Error::TooLarge { .. })
    ));
}

#[test]
fn crc_mismatch_and_opt_out() {
    let mut b = encoded(Profile::Bp, 70, 45, 3, 32);
    let at = b.len() / 2;
    b[at] ^= 1;
    assert!(matches!(parse_err(&b), Error::CrcMismatch { .. }));
    let no_crc = ParseOptions {
        verify_crc: false,
        ..Default::default()
    };
    assert!(
        L3File::parse_with(&b, &no_crc).is_ok(),
        "the opt-out skips the checksum"
    );
    // The CRC itself damaged.
    let mut b = encoded(Profile::Ans, 70, 45, 3, 32);
    let n = b.len();
    b[n - 1] ^= 0x80;
    assert!(matches!(parse_err(&b), Error::CrcMismatch { .. }));
}

#[test]
fn truncated_classes() {
    let good = encoded(Profile::Ans, 70, 45, 3, 32);
    // Shorter than header + CRC.
    let mut b = good[..22].to_vec();
    assert!(matches!(
        L3File::parse_with(
            &b,
            &ParseOptions {
                verify_crc: false,
                ..Default::default()
            }
        ),
        Err(Error::Truncated { what: "CRC", .. })
    ));
    b.truncate(10);
    assert!(matches!(
        parse_err(&b),
        Error::Truncated { what: "header", .. }
    ));
    // The tables cut short: the file ends (CRC after it) inside them.
    let mut b = good[..40].to_vec();
    fix_crc_append(&mut b);
    assert!(matches!(
        parse_err(&b),
        Error::Truncated {
            what: "frequency tables",
            ..
        }
    ));
    // BP: the offset table cut short.
    let bp = encoded(Profile::Bp, 70, 45, 3, 32);
    let mut b = bp[..20 + 4 * 5].to_vec();
    fix_crc_append(&mut b);
    assert!(matches!(
        parse_err(&b),
        Error::Truncated {
            what: "offset table",
            ..
        }
    ));
}

#[test]
fn table_classes() {
    assert_eq!(
        parse_err(&ans_1x1(
            &[(8, &[4095]), (49, &[4096]), (94, &[4096])],
            0x10000
        )),
        Error::FrequencySum {
            context: 8,
            sum: 4095
        }
    );
    assert_eq!(
        parse_err(&ans_1x1(
            &[(8, &[4096, 1]), (49, &[4096]), (94, &[4096])],
            0x10000
        )),
        Error::FrequencySum {
            context: 8,
            sum: 4097
        }
    );
    // A code with 13 leading zeros (a value of at least 8191) cannot be a frequency.
    assert_eq!(
        parse_err(&ans_1x1(
            &[(8, &[8191]), (49, &[4096]), (94, &[4096])],
            0x10000
        )),
        Error::FrequencyCode { context: 8 }
    );
    assert_eq!(
        parse_err(&ans_1x1(
            &[
                (8, &[4096]),
                (49, &[4096]),
                (94, &[4096]),
                (99, &[4000, 32, 32, 16, 16])
            ],
            0x10000
        )),
        Error::SelectorOutOfRange {
            context: 99,
            symbols: 5
        }
    );
}

#[test]
fn rans_classes() {
    assert_eq!(
        decode_err(&ans_1x1(&BLACK, 0xffff)),
        Error::RansStateOutOfRange {
            patch: l3_format::PatchId {
                channel: 0,
                patch: 0
            },
            lane: 0,
            state: 0xffff
        }
    );
    assert!(matches!(
        decode_err(&ans_1x1(&BLACK, 0x10001)),
        Error::RansFinalState {
            lane: 0,
            state: 0x10001,
            ..
        }
    ));
    // Context 94 (plane 2) has no table.
    assert!(matches!(
        decode_err(&ans_1x1(&[(8, &[4096]), (49, &[4096])], 0x10000)),
        Error::UnusedContext { context: 94, .. }
    ));
    // A chunk that is not 128 bytes plus whole words.
    let mut chunk = states(0x10000);
    chunk.push(0);
    let b = assemble(header(1, 1, 3, 32, 1), &tables(102, &BLACK), &[chunk]);
    assert!(matches!(parse_err(&b), Error::ChunkLength { len: 129, .. }));
    let b = assemble(header(1, 1, 3, 32, 1), &tables(102, &BLACK), &[vec![0; 64]]);
    assert!(matches!(parse_err(&b), Error::ChunkLength { len: 64, .. }));
    // A word left over.
    let mut chunk = states(0x10000);
    chunk.extend([1, 2]);
    let b = assemble(header(1, 1, 3, 32, 1), &tables(102, &BLACK), &[chunk]);
    assert!(matches!(
        decode_err(&b),
        Error::TrailingPatchBytes { unused: 2, .. }
    ));
    // Words missing at the end of a real chunk.
    let good = encoded(Profile::Ans, 70, 45, 3, 32);
    let mut b = good[..good.len() - 6].to_vec();
    fix_crc_append(&mut b);
    assert!(matches!(
        decode_err(&b),
        Error::RansPastChunkEnd { .. } | Error::RansFinalState { .. }
    ));
}

#[test]
fn offset_classes() {
    let good = encoded(Profile::Bp, 70, 45, 3, 32); // 3 planes x 6 patches = 18 entries
    let first = 20 + 4 * 18;
    let mut b = good.clone();
    set_u32(&mut b, 20, first as u32 + 4);
    fix_crc(&mut b);
    assert_eq!(
        parse_err(&b),
        Error::FirstOffsetMisplaced {
            offset: first as u32 + 4,
            expected: first as u64
        }
    );
    let mut b = good.clone();
    let (o1, o2) = (u32_at(&b, 24), u32_at(&b, 28));
    set_u32(&mut b, 24, o2);
    set_u32(&mut b, 28, o1);
    fix_crc(&mut b);
    assert!(matches!(parse_err(&b), Error::OffsetOutOfOrder { .. }));
    let mut b = good.clone();
    set_u32(&mut b, 20 + 4 * 17, (good.len() - 3) as u32);
    fix_crc(&mut b);
    assert!(matches!(parse_err(&b), Error::OffsetOutOfRange { .. }));
    // Entry 0 emptied: too short for its rows.
    let mut b = good.clone();
    set_u32(&mut b, 24, first as u32);
    fix_crc(&mut b);
    assert!(matches!(parse_err(&b), Error::PatchTooShort { len: 0, .. }));
    // The same for ANS chunks.
    let good = encoded(Profile::Ans, 70, 45, 3, 32);
    let f = L3File::parse(&good).unwrap();
    let at = f.data_offset() - 4 * 6;
    let mut b = good.clone();
    set_u32(&mut b, at + 4, u32_at(&good, at + 8) + 2);
    fix_crc(&mut b);
    assert!(matches!(parse_err(&b), Error::OffsetOutOfOrder { .. }));
}

/// An 8×2 gray BP file with one patch: row 0 is all zero (nbit 0); `row1` is the second row's bytes.
fn bp_8x2(row1: &[u8]) -> Vec<u8> {
    let mut entry = vec![0x00];
    entry.extend_from_slice(row1);
    assemble(header(8, 2, 1, 32, 0), &[], &[entry])
}

#[test]
fn bp_row_classes() {
    // Selector 0 (2 bits), code 0 (same nbit 0): valid, all zero.
    let f = bp_8x2(&[0x00]);
    let mut out = [7u8; 16];
    L3File::parse(&f).unwrap().decode_hwc(&mut out).unwrap();
    assert_eq!(out, [0; 16]);
    // Code 2 (−1) from nbit 0.
    assert!(matches!(
        decode_err(&bp_8x2(&[0b1000])),
        Error::BadNbit {
            row: 1,
            group: 0,
            nbit: -1,
            ..
        }
    ));
    // Escape (code 3) to 9.
    assert!(matches!(
        decode_err(&bp_8x2(&[0b1100 | (9 << 4)])),
        Error::BadNbit {
            row: 1,
            group: 0,
            nbit: 9,
            ..
        }
    ));
    // Row 0 declaring nbit 9.
    let b = assemble(header(8, 2, 1, 32, 0), &[], &[vec![0x09, 0x00]]);
    assert!(matches!(
        decode_err(&b),
        Error::BadNbit {
            row: 0,
            nbit: 9,
            ..
        }
    ));
    // Escape to 8: the row needs 64 bits of deltas it does not have.
    assert!(matches!(
        decode_err(&bp_8x2(&[0b1100 | (8 << 4)])),
        Error::RowPastPatchEnd { row: 1, .. }
    ));
    // A byte left over.
    assert!(matches!(
        decode_err(&bp_8x2(&[0x00, 0x00])),
        Error::TrailingPatchBytes { unused: 1, .. }
    ));
}

#[test]
fn encoder_options_are_checked() {
    let px = vec![0u8; 10 * 10 * 3];
    let v2 = |n| EncodeOptions {
        format: Format::V2(Profile::Ans),
        patch_size: Some(n),
        ..EncodeOptions::default()
    };
    assert_eq!(
        encode_with(&px, 10, 10, 3, &v2(48)),
        Err(Error::BadPatchSize { found: 48 })
    );
    assert_eq!(
        encode_with(&px, 10, 10, 3, &v2(0)),
        Err(Error::ZeroPatchSize)
    );
    assert!(matches!(
        encode_with(&px, 10, 10, 2, &v2(32)),
        Err(Error::BadChannels { .. })
    ));
    assert!(matches!(
        encode_with(&px[1..], 10, 10, 3, &v2(32)),
        Err(Error::BufferSize { .. })
    ));
}

#[test]
fn index_rejects_what_parse_rejects_and_names_missing_bytes() {
    for profile in [Profile::Bp, Profile::Ans] {
        let good = encoded(profile, 100, 70, 3, 32);
        let n = L3Index::prefix_len(&good).unwrap();
        assert!(n <= good.len());
        let idx = L3Index::parse(&good[..n], good.len() as u64).unwrap();
        let r = Rect::new(40, 20, 30, 30);
        let mut out = vec![0u8; 30 * 30 * 3];
        let l = PixelLayout::packed(30, 30, 3, false);
        assert!(matches!(
            idx.decode_region(&Fragments::new(), r, &mut out, l),
            Err(Error::MissingBytes { .. })
        ));
        // The prefix cut short.
        assert!(L3Index::parse(&good[..n - 1], good.len() as u64).is_err());
        // A damaged offset: the same error from both readers.
        let mut bad = good.clone();
        set_u32(&mut bad, n - 8, u32::MAX);
        fix_crc(&mut bad);
        assert_eq!(
            L3Index::parse(&bad[..n], bad.len() as u64).unwrap_err(),
            parse_err(&bad)
        );
    }
    // Under the header length the index asks for the header.
    assert_eq!(L3Index::prefix_len(b"L3I"), Ok(20));
    assert!(matches!(
        L3Index::prefix_len(b"PNG"),
        Err(Error::BadMagic { .. })
    ));
    // An ANS prefix asks for more until its tables are in.
    let ans = encoded(Profile::Ans, 300, 300, 3, 32);
    let n = L3Index::prefix_len(&ans[..20]).unwrap();
    assert!(n > 20);
    let exact = L3Index::prefix_len(&ans).unwrap();
    assert_eq!(L3Index::prefix_len(&ans[..exact]).unwrap(), exact);
}

/// Parses (with and without the CRC check) and decodes every way: must return, never panic.
fn exercise(bytes: &[u8]) {
    for verify_crc in [true, false] {
        let opts = ParseOptions {
            limits: Limits {
                max_pixels: 1 << 20,
            },
            verify_crc,
        };
        if let Ok(f) = L3File::parse_with(bytes, &opts) {
            let mut out = vec![0u8; f.decoded_len()];
            let a = f.decode_hwc(&mut out);
            let b = f.decode_chw(&mut out);
            let c = f.decode_hwc_parallel(&mut out, 2);
            assert_eq!(a, b);
            // Several bands may fail at once on several threads: which error wins is a race.
            assert_eq!(a.is_ok(), c.is_ok());
            let _ = f.v2_plan();
        }
    }
    if let Ok(n) = L3Index::prefix_len(bytes)
        && n <= bytes.len()
        && let Ok(idx) = L3Index::parse(&bytes[..n], bytes.len() as u64)
    {
        let r = Rect::new(0, 0, idx.width().min(40), idx.height().min(40));
        let l = PixelLayout::packed(r.w, r.h, idx.channels(), true);
        if let (Some(len), Ok(ranges)) = (
            l.required_len(r.w, r.h, idx.channels()),
            idx.region_ranges(r, 64),
        ) {
            let mut frags = Fragments::new();
            frags.reset(&ranges);
            for (range, s) in frags.slices_mut() {
                s.copy_from_slice(&bytes[range.start as usize..range.end as usize]);
            }
            let mut out = vec![0u8; len];
            let _ = idx.decode_region(&frags, r, &mut out, l);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]
    #[test]
    fn mutated_files_never_panic(ans in any::<bool>(), c in prop::sample::select(vec![1u8, 3, 4]),
                                 flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                                 cut in any::<prop::sample::Index>(), truncate in any::<bool>(), fix in any::<bool>()) {
        let profile = if ans { Profile::Ans } else { Profile::Bp };
        let mut b = encoded(profile, 45, 37, c, 32);
        for (i, v) in flips {
            let i = i.index(b.len());
            b[i] = v;
        }
        if truncate {
            b.truncate(cut.index(b.len() + 1));
        }
        if fix && b.len() >= 24 {
            fix_crc(&mut b);
        }
        exercise(&b);
    }

    #[test]
    fn random_bytes_after_a_v2_header_never_panic(w in 1u32..80, h in 1u32..80, c in prop::sample::select(vec![1u8, 3, 4]),
                                                  n in prop::sample::select(vec![32u8, 64, 224]), p in 0u8..2,
                                                  body in prop::collection::vec(any::<u8>(), 0..800)) {
        let mut b = header(w, h, c, n, p);
        b.extend(body);
        fix_crc_append(&mut b);
        exercise(&b);
    }
}

/// Entry CRCs (SPEC.md §2.11): each checksum is checked where the spec says, and names what it covers.
#[test]
fn entry_and_prefix_crcs_name_what_is_damaged() {
    for profile in [Profile::Bp, Profile::Ans] {
        let px: Vec<u8> = (0..150 * 70 * 3u32)
            .map(|i| ((i * 7) % 251) as u8 ^ (i / 97) as u8)
            .collect();
        let opts = EncodeOptions {
            format: Format::V2(profile),
            patch_size: Some(64),
            ..EncodeOptions::default()
        };
        let good = encode_with(&px, 150, 70, 3, &opts).unwrap();
        let f = L3File::parse(&good).unwrap();
        assert!(f.has_entry_crcs());
        let data = f.data_offset();
        let prefix_len = L3Index::prefix_len(&good).unwrap();
        assert_eq!(prefix_len, data, "{profile}: the prefix ends with its CRC");
        let index = L3Index::parse(&good[..prefix_len], good.len() as u64).unwrap();
        assert!(index.has_entry_crcs());

        // A flipped bit in the last entry (plane 2 of the last patch, or the last chunk), the file's CRC
        // made right again: the entry is named, by a whole-file read, by a region read and by check_patch.
        let mut bad = good.clone();
        let at = good.len() - 5;
        bad[at] ^= 0x10;
        fix_crc(&mut bad);
        let last = f.patches_per_channel() - 1;
        let channel = if profile == Profile::Bp { 2 } else { 0 };
        let named = |e: &Error| matches!(e, Error::EntryCrcMismatch { patch, .. } if patch.patch == last && patch.channel == channel);
        let e = parse_err(&bad);
        assert!(named(&e), "{profile}: {e}");
        assert!(e.to_string().contains(&format!("patch {last}")), "{e}");
        let region = f.patch_rect(last);
        let ranges = index.region_ranges(region, 0).unwrap();
        let mut frags = Fragments::new();
        frags.reset(&ranges);
        for (r, s) in frags.slices_mut() {
            s.copy_from_slice(&bad[r.start as usize..r.end as usize]);
        }
        let layout = PixelLayout::packed(region.w, region.h, 3, false);
        let mut out = vec![0u8; layout.required_len(region.w, region.h, 3).unwrap()];
        let e = index
            .decode_region(&frags, region, &mut out, layout)
            .unwrap_err();
        assert!(named(&e), "{profile}: {e}");
        let r = index.patch_range(channel, last).unwrap();
        assert!(named(
            &index
                .check_patch(channel, last, &bad[r.start as usize..r.end as usize])
                .unwrap_err()
        ));
        index
            .check_patch(channel, last, &good[r.start as usize..r.end as usize])
            .unwrap();
        // Told the bytes were verified, a whole-file read decodes them (no check at all).
        let unchecked = ParseOptions {
            verify_crc: false,
            ..Default::default()
        };
        assert!(L3File::parse_with(&bad, &unchecked).is_ok());

        // A flipped bit in an offset (the file's CRC right again): the prefix CRC refuses it everywhere.
        let mut bad = good.clone();
        bad[prefix_len - 4 - 1] ^= 1;
        fix_crc(&mut bad);
        assert!(matches!(parse_err(&bad), Error::PrefixCrcMismatch { .. }));
        assert!(matches!(
            L3Index::parse(&bad[..prefix_len], bad.len() as u64),
            Err(Error::PrefixCrcMismatch { .. })
        ));

        // Only the file's CRC damaged: the parts are intact, the whole-file read still refuses.
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 1] ^= 0x80;
        assert!(matches!(parse_err(&bad), Error::CrcMismatch { .. }));

        // The flag cleared on a file that has the tables: the first offset is misplaced.
        let mut bad = good.clone();
        bad[18] = 0;
        fix_crc(&mut bad);
        assert!(matches!(
            parse_err(&bad),
            Error::FirstOffsetMisplaced { .. }
        ));
    }
}
