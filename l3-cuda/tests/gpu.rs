//! GPU tests: decoded bytes equal the CPU decoder's byte for byte. Without a GPU (no driver, no device,
//! no NVRTC) each test prints why and returns; the error-path tests at the end run everywhere.

mod common;

use common::{Content, Rng, TestImage, check_output, image};
use l3_cuda::{BatchDecoder, BatchPlan, DType, DecodeOptions, Error, Layout, Normalize};

/// A decoder on device 0, or None (after printing why) when this machine cannot run one.
fn decoder_or_skip() -> Option<BatchDecoder> {
    match BatchDecoder::new(0) {
        Ok(d) => Some(d),
        Err(e @ (Error::NoDriver | Error::NoDevice { .. } | Error::NoNvrtc)) => {
            eprintln!("skipping: {e}");
            None
        }
        // A GPU is present but the decoder cannot start (compile error, driver failure): a real failure.
        Err(e) => panic!("BatchDecoder::new(0) failed on a machine with a GPU: {e}"),
    }
}

fn files(imgs: &[TestImage]) -> Vec<&[u8]> {
    imgs.iter().map(|i| i.file.as_slice()).collect()
}

fn decode_and_check(dec: &mut BatchDecoder, imgs: &[TestImage], opts: &DecodeOptions, tag: &str) {
    let batch = dec
        .submit(&files(imgs), opts)
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    let out = batch
        .to_host_bytes()
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    check_output(&out, batch.images(), imgs, opts, tag);
}

fn u8_opts(layout: Layout) -> DecodeOptions {
    DecodeOptions {
        layout,
        ..Default::default()
    }
}

#[test]
fn gpu_every_patch_size_matches_cpu_decoder() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    for (gi, imgs) in common::every_patch_size_batches().iter().enumerate() {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            decode_and_check(
                &mut dec,
                imgs,
                &u8_opts(layout),
                &format!("group{gi} {layout:?}"),
            );
        }
    }
}

#[test]
fn gpu_tiny_mixed_and_uniform_batches_match_cpu_decoder() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    for (name, imgs) in [
        ("tiny", common::tiny_mixed_batch()),
        ("uniform", common::uniform_batch()),
    ] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            decode_and_check(
                &mut dec,
                &imgs,
                &u8_opts(layout),
                &format!("{name} {layout:?}"),
            );
        }
    }
}

#[test]
fn gpu_normalised_float_outputs_match() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    let imgs = common::float_batch();
    for dtype in [DType::F32, DType::F16] {
        for normalize in [None, Some(Normalize::IMAGENET)] {
            let opts = DecodeOptions {
                dtype,
                normalize,
                ..Default::default()
            };
            decode_and_check(&mut dec, &imgs, &opts, &format!("{dtype:?} {normalize:?}"));
        }
    }
}

/// Every PNG of ../shared/corpus at full resolution (the JPEGs' pixels come from a lossy decoder and add
/// nothing a PNG does not), encoded with the default patch size, decoded in one mixed batch.
#[test]
fn gpu_corpus_matches_cpu_decoder() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    let mut imgs = Vec::new();
    for name in [
        "UbuntuMateCold.png",
        "Gulp-rgba.png",
        "Canopee.png",
        "Cascade.png",
        "Kokkini.png",
        "Altai.png",
    ] {
        let Some((px, w, h, c)) = common::corpus_png(name) else {
            eprintln!("skipping: corpus image {name} not found in ../shared/corpus");
            return;
        };
        let n = l3_format::default_patch_size(w, h);
        imgs.push(TestImage {
            file: l3_format::encode(&px, w, h, c, n).unwrap(),
            label: name.into(),
        });
    }
    for layout in [Layout::Nhwc, Layout::Nchw] {
        decode_and_check(
            &mut dec,
            &imgs,
            &u8_opts(layout),
            &format!("corpus {layout:?}"),
        );
    }
}

/// Double buffering: several batches in flight before any is waited on, from the same two staging slots.
#[test]
fn gpu_pipelined_batches_all_correct() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    let batches = common::every_patch_size_batches();
    let opts = u8_opts(Layout::Nchw);
    let pending: Vec<_> = batches
        .iter()
        .chain(batches.iter())
        .map(|imgs| dec.submit(&files(imgs), &opts).unwrap())
        .collect();
    for (i, (batch, imgs)) in pending
        .iter()
        .zip(batches.iter().chain(batches.iter()))
        .enumerate()
    {
        let out = batch.to_host_bytes().unwrap();
        check_output(&out, batch.images(), imgs, &opts, &format!("pipelined {i}"));
    }
}

