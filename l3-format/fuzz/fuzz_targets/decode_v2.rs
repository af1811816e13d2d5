//! Version 2 under arbitrary bytes: the first 9 input bytes choose a plausible header (size, channels,
//! patch size, profile, entry CRCs or not), the rest is the body, and every CRC is made right (the file's,
//! and where the flag is set the entries' and the prefix's) so that the fuzzer explores the tables,
//! offsets, rows and rANS chunks rather than the checksums. Every decode path (whole image HWC/CHW,
//! serial and parallel, region from the file and from an index plus the ranges it names) must return
//! without panicking and agree; the host-side plan a GPU decoder would use must describe the file
//! consistently; what decodes must survive a round trip through the encoder.
#![no_main]

use l3_format::{
    EncodeOptions, Error, FLAG_ENTRY_CRCS, Format, Fragments, L3File, L3Index, Limits, ParseOptions,
    PixelLayout, Rect, crc32c, encode_with,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let w = 1 + u32::from(u16::from_le_bytes([data[0], data[1]]) % 300);
    let h = 1 + u32::from(u16::from_le_bytes([data[2], data[3]]) % 300);
    let c = [1u8, 3, 4][usize::from(data[4] % 3)];
    let n = 32 * (1 + data[5] % 7);
    let profile = data[6] % 2;
    let flags = (data[6] >> 1) & FLAG_ENTRY_CRCS;
    let mut file = b"L3IM".to_vec();
    file.extend(2u16.to_le_bytes());
    file.extend(w.to_le_bytes());
    file.extend(h.to_le_bytes());
    file.extend([c, 8, n, profile, flags, 0]);
    file.extend_from_slice(&data[9..]);
    let crc = crc32c(&file);
    file.extend(crc.to_le_bytes());
    let limits = Limits { max_pixels: 1 << 20 };
    let unverified = ParseOptions {
        limits,
        verify_crc: false,
    };
    // Where the structure parses, write the entry CRCs and the prefix CRC it implies, then the file's.
    let fixed = L3File::parse_with(&file, &unverified).ok().filter(|f| f.has_entry_crcs()).map(|f| {
        let ans = f.profile() == Some(l3_format::Profile::Ans);
        let per = f.patches_per_channel();
        let entries = if ans { per } else { per * usize::from(f.channels()) };
        let table = f.data_offset() - 4 - 4 * entries;
        let crcs: Vec<u32> = (0..entries)
            .map(|i| crc32c(if ans { f.patch_bytes(0, i) } else { f.patch_bytes(i / per, i % per) }))
            .collect();
        (table, crcs)
    });
    if let Some((table, crcs)) = fixed {
        for (i, crc) in crcs.iter().enumerate() {
            file[table + 4 * i..table + 4 * i + 4].copy_from_slice(&crc.to_le_bytes());
        }
        let at = table + 4 * crcs.len();
        let prefix = crc32c(&file[..at]);
        file[at..at + 4].copy_from_slice(&prefix.to_le_bytes());
        let end = file.len() - 4;
        let crc = crc32c(&file[..end]);
        file[end..].copy_from_slice(&crc.to_le_bytes());
    }
    let opts = ParseOptions {
        limits,
        verify_crc: true,
    };
    let Ok(f) = L3File::parse_with(&file, &opts) else {
        // With every checksum right, only the structure can be refused.
        let e = L3File::parse_with(&file, &unverified).unwrap_err();
        assert!(
            !matches!(e, Error::CrcMismatch { .. } | Error::EntryCrcMismatch { .. } | Error::PrefixCrcMismatch { .. }),
            "{e}"
        );
        return;
    };
    // The plan: every entry inside the data, in order, covering it exactly.
    let plan = f.v2_plan().expect("a v2 file has a plan");
    let mut at = f.data_offset() as u32;
    for e in &plan.entries {
        assert_eq!(e.start, at);
        assert!(e.end >= e.start);
        at = e.end;
    }
    assert_eq!(at as usize, file.len() - 4);
    assert_eq!(plan.tables.is_some(), plan.profile == l3_format::Profile::Ans);

    let mut hwc = vec![0u8; f.decoded_len()];
    let mut chw = vec![0u8; f.decoded_len()];
    let a = f.decode_hwc(&mut hwc);
    let b = f.decode_chw(&mut chw);
    assert_eq!(a, b);
    let mut par = vec![0u8; f.decoded_len()];
    let p = f.decode_hwc_parallel(&mut par, 1);
    assert_eq!(a, p);
    if a.is_ok() {
        assert_eq!(hwc, par);
        let fmt = EncodeOptions {
            format: f.format(),
            patch_size: Some(f.patch_size()),
            ..EncodeOptions::default()
        };
        let again = encode_with(&hwc, f.width(), f.height(), f.channels(), &fmt).unwrap();
        let g = L3File::parse(&again).unwrap();
        let mut back = vec![0u8; g.decoded_len()];
        g.decode_hwc(&mut back).unwrap();
        assert_eq!(back, hwc);
        assert_eq!(g.format(), Format::V2(plan.profile));
    }
    // A region chosen by the input: the file and the index paths agree.
    let pick = |k: usize| u32::from(data[7 + k % 2]);
    let (x, y) = (pick(0) % w, pick(1) % h);
    let region = Rect::new(x, y, 1 + (pick(1) * 7) % (w - x), 1 + (pick(0) * 5) % (h - y));
    let layout = PixelLayout::packed(region.w, region.h, c, data[8] & 1 == 1);
    let len = layout.required_len(region.w, region.h, c).unwrap();
    let mut from_file = vec![0u8; len];
    let r1 = f.decode_region(region, &mut from_file, layout);
    let mut have = file[..20].to_vec();
    loop {
        let need = L3Index::prefix_len_with_limits(&have, &limits).unwrap();
        if need <= have.len() || have.len() == file.len() {
            break;
        }
        have = file[..need.min(file.len())].to_vec();
    }
    let idx = L3Index::parse_with_limits(&have, file.len() as u64, &limits).unwrap();
    assert_eq!(idx.has_entry_crcs(), f.has_entry_crcs());
    let ranges = idx.region_ranges(region, 64).unwrap();
    let mut frags = Fragments::new();
    frags.reset(&ranges);
    for (r, s) in frags.slices_mut() {
        s.copy_from_slice(&file[r.start as usize..r.end as usize]);
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
});
