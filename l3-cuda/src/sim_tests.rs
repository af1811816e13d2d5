//! Runs the real kernel source (kernel.cu) on the CPU through cpu-sim/harness.cpp and the toolkit's CUDA
//! simulator (`cuda-sim`: every CUDA thread a fiber, barriers and warp votes real), with launch parameters
//! and descriptor tables from the real host plan, and compares every output byte with `l3-format`'s CPU
//! decoder. The same launches run under AddressSanitizer (no read or write outside any buffer, including on
//! corrupt input) and ThreadSanitizer (every shared-memory access ordered by the kernel's barriers); the
//! simulator's own self-checks (a race, an overflow, a divergent barrier caught) are cuda-sim's tests.
//! The harness and the kernel are embedded in the test binary. Needs a C++20 compiler (`c++`, or `$CXX`);
//! without one the tests print why and skip.

#[path = "../tests/common/mod.rs"]
pub(crate) mod common;

use crate::layout::{V2_BLOCK, v1_blocks};
use crate::plan::{BatchPlan, DecodeOptions};
use crate::sample::{SamplePlan, SampleSource};
use common::{Content, Rng, SampleCase, TestImage, image};
use cuda_sim::{Flavour, Harness, harness_or_skip};
use std::path::Path;
use vocab::{DType, Layout, Normalize};

/// The harness: the launch-file reader and the kernel, built once per flavour.
static HARNESS: Harness = Harness::new(
    "l3-cuda",
    include_str!("../cpu-sim/harness.cpp"),
    &[("kernel.cu", crate::KERNEL_SOURCE)],
    &[],
);

/// What one simulated launch produced.
struct SimRun {
    err: u32,
    /// The bucket words the launch built from its ANS tables.
    buckets: Vec<u32>,
    out: Vec<u8>,
}

fn run_sim(exe: &Path, plan: &BatchPlan, images: &[&[u8]], tag: &str) -> SimRun {
    let mut data = vec![0u8; plan.data_len];
    plan.pack_into(images, &mut data);
    run_sim_data(exe, plan, &data, tag)
}

/// One launch of the harness: everything `cpu-sim/harness.cpp` reads.
struct Launch<'a> {
    samples: bool,
    dtype: DType,
    grid: u32,
    block: u32,
    smem: u32,
    stage_cap: u32,
    n_descs: u32,
    n_fills: u32,
    /// Sample width, height, and 1 for NCHW (sample launches only).
    sample: [u32; 3],
    data: &'a [u8],
    descs: Vec<u8>,
    fills: Vec<u8>,
    scale_bias: [f32; 8],
    out_bytes: usize,
    /// Version-2 descriptors (count and bytes), ANS context tables, scratch bytes: the second launch,
    /// in blocks of [`V2_BLOCK`] threads.
    n_v2: u32,
    v2: Vec<u8>,
    tables: Vec<u8>,
    scratch: u64,
    bucket_words: u64,
    /// Mode 2 (a resampled batch): the passes' part of the launch file, after the decode's.
    resample: Option<Vec<u8>>,
}

/// Runs the launch `plan` describes over the device input bytes `data`.
fn run_sim_data(exe: &Path, plan: &BatchPlan, data: &[u8], tag: &str) -> SimRun {
    assert!(
        plan.descriptors_in_bounds(),
        "{tag}: a descriptor points outside the buffers"
    );
    assert_eq!(data.len(), plan.data_len);
    let launch = Launch {
        samples: false,
        dtype: plan.dtype,
        grid: v1_blocks(plan.descs.len(), plan.block_dim),
        block: plan.block_dim,
        smem: plan.shared_bytes(),
        stage_cap: plan.stage_cap,
        n_descs: plan.descs.len() as u32,
        n_fills: 0,
        sample: [0; 3],
        data,
        descs: plan.descriptor_bytes().to_vec(),
        fills: Vec::new(),
        scale_bias: plan.scale_bias,
        out_bytes: plan.out_len * plan.dtype.size(),
        n_v2: plan.v2.descs.len() as u32,
        v2: plan.v2.descriptor_bytes().to_vec(),
        tables: plan.v2.tables.clone(),
        scratch: plan.v2.scratch_len,
        bucket_words: plan.v2.bucket_words,
        resample: None,
    };
    run_launch(exe, &launch, tag, 0xA5)
}

