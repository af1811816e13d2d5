//! Exact BSP inference: one superstep per convolution, dictionary padding between tiles, delayed
//! normalisation with merged statistics (section 3 of the paper).
//!
//! Superstep of stage `i`, for every tile in parallel: gather the window (own rows + halo) from the
//! previous stage's tiles — neighbours' stored activations inside the image, the model's padding outside —
//! convolve, report per-channel (count, mean, M2). Barrier. The merged statistics are the whole image's;
//! every tile normalises with them, applies ReLU and the residual add. Barrier. Every tile then holds
//! exactly its part of the whole-image activation, so the output equals the whole-image output.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::field::{Field, Input, OutputSink, gather};
use crate::grid::Grid;
use crate::model::{Net, NetStats, Plan};
use crate::stats::merge_all;
use crate::store::{Budget, Layer};
use crate::workers::{inner_threads, superstep};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// What a tiled run did besides its output.
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    /// Statistics each normalising stage applied.
    pub stats: NetStats,
    /// Tiles of the grid.
    pub tiles: usize,
    /// Largest number of activation bytes held at once (RAM and spill files).
    pub peak_store_bytes: u64,
    /// Stage outputs that went to spill files.
    pub spilled_layers: usize,
}

/// Checks that every tile, at every resolution, is at least as wide as the halo the next convolution
/// reads, so that halos come from the immediate neighbours (and the reflection of a tile never needs
/// more than the image has). Returns the per-stage grids.
pub fn stage_grids(net: &Net, plan: &Plan, grid: &Grid) -> Result<Vec<Grid>> {
    let mut grids = vec![];
    let mut in_grid = grid.clone();
    let mut in_div = 1;
    for (i, s) in net.stages.iter().enumerate() {
        let (ay, ax) = plan.axes[i];
        let halo = ay.halo().max(ax.halo());
        let min_tile = in_grid
            .rows
            .windows(2)
            .chain(in_grid.cols.windows(2))
            .map(|p| p[1] - p[0])
            .min()
            .unwrap_or(0);
        if min_tile < halo {
            let min = (0..net.stages.len())
                .map(|j| {
                    plan.axes[j].0.halo().max(plan.axes[j].1.halo())
                        * if j == 0 { 1 } else { plan.div[j - 1] }
                })
                .max()
                .unwrap_or(1);
            return Err(Error::TileSmallerThanHalo {
                tile: min_tile * in_div,
                layer: s.name.clone(),
                halo: halo * in_div,
                min,
            });
        }
        let (_, h, w) = plan.out[i];
        let g = grid.at_level(plan.div[i], h, w)?;
        in_grid = g.clone();
        in_div = plan.div[i];
        grids.push(g);
    }
    Ok(grids)
}

