//! `l3 stylize` (issue: bsp-tiling).
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct StylizeArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long)]
    pub tile: Option<usize>,
    /// exact | sampled | naive | whole
    #[arg(long, default_value = "exact")]
    pub mode: String,
    #[arg(long)]
    pub threads: Option<usize>,
    pub input: PathBuf,
    pub output: PathBuf,
}

pub fn run(_a: StylizeArgs) -> anyhow::Result<()> {
    anyhow::bail!("l3 stylize: not built yet")
}
