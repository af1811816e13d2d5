//! `l3 stream DATASET ...` (issue: loader; `--sampler liquid` is served by `liquid.rs`).
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct StreamArgs {
    /// Dataset: a folder of images, a Liquid multi-format dataset or a PCR dataset.
    pub dataset: PathBuf,
    /// Sampling order: `shuffle` (seeded) or `liquid` (two-region shuffle buffers).
    #[arg(long, default_value = "shuffle")]
    pub sampler: String,
    /// Memory budget in bytes for the Liquid shuffle buffers.
    #[arg(long)]
    pub budget: Option<u64>,
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Decode threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    #[arg(long, default_value_t = 1)]
    pub world_size: usize,
    /// Decode L3 on the GPU.
    #[arg(long)]
    pub gpu: bool,
    /// CSV, one line per delivered item: epoch,batch,item,format,cached
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// CSV, one line per batch: epoch,batch,disk_items,disk_bytes,wait_ms
    #[arg(long)]
    pub batch_log: Option<PathBuf>,
}

pub fn run(a: StreamArgs) -> anyhow::Result<()> {
    if a.sampler == "liquid" {
        return crate::liquid::stream(a);
    }
    anyhow::bail!("l3 stream: not built yet")
}
