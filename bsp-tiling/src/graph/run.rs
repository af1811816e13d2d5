//! Running a graph: the modes (whole, exact, naive, sampled, recompute) on a backend, into a sink or a
//! new tensor, on the device a [`crate::DeviceOptions`] names, alone or on ranks.

use super::eval::{Run, tensor_stats};
use super::exact::{exact_on, exact_schedule, exact_workers, tile_bytes};
use super::exec::GraphOps;
use super::fixed::{eval_region, run_fixed, scale_shifts};
use super::model::{Graph, GraphPlan, GraphStats, prepare};
use super::ops::Op;
use super::superstep::{inner_threads, into_sink, superstep_share};
use super::working;
use crate::backend::CpuBackend;
use crate::error::{Error, Result};
use crate::field::{Input, OutputSink, Sink, gather};
use crate::grid::Grid;
use crate::ranks::{merge_in_tile_order, merge_stats};
use crate::run_info::RunInfo;
use crate::store::Budget;
use crate::tensor::Tensor;
use crate::{Mode, Options};

/// Runs `g` over `input` on `backend` as `opts` asks — its mode, tile, threads, RAM budget and the ranks
/// sharing it — writing `sink` (which must have the output value's shape: [`Graph::plan`]'s last shape)
/// on [`Graph::grid`]'s tiles. The backend first checks that it runs every node, then prepares the run
/// (weights), and each superstep hands it the gathered windows. A device's memory peak (from the run's
/// start) is reported in [`RunInfo::device_peak_bytes`]. On ranks, only rank 0's sink is written.
pub fn run<B: GraphOps>(
    backend: &B,
    g: &Graph,
    input: &dyn Input,
    opts: &Options,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    let ranks = opts.ranks.as_ref();
    if let Some(m) = backend.device_meter() {
        m.reset_peak();
    }
    if let Some(r) = ranks {
        r.begin()?;
    }
    let result = (|| {
        backend.check(&g.nodes)?;
        let prep = backend.prepare(&g.nodes)?;
        let be = &Run {
            backend,
            prep: &prep,
            ranks,
        };
        let copied_before = backend.device_meter().map_or(0, |m| m.copied_total());
        let mut info = run_mode(
            be,
            g,
            input,
            opts.mode,
            opts.tile,
            opts.threads,
            &opts.budget,
            sink,
        )?;
        if let Some(m) = backend.device_meter() {
            info.device_peak_bytes = m.peak();
            info.device_copied_bytes = m.copied_total() - copied_before;
        }
        Ok(info)
    })();
    match ranks {
        Some(r) => r.finish("run", result),
        None => result,
    }
}

/// [`run`] on the device `dev` names: the CPU backend, or the CUDA backend opened with its memory
/// budget and precision. Without a usable GPU, `Device::Cuda` fails with the probe's reason (no driver,
/// no device, no NVRTC or cuBLAS); it never falls back to the CPU.
pub fn run_device(
    dev: &crate::DeviceOptions,
    g: &Graph,
    input: &dyn Input,
    opts: &Options,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    dev.validate()?;
    match dev.device {
        crate::Device::Cpu => run(&CpuBackend, g, input, opts, sink),
        crate::Device::Cuda(ordinal) => {
            let backend = crate::CudaBackend::new(ordinal, dev.gpu_memory, dev.precision)?;
            // The peak this run reports is its own (cuBLAS's workspace is held from the start).
            backend.memory().reset_peak();
            run(&backend, g, input, opts, sink)
        }
    }
}

/// The options of [`infer`]'s positional form.
fn options(mode: Mode, tile: usize, threads: usize, budget: &Budget) -> Options {
    Options {
        mode,
        tile,
        threads,
        budget: budget.clone(),
        ranks: None,
    }
}