/// Packs `sources` as the plan says and runs its launch (output pre-filled with `fill_byte`).
fn run_sim_samples(
    exe: &Path,
    plan: &SamplePlan,
    sources: &[SampleSource<'_>],
    tag: &str,
    fill_byte: u8,
) -> SimRun {
    assert!(
        plan.descriptors_in_bounds(),
        "{tag}: a descriptor points outside the buffers"
    );
    let mut data = vec![0u8; plan.data_len];
    plan.pack_into(sources, &mut data)
        .expect("sources match the plan");
    let (w, h) = plan.sample_size();
    let launch = Launch {
        samples: true,
        dtype: plan.tensor.dtype,
        grid: v1_blocks(plan.descs.len(), plan.block_dim) + plan.fills.len() as u32,
        block: plan.block_dim,
        smem: plan.shared_bytes(),
        stage_cap: plan.stage_cap,
        n_descs: plan.descs.len() as u32,
        n_fills: plan.fills.len() as u32,
        sample: [w, h, plan.nchw()],
        data: &data,
        descs: plan.descriptor_bytes().to_vec(),
        fills: plan.fill_bytes().to_vec(),
        scale_bias: plan.scale_bias,
        out_bytes: plan.tensor.len() * plan.tensor.dtype.size(),
        n_v2: plan.v2.descs.len() as u32,
        v2: plan.v2.descriptor_bytes().to_vec(),
        tables: plan.v2.tables.clone(),
        scratch: plan.v2.scratch_len,
        bucket_words: plan.v2.bucket_words,
        resample: plan.resample.as_ref().map(|r| {
            let mut t = Vec::new();
            let kind: u32 = match r.tensor.dtype {
                DType::U8 => 0,
                DType::F32 => 1,
                DType::F16 => 2,
            };
            let (sw, sh) = r.tensor.sample_size();
            let n = r.descs.len() as u32;
            for v in [
                kind,
                n,
                r.rows,
                sw,
                sh,
                r.nchw(),
                u32::from(r.fill),
                r.h_blocks(),
                r.v_blocks(),
            ] {
                t.extend_from_slice(&v.to_le_bytes());
            }
            let bytes = r.bytes();
            let (sb_at, tab_at) = r.sections();
            for blob in [&bytes[..sb_at], &bytes[sb_at..tab_at], &bytes[tab_at..]] {
                t.extend_from_slice(&(blob.len() as u64).to_le_bytes());
                t.extend_from_slice(blob);
            }
            t.extend_from_slice(&(r.tmp_len as u64).to_le_bytes());
            t.extend_from_slice(&((r.tensor.len() * r.tensor.dtype.size()) as u64).to_le_bytes());
            t
        }),
    };
    run_launch(exe, &launch, tag, fill_byte)
}

fn run_launch(exe: &Path, l: &Launch, tag: &str, fill_byte: u8) -> SimRun {
    let kind: u32 = match l.dtype {
        DType::U8 => 0,
        DType::F32 => 1,
        DType::F16 => 2,
    };
    let sb: Vec<u8> = l.scale_bias.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut f = Vec::new();
    let mode = if l.resample.is_some() {
        2
    } else {
        u32::from(l.samples)
    };
    for v in [
        mode,
        kind,
        l.grid,
        l.block,
        l.smem,
        l.stage_cap,
        l.n_descs,
        l.n_fills,
        l.sample[0],
        l.sample[1],
        l.sample[2],
    ] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    // The patch bytes as the device input holds them: WINDOW_SLACK zero bytes after the last patch, and
    // no more (the ASan flavour reports a window that reads past them).
    let data = [l.data, &[0u8; crate::input::WINDOW_SLACK][..]].concat();
    for blob in [&data[..], &l.descs[..], &l.fills[..], &sb[..]] {
        f.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        f.extend_from_slice(blob);
    }
    f.extend_from_slice(&(l.out_bytes as u64).to_le_bytes());
    f.extend_from_slice(&l.n_v2.to_le_bytes());
    f.extend_from_slice(&V2_BLOCK.to_le_bytes());
    for blob in [&l.v2[..], &l.tables[..]] {
        f.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        f.extend_from_slice(blob);
    }
    f.extend_from_slice(&l.scratch.to_le_bytes());
    f.extend_from_slice(&l.bucket_words.to_le_bytes());
    if let Some(tail) = &l.resample {
        f.extend_from_slice(tail);
    }
    let fill = fill_byte.to_string();
    let bytes = cuda_sim::run(exe, tag, &f, &[&fill]).unwrap_or_else(|e| panic!("{e}"));
    let words = 4 + 4 * l.bucket_words as usize;
    SimRun {
        err: u32::from_le_bytes(bytes[..4].try_into().unwrap()),
        buckets: bytes[4..words]
            .chunks(4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
            .collect(),
        out: bytes[words..].to_vec(),
    }
}

/// Plans `imgs` as one batch, runs the simulated kernel and checks every image against the CPU decoder.
fn check_batch(exe: &Path, imgs: &[TestImage], opts: &DecodeOptions, tag: &str) {
    let files: Vec<&[u8]> = imgs.iter().map(|i| i.file.as_slice()).collect();
    let plan = BatchPlan::new(&files, opts).expect("plan");
    let run = run_sim(exe, &plan, &files, tag);
    assert_eq!(
        run.err,
        u32::MAX,
        "{tag}: kernel flagged descriptor {}",
        run.err
    );
    common::check_output(&run.out, &plan.images, imgs, opts, tag);
}

fn u8_opts(layout: Layout) -> DecodeOptions {
    DecodeOptions {
        layout,
        ..Default::default()
    }
}

/// Every patch size 1..=255 on small images (partial and 1-pixel-wide edge patches), all channel counts,
/// random, constant and smooth content; batches grouped by block size, mixing shapes within each.
#[test]
fn sim_every_patch_size_matches_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    for (gi, imgs) in common::every_patch_size_batches().iter().enumerate() {
        check_batch(
            exe,
            imgs,
            &u8_opts(Layout::Nchw),
            &format!("nchw-group{gi}"),
        );
        check_batch(
            exe,
            imgs,
            &u8_opts(Layout::Nhwc),
            &format!("nhwc-group{gi}"),
        );
    }
}

/// The decoder's self-check batches: the simulated kernels pass them, the plans put the version-1 ones in
/// blocks of 32 and 64 threads (several patches to a warp, which is what they are there to catch) and
/// the last has version-2 patches alone, and a single wrong byte in the output is named by image, byte
/// and value.
#[test]
fn sim_self_check_batches_pass_and_a_wrong_byte_is_named() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let batches = crate::self_check::batches().unwrap();
    let blocks: Vec<(u32, usize, usize)> = batches
        .iter()
        .map(|probes| {
            let files: Vec<&[u8]> = probes.iter().map(|p| p.file.as_slice()).collect();
            let plan = BatchPlan::new(&files, &u8_opts(Layout::Nchw)).unwrap();
            let run = run_sim(exe, &plan, &files, "self-check");
            assert_eq!(run.err, u32::MAX, "no patch fails");
            let offsets: Vec<usize> = plan.images.iter().map(|s| s.offset).collect();
            assert_eq!(
                crate::self_check::first_difference(probes, &run.out, &offsets),
                None
            );
            if plan.v2.descs.is_empty() {
                // The full-width probes: the first at an offset vector stores can take, the last not.
                let last = offsets[offsets.len() - 1];
                assert!(
                    offsets[0].is_multiple_of(8) && !last.is_multiple_of(8),
                    "{offsets:?}"
                );
            }
            let mut bad = run.out.clone();
            let k = offsets[1] + 5;
            bad[k] ^= 1;
            let said = crate::self_check::first_difference(probes, &bad, &offsets).unwrap();
            assert!(
                said.starts_with(&probes[1].label) && said.contains("byte 5 is"),
                "{said}"
            );
            (plan.block_dim, plan.descs.len(), plan.v2.descs.len())
        })
        .collect();
    // Version 1 in blocks of 32 and 64 threads; then version 2 alone, a warp a patch (V2_BLOCK).
    assert_eq!(
        blocks.iter().map(|b| b.0).take(2).collect::<Vec<_>>(),
        [32, 64]
    );
    assert!(blocks[..2].iter().all(|b| b.1 > 0 && b.2 == 0));
    assert!(blocks[2].1 == 0 && blocks[2].2 == 28, "{blocks:?}");
}

/// Patches as wide as their teams, whole images in every layout and element type: the kernel's full
/// modes (NCHW rows in one vector store a lane where aligned, the stage elsewhere). The simulation stops
/// on a vector store a device would fault on.
#[test]
fn sim_full_width_patches_match_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    for (bi, imgs) in common::full_width_batches().iter().enumerate() {
        for opts in common::every_layout_and_dtype() {
            let tag = format!("full{bi}-{:?}-{:?}", opts.layout, opts.dtype);
            check_batch(exe, imgs, &opts, &tag);
        }
    }
}

/// 1×1 images, single rows and columns, in one mixed batch with a larger image of each channel count.
#[test]
fn sim_tiny_and_mixed_batch_matches_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let imgs = common::tiny_mixed_batch();
    check_batch(exe, &imgs, &u8_opts(Layout::Nchw), "tiny-nchw");
    check_batch(exe, &imgs, &u8_opts(Layout::Nhwc), "tiny-nhwc");
}

/// A fixed-size batch (the descriptor fast path).
#[test]
fn sim_uniform_batch_matches_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let imgs = common::uniform_batch();
    let files: Vec<&[u8]> = imgs.iter().map(|i| i.file.as_slice()).collect();
    assert!(
        BatchPlan::new(&files, &DecodeOptions::default())
            .unwrap()
            .is_uniform()
    );
    check_batch(exe, &imgs, &u8_opts(Layout::Nchw), "uniform");
}

/// f32 and f16 outputs, NCHW and NHWC, with normalisation fused: exactly `fma(v, 1/std, -mean/std)`, and
/// f16 rounded to nearest even like the `half` crate.
#[test]
fn sim_normalised_float_outputs_match() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
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
                check_batch(
                    exe,
                    &imgs,
                    &opts,
                    &format!("{layout:?}-{dtype:?}-{}", normalize.is_some()),
                );
            }
        }
    }
}

/// A crop of a real corpus image (PNG render), every channel count the corpus has.
#[test]
fn sim_corpus_crop_matches_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let mut imgs = Vec::new();
    for (name, x0, y0) in [
        ("UbuntuMateCold.png", 700u32, 500u32),
        ("Gulp-rgba.png", 900, 400),
    ] {
        let Some((px, w, _h, c)) = common::corpus_png(name) else {
            stdx::testing::skip(format_args!(
                "corpus image {name} not found in ../shared/corpus"
            ));
            return;
        };
        let (cw, ch) = (203u32, 71u32);
        let px = common::crop(&px, w, c, x0, y0, cw, ch);
        for n in [32u8, 100] {
            imgs.push(TestImage {
                file: l3_format::encode(&px, cw, ch, c, n).unwrap(),
                label: format!("{name} crop N={n}"),
            });
        }
    }
    check_batch(exe, &imgs, &u8_opts(Layout::Nhwc), "corpus-nhwc");
    check_batch(exe, &imgs, &u8_opts(Layout::Nchw), "corpus-nchw");
}

