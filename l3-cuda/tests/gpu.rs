//! GPU tests: decoded bytes equal the CPU decoder's byte for byte. They need a CUDA GPU and are
//! `#[ignore = "needs a CUDA GPU"]`, so that a machine without one lists them as ignored, not passed; on a
//! GPU machine run them with `--include-ignored` (gpu-bin/run.sh, built by `cargo xtask gpu-bundle`, does), where a GPU that cannot be used
//! fails them with the reason. The error-path tests at the end need no GPU and run everywhere.

mod common;

use common::{Content, Rng, SampleCase, TestImage, check_output, image};
use l3_cuda::{
    BatchDecoder, BatchPlan, DecodeOptions, Error, Rect, SampleOptions, SamplePlan, SampleSource,
};
use vocab::{DType, Layout, Normalize, Window};

/// A decoder on device 0; a test that asked for the GPU fails with the reason when there is none.
fn decoder() -> BatchDecoder {
    BatchDecoder::new(0).unwrap_or_else(|e| panic!("needs a CUDA GPU: BatchDecoder::new(0): {e}"))
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
#[ignore = "needs a CUDA GPU"]
fn gpu_every_patch_size_matches_cpu_decoder() {
    // Every group and layout is checked before the test fails, and every image that differs is named:
    // which patch widths, rows and lanes go wrong is the evidence a device failure leaves.
    let mut dec = decoder();
    let mut failures = Vec::new();
    for (gi, imgs) in common::every_patch_size_batches().iter().enumerate() {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let batch = dec.submit(&files(imgs), &u8_opts(layout)).unwrap();
            let out = batch.to_host_bytes().unwrap();
            for (slot, img) in batch.images().iter().zip(imgs) {
                let got = &out[slot.offset..slot.offset + slot.len()];
                let want = common::cpu_decode(&img.file, layout);
                if let Some(report) = common::u8_mismatches(got, &want, slot, layout) {
                    failures.push(format!("group{gi} {layout:?} {}: {report}", img.label));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_tiny_mixed_and_uniform_batches_match_cpu_decoder() {
    let mut dec = decoder();
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

/// The kernel's full modes: patches as wide as their teams, NCHW rows in one vector store a lane where
/// aligned, the stage elsewhere; every layout and element type.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_full_width_patches_match_cpu_decoder() {
    let mut dec = decoder();
    for (bi, imgs) in common::full_width_batches().iter().enumerate() {
        for opts in common::every_layout_and_dtype() {
            let tag = format!("full{bi} {:?} {:?}", opts.layout, opts.dtype);
            decode_and_check(&mut dec, imgs, &opts, &tag);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_normalised_float_outputs_match() {
    let mut dec = decoder();
    let imgs = common::float_batch();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for dtype in [DType::F32, DType::F16] {
            for normalize in [None, Some(Normalize::IMAGENET)] {
                let opts = DecodeOptions {
                    layout,
                    dtype,
                    normalize,
                    ..Default::default()
                };
                let tag = format!("{layout:?} {dtype:?} {normalize:?}");
                decode_and_check(&mut dec, &imgs, &opts, &tag);
            }
        }
    }
}

/// Every PNG of ../shared/corpus at full resolution (the JPEGs' pixels come from a lossy decoder and add
/// nothing a PNG does not), encoded as version 1, version 2-BP and version 2-ANS with the default patch
/// size, each format decoded in one mixed batch, both layouts.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_corpus_matches_cpu_decoder() {
    let mut dec = decoder();
    let mut corpus = Vec::new();
    for name in [
        "UbuntuMateCold.png",
        "Gulp-rgba.png",
        "Canopee.png",
        "Cascade.png",
        "Kokkini.png",
        "Altai.png",
    ] {
        let Some(image) = common::corpus_png(name) else {
            eprintln!("skipping: corpus image {name} not found in ../shared/corpus");
            return;
        };
        corpus.push((name, image));
    }
    let formats = [
        l3_format::Format::V1,
        l3_format::Format::V2(l3_format::Profile::Bp),
        l3_format::Format::V2(l3_format::Profile::Ans),
    ];
    for format in formats {
        let imgs: Vec<TestImage> = corpus
            .iter()
            .map(|(name, (px, w, h, c))| {
                let opts = l3_format::EncodeOptions {
                    format,
                    ..l3_format::EncodeOptions::default()
                };
                TestImage {
                    file: l3_format::encode_with(px, *w, *h, *c, &opts).unwrap(),
                    label: format!("{name} {format:?}"),
                }
            })
            .collect();
        for layout in [Layout::Nhwc, Layout::Nchw] {
            decode_and_check(
                &mut dec,
                &imgs,
                &u8_opts(layout),
                &format!("corpus {format:?} {layout:?}"),
            );
        }
        eprintln!("corpus {format:?}: {} images byte-exact", imgs.len());
    }
}

/// Double buffering: several batches in flight before any is waited on, from the same two staging slots.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pipelined_batches_all_correct() {
    let mut dec = decoder();
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
#[ignore = "needs a CUDA GPU"]
fn gpu_pinned_batch_matches_cpu_decoder() {
    let mut dec = decoder();
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
#[ignore = "needs a CUDA GPU"]
fn gpu_caller_streams_and_ready_event() {
    let mut dec = decoder();
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
#[ignore = "needs a CUDA GPU"]
fn gpu_resident_batch_matches_cpu_decoder() {
    let mut dec = decoder();
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
#[ignore = "needs a CUDA GPU"]
fn gpu_corrupt_rows_reported_by_batch_index() {
    let mut dec = decoder();
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

// ---- version 2 on the GPU ----

/// Version-2 images of both profiles beside a version-1 image in one launch, every layout and element
/// type, whole-image batches and sample batches: equal to the CPU decoder and the CPU sample reference.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_v2_batches_match_cpu_decoder() {
    let mut dec = decoder();
    let imgs = common::v2_mixed_batch();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        decode_and_check(&mut dec, &imgs, &u8_opts(layout), &format!("v2 {layout:?}"));
        let opts = DecodeOptions {
            layout,
            dtype: DType::F16,
            normalize: Some(Normalize::IMAGENET),
            ..Default::default()
        };
        decode_and_check(&mut dec, &imgs, &opts, &format!("v2 {layout:?} f16"));
        for (k, dtype) in [DType::U8, DType::F32, DType::F16].into_iter().enumerate() {
            let case = common::random_v2_sample_case(0x62 + k as u64, 12, layout, dtype, None);
            samples_and_check(&mut dec, &case, &format!("v2 samples {layout:?} {dtype:?}"));
        }
    }
}

/// A damaged version-2 patch behind a valid CRC-32C is reported by batch index after the launch.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_v2_corrupt_patch_reported_by_batch_index() {
    let mut dec = decoder();
    let mut rng = Rng(77);
    // Without entry CRCs: with them, the host finds the damage before the launch (tested on the CPU).
    let good = common::image_v2_with(
        90,
        70,
        3,
        32,
        l3_format::Profile::Ans,
        Content::Smooth,
        &mut rng,
        false,
    );
    let mut bad = good.file.clone();
    let (at, decoded_len) = {
        let f = l3_format::L3File::parse(&bad).unwrap();
        (
            f.data_offset() + f.patch_range(0, 1).start + 200,
            f.decoded_len(),
        )
    };
    bad[at] ^= 0x20;
    let end = bad.len() - 4;
    let crc = l3_format::crc32c(&bad[..end]);
    bad[end..].copy_from_slice(&crc.to_le_bytes());
    let mut px = vec![0u8; decoded_len];
    assert!(
        l3_format::L3File::parse(&bad)
            .unwrap()
            .decode_hwc(&mut px)
            .is_err()
    );
    let batch = dec
        .submit(&[&good.file, &bad], &DecodeOptions::default())
        .unwrap();
    match batch.wait() {
        Err(Error::CorruptPatch { index: 1, patch: 1 }) => {}
        other => panic!("expected CorruptPatch for image 1, patch 1, got {other:?}"),
    }
}

// ---- sample batches on the GPU ----

/// Decodes `case` as one sample batch and compares it with the CPU reference.
fn samples_and_check(
    dec: &mut BatchDecoder,
    case: &SampleCase,
    tag: &str,
) -> l3_cuda::DecodedBatch {
    let parts = case.fragment_parts();
    let sources = common::sample_sources(case, &parts);
    let batch = dec
        .submit_samples(&sources, &case.windows, &case.opts)
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    let got = batch
        .to_host_bytes()
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    let want = common::reference_samples(&case.files(), &case.windows, &case.opts);
    let labels: Vec<String> = case.imgs.iter().map(|i| i.label.clone()).collect();
    common::check_samples(&got, &want, &case.opts, &labels, tag);
    batch
}

/// The six layout × element type combinations, random windows, flips, gray/RGB/RGBA, mixed sizes and
/// patch sizes, whole files and fragments: equal to the CPU reference bit for bit.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_samples_every_layout_and_dtype_match_reference() {
    let mut dec = decoder();
    let mut seed = 0x5eed;
    for layout in [Layout::Nhwc, Layout::Nchw] {
        for (dtype, normalize) in [
            (DType::U8, None),
            (DType::F16, Some(Normalize::IMAGENET)),
            (DType::F16, None),
            (DType::F32, Some(Normalize::IMAGENET)),
            (DType::F32, None),
        ] {
            seed += 1;
            let case = common::random_sample_case(seed, 24, layout, dtype, normalize);
            let batch = samples_and_check(&mut dec, &case, &format!("{layout:?} {dtype:?}"));
            let t = batch.tensor().expect("a sample batch is one tensor");
            assert_eq!(
                t.len(),
                case.windows.len() * (case.opts.width * case.opts.height * 3) as usize
            );
            assert_eq!(t.byte_len(), batch.byte_len());
        }
    }
}

/// Sample windows whose patches fill their teams: whole patch rows at aligned columns take one vector
/// store a lane (NCHW), the others the stage; every layout and element type, equal to the CPU reference.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_samples_of_whole_patch_rows_match_reference() {
    let mut dec = decoder();
    for opts in common::every_layout_and_dtype() {
        let case = common::whole_patch_row_samples(opts.layout, opts.dtype, opts.normalize);
        let tag = format!("whole patch rows {:?} {:?}", opts.layout, opts.dtype);
        samples_and_check(&mut dec, &case, &tag);
    }
}

/// Resampled batches (random-resized crops, resizes, scale jitter with `fill` padding; bilinear and
/// nearest; gray/RGB/RGBA, versions 1 and 2, 1×1 and 7×3 images; every layout and element type): equal
/// to Pillow's integer passes over `vocab::Resampling`'s tables (`common::reference_resampled`) bit for
/// bit — the CPU loader's bytes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_resampled_samples_match_reference() {
    let mut dec = decoder();
    for (tag, case) in common::resampled_cases(20, &[3, 1, 4]) {
        resampled_and_check(&mut dec, &case, false, &tag);
    }
}

/// The DeepLab recipe at full size: corpus photos scale-jittered by 0.5 to 2.0 and cropped to 512×1024
/// (padding with 114 where the crop reaches past), flipped at random, NCHW f16 normalised, read as
/// fragments (only the patches under each sample's source rectangle): equal to the reference.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_resampled_corpus_jitter_matches_reference() {
    let mut dec = decoder();
    let mut case = common::ResampledCase {
        imgs: Vec::new(),
        geometries: Vec::new(),
        interpolation: vocab::Interpolation::Bilinear,
        opts: SampleOptions {
            dtype: DType::F16,
            normalize: Some(Normalize::IMAGENET),
            fill: 114,
            ..SampleOptions::new(1024, 512)
        },
    };
    let spec = vocab::SampleSpec {
        width: 1024,
        height: 512,
        crop: vocab::Crop::Random,
        hflip: true,
        recipe: vocab::Recipe::Jitter { range: [0.5, 2.0] },
        fill: 114,
        ..vocab::SampleSpec::default()
    };
    for (k, name) in [
        "Altai.png",
        "Cascade.png",
        "Gulp-rgba.png",
        "UbuntuMateCold.png",
    ]
    .iter()
    .enumerate()
    {
        let Some((px, w, h, c)) = common::corpus_png(name) else {
            panic!("corpus image {name} not found (L3_CORPUS)");
        };
        case.imgs.push(TestImage {
            file: l3_format::encode(&px, w, h, c, 64).unwrap(),
            label: (*name).to_string(),
        });
        let key = vocab::ItemKey {
            seed: 3,
            epoch: 0,
            index: k,
        };
        case.geometries.push(spec.geometry(w, h, &key));
    }
    resampled_and_check(&mut dec, &case, true, "corpus jitter");
}

/// Submits `case` as a resampled batch (from fragments of each sample's source rectangle, or whole
/// files) and compares the device's bytes with the reference.
fn resampled_and_check(
    dec: &mut BatchDecoder,
    case: &common::ResampledCase,
    fragments: bool,
    tag: &str,
) -> l3_cuda::DecodedBatch {
    let parts: Vec<Option<common::FragmentSource>> = case
        .imgs
        .iter()
        .zip(&case.geometries)
        .map(|(img, g)| {
            let r = vocab::Resampling::new(g, case.interpolation).source();
            fragments.then(|| common::read_fragments(&img.file, r, 64))
        })
        .collect();
    let sources: Vec<SampleSource> = case
        .imgs
        .iter()
        .zip(&parts)
        .map(|(img, p)| match p {
            Some(p) => SampleSource::Fragments {
                index: &p.index,
                data: &p.data,
            },
            None => SampleSource::File(&img.file),
        })
        .collect();
    let plan = SamplePlan::resampled(&sources, &case.geometries, case.interpolation, &case.opts)
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    assert!(plan.descriptors_in_bounds(), "{tag}");
    let batch = dec
        .submit_sample_plan(std::sync::Arc::new(plan), &sources)
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    let got = batch
        .to_host_bytes()
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    let want = common::reference_resampled(case);
    let labels: Vec<String> = case.imgs.iter().map(|i| i.label.clone()).collect();
    common::check_samples(&got, &want, &case.opts, &labels, tag);
    batch
}

/// Training-sized samples (224×224 crops of full-size corpus images, mirrored at random, NCHW f16
/// normalised) from fragments: what the loader asks for.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_samples_corpus_crops_match_reference() {
    let mut dec = decoder();
    let mut rng = Rng(224);
    let mut case = SampleCase {
        imgs: Vec::new(),
        windows: Vec::new(),
        fragments: Vec::new(),
        opts: SampleOptions {
            dtype: DType::F16,
            normalize: Some(Normalize::IMAGENET),
            ..SampleOptions::new(224, 224)
        },
    };
    for name in [
        "UbuntuMateCold.png",
        "Gulp-rgba.png",
        "Canopee.png",
        "Cascade.png",
    ] {
        let Some((px, w, h, c)) = common::corpus_png(name) else {
            eprintln!("skipping: corpus image {name} not found in ../shared/corpus");
            return;
        };
        let file = l3_format::encode(&px, w, h, c, l3_format::default_patch_size(w, h)).unwrap();
        for _ in 0..4 {
            let x = rng.below(u64::from(w - 224)) as u32;
            let y = rng.below(u64::from(h - 224)) as u32;
            case.imgs.push(TestImage {
                file: file.clone(),
                label: name.into(),
            });
            case.windows.push(Window::new(
                Rect::new(x, y, 224, 224),
                0,
                0,
                rng.below(2) == 1,
            ));
            case.fragments.push(Some(4096));
        }
    }
    samples_and_check(&mut dec, &case, "corpus crops");
}

/// Many sample batches in flight through the two staging slots, with the in-flight bound at 1, 2 and 4:
/// all correct.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_samples_pipelined_with_bounded_in_flight() {
    let mut dec = decoder();
    let cases: Vec<SampleCase> = (0..6)
        .map(|i| common::random_sample_case(100 + i, 16, Layout::Nchw, DType::F16, None))
        .collect();
    for bound in [1, 2, 4] {
        dec.set_max_in_flight(bound);
        assert_eq!(dec.max_in_flight(), bound);
        let parts: Vec<_> = cases.iter().map(SampleCase::fragment_parts).collect();
        let pending: Vec<_> = cases
            .iter()
            .zip(&parts)
            .map(|(c, p)| {
                let sources = common::sample_sources(c, p);
                dec.submit_samples(&sources, &c.windows, &c.opts).unwrap()
            })
            .collect();
        for (i, (batch, case)) in pending.iter().zip(&cases).enumerate() {
            let got = batch.to_host_bytes().unwrap();
            let want = common::reference_samples(&case.files(), &case.windows, &case.opts);
            common::check_samples(
                &got,
                &want,
                &case.opts,
                &[],
                &format!("bound {bound} batch {i}"),
            );
        }
    }
}

/// The DLPack-facing surface: device pointer, shape, ordinal; a high-priority stream made to wait with
/// `wait_in` reads the finished batch; `free_after` frees it in that stream's order.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sample_batch_exports_pointer_and_events() {
    use l3_cuda::cudarc::driver::DevicePtr;
    let mut dec = decoder();
    let case = common::random_sample_case(7, 8, Layout::Nhwc, DType::U8, None);
    let parts = case.fragment_parts();
    let sources = common::sample_sources(&case, &parts);
    let compute = dec.high_priority_stream().unwrap();
    let batch = dec
        .submit_samples(&sources, &case.windows, &case.opts)
        .unwrap();
    assert_eq!(batch.device_ordinal(), 0);
    let t = batch.tensor().unwrap();
    assert_eq!(
        t.shape,
        [8, case.opts.height as usize, case.opts.width as usize, 3]
    );
    let l3_cuda::DeviceOutput::U8(out) = batch.output() else {
        panic!("u8 output")
    };
    let (ptr, _record) = out.device_ptr(&compute);
    assert_eq!(ptr, batch.device_ptr());
    drop(_record);
    // SAFETY: `compute` is a live stream of the decoder's context.
    unsafe { batch.wait_in(compute.cu_stream()) }.unwrap();
    let host = compute.clone_dtoh(out).unwrap();
    let want = common::reference_samples(&case.files(), &case.windows, &case.opts);
    common::check_samples(&host, &want, &case.opts, &[], "wait_in");
    // SAFETY: as above; nothing uses the pointer afterwards.
    unsafe { batch.free_after(compute.cu_stream()) }.unwrap();
    compute.synchronize().unwrap();
}

