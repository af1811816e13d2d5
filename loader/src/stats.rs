//! Per-stage counters, updated by the pipeline threads and readable at any time while the loader runs.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Live counters shared by the pipeline's threads (relaxed atomics: cheap, eventually exact).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub items_read: AtomicU64,
    pub bytes_read: AtomicU64,
    pub read_ns: AtomicU64,
    pub items_decoded: AtomicU64,
    pub pixels_decoded: AtomicU64,
    pub decode_ns: AtomicU64,
    pub assemble_ns: AtomicU64,
    pub items_skipped: AtomicU64,
    pub items_partial: AtomicU64,
    pub batches_delivered: AtomicU64,
    pub items_delivered: AtomicU64,
    pub wait_ns: AtomicU64,
    pub gpu_batches: AtomicU64,
    pub gpu_fallback_batches: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, v: u64) {
        c.fetch_add(v, Relaxed);
    }
    pub fn add_time(c: &AtomicU64, since: Instant) {
        c.fetch_add(since.elapsed().as_nanos() as u64, Relaxed);
    }
    pub fn snapshot(&self, started: Instant, io_threads: usize, decode_threads: usize) -> Stats {
        let d = |c: &AtomicU64| Duration::from_nanos(c.load(Relaxed));
        Stats {
            elapsed: started.elapsed(),
            io_threads,
            decode_threads,
            items_read: self.items_read.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            read_busy: d(&self.read_ns),
            items_decoded: self.items_decoded.load(Relaxed),
            pixels_decoded: self.pixels_decoded.load(Relaxed),
            decode_busy: d(&self.decode_ns),
            assemble_busy: d(&self.assemble_ns),
            items_skipped: self.items_skipped.load(Relaxed),
            items_partial: self.items_partial.load(Relaxed),
            batches_delivered: self.batches_delivered.load(Relaxed),
            items_delivered: self.items_delivered.load(Relaxed),
            consumer_wait: d(&self.wait_ns),
            gpu_batches: self.gpu_batches.load(Relaxed),
            gpu_fallback_batches: self.gpu_fallback_batches.load(Relaxed),
        }
    }
}

/// A snapshot of a loader's counters since it started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Wall time since the loader started.
    pub elapsed: Duration,
    pub io_threads: usize,
    pub decode_threads: usize,
    /// Items and stored bytes read by the I/O stage (under the Liquid order: by the sampler's readers).
    /// With region decoding, L3 items count only the header, offset table and patches actually read.
    pub items_read: u64,
    pub bytes_read: u64,
    /// Time the I/O threads spent reading (summed over threads).
    pub read_busy: Duration,
    pub items_decoded: u64,
    /// Pixels decoded (width × height): whole images, or only the window where region decoding applies.
    pub pixels_decoded: u64,
    /// Time the decode threads spent decoding and shaping samples (summed over threads).
    pub decode_busy: Duration,
    /// Time the assembler spent copying samples into batches.
    pub assemble_busy: Duration,
    /// Corrupt or missing items skipped (only when skipping was opted in).
    pub items_skipped: u64,
    /// Items delivered with less than they store, only when opted in: JPEGs cut short
    /// (`partial_images`), PCR images at a lower scan group than asked because a later scan is corrupt
    /// (`pcr_partial`).
    pub items_partial: u64,
    pub batches_delivered: u64,
    pub items_delivered: u64,
    /// Time the consumer spent blocked waiting for the next batch.
    pub consumer_wait: Duration,
    /// Batches decoded on the GPU.
    pub gpu_batches: u64,
    /// Batches the GPU failed on that were decoded on the CPU instead (only with `gpu_fallback`).
    pub gpu_fallback_batches: u64,
}

impl Stats {
    pub fn images_per_sec(&self) -> f64 {
        self.items_delivered as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Stored megabytes (10^6) read per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes_read as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Share of the I/O threads' wall time spent reading, 0 to 1.
    pub fn io_utilisation(&self) -> f64 {
        util(self.read_busy, self.io_threads, self.elapsed)
    }
    /// Share of the decode threads' wall time spent decoding, 0 to 1.
    pub fn decode_utilisation(&self) -> f64 {
        util(self.decode_busy, self.decode_threads, self.elapsed)
    }
    /// Share of the assembler thread's wall time spent copying.
    pub fn assemble_utilisation(&self) -> f64 {
        util(self.assemble_busy, 1, self.elapsed)
    }
    /// Share of wall time the consumer waited for data (1 = the loader is the bottleneck).
    pub fn wait_fraction(&self) -> f64 {
        util(self.consumer_wait, 1, self.elapsed)
    }
}

fn util(busy: Duration, threads: usize, elapsed: Duration) -> f64 {
    let denom = elapsed.as_secs_f64() * threads.max(1) as f64;
    if denom <= 0.0 {
        0.0
    } else {
        (busy.as_secs_f64() / denom).min(1.0)
    }
}