/// Same launches under AddressSanitizer + UBSan: no access outside any buffer.
#[test]
fn sim_asan_clean() {
    let exe = harness_or_skip!(HARNESS, Flavour::Asan);
    let mut rng = Rng(5);
    let imgs = vec![
        image(1, 1, 1, 1, Content::Random, &mut rng),
        image(129, 67, 3, 128, Content::Random, &mut rng),
        image(255, 10, 4, 255, Content::Random, &mut rng),
        image(40, 30, 3, 7, Content::Smooth, &mut rng),
    ];
    check_batch(exe, &imgs, &u8_opts(Layout::Nhwc), "asan-nhwc");
    check_batch(
        exe,
        &imgs,
        &DecodeOptions {
            layout: Layout::Nchw,
            dtype: DType::F16,
            normalize: Some(Normalize::IMAGENET),
            check_rows_on_host: false,
        },
        "asan-f16",
    );
    // The full modes: vector stores of NCHW rows (u8, f32), the stage elsewhere (NHWC).
    let full = &common::full_width_batches()[1];
    for (layout, dtype) in [
        (Layout::Nchw, DType::U8),
        (Layout::Nchw, DType::F32),
        (Layout::Nhwc, DType::U8),
    ] {
        let opts = DecodeOptions {
            layout,
            dtype,
            ..Default::default()
        };
        check_batch(exe, full, &opts, &format!("asan-full-{layout:?}-{dtype:?}"));
    }
    // Resampled batches: the decode into the intermediate and both passes read and write inside their
    // buffers (each allocated to its exact size by the harness), for RGB, luma and RGBA batches (whose
    // intermediates hold 3, 3 and 4 channels) and a batch of label maps (one channel throughout).
    for (interpolation, channels) in [
        (vocab::Interpolation::Bilinear, 3),
        (vocab::Interpolation::Bilinear, 1),
        (vocab::Interpolation::Bilinear, 4),
        (vocab::Interpolation::Nearest, 4),
    ] {
        let case = common::resampled_case(
            77,
            12,
            channels,
            Layout::Nchw,
            DType::F16,
            None,
            interpolation,
        );
        let tag = format!("asan-resampled-{interpolation:?}-{channels}");
        check_resampled_case(exe, &case, &tag);
    }
    check_label_maps(exe, 0x3a5a, 10, "asan-label-maps");
}

/// ThreadSanitizer: the kernel's barriers order every shared-memory write before the reads of it.
#[test]
fn sim_tsan_race_free() {
    let exe = harness_or_skip!(HARNESS, Flavour::Tsan);
    let mut rng = Rng(11);
    let imgs = vec![
        image(70, 19, 3, 64, Content::Random, &mut rng),
        image(9, 9, 1, 4, Content::Smooth, &mut rng),
    ];
    check_batch(exe, &imgs, &u8_opts(Layout::Nchw), "tsan");
}

/// Corrupted patch bytes (offsets intact): the kernel accepts a patch exactly when the CPU decoder does,
/// then produces its bytes; otherwise it flags the lowest bad descriptor, which maps back to the image's
/// batch index. Runs under ASan, so no corrupt input reads outside the batch's buffers.
#[test]
fn sim_corrupt_rows_flagged_like_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Asan);
    let mut rng = Rng(1234);
    let good = image(50, 40, 3, 16, Content::Smooth, &mut rng);
    let (mut flagged, mut accepted) = (0, 0);
    for trial in 0..40 {
        let mut bad = image(45, 38, 3, 16, Content::Random, &mut rng).file;
        let f = l3_format::L3File::parse(&bad).unwrap();
        let start = f.data_offset();
        for _ in 0..1 + trial % 3 {
            let i = start + rng.below((bad.len() - start) as u64) as usize;
            bad[i] ^= 1 << rng.below(8);
        }
        let files: Vec<&[u8]> = vec![&good.file, &good.file, &bad];
        let plan = BatchPlan::new(&files, &DecodeOptions::default()).expect("offsets are intact");
        let run = run_sim(exe, &plan, &files, "corrupt");
        let f = l3_format::L3File::parse(&bad).unwrap();
        let mut cpu = vec![0u8; f.decoded_len()];
        let cpu_ok = f.decode_chw(&mut cpu).is_ok();
        let host_check = f.check_rows().is_ok();
        assert_eq!(
            cpu_ok, host_check,
            "trial {trial}: host row walk disagrees with the CPU decoder"
        );
        if cpu_ok {
            accepted += 1;
            assert_eq!(
                run.err,
                u32::MAX,
                "trial {trial}: kernel rejected what the CPU decodes"
            );
            let slot = plan.images[2];
            assert_eq!(
                &run.out[slot.offset..slot.offset + slot.len()],
                cpu.as_slice()
            );
        } else {
            flagged += 1;
            match plan.kernel_error(run.err) {
                Err(crate::Error::CorruptRows { index: 2, .. }) => {}
                other => panic!("trial {trial}: expected CorruptRows for image 2, got {other:?}"),
            }
            // With host checking on, the same batch is refused before any launch, naming image 2.
            let strict = DecodeOptions {
                check_rows_on_host: true,
                ..Default::default()
            };
            match BatchPlan::new(&files, &strict) {
                Err(crate::Error::Image { index: 2, .. }) => {}
                other => panic!("trial {trial}: host check should reject image 2, got {other:?}"),
            }
        }
    }
    assert!(
        flagged > 0 && accepted > 0,
        "flagged {flagged}, accepted {accepted}"
    );
}

/// The PinnedBatch path: whole files back to back, descriptors pointing inside them (no packing).
#[test]
fn sim_in_place_plan_matches_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Asan);
    let imgs = common::tiny_mixed_batch();
    let mut all = Vec::new();
    let mut starts = Vec::new();
    for i in &imgs {
        starts.push(all.len());
        all.extend_from_slice(&i.file);
    }
    let files: Vec<&[u8]> = imgs.iter().map(|i| i.file.as_slice()).collect();
    let opts = u8_opts(Layout::Nhwc);
    let plan = BatchPlan::new_in_place(&files, &starts, all.len(), &opts).unwrap();
    let run = run_sim_data(exe, &plan, &all, "in-place");
    assert_eq!(run.err, u32::MAX);
    common::check_output(&run.out, &plan.images, &imgs, &opts, "in-place");
}

// ---- Sample batches: windows, flips, channel mapping, padding, every layout and element type ----

/// Plans `case`, runs the simulated sample kernel and compares every element with the CPU reference
/// (`common::reference_samples`). Returns the plan for further checks.
fn check_samples_case(exe: &Path, case: &SampleCase, tag: &str, fill_byte: u8) -> SamplePlan {
    let parts = case.fragment_parts();
    let sources = common::sample_sources(case, &parts);
    let plan = SamplePlan::new(&sources, &case.windows, &case.opts)
        .unwrap_or_else(|e| panic!("{tag}: plan: {e}"));
    let run = run_sim_samples(exe, &plan, &sources, tag, fill_byte);
    assert_eq!(
        run.err,
        u32::MAX,
        "{tag}: kernel flagged {:?}",
        plan.kernel_error(run.err)
    );
    let want = common::reference_samples(&case.files(), &case.windows, &case.opts);
    let labels: Vec<String> = case
        .imgs
        .iter()
        .zip(&case.windows)
        .zip(&case.fragments)
        .map(|((i, w), f)| format!("{} window {w} fragments {f:?}", i.label))
        .collect();
    common::check_samples(&run.out, &want, &case.opts, &labels, tag);
    plan
}

/// Sample windows whose patches fill their teams: where a window holds whole patch rows at aligned
/// columns (NCHW) a lane stores its row in one vector store, elsewhere through the stage; every layout
/// and element type equal to the CPU reference bit for bit. The simulation stops on a vector store a
/// device would fault on.
#[test]
fn sim_samples_of_whole_patch_rows_match_reference() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    for opts in common::every_layout_and_dtype() {
        let case = common::whole_patch_row_samples(opts.layout, opts.dtype, opts.normalize);
        let tag = format!("whole-patch-rows-{:?}-{:?}", opts.layout, opts.dtype);
        check_samples_case(exe, &case, &tag, 0x5A);
    }
}

