//! Exact BSP inference: one superstep per convolution, dictionary padding between tiles, delayed
//! normalisation with merged statistics (section 3 of the paper).
//!
//! Superstep of stage `i`, for every tile in parallel: gather the window (own rows + halo) from the
//! previous stage's tiles — neighbours' stored activations inside the image, the model's padding outside —
//! convolve, report per-channel (count, mean, M2). Barrier. The merged statistics are the whole image's;
//! every tile normalises with them, applies ReLU and the residual add. Barrier. Every tile then holds
//! exactly its part of the whole-image activation, so the output equals the whole-image output.
//!
//! The same code runs on every [`Backend`]. Where each stage's output lives is decided before the run
//! ([`crate::place`]): in host memory ([`Layer`]: RAM up to [`Budget::ram`], then spill files) — tiles are
//! then uploaded to the backend for each superstep and their results downloaded — or, for a device backend
//! with room in its budget, resident in device memory as one buffer that windows are gathered from there.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::field::{Input, Sink, gather};
use crate::grid::{Grid, stage_grids};
use crate::model::{Net, NetStats, Plan};
use crate::place::{self, Placement};
use crate::stats::merge_all;
use crate::store::{Budget, Layer};
use crate::tensor::Tensor;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

/// What a tiled run did besides its output.
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    /// Statistics each normalising stage applied.
    pub stats: NetStats,
    /// Tiles of the grid.
    pub tiles: usize,
    /// Largest number of activation bytes held at once in host memory (RAM and spill files).
    pub peak_store_bytes: u64,
    /// Stage outputs that went to spill files.
    pub spilled_layers: usize,
    /// Graph values computed where their one reader reads them instead of stored (exact runs of
    /// ONNX graphs on the host: a small halo recomputed instead of a stored value copied).
    pub inlined_values: usize,
    /// Stage outputs kept resident in device memory (device backends).
    pub resident_layers: usize,
    /// Device memory the placement plan allows for at its peak (device backends).
    pub device_planned_bytes: u64,
    /// Device memory in use at its peak during the run, as metered (device backends).
    pub device_peak_bytes: u64,
    /// What the run chose that its user should know (how an exact run kept within its budget).
    pub notes: Vec<String>,
}

/// Threads each backend call may use when `workers` tiles run at once.
pub fn inner_threads(threads: usize, workers: usize) -> usize {
    (threads / workers.clamp(1, threads.max(1))).max(1)
}

/// Runs `f` on every tile `0..n`, `workers` at a time on the workspace pool; results in tile order,
/// the first error stops the rest. Returning is the superstep's barrier.
pub fn superstep<R: Send>(
    n: usize,
    workers: usize,
    f: impl Fn(usize) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let tiles: Vec<usize> = (0..n).collect();
    stdx::parallel::map(&tiles, workers.clamp(1, n.max(1)), |_, &t| f(t))
}

