//! CUDA runtime setup, once for the toolkit's GPU crates (`l3-cuda`, `bsp-tiling`).
//!
//! - [`Library`]: libcuda, libnvrtc (and with the `cublas` feature libcublas), loaded at run time; cudarc
//!   panics on the first call into a library it cannot load, so every entry point asks
//!   [`Library::require`] first.
//! - [`probe`]: is GPU `ordinal` usable, and if not, why ([`Error`]: no driver library, driver
//!   initialisation failed, no such device, no NVRTC); [`Gpu`] describes it when it is.
//! - [`device_count`], [`open`]: the devices, and a device's primary context (the one PyTorch, JAX and
//!   CuPy use).
//! - [`Arch`]: a device's compute capability, and the virtual architecture NVRTC compiles for;
//!   [`EVERY_ARCH`], Turing to Blackwell.
//! - [`Program`]: CUDA C source compiled by NVRTC at most once per process and architecture, and loaded
//!   into a context.
//! - [`PinnedHost`]: page-locked host memory, for buffers the GPU copies by DMA.
//!
//! - `testing` (hidden): for tests that need NVRTC or cuDNN and no GPU, a run of the test with CI's library.
//!
//! Nothing here falls back: a GPU that was asked for and cannot be used is an [`Error`] naming the reason.
#![deny(unsafe_code)]

mod arch;
mod device;
mod error;
mod library;
mod pinned;
mod program;
#[doc(hidden)]
pub mod testing;

pub use arch::{Arch, EVERY_ARCH};
pub use cudarc;
pub use device::{Gpu, device_count, open, probe};
pub use error::{Error, describe};
pub use library::Library;
pub use pinned::PinnedHost;
pub use program::Program;

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
