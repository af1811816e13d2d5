//! `l3 demo`: the main job (issue: loader).
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Run on these images instead of the built-in generated dataset.
    #[arg(long)]
    pub data: Option<PathBuf>,
}

pub fn run(_a: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("l3 demo: not built yet")
}
