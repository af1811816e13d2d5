//! Runs the real kernel source (kernel.cu) on the CPU through cpu-sim/harness.cpp, with launch parameters
//! and descriptor tables from the real host plan, and compares every output byte with `l3-format`'s CPU
//! decoder. The same launches run under AddressSanitizer (no read or write outside any buffer, including on
//! corrupt input) and ThreadSanitizer (every shared-memory access ordered by the kernel's barriers).
//! Needs a C++20 compiler (`c++`, or `$CXX`); without one the tests print why and skip.

#[path = "../tests/common/mod.rs"]
mod common;

use crate::plan::{BatchPlan, DecodeOptions};
use crate::tensor::{DType, Layout, Normalize};
use common::{Content, Rng, TestImage, image};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Build {
    Plain,
    Asan,
    Tsan,
}

/// The crate's sources: `$L3_CUDA_DIR` where the test binary was carried elsewhere, else where it was built.
fn crate_dir() -> PathBuf {
    std::env::var_os("L3_CUDA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Builds the harness once per flavour; `Err` says why it cannot run here.
fn harness(build: Build) -> Result<PathBuf, String> {
    static CELLS: [OnceLock<Result<PathBuf, String>>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    CELLS[build as usize]
        .get_or_init(|| {
            let src = crate_dir().join("cpu-sim/harness.cpp");
            if !src.exists() {
                return Err(format!(
                    "{} not found (set L3_CUDA_DIR to the l3-cuda sources)",
                    src.display()
                ));
            }
            let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
            let dir = std::env::temp_dir().join(format!("l3-cuda-sim-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let exe = dir.join(format!("harness-{build:?}"));
            let mut cmd = Command::new(&cxx);
            cmd.args([
                "-std=c++20",
                "-pthread",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-o",
            ])
            .arg(&exe)
            .arg(&src);
            match build {
                Build::Plain => cmd.arg("-O2"),
                Build::Asan => cmd.args([
                    "-O1",
                    "-g",
                    "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all",
                ]),
                Build::Tsan => cmd.args(["-O1", "-g", "-fsanitize=thread"]),
            };
            let out = cmd
                .output()
                .map_err(|e| format!("cannot run C++ compiler `{cxx}`: {e}"))?;
            if !out.status.success() {
                let log = String::from_utf8_lossy(&out.stderr);
                // A compile error in OUR sources is a failure, a missing sanitizer runtime a skip.
                if log.contains("kernel.cu") || log.contains("harness.cpp") {
                    panic!("kernel.cu / harness.cpp failed to compile:\n{log}");
                }
                return Err(format!("`{cxx}` cannot build the {build:?} harness: {log}"));
            }
            Ok(exe)
        })
        .clone()
}

/// What one simulated launch produced.
struct SimRun {
    err: u32,
    out: Vec<u8>,
}

fn run_sim(exe: &Path, plan: &BatchPlan, images: &[&[u8]], tag: &str) -> SimRun {
    let mut data = vec![0u8; plan.data_len];
    plan.pack_into(images, &mut data);
    run_sim_data(exe, plan, &data, tag)
}

/// Runs the launch `plan` describes over the device input bytes `data`.
fn run_sim_data(exe: &Path, plan: &BatchPlan, data: &[u8], tag: &str) -> SimRun {
    assert!(
        plan.descriptors_in_bounds(),
        "{tag}: a descriptor points outside the buffers"
    );
    assert_eq!(data.len(), plan.data_len);
    let kind: u32 = match plan.dtype {
        DType::U8 => 0,
        DType::F32 => 1,
        DType::F16 => 2,
    };
    let descs = plan.descriptor_bytes();
    let sb: Vec<u8> = plan
        .scale_bias
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut f = Vec::new();
    for v in [
        kind,
        plan.descs.len() as u32,
        plan.block_dim,
        plan.shared_bytes(),
        plan.stage_cap,
        plan.descs.len() as u32,
    ] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    for blob in [data, &descs[..], &sb[..]] {
        f.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        f.extend_from_slice(blob);
    }
    f.extend_from_slice(&((plan.out_len * plan.dtype.size()) as u64).to_le_bytes());
    let dir = exe.parent().unwrap();
    let tid =
        format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_alphanumeric(), "");
    let input = dir.join(format!("{tag}-{tid}.launch"));
    let output = dir.join(format!("{tag}-{tid}.out"));
    std::fs::write(&input, &f).unwrap();
    let res = Command::new(exe)
        .arg(&input)
        .arg(&output)
        .env("TSAN_OPTIONS", "halt_on_error=1 exitcode=66")
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{tag}: simulated kernel failed ({}):\n{}",
        res.status,
        String::from_utf8_lossy(&res.stderr)
    );
    let bytes = std::fs::read(&output).unwrap();
    let _ = std::fs::remove_file(&input);
    let _ = std::fs::remove_file(&output);
    SimRun {
        err: u32::from_le_bytes(bytes[..4].try_into().unwrap()),
        out: bytes[4..].to_vec(),
    }
}

macro_rules! harness_or_skip {
    ($b:expr) => {
        match harness($b) {
            Ok(p) => p,
            Err(why) => {
                eprintln!("skipping: {why}");
                return;
            }
        }
    };
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
    let exe = harness_or_skip!(Build::Plain);
    for (gi, imgs) in common::every_patch_size_batches().iter().enumerate() {
        check_batch(
            &exe,
            imgs,
            &u8_opts(Layout::Nchw),
            &format!("nchw-group{gi}"),
        );
        check_batch(
            &exe,
            imgs,
            &u8_opts(Layout::Nhwc),
            &format!("nhwc-group{gi}"),
        );
    }
}

/// 1×1 images, single rows and columns, in one mixed batch with a larger image of each channel count.
#[test]
fn sim_tiny_and_mixed_batch_matches_cpu_decoder() {
    let exe = harness_or_skip!(Build::Plain);
    let imgs = common::tiny_mixed_batch();
    check_batch(&exe, &imgs, &u8_opts(Layout::Nchw), "tiny-nchw");
    check_batch(&exe, &imgs, &u8_opts(Layout::Nhwc), "tiny-nhwc");
}

/// A fixed-size batch (the descriptor fast path).
#[test]
fn sim_uniform_batch_matches_cpu_decoder() {
    let exe = harness_or_skip!(Build::Plain);
    let imgs = common::uniform_batch();
    let files: Vec<&[u8]> = imgs.iter().map(|i| i.file.as_slice()).collect();
    assert!(
        BatchPlan::new(&files, &DecodeOptions::default())
            .unwrap()
            .is_uniform()
    );
    check_batch(&exe, &imgs, &u8_opts(Layout::Nchw), "uniform");
}

/// f32 and f16 outputs with normalisation fused: exactly `fma(v, 1/std, -mean/std)`, and f16 rounded to
/// nearest even like the `half` crate.
#[test]
fn sim_normalised_float_outputs_match() {
    let exe = harness_or_skip!(Build::Plain);
    let imgs = common::float_batch();
    for dtype in [DType::F32, DType::F16] {
        for normalize in [None, Some(Normalize::IMAGENET)] {
            let opts = DecodeOptions {
                dtype,
                normalize,
                ..Default::default()
            };
            check_batch(
                &exe,
                &imgs,
                &opts,
                &format!("{dtype:?}-{}", normalize.is_some()),
            );
        }
    }
}

/// A crop of a real corpus image (PNG render), every channel count the corpus has.
#[test]
fn sim_corpus_crop_matches_cpu_decoder() {
    let exe = harness_or_skip!(Build::Plain);
    let mut imgs = Vec::new();
    for (name, x0, y0) in [
        ("UbuntuMateCold.png", 700u32, 500u32),
        ("Gulp-rgba.png", 900, 400),
    ] {
        let Some((px, w, _h, c)) = common::corpus_png(name) else {
            eprintln!("skipping: corpus image {name} not found in ../shared/corpus");
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
    check_batch(&exe, &imgs, &u8_opts(Layout::Nhwc), "corpus-nhwc");
    check_batch(&exe, &imgs, &u8_opts(Layout::Nchw), "corpus-nchw");
}

/// Same launches under AddressSanitizer + UBSan: no access outside any buffer.
#[test]
fn sim_asan_clean() {
    let exe = harness_or_skip!(Build::Asan);
    let mut rng = Rng(5);
    let imgs = vec![
        image(1, 1, 1, 1, Content::Random, &mut rng),
        image(129, 67, 3, 128, Content::Random, &mut rng),
        image(255, 10, 4, 255, Content::Random, &mut rng),
        image(40, 30, 3, 7, Content::Smooth, &mut rng),
    ];
    check_batch(&exe, &imgs, &u8_opts(Layout::Nhwc), "asan-nhwc");
    check_batch(
        &exe,
        &imgs,
        &DecodeOptions {
            layout: Layout::Nchw,
            dtype: DType::F16,
            normalize: Some(Normalize::IMAGENET),
            check_rows_on_host: false,
        },
        "asan-f16",
    );
}

/// ThreadSanitizer: the kernel's barriers order every shared-memory write before the reads of it.
#[test]
fn sim_tsan_race_free() {
    let exe = harness_or_skip!(Build::Tsan);
    let mut rng = Rng(11);
    let imgs = vec![
        image(70, 19, 3, 64, Content::Random, &mut rng),
        image(9, 9, 1, 4, Content::Smooth, &mut rng),
    ];
    check_batch(&exe, &imgs, &u8_opts(Layout::Nchw), "tsan");
}

/// Corrupted patch bytes (offsets intact): the kernel accepts a patch exactly when the CPU decoder does,
/// then produces its bytes; otherwise it flags the lowest bad descriptor, which maps back to the image's
/// batch index. Runs under ASan, so no corrupt input reads outside the batch's buffers.
#[test]
fn sim_corrupt_rows_flagged_like_cpu_decoder() {
    let exe = harness_or_skip!(Build::Asan);
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
        let run = run_sim(&exe, &plan, &files, "corrupt");
        let f = l3_format::L3File::parse(&bad).unwrap();
        let mut cpu = vec![0u8; f.decoded_len()];
        let cpu_ok = f.decode_chw(&mut cpu).is_ok();
        let host_check = crate::plan::check_rows(&f).is_ok();
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
    let exe = harness_or_skip!(Build::Asan);
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
    let run = run_sim_data(&exe, &plan, &all, "in-place");
    assert_eq!(run.err, u32::MAX);
    common::check_output(&run.out, &plan.images, &imgs, &opts, "in-place");
}
