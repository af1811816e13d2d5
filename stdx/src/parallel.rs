//! The one worker pool: scoped threads pulling items from a shared queue. The first error stops the other
//! workers after the item they hold, and is returned; results keep the input order.
//!
//! Scoped threads rather than a global pool: every caller says how many threads it was granted (a loader's
//! decode threads, the profiler's probe threads), and nothing outlives the call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// `requested`, or every core when it is 0.
pub fn threads(requested: usize) -> usize {
    if requested > 0 {
        requested
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// Runs `work` on every item on `threads` threads (0 = every core); returns the first error.
pub fn for_each<T, E, I>(
    items: I,
    threads: usize,
    work: impl Fn(T) -> Result<(), E> + Sync,
) -> Result<(), E>
where
    I: IntoIterator<Item = T>,
    I::IntoIter: Send,
    T: Send,
    E: Send,
{
    let queue = Mutex::new(items.into_iter());
    let failed = AtomicBool::new(false);
    let first = Mutex::new(None);
    let worker = || {
        while !failed.load(Ordering::Relaxed) {
            let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
            let Some(item) = next else { break };
            if let Err(e) = work(item) {
                failed.store(true, Ordering::Relaxed);
                first
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        }
    };
    let n = self::threads(threads);
    if n <= 1 {
        worker();
    } else {
        std::thread::scope(|s| {
            for _ in 1..n {
                s.spawn(worker);
            }
            worker();
        });
    }
    match first.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Maps every item on `threads` threads (0 = every core), results in input order; the first error wins.
pub fn map<T, R, E>(
    items: &[T],
    threads: usize,
    work: impl Fn(usize, &T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E>
where
    T: Sync,
    R: Send,
    E: Send,
{
    let out: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    for_each(items.iter().enumerate(), threads, |(i, item)| {
        let r = work(i, item)?;
        *out[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        Ok(())
    })?;
    Ok(out
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every item was mapped once for_each returned Ok")
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn maps_in_order_on_many_threads() {
        let v: Vec<u64> = (0..1000).collect();
        for t in [1, 2, 7] {
            let r: Result<Vec<u64>, ()> = map(&v, t, |i, x| Ok(x * 2 + i as u64));
            assert_eq!(r.unwrap(), v.iter().map(|x| x * 3).collect::<Vec<_>>());
        }
    }

    #[test]
    fn first_error_stops_the_rest() {
        let done = AtomicUsize::new(0);
        let r = for_each(0..100_000u32, 2, |i| {
            done.fetch_add(1, Ordering::Relaxed);
            if i == 10 {
                Err(format!("item {i}"))
            } else {
                Ok(())
            }
        });
        assert_eq!(r.unwrap_err(), "item 10");
        assert!(done.load(Ordering::Relaxed) < 100_000);
        assert!(threads(0) >= 1);
    }
}