/// Files read into a PinnedBatch decode from pinned memory directly; the batch is refilled and reused.
#[test]
fn gpu_pinned_batch_matches_cpu_decoder() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    let opts = u8_opts(Layout::Nchw);
    let mut pinned = dec.pinned_batch(1 << 10).unwrap();
    for (round, imgs) in common::every_patch_size_batches().iter().enumerate() {
        pinned.clear().unwrap();
        for i in imgs {
            pinned.push(&i.file).unwrap();
        }
        assert_eq!(pinned.image_count(), imgs.len());
        let batch = dec.submit_pinned(&mut pinned, &opts).unwrap();
        let out = batch.to_host_bytes().unwrap();
        check_output(
            &out,
            batch.images(),
            imgs,
            &opts,
            &format!("pinned {round}"),
        );
    }
}

/// The caller's stream and context: decodes queued on the caller's stream, and a high-priority compute
/// stream ordered after a batch through its `ready()` event, both give the CPU decoder's bytes.
#[test]
fn gpu_caller_streams_and_ready_event() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    let imgs = common::tiny_mixed_batch();
    let opts = u8_opts(Layout::Nchw);
    // A compute stream at the highest priority waits on the decode, then copies the output back itself.
    let compute = dec.high_priority_stream().unwrap();
    let batch = dec.submit(&files(&imgs), &opts).unwrap();
    compute.wait(batch.ready()).unwrap();
    let l3_cuda::DeviceOutput::U8(out) = batch.output() else {
        panic!("u8 layout")
    };
    let host = compute.clone_dtoh(out).unwrap();
    check_output(&host, batch.images(), &imgs, &opts, "compute stream");
    batch.wait().unwrap();
    // A second decoder that decodes on that caller stream.
    let mut on_caller = BatchDecoder::with_stream(&compute).unwrap();
    assert_eq!(on_caller.decode_stream().cu_stream(), compute.cu_stream());
    let batch = on_caller.submit(&files(&imgs), &opts).unwrap();
    let out = batch.to_host_bytes().unwrap();
    check_output(&out, batch.images(), &imgs, &opts, "caller stream");
}

/// Resident input (the benchmark's path) decodes to the same bytes, repeatedly.
#[test]
fn gpu_resident_batch_matches_cpu_decoder() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    let imgs = common::tiny_mixed_batch();
    let opts = u8_opts(Layout::Nhwc);
    let resident = dec.upload(&files(&imgs), &opts).unwrap();
    for round in 0..3 {
        let batch = dec.decode_resident(&resident).unwrap();
        let out = batch.to_host_bytes().unwrap();
        check_output(
            &out,
            batch.images(),
            &imgs,
            &opts,
            &format!("resident {round}"),
        );
    }
}

/// Corrupt row data with host checking off: the kernel flags the patch, the error names the image, and the
/// other images of the batch still decode correctly.
#[test]
fn gpu_corrupt_rows_reported_by_batch_index() {
    let Some(mut dec) = decoder_or_skip() else {
        return;
    };
    let mut rng = Rng(77);
    let good = image(40, 40, 3, 16, Content::Smooth, &mut rng);
    let mut bad = image(40, 40, 3, 16, Content::Smooth, &mut rng).file;
    let start = l3_format::L3File::parse(&bad).unwrap().data_offset();
    bad[start] = (bad[start] & 0xf0) | 0x0f; // first row of patch 0, channel 0: nbit 15
    let batch = dec
        .submit(&[&good.file, &bad, &good.file], &DecodeOptions::default())
        .unwrap();
    match batch.wait() {
        Err(Error::CorruptRows {
            index: 1,
            channel: 0,
            patch: 0,
        }) => {}
        other => panic!("expected CorruptRows for image 1, got {other:?}"),
    }
}

// ---- error paths: run on every machine ----

/// No driver → NoDriver; a driver but no such device → NoDevice. Never a panic.
#[test]
fn missing_driver_or_device_is_a_typed_error() {
    match BatchDecoder::new(9999) {
        Err(Error::NoDriver) => eprintln!("no CUDA driver here: got Error::NoDriver as expected"),
        Err(Error::NoDevice { ordinal: 9999, .. }) => {}
        Err(other) => panic!("expected NoDriver or NoDevice, got {other}"),
        Ok(_) => panic!("device 9999 cannot exist"),
    }
    match l3_cuda::device_count() {
        Ok(_) | Err(Error::NoDriver) => {}
        Err(other) => panic!("device_count: {other}"),
    }
}

