//! The sampling schedule's invariants over a grid of shard sizes, mixes, budgets (one slot per format up to
//! more than the dataset), odd batch sizes and seeds.

use liquid_sampler::plan::{BufferPlan, Planner};
use std::collections::HashSet;

/// A planned batch: (epoch, draws as (local, format, cached, kept), loads).
type Planned = (usize, Vec<(u32, u16, bool, bool)>, Vec<u32>);

struct Run {
    n: usize,
    items: Vec<usize>,
    buffers: BufferPlan,
    batch: usize,
    batches: Vec<Planned>,
    max_resident: usize,
}

fn run(
    n_raw: usize,
    n_cmp: usize,
    slots: [u64; 2],
    budget: u64,
    batch: usize,
    seed: u64,
    epochs: usize,
) -> Run {
    // Interleave the two formats on "disk" so storage order and format are not aligned.
    let n = n_raw + n_cmp;
    let mut format_of = Vec::with_capacity(n);
    let (mut r, mut c) = (0, 0);
    for i in 0..n {
        let raw = if c == n_cmp {
            true
        } else if r == n_raw {
            false
        } else {
            i % 3 == 0
        };
        format_of.push(if raw { 1u16 } else { 0 });
        if raw { r += 1 } else { c += 1 }
    }
    let keys: Vec<(u32, u64)> = (0..n).map(|i| ((i % 2) as u32, i as u64 * 4096)).collect();
    let items = vec![n_cmp, n_raw];
    let sizes = vec![vec![slots[0]; n_cmp], vec![slots[1]; n_raw]];
    let buffers = BufferPlan::new(budget, &sizes).expect("budget fits one slot per format");
    let mut p = Planner::new(&format_of, &keys, &buffers, batch, seed).unwrap();
    let mut batches = Vec::new();
    let mut max_resident = 0;
    loop {
        let plan = p.next_batch();
        if plan.epoch == epochs {
            break;
        }
        let d = plan
            .draws
            .iter()
            .map(|d| (d.local, d.format, d.cached, d.kept))
            .collect();
        batches.push((plan.epoch, d, plan.loads().collect()));
        max_resident = max_resident.max(p.resident().count_ones());
        // Loaded-but-undrawn items and next-region items together never exceed the slots.
        assert!(p.resident().count_ones() <= buffers.capacity.iter().sum::<usize>());
    }
    Run {
        n,
        items,
        buffers,
        batch,
        batches,
        max_resident,
    }
}

