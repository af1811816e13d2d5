//! The streaming encoder ([`L3Writer`]) against the whole-image one: the same bytes for every format,
//! profile, choice, patch size, channel count and shape, whatever the bands' heights; its errors; its spill
//! file gone however it ends.

use l3_format::{Choices, EncodeOptions, Error, Format, L3File, L3Writer, Profile, encode_with};
use std::path::Path;

/// A photo-like image: gradients, texture and some noise, so that every predictor and context is used.
fn image(w: u32, h: u32, c: u8, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut px = Vec::with_capacity((w * h * u32::from(c)) as usize);
    for y in 0..h {
        for x in 0..w {
            for ch in 0..u32::from(c) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let smooth = (x * (ch + 1) + y * 2 + (x * y) / 97) as u8;
                let noise = if (x / 16 + y / 16) % 3 == 0 {
                    (s % 9) as u8
                } else {
                    0
                };
                px.push(smooth.wrapping_add(noise));
            }
        }
    }
    px
}

/// Streams `px` in bands of the heights `bands` gives in turn (cycling), returns the file.
fn stream(
    dir: &Path,
    px: &[u8],
    (w, h, c): (u32, u32, u8),
    opts: &EncodeOptions,
    bands: &[usize],
) -> Vec<u8> {
    let out = dir.join("out.l3");
    let mut wr = L3Writer::new(&out, w, h, c, opts).unwrap();
    let row = (w * u32::from(c)) as usize;
    let (mut y, mut k) = (0usize, 0usize);
    while y < h as usize {
        let rows = bands[k % bands.len()].min(h as usize - y);
        wr.push_rows(&px[y * row..(y + rows) * row]).unwrap();
        y += rows;
        k += 1;
    }
    assert_eq!(wr.rows_written(), h);
    wr.finish(Vec::new()).unwrap()
}

fn check(dir: &Path, (w, h, c): (u32, u32, u8), opts: &EncodeOptions, bands: &[&[usize]]) {
    let px = image(w, h, c, u64::from(w * 31 + h));
    let whole = encode_with(&px, w, h, c, opts).unwrap();
    for b in bands {
        let streamed = stream(dir, &px, (w, h, c), opts, b);
        assert!(
            streamed == whole,
            "{w}x{h}x{c} {opts:?} bands {b:?}: {} bytes streamed, {} whole",
            streamed.len(),
            whole.len()
        );
    }
    // And it decodes to the pixels.
    let f = L3File::parse(&whole).unwrap();
    let mut back = vec![0u8; f.decoded_len()];
    f.decode_hwc(&mut back).unwrap();
    assert_eq!(back, px);
    // Nothing left beside the output: the spill is gone.
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
}

const BANDS: &[&[usize]] = &[&[1], &[5, 17, 1, 64, 3], &[usize::MAX]];

fn v2(
    profile: Profile,
    n: u8,
    choices: Choices,
    entry_crcs: bool,
    threads: usize,
) -> EncodeOptions {
    EncodeOptions {
        format: Format::V2(profile),
        patch_size: Some(n),
        threads,
        choices,
        entry_crcs,
    }
}

