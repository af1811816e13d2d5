//! The library half of xtask, shared with the benchmarks (`l3-bench`): the workspace root and the Python
//! test environment under `target/python/` (see [`python`]), and the invariant checks of `cargo xtask tidy`
//! (see [`tidy`]). It depends on nothing but anyhow and serde_json, so that
//! `cargo xtask ...` compiles in seconds.
#![deny(unsafe_code)]

pub mod python;
pub mod tidy;

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    // A binary carried to another machine (the GPU bundle's `l3-bench`) is told where the tree is now.
    if let Some(root) = std::env::var_os("L3_WORKSPACE_ROOT") {
        return root.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent")
        .to_path_buf()
}

/// The cargo that runs us (`cargo xtask` sets `CARGO`), else `cargo` from `PATH`.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs `cmd`, an error naming it unless it exits with success.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} exited with {status}");
    }
    Ok(())
}

// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
