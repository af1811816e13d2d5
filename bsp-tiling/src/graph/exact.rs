//! The exact engine: a BSP superstep per stored unit on the tiles of its value, each tile's window
//! gathered from its neighbours' stored tiles (dictionary padding), whole-image statistics merged before
//! every normalisation; values kept on the device while its budget allows (`kept`), else in RAM or
//! spilled, recycled after their last reader.

use super::eval::{Run, Source, eval_node, tensor_stats};
use super::exec::GraphOps;
use super::halos::{Exchanged, Halos, KeptOn};
use super::kept::Kept;
use super::model::{Graph, GraphPlan, node_err, prepare};
use super::ops::Op;
use super::schedule::{Schedule, Through, stored_value, taken_input};
use super::superstep::{inner_threads, rounds, superstep_share};
use super::working;
use crate::error::{Error, Result};
use crate::field::{Field, Input, Part, Sink, span};
use crate::grid::Grid;
use crate::meter::Meter;
use crate::ranks::{Ranks, Reader, Wire, merge_in_tile_order, merge_stats, put_stats, read_stats};
use crate::run_info::RunInfo;
use crate::stats::ChannelStats;
use crate::store::{Budget, Layer};
use crate::tensor::Tensor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A value's storage during a run: the image, a tiled layer (RAM or spill), or tiles kept on the
/// device.
enum Val<'a, B: GraphOps> {
    Input(&'a dyn Input),
    Layer(Layer),
    Kept(Kept<B>),
}

impl<B: GraphOps> Val<'_, B> {
    fn source(&self) -> Source<'_, B> {
        match self {
            Val::Input(i) => Source::Host(*i as &dyn Field),
            Val::Layer(l) => Source::Host(l),
            Val::Kept(k) => Source::Kept(k),
        }
    }
}

/// A tile a superstep computed: its corner, its output, and its statistics where a normalisation reads
/// them.
type TileOut<T> = (usize, usize, T, Option<Vec<ChannelStats>>);

/// Where a superstep's tiles go: a stored value's layer on the host or its tiles kept on the device, or
/// (the output value) the sink.
enum Target<'t, B: GraphOps> {
    Layer(&'t Layer),
    Kept(&'t Kept<B>),
    Sink,
}

/// What a superstep of [`exact_on`] evaluates units with: the stored values, and the units computed
/// where they are read.
struct Exact<'a, 'f, B: GraphOps> {
    be: &'a Run<'a, B>,
    g: &'a Graph,
    plan: &'a GraphPlan,
    source: &'a (dyn Fn(usize) -> Source<'f, B> + Sync),
    through: &'a [Through],
    moves: &'a [bool],
    chains: &'a [Vec<usize>],
    /// Per value: the unit computing it where it is read, when it is inlined.
    inline_of: &'a [Option<usize>],
    norms: &'a [Option<(Vec<f32>, Vec<f32>)>],
    threads: usize,
}

impl<B: GraphOps> Exact<'_, '_, B> {
    /// Unit `i` (node `i` and its element-wise chain) over output rows `ry` × columns `rx`, on the
    /// backend.
    fn unit(&self, i: usize, ry: (usize, usize), rx: (usize, usize)) -> Result<B::Buf> {
        let g = self.g;
        let hook = |u: usize, ys: &[Option<usize>], xs: &[Option<usize>]| {
            let p = self.inline_of.get(u).copied().flatten()?;
            Some(self.window(p, u, ys, xs))
        };
        let out = eval_node(
            self.be,
            i,
            &g.nodes[i],
            self.plan,
            i + 1,
            ry,
            rx,
            self.source,
            self.through,
            self.moves,
            self.norms[i].as_ref(),
            self.threads,
            &hook,
        )?;
        self.chains[i].iter().try_fold(out, |out, &j| {
            self.be.backend.pointwise(&g.nodes[j].op, out)
        })
    }

