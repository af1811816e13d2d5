//! Worker threads for one superstep: tiles are claimed from a shared counter, and the superstep ends
//! (the BSP barrier) when every worker has joined.

use crate::error::Result;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `f` for every tile `0..n` on up to `threads` workers; results in tile order, first error wins.
pub fn superstep<R: Send>(
    n: usize,
    threads: usize,
    f: impl Fn(usize) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let workers = threads.clamp(1, n.max(1));
    if workers == 1 {
        return (0..n).map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<Result<R>>> = (0..n).map(|_| None).collect();
    let done: Vec<Vec<(usize, Result<R>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = vec![];
                    loop {
                        let t = next.fetch_add(1, Ordering::Relaxed);
                        if t >= n {
                            break;
                        }
                        let r = f(t);
                        let failed = r.is_err();
                        mine.push((t, r));
                        if failed {
                            // Make the others stop claiming tiles.
                            next.store(n, Ordering::Relaxed);
                            break;
                        }
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for (t, r) in done.into_iter().flatten() {
        slots[t] = Some(r);
    }
    let mut out = Vec::with_capacity(n);
    for s in slots {
        match s {
            Some(r) => out.push(r?),
            None => continue, // skipped after another tile failed; that error is returned below
        }
    }
    if out.len() < n {
        // Unreachable without an error above, which `?` has already returned.
        return Err(crate::error::Error::Unsupported(
            "a worker stopped early".into(),
        ));
    }
    Ok(out)
}

/// Threads each backend call may use when `workers` tiles run at once.
pub fn inner_threads(threads: usize, tiles: usize) -> usize {
    (threads / tiles.clamp(1, threads.max(1))).max(1)
}
