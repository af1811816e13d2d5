//! The host memory one tile's superstep holds while it computes (its *working set*): the input windows it
//! gathered, the output range it computes, the scratch its op takes, and, for a value computed where it
//! is read, that value's own working set and window. Stored values are budgeted by the schedule
//! ([`super::schedule::Schedule::peak_bytes`]) and may spill to disk; a working set cannot, so it is
//! sized here before any tile is computed: the tile is shrunk until the working sets of the tiles worked
//! on at once fit the RAM budget, or the run is refused with the figure.

use super::model::{Graph, GraphPlan};
use super::ops::Op;
use super::schedule::{Range2, Schedule, Through, stored_value};
use crate::error::{Error, Result};
use crate::field::span;
use crate::grid::Grid;

const F32: u64 = 4;

fn bytes(c: usize, h: usize, w: usize) -> u64 {
    (c as u64)
        .saturating_mul(h as u64)
        .saturating_mul(w as u64)
        .saturating_mul(F32)
}

/// Host scratch of one node's computation on the CPU besides its windows and output: a convolution's
/// packed weights and a strided window's phase copy (as large as the window).
fn scratch(op: &Op, window: u64) -> u64 {
    match op {
        Op::Conv(c) | Op::ConvTranspose(c) => {
            let packed = ((c.weight.len() + c.bias.len()) as u64).saturating_mul(F32);
            let cols = match op {
                // `Wᵀ·x` columns of a band of input rows: at most the whole window times the kernel.
                Op::ConvTranspose(_) => {
                    window.saturating_mul((c.cout * c.win[0].k * c.win[1].k) as u64)
                        / (c.cin.max(1) as u64)
                }
                _ => window,
            };
            packed.saturating_add(cols)
        }
        _ => 0,
    }
}

/// The graph, its plan and schedule: what a working set is computed from.
pub(super) struct Sizer<'a> {
    pub g: &'a Graph,
    pub plan: &'a GraphPlan,
    pub through: &'a [Through],
    pub inline_of: &'a [Option<usize>],
}

impl Sizer<'_> {
    /// Bytes held at the peak while node `i` computes output range `r` (rows, columns), windows of values
    /// computed where they are read (`inline_of`) included.
    fn node(&self, i: usize, r: Range2) -> u64 {
        let n = &self.g.nodes[i];
        let plan = self.plan;
        let nh: Vec<usize> = n.inputs.iter().map(|&u| plan.shape[u].1).collect();
        let nw: Vec<usize> = n.inputs.iter().map(|&u| plan.shape[u].2).collect();
        let (c, oh, ow) = plan.shape[i + 1];
        let (mut held, mut peak, mut first) = (0u64, 0u64, 0u64);
        for (j, &u) in n.inputs.iter().enumerate() {
            let ys = n.op.in_map(0, j, &nh, oh, r.0.0, r.0.1);
            let xs = n.op.in_map(1, j, &nw, ow, r.1.0, r.1.1);
            // A value read through a Pad is gathered from the Pad's input: its channels are the same.
            let win = bytes(plan.shape[u].0, ys.len(), xs.len());
            if j == 0 {
                first = win;
            }
            let inner = match (
                self.inline_of.get(u).copied().flatten(),
                span(&ys),
                span(&xs),
            ) {
                (Some(p), Some(ry), Some(rx)) => self.node(p, (ry, rx)),
                _ => 0,
            };
            peak = peak.max(held.saturating_add(inner).saturating_add(win));
            held = held.saturating_add(win);
        }
        let out = bytes(c, r.0.1 - r.0.0, r.1.1 - r.1.0);
        peak.max(
            held.saturating_add(out)
                .saturating_add(scratch(&n.op, first)),
        )
    }

    /// The largest working set of a superstep of `s` over `grids` (one per value): every stored unit over
    /// the tiles of its value's grid. Tiles differ in size only at the first and last rows and columns,
    /// so those and one inner row and column are measured.
    pub fn exact(&self, s: &Schedule, grids: &[Grid]) -> u64 {
        let g = self.g;
        (0..g.nodes.len())
            .filter(|&i| !s.fused[i] && self.through[i + 1].is_none() && !s.inlined[i])
            .map(|i| self.unit(i, &grids[stored_value(&s.chains, i)]))
            .max()
            .unwrap_or(0)
    }

    /// The largest working set of one tile of unit `i`'s superstep over `gv`, the grid of the value it
    /// stores.
    pub fn unit(&self, i: usize, gv: &Grid) -> u64 {
        corners(gv).map(|r| self.node(i, r)).max().unwrap_or(0)
    }

    /// The working set of a one-pass evaluation (sampled, recompute) of value `target` over `r`: every
    /// value it depends on over the region its readers need, each held from its computation to its last
    /// reader's (as `fixed::eval_region` holds them).
    pub fn one_pass(&self, target: usize, r: Range2) -> u64 {
        let g = self.g;
        let need = super::fixed::needs(g, self.plan, target, r, &|_| false);
        let mut last = vec![0usize; target + 1];
        for (i, n) in g.nodes.iter().enumerate().take(target) {
            if need[i + 1].is_some() {
                for &u in &n.inputs {
                    last[u] = last[u].max(i);
                }
            }
        }
        let size = |v: usize| {
            need[v].map_or(0, |((y0, y1), (x0, x1))| {
                bytes(self.plan.shape[v].0, y1 - y0, x1 - x0)
            })
        };
        let (mut held, mut peak) = (0u64, 0u64);
        for i in 0..target {
            let v = i + 1;
            let Some(r) = need[v] else { continue };
            peak = peak.max(held.saturating_add(self.node(i, r)));
            held = held.saturating_add(size(v));
            let freed = (1..v).filter(|&u| last[u] == i && u != target);
            held = freed.fold(held, |h, u| h.saturating_sub(size(u)));
        }
        peak.max(held)
    }
}

