//! The one worker pool: threads pulling items from a shared queue. The first error stops the other
//! workers after the item they hold, and is returned; results keep the input order.
//!
//! Every caller says how many threads it was granted (a loader's decode threads, the profiler's probe
//! threads) and gets exactly that many for the call, as scoped threads would give; the threads
//! themselves are kept parked between calls ([`helpers`]), since starting them is what a short call
//! costs most.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

#[allow(unsafe_code)]
mod helpers;

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
        helpers::run(n - 1, &worker);
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

    /// A call gets every thread it asked for at once (each item waits until all are running), and a
    /// later call is served by the same threads, parked in between.
    #[test]
    fn a_call_gets_its_threads_at_once_and_they_are_kept() {
        use std::collections::HashSet;
        use std::time::{Duration, Instant};
        let ids = |n: usize| {
            let running = AtomicUsize::new(0);
            let seen = Mutex::new(HashSet::new());
            for_each(0..n, n, |_| {
                running.fetch_add(1, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(20);
                while running.load(Ordering::SeqCst) < n && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                seen.lock().unwrap().insert(std::thread::current().id());
                Ok::<(), ()>(())
            })
            .unwrap();
            assert_eq!(running.load(Ordering::SeqCst), n);
            seen.into_inner().unwrap()
        };
        let first = ids(6);
        assert_eq!(first.len(), 6, "six threads at once");
        let second = ids(6);
        assert_eq!(second.len(), 6);
        // The caller is one of them; the five helpers are the first call's.
        assert!(
            second.intersection(&first).count() >= 5,
            "{first:?} {second:?}"
        );
    }

    /// A panic on a helper reaches the caller once every thread has stopped; nested calls and calls from
    /// several threads at once each get their own threads.
    #[test]
    fn panics_propagate_and_calls_nest() {
        let r = std::panic::catch_unwind(|| {
            for_each(0..64u32, 4, |i| {
                assert!(i != 40, "item 40");
                Ok::<(), ()>(())
            })
        });
        assert!(r.is_err());
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for_each(0..8u32, 3, |_| {
                        for_each(0..8u32, 3, |_| {
                            total.fetch_add(1, Ordering::Relaxed);
                            Ok::<(), ()>(())
                        })
                    })
                    .unwrap();
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 8 * 8);
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