/// Dropping a batch that two consumer streams waited on frees it only after the work queued on both:
/// each stream's copy of the output, queued before the drop, still reads the decoded bytes (and
/// compute-sanitizer's memcheck sees no use after free).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dropped_batch_outlives_its_consumers_queued_work() {
    let mut dec = decoder();
    let case = common::random_sample_case(9, 6, Layout::Nchw, DType::U8, None);
    let parts = case.fragment_parts();
    let sources = common::sample_sources(&case, &parts);
    let (a, b) = (
        dec.high_priority_stream().unwrap(),
        dec.context().new_stream().unwrap(),
    );
    let batch = dec
        .submit_samples(&sources, &case.windows, &case.opts)
        .unwrap();
    // SAFETY: both are live streams of the decoder's context, alive past the drop below.
    unsafe {
        batch.wait_in(a.cu_stream()).unwrap();
        batch.wait_in(b.cu_stream()).unwrap();
    }
    let l3_cuda::DeviceOutput::U8(out) = batch.output() else {
        panic!("u8 output")
    };
    let (copy_a, copy_b) = (a.clone_dtod(out).unwrap(), b.clone_dtod(out).unwrap());
    drop(batch);
    let want = common::reference_samples(&case.files(), &case.windows, &case.opts);
    for (s, copy, tag) in [(&a, &copy_a, "stream a"), (&b, &copy_b, "stream b")] {
        let host = s.clone_dtoh(copy).unwrap();
        common::check_samples(&host, &want, &case.opts, &[], tag);
    }
}

