//! `l3 pcr build|read|info` (issue: pcr).

#[derive(clap::Subcommand)]
pub enum PcrCommand {}

pub fn run(c: PcrCommand) -> anyhow::Result<()> {
    match c {}
}