#[allow(clippy::too_many_arguments)]
fn run_mode<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    let (h, w) = (input.height(), input.width());
    let grid = || g.grid(h, w, tile);
    let result = match mode {
        Mode::Whole => one_tile(be, g, input, threads, budget, sink),
        Mode::Exact => {
            match fit(be, g, input, tile, threads, budget, exact_need).and_then(|(tile, note)| {
                let mut info = exact_on(be, g, input, &g.grid(h, w, tile)?, threads, budget, sink)?;
                info.notes.extend(note);
                Ok(info)
            }) {
                // Refused before anything was computed or written: the same output, exact, from the
                // recompute schedule, which stores no activation.
                Err(Error::OverBudget {
                    needed, ram, disk, ..
                }) => {
                    let mut info =
                        run_mode(be, g, input, Mode::Recompute, tile, threads, budget, sink)?;
                    info.notes.push(recompute_note(g, needed, ram, disk));
                    Ok(info)
                }
                other => other,
            }
        }
        Mode::Naive => {
            let grid = grid()?;
            let plan = prepare(g, input, &grid)?;
            let go = g.value_grid(&plan, &grid, g.output)?;
            let workers = be.backend.tiles_at_once(threads).clamp(1, grid.len());
            let inner = inner_threads(threads, workers);
            let compute = |t: usize| {
                let (y0, y1, x0, x1) = grid.tile(t);
                let ys: Vec<Option<usize>> = (y0..y1).map(Some).collect();
                let xs: Vec<Option<usize>> = (x0..x1).map(Some).collect();
                let crop = gather(input, &ys, &xs)?;
                let p = g.plan(y1 - y0, x1 - x0)?;
                let (c, oh, ow) = p.shape[g.output];
                let part = OutputSink::try_f32(c, oh, ow)?;
                // A tile is an image of its own: this rank alone computes it.
                let alone = Run { ranks: None, ..*be };
                one_tile(&alone, g, &crop, inner, budget, &part)?;
                let (oy0, _, ox0, _) = go.tile(t);
                Ok((oy0, ox0, part.finish().into_tensor()?, ()))
            };
            into_sink(be.ranks, "naive tiles", grid.len(), workers, compute, sink)?;
            Ok(RunInfo {
                tiles: grid.len(),
                ..RunInfo::default()
            })
        }
        Mode::Sampled(f) => {
            let (tile, note) = fit(be, g, input, tile, threads, budget, fixed_need)?;
            let grid = g.grid(h, w, tile)?;
            let plan = prepare(g, input, &grid)?;
            // The sample's statistics by the exact mode, tile by tile under the run's budget (its
            // values stored, spilled or recomputed as an exact run's are); its output is not kept.
            let small = crate::field::Downsampled::new(input, f);
            let discard = OutputSink::f32(0, 0, 0)?;
            let sampled = run_mode(be, g, &small, Mode::Exact, tile, threads, budget, &discard)?;
            run_fixed(be, g, &plan, input, &grid, &sampled.stats, threads, sink)?;
            Ok(RunInfo {
                stats: sampled.stats,
                tiles: grid.len(),
                notes: sampled.notes.into_iter().chain(note).collect(),
                ..RunInfo::default()
            })
        }
        Mode::Recompute => {
            let (tile, note) = fit(be, g, input, tile, threads, budget, fixed_need)?;
            let grid = g.grid(h, w, tile)?;
            let plan = prepare(g, input, &grid)?;
            let stats = recompute_stats(be, g, &plan, input, &grid, threads)?;
            run_fixed(be, g, &plan, input, &grid, &stats, threads, sink)?;
            Ok(RunInfo {
                stats,
                tiles: grid.len(),
                notes: note.into_iter().collect(),
                ..RunInfo::default()
            })
        }
    };
    crate::buffers::clear();
    result
}

/// Each normalisation's statistics, recomputed tile by tile: its input evaluated over every tile of its
/// grid with the statistics merged so far (the recompute mode's passes).
fn recompute_stats<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    plan: &GraphPlan,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
) -> Result<GraphStats> {
    let mut stats: GraphStats = vec![None; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if !matches!(n.op, Op::Norm(_)) {
            continue;
        }
        let u = n.inputs[0];
        let gu = g.value_grid(plan, grid, u)?;
        let workers = be.backend.tiles_at_once(threads).clamp(1, gu.len());
        let inner = inner_threads(threads, workers);
        let ss = scale_shifts(g, &stats);
        let tiles = superstep_share(be.ranks, gu.len(), workers, |t| {
            let (y0, y1, x0, x1) = gu.tile(t);
            if u == 0 {
                let x = gather(
                    input,
                    &(y0..y1).map(Some).collect::<Vec<_>>(),
                    &(x0..x1).map(Some).collect::<Vec<_>>(),
                )?;
                Ok(tensor_stats(&x))
            } else {
                let x = eval_region(be, g, plan, input, u, (y0, y1), (x0, x1), &ss, inner)?;
                be.backend.stats(&x)
            }
        });
        stats[i] = Some(match be.ranks {
            Some(ranks) => merge_stats(ranks, &format!("statistics of node {i}"), tiles)?,
            None => merge_in_tile_order(tiles?),
        });
    }
    Ok(stats)
}

/// The note of an exact run that ran the recompute schedule because its stored values did not fit.
fn recompute_note(g: &Graph, needed: u64, ram: u64, disk: u64) -> String {
    let norms = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Norm(_)))
        .count();
    let gb = |b: u64| format!("{:.1} GB", b as f64 / 1e9);
    format!(
        "exact: storing every node's output would take {} at its peak, more than the RAM budget ({}) \
         and the spill space ({}) together, so each normalisation's statistics were recomputed tile by \
         tile instead ({} passes over the input; the same output)",
        gb(needed),
        gb(ram),
        gb(disk),
        norms + 1
    )
}

/// The working sets of a run's tiles in flight at once, and how many tiles that is (see [`working_set`]).
type Need<B> = fn(&Run<'_, B>, &Graph, &dyn Input, usize, usize) -> Result<(u64, usize)>;

/// The tile a run whose working sets `need` gives uses: `tile`, or a smaller one whose working sets fit
/// the budget (with a note), or the refusal of the smallest.
#[allow(clippy::too_many_arguments)]
fn fit<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    tile: usize,
    threads: usize,
    budget: &Budget,
    need: Need<B>,
) -> Result<(usize, Option<String>)> {
    let align = g.plan(input.height(), input.width())?.align;
    let allowance = working::Allowance::of(budget.ram);
    working::fit_tile(tile, align, |t| {
        let (bytes, workers) = need(be, g, input, t, threads)?;
        allowance.admit(bytes, workers, t)
    })
}

