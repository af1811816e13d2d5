//! The paper's Figure 5 baseline: cut the image into tiles and run each one as if it were the image —
//! no halo (the model's padding at every tile border) and each tile's own statistics.

use crate::backend::Backend;
use crate::error::Result;
use crate::field::{Input, OutputSink, gather};
use crate::grid::Grid;
use crate::model::Net;
use crate::workers::{inner_threads, superstep};

pub fn run_naive(
    net: &Net,
    backend: &dyn Backend,
    input: &dyn Input,
    grid: &Grid,
    threads: usize,
    sink: &OutputSink,
) -> Result<()> {
    let plan = net.plan(input.height(), input.width())?;
    let last = net.stages.len() - 1;
    let div = plan.div[last];
    let inner = inner_threads(threads, grid.len());
    superstep(grid.len(), threads, |t| {
        let (y0, y1, x0, x1) = grid.tile(t);
        let ys: Vec<Option<usize>> = (y0..y1).map(Some).collect();
        let xs: Vec<Option<usize>> = (x0..x1).map(Some).collect();
        let tile = gather(input, &ys, &xs)?;
        let (out, _) = net.forward_whole(backend, &tile, inner, None)?;
        sink.put(y0 / div, x0 / div, &out);
        Ok(())
    })?;
    Ok(())
}
