//! Runs the toolkit's CUDA C kernels on the CPU, for tests on machines without a GPU: the kernel's exact
//! source, compiled by the host C++ compiler through a shim, launched by a scheduler that runs every
//! CUDA thread as a fiber, optionally under AddressSanitizer + UBSan or ThreadSanitizer.
//!
//! - `cpp/cuda_sim.h` ([`SHIM`]): the CUDA surface a kernel sees (`threadIdx`, `__shared__`,
//!   `__syncthreads`, `__syncwarp`, `__ballot_sync`, `__shfl_*_sync`, atomics, ...). A kernel source
//!   leaves out its own typedefs when `CUDA_CPU_SIM` is defined.
//! - `cpp/cuda_sim_run.h` ([`RUNTIME`]): `cuda_sim_launch(grid, block, fn)`, the fiber scheduler (a
//!   barrier that not every thread reaches is reported, not waited on), and file reading for harnesses.
//! - [`Harness`]: a crate's harness (its `main`, which reads a launch file its tests write and calls its
//!   kernels) plus the kernel source, written into a build folder with the two headers above and compiled
//!   once per [`Flavour`] per test process. Everything is embedded in the test binary, so a binary
//!   carried to another machine needs no source tree.
//! - [`run`]: one harness run over an input file, its output file back, the blocks of every launch in
//!   a shuffled order ([`block_order`]; a GPU promises none).
//!
//! A missing C++ compiler or sanitizer runtime is [`Error::Unavailable`] (a test prints it and skips); a
//! compile error in the sources is [`Error::Source`] (a test fails).
#![deny(unsafe_code)]

mod build;
mod run;

pub use build::{Error, Flavour, Harness};
pub use run::{block_order, run, run_in_order};
/// The workspace's rule for a test that cannot run here, used by [`harness_or_skip!`].
pub use stdx::testing::skip;

/// The harness `$harness` ([`Harness`]) built for `$flavour`, or — after printing why — `return` from the
/// calling test when this machine cannot build it ([`Error::Unavailable`]; under `CI=true` that fails the
/// test instead, see `stdx::testing`); a compile error in the sources
/// ([`Error::Source`]) fails the test.
#[macro_export]
macro_rules! harness_or_skip {
    ($harness:expr, $flavour:expr) => {
        match $harness.get($flavour) {
            Ok(exe) => exe,
            Err($crate::Error::Unavailable(why)) => {
                $crate::skip(why);
                return;
            }
            Err(e) => panic!("{e}"),
        }
    };
}

/// `cpp/cuda_sim.h`: include it before the kernels.
pub const SHIM: &str = include_str!("../cpp/cuda_sim.h");
/// `cpp/cuda_sim_run.h`: include it after the kernels.
pub const RUNTIME: &str = include_str!("../cpp/cuda_sim_run.h");

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
