//! The exact engine's schedule: which values are stored, fused into their producer's superstep, read
//! through, or computed inside their reader's, and how much host memory the stored ones take at their
//! peak. Decided once per run from the graph, its plan and the grids; the same bits whatever it decides.

use super::model::{Graph, GraphPlan};
use super::ops::{self, Op};
use crate::field::span;
use crate::grid::Grid;
use crate::store::Layer;

/// An output range: rows, columns.
pub(super) type Range2 = ((usize, usize), (usize, usize));

/// How an exact run computes and stores the graph's values: which element-wise chains run in place,
/// which Pads are read through, which units are computed inside their reader's superstep, which values
/// their one reader takes instead of copying, when each stored value dies, and the host bytes stored at
/// the peak.
pub(super) struct Schedule {
    /// Per node: the element-wise nodes computed in place on its tiles ([`fusion`]).
    pub chains: Vec<Vec<usize>>,
    /// Per node: whether it is part of another node's chain.
    pub fused: Vec<bool>,
    /// Per value: read through a Pad's index maps ([`pad_through`]).
    pub through: Vec<Through>,
    /// Per node: whether its unit is computed where it is read ([`inline_units`]).
    pub inlined: Vec<bool>,
    /// Per value: the unit computing it where it is read, when it is inlined.
    pub inline_of: Vec<Option<usize>>,
    /// Per value: whether its one reader takes its stored tiles ([`moved_values`]).
    pub moves: Vec<bool>,
    /// Per value: the last node whose superstep reads it (`usize::MAX`: the output).
    pub last_use: Vec<usize>,
    /// Host bytes of the stored values alive at once at their peak.
    pub peak_bytes: u64,
}

impl Schedule {
    /// The schedule of `g` on `grids` (one per value): element-wise chains run in place on their
    /// producer's tile; `inline`: small-halo units are computed inside their reader's superstep
    /// ([`super::GraphOps::inlines_units`]).
    pub(super) fn new(g: &Graph, plan: &GraphPlan, grids: &[Grid], inline: bool) -> Schedule {
        let (chains, fused) = fusion(g, plan);
        let through = pad_through(g, plan, &chains, &fused);
        // Per unit head: the reader whose superstep computes it, when it is inlined.
        let inlined_into = if inline {
            inline_units(g, plan, grids, &chains, &fused, &through)
        } else {
            vec![None; g.nodes.len()]
        };
        let inlined: Vec<bool> = inlined_into.iter().map(Option::is_some).collect();
        let stored_value = |i: usize| stored_value(&chains, i);
        let mut inline_of: Vec<Option<usize>> = vec![None; plan.shape.len()];
        for (i, _) in inlined.iter().enumerate().filter(|(_, b)| **b) {
            inline_of[stored_value(i)] = Some(i);
        }
        // The unit whose superstep computes each unit: itself, or its reader's host when inlined.
        let mut host_of: Vec<usize> = (0..g.nodes.len()).collect();
        for i in (0..g.nodes.len()).rev() {
            if let Some(r) = inlined_into[i] {
                host_of[i] = host_of[r];
            }
        }
        let mut moves = moved_values(g, &through);
        // A value read by an inlined unit may be read by several of its regions: copied, never taken. (The
        // nodes of its element-wise chain read only the chain's own value.)
        for (i, n) in g.nodes.iter().enumerate().filter(|(i, _)| inlined[*i]) {
            debug_assert!(chains[i].iter().all(|&k| g.nodes[k].inputs == [k]));
            for &u in &n.inputs {
                moves[u] = false;
            }
        }
        let mut last_use = plan.last_use.clone();
        for (v, t) in through.iter().enumerate() {
            if let Some((u, _)) = t {
                last_use[*u] = last_use[*u].max(plan.last_use[v]);
            }
        }
        // What an inlined unit reads stays alive until its host's superstep.
        for i in (0..g.nodes.len()).filter(|&i| inlined[i]) {
            let h = host_of[i];
            let host_last = stored_value(h) - 1;
            for k in std::iter::once(i).chain(chains[i].iter().copied()) {
                for &u in &g.nodes[k].inputs {
                    last_use[u] = last_use[u].max(host_last);
                    if let Some((src, _)) = &through[u] {
                        last_use[*src] = last_use[*src].max(host_last);
                    }
                }
            }
        }
        let mut schedule = Schedule {
            chains,
            fused,
            through,
            inlined,
            inline_of,
            moves,
            last_use,
            peak_bytes: 0,
        };
        schedule.peak_bytes = peak_bytes(g, plan, grids, &schedule);
        schedule
    }
}

