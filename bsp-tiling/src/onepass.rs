//! One pass per tile with fixed statistics: the receptive-field halo instead of a superstep per layer.
//!
//! Once every normalisation's statistics are known, a tile no longer needs its neighbours' activations:
//! it reads a window of the *input* as wide as the receptive field and runs all stages on shrinking
//! regions, in memory proportional to the tile. Two ways to get the statistics:
//!
//! * [`run_sampled`] — the paper's "normalisation via sampling" (section 3.3.2): statistics of a
//!   downsampled copy, processed whole. Approximate.
//! * [`run_recompute`] — exact in bounded memory: one pass over all tiles per normalising stage, each
//!   recomputing the earlier stages with the statistics already merged, to collect that stage's
//!   statistics. Costs about `stages/2` times the compute of one pass, stores nothing but the output.

use crate::backend::Backend;
use crate::bsp::{RunInfo, inner_threads, prepare, run_exact, superstep};
use crate::error::{Error, Result};
use crate::field::{Field, Input, OutputSink, Sink, gather};
use crate::grid::Grid;
use crate::model::{Net, NetStats, Plan};
use crate::stats::{ChannelStats, merge_all};
use crate::store::Budget;
use crate::tensor::Tensor;

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

/// Box-filter downsampling by an integer factor (a partial last block averages what it has), as the
/// "sample image" of section 3.3.2.
pub fn downsample(input: &dyn Input, factor: usize) -> Result<Tensor> {
    let (h, w) = (input.height(), input.width());
    let (sh, sw) = (h.div_ceil(factor), w.div_ceil(factor));
    let c = input.channels();
    let mut out = Tensor::zeros(c, sh, sw);
    let xs: Vec<Option<usize>> = (0..w).map(Some).collect();
    for oy in 0..sh {
        let ys: Vec<Option<usize>> = (oy * factor..((oy + 1) * factor).min(h))
            .map(Some)
            .collect();
        let band = gather(input, &ys, &xs)?;
        for ch in 0..c {
            for ox in 0..sw {
                let (xa, xb) = (ox * factor, ((ox + 1) * factor).min(w));
                let mut acc = 0.0f64;
                for y in 0..ys.len() {
                    for x in xa..xb {
                        acc += band.at(ch, y, x) as f64;
                    }
                }
                out.data[(ch * sh + oy) * sw + ox] = (acc / (ys.len() * (xb - xa)) as f64) as f32;
            }
        }
    }
    Ok(out)
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
        let small = downsample(input, factor)?;
        let align = net.total_stride();
        let tile = (1024 / align).max(1) * align;
        let sg = Grid::with_tile(small.h, small.w, tile, align, 4 * align)?;
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