/// The six layout × element type combinations (floats with and without normalisation), random windows
/// (crops, padding on one or both axes, 1×1, whole images, flips), gray/RGB/RGBA, mixed sizes and patch
/// sizes in one batch, sources from whole files and from fragments: equal to the CPU reference bit for
/// bit.
#[test]
fn sim_samples_every_layout_and_dtype_match_reference() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
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
            check_samples_case(
                exe,
                &case,
                &format!("{layout:?}-{dtype:?}-{}", normalize.is_some()),
                0xA5,
            );
        }
    }
}

/// Resampled batches — random-resized crops, shorter-side resizes and scale jitter (with padding where
/// the crop reaches past the rescaled image), bilinear and nearest, random and centre crops, flips, a
/// `fill` value; gray, RGB and RGBA, versions 1 and 2, 1×1 and 7×3 images; every layout and element
/// type — equal, bit for bit, to Pillow's integer passes over `vocab::Resampling`'s tables (the CPU
/// loader's), written out plainly in `common::reference_resampled`.
#[test]
fn sim_resampled_samples_match_reference() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    for (tag, case) in common::resampled_cases(14, &[3, 1, 4]) {
        check_resampled_case(exe, &case, &tag);
    }
}

/// Whole images (`crop=None`) resized by every whole-image sizing, mirrored within their own width and
/// padded bottom and right to the batch's largest with `fill` — the loader's GPU batches of whole
/// images — equal the CPU reference bit for bit: both interpolations, layouts, u8/f16/f32, 3 and 1
/// channels; and the plans keep every block inside its own sample.
#[test]
fn sim_whole_images_padded_to_their_batch_match_reference() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let mut seed = 0x3a11;
    for channels in [3u8, 1] {
        for interpolation in [
            vocab::Interpolation::Bilinear,
            vocab::Interpolation::Nearest,
        ] {
            for (layout, dtype, normalize) in [
                (Layout::Nhwc, DType::U8, None),
                (Layout::Nchw, DType::F16, Some(vocab::Normalize::IMAGENET)),
                (Layout::Nchw, DType::F32, None),
            ] {
                seed += 1;
                let normalize = normalize.filter(|_| channels == 3);
                let case =
                    common::whole_case(seed, 12, channels, layout, dtype, normalize, interpolation);
                let padded = case
                    .geometries
                    .iter()
                    .filter(|g| g.size() != (case.opts.width, case.opts.height))
                    .count();
                assert!(padded > 0, "the batch pads some sample");
                let tag =
                    format!("whole channels {channels} {interpolation:?} {layout:?} {dtype:?}");
                let plan = check_resampled_case(exe, &case, &tag);
                assert!(plan.descriptors_in_bounds(), "{tag}");
            }
        }
    }
}

/// Plain window batches of 1 channel (luma) and 4 (RGBA) — made by the resampling kernels, a window
/// being a resampling that copies — from gray, RGB and RGBA images, whole files and fragments, every
/// layout and element type: equal to the CPU reference (the window converted pixel by pixel) bit for bit.
#[test]
fn sim_window_samples_of_1_and_4_channels_match_reference() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let mut seed = 0x1c4a;
    for channels in [1u8, 4] {
        for layout in [Layout::Nhwc, Layout::Nchw] {
            for (dtype, normalize) in [
                (DType::U8, None),
                (DType::F16, Some(Normalize::IMAGENET)),
                (DType::F32, None),
            ] {
                seed += 1;
                let mut case = common::random_sample_case(seed, 12, layout, dtype, normalize);
                case.opts.channels = channels;
                let tag = format!("windows channels {channels} {layout:?} {dtype:?}");
                let plan = check_samples_case(exe, &case, &tag, 0xA5);
                assert!(plan.is_resampled(), "{tag}");
                assert_eq!(plan.tensor().channels(), usize::from(channels), "{tag}");
            }
        }
    }
}

/// Label maps (one-channel L3 files, versions 1 and 2, 1×1 and 7×3 among them) through a batch of
/// 1 channel, `u8`, nearest, filled with an ignore index — what the loader makes for `masks` on a
/// device — with the image recipes' geometries (scale jitter whose crop reaches past the rescaled
/// image, random-resized crops, resizes; flips), half of them read as fragments of the picked
/// rectangle: equal to the CPU loader's mask rule, written out here from `vocab::Axis::nearest`
/// (torchvision's index), bit for bit.
#[test]
fn sim_label_maps_match_the_cpu_mask_rule() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    for (k, seed) in [0x3a5b_u64, 0x3a5c, 0x3a5d].into_iter().enumerate() {
        check_label_maps(exe, seed, 14, &format!("label maps {k}"));
    }
}

/// One batch of `n` label maps (see [`sim_label_maps_match_the_cpu_mask_rule`]).
fn check_label_maps(exe: &Path, seed: u64, n: usize, tag: &str) {
    let mut rng = Rng(seed);
    let (sw, sh) = (9 + rng.below(30) as u32, 7 + rng.below(30) as u32);
    let ignore = [255u8, 0, 19][rng.below(3) as usize];
    let opts = crate::SampleOptions {
        channels: 1,
        fill: ignore,
        ..crate::SampleOptions::new(sw, sh)
    };
    let (mut imgs, mut geometries) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (iw, ih) = match i % 5 {
            0 => (1, 1),
            1 => (7, 3),
            _ => (1 + rng.below(80) as u32, 1 + rng.below(60) as u32),
        };
        // Class indices: a few values in blocks, with some noise.
        let content = [Content::Random, Content::Smooth, Content::Constant(7)][i % 3];
        imgs.push(match i % 4 {
            3 => {
                let profile = [l3_format::Profile::Bp, l3_format::Profile::Ans][i % 2];
                common::image_v2(iw, ih, 1, 32, profile, content, &mut rng)
            }
            _ => image(iw, ih, 1, [3u8, 16, 64][i % 3], content, &mut rng),
        });
        let recipe = match i % 3 {
            0 => vocab::Recipe::Jitter { range: [0.5, 2.0] },
            1 => vocab::Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: vocab::DEFAULT_RATIO,
            },
            _ => vocab::Recipe::Resize {
                shorter: 1 + rng.below(40) as u32,
            },
        };
        let spec = vocab::SampleSpec {
            width: sw,
            height: sh,
            crop: [vocab::Crop::Random, vocab::Crop::Center][rng.below(2) as usize],
            hflip: true,
            recipe,
            ..vocab::SampleSpec::default()
        };
        let key = vocab::ItemKey {
            seed,
            epoch: 3,
            index: i,
        };
        geometries.push(spec.geometry(iw, ih, &key));
    }
    let parts: Vec<Option<common::FragmentSource>> = imgs
        .iter()
        .zip(&geometries)
        .enumerate()
        .map(|(i, (img, g))| {
            let r = vocab::Resampling::new(g, vocab::Interpolation::Nearest).source();
            (i % 2 == 1).then(|| common::read_fragments(&img.file, r, 64))
        })
        .collect();
    let sources: Vec<SampleSource> = imgs
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
    let plan = SamplePlan::resampled(&sources, &geometries, vocab::Interpolation::Nearest, &opts)
        .unwrap_or_else(|e| panic!("{tag}: plan: {e}"));
    assert_eq!(plan.tensor().shape, [n, 1, sh as usize, sw as usize]);
    let run = run_sim_samples(exe, &plan, &sources, tag, 0xA5);
    assert_eq!(
        run.err,
        u32::MAX,
        "{tag}: kernel flagged {:?}",
        plan.kernel_error(run.err)
    );
    // The CPU loader's `write_mask`: source (nearest(j), nearest(i)) of each kept output, mirrored
    // within the kept columns with the image, `ignore` wherever the sample shows no image.
    let mut want = Vec::with_capacity(run.out.len());
    for (img, g) in imgs.iter().zip(&geometries) {
        let px = common::cpu_decode(&img.file, Layout::Nhwc);
        let iw = l3_format::L3File::parse(&img.file).unwrap().width() as usize;
        let (kw, kh) = g.size();
        for y in 0..sh {
            for x in 0..sw {
                let inside = (g.dx..g.dx + kw).contains(&x) && (g.dy..g.dy + kh).contains(&y);
                want.push(if inside {
                    let j = x - g.dx;
                    let j = if g.flip { kw - 1 - j } else { j };
                    let (sx, sy) = (g.x.nearest(j) as usize, g.y.nearest(y - g.dy) as usize);
                    px[sy * iw + sx]
                } else {
                    ignore
                });
            }
        }
    }
    let labels: Vec<String> = imgs
        .iter()
        .zip(&geometries)
        .map(|(i, g)| format!("{} geometry {g:?}", i.label))
        .collect();
    common::check_samples(&run.out, &want, &opts, &labels, tag);
}

