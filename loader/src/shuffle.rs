//! How far an order is from a uniform shuffle, in the statistics that matter for training: computed from
//! the seeded schedule alone (no image is read), beside the same statistics of a uniform shuffle of the
//! same dataset, batch size and world size.
//!
//! PCR's record-aware order (records shuffled, items shuffled within a window of records) trades shuffle
//! quality for reading each record once; this report says how much quality, so the window can be chosen
//! with numbers.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::options::{LoaderOptions, Order};
use crate::pipeline::schedule::ShardedOrder;

/// One statistic of an order and of a uniform shuffle of the same dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct ShuffleStat {
    pub name: &'static str,
    /// What it measures and which way is better.
    pub meaning: &'static str,
    pub order: f64,
    pub uniform: f64,
}

/// Statistics over `epochs` epochs of every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct ShuffleReport {
    pub items: usize,
    pub epochs: usize,
    pub batch_size: usize,
    pub world_size: usize,
    /// PCR records shuffled together (`None`: items are independent).
    pub window: Option<usize>,
    pub stats: Vec<ShuffleStat>,
}

/// The report for `ds` under the options' order. The Liquid order's schedule is replayed without reading
/// any data (its positions are the dataset's item indices; its buffers fill in storage order within
/// each format).
pub fn shuffle_report(ds: &dyn Dataset, o: &LoaderOptions, epochs: usize) -> Result<ShuffleReport> {
    if ds.is_empty() || epochs == 0 || o.batch_size == 0 {
        return Err(Error::Options(
            "the shuffle report needs items, an epoch and a batch size".into(),
        ));
    }
    let labels: Vec<u32> = (0..ds.len()).map(|i| ds.label(i)).collect();
    if let Order::Liquid { budget_bytes } = o.order {
        return liquid_report(ds, o, budget_bytes, epochs, &labels);
    }
    let blocks: Vec<usize> = ds.blocks().map_or_else(Vec::new, |b| b.starts.to_vec());
    let window = ds.blocks().map(|b| b.window);
    Ok(ShuffleReport::for_layout(
        &labels, &blocks, window, o, epochs,
    ))
}

impl ShuffleReport {
    /// The report for a dataset laid out as given: each item's label in storage order, the first item of
    /// each PCR record (empty: independent items) and the records shuffled together.
    pub fn for_layout(
        labels: &[u32],
        blocks: &[usize],
        window: Option<usize>,
        o: &LoaderOptions,
        epochs: usize,
    ) -> ShuffleReport {
        let order = |blocks: &[usize], rank: usize| ShardedOrder {
            len: labels.len(),
            seed: o.seed,
            shuffle: o.shuffle,
            rank,
            world_size: o.world_size,
            tail: o.shard_tail,
            blocks: blocks.to_vec().into(),
            window: window.unwrap_or(1),
        };
        let ours = measure(&|r, e| order(blocks, r).epoch(e), o, epochs, labels);
        let mut report = ShuffleReport::beside_uniform(ours, o, epochs, labels);
        report.window = (!blocks.is_empty()).then_some(window.unwrap_or(1));
        report
    }

    /// A report of the statistics `ours`, beside a uniform shuffle's of the same shape.
    fn beside_uniform(ours: [f64; 5], o: &LoaderOptions, epochs: usize, labels: &[u32]) -> Self {
        let uniform_order = |rank| ShardedOrder {
            len: labels.len(),
            seed: o.seed,
            shuffle: true,
            rank,
            world_size: o.world_size,
            tail: o.shard_tail,
            blocks: Vec::new().into(),
            window: 1,
        };
        let uniform = measure(&|r, e| uniform_order(r).epoch(e), o, epochs, labels);
        let stats = NAMES
            .iter()
            .zip(ours.iter().zip(&uniform))
            .map(|(&(name, meaning), (&a, &b))| ShuffleStat {
                name,
                meaning,
                order: a,
                uniform: b,
            })
            .collect();
        ShuffleReport {
            items: labels.len(),
            epochs,
            batch_size: o.batch_size,
            world_size: o.world_size,
            window: None,
            stats,
        }
    }