/// Host bytes of the stored values alive at once at their peak: over the supersteps (the heads of
/// units computed in a superstep of their own), the value the superstep stores and every stored value
/// read at or after it, less an input whose tiles it takes. Values never stored — an element-wise
/// chain's intermediates, values read through, inlined units' — take no memory here (working sets are
/// [`super::working`]'s).
fn peak_bytes(g: &Graph, plan: &GraphPlan, grids: &[Grid], s: &Schedule) -> u64 {
    let heads = || {
        (0..g.nodes.len()).filter(|&i| !s.fused[i] && s.through[i + 1].is_none() && !s.inlined[i])
    };
    let mut stored = vec![false; plan.shape.len()];
    for i in heads() {
        stored[stored_value(&s.chains, i)] = true;
    }
    heads()
        .map(|i| {
            let out = stored_value(&s.chains, i);
            let taken = taken_input(g, &s.moves, grids, i);
            (1..=out)
                .filter(|&v| stored[v] && v != g.output)
                .filter(|&v| v == out || (v <= i && s.last_use[v] >= i && Some(v) != taken))
                .map(|v| Layer::bytes(plan.shape[v].0, &grids[v]))
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// Per node: the chain of element-wise nodes that follow it and are computed on its tiles in place
/// (pointwise fusion: their inputs are never stored), and whether the node is itself part of such a chain.
/// A node joins its predecessor's chain when it is the next node, it reads only the chain's last value,
/// nothing else reads that value, and no normalisation needs that value's statistics.
fn fusion(g: &Graph, plan: &GraphPlan) -> (Vec<Vec<usize>>, Vec<bool>) {
    let mut readers = vec![0usize; g.nodes.len() + 1];
    for n in &g.nodes {
        for &u in &n.inputs {
            readers[u] += 1;
        }
    }
    let mut chains = vec![vec![]; g.nodes.len()];
    let mut fused = vec![false; g.nodes.len()];
    for i in 0..g.nodes.len() {
        if fused[i] {
            continue;
        }
        let mut last = i;
        while let Some(next) = g.nodes.get(last + 1) {
            let v = last + 1;
            let ok = ops::fusable(&next.op, next.inputs.len())
                && next.inputs[0] == v
                && readers[v] == 1
                && v != g.output
                && !plan.feeds_norm[v];
            if !ok {
                break;
            }
            last += 1;
            chains[i].push(last);
            fused[last] = true;
        }
    }
    (chains, fused)
}

/// A value read through: where its node's index maps lead, over the whole value (rows, columns).
pub(super) type Through = Option<(usize, [Vec<Option<usize>>; 2])>;

/// Per value: whether it is read through rather than computed (index-map fusion). A node that only
/// copies values by an index map — a Pad that copies or mirrors (reflect, edge, wrap, or zeros) or a
/// nearest Resize — whose output one Conv alone reads, directly or through other such nodes, is not
/// computed and stored: that Conv gathers its window from the first stored value through the composed
/// index maps (a zero pad's `None` is the zero the Conv's own padding reads). The window is the same,
/// without stored copies of the padded or upsampled value (for the TransformerNet's decoder, a
/// full-resolution value of twice its output's channels) and a second gather.
fn pad_through(g: &Graph, plan: &GraphPlan, chains: &[Vec<usize>], fused: &[bool]) -> Vec<Through> {
    let mut readers: Vec<Vec<usize>> = vec![vec![]; plan.shape.len()];
    for (r, n) in g.nodes.iter().enumerate() {
        for &u in &n.inputs {
            readers[u].push(r);
        }
    }
    let mut through: Vec<Through> = vec![None; plan.shape.len()];
    // From the last node back, so that a reader's own read-through is known before its input's.
    for (i, n) in g.nodes.iter().enumerate().rev() {
        let v = i + 1;
        let maps_only = match &n.op {
            Op::Pad(p) => p.mode.is_some() || p.value == 0.0,
            Op::Resize(r) => !r.linear,
            _ => false,
        };
        let one_reader = match readers[v][..] {
            [r] => matches!(g.nodes[r].op, Op::Conv(_)) || through[r + 1].is_some(),
            _ => false,
        };
        if !maps_only
            || !one_reader
            || v == g.output
            || plan.feeds_norm[v]
            || fused[i]
            || !chains[i].is_empty()
        {
            continue;
        }
        let u = n.inputs[0];
        let (_, ih, iw) = plan.shape[u];
        let (_, oh, ow) = plan.shape[v];
        through[v] = Some((
            u,
            [
                n.op.in_map(0, 0, &[ih], oh, 0, oh),
                n.op.in_map(1, 0, &[iw], ow, 0, ow),
            ],
        ));
    }
    // Compose chains of read-throughs, first to last, so that each leads to a stored value.
    for v in 0..through.len() {
        let Some((u, maps)) = through[v].take() else {
            continue;
        };
        through[v] = Some(match &through[u] {
            Some((src, inner)) => {
                let via = |m: &[Option<usize>], k: &[Option<usize>]| -> Vec<Option<usize>> {
                    m.iter().map(|o| o.and_then(|i| k[i])).collect()
                };
                (*src, [via(&maps[0], &inner[0]), via(&maps[1], &inner[1])])
            }
            None => (u, maps),
        });
    }
    through
}

/// Per value: whether its one reader takes its stored tiles instead of copying them. That reader is
/// the value's only one, reads it once, and reads each tile's own pixels alone (an element-wise node,
/// a normalisation, a concatenation), so no other tile's window needs them.
fn moved_values(g: &Graph, through: &[Through]) -> Vec<bool> {
    let mut readers: Vec<Vec<usize>> = vec![vec![]; through.len()];
    for (r, n) in g.nodes.iter().enumerate() {
        for &u in &n.inputs {
            readers[u].push(r);
        }
    }
    (0..through.len())
        .map(|u| {
            u != 0
                && u != g.output
                && through[u].is_none()
                && matches!(readers[u][..], [r] if g.nodes[r].op.is_pointwise()
                    || matches!(g.nodes[r].op, Op::Norm(_)))
        })
        .collect()
}

/// The input of node `i` whose stored tiles become node `i`'s, one by one as its superstep takes them
/// (a normalisation or an element-wise node of one input, on the same grid: the buffer is computed in
/// place), so that the two are one value's memory, counted once: a normalisation in place.
pub(super) fn taken_input(g: &Graph, moves: &[bool], grids: &[Grid], i: usize) -> Option<usize> {
    match g.nodes[i].inputs[..] {
        [u] if moves[u] && grids[u] == grids[i + 1] => Some(u),
        _ => None,
    }
}

/// The value unit `i` stores: its node's, or its element-wise chain's last.
pub(super) fn stored_value(chains: &[Vec<usize>], i: usize) -> usize {
    chains[i].last().map_or(i, |&j| j) + 1
}

/// Computed regions of an inlined unit cost at most this many times its value's area: the halo a
/// reader's windows add (a 3×3 convolution's reader adds a pixel each side of its tiles).
const INLINE_RATIO: f64 = 1.1;

/// Per node: for the head of a superstep unit (a node with its element-wise chain) whose value is not
/// stored but computed inside its one reader's superstep, over that reader's windows (halo included),
/// that reader.
///
/// A stored value costs its memory (faulted in fresh when the pool has none) and a copy into each
/// reader's window; an inlined one costs recomputing the halo that neighbouring windows share. So a
/// unit is inlined when one node reads its value, once, no normalisation needs that value's statistics
/// (they need every tile first), it is not the output, and the regions computed for it — its reader's
/// windows over the reader's tiles, or over the reader's own computed regions when the reader is inlined
/// too — cover at most [`INLINE_RATIO`] times its area. The result is the same bits: every output
/// pixel sees the same operations in any window.
fn inline_units(
    g: &Graph,
    plan: &GraphPlan,
    grids: &[Grid],
    chains: &[Vec<usize>],
    fused: &[bool],
    through: &[Through],
) -> Vec<Option<usize>> {
    let n = g.nodes.len();
    let mut readers: Vec<Vec<usize>> = vec![vec![]; n + 1];
    for (r, node) in g.nodes.iter().enumerate() {
        for &u in &node.inputs {
            readers[u].push(r);
        }
    }
    let unit = |i: usize| !fused[i] && through[i + 1].is_none();
    let stored = |i: usize| stored_value(chains, i);
    // Per inlined unit: the regions it is computed over, in its output's coordinates.
    let mut regions: Vec<Option<Vec<Range2>>> = vec![None; n];
    let mut reader = vec![None; n];
    for i in (0..n).rev() {
        if !unit(i) {
            continue;
        }
        let v = stored(i);
        let [r] = readers[v][..] else { continue };
        if v == g.output || plan.feeds_norm[v] || !unit(r) {
            continue;
        }
        // The reader must not read the value through a Pad (a Pad read through is itself a reader).
        if g.nodes[r].inputs.iter().filter(|&&u| u == v).count() != 1 {
            continue;
        }
        let j = g.nodes[r]
            .inputs
            .iter()
            .position(|&u| u == v)
            .expect("r reads v");
        let at: Vec<Range2> = match &regions[r] {
            Some(rs) => rs.clone(),
            None => {
                let gr = &grids[stored(r)];
                (0..gr.len())
                    .map(|t| {
                        let (y0, y1, x0, x1) = gr.tile(t);
                        ((y0, y1), (x0, x1))
                    })
                    .collect()
            }
        };
        let node = &g.nodes[r];
        let nh: Vec<usize> = node.inputs.iter().map(|&u| plan.shape[u].1).collect();
        let nw: Vec<usize> = node.inputs.iter().map(|&u| plan.shape[u].2).collect();
        let (_, oh, ow) = plan.shape[r + 1];
        let mine: Vec<Range2> = at
            .iter()
            .filter_map(|&(ry, rx)| {
                let ys = node.op.in_map(0, j, &nh, oh, ry.0, ry.1);
                let xs = node.op.in_map(1, j, &nw, ow, rx.0, rx.1);
                Some((span(&ys)?, span(&xs)?))
            })
            .collect();
        let area: usize = mine
            .iter()
            .map(|((y0, y1), (x0, x1))| (y1 - y0) * (x1 - x0))
            .sum();
        let (_, h, w) = plan.shape[v];
        if area as f64 <= INLINE_RATIO * (h * w) as f64 {
            regions[i] = Some(mine);
            reader[i] = Some(r);
        }
    }
    reader
}
