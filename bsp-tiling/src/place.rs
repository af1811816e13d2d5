//! Device-memory placement for the exact BSP engine: which stage outputs stay resident on the device and
//! which go through host memory, so that device memory never exceeds the backend's budget.
//!
//! Device memory at stage `i` is
//!
//! ```text
//! held already  +  weights (all stages)  +  Σ resident layers alive at i  +  workers × working set of one tile of stage i
//! ```
//!
//! A layer is alive from the stage that writes it to the last stage that reads it (its successor, or the
//! residual add that closes a block). One tile's working set is what [`crate::bsp::run_exact`] holds on the
//! device for it: the uploaded or gathered window, the convolution's output and im2col band, and either
//! the residual tile or the reduction scratch, index maps and scale/shift (the byte counts come from the
//! backend: [`Backend::conv_scratch_bytes`] and friends).
//!
//! Layers are made resident greedily in stage order while every stage they span stays within the
//! budget; the rest live in host memory ([`crate::store`]: RAM, then spill files) and their tiles cross
//! the bus at every superstep — the paper's "load and save to main memory", bounded the same way. A budget
//! smaller than the weights plus one tile's working set at some stage is [`Error::DeviceBudget`], naming
//! the stage and the tile size. Backends without a meter (the CPU) keep every layer in host memory.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::grid::Grid;
use crate::model::{Net, Plan};
use crate::tensor::Tensor;

/// Where the exact engine keeps each stage output, and the device memory that takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Per stage: its output stays in device memory for as long as it is alive.
    pub resident: Vec<bool>,
    /// Per stage: device bytes at that stage (weights, alive resident layers, working sets).
    pub stage_bytes: Vec<u64>,
    /// The largest of `stage_bytes`.
    pub peak: u64,
    /// Bytes of all prepared weights.
    pub weights: u64,
    /// Per stage: one tile's working set (the largest tile of that stage).
    pub working: Vec<u64>,
    /// Per stage: bytes of the whole stage output (what residency costs).
    pub layer_bytes: Vec<u64>,
    /// Estimated bytes moved between host and device (both directions) by the layers left in host memory.
    pub host_traffic: u64,
}

impl Placement {
    /// Every layer in host memory, no device accounting (the CPU backend).
    pub fn host(stages: usize) -> Placement {
        Placement {
            resident: vec![false; stages],
            stage_bytes: vec![0; stages],
            peak: 0,
            weights: 0,
            working: vec![0; stages],
            layer_bytes: vec![0; stages],
            host_traffic: 0,
        }
    }
}

/// One tile's device working set at stage `i`, the largest over the tiles of its grid.
fn working_set<B: Backend>(backend: &B, net: &Net, plan: &Plan, grids: &[Grid], i: usize) -> u64 {
    let s = &net.stages[i];
    let (ay, ax) = plan.axes[i];
    let g = &grids[i];
    (0..g.len())
        .map(|t| {
            let (y0, y1, x0, x1) = g.tile(t);
            let (th, tw) = (y1 - y0, x1 - x0);
            let (wy, wx) = (ay.index_map(y0, y1).len(), ax.index_map(x0, x1).len());
            let window = Tensor::bytes(s.conv.cin, wy, wx);
            let out = Tensor::bytes(s.conv.cout, th, tw);
            let conv = window + out + backend.conv_scratch_bytes(&s.conv, th, tw);
            // After the convolution: the output with the residual tile (or, normalising, the raw tile
            // read back with its residual in part 2).
            let after = out + if s.residual.is_some() { out } else { 0 };
            let small = backend.gather_scratch_bytes(wy, wx)
                + backend.stats_scratch_bytes(s.conv.cout, th * tw)
                + backend.norm_scratch_bytes(s.conv.cout);
            conv.max(after) + small
        })
        .max()
        .unwrap_or(0)
}

