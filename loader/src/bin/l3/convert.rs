//! `l3 convert --to l3|raw|pcr IN_DIR OUT_DIR` (issue: loader).
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConvertArgs {
    #[arg(long)]
    pub to: String,
    pub input: PathBuf,
    pub output: PathBuf,
}

pub fn run(_a: ConvertArgs) -> anyhow::Result<()> {
    anyhow::bail!("l3 convert: not built yet")
}