/// Plans `case` as a resampled batch from whole files, runs the simulated launches and compares every
/// element with `common::reference_resampled`.
fn check_resampled_case(exe: &Path, case: &common::ResampledCase, tag: &str) -> SamplePlan {
    let files = case.imgs.iter().map(|i| i.file.as_slice());
    let sources: Vec<SampleSource> = files.map(SampleSource::File).collect();
    let plan = SamplePlan::resampled(&sources, &case.geometries, case.interpolation, &case.opts)
        .unwrap_or_else(|e| panic!("{tag}: plan: {e}"));
    assert!(plan.is_resampled());
    let run = run_sim_samples(exe, &plan, &sources, tag, 0xA5);
    assert_eq!(
        run.err,
        u32::MAX,
        "{tag}: kernel flagged {:?}",
        plan.kernel_error(run.err)
    );
    let want = common::reference_resampled(case);
    let labels: Vec<String> = case
        .imgs
        .iter()
        .zip(&case.geometries)
        .map(|(i, g)| format!("{} geometry {g:?}", i.label))
        .collect();
    common::check_samples(&run.out, &want, &case.opts, &labels, tag);
    plan
}

/// Hand-picked windows: the whole image exactly filling the sample (no padding block at all), 1×1 into
/// 1×1, crops on both axes, padding on both, on one axis each, windows in corners, mirrored 1-wide and
/// full-width windows, one-patch images (3 and 4 channels) read as fragments, patch sizes 1 and 255,
/// 1-pixel-wide edge patches.
#[test]
fn sim_samples_edge_windows_match_reference() {
    use l3_format::Rect;
    use vocab::Window;
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let mut rng = Rng(31);
    let add = |case: &mut SampleCase, img: TestImage, w: Window, frag: Option<u64>| {
        case.imgs.push(img);
        case.windows.push(w);
        case.fragments.push(frag);
    };
    for layout in [Layout::Nhwc, Layout::Nchw] {
        // 1×1 samples.
        let mut tiny = SampleCase {
            imgs: Vec::new(),
            windows: Vec::new(),
            fragments: Vec::new(),
            opts: crate::SampleOptions {
                layout,
                ..crate::SampleOptions::new(1, 1)
            },
        };
        for (c, frag) in [(1u8, None), (3, Some(0)), (4, Some(0)), (3, None)] {
            let img = image(1, 1, c, 1, Content::Random, &mut rng);
            add(&mut tiny, img, Window::whole(1, 1), frag);
        }
        let img = image(9, 7, 3, 4, Content::Random, &mut rng);
        add(
            &mut tiny,
            img,
            Window::new(Rect::new(8, 6, 1, 1), 0, 0, true),
            None,
        );
        let plan = check_samples_case(exe, &tiny, &format!("tiny-{layout:?}"), 0xA5);
        assert_eq!(plan.fill_count(), 0, "every window fills its 1x1 sample");

        // 20×12 samples.
        let mut case = SampleCase {
            imgs: Vec::new(),
            windows: Vec::new(),
            fragments: Vec::new(),
            opts: crate::SampleOptions {
                layout,
                dtype: DType::F16,
                normalize: Some(Normalize::IMAGENET),
                ..crate::SampleOptions::new(20, 12)
            },
        };
        // Exactly the sample's size, whole image, as a file and as fragments, mirrored or not.
        for (flip, frag) in [(false, None), (true, Some(0)), (false, Some(1 << 20))] {
            let img = image(20, 12, 3, 8, Content::Smooth, &mut rng);
            add(
                &mut case,
                img,
                Window::new(Rect::new(0, 0, 20, 12), 0, 0, flip),
                frag,
            );
        }
        // Crops of a larger image on both axes, patch size 255 (one patch) and 1 (a patch per pixel).
        let img = image(57, 33, 4, 255, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(30, 17, 20, 12), 0, 0, true),
            Some(0),
        );
        let img = image(31, 19, 1, 1, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(5, 3, 20, 12), 0, 0, false),
            Some(0),
        );
        // Padding on both axes: a small image centred, in a corner, mirrored.
        let img = image(7, 5, 3, 4, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(0, 0, 7, 5), 6, 3, false),
            None,
        );
        let img = image(7, 5, 1, 32, Content::Smooth, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(0, 0, 7, 5), 13, 7, true),
            Some(0),
        );
        // Padding on one axis only (full width, short; full height, narrow).
        let img = image(40, 6, 3, 16, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(11, 0, 20, 6), 0, 4, true),
            Some(64),
        );
        let img = image(9, 50, 4, 16, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(0, 21, 9, 12), 11, 0, false),
            None,
        );
        // 1-pixel-wide edge patches (width N + 1), windows on the edge column and across it.
        let img = image(17, 17, 3, 16, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(16, 0, 1, 12), 19, 0, true),
            Some(0),
        );
        let img = image(33, 40, 3, 16, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(14, 15, 19, 12), 0, 0, true),
            Some(0),
        );
        // A mirrored 1-wide window, and a 1×1 window in the middle of a padded sample.
        let img = image(30, 30, 1, 8, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(12, 3, 1, 12), 4, 0, true),
            None,
        );
        let img = image(30, 30, 4, 8, Content::Random, &mut rng);
        add(
            &mut case,
            img,
            Window::new(Rect::new(29, 29, 1, 1), 10, 6, false),
            Some(0),
        );
        let plan = check_samples_case(exe, &case, &format!("edges-{layout:?}"), 0xA5);
        assert!(plan.fill_count() > 0);
    }
}

/// Every output element is written by the launch (window or padding): the same batch gives the same
/// bytes whatever the output buffer held before.
#[test]
fn sim_samples_write_every_element() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    for (layout, dtype) in [(Layout::Nhwc, DType::U8), (Layout::Nchw, DType::F32)] {
        let case = common::random_sample_case(77, 8, layout, dtype, None);
        for fill in [0x00u8, 0xff] {
            check_samples_case(exe, &case, &format!("fill{fill}-{layout:?}"), fill);
        }
    }
}

/// Only the patches under the windows are copied: a crop of a large image moves a fraction of its bytes,
/// from a whole file and from fragments alike.
#[test]
fn sim_samples_copy_only_the_patches_under_windows() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let mut rng = Rng(5150);
    let img = image(300, 200, 3, 32, Content::Random, &mut rng);
    let window = vocab::Window::new(l3_format::Rect::new(100, 90, 40, 30), 0, 0, false);
    for frag in [None, Some(0)] {
        let case = SampleCase {
            imgs: vec![TestImage {
                file: img.file.clone(),
                label: img.label.clone(),
            }],
            windows: vec![window],
            fragments: vec![frag],
            opts: crate::SampleOptions::new(40, 30),
        };
        let plan = check_samples_case(exe, &case, "crop-bytes", 0xA5);
        // 40×30 at (100, 90) meets 2×2 of the 10×7 patches per channel (columns 3-4, rows 2-3), in 3
        // channels.
        assert_eq!(plan.patch_count(), 2 * 2 * 3);
        assert!(
            plan.input_len() * 5 < img.file.len(),
            "{} of {} bytes",
            plan.input_len(),
            img.file.len()
        );
    }
}

