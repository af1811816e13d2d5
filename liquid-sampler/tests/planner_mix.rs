//! The planner over every small shape: 1 to 3 formats of 0..70 items, batches 1..70, budgets from one
//! slot per format to beyond the dataset. It must never panic, draw every item exactly once per epoch,
//! keep each batch's format mix within the documented bound and never hold more than the budget.
//! Also the two shapes that used to wrap a subtraction in the per-batch mix ("capacity overflow"), end to
//! end through the sampler on real files.

use liquid_sampler::plan::{BufferPlan, Planner};
use liquid_sampler::*;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

/// In-memory size of item `i` of format `f`: one to four 4096-byte pages, varied.
fn size_of(f: usize, i: usize) -> u64 {
    4096 * (1 + ((i * 7 + f * 3) % 4) as u64)
}

/// Plans `epochs` epochs and checks every invariant; returns the number of batches planned.
fn check_shape(counts: &[usize], batch: usize, budget_pick: u64, seed: u64, epochs: usize) {
    let what = format!("counts={counts:?} batch={batch} budget_pick={budget_pick} seed={seed}");
    let sizes: Vec<Vec<u64>> = counts
        .iter()
        .enumerate()
        .map(|(f, &c)| (0..c).map(|i| size_of(f, i)).collect())
        .collect();
    let n: usize = counts.iter().sum();
    // One slot per used format (its largest item) up to 1.5 x the dataset.
    let min: u64 = sizes.iter().filter_map(|v| v.iter().max().copied()).sum();
    let dataset: u64 = sizes.iter().flatten().sum();
    let budget = min + budget_pick % (dataset + dataset / 2 + 1).saturating_sub(min).max(1);
    let plan = BufferPlan::new(budget, &sizes);
    if n == 0 {
        assert!(matches!(plan, Err(Error::EmptyDataset)), "{what}");
        return;
    }
    let plan = plan.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(plan.buffer_bytes() <= budget, "{what}: reservation");
    // Formats interleaved on disk in a seeded order; `size` follows each item.
    let mut format_of = Vec::with_capacity(n);
    let mut item_size = Vec::with_capacity(n);
    for (f, &c) in counts.iter().enumerate() {
        for i in 0..c {
            format_of.push(f as u16);
            item_size.push(size_of(f, i));
        }
    }
    let keys: Vec<(u32, u64)> = (0..n)
        .map(|i| ((i % 2) as u32, (i as u64 * 0x9E37_79B9) % 1_000_003))
        .collect();
    let mut p = Planner::new(&format_of, &keys, &plan, batch, seed)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let per_epoch = n.div_ceil(batch);
    assert_eq!(p.batches_per_epoch(), per_epoch, "{what}");
    for e in 0..epochs {
        let mut seen = vec![0u32; n];
        let mut drawn = vec![0usize; counts.len()];
        // Disk items of each full batch, and whether it holds some format's last draw of the epoch.
        let mut full_batch_loads = Vec::new();
        for b in 0..per_epoch {
            let bp = p.next_batch();
            assert_eq!((bp.epoch, bp.batch), (e, b), "{what}");
            let len = bp.draws.len();
            let before = drawn.clone();
            assert_eq!(len, batch.min(n - b * batch), "{what}: batch {b} size");
            let mut m = vec![0usize; counts.len()];
            for d in &bp.draws {
                seen[d.local as usize] += 1;
                assert_eq!(d.format, format_of[d.local as usize], "{what}");
                m[d.format as usize] += 1;
            }
            let s0 = b * batch;
            let s1 = s0 + len;
            let used = counts.iter().filter(|&&c| c > 0).count();
            for (f, &c) in counts.iter().enumerate() {
                let share = c as f64 / n as f64;
                // Cumulative quota: the first s draws of the epoch hold floor or ceil of s x share.
                drawn[f] += m[f];
                let ideal = s1 as f64 * share;
                assert!(
                    (drawn[f] as f64 - ideal).abs() < 1.0,
                    "{what}: epoch {e} after {s1} draws format {f} has {} (ideal {ideal})",
                    drawn[f]
                );
                // Per batch: within one item of batch x share with two formats, within two otherwise.
                let bound = if used <= 2 { 1.0 } else { 2.0 };
                let want = len as f64 * share;
                assert!(
                    (m[f] as f64 - want).abs() < bound,
                    "{what}: epoch {e} batch {b} format {f}: {} vs {want}",
                    m[f]
                );
            }
            if len == batch {
                let ends =
                    (0..counts.len()).any(|f| drawn[f] == counts[f] && before[f] < counts[f]);
                full_batch_loads.push((bp.loads().count(), ends));
            }
            // The resident set never needs more than the budget (nor its format's slots).
            let resident: u64 = p.resident().iter_ones().map(|i| item_size[i]).sum();
            assert!(
                resident <= budget,
                "{what}: {resident} bytes resident > {budget}"
            );
            for (f, &cap) in plan.capacity.iter().enumerate() {
                let r = p
                    .resident()
                    .iter_ones()
                    .filter(|&i| format_of[i] as usize == f)
                    .count();
                assert!(r <= cap, "{what}: format {f} holds {r} > {cap} slots");
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "{what}: epoch {e} is not a permutation"
        );
        if e > 0 {
            level_disk_traffic(&full_batch_loads, &format!("{what}: epoch {e}"));
        }
    }
}

/// Disk traffic is level after the first epoch: full batches read within one item of each other. A
/// batch that holds a format's last draw of the epoch may read fewer (that draw can be the one that
/// fills the format's buffer for the next epoch), never more than one over the fewest of the others.
fn level_disk_traffic(full_batches: &[(usize, bool)], what: &str) {
    let others: Vec<usize> = full_batches.iter().filter(|b| !b.1).map(|b| b.0).collect();
    let (Some(&lo), Some(&hi)) = (others.iter().min(), others.iter().max()) else {
        return;
    };
    assert!(
        hi - lo <= 1 && full_batches.iter().all(|b| b.0 <= lo + 1),
        "{what}: disk items per full batch (and whether it ends a format) {full_batches:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn planner_never_panics_and_keeps_its_promises(
        counts in proptest::collection::vec(0usize..70, 1..=3),
        batch in 1usize..70,
        budget_pick in any::<u64>(),
        seed in any::<u64>(),
    ) {
        check_shape(&counts, batch, budget_pick, seed, 3);
    }
}

/// Exhaustive over the three-format shapes most likely to hit a rounding edge: small counts, every batch.
#[test]
fn small_three_format_shapes_exhaustively() {
    for a in 0..7 {
        for b in 0..7 {
            for c in 0..7 {
                for batch in 1..=a + b + c + 1 {
                    check_shape(&[a, b, c], batch, 0, 1, 2);
                    check_shape(&[a, b, c], batch, u64::MAX, 2, 2);
                }
            }
        }
    }
}

/// Every two-format split of 36 items (what `l3 liquid profile` writes for the CLI tests, at whatever ratio
/// the probes choose), every batch size, budgets from one slot per format to beyond the dataset.
#[test]
fn every_split_of_thirty_six_items() {
    for a in 0..=36 {
        for batch in 1..=37 {
            for (seed, pick) in [0u64, 40_000, 80_000, 150_000, u64::MAX]
                .into_iter()
                .enumerate()
            {
                check_shape(&[a, 36 - a], batch, pick, seed as u64, 3);
            }
        }
    }
}

fn corpus() -> PathBuf {
    std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"))
}

/// Real corpus files with `ext`, sorted.
fn corpus_files(ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(corpus())
        .expect("the corpus in ../shared/corpus")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext)))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no .{ext} files in the corpus");
    v
}

