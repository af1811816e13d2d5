//! A read-bandwidth cap shared by every reader of a process: a token bucket that models network storage
//! (a few hundred MB/s per GPU on a shared file system or object store) on a machine whose page cache would
//! otherwise hide the storage. Readers take bytes *after* a read, so a read never waits on itself, and the
//! debt it leaves delays the next one: over any span the readers together move at most `rate × span +
//! burst` bytes.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes per second, shared by every thread that calls [`take`](Bandwidth::take).
#[derive(Debug)]
pub struct Bandwidth {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bandwidth {
    /// A cap of `bytes_per_sec` (at least 1) with a burst of a tenth of a second's worth.
    pub fn new(bytes_per_sec: u64) -> Bandwidth {
        let rate = bytes_per_sec.max(1) as f64;
        Bandwidth {
            rate,
            burst: rate / 10.0,
            state: Mutex::new((rate / 10.0, Instant::now())),
        }
    }

    /// The cap in bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate as u64
    }

    /// Accounts `bytes` just read, sleeping as long as the bucket is in debt.
    pub fn take(&self, bytes: u64) {
        let wait = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let refill = now.duration_since(s.1).as_secs_f64() * self.rate;
            s.0 = (s.0 + refill).min(self.burst) - bytes as f64;
            s.1 = now;
            if s.0 < 0.0 {
                Duration::from_secs_f64(-s.0 / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_readers_share_one_rate() {
        // 4 threads each move 100 KiB at 2 MB/s: about 0.2 s in all (minus the 0.1 s burst), never much less.
        let b = Bandwidth::new(2_000_000);
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..25 {
                        b.take(4096);
                    }
                });
            }
        });
        let secs = t0.elapsed().as_secs_f64();
        let floor = (4.0 * 25.0 * 4096.0 - 200_000.0) / 2_000_000.0;
        assert!(secs >= floor * 0.95, "{secs} s < {floor} s: the cap leaked");
        assert_eq!(b.rate(), 2_000_000);
    }
}