/// The sample kernel under AddressSanitizer + UBSan (no access outside any buffer, every layout and
/// type) and ThreadSanitizer (its barriers order every shared-memory access; padding and decoding blocks
/// share nothing).
#[test]
fn sim_samples_asan_and_tsan_clean() {
    if let Ok(exe) = HARNESS.get(Flavour::Asan) {
        for (i, (layout, dtype)) in [
            (Layout::Nhwc, DType::U8),
            (Layout::Nchw, DType::U8),
            (Layout::Nhwc, DType::F32),
            (Layout::Nchw, DType::F16),
        ]
        .into_iter()
        .enumerate()
        {
            let case = common::random_sample_case(900 + i as u64, 6, layout, dtype, None);
            check_samples_case(exe, &case, &format!("asan-samples-{i}"), 0xA5);
        }
    } else {
        stdx::testing::skip(format_args!("ASan: {:?}", HARNESS.get(Flavour::Asan).err()));
    }
    match HARNESS.get(Flavour::Tsan) {
        Ok(exe) => {
            let case = common::random_sample_case(4242, 4, Layout::Nchw, DType::U8, None);
            check_samples_case(exe, &case, "tsan-samples", 0xA5);
        }
        Err(why) => stdx::testing::skip(format_args!("TSan: {why}")),
    }
}

/// Corrupted patch bytes (offsets intact) under ASan: the kernel rejects a window exactly when the CPU's
/// region decoder rejects it (for gray and RGB images; alpha is never read), names the sample's batch
/// index, and otherwise produces the reference; with `check_rows_on_host` the plan rejects exactly what
/// the region decoder rejects, alpha included, before any launch.
#[test]
fn sim_samples_corrupt_rows_flagged_like_region_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Asan);
    let mut rng = Rng(8086);
    let good = image(40, 30, 3, 16, Content::Smooth, &mut rng);
    let (mut flagged, mut accepted) = (0, 0);
    for trial in 0..36 {
        let c = [1u8, 3, 4][trial % 3];
        let mut bad = image(45, 38, c, 16, Content::Random, &mut rng).file;
        let f = l3_format::L3File::parse(&bad).unwrap();
        let start = f.data_offset();
        if trial % 2 == 0 {
            // A row header of some patch (any channel, alpha included) gets a random nbit: rows after it
            // shift, or it is out of range.
            let (ch, p) = (rng.below(c as u64) as usize, rng.below(9) as usize);
            let r = f.patch_range(ch, p);
            let row = rng.below(4) as usize;
            let i = start + r.start + row * (r.len() / 16);
            bad[i] = (bad[i] & 0xf0) | rng.below(16) as u8;
        } else {
            for _ in 0..1 + trial % 3 {
                let i = start + rng.below((bad.len() - start) as u64) as usize;
                bad[i] ^= 1 << rng.below(8);
            }
        }
        let windows = [
            common::random_window(40, 30, 24, 20, &mut rng),
            common::random_window(45, 38, 24, 20, &mut rng),
        ];
        let sources = [SampleSource::File(&good.file), SampleSource::File(&bad)];
        let opts = crate::SampleOptions::new(24, 20);
        let plan = SamplePlan::new(&sources, &windows, &opts).expect("offsets are intact");
        let run = run_sim_samples(exe, &plan, &sources, "corrupt-samples", 0xA5);
        let f = l3_format::L3File::parse(&bad).unwrap();
        let r = windows[1].src;
        let mut px = vec![0u8; (r.w * r.h) as usize * c as usize];
        let layout = l3_format::PixelLayout::Interleaved {
            row_stride: (r.w * c as u32) as usize,
        };
        let cpu_ok = f.decode_region(r, &mut px, layout).is_ok();
        let strict = crate::SampleOptions {
            check_rows_on_host: true,
            ..opts
        };
        match SamplePlan::new(&sources, &windows, &strict) {
            Ok(_) => assert!(
                cpu_ok,
                "trial {trial}: host walk accepts what the CPU rejects"
            ),
            Err(crate::Error::Image { index: 1, .. }) => {
                assert!(
                    !cpu_ok,
                    "trial {trial}: host walk rejects what the CPU decodes"
                )
            }
            Err(e) => panic!("trial {trial}: unexpected {e}"),
        }
        let kernel_ok = run.err == u32::MAX;
        if c != 4 {
            assert_eq!(kernel_ok, cpu_ok, "trial {trial}: kernel and CPU disagree");
        } else if cpu_ok {
            assert!(
                kernel_ok,
                "trial {trial}: kernel rejects what the CPU decodes"
            );
        }
        if kernel_ok && cpu_ok {
            accepted += 1;
            let files: Vec<&[u8]> = vec![&good.file, &bad];
            let want = common::reference_samples(&files, &windows, &opts);
            common::check_samples(&run.out, &want, &opts, &[], &format!("corrupt {trial}"));
        } else if !kernel_ok {
            flagged += 1;
            match plan.kernel_error(run.err) {
                Err(crate::Error::CorruptRows { index: 1, .. }) => {}
                other => panic!("trial {trial}: expected CorruptRows for sample 1, got {other:?}"),
            }
        }
    }
    assert!(
        flagged > 0 && accepted > 0,
        "flagged {flagged}, accepted {accepted}"
    );
}

// ---- Version 2: the same kernel source, v2 blocks beside v1 blocks in the same launches. ----

/// Version-2 images of both profiles (gray, RGB, RGBA; 1×1, single rows and columns, partial edge
/// patches, N = 32 to 224) with a version-1 image in the same batch, every layout and element type:
/// equal to `l3-format`'s CPU decoder byte for byte (floats: `Normalize::apply`, f16 by the `half` crate).
#[test]
fn sim_v2_whole_images_match_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let imgs = common::v2_mixed_batch();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        check_batch(exe, &imgs, &u8_opts(layout), &format!("v2-{layout:?}"));
    }
    for (dtype, normalize) in [(DType::F32, None), (DType::F16, Some(Normalize::IMAGENET))] {
        let opts = DecodeOptions {
            layout: Layout::Nchw,
            dtype,
            normalize,
            ..Default::default()
        };
        check_batch(exe, &imgs, &opts, &format!("v2-{dtype:?}"));
    }
    // The same files as whole images in pinned memory (descriptors into the files as they lie).
    let files: Vec<&[u8]> = imgs.iter().map(|i| i.file.as_slice()).collect();
    let mut starts = Vec::new();
    let mut buf = Vec::new();
    for f in &files {
        starts.push(buf.len());
        buf.extend_from_slice(f);
        buf.resize(buf.len().next_multiple_of(7), 0);
    }
    let opts = u8_opts(Layout::Nhwc);
    let plan = BatchPlan::new_in_place(&files, &starts, buf.len(), &opts).unwrap();
    let run = run_sim_data(exe, &plan, &buf, "v2-in-place");
    assert_eq!(run.err, u32::MAX, "{:?}", plan.kernel_error(run.err));
    common::check_output(&run.out, &plan.images, &imgs, &opts, "v2-in-place");
}