/// The most activation bytes alive at once: a stage's input, its output and pending residuals.
pub fn peak_bytes(net: &Net, plan: &Plan, grids: &[Grid]) -> u64 {
    (0..net.stages.len())
        .map(|i| {
            (0..=i)
                .filter(|&j| j == i || plan.last_use[j] >= i)
                .map(|j| Layer::bytes(plan.out[j].0, &grids[j]))
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// Checks the grid against the input and the budget; returns the plan and the per-stage grids.
pub fn prepare(
    net: &Net,
    input: &dyn Input,
    grid: &Grid,
    budget: Option<&Budget>,
) -> Result<(Plan, Vec<Grid>)> {
    let (h, w) = (input.height(), input.width());
    let plan = net.plan(h, w)?;
    if input.channels() != net.channels {
        return Err(Error::Channels {
            expected: net.channels,
            found: input.channels(),
        });
    }
    if grid.rows.last() != Some(&h) || grid.cols.last() != Some(&w) {
        return Err(Error::Grid(format!(
            "grid does not cover the {w}x{h} image"
        )));
    }
    let align = net.total_stride();
    if grid.rows[1..grid.rows.len() - 1]
        .iter()
        .chain(&grid.cols[1..grid.cols.len() - 1])
        .any(|b| b % align != 0)
    {
        return Err(Error::Grid(format!(
            "tile borders must fall on multiples of {align}"
        )));
    }
    let grids = stage_grids(net, &plan, grid)?;
    if let Some(b) = budget {
        let needed = peak_bytes(net, &plan, &grids);
        let disk = b.disk_limit()?;
        if needed > b.ram.saturating_add(disk) {
            return Err(Error::OverBudget {
                needed,
                ram: b.ram,
                disk,
                dir: b.spill_dir.clone(),
            });
        }
    }
    Ok((plan, grids))
}

/// Runs the network over `input` tile by tile with exact whole-image semantics; writes `sink`.
pub fn run_exact(
    net: &Net,
    backend: &dyn Backend,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
    budget: &Budget,
    sink: &OutputSink,
) -> Result<RunInfo> {
    let (plan, grids) = prepare(net, input, grid, Some(budget))?;
    let ram_used = Arc::new(AtomicU64::new(0));
    let n = grid.len();
    let inner = inner_threads(threads, n);
    let mut layers: Vec<Option<Layer>> = (0..net.stages.len()).map(|_| None).collect();
    let mut info = RunInfo {
        stats: vec![None; net.stages.len()],
        tiles: n,
        peak_store_bytes: peak_bytes(net, &plan, &grids),
        spilled_layers: 0,
    };
    let last = net.stages.len() - 1;
    let spill_err = |source| Error::Spill {
        dir: budget.spill_dir.clone(),
        source,
    };
    for (i, s) in net.stages.iter().enumerate() {
        let g = &grids[i];
        let (ay, ax) = plan.axes[i];
        // The final stage without normalisation writes straight to the output: nothing reads it back.
        let direct = i == last && s.norm.is_none();
        let layer = if direct {
            None
        } else {
            let l = Layer::new(s.conv.cout, g.clone(), budget, &ram_used)?;
            info.spilled_layers += l.spilled() as usize;
            Some(l)
        };
        let src: &dyn Field = if i == 0 {
            input
        } else {
            layers[i - 1].as_ref().expect("live")
        };
        let residual = s.residual.map(|r| layers[r].as_ref().expect("live"));
        // Superstep, part 1: halo exchange + convolution (+ local statistics).
        let local = superstep(n, threads, |t| {
            let (y0, y1, x0, x1) = g.tile(t);
            let window = gather(src, &ay.index_map(y0, y1), &ax.index_map(x0, x1))?;
            let mut y = backend.conv2d_valid(&window, &s.conv, inner);
            drop(window);
            if s.norm.is_some() {
                let st = backend.channel_stats(&y);
                layer
                    .as_ref()
                    .expect("stored")
                    .modify(t, |d| d.copy_from_slice(&y.data))
                    .map_err(spill_err)?;
                return Ok(Some(st));
            }
            if s.relu {
                backend.relu(&mut y.data);
            }
            if let Some(r) = residual {
                let rd = r.read(t).map_err(spill_err)?;
                backend.add(&mut y.data, &rd);
            }
            match &layer {
                Some(l) => l
                    .modify(t, |d| d.copy_from_slice(&y.data))
                    .map_err(spill_err)?,
                None => sink.put(y0, x0, &y),
            }
            Ok(None)
        })?;
        // Barrier passed: merge the statistics, then part 2: every tile normalises with them.
        if let Some(norm) = &s.norm {
            let tiles: Vec<_> = local.into_iter().flatten().collect();
            let global = merge_all(&tiles);
            let l = layer.as_ref().expect("stored");
            superstep(n, threads, |t| {
                let (y0, y1, x0, x1) = g.tile(t);
                let plane = (y1 - y0) * (x1 - x0);
                let rd = match residual {
                    Some(r) => Some(r.read(t).map_err(spill_err)?),
                    None => None,
                };
                l.modify(t, |d| {
                    backend.normalize(d, plane, &global, norm, s.relu);
                    if let Some(rd) = &rd {
                        backend.add(d, rd);
                    }
                })
                .map_err(spill_err)?;
                if i == last {
                    let d = l.read(t).map_err(spill_err)?;
                    let tt =
                        crate::tensor::Tensor::from_vec(s.conv.cout, y1 - y0, x1 - x0, d.to_vec())?;
                    sink.put(y0, x0, &tt);
                }
                Ok(())
            })?;
            info.stats[i] = Some(global);
        }
        layers[i] = layer;
        for (j, l) in layers.iter_mut().enumerate().take(i + 1) {
            if plan.last_use[j] <= i {
                *l = None;
            }
        }
    }
    Ok(info)
}
