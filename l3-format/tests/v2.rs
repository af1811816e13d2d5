//! Version 2 round trips: random images of every shape, channel count, patch size and profile, through every
//! decode path (whole image HWC/CHW on one and several threads, region, region from an index and the byte
//! ranges it names), plus the host-side plan a GPU decoder would use.

use l3_format::{
    Choices, EncodeOptions, Format, Fragments, L3File, L3Index, PixelLayout, Profile, Rect,
    encode_with,
};
use proptest::prelude::*;

fn image(w: usize, h: usize, c: usize, seed: u64, kind: u8) -> Vec<u8> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..w * h * c)
        .map(|i| {
            let (x, y, ch) = ((i / c) % w, (i / c) / w, i % c);
            match kind {
                // Noise: every symbol, escapes, 8-bit groups.
                0 => next() as u8,
                // Smooth ramps with a little noise: small residuals, every selector.
                1 => ((x * 3 + y * 2 + ch * 40) as u64 + next() % 5) as u8,
                // Flat areas with hard edges and an alpha that is mostly opaque.
                _ => {
                    if ch == 3 {
                        if (x / 17 + y / 13) % 5 == 0 { 128 } else { 255 }
                    } else {
                        (((x / 23) * 50 + (y / 31) * 70 + ch * 30) % 256) as u8
                    }
                }
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn check(
    px: &[u8],
    w: u32,
    h: u32,
    c: u8,
    n: u8,
    profile: Profile,
    choices: Choices,
    region: Rect,
) {
    let opts = EncodeOptions {
        format: Format::V2(profile),
        patch_size: Some(n),
        threads: 1,
        choices,
        entry_crcs: true,
    };
    let file = encode_with(px, w, h, c, &opts).unwrap();
    let par = encode_with(px, w, h, c, &EncodeOptions { threads: 3, ..opts }).unwrap();
    assert_eq!(file, par, "the output does not depend on the thread count");
    let f = L3File::parse(&file).unwrap();
    assert_eq!((f.version(), f.profile()), (2, Some(profile)));
    let mut hwc = vec![0u8; f.decoded_len()];
    f.decode_hwc(&mut hwc).unwrap();
    assert!(hwc == px, "{w}x{h}x{c} N={n} {profile}: HWC round trip");
    let mut hwc2 = vec![0u8; f.decoded_len()];
    f.decode_hwc_parallel(&mut hwc2, 3).unwrap();
    assert!(hwc2 == px);
    let mut chw = vec![0u8; f.decoded_len()];
    f.decode_chw_parallel(&mut chw, 2).unwrap();
    let plane = (w * h) as usize;
    for i in 0..plane {
        for ch in 0..c as usize {
            assert_eq!(chw[ch * plane + i], px[i * c as usize + ch]);
        }
    }
    let mut chw1 = vec![0u8; f.decoded_len()];
    f.decode_chw(&mut chw1).unwrap();
    assert!(chw1 == chw);

    // The region, from the file and from an index plus only the ranges it names.
    let mut have = Vec::new();
    let mut reads = 0;
    while let Some(r) = L3Index::next_read(&have, file.len() as u64).unwrap() {
        assert_eq!(
            r.start,
            have.len() as u64,
            "reads continue where the last one ended"
        );
        have.extend_from_slice(&file[r.start as usize..r.end as usize]);
        reads += 1;
    }
    // The header, then (ANS) read-aheads doubling until the tables are in, with the offset table.
    assert!(reads <= 10, "{reads} reads for a {}-byte file", file.len());
    let idx = L3Index::parse(&have, file.len() as u64).unwrap();
    assert_eq!((idx.version(), idx.profile()), (2, Some(profile)));
    let ranges = idx.region_ranges(region, 0).unwrap();
    let mut frags = Fragments::new();
    frags.reset(&ranges);
    for (r, s) in frags.slices_mut() {
        s.copy_from_slice(&file[r.start as usize..r.end as usize]);
    }
    for planar in [false, true] {
        let layout = PixelLayout::packed(region.w, region.h, c, planar);
        let len = layout.required_len(region.w, region.h, c).unwrap();
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        f.decode_region(region, &mut a, layout).unwrap();
        idx.decode_region(&frags, region, &mut b, layout).unwrap();
        assert!(a == b, "index region equals file region");
        for y in 0..region.h as usize {
            for x in 0..region.w as usize {
                for ch in 0..c as usize {
                    let want = px[((region.y as usize + y) * w as usize + region.x as usize + x)
                        * c as usize
                        + ch];
                    let at = if planar {
                        ch * (region.w * region.h) as usize + y * region.w as usize + x
                    } else {
                        (y * region.w as usize + x) * c as usize + ch
                    };
                    assert_eq!(
                        a[at], want,
                        "{w}x{h}x{c} N={n} {profile} {region} planar={planar}"
                    );
                }
            }
        }
    }

    // The host-side plan covers the patch data exactly, in order.
    let plan = f.v2_plan().unwrap();
    assert_eq!(plan.patches(), f.patches_per_channel());
    let mut at = f.data_offset() as u32;
    for e in &plan.entries {
        assert_eq!(e.start, at);
        at = e.end;
    }
    assert_eq!(at as usize, file.len() - 4);
    assert_eq!(plan.tables.is_some(), profile == Profile::Ans);
}

#[test]
fn edge_shapes_every_profile_channel_count_and_patch_size() {
    for &(w, h) in &[
        (1u32, 1u32),
        (1, 300),
        (300, 1),
        (31, 33),
        (32, 32),
        (33, 31),
        (129, 64),
        (225, 97),
    ] {
        for c in [1u8, 3, 4] {
            for n in [32u8, 64, 128, 224] {
                for profile in [Profile::Bp, Profile::Ans] {
                    for kind in 0..3 {
                        let px = image(
                            w as usize,
                            h as usize,
                            c as usize,
                            7 + u64::from(kind),
                            kind,
                        );
                        let region = Rect::new(w / 3, h / 2, w - w / 3, h - h / 2);
                        check(&px, w, h, c, n, profile, Choices::Reference, region);
                    }
                }
            }
        }
    }
}

#[test]
fn smallest_choices_round_trip_and_are_not_larger() {
    for (w, h, c) in [(200u32, 150u32, 3u8), (130, 70, 4), (90, 91, 1)] {
        for kind in 0..3 {
            let px = image(w as usize, h as usize, c as usize, 99, kind);
            let r = Rect::new(0, 0, w, h);
            check(&px, w, h, c, 64, Profile::Ans, Choices::Smallest, r);
            let size = |choices| {
                let o = EncodeOptions {
                    format: Format::V2(Profile::Ans),
                    patch_size: Some(64),
                    threads: 1,
                    choices,
                    entry_crcs: true,
                };
                encode_with(&px, w, h, c, &o).unwrap().len()
            };
            let (reference, smallest) = (size(Choices::Reference), size(Choices::Smallest));
            // Not a guarantee in theory (selectors are chosen greedily), but a regression if far off.
            assert!(
                smallest <= reference + reference / 100 + 64,
                "{smallest} vs {reference}"
            );
        }
    }
}

/// Contexts of plane p (SPEC.md §2.7.3): its residual contexts and its selector context.
fn plane_contexts(p: usize) -> Vec<usize> {
    let (res, sel) = match p {
        0 => (0..9, 99),
        1 => (9..54, 100),
        2 => (54..99, 101),
        _ => (102..147, 147),
    };
    res.chain([sel]).collect()
}

#[test]
fn fast_decode_choices_round_trip_with_each_planes_tables_in_budget() {
    for (w, h, c) in [(260u32, 190u32, 3u8), (130, 70, 4), (90, 91, 1)] {
        for kind in 0..3 {
            let px = image(w as usize, h as usize, c as usize, 41, kind);
            let region = Rect::new(w / 4, h / 3, w / 2, h / 2);
            check(&px, w, h, c, 64, Profile::Ans, Choices::FastDecode, region);
            let encode = |choices| {
                let o = EncodeOptions {
                    format: Format::V2(Profile::Ans),
                    patch_size: Some(64),
                    threads: 1,
                    choices,
                    entry_crcs: true,
                };
                encode_with(&px, w, h, c, &o).unwrap()
            };
            let file = encode(Choices::FastDecode);
            let t = L3File::parse(&file).unwrap().ans_tables().unwrap();
            for p in 0..c as usize {
                let ctxs: Vec<&[u16]> = plane_contexts(p)
                    .into_iter()
                    .filter_map(|x| t.freqs(x))
                    .collect();
                // The plane's common power-of-two unit, and its tables at that resolution.
                let k = ctxs
                    .iter()
                    .flat_map(|f| f.iter())
                    .filter(|&&f| f > 0)
                    .map(|f| f.trailing_zeros())
                    .min();
                let bytes = ctxs.len() * ((4 * 4096) >> k.unwrap_or(0).min(3));
                assert!(
                    bytes <= 192 << 10,
                    "{w}x{h}x{c} kind {kind} plane {p}: {bytes} bytes of tables"
                );
                if kind == 0 && p > 0 {
                    // Noise uses every context of the colour planes: they must be coarse to fit.
                    assert!(k >= Some(1), "{w}x{h}x{c} plane {p}: unit 2^{k:?}");
                }
            }
            let reference = encode(Choices::Reference).len();
            assert!(
                file.len() <= reference + reference / 33 + 64,
                "{w}x{h}x{c} kind {kind}: {} vs {reference}",
                file.len()
            );
        }
    }
}

#[test]
fn default_options_write_the_default_format_at_its_patch_size() {
    let px = image(300, 200, 3, 5, 1);
    let file = encode_with(&px, 300, 200, 3, &EncodeOptions::default()).unwrap();
    let f = L3File::parse(&file).unwrap();
    assert_eq!(
        (f.format(), f.patch_size()),
        (
            l3_format::DEFAULT_FORMAT,
            l3_format::DEFAULT_FORMAT.default_patch_size(300, 200)
        )
    );
    // Version 2 without a patch size is N = 128.
    let v2 = encode_with(
        &px,
        300,
        200,
        3,
        &EncodeOptions {
            format: Format::V2(Profile::Ans),
            ..EncodeOptions::default()
        },
    )
    .unwrap();
    assert_eq!(L3File::parse(&v2).unwrap().patch_size(), 128);
    let v1 = encode_with(
        &px,
        300,
        200,
        3,
        &EncodeOptions {
            format: Format::V1,
            ..EncodeOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        v1,
        l3_format::encode(&px, 300, 200, 3, l3_format::default_patch_size(300, 200)).unwrap()
    );
    assert_eq!(L3File::parse(&v1).unwrap().version(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn prop_round_trip_and_regions(w in 1u32..=300, h in 1u32..=300, c in prop::sample::select(vec![1u8, 3, 4]),
                                   n in prop::sample::select(vec![32u8, 64, 128, 224]), ans in any::<bool>(),
                                   seed in any::<u64>(), kind in 0u8..3,
                                   rx in any::<prop::sample::Index>(), ry in any::<prop::sample::Index>(),
                                   rw in any::<prop::sample::Index>(), rh in any::<prop::sample::Index>()) {
        let px = image(w as usize, h as usize, c as usize, seed, kind);
        let (x, y) = (rx.index(w as usize) as u32, ry.index(h as usize) as u32);
        let region = Rect::new(x, y, 1 + rw.index((w - x) as usize) as u32, 1 + rh.index((h - y) as usize) as u32);
        let profile = if ans { Profile::Ans } else { Profile::Bp };
        check(&px, w, h, c, n, profile, Choices::Reference, region);
    }
}