/// The working sets of an exact run's tiles of side `tile` worked on at once.
fn exact_need<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    tile: usize,
    threads: usize,
) -> Result<(u64, usize)> {
    let grid = g.grid(input.height(), input.width(), tile)?;
    let plan = prepare(g, input, &grid)?;
    let grids: Vec<Grid> = (0..plan.shape.len())
        .map(|v| g.value_grid(&plan, &grid, v))
        .collect::<Result<_>>()?;
    let workers = exact_workers(be.backend, threads, grid.len());
    let s = exact_schedule(be, g, &plan, &grids, workers);
    let per_tile = tile_bytes(g, &plan, &s, &grids);
    Ok((per_tile.saturating_mul(workers as u64), workers))
}

/// The working sets of one-pass evaluations (sampled, recompute) over tiles of side `tile` worked on at
/// once: the output's tiles, and the inputs of every normalisation whose statistics are recomputed tile
/// by tile.
fn fixed_need<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    tile: usize,
    threads: usize,
) -> Result<(u64, usize)> {
    let grid = g.grid(input.height(), input.width(), tile)?;
    let plan = prepare(g, input, &grid)?;
    let sizer = working::Sizer {
        g,
        plan: &plan,
        through: &[],
        inline_of: &[],
    };
    let norm_inputs = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Norm(_)))
        .map(|n| n.inputs[0])
        .filter(|&u| u > 0);
    let mut most = (0, 1);
    for v in std::iter::once(g.output).chain(norm_inputs) {
        let gv = g.value_grid(&plan, &grid, v)?;
        let per_tile = working::corners(&gv)
            .map(|r| sizer.one_pass(v, r))
            .max()
            .unwrap_or(0);
        let workers = be.backend.tiles_at_once(threads).clamp(1, gv.len());
        let bytes = per_tile.saturating_mul(workers as u64);
        if bytes > most.0 {
            most = (bytes, workers);
        }
    }
    Ok(most)
}

/// The host memory that the tiles of a `mode` run of `g` over `input` (tiles of side `tile`, `threads`
/// threads, on the CPU) hold at once besides the stored values — their input windows, outputs and
/// scratch — as the planner sizes it. A RAM budget covers this first (the tile is shrunk until it
/// does); the stored values get what remains and spill past it.
pub fn working_set(
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
) -> Result<u64> {
    let be = &Run {
        backend: &CpuBackend,
        prep: &(),
        ranks: None,
    };
    let need = match mode {
        Mode::Sampled(_) | Mode::Recompute => fixed_need(be, g, input, tile, threads)?,
        Mode::Exact | Mode::Naive => exact_need(be, g, input, tile, threads)?,
        Mode::Whole => {
            let align = g.plan(input.height(), input.width())?.align;
            let side = input.height().max(input.width()).next_multiple_of(align);
            exact_need(be, g, input, side, threads)?
        }
    };
    Ok(need.0)
}

/// `g` over all of `input` as one tile with every value in RAM: the whole-image run, a naive tile, the
/// sampled mode's small image.
fn one_tile<B: GraphOps>(
    be: &Run<'_, B>,
    g: &Graph,
    input: &dyn Input,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    let one = Grid {
        rows: vec![0, input.height()],
        cols: vec![0, input.width()],
    };
    // Every value in RAM, up to the machine's memory: past it, a typed error before anything runs
    // rather than the kernel's OOM killer halfway.
    let (limit, source) = stdx::mem::limit();
    let ram = Budget {
        ram: limit,
        disk: Some(0),
        ..budget.clone()
    };
    match exact_on(be, g, input, &one, threads, &ram, sink) {
        Err(Error::OverBudget { needed, .. } | Error::TileOverBudget { needed, .. }) => {
            Err(Error::WholeTooLarge {
                needed,
                limit,
                limit_from: source,
            })
        }
        r => r,
    }
}

/// [`run`] on the CPU into a new f32 tensor (the network's raw output, `C×H×W`).
pub fn infer(
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
) -> Result<(Tensor, RunInfo)> {
    infer_on(&CpuBackend, g, input, mode, tile, threads, budget)
}

/// [`infer`] on `backend` ([`run`]).
pub fn infer_on<B: GraphOps>(
    backend: &B,
    g: &Graph,
    input: &dyn Input,
    mode: Mode,
    tile: usize,
    threads: usize,
    budget: &Budget,
) -> Result<(Tensor, RunInfo)> {
    let plan = g.plan(input.height(), input.width())?;
    let (c, h, w) = plan.shape[g.output];
    let sink = OutputSink::try_f32(c, h, w)?;
    let info = run(
        backend,
        g,
        input,
        &options(mode, tile, threads, budget),
        &sink,
    )?;
    Ok((sink.finish().into_tensor()?, info))
}
