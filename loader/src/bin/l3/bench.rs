//! `l3 bench decode [--gpu] DIR` (issue: l3-cuda).
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Decode throughput: CPU L3 and PNG on all cores, and the GPU with --gpu.
    Decode {
        dir: PathBuf,
        #[arg(long)]
        gpu: bool,
    },
}

pub fn run(_c: BenchCommand) -> anyhow::Result<()> {
    anyhow::bail!("l3 bench: not built yet")
}