/// Resident sample input (the kernel-speed path) decodes to the same bytes, repeatedly.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_resident_samples_match_reference() {
    let mut dec = decoder();
    let case =
        common::random_sample_case(55, 12, Layout::Nchw, DType::F32, Some(Normalize::IMAGENET));
    let parts = case.fragment_parts();
    let sources = common::sample_sources(&case, &parts);
    let resident = dec
        .upload_samples(&sources, &case.windows, &case.opts)
        .unwrap();
    assert!(resident.sample_plan().is_some() && resident.plan().is_none());
    let want = common::reference_samples(&case.files(), &case.windows, &case.opts);
    for round in 0..3 {
        let got = dec
            .decode_resident(&resident)
            .unwrap()
            .to_host_bytes()
            .unwrap();
        common::check_samples(&got, &want, &case.opts, &[], &format!("resident {round}"));
    }
}

/// A corrupt row header under a window: the kernel flags it, the error names the sample's batch index.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sample_corrupt_rows_reported_by_batch_index() {
    let mut dec = decoder();
    let mut rng = Rng(78);
    let good = image(40, 40, 3, 16, Content::Smooth, &mut rng);
    let mut bad = image(40, 40, 3, 16, Content::Smooth, &mut rng).file;
    let start = l3_format::L3File::parse(&bad).unwrap().data_offset();
    bad[start] = (bad[start] & 0xf0) | 0x0f; // row 0 of patch 0, channel 0: nbit 15
    let sources = [
        SampleSource::File(&good.file),
        SampleSource::File(&good.file),
        SampleSource::File(&bad),
    ];
    let w = Window::new(Rect::new(0, 0, 20, 20), 2, 2, true);
    let batch = dec
        .submit_samples(&sources, &[w; 3], &SampleOptions::new(24, 24))
        .unwrap();
    match batch.wait() {
        Err(Error::CorruptRows {
            index: 2,
            channel: 0,
            patch: 0,
        }) => {}
        other => panic!("expected CorruptRows for sample 2, got {other:?}"),
    }
}