    /// The superstep of unit `i`, storing value `v` on the tiles of `gv` into `target`; on ranks, this
    /// rank's share, then what the others read of it sent to them (`halos`) or the output's tiles to
    /// rank 0. Every tile's statistics of `v` where a normalisation reads it, merged in tile order (else
    /// none).
    #[allow(clippy::too_many_arguments)]
    fn superstep(
        &self,
        i: usize,
        v: usize,
        gv: &Grid,
        target: Target<'_, B>,
        sink: &dyn Sink,
        workers: usize,
        halos: Option<&Halos>,
    ) -> Result<Vec<ChannelStats>> {
        let backend = self.be.backend;
        let compute = |t: usize| -> Result<TileOut<B::Buf>> {
            let (y0, y1, x0, x1) = gv.tile(t);
            let out = self.unit(i, (y0, y1), (x0, x1))?;
            let st = match self.plan.feeds_norm[v] {
                true => Some(backend.stats(&out)?),
                false => None,
            };
            Ok((y0, x0, out, st))
        };
        let on_host = |t: usize| -> Result<TileOut<Tensor>> {
            let (y0, x0, out, st) = compute(t)?;
            Ok((y0, x0, backend.store(out)?, st))
        };
        let step = format!("node {i} ({})", self.g.nodes[i].name);
        // Every tile's statistics of `v`, where a normalisation reads it, merged in tile order.
        let keep = |tiles: Vec<(usize, Option<Vec<ChannelStats>>)>| {
            tiles
                .into_iter()
                .filter_map(|(t, s)| s.map(|s| (t, s)))
                .collect::<Vec<_>>()
        };
        let into_layer = |l: &Layer, t: usize| {
            let (_, _, out, st) = on_host(t)?;
            l.put(t, out.data).map_err(|e| l.spill_error(e))?;
            Ok(st)
        };
        Ok(match (target, self.be.ranks, halos) {
            (Target::Layer(l), Some(ranks), Some(halos)) => {
                let local = superstep_share(Some(ranks), gv.len(), workers, |t| into_layer(l, t));
                merge_in_tile_order(share_value(ranks, &step, local, l, v, halos)?)
            }
            (Target::Layer(l), ..) => {
                merge_in_tile_order(keep(superstep_share(None, gv.len(), workers, |t| {
                    into_layer(l, t)
                })?))
            }
            (Target::Kept(k), Some(ranks), Some(halos)) => {
                let local = superstep_share(Some(ranks), gv.len(), workers, |t| {
                    let (_, _, out, st) = compute(t)?;
                    k.put(t, out)?;
                    Ok(st)
                });
                let held = KeptOn { kept: k, backend };
                merge_in_tile_order(share_value(ranks, &step, local, &held, v, halos)?)
            }
            (Target::Kept(k), ..) => {
                merge_in_tile_order(keep(superstep_share(None, gv.len(), workers, |t| {
                    let (_, _, out, st) = compute(t)?;
                    k.put(t, out)?;
                    Ok(st)
                })?))
            }
            (Target::Sink, Some(ranks), _) => {
                let own = rounds(ranks, &step, gv.len(), workers, on_host, sink)?;
                if self.plan.feeds_norm[v] {
                    let step = format!("{step} statistics");
                    merge_stats(ranks, &step, Ok(keep(own)))?
                } else {
                    vec![]
                }
            }
            (Target::Sink, None, _) => {
                merge_in_tile_order(keep(superstep_share(None, gv.len(), workers, |t| {
                    let (y0, x0, out, st) = on_host(t)?;
                    sink.put_tile(y0, x0, &out)?;
                    crate::buffers::give(out.data);
                    Ok(st)
                })?))
            }
        })
    }

