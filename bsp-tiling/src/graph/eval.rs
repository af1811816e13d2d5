//! One node over one output range: its input windows gathered by global coordinates (from the stored
//! values, through a Pad's index maps, taken from their one reader, or computed where they are read),
//! then computed on the backend. What the exact superstep and the one-pass evaluation both run.

use super::exec::GraphOps;
use super::model::{GraphPlan, Node};
use super::ops::Ctx;
use super::schedule::Through;
use crate::error::Result;
use crate::field::{Field, gather};
use crate::stats::ChannelStats;
use crate::tensor::Tensor;

/// A backend, what it prepared for this run, and the ranks sharing the run's tiles (none: this process
/// computes them all).
pub struct Run<'a, B: GraphOps> {
    pub backend: &'a B,
    pub prep: &'a B::Prepared,
    pub ranks: Option<&'a crate::ranks::Ranks>,
}

pub(super) fn tensor_stats(t: &Tensor) -> Vec<ChannelStats> {
    (0..t.c).map(|c| ChannelStats::of(t.plane(c))).collect()
}

/// The window of an input value that is not stored but computed where it is read (see `schedule::inline_units`):
/// `Some` for such a value, given its rows and columns.
pub(super) type Inlined<'a> =
    dyn Fn(usize, &[Option<usize>], &[Option<usize>]) -> Option<Result<Tensor>> + 'a;

/// Gathers node `n`'s input windows for output rows `ry` × columns `rx` from `field(u)` (or computes them,
/// for the values `inlined` gives) and computes.
#[allow(clippy::too_many_arguments)]
pub(super) fn eval_node<'f, B: GraphOps>(
    be: &Run<'_, B>,
    i: usize,
    n: &Node,
    plan: &GraphPlan,
    v: usize,
    ry: (usize, usize),
    rx: (usize, usize),
    field: &dyn Fn(usize) -> &'f dyn Field,
    through: &[Through],
    moves: &[bool],
    norm: Option<&(Vec<f32>, Vec<f32>)>,
    threads: usize,
    inlined: &Inlined,
) -> Result<Tensor> {
    let n_in: Vec<[usize; 2]> = n
        .inputs
        .iter()
        .map(|&u| [plan.shape[u].1, plan.shape[u].2])
        .collect();
    let nh: Vec<usize> = n_in.iter().map(|d| d[0]).collect();
    let nw: Vec<usize> = n_in.iter().map(|d| d[1]).collect();
    let (_, oh, ow) = plan.shape[v];
    let mut maps = vec![];
    let mut wins = vec![];
    for (j, &u) in n.inputs.iter().enumerate() {
        let ys = n.op.in_map(0, j, &nh, oh, ry.0, ry.1);
        let xs = n.op.in_map(1, j, &nw, ow, rx.0, rx.1);
        if let Some(win) = inlined(u, &ys, &xs) {
            wins.push(be.backend.load(win?)?);
            maps.push([ys, xs]);
            continue;
        }
        let win = match through.get(u).and_then(Option::as_ref) {
            Some((src, [my, mx])) => {
                let via = |idx: &[Option<usize>], m: &[Option<usize>]| -> Vec<Option<usize>> {
                    idx.iter().map(|o| o.and_then(|i| m[i])).collect()
                };
                gather(field(*src), &via(&ys, my), &via(&xs, mx))?
            }
            None => match moves
                .get(u)
                .copied()
                .unwrap_or(false)
                .then(|| field(u).take(&ys, &xs))
            {
                Some(Some(data)) => Tensor {
                    c: field(u).channels(),
                    h: ys.len(),
                    w: xs.len(),
                    data,
                },
                _ => gather(field(u), &ys, &xs)?,
            },
        };
        wins.push(be.backend.load(win)?);
        maps.push([ys, xs]);
    }
    let ctx = Ctx {
        range: [ry, rx],
        n_in: &n_in,
        maps: &maps,
        norm,
        threads,
    };
    let out = be.backend.compute(be.prep, i, n, wins, &ctx)?;
    be.backend.store(out)
}