/// Plans the exact engine's device memory on `backend` for `workers` tiles at once.
pub fn plan_exact<B: Backend>(
    backend: &B,
    net: &Net,
    plan: &Plan,
    grids: &[Grid],
    workers: usize,
) -> Result<Placement> {
    let n = net.stages.len();
    let Some(meter) = backend.meter() else {
        return Ok(Placement::host(n));
    };
    let budget = meter.budget();
    // What the backend already holds (the CUDA backend: cuBLAS's workspace).
    let base = meter.used();
    let weights: u64 = net
        .stages
        .iter()
        .map(|s| backend.weight_bytes(&s.conv))
        .sum();
    let working: Vec<u64> = (0..n)
        .map(|i| working_set(backend, net, plan, grids, i))
        .collect();
    let layer_bytes: Vec<u64> = (0..n)
        .map(|i| {
            let (c, h, w) = plan.out[i];
            Tensor::bytes(c, h, w)
        })
        .collect();
    let last = n - 1;
    // The last stage writes the output directly when it does not normalise: no layer to place.
    let stored = |i: usize| i != last || net.stages[i].norm.is_some();
    let alive = |j: usize, i: usize| j <= i && i <= plan.last_use[j];
    let stage_bytes = |resident: &[bool]| -> Vec<u64> {
        (0..n)
            .map(|i| {
                let res: u64 = (0..=i)
                    .filter(|&j| resident[j] && alive(j, i))
                    .map(|j| layer_bytes[j])
                    .sum();
                base + weights + res + workers as u64 * working[i]
            })
            .collect()
    };
    let mut resident = vec![false; n];
    let base = stage_bytes(&resident);
    if let Some(i) = (0..n).find(|&i| base[i] > budget) {
        let (y0, y1, x0, x1) = grids[i].tile(0);
        return Err(Error::DeviceBudget {
            what: format!(
                "layer {} with {workers} tile(s) of {}x{} at once (weights, window, output and im2col columns)",
                net.stages[i].name,
                x1 - x0,
                y1 - y0
            ),
            needed: base[i],
            budget,
        });
    }
    for j in (0..n).filter(|&j| stored(j)) {
        resident[j] = true;
        let b = stage_bytes(&resident);
        if (j..=plan.last_use[j]).any(|i| b[i] > budget) {
            resident[j] = false;
        }
    }
    let stage_bytes = stage_bytes(&resident);
    // A layer in host memory is downloaded once (raw, if it normalises, then again normalised), read back
    // by its consumers' windows (tile plus halo, about once) and by a residual add, uploaded for part 2.
    let host_traffic = (0..n)
        .filter(|&j| stored(j) && !resident[j])
        .map(|j| {
            let norm = net.stages[j].norm.is_some() as u64;
            let readers = (j + 1..n)
                .filter(|&i| i == j + 1 || net.stages[i].residual == Some(j))
                .count() as u64;
            layer_bytes[j] * (1 + 2 * norm + readers)
        })
        .sum();
    Ok(Placement {
        peak: stage_bytes.iter().copied().max().unwrap_or(0),
        resident,
        stage_bytes,
        weights,
        working,
        layer_bytes,
        host_traffic,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Precision;
    use crate::sim::DeviceSim;
    use crate::{PaddingMode, Widths};

    fn setup(side: usize, tile: usize) -> (Net, Plan, Vec<Grid>) {
        let net = Net::random_transformer(Widths(4, 8, 8), 1, PaddingMode::Reflect);
        let plan = net.plan(side, side).unwrap();
        let g = Grid::with_tile(side, side, tile, 4, 4).unwrap();
        let grids = crate::grid::stage_grids(&net, &plan, &g).unwrap();
        (net, plan, grids)
    }

    #[test]
    fn the_cpu_keeps_everything_on_the_host() {
        let (net, plan, grids) = setup(64, 32);
        let p = plan_exact(&crate::CpuBackend, &net, &plan, &grids, 2).unwrap();
        assert_eq!(p, Placement::host(net.stages.len()));
    }

    #[test]
    fn accounting_by_hand_for_one_stage() {
        // 64² image, 32² tiles: stage 0 (conv1, 3→4, 9×9, stride 1) reads 40×40 windows.
        let (net, plan, grids) = setup(64, 32);
        let sim = DeviceSim::new(u64::MAX, Precision::F32);
        let p = plan_exact(&sim, &net, &plan, &grids, 1).unwrap();
        let window = 3 * 40 * 40 * 4;
        let out = 4 * 32 * 32 * 4;
        let band = 3 * 81 * 32 * 32 * 4; // the whole 32-row output fits one band
        let small = (40 + 40) * 4 + 4 * (1 + 2) * 8 + 2 * 4 * 4;
        assert_eq!(p.working[0], (window + out + band + small) as u64);
        // With an unlimited budget every stored layer is resident and nothing crosses the bus.
        let stored = net.stages.len() - 1;
        assert_eq!(p.resident.iter().filter(|&&r| r).count(), stored);
        assert_eq!(p.host_traffic, 0);
        // Stage 0: weights + its own output (4×64×64) + one working set.
        assert_eq!(p.stage_bytes[0], p.weights + 4 * 64 * 64 * 4 + p.working[0]);
    }

    #[test]
    fn tighter_budgets_keep_fewer_layers_resident_and_never_exceed() {
        let (net, plan, grids) = setup(96, 32);
        let all = plan_exact(
            &DeviceSim::new(u64::MAX, Precision::F32),
            &net,
            &plan,
            &grids,
            1,
        )
        .unwrap();
        let floor = (0..net.stages.len())
            .map(|i| all.weights + all.working[i])
            .max()
            .unwrap();
        assert_eq!(
            all.resident.iter().filter(|&&r| r).count(),
            net.stages.len() - 1
        );
        let mut prev_resident = usize::MAX;
        let mut prev_traffic = 0;
        for frac in [1.0, 0.8, 0.6, 0.4, 0.2, 0.0] {
            let budget = floor + ((all.peak - floor) as f64 * frac) as u64;
            let sim = DeviceSim::new(budget, Precision::F32);
            let p = plan_exact(&sim, &net, &plan, &grids, 1).unwrap();
            assert!(p.peak <= budget, "{frac}: {} > {budget}", p.peak);
            let r = p.resident.iter().filter(|&&r| r).count();
            assert!(
                r <= prev_resident,
                "{frac}: {r} resident after {prev_resident}"
            );
            assert!(p.host_traffic >= prev_traffic);
            prev_resident = r;
            prev_traffic = p.host_traffic;
        }
        assert!(prev_resident < net.stages.len() - 1);
        // Below the floor: a typed error naming the layer and the tile.
        let sim = DeviceSim::new(floor - 1, Precision::F32);
        let e = plan_exact(&sim, &net, &plan, &grids, 1).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::DeviceBudget { .. }), "{msg}");
        assert!(msg.contains("layer ") && msg.contains("32x32"), "{msg}");
        // Two tiles at once need more.
        let sim = DeviceSim::new(floor, Precision::F32);
        assert!(plan_exact(&sim, &net, &plan, &grids, 2).is_err());
    }
}