    /// The window at `ys` × `xs` of value `u`, computed by unit `p` over the rows and columns it spans,
    /// on the backend.
    fn window(
        &self,
        p: usize,
        u: usize,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<B::Buf> {
        let c = self.plan.shape[u].0;
        let backend = self.be.backend;
        let (Some(ry), Some(rx)) = (span(ys), span(xs)) else {
            // Nothing but padding: zeros.
            return backend.gather(c, &[], ys, xs);
        };
        let t = self.unit(p, ry, rx)?;
        let plain = |m: &[Option<usize>], (lo, hi): (usize, usize)| {
            m.len() == hi - lo && m.iter().enumerate().all(|(k, &o)| o == Some(lo + k))
        };
        if plain(ys, ry) && plain(xs, rx) {
            return Ok(t);
        }
        let part = Part {
            y0: ry.0,
            x0: rx.0,
            h: ry.1 - ry.0,
            w: rx.1 - rx.0,
            buf: &t,
        };
        let win = backend.gather(c, &[part], ys, xs);
        backend.recycle(t);
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

/// The schedule of an exact run over `grids` with `workers` tiles at once: small-halo units inlined
/// where the backend inlines them, and on a device only while the tiles' working sets with them fit
/// what its budget leaves (a unit computed in its reader's superstep widens that superstep's working
/// set, and a run the device holds without inlining must not fail for it).
pub(super) fn exact_schedule<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    plan: &GraphPlan,
    grids: &[Grid],
    workers: usize,
) -> Schedule {
    let schedule = Schedule::new(g, plan, grids, be.backend.inlines_units());
    match be.backend.device_meter() {
        Some(m)
            if be.backend.inlines_units()
                && tile_bytes(g, plan, &schedule, grids).saturating_mul(workers as u64)
                    > m.available() =>
        {
            Schedule::new(g, plan, grids, false)
        }
        _ => schedule,
    }
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
/// order by the caller), all-gathered with each rank's status; then, every rank being well, the parts of
/// its tiles that other ranks read, each sent to its reader alone. What this rank reads of others' tiles
/// is stored in `held` (the value's layer on the host, or its tiles kept on the device).
fn share_value(
    ranks: &Ranks,
    step: &str,
    local: Result<Vec<(usize, Option<Vec<ChannelStats>>)>>,
    held: &dyn Exchanged,
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
        Ok((w.0, halos.outgoing(v, held, ranks)?))
    });
    let (stats, parts) = match sent {
        Ok((stats, parts)) => (Ok(stats), parts),
        Err(e) => (Err(e), vec![]),
    };
    let got = ranks.all_gather(step, stats)?;
    let mut all = vec![];
    for (r, data) in got.iter().enumerate() {
        all.extend(read_stats(&mut Reader::new(data, r))?);
    }
    let received = ranks.exchange(&format!("{step} halos"), parts)?;
    for (r, data) in received.iter().enumerate() {
        Halos::incoming(held, ranks, &mut Reader::new(data, r))?;
    }
    Ok(all)
}

/// Recycles the stored values no node after node `done` reads (the input and the output aside).
fn recycle_dead<B: GraphOps>(vals: &mut [Option<Val<'_, B>>], last_use: &[usize], done: usize) {
    for (u, val) in vals.iter_mut().enumerate() {
        if u > 0 && last_use[u] != usize::MAX && last_use[u] <= done {
            // A kept value's buffers are freed as it drops.
            if let Some(Val::Layer(l)) = val.take() {
                l.recycle();
            }
        }
    }
}

/// Where an exact run stores its values: in device memory while `keeper`'s budget holds them beside the
/// working sets, else in the host's tiled store under `budget`. On ranks (`share`) a rank holds its own
/// tiles and the parts of the others' that it reads.
struct Storage<'s, B: GraphOps> {
    backend: &'s B,
    keeper: Option<&'s Arc<Meter>>,
    share: Option<(&'s Ranks, &'s Halos)>,
    budget: &'s Budget,
    ram_used: &'s Arc<AtomicU64>,
    last_use: &'s [usize],
    sizer: working::Sizer<'s>,
    /// Tiles in flight at once.
    workers: usize,
}

impl<B: GraphOps> Storage<'_, B> {
    /// The device memory unit `i`'s superstep over `gv` needs for its tiles in flight (none to keep when
    /// nothing is kept).
    fn room(&self, i: usize, gv: &Grid) -> u64 {
        match self.keeper {
            Some(_) => self.sizer.unit(i, gv).saturating_mul(self.workers as u64),
            None => 0,
        }
    }

