//! One pass per output tile with fixed statistics (the sampled and recompute modes): each output tile is
//! evaluated through its receptive field, every value it depends on computed over the region its
//! readers' windows need; nothing is stored between tiles.

use super::eval::{Run, Source, eval_node};
use super::exec::GraphOps;
use super::model::{Graph, GraphPlan, GraphStats, node_err};
use super::ops::Op;
use super::schedule::Range2;
use super::superstep::{inner_threads, into_sink};
use crate::error::{Error, Result};
use crate::field::{Field, Input, Part, Sink, span};
use crate::grid::Grid;

/// One-pass evaluation of value `target` over rows `ry` × columns `rx`, on the backend: every value it
/// depends on is computed over the region its consumers' windows need (the receptive field), with the
/// statistics in `stats` for the normalisations.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub(super) fn eval_region<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    plan: &GraphPlan,
    input: &dyn Input,
    target: usize,
    ry: (usize, usize),
    rx: (usize, usize),
    stats: &[Option<(Vec<f32>, Vec<f32>)>],
    threads: usize,
) -> Result<B::Buf> {
    let need = needs(g, plan, target, (ry, rx), &|_| false);
    // Per value: its region's buffer and where the region starts.
    let mut regions: Vec<Option<(B::Buf, Range2)>> = (0..=target).map(|_| None).collect();
    let mut last = vec![0usize; target + 1];
    for (i, n) in g.nodes.iter().enumerate().take(target) {
        if need[i + 1].is_some() {
            for &u in &n.inputs {
                last[u] = last[u].max(i);
            }
        }
    }
    for i in 0..target {
        let v = i + 1;
        let Some((ry, rx)) = need[v] else { continue };
        let n = &g.nodes[i];
        let out = {
            let source = |u: usize| -> Source<'_, B> {
                match &regions[u] {
                    Some((buf, ((y0, y1), (x0, x1)))) if u > 0 => Source::Region(
                        plan.shape[u].0,
                        Part {
                            y0: *y0,
                            x0: *x0,
                            h: y1 - y0,
                            w: x1 - x0,
                            buf,
                        },
                    ),
                    // The input (a value is computed before its readers, so no other is missing).
                    _ => Source::Host(input as &dyn Field),
                }
            };
            let norm = match &n.op {
                Op::Norm(_) => Some(stats[i].as_ref().ok_or_else(|| {
                    node_err(n, "one-pass evaluation: its statistics are missing")
                })?),
                _ => None,
            };
            eval_node(
                be,
                i,
                n,
                plan,
                v,
                ry,
                rx,
                &source,
                &[],
                &[],
                norm,
                threads,
                &|_, _, _| None,
            )?
        };
        regions[v] = Some((out, (ry, rx)));
        for u in 1..v {
            if last[u] <= i && u != target {
                regions[u] = None;
            }
        }
    }
    regions[target]
        .take()
        .map(|(buf, _)| buf)
        .ok_or_else(|| Error::Grid("internal: the target was not computed".into()))
}

/// Per value up to `target`: the region (rows, columns) that computing `target` over `r` needs of it. A
/// value `leaf` names (one that is read, not computed) is needed but what it needs is not.
pub(super) fn needs(
    g: &Graph,
    plan: &GraphPlan,
    target: usize,
    r: Range2,
    leaf: &dyn Fn(usize) -> bool,
) -> Vec<Option<Range2>> {
    let (ry, rx) = r;
    let mut need: Vec<Option<Range2>> = vec![None; target + 1];
    need[target] = Some((ry, rx));
    for i in (0..target).rev() {
        let v = i + 1;
        if v != target && leaf(v) {
            continue;
        }
        let Some(((y0, y1), (x0, x1))) = need[v] else {
            continue;
        };
        let n = &g.nodes[i];
        let nh: Vec<usize> = n.inputs.iter().map(|&u| plan.shape[u].1).collect();
        let nw: Vec<usize> = n.inputs.iter().map(|&u| plan.shape[u].2).collect();
        let (_, oh, ow) = plan.shape[v];
        for (j, &u) in n.inputs.iter().enumerate() {
            let ys = n.op.in_map(0, j, &nh, oh, y0, y1);
            let xs = n.op.in_map(1, j, &nw, ow, x0, x1);
            let (Some(a), Some(b)) = (span(&ys), span(&xs)) else {
                continue;
            };
            need[u] = Some(match need[u] {
                None => (a, b),
                Some(((p0, p1), (q0, q1))) => {
                    ((p0.min(a.0), p1.max(a.1)), (q0.min(b.0), q1.max(b.1)))
                }
            });
        }
    }
    need
}

/// Per-node `(scale, shift)` of every normalisation for the given statistics.
pub(super) fn scale_shifts(g: &Graph, stats: &GraphStats) -> Vec<Option<(Vec<f32>, Vec<f32>)>> {
    g.nodes
        .iter()
        .enumerate()
        .map(
            |(i, n)| match (&n.op, stats.get(i).and_then(|s| s.as_ref())) {
                (Op::Norm(m), Some(st)) => Some(m.scale_shift(st)),
                _ => None,
            },
        )
        .collect()
}

/// One pass per output tile with fixed statistics (sampled and recompute modes).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_fixed<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    plan: &GraphPlan,
    input: &dyn Input,
    grid: &Grid,
    stats: &GraphStats,
    threads: usize,
    sink: &dyn Sink,
) -> Result<()> {
    let go = g.value_grid(plan, grid, g.output)?;
    let workers = be.backend.tiles_at_once(threads).clamp(1, go.len());
    let inner = inner_threads(threads, workers);
    let ss = scale_shifts(g, stats);
    let compute = |t: usize| {
        let (y0, y1, x0, x1) = go.tile(t);
        let out = eval_region(be, g, plan, input, g.output, (y0, y1), (x0, x1), &ss, inner)?;
        Ok((y0, x0, be.backend.store(out)?, ()))
    };
    into_sink(be.ranks, "output tiles", go.len(), workers, compute, sink)?;
    Ok(())
}