#[test]
fn version_2_ans_matches_the_whole_encoder() {
    let dir = tempfile::tempdir().unwrap();
    for &(w, h) in &[(1, 1), (7, 3), (33, 65), (200, 131)] {
        for c in [1, 3, 4] {
            for choices in [Choices::Reference, Choices::Smallest, Choices::FastDecode] {
                for crcs in [true, false] {
                    for n in [32, 64] {
                        check(
                            dir.path(),
                            (w, h, c),
                            &v2(Profile::Ans, n, choices, crcs, 1),
                            BANDS,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn version_2_bp_matches_the_whole_encoder() {
    let dir = tempfile::tempdir().unwrap();
    for &(w, h) in &[(1, 1), (7, 3), (33, 65), (200, 131)] {
        for c in [1, 3, 4] {
            for crcs in [true, false] {
                for n in [32, 96, 224] {
                    check(
                        dir.path(),
                        (w, h, c),
                        &v2(Profile::Bp, n, Choices::Reference, crcs, 1),
                        BANDS,
                    );
                }
            }
        }
    }
}

#[test]
fn version_1_matches_the_whole_encoder() {
    let dir = tempfile::tempdir().unwrap();
    for &(w, h) in &[(1, 1), (7, 3), (33, 65), (200, 131)] {
        for c in [1, 3, 4] {
            for n in [None, Some(1), Some(7), Some(32), Some(255)] {
                let opts = EncodeOptions {
                    format: Format::V1,
                    patch_size: n,
                    ..EncodeOptions::default()
                };
                check(dir.path(), (w, h, c), &opts, BANDS);
            }
        }
    }
}

#[test]
fn defaults_and_threads_on_a_large_odd_image() {
    let dir = tempfile::tempdir().unwrap();
    let shape = (4097, 2161, 3);
    let bands: &[&[usize]] = &[&[37, 200, 1, 128]];
    check(dir.path(), shape, &EncodeOptions::default(), bands);
    let threads = EncodeOptions {
        threads: 3,
        ..EncodeOptions::default()
    };
    check(dir.path(), shape, &threads, bands);
    for format in [Format::V1, Format::V2(Profile::Bp)] {
        for t in [1, 2] {
            let opts = EncodeOptions {
                format,
                threads: t,
                ..EncodeOptions::default()
            };
            check(dir.path(), shape, &opts, bands);
        }
    }
}

#[test]
fn threads_do_not_change_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for profile in [Profile::Ans, Profile::Bp] {
        for c in [1, 4] {
            let opts = v2(profile, 32, Choices::FastDecode, true, 4);
            check(dir.path(), (301, 97, c), &opts, BANDS);
        }
    }
    let v1 = EncodeOptions {
        format: Format::V1,
        patch_size: Some(16),
        threads: 4,
        ..EncodeOptions::default()
    };
    check(dir.path(), (301, 97, 3), &v1, BANDS);
}

/// The streaming error inside the `File` wrapper, which names the output.
fn inner(e: Error, out: &Path) -> Error {
    assert!(e.to_string().contains(&*out.to_string_lossy()), "{e}");
    match e {
        Error::File { path, source } => {
            assert_eq!(path, out);
            *source
        }
        other => panic!("not named: {other:?}"),
    }
}

#[test]
fn rows_past_the_end_are_refused_and_not_taken() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.l3");
    let px = image(10, 6, 3, 1);
    for opts in [
        EncodeOptions::default(),
        EncodeOptions {
            format: Format::V1,
            ..EncodeOptions::default()
        },
    ] {
        let mut wr = L3Writer::new(&out, 10, 6, 3, &opts).unwrap();
        wr.push_rows(&px[..4 * 30]).unwrap();
        let e = wr.push_rows(&px[..3 * 30]).unwrap_err();
        assert_eq!(
            inner(e, &out),
            Error::RowsPastEnd {
                height: 6,
                given: 7
            }
        );
        // None of the refused rows was taken: the right ones still finish the same file.
        assert_eq!(wr.rows_written(), 4);
        wr.push_rows(&px[4 * 30..]).unwrap();
        let e = wr.push_rows(&px[..30]).unwrap_err();
        assert!(matches!(
            inner(e, &out),
            Error::RowsPastEnd { given: 7, .. }
        ));
        assert_eq!(
            wr.finish(Vec::new()).unwrap(),
            encode_with(&px, 10, 6, 3, &opts).unwrap()
        );
    }
}

#[test]
fn finishing_early_and_partial_rows_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("y.l3");
    let px = image(10, 300, 1, 2);
    let mut wr = L3Writer::new(&out, 10, 300, 1, &EncodeOptions::default()).unwrap();
    let e = wr.push_rows(&px[..15]).unwrap_err();
    assert_eq!(
        inner(e, &out),
        Error::PartialRow {
            row_bytes: 10,
            got: 15
        }
    );
    wr.push_rows(&px[..2990]).unwrap();
    let e = wr.finish(Vec::new()).unwrap_err();
    assert_eq!(
        inner(e, &out),
        Error::RowsMissing {
            height: 300,
            given: 299
        }
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn bad_shapes_are_refused_as_the_whole_encoder_refuses_them() {
    let out = Path::new("z.l3");
    let new = |w, h, c, opts: &EncodeOptions| {
        inner(L3Writer::new(out, w, h, c, opts).err().unwrap(), out)
    };
    let d = EncodeOptions::default();
    assert_eq!(
        new(0, 5, 3, &d),
        Error::ZeroDimension {
            width: 0,
            height: 5
        }
    );
    assert_eq!(new(5, 5, 2, &d), Error::BadChannels { found: 2 });
    assert!(matches!(new(70_000, 70_000, 3, &d), Error::TooLarge { .. }));
    let odd = EncodeOptions {
        patch_size: Some(48),
        ..d
    };
    assert_eq!(new(5, 5, 3, &odd), Error::BadPatchSize { found: 48 });
    assert_eq!(
        encode_with(&[0; 75], 5, 5, 3, &odd).unwrap_err(),
        Error::BadPatchSize { found: 48 }
    );
}

#[test]
fn the_spill_is_gone_while_streaming_after_a_drop_and_after_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let spill = tempfile::tempdir().unwrap();
    let out = dir.path().join("w.l3");
    let px = image(300, 400, 3, 3);
    for opts in [
        EncodeOptions::default(),
        EncodeOptions {
            format: Format::V2(Profile::Bp),
            ..EncodeOptions::default()
        },
    ] {
        let mut wr = L3Writer::new(&out, 300, 400, 3, &opts)
            .unwrap()
            .spill_dir(spill.path());
        wr.push_rows(&px[..300 * 3 * 300]).unwrap();
        // Spilled already (three rows of patches), but no name shows in either folder.
        assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        drop(wr);
        // An output that cannot be written: the error names it, nothing is left.
        let mut wr = L3Writer::new(&out, 300, 400, 3, &opts)
            .unwrap()
            .spill_dir(spill.path());
        wr.push_rows(&px).unwrap();
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full");
        if let Ok(full) = full {
            let e = inner(wr.finish(full).unwrap_err(), &out);
            assert!(matches!(e, Error::Io { .. }), "{e:?}");
        }
        assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0);
    }
    // A spill folder that does not exist: a typed error naming it.
    let mut wr = L3Writer::new(&out, 300, 400, 3, &EncodeOptions::default())
        .unwrap()
        .spill_dir(&dir.path().join("missing"));
    let e = inner(wr.push_rows(&px).unwrap_err(), &out);
    assert!(e.to_string().contains("missing"), "{e}");
    // The writer refuses everything after an error.
    assert!(wr.push_rows(&px[..900]).is_err());
}
