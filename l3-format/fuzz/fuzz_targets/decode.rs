//! Arbitrary bytes (either version) through the whole decoding surface: parse, HWC/CHW decode (serial and parallel),
//! region decode (from the whole file and from the index plus the fragments it names) and per-patch
//! decode. Any panic, out-of-bounds access or disagreement between the paths is a bug.
#![no_main]

use l3_format::{Fragments, L3File, L3Index, Limits, PixelLayout, Rect, decode_patch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Keep decoded images small so the fuzzer explores structure rather than memory.
    let limits = Limits {
        max_pixels: 1 << 22,
    };
    let Ok(f) = L3File::parse_with_limits(data, &limits) else {
        return;
    };
    let mut hwc = vec![0u8; f.decoded_len()];
    let mut chw = vec![0u8; f.decoded_len()];
    let a = f.decode_hwc(&mut hwc);
    let b = f.decode_chw(&mut chw);
    assert_eq!(a.is_ok(), b.is_ok());
    let mut par = vec![0u8; f.decoded_len()];
    // One thread: the queue and error paths of the parallel decoder without spawning per input
    // (thread start-up also trips LeakSanitizer false positives).
    let c = f.decode_hwc_parallel(&mut par, 1);
    assert_eq!(a, c);
    if a.is_ok() {
        assert_eq!(hwc, par);
        // What decodes must survive a round trip through the encoder (which may choose other bytes:
        // readers accept non-minimal nbit and ignore padding bits).
        let again =
            l3_format::encode(&hwc, f.width(), f.height(), f.channels(), f.patch_size()).unwrap();
        let g = L3File::parse(&again).unwrap();
        let mut back = vec![0u8; g.decoded_len()];
        g.decode_hwc(&mut back).unwrap();
        assert_eq!(back, hwc);
    }
    // A region chosen by the input's last bytes: the whole-file and the index paths must agree with each
    // other and, when the whole image decodes, with its pixels.
    let pick = |k: usize| u32::from(data[data.len() - 1 - k % data.len()]);
    let (w, h) = (f.width(), f.height());
    let (x, y) = (pick(0) % w, pick(1) % h);
    let region = Rect::new(x, y, 1 + pick(2) % (w - x), 1 + pick(3) % (h - y));
    let layout = PixelLayout::packed(region.w, region.h, f.channels(), pick(4) & 1 == 1);
    let len = layout.required_len(region.w, region.h, f.channels()).unwrap();
    let mut from_file = vec![0u8; len];
    let r1 = f.decode_region(region, &mut from_file, layout);
    let prefix = L3Index::prefix_len_with_limits(data, &limits).unwrap();
    let idx = L3Index::parse_with_limits(&data[..prefix], data.len() as u64, &limits).unwrap();
    let ranges = idx.region_ranges(region, u64::from(pick(5)) * 64).unwrap();
    let mut frags = Fragments::new();
    frags.reset(&ranges);
    for (r, s) in frags.slices_mut() {
        s.copy_from_slice(&data[r.start as usize..r.end as usize]);
    }
    let mut from_index = vec![0u8; len];
    let r2 = idx.decode_region(&frags, region, &mut from_index, layout);
    assert_eq!(r1, r2);
    if r1.is_ok() {
        assert_eq!(from_file, from_index);
    }
    if a.is_ok() {
        r1.unwrap();
    }
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
});
