//! Region reads of L3 items, for version 1 and both version-2 profiles: the bytes read are exactly the
//! file's prefix (header, offset table, and for v2-ANS the frequency tables, read as `L3Index::next_read`
//! says) and the patches under each crop (counted by the loader's read layer), the prefix is read once per
//! file, and the pixels equal the same crops of whole-image decoding.

use l3_format::{EncodeOptions, Format, Profile};
use loader::{Crop, DecodeScope, ImageFolder, ItemKey, Loader, LoaderOptions, SampleSpec, Stats};
use std::sync::Arc;

fn image(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let mut s = seed | 1;
    (0..w * h * 3)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((i % (w * 3)) / 7 + i / (w * 3) / 3) as u8 ^ (s as u8 & 31)
        })
        .collect()
}

#[test]
fn a_v1_crop_reads_only_its_patches_and_decodes_the_same_pixels() {
    crop_reads(Format::V1);
}

#[test]
fn a_v2_bp_crop_reads_only_its_patches_and_decodes_the_same_pixels() {
    crop_reads(Format::V2(Profile::Bp));
}

#[test]
fn a_v2_ans_crop_reads_only_its_patches_and_decodes_the_same_pixels() {
    crop_reads(Format::V2(Profile::Ans));
}

/// The bytes a reader takes for the prefix of `file`: what `L3Index::next_read` asks for, read by read.
fn prefix_read(file: &[u8]) -> u64 {
    let mut have = Vec::new();
    while let Some(r) = l3_format::L3Index::next_read(&have, file.len() as u64).unwrap() {
        have.extend_from_slice(&file[r.start as usize..r.end as usize]);
    }
    have.len() as u64
}

fn crop_reads(format: Format) {
    let tmp = tempfile::tempdir().unwrap();
    let sizes = [(1931u32, 1097u32), (3840, 2160), (700, 300)];
    let mut files = Vec::new();
    for (i, &(w, h)) in sizes.iter().enumerate() {
        let px = image(w, h, 7 + i as u32);
        let opts = EncodeOptions {
            format,
            patch_size: Some(64),
            threads: 0,
            ..EncodeOptions::default()
        };
        let bytes = l3_format::encode_with(&px, w, h, 3, &opts).unwrap();
        let p = tmp.path().join(format!("img{i}.l3"));
        std::fs::write(&p, &bytes).unwrap();
        files.push(bytes);
    }
    let ds = Arc::new(ImageFolder::open(tmp.path()).unwrap());
    let opts = |decode| LoaderOptions {
        batch_size: 1,
        decode,
        decode_threads: 2,
        seed: 5,
        epochs: Some(2),
        sample: SampleSpec {
            height: 224,
            width: 224,
            crop: Crop::Random,
            hflip: true,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    };
    let run = |decode| {
        let mut l = Loader::new(ds.clone(), opts(decode)).unwrap();
        let batches: Vec<_> = l.by_ref().map(|b| b.unwrap()).collect();
        let stats: Stats = l.stats();
        (batches, stats)
    };
    let (region, stats) = run(DecodeScope::Region);
    let (whole, whole_stats) = run(DecodeScope::Whole);
    assert_eq!(region.len(), 6);
    for (a, b) in region.iter().zip(&whole) {
        assert_eq!(a.ids, b.ids);
        assert!(
            a.pixels == b.pixels,
            "{format}: epoch {} item {}",
            a.epoch,
            a.ids[0]
        );
    }
    // The expected bytes, from the whole file: header + offset table once per file (the second epoch
    // finds them cached), plus, per draw, every (channel, patch) under the item's window.
    let spec = SampleSpec {
        height: 224,
        width: 224,
        crop: Crop::Random,
        hflip: true,
        layout: Default::default(),
        dtype: Default::default(),
        normalize: None,
        ..SampleSpec::default()
    };
    let mut want = 0u64;
    for (i, bytes) in files.iter().enumerate() {
        let f = l3_format::L3File::parse(bytes).unwrap();
        assert_eq!(f.format(), format);
        let prefix = prefix_read(bytes);
        assert!(prefix >= f.data_offset() as u64);
        want += prefix;
        for epoch in 0..2 {
            let win = spec.window(
                f.width(),
                f.height(),
                &ItemKey {
                    seed: 5,
                    epoch,
                    index: i,
                },
            );
            let n = f.patch_size() as u32;
            for p in 0..f.patches_per_channel() {
                let r = f.patch_rect(p);
                let meets = r.x < win.src.x + win.src.w
                    && win.src.x < r.x + r.w
                    && r.y < win.src.y + win.src.h
                    && win.src.y < r.y + r.h;
                if meets {
                    // v1 and v2-BP store each channel's patch apart; a v2-ANS chunk holds every channel.
                    let channels = if format == Format::V2(Profile::Ans) {
                        1
                    } else {
                        3
                    };
                    for c in 0..channels {
                        want += f.patch_range(c, p).len() as u64;
                    }
                }
            }
            assert!(win.src.w <= 224 && n == 64);
        }
    }
    assert_eq!(stats.bytes_read, want, "{format}");
    let on_disk: u64 = files.iter().map(|f| f.len() as u64).sum();
    assert_eq!(whole_stats.bytes_read, 2 * on_disk);
    // A 224x224 crop of a 4K image covers a few percent of its bytes.
    assert!(
        stats.bytes_read * 10 < whole_stats.bytes_read,
        "{} of {}",
        stats.bytes_read,
        whole_stats.bytes_read
    );
    // Decoding only the window also decodes fewer pixels.
    assert!(stats.pixels_decoded < whole_stats.pixels_decoded / 10);
}
