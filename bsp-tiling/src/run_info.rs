//! What a run did besides its output: what `stylize`, `run` and `infer` return.

use crate::model::NetStats;

/// What a tiled run did besides its output.
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    /// Per graph node: the statistics a normalisation applied.
    pub stats: NetStats,
    /// Tiles of the grid.
    pub tiles: usize,
    /// Largest number of activation bytes held at once in host memory (RAM and spill files).
    pub peak_store_bytes: u64,
    /// Stored values that went to spill files.
    pub spilled_layers: usize,
    /// Graph values computed where their one reader reads them instead of stored (exact runs of
    /// ONNX graphs on the host: a small halo recomputed instead of a stored value copied).
    pub inlined_values: usize,
    /// Device memory in use at its peak during the run, as metered (device backends).
    pub device_peak_bytes: u64,
    /// Bytes copied between host and device memory during the run (device backends): the windows
    /// uploaded and the outputs downloaded. A stored value kept on the device does not cross the bus;
    /// one stored on the host crosses it both ways.
    pub device_copied_bytes: u64,
    /// Stored values kept in device memory between supersteps (exact runs on a device backend).
    pub kept_values: usize,
    /// Kept values moved to the host later, to leave the next supersteps' working sets their room.
    pub values_moved_to_host: usize,
    /// What the run chose that its user should know (how an exact run kept within its budget).
    pub notes: Vec<String>,
}