/// The design's conformance vectors (../shared/specs/l3v2-vectors): every one decodes on the simulated
/// kernel to exactly the CPU decoder's pixels, which the l3-format conformance test checks against the
/// vectors' SHA-256. One batch of all 40, NHWC.
/// Every way a version-2 row falls on a warp: patch widths from 1 to 224 (1 to 7 columns a lane, every
/// remainder), both profiles, gray, RGB and RGBA, in blocks of 2 warps and, beside a version-1 image 255
/// pixels wide, of 8 (several patches to a block either way).
#[test]
fn sim_v2_every_row_width_matches_cpu_decoder() {
    use l3_format::Profile::{Ans, Bp};
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let mut rng = common::Rng(0x5eed_0224);
    let widths = [
        1u32, 2, 7, 31, 32, 33, 63, 64, 65, 95, 96, 97, 127, 128, 129, 150, 159, 160, 161, 191,
        192, 193, 200, 222, 223, 224,
    ];
    let mut imgs = Vec::new();
    for (i, &w2) in widths.iter().enumerate() {
        let c = [3u8, 1, 4][i % 3];
        let content = [common::Content::Smooth, common::Content::Random][i % 2];
        let profile = [Bp, Ans][(i / 2) % 2];
        imgs.push(common::image_v2(
            224 + w2,
            5,
            c,
            224,
            profile,
            content,
            &mut rng,
        ));
    }
    for layout in [Layout::Nchw, Layout::Nhwc] {
        check_batch(
            exe,
            &imgs,
            &u8_opts(layout),
            &format!("v2-widths-{layout:?}"),
        );
    }
    imgs.push(common::image(
        258,
        4,
        3,
        255,
        common::Content::Smooth,
        &mut rng,
    ));
    let opts = DecodeOptions {
        layout: Layout::Nchw,
        dtype: DType::F16,
        normalize: Some(Normalize::IMAGENET),
        ..Default::default()
    };
    check_batch(exe, &imgs, &opts, "v2-widths-with-v1-255");
}

/// An ANS table bitstream (SPEC.md 2.7.4) for `k` contexts, `tables` the used ones: (context, f).
fn ans_tables(k: usize, tables: &[(usize, Vec<u16>)]) -> l3_format::AnsTables {
    let mut bits: Vec<bool> = Vec::new();
    let put =
        |bits: &mut Vec<bool>, v: u32, n: u32| (0..n).for_each(|i| bits.push(v >> i & 1 == 1));
    for ctx in 0..k {
        let Some((_, f)) = tables.iter().find(|t| t.0 == ctx) else {
            bits.push(false);
            continue;
        };
        bits.push(true);
        put(&mut bits, f.len() as u32 - 1, 8);
        for &v in f {
            let code = u32::from(v) + 1;
            let len = 32 - code.leading_zeros();
            (0..len - 1).for_each(|_| bits.push(false));
            (0..len).rev().for_each(|i| bits.push(code >> i & 1 == 1));
        }
    }
    let mut bytes = vec![0u8; bits.len().div_ceil(8)];
    for (i, b) in bits.iter().enumerate() {
        bytes[i / 8] |= u8::from(*b) << (i % 8);
    }
    l3_format::AnsTables::parse(&bytes, k)
        .expect("a valid table")
        .0
}

/// The bucket words the device builds from each ANS table (`l3v2_buckets`), against their definition
/// (`v2::BUCKETS`), for tables with one symbol, zero frequencies, symbols inside one bucket, frequencies
/// of exactly one bucket, a run of rare symbols at the end and 256 symbols; two images' tables, each
/// built once however many patches share it.
#[test]
fn sim_v2_bucket_words_match_their_tables() {
    use crate::v2::{BUCKETS, V2Batch, V2Desc};
    let exe = harness_or_skip!(HARNESS, Flavour::Asan);
    let cases: Vec<Vec<u16>> = vec![
        vec![4096],
        vec![0, 4096, 0],
        vec![4000, 1, 95],
        vec![16; 256],
        [vec![3841], vec![1; 255]].concat(),
        [vec![16; 253], vec![0, 47, 1]].concat(),
        (0..200)
            .map(|i| if i == 7 { 4096 - 199 } else { 1 })
            .collect(),
        [vec![64; 63], vec![0, 31, 33]].concat(),
    ];
    let mut v2 = V2Batch::default();
    let mut images = Vec::new();
    for (i, chunk) in [&cases[..4], &cases[4..]].into_iter().enumerate() {
        let used: Vec<(usize, Vec<u16>)> = chunk
            .iter()
            .enumerate()
            .map(|(j, f)| (10 * j + i, f.clone()))
            .chain([(99 + i, vec![1000, 0, 3000, 96])]) // a selector context
            .collect();
        let t = ans_tables(102, &used);
        let (table_offset, buckets) = v2.add_tables(&t).unwrap();
        for _ in 0..3 {
            v2.descs.push(V2Desc {
                table_offset,
                buckets,
                planes: 3,
                decoded: 3,
                profile: l3_format::Profile::Ans.byte(),
                ..V2Desc::default()
            });
            v2.ids.push((i as u32, 0));
        }
        images.push((t, buckets));
    }
    let launch = Launch {
        samples: false,
        dtype: DType::U8,
        grid: 0,
        block: 32,
        smem: 0,
        stage_cap: 0,
        n_descs: 0,
        n_fills: 0,
        sample: [0; 3],
        data: &[],
        descs: Vec::new(),
        fills: Vec::new(),
        scale_bias: [0.0; 8],
        out_bytes: 0,
        n_v2: v2.descs.len() as u32,
        v2: v2.descriptor_bytes().to_vec(),
        tables: v2.tables.clone(),
        scratch: 1,
        bucket_words: v2.bucket_words,
        resample: None,
    };
    // The chunks are empty, so every patch fails; the words are built before.
    let run = run_launch(exe, &launch, "v2-buckets", 0);
    assert_eq!(run.err, 0, "the empty chunks are refused");
    let mut checked = 0;
    for (t, at) in &images {
        for ctx in 0..t.contexts() {
            let Some(cum) = t.cum(ctx) else { continue };
            let sym = |slot: usize| cum.partition_point(|&c| usize::from(c) <= slot) - 1;
            for b in 0..BUCKETS as usize {
                let (lo, hi) = (sym(16 * b), sym(16 * b + 15));
                let want = if lo == hi {
                    let f = u32::from(cum[lo + 1] - cum[lo]);
                    lo as u32 | u32::from(cum[lo]) << 8 | (f - 1) << 20
                } else {
                    lo as u32 | (hi as u32) << 8
                };
                let got = run.buckets[*at as usize + ctx * BUCKETS as usize + b];
                assert_eq!(
                    got, want,
                    "context {ctx}, bucket {b}: {got:#x}, want {want:#x}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, (cases.len() + 2) * BUCKETS as usize);
}

#[test]
fn sim_v2_conformance_vectors_decode_exactly() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let dir = std::env::var_os("L3V2_VECTORS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/specs/l3v2-vectors")
        });
    let Ok(list) = std::fs::read_dir(&dir) else {
        stdx::testing::skip(format_args!(
            "no conformance vectors at {} (set L3V2_VECTORS)",
            dir.display()
        ));
        return;
    };
    let mut imgs: Vec<TestImage> = list
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "l3"))
        .map(|p| TestImage {
            file: std::fs::read(&p).unwrap(),
            label: p.file_name().unwrap().to_string_lossy().into(),
        })
        .collect();
    imgs.sort_by(|a, b| a.label.cmp(&b.label));
    assert_eq!(imgs.len(), 40, "the manifest lists 40 vectors");
    // One layout: the layouts are a matter of strides, checked on every other batch.
    check_batch(exe, &imgs, &u8_opts(Layout::Nhwc), "vectors-nhwc");
}

/// Sample batches with version-2 sources: the six layout × element type combinations, random windows,
/// flips and padding, gray/RGB/RGBA, both profiles, whole files and fragments, a version-1 source among
/// them: equal to the CPU reference bit for bit, every element written once (two fill bytes).
#[test]
fn sim_v2_samples_match_reference() {
    let exe = harness_or_skip!(HARNESS, Flavour::Plain);
    let mut k = 0u64;
    for layout in [Layout::Nchw, Layout::Nhwc] {
        for (dtype, normalize) in [
            (DType::U8, None),
            (DType::F32, Some(Normalize::IMAGENET)),
            (DType::F16, None),
        ] {
            k += 1;
            let case = common::random_v2_sample_case(0xA2 + k, 6, layout, dtype, normalize);
            let plan = check_samples_case(exe, &case, &format!("v2-samples-{k}"), 0xA5);
            assert!(!plan.v2.descs.is_empty() && !plan.descs.is_empty());
            check_samples_case(exe, &case, &format!("v2-samples-{k}-fill0"), 0x00);
        }
    }
}