/// A three-format dataset as `l3 liquid profile` writes it: `jpeg` and `png` items and `raw` items of
/// `w`x`h` RGB, in that format order. The sampler never decodes, so the compressed items are the first
/// bytes of real corpus files, cut to what a `w`x`h` JPEG (1 byte per pixel) or PNG (2) would weigh.
fn three_formats(dir: &Path, jpeg: usize, png: usize, raw: usize, w: u32, h: u32) {
    let formats = vec![
        FormatSpec {
            tag: "jpeg".into(),
            kind: FormatKind::Compressed,
        },
        FormatSpec {
            tag: "png".into(),
            kind: FormatKind::Compressed,
        },
        FormatSpec {
            tag: "raw".into(),
            kind: FormatKind::Raw,
        },
    ];
    let mut wr = DatasetWriter::create(
        dir,
        0,
        Ratio {
            compressed: 1,
            raw: 1,
        },
        formats,
    )
    .unwrap();
    let dims = Dims {
        width: w,
        height: h,
        channels: 3,
    };
    let (jpegs, pngs) = (corpus_files("jpg"), corpus_files("png"));
    let mut id = 0u64;
    for i in 0..jpeg {
        let mut bytes = std::fs::read(&jpegs[i % jpegs.len()]).unwrap();
        bytes.truncate((w * h) as usize);
        wr.add(id, 0, 0, &bytes, dims).unwrap();
        id += 1;
    }
    for i in 0..png {
        let mut bytes = std::fs::read(&pngs[i % pngs.len()]).unwrap();
        bytes.truncate((w * h * 2) as usize);
        wr.add(id, 1, 1, &bytes, dims).unwrap();
        id += 1;
    }
    for _ in 0..raw {
        let pixels: Vec<u8> = (0..w * h * 3).map(|v| (v as u64 + id) as u8).collect();
        wr.add(id, 2, 2, &pixels, dims).unwrap();
        id += 1;
    }
    wr.finish().unwrap();
}

fn stream_epochs(dir: &Path, budget: u64, batch: usize, epochs: usize) {
    let ds = Dataset::open(dir).unwrap();
    let n = ds.manifest.items.len();
    let mut s = LiquidSampler::new(ds, &SamplerConfig::new(budget, batch)).unwrap();
    for e in 0..epochs {
        let mut ids = Vec::new();
        for _ in 0..s.batches_per_epoch() {
            let b = s.next_batch().unwrap();
            assert_eq!(b.epoch, e);
            ids.extend(b.items.iter().map(|d| d.item.id));
        }
        ids.sort_unstable();
        assert_eq!(ids, (0..n as u64).collect::<Vec<_>>(), "epoch {e}");
    }
}

/// `l3 liquid profile` on 6 JPEG + 6 PNG images of 256x192 wrote 4 jpeg, 2 png and 6 raw items; streaming
/// them with `--budget 4000000 --batch 1` panicked with "capacity overflow".
#[test]
fn twelve_images_three_formats_batch_one() {
    let dir = tempfile::tempdir().unwrap();
    three_formats(dir.path(), 4, 2, 6, 256, 192);
    stream_epochs(dir.path(), 4_000_000, 1, 3);
}

/// A valid dataset of 66 jpeg, 1 png and 32 raw items at the default batch size (32) panicked the same way.
#[test]
fn sixty_six_one_thirty_two_default_batch() {
    let dir = tempfile::tempdir().unwrap();
    three_formats(dir.path(), 66, 1, 32, 64, 48);
    let ds = Dataset::open(dir.path()).unwrap();
    let total: u64 = ds
        .manifest
        .items
        .iter()
        .map(|i| i.location.length.div_ceil(4096) * 4096)
        .sum();
    stream_epochs(dir.path(), total / 2, 32, 3);
    stream_epochs(dir.path(), total * 2, 32, 2);
}
