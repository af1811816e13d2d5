//! `l3 encode`, `l3 decode`, `l3 info` (issue: l3-format).
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct EncodeArgs {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Patch size N (1..=255); default by resolution.
    #[arg(long)]
    pub patch: Option<u8>,
}

#[derive(clap::Args)]
pub struct DecodeArgs {
    pub input: PathBuf,
    pub output: PathBuf,
}

#[derive(clap::Args)]
pub struct InfoArgs {
    pub input: PathBuf,
}

pub fn encode(_a: EncodeArgs) -> anyhow::Result<()> {
    anyhow::bail!("l3 encode: not built yet")
}
pub fn decode(_a: DecodeArgs) -> anyhow::Result<()> {
    anyhow::bail!("l3 decode: not built yet")
}
pub fn info(_a: InfoArgs) -> anyhow::Result<()> {
    anyhow::bail!("l3 info: not built yet")
}
