//! The superstep: every tile of a grid computed in parallel, the return its barrier.

use crate::error::{Error, Result};
use crate::ranks::{Ranks, to_root};
use crate::tensor::Tensor;

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

/// [`superstep`] over this rank's share of the tiles `0..n` (all of them without ranks), each result
/// with its tile.
pub(crate) fn superstep_share<R: Send>(
    ranks: Option<&Ranks>,
    n: usize,
    workers: usize,
    f: impl Fn(usize) -> Result<R> + Sync,
) -> Result<Vec<(usize, R)>> {
    let tiles: Vec<usize> = ranks.map_or(0..n, |r| r.share(n)).collect();
    superstep_of(&tiles, workers, f)
}

/// [`superstep`] over the tiles `tiles`, each result with its tile.
pub(crate) fn superstep_of<R: Send>(
    tiles: &[usize],
    workers: usize,
    f: impl Fn(usize) -> Result<R> + Sync,
) -> Result<Vec<(usize, R)>> {
    stdx::parallel::map(tiles, workers.clamp(1, tiles.len().max(1)), |_, &t| {
        f(t).map(|r| (t, r))
    })
}

/// A superstep whose tiles go to a sink: this rank's share of the tiles `0..n`, `workers` at a time;
/// `compute(t)` gives tile `t` at `(y0, x0)` of the sink and a result kept here. The other ranks send
/// their tiles to rank 0 after each round; rank 0 hands them and its own to `sink` on a thread of its
/// own while it computes the next round (the others would otherwise wait for its writes every round).
/// So the sink is only ever written by rank 0, and holds a round of tiles per rank at most.
pub(crate) fn rounds<R: Send>(
    ranks: &Ranks,
    step: &str,
    n: usize,
    workers: usize,
    compute: impl Fn(usize) -> Result<(usize, usize, Tensor, R)> + Sync,
    sink: &dyn crate::field::Sink,
) -> Result<Vec<(usize, R)>> {
    if !ranks.is_root() {
        return rounds_to(ranks, step, n, workers, &compute, &|_, _, _| Ok(()));
    }
    std::thread::scope(|s| {
        let (tx, rx) =
            std::sync::mpsc::sync_channel::<(usize, usize, Tensor)>(ranks.size() * workers.max(1));
        let writer = s.spawn(move || -> Result<()> {
            for (y0, x0, t) in rx {
                sink.put_tile(y0, x0, &t)?;
                crate::buffers::give(t.data);
            }
            Ok(())
        });
        let sent = rounds_to(ranks, step, n, workers, &compute, &|y0, x0, t| {
            tx.send((y0, x0, t))
                .map_err(|_| Error::Grid("internal: the output's writer stopped".into()))
        });
        drop(tx);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(Error::Grid("the output's writer panicked".into())));
        // The writer's own error, where it stopped, rather than the stop it caused.
        written.and(sent)
    })
}

/// [`rounds`] with every rank's tiles handed to `put` on rank 0.
fn rounds_to<R: Send>(
    ranks: &Ranks,
    step: &str,
    n: usize,
    workers: usize,
    compute: &(impl Fn(usize) -> Result<(usize, usize, Tensor, R)> + Sync),
    put: &dyn Fn(usize, usize, Tensor) -> Result<()>,
) -> Result<Vec<(usize, R)>> {
    let mine: Vec<usize> = ranks.share(n).collect();
    let mut chunks = mine.chunks(workers.max(1)).peekable();
    let mut kept = vec![];
    loop {
        let chunk = chunks.next().unwrap_or(&[]);
        let done = superstep_of(chunk, workers, compute).map(|tiles| {
            tiles
                .into_iter()
                .map(|(t, (y0, x0, out, r))| {
                    kept.push((t, r));
                    (y0, x0, out)
                })
                .collect()
        });
        if !to_root(ranks, step, done, chunks.peek().is_some(), put)? {
            return Ok(kept);
        }
    }
}

/// The tiles `0..n` that `compute` gives, handed to `sink`: on ranks through [`rounds`] (rank 0 writes
/// every rank's), alone as each completes.
pub(crate) fn into_sink(
    ranks: Option<&Ranks>,
    step: &str,
    n: usize,
    workers: usize,
    compute: impl Fn(usize) -> Result<(usize, usize, Tensor, ())> + Sync,
    sink: &dyn crate::field::Sink,
) -> Result<()> {
    match ranks {
        Some(ranks) => rounds(ranks, step, n, workers, compute, sink).map(|_| ()),
        None => superstep(n, workers, |t| {
            let (y0, x0, out, ()) = compute(t)?;
            sink.put_tile(y0, x0, &out)
        })
        .map(|_| ()),
    }
}
