//! One node over one output range: its input windows gathered by global coordinates (from the stored
//! values, through a Pad's index maps, taken from their one reader, or computed where they are read),
//! then computed on the backend, where the output stays. What the exact superstep and the one-pass
//! evaluation both run.

use super::exec::GraphOps;
use super::kept::Kept;
use super::model::{GraphPlan, Node};
use super::ops::Ctx;
use super::schedule::Through;
use crate::error::Result;
use crate::field::{Field, Part, gather};
use crate::tensor::Tensor;

/// A backend, what it prepared for this run, and the ranks sharing the run's tiles (none: this process
/// computes them all).
pub struct Run<'a, B: GraphOps> {
    pub backend: &'a B,
    pub prep: &'a B::Prepared,
    pub ranks: Option<&'a crate::ranks::Ranks>,
}

pub(super) use super::exec::tensor_stats;

/// Where a value is read from: a host field (the input, the tiled store), its tiles kept where the
/// backend computes, or a region of it computed there.
pub(super) enum Source<'f, B: GraphOps> {
    Host(&'f dyn Field),
    Kept(&'f Kept<B>),
    /// A region of a `c`-channel value on the backend (one-pass evaluation).
    Region(usize, Part<'f, B::Buf>),
}

/// The window of an input value that is not stored but computed where it is read (see `schedule::inline_units`):
/// `Some` for such a value, given its rows and columns.
pub(super) type Inlined<'a, Buf> =
    dyn Fn(usize, &[Option<usize>], &[Option<usize>]) -> Option<Result<Buf>> + 'a;

/// Gathers node `n`'s input windows for output rows `ry` × columns `rx` from `source(u)` (or computes
/// them, for the values `inlined` gives) and computes; the output stays on the backend.
#[allow(clippy::too_many_arguments)]
pub(super) fn eval_node<'f, B: GraphOps>(
    be: &Run<'_, B>,
    i: usize,
    n: &Node,
    plan: &GraphPlan,
    v: usize,
    ry: (usize, usize),
    rx: (usize, usize),
    source: &dyn Fn(usize) -> Source<'f, B>,
    through: &[Through],
    moves: &[bool],
    norm: Option<&(Vec<f32>, Vec<f32>)>,
    threads: usize,
    inlined: &Inlined<B::Buf>,
) -> Result<B::Buf> {
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
            wins.push(win?);
            maps.push([ys, xs]);
            continue;
        }
        let win = match through.get(u).and_then(Option::as_ref) {
            Some((src, [my, mx])) => {
                let via = |idx: &[Option<usize>], m: &[Option<usize>]| -> Vec<Option<usize>> {
                    idx.iter().map(|o| o.and_then(|i| m[i])).collect()
                };
                read(
                    be.backend,
                    source(*src),
                    &via(&ys, my),
                    &via(&xs, mx),
                    false,
                )?
            }
            None => read(
                be.backend,
                source(u),
                &ys,
                &xs,
                moves.get(u).copied().unwrap_or(false),
            )?,
        };
        wins.push(win);
        maps.push([ys, xs]);
    }
    let ctx = Ctx {
        range: [ry, rx],
        n_in: &n_in,
        maps: &maps,
        norm,
        threads,
    };
    be.backend.compute(be.prep, i, n, wins, &ctx)
}

/// The window at `ys` × `xs` of a value on the backend: a host field's gathered (or, for its one
/// reader, `take`n: `moves`) and loaded; a kept value's gathered where it is.
fn read<B: GraphOps>(
    backend: &B,
    source: Source<'_, B>,
    ys: &[Option<usize>],
    xs: &[Option<usize>],
    moves: bool,
) -> Result<B::Buf> {
    match source {
        Source::Kept(k) => k.gather(backend, ys, xs),
        Source::Region(c, part) => backend.gather(c, &[part], ys, xs),
        Source::Host(f) => {
            let win = match moves.then(|| f.take(ys, xs)).flatten() {
                Some(data) => Tensor {
                    c: f.channels(),
                    h: ys.len(),
                    w: xs.len(),
                    data,
                },
                None => gather(f, ys, xs)?,
            };
            backend.load(win)
        }
    }
}