/// The most activation bytes alive at once in host memory: a stage's input, its output and pending
/// residuals, counting the layers `on_host` says live there.
pub fn peak_bytes(net: &Net, plan: &Plan, grids: &[Grid], on_host: impl Fn(usize) -> bool) -> u64 {
    (0..net.stages.len())
        .map(|i| {
            (0..=i)
                .filter(|&j| (j == i || plan.last_use[j] >= i) && on_host(j))
                .map(|j| Layer::bytes(plan.out[j].0, &grids[j]))
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// Checks the grid against the input; returns the plan and the per-stage grids.
pub fn prepare(net: &Net, input: &dyn Input, grid: &Grid) -> Result<(Plan, Vec<Grid>)> {
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
    Ok((plan, grids))
}

/// Checks the host-memory peak of the layers kept there against RAM + disk budget.
pub fn check_host_budget(
    net: &Net,
    plan: &Plan,
    grids: &[Grid],
    placement: &Placement,
    budget: &Budget,
) -> Result<u64> {
    let needed = peak_bytes(net, plan, grids, |j| !placement.resident[j]);
    let disk = budget.disk_limit()?;
    if needed > budget.ram.saturating_add(disk) {
        return Err(Error::OverBudget {
            needed,
            ram: budget.ram,
            disk,
            dir: budget.spill_dir.clone(),
        });
    }
    Ok(needed)
}

/// Where one stage's output lives during the run.
enum Store<B: Backend> {
    Host(Layer),
    /// The whole activation in one backend buffer (tiles pasted in at their place).
    Resident(RwLock<B::Buf>),
}

/// A superstep's data access: windows, tiles and their write-back, wherever the layer lives.
struct Access<'a, B: Backend> {
    backend: &'a B,
    spill_dir: &'a std::path::Path,
}

impl<B: Backend> Access<'_, B> {
    fn spill(&self, source: std::io::Error) -> Error {
        Error::Spill {
            dir: self.spill_dir.to_path_buf(),
            source,
        }
    }

    /// The window at rows `ys` × columns `xs` (dictionary padding resolved in the maps).
    fn window(
        &self,
        input: &dyn Input,
        src: Option<&Store<B>>,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<B::Buf> {
        match src {
            None => self.backend.upload(gather(input, ys, xs)?),
            Some(Store::Host(l)) => self.backend.upload(gather(l, ys, xs)?),
            Some(Store::Resident(b)) => {
                let b = b.read().unwrap_or_else(|p| p.into_inner());
                self.backend.gather(&b, ys, xs)
            }
        }
    }

    /// Tile `t` of a stored layer.
    fn read(&self, s: &Store<B>, g: &Grid, t: usize) -> Result<B::Buf> {
        let (y0, y1, x0, x1) = g.tile(t);
        match s {
            Store::Host(l) => {
                let d = l.read(t).map_err(|e| self.spill(e))?;
                self.backend
                    .upload(Tensor::from_vec(l.c, y1 - y0, x1 - x0, d.to_vec())?)
            }
            Store::Resident(b) => {
                let ys: Vec<Option<usize>> = (y0..y1).map(Some).collect();
                let xs: Vec<Option<usize>> = (x0..x1).map(Some).collect();
                let b = b.read().unwrap_or_else(|p| p.into_inner());
                self.backend.gather(&b, &ys, &xs)
            }
        }
    }

    /// Stores `y` as tile `t`.
    fn write(&self, s: &Store<B>, g: &Grid, t: usize, y: &B::Buf) -> Result<()> {
        match s {
            Store::Host(l) => l
                .modify(t, |d| self.backend.download_into(y, d))
                .map_err(|e| self.spill(e))?,
            Store::Resident(b) => {
                let (y0, _, x0, _) = g.tile(t);
                let mut b = b.write().unwrap_or_else(|p| p.into_inner());
                self.backend.paste(&mut b, y0, x0, y)
            }
        }
    }
}

/// Runs the network over `input` tile by tile with exact whole-image semantics; writes `sink`.
pub fn run_exact<B: Backend>(
    net: &Net,
    backend: &B,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
    budget: &Budget,
    sink: &dyn Sink,
) -> Result<RunInfo> {
    let (plan, grids) = prepare(net, input, grid)?;
    let n = grid.len();
    let workers = backend.concurrency(threads).min(n);
    let placement = place::plan_exact(backend, net, &plan, &grids, workers)?;
    let host_peak = check_host_budget(net, &plan, &grids, &placement, budget)?;
    let weights = net.load_weights(backend)?;
    let ram_used = Arc::new(AtomicU64::new(0));
    let inner = inner_threads(threads, workers);
    let mut layers: Vec<Option<Store<B>>> = (0..net.stages.len()).map(|_| None).collect();
    let mut info = RunInfo {
        stats: vec![None; net.stages.len()],
        tiles: n,
        peak_store_bytes: host_peak,
        device_planned_bytes: placement.peak,
        ..RunInfo::default()
    };
    let acc = Access {
        backend,
        spill_dir: &budget.spill_dir,
    };
    let last = net.stages.len() - 1;
    for (i, s) in net.stages.iter().enumerate() {
        let g = &grids[i];
        let (ay, ax) = plan.axes[i];
        // The final stage without normalisation writes straight to the output: nothing reads it back.
        let direct = i == last && s.norm.is_none();
        let layer = if direct {
            None
        } else if placement.resident[i] {
            let (c, h, w) = plan.out[i];
            info.resident_layers += 1;
            Some(Store::Resident(RwLock::new(backend.zeros(c, h, w)?)))
        } else {
            let l = Layer::new(s.conv.cout, g.clone(), budget, &ram_used)?;
            info.spilled_layers += l.spilled() as usize;
            Some(Store::Host(l))
        };
        let src = if i == 0 { None } else { layers[i - 1].as_ref() };
        let residual = s
            .residual
            .map(|r| (layers[r].as_ref().expect("live"), &grids[r]));
        // Superstep, part 1: halo exchange + convolution (+ local statistics).
        let local = superstep(n, workers, |t| {
            let (y0, y1, x0, x1) = g.tile(t);
            let window = acc.window(input, src, &ay.index_map(y0, y1), &ax.index_map(x0, x1))?;
            let mut y = backend.conv2d_valid(&window, &s.conv, &weights[i], inner)?;
            drop(window);
            if s.norm.is_some() {
                let st = backend.channel_stats(&y)?;
                acc.write(layer.as_ref().expect("stored"), g, t, &y)?;
                return Ok(Some(st));
            }
            if s.relu {
                backend.relu(&mut y)?;
            }
            if let Some((r, rg)) = residual {
                let rd = acc.read(r, rg, t)?;
                backend.add(&mut y, &rd)?;
            }
            match &layer {
                Some(l) => acc.write(l, g, t, &y)?,
                None => sink.put_tile(y0, x0, &backend.download(y)?)?,
            }
            Ok(None)
        })?;
        // Barrier passed: merge the statistics, then part 2: every tile normalises with them.
        if let Some(norm) = &s.norm {
            let tiles: Vec<_> = local.into_iter().flatten().collect();
            let global = merge_all(&tiles);
            let l = layer.as_ref().expect("stored");
            match (l, residual) {
                // The whole resident layer at once: the same per-channel map as tile by tile.
                (Store::Resident(b), None | Some((Store::Resident(_), _))) if i != last => {
                    let mut b = b.write().unwrap_or_else(|p| p.into_inner());
                    backend.normalize(&mut b, &global, norm, s.relu)?;
                    if let Some((Store::Resident(r), _)) = residual {
                        backend.add(&mut b, &r.read().unwrap_or_else(|p| p.into_inner()))?;
                    }
                }
                // Tiles in host memory, normalised where they lie.
                (Store::Host(hl), None | Some((Store::Host(_), _))) => {
                    superstep(n, workers, |t| {
                        let (y0, y1, x0, x1) = g.tile(t);
                        let dims = (s.conv.cout, y1 - y0, x1 - x0);
                        let rd = match residual {
                            Some((Store::Host(r), _)) => Some(r.read(t).map_err(|e| acc.spill(e))?),
                            _ => None,
                        };
                        hl.modify(t, |d| {
                            backend.normalize_host(d, dims, &global, norm, s.relu, rd.as_deref())
                        })
                        .map_err(|e| acc.spill(e))??;
                        if i == last {
                            let d = hl.read(t).map_err(|e| acc.spill(e))?;
                            sink.put_tile(
                                y0,
                                x0,
                                &Tensor::from_vec(dims.0, dims.1, dims.2, d.to_vec())?,
                            )?;
                        }
                        Ok(())
                    })?;
                }
                _ => {
                    superstep(n, workers, |t| {
                        let mut y = acc.read(l, g, t)?;
                        backend.normalize(&mut y, &global, norm, s.relu)?;
                        if let Some((r, rg)) = residual {
                            let rd = acc.read(r, rg, t)?;
                            backend.add(&mut y, &rd)?;
                        }
                        if i == last {
                            let (y0, _, x0, _) = g.tile(t);
                            sink.put_tile(y0, x0, &backend.download(y)?)?;
                        } else {
                            acc.write(l, g, t, &y)?;
                        }
                        Ok(())
                    })?;
                }
            }
            info.stats[i] = Some(global);
        }
        layers[i] = layer;
        for (j, l) in layers.iter_mut().enumerate().take(i + 1) {
            if plan.last_use[j] <= i {
                *l = None;
            }
        }
    }
    drop(layers);
    drop(weights);
    if let Some(m) = backend.meter() {
        info.device_peak_bytes = m.peak();
    }
    Ok(info)
}
