//! `l3 liquid profile` and the Liquid sampler behind `l3 stream --sampler liquid` (issue: liquid-sampler).

#[derive(clap::Subcommand)]
pub enum LiquidCommand {}

pub fn run(c: LiquidCommand) -> anyhow::Result<()> {
    match c {}
}

/// `l3 stream DIR --sampler liquid ...`.
pub fn stream(_a: crate::stream::StreamArgs) -> anyhow::Result<()> {
    anyhow::bail!("l3 stream --sampler liquid: not built yet")
}