// ---- error paths: no GPU needed, run on every machine ----

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
}

/// On a GPU, submit refuses a corrupt image with the same error, before any GPU work.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_submit_rejects_corrupt_image_with_batch_index() {
    let mut dec = decoder();
    let mut rng = Rng(3);
    let a = image(30, 20, 3, 8, Content::Random, &mut rng).file;
    let b = image(17, 9, 1, 4, Content::Smooth, &mut rng).file;
    let mut bad_magic = a.clone();
    bad_magic[0] = b'X';
    let err = dec
        .submit(&[&a, &b, &bad_magic], &DecodeOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::Image { index: 2, .. }), "{err}");
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

/// Sample plans validate everything before any GPU work, naming the batch index: a corrupt file, a
/// window outside its image or its sample, bytes missing from fragments, counts, sizes, overflow.
#[test]
fn sample_plan_rejects_bad_input_with_batch_index() {
    let mut rng = Rng(12);
    let a = image(30, 20, 3, 8, Content::Random, &mut rng).file;
    let b = image(17, 9, 1, 4, Content::Smooth, &mut rng).file;
    let opts = SampleOptions::new(16, 8);
    let fit = Window::new(Rect::new(2, 1, 16, 8), 0, 0, false);
    let small = Window::new(Rect::new(0, 0, 10, 5), 3, 2, true);
    fn src(f: &[u8]) -> SampleSource<'_> {
        SampleSource::File(f)
    }
    let ok = SamplePlan::new(&[src(&a), src(&b)], &[fit, small], &opts).unwrap();
    assert!(ok.descriptors_in_bounds());
    assert_eq!(ok.tensor().shape, [2, 3, 8, 16]);
    assert_eq!(ok.sample_len(), 16 * 8 * 3);
    assert!(ok.fill_count() > 0);
    // Bad magic at index 1.
    let mut bad = b.clone();
    bad[0] = b'X';
    let e = SamplePlan::new(&[src(&a), src(&bad)], &[fit, small], &opts).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Image {
                index: 1,
                source: l3_format::Error::BadMagic { .. }
            }
        ),
        "{e}"
    );
    // Windows outside the image: past its right edge, empty, past the bottom.
    for w in [
        Window::new(Rect::new(15, 0, 16, 8), 0, 0, false),
        Window::new(Rect::new(0, 0, 0, 8), 0, 0, false),
        Window::new(Rect::new(0, 13, 16, 8), 0, 0, false),
    ] {
        match SamplePlan::new(&[src(&b), src(&a)], &[small, w], &opts) {
            Err(Error::BadWindow {
                index: 1,
                what: "image",
                width: 30,
                height: 20,
                ..
            }) => {}
            other => panic!("{w}: expected BadWindow(image) for 1, got {other:?}"),
        }
    }
    // Windows that do not fit the sample: too wide, placed too far right or down.
    for w in [
        Window::new(Rect::new(0, 0, 17, 8), 0, 0, false),
        Window::new(Rect::new(0, 0, 16, 8), 1, 0, true),
        Window::new(Rect::new(0, 0, 4, 4), 0, 5, false),
    ] {
        let e = SamplePlan::new(&[src(&a)], &[w], &opts).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadWindow {
                    index: 0,
                    what: "sample",
                    width: 16,
                    height: 8,
                    ..
                }
            ),
            "{w}: {e}"
        );
        assert!(
            e.to_string().starts_with("sample 0 of the batch: window"),
            "{e}"
        );
    }
    // Fragments that lack the window's patches.
    let far = Window::new(Rect::new(14, 12, 16, 8), 0, 0, false);
    let read = common::read_fragments(&a, Rect::new(0, 0, 8, 8), 0);
    let frag = SampleSource::Fragments {
        index: &read.index,
        data: &read.data,
    };
    let e = SamplePlan::new(&[src(&b), frag], &[small, far], &opts).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Image {
                index: 1,
                source: l3_format::Error::MissingBytes { .. }
            }
        ),
        "{e}"
    );
    // Counts, sizes, options.
    assert!(matches!(
        SamplePlan::new(&[], &[], &opts),
        Err(Error::EmptyBatch)
    ));
    assert!(matches!(
        SamplePlan::new(&[src(&a)], &[fit, fit], &opts),
        Err(Error::WindowCount {
            sources: 1,
            windows: 2
        })
    ));
    assert!(matches!(
        SamplePlan::new(&[src(&a)], &[fit], &SampleOptions::new(0, 8)),
        Err(Error::BadSampleSize {
            width: 0,
            height: 8
        })
    ));
    let u8_norm = SampleOptions {
        normalize: Some(Normalize::IMAGENET),
        ..opts
    };
    assert!(matches!(
        SamplePlan::new(&[src(&a)], &[fit], &u8_norm),
        Err(Error::NormalizeNeedsFloat)
    ));
    // Output size overflow: 2^31 x 2^31 samples.
    let huge = SampleOptions {
        dtype: DType::F32,
        ..SampleOptions::new(1 << 31, 1 << 31)
    };
    assert!(matches!(
        SamplePlan::new(&[src(&a)], &[fit], &huge),
        Err(Error::TooLarge { .. })
    ));
    // Corrupt row under the window, caught on the host when asked to walk rows (with the index).
    let mut bad_rows = a.clone();
    let start = l3_format::L3File::parse(&bad_rows).unwrap().data_offset();
    bad_rows[start] |= 0x0f;
    let strict = SampleOptions {
        check_rows_on_host: true,
        ..opts
    };
    let corner = Window::new(Rect::new(0, 0, 4, 4), 0, 0, false);
    match SamplePlan::new(&[src(&b), src(&bad_rows)], &[small, corner], &strict) {
        Err(Error::Image {
            index: 1,
            source: l3_format::Error::NbitTooLarge { .. },
        }) => {}
        other => panic!("expected Image{{index: 1, NbitTooLarge}}, got {other:?}"),
    }
    // The same window elsewhere does not read the bad patch.
    let away = Window::new(Rect::new(20, 10, 4, 4), 0, 0, false);
    assert!(SamplePlan::new(&[src(&b), src(&bad_rows)], &[small, away], &strict).is_ok());
}

