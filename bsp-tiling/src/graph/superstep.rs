//! The superstep: every tile of a grid computed in parallel, the return its barrier.

use crate::error::Result;

/// Threads each backend call may use when `workers` tiles run at once.
pub(crate) fn inner_threads(threads: usize, workers: usize) -> usize {
    (threads / workers.clamp(1, threads.max(1))).max(1)
}

/// Runs `f` on every tile `0..n`, `workers` at a time on the workspace pool; results in tile order,
/// the first error stops the rest. Returning is the superstep's barrier.
pub(crate) fn superstep<R: Send>(
    n: usize,
    workers: usize,
    f: impl Fn(usize) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let tiles: Vec<usize> = (0..n).collect();
    stdx::parallel::map(&tiles, workers.clamp(1, n.max(1)), |_, &t| f(t))
}
