//! The exact engine: a BSP superstep per stored unit on the tiles of its value, each tile's window
//! gathered from its neighbours' stored tiles (dictionary padding), whole-image statistics merged before
//! every normalisation; values in RAM or spilled, recycled after their last reader.

use super::eval::{Run, eval_node, tensor_stats};
use super::exec::GraphOps;
use super::halos::Halos;
use super::model::{Graph, GraphPlan, node_err, prepare};
use super::ops::{self, Op};
use super::schedule::{Schedule, Through, stored_value, taken_input};
use super::superstep::{inner_threads, rounds, superstep_share};
use super::working;
use crate::error::{Error, Result};
use crate::field::{Field, Input, Region, Sink, gather, span};
use crate::grid::Grid;
use crate::ranks::{Ranks, Reader, Wire, merge_in_tile_order, merge_stats, put_stats, read_stats};
use crate::run_info::RunInfo;
use crate::stats::ChannelStats;
use crate::store::{Budget, Layer};
use crate::tensor::Tensor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A value's storage during a run: the image, a tiled layer (RAM or spill), or a region of one
/// (one-pass evaluation).
enum Val<'a> {
    Input(&'a dyn Input),
    Layer(Layer),
}

impl Val<'_> {
    fn field(&self) -> &dyn Field {
        match self {
            Val::Input(i) => *i as &dyn Field,
            Val::Layer(l) => l,
        }
    }
}

type FieldRef<'f> = &'f dyn Field;

/// What a superstep of [`exact_on`] evaluates units with: the stored values, and the units computed
/// where they are read.
struct Exact<'a, 'f, B: GraphOps> {
    be: &'a Run<'a, B>,
    g: &'a Graph,
    plan: &'a GraphPlan,
    field: &'a (dyn Fn(usize) -> FieldRef<'f> + Sync),
    through: &'a [Through],
    moves: &'a [bool],
    chains: &'a [Vec<usize>],
    /// Per value: the unit computing it where it is read, when it is inlined.
    inline_of: &'a [Option<usize>],
    norms: &'a [Option<(Vec<f32>, Vec<f32>)>],
    threads: usize,
}

impl<B: GraphOps> Exact<'_, '_, B> {
    /// Unit `i` (node `i` and its element-wise chain) over output rows `ry` × columns `rx`.
    fn unit(&self, i: usize, ry: (usize, usize), rx: (usize, usize)) -> Result<Tensor> {
        let g = self.g;
        let hook = |u: usize, ys: &[Option<usize>], xs: &[Option<usize>]| {
            let p = self.inline_of.get(u).copied().flatten()?;
            Some(self.window(p, u, ys, xs))
        };
        let mut out = eval_node(
            self.be,
            i,
            &g.nodes[i],
            self.plan,
            i + 1,
            ry,
            rx,
            self.field,
            self.through,
            self.moves,
            self.norms[i].as_ref(),
            self.threads,
            &hook,
        )?;
        for &j in &self.chains[i] {
            out = ops::apply_pointwise(&g.nodes[j].op, out)?;
        }
        Ok(out)
    }

