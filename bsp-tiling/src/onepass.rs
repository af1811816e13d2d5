//! One pass per tile with fixed statistics: the receptive-field halo instead of a superstep per layer.
//!
//! Once every normalisation's statistics are known, a tile no longer needs its neighbours' activations:
//! it reads a window of the *input* as wide as the receptive field and runs all stages on shrinking
//! regions, in memory proportional to the tile. Two ways to get the statistics:
//!
//! * [`run_sampled`] — the paper's "normalisation via sampling" (section 3.3.2): statistics of a
//!   downsampled copy ([`Downsampled`], computed as it is read), processed by the exact engine under
//!   the run's budget. Approximate.
//! * [`run_recompute`] — exact in bounded memory: one pass over all tiles per normalising stage, each
//!   recomputing the earlier stages with the statistics already merged, to collect that stage's
//!   statistics. Costs about `stages/2` times the compute of one pass, stores nothing but the output.

use crate::backend::Backend;
use crate::bsp::{RunInfo, inner_threads, prepare, run_exact, superstep};
use crate::error::{Error, Result};
use crate::field::{Field, Input, OutputSink, Sink, gather, span};
use crate::grid::Grid;
use crate::model::{Net, NetStats, Plan};
use crate::stats::{ChannelStats, merge_all};
use crate::store::Budget;

type Range2 = ((usize, usize), (usize, usize));

fn hull(a: Option<Range2>, b: Range2) -> Range2 {
    match a {
        None => b,
        Some(((a0, a1), (b0, b1))) => (
            (a0.min(b.0.0), a1.max(b.0.1)),
            (b0.min(b.1.0), b1.max(b.1.1)),
        ),
    }
}

/// The region each stage up to `target` must produce so that `target` can produce rows `ry` × columns
/// `rx`: its consumers' windows (and residual reads), hulled, walking backwards.
pub fn needed_regions(
    net: &Net,
    plan: &Plan,
    target: usize,
    ry: (usize, usize),
    rx: (usize, usize),
) -> Vec<Range2> {
    let mut need: Vec<Option<Range2>> = vec![None; target + 1];
    need[target] = Some((ry, rx));
    for i in (0..=target).rev() {
        let ((y0, y1), (x0, x1)) = need[i].expect("every stage up to target feeds it");
        let (ay, ax) = plan.axes[i];
        if i > 0 {
            need[i - 1] = Some(hull(
                need[i - 1],
                (ay.input_hull(y0, y1), ax.input_hull(x0, x1)),
            ));
        }
        if let Some(r) = net.stages[i].residual {
            need[r] = Some(hull(need[r], ((y0, y1), (x0, x1))));
        }
    }
    need.into_iter().map(|n| n.expect("set above")).collect()
}

/// Index maps shifted into a region starting at `origin`.
fn shifted(m: &[Option<usize>], origin: usize) -> Vec<Option<usize>> {
    m.iter().map(|v| v.map(|v| v - origin)).collect()
}

/// What every tile's one-pass evaluation shares.
pub struct Pass<'a, B: Backend> {
    pub net: &'a Net,
    pub plan: &'a Plan,
    pub backend: &'a B,
    pub weights: &'a [B::Weights],
    pub input: &'a dyn Field,
    pub stats: &'a NetStats,
    /// Threads each backend call may use.
    pub threads: usize,
}

impl<B: Backend> Pass<'_, B> {
    /// Computes stage `target`'s output over rows `ry` × columns `rx`, reading the input through the
    /// receptive field. Stages before `target` must have statistics; `target`'s own are applied if
    /// present, else its raw convolution output is returned (to collect them).
    pub fn eval_region(
        &self,
        target: usize,
        ry: (usize, usize),
        rx: (usize, usize),
    ) -> Result<B::Buf> {
        let Pass {
            net,
            plan,
            backend,
            weights,
            input,
            stats,
            threads,
        } = *self;
        let need = needed_regions(net, plan, target, ry, rx);
        // Forwards over the regions.
        let mut regions: Vec<Option<B::Buf>> = (0..=target).map(|_| None).collect();
        for i in 0..=target {
            let s = &net.stages[i];
            let ((y0, y1), (x0, x1)) = need[i];
            let (ay, ax) = plan.axes[i];
            let (ys, xs) = (ay.index_map(y0, y1), ax.index_map(x0, x1));
            let window = if i == 0 {
                backend.upload(gather(input, &ys, &xs)?)?
            } else {
                let prev = regions[i - 1].as_ref().expect("live");
                let ((py, _), (px, _)) = need[i - 1];
                backend.gather(prev, &shifted(&ys, py), &shifted(&xs, px))?
            };
            let mut y = backend.conv2d_valid(&window, &s.conv, &weights[i], threads)?;
            drop(window);
            if let Some(norm) = &s.norm {
                match &stats[i] {
                    Some(st) => backend.normalize(&mut y, st, norm, s.relu)?,
                    None if i == target => return Ok(y),
                    None => {
                        return Err(Error::Unsupported(format!(
                            "one-pass evaluation: the statistics of layer {} are missing",
                            s.name
                        )));
                    }
                }
            } else if s.relu {
                backend.relu(&mut y)?;
            }
            if let Some(r) = s.residual {
                let src = regions[r].as_ref().expect("live");
                let ((ry0, _), (rx0, _)) = need[r];
                let ys: Vec<Option<usize>> = (y0 - ry0..y1 - ry0).map(Some).collect();
                let xs: Vec<Option<usize>> = (x0 - rx0..x1 - rx0).map(Some).collect();
                let crop = backend.gather(src, &ys, &xs)?;
                backend.add(&mut y, &crop)?;
            }
            regions[i] = Some(y);
            for (j, reg) in regions.iter_mut().enumerate().take(i) {
                if plan.last_use[j] <= i {
                    *reg = None;
                }
            }
        }
        Ok(regions.pop().flatten().expect("target computed"))
    }
}