/// A corrupt image is rejected with its batch index by host validation, before any GPU work: the same
/// BatchPlan::new is the first thing BatchDecoder::submit does.
#[test]
fn corrupt_image_rejected_with_batch_index_before_launch() {
    let mut rng = Rng(3);
    let a = image(30, 20, 3, 8, Content::Random, &mut rng).file;
    let b = image(17, 9, 1, 4, Content::Smooth, &mut rng).file;
    // Bad magic at index 2.
    let mut bad_magic = a.clone();
    bad_magic[0] = b'X';
    match BatchPlan::new(&[&a, &b, &bad_magic], &DecodeOptions::default()) {
        Err(Error::Image {
            index: 2,
            source: l3_format::Error::BadMagic { .. },
        }) => {}
        other => panic!("expected Image{{index: 2, BadMagic}}, got {other:?}"),
    }
    // Truncated file at index 1.
    let truncated = &b[..b.len() - 3];
    let err = BatchPlan::new(&[&a, truncated, &a], &DecodeOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Image { index: 1, .. }), "{err}");
    assert!(err.to_string().starts_with("image 1 of the batch"), "{err}");
    // Corrupt row header at index 0, caught on the host when asked to walk rows.
    let mut bad_rows = a.clone();
    let start = l3_format::L3File::parse(&bad_rows).unwrap().data_offset();
    bad_rows[start] |= 0x0f;
    let strict = DecodeOptions {
        check_rows_on_host: true,
        ..Default::default()
    };
    match BatchPlan::new(&[&bad_rows, &b], &strict) {
        Err(Error::Image {
            index: 0,
            source: l3_format::Error::NbitTooLarge { .. },
        }) => {}
        other => panic!("expected Image{{index: 0, NbitTooLarge}}, got {other:?}"),
    }
    // With a GPU, submit refuses the same batch with the same error.
    if let Some(mut dec) = decoder_or_skip() {
        let err = dec
            .submit(&[&a, &b, &bad_magic], &DecodeOptions::default())
            .unwrap_err();
        assert!(matches!(err, Error::Image { index: 2, .. }), "{err}");
    }
}

#[test]
fn plan_lays_out_mixed_batch_and_validates_options() {
    let mut rng = Rng(8);
    let a = image(30, 20, 3, 8, Content::Random, &mut rng).file;
    let b = image(17, 9, 1, 4, Content::Smooth, &mut rng).file;
    let plan = BatchPlan::new(&[&a, &b, &a], &DecodeOptions::default()).unwrap();
    let s = plan.images();
    assert_eq!(
        (s[0].offset, s[1].offset, s[2].offset),
        (0, 1800, 1800 + 153)
    );
    assert_eq!(plan.output_len(), 1800 * 2 + 153);
    assert!(!plan.is_uniform());
    // One descriptor per (image, channel, patch): 4x3 patches x 3 ch, 5x3 x 1, 4x3 x 3.
    assert_eq!(plan.patch_count(), 36 + 15 + 36);
    assert!(matches!(
        BatchPlan::new(&[], &DecodeOptions::default()),
        Err(Error::EmptyBatch)
    ));
    let u8_norm = DecodeOptions {
        layout: Layout::Nchw,
        normalize: Some(Normalize::IMAGENET),
        ..Default::default()
    };
    assert!(matches!(
        BatchPlan::new(&[&a], &u8_norm),
        Err(Error::NormalizeNeedsFloat)
    ));
    let zero_std = DecodeOptions {
        dtype: DType::F32,
        normalize: Some(Normalize {
            mean: [0.0; 3],
            std: [1.0, 0.0, 1.0],
        }),
        ..Default::default()
    };
    assert!(matches!(
        BatchPlan::new(&[&a], &zero_std),
        Err(Error::BadNormalize { channel: 1, .. })
    ));
}

/// Arbitrary byte damage (header, offset table, patch data, truncation) never panics the host side, and
/// every plan it accepts keeps all descriptors inside the input and output buffers.
#[test]
fn damaged_files_never_panic_and_plans_stay_in_bounds() {
    let mut rng = Rng(2024);
    let base = image(37, 23, 3, 8, Content::Smooth, &mut rng).file;
    let other = image(5, 70, 1, 16, Content::Random, &mut rng).file;
    let (mut accepted, mut rejected) = (0, 0);
    for trial in 0..3000 {
        let mut bad = base.clone();
        match trial % 3 {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(bad.len() as u64) as usize;
                    bad[i] = rng.next() as u8;
                }
            }
            1 => {
                // Damage the header and offset table only.
                let i = rng.below(60.min(bad.len() as u64)) as usize;
                bad[i] ^= 1 << rng.below(8);
            }
            _ => bad.truncate(rng.below(bad.len() as u64) as usize),
        }
        for check_rows_on_host in [false, true] {
            let opts = DecodeOptions {
                check_rows_on_host,
                ..Default::default()
            };
            match BatchPlan::new(&[&other, &bad], &opts) {
                Ok(plan) => {
                    accepted += 1;
                    assert!(plan.descriptors_in_bounds(), "trial {trial}");
                }
                Err(Error::Image { index: 1, .. }) => rejected += 1,
                Err(e) => panic!("trial {trial}: unexpected {e}"),
            }
        }
    }
    assert!(
        accepted > 0 && rejected > 0,
        "accepted {accepted}, rejected {rejected}"
    );
}
