//! The toolkit's shared vocabulary, in the manner of rust-analyzer's `stdx`: the few things every crate needs
//! and none should write again.
//!
//! - [`SplitMix64`]: the one seeded generator (shuffles, crops, probes), identical on every machine.
//! - [`parallel`]: the one worker pool — a scoped queue over items with the first error stopping the rest.
//! - [`fs`]: durable outputs ([`fs::AtomicFile`]: temporary name, fsync, rename), stale-temporary cleanup,
//!   [`fs::DirLock`] for folders two processes could write at once, [`fs::walk`] that survives symlink loops
//!   and special files, and [`fs::open_regular`] that never blocks on a FIFO.
//! - [`mem`]: a memory limit to check large allocations against before making them.
//! - [`Bandwidth`]: one read-bandwidth cap shared by every reader (a model of network storage).
//!
//! Everything returns `std::io::Error` (or a small typed error) whose message says what went wrong; callers
//! add the file name in their own typed errors.

pub mod fs;
pub mod mem;
pub mod parallel;
mod rng;
mod throttle;

pub use rng::SplitMix64;
pub use throttle::Bandwidth;

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
