//! The paper's Figure 5 baseline: cut the image into tiles and run each one as if it were the image —
//! no halo (the model's padding at every tile border) and each tile's own statistics.

use crate::backend::Backend;
use crate::bsp::{inner_threads, superstep};
use crate::error::{Error, Result};
use crate::field::{Input, Sink, gather};
use crate::grid::Grid;
use crate::model::Net;

pub fn run_naive<B: Backend>(
    net: &Net,
    backend: &B,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
    sink: &dyn Sink,
) -> Result<()> {
    let plan = net.plan(input.height(), input.width())?;
    let last = net.stages.len() - 1;
    let div = plan.div[last];
    let workers = backend.concurrency(threads).min(grid.len());
    let weights = net.load_weights(backend)?;
    if let Some(m) = backend.meter() {
        // Every tile is a whole-image pass of its own size; the largest decides.
        let mut needed = 0;
        for t in 0..grid.len() {
            let (y0, y1, x0, x1) = grid.tile(t);
            let p = net.plan(y1 - y0, x1 - x0)?;
            needed = needed.max(crate::whole::whole_peak(backend, net, &p, y1 - y0, x1 - x0));
        }
        let weights_bytes: u64 = net
            .stages
            .iter()
            .map(|s| backend.weight_bytes(&s.conv))
            .sum();
        // `weights` are loaded already: what the meter holds covers them.
        let needed = m.used() + workers as u64 * (needed - weights_bytes);
        if needed > m.budget() {
            return Err(Error::DeviceBudget {
                what: format!("naive tiles ({workers} at once)"),
                needed,
                budget: m.budget(),
            });
        }
    }
    let inner = inner_threads(threads, workers);
    superstep(grid.len(), workers, |t| {
        let (y0, y1, x0, x1) = grid.tile(t);
        let ys: Vec<Option<usize>> = (y0..y1).map(Some).collect();
        let xs: Vec<Option<usize>> = (x0..x1).map(Some).collect();
        let tile = backend.upload(gather(input, &ys, &xs)?)?;
        let p = net.plan(y1 - y0, x1 - x0)?;
        let (out, _) = net.forward_buf(backend, &weights, &p, tile, inner, None)?;
        sink.put_tile(y0 / div, x0 / div, &backend.download(out)?)?;
        Ok(())
    })?;
    Ok(())
}
