//! Host validation of a batch of untrusted files: `BatchPlan::new` (with and without the host row walk) and
//! `SamplePlan::new` (windows taken from the input too; files whole and as fragments) must return an error
//! or a plan whose every descriptor lies inside the packed input and the output (for samples: inside its
//! own sample), never panic; and so must `SamplePlan::resampled` (geometries of a recipe chosen by the
//! input, over each file's own size).
//! Input: first byte = number of files (1..=4), then 16 bytes of window parameters, then the files split at
//! evenly spaced cut points; valid seed files (version 1, version 2 BP and ANS) are mixed in so the fuzzer
//! reaches the row walk and the version-2 planning quickly. A version-2 file's CRC-32C would refuse almost
//! every mutation before planning, so when parameter bit 12.7 is set the target makes each one right
//! again: the planners then see damaged bodies behind a valid checksum.
#![no_main]
use l3_cuda::{BatchPlan, DecodeOptions, Rect, SampleOptions, SamplePlan, SampleSource};
use vocab::{Layout, Window};
use l3_format::{Fragments, L3Index};
use libfuzzer_sys::fuzz_target;

/// What a loader would have read of `file` for `region`: its index and the patch ranges under it, if the
/// prefix parses.
fn fragments(file: &[u8], region: Rect) -> Option<(L3Index, Fragments)> {
    let index = L3Index::read_from(file.len() as u64, |r| {
        Ok::<_, std::convert::Infallible>(file[r.start as usize..r.end as usize].to_vec())
    })
    .ok()?;
    let ranges = index.region_ranges(region, 16).ok()?;
    let mut data = Fragments::new();
    data.reset(&ranges);
    for (r, dst) in data.slices_mut() {
        // A range past the end of a truncated file stays zero-filled: still bytes to plan from.
        if let Some(src) = file.get(r.start as usize..r.end as usize) {
            dst.copy_from_slice(src);
        }
    }
    Some((index, data))
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    if rest.len() < 16 {
        return;
    }
    let (params, rest) = rest.split_at(16);
    let n = (n as usize % 4) + 1;
    let chunk = rest.len() / n;
    let fix_crc = params[12] & 0x80 != 0;
    let mut owned: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut f = rest[i * chunk..if i + 1 == n {
                rest.len()
            } else {
                (i + 1) * chunk
            }]
                .to_vec();
            if fix_crc && f.len() >= 24 && f[4..6] == [2, 0] {
                let end = f.len() - 4;
                let crc = l3_format::crc32c(&f[..end]);
                f[end..].copy_from_slice(&crc.to_le_bytes());
            }
            f
        })
        .collect();
    owned.push(l3_format::encode(&[7u8; 5 * 3 * 3], 5, 3, 3, 2).unwrap());
    let px: Vec<u8> = (0..40 * 33 * 3).map(|i| (i * 7 % 251) as u8).collect();
    let profile = if params[12] & 0x40 != 0 {
        l3_format::Profile::Ans
    } else {
        l3_format::Profile::Bp
    };
    let v2 = l3_format::EncodeOptions {
        format: l3_format::Format::V2(profile),
        patch_size: Some(32),
        ..l3_format::EncodeOptions::default()
    };
    owned.push(l3_format::encode_with(&px, 40, 33, 3, &v2).unwrap());
    let files: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
    for (layout, check_rows_on_host) in [(Layout::Nchw, false), (Layout::Nhwc, true)] {
        let opts = DecodeOptions {
            layout,
            dtype: vocab::DType::U8,
            normalize: None,
            check_rows_on_host,
        };
        if let Ok(plan) = BatchPlan::new(&files, &opts) {
            let out: usize = plan.images().iter().map(|s| s.len()).sum();
            assert_eq!(out, plan.output_len());
            assert!(plan.patch_count() > 0);
            assert!(plan.descriptors_in_bounds());
        }
    }

    // Sample plans: one window for every file, from the parameter bytes (small values, so that many fit).
    let p = |i: usize| u32::from(params[i] % 64);
    let window = |k: usize| {
        Window::new(
            Rect::new(p(k % 4), p((k + 1) % 4), 1 + p(4 + k % 4), 1 + p(5 + k % 3)),
            p(8 + k % 4),
            p(9 + k % 3),
            params[12] >> (k % 8) & 1 == 1,
        )
    };
    let windows: Vec<Window> = (0..files.len()).map(window).collect();
    let parts: Vec<Option<(L3Index, Fragments)>> = files
        .iter()
        .zip(&windows)
        .enumerate()
        .map(|(i, (f, w))| {
            (params[13] >> (i % 8) & 1 == 1)
                .then(|| fragments(f, w.src))
                .flatten()
        })
        .collect();
    let sources: Vec<SampleSource<'_>> = files
        .iter()
        .zip(&parts)
        .map(|(f, part)| match part {
            Some((index, data)) => SampleSource::Fragments { index, data },
            None => SampleSource::File(f),
        })
        .collect();
    let (sw, sh) = (
        1 + u32::from(params[14] % 96),
        1 + u32::from(params[15] % 96),
    );
    // Windows into RGB batches, and (through the resampling kernels) into luma and RGBA ones; a
    // channel count the batch cannot have must be refused, never planned.
    let other = [1u8, 4, 0, 2][usize::from(params[4] % 4)];
    for (layout, check_rows_on_host, channels) in [
        (Layout::Nchw, false, 3),
        (Layout::Nhwc, true, 3),
        (Layout::Nhwc, false, other),
    ] {
        let opts = SampleOptions {
            layout,
            check_rows_on_host,
            channels,
            ..SampleOptions::new(sw, sh)
        };
        let planned = SamplePlan::new(&sources, &windows, &opts);
        if !matches!(channels, 1 | 3 | 4) {
            assert!(planned.is_err());
        }
        if let Ok(plan) = planned {
            assert_eq!(plan.tensor().channels(), usize::from(channels));
            assert_eq!(plan.output_len(), plan.sample_count() * plan.sample_len());
            assert!(plan.patch_count() > 0);
            assert!(plan.descriptors_in_bounds());
        }
    }
    // Resampled batches: a recipe's geometries over each file's size, as the loader draws them.
    let dims: Option<Vec<(u32, u32)>> = files
        .iter()
        .map(|f| l3_format::L3File::parse(f).ok().map(|p| (p.width(), p.height())))
        .collect();
    if let Some(dims) = dims {
        let recipe = match params[0] % 3 {
            0 => vocab::Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: vocab::DEFAULT_RATIO,
            },
            1 => vocab::Recipe::Resize {
                shorter: 1 + u32::from(params[1]),
            },
            _ => vocab::Recipe::Jitter { range: [0.5, 2.0] },
        };
        let spec = vocab::SampleSpec {
            width: sw,
            height: sh,
            crop: vocab::Crop::Random,
            hflip: true,
            recipe,
            ..vocab::SampleSpec::default()
        };
        let geometries: Vec<vocab::Geometry> = dims
            .iter()
            .enumerate()
            .map(|(index, &(w, h))| {
                let key = vocab::ItemKey {
                    seed: u64::from(params[2]),
                    epoch: 0,
                    index,
                };
                spec.geometry(w, h, &key)
            })
            .collect();
        let whole: Vec<SampleSource<'_>> = files.iter().map(|f| SampleSource::File(f)).collect();
        for (interpolation, channels) in [
            (vocab::Interpolation::Bilinear, 3),
            (vocab::Interpolation::Nearest, 3),
            (vocab::Interpolation::Bilinear, [1, 4][usize::from(params[5] % 2)]),
        ] {
            let opts = SampleOptions {
                fill: params[3],
                channels,
                ..SampleOptions::new(sw, sh)
            };
            if let Ok(plan) = SamplePlan::resampled(&whole, &geometries, interpolation, &opts) {
                assert!(plan.is_resampled());
                assert_eq!(plan.output_len(), plan.sample_count() * plan.sample_len());
                assert!(plan.descriptors_in_bounds());
            }
        }
    }
});
