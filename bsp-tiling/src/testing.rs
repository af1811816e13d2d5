//! What this crate's tests, benchmarks and fuzz targets drive directly, below [`crate::stylize`] and
//! [`crate::run_graph`]: the stage engine's modes on an explicit grid, the per-stage grids, the
//! device-memory placement and the device simulated on the CPU, and the CUDA backend's kernel source,
//! activations and launch parameters. Not part of the library's interface: names here change with the
//! engines.

pub use crate::bsp::run_exact;
pub use crate::cuda::{BandGemm, CudaTensor, CudaWeights, KERNEL_NAMES, KERNEL_SOURCE, band_gemm};
pub use crate::device::stats_blocks;
pub use crate::grid::stage_grids;
pub use crate::naive::run_naive;
pub use crate::onepass::{run_recompute, run_sampled};
pub use crate::place::{Placement, plan_exact};
pub use crate::sim::{DeviceSim, SimBuf, SimWeights};
pub use crate::whole::whole_peak;
