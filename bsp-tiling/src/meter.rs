//! Accounting of a device's memory against a budget: every allocation a device backend makes takes a
//! [`Lease`] first, which fails with [`Error::DeviceBudget`] rather than exceed the budget, and gives its
//! bytes back when dropped. The high-water mark is what the benchmark reports as device peak memory. The
//! meter also counts the bytes copied between host and device, what a run's bus traffic costs.

use crate::error::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes in use, their peak, the budget, and the bytes copied in and out.
#[derive(Debug)]
pub struct Meter {
    budget: u64,
    used: AtomicU64,
    peak: AtomicU64,
    copied: AtomicU64,
}

impl Meter {
    pub fn new(budget: u64) -> Arc<Meter> {
        Arc::new(Meter {
            budget,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            copied: AtomicU64::new(0),
        })
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes the budget still leaves (a moment's figure: other leases may take them first).
    pub fn available(&self) -> u64 {
        self.budget.saturating_sub(self.used())
    }

    /// The most bytes in use at once since creation (or the last [`Meter::reset_peak`]).
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Counts `bytes` copied between host and device memory (either way).
    pub fn copied(&self, bytes: u64) {
        self.copied.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes copied between host and device since creation.
    pub fn copied_total(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    /// Restarts the high-water mark from what is in use now.
    pub fn reset_peak(&self) {
        self.peak.store(self.used(), Ordering::Relaxed);
    }

    /// Reserves `bytes` for `what`, or fails if that would exceed the budget.
    pub fn lease(self: &Arc<Self>, bytes: u64, what: &str) -> Result<Lease> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = cur.saturating_add(bytes);
            if next > self.budget {
                return Err(Error::DeviceBudget {
                    what: format!("{what} (with {cur} bytes already in use)"),
                    needed: next,
                    budget: self.budget,
                });
            }
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(Lease {
                        meter: self.clone(),
                        bytes,
                    });
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// Bytes reserved on a [`Meter`] until dropped.
#[derive(Debug)]
pub struct Lease {
    meter: Arc<Meter>,
    bytes: u64,
}

impl Lease {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives `bytes` of the lease back before it is dropped (at most what it holds): a reservation whose
    /// parts have taken leases of their own.
    pub fn give_back(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        self.meter.used.fetch_sub(bytes, Ordering::Relaxed);
        self.bytes -= bytes;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.meter.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_count_peak_and_refuse_past_the_budget() {
        let m = Meter::new(1000);
        let a = m.lease(600, "a").unwrap();
        let b = m.lease(400, "b").unwrap();
        assert_eq!(m.used(), 1000);
        let e = m.lease(1, "tile 3 of conv2").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("tile 3 of conv2") && msg.contains("1001") && msg.contains("1000"),
            "{msg}"
        );
        drop(a);
        assert_eq!(m.used(), 400);
        assert_eq!(m.available(), 600);
        let c = m.lease(500, "c").unwrap();
        assert_eq!((m.used(), m.peak(), m.available()), (900, 1000, 100));
        drop((b, c));
        m.reset_peak();
        assert_eq!((m.used(), m.peak()), (0, 0));
    }

    #[test]
    fn a_lease_gives_back_part_of_itself() {
        let m = Meter::new(1000);
        let mut r = m.lease(800, "reservation").unwrap();
        r.give_back(300);
        assert_eq!((r.bytes(), m.used()), (500, 500));
        r.give_back(900);
        assert_eq!((r.bytes(), m.used()), (0, 0));
        drop(r);
        assert_eq!(m.used(), 0);
    }
}