/// On a GPU, submit_samples refuses a corrupt image with the same error, before any GPU work.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_submit_samples_rejects_corrupt_image_with_batch_index() {
    let mut dec = decoder();
    let mut rng = Rng(12);
    let a = image(30, 20, 3, 8, Content::Random, &mut rng).file;
    let mut bad = image(17, 9, 1, 4, Content::Smooth, &mut rng).file;
    bad[0] = b'X';
    let opts = SampleOptions::new(16, 8);
    let fit = Window::new(Rect::new(2, 1, 16, 8), 0, 0, false);
    let small = Window::new(Rect::new(0, 0, 10, 5), 3, 2, true);
    let e = dec
        .submit_samples(
            &[SampleSource::File(&a), SampleSource::File(&bad)],
            &[fit, small],
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, Error::Image { index: 1, .. }), "{e}");
}

/// A one-patch image read as fragments: its channels are split by walking its rows and proved against
/// its offset table; damaged patch bytes that move a channel boundary are refused, never mis-split.
#[test]
fn one_patch_fragments_split_or_refused() {
    let mut rng = Rng(99);
    let img = image(20, 10, 4, 32, Content::Random, &mut rng).file;
    let all = Rect::new(0, 0, 20, 10);
    let read = common::read_fragments(&img, all, 0);
    let src = SampleSource::Fragments {
        index: &read.index,
        data: &read.data,
    };
    let win = Window::new(all, 0, 0, false);
    let from_frag = SamplePlan::new(&[src], &[win], &SampleOptions::new(20, 10)).unwrap();
    let from_file = SamplePlan::new(
        &[SampleSource::File(&img)],
        &[win],
        &SampleOptions::new(20, 10),
    )
    .unwrap();
    assert_eq!(from_frag.input_len(), from_file.input_len());
    assert_eq!(from_frag.patch_count(), 3);
    // Channel 0's first row claims more bits per pixel: its rows now end elsewhere.
    let (mut refused, mut accepted) = (0, 0);
    for nbit in 0..16u8 {
        let mut bad = img.clone();
        let start = l3_format::L3File::parse(&bad).unwrap().data_offset();
        bad[start] = (bad[start] & 0xf0) | nbit;
        let read = common::read_fragments(&bad, all, 0);
        let src = SampleSource::Fragments {
            index: &read.index,
            data: &read.data,
        };
        match SamplePlan::new(&[src], &[win], &SampleOptions::new(20, 10)) {
            Ok(p) => {
                accepted += 1;
                assert!(p.descriptors_in_bounds());
            }
            Err(Error::OffsetTableMismatch { index: 0 } | Error::Image { index: 0, .. }) => {
                refused += 1
            }
            Err(e) => panic!("nbit {nbit}: {e}"),
        }
    }
    assert!(
        refused > 0 && accepted > 0,
        "refused {refused}, accepted {accepted}"
    );
}

