//! Arbitrary bytes through the whole decoding surface: parse, HWC/CHW decode (serial and parallel) and
//! per-patch decode. Any panic, out-of-bounds access or disagreement between the paths is a bug.
#![no_main]

use l3_format::{L3File, Limits, decode_patch};
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
