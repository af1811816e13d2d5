//! The host stage on several threads against one thread: the plans (`new_parallel`,
//! `resampled_parallel`) and the staged device input (`stage_into`) of every batch shape — versions 1
//! and 2, whole images and windows, files and fragments, resampled batches, inputs large enough to be cut
//! into many pieces — are byte for byte the single-threaded plan and the input packed in order, and a
//! corrupt source is named as a single thread names it.

use crate::error::Error;
use crate::input::{InputOffsets, Tables, pack_tables};
use crate::plan::{BatchPlan, DecodeOptions};
use crate::sample::{SamplePlan, SampleSource};
use crate::sim_tests::common;
use common::{Content, Rng, SampleCase};
use vocab::{DType, Layout, Normalize, Window};

const THREADS: [usize; 4] = [1, 2, 3, 8];

/// The input as the decoder packed it before the host stage ran in parallel: the patch runs in order,
/// zeros to the tables, the tables.
fn packed_in_order(plan: &SamplePlan, sources: &[SampleSource<'_>]) -> Vec<u8> {
    let off = InputOffsets::of_samples(plan);
    let mut v = vec![0u8; off.total];
    plan.pack_into(sources, &mut v[..off.data_len]).unwrap();
    pack_tables(&Tables::of_samples(plan), off, &mut v[off.descs..]);
    v
}

/// Stages `plan` on `threads` threads into a buffer longer than the input, filled with garbage first:
/// every byte of the input is written, none past it.
fn staged(plan: &SamplePlan, sources: &[SampleSource<'_>], threads: usize) -> Vec<u8> {
    let mut v = vec![0xEE; plan.staged_len() + 5];
    plan.stage_into(sources, &mut v, threads).unwrap();
    assert!(v[plan.staged_len()..].iter().all(|&b| b == 0xEE));
    v.truncate(plan.staged_len());
    v
}

/// `plan_on(threads)` gives the plan of one thread, and its staged input is the input packed in order.
fn check_case(
    tag: &str,
    sources: &[SampleSource<'_>],
    plan_on: impl Fn(usize) -> Result<SamplePlan, Error>,
) {
    let serial = plan_on(1).unwrap_or_else(|e| panic!("{tag}: {e}"));
    let want = packed_in_order(&serial, sources);
    let want_plan = format!("{serial:?}");
    for t in THREADS {
        let plan = plan_on(t).unwrap();
        assert_eq!(format!("{plan:?}"), want_plan, "{tag}: plan on {t} threads");
        assert!(plan.descriptors_in_bounds(), "{tag}");
        assert!(
            staged(&plan, sources, t) == want,
            "{tag}: input on {t} threads"
        );
    }
}

fn window_case(tag: &str, case: &SampleCase) {
    let parts = case.fragment_parts();
    let sources = common::sample_sources(case, &parts);
    check_case(tag, &sources, |t| {
        SamplePlan::new_parallel(&sources, &case.windows, &case.opts, t)
    });
}

#[test]
fn parallel_window_batches_equal_one_thread() {
    let mut seed = 0x57a6e;
    for n in [1, 2, 5, 12, 33] {
        for (layout, dtype, normalize) in [
            (Layout::Nhwc, DType::U8, None),
            (Layout::Nchw, DType::F16, Some(Normalize::IMAGENET)),
        ] {
            seed += 1;
            let case = common::random_sample_case(seed, n, layout, dtype, normalize);
            window_case(&format!("v1 n={n} {layout:?}"), &case);
            let case = common::random_v2_sample_case(seed, n, layout, dtype, normalize);
            window_case(&format!("v2 n={n} {layout:?}"), &case);
        }
    }
    // Luma and RGBA batches go through the resampling planner.
    for channels in [1, 4] {
        let mut case = common::random_v2_sample_case(9, 7, Layout::Nchw, DType::U8, None);
        case.opts.channels = channels;
        window_case(&format!("{channels} channels"), &case);
    }
}

#[test]
fn parallel_resampled_batches_equal_one_thread() {
    for (tag, case) in common::resampled_cases(6, &[3, 1, 4]).iter().step_by(3) {
        let sources: Vec<SampleSource<'_>> = case
            .imgs
            .iter()
            .map(|i| SampleSource::File(&i.file))
            .collect();
        check_case(tag, &sources, |t| {
            SamplePlan::resampled_parallel(
                &sources,
                &case.geometries,
                case.interpolation,
                &case.opts,
                t,
            )
        });
    }
}

/// Large whole images (versions 1 and 2, both profiles): inputs of megabytes, cut into many pieces.
#[test]
fn parallel_stage_of_large_images_equals_one_thread() {
    let mut rng = Rng(0xb16);
    let mut imgs = Vec::new();
    for k in 0..6 {
        let (w, h) = (700 + 13 * k, 500 - 7 * k);
        let content = [Content::Random, Content::Smooth][k as usize % 2];
        imgs.push(match k % 3 {
            0 => common::image(w, h, 3, 64, content, &mut rng),
            1 => common::image_v2(w, h, 3, 64, l3_format::Profile::Bp, content, &mut rng),
            _ => common::image_v2(w, h, 4, 32, l3_format::Profile::Ans, content, &mut rng),
        });
    }
    let sources: Vec<SampleSource<'_>> = imgs.iter().map(|i| SampleSource::File(&i.file)).collect();
    let windows: Vec<Window> = imgs
        .iter()
        .map(|i| {
            let f = l3_format::L3File::parse(&i.file).unwrap();
            Window::whole(f.width(), f.height())
        })
        .collect();
    let opts = crate::SampleOptions {
        layout: Layout::Nchw,
        dtype: DType::F16,
        normalize: Some(Normalize::IMAGENET),
        ..crate::SampleOptions::new(800, 500)
    };
    check_case("large samples", &sources, |t| {
        SamplePlan::new_parallel(&sources, &windows, &opts, t)
    });
    assert!(
        packed_in_order(
            &SamplePlan::new(&sources, &windows, &opts).unwrap(),
            &sources
        )
        .len()
            > 4 << 20
    );

    // Whole-image batches stage the same way.
    let files: Vec<&[u8]> = imgs.iter().map(|i| i.file.as_slice()).collect();
    let plan = BatchPlan::new(&files, &DecodeOptions::default()).unwrap();
    let off = InputOffsets::of(&plan);
    let mut want = vec![0u8; off.total];
    plan.pack_into(&files, &mut want[..off.data_len]);
    pack_tables(&Tables::of(&plan), off, &mut want[off.descs..]);
    for t in THREADS {
        let mut got = vec![0xEE; plan.staged_len()];
        plan.stage_into(&files, &mut got, t).unwrap();
        assert!(got == want, "whole images on {t} threads");
    }
}

/// A corrupt source is named by its batch index whatever the threads; of several, the first; a short
/// buffer and other sources are refused.
#[test]
fn parallel_plans_name_the_first_bad_source() {
    let mut rng = Rng(0xbad);
    let mut files: Vec<Vec<u8>> = (0..9)
        .map(|k| match k % 2 {
            0 => common::image(90, 70, 3, 32, Content::Smooth, &mut rng).file,
            _ => {
                let p = l3_format::Profile::Ans;
                common::image_v2(90, 70, 3, 32, p, Content::Smooth, &mut rng).file
            }
        })
        .collect();
    let opts = crate::SampleOptions::new(90, 70);
    let whole = vec![Window::whole(90, 70); files.len()];
    // Image 6 (version 1) has a damaged magic; image 3 (version 2) has a byte flipped in its data.
    files[6][0] ^= 0xff;
    let at = files[3].len() / 2;
    files[3][at] ^= 0x40;
    let sources: Vec<SampleSource<'_>> = files.iter().map(|f| SampleSource::File(f)).collect();
    for t in THREADS {
        match SamplePlan::new_parallel(&sources, &whole, &opts, t) {
            Err(Error::Image { index: 3, .. }) => {}
            other => panic!("{t} threads: {:?}", other.map(|_| "a plan")),
        }
        match SamplePlan::new_parallel(&sources[4..], &whole[4..], &opts, t) {
            Err(Error::Image { index: 2, .. }) => {}
            other => panic!("{t} threads: {:?}", other.map(|_| "a plan")),
        }
        let mut windows = whole[..3].to_vec();
        windows[1] = Window::new(l3_format::Rect::new(50, 0, 41, 10), 0, 0, false);
        windows[2] = windows[1];
        match SamplePlan::new_parallel(&sources[..3], &windows, &opts, t) {
            Err(Error::BadWindow { index: 1, .. }) => {}
            other => panic!("{t} threads: {:?}", other.map(|_| "a plan")),
        }
    }
    let plan = SamplePlan::new_parallel(&sources[..3], &whole[..3], &opts, 2).unwrap();
    let mut short = vec![0u8; plan.staged_len() - 1];
    assert!(matches!(
        plan.stage_into(&sources[..3], &mut short, 2),
        Err(Error::StagingTooSmall { .. })
    ));
    let mut dst = vec![0u8; plan.staged_len()];
    assert!(matches!(
        plan.stage_into(&sources[4..7], &mut dst, 2),
        Err(Error::PlanMismatch)
    ));
}