/// Runs every tile in one pass with the given statistics, writing `sink`.
pub fn run_fixed<B: Backend>(
    net: &Net,
    backend: &B,
    input: &dyn Input,
    grid: &Grid,
    stats: &NetStats,
    threads: usize,
    sink: &dyn Sink,
) -> Result<()> {
    let plan = net.plan(input.height(), input.width())?;
    let last = net.stages.len() - 1;
    let (_, h, w) = plan.out[last];
    let g = grid.at_level(plan.div[last], h, w)?;
    let workers = backend.concurrency(threads).min(g.len());
    let weights = net.load_weights(backend)?;
    let pass = Pass {
        net,
        plan: &plan,
        backend,
        weights: &weights,
        input,
        stats,
        threads: inner_threads(threads, workers),
    };
    superstep(g.len(), workers, |t| {
        let (y0, y1, x0, x1) = g.tile(t);
        let out = pass.eval_region(last, (y0, y1), (x0, x1))?;
        sink.put_tile(y0, x0, &backend.download(out)?)?;
        Ok(())
    })?;
    Ok(())
}

/// The input box-downsampled `factor` times (a partial last block averages what it has: the "sample
/// image" of section 3.3.2), computed window by window as it is read: the sampled
/// statistics' image (a 30,000² input's 2× sample is 2.7 GB of float32) is never held whole, and its
/// windows read only their blocks of the input.
pub struct Downsampled<'a> {
    input: &'a dyn Input,
    factor: usize,
}

impl<'a> Downsampled<'a> {
    pub fn new(input: &'a dyn Input, factor: usize) -> Downsampled<'a> {
        Downsampled {
            input,
            factor: factor.max(1),
        }
    }
}

impl Field for Downsampled<'_> {
    fn channels(&self) -> usize {
        self.input.channels()
    }

    /// Each output is the mean (in f64, rows then columns) of its block of the input; a window reads
    /// the blocks under it with one gather of the input.
    fn gather(&self, ys: &[Option<usize>], xs: &[Option<usize>], out: &mut [f32]) -> Result<()> {
        let (h, w, f) = (self.input.height(), self.input.width(), self.factor);
        let (c, n) = (self.channels(), ys.len() * xs.len());
        let (Some((y_lo, y_hi)), Some((x_lo, x_hi))) = (span(ys), span(xs)) else {
            out[..c * n].fill(0.0);
            return Ok(());
        };
        let (r0, c0) = (y_lo * f, x_lo * f);
        let rows: Vec<Option<usize>> = (r0..(y_hi * f).min(h)).map(Some).collect();
        let cols: Vec<Option<usize>> = (c0..(x_hi * f).min(w)).map(Some).collect();
        let block = gather(self.input, &rows, &cols)?;
        for ch in 0..c {
            for (iy, y) in ys.iter().enumerate() {
                for (ix, x) in xs.iter().enumerate() {
                    let v = match (*y, *x) {
                        (Some(oy), Some(ox)) => {
                            let (ya, yb) = (oy * f - r0, ((oy + 1) * f).min(h) - r0);
                            let (xa, xb) = (ox * f - c0, ((ox + 1) * f).min(w) - c0);
                            let mut acc = 0.0f64;
                            for y in ya..yb {
                                for x in xa..xb {
                                    acc += block.at(ch, y, x) as f64;
                                }
                            }
                            (acc / ((yb - ya) * (xb - xa)) as f64) as f32
                        }
                        _ => 0.0,
                    };
                    out[ch * n + iy * xs.len() + ix] = v;
                }
            }
        }
        crate::buffers::give(block.data);
        Ok(())
    }
}

impl Input for Downsampled<'_> {
    fn height(&self) -> usize {
        self.input.height().div_ceil(self.factor)
    }
    fn width(&self) -> usize {
        self.input.width().div_ceil(self.factor)
    }
}