    /// Moves kept values to the host (those read last first) until the device budget leaves `room` for
    /// a superstep's working sets, which come before keeping values.
    fn make_room(
        &self,
        vals: &mut [Option<Val<'_, B>>],
        room: u64,
        info: &mut RunInfo,
    ) -> Result<()> {
        let Some(meter) = self.keeper else {
            return Ok(());
        };
        while meter.available() < room {
            let Some(u) = (0..vals.len())
                .filter(|&u| matches!(vals[u], Some(Val::Kept(_))))
                .max_by_key(|&u| (self.last_use[u], u))
            else {
                return Ok(());
            };
            if let Some(Val::Kept(k)) = vals[u].take() {
                let l = k.into_host(self.backend, self.budget, self.ram_used)?;
                info.spilled_layers += l.spilled() as usize;
                info.values_moved_to_host += 1;
                vals[u] = Some(Val::Layer(l));
            }
        }
        Ok(())
    }

    /// The bytes of value `v` (`c` channels on `gv`) this process holds: all of it, or on ranks its own
    /// tiles and the rectangles of the others' that it reads.
    fn held_bytes(&self, v: usize, c: usize, gv: &Grid) -> u64 {
        let Some((ranks, halos)) = self.share else {
            return Kept::<B>::bytes(c, gv);
        };
        let own: u64 = (0..gv.len())
            .filter(|&t| ranks.owner(t, gv.len()) == ranks.rank())
            .map(|t| {
                let (y0, y1, x0, x1) = gv.tile(t);
                Tensor::bytes(c, y1 - y0, x1 - x0)
            })
            .sum();
        own.saturating_add(halos.received_bytes(v, ranks.rank(), c))
    }

    /// A new stored value `v` of `c` channels on `gv` (`name`: its node): kept on the device when what
    /// this process holds of it fits beside `room` bytes of working sets, else on the host.
    fn place<'a>(
        &self,
        v: usize,
        c: usize,
        gv: &Grid,
        room: u64,
        name: &str,
        info: &mut RunInfo,
    ) -> Result<Val<'a, B>> {
        let bytes = self.held_bytes(v, c, gv);
        if let Some(m) = self.keeper
            && m.available() >= bytes.saturating_add(room)
        {
            let what = format!("the output of `{name}`, kept on the device");
            info.kept_values += 1;
            return Ok(Val::Kept(Kept::reserve(m, c, gv, bytes, &what)?));
        }
        let l = Layer::new(c, gv.clone(), self.budget, self.ram_used)?;
        info.spilled_layers += l.spilled() as usize;
        Ok(Val::Layer(l))
    }
}

/// What ranks sharing a run send each other after each stored value's superstep (`units`: each stored
/// unit and the value it stores).
fn plan_halos(
    g: &Graph,
    plan: &GraphPlan,
    grids: &[Grid],
    units: &[(usize, usize)],
    ranks: &Ranks,
) -> Halos {
    let mut stored = vec![false; plan.shape.len()];
    stored[0] = true;
    for &(_, v) in units {
        stored[v] = v != g.output;
    }
    Halos::plan(g, plan, grids, units, &stored, ranks)
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
    let n_tiles = grid.len();
    let workers = exact_workers(be.backend, threads, n_tiles);
    let schedule = exact_schedule(be, g, &plan, &grids, workers);
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
    let units: Vec<(usize, usize)> = (0..g.nodes.len())
        .filter(|&i| !(fused[i] || through[i + 1].is_some() || inlined[i]))
        .map(|i| (i, stored_value(i)))
        .collect();
    let halos = be
        .ranks
        .map(|ranks| plan_halos(g, &plan, &grids, &units, ranks));
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
    let storage = Storage {
        backend: be.backend,
        keeper: be
            .backend
            .device_meter()
            .filter(|_| be.backend.keeps_values()),
        share: be.ranks.zip(halos.as_ref()),
        budget,
        ram_used: &ram_used,
        last_use: &last_use,
        sizer: working::Sizer {
            g,
            plan: &plan,
            through: &through,
            inline_of: &inline_of,
        },
        workers,
    };
    let mut vals: Vec<Option<Val<B>>> = (0..plan.shape.len()).map(|_| None).collect();
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
        // This superstep's working sets on the device come first: kept values make room for them.
        let room = storage.room(i, gv);
        storage.make_room(&mut vals, room, &mut info)?;
        let stored = if v == g.output {
            None
        } else {
            Some(storage.place(v, plan.shape[v].0, gv, room, &n.name, &mut info)?)
        };
        crate::buffers::limit(pool_room(ram_used.load(Ordering::Relaxed)));
        let source = |u: usize| vals[u].as_ref().expect("value alive").source();
        let exact = Exact {
            be,
            g,
            plan: &plan,
            source: &source,
            through: &through,
            moves: &moves,
            chains: &chains,
            inline_of: &inline_of,
            norms: &norms,
            threads: inner,
        };
        let target = match &stored {
            Some(Val::Layer(l)) => Target::Layer(l),
            Some(Val::Kept(k)) => Target::Kept(k),
            // Not stored: the output (a superstep never stores the input).
            None | Some(Val::Input(_)) => Target::Sink,
        };
        let merged = exact.superstep(i, v, gv, target, sink, workers, halos.as_ref())?;
        if plan.feeds_norm[v] {
            stats[v] = Some(merged);
        }
        vals[v] = stored;
        recycle_dead(&mut vals, &last_use, v - 1);
    }
    if let Some(m) = be.backend.device_meter() {
        info.device_peak_bytes = m.peak();
    }
    drop(vals);
    crate::buffers::clear();
    Ok(info)
}
