//! What this crate's tests, benchmarks and fuzz targets drive directly, below [`crate::stylize`] and
//! [`crate::run`]: the device simulated on the CPU, and the CUDA backend's kernel source and
//! values. Not part of the library's interface: names here change with the engine.

pub use crate::cuda::{CudaTensor, KERNEL_NAMES, KERNEL_SOURCE};
pub use crate::sim::{DeviceSim, SimBuf};