/// Normalisation via sampling: statistics from the input downsampled `factor` times (computed with the
/// exact BSP engine on that smaller image, so memory stays bounded too), then one pass per tile.
#[allow(clippy::too_many_arguments)]
pub fn run_sampled<B: Backend>(
    net: &Net,
    backend: &B,
    input: &dyn Input,
    grid: &Grid,
    factor: usize,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    prepare(net, input, grid)?;
    let stats = if factor <= 1 {
        // Factor 1: the statistics of the image itself (exact, a check of the one-pass machinery).
        run_recompute_stats(net, backend, input, grid, threads)?
    } else {
        let small = Downsampled::new(input, factor);
        let align = net.total_stride();
        let tile = (1024 / align).max(1) * align;
        let sg = Grid::with_tile(small.height(), small.width(), tile, align, 4 * align)?;
        let sink_small = OutputSink::f32(0, 0, 0);
        run_exact(net, backend, &small, &sg, threads, budget, &sink_small)?.stats
    };
    run_fixed(net, backend, input, grid, &stats, threads, sink)?;
    Ok(RunInfo {
        stats,
        tiles: grid.len(),
        ..RunInfo::default()
    })
}

/// Exact statistics in bounded memory: a recomputing pass over all tiles per normalising stage.
pub fn run_recompute_stats<B: Backend>(
    net: &Net,
    backend: &B,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
) -> Result<NetStats> {
    let (plan, grids) = prepare(net, input, grid)?;
    let weights = net.load_weights(backend)?;
    let mut stats: NetStats = vec![None; net.stages.len()];
    for (i, s) in net.stages.iter().enumerate() {
        if s.norm.is_none() {
            continue;
        }
        let g = &grids[i];
        let workers = backend.concurrency(threads).min(g.len());
        let pass = Pass {
            net,
            plan: &plan,
            backend,
            weights: &weights,
            input,
            stats: &stats,
            threads: inner_threads(threads, workers),
        };
        let local: Vec<Vec<ChannelStats>> = superstep(g.len(), workers, |t| {
            let (y0, y1, x0, x1) = g.tile(t);
            let raw = pass.eval_region(i, (y0, y1), (x0, x1))?;
            backend.channel_stats(&raw)
        })?;
        stats[i] = Some(merge_all(&local));
    }
    Ok(stats)
}

/// Exact output without storing any activation: [`run_recompute_stats`], then one pass per tile.
pub fn run_recompute<B: Backend>(
    net: &Net,
    backend: &B,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    let stats = run_recompute_stats(net, backend, input, grid, threads)?;
    run_fixed(net, backend, input, grid, &stats, threads, sink)?;
    Ok(RunInfo {
        stats,
        tiles: grid.len(),
        ..RunInfo::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    /// Windows of the downsampled input (inside, at the edges with partial blocks, with padding) hold
    /// each block's mean, as computed from the whole input.
    #[test]
    fn downsampled_windows_are_the_block_means() {
        let (c, h, w) = (2, 37, 53);
        let img = Tensor::from_vec(
            c,
            h,
            w,
            (0..c * h * w)
                .map(|i| ((i * 7919) % 101) as f32 * 0.5)
                .collect(),
        )
        .unwrap();
        for f in [2, 3] {
            let small = Downsampled::new(&img, f);
            let (sh, sw) = (h.div_ceil(f), w.div_ceil(f));
            assert_eq!((small.height(), small.width()), (sh, sw));
            let mean = |ch: usize, oy: usize, ox: usize| {
                let (ya, yb, xa, xb) =
                    (oy * f, ((oy + 1) * f).min(h), ox * f, ((ox + 1) * f).min(w));
                let mut acc = 0.0f64;
                for y in ya..yb {
                    for x in xa..xb {
                        acc += img.at(ch, y, x) as f64;
                    }
                }
                (acc / ((yb - ya) * (xb - xa)) as f64) as f32
            };
            type Map = Vec<Option<usize>>;
            let windows: Vec<(Map, Map)> = vec![
                ((0..sh).map(Some).collect(), (0..sw).map(Some).collect()),
                (
                    [None]
                        .into_iter()
                        .chain((sh - 4..sh).map(Some))
                        .chain([None])
                        .collect(),
                    [None, None].into_iter().chain((3..9).map(Some)).collect(),
                ),
                (vec![None, None], (0..3).map(Some).collect()),
            ];
            for (ys, xs) in windows {
                let got = gather(&small, &ys, &xs).unwrap();
                for ch in 0..c {
                    for (iy, y) in ys.iter().enumerate() {
                        for (ix, xx) in xs.iter().enumerate() {
                            let want = match (y, xx) {
                                (Some(oy), Some(ox)) => mean(ch, *oy, *ox),
                                _ => 0.0,
                            };
                            assert_eq!(got.at(ch, iy, ix), want, "f {f}: ({ch}, {iy}, {ix})");
                        }
                    }
                }
            }
        }
    }
}
