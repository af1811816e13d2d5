//! Per-channel statistics that merge exactly: (count, mean, M2) with Chan et al.'s parallel update.
//!
//! Tiles report these instead of their activations ("delayed normalisation", section 3.3.1): the merge of
//! every tile's triple is the whole image's mean and variance, whatever the tile sizes. Accumulated in f64
//! so that the tiled and the whole-image statistics agree to far below f32 resolution.

/// Count, mean and sum of squared deviations of one channel.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ChannelStats {
    pub count: u64,
    pub mean: f64,
    pub m2: f64,
}

/// `Σ f(v)` in eight interleaved f64 sums, added pairwise at the end: the additions of one sum do not
/// wait for each other (a single running sum is bound by the adder's latency), and the result is a
/// little more accurate, not less.
fn lanes_sum(values: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    let [a, b, c, d, e, f2, g, h] = acc;
    let mut s = ((a + b) + (c + d)) + ((e + f2) + (g + h));
    for &v in rest {
        s += f(v);
    }
    s
}

impl ChannelStats {
    /// Statistics of a slice (two-pass in f64 within the slice, which is as exact as Welford and faster).
    pub fn of(values: &[f32]) -> ChannelStats {
        if values.is_empty() {
            return ChannelStats::default();
        }
        let n = values.len() as f64;
        let mean = lanes_sum(values, |v| v as f64) / n;
        let m2 = lanes_sum(values, |v| {
            let d = v as f64 - mean;
            d * d
        });
        ChannelStats {
            count: values.len() as u64,
            mean,
            m2,
        }
    }

    /// Chan, Golub and LeVeque's pairwise merge.
    pub fn merge(self, o: ChannelStats) -> ChannelStats {
        if self.count == 0 {
            return o;
        }
        if o.count == 0 {
            return self;
        }
        let n = (self.count + o.count) as f64;
        let d = o.mean - self.mean;
        ChannelStats {
            count: self.count + o.count,
            mean: self.mean + d * o.count as f64 / n,
            m2: self.m2 + o.m2 + d * d * self.count as f64 * o.count as f64 / n,
        }
    }

    /// The biased variance, as InstanceNorm2d and BatchNorm2d normalise with.
    pub fn variance(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.m2 / self.count as f64
        }
    }
}

/// Merges per-tile channel statistics (`tiles[t][c]`) into one per channel.
pub fn merge_all(tiles: &[Vec<ChannelStats>]) -> Vec<ChannelStats> {
    let c = tiles.first().map_or(0, Vec::len);
    (0..c)
        .map(|ch| {
            tiles
                .iter()
                .fold(ChannelStats::default(), |a, t| a.merge(t[ch]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_equals_whole() {
        let v: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 113) as f32 * 0.37 - 9.0)
            .collect();
        let whole = ChannelStats::of(&v);
        let parts = [&v[..1], &v[1..333], &v[333..334], &v[334..]];
        let merged = parts
            .iter()
            .fold(ChannelStats::default(), |a, p| a.merge(ChannelStats::of(p)));
        assert_eq!(merged.count, 1000);
        assert!((merged.mean - whole.mean).abs() < 1e-12);
        assert!((merged.variance() - whole.variance()).abs() < 1e-9);
    }
}