fn check(r: &Run, epochs: usize, what: &str) {
    let n = r.n;
    let mut kept_prev: Option<HashSet<u32>> = None;
    for e in 0..epochs {
        let bs: Vec<_> = r.batches.iter().filter(|b| b.0 == e).collect();
        assert_eq!(
            bs.len(),
            n.div_ceil(r.batch),
            "{what}: batches in epoch {e}"
        );
        // Every item exactly once per epoch.
        let mut seen = vec![0u32; n];
        for b in &bs {
            for d in &b.1 {
                seen[d.0 as usize] += 1;
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "{what}: epoch {e} not a permutation"
        );
        // Per-batch mix within one item of the ratio.
        for b in &bs {
            let len = b.1.len() as f64;
            for f in 0..2u16 {
                let m = b.1.iter().filter(|d| d.1 == f).count() as f64;
                let want = len * r.items[f as usize] as f64 / n as f64;
                assert!(
                    (m - want).abs() < 1.0,
                    "{what}: epoch {e} mix {m} vs {want}"
                );
            }
        }
        // Cached = kept in the previous epoch, exactly.
        let cached: HashSet<u32> = bs
            .iter()
            .flat_map(|b| b.1.iter().filter(|d| d.2).map(|d| d.0))
            .collect();
        match &kept_prev {
            None => assert!(cached.is_empty(), "{what}: cached items in the first epoch"),
            Some(k) => assert_eq!(&cached, k, "{what}: epoch {e} cached set"),
        }
        kept_prev = Some(
            bs.iter()
                .flat_map(|b| b.1.iter().filter(|d| d.3).map(|d| d.0))
                .collect(),
        );
        if e == 0 {
            continue;
        }
        // Hit ratio: what the plan promises, and min(1, budget/dataset) within one batch.
        let hits = cached.len() as f64;
        assert_eq!(
            hits,
            r.buffers.hit_ratio() * n as f64,
            "{what}: epoch {e} hits"
        );
        let target = r.buffers.target_hit_ratio() * n as f64;
        assert!(
            (hits - target).abs() <= r.batch.max(1) as f64,
            "{what}: epoch {e} hits {hits} vs target {target}"
        );
        // Disk items per full batch level within one; a batch holding a format's last draw of the
        // epoch may read fewer, never more than one over the fewest; the short last batch no more.
        let mut left = r.items.clone();
        let mut full = Vec::new();
        for b in &bs {
            let mut ends = false;
            for d in &b.1 {
                left[d.1 as usize] -= 1;
                ends |= left[d.1 as usize] == 0;
            }
            if b.1.len() == r.batch {
                full.push((b.2.len(), ends));
            }
        }
        let others: Vec<usize> = full.iter().filter(|b| !b.1).map(|b| b.0).collect();
        if let (Some(&lo), Some(&hi)) = (others.iter().min(), others.iter().max()) {
            assert!(
                hi - lo <= 1 && full.iter().all(|b| b.0 <= lo + 1),
                "{what}: epoch {e} disk items per full batch (and whether it ends a format) {full:?}"
            );
            let last = bs.last().unwrap();
            assert!(
                last.2.len() <= hi + 1,
                "{what}: short batch loads {}",
                last.2.len()
            );
        }
        // Disk items over the epoch = items not kept in memory.
        let loads: usize = bs.iter().map(|b| b.2.len()).sum();
        assert_eq!(loads as f64, n as f64 - hits, "{what}: epoch {e} loads");
    }
}

#[test]
fn invariants_over_a_grid() {
    let slots = [8192u64, 12288];
    let mut configs = 0;
    for (n_raw, n_cmp) in [
        (0, 1),
        (1, 0),
        (3, 4),
        (0, 37),
        (29, 0),
        (23, 77),
        (61, 40),
        (150, 151),
    ] {
        let n = n_raw + n_cmp;
        let min: u64 = [n_cmp, n_raw]
            .iter()
            .zip(slots)
            .filter(|(c, _)| **c > 0)
            .map(|(_, s)| s)
            .sum();
        let dataset = n_cmp as u64 * slots[0] + n_raw as u64 * slots[1];
        let budgets = [
            min,
            min + 8192,
            dataset / 10,
            dataset * 3 / 10,
            dataset / 2,
            dataset - 1,
            dataset,
            dataset * 2,
        ];
        for budget in budgets.into_iter().filter(|&b| b >= min) {
            for batch in [1, 3, 7, 16, 33] {
                for seed in [0, 7] {
                    let epochs = 4;
                    let what = format!(
                        "n_raw={n_raw} n_cmp={n_cmp} budget={budget} batch={batch} seed={seed}"
                    );
                    let r = run(n_raw, n_cmp, slots, budget, batch, seed, epochs);
                    check(&r, epochs, &what);
                    assert!(r.max_resident <= n, "{what}");
                    configs += 1;
                }
            }
        }
    }
    assert!(configs > 500);
}

#[test]
fn same_seed_same_sequence_other_seed_other_sequence() {
    let a = run(40, 60, [8192, 12288], 400_000, 9, 3, 3);
    let b = run(40, 60, [8192, 12288], 400_000, 9, 3, 3);
    let c = run(40, 60, [8192, 12288], 400_000, 9, 4, 3);
    assert_eq!(a.batches, b.batches);
    assert_ne!(a.batches, c.batches);
}

#[test]
fn hit_ratio_follows_the_budget() {
    // 30% of the dataset in memory: 30% of each later epoch served from memory, 70% read.
    let (n_raw, n_cmp) = (100, 100);
    let dataset = 100 * 8192 + 100 * 12288;
    let r = run(n_raw, n_cmp, [8192, 12288], dataset * 3 / 10, 10, 1, 3);
    assert!(
        (r.buffers.hit_ratio() - 0.3).abs() <= 0.01,
        "{}",
        r.buffers.hit_ratio()
    );
    let e1: Vec<_> = r.batches.iter().filter(|b| b.0 == 1).collect();
    for b in &e1 {
        assert!(
            (6..=8).contains(&b.2.len()),
            "7 +- 1 of 10 items per batch come from disk"
        );
    }
    assert_eq!(e1.iter().map(|b| b.2.len()).sum::<usize>(), 140);
}

#[test]
fn budget_smaller_than_one_item_is_an_error() {
    let e = BufferPlan::new(8191 + 12288, &[vec![8192; 5], vec![12288; 5]]).unwrap_err();
    assert!(
        matches!(e, liquid_sampler::Error::BudgetTooSmall { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("20480"), "{e}");
    let e = BufferPlan::new(100, &[vec![], vec![]]).unwrap_err();
    assert!(matches!(e, liquid_sampler::Error::EmptyDataset), "{e}");
}

#[test]
fn varied_item_sizes_never_exceed_the_budget() {
    let mut x = 77u64;
    let mut size = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        4096 * (1 + x % 10)
    };
    let sizes = vec![
        (0..120).map(|_| size()).collect::<Vec<u64>>(),
        vec![12288; 80],
    ];
    let dataset: u64 = sizes.iter().flatten().sum();
    let mut last = 0;
    for pct in [1u64, 5, 10, 30, 50, 80, 99, 100, 150] {
        let budget = (dataset * pct / 100).max(40960 + 12288);
        let p = BufferPlan::new(budget, &sizes).unwrap();
        assert!(
            p.buffer_bytes() <= budget,
            "{pct}%: {} > {budget}",
            p.buffer_bytes()
        );
        let kept: usize = p.retained.iter().sum();
        assert!(kept >= last, "more budget, more kept");
        last = kept;
        assert!(p.hit_ratio() <= p.target_hit_ratio() + 1.0 / 200.0);
        if pct >= 100 {
            assert_eq!(p.hit_ratio(), 1.0);
        }
        if (30..100).contains(&pct) {
            // Reserving for the largest items costs something, but not most of the budget.
            assert!(
                p.hit_ratio() > 0.6 * p.target_hit_ratio(),
                "{pct}%: {}",
                p.hit_ratio()
            );
        }
    }
}