    /// The superstep of unit `i`, storing value `v` on the tiles of `gv`: into `layer`, or (the output)
    /// into `sink`; on ranks, this rank's share, then what the others read of it sent to them (`halos`)
    /// or the output's tiles to rank 0. Every tile's statistics of `v` where a normalisation reads it,
    /// merged in tile order (else none).
    #[allow(clippy::too_many_arguments)]
    fn superstep(
        &self,
        i: usize,
        v: usize,
        gv: &Grid,
        layer: Option<&Layer>,
        sink: &dyn Sink,
        workers: usize,
        halos: Option<&Halos>,
    ) -> Result<Vec<ChannelStats>> {
        let compute = |t: usize| -> Result<(usize, usize, Tensor, Option<Vec<ChannelStats>>)> {
            let (y0, y1, x0, x1) = gv.tile(t);
            let out = self.unit(i, (y0, y1), (x0, x1))?;
            let st = self.plan.feeds_norm[v].then(|| tensor_stats(&out));
            Ok((y0, x0, out, st))
        };
        let step = format!("node {i} ({})", self.g.nodes[i].name);
        // Every tile's statistics of `v`, where a normalisation reads it, merged in tile order.
        let keep = |tiles: Vec<(usize, Option<Vec<ChannelStats>>)>| {
            tiles
                .into_iter()
                .filter_map(|(t, s)| s.map(|s| (t, s)))
                .collect::<Vec<_>>()
        };
        Ok(match (layer, self.be.ranks, halos) {
            (Some(l), Some(ranks), Some(halos)) => {
                let local = superstep_share(Some(ranks), gv.len(), workers, |t| {
                    let (_, _, out, st) = compute(t)?;
                    l.put(t, out.data).map_err(|e| l.spill_error(e))?;
                    Ok(st)
                });
                merge_in_tile_order(share_value(ranks, &step, local, l, v, halos)?)
            }
            (Some(l), ..) => {
                merge_in_tile_order(keep(superstep_share(None, gv.len(), workers, |t| {
                    let (_, _, out, st) = compute(t)?;
                    l.put(t, out.data).map_err(|e| l.spill_error(e))?;
                    Ok(st)
                })?))
            }
            (None, Some(ranks), _) => {
                let own = rounds(ranks, &step, gv.len(), workers, compute, sink)?;
                if self.plan.feeds_norm[v] {
                    let step = format!("{step} statistics");
                    merge_stats(ranks, &step, Ok(keep(own)))?
                } else {
                    vec![]
                }
            }
            (None, None, _) => {
                merge_in_tile_order(keep(superstep_share(None, gv.len(), workers, |t| {
                    let (y0, x0, out, st) = compute(t)?;
                    sink.put_tile(y0, x0, &out)?;
                    crate::buffers::give(out.data);
                    Ok(st)
                })?))
            }
        })
    }