    /// The statistic called `name`.
    pub fn stat(&self, name: &str) -> Option<&ShuffleStat> {
        self.stats.iter().find(|s| s.name == name)
    }
}

const NAMES: [(&str, &str); 5] = [
    (
        "order_correlation",
        "Pearson correlation of visit position with storage position, per rank and epoch (0 is best)",
    ),
    (
        "position_spread",
        "spread of the storage positions one visit position draws from across epochs, over a uniform \
         draw's (1 is best)",
    ),
    (
        "neighbours_same_batch",
        "share of storage neighbours (i, i+1) that land in one batch (uniform: (B-1)/(n-1); lower is \
         better)",
    ),
    (
        "batch_span",
        "storage span of a batch, max - min over n - 1 (uniform: (B-1)/(B+1); higher is better)",
    ),
    (
        "label_entropy_bits",
        "entropy of the labels in a batch, in bits (higher is better)",
    ),
];

/// The Liquid order's report: each rank's schedule replayed.
fn liquid_report(
    ds: &dyn Dataset,
    o: &LoaderOptions,
    budget: u64,
    epochs: usize,
    labels: &[u32],
) -> Result<ShuffleReport> {
    let l = ds.liquid().ok_or_else(|| {
        Error::Options(format!(
            "the Liquid order needs a Liquid dataset, not {}",
            ds.describe()
        ))
    })?;
    let seqs = (0..o.world_size)
        .map(|rank| {
            let cfg = liquid_sampler::SamplerConfig {
                budget,
                batch: o.batch_size,
                seed: o.seed,
                rank,
                world_size: o.world_size,
                shard_policy: o.shard_tail,
                io_threads: 1,
                items: None,
            };
            liquid_sampler::delivered_epochs(l, &cfg, epochs)
                .map_err(|e| Error::Options(format!("Liquid order on {}: {e}", l.dir.display())))
        })
        .collect::<Result<Vec<_>>>()?;
    let ours = measure(
        &|r, e| seqs[r][e].iter().map(|&i| i as usize).collect(),
        o,
        epochs,
        labels,
    );
    Ok(ShuffleReport::beside_uniform(ours, o, epochs, labels))
}

/// The five statistics (in [`NAMES`]' order) of the orders `order(rank, epoch)` make.
fn measure(
    order: &dyn Fn(usize, usize) -> Vec<usize>,
    o: &LoaderOptions,
    epochs: usize,
    labels: &[u32],
) -> [f64; 5] {
    let n = labels.len();
    let b = o.batch_size;
    let (mut corr, mut corr_n) = (0.0, 0usize);
    let (mut same, mut pairs) = (0usize, 0usize);
    let (mut span, mut entropy, mut batches) = (0.0, 0.0, 0usize);
    // Per visit position of rank 0: the storage positions it drew over the epochs (sum and sum of squares).
    let mut moments: Vec<(f64, f64)> = Vec::new();
    for e in 0..epochs {
        let mut batch_of = vec![usize::MAX; n];
        let mut next_batch = 0usize;
        for rank in 0..o.world_size {
            let seq = order(rank, e);
            if seq.len() > 1 {
                corr += pearson(&seq);
                corr_n += 1;
            }
            if rank == 0 {
                moments.resize(seq.len(), (0.0, 0.0));
                for (m, &i) in moments.iter_mut().zip(&seq) {
                    m.0 += i as f64;
                    m.1 += (i as f64) * (i as f64);
                }
            }
            for chunk in seq.chunks(b) {
                for &i in chunk {
                    batch_of[i] = next_batch;
                }
                next_batch += 1;
                let (lo, hi) = chunk
                    .iter()
                    .fold((usize::MAX, 0), |(lo, hi), &i| (lo.min(i), hi.max(i)));
                span += (hi - lo) as f64 / (n.max(2) - 1) as f64;
                entropy += label_entropy(chunk.iter().map(|&i| labels[i]));
                batches += 1;
            }
        }
        for i in 0..n.saturating_sub(1) {
            pairs += 1;
            same += usize::from(batch_of[i] != usize::MAX && batch_of[i] == batch_of[i + 1]);
        }
    }
    let uniform_sd = n as f64 / 12f64.sqrt();
    let spread = if epochs > 1 && !moments.is_empty() && uniform_sd > 0.0 {
        let k = epochs as f64;
        moments
            .iter()
            .map(|&(s, s2)| ((s2 / k - (s / k).powi(2)).max(0.0) * k / (k - 1.0)).sqrt())
            .sum::<f64>()
            / moments.len() as f64
            / uniform_sd
    } else {
        f64::NAN
    };
    [
        corr / corr_n.max(1) as f64,
        spread,
        same as f64 / pairs.max(1) as f64,
        span / batches.max(1) as f64,
        entropy / batches.max(1) as f64,
    ]
}