/// Arbitrary damage to files and arbitrary windows never panic sample planning, and every plan it
/// accepts keeps all descriptors inside the input and inside their own samples.
#[test]
fn damaged_files_and_random_windows_sample_plans_stay_in_bounds() {
    let mut rng = Rng(4048);
    let base = image(37, 23, 3, 8, Content::Smooth, &mut rng).file;
    let other = image(5, 70, 1, 16, Content::Random, &mut rng).file;
    let (mut accepted, mut rejected) = (0, 0);
    for trial in 0..2000 {
        let mut bad = base.clone();
        match trial % 3 {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(bad.len() as u64) as usize;
                    bad[i] = rng.next() as u8;
                }
            }
            1 => {
                let i = rng.below(60.min(bad.len() as u64)) as usize;
                bad[i] ^= 1 << rng.below(8);
            }
            _ => bad.truncate(rng.below(bad.len() as u64) as usize),
        }
        let r = |rng: &mut Rng, n: u64| rng.below(n) as u32;
        let win = Window::new(
            Rect::new(
                r(&mut rng, 40),
                r(&mut rng, 26),
                r(&mut rng, 40),
                r(&mut rng, 26),
            ),
            r(&mut rng, 20),
            r(&mut rng, 20),
            rng.below(2) == 1,
        );
        let layout = [Layout::Nhwc, Layout::Nchw][trial % 2];
        let opts = SampleOptions {
            layout,
            check_rows_on_host: trial % 4 < 2,
            ..SampleOptions::new(24, 30)
        };
        let sources = [SampleSource::File(&other), SampleSource::File(&bad)];
        let windows = [Window::new(Rect::new(0, 0, 5, 30), 19, 0, true), win];
        match SamplePlan::new(&sources, &windows, &opts) {
            Ok(plan) => {
                accepted += 1;
                assert!(plan.descriptors_in_bounds(), "trial {trial}");
            }
            Err(Error::Image { index: 1, .. } | Error::BadWindow { index: 1, .. }) => rejected += 1,
            Err(e) => panic!("trial {trial}: unexpected {e}"),
        }
    }
    assert!(
        accepted > 0 && rejected > 0,
        "accepted {accepted}, rejected {rejected}"
    );
}
