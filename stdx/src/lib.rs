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
//! - [`Quoted`]: untrusted text quoted in an error message, cut to a bounded length.
//! - [`testing`]: the one rule for a test that cannot run here ([`testing::skip`]: says why, or fails
//!   under `CI=true`).
//!
//! Everything returns `std::io::Error` (or a small typed error) whose message says what went wrong; callers
//! add the file name in their own typed errors.

// `unsafe` lives only where std has no call for it: `kill(pid, 0)` (fs/atomic.rs), clearing `O_NONBLOCK`
// after a FIFO-safe open (fs/regular.rs), `getrlimit` (mem.rs) and lending a call's work to parked
// worker threads (parallel/helpers.rs); tests make FIFOs with `mkfifo`.
#![deny(unsafe_code)]

pub mod fs;
#[allow(unsafe_code)]
pub mod mem;
pub mod parallel;
mod quote;
mod rng;
pub mod testing;
mod throttle;

pub use quote::{QUOTE_CHARS, Quoted};
pub use rng::SplitMix64;
pub use throttle::Bandwidth;

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