    /// The window at `ys` × `xs` of value `u`, computed by unit `p` over the rows and columns it spans.
    fn window(
        &self,
        p: usize,
        u: usize,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<Tensor> {
        let c = self.plan.shape[u].0;
        let (Some(ry), Some(rx)) = (span(ys), span(xs)) else {
            return Tensor::zeros(c, ys.len(), xs.len());
        };
        let t = self.unit(p, ry, rx)?;
        let plain = |m: &[Option<usize>], (lo, hi): (usize, usize)| {
            m.len() == hi - lo && m.iter().enumerate().all(|(k, &o)| o == Some(lo + k))
        };
        if plain(ys, ry) && plain(xs, rx) {
            return Ok(t);
        }
        let win = gather(
            &Region {
                t: &t,
                y0: ry.0,
                x0: rx.0,
            },
            ys,
            xs,
        );
        crate::buffers::give(t.data);
        win
    }
}

/// The budget the stored values of an exact run get: what `budget` leaves once the tiles in flight took
/// their working sets (`working` bytes, `workers` tiles of side `tile`); they spill past it. Refused
/// when the working sets do not fit, or the stored values (`stored` bytes at their peak) fit neither
/// that rest nor the spill space.
fn reserve(
    budget: &Budget,
    stored: u64,
    working: u64,
    workers: usize,
    tile: usize,
) -> Result<Budget> {
    let disk = budget.disk_limit()?;
    let over = |needed| Error::OverBudget {
        needed,
        ram: budget.ram,
        disk,
        dir: budget.spill_dir.clone(),
    };
    if stored > budget.ram.saturating_add(disk) {
        return Err(over(stored));
    }
    working::Allowance::of(budget.ram).admit(working, workers, tile)?;
    let rest = budget.ram.saturating_sub(working);
    if stored > rest.saturating_add(disk) {
        return Err(over(stored.saturating_add(working)));
    }
    Ok(Budget {
        ram: rest,
        ..budget.clone()
    })
}

/// Tiles an exact run works on at once.
pub(super) fn exact_workers<B: GraphOps>(backend: &B, threads: usize, n_tiles: usize) -> usize {
    backend
        .tiles_at_once(threads)
        .clamp(1, threads.max(1))
        .clamp(1, n_tiles.max(1))
}

/// The largest working set of one tile's superstep of `schedule`.
pub(super) fn tile_bytes(g: &Graph, plan: &GraphPlan, schedule: &Schedule, grids: &[Grid]) -> u64 {
    working::Sizer {
        g,
        plan,
        through: &schedule.through,
        inline_of: &schedule.inline_of,
    }
    .exact(schedule, grids)
}

/// The side of `grid`'s first tile (what a refusal names).
pub(super) fn grid_tile(grid: &Grid) -> usize {
    let (y0, y1, x0, x1) = grid.tile(0);
    (y1 - y0).max(x1 - x0)
}

/// The input's per-channel statistics, merged from its tiles on `grid` (this rank's, with the others').
fn input_stats(
    ranks: Option<&Ranks>,
    input: &dyn Input,
    grid: &Grid,
    workers: usize,
) -> Result<Vec<ChannelStats>> {
    let local = superstep_share(ranks, grid.len(), workers, |t| {
        let (y0, y1, x0, x1) = grid.tile(t);
        let ys: Vec<Option<usize>> = (y0..y1).map(Some).collect();
        let xs: Vec<Option<usize>> = (x0..x1).map(Some).collect();
        Ok(tensor_stats(&crate::field::gather(input, &ys, &xs)?))
    });
    match ranks {
        None => Ok(merge_in_tile_order(local?)),
        Some(ranks) => merge_stats(ranks, "input statistics", local),
    }
}

/// After a stored value's superstep on ranks: every rank's per-tile statistics of it (merged in tile
/// order by the caller) and the parts of its tiles that other ranks read, sent there; what this rank
/// reads of others' tiles is stored in `layer`.
fn share_value(
    ranks: &Ranks,
    step: &str,
    local: Result<Vec<(usize, Option<Vec<ChannelStats>>)>>,
    layer: &Layer,
    v: usize,
    halos: &Halos,
) -> Result<Vec<(usize, Vec<ChannelStats>)>> {
    let sent = local.and_then(|local| {
        let mut w = Wire::default();
        let st: Vec<(usize, Vec<ChannelStats>)> = local
            .into_iter()
            .filter_map(|(t, s)| s.map(|s| (t, s)))
            .collect();
        put_stats(&mut w, &st);
        halos.outgoing(v, layer, ranks, &mut w)?;
        Ok(w.0)
    });
    let got = ranks.all_gather(step, sent)?;
    let mut all = vec![];
    for (r, data) in got.iter().enumerate() {
        let mut rd = Reader::new(data, r);
        all.extend(read_stats(&mut rd)?);
        Halos::incoming(layer, ranks, &mut rd)?;
    }
    Ok(all)
}

/// Recycles the stored values no node after node `done` reads (the input and the output aside).
fn recycle_dead(vals: &mut [Option<Val<'_>>], last_use: &[usize], done: usize) {
    for (u, val) in vals.iter_mut().enumerate() {
        if u > 0
            && last_use[u] != usize::MAX
            && last_use[u] <= done
            && let Some(Val::Layer(l)) = val.take()
        {
            l.recycle();
        }
    }
}

/// Exact BSP execution of `g` over `input` on `be`'s backend: a superstep per stored value on the tiles
/// of `grid`, statistics merged for every normalisation; writes `sink` (the output value's tiles as they
/// are computed).
#[allow(clippy::too_many_arguments)]
pub(super) fn exact_on<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    let plan = prepare(g, input, grid)?;
    let grids: Vec<Grid> = (0..plan.shape.len())
        .map(|v| g.value_grid(&plan, grid, v))
        .collect::<Result<_>>()?;
    let schedule = Schedule::new(g, &plan, &grids, be.backend.fuses_pointwise());
    let n_tiles = grid.len();
    let workers = exact_workers(be.backend, threads, n_tiles);
    let working = tile_bytes(g, &plan, &schedule, &grids).saturating_mul(workers as u64);
    let budget = &reserve(
        budget,
        schedule.peak_bytes,
        working,
        workers,
        grid_tile(grid),
    )?;
    let Schedule {
        chains,
        fused,
        through,
        inlined,
        inline_of,
        moves,
        last_use,
        peak_bytes: needed,
    } = schedule;
    let stored_value = |i: usize| stored_value(&chains, i);
    // What ranks sharing the run send each other after each stored value's superstep.
    let halos = be.ranks.map(|ranks| {
        let units: Vec<(usize, usize)> = (0..g.nodes.len())
            .filter(|&i| !(fused[i] || through[i + 1].is_some() || inlined[i]))
            .map(|i| (i, stored_value(i)))
            .collect();
        let mut stored = vec![false; plan.shape.len()];
        stored[0] = true;
        for &(_, v) in &units {
            stored[v] = v != g.output;
        }
        Halos::plan(g, &plan, &grids, &units, &stored, ranks)
    });
    // The buffers kept for reuse count against the plan: the stored values' planned peak (in RAM) less
    // what is stored now, plus the working sets of the tiles in flight.
    let pool_room = |stored: u64| {
        needed
            .min(budget.ram)
            .saturating_sub(stored)
            .saturating_add(working)
    };
    let inner = inner_threads(threads, workers);
    let ram_used = Arc::new(AtomicU64::new(0));
    let mut vals: Vec<Option<Val>> = (0..plan.shape.len()).map(|_| None).collect();
    vals[0] = Some(Val::Input(input));
    let mut stats: Vec<Option<Vec<ChannelStats>>> = vec![None; plan.shape.len()];
    let mut norms: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; g.nodes.len()];
    let mut info = RunInfo {
        stats: vec![None; g.nodes.len()],
        tiles: n_tiles,
        peak_store_bytes: needed,
        inlined_values: inlined.iter().filter(|&&b| b).count(),
        ..RunInfo::default()
    };
    // A normalisation of the graph input itself: the input's statistics, tile by tile, first.
    if plan.feeds_norm[0] {
        stats[0] = Some(input_stats(be.ranks, input, &grids[0], workers)?);
    }
    for (i, n) in g.nodes.iter().enumerate() {
        if fused[i] || through[i + 1].is_some() {
            continue;
        }
        if let Op::Norm(m) = &n.op {
            let st = stats[n.inputs[0]]
                .clone()
                .ok_or_else(|| node_err(n, "internal: its input reported no statistics"))?;
            norms[i] = Some(m.scale_shift(&st));
            info.stats[i] = Some(st);
        }
        if inlined[i] {
            continue;
        }
        // The value this superstep stores: the node's, or its chain's last.
        let v = stored_value(i);
        let gv = &grids[v];
        if let Some(u) = taken_input(g, &moves, &grids, i)
            && let Some(Val::Layer(l)) = &mut vals[u]
        {
            l.hand_over_ram();
        }
        let layer = if v == g.output {
            None
        } else {
            let l = Layer::new(plan.shape[v].0, gv.clone(), budget, &ram_used)?;
            info.spilled_layers += l.spilled() as usize;
            Some(l)
        };
        crate::buffers::limit(pool_room(ram_used.load(Ordering::Relaxed)));
        let field = |u: usize| vals[u].as_ref().expect("value alive").field();
        let exact = Exact {
            be,
            g,
            plan: &plan,
            field: &field,
            through: &through,
            moves: &moves,
            chains: &chains,
            inline_of: &inline_of,
            norms: &norms,
            threads: inner,
        };
        let merged = exact.superstep(i, v, gv, layer.as_ref(), sink, workers, halos.as_ref())?;
        if plan.feeds_norm[v] {
            stats[v] = Some(merged);
        }
        vals[v] = layer.map(Val::Layer);
        recycle_dead(&mut vals, &last_use, v - 1);
    }
    if let Some(m) = be.backend.device_meter() {
        info.device_peak_bytes = m.peak();
    }
    drop(vals);
    crate::buffers::clear();
    Ok(info)
}