/// The output ranges of the tiles of `grid` at its first, second, second-to-last and last rows and
/// columns: every tile size and border position the grid has.
pub(super) fn corners(grid: &Grid) -> impl Iterator<Item = Range2> + '_ {
    let pick = |n: usize| {
        let mut v: Vec<usize> = [0, 1, n.saturating_sub(2), n.saturating_sub(1)]
            .into_iter()
            .filter(|&k| k < n)
            .collect();
        v.dedup();
        v
    };
    let (rows, cols) = (pick(grid.rows.len() - 1), pick(grid.cols.len() - 1));
    rows.into_iter().flat_map(move |i| {
        cols.clone().into_iter().map(move |j| {
            (
                (grid.rows[i], grid.rows[i + 1]),
                (grid.cols[j], grid.cols[j + 1]),
            )
        })
    })
}

/// What the working sets of a run are checked against: bytes, and what sets them.
#[derive(Clone, Debug)]
pub(super) struct Allowance {
    pub bytes: u64,
    pub from: String,
}

impl Allowance {
    /// The RAM budget, or the memory limit where that is smaller.
    pub fn of(ram: u64) -> Allowance {
        let (limit, source) = stdx::mem::limit();
        if limit <= ram {
            Allowance {
                bytes: limit,
                from: format!("the memory limit ({source})"),
            }
        } else {
            Allowance {
                bytes: ram,
                from: "the RAM budget".into(),
            }
        }
    }

    /// `Ok` when the working sets of `workers` tiles of side `tile`, `needed` bytes together, fit; else
    /// the refusal naming both figures.
    pub fn admit(&self, needed: u64, workers: usize, tile: usize) -> Result<()> {
        if needed <= self.bytes {
            return Ok(());
        }
        Err(Error::TileOverBudget {
            needed,
            budget: self.bytes,
            budget_from: self.from.clone(),
            tile,
            workers,
        })
    }
}

/// The tile side a run uses: `tile`, or, when `fits(tile)` refuses it, the largest of `tile` halved
/// (in multiples of `align`) that fits, with a note saying so; the refusal of the smallest when none does.
pub(super) fn fit_tile(
    tile: usize,
    align: usize,
    mut fits: impl FnMut(usize) -> Result<()>,
) -> Result<(usize, Option<String>)> {
    let align = align.max(1);
    let mut t = tile;
    // The requested tile's refusal (for the note), and the last tile's (the error when none fits).
    let mut first: Option<String> = None;
    let mut last: Option<Error> = None;
    loop {
        match fits(t) {
            Ok(()) => {
                let note = first.map(|why| {
                    format!(
                        "tiles of {tile} input pixels {why}: tiles of {t} were used instead (the same output)"
                    )
                });
                return Ok((t, note));
            }
            Err(e @ Error::TileOverBudget { .. }) => {
                if let Error::TileOverBudget {
                    needed,
                    budget,
                    budget_from,
                    ..
                } = &e
                {
                    first.get_or_insert_with(|| {
                        format!(
                            "would hold {} at once, more than {budget_from} ({})",
                            stdx::mem::human(*needed),
                            stdx::mem::human(*budget)
                        )
                    });
                }
                let next = t / 2 / align * align;
                if next == 0 || next >= t {
                    return Err(e);
                }
                last = Some(e);
                t = next;
            }
            // A smaller tile that the grid refuses (an empty tile at a coarse resolution): the budget's
            // refusal of the last tile that the grid allowed.
            Err(e) => return Err(last.unwrap_or(e)),
        }
    }
}