/// ASan + UBSan and TSan on version-2 launches (whole images and samples): no access outside any
/// buffer, every shared-memory access ordered by the kernel's barriers (block and warp).
#[test]
fn sim_v2_asan_and_tsan_clean() {
    let imgs = common::v2_mixed_batch();
    let case = common::random_v2_sample_case(0x7A5, 4, Layout::Nhwc, DType::F16, None);
    for build in [Flavour::Asan, Flavour::Tsan] {
        match HARNESS.get(build) {
            Ok(exe) => {
                check_batch(exe, &imgs, &u8_opts(Layout::Nhwc), &format!("v2-{build:?}"));
                check_samples_case(exe, &case, &format!("v2-samples-{build:?}"), 0xA5);
            }
            Err(why) => stdx::testing::skip(format_args!("{build:?}: {why}")),
        }
    }
}

/// Damaged version-2 patch data in files without entry CRCs, whose file CRC-32C was made right again (so
/// the host's parse accepts it):
/// under ASan the kernel rejects a patch exactly when the CPU decoder rejects the image, names its batch
/// index, and otherwise produces the CPU's pixels; with `check_rows_on_host` the plan rejects exactly what
/// the CPU rejects before any launch. Samples (gray and RGB, whose every plane a sample holds) likewise
/// against the CPU's region decoder.
#[test]
fn sim_v2_corrupt_patches_flagged_like_cpu_decoder() {
    let exe = harness_or_skip!(HARNESS, Flavour::Asan);
    let mut rng = Rng(0xC0FFEE);
    let good = common::image_v2(
        40,
        30,
        3,
        32,
        l3_format::Profile::Ans,
        Content::Smooth,
        &mut rng,
    );
    let (mut flagged, mut accepted) = (0, 0);
    for trial in 0..40 {
        let c = [1u8, 3, 4][trial % 3];
        let profile = [l3_format::Profile::Bp, l3_format::Profile::Ans][trial / 3 % 2];
        let content = [Content::Random, Content::Smooth][trial / 6 % 2];
        let mut bad = common::image_v2_with(70, 45, c, 32, profile, content, &mut rng, false).file;
        let f = l3_format::L3File::parse(&bad).unwrap();
        let (start, end) = (f.data_offset(), bad.len() - 4);
        for _ in 0..1 + trial % 3 {
            let i = start + rng.below((end - start) as u64) as usize;
            bad[i] ^= 1 << rng.below(8);
        }
        let crc = l3_format::crc32c(&bad[..end]);
        bad[end..].copy_from_slice(&crc.to_le_bytes());
        let Ok(f) = l3_format::L3File::parse(&bad) else {
            continue; // an offset or table damaged: refused by the host, as the CPU refuses it
        };
        let mut px = vec![0u8; f.decoded_len()];
        let cpu_ok = f.decode_chw(&mut px).is_ok();
        let files: Vec<&[u8]> = vec![&good.file, &bad];
        let strict = DecodeOptions {
            check_rows_on_host: true,
            ..Default::default()
        };
        match BatchPlan::new(&files, &strict) {
            Ok(_) => assert!(
                cpu_ok,
                "trial {trial}: host check accepts what the CPU rejects"
            ),
            Err(crate::Error::Image { index: 1, .. }) => {
                assert!(
                    !cpu_ok,
                    "trial {trial}: host check rejects what the CPU decodes"
                )
            }
            Err(e) => panic!("trial {trial}: unexpected {e}"),
        }
        let plan = BatchPlan::new(&files, &DecodeOptions::default()).unwrap();
        let run = run_sim(exe, &plan, &files, &format!("v2-corrupt-{trial}"));
        let kernel_ok = run.err == u32::MAX;
        assert_eq!(
            kernel_ok, cpu_ok,
            "trial {trial} ({profile}, C={c}): kernel and CPU disagree"
        );
        if kernel_ok {
            accepted += 1;
            let imgs = [
                TestImage {
                    file: good.file.clone(),
                    label: "good".into(),
                },
                TestImage {
                    file: bad.clone(),
                    label: format!("damaged {trial}"),
                },
            ];
            common::check_output(
                &run.out,
                &plan.images,
                &imgs,
                &DecodeOptions::default(),
                "v2-corrupt",
            );
        } else {
            flagged += 1;
            match plan.kernel_error(run.err) {
                Err(crate::Error::CorruptPatch { index: 1, .. }) => {}
                other => panic!("trial {trial}: expected CorruptPatch for image 1, got {other:?}"),
            }
        }
        if c != 4 {
            let windows = [
                common::random_window(40, 30, 24, 20, &mut rng),
                common::random_window(70, 45, 24, 20, &mut rng),
            ];
            let sources = [SampleSource::File(&good.file), SampleSource::File(&bad)];
            let opts = crate::SampleOptions::new(24, 20);
            let plan = SamplePlan::new(&sources, &windows, &opts).unwrap();
            let run = run_sim_samples(exe, &plan, &sources, "v2-corrupt-samples", 0xA5);
            let r = windows[1].src;
            let mut px = vec![0u8; (r.w * r.h) as usize * c as usize];
            let layout = l3_format::PixelLayout::packed(r.w, r.h, c, false);
            let cpu_ok = f.decode_region(r, &mut px, layout).is_ok();
            assert_eq!(
                run.err == u32::MAX,
                cpu_ok,
                "trial {trial}: samples disagree"
            );
        }
    }
    assert!(
        flagged > 0 && accepted > 0,
        "flagged {flagged}, accepted {accepted}"
    );
}

/// Files with entry CRCs: a sample read from fragments checks every entry it uploads on the host, so a
/// damaged one is refused with its batch index and patch before any launch (a whole file's checksums are
/// checked by its parse). No kernel runs here, so no harness is needed.
#[test]
fn v2_damaged_entries_are_refused_by_the_host_plans() {
    let mut rng = Rng(0xE17);
    for profile in [l3_format::Profile::Bp, l3_format::Profile::Ans] {
        let good = common::image_v2(100, 70, 3, 32, profile, Content::Random, &mut rng).file;
        let prefix = l3_format::L3Index::prefix_len(&good).unwrap();
        let index = l3_format::L3Index::parse(&good[..prefix], good.len() as u64).unwrap();
        assert!(index.has_entry_crcs());
        let win = vocab::Window::new(vocab::Rect::new(40, 10, 24, 20), 0, 0, false);
        let ranges = index.region_ranges(win.src, 0).unwrap();
        let read = |file: &[u8]| {
            let mut f = l3_format::Fragments::new();
            f.reset(&ranges);
            for (r, s) in f.slices_mut() {
                s.copy_from_slice(&file[r.start as usize..r.end as usize]);
            }
            f
        };
        // One bit of the first byte the window reads (its first patch's first plane, or chunk).
        let mut bad = good.clone();
        bad[ranges[0].start as usize] ^= 4;
        let opts = crate::SampleOptions::new(24, 20);
        let (clean, damaged) = (read(&good), read(&bad));
        let sources = [
            SampleSource::Fragments {
                index: &index,
                data: &clean,
            },
            SampleSource::Fragments {
                index: &index,
                data: &damaged,
            },
        ];
        match SamplePlan::new(&sources, &[win, win], &opts) {
            Err(crate::Error::Image {
                index: 1,
                source: l3_format::Error::EntryCrcMismatch { .. },
            }) => {}
            other => panic!("{profile}: {other:?}"),
        }
        SamplePlan::new(&sources[..1], &[win], &opts).unwrap();
        // The same damage in a whole file: its parse names the entry.
        match BatchPlan::new(&[&good, &bad], &DecodeOptions::default()) {
            Err(crate::Error::Image {
                index: 1,
                source: l3_format::Error::EntryCrcMismatch { .. },
            }) => {}
            other => panic!("{profile}: {other:?}"),
        }
    }
}