/// Pearson correlation of position with value.
fn pearson(seq: &[usize]) -> f64 {
    let m = seq.len() as f64;
    let mx = (m - 1.0) / 2.0;
    let my = seq.iter().sum::<usize>() as f64 / m;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (p, &v) in seq.iter().enumerate() {
        let (dx, dy) = (p as f64 - mx, v as f64 - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx == 0.0 || syy == 0.0 {
        0.0
    } else {
        sxy / (sxx * syy).sqrt()
    }
}

fn label_entropy(labels: impl Iterator<Item = u32>) -> f64 {
    let mut counts: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    let mut total = 0usize;
    for l in labels {
        *counts.entry(l).or_default() += 1;
        total += 1;
    }
    counts
        .values()
        .map(|&c| {
            let p = c as f64 / total as f64;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(blocks: Vec<usize>, window: usize, shuffle: bool) -> [f64; 5] {
        let labels: Vec<u32> = (0..1000).map(|i| (i / 100) as u32).collect();
        let o = LoaderOptions {
            batch_size: 10,
            ..LoaderOptions::default()
        };
        let order = |rank| ShardedOrder {
            len: 1000,
            seed: 3,
            shuffle,
            rank,
            world_size: 1,
            tail: vocab::ShardPolicy::Pad,
            blocks: blocks.clone().into(),
            window,
        };
        measure(&|r, e| order(r).epoch(e), &o, 8, &labels)
    }

    #[test]
    fn the_statistics_tell_sequential_windowed_and_uniform_orders_apart() {
        let sequential = stats(Vec::new(), 1, false);
        let uniform = stats(Vec::new(), 1, true);
        let records: Vec<usize> = (0..100).map(|r| r * 10).collect();
        let window1 = stats(records.clone(), 1, true);
        let window8 = stats(records, 8, true);
        // Correlation with storage order: 1 when sequential, about 0 shuffled.
        assert!((sequential[0] - 1.0).abs() < 1e-9);
        assert!(uniform[0].abs() < 0.1 && window1[0].abs() < 0.1);
        // The same position draws from everywhere across epochs unless the order never changes.
        assert_eq!(sequential[1], 0.0);
        assert!((uniform[1] - 1.0).abs() < 0.2, "{}", uniform[1]);
        // Storage neighbours share a batch: 9 in 10 sequential, (B-1)/(n-1) uniform, more with small windows.
        assert!((sequential[2] - 0.9).abs() < 0.01);
        assert!((uniform[2] - 9.0 / 999.0).abs() < 0.01, "{}", uniform[2]);
        assert!(window1[2] > window8[2] && window8[2] > uniform[2]);
        // Labels (100 per class, 10 per record): one per batch sequential, more the wider the window.
        assert!(sequential[4] < 1e-9);
        assert!(
            window1[4] < window8[4] && window8[4] < uniform[4] + 1e-9,
            "{window1:?} {window8:?}"
        );
    }
}
